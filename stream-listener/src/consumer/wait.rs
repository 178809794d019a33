//! The idle wait: once a whole rotation of the member's shards came back empty, one blocking
//! `XREADGROUP ... BLOCK block_ms STREAMS s1 s2 ... > > ...` over all of them, on a connection of its own,
//! instead of a read per shard. An idle member then costs about two commands a second however many shards
//! it owns, and an entry written to an idle shard is picked up within the wait.
//!
//! The wait never blocks past the member's self-fencing deadline (Redis could otherwise hand entries to a
//! read that outlived it). Whatever it returns is pending under this member and goes to the shards' next
//! jobs as deferred entries, in order. The scheduler aborts the wait when ownership changes (an assignment, a
//! revocation, a fence, shutdown): entries a cancelled read still took stay pending under this member, and
//! the next owner (or this member's own claim phase) delivers them.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;

use crate::member::lifecycle::OwnershipDeadline;

use super::job::{is_missing_group, JobOutcome};
use super::shard_io::ShardIo;

/// The shards to wait on, by index and stream key.
pub(crate) struct WaitSpec {
    pub(crate) shards: Vec<(u32, Arc<str>)>,
    /// Shards due to look for entries other consumers left pending too long: done first, without
    /// blocking, so those shards stay watched by the wait.
    pub(crate) reclaim: Vec<u32>,
    pub(crate) conn: Option<(MultiplexedConnection, i64)>,
    /// Where to publish the connection's client id, so the scheduler can `CLIENT UNBLOCK` it.
    pub(crate) client: Arc<AtomicI64>,
    pub(crate) deadline: Arc<OwnershipDeadline>,
}

pub(crate) async fn run(io: Arc<ShardIo>, mut spec: WaitSpec) -> JobOutcome {
    let mut outcome = JobOutcome::default();
    let cluster = io.client.is_cluster();
    if spec.conn.is_none() && !cluster {
        match io.blocking_connection().await {
            Ok(conn) => {
                spec.client.store(conn.1, Ordering::Release);
                spec.conn = Some(conn);
            }
            Err(error) => {
                outcome.error = Some(error);
                return outcome;
            }
        }
    }
    for shard in std::mem::take(&mut spec.reclaim) {
        let Some((_, key)) = spec.shards.iter().find(|(s, _)| *s == shard) else {
            continue;
        };
        if !spec.deadline.is_valid() {
            break;
        }
        match io.reclaim_stale(key).await {
            Ok(entries) if entries.is_empty() => {}
            Ok(entries) => {
                tracing::warn!(shard, entries = entries.len(), "claimed entries another consumer left pending too long (a zombie owner or a lost ack); handling them now");
                outcome.fetched += entries.len();
                outcome.woke.push((shard, entries));
            }
            Err(error) if is_missing_group(&error) => outcome.missing_group = true,
            Err(error) => {
                tracing::debug!(shard, %error, "looking for stale pending entries failed")
            }
        }
    }
    if outcome.fetched > 0 || outcome.missing_group {
        outcome.conn = spec.conn;
        return outcome;
    }
    if cluster {
        return super::cluster_wait::read(io, spec, outcome).await;
    }
    // Read at the last moment: connecting may have taken a while.
    let Some(left) = spec.deadline.remaining() else {
        outcome.expired = true;
        outcome.conn = spec.conn;
        return outcome;
    };
    let block = Duration::from_millis(io.config.block_ms).min(left);
    let keys: Vec<&str> = spec.shards.iter().map(|(_, key)| &**key).collect();
    let (conn, _) = spec.conn.as_mut().expect("connected above");
    match io.wait_new(&keys, conn, block).await {
        Ok(by_key) => {
            for (key, entries) in by_key {
                if let Some((shard, _)) = spec.shards.iter().find(|(_, k)| **k == *key) {
                    outcome.fetched += entries.len();
                    outcome.woke.push((*shard, entries));
                }
            }
            outcome.conn = spec.conn;
        }
        // Which shard lost its group is found by the shards' own reads.
        Err(error) if is_missing_group(&error) => {
            outcome.missing_group = true;
            outcome.conn = spec.conn;
        }
        // The connection may be broken; a fresh one is made next time.
        Err(error) => outcome.error = Some(error),
    }
    outcome
}
