//! Waiting for Redis at startup: a pod often starts before its Redis answers (a rollout, a node restart).
//! Failing at once turns that into a crash loop, so the runtime retries with bounded exponential backoff
//! and jitter, logging every failed attempt, until Redis answers or the configured limit passes. What
//! will never pass (a wrong password, an ACL user without a command, a database index out of range, a
//! refused certificate, a server too old: [`crate::preflight`]) is a start error at once.

use std::time::Duration;

use tokio::time::Instant;

use crate::preflight::Failure;
use crate::redact::RedisUrl;

use super::RuntimeError;

/// The target these lines had before this file moved into `runtime/`, kept for log filters that name it.
const LOG_TARGET: &str = "stream_listener::startup";

/// First wait between attempts.
pub(crate) const INITIAL_BACKOFF: Duration = Duration::from_millis(100);
/// Longest wait between attempts.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The wait before attempt `attempt + 1` (0-based): `100 ms * 2^attempt`, at most 5 s, then a random
/// 50 % to 100 % of it, so a fleet restarted at once does not reconnect in lockstep.
pub(crate) fn backoff(attempt: u32, random: u64) -> Duration {
    use crate::util::{equal_jitter, exponential_backoff};
    equal_jitter(
        exponential_backoff(INITIAL_BACKOFF, attempt, MAX_BACKOFF),
        random,
    )
}

/// Redis did not answer within the startup limit.
#[derive(thiserror::Error, stream_listener_macros::ReportDebug)]
#[error("Redis at {url} unreachable for {waited_ms} ms ({attempts} attempts): {last_error}")]
pub struct Unreachable {
    /// The URL, credentials redacted.
    pub url: String,
    /// Connection attempts made.
    pub attempts: u32,
    /// How long the runtime kept trying.
    pub waited_ms: u64,
    /// The last attempt's error.
    pub last_error: redis::RedisError,
}

/// Checks Redis ([`crate::preflight::check`]) until it answers, a permanent failure
/// ([`RuntimeError::Refused`]), or `limit` (if any) has passed ([`RuntimeError::Unreachable`]).
pub(crate) async fn wait_for_redis(
    client: &crate::connection::RedisTarget,
    url: &RedisUrl,
    limit: Option<Duration>,
) -> Result<(), RuntimeError> {
    let start = Instant::now();
    let mut attempt = 0u32;
    loop {
        let error = match crate::preflight::check(client, url).await {
            Ok(_) => {
                if attempt > 0 {
                    tracing::info!(target: LOG_TARGET, %url, attempts = attempt + 1, "Redis reachable");
                }
                return Ok(());
            }
            Err(Failure::Permanent(refused)) => {
                tracing::error!(target: LOG_TARGET, error = %refused, "Redis refused the start; not retrying");
                return Err(refused.into());
            }
            Err(Failure::Transient(error)) => error,
        };
        attempt += 1;
        let wait = backoff(attempt - 1, crate::util::random_u64());
        let waited = start.elapsed();
        if let Some(limit) = limit {
            if waited + wait > limit {
                tracing::error!(target: LOG_TARGET, %url, attempts = attempt, %error, "Redis unreachable; giving up");
                return Err(Unreachable {
                    url: url.to_string(),
                    attempts: attempt,
                    waited_ms: waited.as_millis() as u64,
                    last_error: error,
                }
                .into());
            }
        }
        tracing::warn!(target: LOG_TARGET, %url, attempt, %error, retry_in = ?wait, "Redis unreachable at startup; retrying");
        tokio::time::sleep(wait).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_is_bounded_and_jittered() {
        assert_eq!(backoff(0, 0), Duration::from_millis(50));
        assert_eq!(
            backoff(0, u64::MAX - 1).max(backoff(0, 0)),
            backoff(0, u64::MAX - 1)
        );
        assert!(backoff(0, 12345) <= Duration::from_millis(100));
        assert_eq!(backoff(3, 0), Duration::from_millis(400));
        for attempt in 0..100 {
            for random in [0, 7, u64::MAX] {
                let wait = backoff(attempt, random);
                assert!(
                    wait <= MAX_BACKOFF && wait >= Duration::from_millis(50),
                    "{wait:?}"
                );
            }
        }
        assert_eq!(backoff(40, 0), MAX_BACKOFF / 2);
    }
}
