//! Integration tests live in `tests/`; this library is what they share at the level of stream-listener's
//! own types (timings, a test payload, producer and runtime set-up, member sessions), the log capture of
//! tests that assert on what the library logs ([`logs`]), and the [`Target`] the end-to-end suites run on:
//! a single node and a Redis Cluster, from one test body ([`on_every_target!`]).
//!
//! Helpers that need only tokio and redis-rs (connections, waits with a deadline, stream and `INFO`
//! replies) are in `stream_listener_test_support::aio`, which the benchmarks use as well; they are not
//! here because stream-listener's benchmarks cannot depend on a crate that depends on stream-listener.

use std::ops::Range;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use stream_listener::connection::{slot_of, ConnectOptions, Connection, RedisTarget};
use stream_listener::coordinator::metadata::GroupConfig;
use stream_listener::member::session::{MemberIdentity, MemberSession};
use stream_listener::names;
use stream_listener::topology::{StartFrom, Topology};
use stream_listener::{ConsumerBuilder, Producer, RunningRuntime, Runtime};
use stream_listener_test_support::{RedisCluster, RedisServer};

/// Where an end-to-end test runs: the same body on each (see [`on_every_target!`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A `redis-server` of the test's own.
    Single,
    /// The test process's shared Redis Cluster ([`RedisCluster::shared`]), 3 masters and 3 replicas:
    /// tests on it use stream names no other test of their file uses.
    Cluster,
}

impl Target {
    /// Starts the test's own server, or joins the shared cluster (started on first use).
    pub fn start(self) -> TestRedis {
        match self {
            Self::Single => {
                let server = RedisServer::start();
                TestRedis {
                    url: server.url(),
                    server: Some(server),
                }
            }
            Self::Cluster => TestRedis {
                url: RedisCluster::shared().url(),
                server: None,
            },
        }
    }
}

/// A running Redis of a [`Target`]: its URL for the library, and connections for the test's own checks.
#[derive(Debug)]
pub struct TestRedis {
    url: String,
    /// The single node, killed on drop; `None` on the shared cluster.
    server: Option<RedisServer>,
}

impl TestRedis {
    /// `redis://127.0.0.1:port` or `redis+cluster://127.0.0.1:p1,...`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A reconnecting connection, cluster-aware on the cluster (routes by slot, splits pipelines per
    /// slot): a test's own commands must each touch one slot.
    ///
    /// # Panics
    /// If Redis does not answer.
    pub async fn connect(&self) -> Connection {
        connection(&self.url).await
    }

    /// On the cluster, checks that the shard streams `0..shards` of `stream` are served by more than one
    /// master, so that the test exercises the cluster and not one node behind it. Nothing to check on a
    /// single node.
    ///
    /// # Panics
    /// If they all live on one master.
    pub fn assert_spread(&self, stream: &str, shards: u32) {
        if self.server.is_some() {
            return;
        }
        let cluster = RedisCluster::shared();
        let masters: std::collections::BTreeSet<usize> = (0..shards)
            .map(|shard| cluster.master_of(slot_of(names::shard_stream(stream, shard).as_bytes())))
            .collect();
        assert!(
            masters.len() > 1,
            "{stream}'s {shards} shards all on master {masters:?}: use more shards"
        );
    }
}

/// A reconnecting connection to a single node or cluster URL (see [`TestRedis::connect`]).
///
/// # Panics
/// If the URL is invalid or Redis does not answer.
pub async fn connection(url: &str) -> Connection {
    RedisTarget::open(url)
        .unwrap_or_else(|e| panic!("bad Redis URL {url}: {e}"))
        .connect(ConnectOptions::default())
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"))
}

/// For each named `async fn name(target: Target)`, a module `name` with two tests calling it:
/// `name::on_a_single_node` and `name::on_a_cluster` (`cargo test on_a_cluster` runs one side). On a
/// multi-threaded tokio runtime of 2 workers, or `worker_threads = n; name, ...`.
#[macro_export]
macro_rules! on_every_target {
    (worker_threads = $threads:literal; $($test:ident),+ $(,)?) => {$(
        mod $test {
            #[tokio::test(flavor = "multi_thread", worker_threads = $threads)]
            async fn on_a_single_node() {
                super::$test($crate::Target::Single).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = $threads)]
            async fn on_a_cluster() {
                super::$test($crate::Target::Cluster).await;
            }
        }
    )+};
    ($($test:ident),+ $(,)?) => {
        $crate::on_every_target!(worker_threads = 2; $($test),+);
    };
}

pub mod logs;
pub mod otel;

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

/// A connection to `redis` after ensuring `stream`'s topology with `shards` shards and consumer `group`
/// on every shard, reading from the start.
///
/// # Panics
/// If Redis does not answer or the stream exists with another shard count.
pub async fn stream_with_group(
    redis: &TestRedis,
    stream: &str,
    shards: u32,
    group: &str,
) -> Connection {
    let mut conn = redis.connect().await;
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
        .without_default_logging()
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
