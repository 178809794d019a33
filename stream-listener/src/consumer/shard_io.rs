//! The Redis side of consumption ([`ShardIo`]): connections, and every command a consumer sends to its
//! shard streams (reads, claims, acks, dead letters, cleanup; their replies decoded by [`crate::reply`]),
//! with the cached topology that the moved-key rule reads.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisResult, Script, Value};

use crate::connection::{ConnectOptions, Connection, RedisTarget};
use crate::preflight::ServerVersion;
use crate::reply;

use super::config::{AckPolicy, ConsumerConfig};
use super::entry::Entry;
use super::fence::Fence;
use super::message::{Acknowledge, BoxFuture};

pub use crate::names::field::{KEY as KEY_FIELD, PAYLOAD as PAYLOAD_FIELD};

/// Field names the consumer adds to a dead-letter entry ([`crate::names::dead_letter_field`]).
pub use crate::names::dead_letter_field as dead_letter_fields;

/// Acknowledge the ids, then delete them per `ARGV[2]` (KEEPREF, DELREF, ACKED): `XACKDEL` for servers
/// older than 8.2. Atomic because it is one script.
const ACK_DELETE_SCRIPT: &str = include_str!("ack_delete.lua");

/// Delete the group's consumers other than `ARGV[2]` that have nothing pending. One script, so a consumer
/// cannot gain pending entries between the check and `XGROUP DELCONSUMER` (which would drop them).
const CLEANUP_SCRIPT: &str = include_str!("cleanup.lua");

/// The consumer groups of the stream other than `config.group` (the library's own left out), sorted: the
/// groups of shard 0 (`XINFO GROUPS`), which every group of the stream reads. None when the shard does
/// not exist yet.
pub async fn other_groups<C>(conn: &mut C, config: &ConsumerConfig) -> RedisResult<Vec<String>>
where
    C: redis::aio::ConnectionLike + Send,
{
    let key = config.shard_key(0);
    let exists: bool = redis::cmd("EXISTS").arg(&key).query_async(conn).await?;
    if !exists {
        return Ok(Vec::new());
    }
    let groups: Value = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(&key)
        .query_async(conn)
        .await?;
    let mut names: Vec<String> = reply::xinfo_groups(&groups)?
        .into_iter()
        .map(|group| group.name)
        .filter(|name| *name != config.group && !crate::names::is_internal_group(name))
        .collect();
    names.sort();
    Ok(names)
}

/// Says at start when the ack policy deletes entries on a stream other groups read too (see
/// [`AckPolicy::AckDelete`]): a WARN when they may lose entries they have not read, an INFO when entries
/// are deleted only once every group acknowledged them. Best effort: a failed look is logged at DEBUG.
async fn warn_about_other_groups(conn: &mut Connection, config: &ConsumerConfig) {
    if !matches!(config.ack_policy, AckPolicy::AckDelete(_)) {
        return;
    }
    let others = match other_groups(conn, config).await {
        Ok(others) => others,
        Err(error) => {
            tracing::debug!(stream = %config.stream_prefix, %error, "cannot list the stream's consumer groups");
            return;
        }
    };
    if others.is_empty() {
        return;
    }
    let other_groups = others.join(", ");
    let (stream, group, policy) = (&config.stream_prefix, &config.group, config.ack_policy);
    if policy.deletes_for_other_groups() {
        tracing::warn!(%stream, %group, %other_groups, ?policy, "this ack policy deletes entries the stream's other consumer groups may not have read yet: they lose them; use AckDelete(Acked) (ack = \"ack_delete_acked\") to delete only what every group acknowledged, or plain Ack");
    } else {
        tracing::info!(%stream, %group, %other_groups, ?policy, "other consumer groups read this stream: an entry is deleted only once every group acknowledged it, and only by a group that acknowledges with AckDelete(Acked) last (plain acks leave it for the retention job to trim)");
    }
}

/// One consumer's way to its shard streams, shared (`Arc`) by its scheduler, jobs, idle wait and manual
/// ackers: the connections, the Redis commands on shards, the cached topology, and what those commands
/// need to know (config, server version, probe, metrics).
pub(crate) struct ShardIo {
    pub(crate) config: ConsumerConfig,
    pub(crate) client: RedisTarget,
    /// Non-blocking commands only: reads without BLOCK, claims, acks, dead letters, scripts.
    pub(crate) conn: Connection,
    pub(crate) version: ServerVersion,
    pub(crate) dead_letter_key: String,
    ack_delete_script: Script,
    cleanup_script: Script,
    /// Installs an ownership's fence, and runs single-key commands behind it (see the `fence` module).
    fence_script: Script,
    fenced_script: Script,
    warned_missing_group: std::sync::atomic::AtomicBool,
    /// Handlers running and failing reads, for health and shutdown reports.
    pub(crate) probe: crate::health::Probe,
    /// One permit per worker (`runtime_max_concurrency`): a job holds one while its handler runs on a
    /// batch, so that more shards may be read than handled at once (see the `job` module).
    pub(crate) handlers: tokio::sync::Semaphore,
    /// The consumer's counters and histograms, labelled with its stream and group.
    pub(crate) metrics: crate::metrics::ConsumerMetrics,
}

impl ShardIo {
    pub(crate) async fn connect(client: RedisTarget, config: ConsumerConfig) -> RedisResult<Self> {
        let handlers = tokio::sync::Semaphore::new(config.runtime_max_concurrency.max(1));
        let options = ConnectOptions {
            response_timeout: Some(config.response_timeout),
            connection_timeout: Some(config.response_timeout),
            retries: None,
            // A read's lost reply must reach the job (see `ReadMode::after_failure`).
            no_resend: true,
        };
        let mut conn = client.connect(options).await?;
        warn_about_other_groups(&mut conn, &config).await;
        let info = conn.server_info().await?;
        let version = ServerVersion::from_info(&info).unwrap_or(ServerVersion {
            major: 0,
            minor: 0,
            patch: 0,
            valkey: false,
        });
        Ok(Self {
            dead_letter_key: config.dead_letter_key(),
            metrics: crate::metrics::ConsumerMetrics::new(&config.stream_prefix, &config.group),
            config,
            client,
            conn,
            version,
            ack_delete_script: Script::new(ACK_DELETE_SCRIPT),
            cleanup_script: Script::new(CLEANUP_SCRIPT),
            fence_script: Script::new(super::fence::INSTALL_SCRIPT),
            fenced_script: Script::new(super::fence::FENCED_SCRIPT),
            warned_missing_group: std::sync::atomic::AtomicBool::new(false),
            probe: crate::health::Probe::default(),
            handlers,
        })
    }

    /// A dedicated connection for the idle wait's blocking read: redis-rs queues every command behind a blocking read
    /// on a multiplexed connection, so blocking reads never share one with acks or heartbeats.
    /// Returns it with its Redis client id (for `CLIENT UNBLOCK`) and its node's generation: behind
    /// Sentinel it is to the node the member's own connection uses (see
    /// [`SentinelConnection::pinned`](crate::connection::SentinelConnection::pinned)).
    pub(crate) async fn blocking_connection(
        &self,
    ) -> RedisResult<(MultiplexedConnection, i64, u64)> {
        let timeout = Duration::from_millis(self.config.block_ms) + self.config.response_timeout;
        let config = AsyncConnectionConfig::new()
            .set_response_timeout(Some(timeout))
            .set_connection_timeout(Some(self.config.response_timeout));
        let (mut conn, generation) = match &self.conn {
            Connection::Sentinel(main) => main.pinned(&config).await?,
            _ => (self.client.node_connection(None, &config).await?, 0),
        };
        let id: i64 = redis::cmd("CLIENT")
            .arg("ID")
            .query_async(&mut conn)
            .await?;
        Ok((conn, id, generation))
    }

    /// Behind Sentinel, the generation of the node the member's commands go to now (see
    /// [`blocking_connection`](Self::blocking_connection)); 0 elsewhere.
    pub(crate) fn node_generation(&self) -> u64 {
        match &self.conn {
            Connection::Sentinel(main) => main.generation(),
            _ => 0,
        }
    }

    /// Resolves once the member's commands go to another node than in generation `since` (behind
    /// Sentinel); never elsewhere.
    pub(crate) async fn node_moved(&self, since: u64) {
        match &self.conn {
            Connection::Sentinel(main) => main.moved(since).await,
            _ => std::future::pending().await,
        }
    }

    /// `XREADGROUP ... COUNT n STREAMS key fence > >`: the shard's new entries, delivered to this member,
    /// unless the ownership's fence is gone (then `NOGROUP` naming the fence, and nothing is delivered; see
    /// the `fence` module). Never blocks: a group read is sent only right after a deadline check (the idle
    /// wait's blocking group read is [`read_new_blocking`](Self::read_new_blocking)).
    fn read_cmd(&self, key: &str, fence: &Fence) -> redis::Cmd {
        let mut cmd = self.group_read();
        cmd.arg("STREAMS")
            .arg(key)
            .arg(&*fence.key)
            .arg(">")
            .arg(">");
        cmd
    }

    /// `XREADGROUP GROUP <group> <member> COUNT <batch size>`, the start of every group read.
    fn group_read(&self) -> redis::Cmd {
        self.group_read_of(self.config.batch_size)
    }

    fn group_read_of(&self, count: usize) -> redis::Cmd {
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(&self.config.group)
            .arg(&self.config.consumer_name)
            .arg("COUNT")
            .arg(count);
        cmd
    }

    /// How many entries a group wait over `watched` shards reads from each: a batch, but no more than a
    /// batch per worker in all (at least one a shard). What a wait delivers is held in memory, pending,
    /// until the shards' jobs take it, one batch per worker at a time: 1,024 idle shards that all get a
    /// burst at once deliver 1,024 entries, not 1,024 batches.
    pub(crate) fn wait_count(&self, watched: usize) -> usize {
        wait_count(
            self.config.batch_size,
            self.config.runtime_max_concurrency,
            watched,
        )
    }

    /// Installs this ownership's fence before its first command on the shard (see the `fence` module).
    pub(crate) async fn install_fence(&self, fence: &Fence) -> RedisResult<()> {
        fence
            .install(
                &self.fence_script,
                &mut self.conn.clone(),
                &self.config.group,
            )
            .await
    }

    /// The command named by the first argument added, on shard stream `key` with the arguments after it
    /// (the key is not repeated), run only while `fence` exists.
    fn fenced<'a>(&'a self, key: &str, fence: &Fence) -> redis::ScriptInvocation<'a> {
        let mut invocation = self.fenced_script.key(key);
        invocation.key(&*fence.key);
        invocation
    }

    /// `XREADGROUP ... STREAMS key fence > >`: new entries, without blocking (the idle wait blocks, see
    /// `wait`).
    pub(crate) async fn read_new(&self, key: &str, fence: &Fence) -> RedisResult<Vec<Entry>> {
        let reply: Value = self
            .read_cmd(key, fence)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(entries_of(reply::read(reply)))
    }

    /// The idle wait on Redis 6.2: one `XREAD COUNT 1 BLOCK ms STREAMS k1 k2 .. id1 id2 ..` over several
    /// shard streams, on a blocking connection, each stream watched above its id (at most the group's last-delivered id).
    /// Returns the keys that have an entry above their id. It delivers nothing to the group: a wait that
    /// reaches Redis late (its process froze with it queued) or is served while the process is frozen takes
    /// no entry from the shard's next owner. (One multi-key command: a single Redis node only; on a cluster
    /// the keys of one wait must share a slot.)
    pub(crate) async fn wait_for_new(
        &self,
        streams: &[(&str, &str)],
        conn: &mut MultiplexedConnection,
        block: Duration,
    ) -> RedisResult<Vec<String>> {
        let ms = block_ms(block);
        let mut cmd = redis::cmd("XREAD");
        cmd.arg("COUNT").arg(1).arg("BLOCK").arg(ms).arg("STREAMS");
        for (key, _) in streams {
            cmd.arg(*key);
        }
        for (_, id) in streams {
            cmd.arg(*id);
        }
        let reply: Value = cmd.query_async(conn).await?;
        Ok(reply::read_by_stream(reply)
            .into_iter()
            .filter(|(_, entries)| !entries.is_empty())
            .map(|(key, _)| key)
            .collect())
    }

    /// Whether the idle wait may block in a group read (see [`read_new_blocking`](Self::read_new_blocking)):
    /// Redis 7.0 and Valkey end a blocked `XREADGROUP` with an error (`UNBLOCKED the stream key no longer
    /// exists`) when one of its streams is deleted,
    /// so a newer owner's fence install ends a zombie's blocked read. Older servers leave it blocked, and
    /// wait with [`wait_for_new`](Self::wait_for_new), which delivers nothing.
    ///
    /// Behind Sentinel the wait's connection is to the node the member's own reads go to, and a wait whose
    /// node is no longer theirs hands on nothing (see the `wait` module): during a failover the old and the
    /// new master both serve reads for a while, and a group read on the other one could deliver an entry
    /// the old master took after newer entries the member read from the new one (`tests/sentinel.rs`
    /// caught that when the wait found its master by a discovery of its own).
    pub(crate) fn group_wait(&self) -> bool {
        self.version.valkey || self.version.major >= 7
    }

    /// The idle wait as a group read: `XREADGROUP ... COUNT n BLOCK ms STREAMS k1 f1 k2 f2 .. > > ..` over
    /// several shards, each with its ownership's fence, on a blocking connection. Returns the entries it
    /// delivered, by shard key. With [`WaitReads::follow_up`], the same read without `BLOCK` is pipelined
    /// behind it: Redis runs it as soon as the blocked read ends (see the `wait` module).
    ///
    /// Fenced like any group read (see the `fence` module): a read that reaches Redis after a newer owner
    /// installed its fence fails with `NOGROUP` at once, and one blocked when that happens is ended with
    /// an `UNBLOCKED` error by the install's `DEL` of our fence (Redis 7.0 unblocks a blocked `XREADGROUP`
    /// whose stream is deleted): a zombie's wait delivers nothing once the next owner is in. Only a reply from Redis
    /// says what it delivered: after a lost one the shards claim their own pending entries first
    /// ([`super::scheduler::WaitReport::in_doubt`]).
    pub(crate) async fn read_new_blocking(
        &self,
        read: &redis::Pipeline,
        conn: &mut MultiplexedConnection,
    ) -> RedisResult<Vec<(String, Vec<Entry>)>> {
        let replies: Vec<RedisResult<Value>> = read.query_async(conn).await?;
        merge_reads(replies)
    }

    /// The group wait's read over `streams`, `(stream key, fence key)` each, for
    /// [`read_new_blocking`](Self::read_new_blocking): one command, or two with a follow-up.
    pub(crate) fn group_wait_read(
        &self,
        streams: &[(&str, &str)],
        reads: WaitReads,
        block_ms: u64,
    ) -> redis::Pipeline {
        let read = |block: Option<u64>| {
            let mut cmd = self.group_read_of(reads.count);
            if let Some(ms) = block {
                cmd.arg("BLOCK").arg(ms);
            }
            cmd.arg("STREAMS");
            for (key, fence) in streams {
                cmd.arg(*key).arg(*fence);
            }
            for _ in 0..streams.len() * 2 {
                cmd.arg(">");
            }
            cmd
        };
        let mut pipe = redis::pipe();
        pipe.add_command(read(Some(block_ms)));
        if reads.follow_up {
            pipe.add_command(read(None));
        }
        pipe.ignore_errors();
        pipe
    }

    /// The group's last-delivered id on shard stream `key` (`XINFO GROUPS`): where the idle wait watches
    /// from when this member has read nothing new there yet. Everything up to it was delivered, so any
    /// snapshot of it is a safe place to watch from. `NOGROUP` when the group (or the stream) is missing.
    pub(crate) async fn last_delivered_id(&self, key: &str) -> RedisResult<String> {
        let reply: RedisResult<Value> = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(key)
            .query_async(&mut self.conn.clone())
            .await;
        let missing = || {
            let detail = format!("no consumer group `{}` on `{key}`", self.config.group);
            redis::make_extension_error("NOGROUP".to_owned(), Some(detail))
        };
        match reply {
            Ok(groups) => reply::xinfo_groups(&groups)
                .ok()
                .and_then(|groups| {
                    groups.into_iter().find_map(|info| {
                        (info.name == self.config.group)
                            .then_some(info.last_delivered_id)
                            .flatten()
                    })
                })
                .ok_or_else(missing),
            // `ERR no such key`: the stream is gone with its group.
            Err(error) if error.to_string().contains("no such key") => Err(missing()),
            Err(error) => Err(error),
        }
    }

    /// Claims entries that other consumers of the group have left pending for longer than
    /// `reclaim_idle` (a zombie owner that read after it lost the shard, an ack that never arrived): so
    /// nothing stays pending for good. Our own pending entries are left alone (deferred or left on purpose).
    pub(crate) async fn reclaim_stale(&self, key: &str, fence: &Fence) -> RedisResult<Vec<Entry>> {
        let idle = self.config.reclaim_idle.as_millis() as u64;
        let mut conn = self.conn.clone();
        let pending: Value = redis::cmd("XPENDING")
            .arg(key)
            .arg(&self.config.group)
            .arg("IDLE")
            .arg(idle)
            .arg("-")
            .arg("+")
            .arg(self.config.batch_size)
            .query_async(&mut conn)
            .await?;
        let stale: Vec<String> = reply::pending(pending)
            .into_iter()
            .filter(|row| row.consumer != self.config.consumer_name)
            .map(|row| row.id)
            .collect();
        if stale.is_empty() {
            return Ok(Vec::new());
        }
        // At most a batch of ids: well inside what the script's `unpack` takes.
        let claimed: Value = self
            .fenced(key, fence)
            .arg("XCLAIM")
            .arg(&self.config.group)
            .arg(&self.config.consumer_name)
            .arg(idle)
            .arg(&stale)
            .invoke_async(&mut conn)
            .await?;
        let mut entries: Vec<Entry> = entries_of(reply::entries(claimed))
            .into_iter()
            .filter(|e| !e.deleted)
            .collect();
        self.set_delivery_counts(key, &mut entries).await?;
        Ok(entries)
    }

    /// Creates the shard's consumer group again after the store lost it, at `0`: every entry still in
    /// the stream is delivered again, which keeps at-least-once (entries that were acknowledged before the
    /// loss are handled twice). Only called once a heartbeat confirmed the member still owns the shard.
    pub(crate) async fn recreate_group(
        &self,
        key: &str,
        shard: u32,
        ownership: &super::message::ShardOwnership,
    ) -> RedisResult<()> {
        if !ownership.is_active() {
            return Ok(());
        }
        let created: RedisResult<()> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(key)
            .arg(&self.config.group)
            .arg(crate::names::FIRST_ENTRY)
            .arg("MKSTREAM")
            .query_async(&mut self.conn.clone())
            .await;
        match created {
            Ok(()) => {
                // The loss was already warned about once per consumer (`warn_missing_group`).
                tracing::info!(shard, stream = key, group = %self.config.group, "consumer group recreated at 0: entries still in the stream are delivered again");
                Ok(())
            }
            Err(error) if error.code() == Some("BUSYGROUP") => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// Says once per consumer that a shard's consumer group is missing (not once per shard per retry).
    pub(crate) fn warn_missing_group(&self, key: &str) {
        if !self
            .warned_missing_group
            .swap(true, std::sync::atomic::Ordering::AcqRel)
        {
            tracing::warn!(stream = key, group = %self.config.group, "the shard's consumer group is missing (Redis restarted empty or was flushed?): waiting for the coordinator to confirm ownership, then recreating it");
        }
    }

    /// Acknowledge the previous batch and read the next one in a single round trip (a pipeline: the ack
    /// still reaches Redis before the read). The script fallback of ack-and-delete cannot be pipelined
    /// this way and takes two round trips.
    pub(crate) async fn ack_and_read_new(
        &self,
        key: &str,
        fence: &Fence,
        acks: &mut CarriedAcks,
    ) -> RedisResult<Vec<Entry>> {
        // Taken, not copied (a batch's ids, every turn): the acks go out once, in this pipeline, and
        // after a failure the job ends without them.
        let Some(ack) = acks.cmd.take() else {
            let ids: Vec<&str> = acks.ids.iter().map(String::as_str).collect();
            self.ack(key, &ids).await?;
            return self.read_new(key, fence).await;
        };
        let mut pipe = redis::pipe();
        pipe.add_command(ack).ignore();
        pipe.add_command(self.read_cmd(key, fence));
        let (reply,): (Value,) = pipe.query_async(&mut self.conn.clone()).await?;
        Ok(entries_of(reply::read(reply)))
    }

    /// `XAUTOCLAIM key group me 0 cursor COUNT n`, then the delivery counts of what was claimed. Returns
    /// the next cursor (`0-0` when the pending list was walked to its end) and the live entries; entries
    /// deleted from the stream are dropped from the pending list by Redis itself.
    pub(crate) async fn claim(
        &self,
        key: &str,
        fence: &Fence,
        cursor: &str,
    ) -> RedisResult<(String, Vec<Entry>)> {
        let mut conn = self.conn.clone();
        let reply: Value = self
            .fenced(key, fence)
            .arg("XAUTOCLAIM")
            .arg(&self.config.group)
            .arg(&self.config.consumer_name)
            .arg(0)
            .arg(cursor)
            .arg("COUNT")
            .arg(self.config.batch_size)
            .invoke_async(&mut conn)
            .await?;
        let (next, entries) = reply::autoclaim(reply);
        let entries = entries_of(entries);
        let next = next.unwrap_or_else(|| crate::names::START_ID.to_owned());
        // Redis 6.2 returns deleted entries as nil; ack them so they leave the pending list.
        let (mut live, dead): (Vec<_>, Vec<_>) = entries.into_iter().partition(|e| !e.deleted);
        if !dead.is_empty() {
            let ids: Vec<&str> = dead.iter().map(|e| e.id.as_str()).collect();
            redis::cmd("XACK")
                .arg(key)
                .arg(&self.config.group)
                .arg(&ids)
                .query_async::<i64>(&mut conn)
                .await?;
        }
        self.set_delivery_counts(key, &mut live).await?;
        Ok((next, live))
    }

    /// Sets the delivery counts of entries just claimed by this consumer (`XPENDING` over their range).
    async fn set_delivery_counts(&self, key: &str, entries: &mut [Entry]) -> RedisResult<()> {
        let (Some(first), Some(last)) = (entries.first(), entries.last()) else {
            return Ok(());
        };
        let pending: Value = redis::cmd("XPENDING")
            .arg(key)
            .arg(&self.config.group)
            .arg(&first.id)
            .arg(&last.id)
            .arg(entries.len())
            .arg(&self.config.consumer_name)
            .query_async(&mut self.conn.clone())
            .await?;
        let counts = reply::pending_counts(pending);
        for entry in entries {
            entry.delivery_count = counts.get(entry.id.as_str()).copied().unwrap_or(1).max(1);
        }
        Ok(())
    }

    /// Delete consumer names of this shard's group, other than ours, that have nothing pending: pods come
    /// and go, and their names would otherwise pile up in `XINFO CONSUMERS` forever.
    pub(crate) async fn cleanup_consumers(
        &self,
        key: &str,
        fence: &Fence,
    ) -> RedisResult<Vec<String>> {
        self.cleanup_script
            .key(key)
            .key(&*fence.key)
            .arg(&self.config.group)
            .arg(&self.config.consumer_name)
            .invoke_async(&mut self.conn.clone())
            .await
    }

    /// The single command that acknowledges `ids` per the ack policy, or `None` when it takes the
    /// ack-and-delete script (servers without `XACKDEL`). `Manual` acks with plain `XACK`: the consumer
    /// only acks entries it finished itself, such as dead letters. Not behind the ownership's fence: an
    /// ack only ever names entries this member handled, so one that reaches Redis late is harmless (see
    /// the `fence` module), and a script around every ack cost a fifth of the throughput.
    /// A batch's acks (`ids`, not empty), kept to go out with the next read: the command built at once
    /// (one buffer, not an id string each), or the ids when the ack is a script.
    pub(crate) fn carry_acks(&self, key: &str, ids: &[&str]) -> CarriedAcks {
        let last = ids.last().map_or_else(String::new, |id| (*id).to_owned());
        match self.ack_cmd(key, ids) {
            Some(cmd) => CarriedAcks {
                cmd: Some(cmd),
                ids: Vec::new(),
                last,
            },
            None => CarriedAcks {
                cmd: None,
                ids: ids.iter().map(|id| (*id).to_owned()).collect(),
                last,
            },
        }
    }

    fn ack_cmd(&self, key: &str, ids: &[&str]) -> Option<redis::Cmd> {
        match self.config.ack_policy {
            AckPolicy::Ack | AckPolicy::Manual => {
                let mut cmd = redis::cmd("XACK");
                cmd.arg(key).arg(&self.config.group).arg(ids);
                Some(cmd)
            }
            AckPolicy::AckDelete(mode) if self.version.has_xackdel() => {
                let mut cmd = redis::cmd("XACKDEL");
                cmd.arg(key)
                    .arg(&self.config.group)
                    .arg(mode.keyword())
                    .arg("IDS")
                    .arg(ids.len())
                    .arg(ids);
                Some(cmd)
            }
            AckPolicy::AckDelete(_) => None,
        }
    }

    /// Acknowledge `ids` per the ack policy.
    pub(crate) async fn ack(&self, key: &str, ids: &[&str]) -> RedisResult<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let mut conn = self.conn.clone();
        if let Some(cmd) = self.ack_cmd(key, ids) {
            cmd.query_async::<Value>(&mut conn).await?;
        } else if let AckPolicy::AckDelete(mode) = self.config.ack_policy {
            self.ack_delete_script
                .key(key)
                .arg(&self.config.group)
                .arg(mode.keyword())
                .arg(ids)
                .invoke_async::<Value>(&mut conn)
                .await?;
        }
        Ok(())
    }

    /// Copy entries to the dead-letter stream: the original fields, then the reason and where they came
    /// from. Not atomic with the ack that follows (the streams may live on different cluster nodes): a
    /// crash in between dead-letters an entry twice, never zero times.
    ///
    /// Several letters go as one `MULTI`/`EXEC` transaction (one key, so one slot on a cluster): a
    /// command refused while queued (`OOM`, a redirection) aborts it whole, so the retry after a refused
    /// write writes each letter once. As a plain pipeline, the letters ahead of the one that crossed
    /// `maxmemory` were written, and written again by the retry (`tests/error_classes.rs`).
    pub(crate) async fn dead_letter(
        &self,
        key: &str,
        shard: u32,
        letters: &[(&Entry, Letter)],
    ) -> RedisResult<()> {
        if letters.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        if letters.len() > 1 {
            pipe.atomic();
        }
        for (entry, letter) in letters {
            let cmd = pipe.cmd("XADD").arg(&self.dead_letter_key).arg("*");
            for (name, value) in &entry.fields {
                cmd.arg(name).arg(value);
            }
            cmd.arg(dead_letter_fields::ERROR)
                .arg(&letter.reason)
                .arg(dead_letter_fields::PERMANENT)
                .arg(if letter.permanent { "true" } else { "false" })
                .arg(dead_letter_fields::DELIVERY_COUNT)
                .arg(letter.deliveries)
                .arg(dead_letter_fields::GROUP)
                .arg(&self.config.group)
                .arg(dead_letter_fields::SHARD)
                .arg(shard)
                .arg(dead_letter_fields::SOURCE_STREAM)
                .arg(key)
                .arg(dead_letter_fields::SOURCE_ID)
                .arg(&entry.id)
                .arg(dead_letter_fields::CONSUMER)
                .arg(&self.config.consumer_name)
                .ignore();
        }
        pipe.query_async::<()>(&mut self.conn.clone()).await
    }
}

/// Why an entry is dead-lettered: what its dead letter records besides the entry and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Letter {
    /// Deliveries before it was given up.
    pub(crate) deliveries: u32,
    /// The handler's error, or why the entry never reached it.
    pub(crate) reason: String,
    /// Given up before its deliveries ran out: the handler said retrying cannot help, or the payload
    /// does not decode.
    pub(crate) permanent: bool,
}

/// Entries as the consumer keeps them, from a reply's rows: delivered once until `XPENDING` says more.
/// A batch's acknowledgements, carried to go out in one pipeline with the next read
/// ([`ShardIo::carry_acks`]).
pub(crate) struct CarriedAcks {
    cmd: Option<redis::Cmd>,
    ids: Vec<String>,
    /// The last id acknowledged.
    pub(crate) last: String,
}

/// A blocking read's `BLOCK`, in milliseconds: at least 1 (0 would block forever).
pub(crate) fn block_ms(block: Duration) -> u64 {
    block.as_millis().clamp(1, u128::from(u64::MAX)) as u64
}

fn entries_of(rows: Vec<reply::StreamEntry>) -> Vec<Entry> {
    rows.into_iter()
        .map(|row| Entry {
            id: row.id,
            deleted: row.fields.is_none(),
            fields: row.fields.unwrap_or_default(),
            delivery_count: 1,
            retries: 0,
        })
        .collect()
}

/// What the wait's reads delivered, by shard key, in order (a key read by both: the blocking read's
/// entries first). An error reply delivered nothing: it is the result only when nothing was delivered, and
/// what the other read delivered is handed on (the next command on the shard finds the error again).
fn merge_reads(replies: Vec<RedisResult<Value>>) -> RedisResult<Vec<(String, Vec<Entry>)>> {
    let mut delivered: Vec<(String, Vec<Entry>)> = Vec::new();
    let mut refused = None;
    for reply in replies {
        let reply = match reply {
            Ok(reply) => reply,
            Err(error) => {
                refused.get_or_insert(error);
                continue;
            }
        };
        for (key, rows) in reply::read_by_stream(reply) {
            if rows.is_empty() {
                continue;
            }
            let entries = entries_of(rows);
            match delivered.iter_mut().find(|(k, _)| *k == key) {
                Some((_, have)) => have.extend(entries),
                None => delivered.push((key, entries)),
            }
        }
    }
    match refused {
        Some(error) if delivered.is_empty() => Err(error),
        _ => Ok(delivered),
    }
}

/// How a group wait reads each shard: `count` entries at most, in the blocking read and, with
/// `follow_up`, again in a read without `BLOCK` pipelined behind it (see
/// [`Command::StartWait`](super::scheduler::Command::StartWait)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WaitReads {
    pub(crate) count: usize,
    pub(crate) follow_up: bool,
}

impl WaitReads {
    /// A wait that may deliver `most` entries a shard ([`ShardIo::wait_count`]):
    /// with a follow-up each read takes half, so that both deliver no more than one wait would (a wait of
    /// one entry a shard reads once).
    pub(crate) fn new(most: usize, follow_up: bool) -> Self {
        if follow_up && most >= 2 {
            Self {
                count: most / 2,
                follow_up: true,
            }
        } else {
            Self {
                count: most,
                follow_up: false,
            }
        }
    }

    /// Entries the wait delivers to each shard at most.
    pub(crate) fn delivers_at_most(self) -> usize {
        self.count * if self.follow_up { 2 } else { 1 }
    }
}

/// See [`ShardIo::wait_count`].
fn wait_count(batch: usize, workers: usize, watched: usize) -> usize {
    let batch = batch.max(1);
    (batch.saturating_mul(workers.max(1)) / watched.max(1)).clamp(1, batch)
}

impl Acknowledge for ShardIo {
    fn ack<'a>(&'a self, key: &'a str, ids: &'a [&'a str]) -> BoxFuture<'a, RedisResult<()>> {
        Box::pin(ShardIo::ack(self, key, ids))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_read_reply() {
        let reply = Value::Array(vec![Value::Array(vec![
            Value::BulkString(b"s:0".to_vec()),
            Value::Array(vec![Value::Array(vec![
                Value::BulkString(b"1-0".to_vec()),
                Value::Array(vec![
                    Value::BulkString(b"k".to_vec()),
                    Value::BulkString(b"user-1".to_vec()),
                    Value::BulkString(b"p".to_vec()),
                    Value::BulkString(b"{}".to_vec()),
                ]),
            ])]),
        ])]);
        let entries = entries_of(reply::read(reply));
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].id, "1-0");
        assert_eq!(entries[0].key(), "user-1");
        assert_eq!(entries[0].payload(), Some(&b"{}"[..]));
        assert_eq!((entries[0].delivery_count, entries[0].deleted), (1, false));
        assert!(entries_of(reply::read(Value::Nil)).is_empty());
    }

    /// A read reply of `key` with entries `ids`.
    fn read_reply(key: &str, ids: &[&str]) -> Value {
        let rows = ids
            .iter()
            .map(|id| {
                Value::Array(vec![
                    Value::BulkString(id.as_bytes().to_vec()),
                    Value::Array(vec![
                        Value::BulkString(b"k".to_vec()),
                        Value::BulkString(b"user-1".to_vec()),
                    ]),
                ])
            })
            .collect();
        Value::Array(vec![Value::Array(vec![
            Value::BulkString(key.as_bytes().to_vec()),
            Value::Array(rows),
        ])])
    }

    fn ids(delivered: &[(String, Vec<Entry>)]) -> Vec<(String, Vec<String>)> {
        delivered
            .iter()
            .map(|(key, entries)| (key.clone(), entries.iter().map(|e| e.id.clone()).collect()))
            .collect()
    }

    #[test]
    fn the_waits_two_reads_are_merged_by_shard_in_order_and_an_error_reply_hands_on_the_other() {
        let refused = || -> RedisResult<Value> {
            Err(redis::make_extension_error("NOGROUP".to_owned(), None))
        };
        let both = merge_reads(vec![
            Ok(read_reply("s:0", &["1-0"])),
            Ok(Value::Array(vec![
                read_reply("s:1", &["2-0"])
                    .into_sequence()
                    .unwrap()
                    .remove(0),
                read_reply("s:0", &["3-0", "4-0"])
                    .into_sequence()
                    .unwrap()
                    .remove(0),
            ])),
        ])
        .unwrap();
        assert_eq!(
            ids(&both),
            vec![
                (
                    "s:0".to_owned(),
                    vec!["1-0".to_owned(), "3-0".to_owned(), "4-0".to_owned()]
                ),
                ("s:1".to_owned(), vec!["2-0".to_owned()]),
            ]
        );
        // Either read refused: what the other delivered is handed on, not dropped (it is pending for us).
        for replies in [
            vec![refused(), Ok(read_reply("s:0", &["5-0"]))],
            vec![Ok(read_reply("s:0", &["5-0"])), refused()],
        ] {
            assert_eq!(
                ids(&merge_reads(replies).unwrap()),
                vec![("s:0".to_owned(), vec!["5-0".to_owned()])]
            );
        }
        // Nothing delivered: the error is the result.
        let error = merge_reads(vec![Ok(Value::Nil), refused()]).unwrap_err();
        assert_eq!(error.code(), Some("NOGROUP"));
        assert!(merge_reads(vec![Ok(Value::Nil), Ok(Value::Nil)])
            .unwrap()
            .is_empty());
    }

    #[test]
    fn an_entry_with_nil_fields_is_kept_as_deleted() {
        let claimed = Value::Array(vec![Value::Array(vec![
            Value::BulkString(b"1-0".to_vec()),
            Value::Nil,
        ])]);
        let entries = entries_of(reply::entries(claimed));
        assert_eq!(entries.len(), 1);
        assert!(entries[0].deleted && entries[0].fields.is_empty());
    }

    #[test]
    fn rule_a_follow_up_halves_each_reads_count_so_that_both_deliver_no_more_than_one() {
        let one = WaitReads::new(25, false);
        assert_eq!(
            (one.count, one.follow_up, one.delivers_at_most()),
            (25, false, 25)
        );
        let two = WaitReads::new(25, true);
        assert_eq!(
            (two.count, two.follow_up, two.delivers_at_most()),
            (12, true, 24)
        );
        let two = WaitReads::new(100, true);
        assert_eq!((two.count, two.delivers_at_most()), (50, 100));
        // One entry a shard (1,024 shards on 4 workers): one read, not two.
        let one = WaitReads::new(1, true);
        assert_eq!(
            (one.count, one.follow_up, one.delivers_at_most()),
            (1, false, 1)
        );
    }

    #[test]
    fn a_wait_reads_at_most_a_batch_per_worker_in_all() {
        // Few shards: a batch each.
        assert_eq!(wait_count(100, 4, 2), 100);
        assert_eq!(wait_count(100, 4, 4), 100);
        // More shards than workers: the workers' batches shared out.
        assert_eq!(wait_count(100, 4, 16), 25);
        assert_eq!(wait_count(100, 4, 1024), 1);
        // At least one a shard, and nothing divides by zero.
        assert_eq!(wait_count(0, 0, 0), 1);
        for (batch, workers, watched) in [(100, 4, 16), (100, 4, 300), (7, 3, 5), (1, 1, 9)] {
            let count = wait_count(batch, workers, watched);
            assert!(count <= batch && (count * watched <= batch * workers || count == 1));
        }
    }
}
