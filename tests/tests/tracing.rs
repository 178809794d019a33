//! The handler runs inside a span per message that says where the entry came from, and a healthy idle
//! member logs nothing at INFO or above. A capturing subscriber (a `tracing-subscriber` layer) records
//! every event with its span's fields.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use stream_listener::{ConsumerBuilder, Message};
use stream_listener_test_support::aio::connect;
use stream_listener_test_support::RedisServer;
use stream_listener_tests::{producer, test_runtime, TIMING};
use tokio::time::Instant;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

#[derive(Debug, Serialize, Deserialize)]
struct Job {
    key: String,
}

#[derive(Debug, Default, Clone)]
struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

#[derive(Debug, Clone)]
struct Captured {
    level: Level,
    target: String,
    fields: Fields,
    span: Option<(String, Fields)>,
    /// Every field of every span the event is in, innermost first wins.
    scope: BTreeMap<String, String>,
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
            scope,
        });
    }
}

fn events() -> Vec<Captured> {
    EVENTS.lock().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handler_runs_inside_a_span_per_message_and_an_idle_member_stays_quiet() {
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(Capture))
        .expect("the only subscriber of this test binary");
    let mut redis = RedisServer::start();
    let url = redis.url();
    let producer = producer(&url, "traced", 2).await;
    let receipt = producer
        .send(
            "customer-42",
            &Job {
                key: "customer-42".into(),
            },
        )
        .await
        .unwrap();
    let consumer = ConsumerBuilder::new("traced", "g")
        .member_id("solo")
        .handler(|msg: Message<Job>| async move {
            tokio::task::yield_now().await;
            tracing::info!(key = %msg.payload.key, "handling");
            Ok::<(), String>(())
        });
    let runtime = test_runtime(&url)
        .shutdown_timeout(Duration::from_secs(2))
        .consumer(consumer)
        .start()
        .await
        .unwrap();
    let start = Instant::now();
    let handled = loop {
        if let Some(e) = events()
            .into_iter()
            .find(|e| e.fields.0.get("message").is_some_and(|m| m == "handling"))
        {
            break e;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "never handled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let (name, span) = handled.span.expect("inside a span");
    assert_eq!(name, "message");
    let span = span.0;
    assert_eq!(span["stream"], "traced");
    assert_eq!(span["group"], "g");
    assert_eq!(span["shard"], receipt.shard.to_string());
    assert_eq!(span["entry_id"], receipt.id);
    assert_eq!(span["key"], "customer-42");
    assert_eq!(span["member"], "solo");
    assert_eq!(span["delivery_count"], "1");
    assert!(span["epoch"].parse::<i64>().unwrap() > 0, "{span:?}");

    // Idle from here on: over a second of heartbeats and idle waits, nothing at INFO or above.
    let before = events().len();
    let idle_until = Instant::now() + Duration::from_secs(1);
    while Instant::now() < idle_until {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let loud: Vec<Captured> = events()[before..]
        .iter()
        .filter(|e| e.target.starts_with("stream_listener") && e.level <= Level::INFO)
        .cloned()
        .collect();
    assert!(loud.is_empty(), "an idle member logged: {loud:#?}");

    // The join and the first assignment were logged at INFO, once each, with the shards.
    let info = |message: &str| -> Vec<Captured> {
        events()
            .into_iter()
            .filter(|e| {
                e.level == Level::INFO && e.fields.0.get("message").is_some_and(|m| m == message)
            })
            .collect()
    };
    assert_eq!(info("joined the group").len(), 1, "{:#?}", events());
    let assigned = info("assignment changed");
    assert_eq!(assigned.len(), 1, "{assigned:#?}");
    assert_eq!(assigned[0].fields.0["assigned"], "[0, 1]");
    assert_eq!(assigned[0].fields.0["revoked"], "[]");

    // A fence by the operator: the member logs it with the shards it drops, rejoins and is assigned
    // its shards again, each at INFO.
    let mut store =
        stream_listener::store::GroupStore::create(connect(&url).await, "traced", "g", 2, TIMING)
            .unwrap();
    store
        .command(stream_listener::coordinator::AdminCommand::FenceMember(
            "solo".into(),
        ))
        .await
        .unwrap()
        .unwrap();
    let start = Instant::now();
    while info("joined the group").len() < 2 || info("assignment changed").len() < 3 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no rejoin: {:#?}",
            events()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let fenced = info("ownership invalid: dropping every shard and rejoining");
    assert_eq!(fenced.len(), 1, "{fenced:#?}");
    assert_eq!(fenced[0].fields.0["shards"], "[0, 1]");
    assert_eq!(fenced[0].fields.0["status"], "FencedMemberEpoch");
    let changes = info("assignment changed");
    assert_eq!(changes[1].fields.0["revoked"], "[0, 1]", "{changes:#?}");
    assert_eq!(changes[2].fields.0["assigned"], "[0, 1]", "{changes:#?}");

    // Redis goes away and comes back: failed heartbeats are WARNs, the first one through again an INFO.
    redis.kill();
    let start = Instant::now();
    while !events().iter().any(|e| {
        e.level == Level::WARN
            && e.fields
                .0
                .get("message")
                .is_some_and(|m| m.starts_with("heartbeat"))
    }) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no failed heartbeat"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    redis.restart();
    let start = Instant::now();
    let recovered = loop {
        if let Some(e) = info("heartbeat recovered").pop() {
            break e;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no recovery: {:#?}",
            events()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        recovered.fields.0["failures"].parse::<u32>().unwrap() >= 1,
        "{recovered:#?}"
    );

    runtime.shutdown().await;

    // Every line the member's heartbeat loop, store and consumer logged says which member, stream and
    // group it is about; and every heartbeat had its span, at DEBUG.
    let all = events();
    let member_lines: Vec<&Captured> = all
        .iter()
        .filter(|e| {
            [
                "stream_listener::member",
                "stream_listener::consumer",
                "stream_listener::store",
            ]
            .iter()
            .any(|t| e.target.starts_with(t))
        })
        .collect();
    assert!(member_lines.len() >= 5, "{all:#?}");
    for line in member_lines {
        assert_eq!(
            line.scope.get("member").map(String::as_str),
            Some("solo"),
            "{line:#?}"
        );
        assert_eq!(
            line.scope.get("stream").map(String::as_str),
            Some("traced"),
            "{line:#?}"
        );
        assert_eq!(
            line.scope.get("group").map(String::as_str),
            Some("g"),
            "{line:#?}"
        );
    }
    let spans = SPANS.lock().unwrap().clone();
    assert!(
        spans.contains(&("heartbeat".to_owned(), Level::DEBUG)),
        "{spans:?}"
    );
    assert!(
        spans.contains(&("member".to_owned(), Level::ERROR)),
        "{spans:?}"
    );
}
