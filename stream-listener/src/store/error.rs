//! Why the store could not apply an input: the one error type of `store/`, so callers (the member loop,
//! the runtime, the CLI) tell a Redis failure from damaged metadata, contention or a missing group.

use crate::coordinator::metadata::MetadataError;

use super::MAX_ATTEMPTS;

/// Why the store could not apply an input.
#[derive(thiserror::Error, stream_listener_macros::ReportDebug)]
#[non_exhaustive]
pub enum StoreError {
    /// Redis failed or is unreachable.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// The stored snapshot cannot be used; it is left untouched.
    #[error("group metadata at {key} cannot be used: {source}")]
    Metadata {
        /// The key holding it.
        key: String,
        /// What is wrong.
        source: MetadataError,
    },
    /// Other processes kept changing the group; the input was not applied.
    #[error("gave up after {MAX_ATTEMPTS} conflicting attempts")]
    Contention,
    /// The group has no metadata, and this handle was opened on an existing group
    /// ([`GroupStore::open`](super::GroupStore::open)), so it does not create one.
    #[error("group metadata at {key} does not exist")]
    Missing {
        /// The key that would hold it.
        key: String,
    },
    /// A stream or group name that cannot be used in a key.
    #[error("invalid name {0:?}: must be non-empty and contain no '{{', '}}' or '/'")]
    InvalidName(String),
    /// A script answered numbers this build does not understand (another version wrote the scripts?).
    #[error("unexpected reply from {script}: {reply:?}")]
    Reply {
        /// The script.
        script: &'static str,
        /// What it answered.
        reply: Vec<i64>,
    },
    /// A script's reply does not have the shape this build expects (another version wrote the scripts?).
    #[error("unexpected reply from {script}: {what}")]
    Shape {
        /// The script.
        script: &'static str,
        /// The part of the reply that is not what was expected.
        what: &'static str,
    },
}
