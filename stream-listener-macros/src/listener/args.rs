//! The attribute's `key = value` arguments: each key at most once, each value checked on its own, then
//! the set checked as a whole. Every problem is recorded, spanned on the offending token.

use std::collections::HashMap;

use proc_macro2::{Span, TokenStream};
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, Lit, LitInt, LitStr, Meta, Token};

use super::Errors;

/// Every key the attribute accepts, in the order the error message lists them.
const KEYS: &[&str] = &[
    "stream",
    "group",
    "concurrency",
    "id",
    "batch_size",
    "block_ms",
    "ack",
    "failure",
    "max_deliveries",
    "initial_backoff_ms",
    "max_backoff_ms",
    "jitter",
    "dead_letter",
    "weight",
    "handler_timeout_ms",
    "start_from",
    "shard_count",
];

/// The `start_from` values, with the `StartFrom` each stands for.
const START_VALUES: &[(&str, Start)] = &[("earliest", Start::Earliest), ("latest", Start::Latest)];

/// Mirror of the runtime's `StartFrom`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Start {
    Earliest,
    Latest,
}

/// The `ack` values, with the `AckPolicy` each stands for. The deleting ones say whose reads they respect:
/// `acked` waits for every group, `keepref` and `delref` delete what other groups may not have read.
const ACK_VALUES: &[(&str, Ack)] = &[
    ("ack", Ack::Ack),
    ("ack_delete_acked", Ack::AckDelete(DeleteRef::Acked)),
    ("ack_delete_keepref", Ack::AckDelete(DeleteRef::KeepRef)),
    ("ack_delete_delref", Ack::AckDelete(DeleteRef::DelRef)),
    ("manual", Ack::Manual),
];

/// The old spelling of `ack_delete_keepref`: still accepted, with a deprecation warning (its short name
/// made the policy that loses entries for other groups look like the default way to delete).
const DEPRECATED_ACK_DELETE: &str = "ack_delete";

/// The `failure` values, with the `OnExhausted` each stands for.
const FAILURE_VALUES: &[(&str, Failure)] = &[
    ("retry_then_dead_letter", Failure::DeadLetter),
    ("leave_pending", Failure::LeavePending),
];

/// Mirror of the runtime's `AckPolicy` (variant names follow it, hence the allow).
#[allow(clippy::enum_variant_names)]
#[derive(Debug, Clone, Copy)]
pub(crate) enum Ack {
    Ack,
    AckDelete(DeleteRef),
    Manual,
}

/// Mirror of the runtime's `DeleteRef`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum DeleteRef {
    KeepRef,
    DelRef,
    Acked,
}

/// Mirror of the runtime's `OnExhausted`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Failure {
    DeadLetter,
    LeavePending,
}

/// The validated arguments.
#[derive(Debug)]
pub(crate) struct Args {
    pub(crate) stream: String,
    pub(crate) group: String,
    pub(crate) concurrency: usize,
    pub(crate) id: Option<String>,
    pub(crate) batch_size: Option<usize>,
    pub(crate) block_ms: Option<u64>,
    pub(crate) ack: Option<Ack>,
    /// Where the deprecated `ack = "ack_delete"` was written, if it was.
    pub(crate) deprecated_ack: Option<Span>,
    pub(crate) failure: Option<Failure>,
    pub(crate) max_deliveries: Option<u32>,
    pub(crate) initial_backoff_ms: Option<u64>,
    pub(crate) max_backoff_ms: Option<u64>,
    pub(crate) jitter: Option<bool>,
    pub(crate) dead_letter: Option<String>,
    pub(crate) weight: Option<u32>,
    pub(crate) handler_timeout_ms: Option<u64>,
    pub(crate) start_from: Option<Start>,
    pub(crate) shard_count: Option<u32>,
}

/// Arguments as they are being collected: value plus the span of its key.
#[derive(Default)]
struct Raw {
    seen: HashMap<String, Span>,
    stream: Option<String>,
    group: Option<String>,
    concurrency: Option<usize>,
    id: Option<String>,
    batch_size: Option<usize>,
    block_ms: Option<u64>,
    ack: Option<Ack>,
    deprecated_ack: Option<Span>,
    failure: Option<(Failure, Span)>,
    max_deliveries: Option<u32>,
    initial_backoff_ms: Option<(u64, Span)>,
    max_backoff_ms: Option<u64>,
    jitter: Option<bool>,
    dead_letter: Option<(String, Span)>,
    weight: Option<u32>,
    handler_timeout_ms: Option<u64>,
    start_from: Option<Start>,
    shard_count: Option<u32>,
}

impl Args {
    /// Parse and validate; `None` if anything was wrong (the reasons are in `errors`).
    pub(crate) fn parse(tokens: TokenStream, errors: &mut Errors) -> Option<Self> {
        let metas = match Punctuated::<Meta, Token![,]>::parse_terminated.parse2(tokens) {
            Ok(metas) => metas,
            Err(error) => {
                errors.push(error);
                return None;
            }
        };
        let mut raw = Raw::default();
        let mut ok = true;
        for meta in &metas {
            ok &= raw.add(meta, errors);
        }
        ok &= raw.check_whole(errors);
        if !ok {
            return None;
        }
        let (Some(stream), Some(group)) = (raw.stream, raw.group) else {
            return None;
        };
        Some(Self {
            stream,
            group,
            concurrency: raw.concurrency.unwrap_or(1),
            id: raw.id,
            batch_size: raw.batch_size,
            block_ms: raw.block_ms,
            ack: raw.ack,
            deprecated_ack: raw.deprecated_ack,
            failure: raw.failure.map(|(f, _)| f),
            max_deliveries: raw.max_deliveries,
            initial_backoff_ms: raw.initial_backoff_ms.map(|(ms, _)| ms),
            max_backoff_ms: raw.max_backoff_ms,
            jitter: raw.jitter,
            dead_letter: raw.dead_letter.map(|(d, _)| d),
            weight: raw.weight,
            handler_timeout_ms: raw.handler_timeout_ms,
            start_from: raw.start_from,
            shard_count: raw.shard_count,
        })
    }
}

impl Raw {
    /// Record one `key = value`; false if it was rejected.
    fn add(&mut self, meta: &Meta, errors: &mut Errors) -> bool {
        let (path, value) = match meta {
            Meta::NameValue(nv) => (&nv.path, &nv.value),
            Meta::Path(path) => {
                errors.on(
                    path,
                    format!(
                        "expected `{} = ...`: every argument is a `key = value` pair",
                        path_name(path)
                    ),
                );
                return false;
            }
            Meta::List(list) => {
                errors.on(
                    meta,
                    format!(
                        "expected `{} = ...`: every argument is a `key = value` pair",
                        path_name(&list.path)
                    ),
                );
                return false;
            }
        };
        let key = path_name(path);
        if !KEYS.contains(&key.as_str()) {
            errors.on(
                path,
                format!(
                    "unknown argument `{key}`; expected one of: {}",
                    KEYS.iter()
                        .map(|k| format!("`{k}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            );
            return false;
        }
        if self.seen.contains_key(&key) {
            errors.on(
                path,
                format!("duplicate argument `{key}`: each argument may be given once"),
            );
            return false;
        }
        self.seen.insert(key.clone(), path.span());

        let result = match key.as_str() {
            "stream" => string(value, &key).and_then(|s| {
                let text = s.value();
                if text.trim().is_empty() {
                    Err(syn::Error::new(s.span(), "`stream` must not be empty"))
                } else if text.contains(['{', '}']) {
                    Err(syn::Error::new(
                        s.span(),
                        "`stream` must not contain `{` or `}`: shard keys are `{stream}:{i}`, and a hash \
                         tag would put every shard in one Redis Cluster slot",
                    ))
                } else {
                    self.stream = Some(text);
                    Ok(())
                }
            }),
            "group" => non_empty(value, &key).map(|s| self.group = Some(s.value())),
            "id" => non_empty(value, &key).and_then(|s| {
                let text = s.value();
                if text
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
                {
                    self.id = Some(text);
                    Ok(())
                } else {
                    Err(syn::Error::new(
                        s.span(),
                        "`id` may contain only ASCII letters, digits, `.`, `_` and `-`",
                    ))
                }
            }),
            "dead_letter" => {
                non_empty(value, &key).map(|s| self.dead_letter = Some((s.value(), s.span())))
            }
            "concurrency" => at_least_one(value, &key).map(|n| self.concurrency = Some(n)),
            "batch_size" => at_least_one(value, &key).map(|n| self.batch_size = Some(n)),
            "max_deliveries" => at_least_one(value, &key).map(|n| self.max_deliveries = Some(n)),
            "weight" => at_least_one(value, &key).map(|n| self.weight = Some(n)),
            "handler_timeout_ms" => {
                at_least_one(value, &key).map(|n| self.handler_timeout_ms = Some(n))
            }
            "shard_count" => at_least_one(value, &key).map(|n| self.shard_count = Some(n)),
            "start_from" => {
                choice(value, &key, START_VALUES).map(|(s, _)| self.start_from = Some(s))
            }
            "block_ms" => integer(value, &key)
                .and_then(|lit| lit.base10_parse())
                .map(|n| self.block_ms = Some(n)),
            "initial_backoff_ms" => milliseconds(value, &key)
                .map(|ms| self.initial_backoff_ms = Some((ms, value.span()))),
            "max_backoff_ms" => milliseconds(value, &key).map(|ms| self.max_backoff_ms = Some(ms)),
            "jitter" => boolean(value, &key).map(|on| self.jitter = Some(on)),
            "ack" => match value {
                Expr::Lit(syn::ExprLit {
                    lit: Lit::Str(s), ..
                }) if s.value() == DEPRECATED_ACK_DELETE => {
                    self.ack = Some(Ack::AckDelete(DeleteRef::KeepRef));
                    self.deprecated_ack = Some(s.span());
                    Ok(())
                }
                _ => choice(value, &key, ACK_VALUES).map(|(a, _)| self.ack = Some(a)),
            },
            "failure" => choice(value, &key, FAILURE_VALUES).map(|f| self.failure = Some(f)),
            _ => unreachable!("every key of KEYS is handled"),
        };
        result.map_err(|error| errors.push(error)).is_ok()
    }

    /// Checks that need more than one argument: required keys, and combinations that make no sense.
    fn check_whole(&self, errors: &mut Errors) -> bool {
        let mut ok = true;
        for (key, present) in [
            ("stream", self.seen.contains_key("stream")),
            ("group", self.seen.contains_key("group")),
        ] {
            if !present {
                errors.at(
                    Span::call_site(),
                    format!(
                        "missing required argument `{key}`, e.g. \
                         `#[stream_listener(stream = \"orders\", group = \"billing\")]`"
                    ),
                );
                ok = false;
            }
        }
        if let (Some((Failure::LeavePending, _)), Some((_, span))) =
            (&self.failure, &self.dead_letter)
        {
            errors.at(
                *span,
                "`dead_letter` has no effect with `failure = \"leave_pending\"`: nothing is dead-lettered",
            );
            ok = false;
        }
        if let (Some((initial, span)), Some(max)) = (&self.initial_backoff_ms, self.max_backoff_ms)
        {
            if *initial > max {
                errors.at(
                    *span,
                    format!(
                        "`initial_backoff_ms` ({initial}) is above `max_backoff_ms` ({max}): every wait would be \
                         `max_backoff_ms`"
                    ),
                );
                ok = false;
            }
        }
        ok
    }
}

fn path_name(path: &syn::Path) -> String {
    path.segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect::<Vec<_>>()
        .join("::")
}

/// The literal inside a possibly parenthesised / invisible-grouped expression.
fn literal(value: &Expr) -> Option<&Lit> {
    match value {
        Expr::Lit(lit) => Some(&lit.lit),
        Expr::Group(group) => literal(&group.expr),
        Expr::Paren(paren) => literal(&paren.expr),
        _ => None,
    }
}

fn string<'a>(value: &'a Expr, key: &str) -> syn::Result<&'a LitStr> {
    match literal(value) {
        Some(Lit::Str(s)) => Ok(s),
        _ => Err(syn::Error::new_spanned(
            value,
            format!("`{key}` expects a string literal, e.g. `{key} = \"...\"`"),
        )),
    }
}

fn non_empty<'a>(value: &'a Expr, key: &str) -> syn::Result<&'a LitStr> {
    let s = string(value, key)?;
    if s.value().trim().is_empty() {
        Err(syn::Error::new(
            s.span(),
            format!("`{key}` must not be empty"),
        ))
    } else {
        Ok(s)
    }
}

fn integer<'a>(value: &'a Expr, key: &str) -> syn::Result<&'a LitInt> {
    match literal(value) {
        Some(Lit::Int(n)) => Ok(n),
        _ => Err(syn::Error::new_spanned(
            value,
            format!("`{key}` expects an integer literal, e.g. `{key} = 4`"),
        )),
    }
}

/// A duration in milliseconds: a non-negative integer literal.
fn milliseconds(value: &Expr, key: &str) -> syn::Result<u64> {
    integer(value, key)?.base10_parse().map_err(|_| {
        syn::Error::new_spanned(
            value,
            format!("`{key}` expects a non-negative integer of milliseconds, e.g. `{key} = 250`"),
        )
    })
}

fn boolean(value: &Expr, key: &str) -> syn::Result<bool> {
    match literal(value) {
        Some(Lit::Bool(b)) => Ok(b.value),
        _ => Err(syn::Error::new_spanned(
            value,
            format!("`{key}` expects `true` or `false`, e.g. `{key} = false`"),
        )),
    }
}

fn at_least_one<N>(value: &Expr, key: &str) -> syn::Result<N>
where
    N: std::str::FromStr + PartialOrd + From<u8>,
    N::Err: std::fmt::Display,
{
    let lit = integer(value, key)?;
    let n: N = lit.base10_parse()?;
    if n < N::from(1) {
        return Err(syn::Error::new(
            lit.span(),
            format!("`{key}` must be at least 1"),
        ));
    }
    Ok(n)
}

fn choice<T: Copy>(value: &Expr, key: &str, options: &[(&str, T)]) -> syn::Result<(T, Span)> {
    let s = string(value, key)?;
    let text = s.value();
    options
        .iter()
        .find(|(name, _)| *name == text)
        .map(|(_, v)| (*v, s.span()))
        .ok_or_else(|| {
            syn::Error::new(
                s.span(),
                format!(
                    "unknown `{key}` value \"{text}\"; expected one of: {}",
                    options
                        .iter()
                        .map(|(name, _)| format!("\"{name}\""))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The attribute's docs (`src/lib.rs`) have a table row for every argument it accepts, and name
    /// every value of the arguments that take one of a list.
    #[test]
    fn every_argument_and_value_is_documented() {
        let docs = include_str!("../lib.rs");
        for key in KEYS {
            assert!(
                docs.contains(&format!("/// | `{key} = ")),
                "no row for `{key}` in the attribute's docs"
            );
        }
        let values = START_VALUES.iter().map(|(v, _)| *v);
        let values = values.chain(ACK_VALUES.iter().map(|(v, _)| *v));
        let values = values.chain(FAILURE_VALUES.iter().map(|(v, _)| *v));
        for value in values.chain([DEPRECATED_ACK_DELETE]) {
            assert!(
                docs.contains(&format!("`\"{value}\"`")),
                "value \"{value}\" not in the attribute's docs"
            );
        }
    }
}
