//! The two clocks, as two types, so that the compiler refuses to mix them.
//!
//! * [`StoreMillis`]: the **store clock**, Redis `TIME` in milliseconds (plus the local time elapsed since
//!   the store last read it). Every member shares it: the coordinator's `now`, member lease deadlines,
//!   timers, fenced holds.
//! * [`LocalMillis`]: one process's **monotonic clock**, milliseconds after an
//!   [`OwnershipDeadline`](crate::member::lifecycle::OwnershipDeadline)'s origin. Only that process reads
//!   it: when a heartbeat was sent, the self-fencing deadline.
//!
//! The two are never compared: a member cannot know the store time at which its heartbeat was accepted,
//! which is why it trusts its ownership only until `sent + session timeout - margin` on its own clock (see
//! [`MemberSession`](crate::member::session::MemberSession)).

/// A time on the store clock (Redis `TIME`, ms since the Unix epoch). See the [module docs](self).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StoreMillis(pub i64);

/// A time on one process's monotonic clock (ms after its origin). See the [module docs](self).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LocalMillis(pub i64);

impl LocalMillis {
    /// Before any time: nothing may be trusted until it.
    pub const MIN: Self = Self(i64::MIN);
    /// After every time: no deadline.
    pub const MAX: Self = Self(i64::MAX);

    /// `ms` later (saturating).
    pub fn plus_ms(self, ms: i64) -> Self {
        Self(self.0.saturating_add(ms))
    }

    /// Milliseconds from `earlier` to `self` (saturating; negative if `earlier` is later).
    pub fn ms_since(self, earlier: Self) -> i64 {
        self.0.saturating_sub(earlier.0)
    }
}

impl StoreMillis {
    /// `ms` later (saturating).
    pub fn plus_ms(self, ms: i64) -> Self {
        Self(self.0.saturating_add(ms))
    }
}
