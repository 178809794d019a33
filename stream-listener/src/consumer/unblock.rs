//! Ending the idle wait's blocked read early, for sure.
//!
//! The scheduler interrupts the wait when ownership changes or a shard is parked. Aborting the task would
//! leave the read blocked in Redis, holding the wait's connection, so the wait sends `CLIENT UNBLOCK`
//! for its own connection. One `CLIENT UNBLOCK` is not enough: it may reach Redis before the read it
//! means to end (the read was sent, but is still on the wire or queued behind a slow link), unblocks
//! nothing and answers 0, and the read then blocks for its whole timeout. So the wait sends it again,
//! after a short and growing pause, until the read has ended; the read's own timeout bounds the retries.
//!
//! The interrupt is sticky: one that comes before the wait blocks (while it connects or reads where to
//! watch from) makes it return without blocking.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// The scheduler's request to end the current wait: set by the driver, reset when a wait starts.
#[derive(Debug, Default)]
pub(crate) struct Interrupt {
    set: AtomicBool,
    notify: Notify,
}

impl Interrupt {
    /// A new wait starts: earlier requests were for the wait that ended.
    pub(crate) fn reset(&self) {
        self.set.store(false, Ordering::Release);
    }

    /// Ends the running wait, or the next one before it blocks.
    pub(crate) fn fire(&self) {
        self.set.store(true, Ordering::Release);
        self.notify.notify_waiters();
    }

    pub(crate) fn is_set(&self) -> bool {
        self.set.load(Ordering::Acquire)
    }

    /// Returns once [`fire`](Self::fire) was called (at once if it was already).
    pub(crate) async fn fired(&self) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_set() {
                return;
            }
            notified.await;
        }
    }
}

/// When to send `CLIENT UNBLOCK` (again) while an interrupted read has not ended.
#[derive(Debug, Default)]
pub(crate) struct Unblocking {
    /// `None`: not interrupted (yet).
    next: Option<Instant>,
    sent: u32,
}

impl Unblocking {
    /// The read is to end: unblock now (unless already unblocking).
    pub(crate) fn start(&mut self, now: Instant) {
        self.next.get_or_insert(now);
    }

    pub(crate) fn started(&self) -> bool {
        self.next.is_some()
    }

    /// Returns when the next `CLIENT UNBLOCK` is due; never, before [`start`](Self::start).
    pub(crate) async fn due(&self) {
        match self.next {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    }

    /// One round of `CLIENT UNBLOCK` was sent at `now`; `unblocked`: whether it ended every read it meant
    /// to (each answered 1).
    pub(crate) fn sent(&mut self, now: Instant, unblocked: bool) {
        self.next = Some(now + retry_pause(self.sent, unblocked));
        self.sent += 1;
    }
}

/// The pause before `CLIENT UNBLOCK` number `sent + 2`. After a 0 (the read had not reached Redis yet, or
/// had just ended) or an error: 1 ms, doubling up to 64 ms. After a 1 the read ends at once; another try
/// is only a safety net against a lost reply.
pub(crate) fn retry_pause(sent: u32, unblocked: bool) -> Duration {
    if unblocked {
        return Duration::from_millis(250);
    }
    Duration::from_millis(1 << sent.min(6))
}

/// `CLIENT UNBLOCK id` on `conn`: whether it ended a blocked command. Errors count as "not yet": the
/// caller tries again, and the read's own timeout bounds that.
pub(crate) async fn unblock(conn: &mut impl redis::aio::ConnectionLike, id: i64) -> bool {
    let reply: redis::RedisResult<i64> = redis::cmd("CLIENT")
        .arg("UNBLOCK")
        .arg(id)
        .query_async(conn)
        .await;
    match reply {
        Ok(n) => n == 1,
        Err(error) => {
            tracing::debug!(%error, "CLIENT UNBLOCK failed; trying again");
            false
        }
    }
}

/// Runs `read` (a blocking command on the connection with client id `client`) to its end, sending `CLIENT
/// UNBLOCK` over `control` from the moment `interrupt` fires until it has ended.
pub(crate) async fn read_until_interrupted<T, C>(
    read: impl std::future::Future<Output = T>,
    interrupt: &Interrupt,
    control: &mut C,
    client: i64,
) -> T
where
    C: redis::aio::ConnectionLike,
{
    tokio::pin!(read);
    let mut unblocking = Unblocking::default();
    loop {
        tokio::select! {
            biased;
            out = &mut read => return out,
            () = interrupt.fired(), if !unblocking.started() => unblocking.start(Instant::now()),
            () = unblocking.due() => {
                let unblocked = unblock(control, client).await;
                unblocking.sent(Instant::now(), unblocked);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zero_is_retried_soon_and_ever_less_often() {
        let pauses: Vec<u64> = (0..9)
            .map(|n| retry_pause(n, false).as_millis() as u64)
            .collect();
        assert_eq!(pauses, [1, 2, 4, 8, 16, 32, 64, 64, 64]);
        assert_eq!(retry_pause(0, true), Duration::from_millis(250));
    }

    #[tokio::test(start_paused = true)]
    async fn unblocking_is_due_at_once_then_after_each_pause() {
        let mut unblocking = Unblocking::default();
        assert!(!unblocking.started());
        assert!(
            tokio::time::timeout(Duration::from_secs(3600), unblocking.due())
                .await
                .is_err(),
            "never due before it starts"
        );
        let start = Instant::now();
        unblocking.start(start);
        unblocking.due().await;
        assert_eq!(Instant::now(), start);
        unblocking.sent(start, false);
        unblocking.start(start + Duration::from_secs(9)); // starting again changes nothing
        unblocking.due().await;
        assert_eq!(Instant::now(), start + Duration::from_millis(1));
    }

    #[tokio::test]
    async fn an_interrupt_before_the_wait_looks_is_kept_until_reset() {
        let interrupt = Interrupt::default();
        interrupt.fire();
        tokio::time::timeout(Duration::from_secs(5), interrupt.fired())
            .await
            .expect("a fired interrupt is seen later");
        interrupt.reset();
        assert!(!interrupt.is_set());
        assert!(
            tokio::time::timeout(Duration::from_millis(20), interrupt.fired())
                .await
                .is_err(),
            "reset for the next wait"
        );
    }
}
