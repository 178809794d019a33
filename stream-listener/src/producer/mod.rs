//! Publishing to a sharded stream.
//!
//! A [`Producer`] routes each message by its partition key to one shard (see [`crate::routing`]), so all
//! messages of one key stay in order in one shard stream, and appends it with
//!
//! ```text
//! XADD <prefix>:<shard> NOMKSTREAM [MAXLEN ~ <cap_unread>] * k <key> p <payload>
//! ```
//!
//! # Trimming
//!
//! By default the producer never trims: an entry stays in its shard stream until every consumer group of
//! the stream has acknowledged it, and then the shard's owner trims it (the consumers' retention job, see
//! [`Retention`](crate::consumer::Retention)), so memory is bounded by what the groups have not
//! acknowledged yet. [`ProducerConfig::cap_unread`] is an opt-in hard cap (`MAXLEN ~ n`) for streams that
//! must not grow past a size even when a group stops reading: it drops the oldest entries whether or not
//! every group has read them, and consumers count what a group lost that way (metric
//! `stream_listener_trimmed_unread_total`, a WARN, the CLI's `status`).
//!
//! When Redis is out of memory (`maxmemory` with the policy `noeviction`) a write fails with
//! [`ProducerError::OutOfMemory`]: retry once the consumers caught up. A batch in which a key repeats
//! is one transaction (on a cluster, one per shard), refused whole, so a retry keeps each key's
//! messages in order; of a batch of distinct keys Redis may have taken some, and a retry writes those
//! again (at-least-once).
//!
//! # Durability
//!
//! Redis replicates asynchronously: a master that acknowledged a write and died (or was failed over)
//! before a replica had it loses it, and a successful send with it. [`ProducerConfig::min_replicas`]
//! makes a send succeed only once that many replicas of the shard's master have the write (`WAIT`, in the
//! same pipeline, on the connection that wrote), as Kafka's `acks=all`: a failover then loses nothing a
//! send reported. While the replicas are missing (a promoted master without a replica yet) sends fail
//! with [`ProducerError::NotReplicated`], and resending them is at-least-once. The wait costs a round
//! trip to the replica per write: back-to-back batches of 100 went from about 298,000 to 165,000 entries
//! a second on one machine, as fast as raw pipelines that end in `WAIT 1` (`--bench producer`).
//!
//! # Entry layout
//!
//! Every entry has these fields (the first two the same for the spec's JVM and Python clients, which do not
//! write the third; consumers accept entries without it):
//!
//! | field | value |
//! | --- | --- |
//! | `k` | the partition key, as given (UTF-8 for string keys, raw bytes otherwise) |
//! | `p` | the payload bytes: JSON for [`Producer::send`], anything for [`Producer::send_bytes`] |
//! | `v` | the topology version the entry was routed with (decimal), once the stream has been resized |
//! | `sl_headers` | the message's [`Headers`] as a JSON object of strings, only when it has any (see [`crate::headers`]) |
//!
//! Consumers recompute the shard from `k` to detect a misrouted entry, and compare `v` with their topology
//! to detect a write routed with a stale layout after a resize's grace period
//! ([`Topology::is_stale_write`]). A stream that was never resized is at version 1, where no layout can be
//! stale, so its entries leave `v` out and cost what a hand-written `XADD` of `k` and `p` costs.
//!
//! Headers are set with [`Producer::send_with_headers`] and the other `*_with_headers` methods. With
//! the feature `opentelemetry`, every send also puts the current span's W3C trace context
//! (`traceparent`, and `tracestate` when not empty) into the headers, unless they carry a `traceparent`
//! already, so that the consumer's span continues the producer's trace.
//!
//! # Topology
//!
//! The shard count comes from the stream's topology record ([`Topology`]), which must exist: publishing to a
//! stream without one is [`TopologyError::Missing`]. The producer caches the topology, re-reads it at most
//! every [`ProducerConfig::refresh_interval`] to notice a resize (version change), and at once when a write
//! finds its shard stream missing (`XADD … NOMKSTREAM` answers nil) or frozen (the stream refuses new
//! ids: a shard a shrink removed, past its cut); after a refresh the affected messages
//! are routed again and resent once. A producer that misses a shrink therefore never writes where nobody
//! reads: its write fails over to the new layout, or fails loudly.
//!
//! # Redis Cluster
//!
//! On a cluster a batch goes out as one part per shard (each of one slot). A part in which a key
//! repeats is one `MULTI`/`EXEC` transaction, written whole or not at all (an `OOM` while queued refuses
//! all of it), so a batch sent again after a failure never writes a key's messages out of order, and a
//! slot migration never writes one twice. A part of distinct keys is plain XADDs: distinct keys have no
//! order between them to keep, and a transaction costs Redis and the client a reply per XADD more.
//! On a single node the same holds for the whole batch: a transaction when a key repeats.
//!
//! A producer made with [`Producer::connect`] (or its variants, or [`Producer::connect_to`]) keeps a
//! connection to each master (named [`MASTERS_CLIENT_NAME`] in `CLIENT LIST`) and sends the parts of
//! one master in one pipeline on it: what a master refused because its slot moved was not written and
//! is sent again through the cluster connection, which follows the move. [`Producer::new`] over a
//! connection sends each shard's part through it, at once, as a transaction when it has more than one
//! XADD. See the `cluster` module.

mod cluster;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use redis::{RedisError, Value};
use serde::Serialize;

use crate::headers::Headers;
use crate::tls::TlsFiles;
use crate::topology::{Topology, TopologyError};

/// Entry field holding the partition key ([`crate::names::field::KEY`]).
pub const KEY_FIELD: &str = crate::names::field::KEY;
/// Entry field holding the payload bytes ([`crate::names::field::PAYLOAD`]).
pub const PAYLOAD_FIELD: &str = crate::names::field::PAYLOAD;
/// Entry field holding the topology version the entry was routed with ([`crate::names::field::VERSION`]).
pub const VERSION_FIELD: &str = crate::names::field::VERSION;
/// Entry field holding the headers ([`crate::names::field::HEADERS`]).
pub const HEADERS_FIELD: &str = crate::names::field::HEADERS;

/// The `CLIENT SETNAME` of a producer's connections to a cluster's masters (see the module docs).
pub const MASTERS_CLIENT_NAME: &str = "stream-listener-producer";

/// Errors from publishing.
#[derive(thiserror::Error, stream_listener_macros::ReportDebug)]
#[non_exhaustive]
pub enum ProducerError {
    /// The stream's topology is missing, corrupt, or could not be read.
    #[error(transparent)]
    Topology(#[from] TopologyError),
    /// A shard stream does not exist (or is retired) even after refreshing the topology (it was deleted,
    /// the topology was created without [`Topology::ensure`], or this producer routes with a layout no
    /// consumer reads). Earlier messages of the same batch may have been written.
    #[error(
        "shard stream `{stream}` does not exist (topology version {version}); run Topology::ensure or \
         Topology::ensure_group for this stream"
    )]
    MissingShardStream {
        /// The missing Redis stream key.
        stream: String,
        /// The topology version the message was routed with.
        version: u64,
    },
    /// The payload could not be serialized to JSON.
    #[error("could not serialize payload to JSON: {0}")]
    Serialize(#[from] serde_json::Error),
    /// A Redis command failed. Some messages of a batch may have been written: resending is at-least-once.
    #[error("redis error: {0}")]
    Redis(#[from] RedisError),
    /// The TLS files of [`Producer::connect_with_tls`] cannot be used; names the file.
    #[error("TLS: {0}")]
    Tls(#[from] crate::tls::TlsError),
    /// The URL given to [`Producer::connect`] (or its variants) does not parse; names it, redacted.
    #[error(transparent)]
    InvalidUrl(#[from] crate::connection::InvalidUrl),
    /// Redis refused the connection for a reason retrying would not change (a wrong password, an ACL
    /// user without a command, a database index out of range, a refused certificate, a server too old).
    #[error(transparent)]
    Refused(#[from] crate::preflight::Refused),
    /// [`Producer::send_fields`] was given a field the library writes itself (`k`, `v` or
    /// `sl_headers`).
    #[error(
        "field `{0}` is reserved (the partition key `k`, the topology version `v` and the headers \
         `sl_headers`)"
    )]
    ReservedField(String),
    /// Redis refused the write because it is out of memory (`OOM command not allowed when used memory >
    /// 'maxmemory'`): nothing was written to `stream`. Entries leave Redis only once every group
    /// acknowledged them (or through [`ProducerConfig::cap_unread`]): a group that stopped or fell
    /// behind keeps them. Earlier messages of the same batch may have been written.
    #[error(
        "Redis is out of memory (maxmemory reached): the write to `{stream}` was refused and nothing was \
         written; acknowledged entries are trimmed by the consumers, so a consumer group that stopped or \
         lags holds the memory (see `stream-listener status`), or raise maxmemory: {error}"
    )]
    OutOfMemory {
        /// The stream written to.
        stream: String,
        /// Redis's error.
        error: RedisError,
    },
    /// The write is on `stream`'s master, but fewer replicas than
    /// [`ProducerConfig::min_replicas`] acknowledged it within [`ProducerConfig::replica_timeout`] (a
    /// replica down or lagging): a failover now could lose it. Resending is at-least-once.
    #[error(
        "the write to `{stream}` was acknowledged by {acknowledged} of the {wanted} replicas asked for \
         within the timeout: it is on the master, and a failover could lose it"
    )]
    NotReplicated {
        /// The stream written to (the first such of a batch).
        stream: String,
        /// Replicas that acknowledged the write.
        acknowledged: u32,
        /// [`ProducerConfig::min_replicas`].
        wanted: u32,
    },
    /// Redis answered XADD with something other than an entry id or nil.
    #[error("unexpected reply to XADD on `{stream}`: {reply:?}")]
    UnexpectedReply {
        /// The stream written to.
        stream: String,
        /// The reply received.
        reply: Value,
    },
}

/// Producer settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerConfig {
    /// An approximate cap on each shard stream's length (`MAXLEN ~ n`) that **drops entries consumer
    /// groups have not read yet** once a stream is longer. `None` (the default) never trims: acknowledged
    /// entries are trimmed by the consumers' retention job instead (see the module docs), and nothing a
    /// group has not acknowledged is ever removed.
    ///
    /// Set it only where a bounded stream matters more than at-least-once delivery (a group that stops
    /// reading would otherwise keep every entry, until Redis runs out of memory). Entries a group lost to
    /// it are counted per group by the consumers (metric `stream_listener_trimmed_unread_total`, a WARN,
    /// the CLI's `status`).
    pub cap_unread: Option<u64>,
    /// How often the cached topology is re-read to notice a resize. A missing shard stream triggers a
    /// re-read at once regardless.
    pub refresh_interval: Duration,
    /// How many replicas of the shard's master must have each write before a send succeeds (`WAIT`, in
    /// the write's own pipeline). Replication is asynchronous: a master that acknowledged a write and died
    /// before any replica had it loses it in the failover, so with the default `0` a successful send can
    /// still be lost to a failover. With `1` (and a replica per master), a write a send reported is on the
    /// replica the failover promotes. A write the replicas did not acknowledge within
    /// [`replica_timeout`](Self::replica_timeout) fails the send with [`ProducerError::NotReplicated`]:
    /// it is on the master, so resending is at-least-once.
    pub min_replicas: u32,
    /// How long a send waits for [`min_replicas`](Self::min_replicas) at most.
    pub replica_timeout: Duration,
}

impl Default for ProducerConfig {
    fn default() -> Self {
        ProducerConfig {
            cap_unread: None,
            refresh_interval: Duration::from_secs(1),
            min_replicas: 0,
            replica_timeout: Duration::from_secs(1),
        }
    }
}

/// Where a message was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendReceipt {
    /// The shard index.
    pub shard: u32,
    /// The shard stream key, `<prefix>:<shard>`.
    pub stream: String,
    /// The stream entry id Redis assigned.
    pub id: String,
    /// The topology version the message was routed with.
    pub topology_version: u64,
}

#[derive(Debug)]
struct Cached {
    topology: Topology,
    checked_at: Instant,
}

/// Publishes messages to one sharded stream. Cheap to clone; clones share the connection and topology cache.
///
/// `C` is any async Redis connection that is cheap to clone: [`Connection`](crate::connection::Connection) (the
/// default, which reconnects, on one node or a cluster), [`redis::aio::ConnectionManager`],
/// [`redis::aio::MultiplexedConnection`] or [`redis::cluster_async::ClusterConnection`]. On a cluster
/// (`Connection::Cluster` or a `ClusterConnection`) a batch goes out as one pipeline per shard, at once;
/// elsewhere as one pipeline.
#[derive(Clone)]
pub struct Producer<C = crate::connection::Connection> {
    conn: C,
    prefix: Arc<str>,
    config: ProducerConfig,
    cache: Arc<Mutex<Cached>>,
    /// On a cluster reached through [`connect`](Producer::connect) (or its variants): a connection per
    /// master, for a batch's parts of one master in one pipeline (see the `cluster` module).
    masters: Option<Arc<crate::connection::Masters>>,
}

impl<C> std::fmt::Debug for Producer<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer")
            .field("prefix", &self.prefix)
            .field("config", &self.config)
            .field("topology", &self.lock().topology)
            .finish_non_exhaustive()
    }
}

/// One message prepared for XADD.
struct Outgoing<'a> {
    key: &'a [u8],
    body: Body<'a>,
    /// The `sl_headers` field's value; `None` writes no field.
    headers: Option<String>,
}

impl<'a> Outgoing<'a> {
    fn new(key: &'a [u8], body: Body<'a>, headers: Option<&Headers>) -> Self {
        #[cfg(feature = "opentelemetry")]
        let headers = {
            let mut headers = headers.cloned().unwrap_or_default();
            crate::otel::inject(&mut headers);
            Some(headers)
        };
        #[cfg(feature = "opentelemetry")]
        let headers = headers.as_ref();
        Self {
            key,
            body,
            headers: headers.filter(|h| !h.is_empty()).map(Headers::encode),
        }
    }
}

/// What an entry carries besides its key and version.
enum Body<'a> {
    /// The library's layout: one payload field `p`.
    Payload(std::borrow::Cow<'a, [u8]>),
    /// A field map, as the spec's JVM and Python producers write (no `p`).
    Fields(Vec<(&'a [u8], &'a [u8])>),
}

impl<C> Producer<C> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Cached> {
        // The cache holds plain data, so a panic elsewhere cannot leave it half-updated.
        self.cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Producer<crate::connection::Connection> {
    /// Connects to the Redis at `url` (reconnecting on failure) and loads the topology of `stream`, which
    /// must exist: a listener with a `shard_count`, [`Topology::ensure`], or
    /// [`connect_creating`](Self::connect_creating) creates it. A `redis+cluster://host:port,...` URL
    /// connects to a Redis Cluster (see [`RedisTarget::open`](crate::connection::RedisTarget::open)).
    pub async fn connect(url: &str, stream: &str) -> Result<Self, ProducerError> {
        Self::connect_with_tls(url, stream, &TlsFiles::default()).await
    }

    /// [`connect`](Self::connect) with settings other than the defaults (for example
    /// [`ProducerConfig::min_replicas`]).
    pub async fn connect_with_config(
        url: &str,
        stream: &str,
        config: ProducerConfig,
    ) -> Result<Self, ProducerError> {
        let target = checked_target(url, &TlsFiles::default()).await?;
        Self::connect_to(&target, stream, None, config).await
    }

    /// [`connect`](Self::connect) to a `rediss://` or `rediss+cluster://` URL with these TLS files (a CA
    /// to trust, a client certificate: see [`TlsFiles`], [`TlsFiles::from_env`]). A file that cannot be
    /// used is [`ProducerError::Tls`], naming it.
    pub async fn connect_with_tls(
        url: &str,
        stream: &str,
        tls: &TlsFiles,
    ) -> Result<Self, ProducerError> {
        let target = checked_target(url, tls).await?;
        Self::connect_to(&target, stream, None, ProducerConfig::default()).await
    }

    /// [`connect`](Self::connect), first creating the stream with `shard_count` shards if it has no
    /// topology yet (an existing stream keeps its count).
    pub async fn connect_creating(
        url: &str,
        stream: &str,
        shard_count: u32,
    ) -> Result<Self, ProducerError> {
        Self::connect_creating_with_tls(url, stream, shard_count, &TlsFiles::default()).await
    }

    /// [`connect_creating`](Self::connect_creating) with TLS files (see
    /// [`connect_with_tls`](Self::connect_with_tls)).
    pub async fn connect_creating_with_tls(
        url: &str,
        stream: &str,
        shard_count: u32,
        tls: &TlsFiles,
    ) -> Result<Self, ProducerError> {
        let target = checked_target(url, tls).await?;
        Self::connect_to(
            &target,
            stream,
            Some(shard_count),
            ProducerConfig::default(),
        )
        .await
    }

    /// Connects to `target` (a [`RedisTarget`](crate::connection::RedisTarget) made in code: cluster
    /// seeds, TLS certificates) and loads the topology of `stream`, first creating it with
    /// `create` shards if it has none and `create` is given. On a cluster the producer also keeps a
    /// connection to each master for its batches (see the module docs), which [`Producer::new`] over a
    /// connection cannot: it has no target to open them from.
    pub async fn connect_to(
        target: &crate::connection::RedisTarget,
        stream: &str,
        create: Option<u32>,
        config: ProducerConfig,
    ) -> Result<Self, ProducerError> {
        let options = crate::connection::ConnectOptions::default();
        let mut conn = target.connect(options).await?;
        if let Some(shard_count) = create {
            Topology::ensure(&mut conn, stream, shard_count).await?;
        }
        let mut producer = Self::with_config(conn, stream, config).await?;
        producer.masters =
            crate::connection::Masters::of(target, options, MASTERS_CLIENT_NAME).map(Arc::new);
        Ok(producer)
    }
}

/// The target of `url`, once the checks that would never pass passed.
async fn checked_target(
    url: &str,
    tls: &TlsFiles,
) -> Result<crate::connection::RedisTarget, ProducerError> {
    let target =
        crate::tls::open_target::<ProducerError>(url, "the url of Producer::connect", tls)?;
    // What will never pass fails at once, as the runtime's start does; anything else is left to the
    // connection's own retries.
    let url = crate::redact::RedisUrl::new(url);
    if let Err(crate::preflight::Failure::Permanent(refused)) =
        crate::preflight::check(&target, &url).await
    {
        return Err(refused.into());
    }
    Ok(target)
}

impl<C> Producer<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Creates a producer for the stream `prefix` with default settings, loading its topology.
    ///
    /// Fails with [`TopologyError::Missing`] if the stream has no topology.
    pub async fn new(conn: C, prefix: &str) -> Result<Self, ProducerError> {
        Self::with_config(conn, prefix, ProducerConfig::default()).await
    }

    /// Creates a producer for the stream `prefix` with `config`, loading its topology.
    pub async fn with_config(
        mut conn: C,
        prefix: &str,
        config: ProducerConfig,
    ) -> Result<Self, ProducerError> {
        let topology = Topology::load(&mut conn, prefix).await?;
        Ok(Producer {
            conn,
            prefix: prefix.into(),
            config,
            cache: Arc::new(Mutex::new(Cached {
                topology,
                checked_at: Instant::now(),
            })),
            masters: None,
        })
    }

    /// The stream prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The settings.
    pub fn config(&self) -> &ProducerConfig {
        &self.config
    }

    /// The cached topology.
    pub fn topology(&self) -> Topology {
        self.lock().topology.clone()
    }

    /// Re-reads the topology from Redis now and caches it.
    pub async fn refresh_topology(&self) -> Result<Topology, ProducerError> {
        let mut conn = self.conn.clone();
        let topology = Topology::load(&mut conn, &self.prefix).await?;
        let mut cached = self.lock();
        if cached.topology.version() != topology.version() {
            tracing::info!(
                stream = %self.prefix,
                from_version = cached.topology.version(),
                to_version = topology.version(),
                shard_count = topology.shard_count(),
                "producer picked up a new topology"
            );
        }
        cached.topology = topology.clone();
        cached.checked_at = Instant::now();
        Ok(topology)
    }

    /// Publishes `payload` as JSON under the partition key `key`.
    pub async fn send<K, T>(&self, key: K, payload: &T) -> Result<SendReceipt, ProducerError>
    where
        K: AsRef<[u8]>,
        T: Serialize + ?Sized,
    {
        let payload = serde_json::to_vec(payload)?;
        self.send_bytes(key, payload).await
    }

    /// [`send`](Self::send) with headers ([`Message::headers`](crate::Message::headers) on the
    /// consumer's side).
    pub async fn send_with_headers<K, T>(
        &self,
        key: K,
        payload: &T,
        headers: &Headers,
    ) -> Result<SendReceipt, ProducerError>
    where
        K: AsRef<[u8]>,
        T: Serialize + ?Sized,
    {
        let payload = serde_json::to_vec(payload)?;
        self.send_bytes_with_headers(key, payload, headers).await
    }

    /// [`send_bytes`](Self::send_bytes) with headers.
    pub async fn send_bytes_with_headers<K, P>(
        &self,
        key: K,
        payload: P,
        headers: &Headers,
    ) -> Result<SendReceipt, ProducerError>
    where
        K: AsRef<[u8]>,
        P: AsRef<[u8]>,
    {
        self.send_one(key.as_ref(), payload.as_ref(), Some(headers))
            .await
    }

    async fn send_one(
        &self,
        key: &[u8],
        payload: &[u8],
        headers: Option<&Headers>,
    ) -> Result<SendReceipt, ProducerError> {
        let messages = [Outgoing::new(
            key,
            Body::Payload(std::borrow::Cow::Borrowed(payload)),
            headers,
        )];
        let mut receipts = self.publish(&messages).await?;
        Ok(receipts.remove(0))
    }

    /// Publishes raw payload bytes under the partition key `key`.
    pub async fn send_bytes<K, P>(&self, key: K, payload: P) -> Result<SendReceipt, ProducerError>
    where
        K: AsRef<[u8]>,
        P: AsRef<[u8]>,
    {
        self.send_one(key.as_ref(), payload.as_ref(), None).await
    }

    /// Publishes a field map under the partition key `key`, the way the spec's JVM and Python producers
    /// write entries: the entry gets `k`, the given fields in order, `v` once the stream has been resized, and no `p` field. Consumers
    /// read it with a [`Fields`](crate::consumer::Fields) handler. The names `k`, `v` and `sl_headers`
    /// are reserved ([`ProducerError::ReservedField`]).
    pub async fn send_fields<K, N, V>(
        &self,
        key: K,
        fields: &[(N, V)],
    ) -> Result<SendReceipt, ProducerError>
    where
        K: AsRef<[u8]>,
        N: AsRef<[u8]>,
        V: AsRef<[u8]>,
    {
        let mut body = Vec::with_capacity(fields.len());
        for (name, value) in fields {
            let name = name.as_ref();
            if name == KEY_FIELD.as_bytes()
                || name == VERSION_FIELD.as_bytes()
                || name == HEADERS_FIELD.as_bytes()
            {
                return Err(ProducerError::ReservedField(
                    String::from_utf8_lossy(name).into_owned(),
                ));
            }
            body.push((name, value.as_ref()));
        }
        let messages = [Outgoing::new(key.as_ref(), Body::Fields(body), None)];
        let mut receipts = self.publish(&messages).await?;
        Ok(receipts.remove(0))
    }

    /// Publishes `(key, payload)` pairs as JSON in one pipeline (on a cluster one per shard, at once);
    /// receipts are in input order.
    pub async fn send_batch<K, T>(
        &self,
        messages: &[(K, T)],
    ) -> Result<Vec<SendReceipt>, ProducerError>
    where
        K: AsRef<[u8]>,
        T: Serialize,
    {
        let outgoing = messages
            .iter()
            .map(|(key, payload)| {
                Ok(Outgoing::new(
                    key.as_ref(),
                    Body::Payload(std::borrow::Cow::Owned(serde_json::to_vec(payload)?)),
                    None,
                ))
            })
            .collect::<Result<Vec<_>, serde_json::Error>>()?;
        self.publish(&outgoing).await
    }

    /// [`send_batch`](Self::send_batch) with each message's headers: `(key, payload, headers)`.
    pub async fn send_batch_with_headers<K, T>(
        &self,
        messages: &[(K, T, Headers)],
    ) -> Result<Vec<SendReceipt>, ProducerError>
    where
        K: AsRef<[u8]>,
        T: Serialize,
    {
        let outgoing = messages
            .iter()
            .map(|(key, payload, headers)| {
                Ok(Outgoing::new(
                    key.as_ref(),
                    Body::Payload(std::borrow::Cow::Owned(serde_json::to_vec(payload)?)),
                    Some(headers),
                ))
            })
            .collect::<Result<Vec<_>, serde_json::Error>>()?;
        self.publish(&outgoing).await
    }

    /// [`send_batch_bytes`](Self::send_batch_bytes) with each message's headers.
    pub async fn send_batch_bytes_with_headers<K, P>(
        &self,
        messages: &[(K, P, Headers)],
    ) -> Result<Vec<SendReceipt>, ProducerError>
    where
        K: AsRef<[u8]>,
        P: AsRef<[u8]>,
    {
        let outgoing: Vec<_> = messages
            .iter()
            .map(|(key, payload, headers)| {
                Outgoing::new(
                    key.as_ref(),
                    Body::Payload(std::borrow::Cow::Borrowed(payload.as_ref())),
                    Some(headers),
                )
            })
            .collect();
        self.publish(&outgoing).await
    }

    /// Publishes `(key, payload bytes)` pairs in one pipeline (on a cluster one per shard, at once);
    /// receipts are in input order.
    pub async fn send_batch_bytes<K, P>(
        &self,
        messages: &[(K, P)],
    ) -> Result<Vec<SendReceipt>, ProducerError>
    where
        K: AsRef<[u8]>,
        P: AsRef<[u8]>,
    {
        let outgoing: Vec<_> = messages
            .iter()
            .map(|(key, payload)| {
                Outgoing::new(
                    key.as_ref(),
                    Body::Payload(std::borrow::Cow::Borrowed(payload.as_ref())),
                    None,
                )
            })
            .collect();
        self.publish(&outgoing).await
    }

    /// The cached topology, re-read first if it is older than the refresh interval.
    async fn current_topology(&self) -> Result<Topology, ProducerError> {
        let stale = {
            let cached = self.lock();
            (cached.checked_at.elapsed() >= self.config.refresh_interval)
                .then(|| cached.topology.clone())
        };
        match stale {
            None => Ok(self.topology()),
            Some(_) => self.refresh_topology().await,
        }
    }

    async fn publish(&self, messages: &[Outgoing<'_>]) -> Result<Vec<SendReceipt>, ProducerError> {
        if messages.is_empty() {
            return Ok(Vec::new());
        }
        let mut receipts: Vec<Option<SendReceipt>> = vec![None; messages.len()];
        let mut pending: Vec<usize> = (0..messages.len()).collect();
        let mut topology = self.current_topology().await?;
        let mut refreshed = false;
        loop {
            let missing = self
                .write(&topology, messages, &pending, &mut receipts)
                .await?;
            let Some(&first_missing) = missing.first() else {
                break;
            };
            if refreshed {
                let shard = topology.shard_for_key(messages[first_missing].key);
                return Err(ProducerError::MissingShardStream {
                    stream: topology.stream_key(shard),
                    version: topology.version(),
                });
            }
            // A shard stream is missing: the topology may have changed under us. Re-read it and resend only
            // the messages that were not written, routed with the new topology.
            topology = self.refresh_topology().await?;
            refreshed = true;
            pending = missing;
        }
        Ok(receipts
            .into_iter()
            .map(|r| r.expect("every message written"))
            .collect())
    }

    /// XADDs `messages[i]` for each `i` in `indices`; returns the indices whose stream was missing (nil
    /// reply). One pipeline, one round trip; on a cluster one pipeline per shard, sent at once (see
    /// [`send_pipelines`](Self::send_pipelines)).
    async fn write(
        &self,
        topology: &Topology,
        messages: &[Outgoing<'_>],
        indices: &[usize],
        receipts: &mut [Option<SendReceipt>],
    ) -> Result<Vec<usize>, ProducerError> {
        let mut targets = Vec::with_capacity(indices.len());
        let shards: Vec<u32> = indices
            .iter()
            .map(|&i| topology.shard_for_key(messages[i].key))
            .collect();
        let mut pipelines = Pipelines::new(
            crate::connection::as_cluster(&self.conn).is_some(),
            topology.shard_count(),
            &shards,
        );
        // Each shard's key is formatted once per write, not once per message.
        let mut streams: Vec<Option<String>> = vec![None; topology.shard_count() as usize];
        // The keys seen so far: a key met again makes its shard's part a transaction.
        let mut keys: HashSet<&[u8]> =
            HashSet::with_capacity(if indices.len() > 1 { indices.len() } else { 0 });
        for (&i, &shard) in indices.iter().zip(&shards) {
            let message = &messages[i];
            let stream = streams[shard as usize]
                .get_or_insert_with(|| topology.stream_key(shard))
                .clone();
            let cmd = xadd(self.config.cap_unread, topology.version(), &stream, message);
            let repeated = indices.len() > 1 && !keys.insert(message.key);
            pipelines.add(shard, &stream, cmd, repeated);
            targets.push((i, shard, stream));
        }
        let (replies, short) = self.send_pipelines(pipelines).await?;
        let short = short.map(|(position, n)| (targets[position].2.clone(), n));
        let mut missing = Vec::new();
        for ((i, shard, stream), reply) in targets.into_iter().zip(replies) {
            match reply {
                // Missing, or frozen: a shard a shrink removed, past its cut.
                Value::Nil => missing.push(i),
                Value::ServerError(error)
                    if error
                        .details()
                        .is_some_and(|d| d.contains("exhausted the last possible ID")) =>
                {
                    missing.push(i)
                }
                Value::ServerError(error) if error.code() == "OOM" => {
                    return Err(ProducerError::OutOfMemory {
                        stream,
                        error: error.into(),
                    })
                }
                Value::ServerError(error) => return Err(ProducerError::Redis(error.into())),
                Value::BulkString(bytes) => {
                    // An id is ASCII: take the reply's buffer rather than copying it.
                    let id = String::from_utf8(bytes)
                        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
                    receipts[i] = Some(SendReceipt {
                        shard,
                        stream,
                        id,
                        topology_version: topology.version(),
                    });
                }
                Value::SimpleString(id) => {
                    receipts[i] = Some(SendReceipt {
                        shard,
                        stream,
                        id,
                        topology_version: topology.version(),
                    });
                }
                reply => return Err(ProducerError::UnexpectedReply { stream, reply }),
            }
        }
        if let Some((stream, acknowledged)) = short {
            return Err(ProducerError::NotReplicated {
                stream,
                acknowledged,
                wanted: self.config.min_replicas,
            });
        }
        Ok(missing)
    }
}

/// `XADD <stream> NOMKSTREAM [MAXLEN ~ cap] * k <key> (p <payload> | fields..) [v <version>]
/// [sl_headers <headers>]`, its buffers sized up front ([`xadd_capacity`]): grown argument by argument
/// they would be reallocated several times per entry.
fn xadd(cap_unread: Option<u64>, version: u64, stream: &str, message: &Outgoing<'_>) -> redis::Cmd {
    let (args, bytes) = xadd_capacity(cap_unread, version, stream, message);
    let mut cmd = redis::Cmd::with_capacity(args, bytes);
    cmd.arg("XADD").arg(stream).arg("NOMKSTREAM");
    if let Some(cap) = cap_unread {
        cmd.arg("MAXLEN").arg("~").arg(cap);
    }
    cmd.arg("*").arg(KEY_FIELD).arg(message.key);
    match &message.body {
        Body::Payload(payload) => {
            cmd.arg(PAYLOAD_FIELD).arg(payload.as_ref());
        }
        Body::Fields(fields) => {
            for (name, value) in fields {
                cmd.arg(*name).arg(*value);
            }
        }
    }
    if version > 1 {
        cmd.arg(VERSION_FIELD).arg(version);
    }
    if let Some(headers) = &message.headers {
        cmd.arg(HEADERS_FIELD).arg(headers);
    }
    cmd
}

/// How many arguments and bytes of arguments [`xadd`] writes, at most.
fn xadd_capacity(
    cap_unread: Option<u64>,
    version: u64,
    stream: &str,
    message: &Outgoing<'_>,
) -> (usize, usize) {
    // `XADD`, `NOMKSTREAM`, `*`: 15 bytes; `MAXLEN ~`: 7; numbers at their widest, 20 digits.
    let (mut args, mut bytes) = (6, 15 + stream.len() + KEY_FIELD.len() + message.key.len());
    if cap_unread.is_some() {
        (args, bytes) = (args + 3, bytes + 7 + 20);
    }
    match &message.body {
        Body::Payload(payload) => {
            (args, bytes) = (args + 2, bytes + PAYLOAD_FIELD.len() + payload.len())
        }
        Body::Fields(fields) => {
            args += 2 * fields.len();
            bytes += fields.iter().map(|(n, v)| n.len() + v.len()).sum::<usize>();
        }
    }
    if version > 1 {
        (args, bytes) = (args + 2, bytes + VERSION_FIELD.len() + 20);
    }
    if let Some(headers) = &message.headers {
        (args, bytes) = (args + 2, bytes + HEADERS_FIELD.len() + headers.len());
    }
    (args, bytes)
}

/// The XADDs of one write: one pipeline, or on a cluster one part per shard, each of one slot, so that
/// none is split (each command copied) again by the connection.
///
/// Where a key repeats (in the write, on one node; in a shard's part, on a cluster) the XADDs go as one
/// `MULTI`/`EXEC` transaction: written whole or not at all, so that a command refused in the middle
/// (`OOM`, `BUSY`) cannot be followed by a later XADD of the same key that Redis accepted once memory
/// was freed, which would put the key's messages out of order when the batch is sent again. XADDs of
/// distinct keys have no order to keep and go as plain commands: a transaction costs Redis and the
/// client a reply per command more.
enum Pipelines {
    One {
        cmds: Vec<redis::Cmd>,
        /// Some key is in the write more than once.
        repeats: bool,
    },
    PerShard {
        /// Where each shard's part is in `parts`.
        part_of: Vec<Option<usize>>,
        /// How many XADDs each shard's part gets.
        sizes: Vec<usize>,
        parts: Vec<cluster::Part>,
        len: usize,
    },
}

impl Pipelines {
    /// For the XADDs to `shards`, in order: each part is sized up front, as a part grown command by
    /// command would move its commands several times.
    fn new(per_shard: bool, shard_count: u32, shards: &[u32]) -> Self {
        if per_shard {
            let mut sizes = vec![0; shard_count as usize];
            for &shard in shards {
                sizes[shard as usize] += 1;
            }
            Self::PerShard {
                part_of: vec![None; shard_count as usize],
                sizes,
                parts: Vec::new(),
                len: 0,
            }
        } else {
            Self::One {
                cmds: Vec::with_capacity(shards.len()),
                repeats: false,
            }
        }
    }

    /// Adds the next XADD, to `stream` of `shard`; `repeated` if its key was in the write already.
    fn add(&mut self, shard: u32, stream: &str, cmd: redis::Cmd, repeated: bool) {
        match self {
            Self::One { cmds, repeats } => {
                cmds.push(cmd);
                *repeats |= repeated;
            }
            Self::PerShard {
                part_of,
                sizes,
                parts,
                len,
            } => {
                let part = *part_of[shard as usize].get_or_insert_with(|| {
                    let size = sizes[shard as usize];
                    parts.push(cluster::Part {
                        slot: crate::connection::slot_of(stream.as_bytes()),
                        cmds: Vec::with_capacity(size),
                        positions: Vec::with_capacity(size),
                        repeats: false,
                    });
                    parts.len() - 1
                });
                let part = &mut parts[part];
                part.cmds.push(cmd);
                part.positions.push(*len);
                // A key is always in the same shard: met again, it is in this part.
                part.repeats |= repeated;
                *len += 1;
            }
        }
    }
}

/// Moves `cmds` into `pipe`, as a transaction when `transaction`.
fn write_into(pipe: &mut redis::Pipeline, cmds: Vec<redis::Cmd>, transaction: bool) {
    if transaction {
        pipe.cmd("MULTI");
    }
    for cmd in cmds {
        pipe.add_command(cmd);
    }
    if transaction {
        pipe.cmd("EXEC");
    }
}

/// The per-command replies of a transaction (`MULTI`, its XADDs, `EXEC`: every reply, in order). A
/// command refused while queued (`OOM`, `MOVED`) aborts the transaction, as does an `EXEC` refused for
/// the layout: nothing was written, and each command answers with that refusal.
fn exec_replies(replies: Vec<Value>) -> Vec<Value> {
    let n = replies.len().saturating_sub(2);
    let mut replies = replies.into_iter();
    let refusal = replies
        .by_ref()
        .skip(1)
        .take(n)
        .fold(None, |refusal, queued| {
            refusal.or_else(|| matches!(queued, Value::ServerError(_)).then_some(queued))
        });
    match replies.next() {
        Some(Value::Array(executed)) if executed.len() == n => executed,
        exec => vec![refusal.or(exec).unwrap_or(Value::Nil); n],
    }
}

impl<C> Producer<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Sends a write's pipelines and returns the replies in the order the XADDs were added.
    /// Per-command errors come back in place, so a frozen shard fails only its own messages. On a
    /// cluster, the parts go out at once (see the `cluster` module); if one fails as a whole (its node
    /// unreachable), that is the write's error, as when the connection split one pipeline, though the
    /// other parts may have been written.
    ///
    /// With [`ProducerConfig::min_replicas`], each pipeline ends with `WAIT` (on the connection that
    /// wrote, which is what `WAIT` counts): the second value is the position of the first XADD of a
    /// pipeline fewer replicas acknowledged, and how many did.
    async fn send_pipelines(&self, pipelines: Pipelines) -> Result<Replies, ProducerError> {
        let wanted = self.config.min_replicas;
        let wait = (wanted > 0).then(|| {
            let mut wait = redis::cmd("WAIT");
            let ms = u64::try_from(self.config.replica_timeout.as_millis()).unwrap_or(u64::MAX);
            // `WAIT n 0` blocks for ever.
            wait.arg(wanted).arg(ms.max(1));
            wait
        });
        match pipelines {
            Pipelines::One { cmds, repeats } => {
                let mut pipe = redis::Pipeline::with_capacity(cmds.len() + 3);
                write_into(&mut pipe, cmds, repeats);
                pipe.ignore_errors();
                if let Some(wait) = &wait {
                    pipe.add_command(wait.clone());
                }
                let mut conn = self.conn.clone();
                let mut replies: Vec<Value> = pipe.query_async(&mut conn).await?;
                let short = match &wait {
                    Some(_) => replicas_short(replies.pop(), wanted)?.map(|n| (0, n)),
                    None => None,
                };
                let replies = if repeats {
                    exec_replies(replies)
                } else {
                    replies
                };
                Ok((replies, short))
            }
            Pipelines::PerShard { parts, len, .. } => {
                let conn = crate::connection::as_cluster(&self.conn)
                    .expect("per-shard pipelines only on a cluster");
                cluster::send(
                    conn,
                    self.masters.as_deref(),
                    parts,
                    len,
                    wait.as_ref(),
                    wanted,
                )
                .await
            }
        }
    }
}

/// The XADDs' replies in the order they were added, and where the replicas fell short (see
/// `send_pipelines`).
type Replies = (Vec<Value>, Option<(usize, u32)>);

/// How many replicas acknowledged, if fewer than `wanted`, from `WAIT`'s reply.
fn replicas_short(reply: Option<Value>, wanted: u32) -> Result<Option<u32>, ProducerError> {
    match reply {
        Some(Value::Int(n)) => {
            let n = u32::try_from(n.max(0)).unwrap_or(u32::MAX);
            Ok((n < wanted).then_some(n))
        }
        Some(Value::ServerError(error)) => Err(ProducerError::Redis(error.into())),
        reply => Err(ProducerError::UnexpectedReply {
            stream: "WAIT".into(),
            reply: reply.unwrap_or(Value::Nil),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rule of `Pipelines`: a repeated key makes its own shard's part a transaction, and no other;
    /// on one node, the whole write.
    #[test]
    fn rule_a_part_is_a_transaction_only_where_a_key_repeats() {
        let xadd = || redis::cmd("XADD");
        let mut per_shard = Pipelines::new(true, 3, &[0, 1, 0, 1, 2]);
        per_shard.add(0, "s:0", xadd(), false);
        per_shard.add(1, "s:1", xadd(), false);
        per_shard.add(0, "s:0", xadd(), false);
        per_shard.add(1, "s:1", xadd(), true);
        per_shard.add(2, "s:2", xadd(), false);
        let Pipelines::PerShard { parts, len, .. } = per_shard else {
            unreachable!()
        };
        let repeats: Vec<(usize, bool)> = parts.iter().map(|p| (p.cmds.len(), p.repeats)).collect();
        assert_eq!(repeats, [(2, false), (2, true), (1, false)]);
        assert_eq!(parts[1].positions, [1, 3]);
        assert_eq!(len, 5);
        let mut one = Pipelines::new(false, 3, &[0, 1, 1]);
        one.add(0, "s:0", xadd(), false);
        one.add(1, "s:1", xadd(), false);
        assert!(matches!(one, Pipelines::One { repeats: false, .. }));
        one.add(1, "s:1", xadd(), true);
        assert!(matches!(one, Pipelines::One { repeats: true, .. }));
    }

    #[test]
    fn a_transactions_replies_are_its_commands_or_the_refusal_of_all() {
        let ok = || Value::Okay;
        let queued = || Value::SimpleString("QUEUED".into());
        let id = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let executed = vec![
            ok(),
            queued(),
            queued(),
            Value::Array(vec![id("1-0"), Value::Nil]),
        ];
        assert_eq!(exec_replies(executed), vec![id("1-0"), Value::Nil]);
        let error =
            |text: &str| redis::parse_redis_value(format!("-{text}\r\n").as_bytes()).unwrap();
        let oom = error("OOM command not allowed");
        let exec_abort = error("EXECABORT Transaction discarded");
        assert!(matches!(oom, Value::ServerError(_)));
        let refused = vec![ok(), queued(), oom.clone(), exec_abort.clone()];
        assert_eq!(exec_replies(refused), vec![oom.clone(), oom]);
        // An EXEC that failed without a queued refusal: each command gets EXEC's answer.
        assert_eq!(
            exec_replies(vec![ok(), queued(), exec_abort.clone()]),
            vec![exec_abort]
        );
        // An EXEC refused for the layout (the slot moved between the queueing and EXEC).
        let moved = error("MOVED 3999 127.0.0.1:7001");
        assert_eq!(
            exec_replies(vec![ok(), queued(), queued(), moved.clone()]),
            vec![moved.clone(), moved]
        );
    }

    #[test]
    fn an_xadd_fits_the_buffers_sized_for_it() {
        let headers = Headers::from_iter([("tenant", "acme")]);
        let fields = [(b"name".as_slice(), b"value".as_slice()), (b"n2", b"")];
        for cap in [None, Some(u64::MAX)] {
            for version in [1, u64::MAX] {
                for message in [
                    Outgoing::new(b"key", Body::Payload(b"{}".as_slice().into()), None),
                    Outgoing::new(b"", Body::Payload(b"".as_slice().into()), Some(&headers)),
                    Outgoing::new(b"key", Body::Fields(fields.to_vec()), Some(&headers)),
                ] {
                    let cmd = xadd(cap, version, "orders:12", &message);
                    let written: Vec<&[u8]> = cmd
                        .args_iter()
                        .map(|arg| match arg {
                            redis::Arg::Simple(bytes) => bytes,
                            _ => panic!("only plain arguments"),
                        })
                        .collect();
                    let (args, bytes) = xadd_capacity(cap, version, "orders:12", &message);
                    assert!(written.len() <= args, "{written:?}");
                    assert!(
                        written.iter().map(|a| a.len()).sum::<usize>() <= bytes,
                        "{written:?}"
                    );
                }
            }
        }
    }
}
