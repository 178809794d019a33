//! SplitMix64: a tiny seeded generator, so that a seed replays the same schedule (the coordinator's
//! simulation and the fault suites).

/// The generator; its state is the seed.
#[derive(Debug, Clone)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, n)` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// Uniform in `[lo, hi]`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// True `per_mille` times in a thousand.
    pub fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }
}

#[cfg(test)]
mod tests {
    use super::SplitMix64;

    #[test]
    fn a_seed_replays_its_numbers_within_their_bounds() {
        let (mut a, mut b) = (SplitMix64(42), SplitMix64(42));
        let draws: Vec<u64> = (0..100).map(|_| a.range(130, 180)).collect();
        assert_eq!(
            draws,
            (0..100).map(|_| b.range(130, 180)).collect::<Vec<_>>()
        );
        assert!(draws.iter().all(|d| (130..=180).contains(d)));
        assert!(draws.iter().any(|d| *d != draws[0]), "{draws:?}");
        assert_eq!(SplitMix64(1).below(0), 0);
    }
}
