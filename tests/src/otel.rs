//! The OpenTelemetry harness of the trace-context tests: a process-wide tracing subscriber whose only
//! layer is `tracing-opentelemetry` exporting to an in-memory span exporter, and waits on what it
//! exported.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use opentelemetry::trace::{SpanContext, TraceContextExt, TraceId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

pub use opentelemetry;
pub use opentelemetry_sdk;

static EXPORTER: OnceLock<(InMemorySpanExporter, SdkTracerProvider)> = OnceLock::new();

/// Installs the subscriber (once per test binary) and returns the exporter every span ends up in.
pub fn install() -> InMemorySpanExporter {
    EXPORTER
        .get_or_init(|| {
            let exporter = InMemorySpanExporter::default();
            let provider = SdkTracerProvider::builder()
                .with_simple_exporter(exporter.clone())
                .build();
            let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("tests"));
            tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))
                .expect("no other global subscriber in this test binary");
            (exporter, provider)
        })
        .0
        .clone()
}

/// The OpenTelemetry context of a tracing span.
pub fn span_context(span: &tracing::Span) -> SpanContext {
    span.context().span().span_context().clone()
}

/// Sends `payload` as JSON under `key` inside a new root span `send`; that span's context.
///
/// # Panics
/// If the layer is not installed or the send fails.
pub async fn send_traced(
    producer: &stream_listener::Producer,
    key: &str,
    payload: u32,
) -> SpanContext {
    use tracing::Instrument as _;
    let span = tracing::info_span!("send");
    let context = span_context(&span);
    assert!(context.is_valid(), "the OpenTelemetry layer is installed");
    producer.send(key, &payload).instrument(span).await.unwrap();
    context
}

/// The spans exported so far whose name is `name` and that `pick` accepts; waits up to 20 s for at
/// least `count` of them.
pub async fn wait_for_spans(
    exporter: &InMemorySpanExporter,
    name: &str,
    count: usize,
    pick: impl Fn(&SpanData) -> bool,
) -> Vec<SpanData> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let found: Vec<SpanData> = exporter
            .get_finished_spans()
            .expect("the in-memory exporter answers")
            .into_iter()
            .filter(|span| span.name == name && pick(span))
            .collect();
        if found.len() >= count {
            return found;
        }
        assert!(
            Instant::now() < deadline,
            "{count} `{name}` span(s) never ended: {found:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether `span` belongs to the trace `trace`.
pub fn in_trace(trace: TraceId) -> impl Fn(&SpanData) -> bool {
    move |span| span.span_context.trace_id() == trace
}

/// The value of attribute `key` of `span`, as text.
pub fn attribute(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.to_string())
}
