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
//! | `stream_listener_pending_shards` | gauge | `stream`, `group`, `member` | shards targeted to the member, not yet released by their previous owner |
//! | `stream_listener_revoking_shards` | gauge | `stream`, `group`, `member` | shards the member is giving up (draining) |
//! | `stream_listener_member_state` | gauge | `stream`, `group`, `member`, `state` (`joining`, `member`, `leaving`, `left`) | 1 for the member's current state, 0 for the others |
//! | `stream_listener_group_epoch`, `stream_listener_assignment_epoch` | gauge | `stream`, `group`, `member` | the group and target assignment epochs of the member's last accepted heartbeat |
//! | `stream_listener_heartbeats_total` | counter | `stream`, `group`, `member`, `status` (the response status in snake case: `ok`, `revoke_pending`, `fenced_member_epoch`, ...; or `error`, `timeout`) | heartbeats sent |
//! | `stream_listener_self_fences_total` | counter | `stream`, `group`, `member` | the member stopped reading because its lease could not be renewed in time |
//! | `stream_listener_rebalances_total` | counter | `stream`, `group`, `member` | rebalances the member saw complete (the group went from ASSIGNING or RECONCILING back to STABLE) |
//! | `stream_listener_rebalance_duration_seconds` | histogram | `stream`, `group`, `member` | from the first heartbeat that saw the group unsettled to the first that saw it STABLE |
//! | `stream_listener_shard_lag`, `stream_listener_shard_pending` | gauge | `stream`, `group`, `shard` | entries not yet read by the group (lag, from `XINFO GROUPS`; left as it was when Redis cannot tell) and delivered but not acknowledged; sampled by the owner every 10 heartbeat intervals with one pipeline of `XINFO GROUPS` per member, 0 once the shard is given up |
//! | `stream_listener_trimmed_unread_total` | counter | `stream`, `group` | entries removed from a shard stream before `group` read them (a producer's `cap_unread`, an `XTRIM` or `XDEL` by hand), found by the retention job of any group's shard owner: lost to that group |
//! | `stream_listener_retention_trimmed_total` | counter | `stream`, `group` | acknowledged entries the retention job of `group`'s shard owners trimmed (entries every group of the stream had acknowledged) |
//! | `stream_listener_stale_writes_total` | counter | `stream`, `group` | entries a producer routed with a topology older than the last resize and wrote after its cut (possible order violations, see ARCHITECTURE.md) |
//!
//! With the cargo feature `prometheus`, `install_prometheus` installs a Prometheus recorder that serves
//! them at `http://{addr}/metrics` (see `examples/src/bin/metrics.rs`).

use std::sync::Arc;
use std::time::Duration;

use metrics::{counter, gauge, histogram};
use tokio::sync::watch;

use crate::member::heartbeat::MemberStatus;
use crate::member::lifecycle::OwnershipDeadline;
use crate::member::session::Phase;

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
    PENDING_SHARDS,
    REVOKING_SHARDS,
    HEARTBEATS,
    REBALANCES,
    REBALANCE_DURATION,
    MEMBER_STATE,
    GROUP_EPOCH,
    ASSIGNMENT_EPOCH,
    SELF_FENCES,
    SHARD_LAG,
    SHARD_PENDING,
    TRIMMED_UNREAD,
    RETENTION_TRIMMED,
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

/// Shards targeted to a member but not yet released by their previous owner.
pub const PENDING_SHARDS: &str = "stream_listener_pending_shards";
/// Shards a member is giving up (draining).
pub const REVOKING_SHARDS: &str = "stream_listener_revoking_shards";
/// Heartbeats by outcome.
pub const HEARTBEATS: &str = "stream_listener_heartbeats_total";
/// Rebalances a member saw complete.
pub const REBALANCES: &str = "stream_listener_rebalances_total";
/// How long a rebalance took.
pub const REBALANCE_DURATION: &str = "stream_listener_rebalance_duration_seconds";
/// A member's state (1 for the current one).
pub const MEMBER_STATE: &str = "stream_listener_member_state";
/// The group epoch a member last saw.
pub const GROUP_EPOCH: &str = "stream_listener_group_epoch";
/// The target assignment epoch a member last saw.
pub const ASSIGNMENT_EPOCH: &str = "stream_listener_assignment_epoch";
/// Self-fences: the lease could not be renewed in time.
pub const SELF_FENCES: &str = "stream_listener_self_fences_total";
/// Entries of a shard its group has not read yet.
pub const SHARD_LAG: &str = "stream_listener_shard_lag";
/// Entries of a shard delivered to its group and not acknowledged.
pub const SHARD_PENDING: &str = "stream_listener_shard_pending";

/// Entries removed before a group read them.
pub const TRIMMED_UNREAD: &str = "stream_listener_trimmed_unread_total";
/// Acknowledged entries the retention job trimmed.
pub const RETENTION_TRIMMED: &str = "stream_listener_retention_trimmed_total";

/// A retention run found `n` entries of `stream` removed before `group` read them.
pub(crate) fn trimmed_unread(stream: &str, group: &str, n: u64) {
    counter!(TRIMMED_UNREAD, "stream" => stream.to_owned(), "group" => group.to_owned())
        .increment(n);
}

/// Late writes under a stale layout, detected by consumers.
pub const STALE_WRITES: &str = "stream_listener_stale_writes_total";

/// The metrics of one consumer, labelled once with its stream and group.
#[derive(Debug, Clone)]
pub(crate) struct ConsumerMetrics {
    /// Shared label values: a clone must not allocate.
    stream: metrics::SharedString,
    group: metrics::SharedString,
    /// The handles recorded per handled entry (`handled`, and an `ok` attempt), registered at their first
    /// use: a handle skips building the key and looking it up on every entry. The recorder is the one
    /// installed then (install it before consumers start, as the `metrics` crate asks).
    handled: std::sync::OnceLock<metrics::Counter>,
    ok: std::sync::OnceLock<metrics::Histogram>,
}

impl ConsumerMetrics {
    pub(crate) fn new(stream: &str, group: &str) -> Self {
        Self {
            stream: metrics::SharedString::from_shared(std::sync::Arc::from(stream)),
            group: metrics::SharedString::from_shared(std::sync::Arc::from(group)),
            handled: std::sync::OnceLock::new(),
            ok: std::sync::OnceLock::new(),
        }
    }

    fn messages_counter(&self, outcome: &'static str) -> metrics::Counter {
        counter!(MESSAGES, "stream" => self.stream.clone(), "group" => self.group.clone(), "outcome" => outcome)
    }

    fn duration_histogram(&self, outcome: &'static str) -> metrics::Histogram {
        histogram!(HANDLER_DURATION, "stream" => self.stream.clone(), "group" => self.group.clone(), "outcome" => outcome)
    }

    /// `n` entries had `outcome`.
    pub(crate) fn messages(&self, outcome: &'static str, n: u64) {
        match (n, outcome) {
            (0, _) => {}
            (_, "handled") => self
                .handled
                .get_or_init(|| self.messages_counter("handled"))
                .increment(n),
            _ => self.messages_counter(outcome).increment(n),
        }
    }

    /// One handler attempt took `elapsed` and ended with `outcome` (`ok`, `error`, `timeout`).
    pub(crate) fn handler_attempt(&self, outcome: &'static str, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        match outcome {
            "ok" => self
                .ok
                .get_or_init(|| self.duration_histogram("ok"))
                .record(seconds),
            _ => self.duration_histogram(outcome).record(seconds),
        }
    }

    /// A late write under a stale layout was found.
    pub(crate) fn stale_write(&self) {
        counter!(STALE_WRITES, "stream" => self.stream.clone(), "group" => self.group.clone())
            .increment(1);
    }

    /// A retention run trimmed `n` acknowledged entries.
    pub(crate) fn retention_trimmed(&self, n: u64) {
        if n == 0 {
            return;
        }
        counter!(RETENTION_TRIMMED, "stream" => self.stream.clone(), "group" => self.group.clone())
            .increment(n);
    }
}

/// What [`follow_member`] samples from Redis: each owned shard's lag and pending entries, with one
/// pipelined `XINFO GROUPS` per shard every `every` (a few heartbeat intervals).
#[derive(Debug)]
pub(crate) struct ShardSampler {
    /// A connection that never blocks (the member's heartbeat connection).
    pub conn: crate::connection::Connection,
    /// Time between samples.
    pub every: Duration,
}

/// The member states [`MEMBER_STATE`] reports, one series each (1 for the current one).
const PHASES: [(Phase, &str); 4] = [
    (Phase::Joining, "joining"),
    (Phase::Member, "member"),
    (Phase::Leaving, "leaving"),
    (Phase::Left, "left"),
];

/// Publishes a member's status as gauges and counters until the member's status channel closes,
/// samples its lease and the store's counters every second, and its shards' lag and pending entries
/// every `sampler.every`.
pub(crate) async fn follow_member(
    mut status: watch::Receiver<MemberStatus>,
    deadline: Arc<OwnershipDeadline>,
    stream: String,
    group: String,
    member: String,
    mut sampler: Option<ShardSampler>,
) {
    let labels = [
        ("stream", stream.clone()),
        ("group", group.clone()),
        ("member", member),
    ];
    let owned = gauge!(OWNED_SHARDS, &labels);
    let pending = gauge!(PENDING_SHARDS, &labels);
    let revoking = gauge!(REVOKING_SHARDS, &labels);
    let epoch = gauge!(MEMBER_EPOCH, &labels);
    let group_epoch = gauge!(GROUP_EPOCH, &labels);
    let assignment_epoch = gauge!(ASSIGNMENT_EPOCH, &labels);
    let failures = gauge!(HEARTBEAT_FAILURES, &labels);
    let lease = gauge!(LEASE_REMAINING, &labels);
    let self_fences = counter!(SELF_FENCES, &labels);
    let rebalances = counter!(REBALANCES, &labels);
    let rebalance_duration = histogram!(REBALANCE_DURATION, &labels);
    let states = PHASES.map(|(phase, name)| {
        let mut with_state = labels.to_vec();
        with_state.push(("state", name.to_owned()));
        (phase, gauge!(MEMBER_STATE, &with_state))
    });
    let mut rebalances_seen = 0;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sample = tokio::time::interval(
        sampler
            .as_ref()
            .map_or(Duration::from_secs(3600), |s| s.every),
    );
    sample.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sampled: Vec<u32> = Vec::new();
    loop {
        let shards = {
            let now = status.borrow_and_update();
            owned.set(now.owned.len() as f64);
            pending.set(f64::from(now.pending));
            revoking.set(f64::from(now.revoking));
            epoch.set(now.epoch as f64);
            group_epoch.set(now.group_epoch as f64);
            assignment_epoch.set(now.assignment_epoch as f64);
            failures.set(f64::from(now.failures));
            for (phase, gauge) in &states {
                gauge.set(if *phase == now.phase { 1.0 } else { 0.0 });
            }
            for (outcome, n) in &now.heartbeats {
                let mut with_status = labels.to_vec();
                with_status.push(("status", (*outcome).to_owned()));
                counter!(HEARTBEATS, &with_status).absolute(*n);
            }
            self_fences.absolute(now.self_fences);
            if now.rebalances > rebalances_seen {
                rebalances.increment(now.rebalances - rebalances_seen);
                rebalance_duration.record(now.last_rebalance.as_secs_f64());
                rebalances_seen = now.rebalances;
            }
            now.owned.clone()
        };
        tokio::select! {
            changed = status.changed() => if changed.is_err() {
                owned.set(0.0);
                pending.set(0.0);
                revoking.set(0.0);
                lease.set(0.0);
                for shard in sampled {
                    shard_gauges(&stream, &group, shard, None, Some(0));
                }
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
            _ = sample.tick(), if sampler.is_some() => {
                let sampler = sampler.as_mut().expect("checked");
                // A shard given up reads 0 here, so the new owner's process is the only one with a
                // non-zero series and sums over processes stay right.
                for shard in sampled.iter().filter(|s| !shards.contains(s)) {
                    shard_gauges(&stream, &group, *shard, Some(0), Some(0));
                }
                sampled = shards;
                match sample_shards(&mut sampler.conn, &stream, &group, &sampled).await {
                    Ok(found) => {
                        for (shard, lag, pending) in found {
                            shard_gauges(&stream, &group, shard, lag, Some(pending));
                        }
                    }
                    Err(error) => tracing::debug!(%error, "sampling the shards' lag failed"),
                }
            }
        }
    }
}

/// Sets a shard's lag and pending gauges (`None`: leave it as it is).
fn shard_gauges(stream: &str, group: &str, shard: u32, lag: Option<i64>, pending: Option<i64>) {
    let labels = [
        ("stream", stream.to_owned()),
        ("group", group.to_owned()),
        ("shard", shard.to_string()),
    ];
    if let Some(lag) = lag {
        gauge!(SHARD_LAG, &labels).set(lag as f64);
    }
    if let Some(pending) = pending {
        gauge!(SHARD_PENDING, &labels).set(pending as f64);
    }
}

/// `(shard, lag, pending)` of `group` on each of `shards`, in one pipeline of `XINFO GROUPS`. The lag
/// is `None` when Redis cannot tell (entries were deleted or trimmed past the group's position).
async fn sample_shards(
    conn: &mut crate::connection::Connection,
    stream: &str,
    group: &str,
    shards: &[u32],
) -> Result<Vec<(u32, Option<i64>, i64)>, redis::RedisError> {
    if shards.is_empty() {
        return Ok(Vec::new());
    }
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for shard in shards {
        pipe.cmd("XINFO")
            .arg("GROUPS")
            .arg(crate::routing::shard_stream_key(stream, *shard));
    }
    // Per command: a missing stream (not created yet) is an error reply, skipped.
    let replies: Vec<redis::RedisResult<redis::Value>> = pipe.query_async(conn).await?;
    Ok(shards
        .iter()
        .zip(replies)
        .filter_map(|(shard, reply)| {
            let (lag, pending) = group_lag(&reply.ok()?, group)?;
            Some((*shard, lag, pending))
        })
        .collect())
}

/// `(lag, pending)` of `group` in an `XINFO GROUPS` reply ([`crate::reply::xinfo_groups`]); a pending
/// count Redis did not give is 0.
fn group_lag(reply: &redis::Value, group: &str) -> Option<(Option<i64>, i64)> {
    let info = crate::reply::xinfo_groups(reply)
        .ok()?
        .into_iter()
        .find(|info| info.name == group)?;
    let signed = |n: Option<u64>| n.and_then(|n| i64::try_from(n).ok());
    Some((signed(info.lag), signed(info.pending).unwrap_or(0)))
}

/// Installs a Prometheus recorder as the process's global recorder, serving every metric in the text
/// format at `http://{addr}/metrics` (any path answers). Call it once, inside a Tokio runtime, before
/// starting the runtime.
#[cfg(feature = "prometheus")]
pub fn install_prometheus(
    addr: std::net::SocketAddr,
) -> Result<(), metrics_exporter_prometheus::BuildError> {
    prometheus_builder()?.with_http_listener(addr).install()
}

/// Installs a Prometheus recorder as the process's global recorder without serving it; the handle
/// renders the page (for example for the `http` feature's `ProbeServer`:
/// `Some(Box::new(move || handle.render()))`).
#[cfg(feature = "prometheus")]
pub fn install_prometheus_recorder(
) -> Result<metrics_exporter_prometheus::PrometheusHandle, metrics_exporter_prometheus::BuildError>
{
    prometheus_builder()?.install_recorder()
}

/// The exporter with the library's histogram buckets.
#[cfg(feature = "prometheus")]
fn prometheus_builder(
) -> Result<metrics_exporter_prometheus::PrometheusBuilder, metrics_exporter_prometheus::BuildError>
{
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Full(HANDLER_DURATION.to_owned()),
            &[
                0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            ],
        )?
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Full(REBALANCE_DURATION.to_owned()),
            &[0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0],
        )
}
