//! [`RuntimeError`]: why the runtime could not start, or stopped.

use stream_listener_macros::ReportDebug;

use crate::consumer::ConsumerError;
use crate::store::StoreError;
use crate::topology::TopologyError;

use super::spec::InvalidListener;
use super::startup::Unreachable;
use super::state::MissingState;

/// Why the runtime could not start, or stopped.
#[derive(thiserror::Error, ReportDebug)]
#[non_exhaustive]
pub enum RuntimeError {
    /// Redis is unreachable or failed.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// The TLS files ([`Runtime::tls`](super::Runtime::tls), `REDIS_TLS_*`) cannot be used; names the file.
    #[error("TLS: {0}")]
    Tls(#[from] crate::tls::TlsError),
    /// The stream's topology could not be read or created.
    #[error(transparent)]
    Topology(#[from] TopologyError),
    /// The group metadata store refused the names.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A consumer could not start.
    #[error(transparent)]
    Consumer(#[from] ConsumerError),
    /// The Redis URL does not parse; names it (redacted) and where it came from (`REDIS_URL`,
    /// `Runtime::new`).
    #[error(transparent)]
    InvalidUrl(#[from] crate::connection::InvalidUrl),
    /// Redis answered, and will refuse every attempt the same way (a wrong password, an ACL user without a
    /// command, a database index out of range, a refused certificate, a server too old): not retried.
    #[error(transparent)]
    Refused(#[from] crate::preflight::Refused),
    /// Redis did not answer within the startup limit ([`Runtime::startup_timeout`](super::Runtime::startup_timeout)).
    #[error(transparent)]
    Unreachable(#[from] Unreachable),
    /// A graceful shutdown missed its deadline; what was still running was aborted (entries in flight stay
    /// pending for the next owner).
    #[error("shutdown missed its deadline of {timeout_ms} ms; stuck: {}", .stuck.join("; "))]
    ShutdownTimedOut {
        /// The shutdown timeout.
        timeout_ms: u64,
        /// One line per member that did not stop: its id, the shards it still owned, its running handlers.
        stuck: Vec<String>,
    },
    /// A second stop signal came during the graceful shutdown ([`RunningRuntime::run_until_signal`](super::RunningRuntime::run_until_signal)):
    /// what was still running was aborted at once (entries in flight stay pending for the next owner).
    #[error(
        "shutdown forced by a second signal; aborted: {}",
        if .stuck.is_empty() { "nothing".to_owned() } else { .stuck.join("; ") }
    )]
    ShutdownForced {
        /// One line per member that had not stopped: its id, the shards it still owned, its running
        /// handlers.
        stuck: Vec<String>,
    },
    /// [`RunningRuntime::pause`](super::RunningRuntime::pause) or [`RunningRuntime::resume`](super::RunningRuntime::resume) got an id no listener of this runtime has.
    #[error("no listener with id `{id}` in this runtime (listeners: {})", .known.join(", "))]
    UnknownListener {
        /// The id asked for.
        id: String,
        /// The ids this runtime has ([`RunningRuntime::listener_ids`](super::RunningRuntime::listener_ids)).
        known: Vec<String>,
    },
    /// A member's heartbeat loop or consumer, or a group's topology follower, ended (panicked, or gave
    /// up) while the runtime was running; [`Runtime::run`](super::Runtime::run) then shuts the rest down and returns this.
    #[error("{owner}: the {task} stopped while running ({reason}); the runtime shut down")]
    TaskStopped {
        /// Whose task: `member <memberId>`, or `group <group> of stream <stream>`.
        owner: String,
        /// `heartbeat loop`, `consumer` or `topology follower`.
        task: &'static str,
        /// `ended`, or `panicked: <message> (at <file:line:column>)`.
        reason: String,
    },
    /// Nothing to run.
    #[error("no listener registered: add #[stream_listener] handlers or a ConsumerBuilder")]
    NoListeners,
    /// [`Runtime::static_membership`](super::Runtime::static_membership) is on, but nothing names this
    /// process in a way that survives a restart.
    #[error(
        "static membership needs a member id that survives restarts for {listener}: set \
         STREAM_LISTENER_MEMBER_ID, POD_NAME (the downward API's metadata.name) or HOSTNAME, \
         or give the listener an id"
    )]
    NoStableMemberId {
        /// The listener without one.
        listener: String,
    },
    /// [`Runtime::hooks`](super::Runtime::hooks) names a listener this runtime does not run.
    #[error("lifecycle hooks for `{name}`: no listener of this runtime has that name (listeners: {})", .known.join(", "))]
    HooksForUnknownListener {
        /// The name given.
        name: String,
        /// The names of this runtime's listeners.
        known: Vec<String>,
    },
    /// A listener's settings (after the environment's overrides) are invalid; names the listener.
    #[error(transparent)]
    InvalidListener(#[from] InvalidListener),
    /// A runtime setting from the environment ([`Runtime::from_env`](super::Runtime::from_env)) does not parse.
    #[error("invalid environment: {0}")]
    InvalidEnvironment(String),
    /// [`Runtime::from_env`](super::Runtime::from_env) found `STREAM_LISTENER_*` variables that neither
    /// the runtime nor any of its listeners reads (a typo), each named with the nearest valid name.
    #[error(
        "unknown environment variable{} {}: stream-listener reads STREAM_LISTENER_<SETTING> (MEMBER_ID, \
         HEARTBEAT_INTERVAL_MS, SESSION_TIMEOUT_MS, REBALANCE_TIMEOUT_MS, DEFAULT_SHARD_COUNT) and \
         STREAM_LISTENER_<LISTENER>_<SETTING> for its listeners ({}); fix or remove {}",
        if .variables.len() == 1 { "" } else { "s" },
        .variables.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
        .listeners.join(", "),
        if .variables.len() == 1 { "it" } else { "them" }
    )]
    UnknownEnvironment {
        /// Each unknown variable, with the valid name nearest to it.
        variables: Vec<super::UnknownVariable>,
        /// The names of the runtime's listeners (`<LISTENER>` is one, upper-cased).
        listeners: Vec<String>,
    },
    /// A handler takes a [`State<T>`](super::State) whose type nobody registered.
    #[error("listener {listener}: {missing}")]
    MissingState {
        /// The listener ([`Origin`](super::Origin)).
        listener: String,
        /// The missing type.
        missing: MissingState,
    },
    /// Two listeners of this process would run the same member of the same group: they would fence each
    /// other forever. Give one an `id` (attribute) or a [`ConsumerBuilder::member_id`](super::ConsumerBuilder::member_id).
    #[error(
        "listeners {first} and {second} would both run member `{member_id}` of group `{group}` on stream `{stream}`: \
         give one of them another id (`id = \"...\"` on the attribute, `ConsumerBuilder::member_id`)"
    )]
    DuplicateMemberId {
        /// The member id both would use.
        member_id: String,
        /// The stream.
        stream: String,
        /// The group.
        group: String,
        /// The first listener (handler path and source location, or the builder).
        first: String,
        /// The second listener.
        second: String,
    },
}
