//! The feature `opentelemetry`: W3C trace context in [`Headers`] (`traceparent`, `tracestate`), put in by
//! the producer and taken out by the consumer's `message` and `batch` spans, through
//! [`tracing-opentelemetry`](https://docs.rs/tracing-opentelemetry)'s span extension.
//!
//! The headers are always W3C trace context, whatever text-map propagator the application installed
//! globally, so that producers and consumers of one stream agree without configuration.

use std::str::FromStr;

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::headers::Headers;

/// The W3C `traceparent` header.
pub(crate) const TRACEPARENT: &str = "traceparent";
/// The W3C `tracestate` header.
pub(crate) const TRACESTATE: &str = "tracestate";

/// Puts the current span's context into `headers`, unless they carry a `traceparent` already or there
/// is no sampled-or-not valid context (no OpenTelemetry layer, no span).
pub(crate) fn inject(headers: &mut Headers) {
    if headers.get(TRACEPARENT).is_some() {
        return;
    }
    let context = tracing::Span::current().context();
    let span = context.span();
    let span_context = span.span_context();
    if !span_context.is_valid() {
        return;
    }
    headers.insert(TRACEPARENT, traceparent(span_context));
    let state = span_context.trace_state().header();
    if !state.is_empty() {
        headers.insert(TRACESTATE, state);
    }
}

fn traceparent(context: &SpanContext) -> String {
    format!(
        "00-{:032x}-{:016x}-{:02x}",
        context.trace_id(),
        context.span_id(),
        context.trace_flags().to_u8()
    )
}

/// The remote span context in `headers`, if their `traceparent` is valid (version `00`, or a later
/// version's first four parts, as W3C asks); an invalid `tracestate` is dropped.
pub(crate) fn extract(headers: &Headers) -> Option<SpanContext> {
    let parent = headers.get(TRACEPARENT)?.trim();
    let mut parts = parent.split('-');
    let (version, trace_id, span_id, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let rest = parts.next();
    let valid_version = version.len() == 2
        && version
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        && version != "ff";
    if !valid_version || (version == "00" && rest.is_some()) {
        return None;
    }
    let lower_hex = |s: &str, len: usize| {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    if !lower_hex(trace_id, 32) || !lower_hex(span_id, 16) || !lower_hex(flags, 2) {
        return None;
    }
    let trace_id = TraceId::from_hex(trace_id).ok()?;
    let span_id = SpanId::from_hex(span_id).ok()?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    let state = headers
        .get(TRACESTATE)
        .and_then(|state| TraceState::from_str(state).ok())
        .unwrap_or_default();
    let context = SpanContext::new(
        trace_id,
        span_id,
        TraceFlags::new(flags) & TraceFlags::SAMPLED,
        true,
        state,
    );
    context.is_valid().then_some(context)
}

/// Where a handled entry came from: the messaging semantic conventions' attributes.
pub(crate) struct Source<'a> {
    pub(crate) stream: &'a str,
    pub(crate) group: &'a str,
    pub(crate) shard: u32,
}

impl Source<'_> {
    fn set(&self, span: &tracing::Span) {
        span.set_attribute("messaging.system", "redis");
        span.set_attribute("messaging.operation.type", "process");
        span.set_attribute("messaging.destination.name", self.stream.to_owned());
        span.set_attribute("messaging.consumer.group.name", self.group.to_owned());
        span.set_attribute("messaging.destination.partition.id", self.shard.to_string());
    }
}

/// A single handler's `message` span: the producer's context as its parent, and the attributes.
pub(crate) fn message_span(
    span: &tracing::Span,
    source: &Source<'_>,
    entry_id: &str,
    headers: &Headers,
) {
    source.set(span);
    span.set_attribute("messaging.message.id", entry_id.to_owned());
    if let Some(parent) = extract(headers) {
        // Fails only without an OpenTelemetry layer, where there is nothing to parent.
        let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(parent));
    }
}

/// A batch handler's `batch` span: a link to every entry's producer context, and the attributes.
pub(crate) fn batch_span<'a>(
    span: &tracing::Span,
    source: &Source<'_>,
    headers: impl IntoIterator<Item = &'a Headers>,
) {
    source.set(span);
    let mut count = 0i64;
    for headers in headers {
        count += 1;
        if let Some(context) = extract(headers) {
            span.add_link(context);
        }
    }
    span.set_attribute("messaging.batch.message_count", count);
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn a_valid_traceparent_and_tracestate_are_extracted_and_written_back_alike() {
        let headers = Headers::new()
            .with(TRACEPARENT, PARENT)
            .with(TRACESTATE, "vendor=value,other=x");
        let context = extract(&headers).expect("valid");
        assert!(context.is_remote() && context.is_sampled());
        assert_eq!(traceparent(&context), PARENT);
        assert_eq!(context.trace_state().header(), "vendor=value,other=x");
    }

    #[test]
    fn an_invalid_traceparent_is_ignored() {
        for bad in [
            "",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
            "00-0af7651916cd43dd8448eb211c8031-b7ad6b7169203331-01",
        ] {
            assert!(
                extract(&Headers::new().with(TRACEPARENT, bad)).is_none(),
                "{bad}"
            );
        }
        // A later version may add parts.
        let later = "cc-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-what-ever";
        assert!(extract(&Headers::new().with(TRACEPARENT, later)).is_some());
        assert!(extract(&Headers::new()).is_none());
    }

    #[test]
    fn without_a_span_nothing_is_injected() {
        let mut headers = Headers::new().with("a", "1");
        inject(&mut headers);
        assert_eq!(headers, Headers::new().with("a", "1"));
    }
}
