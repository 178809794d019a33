//! Repeated WARNs, throttled. During a Redis outage every retry of every loop fails the same way, and a
//! line per attempt (each member's heartbeats, each shard's reads) buries the lines that matter. A
//! [`Throttle`] per cause lets its first occurrence through at once, then at most one line per
//! [`WARN_EVERY_MS`], saying how many repeats it held back; clearing it (the cause went away) lets the
//! next occurrence through at once again. Pure: time is an argument.

use crate::clock::LocalMillis;

/// The shortest time between two lines of one cause.
pub(crate) const WARN_EVERY_MS: i64 = 10_000;

/// The lines of one cause: when one was last let through and how many repeats were held back since.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Throttle {
    last: Option<LocalMillis>,
    held: u64,
}

impl Throttle {
    /// Whether an occurrence at `now` is logged: `Some(held)`, the repeats held back since the last line
    /// (log it with the line); `None`: hold this one back.
    pub(crate) fn admit(&mut self, now: LocalMillis) -> Option<u64> {
        match self.last {
            Some(last) if now.ms_since(last) < WARN_EVERY_MS => {
                self.held += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.held))
            }
        }
    }

    /// The cause went away: its next occurrence is logged at once. Returns the repeats held back since the
    /// last line.
    pub(crate) fn clear(&mut self) -> u64 {
        self.last = None;
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn at(ms: i64) -> LocalMillis {
        LocalMillis(ms)
    }

    #[test]
    fn the_first_occurrence_is_logged_at_once() {
        assert_eq!(Throttle::default().admit(at(0)), Some(0));
        assert_eq!(Throttle::default().admit(at(123_456)), Some(0));
    }

    #[test]
    fn repeats_within_the_period_are_held_back_and_counted_on_the_next_line() {
        let mut throttle = Throttle::default();
        assert_eq!(throttle.admit(at(1_000)), Some(0));
        for ms in [1_001, 2_000, 5_000, 10_999] {
            assert_eq!(throttle.admit(at(ms)), None, "{ms}");
        }
        assert_eq!(throttle.admit(at(11_000)), Some(4));
        assert_eq!(throttle.admit(at(11_001)), None);
        assert_eq!(throttle.admit(at(21_000)), Some(1));
        assert_eq!(throttle.admit(at(40_000)), Some(0));
    }

    #[test]
    fn at_most_one_line_per_period_however_often_it_happens() {
        let mut throttle = Throttle::default();
        // Every 250 ms for a minute: 4 attempts a second.
        let lines = (0..240)
            .filter(|i| throttle.admit(at(i * 250)).is_some())
            .count();
        assert_eq!(lines, 6);
    }

    #[test]
    fn once_cleared_the_next_occurrence_is_logged_at_once() {
        let mut throttle = Throttle::default();
        assert_eq!(throttle.admit(at(0)), Some(0));
        assert_eq!(throttle.admit(at(100)), None);
        assert_eq!(throttle.admit(at(200)), None);
        assert_eq!(throttle.clear(), 2);
        assert_eq!(throttle.admit(at(300)), Some(0));
        assert_eq!(throttle.clear(), 0);
    }
}
