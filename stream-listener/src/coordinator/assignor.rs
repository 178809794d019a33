//! The sticky assignor: the spec's five steps, as one pure function.
//!
//! 1. Keep existing owners that are still live and eligible.
//! 2. Drop expired and leaving owners (the caller passes live members only).
//! 3. Assign unowned shards to live members.
//! 4. Balance by static member weight.
//! 5. Move as few shards as possible.
//!
//! Every member gets a quota of `floor(n * w / W)` or one more. The extra ones go first to members that
//! already own more than their floor, so an already balanced assignment moves nothing (KAFKA-18688), and
//! among quota vectors of that shape the number of kept shards `sum(min(current, quota))` is maximal. With
//! equal weights this gives `max - min <= 1`. Runs in `O(shards + members log members)`.

/// One live member as the assignor sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberSpec {
    /// Static balancing weight (>= 1). Never the runtime concurrency a member reports.
    pub weight: u32,
    /// The shards targeted to this member before (may include shards out of range after a shrink).
    pub current: Vec<u32>,
}

/// Computes the new target assignment: for each member (same order as `members`), its shards, ascending.
pub fn assign(shard_count: u32, members: &[MemberSpec]) -> Vec<Vec<u32>> {
    let n = shard_count as usize;
    if members.is_empty() || n == 0 {
        return vec![Vec::new(); members.len()];
    }
    let quotas = quotas(shard_count, members);
    // One allocation per member: a member's list never outgrows its quota.
    let mut result: Vec<Vec<u32>> = quotas
        .iter()
        .map(|&quota| Vec::with_capacity(quota as usize))
        .collect();

    // Steps 1 and 5: keep up to quota of each member's current shards.
    let mut taken = vec![false; n];
    for (i, member) in members.iter().enumerate() {
        // Kept in ascending order; current lists are usually sorted already, so copy only when not.
        let sorted;
        let current: &[u32] = if member.current.is_sorted() {
            &member.current
        } else {
            let mut copy = member.current.clone();
            copy.sort_unstable();
            sorted = copy;
            &sorted
        };
        for &shard in current {
            if result[i].len() as u64 >= quotas[i] {
                break;
            }
            let s = shard as usize;
            if s < n && !taken[s] {
                taken[s] = true;
                result[i].push(shard);
            }
        }
    }

    // Step 3: hand the rest, in shard order, to members below quota, in member order.
    let mut free = (0..shard_count).filter(|&s| !taken[s as usize]);
    for (i, shards) in result.iter_mut().enumerate() {
        while (shards.len() as u64) < quotas[i] {
            match free.next() {
                Some(s) => shards.push(s),
                None => break,
            }
        }
        shards.sort_unstable();
    }
    result
}

/// Step 4: each member's share, `floor(n * w / W)` plus at most one of the remainder.
fn quotas(shard_count: u32, members: &[MemberSpec]) -> Vec<u64> {
    let n = u64::from(shard_count);
    let total: u64 = members.iter().map(|m| u64::from(m.weight.max(1))).sum();
    let mut quotas: Vec<u64> = members
        .iter()
        .map(|m| n * u64::from(m.weight.max(1)) / total)
        .collect();
    let remainder = n - quotas.iter().sum::<u64>();
    if remainder == 0 {
        return quotas;
    }
    // Who gets one more: members that already own more than their floor first (they keep a shard instead
    // of moving it), then the largest fractional share, then member order.
    // The keys are computed once: a comparator that counted owned shards made one join at 10,000 members
    // cost O(m log m * shards per member).
    let mut order: Vec<(bool, u64, usize)> = members
        .iter()
        .enumerate()
        .map(|(i, member)| {
            let owned = member.current.iter().filter(|&&s| s < shard_count).count() as u64;
            let fraction = (n * u64::from(member.weight.max(1))) % total;
            (owned <= quotas[i], u64::MAX - fraction, i)
        })
        .collect();
    order.sort_unstable();
    for &(_, _, i) in order.iter().take(remainder as usize) {
        quotas[i] += 1;
    }
    quotas
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spec(current: &[u32]) -> MemberSpec {
        MemberSpec {
            weight: 1,
            current: current.to_vec(),
        }
    }

    fn counts(result: &[Vec<u32>]) -> Vec<usize> {
        result.iter().map(Vec::len).collect()
    }

    /// Shards that had a live owner before and have another one now.
    fn moves(members: &[MemberSpec], result: &[Vec<u32>], n: u32) -> usize {
        members
            .iter()
            .zip(result)
            .map(|(m, r)| {
                m.current
                    .iter()
                    .filter(|s| **s < n && !r.contains(s))
                    .count()
            })
            .sum()
    }

    /// Independent oracle: the fewest moves any balanced (floor/ceil) assignment can make, by trying every
    /// choice of which members get the ceiling.
    fn optimal_moves(n: u32, members: &[MemberSpec]) -> usize {
        let m = members.len();
        let floor = n as usize / m;
        let extra = n as usize % m;
        let owned: Vec<usize> = members
            .iter()
            .map(|s| s.current.iter().filter(|&&x| x < n).count())
            .collect();
        let total_owned: usize = owned.iter().sum();
        let mut best_kept = 0;
        for mask in 0u32..(1 << m) {
            if mask.count_ones() as usize != extra {
                continue;
            }
            let kept: usize = (0..m)
                .map(|i| owned[i].min(floor + usize::from(mask & (1 << i) != 0)))
                .sum();
            best_kept = best_kept.max(kept);
        }
        total_owned - best_kept
    }

    fn check_partition(n: u32, result: &[Vec<u32>]) {
        let mut all: Vec<u32> = result.iter().flatten().copied().collect();
        all.sort_unstable();
        assert_eq!(
            all,
            (0..n).collect::<Vec<_>>(),
            "every shard assigned exactly once"
        );
    }

    #[test]
    fn assigns_every_shard_once_balanced() {
        let result = assign(10, &[spec(&[]), spec(&[]), spec(&[])]);
        check_partition(10, &result);
        assert_eq!(counts(&result), [4, 3, 3]);
    }

    #[test]
    fn balanced_assignment_moves_nothing_kafka_18688() {
        // 3 members, 7 shards, the member with 3 is not the first one.
        let members = [spec(&[0, 1]), spec(&[2, 3]), spec(&[4, 5, 6])];
        let result = assign(7, &members);
        assert_eq!(result, vec![vec![0, 1], vec![2, 3], vec![4, 5, 6]]);
    }

    #[test]
    fn keeps_live_owners_and_assigns_unowned() {
        // Member 0 kept its shards; shards of a departed member (2, 3) are spread out.
        let result = assign(4, &[spec(&[0]), spec(&[1])]);
        assert_eq!(result, vec![vec![0, 2], vec![1, 3]]);
    }

    #[test]
    fn weights_balance_by_static_weight() {
        let members = [
            MemberSpec {
                weight: 3,
                current: vec![],
            },
            MemberSpec {
                weight: 1,
                current: vec![],
            },
        ];
        let result = assign(8, &members);
        assert_eq!(counts(&result), [6, 2]);
    }

    #[test]
    fn shrink_drops_out_of_range_shards() {
        let result = assign(4, &[spec(&[0, 1, 4, 5]), spec(&[2, 3, 6, 7])]);
        assert_eq!(result, vec![vec![0, 1], vec![2, 3]]);
    }

    #[test]
    fn no_members_no_assignment() {
        assert!(assign(5, &[]).is_empty());
    }

    fn arb_group() -> impl Strategy<Value = (u32, Vec<MemberSpec>)> {
        (1u32..200, 1usize..12, any::<u64>()).prop_map(|(n, m, seed)| {
            // A random previous assignment: each shard owned by a random member or nobody.
            let mut members = vec![spec(&[]); m];
            let mut x = seed | 1;
            for s in 0..n {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let owner = (x % (m as u64 + 1)) as usize;
                if owner < m {
                    members[owner].current.push(s);
                }
            }
            (n, members)
        })
    }

    proptest! {
        #[test]
        fn prop_balance_bound((n, members) in arb_group()) {
            let result = assign(n, &members);
            check_partition(n, &result);
            let c = counts(&result);
            prop_assert!(c.iter().max().unwrap() - c.iter().min().unwrap() <= 1);
        }

        #[test]
        fn prop_minimal_moves_from_any_state((n, members) in arb_group()) {
            let result = assign(n, &members);
            prop_assert_eq!(moves(&members, &result, n), optimal_moves(n, &members));
        }

        #[test]
        fn prop_deterministic((n, members) in arb_group()) {
            prop_assert_eq!(assign(n, &members), assign(n, &members));
        }

        #[test]
        fn prop_stable_when_balanced((n, members) in arb_group()) {
            let first = assign(n, &members);
            let again: Vec<MemberSpec> = first.iter().map(|s| spec(s)).collect();
            prop_assert_eq!(assign(n, &again), first);
        }

        #[test]
        fn prop_one_join_moves_the_optimum(n in 1u32..300, m in 1usize..10) {
            let balanced = assign(n, &vec![spec(&[]); m]);
            let mut members: Vec<MemberSpec> = balanced.iter().map(|s| spec(s)).collect();
            members.push(spec(&[]));
            let result = assign(n, &members);
            prop_assert_eq!(moves(&members, &result, n), optimal_moves(n, &members));
            // Only shards going to the newcomer move: exactly its share.
            prop_assert_eq!(moves(&members, &result, n), result[m].len());
        }

        #[test]
        fn prop_one_leave_moves_only_the_leavers_shards(n in 1u32..300, m in 2usize..10, leaver in 0usize..10) {
            let leaver = leaver % m;
            let balanced = assign(n, &vec![spec(&[]); m]);
            let members: Vec<MemberSpec> = balanced.iter().enumerate()
                .filter(|(i, _)| *i != leaver).map(|(_, s)| spec(s)).collect();
            let result = assign(n, &members);
            prop_assert_eq!(moves(&members, &result, n), 0);
            check_partition(n, &result);
            prop_assert_eq!(moves(&members, &result, n), optimal_moves(n, &members));
        }

        #[test]
        fn prop_shard_count_grow_and_shrink(n in 1u32..200, n2 in 1u32..200, m in 1usize..8) {
            let before = assign(n, &vec![spec(&[]); m]);
            let members: Vec<MemberSpec> = before.iter().map(|s| spec(s)).collect();
            let after = assign(n2, &members);
            check_partition(n2, &after);
            let c = counts(&after);
            prop_assert!(c.iter().max().unwrap() - c.iter().min().unwrap() <= 1);
            prop_assert_eq!(moves(&members, &after, n2), optimal_moves(n2, &members));
        }

        #[test]
        fn prop_weighted_shares_within_one_of_ideal(n in 1u32..500, weights in proptest::collection::vec(1u32..5, 1..8)) {
            let members: Vec<MemberSpec> = weights.iter().map(|&w| MemberSpec { weight: w, current: vec![] }).collect();
            let result = assign(n, &members);
            check_partition(n, &result);
            let total: u32 = weights.iter().sum();
            for (shards, w) in result.iter().zip(&weights) {
                let ideal = f64::from(n) * f64::from(*w) / f64::from(total);
                prop_assert!((shards.len() as f64 - ideal).abs() < 1.0 + 1e-9);
            }
        }
    }
}
