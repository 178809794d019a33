//! A consumer whose ack policy deletes entries other consumer groups of the stream may not have read yet
//! says so at start: a WARN naming those groups. A safe policy, or a stream read by one group only, says
//! nothing. The shared log capture (`stream_listener_tests::logs`) records the events.

use stream_listener::consumer::{other_groups, BoxedHandler, Consumer, ConsumerConfig};
use stream_listener::topology::Topology;
use stream_listener::{AckPolicy, DeleteRef, RawMessage, StartFrom};
use stream_listener_test_support::RedisServer;
use stream_listener_tests::logs::{self, Captured};
use tracing::Level;

/// The WARN and INFO events about `stream`'s other groups.
fn shared_stream_events(stream: &str) -> Vec<Captured> {
    logs::events()
        .into_iter()
        .filter(|e| {
            e.level <= Level::INFO
                && e.fields.0.get("stream").is_some_and(|s| s == stream)
                && e.fields.0.contains_key("other_groups")
        })
        .collect()
}

fn handler() -> BoxedHandler {
    BoxedHandler::raw(|_: RawMessage| async { Ok::<(), String>(()) })
}

/// Connects a consumer of `group` on `stream` with `policy` (which logs at connect), and returns what it
/// logged about other groups.
async fn start_with(
    server: &RedisServer,
    stream: &str,
    group: &str,
    policy: AckPolicy,
) -> Vec<Captured> {
    let mut config = ConsumerConfig::new(stream, group, format!("{group}-m0"));
    config.ack_policy = policy;
    let client = redis::Client::open(server.url().as_str()).unwrap();
    let consumer = Consumer::connect(client, config, handler())
        .await
        .expect("consumer");
    drop(consumer);
    shared_stream_events(stream)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleting_policy_on_a_stream_other_groups_read_is_a_warning_naming_them() {
    logs::capture();
    let server = RedisServer::start();
    let client = redis::Client::open(server.url().as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();

    // One stream read by one group: nothing to say, whatever the policy.
    Topology::ensure(&mut conn, "alone", 2).await.unwrap();
    Topology::ensure_group(&mut conn, "alone", "billing", StartFrom::Earliest)
        .await
        .unwrap();
    let config = ConsumerConfig::new("alone", "billing", "m");
    assert_eq!(
        other_groups(&mut conn, &config).await.unwrap(),
        Vec::<String>::new()
    );
    let policy = AckPolicy::AckDelete(DeleteRef::KeepRef);
    assert!(start_with(&server, "alone", "billing", policy)
        .await
        .is_empty());

    // Three groups read "shared" (the library's bootstrap group does not count).
    Topology::ensure(&mut conn, "shared", 2).await.unwrap();
    for group in ["billing", "audit", "search"] {
        Topology::ensure_group(&mut conn, "shared", group, StartFrom::Earliest)
            .await
            .unwrap();
    }
    let config = ConsumerConfig::new("shared", "billing", "m");
    assert_eq!(
        other_groups(&mut conn, &config).await.unwrap(),
        ["audit", "search"]
    );

    // Plain acks never delete: silent.
    assert!(start_with(&server, "shared", "billing", AckPolicy::Ack)
        .await
        .is_empty());
    assert!(start_with(&server, "shared", "billing", AckPolicy::Manual)
        .await
        .is_empty());

    // Deleting whatever the others did: a WARN naming them, once per consumer.
    for (n, mode) in [DeleteRef::KeepRef, DeleteRef::DelRef]
        .into_iter()
        .enumerate()
    {
        let events = start_with(&server, "shared", "billing", AckPolicy::AckDelete(mode)).await;
        assert_eq!(events.len(), n + 1, "{events:?}");
        let Captured { level, fields, .. } = events.last().unwrap();
        assert_eq!(*level, Level::WARN, "{fields:?}");
        assert_eq!(fields.0["other_groups"], "audit, search");
        assert_eq!(fields.0["group"], "billing");
    }

    // Deleting only what every group acknowledged loses nothing, but a group that acks plainly keeps
    // every entry in the stream: an INFO, not a WARN.
    let events = start_with(
        &server,
        "shared",
        "billing",
        AckPolicy::AckDelete(DeleteRef::Acked),
    )
    .await;
    assert_eq!(events.len(), 3, "{events:?}");
    let Captured { level, fields, .. } = events.last().unwrap();
    assert_eq!(*level, Level::INFO, "{fields:?}");
    assert_eq!(fields.0["other_groups"], "audit, search");
}
