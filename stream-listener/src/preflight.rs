//! What a start checks before anything else, and which failures are worth retrying.
//!
//! A pod often starts before its Redis answers, so a start retries a Redis that is unreachable
//! ([`Failure::Transient`]: connection refused, a timeout, `LOADING`, `BUSY`, `MASTERDOWN`, `TRYAGAIN`,
//! `CLUSTERDOWN`, anything not known to be permanent). But some answers will be the same on every
//! attempt: a wrong password, an ACL user without a command it needs, a database index the server does
//! not have, a certificate the other side refuses, a server too old. Retrying those forever looks like an
//! outage; [`classify`] tells them apart (pure, over redis-rs's error kinds and codes), and [`check`]
//! turns them into a [`Refused`] that names the cause and the fix. The runtime, the producer and the CLI
//! all start with [`check`].

use std::fmt;
use std::time::Duration;

use crate::connection::RedisTarget;
use crate::redact::RedisUrl;

/// The oldest Redis stream-listener runs on: 6.2, for `XAUTOCLAIM` (taking over shards), `ZADD GT`
/// (leases) and `XADD NOMKSTREAM` (the producer). Below 7.0 Redis does not report a group's `lag` and
/// `entries-read`: the lag metrics and the CLI's lag column are empty and trimmed-unread entries are not
/// counted.
pub const MINIMUM_VERSION: (u32, u32) = (6, 2);

/// The command rules of a least-privilege ACL user for everything stream-listener runs (members,
/// producers, the lag exporter, `serve`, the CLI's reads), to give with its keys (`~<stream>:*`,
/// `~sl:*`) and channels (`&sl:*`): `ACL SETUSER <user> on ><password> ~sl:* ~orders:* &sl:* <these>`.
/// `MULTI`, `EXEC` and `DISCARD` are for the consumer's dead letters and the producer's batches in which
/// a key repeats (and a cluster producer's through the cluster connection, see `producer/cluster.rs`);
/// [`check`] refuses a user without them. `WAIT` is for a
/// producer's `min_replicas`. `CONFIG GET` (the
/// eviction check) and `MEMORY USAGE` (`serve`'s offsets) are optional: without them that check or
/// number is skipped. The serve conformance tests run a mixed group as such a user.
pub const ACL_COMMANDS: &[&str] = &[
    "-@all",
    "+@stream",
    "+@scripting",
    "+@sortedset",
    "+@hash",
    "+@string",
    "+@list",
    "+@pubsub",
    "+del",
    "+exists",
    "+type",
    "+pexpire",
    "+scan",
    "+info",
    "+time",
    "+ping",
    "+client",
    "+role",
    "+multi",
    "+exec",
    "+discard",
    "+wait",
    "+cluster|slots",
    "+config|get",
    "+memory|usage",
];

/// How long one attempt of [`check`] (connect, authenticate, `INFO server`) may take.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);

/// A Redis server version, read from `INFO server`: checked against [`MINIMUM_VERSION`] at start, and
/// the consumer's choice between `XACKDEL` and the script.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServerVersion {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
    /// Patch version.
    pub patch: u32,
    /// Whether the server is Valkey (it reports a `redis_version` of 7.2 for compatibility).
    pub valkey: bool,
}

impl ServerVersion {
    /// Parse the text of `INFO server`; Valkey's own `valkey_version` wins over its `redis_version`.
    pub fn from_info(info: &str) -> Option<Self> {
        let field = |name: &str| {
            info.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(':').map(str::trim))
        };
        let (text, valkey) = match field("valkey_version") {
            Some(v) => (v, true),
            None => (field("redis_version")?, false),
        };
        let mut parts = text.split('.').map(|p| p.parse::<u32>().ok());
        let major = parts.next()??;
        let minor = parts.next().flatten().unwrap_or(0);
        let patch = parts.next().flatten().unwrap_or(0);
        Some(Self {
            major,
            minor,
            patch,
            valkey,
        })
    }

    /// Whether stream-listener runs on it: Redis [`MINIMUM_VERSION`] or newer, or any Valkey (forked
    /// from Redis 7.2). A version of 0 (an `INFO` without one) is given the benefit of the doubt.
    pub fn is_supported(self) -> bool {
        self.valkey || self.major == 0 || (self.major, self.minor) >= MINIMUM_VERSION
    }

    /// Whether the server has `XACKDEL` (Redis 8.2, Valkey 9.2).
    pub fn has_xackdel(self) -> bool {
        let since = if self.valkey { (9, 2) } else { (8, 2) };
        (self.major, self.minor) >= since
    }
}

impl fmt::Display for ServerVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = if self.valkey { "Valkey" } else { "Redis" };
        write!(f, "{name} {}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Why Redis will refuse every attempt: a start error, not a reason to retry.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// The password (or the user) is wrong, or missing where the server requires one (`WRONGPASS`,
    /// `NOAUTH`, a refused `AUTH`).
    Authentication,
    /// The ACL user may not run a command stream-listener needs (`NOPERM`).
    Permission,
    /// The database index of the URL (`/<db>`) is beyond the server's `databases`.
    DatabaseIndex,
    /// The TLS handshake failed over a certificate: the server's is not trusted (an unknown authority,
    /// a wrong name, expired), or the server refused or required ours.
    Certificate,
    /// The server is older than [`MINIMUM_VERSION`].
    ServerTooOld(ServerVersion),
    /// Every sentinel of a `redis+sentinel://` URL answered, and none monitors a master of its name.
    UnknownSentinelMaster,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Authentication => f.write_str(
                "authentication failed: the user name or password in the URL is wrong, or missing where \
                 the server requires one (redis://user:password@host, redis://:password@host for \
                 `requirepass`)",
            ),
            Self::Permission => f.write_str(
                "the ACL user may not run a command stream-listener needs: give it the stream, script, \
                 sorted set, hash, string, list and pub/sub commands plus DEL, EXISTS, TYPE, PEXPIRE, SCAN, \
                 INFO, TIME, PING, CLIENT, ROLE, MULTI, EXEC and DISCARD on its keys \
                 (`preflight::ACL_COMMANDS` lists them; \
                 ACL SETUSER <user> +@all ~* &* allows everything)",
            ),
            Self::DatabaseIndex => f.write_str(
                "the database index in the URL (`/<db>`) is out of range: the server has fewer databases \
                 (its `databases` setting; a Redis Cluster has only database 0)",
            ),
            Self::Certificate => f.write_str(
                "the TLS handshake failed on a certificate: check the certificate authority \
                 (REDIS_TLS_CA_CERT, Runtime::tls_ca_cert) and the client certificate and key \
                 (REDIS_TLS_CERT, REDIS_TLS_KEY) against the server's",
            ),
            Self::ServerTooOld(found) => write!(
                f,
                "{found} is too old: stream-listener needs Redis {}.{} or newer (XAUTOCLAIM, ZADD GT, \
                 XADD NOMKSTREAM; Redis 7.0 or newer also reports group lag): use a newer server (for \
                 example the `redis:7` image)",
                MINIMUM_VERSION.0, MINIMUM_VERSION.1
            ),
            Self::UnknownSentinelMaster => f.write_str(
                "no sentinel monitors a master of the name in the URL \
                 (redis+sentinel://host:26379/<master name>): use the name of `sentinel monitor \
                 <name> ...` (SENTINEL MASTERS lists them)",
            ),
        }
    }
}

/// Redis refused a start for a reason retrying would not change ([`Refusal`]). Its text ends with the
/// error it came from, so a log line of it (`%error`) says everything.
#[derive(thiserror::Error, stream_listener_macros::ReportDebug)]
#[error("Redis at {url}: {refusal}{}", .error.as_ref().map(|e| format!(" ({e})")).unwrap_or_default())]
#[non_exhaustive]
pub struct Refused {
    /// The URL, credentials redacted.
    pub url: String,
    /// Why.
    pub refusal: Refusal,
    /// Redis's (or the TLS library's) error; `None` for a server too old.
    #[source]
    pub error: Option<redis::RedisError>,
}

/// Why one [`check`] failed.
#[derive(Debug)]
pub enum Failure {
    /// It will fail the same way every time: give up at once.
    Permanent(Refused),
    /// Redis may answer later: retry.
    Transient(redis::RedisError),
}

/// Whether `error` will come back on every attempt, and why; `None`: it may pass (retry it). Only
/// causes known to be permanent are: anything else (connection refused, timeouts, `LOADING`, `BUSY`,
/// `MASTERDOWN`, `TRYAGAIN`, `CLUSTERDOWN`, errors this does not know) is retried.
pub fn classify(error: &redis::RedisError) -> Option<Refusal> {
    use redis::{ErrorKind, ServerErrorKind};
    match (error.kind(), error.code()) {
        (ErrorKind::AuthenticationFailed, _) | (_, Some("WRONGPASS" | "NOAUTH")) => {
            return Some(Refusal::Authentication)
        }
        (ErrorKind::Server(ServerErrorKind::NoPerm), _) | (_, Some("NOPERM")) => {
            return Some(Refusal::Permission)
        }
        (ErrorKind::MasterNameNotFoundBySentinel, _) => {
            return Some(Refusal::UnknownSentinelMaster)
        }
        _ => {}
    }
    // redis-rs reports a refused `SELECT` as "Redis server refused to switch database - ...: DB index is
    // out of range".
    let text = error.to_string();
    if error.kind() == ErrorKind::Server(ServerErrorKind::ResponseError)
        && (text.contains("refused to switch database")
            || error.detail().is_some_and(|d| d.contains("DB index")))
    {
        return Some(Refusal::DatabaseIndex);
    }
    if certificate_problem(error) {
        return Some(Refusal::Certificate);
    }
    classify_text(&text)
}

/// The causes of [`classify`] by their words: redis-rs's cluster client passes the errors of its first
/// connections on as text only (`Failed to create initial connections - ...: <each node's error>`).
fn classify_text(text: &str) -> Option<Refusal> {
    const CERTIFICATE_ALERTS: &[&str] = &[
        "BadCertificate",
        "UnsupportedCertificate",
        "CertificateRevoked",
        "CertificateExpired",
        "CertificateUnknown",
        "UnknownCA",
        "CertificateRequired",
    ];
    let has = |words: &[&str]| words.iter().any(|w| text.contains(w));
    if has(&["Password authentication failed", "NOAUTH", "WRONGPASS"]) {
        Some(Refusal::Authentication)
    } else if has(&["NOPERM", "NoPerm:"]) {
        Some(Refusal::Permission)
    } else if has(&["DB index is out of range"]) {
        Some(Refusal::DatabaseIndex)
    } else if has(&["invalid peer certificate"])
        || text.contains("received fatal alert: ") && has(CERTIFICATE_ALERTS)
    {
        Some(Refusal::Certificate)
    } else {
        None
    }
}

/// Whether a TLS library error about a certificate is among `error`'s causes. redis-rs passes rustls's
/// errors on inside an `io::Error`, which it keeps in an `Arc`: neither is transparent to `source()`.
fn certificate_problem(error: &(dyn std::error::Error + 'static)) -> bool {
    type Dyn = dyn std::error::Error + 'static;
    let mut next = Some(error);
    // Bounded: a chain is finite, but nothing stops a type from returning itself.
    for _ in 0..16 {
        let Some(cause) = next else { return false };
        let unshared = cause
            .downcast_ref::<std::sync::Arc<dyn std::error::Error + Send + Sync>>()
            .map(|shared| &**shared as &Dyn)
            .unwrap_or(cause);
        let inner = unshared
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .map(|inner| inner as &Dyn);
        if is_certificate_error(unshared) || inner.is_some_and(is_certificate_error) {
            return true;
        }
        next = cause.source();
    }
    false
}

#[cfg(feature = "tls")]
fn is_certificate_error(error: &(dyn std::error::Error + 'static)) -> bool {
    use rustls::AlertDescription as Alert;
    match error.downcast_ref::<rustls::Error>() {
        Some(
            rustls::Error::InvalidCertificate(_)
            | rustls::Error::NoCertificatesPresented
            | rustls::Error::InvalidCertRevocationList(_),
        ) => true,
        Some(rustls::Error::AlertReceived(alert)) => matches!(
            alert,
            Alert::BadCertificate
                | Alert::UnsupportedCertificate
                | Alert::CertificateRevoked
                | Alert::CertificateExpired
                | Alert::CertificateUnknown
                | Alert::UnknownCA
                | Alert::CertificateRequired
        ),
        _ => false,
    }
}

#[cfg(not(feature = "tls"))]
fn is_certificate_error(_error: &(dyn std::error::Error + 'static)) -> bool {
    false
}

/// The version refusal of `version`: [`Refusal::ServerTooOld`] below [`MINIMUM_VERSION`].
pub fn version_refusal(version: ServerVersion) -> Option<Refusal> {
    (!version.is_supported()).then_some(Refusal::ServerTooOld(version))
}

/// One attempt: connect to `target` through a fresh connection (authenticating and selecting the
/// database), read `INFO server` and check the version, and open and discard a transaction (the ACL
/// must allow `MULTI`), within [`ATTEMPT_TIMEOUT`]. `url` is named in a [`Refused`].
pub async fn check(target: &RedisTarget, url: &RedisUrl) -> Result<ServerVersion, Failure> {
    let refused = |refusal, error| {
        Failure::Permanent(Refused {
            url: url.to_string(),
            refusal,
            error,
        })
    };
    let info = match tokio::time::timeout(ATTEMPT_TIMEOUT, target.server_info()).await {
        Ok(Ok(info)) => info,
        Ok(Err(error)) => {
            return Err(match classify(&error) {
                Some(refusal) => refused(refusal, Some(error)),
                None => Failure::Transient(error),
            })
        }
        Err(_) => {
            return Err(Failure::Transient(redis::RedisError::from((
                redis::ErrorKind::Io,
                "connect and INFO timed out",
                format!("no answer within {ATTEMPT_TIMEOUT:?}"),
            ))))
        }
    };
    let version = ServerVersion::from_info(&info).unwrap_or(ServerVersion {
        major: 0,
        minor: 0,
        patch: 0,
        valkey: false,
    });
    match version_refusal(version) {
        Some(refusal) => Err(refused(refusal, None)),
        None => Ok(version),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::{ErrorKind, RedisError, ServerErrorKind};

    fn server(kind: ServerErrorKind, detail: &str) -> RedisError {
        (
            ErrorKind::Server(kind),
            "An error was signalled by the server",
            detail.to_owned(),
        )
            .into()
    }

    fn extension(code: &str, detail: &str) -> RedisError {
        redis::make_extension_error(code.to_owned(), Some(detail.to_owned()))
    }

    fn io(kind: std::io::ErrorKind) -> RedisError {
        std::io::Error::from(kind).into()
    }

    #[test]
    fn a_wrong_or_missing_password_is_permanent() {
        let wrong: RedisError = (
            ErrorKind::AuthenticationFailed,
            "Password authentication failed",
        )
            .into();
        assert_eq!(classify(&wrong), Some(Refusal::Authentication));
        let missing = extension("NOAUTH", "Authentication required.");
        assert_eq!(classify(&missing), Some(Refusal::Authentication));
        let hello = extension(
            "WRONGPASS",
            "invalid username-password pair or user is disabled.",
        );
        assert_eq!(classify(&hello), Some(Refusal::Authentication));
    }

    #[test]
    fn a_command_the_acl_user_may_not_run_is_permanent() {
        let noperm = server(
            ServerErrorKind::NoPerm,
            "this user has no permissions to run the 'info' command",
        );
        assert_eq!(classify(&noperm), Some(Refusal::Permission));
        assert_eq!(
            classify(&extension("NOPERM", "no")),
            Some(Refusal::Permission)
        );
    }

    #[test]
    fn a_database_index_out_of_range_is_permanent() {
        let select: RedisError = (
            ErrorKind::Server(ServerErrorKind::ResponseError),
            "Redis server refused to switch database",
            "DB index is out of range".to_owned(),
        )
            .into();
        assert_eq!(classify(&select), Some(Refusal::DatabaseIndex));
        // Any other `ERR` is not.
        assert_eq!(
            classify(&server(ServerErrorKind::ResponseError, "unknown command")),
            None
        );
    }

    #[test]
    fn a_master_name_no_sentinel_monitors_is_permanent_a_failover_under_way_is_not() {
        let unknown: RedisError = (
            ErrorKind::MasterNameNotFoundBySentinel,
            "no sentinel monitors the master named in the URL",
            "master `orders`: sentinel 127.0.0.1:26379 monitors no master of that name".to_owned(),
        )
            .into();
        assert_eq!(classify(&unknown), Some(Refusal::UnknownSentinelMaster));
        let failing_over: RedisError = std::io::Error::new(
            std::io::ErrorKind::NotConnected,
            "no master found through the sentinels: master `orders`: 127.0.0.1:6380, named by \
             sentinel 127.0.0.1:26379, is not a master (a failover is under way)",
        )
        .into();
        assert_eq!(classify(&failing_over), None);
    }

    #[test]
    fn an_unreachable_loading_busy_or_failing_over_server_is_retried() {
        for error in [
            io(std::io::ErrorKind::ConnectionRefused),
            io(std::io::ErrorKind::TimedOut),
            io(std::io::ErrorKind::ConnectionReset),
            io(std::io::ErrorKind::UnexpectedEof),
            server(
                ServerErrorKind::BusyLoading,
                "Redis is loading the dataset in memory",
            ),
            server(ServerErrorKind::MasterDown, "Link with MASTER is down"),
            server(
                ServerErrorKind::TryAgain,
                "Multiple keys request during rehashing of slot",
            ),
            server(ServerErrorKind::ClusterDown, "The cluster is down"),
            extension("BUSY", "Redis is busy running a script."),
            (ErrorKind::Io, "connect and INFO timed out").into(),
            (ErrorKind::ClusterConnectionNotFound, "no node").into(),
        ] {
            assert_eq!(classify(&error), None, "{error}");
        }
    }

    #[cfg(feature = "tls")]
    #[test]
    fn a_certificate_the_handshake_refused_is_permanent_other_tls_failures_are_not() {
        let tls = |error: rustls::Error| -> RedisError {
            std::io::Error::new(std::io::ErrorKind::InvalidData, error).into()
        };
        let unknown_issuer =
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        assert_eq!(classify(&tls(unknown_issuer)), Some(Refusal::Certificate));
        let required = rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired);
        assert_eq!(classify(&tls(required)), Some(Refusal::Certificate));
        let unknown_ca = rustls::Error::AlertReceived(rustls::AlertDescription::UnknownCA);
        assert_eq!(classify(&tls(unknown_ca)), Some(Refusal::Certificate));
        // A lost connection mid-handshake is not about a certificate.
        let closed = rustls::Error::AlertReceived(rustls::AlertDescription::CloseNotify);
        assert_eq!(classify(&tls(closed)), None);
    }

    #[test]
    fn the_cluster_clients_text_only_errors_are_classified_by_their_words() {
        let cluster = |node: &str| -> RedisError {
            (
                ErrorKind::Io,
                "Failed to create initial connections",
                format!("127.0.0.1:7000: {node}"),
            )
                .into()
        };
        for (node, refusal) in [
            (
                "Password authentication failed - AuthenticationFailed",
                Some(Refusal::Authentication),
            ),
            (
                "\"NOAUTH\": Authentication required.",
                Some(Refusal::Authentication),
            ),
            (
                "NoPerm: this user has no permissions",
                Some(Refusal::Permission),
            ),
            (
                "invalid peer certificate: UnknownIssuer",
                Some(Refusal::Certificate),
            ),
            (
                "received fatal alert: CertificateRequired",
                Some(Refusal::Certificate),
            ),
            ("received fatal alert: CloseNotify", None),
            ("Connection refused (os error 111)", None),
        ] {
            assert_eq!(classify(&cluster(node)), refusal, "{node}");
        }
    }

    #[test]
    fn a_server_older_than_6_2_is_refused_naming_its_version() {
        let version = |info: &str| ServerVersion::from_info(info).unwrap();
        let old = version("redis_version:5.0.14\r\n");
        assert_eq!(version_refusal(old), Some(Refusal::ServerTooOld(old)));
        assert!(version_refusal(version("redis_version:6.0.20\r\n")).is_some());
        assert_eq!(version_refusal(version("redis_version:6.2.0\r\n")), None);
        assert_eq!(version_refusal(version("redis_version:7.0.15\r\n")), None);
        assert_eq!(
            version_refusal(version("redis_version:7.2.4\r\nvalkey_version:8.0.1\r\n")),
            None
        );
        let text = Refusal::ServerTooOld(old).to_string();
        assert!(
            text.starts_with(
                "Redis 5.0.14 is too old: stream-listener needs Redis 6.2 or newer (XAUTOCLAIM"
            ),
            "{text}"
        );
    }

    #[test]
    fn parses_versions() {
        let v =
            ServerVersion::from_info("# Server\r\nredis_version:7.0.15\r\nfoo:bar\r\n").unwrap();
        assert_eq!((v.major, v.minor, v.patch, v.valkey), (7, 0, 15, false));
        assert!(!v.has_xackdel());
        assert!(ServerVersion::from_info("redis_version:8.2.1\r\n")
            .unwrap()
            .has_xackdel());
        assert!(!ServerVersion::from_info("redis_version:8.0.0\r\n")
            .unwrap()
            .has_xackdel());
        let valkey =
            ServerVersion::from_info("redis_version:7.2.4\r\nvalkey_version:9.2.0\r\n").unwrap();
        assert!(valkey.valkey && valkey.has_xackdel());
    }
}
