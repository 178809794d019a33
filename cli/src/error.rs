//! The CLI's errors: each says what failed and, where it helps, which Redis key.

use stream_listener::coordinator::CommandError;
use stream_listener::producer::ProducerError;
use stream_listener::store::StoreError;
use stream_listener::topology::TopologyError;

/// Why a command failed. Printed as `error: <message>`; the process exits with status 1.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Redis could not be reached.
    #[error("cannot connect to Redis at {url}: {source}")]
    Connect {
        /// The URL given, redacted (`redis://user:***@host`).
        url: String,
        /// Why.
        source: redis::RedisError,
    },
    /// The Redis URL does not parse; names it (redacted) and where it came from.
    #[error(transparent)]
    InvalidUrl(#[from] stream_listener::connection::InvalidUrl),
    /// Redis refused for a reason retrying would not change (a wrong password, an ACL user without a
    /// command, a database index out of range, a refused certificate, a server too old).
    #[error(transparent)]
    RedisRefused(#[from] stream_listener::preflight::Refused),
    /// TLS files could not be read or hold no certificate or key; names the file.
    #[error("TLS: {0}")]
    Tls(#[from] stream_listener::tls::TlsError),
    /// A Redis command failed.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// The metadata store refused or failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The stream's topology could not be read or changed.
    #[error(transparent)]
    Topology(#[from] TopologyError),
    /// The producer failed.
    #[error(transparent)]
    Producer(#[from] ProducerError),
    /// The coordinator refused an admin command.
    #[error("refused: {0}")]
    Command(#[from] CommandError),
    /// The group has no metadata in Redis.
    #[error(
        "unknown group `{group}` of stream `{stream}`: no Redis key `{key}` (a group exists once a member \
         has joined it)"
    )]
    UnknownGroup {
        /// Stream.
        stream: String,
        /// Group.
        group: String,
        /// The missing metadata key.
        key: String,
    },
    /// Stored data that cannot be read.
    #[error("{key}: {reason}")]
    Corrupt {
        /// The Redis key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// Something the operator asked for does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The command was refused before it changed anything.
    #[error("refused: {0}")]
    Refused(String),
    /// Reading the operator's answer failed.
    #[error("cannot read the confirmation: {0}")]
    Io(#[from] std::io::Error),
}
