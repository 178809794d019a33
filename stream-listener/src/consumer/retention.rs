//! Retention: each shard's owner trims what every consumer group of the stream has acknowledged, and
//! counts the entries that were removed before a group read them (see [`Retention`] and
//! `retention.lua`).
//!
//! When a run is due is decided here, per shard and without IO ([`ShardRetention::due`]): at an
//! ownership's start (before its first read, so a loss while the group was down is still visible), then
//! at most every [`Retention::interval`] when the shard had acknowledgements since the last run, and again
//! at once after a run that stopped at its bound of [`MAX_TRIM`] entries (up to
//! [`MAX_RUNS_PER_STEP`] runs in a row, then at the next step). The job runs a step at its end (and
//! one after installing a new ownership's fence), and for each shard an idle wait watched that saw nothing
//! new (an idle shard runs no job) the driver runs one beside the next jobs, so that the entries the wait
//! found are not held back by it; the step runs the script, then turns its answer into
//! metrics, a WARN and the per-group count in Redis ([`trimmed_unread`]).
//!
//! The script needs nothing but the shard stream (one key, so it runs on a cluster) and is not behind
//! the ownership's fence: it computes everything from the stream's state at the time it runs, atomically,
//! so a late run of an earlier owner trims nothing a group still needs.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use redis::{RedisResult, Script, Value};

use super::config::Retention;
use super::shard_io::ShardIo;

/// The most entries one run removes. A run first frees the stream's whole nodes below its cut
/// (`XTRIM MINID ~ … LIMIT`: no entry is read), then reads only the entries left below the cut (less than
/// a node) and trims them exactly, so it costs O(nodes) in Redis. Reading the first `MAX_TRIM` entries
/// to find the bound's cut, as runs did before, cost a busy shard's Redis as much as a second group read
/// (the latency bench at 300,000 entries/s: hundreds of runs a second, each copying 1,001 entries into
/// Lua). A run that stopped there is followed by another at the shard's next job end.
pub(crate) const MAX_TRIM: u64 = 1000;

/// Runs one step makes at most, one after the other while each stopped at [`MAX_TRIM`]: a step trims up to
/// 8000 entries, more than one job handles (64 batches of the default 100), so trimming keeps up with a
/// busy shard; each run is a separate script call, so other clients are served between them.
const MAX_RUNS_PER_STEP: u32 = 8;

const SCRIPT: &str = include_str!("retention.lua");

/// When a shard's retention ran and what happened since.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ShardRetention {
    last_run: Option<Instant>,
    /// Acknowledgements since the last run.
    acked: bool,
    /// The last run stopped at [`MAX_TRIM`]: there is more to trim.
    saturated: bool,
}

impl ShardRetention {
    /// Whether a run is due at `now`: the first run (an ownership's start), a run that stopped at its
    /// bound, or acknowledgements since a run at least `interval` ago.
    pub(crate) fn due(&self, now: Instant, interval: Duration) -> bool {
        match self.last_run {
            None => true,
            Some(_) if self.saturated => true,
            Some(at) => self.acked && now.saturating_duration_since(at) >= interval,
        }
    }

    pub(crate) fn acked(&mut self) {
        self.acked = true;
    }

    pub(crate) fn ran(&mut self, now: Instant, outcome: &RunOutcome) {
        self.last_run = Some(now);
        self.acked = false;
        self.saturated = outcome.saturated;
    }

    /// A run failed: try again after the interval.
    pub(crate) fn failed(&mut self, now: Instant) {
        self.last_run = Some(now);
        self.saturated = false;
    }
}

/// What one run of the script did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RunOutcome {
    /// Entries trimmed.
    pub(crate) trimmed: u64,
    /// Stopped at [`MAX_TRIM`] with more to trim.
    pub(crate) saturated: bool,
    /// `(group, entries)`: entries removed before that group read them, found (and counted) by this run.
    pub(crate) lost: Vec<(String, u64)>,
}

impl RunOutcome {
    /// The script's reply: `{trimmed, saturated, group, lost, group, lost, ...}`; anything else is
    /// nothing done.
    pub(crate) fn parse(reply: &Value) -> Self {
        let Value::Array(items) = reply else {
            return Self::default();
        };
        let int = |v: &Value| match v {
            Value::Int(n) => u64::try_from(*n).ok(),
            _ => None,
        };
        let text = |v: &Value| match v {
            Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
            Value::SimpleString(s) => Some(s.clone()),
            _ => None,
        };
        let mut outcome = Self {
            trimmed: items.first().and_then(int).unwrap_or(0),
            saturated: items.get(1).and_then(int).unwrap_or(0) == 1,
            lost: Vec::new(),
        };
        for pair in items.get(2..).unwrap_or_default().chunks(2) {
            if let [group, n] = pair {
                if let (Some(group), Some(n)) = (text(group), int(n)) {
                    if n > 0 {
                        outcome.lost.push((group, n));
                    }
                }
            }
        }
        outcome
    }
}

/// The retention state of one consumer: the script and each shard's [`ShardRetention`].
pub(crate) struct RetentionJob {
    script: Script,
    shards: Mutex<HashMap<Arc<str>, ShardRetention>>,
}

impl Default for RetentionJob {
    fn default() -> Self {
        Self {
            script: Script::new(SCRIPT),
            shards: Mutex::new(HashMap::new()),
        }
    }
}

impl RetentionJob {
    fn shards(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, ShardRetention>> {
        // Plain data: a panic elsewhere cannot leave it half-updated.
        self.shards
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl RetentionJob {
    /// An ownership of the shard `key` starts: forget what an earlier one did, so that the run is due.
    pub(crate) fn ownership_started(&self, key: &Arc<str>) {
        self.shards().remove(key);
    }

    /// Which of `keys` [`step`](Self::step) would run the script for now: a cheap check for the idle wait,
    /// which leaves the steps to the driver (one lock and one clock reading for all its shards).
    pub(crate) fn due<'a>(
        &self,
        io: &ShardIo,
        keys: impl Iterator<Item = (u32, &'a Arc<str>)>,
    ) -> Vec<(u32, Arc<str>)> {
        let Some(settings) = io.config.retention else {
            return Vec::new();
        };
        let now = Instant::now();
        let shards = self.shards();
        keys.filter(|(_, key)| {
            shards
                .get(*key)
                .is_none_or(|state| state.due(now, settings.interval))
        })
        .map(|(shard, key)| (shard, key.clone()))
        .collect()
    }

    /// The step at a job's end (and after a new ownership's fence): note `acked`, then run the script if a run
    /// is due (see the module docs).
    pub(crate) async fn step(&self, io: &ShardIo, shard: u32, key: &Arc<str>, acked: bool) {
        let Some(settings) = io.config.retention else {
            return;
        };
        let now = Instant::now();
        {
            let mut shards = self.shards();
            let state = shards.entry(key.clone()).or_default();
            if acked {
                state.acked();
            }
            if !state.due(now, settings.interval) {
                return;
            }
        }
        for _ in 0..MAX_RUNS_PER_STEP {
            let started = Instant::now();
            let result = self.run(io, key, &settings).await;
            let saturated = {
                let mut shards = self.shards();
                let state = shards.entry(key.clone()).or_default();
                match &result {
                    Ok(outcome) => state.ran(now, outcome),
                    Err(_) => state.failed(now),
                }
                state.due(now, settings.interval)
            };
            match result {
                Ok(outcome) => {
                    tracing::debug!(shard, trimmed = outcome.trimmed, saturated = outcome.saturated, took = ?started.elapsed(), "retention ran");
                    report(io, shard, key, &outcome).await;
                }
                Err(error) => {
                    tracing::debug!(shard, %error, "retention failed; trying again later");
                }
            }
            if !saturated {
                break;
            }
        }
    }

    async fn run(&self, io: &ShardIo, key: &str, settings: &Retention) -> RedisResult<RunOutcome> {
        let keep_for_ms = settings.keep_for.map_or(0, |age| {
            u64::try_from(age.as_millis()).unwrap_or(u64::MAX).max(1)
        });
        let reply: Value = self
            .script
            .key(key)
            .arg(settings.keep)
            .arg(keep_for_ms)
            .arg(MAX_TRIM)
            .invoke_async(&mut io.conn.clone())
            .await?;
        Ok(RunOutcome::parse(&reply))
    }
}

/// Metrics, a WARN per group that lost entries, and the per-group count in Redis.
async fn report(io: &ShardIo, shard: u32, key: &str, outcome: &RunOutcome) {
    let stream = &io.config.stream_prefix;
    io.metrics.retention_trimmed(outcome.trimmed);
    for (group, lost) in &outcome.lost {
        crate::metrics::trimmed_unread(stream, group, *lost);
        tracing::warn!(
            stream = %stream,
            shard,
            shard_stream = %key,
            group = %group,
            lost = *lost,
            "entries were removed from the shard stream before this consumer group read them (a producer's \
             cap_unread / MAXLEN, or an XTRIM or XDEL by hand): they are lost to the group; counted in {}",
            crate::names::topology_trimmed(stream),
        );
        let counted: RedisResult<i64> = redis::cmd("HINCRBY")
            .arg(crate::names::topology_trimmed(stream))
            .arg(group)
            .arg(*lost)
            .query_async(&mut io.conn.clone())
            .await;
        if let Err(error) = counted {
            tracing::warn!(stream = %stream, group = %group, %error, "cannot count the lost entries in Redis");
        }
    }
}

/// Entries each consumer group of `stream` lost because they were removed before it read them, as the
/// consumers' retention runs found them (`sl:topology:{<stream>}:trimmed`; see
/// [`ProducerConfig::cap_unread`](crate::producer::ProducerConfig::cap_unread)).
pub async fn trimmed_unread<C>(conn: &mut C, stream: &str) -> RedisResult<BTreeMap<String, u64>>
where
    C: ConnectionLike + Send,
{
    redis::cmd("HGETALL")
        .arg(crate::names::topology_trimmed(stream))
        .query_async(conn)
        .await
}

/// What a `maxmemory-policy` means for the library's keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EvictionVerdict {
    /// `noeviction` (or a policy this version does not know): a full Redis refuses writes and loses
    /// nothing.
    Safe,
    /// `volatile-*`: only keys with a TTL are evicted, and the library's lock and reply keys have TTLs.
    Warn,
    /// `allkeys-*`: any key may be evicted, a shard stream or the group's metadata with it.
    Refuse,
}

pub(crate) fn eviction_verdict(policy: &str) -> EvictionVerdict {
    let policy = policy.to_ascii_lowercase();
    if policy.starts_with("allkeys-") {
        EvictionVerdict::Refuse
    } else if policy.starts_with("volatile-") {
        EvictionVerdict::Warn
    } else {
        EvictionVerdict::Safe
    }
}

/// Reads `CONFIG GET maxmemory-policy` (a refusal, as managed services answer, is not an error: nothing is
/// known) and refuses an `allkeys-*` policy, warning on `volatile-*` (see [`EvictionVerdict`]).
pub(crate) async fn check_eviction_policy<C>(conn: &mut C) -> Result<(), super::ConsumerError>
where
    C: ConnectionLike + Send,
{
    let reply: RedisResult<HashMap<String, String>> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory-policy")
        .query_async(conn)
        .await;
    let policy = match reply {
        Ok(mut found) => match found.remove("maxmemory-policy") {
            Some(policy) => policy,
            None => return Ok(()),
        },
        Err(error) => {
            tracing::debug!(%error, "cannot read maxmemory-policy (CONFIG refused); not checked");
            return Ok(());
        }
    };
    match eviction_verdict(&policy) {
        EvictionVerdict::Safe => Ok(()),
        EvictionVerdict::Refuse => Err(super::ConsumerError::EvictionPolicy { policy }),
        EvictionVerdict::Warn => {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                tracing::warn!(maxmemory_policy = %policy, "Redis evicts keys with a TTL when it is full: the library's lock and reply keys have TTLs, and evicting one can stall heartbeats or hand a shard over early; use maxmemory-policy noeviction (the consumers trim acknowledged entries themselves)");
            });
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allkeys_policies_are_refused_and_volatile_ones_warned_about() {
        for policy in [
            "allkeys-lru",
            "allkeys-lfu",
            "allkeys-random",
            "ALLKEYS-LRU",
        ] {
            assert_eq!(
                eviction_verdict(policy),
                EvictionVerdict::Refuse,
                "{policy}"
            );
        }
        for policy in [
            "volatile-lru",
            "volatile-lfu",
            "volatile-random",
            "volatile-ttl",
        ] {
            assert_eq!(eviction_verdict(policy), EvictionVerdict::Warn, "{policy}");
        }
        for policy in ["noeviction", "", "something-new"] {
            assert_eq!(eviction_verdict(policy), EvictionVerdict::Safe, "{policy}");
        }
    }

    const INTERVAL: Duration = Duration::from_secs(5);

    #[test]
    fn the_first_run_of_an_ownership_is_due_at_once() {
        assert!(ShardRetention::default().due(Instant::now(), INTERVAL));
    }

    #[test]
    fn later_runs_wait_for_acks_and_the_interval() {
        let start = Instant::now();
        let mut state = ShardRetention::default();
        state.ran(start, &RunOutcome::default());
        // No acknowledgement: never due, however long.
        assert!(!state.due(start + INTERVAL * 10, INTERVAL));
        state.acked();
        assert!(!state.due(start + INTERVAL / 2, INTERVAL));
        assert!(state.due(start + INTERVAL, INTERVAL));
        // A run clears the acks.
        state.ran(start + INTERVAL, &RunOutcome::default());
        assert!(!state.due(start + INTERVAL * 3, INTERVAL));
    }

    #[test]
    fn a_run_that_stopped_at_its_bound_runs_again_at_once() {
        let start = Instant::now();
        let mut state = ShardRetention::default();
        let saturated = RunOutcome {
            trimmed: MAX_TRIM,
            saturated: true,
            lost: Vec::new(),
        };
        state.ran(start, &saturated);
        assert!(state.due(start, INTERVAL));
        state.ran(start, &RunOutcome::default());
        assert!(!state.due(start, INTERVAL));
    }

    #[test]
    fn a_failed_run_is_tried_again_after_the_interval() {
        let start = Instant::now();
        let mut state = ShardRetention::default();
        state.acked();
        state.failed(start);
        assert!(!state.due(start + INTERVAL / 2, INTERVAL));
        assert!(state.due(start + INTERVAL, INTERVAL));
    }

    #[test]
    fn the_scripts_reply_becomes_trimmed_saturated_and_losses_per_group() {
        let reply = Value::Array(vec![
            Value::Int(1000),
            Value::Int(1),
            Value::BulkString(b"billing".to_vec()),
            Value::Int(7),
            Value::BulkString(b"audit".to_vec()),
            Value::Int(0),
        ]);
        assert_eq!(
            RunOutcome::parse(&reply),
            RunOutcome {
                trimmed: 1000,
                saturated: true,
                lost: vec![("billing".into(), 7)],
            }
        );
        assert_eq!(
            RunOutcome::parse(&Value::Array(vec![Value::Int(0), Value::Int(0)])),
            RunOutcome::default()
        );
        // Garbled replies are nothing done, never a panic.
        for garbled in [
            Value::Nil,
            Value::Int(3),
            Value::Array(vec![Value::Nil]),
            Value::Array(vec![Value::Int(-1), Value::Int(1), Value::Int(2)]),
        ] {
            let parsed = RunOutcome::parse(&garbled);
            assert!(parsed.lost.is_empty() && parsed.trimmed == 0, "{garbled:?}");
        }
    }
}
