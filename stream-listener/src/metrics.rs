//! Metrics through the [`metrics`] facade: whatever recorder the application installs (a Prometheus
//! exporter, StatsD, a test recorder) receives them; without one they cost next to nothing.
//!
//! | name | kind | labels | what |
//! | --- | --- | --- | --- |
//! | `stream_listener_messages_total` | counter | `stream`, `group`, `outcome` | entries by outcome: `handled` (handler succeeded), `failed` (an attempt failed, timed out or panicked), `retried` (a retry was scheduled), `dead_lettered`, `left_pending` (exhausted under `leave_pending`) |
//! | `stream_listener_handler_duration_seconds` | histogram | `stream`, `group`, `outcome` (`ok`, `error`, `timeout`) | one handler attempt |
//! | `stream_listener_owned_shards` | gauge | `stream`, `group`, `member` | shards the member reads now |
//! | `stream_listener_member_epoch` | gauge | `stream`, `group`, `member` | the member's epoch |
//! | `stream_listener_heartbeat_failures` | gauge | `stream`, `group`, `member` | heartbeats failed in a row |
//! | `stream_listener_lease_remaining_seconds` | gauge | `stream`, `group`, `member` | time left before the member self-fences (0 when fenced), sampled every second |
//! | `stream_listener_store_commits_total`, `_conflicts_total`, `_loads_total`, `_lock_waits_total` | counter | none | the process's group-metadata store operations ([`crate::store::stats`]) |
//! | `stream_listener_stale_writes_total` | counter | `stream`, `group` | entries a producer routed with a topology older than the last resize and wrote after its cut (possible order violations, see ARCHITECTURE.md) |
//!
//! With the cargo feature `prometheus`, `install_prometheus` installs a Prometheus recorder that serves
//! them at `http://{addr}/metrics` (see `examples/src/bin/metrics.rs`).

use std::sync::Arc;
use std::time::Duration;

use metrics::{counter, gauge, histogram};
use tokio::sync::watch;

use crate::consumer::ConsumerConfig;
use crate::member::heartbeat::MemberStatus;
use crate::member::lifecycle::OwnershipDeadline;

/// Every metric name the library emits.
pub const NAMES: &[&str] = &[
    MESSAGES,
    HANDLER_DURATION,
    OWNED_SHARDS,
    MEMBER_EPOCH,
    HEARTBEAT_FAILURES,
    LEASE_REMAINING,
    STORE_COMMITS,
    STORE_CONFLICTS,
    STORE_LOADS,
    STORE_LOCK_WAITS,
    STALE_WRITES,
];

/// Entries by outcome.
pub const MESSAGES: &str = "stream_listener_messages_total";
/// Handler attempt latency.
pub const HANDLER_DURATION: &str = "stream_listener_handler_duration_seconds";
/// Shards a member reads now.
pub const OWNED_SHARDS: &str = "stream_listener_owned_shards";
/// A member's epoch.
pub const MEMBER_EPOCH: &str = "stream_listener_member_epoch";
/// Heartbeats failed in a row.
pub const HEARTBEAT_FAILURES: &str = "stream_listener_heartbeat_failures";

/// Time left before the member self-fences.
pub const LEASE_REMAINING: &str = "stream_listener_lease_remaining_seconds";
/// Store commits.
pub const STORE_COMMITS: &str = "stream_listener_store_commits_total";
/// Store commits refused because someone committed first.
pub const STORE_CONFLICTS: &str = "stream_listener_store_conflicts_total";
/// Store snapshot loads.
pub const STORE_LOADS: &str = "stream_listener_store_loads_total";
/// Waits for the store's writer lock.
pub const STORE_LOCK_WAITS: &str = "stream_listener_store_lock_waits_total";

/// Late writes under a stale layout, detected by consumers.
pub const STALE_WRITES: &str = "stream_listener_stale_writes_total";

/// A consumer of `config`'s group found a late write under a stale layout.
pub(crate) fn stale_write(config: &ConsumerConfig) {
    counter!(STALE_WRITES, "stream" => config.stream_prefix.clone(), "group" => config.group.clone())
        .increment(1);
}

/// `n` entries of the consumer's group had `outcome`.
pub(crate) fn messages(config: &ConsumerConfig, outcome: &'static str, n: u64) {
    if n == 0 {
        return;
    }
    counter!(MESSAGES, "stream" => config.stream_prefix.clone(), "group" => config.group.clone(), "outcome" => outcome)
        .increment(n);
}

/// One handler attempt took `elapsed` and ended with `outcome` (`ok`, `error`, `timeout`).
pub(crate) fn handler_attempt(config: &ConsumerConfig, outcome: &'static str, elapsed: Duration) {
    histogram!(HANDLER_DURATION, "stream" => config.stream_prefix.clone(), "group" => config.group.clone(), "outcome" => outcome)
        .record(elapsed.as_secs_f64());
}

/// Publishes a member's status as gauges until the member's status channel closes, and samples its
/// lease and the store's counters every second.
pub(crate) async fn follow_member(
    mut status: watch::Receiver<MemberStatus>,
    deadline: Arc<OwnershipDeadline>,
    stream: String,
    group: String,
    member: String,
) {
    let labels = [("stream", stream), ("group", group), ("member", member)];
    let owned = gauge!(OWNED_SHARDS, &labels);
    let epoch = gauge!(MEMBER_EPOCH, &labels);
    let failures = gauge!(HEARTBEAT_FAILURES, &labels);
    let lease = gauge!(LEASE_REMAINING, &labels);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        {
            let now = status.borrow_and_update();
            owned.set(now.owned.len() as f64);
            epoch.set(now.epoch as f64);
            failures.set(f64::from(now.failures));
        }
        tokio::select! {
            changed = status.changed() => if changed.is_err() {
                owned.set(0.0);
                lease.set(0.0);
                return;
            },
            _ = tick.tick() => {
                lease.set(deadline.remaining().map_or(0.0, |left| left.as_secs_f64()));
                let stats = crate::store::stats();
                counter!(STORE_COMMITS).absolute(stats.commits);
                counter!(STORE_CONFLICTS).absolute(stats.conflicts);
                counter!(STORE_LOADS).absolute(stats.loads);
                counter!(STORE_LOCK_WAITS).absolute(stats.lock_waits);
            }
        }
    }
}

/// Installs a Prometheus recorder as the process's global recorder, serving every metric in the text
/// format at `http://{addr}/metrics` (any path answers). Call it once, inside a Tokio runtime, before
/// starting the runtime.
#[cfg(feature = "prometheus")]
pub fn install_prometheus(
    addr: std::net::SocketAddr,
) -> Result<(), metrics_exporter_prometheus::BuildError> {
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Full(HANDLER_DURATION.to_owned()),
            &[
                0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            ],
        )?
        .install()
}
