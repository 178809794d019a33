//! What the idle wait is given: the shards to watch and from where, its connection, the deadline.

use std::collections::HashMap;
use std::sync::Arc;

use redis::aio::MultiplexedConnection;

use crate::member::lifecycle::OwnershipDeadline;

use super::retention::RetentionJob;
use super::scheduler::WaitReport;
use super::unblock::Interrupt;

/// The idle wait's blocking connection, its Redis client id, and the target's master switches when it
/// was made (behind Sentinel, a later switch means it may be to the old master: a fresh one is made).
pub(crate) type WaitConnection = (MultiplexedConnection, i64, u64);

/// The shards to wait on, by index and stream key.
pub(crate) struct WaitSpec {
    pub(crate) shards: Vec<(u32, Arc<str>)>,
    /// Where each shard's stream is watched from, when known (see the module docs); the others are read
    /// from the group first.
    pub(crate) watch_from: HashMap<u32, String>,
    pub(crate) conn: Option<WaitConnection>,
    /// The scheduler's request to end the wait early (see the `unblock` module).
    pub(crate) interrupt: Arc<Interrupt>,
    pub(crate) deadline: Arc<OwnershipDeadline>,
    /// Idle shards' retention runs at the wait's end (see the `retention` module).
    pub(crate) retention: Arc<RetentionJob>,
}

impl WaitSpec {
    /// `(stream key, id to watch above)` of every shard, in order (all known by now).
    pub(crate) fn streams(&self) -> Vec<(&str, &str)> {
        self.shards
            .iter()
            .map(|(shard, key)| {
                let from = self.watch_from.get(shard).map_or("0-0", String::as_str);
                (&**key, from)
            })
            .collect()
    }

    /// Records the shards whose streams have new entries (by key) as woken.
    pub(crate) fn note_new_entries(&self, keys: &[String], outcome: &mut WaitReport) {
        for key in keys {
            if let Some((shard, _)) = self.shards.iter().find(|(_, k)| **k == **key) {
                outcome.new_entries.push(*shard);
            }
        }
    }
}
