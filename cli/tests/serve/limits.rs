//! What the README's limits of clients that do not fence themselves come to, measured: an HTTP member
//! (the Python client) stopped with a read in flight for longer than its lease plus the server's hold,
//! while a member of ours takes its shards over.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use stream_listener::routing::shard_for_key;
use stream_listener_test_support::aio::{poll_until, xpending_count};

use super::client::Stop;
use super::{wait_until, MixedGroup, GROUP, SHARDS, WAIT};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_in_flight_across_a_pause_past_lease_and_hold_is_handled_twice_and_only_that_read() {
    let stream = "in-flight";
    let MixedGroup {
        _redis,
        url,
        _server,
        log,
        production,
        rust,
        py,
    } = MixedGroup::start(stream, "py-a").await;

    // SIGSTOP with a read in flight: it read, and handles nothing until the test lets it go on.
    py.shared.freeze_after_read.store(true, Ordering::SeqCst);
    wait_until("it stops with a read in flight", WAIT, || {
        py.shared.frozen.load(Ordering::SeqCst)
    })
    .await;
    let frozen_at = Instant::now();
    let in_flight = py.shared.in_flight.load(Ordering::SeqCst);
    let py_shards = py.assigned();
    // Past its lease and the hold: our member owns its shards, has claimed what it left pending and goes
    // on with newer entries.
    wait_until(
        "our member handles the stopped member's shards",
        WAIT,
        || py_shards.is_subset(&log.shards_handled_by("rust-a", frozen_at, SHARDS)),
    )
    .await;
    let resumed_at = Instant::now();
    py.shared.frozen.store(false, Ordering::SeqCst);
    let heartbeats = py.shared.heartbeats.load(Ordering::SeqCst);
    wait_until("it heartbeats again, or dies on the answer", WAIT, || {
        py.shared.heartbeats.load(Ordering::SeqCst) > heartbeats || py.died().is_some()
    })
    .await;
    let sent = production.stop().await;

    let complete = poll_until(WAIT, Duration::from_millis(20), || {
        let done = log.missing(&sent).is_empty();
        async move { done }
    })
    .await;
    assert!(
        complete,
        "{} entries never handled",
        log.missing(&sent).len()
    );
    let mut conn = stream_listener_tests::connection(&url).await;
    for shard in 0..SHARDS {
        let key = format!("{stream}:{shard}");
        assert_eq!(xpending_count(&mut conn, &key, GROUP).await, 0, "{key}");
    }
    // Handled twice: only what that read returned, the second time by the stopped member on resuming
    // (the first entries it handled then: the read it was in, before its next heartbeat).
    let duplicates = log.duplicates();
    let batch: BTreeSet<(String, u32)> = log
        .entries()
        .iter()
        .filter(|h| h.member == "py-a" && h.at >= resumed_at)
        .take(in_flight)
        .map(|h| (h.order.key.clone(), h.order.seq))
        .collect();
    assert_eq!(batch.len(), in_flight, "it handled its read on resuming");
    for (key, seq, _) in &duplicates {
        assert!(
            batch.contains(&(key.clone(), *seq)),
            "{key}/{seq} handled twice otherwise"
        );
        assert!(py_shards.contains(&shard_for_key(key.as_bytes(), SHARDS)));
    }
    // The second handling of each comes after later entries of its key were handled by our member.
    let entries = log.entries();
    let reordered = duplicates
        .iter()
        .filter(|(key, seq, _)| {
            let again = entries
                .iter()
                .rposition(|h| h.order.key == *key && h.order.seq == *seq)
                .unwrap();
            entries[..again]
                .iter()
                .any(|h| h.order.key == *key && h.order.seq > *seq)
        })
        .count();
    let violations = log.order_violations();
    let dup_keys: BTreeSet<&str> = duplicates.iter().map(|(k, _, _)| k.as_str()).collect();
    assert!(violations
        .iter()
        .all(|(k, _, _)| dup_keys.contains(k.as_str())));
    eprintln!(
        "a read of {in_flight} entries in flight across a pause of {:?}: {} handled twice ({} of them \
         after a later entry of their key), {} per-key order violations (of first handlings), over {} keys",
        resumed_at.duration_since(frozen_at),
        duplicates.len(),
        reordered,
        violations.len(),
        dup_keys.len()
    );
    py.stop(Stop::Kill);
    rust.stop().await.unwrap();
}
