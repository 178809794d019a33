//! What a store handle did: loads, commits, conflicts, renewals, lock waits and batching, counted per
//! [`GroupStore`](super::GroupStore) handle ([`GroupStore::stats`](super::GroupStore::stats)), like a
//! connection's statistics. The metrics sampler and the benchmarks want the process's total, which
//! [`stats`] sums over every handle: the live ones, plus what the dropped ones had counted, so the total
//! never goes back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// What a store did (one handle's, or the process's total from [`stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Snapshots loaded.
    pub loads: u64,
    /// Bytes of snapshots loaded.
    pub load_bytes: u64,
    /// Commits accepted.
    pub commits: u64,
    /// Commits refused by the revision compare-and-set (or another check): the writer had to reload.
    pub conflicts: u64,
    /// Bytes of metadata sent in accepted commits (the header and the member records written or
    /// deleted).
    pub commit_bytes: u64,
    /// Lease renewals accepted.
    pub renewals: u64,
    /// Times a writer waited for the writer lock.
    pub lock_waits: u64,
    /// Heartbeats queued for the writer.
    pub queued: u64,
    /// Queued heartbeats of others applied and answered.
    pub batched: u64,
}

impl std::ops::AddAssign for StoreStats {
    fn add_assign(&mut self, other: Self) {
        self.loads += other.loads;
        self.load_bytes += other.load_bytes;
        self.commits += other.commits;
        self.conflicts += other.conflicts;
        self.commit_bytes += other.commit_bytes;
        self.renewals += other.renewals;
        self.lock_waits += other.lock_waits;
        self.queued += other.queued;
        self.batched += other.batched;
    }
}

/// One counter of [`StoreStats`].
#[derive(Debug, Clone, Copy)]
pub(crate) enum Stat {
    Loads,
    LoadBytes,
    Commits,
    Conflicts,
    CommitBytes,
    Renewals,
    LockWaits,
    Queued,
    Batched,
}

const STATS: usize = 9;

/// One handle's counters. Atomic only because [`stats`] reads them from other tasks; the handle is the
/// one writer.
#[derive(Debug, Default)]
struct Cells([AtomicU64; STATS]);

impl Cells {
    fn get(&self) -> StoreStats {
        let v = |stat: Stat| self.0[stat as usize].load(Ordering::Relaxed);
        StoreStats {
            loads: v(Stat::Loads),
            load_bytes: v(Stat::LoadBytes),
            commits: v(Stat::Commits),
            conflicts: v(Stat::Conflicts),
            commit_bytes: v(Stat::CommitBytes),
            renewals: v(Stat::Renewals),
            lock_waits: v(Stat::LockWaits),
            queued: v(Stat::Queued),
            batched: v(Stat::Batched),
        }
    }
}

/// The counters of one [`GroupStore`](super::GroupStore), registered so that [`stats`] can sum them.
#[derive(Debug)]
pub(crate) struct Counters(Arc<Cells>);

impl Counters {
    /// A handle's counters, at zero, registered in the process's total.
    pub(crate) fn registered() -> Self {
        let cells = Arc::new(Cells::default());
        let mut handles = HANDLES.lock().unwrap_or_else(PoisonError::into_inner);
        handles.retire_dropped();
        handles.live.push(Arc::clone(&cells));
        Self(cells)
    }

    pub(crate) fn add(&self, stat: Stat, n: u64) {
        self.0 .0[stat as usize].fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> StoreStats {
        self.0.get()
    }
}

/// Every handle's counters: the live handles' and the sum of the dropped ones'.
struct Handles {
    live: Vec<Arc<Cells>>,
    retired: StoreStats,
}

impl Handles {
    /// Folds the counters of dropped handles into `retired`. A cell only this registry holds belongs to a
    /// dropped handle: nothing can count into it any more.
    fn retire_dropped(&mut self) {
        let retired = &mut self.retired;
        self.live.retain(|cells| {
            let dropped = Arc::strong_count(cells) == 1;
            if dropped {
                *retired += cells.get();
            }
            !dropped
        });
    }
}

static HANDLES: Mutex<Handles> = Mutex::new(Handles {
    live: Vec::new(),
    retired: StoreStats {
        loads: 0,
        load_bytes: 0,
        commits: 0,
        conflicts: 0,
        commit_bytes: 0,
        renewals: 0,
        lock_waits: 0,
        queued: 0,
        batched: 0,
    },
});

/// What every store handle of this process did so far (for benchmarks and the metrics sampler): the sum
/// of [`GroupStore::stats`](super::GroupStore::stats) over the live handles and the dropped ones.
pub fn stats() -> StoreStats {
    let mut handles = HANDLES.lock().unwrap_or_else(PoisonError::into_inner);
    handles.retire_dropped();
    let mut total = handles.retired;
    for cells in &handles.live {
        total += cells.get();
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_counts_its_own_work_and_the_total_keeps_it_after_the_handle_is_dropped() {
        let before = stats();
        let counters = Counters::registered();
        counters.add(Stat::Commits, 2);
        counters.add(Stat::LoadBytes, 7);
        assert_eq!(
            counters.get(),
            StoreStats {
                commits: 2,
                load_bytes: 7,
                ..StoreStats::default()
            }
        );
        let other = Counters::registered();
        other.add(Stat::Commits, 1);
        assert_eq!(other.get().commits, 1, "each handle counts only its own");
        drop(counters);
        let after = stats();
        // Other tests of this process count meanwhile: the total only grows, by at least ours.
        assert!(
            after.commits >= before.commits + 3,
            "{before:?} -> {after:?}"
        );
        assert!(
            after.load_bytes >= before.load_bytes + 7,
            "{before:?} -> {after:?}"
        );
    }
}
