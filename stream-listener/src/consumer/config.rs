//! Configuration of one member's consumption layer: what to read, how to acknowledge, what to do on failure.

use std::time::Duration;

/// Settings of one [`Consumer`](super::Consumer), that is of one logical member's reads and handlers.
///
/// Fields are public so the builder and the attribute macro can fill them in; [`ConsumerConfig::new`] gives
/// the defaults. The struct is `#[non_exhaustive]` so new settings are not breaking changes.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConsumerConfig {
    /// Logical stream name: shard `i` lives at the stream key `{stream_prefix}:{i}`.
    pub stream_prefix: String,
    /// Redis consumer group, one per logical listener group.
    pub group: String,
    /// Redis consumer name. Use the member id, so the PEL says which member holds an entry.
    pub consumer_name: String,
    /// Entries fetched per read (`COUNT`). Larger batches mean fewer round trips but longer revokes.
    pub batch_size: usize,
    /// How long the idle wait blocks (`BLOCK`) once a full rotation over the owned shards found nothing,
    /// at most (and it is over 150 ms before the member's self-fencing deadline). A new entry ends the wait at
    /// once; a longer block means fewer commands from an idle member.
    pub block_ms: u64,
    /// Local worker capacity: how many handlers run at once (each on one shard's batch; up to four times as
    /// many shards are read meanwhile, each holding one batch until a worker is free). Not an ownership
    /// limit.
    pub runtime_max_concurrency: usize,
    /// What "done" means for a handled entry.
    pub ack_policy: AckPolicy,
    /// What happens when a handler fails.
    pub failure_policy: FailurePolicy,
    /// Dead-letter stream key; `None` means `{stream_prefix}:dlq`.
    pub dead_letter_stream: Option<String>,
    /// How often [`ShardReport::Progress`](crate::member::lifecycle::ShardReport::Progress) is sent for
    /// shards that changed.
    pub progress_interval: Duration,
    /// Response timeout of non-blocking commands. redis-rs defaults to 500 ms; we pick ours on purpose, and
    /// blocking reads get `block_ms` plus this.
    pub response_timeout: Duration,
    /// Entries that another consumer of the group has left pending for longer than this (a zombie owner
    /// that read after it lost the shard, a lost ack) are claimed by the current owner, checked about as
    /// often. The runtime sets it to the group's session timeout: by then any earlier owner has
    /// self-fenced.
    pub reclaim_idle: Duration,
    /// How long one handler attempt may run. An attempt past it is dropped (cancelled at its next `.await`)
    /// and counts as a failed delivery: retried, then dead-lettered per the [`FailurePolicy`]. `None`: no
    /// limit. A handler that blocks its thread without awaiting cannot be cancelled, only reported.
    pub handler_timeout: Option<Duration>,
    /// Trimming of acknowledged entries by each shard's owner (see [`Retention`]); `None` never trims
    /// (the stream then grows until something else trims it).
    pub retention: Option<Retention>,
}

impl ConsumerConfig {
    /// Defaults for a member `consumer_name` of `group` reading the shards of `stream_prefix`.
    pub fn new(
        stream_prefix: impl Into<String>,
        group: impl Into<String>,
        consumer_name: impl Into<String>,
    ) -> Self {
        Self {
            stream_prefix: stream_prefix.into(),
            group: group.into(),
            consumer_name: consumer_name.into(),
            batch_size: 100,
            block_ms: 450,
            runtime_max_concurrency: 1,
            ack_policy: AckPolicy::Ack,
            failure_policy: FailurePolicy::default(),
            dead_letter_stream: None,
            progress_interval: Duration::from_secs(1),
            response_timeout: Duration::from_secs(5),
            reclaim_idle: Duration::from_secs(10),
            handler_timeout: None,
            retention: Some(Retention::default()),
        }
    }

    /// The Redis stream key of `shard`, so every component names shards the same way.
    pub fn shard_key(&self, shard: u32) -> String {
        crate::names::shard_stream(&self.stream_prefix, shard)
    }

    /// The dead-letter stream key in effect.
    pub fn dead_letter_key(&self) -> String {
        self.dead_letter_stream
            .clone()
            .unwrap_or_else(|| crate::names::dead_letter_stream(&self.stream_prefix))
    }
}

/// How much of what every group acknowledged a shard stream keeps: each shard's owner trims the rest.
///
/// The owner runs one Lua script on the shard stream (`consumer/retention.lua`) at its takeover and then
/// at most every [`interval`](Self::interval), when the shard had acknowledgements since the last run (or
/// right away when the last run stopped at its bound). The script computes the stream's *floor*: for each
/// consumer group of the stream (`XINFO GROUPS`) its smallest pending id if it has pending entries
/// (`XPENDING`), else its last-delivered id; the minimum over groups. Everything below the floor has been
/// acknowledged by every group. It then trims below the cut, the lowest of the floor, the id of the entry
/// that keeps the newest [`keep`](Self::keep) entries, and the age limit `now - keep_for` (`TIME`),
/// removing at most 1000 entries per run: the stream's whole nodes first (`XTRIM MINID ~ … LIMIT`, no
/// entry read), then the rest exactly, so a run costs Redis O(nodes), not O(entries).
/// A stream without groups is never trimmed; each group's last-delivered entry stays.
///
/// The same run counts entries removed before a group read them (a producer's
/// [`cap_unread`](crate::producer::ProducerConfig::cap_unread), an `XTRIM` or `XDEL` by hand): see
/// ARCHITECTURE.md, "Retention".
///
/// Defaults: keep nothing acknowledged, no age limit, every 5 s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Retention {
    /// The newest entries each shard stream keeps even when every group acknowledged them (default 0).
    pub keep: u64,
    /// Entries younger than this are kept even when every group acknowledged them (by their id's
    /// millisecond timestamp against Redis's clock); `None` (the default): no age limit.
    pub keep_for: Option<Duration>,
    /// Least time between two runs on one shard (default 5 s).
    pub interval: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            keep: 0,
            keep_for: None,
            interval: Duration::from_secs(5),
        }
    }
}

impl Retention {
    /// Keep the newest `n` entries of each shard stream.
    pub fn keep(mut self, n: u64) -> Self {
        self.keep = n;
        self
    }

    /// Keep entries younger than `age`.
    pub fn keep_for(mut self, age: Duration) -> Self {
        self.keep_for = Some(age);
        self
    }

    /// Least time between two runs on one shard.
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }
}

/// What the consumer does with an entry once its handler succeeded (or it was dead-lettered).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AckPolicy {
    /// `XACK`: the entry leaves the group's pending list and stays in the stream until every group
    /// acknowledged it and the [`Retention`] job trims it. Right when several groups read one stream.
    #[default]
    Ack,
    /// Acknowledge and delete the entry from the stream, so a stream read by one group does not grow.
    ///
    /// With several consumer groups on the stream, the [`DeleteRef`] decides whose reads count:
    /// [`DeleteRef::Acked`] deletes an entry only once every group acknowledged it (and so only when the
    /// last group to acknowledge it also uses `AckDelete(Acked)`: a group with plain [`AckPolicy::Ack`]
    /// leaves it in the stream, for the [`Retention`] job to trim); [`DeleteRef::KeepRef`] and
    /// [`DeleteRef::DelRef`] delete it at once, so other groups lose entries they have not read yet. With
    /// one group all three are the same. A consumer whose policy deletes for others logs a WARN at start
    /// naming the stream's other groups (see [`other_groups`](super::other_groups)).
    ///
    /// On Redis >= 8.2 this is `XACKDEL` with the given [`DeleteRef`]. On older servers it is a Lua script
    /// that runs `XACK` then `XDEL` atomically and emulates the reference modes: `KeepRef` is plain
    /// `XDEL`; `DelRef` also `XACK`s the ids in every other group; `Acked` deletes only ids that no group
    /// has pending and every group has already been delivered past. The observable differences: the script
    /// returns no per-id status codes, and on Redis 7 an `XDEL` leaves tombstones that can make
    /// `XINFO GROUPS` report the lag of other groups as unknown.
    AckDelete(DeleteRef),
    /// The handler calls [`Message::ack`](super::Message::ack) itself; the consumer only acks entries it
    /// dead-letters. An entry a handler neither acked nor failed stays pending until the next takeover.
    Manual,
}

/// Which entries [`AckPolicy::AckDelete`] deletes, and what happens to other groups' references to them
/// (Redis 8.2's `XACKDEL` names). There is no default: [`DeleteRef::Acked`] is the one that never takes an
/// entry from a group that has not read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteRef {
    /// Delete the entry only once every group has read and acknowledged it. Safe with several groups.
    Acked,
    /// Delete the entry now, read by other groups or not; they keep their pending references (and see
    /// the entry as deleted when claiming). Loses unread entries for other groups.
    KeepRef,
    /// Delete the entry now and drop every group's pending reference to it. Loses unread and pending
    /// entries for other groups.
    DelRef,
}

impl AckPolicy {
    /// Whether acknowledging deletes entries that other consumer groups of the stream may not have read
    /// yet: `AckDelete(KeepRef)` and `AckDelete(DelRef)`.
    pub fn deletes_for_other_groups(self) -> bool {
        matches!(
            self,
            Self::AckDelete(DeleteRef::KeepRef | DeleteRef::DelRef)
        )
    }
}

impl DeleteRef {
    /// The `XACKDEL` keyword.
    pub fn keyword(self) -> &'static str {
        match self {
            Self::KeepRef => "KEEPREF",
            Self::DelRef => "DELREF",
            Self::Acked => "ACKED",
        }
    }
}

/// What happens when a handler returns an error or panics.
///
/// Retries keep per-key order: the failing entry and the later entries of its shard wait out the backoff
/// (deferred in memory, pending in Redis), while the worker serves the member's other shards. A revoke or
/// shutdown cuts the retries short and leaves the entry pending for the next owner. `delivery_count`
/// counts Redis deliveries (takeovers included) plus local retries.
///
/// The handler's error says how it failed ([`ErrorClass`](super::ErrorClass)): a transient error is retried
/// after the backoff, [`HandlerError::permanent`](super::HandlerError::permanent) goes to `on_exhausted`
/// at once, [`HandlerError::retry_after`](super::HandlerError::retry_after) waits what it asked (at most
/// `max_backoff`) instead of the backoff.
///
/// ```
/// use std::time::Duration;
/// use stream_listener::{FailurePolicy, OnExhausted};
///
/// let policy = FailurePolicy::default()
///     .max_deliveries(3)
///     .initial_backoff(Duration::from_millis(200))
///     .max_backoff(Duration::from_secs(10))
///     .jitter(true)
///     .on_exhausted(OnExhausted::DeadLetter);
/// // The second retry waits 800 ms, jittered to between 400 and 800 ms.
/// let wait = policy.backoff(2, 12345);
/// assert!(wait >= Duration::from_millis(400) && wait <= Duration::from_millis(800));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct FailurePolicy {
    /// Deliveries (first attempt included) before the entry counts as exhausted. At least 1.
    pub max_deliveries: u32,
    /// Wait before the first retry; doubles per retry.
    pub initial_backoff: Duration,
    /// Upper bound of the wait between retries, a handler's
    /// [`retry_after`](super::HandlerError::retry_after) included.
    pub max_backoff: Duration,
    /// Equal jitter on the backoff (default on): each wait is a random 50-100 % of the doubled wait, so
    /// members that failed together (a dependency went down) do not retry in lockstep.
    pub jitter: bool,
    /// What to do with an exhausted entry.
    pub on_exhausted: OnExhausted,
}

impl Default for FailurePolicy {
    fn default() -> Self {
        Self {
            max_deliveries: 5,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            jitter: true,
            on_exhausted: OnExhausted::DeadLetter,
        }
    }
}

impl FailurePolicy {
    /// The wait before local retry number `retry` (0-based): `initial_backoff * 2^retry`, at most
    /// `max_backoff`; with [`jitter`](Self::jitter), a part of it between half and all chosen by `random`
    /// (any number: the consumer draws one per retry).
    pub fn backoff(&self, retry: u32, random: u64) -> Duration {
        let wait = crate::util::exponential_backoff(self.initial_backoff, retry, self.max_backoff);
        if self.jitter {
            crate::util::equal_jitter(wait, random)
        } else {
            wait
        }
    }

    /// Deliveries before an entry counts as exhausted (at least 1).
    pub fn max_deliveries(mut self, n: u32) -> Self {
        self.max_deliveries = n;
        self
    }

    /// Wait before the first retry.
    pub fn initial_backoff(mut self, wait: Duration) -> Self {
        self.initial_backoff = wait;
        self
    }

    /// Upper bound of every wait between retries.
    pub fn max_backoff(mut self, wait: Duration) -> Self {
        self.max_backoff = wait;
        self
    }

    /// Equal jitter on the backoff, or exact doubling.
    pub fn jitter(mut self, on: bool) -> Self {
        self.jitter = on;
        self
    }

    /// What to do with an exhausted entry.
    pub fn on_exhausted(mut self, on_exhausted: OnExhausted) -> Self {
        self.on_exhausted = on_exhausted;
        self
    }
}

/// The fate of an entry whose handler failed `max_deliveries` times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnExhausted {
    /// Copy it to the dead-letter stream with the reason, then acknowledge it: the shard moves on and
    /// nothing is lost.
    #[default]
    DeadLetter,
    /// Leave it pending: the shard moves on, and the entry is offered again at the next takeover (where it
    /// is left pending again without running the handler, until an operator deals with it).
    LeavePending,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_keepref_and_delref_delete_for_other_groups() {
        assert!(!AckPolicy::Ack.deletes_for_other_groups());
        assert!(!AckPolicy::Manual.deletes_for_other_groups());
        assert!(!AckPolicy::AckDelete(DeleteRef::Acked).deletes_for_other_groups());
        assert!(AckPolicy::AckDelete(DeleteRef::KeepRef).deletes_for_other_groups());
        assert!(AckPolicy::AckDelete(DeleteRef::DelRef).deletes_for_other_groups());
    }

    #[test]
    fn backoff_doubles_up_to_the_bound_exactly_without_jitter() {
        let ms = Duration::from_millis;
        let policy = FailurePolicy::default()
            .initial_backoff(ms(100))
            .max_backoff(ms(1000))
            .jitter(false);
        let waits: Vec<Duration> = (0..6).map(|retry| policy.backoff(retry, 99)).collect();
        assert_eq!(
            waits,
            [ms(100), ms(200), ms(400), ms(800), ms(1000), ms(1000)]
        );
    }

    #[test]
    fn jitter_keeps_every_wait_between_half_and_all_of_the_backoff() {
        let ms = Duration::from_millis;
        let policy = FailurePolicy::default()
            .initial_backoff(ms(100))
            .max_backoff(ms(1000));
        assert!(policy.jitter, "jitter is on by default");
        let mut seen = std::collections::BTreeSet::new();
        for retry in 0..6 {
            let exact = policy.jitter(false).backoff(retry, 0);
            for draw in 0..200u64 {
                let random = draw.wrapping_mul(0x9E37_79B9_7F4A_7C15);
                let wait = policy.backoff(retry, random);
                assert!(
                    wait >= exact / 2 && wait <= exact,
                    "retry {retry}: {wait:?} of {exact:?}"
                );
                seen.insert(wait);
            }
        }
        assert!(
            seen.len() > 100,
            "the draws spread the waits: {} distinct",
            seen.len()
        );
        assert_eq!(policy.backoff(0, 0), ms(50), "the lowest draw waits half");
    }
}
