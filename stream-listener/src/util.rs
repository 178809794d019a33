//! Small things the library needs in several places: exponential backoff and its jitter, a random
//! number, and RFC 3339 time (public, for the CLI).

use std::time::Duration;

/// `initial * 2^attempt`, at most `max` (attempt 0 waits `initial`).
pub(crate) fn exponential_backoff(initial: Duration, attempt: u32, max: Duration) -> Duration {
    let factor = 1u32.checked_shl(attempt.min(20)).unwrap_or(u32::MAX);
    initial.saturating_mul(factor).min(max)
}

/// A random 50 % to 100 % of `base` ("equal jitter"), so processes that failed together do not retry in
/// lockstep, yet none retries much sooner than `base` says.
pub(crate) fn equal_jitter(base: Duration, random: u64) -> Duration {
    let half = base / 2;
    half + Duration::from_nanos(random % (half.as_nanos() as u64 + 1))
}

/// A random number without a dependency, for jitter and nonces (not for secrets): std's `RandomState` is
/// keyed randomly per process and per call; the clock and the process id are hashed in as well.
pub(crate) fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(since_epoch().as_nanos());
    hasher.write_u32(std::process::id());
    hasher.finish()
}

/// A random number below `bound` (`0` when `bound` is 0).
pub(crate) fn random_below(bound: u64) -> u64 {
    random_u64().checked_rem(bound).unwrap_or(0)
}

/// The wall clock as a duration since the Unix epoch (zero if the clock is before it).
pub(crate) fn since_epoch() -> Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}

/// The wall clock as RFC 3339 (UTC, milliseconds): `2024-05-01T12:00:00.123Z`.
pub fn rfc3339_now() -> String {
    rfc3339_ms(since_epoch().as_millis() as i64)
}

/// A Unix time in milliseconds as RFC 3339 in UTC, `2024-05-01T12:00:00.123Z`, in the proleptic Gregorian
/// calendar (negative times are before 1970). Four-digit years keep the text sortable (years 0 to 9999).
pub fn rfc3339_ms(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let millis = ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar (H. Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// A boxed future that is `Send`: what handlers and hooks return.
pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// What a test's `tracing-subscriber` writes (as its `with_writer`), to read back as text.
#[cfg(test)]
#[derive(Default, Clone)]
pub(crate) struct LogBuffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

#[cfg(test)]
impl LogBuffer {
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

#[cfg(test)]
impl std::io::Write for LogBuffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_rfc3339() {
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_ms(-1), "1969-12-31T23:59:59.999Z");
        // A leap day of a leap century, and the days around it.
        assert_eq!(rfc3339_ms(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(rfc3339_ms(951_782_400_000 - 1), "2000-02-28T23:59:59.999Z");
        assert_eq!(rfc3339_ms(951_868_800_000), "2000-03-01T00:00:00.000Z");
        assert_eq!(rfc3339_ms(1_709_251_199_999), "2024-02-29T23:59:59.999Z");
        assert_eq!(rfc3339_ms(1_735_689_599_999), "2024-12-31T23:59:59.999Z");
        assert_eq!(rfc3339_ms(1_764_547_200_123), "2025-12-01T00:00:00.123Z");
        // 2100 is not a leap year: February 28 is followed by March 1.
        assert_eq!(rfc3339_ms(4_102_444_800_000), "2100-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_ms(4_107_456_000_000), "2100-02-28T00:00:00.000Z");
        assert_eq!(rfc3339_ms(4_107_542_400_000), "2100-03-01T00:00:00.000Z");
        assert_eq!(rfc3339_ms(253_402_300_799_999), "9999-12-31T23:59:59.999Z");
    }

    #[test]
    fn rfc3339_now_truncates_to_the_millisecond_of_the_clock() {
        let before = since_epoch();
        let now = rfc3339_now();
        let after = since_epoch();
        // Sub-millisecond time is cut, never rounded up into the next millisecond (or second).
        let at = |d: Duration| rfc3339_ms(d.as_millis() as i64);
        assert_eq!(
            at(Duration::new(1_709_251_199, 999_999_999)),
            "2024-02-29T23:59:59.999Z"
        );
        assert!(at(before) <= now && now <= at(after), "{now} not between");
        assert_eq!(now.len(), "1970-01-01T00:00:00.000Z".len());
    }

    #[test]
    fn backoff_doubles_and_is_bounded() {
        let ms = Duration::from_millis;
        assert_eq!(exponential_backoff(ms(100), 0, ms(5000)), ms(100));
        assert_eq!(exponential_backoff(ms(100), 3, ms(5000)), ms(800));
        assert_eq!(exponential_backoff(ms(100), 6, ms(5000)), ms(5000));
        assert_eq!(exponential_backoff(ms(100), u32::MAX, ms(5000)), ms(5000));
        assert_eq!(
            exponential_backoff(Duration::MAX, 40, Duration::MAX),
            Duration::MAX
        );
    }

    #[test]
    fn equal_jitter_stays_in_the_upper_half() {
        let base = Duration::from_millis(400);
        assert_eq!(equal_jitter(base, 0), Duration::from_millis(200));
        assert_eq!(
            equal_jitter(base, base.as_nanos() as u64 / 2),
            Duration::from_millis(400)
        );
        for _ in 0..1000 {
            let wait = equal_jitter(base, random_u64());
            assert!(wait >= base / 2 && wait <= base, "{wait:?}");
        }
        assert_eq!(equal_jitter(Duration::ZERO, random_u64()), Duration::ZERO);
    }

    #[test]
    fn random_numbers_differ_and_respect_the_bound() {
        let draws: std::collections::HashSet<u64> = (0..100).map(|_| random_u64()).collect();
        assert!(draws.len() > 90, "{} distinct of 100", draws.len());
        assert!((0..1000).all(|_| random_below(7) < 7));
        assert_eq!(random_below(0), 0);
    }
}
