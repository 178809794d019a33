//! What every member of a test handled, in handling order, and the guarantees checked from it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use stream_listener_tests::Order;

/// One handled entry.
#[derive(Debug, Clone)]
pub struct Handled {
    /// Its order.
    pub order: Order,
    /// Who handled it.
    pub member: String,
    /// When.
    pub at: Instant,
}

/// The shared record of handled entries.
#[derive(Debug, Clone, Default)]
pub struct Log(Arc<Mutex<Vec<Handled>>>);

impl Log {
    /// Records `order` as handled by `member`, now.
    pub fn push(&self, order: &Order, member: &str) {
        self.0.lock().unwrap().push(Handled {
            order: order.clone(),
            member: member.to_string(),
            at: Instant::now(),
        });
    }

    /// Everything so far.
    pub fn entries(&self) -> Vec<Handled> {
        self.0.lock().unwrap().clone()
    }

    /// The shards (of `shards`) whose entries `member` handled after `since`.
    pub fn shards_handled_by(&self, member: &str, since: Instant, shards: u32) -> BTreeSet<u32> {
        self.entries()
            .iter()
            .filter(|h| h.member == member && h.at > since)
            .map(|h| stream_listener::routing::shard_for_key(h.order.key.as_bytes(), shards))
            .collect()
    }

    /// Who handled anything.
    pub fn members(&self) -> BTreeSet<String> {
        self.entries().into_iter().map(|h| h.member).collect()
    }

    /// `(key, seq)` of `expected` that nobody handled.
    pub fn missing(&self, expected: &[(String, Order)]) -> Vec<(String, u32)> {
        let seen: BTreeSet<(String, u32)> = self
            .entries()
            .iter()
            .map(|h| (h.order.key.clone(), h.order.seq))
            .collect();
        expected
            .iter()
            .map(|(k, o)| (k.clone(), o.seq))
            .filter(|x| !seen.contains(x))
            .collect()
    }

    /// Entries handled more than once.
    pub fn duplicates(&self) -> Vec<(String, u32, Vec<String>)> {
        let mut by: BTreeMap<(String, u32), Vec<String>> = BTreeMap::new();
        for h in self.entries() {
            by.entry((h.order.key.clone(), h.order.seq))
                .or_default()
                .push(h.member);
        }
        by.into_iter()
            .filter(|(_, who)| who.len() > 1)
            .map(|((k, s), who)| (k, s, who))
            .collect()
    }

    /// Per-key order: within each key, the first handling of each seq comes after the first handling of
    /// every smaller seq. Returns the violations (`key`, seq handled first, the smaller seq after it).
    pub fn order_violations(&self) -> Vec<(String, u32, u32)> {
        let mut first: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        let mut seen: BTreeSet<(String, u32)> = BTreeSet::new();
        for h in self.entries() {
            if seen.insert((h.order.key.clone(), h.order.seq)) {
                first
                    .entry(h.order.key.clone())
                    .or_default()
                    .push(h.order.seq);
            }
        }
        let mut violations = Vec::new();
        for (key, seqs) in first {
            let mut max = None;
            for seq in seqs {
                if let Some(m) = max {
                    if seq < m {
                        violations.push((key.clone(), m, seq));
                    }
                }
                max = max.max(Some(seq));
            }
        }
        violations
    }
}

impl Log {
    /// Two owners of one shard at once: per shard (of `shards`), a member's handling that comes between
    /// two of another member's less than `window` apart. A real hand-off and back takes two
    /// heartbeat rounds; two members reading one shard with `>` at the same time alternate at once.
    pub fn overlaps(&self, shards: u32, window: std::time::Duration) -> Vec<(u32, String, String)> {
        let mut by_shard: BTreeMap<u32, Vec<Handled>> = BTreeMap::new();
        for h in self.entries() {
            let shard = stream_listener::routing::shard_for_key(h.order.key.as_bytes(), shards);
            by_shard.entry(shard).or_default().push(h);
        }
        let mut found = Vec::new();
        for (shard, handled) in by_shard {
            // Runs of one member: (member, first at, last at).
            let mut runs: Vec<(String, Instant, Instant)> = Vec::new();
            for h in handled {
                match runs.last_mut() {
                    Some((member, _, last)) if *member == h.member => *last = h.at,
                    _ => runs.push((h.member.clone(), h.at, h.at)),
                }
            }
            for three in runs.windows(3) {
                let [(before, _, before_end), (between, _, _), (after, after_start, _)] = three
                else {
                    unreachable!()
                };
                if before == after && after_start.duration_since(*before_end) < window {
                    found.push((shard, before.clone(), between.clone()));
                }
            }
        }
        found
    }
}

#[test]
fn overlaps_are_found_only_where_two_members_alternate_on_one_shard() {
    use std::time::Duration;
    let order = |seq| Order {
        key: "k0".into(),
        seq,
    };
    let t0 = Instant::now();
    let at = |ms| t0 + Duration::from_millis(ms);
    let log = |steps: &[(&str, u64)]| {
        let log = Log::default();
        for (i, (member, ms)) in steps.iter().enumerate() {
            log.0.lock().unwrap().push(Handled {
                order: order(i as u32),
                member: (*member).into(),
                at: at(*ms),
            });
        }
        log
    };
    let shard = stream_listener::routing::shard_for_key(b"k0", 4);
    let window = Duration::from_millis(50);
    // A hand-off and back, each a heartbeat round apart: one owner at a time.
    assert_eq!(
        log(&[("a", 0), ("a", 10), ("b", 120), ("a", 250)]).overlaps(4, window),
        vec![]
    );
    // Two readers of one shard at once.
    assert_eq!(
        log(&[("a", 0), ("b", 2), ("a", 4), ("b", 6)]).overlaps(4, window),
        vec![
            (shard, "a".into(), "b".into()),
            (shard, "b".into(), "a".into())
        ]
    );
}
