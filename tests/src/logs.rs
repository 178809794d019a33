//! Log capture for tests that assert on what the library logs: a `tracing-subscriber` layer that records
//! every event with its span's fields and every span created. Install it once per test binary with
//! [`capture`], then read [`events`] and [`spans`].

use std::collections::BTreeMap;
use std::sync::Mutex;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// The fields of an event or a span, each as text (`Debug` unless it is a string).
#[derive(Debug, Default, Clone)]
pub struct Fields(pub BTreeMap<String, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

/// One recorded event.
#[derive(Debug, Clone)]
pub struct Captured {
    /// The event's level.
    pub level: Level,
    /// The module that logged it.
    pub target: String,
    /// The event's own fields (its text under `message`).
    pub fields: Fields,
    /// The span the event is in: its name and fields.
    pub span: Option<(String, Fields)>,
    /// That span's target (what a `RUST_LOG` directive matches).
    pub span_target: Option<String>,
    /// Every field of every span the event is in, innermost first wins.
    pub scope: BTreeMap<String, String>,
}

static EVENTS: Mutex<Vec<Captured>> = Mutex::new(Vec::new());
/// Every span created: name and level.
static SPANS: Mutex<Vec<(String, Level)>> = Mutex::new(Vec::new());

struct Capture;

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        SPANS.lock().unwrap().push((
            attrs.metadata().name().to_owned(),
            *attrs.metadata().level(),
        ));
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let span_target = ctx
            .event_span(event)
            .map(|span| span.metadata().target().to_owned());
        let span = ctx.event_span(event).map(|span| {
            let fields = span
                .extensions()
                .get::<Fields>()
                .cloned()
                .unwrap_or_default();
            (span.name().to_owned(), fields)
        });
        let mut scope = BTreeMap::new();
        if let Some(spans) = ctx.event_scope(event) {
            for span in spans {
                if let Some(fields) = span.extensions().get::<Fields>() {
                    for (k, v) in &fields.0 {
                        scope.entry(k.clone()).or_insert_with(|| v.clone());
                    }
                }
            }
        }
        EVENTS.lock().unwrap().push(Captured {
            level: *event.metadata().level(),
            target: event.metadata().target().to_owned(),
            fields,
            span,
            span_target,
            scope,
        });
    }
}

/// Installs the capturing subscriber as the test binary's global default, once (later calls do nothing):
/// call it at the start of every test that reads the captured logs, before it logs anything. Tests of a
/// binary run in parallel: each picks out its own lines (by member, stream or URL).
pub fn capture() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(Capture))
            .expect("the only subscriber of this test binary");
    });
}

/// Every event recorded so far, oldest first.
pub fn events() -> Vec<Captured> {
    EVENTS.lock().unwrap().clone()
}

/// Every span created so far: name and level.
pub fn spans() -> Vec<(String, Level)> {
    SPANS.lock().unwrap().clone()
}
