//! What the idle wait is given: the shards to watch (and from where, or behind which fences), its
//! connection, the deadline.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::MultiplexedConnection;

use crate::member::lifecycle::OwnershipDeadline;

use super::entry::Entry;
use super::order::OrderGate;
use super::scheduler::{WaitReport, WAIT_MARGIN};
use super::shard_io::{block_ms, ShardIo, WaitReads};
use super::unblock::Interrupt;

/// The idle wait's blocking connection, its Redis client id, and the target's master switches when it
/// was made (behind Sentinel, a later switch means it may be to the old master: a fresh one is made).
pub(crate) type WaitConnection = (MultiplexedConnection, i64, u64);

/// One shard the wait watches: its index, stream key and the fence of its ownership.
#[derive(Clone)]
pub(crate) struct Watched {
    pub(crate) shard: u32,
    pub(crate) key: Arc<str>,
    pub(crate) fence: Arc<str>,
}

/// The shards one wait watches, in order. The driver keeps the last set and gives it to the next wait
/// while the same ownerships are watched, so that an idle pickup neither copies every shard's keys nor
/// builds the group read anew (at 1,000 entries/s that was a wait's largest own cost: 32 keys, 64
/// arguments).
pub(crate) struct WaitSet {
    pub(crate) shards: Vec<Watched>,
    /// The last group read over these shards, for the next wait that reads the same way.
    read: Mutex<Option<BuiltRead>>,
}

/// A group read built for a set, with what it was built for.
pub(crate) struct BuiltRead {
    pub(crate) reads: WaitReads,
    pub(crate) block_ms: u64,
    pub(crate) pipe: redis::Pipeline,
}

impl WaitSet {
    pub(crate) fn new(shards: Vec<Watched>) -> Self {
        Self {
            shards,
            read: Mutex::default(),
        }
    }

    /// Whether the set watches exactly `shards` (index, key, fence), in order, with the same `Arc`s (a new
    /// ownership has a new fence).
    pub(crate) fn is<'a>(
        &self,
        shards: impl Iterator<Item = (u32, &'a Arc<str>, &'a Arc<str>)>,
    ) -> bool {
        let mut have = self.shards.iter();
        for (shard, key, fence) in shards {
            match have.next() {
                Some(w)
                    if w.shard == shard
                        && Arc::ptr_eq(&w.key, key)
                        && Arc::ptr_eq(&w.fence, fence) => {}
                _ => return false,
            }
        }
        have.next().is_none()
    }

    /// The group read over this set for `reads` blocking `block`: the one built last if it was for that,
    /// else a new one. Taken: give it back with [`keep_read`](Self::keep_read).
    pub(crate) fn group_read(&self, io: &ShardIo, reads: WaitReads, block: Duration) -> BuiltRead {
        let block_ms = block_ms(block);
        self.take_read(reads, block_ms)
            .unwrap_or_else(|| BuiltRead {
                reads,
                block_ms,
                pipe: io.group_wait_read(&self.streams(), reads, block_ms),
            })
    }

    /// `(stream key, fence key)` of every shard, in order: what a group read names.
    fn streams(&self) -> Vec<(&str, &str)> {
        self.shards.iter().map(|w| (&*w.key, &*w.fence)).collect()
    }

    /// The group read built for `reads` blocking `block_ms`, if the last one was that (taken: one wait
    /// at a time uses it, and gives it back with [`keep_read`](Self::keep_read)).
    pub(crate) fn take_read(&self, reads: WaitReads, block_ms: u64) -> Option<BuiltRead> {
        let mut read = self.read.lock().unwrap_or_else(|e| e.into_inner());
        read.take()
            .filter(|built| built.reads == reads && built.block_ms == block_ms)
    }

    pub(crate) fn keep_read(&self, built: BuiltRead) {
        *self.read.lock().unwrap_or_else(|e| e.into_inner()) = Some(built);
    }
}

/// The shards to wait on.
pub(crate) struct WaitSpec {
    pub(crate) set: Arc<WaitSet>,
    /// How a group wait reads: how many entries from each shard, in one read or two.
    pub(crate) reads: WaitReads,
    /// Where each shard's stream is watched from, when known (see the module docs); the others are read
    /// from the group first.
    pub(crate) watch_from: HashMap<u32, Arc<str>>,
    pub(crate) conn: Option<WaitConnection>,
    /// The scheduler's request to end the wait early (see the `unblock` module).
    pub(crate) interrupt: Arc<Interrupt>,
    pub(crate) deadline: Arc<OwnershipDeadline>,
    /// Kept fresh while the wait blocks (see the `order` module).
    pub(crate) order: Arc<OrderGate>,
}

/// How long the wait's read may block (see [`WaitSpec::block`]).
pub(crate) enum Block {
    For(Duration),
    /// Within [`WAIT_MARGIN`] of the deadline: the wait reads nothing.
    TooLate,
    /// The deadline has passed.
    Expired,
}

impl WaitSpec {
    /// `block_ms`, cut to end [`WAIT_MARGIN`] before the deadline (see there), read now.
    pub(crate) fn block(&self, block_ms: u64) -> Block {
        let Some(left) = self.deadline.remaining() else {
            return Block::Expired;
        };
        match left.checked_sub(WAIT_MARGIN) {
            Some(until_margin) if until_margin >= Duration::from_millis(1) => {
                Block::For(Duration::from_millis(block_ms).min(until_margin))
            }
            _ => Block::TooLate,
        }
    }

    /// `(stream key, id to watch above)` of every shard, in order (all known by now); for a group wait,
    /// `(stream key, fence key)`.
    pub(crate) fn streams(&self, group_wait: bool) -> Vec<(&str, &str)> {
        if group_wait {
            return self.set.streams();
        }
        self.set
            .shards
            .iter()
            .map(|w| {
                let from = self.watch_from.get(&w.shard).map_or("0-0", |id| &**id);
                (&*w.key, from)
            })
            .collect()
    }

    /// The index of the shard whose stream is `key`.
    fn shard_of(&self, key: &str) -> Option<u32> {
        self.set
            .shards
            .iter()
            .find(|w| *w.key == *key)
            .map(|w| w.shard)
    }

    /// Records the shards whose streams have new entries (by key) as woken.
    pub(crate) fn note_new_entries(&self, keys: &[String], outcome: &mut WaitReport) {
        outcome
            .new_entries
            .extend(keys.iter().filter_map(|key| self.shard_of(key)));
    }

    /// Records what a group wait delivered (by key): those shards are woken with their entries.
    pub(crate) fn note_delivered(
        &self,
        delivered: Vec<(String, Vec<Entry>)>,
        outcome: &mut WaitReport,
    ) {
        for (key, entries) in delivered {
            if let Some(shard) = self.shard_of(&key) {
                outcome.new_entries.push(shard);
                outcome.delivered.push((shard, entries));
            }
        }
    }
}

/// What the wait's blocking read found: the keys with entries above their ids (`XREAD`), or the entries a
/// group read delivered, by key.
pub(crate) enum Read {
    Seen(Vec<String>),
    Delivered(Vec<(String, Vec<Entry>)>),
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::{BuiltRead, WaitSet, Watched};
    use crate::consumer::shard_io::WaitReads;

    fn watched(shard: u32) -> Watched {
        Watched {
            shard,
            key: format!("s:{shard}").into(),
            fence: format!("s:{shard}:fence").into(),
        }
    }

    #[test]
    fn rule_a_wait_set_is_the_same_shards_in_order_with_the_same_ownerships() {
        let shards = vec![watched(0), watched(3)];
        let set = WaitSet::new(shards.clone());
        fn each(list: &[Watched]) -> impl Iterator<Item = (u32, &Arc<str>, &Arc<str>)> {
            list.iter().map(|w| (w.shard, &w.key, &w.fence))
        }
        assert!(set.is(each(&shards)));
        assert!(!set.is(each(&shards[..1])), "a shard fewer");
        assert!(
            !set.is(each(&[shards[1].clone(), shards[0].clone()])),
            "another order"
        );
        let more = [shards.clone(), vec![watched(5)]].concat();
        assert!(!set.is(each(&more)), "a shard more");
        // A new ownership of shard 3: a fence of the same name, but another one.
        let mut again = shards.clone();
        again[1].fence = Arc::from(&*again[1].fence);
        assert!(!set.is(each(&again)), "a new ownership's fence");
    }

    #[test]
    fn rule_a_built_read_is_used_again_only_for_the_same_count_follow_up_and_block() {
        let set = WaitSet::new(vec![watched(0)]);
        let reads = WaitReads::new(8, false);
        assert!(set.take_read(reads, 450).is_none(), "nothing built yet");
        let built = |reads, block_ms| BuiltRead {
            reads,
            block_ms,
            pipe: redis::pipe(),
        };
        set.keep_read(built(reads, 450));
        assert!(set.take_read(reads, 300).is_none(), "another block");
        set.keep_read(built(reads, 450));
        assert!(
            set.take_read(WaitReads::new(8, true), 450).is_none(),
            "a follow-up"
        );
        set.keep_read(built(reads, 450));
        assert!(set.take_read(reads, 450).is_some());
        assert!(
            set.take_read(reads, 450).is_none(),
            "taken: one wait uses it at a time"
        );
    }
}
