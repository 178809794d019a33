//! Integration tests live in `tests/`; this library is what they share at the level of stream-listener's
//! own types (timings, a test payload, producer and runtime set-up, member sessions) and the log capture
//! of tests that assert on what the library logs ([`logs`]).
//!
//! Helpers that need only tokio and redis-rs (connections, waits with a deadline, stream and `INFO`
//! replies) are in `stream_listener_test_support::aio`, which the benchmarks use as well; they are not
//! here because stream-listener's benchmarks cannot depend on a crate that depends on stream-listener.

use std::ops::Range;
use std::sync::Arc;

use redis::aio::ConnectionManager;
use serde::{Deserialize, Serialize};
use stream_listener::coordinator::metadata::GroupConfig;
use stream_listener::member::session::{MemberIdentity, MemberSession};
use stream_listener::topology::{StartFrom, Topology};
use stream_listener::{ConsumerBuilder, Producer, RunningRuntime, Runtime};
use stream_listener_test_support::aio::connect;

pub mod logs;

/// The group timing of the runtime tests: heartbeats every 100 ms, a member expires after 1.5 s, a
/// rebalance times out after 3 s.
pub const TIMING: GroupConfig = GroupConfig {
    heartbeat_interval_ms: 100,
    session_timeout_ms: 1_500,
    rebalance_timeout_ms: 3_000,
};

/// The test payload: a key and its sequence number within the key (JSON `{"key":..,"seq":..}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Order {
    /// The routing key the order is sent with.
    pub key: String,
    /// Its position among the key's orders.
    pub seq: u32,
}

/// `seqs` orders for each of the keys `k0..k{keys-1}`, key by key: `(key, order)` for `Producer::send_batch`.
pub fn orders(keys: u32, seqs: Range<u32>) -> Vec<(String, Order)> {
    (0..keys)
        .flat_map(|k| {
            seqs.clone().map(move |seq| {
                (
                    format!("k{k}"),
                    Order {
                        key: format!("k{k}"),
                        seq,
                    },
                )
            })
        })
        .collect()
}

/// A producer for `stream`, after ensuring its topology with `shards` shards.
///
/// # Panics
/// If Redis does not answer or the stream exists with another shard count.
pub async fn producer(url: &str, stream: &str, shards: u32) -> Producer {
    Producer::connect_creating(url, stream, shards)
        .await
        .unwrap()
}

/// A connection to `url` after ensuring `stream`'s topology with `shards` shards and consumer `group`
/// on every shard, reading from the start.
///
/// # Panics
/// If Redis does not answer or the stream exists with another shard count.
pub async fn stream_with_group(
    url: &str,
    stream: &str,
    shards: u32,
    group: &str,
) -> ConnectionManager {
    let mut conn = connect(url).await;
    Topology::ensure(&mut conn, stream, shards).await.unwrap();
    Topology::ensure_group(&mut conn, stream, group, StartFrom::Earliest)
        .await
        .unwrap();
    conn
}

/// A runtime for `url` with [`TIMING`] and without the annotated listeners of the test binary: add
/// consumers and settings, then start it.
pub fn test_runtime(url: &str) -> Runtime {
    Runtime::new(url)
        .without_annotated_listeners()
        .group_config(TIMING)
}

/// Starts [`test_runtime`] with the one consumer `builder`.
///
/// # Panics
/// If the runtime does not start.
pub async fn start_one(url: &str, builder: ConsumerBuilder) -> RunningRuntime {
    test_runtime(url).consumer(builder).start().await.unwrap()
}

/// A member session of weight 1, unnamed, for tests that drive a `GroupStore` themselves.
pub fn member_session(
    id: &str,
    session_timeout_ms: i64,
    runtime_max_concurrency: u32,
    incarnation: u64,
) -> MemberSession {
    let identity = MemberIdentity {
        member_id: Arc::from(id),
        member_name: None,
        weight: 1,
        runtime_max_concurrency,
    };
    MemberSession::new(identity, session_timeout_ms, incarnation)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_are_key_by_key_in_sequence() {
        let batch = orders(2, 3..5);
        let got: Vec<(&str, &str, u32)> = batch
            .iter()
            .map(|(k, o)| (k.as_str(), o.key.as_str(), o.seq))
            .collect();
        assert_eq!(
            got,
            [
                ("k0", "k0", 3),
                ("k0", "k0", 4),
                ("k1", "k1", 3),
                ("k1", "k1", 4)
            ]
        );
    }
}
