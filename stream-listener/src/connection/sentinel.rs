//! Redis Sentinel (`redis+sentinel://`): the master of a named set, found through its sentinels, and a
//! connection that finds it again after a failover.
//!
//! redis-rs's `ConnectionManager` reconnects to the address it was made with, which after a failover is a
//! replica (writes fail with `READONLY`) or a dead process. [`SentinelConnection`] asks the sentinels
//! instead: a command that failed on the connection (an IO error, a timeout, the connection dropped,
//! `READONLY`) makes the next command discover the master and connect to it. Like the manager it never
//! sends a command twice: a read whose reply was lost reaches its caller as an error.
//!
//! Discovery asks one sentinel after the other (`SENTINEL GET-MASTER-ADDR-BY-NAME`), the one that
//! answered last first, and trusts an answer only when the named node says `ROLE` master: during a
//! failover a sentinel may still name the old master, which is being demoted.
//!
//! **Split brain.** After `SENTINEL FAILOVER` the old master stays a master, accepting writes that the
//! new one never sees, until a sentinel converts it into a replica (which throws those writes away and
//! kills its clients): about ten seconds, in which nothing above would notice. So every target also
//! subscribes to `+switch-master` on each of its sentinels (a frozen one must not hide the news), and
//! counts the switches to a master other than the one it knows ([`SentinelTarget::switches`]). A
//! connection made before the latest switch is replaced before its next command; the idle wait's
//! blocking connection and the wake-up subscription end on it too (`consumer::wait`, `store::wakeup`).
//! What is written to the old master between its replica's promotion and the announcement is lost with
//! it, as with any Redis client: that window is what a failover costs.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::watch;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{
    AsyncConnectionConfig, Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, IntoConnectionInfo,
    Pipeline, RedisError, RedisFuture, RedisResult, ServerErrorKind, Value,
};

use super::{invalid, ConnectOptions};

/// The URL scheme of a Sentinel-managed master:
/// `redis+sentinel://[user:password@]host:port,host:port/<master name>[/<db>]`.
pub const SENTINEL_SCHEME: &str = "redis+sentinel";

/// [`SENTINEL_SCHEME`] over TLS, to the sentinels and to the data nodes.
pub const SENTINEL_TLS_SCHEME: &str = "rediss+sentinel";

/// The port of a sentinel named without one.
pub const DEFAULT_SENTINEL_PORT: u16 = 26379;

/// How long one step of a discovery (asking a sentinel, checking the node it names) may take when the
/// connection has no timeout of its own: a frozen sentinel must not stall the others.
const DEFAULT_STEP_TIMEOUT: Duration = Duration::from_secs(1);

/// A master found through its sentinels.
#[derive(Clone)]
pub struct SentinelTarget {
    /// The master set's name (`sentinel monitor <name> ...`).
    master_name: String,
    /// The sentinels, each with the sentinels' credentials (`sentinel_username`, `sentinel_password`).
    sentinels: Vec<ConnectionInfo>,
    /// The data nodes' settings (TLS, database, credentials); the address is replaced by the master's.
    node: ConnectionInfo,
    /// The sentinel that answered last, asked first next time (shared by clones).
    preferred: Arc<AtomicUsize>,
    /// The master switches the sentinels announced (shared by clones).
    switches: Arc<Switches>,
}

/// The master switches announced on the sentinels' `+switch-master` channel, counted, and the tasks that
/// listen to it (one per sentinel, started with the first connection, ended when the last clone of the
/// target is dropped).
#[derive(Default)]
struct Switches {
    count: watch::Sender<u64>,
    /// The master last found or announced: an announcement of it again is no switch.
    master: Mutex<Option<(String, u16)>>,
    listeners: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl Switches {
    fn master(&self) -> std::sync::MutexGuard<'_, Option<(String, u16)>> {
        // Plain data, replaced whole: a panic elsewhere cannot leave it half-updated.
        self.master.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `addr` is the master now: counted as a switch if another one was known.
    fn announce(&self, addr: (String, u16)) {
        let mut master = self.master();
        if master.as_ref() != Some(&addr) {
            let switched = master.is_some();
            *master = Some(addr);
            if switched {
                self.count.send_modify(|count| *count += 1);
            }
        }
    }
}

impl Drop for Switches {
    fn drop(&mut self) {
        for listener in self
            .listeners
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
        {
            listener.abort();
        }
    }
}

impl fmt::Debug for SentinelTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Addresses only: the connection infos also hold the passwords.
        let addrs: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| s.addr().to_string())
            .collect();
        write!(f, "Sentinel({}/{})", addrs.join(","), self.master_name)
    }
}

impl SentinelTarget {
    /// Parses what follows `redis+sentinel://` (`tls`: `rediss+sentinel://`):
    /// `[user:password@]host[:port],host[:port]/<master name>[/<db>][?sentinel_username=..&sentinel_password=..]`.
    /// The user-info is the data nodes'; sentinels that require a password of their own take it from
    /// the query.
    pub(crate) fn parse(tls: bool, rest: &str) -> RedisResult<Self> {
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (userinfo, rest) = match rest.rfind('@') {
            Some(at) => (&rest[..=at], &rest[at + 1..]),
            None => ("", rest),
        };
        let (hosts, path) = rest.split_once('/').unwrap_or((rest, ""));
        let mut segments = path.split('/');
        let master_name = segments.next().unwrap_or("").to_owned();
        if master_name.is_empty() {
            return Err(invalid(
                "a sentinel URL names its master: redis+sentinel://host:port/<master name>",
            ));
        }
        let db = match segments.next() {
            None | Some("") => "0",
            Some(db) if db.parse::<u16>().is_ok() => db,
            Some(_) => {
                return Err(invalid(
                    "the database after the master name is not a number",
                ))
            }
        };
        if segments.next().is_some_and(|s| !s.is_empty()) {
            return Err(invalid("a sentinel URL's path is /<master name>[/<db>]"));
        }
        let (mut sentinel_user, mut sentinel_password) = ("", "");
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("sentinel_username", value)) => sentinel_user = value,
                Some(("sentinel_password", value)) => sentinel_password = value,
                _ => {
                    return Err(invalid(
                        "a sentinel URL takes only the query parameters sentinel_username and \
                         sentinel_password",
                    ))
                }
            }
        }
        let scheme = if tls { "rediss" } else { "redis" };
        let sentinel_userinfo = match (sentinel_user, sentinel_password) {
            ("", "") => String::new(),
            (user, password) => format!("{user}:{password}@"),
        };
        let sentinels = hosts
            .split(',')
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .map(|host| {
                let host = with_default_port(host);
                format!("{scheme}://{sentinel_userinfo}{host}").into_connection_info()
            })
            .collect::<RedisResult<Vec<_>>>()?;
        if sentinels.is_empty() {
            return Err(invalid("the sentinel URL names no sentinel"));
        }
        // The address is a placeholder: every connection replaces it with the master's.
        let node = format!("{scheme}://{userinfo}127.0.0.1:6379/{db}").into_connection_info()?;
        Ok(Self {
            master_name,
            sentinels,
            node,
            preferred: Arc::default(),
            switches: Arc::default(),
        })
    }

    /// How many times the sentinels announced a switch to another master since this target's first
    /// connection: a connection made when the count was lower may be to the old master.
    pub fn switches(&self) -> u64 {
        *self.switches.count.borrow()
    }

    /// A receiver that sees [`switches`](Self::switches) change.
    pub(crate) fn switch_receiver(&self) -> watch::Receiver<u64> {
        self.switches.count.subscribe()
    }

    /// Starts listening to `+switch-master` on every sentinel, once per target (and its clones).
    fn listen(&self) {
        let mut listeners = self
            .switches
            .listeners
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if !listeners.is_empty() {
            return;
        }
        for sentinel in &self.sentinels {
            listeners.push(tokio::spawn(listen_for_switches(
                sentinel.clone(),
                self.master_name.clone(),
                Arc::downgrade(&self.switches),
            )));
        }
    }

    /// The master set's name.
    pub fn master_name(&self) -> &str {
        &self.master_name
    }

    /// This target with `certificates` on every connection, to the sentinels and to the nodes.
    #[cfg(feature = "tls")]
    pub(crate) fn with_tls(self, certificates: redis::TlsCertificates) -> RedisResult<Self> {
        // A client built with certificates keeps them in its connection info.
        let with = |info: ConnectionInfo| {
            redis::Client::build_with_tls(info, certificates.clone())
                .map(|client| client.get_connection_info().clone())
        };
        Ok(Self {
            sentinels: self
                .sentinels
                .into_iter()
                .map(with)
                .collect::<RedisResult<_>>()?,
            node: with(self.node)?,
            ..self
        })
    }

    /// The database the nodes' connections select.
    pub(crate) fn db(&self) -> i64 {
        self.node.redis_settings().db()
    }

    /// Finds the master and connects to it with `config`. Each step (a sentinel's answer, the named node's
    /// connection and `ROLE`) gets the config's connection timeout, or [`DEFAULT_STEP_TIMEOUT`].
    ///
    /// Fails with `MasterNameNotFoundBySentinel` when every sentinel answered and none monitors the name
    /// (a wrong URL: retrying will not help), otherwise with an IO error naming what each sentinel said.
    pub(crate) async fn connect_master(
        &self,
        config: &AsyncConnectionConfig,
        step: Option<Duration>,
    ) -> RedisResult<(redis::Client, MultiplexedConnection)> {
        self.listen();
        let step = step.unwrap_or(DEFAULT_STEP_TIMEOUT);
        let count = self.sentinels.len();
        let first = self.preferred.load(Ordering::Relaxed) % count;
        let mut unknown = 0;
        let mut problems = Vec::new();
        for index in (0..count).map(|i| (first + i) % count) {
            // Asked first next time unless it helps now: an attempt cut short by its caller's timeout
            // while a frozen sentinel kept it waiting starts with another one.
            let _ = self.preferred.compare_exchange(
                index,
                (index + 1) % count,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            let sentinel = self.sentinels[index].addr().to_string();
            let (host, port) = match tokio::time::timeout(step, self.ask(index, step)).await {
                Ok(Ok(Some(addr))) => addr,
                Ok(Ok(None)) => {
                    unknown += 1;
                    problems.push(format!(
                        "sentinel {sentinel} monitors no master of that name"
                    ));
                    continue;
                }
                // A refused password or certificate will be refused again: say so, not "no master".
                Ok(Err(error)) if crate::preflight::classify(&error).is_some() => {
                    return Err(error)
                }
                Ok(Err(error)) => {
                    problems.push(format!("sentinel {sentinel}: {error}"));
                    continue;
                }
                Err(_) => {
                    problems.push(format!("sentinel {sentinel}: no answer within {step:?}"));
                    continue;
                }
            };
            let client = redis::Client::open(self.node_info(&host, port))?;
            match tokio::time::timeout(step, connect_if_master(&client, config)).await {
                Ok(Ok(Some(conn))) => {
                    self.preferred.store(index, Ordering::Relaxed);
                    self.switches.announce((host, port));
                    return Ok((client, conn));
                }
                Ok(Ok(None)) => problems.push(format!(
                    "{host}:{port}, named by sentinel {sentinel}, is not a master (a failover is under way)"
                )),
                // A refused password or database is the node's answer, not the sentinels' trouble.
                Ok(Err(error)) if crate::preflight::classify(&error).is_some() => return Err(error),
                Ok(Err(error)) => problems.push(format!("{host}:{port}: {error}")),
                Err(_) => problems.push(format!("{host}:{port}: no answer within {step:?}")),
            }
        }
        let detail = format!("master `{}`: {}", self.master_name, problems.join("; "));
        Err(if unknown == count {
            RedisError::from((
                ErrorKind::MasterNameNotFoundBySentinel,
                "no sentinel monitors the master named in the URL",
                detail,
            ))
        } else {
            RedisError::from(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                format!("no master found through the sentinels: {detail}"),
            ))
        })
    }

    /// The master's address as sentinel `index` sees it (`None`: it monitors no master of that name).
    async fn ask(&self, index: usize, step: Duration) -> RedisResult<Option<(String, u16)>> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(step))
            .set_response_timeout(Some(step));
        let mut conn = redis::Client::open(self.sentinels[index].clone())?
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(&self.master_name)
            .query_async(&mut conn)
            .await
    }

    /// The nodes' settings at `host:port`.
    fn node_info(&self, host: &str, port: u16) -> ConnectionInfo {
        let addr = match self.node.addr() {
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
            _ => ConnectionAddr::Tcp(host.to_owned(), port),
        };
        self.node.clone().set_addr(addr)
    }
}

/// The channels that announce a new master: `+promoted-slave` as soon as the chosen replica says it is
/// a master (the point of no return of a failover), `+switch-master` once the failover ended.
const SWITCH_CHANNELS: [&str; 2] = ["+promoted-slave", "+switch-master"];

/// The master's name and the new master's address in a message of [`SWITCH_CHANNELS`]:
/// `+switch-master`: `<name> <old ip> <old port> <new ip> <new port>`; `+promoted-slave`:
/// `slave <ip>:<port> <ip> <port> @ <name> <old ip> <old port>`.
fn new_master<'a>(channel: &str, text: &'a str) -> Option<(&'a str, &'a str, u16)> {
    let words: Vec<&str> = text.split(' ').collect();
    match (channel, &words[..]) {
        ("+switch-master", [name, _, _, host, port]) => Some((name, host, port.parse().ok()?)),
        ("+promoted-slave", ["slave", _, host, port, "@", name, _, _]) => {
            Some((name, host, port.parse().ok()?))
        }
        _ => None,
    }
}

/// Listens to [`SWITCH_CHANNELS`] on one sentinel for as long as the target lives, subscribing again
/// (with a backoff) whenever the subscription fails or ends.
async fn listen_for_switches(
    sentinel: ConnectionInfo,
    master_name: String,
    switches: Weak<Switches>,
) {
    let mut failures = 0u32;
    while switches.strong_count() > 0 {
        if let Ok(mut pubsub) = subscribe(&sentinel).await {
            failures = 0;
            let mut messages = pubsub.on_message();
            while let Some(message) = messages.next().await {
                let Ok(text) = message.get_payload::<String>() else {
                    continue;
                };
                let Some((name, host, port)) = new_master(message.get_channel_name(), &text) else {
                    continue;
                };
                let Some(switches) = switches.upgrade() else {
                    return;
                };
                if name == master_name {
                    tracing::info!(
                        target: "stream_listener::connection",
                        master = %name, new = %format!("{host}:{port}"),
                        "the sentinels switched the master; connections move to the new one"
                    );
                    switches.announce((host.to_owned(), port));
                }
            }
        }
        failures = failures.saturating_add(1);
        let backoff = crate::util::exponential_backoff(
            Duration::from_millis(100),
            failures,
            Duration::from_secs(2),
        );
        tokio::time::sleep(backoff).await;
    }
}

async fn subscribe(sentinel: &ConnectionInfo) -> RedisResult<redis::aio::PubSub> {
    let mut pubsub = redis::Client::open(sentinel.clone())?
        .get_async_pubsub()
        .await?;
    pubsub.subscribe(&SWITCH_CHANNELS[..]).await?;
    Ok(pubsub)
}

/// A connection to `client` if its node is a master (`ROLE`), `None` if it is not.
async fn connect_if_master(
    client: &redis::Client,
    config: &AsyncConnectionConfig,
) -> RedisResult<Option<MultiplexedConnection>> {
    let mut conn = client
        .get_multiplexed_async_connection_with_config(config)
        .await?;
    let role: redis::Role = redis::cmd("ROLE").query_async(&mut conn).await?;
    Ok(matches!(role, redis::Role::Primary { .. }).then_some(conn))
}

/// `host` with the sentinel port appended when it names none (`[::1]` and `h` get `:26379`).
fn with_default_port(host: &str) -> String {
    let has_port = match host.rfind(']') {
        Some(bracket) => host[bracket..].contains(':'),
        None => host.contains(':'),
    };
    if has_port {
        host.to_owned()
    } else {
        format!("{host}:{DEFAULT_SENTINEL_PORT}")
    }
}

/// A shared connection to the current master of a [`SentinelTarget`]. Clone it freely.
#[derive(Clone)]
pub struct SentinelConnection {
    shared: Arc<Shared>,
}

impl fmt::Debug for SentinelConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SentinelConnection({:?})", self.shared.target)
    }
}

struct Shared {
    target: SentinelTarget,
    config: AsyncConnectionConfig,
    step: Option<Duration>,
    current: Mutex<Current>,
    /// Held by the one command that discovers; the others wait for its outcome.
    discovering: tokio::sync::Mutex<()>,
    /// [`Current::generation`], for those who follow this connection's node ([`pinned`](SentinelConnection::pinned)).
    moves: watch::Sender<u64>,
}

#[derive(Default)]
struct Current {
    /// Bumped by every discovery, so a failure on an old connection does not drop a newer one.
    generation: u64,
    conn: Option<MultiplexedConnection>,
    /// The node `conn` is to.
    node: Option<redis::Client>,
    /// [`SentinelTarget::switches`] before `conn` was found: a later switch replaces it.
    switches: u64,
    /// The last discovery's error: commands that waited for it fail with it instead of trying again.
    failure: Option<RedisError>,
}

impl SentinelConnection {
    /// Discovers the master and connects to it.
    pub(crate) async fn connect(
        target: SentinelTarget,
        options: ConnectOptions,
    ) -> RedisResult<Self> {
        // redis-rs's timeouts unless given: without one, a frozen master would hold every command (and
        // the discovery of its successor) for good.
        let mut config = AsyncConnectionConfig::new();
        if let Some(timeout) = options.response_timeout {
            config = config.set_response_timeout(Some(timeout));
        }
        if let Some(timeout) = options.connection_timeout {
            config = config.set_connection_timeout(Some(timeout));
        }
        let conn = Self {
            shared: Arc::new(Shared {
                target,
                config,
                step: options.connection_timeout,
                current: Mutex::default(),
                discovering: tokio::sync::Mutex::new(()),
                moves: watch::Sender::new(0),
            }),
        };
        conn.current().await?;
        Ok(conn)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Current> {
        // Plain data, replaced whole: a panic elsewhere cannot leave it half-updated.
        self.shared
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The connection to the master, discovered first if there is none.
    async fn current(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        let switches = self.shared.target.switches();
        let seen = {
            let current = self.lock();
            match &current.conn {
                Some(conn) if current.switches >= switches => {
                    return Ok((current.generation, conn.clone()))
                }
                _ => {}
            }
            current.generation
        };
        let _discovering = self.shared.discovering.lock().await;
        {
            let current = self.lock();
            match (&current.conn, &current.failure) {
                (Some(conn), _) if current.switches >= switches => {
                    return Ok((current.generation, conn.clone()))
                }
                // A discovery ran and failed while this command waited: its answer is this one's too.
                (None, Some(error)) if current.generation != seen => return Err(error.clone()),
                _ => {}
            }
        }
        let found = self
            .shared
            .target
            .connect_master(&self.shared.config, self.shared.step)
            .await;
        let mut current = self.lock();
        current.generation += 1;
        self.shared.moves.send_replace(current.generation);
        match found {
            Ok((node, conn)) => {
                current.conn = Some(conn.clone());
                current.node = Some(node);
                current.switches = switches;
                current.failure = None;
                Ok((current.generation, conn))
            }
            Err(error) => {
                current.failure = Some(error.clone());
                current.node = None;
                Err(error)
            }
        }
    }

    /// A connection of its own (made with `config`) to the node this connection's commands go to now,
    /// with that node's generation. During a failover the old and the new master both answer for a while,
    /// and a discovery of its own could find the other one: a blocking read on a pinned connection sees
    /// what this connection's reads see, and [`moved`](Self::moved) says when that stops being so.
    pub(crate) async fn pinned(
        &self,
        config: &AsyncConnectionConfig,
    ) -> RedisResult<(MultiplexedConnection, u64)> {
        let (generation, _) = self.current().await?;
        let node = {
            let current = self.lock();
            current
                .node
                .clone()
                .filter(|_| current.generation == generation)
        };
        let node = node.ok_or_else(|| {
            RedisError::from((ErrorKind::Io, "the master moved while connecting to it"))
        })?;
        let conn = node
            .get_multiplexed_async_connection_with_config(config)
            .await?;
        Ok((conn, generation))
    }

    /// The generation of the node this connection's commands go to now.
    pub(crate) fn generation(&self) -> u64 {
        self.lock().generation
    }

    /// Resolves once this connection's commands go to a node found after generation `since`.
    pub(crate) async fn moved(&self, since: u64) {
        let mut moves = self.shared.moves.subscribe();
        if moves
            .wait_for(|generation| *generation > since)
            .await
            .is_err()
        {
            std::future::pending::<()>().await;
        }
    }

    /// Drops the connection of `generation` if `error` says it is broken or no longer the master's.
    fn failed(&self, generation: u64, error: &RedisError) {
        if breaks_connection(error) {
            let mut current = self.lock();
            if current.generation == generation {
                current.conn = None;
            }
        }
    }
}

/// Whether the connection that answered `error` must be replaced: it broke, timed out (the master may be
/// frozen, and a failover under way), or its node is no longer the master (`READONLY`).
fn breaks_connection(error: &RedisError) -> bool {
    error.is_io_error()
        || error.is_timeout()
        || error.is_connection_dropped()
        || error.is_unrecoverable_error()
        || error.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
}

/// The `READONLY` error among a pipeline's answers, if any.
fn read_only_answer(answers: &[Value]) -> Option<RedisError> {
    answers.iter().find_map(|answer| match answer {
        Value::ServerError(error) if error.kind() == Some(ServerErrorKind::ReadOnly) => {
            Some(RedisError::from(error.clone()))
        }
        _ => None,
    })
}

impl ConnectionLike for SentinelConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (generation, mut conn) = self.current().await?;
            let answer = conn.req_packed_command(cmd).await;
            match &answer {
                Err(error) => self.failed(generation, error),
                Ok(answer) => {
                    if let Some(error) = read_only_answer(std::slice::from_ref(answer)) {
                        self.failed(generation, &error);
                    }
                }
            }
            answer
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (generation, mut conn) = self.current().await?;
            let answers = conn.req_packed_commands(pipeline, offset, count).await;
            match &answers {
                Err(error) => self.failed(generation, error),
                Ok(answers) => {
                    if let Some(error) = read_only_answer(answers) {
                        self.failed(generation, &error);
                    }
                }
            }
            answers
        })
    }

    fn get_db(&self) -> i64 {
        self.shared.target.db()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// The port of the node `conn` is to, as that node says.
    async fn port_of(conn: &mut impl ConnectionLike) -> u16 {
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query_async(conn)
            .await
            .unwrap();
        info.lines()
            .find_map(|line| line.strip_prefix("tcp_port:"))
            .and_then(|port| port.trim().parse().ok())
            .expect("tcp_port")
    }

    /// A pinned connection is to the node the shared connection's commands go to, and `moved` resolves
    /// once they go elsewhere (a failover): the idle wait's connection follows the member's reads.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pinned_connection_follows_the_shared_connections_node() {
        let sentinels = stream_listener_test_support::RedisSentinels::start(1);
        let Ok(super::super::RedisTarget::Sentinel(target)) =
            super::super::RedisTarget::open(&sentinels.url())
        else {
            panic!("a sentinel url");
        };
        let options = ConnectOptions {
            response_timeout: Some(Duration::from_secs(2)),
            connection_timeout: Some(Duration::from_secs(2)),
            ..ConnectOptions::default()
        };
        let mut shared = SentinelConnection::connect(target, options).await.unwrap();
        let old = sentinels.master_port();
        assert_eq!(port_of(&mut shared).await, old);
        let config = AsyncConnectionConfig::new();
        let (mut pinned, generation) = shared.pinned(&config).await.unwrap();
        assert_eq!(port_of(&mut pinned).await, old);
        assert_eq!(shared.generation(), generation);

        let new = tokio::task::block_in_place(|| sentinels.failover()).unwrap();
        assert_ne!(new, old);
        // The shared connection's next commands find the new master; `moved` says so.
        let deadline = Instant::now() + Duration::from_secs(30);
        while port_of(&mut shared).await != new {
            assert!(
                Instant::now() < deadline,
                "the shared connection stayed on {old}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::timeout(Duration::from_secs(10), shared.moved(generation))
            .await
            .expect("moved resolves");
        let (mut again, later) = shared.pinned(&config).await.unwrap();
        assert!(later > generation);
        assert_eq!(port_of(&mut again).await, new);
    }

    #[test]
    fn a_sentinel_url_names_the_sentinels_the_master_and_the_nodes_settings() {
        let target = SentinelTarget::parse(
            false,
            "alice:pw@10.0.0.1:26379,10.0.0.2,[::1]/orders-master/3?sentinel_password=spw",
        )
        .unwrap();
        assert_eq!(target.master_name(), "orders-master");
        let addrs: Vec<String> = target
            .sentinels
            .iter()
            .map(|s| s.addr().to_string())
            .collect();
        assert_eq!(addrs, ["10.0.0.1:26379", "10.0.0.2:26379", "::1:26379"]);
        assert_eq!(target.sentinels[0].redis_settings().password(), Some("spw"));
        assert_eq!(target.sentinels[0].redis_settings().username(), None);
        assert_eq!(target.node.redis_settings().username(), Some("alice"));
        assert_eq!(target.node.redis_settings().password(), Some("pw"));
        assert_eq!(target.db(), 3);
        let node = target.node_info("10.0.0.9", 6380);
        assert_eq!(node.addr().to_string(), "10.0.0.9:6380");
        assert_eq!(node.redis_settings().password(), Some("pw"));
        let debug = format!("{target:?}");
        assert_eq!(
            debug,
            "Sentinel(10.0.0.1:26379,10.0.0.2:26379,::1:26379/orders-master)"
        );
    }

    #[test]
    fn sentinel_urls_without_a_master_or_with_unknown_parameters_are_refused() {
        for bad in [
            "10.0.0.1:26379",
            "10.0.0.1:26379/",
            "/mymaster",
            "h/mymaster/notadb",
            "h/mymaster/0/extra",
            "h/mymaster?password=x",
        ] {
            assert!(SentinelTarget::parse(false, bad).is_err(), "{bad}");
        }
        let plain = SentinelTarget::parse(false, "h/mymaster").unwrap();
        assert_eq!(plain.db(), 0);
        assert_eq!(plain.node.redis_settings().password(), None);
    }

    #[cfg(feature = "tls")]
    #[test]
    fn rediss_sentinel_urls_use_tls_to_the_sentinels_and_the_nodes() {
        let target = SentinelTarget::parse(true, "h:26380/mymaster").unwrap();
        assert!(matches!(
            target.sentinels[0].addr(),
            ConnectionAddr::TcpTls { .. }
        ));
        assert!(matches!(
            target.node_info("10.0.0.9", 6380).addr(),
            ConnectionAddr::TcpTls { host, port: 6380, .. } if host == "10.0.0.9"
        ));
    }

    #[test]
    fn a_new_master_is_read_from_both_announcements() {
        assert_eq!(
            new_master("+switch-master", "sl-master 127.0.0.1 6379 127.0.0.1 6380"),
            Some(("sl-master", "127.0.0.1", 6380))
        );
        assert_eq!(
            new_master(
                "+promoted-slave",
                "slave 127.0.0.1:6380 127.0.0.1 6380 @ sl-master 127.0.0.1 6379"
            ),
            Some(("sl-master", "127.0.0.1", 6380))
        );
        assert_eq!(
            new_master("+switch-master", "sl-master 127.0.0.1 6379"),
            None
        );
        assert_eq!(new_master("+switch-master", "m a 1 b notaport"), None);
        assert_eq!(
            new_master("+sdown", "sl-master 127.0.0.1 6379 127.0.0.1 6380"),
            None
        );
    }

    #[test]
    fn a_read_only_answer_or_a_broken_connection_means_another_discovery() {
        let answer = |text: &[u8]| redis::parse_redis_value(text).unwrap();
        let read_only = answer(b"-READONLY You can't write against a read only replica.\r\n");
        let error = read_only_answer(&[Value::Okay, read_only]).expect("READONLY is seen");
        assert!(breaks_connection(&error));
        assert!(read_only_answer(&[Value::Okay, answer(b"-WRONGTYPE nope\r\n")]).is_none());
        let Value::ServerError(wrong_type) = answer(b"-WRONGTYPE nope\r\n") else {
            panic!("not an error answer");
        };
        assert!(!breaks_connection(&RedisError::from(wrong_type)));
        let refused = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(breaks_connection(&refused));
    }
}
