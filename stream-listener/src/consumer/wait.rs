//! The idle wait: once a whole rotation of the member's shards came back empty, one blocking
//! `XREAD BLOCK block_ms STREAMS s1 s2 ... id1 id2 ...` over all of them, on a connection of its own,
//! instead of a read per shard. An idle member then costs about two commands a second however many shards
//! it owns, and an entry written to an idle shard is picked up within the wait.
//!
//! The blocking read only wakes the wait up: `XREADGROUP ... BLOCK` cannot run inside the script that
//! checks the shard's fence, so the wait takes nothing itself. Each `id` is what the shard's last empty
//! (fenced) read answered, atomically with it: at or past everything the group was delivered. The shards it
//! woke for are then read with the fenced read script (see `Shared::wait_new`), so a wait that reaches
//! Redis late (a process paused with it queued) takes nothing from a shard another member now owns.
//!
//! The wait never blocks past the member's self-fencing deadline. Whatever it reads is pending under this
//! member and goes to the shards' next jobs as held entries, in order. The scheduler interrupts the wait
//! when ownership changes (an assignment, a revocation, a fence, shutdown).

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;

use crate::member::lifecycle::OwnershipDeadline;

use super::job::{is_missing_group, JobOutcome};
use super::ops::{is_fenced, Shared};

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

pub(crate) async fn run(shared: Arc<Shared>, mut spec: WaitSpec) -> JobOutcome {
    let mut outcome = JobOutcome::default();
    let cluster = shared.client.is_cluster();
    if spec.conn.is_none() && !cluster {
        match shared.blocking_connection().await {
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
        // Claimed under the token the shard's fence holds for us; an unfenced shard's job does it.
        let Some(token) = shared.fenced_with(key) else {
            continue;
        };
        if !spec.deadline.is_valid() {
            break;
        }
        match shared.reclaim_stale(key, &token).await {
            Ok(entries) if entries.is_empty() => {}
            Ok(entries) => {
                tracing::warn!(shard, entries = entries.len(), "claimed entries another consumer left pending too long (a zombie owner or a lost ack); handling them now");
                outcome.fetched += entries.len();
                outcome.woke.push((shard, entries));
            }
            Err(error) if is_missing_group(&error) => outcome.missing_group = true,
            Err(error) if is_fenced(&error) => {
                shared.forget_fence(key);
                outcome.expired = true;
            }
            Err(error) => {
                tracing::debug!(shard, %error, "looking for stale pending entries failed")
            }
        }
    }
    if outcome.fetched > 0 || outcome.missing_group || outcome.expired {
        outcome.conn = spec.conn;
        return outcome;
    }
    if cluster {
        return super::cluster_wait::read(shared, spec, outcome).await;
    }
    // Read at the last moment: connecting may have taken a while.
    let Some(left) = spec.deadline.remaining() else {
        outcome.expired = true;
        outcome.conn = spec.conn;
        return outcome;
    };
    let block = Duration::from_millis(shared.config.block_ms).min(left);
    let keys: Vec<&str> = spec.shards.iter().map(|(_, key)| &**key).collect();
    let (conn, _) = spec.conn.as_mut().expect("connected above");
    match shared.wait_new(&keys, conn, block, &spec.deadline).await {
        Ok(by_key) => {
            for (key, entries) in by_key {
                if let Some((shard, _)) = spec.shards.iter().find(|(_, k)| **k == *key) {
                    outcome.fetched += entries.len();
                    outcome.woke.push((*shard, entries));
                }
            }
            outcome.conn = spec.conn;
        }
        // Which shard lost its group (or its fence) is found by the shards' own reads.
        Err(error) if is_missing_group(&error) => {
            outcome.missing_group = true;
            outcome.conn = spec.conn;
        }
        Err(error) if is_fenced(&error) => {
            outcome.expired = true;
            outcome.conn = spec.conn;
        }
        // The connection may be broken; a fresh one is made next time.
        Err(error) => outcome.error = Some(error),
    }
    outcome
}
