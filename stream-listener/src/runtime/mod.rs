//! The runtime bootstrap: one call starts every listener of the process and stops them gracefully.
//!
//! ```no_run
//! # async fn run() -> Result<(), stream_listener::RuntimeError> {
//! // Every #[stream_listener] of the binary, Redis from REDIS_URL, until SIGTERM or ctrl-c.
//! stream_listener::Runtime::from_env().run().await
//! # }
//! ```
//!
//! For each annotated listener with `concurrency = n` the runtime starts `n` logical members
//! `{base}-m0 .. {base}-m{n-1}`, each with its own heartbeat loop, Redis consumer name, assignment state and
//! member epoch. A [`ConsumerBuilder`] adds exactly one explicitly named member whose
//! `runtime_max_concurrency` is local worker capacity (the spec's bean-based consumer).

mod builder;
mod env;
mod error;
mod follower;
mod logging;
mod member;
mod plan;
pub(crate) mod registry;
mod running;
mod signal;
mod spec;
mod startup;
mod state;
mod supervise;
mod wait;

use std::collections::HashMap;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use crate::connection::ConnectOptions;
use crate::consumer::LifecycleHooks;
use crate::coordinator::metadata::GroupConfig;
use crate::store::wakeup::Wakeups;
use crate::store::{GroupKeys, GroupStore};
use crate::tls::TlsFiles;

pub use builder::ConsumerBuilder;
pub use env::UnknownVariable;
pub use error::RuntimeError;
pub use running::RunningRuntime;
pub use spec::{InvalidListener, ListenerSpec, Origin};
pub use startup::Unreachable;
pub use state::{MissingState, State, States};
pub use wait::WaitError;

use member::{RunningMember, Shared};

/// Shards of a stream created by a listener when no producer has created its topology yet.
pub const DEFAULT_SHARD_COUNT: u32 = 16;

/// The process-wide runtime. See the [module docs](self).
#[derive(Debug, Clone)]
pub struct Runtime {
    /// Redacted in `Debug`: the URL may carry a password.
    redis_url: crate::redact::RedisUrl,
    /// Where the URL came from, named when it does not parse.
    url_origin: &'static str,
    /// Certificates for `rediss://` beyond the system's roots (paths only: read at start).
    tls: TlsFiles,
    base_member_id: Option<String>,
    /// Member ids survive restarts and a shutdown announces one ([`Runtime::static_membership`]).
    static_membership: bool,
    group_config: GroupConfig,
    shard_count: u32,
    shutdown_timeout: Duration,
    startup_timeout: Option<Duration>,
    annotated: bool,
    builders: Vec<ConsumerBuilder>,
    states: States,
    /// Lifecycle hooks by listener name ([`Runtime::hooks`]).
    hooks: Vec<(String, LifecycleHooks)>,
    env_overrides: bool,
    /// Install a log subscriber at start when the application has none ([`Runtime::without_default_logging`]).
    default_logging: bool,
    /// Environment values [`from_env`](Runtime::from_env) could not parse; `start` refuses them.
    env_errors: Vec<String>,
    /// The `STREAM_LISTENER_*` variables set when [`from_env`](Runtime::from_env) ran (`None`: not
    /// from the environment); `start` refuses those no listener or setting reads.
    env_names: Option<Vec<String>>,
}

impl Runtime {
    /// A runtime for the Redis at `redis_url`, running every `#[stream_listener]` of the binary.
    pub fn new(redis_url: impl Into<String>) -> Self {
        Self {
            redis_url: crate::redact::RedisUrl::new(redis_url),
            url_origin: "Runtime::new",
            tls: TlsFiles::default(),
            base_member_id: None,
            static_membership: false,
            group_config: GroupConfig::default(),
            shard_count: DEFAULT_SHARD_COUNT,
            shutdown_timeout: Duration::from_secs(30),
            startup_timeout: None,
            annotated: true,
            builders: Vec::new(),
            states: States::default(),
            hooks: Vec::new(),
            env_overrides: true,
            default_logging: true,
            env_errors: Vec::new(),
            env_names: None,
        }
    }

    /// [`Runtime::new`] with `REDIS_URL` (default `redis://127.0.0.1:6379`), its TLS files from
    /// `REDIS_TLS_CA_CERT`, `REDIS_TLS_CERT` and `REDIS_TLS_KEY` ([`TlsFiles::from_env`]), `STREAM_LISTENER_MEMBER_ID`,
    /// and the timing of groups this process creates from `STREAM_LISTENER_HEARTBEAT_INTERVAL_MS`,
    /// `STREAM_LISTENER_SESSION_TIMEOUT_MS`, `STREAM_LISTENER_REBALANCE_TIMEOUT_MS` and the shard count of
    /// streams it creates from `STREAM_LISTENER_DEFAULT_SHARD_COUNT` (a value that does not parse makes
    /// [`start`](Self::start) fail with [`RuntimeError::InvalidEnvironment`]). Listener settings have their
    /// own overrides ([`ListenerSpec::apply_env`]).
    ///
    /// Every other variable that starts with `STREAM_LISTENER_` (and is not empty) makes `start` fail
    /// with [`RuntimeError::UnknownEnvironment`], naming the valid name nearest to it: a typo would
    /// otherwise start the members with their defaults, silently.
    pub fn from_env() -> Self {
        let lookup = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let names = std::env::vars_os()
            .filter_map(|(name, value)| {
                let set = !value.to_string_lossy().trim().is_empty();
                name.into_string()
                    .ok()
                    .filter(|n| set && n.starts_with("STREAM_LISTENER_"))
            })
            .collect();
        Self::from_variables(lookup, names)
    }

    /// The TLS files of a `rediss://` or `rediss+cluster://` URL: a certificate authority to trust
    /// instead of the system's roots, a client certificate and key for a server with
    /// `tls-auth-clients yes`. Read and checked when the runtime starts ([`RuntimeError::Tls`] names a
    /// file that cannot be used).
    pub fn tls(mut self, files: TlsFiles) -> Self {
        self.tls = files;
        self
    }

    /// Trusts the certificate authority in the PEM file `path` (instead of the system's roots).
    pub fn tls_ca_cert(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.tls.ca_cert = Some(path.into());
        self
    }

    /// Presents the client certificate in the PEM file `cert`, with its private key in `key` (mutual TLS).
    pub fn tls_client_cert(
        mut self,
        cert: impl Into<std::path::PathBuf>,
        key: impl Into<std::path::PathBuf>,
    ) -> Self {
        self.tls.cert = Some(cert.into());
        self.tls.key = Some(key.into());
        self
    }

    /// Overrides the base member id of annotated listeners (default: pod IP, local address, hostname).
    pub fn base_member_id(mut self, id: impl Into<String>) -> Self {
        self.base_member_id = Some(id.into());
        self
    }

    /// Static membership (Kafka's KIP-345), for rolling deploys: member ids survive restarts, and a
    /// graceful shutdown announces a restart, so the group keeps this process's shards for it for one
    /// session timeout instead of moving them to the others and back.
    ///
    /// The base member id is then [`base_member_id`](Self::base_member_id) (or
    /// `STREAM_LISTENER_MEMBER_ID`), else `POD_NAME`, else `HOSTNAME` (a StatefulSet pod's name), never
    /// with the process id; `start` refuses a listener without one
    /// ([`RuntimeError::NoStableMemberId`]). Use it where each pod's name is its own and comes back
    /// (a StatefulSet), never where two live processes could share one. The cost: a process shut down
    /// for good leaves its shards unread for one session timeout before they move.
    /// `STREAM_LISTENER_STATIC_MEMBERSHIP=true` turns it on from the environment.
    pub fn static_membership(mut self) -> Self {
        self.static_membership = true;
        self
    }

    /// Timing of groups this process creates (existing groups keep theirs).
    pub fn group_config(mut self, config: GroupConfig) -> Self {
        self.group_config = config;
        self
    }

    /// Shards of streams this process creates when no producer created them first (default 16).
    pub fn default_shard_count(mut self, n: u32) -> Self {
        self.shard_count = n.max(1);
        self
    }

    /// How long a graceful shutdown may take.
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// How long [`start`](Self::start) keeps trying to reach Redis before it gives up with
    /// [`RuntimeError::Unreachable`]. Default: no limit (it keeps trying, with exponential backoff from
    /// 100 ms to 5 s plus jitter, and logs each failed attempt), so a pod started before its Redis does not
    /// crash-loop. Only failures that may pass are retried: a wrong password, an ACL user without a
    /// command, a database index out of range, a refused certificate or a server older than Redis 6.2
    /// fail the start at once ([`RuntimeError::Refused`], see [`crate::preflight`]).
    pub fn startup_timeout(mut self, limit: Duration) -> Self {
        self.startup_timeout = Some(limit);
        self
    }

    /// Runs only builder-registered consumers, not the annotated listeners of the binary.
    pub fn without_annotated_listeners(mut self) -> Self {
        self.annotated = false;
        self
    }

    /// Registers `value` for every handler's [`State<T>`] argument of type `T` (a listener's own value,
    /// [`ConsumerBuilder::state`], comes first). Starting a handler that asks for a type nobody
    /// registered fails with [`RuntimeError::MissingState`].
    pub fn state<T: Clone + Send + Sync + 'static>(mut self, value: T) -> Self {
        self.states.insert(value);
        self
    }

    /// Lifecycle hooks for the listener named `listener`: an annotated listener's handler function name
    /// (`on_order`), or a builder's [`name`](ConsumerBuilder::name) (default `{stream}_{group}`), the
    /// names of the environment overrides. For annotated listeners, which have no builder; every member of
    /// the listener calls them with its own shards. Replaces the listener's own hooks; a name no listener
    /// has is a start error ([`RuntimeError::HooksForUnknownListener`]).
    ///
    /// ```no_run
    /// # use stream_listener::{consumer::LifecycleHooks, Runtime};
    /// let runtime = Runtime::from_env().hooks(
    ///     "on_order",
    ///     LifecycleHooks::default().on_shards_revoked(|shards| async move {
    ///         // flush what was buffered for `shards`
    ///     }),
    /// );
    /// ```
    pub fn hooks(mut self, listener: impl Into<String>, hooks: LifecycleHooks) -> Self {
        self.hooks.push((listener.into(), hooks));
        self
    }

    /// Ignores the `STREAM_LISTENER_<LISTENER>_<SETTING>` environment overrides
    /// ([`ListenerSpec::apply_env`]), which apply by default.
    pub fn without_env_overrides(mut self) -> Self {
        self.env_overrides = false;
        self
    }

    /// Leaves logging to the application. By default [`start`](Self::start) installs a `tracing`
    /// subscriber that prints INFO and above on stderr (`RUST_LOG` overrides the filter, e.g.
    /// `RUST_LOG=stream_listener=debug`) when the application installed none, so starts, joins,
    /// assignments, dead letters, handler timeouts and self-fences are seen. An application that sets
    /// its own global subscriber before `start` needs no opt-out: it is kept.
    pub fn without_default_logging(mut self) -> Self {
        self.default_logging = false;
        self
    }

    /// Adds one explicitly registered member.
    pub fn consumer(mut self, builder: ConsumerBuilder) -> Self {
        self.builders.push(builder);
        self
    }

    /// Starts everything and runs until SIGTERM or ctrl-c, then shuts down gracefully. A shutdown that
    /// misses its deadline is an error ([`RuntimeError::ShutdownTimedOut`]), so the binary exits non-zero.
    /// A member task that stops while running (a panic, a heartbeat loop that left) is logged at ERROR
    /// naming the member, the rest is shut down, and `run` fails with [`RuntimeError::TaskStopped`].
    /// To keep a handle while it runs (health for a probe endpoint, pause and resume), use
    /// [`start`](Self::start) and then [`RunningRuntime::run_until_signal`].
    pub async fn run(self) -> Result<(), RuntimeError> {
        self.start().await?.run_until_signal().await
    }

    /// Starts everything and returns a handle (for embedding and tests).
    pub async fn start(self) -> Result<RunningRuntime, RuntimeError> {
        logging::install_default(self.default_logging);
        if !self.env_errors.is_empty() {
            return Err(RuntimeError::InvalidEnvironment(self.env_errors.join("; ")));
        }
        let specs = self.specs();
        self.check_env_names(&specs)?;
        let plans = plan::plans(&self, specs, |name| std::env::var(name).ok())?;
        let client = crate::tls::open_target::<RuntimeError>(
            self.redis_url.expose(),
            self.url_origin,
            &self.tls,
        )?;
        startup::wait_for_redis(&client, &self.redis_url, self.startup_timeout).await?;
        let (shutdown, shutdown_rx) = watch::channel(false);
        let (exits, exits_rx) = mpsc::unbounded_channel();
        let mut groups: Vec<(String, String)> = plans
            .iter()
            .map(|p| (p.consumer.stream_prefix.clone(), p.consumer.group.clone()))
            .collect();
        groups.sort();
        groups.dedup();
        // One wake-up subscription per group, shared by this process's members of it.
        let wakeups: HashMap<(String, String), Wakeups> = groups
            .iter()
            .map(|(stream, group)| {
                let channel = GroupKeys::new(stream, group).wake;
                let wakeups = Wakeups::start(client.clone(), channel);
                ((stream.clone(), group.clone()), wakeups)
            })
            .collect();
        for wakeups in wakeups.values() {
            // Members that heartbeat before it would miss early wake-ups (and fall back to the
            // interval); a Redis that refuses pub/sub costs this wait once, then nothing.
            wakeups.subscribed(Duration::from_secs(1)).await;
        }
        let shared = Shared {
            client: client.clone(),
            group_config: self.group_config,
            default_shard_count: self.shard_count,
            shutdown_timeout: self.shutdown_timeout,
            shutdown: shutdown_rx.clone(),
            exits: exits.clone(),
        };
        let mut members = Vec::new();
        for plan in plans {
            let key = (
                plan.consumer.stream_prefix.clone(),
                plan.consumer.group.clone(),
            );
            let wakeup = wakeups[&key].register(&plan.member_id);
            members.push(RunningMember::spawn(plan, wakeup, &shared).await?);
        }
        let mut followers = Vec::new();
        for (stream, group) in groups {
            let conn = client.connect(ConnectOptions::default()).await?;
            let store = GroupStore::open(conn.clone(), &stream, &group)?;
            let period =
                Duration::from_millis(self.group_config.heartbeat_interval_ms.max(200) as u64 * 5);
            let owner = format!("group {group} of stream {stream}");
            followers.push(tokio::spawn(supervise::supervised(
                owner,
                "topology follower",
                exits.clone(),
                follower::follow_topology(conn, store, stream, group, period, shutdown_rx.clone()),
            )));
        }
        Ok(RunningRuntime {
            shutdown,
            members,
            followers,
            _wakeups: wakeups.into_values().collect(),
            timeout: self.shutdown_timeout,
            exits: exits_rx,
            client,
        })
    }

    /// Every listener's spec as declared: the binary's annotated listeners (unless
    /// [`without_annotated_listeners`](Self::without_annotated_listeners)), then the builders in order.
    fn specs(&self) -> Vec<ListenerSpec> {
        let mut specs = if self.annotated {
            ListenerSpec::registered()
        } else {
            Vec::new()
        };
        specs.extend(
            self.builders
                .iter()
                .enumerate()
                .map(|(index, builder)| builder.clone().into_spec(index + 1)),
        );
        specs
    }
}
