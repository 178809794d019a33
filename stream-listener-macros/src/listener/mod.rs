//! Expansion of `#[stream_listener]`: parse the arguments and the handler, validate both as a whole
//! (collecting every error), then emit the function unchanged plus one `inventory::submit!`.

mod args;
mod emit;
mod handler;

use proc_macro2::TokenStream;
use quote::{quote, ToTokens};

/// Collects every error of one invocation, so the user sees all of them at once (serde_derive's `Ctxt`).
#[derive(Default)]
pub(crate) struct Errors {
    combined: Option<syn::Error>,
}

impl Errors {
    /// Record an error.
    pub(crate) fn push(&mut self, error: syn::Error) {
        match &mut self.combined {
            Some(combined) => combined.combine(error),
            None => self.combined = Some(error),
        }
    }

    /// Record an error spanned on `span`.
    pub(crate) fn at(&mut self, span: proc_macro2::Span, message: impl std::fmt::Display) {
        self.push(syn::Error::new(span, message));
    }

    /// Record an error spanned on the tokens of `tokens`.
    pub(crate) fn on(&mut self, tokens: impl ToTokens, message: impl std::fmt::Display) {
        self.push(syn::Error::new_spanned(tokens, message));
    }

    /// `Err` with everything recorded, if anything was.
    pub(crate) fn finish(self) -> Result<(), syn::Error> {
        self.combined.map_or(Ok(()), Err)
    }
}

/// The whole attribute: arguments plus the item it is placed on.
pub(crate) fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let function: syn::ItemFn = match syn::parse2(item.clone()) {
        Ok(function) => function,
        Err(_) => {
            let error = syn::Error::new_spanned(
                &item,
                "`#[stream_listener]` can only be placed on an `async fn`",
            )
            .into_compile_error();
            return quote!(#item #error);
        }
    };

    let mut errors = Errors::default();
    let args = args::Args::parse(args, &mut errors);
    let handler = handler::Handler::check(&function, &mut errors);
    match (errors.finish(), args, handler) {
        (Ok(()), Some(args), Some(handler)) => emit::registration(&function, &args, &handler),
        (result, _, _) => {
            // As tokio-macros does: keep the function so the rest of the crate and the IDE still see it.
            let error = result
                .err()
                .unwrap_or_else(|| {
                    syn::Error::new(
                        proc_macro2::Span::call_site(),
                        "invalid `#[stream_listener]`",
                    )
                })
                .into_compile_error();
            quote!(#item #error)
        }
    }
}
