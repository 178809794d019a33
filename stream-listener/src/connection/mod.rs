//! Where Redis is ([`RedisTarget`]: one node, a Sentinel-managed master, or a Redis Cluster) and the
//! connection every component shares ([`Connection`]).
//!
//! A single node stays the default and goes through redis-rs's `ConnectionManager`, unchanged. A master
//! behind Redis Sentinel (`redis+sentinel://sentinel:26379,sentinel:26379/<master name>`) goes through
//! [`SentinelConnection`], which finds the master again after a failover (the `sentinel` module). A cluster
//! (`redis+cluster://host:port,host:port` or [`RedisTarget::cluster`] with seed nodes) goes through
//! redis-rs's async cluster connection, which follows `MOVED` / `ASK` and reconnects after a failover. Every
//! command stream-listener sends touches one slot (shard streams spread over slots; a group's keys share a
//! hash tag); a pipeline that spans slots is split per slot here (the producer builds its batch's
//! per-shard pipelines itself and sends them with `send_to_slots`).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{
    AsyncConnectionConfig, Cmd, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, Pipeline,
    RedisFuture, RedisResult, Value,
};

mod masters;
mod sentinel;
pub(crate) use masters::{not_run_here, Masters, NodeConnections, SlotMaps};
pub use sentinel::{
    SentinelConnection, SentinelTarget, DEFAULT_SENTINEL_PORT, SENTINEL_SCHEME, SENTINEL_TLS_SCHEME,
};

/// The URL scheme of a cluster given by its seed nodes: `redis+cluster://[user:pass@]h1:p1,h2:p2`.
pub const CLUSTER_SCHEME: &str = "redis+cluster";

/// [`CLUSTER_SCHEME`] over TLS: `rediss+cluster://[user:pass@]h1:p1,h2:p2` (the nodes' TLS ports,
/// certificates checked against the system's roots, or those of [`RedisTarget::with_tls`]).
pub const CLUSTER_TLS_SCHEME: &str = "rediss+cluster";

/// Where Redis is: one node (the default), a master found through Redis Sentinel, or a Redis Cluster
/// reached through seed nodes.
#[derive(Clone)]
// Made once per process and cloned rarely: boxing the client would only complicate matching on it.
#[allow(clippy::large_enum_variant)]
pub enum RedisTarget {
    /// One Redis node (`redis://`, `rediss://`, `redis+unix://`).
    Single(redis::Client),
    /// The master of a set monitored by Redis Sentinel (`redis+sentinel://`, `rediss+sentinel://`).
    Sentinel(SentinelTarget),
    /// A Redis Cluster.
    Cluster {
        /// The nodes to discover it from (one reachable seed is enough).
        seeds: Vec<ConnectionInfo>,
        /// Certificates for every node of a `rediss+cluster://` cluster ([`RedisTarget::with_tls`];
        /// `None`: the system's roots, no client certificate).
        #[cfg(feature = "tls")]
        certificates: Option<redis::TlsCertificates>,
    },
}

impl fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Addresses only: the connection info also holds the password.
        match self {
            Self::Single(client) => write!(f, "Single({})", client.get_connection_info().addr()),
            Self::Sentinel(target) => target.fmt(f),
            Self::Cluster { seeds, .. } => {
                let addrs: Vec<String> = seeds.iter().map(|s| s.addr().to_string()).collect();
                write!(f, "Cluster({})", addrs.join(","))
            }
        }
    }
}

/// Timeouts of one connection (see [`RedisTarget::connect`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct ConnectOptions {
    /// How long a command may wait for its answer (`None`: redis-rs's default).
    pub response_timeout: Option<Duration>,
    /// How long connecting may take (`None`: redis-rs's default).
    pub connection_timeout: Option<Duration>,
    /// Reconnection attempts per command before it fails (`None`: redis-rs's default).
    pub retries: Option<usize>,
    /// Never send a command again after its connection failed (cluster only: the cluster client retries
    /// by default, the single-node manager never does). A group read (`>`) whose reply was lost may have
    /// delivered entries; sent again, it would answer with later ones and hide the loss from the caller.
    pub no_resend: bool,
}

impl RedisTarget {
    /// Parses a URL: `redis+cluster://[user:pass@]host:port,host:port,...` is a cluster (the credentials
    /// apply to every node), `rediss+cluster://` one over TLS;
    /// `redis+sentinel://[user:pass@]host:port,host:port/<master name>[/<db>]` is the master a set of
    /// sentinels names (the credentials are the data nodes'; the query parameters `sentinel_username` and
    /// `sentinel_password` are the sentinels'; the port defaults to 26379), `rediss+sentinel://` one over
    /// TLS; anything else is one node, as `redis::Client::open` reads it.
    pub fn open(url: &str) -> RedisResult<Self> {
        for (scheme, tls) in [(SENTINEL_SCHEME, false), (SENTINEL_TLS_SCHEME, true)] {
            if let Some(rest) = url.strip_prefix(scheme).and_then(|r| r.strip_prefix("://")) {
                return SentinelTarget::parse(tls, rest).map(Self::Sentinel);
            }
        }
        for (scheme, node_scheme) in [(CLUSTER_SCHEME, "redis"), (CLUSTER_TLS_SCHEME, "rediss")] {
            if let Some(rest) = url.strip_prefix(scheme).and_then(|r| r.strip_prefix("://")) {
                return Self::cluster(cluster_seed_urls(node_scheme, rest)?);
            }
        }
        Ok(Self::Single(redis::Client::open(url)?))
    }

    /// [`open`](Self::open), naming the URL (redacted) and where it came from (`origin`: `REDIS_URL`,
    /// `Runtime::new`, a command-line flag) when it does not parse.
    pub fn open_from(url: &str, origin: &'static str) -> Result<Self, InvalidUrl> {
        Self::open(url).map_err(|error| InvalidUrl {
            url: crate::redact::redact_url(url),
            origin,
            reason: url_problem(url),
            error,
        })
    }

    /// A cluster reached through these seed nodes (`redis://` or `rediss://` URLs, or anything redis-rs
    /// turns into a connection info).
    pub fn cluster<T: IntoConnectionInfo>(seeds: impl IntoIterator<Item = T>) -> RedisResult<Self> {
        let seeds = seeds
            .into_iter()
            .map(IntoConnectionInfo::into_connection_info)
            .collect::<RedisResult<Vec<_>>>()?;
        if seeds.is_empty() {
            return Err(invalid("a cluster needs at least one seed node"));
        }
        Ok(Self::Cluster {
            seeds,
            #[cfg(feature = "tls")]
            certificates: None,
        })
    }

    /// This target with `certificates` (a CA to trust instead of the system's roots, a client
    /// certificate for mutual TLS) on every connection: to the node, to the sentinels and the nodes they
    /// name, or to each node of the cluster. The URL must be `rediss://`, `rediss+sentinel://` or
    /// `rediss+cluster://`. See [`crate::tls::TlsFiles`] to read them.
    #[cfg(feature = "tls")]
    pub fn with_tls(self, certificates: redis::TlsCertificates) -> RedisResult<Self> {
        match self {
            Self::Single(client) => Ok(Self::Single(redis::Client::build_with_tls(
                client.get_connection_info().clone(),
                certificates,
            )?)),
            Self::Sentinel(target) => Ok(Self::Sentinel(target.with_tls(certificates)?)),
            Self::Cluster { seeds, .. } => {
                // The seeds carry them too: blocking reads and pub/sub open plain clients from a seed.
                let seeds = seeds
                    .into_iter()
                    .map(|seed| {
                        redis::Client::build_with_tls(seed, certificates.clone())
                            .map(|client| client.get_connection_info().clone())
                    })
                    .collect::<RedisResult<Vec<_>>>()?;
                Ok(Self::Cluster {
                    seeds,
                    certificates: Some(certificates),
                })
            }
        }
    }

    /// How many master switches the sentinels announced so far (0 but for a Sentinel target): a
    /// connection of [`node_connection`](Self::node_connection) or [`pubsub`](Self::pubsub) made at a
    /// lower count may be to the old master, and should be made again.
    pub(crate) fn master_switches(&self) -> u64 {
        match self {
            Self::Sentinel(target) => target.switches(),
            _ => 0,
        }
    }

    /// Resolves once [`master_switches`](Self::master_switches) is above `since`; never for other
    /// targets.
    pub(crate) async fn master_switched(&self, since: u64) {
        if let Self::Sentinel(target) = self {
            let mut switches = target.switch_receiver();
            if switches.wait_for(|count| *count > since).await.is_ok() {
                return;
            }
        }
        std::future::pending().await
    }

    /// Whether this is a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster { .. })
    }

    /// A shared connection: a `ConnectionManager` on one node, a [`SentinelConnection`] to a Sentinel's
    /// master, the cluster connection on a cluster. All reconnect by themselves and are cheap to clone.
    pub async fn connect(&self, options: ConnectOptions) -> RedisResult<Connection> {
        match self {
            Self::Single(client) => {
                let mut config = ConnectionManagerConfig::new()
                    .set_response_timeout(options.response_timeout)
                    .set_connection_timeout(options.connection_timeout);
                if let Some(retries) = options.retries {
                    config = config.set_number_of_retries(retries);
                }
                Ok(Connection::Single(
                    ConnectionManager::new_with_config(client.clone(), config).await?,
                ))
            }
            Self::Sentinel(target) => Ok(Connection::Sentinel(
                SentinelConnection::connect(target.clone(), options).await?,
            )),
            Self::Cluster {
                seeds,
                #[cfg(feature = "tls")]
                certificates,
            } => {
                let mut builder = ClusterClientBuilder::new(seeds.clone());
                #[cfg(feature = "tls")]
                if let Some(certificates) = certificates {
                    builder = builder.certs(certificates.clone());
                }
                if let Some(info) = seeds.first() {
                    // The builder takes the credentials from its own settings, not from each seed.
                    if let Some(user) = info.redis_settings().username() {
                        builder = builder.username(user);
                    }
                    if let Some(pass) = info.redis_settings().password() {
                        builder = builder.password(pass);
                    }
                }
                if let Some(timeout) = options.response_timeout {
                    builder = builder.response_timeout(timeout);
                }
                if let Some(timeout) = options.connection_timeout {
                    builder = builder.connection_timeout(timeout);
                }
                if options.no_resend {
                    builder = builder.retries(0);
                } else if let Some(retries) = options.retries {
                    builder = builder.retries(retries as u32);
                }
                let conn = builder.build()?.get_async_connection().await?;
                Ok(Connection::Cluster(conn))
            }
        }
    }

    /// A plain multiplexed connection to one node: the single node, the Sentinel's current master
    /// (discovered again), or the cluster node at `host:port` (with the seeds' credentials and TLS). For
    /// blocking reads, which must not share a connection.
    pub(crate) async fn node_connection(
        &self,
        node: Option<(&str, u16)>,
        config: &AsyncConnectionConfig,
    ) -> RedisResult<MultiplexedConnection> {
        if let Self::Sentinel(target) = self {
            return Ok(target.connect_master(config, None).await?.1);
        }
        self.node_client(node)?
            .get_multiplexed_async_connection_with_config(config)
            .await
    }

    /// A pub/sub connection: to the single node, to the Sentinel's current master (discovered again), or
    /// to the first cluster seed (a cluster forwards `PUBLISH` to every node).
    pub(crate) async fn pubsub(&self) -> RedisResult<redis::aio::PubSub> {
        let node = match self {
            Self::Single(_) => None,
            Self::Sentinel(target) => {
                let config = AsyncConnectionConfig::new();
                let (client, _) = target.connect_master(&config, None).await?;
                return client.get_async_pubsub().await;
            }
            Self::Cluster { seeds, .. } => match seeds.first().map(|seed| seed.addr()) {
                Some(ConnectionAddr::Tcp(host, port)) => Some((host.as_str(), *port)),
                #[cfg(feature = "tls")]
                Some(ConnectionAddr::TcpTls { host, port, .. }) => Some((host.as_str(), *port)),
                _ => return Err(invalid("cluster seeds must be TCP addresses")),
            },
        };
        self.node_client(node)?.get_async_pubsub().await
    }

    /// A client for one node: the single node, or the cluster node at `host:port` with the seeds'
    /// credentials and TLS.
    fn node_client(&self, node: Option<(&str, u16)>) -> RedisResult<redis::Client> {
        match (self, node) {
            (Self::Single(client), _) => Ok(client.clone()),
            (Self::Sentinel(_), _) => Err(invalid("a Sentinel's master is discovered, not named")),
            (Self::Cluster { seeds, .. }, Some((host, port))) => {
                let seed = seeds[0].clone();
                let addr = match seed.addr() {
                    ConnectionAddr::Tcp(..) => ConnectionAddr::Tcp(host.to_owned(), port),
                    #[cfg(feature = "tls")]
                    ConnectionAddr::TcpTls {
                        insecure,
                        tls_params,
                        ..
                    } => ConnectionAddr::TcpTls {
                        host: host.to_owned(),
                        port,
                        insecure: *insecure,
                        tls_params: tls_params.clone(),
                    },
                    _ => return Err(invalid("cluster seeds must be TCP addresses")),
                };
                redis::Client::open(seed.set_addr(addr))
            }
            (Self::Cluster { .. }, None) => Err(invalid("a cluster node address is needed")),
        }
    }

    /// `INFO server` through a fresh connection (the cluster: through its discovery, of one node), for
    /// the start's checks ([`crate::preflight`]): it connects, authenticates, selects the database and
    /// reads the version in one round trip more. The same round trip opens a transaction and discards
    /// it: the consumer's dead letters and the cluster producer's batches are transactions, and an ACL
    /// user without `MULTI` must fail here (`NOPERM`), not at its first batch (where a refused `MULTI`
    /// also breaks redis-rs's count of replies).
    pub(crate) async fn server_info(&self) -> RedisResult<String> {
        let mut pipe = redis::pipe();
        pipe.cmd("INFO").arg("server");
        pipe.cmd("MULTI").ignore().cmd("DISCARD").ignore();
        let (info,): (String,) = match self {
            Self::Single(client) => {
                let mut conn = client.get_multiplexed_async_connection().await?;
                pipe.query_async(&mut conn).await?
            }
            Self::Sentinel(_) | Self::Cluster { .. } => {
                let mut conn = self.connect(ConnectOptions::default()).await?;
                pipe.query_async(&mut conn).await?
            }
        };
        Ok(info)
    }
}

impl From<redis::Client> for RedisTarget {
    fn from(client: redis::Client) -> Self {
        Self::Single(client)
    }
}

/// The seed URLs (`{scheme}://...`) of a cluster URL after its scheme: `[userinfo@]h:p,h:p[/...]`.
fn cluster_seed_urls(scheme: &str, rest: &str) -> RedisResult<Vec<String>> {
    let (userinfo, hosts) = match rest.rfind('@') {
        Some(at) => (&rest[..=at], &rest[at + 1..]),
        None => ("", rest),
    };
    let hosts = hosts.split(['/', '?']).next().unwrap_or("");
    let seeds: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(|h| format!("{scheme}://{userinfo}{h}"))
        .collect();
    if seeds.is_empty() {
        return Err(invalid("the cluster URL names no seed node"));
    }
    Ok(seeds)
}

/// The URL schemes [`RedisTarget::open`] reads.
const SCHEMES: &[&str] = &[
    "redis",
    "rediss",
    "redis+unix",
    "unix",
    "valkey",
    "valkeys",
    CLUSTER_SCHEME,
    CLUSTER_TLS_SCHEME,
    SENTINEL_SCHEME,
    SENTINEL_TLS_SCHEME,
];

/// A Redis URL that does not parse: its text redacted, where it came from, and what is wrong with it.
#[derive(thiserror::Error, stream_listener_macros::ReportDebug)]
#[error(
    "Redis URL `{url}` (from {origin}) {reason}: expected redis://[user:password@]host[:port][/db], \
     rediss:// for TLS, redis+unix:///path, redis+sentinel://host:port,host:port/<master name>, or \
     redis+cluster://host:port,host:port"
)]
#[non_exhaustive]
pub struct InvalidUrl {
    /// The URL, credentials redacted.
    pub url: String,
    /// Where it came from: `the environment variable REDIS_URL`, `Runtime::new`, ...
    pub origin: &'static str,
    /// What is wrong with it, as far as can be told (`has no scheme`, `has the unknown scheme ...`).
    pub reason: String,
    /// redis-rs's error.
    #[source]
    pub error: redis::RedisError,
}

/// What is wrong with a URL that did not parse, for [`InvalidUrl`]: its scheme, or else its shape (a
/// port that is not a number, no host, ...). Never quotes more of it than its scheme.
fn url_problem(url: &str) -> String {
    match url.split_once("://") {
        None => "has no scheme".into(),
        Some((scheme, _)) if !SCHEMES.contains(&scheme.to_ascii_lowercase().as_str()) => {
            format!(
                "has the unknown scheme `{}`",
                crate::redact::redact_url(scheme)
            )
        }
        Some(_) => "does not parse".into(),
    }
}

fn invalid(detail: &'static str) -> redis::RedisError {
    (
        redis::ErrorKind::InvalidClientConfig,
        "invalid Redis target",
        detail.to_owned(),
    )
        .into()
}

/// A key's hash tag: the part between the first `{` and the next `}`, when not empty.
pub fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    })
}

/// The cluster slot of a key: CRC16 (XMODEM) of its [`hash_tag`] or of the whole key, modulo 16384, as
/// Redis computes it.
pub fn slot_of(key: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in hash_tag(key).unwrap_or(key) {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

/// A shared, reconnecting connection to a [`RedisTarget`]. Clone it freely.
#[derive(Clone)]
pub enum Connection {
    /// One node: redis-rs's `ConnectionManager`.
    Single(ConnectionManager),
    /// A Sentinel's master, found again after a failover.
    Sentinel(SentinelConnection),
    /// A cluster: redis-rs's async cluster connection (routes by slot, follows `MOVED` / `ASK`).
    Cluster(ClusterConnection),
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Single(_) => "Connection::Single",
            Self::Sentinel(_) => "Connection::Sentinel",
            Self::Cluster(_) => "Connection::Cluster",
        })
    }
}

impl From<ConnectionManager> for Connection {
    fn from(conn: ConnectionManager) -> Self {
        Self::Single(conn)
    }
}

impl Connection {
    /// Whether this is a cluster connection.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(_))
    }

    /// `INFO server` of one node (any node of a cluster: they run the same version).
    pub async fn server_info(&mut self) -> RedisResult<String> {
        let mut cmd = redis::cmd("INFO");
        cmd.arg("server");
        self.query_one_node(&cmd, None).await
    }

    /// The cluster's masters from `CLUSTER SLOTS` (any node's view), each once; empty on a single node.
    /// For keyspace-wide commands such as `SCAN`, which see one node's keys only.
    pub async fn masters(&mut self) -> RedisResult<Vec<(String, u16)>> {
        if !self.is_cluster() {
            return Ok(Vec::new());
        }
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SLOTS");
        let slots = parse_cluster_slots(self.query_one_node(&cmd, None).await?)?;
        let mut masters: Vec<NodeAddr> = slots.into_iter().map(|(_, _, m)| m).collect();
        masters.sort();
        masters.dedup();
        Ok(masters)
    }

    /// Runs a keyless command on one node: the single node, or on a cluster the node at `addr` (any
    /// node when `None`). redis-rs would send some keyless commands (`INFO`, `CLIENT`) to every node.
    pub async fn query_one_node<T: redis::FromRedisValue>(
        &mut self,
        cmd: &Cmd,
        addr: Option<(&str, u16)>,
    ) -> RedisResult<T> {
        use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
        match self {
            Self::Single(conn) => cmd.query_async(conn).await,
            Self::Sentinel(conn) => cmd.query_async(conn).await,
            Self::Cluster(conn) => {
                let route = match addr {
                    Some((host, port)) => SingleNodeRoutingInfo::ByAddress {
                        host: host.to_owned(),
                        port,
                    },
                    None => SingleNodeRoutingInfo::Random,
                };
                let value = conn
                    .route_command(cmd.clone(), RoutingInfo::SingleNode(route))
                    .await?;
                Ok(redis::from_redis_value(value)?)
            }
        }
    }
}

/// The slot of a command's first key, for the commands stream-listener pipelines (`None`: keyless).
/// Reads the arguments in place: it runs for every command of every cluster pipeline.
fn command_slot(cmd: &Cmd) -> Option<u16> {
    let mut args = cmd.args_iter().filter_map(|arg| match arg {
        redis::Arg::Simple(bytes) => Some(bytes),
        _ => None,
    });
    let name = args.next()?;
    let is = |names: &[&str]| {
        names
            .iter()
            .any(|n| name.eq_ignore_ascii_case(n.as_bytes()))
    };
    let key = if is(&["TIME", "PING", "INFO", "SCRIPT", "CLIENT", "CLUSTER"]) {
        return None;
    } else if is(&["EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO", "FCALL"]) {
        let keys = std::str::from_utf8(args.nth(1)?)
            .ok()?
            .parse::<usize>()
            .ok()?;
        if keys == 0 {
            return None;
        }
        args.next()?
    } else if is(&["XINFO", "MEMORY"]) {
        // `XINFO GROUPS <key>`, `XINFO STREAM <key>`, `MEMORY USAGE <key>`: the key follows the
        // subcommand.
        args.nth(1)?
    } else if is(&["XREAD", "XREADGROUP"]) {
        args.find(|a| a.eq_ignore_ascii_case(b"STREAMS"))?;
        args.next()?
    } else {
        args.next()?
    };
    Some(slot_of(key))
}

/// A pipeline's command positions grouped by slot (keyless commands go with the first keyed slot, or
/// make the only group when no command has a key), so the answers can be put back in order. Positions
/// only: a pipeline of one slot, the usual case, is sent as it is, without copying its commands.
fn slot_groups(pipeline: &Pipeline) -> Vec<(Option<u16>, Vec<usize>)> {
    let mut groups: BTreeMap<Option<u16>, Vec<usize>> = BTreeMap::new();
    let mut first = None;
    for (index, cmd) in pipeline.cmd_iter().enumerate() {
        let slot = command_slot(cmd);
        if first.is_none() && slot.is_some() {
            first = slot;
        }
        groups.entry(slot).or_default().push(index);
    }
    if let Some(first) = first {
        if let Some(keyless) = groups.remove(&None) {
            groups
                .get_mut(&Some(first))
                .expect("first slot present")
                .extend(keyless);
        }
    }
    groups.into_iter().collect()
}

/// The cluster connection inside `conn`, when it is one: a [`Connection::Cluster`] or a redis-rs
/// `ClusterConnection`. Lets generic code (the producer) send one pipeline per slot itself on a
/// cluster, and keep one pipeline, one round trip, elsewhere.
pub(crate) fn as_cluster(conn: &dyn std::any::Any) -> Option<&ClusterConnection> {
    match conn.downcast_ref::<Connection>() {
        Some(Connection::Cluster(cluster)) => Some(cluster),
        Some(_) => None,
        None => conn.downcast_ref::<ClusterConnection>(),
    }
}

/// The route of a pipeline of one slot: its master (as redis-rs routes a pipeline with a write; this
/// connection never reads from replicas), any node when keyless.
fn slot_route(slot: Option<u16>) -> redis::cluster_routing::SingleNodeRoutingInfo {
    use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
    match slot {
        Some(slot) => SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master)),
        None => SingleNodeRoutingInfo::Random,
    }
}

/// Sends pipelines of one slot each (`None`: keyless, any node) at once on the shared cluster
/// connection, polled together in this task (no task per part: a producer's batch has one part per
/// shard). Each goes to its slot's master ([`slot_route`]) and is moved into redis-rs, which would copy
/// a borrowed one. A part's
/// per-command errors (`MOVED` included) come back in place; the answers are in the parts' order.
pub(crate) async fn send_to_slots(
    conn: &ClusterConnection,
    parts: Vec<(Option<u16>, Pipeline)>,
) -> Vec<RedisResult<Vec<Value>>> {
    futures_util::future::join_all(parts.into_iter().map(|(slot, part)| {
        let mut conn = conn.clone();
        let route = slot_route(slot);
        async move {
            // A transaction's answers are `MULTI`'s, one per command queued, and `EXEC`'s.
            let n = part.len() + if part.is_transaction() { 2 } else { 0 };
            conn.route_pipeline(part, 0, n, route).await
        }
    }))
    .await
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(conn) => conn.req_packed_command(cmd),
            Self::Sentinel(conn) => conn.req_packed_command(cmd),
            Self::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        // A transaction must stay whole (its keys must share a slot anyway).
        let conn = match self {
            Self::Cluster(conn) if !pipeline.is_transaction() => conn.clone(),
            Self::Cluster(conn) => return conn.req_packed_commands(pipeline, offset, count),
            Self::Single(conn) => return conn.req_packed_commands(pipeline, offset, count),
            Self::Sentinel(conn) => return conn.req_packed_commands(pipeline, offset, count),
        };
        Box::pin(async move {
            let mut groups = slot_groups(pipeline);
            if groups.len() <= 1 {
                let mut conn = conn;
                return match groups.pop() {
                    // One slot: routed by the slot already known, without redis-rs reading every
                    // command again.
                    Some((Some(slot), _)) => {
                        conn.route_pipeline(pipeline.clone(), offset, count, slot_route(Some(slot)))
                            .await
                    }
                    // Keyless: redis-rs picks the node.
                    _ => conn.req_packed_commands(pipeline, offset, count).await,
                };
            }
            let commands: Vec<&Cmd> = pipeline.cmd_iter().collect();
            let parts = groups
                .iter()
                .map(|(slot, indices)| {
                    let mut part = redis::pipe();
                    for &index in indices {
                        part.add_command(commands[index].clone());
                    }
                    (*slot, part)
                })
                .collect();
            let mut answers: Vec<Option<Value>> = vec![None; pipeline.len()];
            for ((_, indices), part) in groups.into_iter().zip(send_to_slots(&conn, parts).await) {
                for (index, value) in indices.into_iter().zip(part?) {
                    answers[index] = Some(value);
                }
            }
            Ok(answers
                .into_iter()
                .skip(offset)
                .take(count)
                .map(|a| a.unwrap_or(Value::Nil))
                .collect())
        })
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(conn) => conn.get_db(),
            Self::Sentinel(conn) => conn.get_db(),
            Self::Cluster(_) => 0,
        }
    }
}

/// A node's address.
pub(crate) type NodeAddr = (String, u16);

/// Parses `CLUSTER SLOTS`: `[[start, end, [host, port, ..], replicas..], ..]` into
/// `(first slot, last slot, master)` ranges.
pub(crate) fn parse_cluster_slots(value: redis::Value) -> RedisResult<Vec<(u16, u16, NodeAddr)>> {
    let ranges: Vec<redis::Value> = redis::from_redis_value(value)?;
    let mut out = Vec::new();
    for range in ranges {
        let range: Vec<redis::Value> = redis::from_redis_value(range)?;
        if range.len() < 3 {
            continue;
        }
        let start: u16 = redis::from_redis_value_ref(&range[0])?;
        let end: u16 = redis::from_redis_value_ref(&range[1])?;
        let master: Vec<redis::Value> = redis::from_redis_value_ref(&range[2])?;
        if master.len() < 2 {
            continue;
        }
        let host: String = redis::from_redis_value_ref(&master[0])?;
        let port: u16 = redis::from_redis_value_ref(&master[1])?;
        out.push((start, end, (host, port)));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_urls_give_one_seed_per_host_with_the_credentials() {
        assert_eq!(
            cluster_seed_urls("redis", "alice:pw@10.0.0.1:7000,10.0.0.2:7001/0").unwrap(),
            [
                "redis://alice:pw@10.0.0.1:7000",
                "redis://alice:pw@10.0.0.2:7001"
            ]
        );
        assert_eq!(
            cluster_seed_urls("redis", "h:1, h:2,").unwrap(),
            ["redis://h:1", "redis://h:2"]
        );
        assert!(cluster_seed_urls("redis", "").is_err());
        assert!(cluster_seed_urls("redis", "pw@").is_err());
    }

    #[test]
    fn a_url_that_does_not_parse_is_named_redacted_with_its_origin() {
        let error =
            RedisTarget::open_from("redis://:topsecret@host:port/", "Runtime::new").unwrap_err();
        assert_eq!(
            error.to_string(),
            "Redis URL `redis://:***@host:port/` (from Runtime::new) does not parse: expected \
             redis://[user:password@]host[:port][/db], rediss:// for TLS, redis+unix:///path, \
             redis+sentinel://host:port,host:port/<master name>, or redis+cluster://host:port,host:port"
        );
        let error = RedisTarget::open_from(
            "redis+sentinel://:topsecret@h:26379?sentinel_password=alsosecret",
            "REDIS_URL",
        )
        .unwrap_err();
        assert_eq!(error.reason, "does not parse");
        assert!(
            error.url.starts_with("redis+sentinel://:***@h:26379?"),
            "{}",
            error.url
        );
        let report = format!("{error:?}");
        assert!(!report.contains("secret"), "{report}");
        assert!(report.contains("names its master"), "{report}");
        assert!(!format!("{error:?}").contains("topsecret"));
        assert!(!format!("{error:#?}").contains("topsecret"));
        let error = RedisTarget::open_from("127.0.0.1:6379", "REDIS_URL").unwrap_err();
        assert_eq!(error.reason, "has no scheme");
        let error = RedisTarget::open_from("http://u:topsecret@h/", "REDIS_URL").unwrap_err();
        assert_eq!(error.reason, "has the unknown scheme `http`");
        assert_eq!(error.origin, "REDIS_URL");
        let error = RedisTarget::open_from("redis+cluster://", "REDIS_URL").unwrap_err();
        assert_eq!(error.reason, "does not parse");
        assert!(RedisTarget::open_from("redis://127.0.0.1:6379/0", "REDIS_URL").is_ok());
    }

    #[test]
    fn open_tells_a_cluster_from_a_single_node() {
        let cluster =
            RedisTarget::open("redis+cluster://:pw@127.0.0.1:7000,127.0.0.1:7001").unwrap();
        let RedisTarget::Cluster { seeds, .. } = &cluster else {
            panic!("not a cluster: {cluster:?}");
        };
        assert_eq!(seeds.len(), 2);
        assert_eq!(seeds[1].redis_settings().password(), Some("pw"));
        assert!(!format!("{cluster:?}").contains("pw"));
        assert!(!RedisTarget::open("redis://127.0.0.1:6379")
            .unwrap()
            .is_cluster());
        assert!(RedisTarget::open("redis+cluster://").is_err());
        let tls = RedisTarget::open("rediss+cluster://127.0.0.1:7000,127.0.0.1:7001").unwrap();
        let RedisTarget::Cluster { seeds, .. } = &tls else {
            panic!("not a cluster: {tls:?}");
        };
        assert!(
            matches!(seeds[0].addr(), ConnectionAddr::TcpTls { host, port: 7000, .. } if host == "127.0.0.1"),
            "{:?}",
            seeds[0].addr()
        );
        assert!(RedisTarget::cluster(Vec::<String>::new()).is_err());
        let sentinel = RedisTarget::open("redis+sentinel://:pw@127.0.0.1:26379/mymaster").unwrap();
        assert!(matches!(sentinel, RedisTarget::Sentinel(_)), "{sentinel:?}");
        assert!(!sentinel.is_cluster());
        assert_eq!(
            format!("{sentinel:?}"),
            "Sentinel(127.0.0.1:26379/mymaster)"
        );
    }

    #[test]
    fn xinfo_and_memory_go_to_the_slot_of_their_key_not_of_their_subcommand() {
        let mut pipe = redis::pipe();
        pipe.cmd("XINFO").arg("GROUPS").arg("orders:0");
        pipe.cmd("XREVRANGE").arg("orders:0").arg("+").arg("-");
        pipe.cmd("XINFO").arg("GROUPS").arg("orders:1");
        pipe.cmd("MEMORY").arg("USAGE").arg("orders:1");
        let mut positions: Vec<Vec<usize>> =
            slot_groups(&pipe).into_iter().map(|(_, i)| i).collect();
        positions.sort();
        assert_eq!(positions, [vec![0, 1], vec![2, 3]]);
    }

    #[test]
    fn pipelines_split_per_slot_and_keep_positions() {
        let mut pipe = redis::pipe();
        pipe.cmd("XADD").arg("orders:0").arg("*").arg("k").arg("a");
        pipe.cmd("XADD").arg("orders:1").arg("*").arg("k").arg("b");
        pipe.cmd("TIME");
        pipe.cmd("XADD").arg("orders:0").arg("*").arg("k").arg("c");
        let groups = slot_groups(&pipe);
        assert_ne!(slot_of(b"orders:0"), slot_of(b"orders:1"));
        assert_eq!(groups.len(), 2);
        let mut positions: Vec<(Option<u16>, Vec<usize>)> = groups;
        positions.sort_by_key(|(_, i)| i.clone());
        // The keyless TIME goes with the first key's slot (orders:0).
        assert_eq!(
            positions,
            [
                (Some(slot_of(b"orders:0")), vec![0, 3, 2]),
                (Some(slot_of(b"orders:1")), vec![1])
            ]
        );
        // Keyless alone make one group; names are matched in any case, and the key of EVAL and
        // XREADGROUP is found after their counts and options.
        let mut pipe = redis::pipe();
        pipe.cmd("PING");
        pipe.cmd("time");
        assert_eq!(slot_groups(&pipe), [(None, vec![0, 1])]);
        let mut pipe = redis::pipe();
        pipe.cmd("evalsha")
            .arg("sha")
            .arg(1)
            .arg("orders:1")
            .arg("x");
        pipe.cmd("XREADGROUP")
            .arg("GROUP")
            .arg("g")
            .arg("c")
            .arg("COUNT")
            .arg(10)
            .arg("streams")
            .arg("orders:1")
            .arg(">");
        pipe.cmd("EVAL").arg("return 1").arg(0);
        assert_eq!(
            slot_groups(&pipe),
            [(Some(slot_of(b"orders:1")), vec![0, 1, 2])]
        );
        // Known slots (CLUSTER KEYSLOT), and hash tags keep a group's keys in one slot.
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"{user1000}.following"), slot_of(b"user1000"));
        assert_eq!(slot_of(b"foo{}{bar}"), slot_of(b"foo{}{bar}"));
        assert_ne!(slot_of(b"foo{}{bar}"), slot_of(b"bar"));
        assert_eq!(
            slot_of(b"sl:{orders/g}:meta"),
            slot_of(b"sl:{orders/g}:leases")
        );
    }
}
