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

use std::time::Duration;

use metrics::{counter, gauge, histogram};
use tokio::sync::watch;

use crate::consumer::ConsumerConfig;
use crate::member::heartbeat::MemberStatus;

/// Every metric name the library emits.
pub const NAMES: &[&str] = &[
    MESSAGES,
    HANDLER_DURATION,
    OWNED_SHARDS,
    MEMBER_EPOCH,
    HEARTBEAT_FAILURES,
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

/// Publishes a member's status as gauges until the member's status channel closes.
pub(crate) async fn follow_member(
    mut status: watch::Receiver<MemberStatus>,
    stream: String,
    group: String,
    member: String,
) {
    let labels = [("stream", stream), ("group", group), ("member", member)];
    let owned = gauge!(OWNED_SHARDS, &labels);
    let epoch = gauge!(MEMBER_EPOCH, &labels);
    let failures = gauge!(HEARTBEAT_FAILURES, &labels);
    loop {
        {
            let now = status.borrow_and_update();
            owned.set(now.owned.len() as f64);
            epoch.set(now.epoch as f64);
            failures.set(f64::from(now.failures));
        }
        if status.changed().await.is_err() {
            owned.set(0.0);
            return;
        }
    }
}
