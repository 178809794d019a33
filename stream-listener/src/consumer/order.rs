//! The order barrier of a resize: whether an entry may be handled now, or waits for its key's old shard.
//!
//! Before an entry is handled, its key is placed with [`Topology::placement`](crate::topology::Topology::placement)
//! against the stream's topology (cached, re-read in the background every [`LAYOUT_REFRESH`], never used
//! older than [`LAYOUT_MAX_AGE`], and re-read at once when an entry newer than the cached read is routed here by neither layout). An entry of a key
//! that moved here with the last resize waits until the group has consumed the key's old shard below
//! `min(entry id, cut)`. Until then the job stops at that entry (later entries of the shard wait too, so
//! per-key order holds within the shard), acknowledges what it finished, and hands the rest of the batch
//! back to the scheduler, which retries the shard after a short delay, starting with those entries. They
//! stay pending in Redis under this consumer, so a revoke or crash hands them to the next owner as usual;
//! they are kept in memory rather than re-claimed so that waiting does not raise their delivery count
//! (every `XAUTOCLAIM` adds one, and enough of them would dead-letter an entry that never failed).
//!
//! A key that moved out of a shard a shrink removed waits the same way, for that shard's entries older than
//! its own while the shard drains (see [`Topology::placement`](crate::topology::Topology::placement)). An
//! entry about to be handled that a producer wrote with a stale layout after the cut is counted and logged
//! (`OrderGate::note_stale_write`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::entry::Entry;
use super::shard_io::ShardIo;
use crate::clock::LocalMillis;
use crate::throttle::Throttle;
use crate::topology::{consumed_before, ConsumedBefore, Placement, Topology, TopologyError};

/// How old the cached topology may get before a job re-reads it, in the background: the job gates with
/// the cached one meanwhile, so a re-read never delays a handler.
const LAYOUT_REFRESH: Duration = Duration::from_millis(500);
/// How old the cached topology may get at all: an older one is re-read before gating. It must stay below
/// the smallest grace period of a resize ([`crate::topology::DEFAULT_RESIZE_GRACE`] is 2 s): a second
/// resize waits for the first one's cut, so a cache never older than this is never more than one resize
/// behind, which the moved-key rule detects (see [`Topology::placement`]). The idle wait keeps the cache
/// younger than this while it blocks ([`OrderGate::keep_fresh`]), so an idle pickup gates without a read.
const LAYOUT_MAX_AGE: Duration = Duration::from_millis(1500);
/// Retry delay of a shard whose entries wait for a moved key whose old shard is not consumed yet.
const MOVED_KEY_RETRY: Duration = Duration::from_millis(50);

/// The stream's topology as this consumer last read it.
#[derive(Clone)]
struct Layout {
    topology: Arc<Topology>,
    /// Redis time (ms) taken just before the read: any entry with an older id was written by a producer
    /// whose topology was at most this one.
    read_ms: u64,
}

/// What one job's entries are gated with: the layout, read from the cache once per batch (it is a
/// consistent pair of topology and read time however old, see [`Layout`]), and whether the job already
/// forced a re-read (at most one per job).
#[derive(Default)]
pub(crate) struct GateMemo {
    view: Option<Option<Layout>>,
    refreshed: bool,
}

impl GateMemo {
    /// A new batch: its first entry takes the layout from the cache again.
    pub(crate) fn next_batch(&mut self) {
        self.view = None;
    }
}

#[derive(Default)]
struct LayoutCache {
    /// `None`: not read yet, or the stream has no topology record (then no order barrier applies).
    view: Option<Layout>,
    read_at: Option<Instant>,
    /// Old shard -> bound (ms) below which the group is known to have consumed it, for `view`'s version.
    /// Consumption below a bound never goes back, so this only grows.
    consumed: HashMap<u32, u64>,
    /// The WARNs of reads that fail: during a Redis outage every re-read fails the same way.
    warnings: Throttle,
    /// The WARNs of stale-layout writes: a producer left behind writes many.
    stale_warnings: Throttle,
    /// The origin of the throttles' clock.
    origin: Option<Instant>,
}

impl LayoutCache {
    /// The throttles' clock.
    fn now(&mut self) -> LocalMillis {
        let origin = *self.origin.get_or_insert_with(Instant::now);
        LocalMillis(origin.elapsed().as_millis() as i64)
    }

    /// A failed read: logged at once, then at most once per [`crate::throttle::WARN_EVERY_MS`].
    fn warn(&mut self, stream: &str, error: &dyn std::fmt::Display) {
        let now = self.now();
        if let Some(not_logged) = self.warnings.admit(now) {
            tracing::warn!(%stream, %error, not_logged, "cannot read the stream's topology");
        }
    }
}

/// One consumer's order gate: the cached topology and what it knows of old shards' consumption, and the
/// stale-layout warnings. Shared by the consumer's jobs.
#[derive(Default)]
pub(crate) struct OrderGate {
    cache: Mutex<LayoutCache>,
    /// A background re-read is under way (at most one at a time).
    refreshing: AtomicBool,
}

impl OrderGate {
    fn cache(&self) -> std::sync::MutexGuard<'_, LayoutCache> {
        // Plain data: a panic elsewhere cannot leave it half-updated.
        self.cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The stream's topology: the cached one while younger than [`LAYOUT_MAX_AGE`] (re-read in the
    /// background once older than [`LAYOUT_REFRESH`]), else re-read now, as when `force` is set. `None` when
    /// the stream has no topology record. A failed read keeps the last one (and is logged).
    async fn layout(self: &Arc<Self>, io: &Arc<ShardIo>, force: bool) -> Option<Layout> {
        if !force {
            let cache = self.cache();
            if let Some(age) = cache.read_at.map(|at| at.elapsed()) {
                if age < LAYOUT_MAX_AGE {
                    if age >= LAYOUT_REFRESH {
                        self.refresh_in_background(io);
                    }
                    return cache.view.clone();
                }
            }
        }
        self.read(io).await
    }

    /// Keeps the cache young enough to be used without a read for the next `horizon` (an idle wait's
    /// block): re-reads it in the background if it would be older than [`LAYOUT_MAX_AGE`] minus
    /// [`LAYOUT_REFRESH`] by then, or was never read.
    pub(crate) fn keep_fresh(self: &Arc<Self>, io: &Arc<ShardIo>, horizon: Duration) {
        let age = self.cache().read_at.map(|at| at.elapsed());
        if age.is_none_or(|age| age + horizon >= LAYOUT_MAX_AGE - LAYOUT_REFRESH) {
            self.refresh_in_background(io);
        }
    }

    fn refresh_in_background(self: &Arc<Self>, io: &Arc<ShardIo>) {
        if self.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let (gate, io) = (self.clone(), io.clone());
        // In the member's span, so that a failed re-read's WARN says whose it is.
        tokio::spawn(tracing::Instrument::in_current_span(async move {
            gate.read(&io).await;
            gate.refreshing.store(false, Ordering::Release);
        }));
    }

    /// Re-reads the topology and caches it, unless a read that started later was cached first.
    async fn read(&self, io: &ShardIo) -> Option<Layout> {
        let mut conn = io.conn.clone();
        let started = Instant::now();
        let read = async {
            let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await?;
            let topology = Topology::load(&mut conn, &io.config.stream_prefix).await;
            Ok::<_, redis::RedisError>((secs * 1000 + micros / 1000, topology))
        }
        .await;
        let mut cache = self.cache();
        if cache.read_at.is_some_and(|at| at > started) {
            return cache.view.clone();
        }
        cache.read_at = Some(started);
        let stream = &io.config.stream_prefix;
        match read {
            Ok((read_ms, Ok(topology))) => {
                cache.warnings.clear();
                let version = cache.view.as_ref().map(|l| l.topology.version());
                if version != Some(topology.version()) {
                    cache.consumed.clear();
                }
                cache.view = Some(Layout {
                    topology: Arc::new(topology),
                    read_ms,
                });
            }
            Ok((_, Err(TopologyError::Missing { .. }))) => {
                cache.warnings.clear();
                cache.view = None
            }
            Ok((_, Err(error))) => cache.warn(stream, &error),
            Err(error) => cache.warn(stream, &error),
        }
        cache.view.clone()
    }

    /// The batch's layout: from `memo`, else from the cache (and kept in `memo`). Borrowed, not cloned: a
    /// clone per entry was a count on the topology's `Arc`, shared by every job, moved between the
    /// workers' cores.
    async fn memoized<'m>(
        self: &Arc<Self>,
        io: &Arc<ShardIo>,
        memo: &'m mut GateMemo,
    ) -> Option<&'m Layout> {
        if memo.view.is_none() {
            memo.view = Some(self.layout(io, false).await);
        }
        memo.view.as_ref().and_then(Option::as_ref)
    }

    /// The resize's order for `entry`, about to be handled: `None` if it may be handled now (see
    /// [`gate`](Self::gate); a late stale-layout write among those is counted and warned, see
    /// [`note_stale_write`](Self::note_stale_write)), else how long to defer it. The entry's key and id
    /// time are read once for both.
    pub(super) async fn admit(
        self: &Arc<Self>,
        io: &Arc<ShardIo>,
        shard: u32,
        memo: &mut GateMemo,
        entry: &Entry,
    ) -> Option<Duration> {
        let (Some(key), Some(entry_ms)) = (entry.raw_key(), entry.id_ms()) else {
            return None;
        };
        if let Some(delay) = self.gate(io, shard, memo, entry, key, entry_ms).await {
            return Some(delay);
        }
        self.note_stale_write(io, shard, memo, entry, key, entry_ms)
            .await;
        None
    }

    /// Whether the group consumed old shard `from` below `before_ms` (see
    /// [`crate::topology::consumed_before`]): `None` if so, else how long to defer the entry waiting on it.
    /// Positive answers are cached for the topology `version`.
    async fn old_shard_consumed(
        &self,
        io: &ShardIo,
        version: u64,
        from: u32,
        before_ms: u64,
    ) -> Result<Option<Duration>, TopologyError> {
        let cached = |cache: &LayoutCache| {
            cache
                .view
                .as_ref()
                .is_some_and(|l| l.topology.version() == version)
        };
        {
            let cache = self.cache();
            if cached(&cache) && cache.consumed.get(&from).is_some_and(|&b| b >= before_ms) {
                return Ok(None);
            }
        }
        let stream = io.config.shard_key(from);
        let answer = consumed_before(
            &mut io.conn.clone(),
            &stream,
            Some(&io.config.group),
            before_ms,
        )
        .await?;
        match answer {
            ConsumedBefore::Yes => {
                let mut cache = self.cache();
                if cached(&cache) {
                    let bound = cache.consumed.entry(from).or_insert(0);
                    *bound = (*bound).max(before_ms);
                }
                Ok(None)
            }
            // Old-layout entries may still be written: wait for the bound itself.
            ConsumedBefore::No {
                now_ms,
                group: None,
            } => Ok(Some(
                Duration::from_millis(before_ms.saturating_sub(now_ms))
                    .clamp(Duration::from_millis(10), Duration::from_secs(1)),
            )),
            ConsumedBefore::No { .. } => Ok(Some(MOVED_KEY_RETRY)),
        }
    }

    /// Detects a late stale-layout write (see [`Topology::is_stale_write`]) about to be handled: counts it
    /// for the group in Redis and in the process, and warns (at once, then at most once per
    /// [`crate::throttle::WARN_EVERY_MS`], counting the writes held back).
    async fn note_stale_write(
        self: &Arc<Self>,
        io: &Arc<ShardIo>,
        shard: u32,
        memo: &mut GateMemo,
        entry: &Entry,
        key: &[u8],
        entry_ms: u64,
    ) {
        let Some(view) = self.memoized(io, memo).await else {
            return;
        };
        if !view
            .topology
            .is_stale_write(key, shard, entry_ms, entry.topology_version())
        {
            return;
        }
        crate::topology::count_stale_write_seen();
        io.metrics.stale_write();
        let prefix = &io.config.stream_prefix;
        if let Err(error) =
            Topology::count_stale_write(&mut io.conn.clone(), prefix, &io.config.group).await
        {
            tracing::debug!(stream = %prefix, %error, "cannot count a stale-layout write");
        }
        let since_last_warning = {
            let mut cache = self.cache();
            let now = cache.now();
            match cache.stale_warnings.admit(now) {
                // The repeats held back, and this one.
                Some(held) => held + 1,
                None => return,
            }
        };
        tracing::warn!(
            stale_writes = since_last_warning,
            stream = %prefix,
            group = %io.config.group,
            shard,
            id = %entry.id,
            key = %entry.key(),
            routed_with = ?entry.topology_version(),
            topology = view.topology.version(),
            "a producer wrote with a stale topology after the resize's grace period: per-key order of \
             this key across the resize is not guaranteed (stale writes are counted in {}; refresh \
             producers within the grace)",
            Topology::stale_key(prefix),
        );
    }

    /// The order barrier of a resize: `None` if `entry` may be handled now, else how long to defer it (see the
    /// module docs). The topology comes from the consumer's cache, at most `LAYOUT_MAX_AGE` old when the
    /// batch's first entry is placed; `memo` limits forced re-reads to one per job.
    async fn gate(
        self: &Arc<Self>,
        io: &Arc<ShardIo>,
        shard: u32,
        memo: &mut GateMemo,
        entry: &Entry,
        key: &[u8],
        entry_ms: u64,
    ) -> Option<Duration> {
        let refreshed = memo.refreshed;
        let view = self.memoized(io, memo).await?;
        // Most entries: in their key's shard, routed with no newer topology than ours.
        let newer = || {
            entry
                .topology_version()
                .is_some_and(|v| v > view.topology.version())
        };
        if matches!(
            view.topology.placement(key, shard, entry_ms),
            Placement::Current | Placement::Previous
        ) && (refreshed || !newer())
        {
            return None;
        }
        let mut layout: Option<Layout> = Some(view.clone());
        loop {
            let view = layout.as_ref()?;
            // Routed with a newer topology than ours: re-read it once.
            if !memo.refreshed
                && entry
                    .topology_version()
                    .is_some_and(|v| v > view.topology.version())
            {
                memo.refreshed = true;
                layout = self.layout(io, true).await;
                memo.view = Some(layout.clone());
                continue;
            }
            match view.topology.placement(key, shard, entry_ms) {
                Placement::Current | Placement::Previous => return None,
                Placement::Misrouted => {
                    // Newer than our read: routed by a topology we have not seen yet. Re-read it once.
                    if memo.refreshed || entry_ms < view.read_ms {
                        return None;
                    }
                    memo.refreshed = true;
                    layout = self.layout(io, true).await;
                    memo.view = Some(layout.clone());
                }
                Placement::Moved { from, before_ms } => {
                    let version = view.topology.version();
                    return match self.old_shard_consumed(io, version, from, before_ms).await {
                        Ok(wait) => wait,
                        Err(error) => {
                            tracing::warn!(shard, from, %error, "cannot check the moved key's old shard; deferring");
                            Some(MOVED_KEY_RETRY)
                        }
                    };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consumer::ConsumerConfig;
    use stream_listener_test_support::aio::wait_until;
    use stream_listener_test_support::RedisServer;

    impl OrderGate {
        /// Makes the cached copy `by` older.
        fn age_by(&self, by: Duration) {
            let mut cache = self.cache();
            cache.read_at = cache.read_at.and_then(|at| at.checked_sub(by));
        }

        fn version(&self) -> Option<u64> {
            self.cache().view.as_ref().map(|l| l.topology.version())
        }
    }

    async fn set_up(server: &RedisServer) -> (Arc<ShardIo>, redis::aio::MultiplexedConnection) {
        let client = redis::Client::open(server.url()).unwrap();
        let mut admin = client.get_multiplexed_async_connection().await.unwrap();
        Topology::ensure(&mut admin, "orders", 2).await.unwrap();
        let mut config = ConsumerConfig::new("orders", "g", "m");
        // Longer than any wait below: a read that waits for Redis cannot end early by timing out.
        config.response_timeout = Duration::from_secs(60);
        let io = ShardIo::connect(client.into(), config).await.unwrap();
        (Arc::new(io), admin)
    }

    /// Fault: Redis freezes (SIGSTOP) while the cached topology is due for a re-read. The gate keeps
    /// using the copy (it returns while Redis answers nothing), and the re-read it started brings the
    /// newer topology once Redis runs again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_due_re_read_runs_in_the_background_and_never_holds_the_gate() {
        let server = RedisServer::start();
        let (io, mut admin) = set_up(&server).await;
        let gate = Arc::new(OrderGate::default());
        let first = gate.layout(&io, false).await.expect("a topology");
        assert_eq!(first.topology.version(), 1);
        Topology::resize(&mut admin, "orders", 4).await.unwrap();

        gate.age_by(LAYOUT_REFRESH + Duration::from_millis(100));
        server.freeze();
        let used = tokio::time::timeout(Duration::from_secs(10), gate.layout(&io, false)).await;
        server.thaw();
        let used = used.expect("the gate waited for a frozen Redis");
        assert_eq!(
            used.map(|l| l.topology.version()),
            Some(1),
            "the cached copy"
        );
        wait_until("the background re-read", Duration::from_secs(10), || {
            gate.version() == Some(2)
        })
        .await;
    }

    /// Fault: the topology record becomes unreadable (here a key of the wrong type: every read fails with
    /// `WRONGTYPE` at once, as every read fails in an outage) while the jobs and the wait keep re-reading
    /// it. Every read keeps the copy from before; the first failure is logged and the repeats are held
    /// back (the next line counts them), so a lasting failure is not a WARN per re-read; a read that works
    /// again clears that, and brings the record back.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn failed_re_reads_keep_the_copy_and_are_logged_once_in_a_while() {
        let server = RedisServer::start();
        let (io, mut admin) = set_up(&server).await;
        let gate = Arc::new(OrderGate::default());
        let version = |layout: Option<Layout>| layout.map(|l| l.topology.version());
        assert_eq!(version(gate.read(&io).await), Some(1));
        let key = crate::names::topology("orders");
        let _: () = redis::cmd("RENAME")
            .arg(&key)
            .arg("saved")
            .query_async(&mut admin)
            .await
            .unwrap();
        let _: () = redis::cmd("RPUSH")
            .arg(&key)
            .arg("garbage")
            .query_async(&mut admin)
            .await
            .unwrap();
        for _ in 0..3 {
            assert_eq!(version(gate.read(&io).await), Some(1), "the copy is kept");
        }
        let held = gate.cache().warnings.clone().clear();
        assert_eq!(
            held, 2,
            "the first failure is logged, the two repeats held back"
        );

        let _: () = redis::cmd("RENAME")
            .arg("saved")
            .arg(&key)
            .query_async(&mut admin)
            .await
            .unwrap();
        assert_eq!(version(gate.read(&io).await), Some(1));
        assert_eq!(gate.cache().warnings, Throttle::default(), "cleared");
    }

    /// Garbage input of a kind: a producer that missed a resize keeps writing with the old layout past
    /// the cut. Every such entry is counted in Redis; the WARN goes out for the first, then the repeats
    /// are held back and counted on the next line (one stale producer writes thousands).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn stale_writes_are_all_counted_and_warned_of_once_in_a_while() {
        let server = RedisServer::start();
        let (io, mut admin) = set_up(&server).await;
        let topology = Topology::resize(&mut admin, "orders", 4).await.unwrap();
        let cut = topology.migration().expect("a resize").cut_ms();
        let key = (0..100)
            .map(|i| format!("key-{i}"))
            .find(|k| {
                crate::routing::shard_for_key(k.as_bytes(), 2)
                    != topology.shard_for_key(k.as_bytes())
            })
            .expect("a key that moved");
        let old_shard = crate::routing::shard_for_key(key.as_bytes(), 2);
        // Routed with version 1 (no `v` field), a second past the cut, into the key's old shard.
        let entry = Entry {
            id: format!("{}-0", cut + 1_000),
            fields: vec![(b"k".to_vec(), key.clone().into_bytes())],
            delivery_count: 1,
            deleted: false,
            retries: 0,
        };
        let gate = Arc::new(OrderGate::default());
        for _ in 0..3 {
            gate.admit(&io, old_shard, &mut GateMemo::default(), &entry)
                .await;
        }
        let counted: u64 = Topology::stale_writes(&mut admin, "orders")
            .await
            .unwrap()
            .values()
            .sum();
        assert_eq!(counted, 3, "every stale write is counted in Redis");
        assert_eq!(
            gate.cache().stale_warnings.clone().clear(),
            2,
            "the first one is warned of, the two after it held back"
        );
    }

    /// Fault: Redis freezes while the cached topology is older than [`LAYOUT_MAX_AGE`]. The gate does not
    /// use it: it waits for the re-read, which brings the newer topology once Redis runs again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_copy_older_than_the_bound_is_re_read_before_it_is_used() {
        let server = RedisServer::start();
        let (io, mut admin) = set_up(&server).await;
        let gate = Arc::new(OrderGate::default());
        gate.layout(&io, false).await.expect("a topology");
        Topology::resize(&mut admin, "orders", 4).await.unwrap();

        gate.age_by(LAYOUT_MAX_AGE);
        server.freeze();
        let pending = tokio::spawn({
            let (gate, io) = (gate.clone(), io.clone());
            async move { gate.layout(&io, false).await }
        });
        // The read reached the frozen server and waits for it.
        let waiting = tokio::time::timeout(Duration::from_millis(500), async {
            while !pending.is_finished() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        server.thaw();
        assert!(waiting.is_err(), "the old copy was used");
        let used = pending.await.unwrap();
        assert_eq!(used.map(|l| l.topology.version()), Some(2));
    }

    /// The idle wait's re-read: started when the copy would age past the bound's margin within the wait,
    /// not before (one re-read every other wait at the default block, not one per wait). Redis is frozen
    /// (SIGSTOP) whenever a re-read may start, so one that started is still under way when looked at.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_wait_re_reads_only_a_copy_that_would_age_past_the_margin() {
        let server = RedisServer::start();
        let (io, _admin) = set_up(&server).await;
        let gate = Arc::new(OrderGate::default());
        let block = Duration::from_millis(450);
        let refreshing = |gate: &OrderGate| gate.refreshing.load(Ordering::Acquire);
        let re_read = |what: &'static str| {
            let gate = gate.clone();
            async move {
                wait_until(what, Duration::from_secs(10), || {
                    gate.version() == Some(1) && !refreshing(&gate)
                })
                .await;
            }
        };

        server.freeze();
        gate.keep_fresh(&io, block);
        let started = refreshing(&gate);
        server.thaw();
        assert!(started, "never read: read now");
        re_read("the first read").await;

        gate.keep_fresh(&io, block);
        assert!(!refreshing(&gate), "a young copy is not read again");

        gate.age_by(LAYOUT_MAX_AGE - LAYOUT_REFRESH - block);
        server.freeze();
        gate.keep_fresh(&io, block);
        let started = refreshing(&gate);
        server.thaw();
        assert!(started, "a copy ageing past the margin is read again");
        re_read("the second read").await;
    }
}
