//! The idle wait: once a whole rotation of the member's shards came back empty, one blocking read over
//! all of them, on a connection of its own, instead of a read per shard. An idle member then costs about
//! two commands a second however many shards it owns, and an entry written to an idle shard reaches its
//! handler within the wait.
//!
//! On Redis 7.0 and later (and Valkey) the wait is a group read behind the shards' fences,
//! `XREADGROUP ... COUNT n BLOCK ms STREAMS s1 f1 s2 f2 ... > > ...`, and it delivers: what it reads goes
//! to the shards' next jobs, handled first, so an idle pickup costs the read and the ack, as in a
//! hand-written loop. After a wait that delivered to two shards or more (a producer's burst over
//! several shards: Redis ends a blocked read with the first entry written), a second group read without
//! `BLOCK` is pipelined behind the blocking one, so the rest of the burst comes with the reply (see
//! [`Command::StartWait`](super::scheduler::Command::StartWait)). The wait is no task of its own: the
//! driver polls it (see `Driver::start_wait`).
//! It is fenced like any group read (see the `fence` module): a newer owner's fence install deletes our
//! fence, and Redis 7.0 ends a blocked `XREADGROUP` whose stream was deleted with an error
//! (`UNBLOCKED the stream key no longer exists`), so a zombie's wait (its process froze while it blocked,
//! past its lease) delivers nothing once the next owner is in, and one that reaches Redis after that
//! fails at once. What it delivered
//! before is pending for the zombie, never handled by it (its jobs check the deadline first), and claimed
//! by the next owner before it reads anything new. A reply that never came (a reset, a timeout, a master
//! switch) may have delivered entries: every waited shard then claims its own pending entries first
//! ([`WaitReport::in_doubt`]).
//!
//! Behind Sentinel the wait's connection is to the node the member's own connection uses, and the wait ends,
//! handing on nothing (in doubt), once that connection moves to another node (see [`ShardIo::group_wait`]).
//!
//! Older servers leave such a read blocked, so there the wait is `XREAD COUNT 1 BLOCK ms STREAMS s1 s2 ...
//! id1 id2 ...`, which delivers nothing: it only says which shards have an entry above the id it watches
//! from, and those shards' next jobs read them with `XREADGROUP ... >` after a fresh deadline check. Each
//! stream is watched from above the newest entry this member's own `>` reads got there, or, when it has
//! none (a new shard, or a wake-up whose read found nothing: another consumer took the entry), from the
//! group's last-delivered id, read once with `XINFO GROUPS`. Both are at most the group's last-delivered
//! id, below which everything was delivered, so no undelivered entry is above-but-missed.
//!
//! The wait is over before the member's self-fencing deadline: it blocks until
//! [`WAIT_MARGIN`](super::scheduler::WAIT_MARGIN) before it at most, and the scheduler interrupts it then
//! (Redis may end a block late, and deliver what was written meanwhile). The scheduler interrupts it when
//! ownership changes (an assignment, a revocation, a fence, shutdown) or a shard is parked; the wait then
//! ends its own read with `CLIENT UNBLOCK` (see the `unblock` module), and what it read is still handed on.

use std::sync::Arc;
use std::time::Duration;

use super::cluster_wait::ClusterWait;
use super::fence::is_missing_group;
use super::scheduler::WaitReport;
use super::shard_io::ShardIo;
use super::unblock::read_until_interrupted;
use super::wait_spec::{Block, Read, WaitConnection, WaitSet, WaitSpec, Watched};

/// How a wait ended.
pub(crate) struct WaitEnd {
    pub(crate) report: WaitReport,
    /// The blocking connection, to be used again (none after an error: a fresh one is made next time).
    pub(crate) conn: Option<WaitConnection>,
    /// Watched shards that saw nothing, after a read that did not fail, before the deadline: an idle shard
    /// runs no job, so the driver runs their due retention steps beside the next jobs (see the `retention`
    /// module), and what they acknowledged last is trimmed without waiting for new entries. It looks
    /// which are due after those jobs started: the entries the wait found go to their handlers first.
    pub(crate) idle: Idle,
}

impl WaitEnd {
    fn of(report: WaitReport, conn: Option<WaitConnection>) -> Self {
        Self {
            report,
            conn,
            idle: Idle::default(),
        }
    }
}

/// The shards of a wait's set that saw nothing (none when the wait failed).
#[derive(Default)]
pub(crate) struct Idle {
    set: Option<Arc<WaitSet>>,
    woken: Vec<u32>,
}

impl Idle {
    fn of(set: Arc<WaitSet>, outcome: &WaitReport) -> Self {
        Self {
            set: Some(set),
            woken: outcome.new_entries.clone(),
        }
    }

    pub(crate) fn shards(&self) -> impl Iterator<Item = &Watched> {
        self.set
            .iter()
            .flat_map(|set| set.shards.iter())
            .filter(|w| !self.woken.contains(&w.shard))
    }
}

/// Waits; hands back what it saw, its connection and the shards it saw nothing on.
pub(crate) async fn run(io: Arc<ShardIo>, pool: Arc<ClusterWait>, mut spec: WaitSpec) -> WaitEnd {
    let mut outcome = WaitReport {
        count: spec.reads.delivers_at_most(),
        ..WaitReport::default()
    };
    let cluster = io.client.is_cluster();
    // Behind Sentinel, a connection made before the member's commands moved to another node is to the
    // wrong one.
    if spec
        .conn
        .as_ref()
        .is_some_and(|(_, _, generation)| *generation != io.node_generation())
    {
        spec.conn = None;
    }
    if spec.conn.is_none() && !cluster {
        match io.blocking_connection().await {
            Ok(conn) => spec.conn = Some(conn),
            Err(error) => {
                outcome.error = Some(error);
                return WaitEnd::of(outcome, None);
            }
        }
    }
    // Where to watch each stream from: the group's last-delivered id where this member has read nothing.
    // A group wait reads from the group's position itself.
    let group_wait = io.group_wait();
    for watched in spec.set.shards.iter().filter(|_| !group_wait) {
        if spec.watch_from.contains_key(&watched.shard) {
            continue;
        }
        match io.last_delivered_id(&watched.key).await {
            Ok(id) => {
                spec.watch_from.insert(watched.shard, id.as_str().into());
                outcome.watch_from.push((watched.shard, id));
            }
            Err(error) => {
                if is_missing_group(&error) {
                    outcome.missing_group = true;
                } else {
                    outcome.error = Some(error);
                }
                return WaitEnd::of(outcome, spec.conn);
            }
        }
    }
    // The entry that ends the wait is gated with the cached topology, without a read (see the `order`
    // module).
    spec.order
        .keep_fresh(&io, Duration::from_millis(io.config.block_ms));
    if cluster {
        let set = spec.set.clone();
        let outcome = super::cluster_wait::read(io.clone(), &pool, spec, outcome).await;
        let idle = if outcome.failed() {
            Idle::default()
        } else {
            Idle::of(set, &outcome)
        };
        return WaitEnd {
            idle,
            ..WaitEnd::of(outcome, None)
        };
    }
    // Read at the last moment: connecting may have taken a while, and the wait may be over already.
    if spec.interrupt.is_set() {
        return WaitEnd::of(outcome, spec.conn);
    }
    let block = match spec.block(io.config.block_ms) {
        Block::For(block) => block,
        Block::TooLate => return WaitEnd::of(outcome, spec.conn),
        Block::Expired => {
            outcome.expired = true;
            return WaitEnd::of(outcome, spec.conn);
        }
    };
    let (mut conn, id, generation) = spec.conn.take().expect("connected above");
    let mut kept = None;
    let mut idle_shards = Idle::default();
    let read = async {
        if group_wait {
            let built = spec.set.group_read(&io, spec.reads, block);
            let read = io.read_new_blocking(&built.pipe, &mut conn).await;
            spec.set.keep_read(built);
            read.map(Read::Delivered)
        } else {
            let streams = spec.streams(false);
            io.wait_for_new(&streams, &mut conn, block)
                .await
                .map(Read::Seen)
        }
    };
    let mut control = io.conn.clone();
    let read = read_until_interrupted(read, &spec.interrupt, &mut control, id);
    // Behind Sentinel, the member's commands moving to another node ends the wait: it may be blocking on
    // the old master, which never sees the new entries, and what it reads there may be older than what the
    // member reads from the new one. A reply that comes after the move is dropped like one never answered.
    let moved = io.node_moved(generation);
    let read = tokio::select! {
        read = read => Some(read).filter(|_| io.node_generation() == generation),
        () = moved => None,
    };
    match read {
        // A fresh connection, to the member's node, next time. A group read dropped unanswered may have
        // delivered entries.
        None => outcome.in_doubt = group_wait,
        Some(Ok(read)) => {
            match read {
                Read::Seen(keys) => spec.note_new_entries(&keys, &mut outcome),
                Read::Delivered(delivered) => spec.note_delivered(delivered, &mut outcome),
            }
            kept = Some((conn, id, generation));
            if spec.deadline.remaining().is_some() {
                idle_shards = Idle::of(spec.set.clone(), &outcome);
            }
        }
        // The connection may be broken; a fresh one is made next time.
        Some(Err(error)) => outcome.fail(error, group_wait),
    }
    WaitEnd {
        idle: idle_shards,
        ..WaitEnd::of(outcome, kept)
    }
}
