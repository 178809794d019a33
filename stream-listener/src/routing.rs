//! Key routing and shard stream keys, byte for byte as `spec/routing.md`.
//!
//! A logical stream `orders` with `N` shards is stored in the Redis stream keys `orders:0` … `orders:{N-1}`
//! ([`shard_stream_key`]). A message's partition key picks its shard with [`shard_for_key`]: MurmurHash3
//! x86_32 over the key's bytes, with rejection sampling so that `hash mod N` is unbiased. The spec's JVM and
//! Python clients use the same layout and hash, so a Rust consumer can share a sharded stream with them.

use std::fmt;

/// MurmurHash3 x86_32 of `data` with `seed` (Austin Appleby's reference algorithm).
pub fn murmur3_32(data: &[u8], seed: u32) -> u32 {
    const C1: u32 = 0xcc9e_2d51;
    const C2: u32 = 0x1b87_3593;

    let mut h = seed;
    let mut blocks = data.chunks_exact(4);
    for block in &mut blocks {
        let mut k = u32::from_le_bytes([block[0], block[1], block[2], block[3]]);
        k = k.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2);
        h ^= k;
        h = h.rotate_left(13).wrapping_mul(5).wrapping_add(0xe654_6b64);
    }

    let tail = blocks.remainder();
    if !tail.is_empty() {
        let mut k = 0u32;
        for (i, byte) in tail.iter().enumerate() {
            k ^= u32::from(*byte) << (8 * i);
        }
        k = k.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2);
        h ^= k;
    }

    // The length is mixed in modulo 2^32, as the reference implementation's `int len` does.
    h ^= data.len() as u32;
    fmix32(h)
}

fn fmix32(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^= h >> 16;
    h
}

/// The hash seed of routing attempt `attempt`: 0 for the first, `murmur3_32(le_u32(attempt), 0)` after.
fn attempt_seed(attempt: u32) -> u32 {
    if attempt == 0 {
        0
    } else {
        murmur3_32(&attempt.to_le_bytes(), 0)
    }
}

/// The shard (`0..shard_count`) that `key` routes to, per `spec/routing.md`.
///
/// Hashes with MurmurHash3 x86_32 and rejects hashes at or above `2^32 - (2^32 mod N)`, rehashing with the
/// next attempt's seed, so every shard is equally likely. When `shard_count` is a power of two nothing is
/// ever rejected. Pass a string's UTF-8 bytes (`key.as_bytes()`) to match the other clients.
///
/// # Panics
/// If `shard_count` is 0.
pub fn shard_for_key(key: &[u8], shard_count: u32) -> u32 {
    assert!(shard_count > 0, "shard_count must be greater than zero");
    let n = u64::from(shard_count);
    let limit = (1u64 << 32) - ((1u64 << 32) % n);
    let mut attempt = 0u32;
    loop {
        let h = u64::from(murmur3_32(key, attempt_seed(attempt)));
        if h < limit {
            return (h % n) as u32;
        }
        // Each attempt is rejected with probability < 1/2, so this ends after a handful of attempts.
        attempt = attempt.wrapping_add(1);
    }
}

/// The Redis key of shard `index` of the stream `prefix`: `{prefix}:{index}`, e.g. `orders:3`.
///
/// Does not validate `prefix`; see [`validate_prefix`].
pub fn shard_stream_key(prefix: &str, index: u32) -> String {
    crate::names::shard_stream(prefix, index)
}

/// Why a stream prefix was rejected by [`validate_prefix`].
#[derive(Clone, PartialEq, Eq, stream_listener_macros::ReportDebug)]
#[non_exhaustive]
pub enum PrefixError {
    /// The prefix is empty.
    Empty,
    /// The prefix contains `{` or `}`: a Redis Cluster hash tag would put every shard in one slot.
    ContainsBrace {
        /// The rejected prefix.
        prefix: String,
    },
}

impl fmt::Display for PrefixError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PrefixError::Empty => write!(f, "stream prefix must not be empty"),
            PrefixError::ContainsBrace { prefix } => write!(
                f,
                "stream prefix `{prefix}` must not contain `{{` or `}}`: shard streams must spread across \
                 Redis Cluster slots, and braces would make a hash tag"
            ),
        }
    }
}

impl std::error::Error for PrefixError {}

/// Checks that `prefix` can name a sharded stream: non-empty, without `{` or `}`.
pub fn validate_prefix(prefix: &str) -> Result<(), PrefixError> {
    if prefix.is_empty() {
        return Err(PrefixError::Empty);
    }
    if prefix.contains(['{', '}']) {
        return Err(PrefixError::ContainsBrace {
            prefix: prefix.to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_vectors() {
        assert_eq!(murmur3_32(b"", 0), 0);
        assert_eq!(murmur3_32(b"hello", 0), 613_153_351);
        assert_eq!(shard_for_key(b"order-123", 10), 1);
        assert_eq!(shard_for_key(b"order-123", 16), 13);
        assert_eq!(shard_for_key(b"user-42", 12), 8);
        assert_eq!(murmur3_32(&1u32.to_le_bytes(), 0), 0xfbf1_402a);
        assert_eq!(attempt_seed(1), 0xfbf1_402a);
    }

    #[test]
    fn reference_vectors_for_every_tail_length() {
        // Published MurmurHash3_x86_32 results (also what Guava's murmur3_32_fixed gives).
        assert_eq!(murmur3_32(b"", 1), 0x514e_28b7);
        assert_eq!(murmur3_32(b"", 0xffff_ffff), 0x81f1_6f39);
        assert_eq!(murmur3_32(&[0xff, 0xff, 0xff, 0xff], 0), 0x7629_3b50);
        assert_eq!(murmur3_32(&[0x21, 0x43, 0x65, 0x87], 0), 0xf55b_516b);
        assert_eq!(murmur3_32(&[0x21, 0x43, 0x65], 0), 0x7e4a_8634);
        assert_eq!(murmur3_32(&[0x21, 0x43], 0), 0xa0f7_b07a);
        assert_eq!(murmur3_32(&[0x21], 0), 0x7266_1cf4);
        assert_eq!(murmur3_32(&[0x00, 0x00, 0x00, 0x00], 0), 0x2362_f9de);
        assert_eq!(murmur3_32(b"Hello, world!", 1234), 0xfaf6_cdb3);
        assert_eq!(
            murmur3_32(b"The quick brown fox jumps over the lazy dog", 0x9747_b28c),
            0x2fa8_26cd
        );
    }

    #[test]
    fn one_shard_takes_everything() {
        for i in 0..1000 {
            assert_eq!(shard_for_key(format!("k{i}").as_bytes(), 1), 0);
        }
    }

    #[test]
    #[should_panic(expected = "greater than zero")]
    fn zero_shards_panics() {
        shard_for_key(b"x", 0);
    }

    #[test]
    fn power_of_two_counts_never_reject() {
        // With N = 2^k the limit is 2^32, so the first hash is always accepted: the shard is its low bits.
        for k in 0..=31 {
            let n = 1u32 << k;
            for i in 0..200 {
                let key = format!("key-{i}");
                let h = murmur3_32(key.as_bytes(), 0);
                assert_eq!(shard_for_key(key.as_bytes(), n), h % n, "n={n} key={key}");
            }
        }
    }

    #[test]
    fn rejection_uses_the_next_seed() {
        // N = 2^31 + 1: limit = 2^31 + 1, so roughly half of all hashes are rejected. Find a rejected key and
        // check that the second attempt's seed decides it.
        let n = (1u32 << 31) + 1;
        let limit = (1u64 << 32) - ((1u64 << 32) % u64::from(n));
        let key = (0..)
            .map(|i| format!("r{i}"))
            .find(|k| u64::from(murmur3_32(k.as_bytes(), 0)) >= limit)
            .expect("some key is rejected");
        let second = u64::from(murmur3_32(key.as_bytes(), 0xfbf1_402a));
        if second < limit {
            assert_eq!(
                u64::from(shard_for_key(key.as_bytes(), n)),
                second % u64::from(n)
            );
        }
        assert!(shard_for_key(key.as_bytes(), n) < n);
    }

    #[test]
    fn uniform_across_shards() {
        // 120,000 keys over 12 shards: each should get 10,000 ± a few standard deviations (~96).
        let n = 12u32;
        let total = 120_000u32;
        let mut counts = vec![0u32; n as usize];
        for i in 0..total {
            counts[shard_for_key(format!("user-{i}").as_bytes(), n) as usize] += 1;
        }
        let expected = f64::from(total) / f64::from(n);
        let chi2: f64 = counts
            .iter()
            .map(|&c| (f64::from(c) - expected).powi(2) / expected)
            .sum();
        // 11 degrees of freedom: p = 0.001 at chi^2 ≈ 31.3.
        assert!(chi2 < 31.3, "chi^2 = {chi2}, counts = {counts:?}");
        for &c in &counts {
            assert!((9_500..=10_500).contains(&c), "counts = {counts:?}");
        }
    }

    #[test]
    fn every_count_stays_in_range() {
        for n in 1..=64u32 {
            for i in 0..100 {
                assert!(shard_for_key(format!("{n}-{i}").as_bytes(), n) < n);
            }
        }
    }

    #[test]
    fn stream_keys() {
        assert_eq!(shard_stream_key("orders", 0), "orders:0");
        assert_eq!(shard_stream_key("orders", 11), "orders:11");
    }

    #[test]
    fn prefix_validation() {
        assert_eq!(validate_prefix("orders"), Ok(()));
        assert_eq!(validate_prefix("app:orders"), Ok(()));
        assert_eq!(validate_prefix(""), Err(PrefixError::Empty));
        assert!(matches!(
            validate_prefix("{orders}"),
            Err(PrefixError::ContainsBrace { .. })
        ));
        assert!(matches!(
            validate_prefix("ord}ers"),
            Err(PrefixError::ContainsBrace { .. })
        ));
        let msg = validate_prefix("a{b").unwrap_err().to_string();
        assert!(msg.contains("a{b") && msg.contains("hash tag"), "{msg}");
    }
}
