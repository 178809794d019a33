//! Checks on the annotated function, each error pointing at the part of the signature that is wrong.

use syn::{FnArg, GenericArgument, PathArguments, ReturnType, Type};

use super::Errors;

const ARGUMENT_HINT: &str = "`msg: Message<T>` (JSON payload decoded into `T`), `msg: RawMessage` \
     (payload bytes), `msg: Message<Fields>` (the entry's field map) or `batch: Vec<Message<T>>` (a batch)";

/// How the handler's payload is decoded, read off its argument type. Built once per handler: its size
/// does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum Payload {
    /// `Message<T>`: JSON into `T`.
    Json(Type),
    /// `RawMessage` or `Message<Vec<u8>>`.
    Raw,
    /// `Message<Fields>`: the entry's field map (entries written by other clients).
    Fields,
    /// `Vec<Message<T>>`: a batch handler of JSON payloads.
    JsonBatch(Type),
}

/// A handler signature that passed every check.
#[derive(Debug)]
pub(crate) struct Handler {
    /// The argument type exactly as written.
    pub(crate) argument: Type,
    /// How to decode it.
    pub(crate) payload: Payload,
    /// The second argument's type, `State<T>` as written, if there is one.
    pub(crate) state: Option<Type>,
}

impl Handler {
    /// Check the signature; `None` if anything was wrong (the reasons are in `errors`).
    pub(crate) fn check(function: &syn::ItemFn, errors: &mut Errors) -> Option<Self> {
        let sig = &function.sig;
        let mut ok = true;
        let mut fail = |errors: &mut Errors, error: syn::Error| {
            errors.push(error);
            ok = false;
        };

        if sig.asyncness.is_none() {
            fail(
                errors,
                syn::Error::new(
                    sig.fn_token.span,
                    "`#[stream_listener]` handlers must be `async fn`: add `async` before `fn`",
                ),
            );
        }
        if let Some(unsafety) = &sig.unsafety {
            fail(
                errors,
                syn::Error::new(
                    unsafety.span,
                    "`#[stream_listener]` handlers cannot be `unsafe`",
                ),
            );
        }
        if let Some(abi) = &sig.abi {
            fail(
                errors,
                syn::Error::new_spanned(abi, "`#[stream_listener]` handlers cannot have an ABI"),
            );
        }
        if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
            fail(
                errors,
                syn::Error::new_spanned(
                    &sig.generics,
                    "`#[stream_listener]` handlers cannot be generic: the registration needs one \
                     concrete function; write a non-generic wrapper that calls the generic one",
                ),
            );
        }
        if let Some(variadic) = &sig.variadic {
            fail(
                errors,
                syn::Error::new_spanned(
                    variadic,
                    "`#[stream_listener]` handlers cannot be variadic",
                ),
            );
        }

        // A `self` receiver gets its own error; the message-count check looks at the other arguments.
        let mut argument = None;
        let mut state = None;
        let mut typed_index = 0;
        for input in &sig.inputs {
            let index = typed_index;
            if matches!(input, FnArg::Typed(_)) {
                typed_index += 1;
            }
            match input {
                FnArg::Receiver(receiver) => fail(
                    errors,
                    syn::Error::new_spanned(
                        receiver,
                        "`#[stream_listener]` handlers cannot take `self`: use a free function \
                         (shared state can live in a `static`)",
                    ),
                ),
                FnArg::Typed(typed) if index == 0 => argument = Some(&*typed.ty),
                FnArg::Typed(typed) if index == 1 && is_state(&typed.ty) => {
                    state = Some((*typed.ty).clone())
                }
                FnArg::Typed(typed) if index == 1 => fail(
                    errors,
                    syn::Error::new_spanned(
                        &typed.ty,
                        "the second argument of a `#[stream_listener]` handler must be `State<T>`: \
                         a value registered with `Runtime::state(..)`, e.g. `State(db): State<Db>`",
                    ),
                ),
                FnArg::Typed(typed) => fail(
                    errors,
                    syn::Error::new_spanned(
                        typed,
                        format!(
                            "`#[stream_listener]` handlers take the message and at most one `State<T>`: \
                             {ARGUMENT_HINT}"
                        ),
                    ),
                ),
            }
        }
        if typed_index == 0 && sig.receiver().is_none() {
            fail(
                errors,
                syn::Error::new(
                    sig.paren_token.span.join(),
                    format!(
                        "`#[stream_listener]` handlers take the message as their first argument: \
                         {ARGUMENT_HINT}"
                    ),
                ),
            );
        }
        let payload = argument.and_then(|ty| match payload_of(ty) {
            Some(payload) => Some(payload),
            None => {
                fail(
                    errors,
                    syn::Error::new_spanned(
                        ty,
                        format!("the handler argument must be {ARGUMENT_HINT}"),
                    ),
                );
                None
            }
        });

        match &sig.output {
            ReturnType::Default => fail(
                errors,
                syn::Error::new(
                    sig.paren_token.span.close(),
                    "`#[stream_listener]` handlers must return `Result<(), E>` with `E: Display`: \
                     add `-> Result<(), E>`",
                ),
            ),
            ReturnType::Type(_, ty) if !is_result(ty) => fail(
                errors,
                syn::Error::new_spanned(
                    ty,
                    "`#[stream_listener]` handlers must return `Result<(), E>` with `E: Display`: \
                     `Ok` acknowledges the entry, `Err` retries or dead-letters it",
                ),
            ),
            ReturnType::Type(..) => {}
        }

        match (ok, argument, payload) {
            (true, Some(argument), Some(payload)) => Some(Self {
                argument: argument.clone(),
                payload,
                state,
            }),
            _ => None,
        }
    }
}

/// Strip parentheses and invisible groups.
fn peel(ty: &Type) -> &Type {
    match ty {
        Type::Group(group) => peel(&group.elem),
        Type::Paren(paren) => peel(&paren.elem),
        other => other,
    }
}

/// The last path segment of a plain path type.
fn last_segment(ty: &Type) -> Option<&syn::PathSegment> {
    match peel(ty) {
        Type::Path(path) if path.qself.is_none() => path.path.segments.last(),
        _ => None,
    }
}

/// The single type argument of `Name<T>`.
fn single_type_argument(segment: &syn::PathSegment) -> Option<&Type> {
    let PathArguments::AngleBracketed(args) = &segment.arguments else {
        return None;
    };
    let mut types = args.args.iter();
    match (types.next(), types.next()) {
        (Some(GenericArgument::Type(ty)), None) => Some(ty),
        _ => None,
    }
}

fn payload_of(ty: &Type) -> Option<Payload> {
    let segment = last_segment(ty)?;
    if segment.ident == "Vec" {
        let message = last_segment(single_type_argument(segment)?)?;
        if message.ident != "Message" {
            return None;
        }
        return Some(Payload::JsonBatch(single_type_argument(message)?.clone()));
    }
    if segment.ident == "RawMessage" && segment.arguments.is_none() {
        return Some(Payload::Raw);
    }
    if segment.ident != "Message" {
        return None;
    }
    let inner = single_type_argument(segment)?;
    if is_bytes(inner) {
        Some(Payload::Raw)
    } else if last_segment(inner)
        .is_some_and(|segment| segment.ident == "Fields" && segment.arguments.is_none())
    {
        Some(Payload::Fields)
    } else {
        Some(Payload::Json(inner.clone()))
    }
}

/// `Vec<u8>` (under any path).
fn is_bytes(ty: &Type) -> bool {
    last_segment(ty)
        .filter(|segment| segment.ident == "Vec")
        .and_then(single_type_argument)
        .and_then(last_segment)
        .is_some_and(|segment| segment.ident == "u8" && segment.arguments.is_none())
}

/// `State<T>` (under any path).
fn is_state(ty: &Type) -> bool {
    last_segment(ty)
        .is_some_and(|segment| segment.ident == "State" && single_type_argument(segment).is_some())
}

fn is_result(ty: &Type) -> bool {
    last_segment(ty).is_some_and(|segment| segment.ident == "Result")
}
