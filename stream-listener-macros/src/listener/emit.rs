//! Code generation for a valid listener: the function unchanged, a `Send` check spanned on its name, and
//! one `inventory::submit!` of a `ListenerRegistration`.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};

use super::args::{Ack, Args, DeleteRef, Failure, Start};
use super::handler::{Handler, Payload};

pub(crate) fn registration(function: &syn::ItemFn, args: &Args, handler: &Handler) -> TokenStream {
    let private = quote!(::stream_listener::__private);
    let name = &function.sig.ident;
    let span = name.span();
    let argument = &handler.argument;

    let (payload, payload_type, constructor) = match &handler.payload {
        Payload::Json(ty) => (
            quote!(#private::PayloadKind::Json),
            quote!(::core::stringify!(#ty)),
            quote_spanned!(span=> #private::BoxedHandler::json::<#ty, _>),
        ),
        Payload::Raw => (
            quote!(#private::PayloadKind::Raw),
            quote!(::core::stringify!(#argument)),
            quote_spanned!(span=> #private::BoxedHandler::raw),
        ),
        Payload::JsonBatch(ty) => (
            quote!(#private::PayloadKind::JsonBatch),
            quote!(::core::stringify!(#ty)),
            quote_spanned!(span=> #private::BoxedHandler::json_batch::<#ty, _>),
        ),
        Payload::Fields => (
            quote!(#private::PayloadKind::Fields),
            quote!(::core::stringify!(#argument)),
            quote_spanned!(span=> #private::BoxedHandler::fields),
        ),
    };

    // The handler's future must be `Send` (workers run on a multi-threaded runtime). Passing it through
    // a generic function with a `Send` bound makes rustc report "future cannot be sent between threads
    // safely" on the user's function name, with a note at the `.await` that holds the culprit (the axum
    // `debug_handler` technique). The returned opaque type is declared `Send`, so the `Handler` bound of
    // `BoxedHandler` does not repeat the same error on generated code.
    let check_send = quote_spanned! {span=>
        fn __stream_listener_check_send<F>(
            future: F,
        ) -> impl ::core::future::Future<Output = F::Output> + ::core::marker::Send + 'static
        where
            F: ::core::future::Future + ::core::marker::Send + 'static,
        {
            future
        }
    };
    // A `State<T>` argument is looked up once, at start (a missing type is a start error naming the
    // listener), and cloned into every call.
    let make_handler = match &handler.state {
        None => quote_spanned! {span=>
            fn __stream_listener_make_handler(
                _states: &#private::States,
            ) -> #private::Result<#private::BoxedHandler, #private::MissingState> {
                #check_send
                #private::Result::Ok(#constructor(|message: #argument| {
                    __stream_listener_check_send(#name(message))
                }))
            }
        },
        Some(state) => quote_spanned! {span=>
            fn __stream_listener_make_handler(
                states: &#private::States,
            ) -> #private::Result<#private::BoxedHandler, #private::MissingState> {
                #check_send
                let state: #state = states.get()?;
                #private::Result::Ok(#constructor(move |message: #argument| {
                    __stream_listener_check_send(#name(message, ::core::clone::Clone::clone(&state)))
                }))
            }
        },
    };

    let stream = &args.stream;
    let group = &args.group;
    let concurrency = args.concurrency;
    let id = option(args.id.as_ref().map(|id| quote!(#id)));
    let batch_size = option(args.batch_size.map(|n| quote!(#n)));
    let block_ms = option(args.block_ms.map(|n| quote!(#n)));
    let max_deliveries = option(args.max_deliveries.map(|n| quote!(#n)));
    let initial_backoff_ms = option(args.initial_backoff_ms.map(|n| quote!(#n)));
    let max_backoff_ms = option(args.max_backoff_ms.map(|n| quote!(#n)));
    let jitter = option(args.jitter.map(|on| quote!(#on)));
    let dead_letter = option(args.dead_letter.as_ref().map(|d| quote!(#d)));
    let weight = option(args.weight.map(|n| quote!(#n)));
    let handler_timeout_ms = option(args.handler_timeout_ms.map(|n| quote!(#n)));
    let ack = option(args.ack.map(|ack| match ack {
        Ack::Ack => quote!(#private::AckPolicy::Ack),
        Ack::Manual => quote!(#private::AckPolicy::Manual),
        Ack::AckDelete(delete_ref) => {
            let variant = match delete_ref {
                DeleteRef::KeepRef => quote!(KeepRef),
                DeleteRef::DelRef => quote!(DelRef),
                DeleteRef::Acked => quote!(Acked),
            };
            quote!(#private::AckPolicy::AckDelete(#private::DeleteRef::#variant))
        }
    }));
    let on_exhausted = option(args.failure.map(|failure| match failure {
        Failure::DeadLetter => quote!(#private::OnExhausted::DeadLetter),
        Failure::LeavePending => quote!(#private::OnExhausted::LeavePending),
    }));
    let start_from = option(args.start_from.map(|start| match start {
        Start::Earliest => quote!(#private::StartFrom::Earliest),
        Start::Latest => quote!(#private::StartFrom::Latest),
    }));
    let shard_count = option(args.shard_count.map(|n| quote!(#n)));
    let line = quote_spanned!(span=> ::core::line!());
    // Naming a deprecated item, spanned on the user's `"ack_delete"`, makes rustc warn right there.
    let deprecated_ack = args
        .deprecated_ack
        .map(|span| quote_spanned!(span=> const _: () = #private::deprecated::ACK_DELETE;));

    quote! {
        #function

        #[doc(hidden)]
        const _: () = {
            #deprecated_ack
            #make_handler

            #private::inventory::submit! {
                #private::ListenerRegistration {
                    handler_name: ::core::stringify!(#name),
                    module_path: ::core::module_path!(),
                    file: ::core::file!(),
                    line: #line,
                    stream: #stream,
                    group: #group,
                    concurrency: #concurrency,
                    id: #id,
                    batch_size: #batch_size,
                    block_ms: #block_ms,
                    ack: #ack,
                    on_exhausted: #on_exhausted,
                    max_deliveries: #max_deliveries,
                    initial_backoff_ms: #initial_backoff_ms,
                    max_backoff_ms: #max_backoff_ms,
                    jitter: #jitter,
                    dead_letter: #dead_letter,
                    weight: #weight,
                    handler_timeout_ms: #handler_timeout_ms,
                    start_from: #start_from,
                    shard_count: #shard_count,
                    payload: #payload,
                    payload_type: #payload_type,
                    make_handler: __stream_listener_make_handler,
                }
            }
        };
    }
}

fn option(value: Option<TokenStream>) -> TokenStream {
    match value {
        Some(value) => quote!(::core::option::Option::Some(#value)),
        None => quote!(::core::option::Option::None),
    }
}
