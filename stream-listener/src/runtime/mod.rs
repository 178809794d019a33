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
mod follower;
pub(crate) mod registry;
mod spec;
mod startup;
mod state;
mod supervise;

use std::collections::HashMap;
use std::time::Duration;

use crate::connection::{ConnectOptions, RedisTarget};
use crate::tls::TlsFiles;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::consumer::{
    BoxedHandler, Consumer, ConsumerConfig, ConsumerError, LifecycleHooks, PauseHandle,
};
use crate::coordinator::metadata::GroupConfig;
use crate::member::heartbeat::{MemberLoop, MemberStatus};
use crate::member::lifecycle::OwnershipDeadline;
use crate::member::session::{MemberIdentity, MemberSession, Phase};
use crate::store::wakeup::Wakeups;
use crate::store::{GroupKeys, GroupStore, StoreError};
use crate::topology::{StartFrom, Topology, TopologyError};

pub use builder::ConsumerBuilder;
pub use spec::{InvalidListener, ListenerSpec, Origin};
pub use startup::Unreachable;
pub use state::{MissingState, State, States};

/// Shards of a stream created by a listener when no producer has created its topology yet.
pub const DEFAULT_SHARD_COUNT: u32 = 16;

/// Why the runtime could not start, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// Redis is unreachable or failed.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// The TLS files ([`Runtime::tls`], `REDIS_TLS_*`) cannot be used; names the file.
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
    /// Redis did not answer within the startup limit ([`Runtime::startup_timeout`]).
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
    /// [`RunningRuntime::pause`] or [`RunningRuntime::resume`] got an id no listener of this runtime has.
    #[error("no listener with id `{id}` in this runtime (listeners: {})", .known.join(", "))]
    UnknownListener {
        /// The id asked for.
        id: String,
        /// The ids this runtime has ([`RunningRuntime::listener_ids`]).
        known: Vec<String>,
    },
    /// A member's heartbeat loop or consumer, or a group's topology follower, ended (panicked, or gave
    /// up) while the runtime was running; [`Runtime::run`] then shuts the rest down and returns this.
    #[error("{owner}: the {task} stopped while running ({reason}); the runtime shut down")]
    TaskStopped {
        /// Whose task: `member <memberId>`, or `group <group> of stream <stream>`.
        owner: String,
        /// `heartbeat loop`, `consumer` or `topology follower`.
        task: &'static str,
        /// `ended`, or `panicked: <message>`.
        reason: String,
    },
    /// Nothing to run.
    #[error("no listener registered: add #[stream_listener] handlers or a ConsumerBuilder")]
    NoListeners,
    /// [`Runtime::hooks`] names a listener this runtime does not run.
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
    /// A runtime setting from the environment ([`Runtime::from_env`]) does not parse.
    #[error("invalid environment: {0}")]
    InvalidEnvironment(String),
    /// A handler takes a [`State<T>`] whose type nobody registered.
    #[error("listener {listener}: {missing}")]
    MissingState {
        /// The listener ([`Origin`]).
        listener: String,
        /// The missing type.
        missing: MissingState,
    },
    /// Two listeners of this process would run the same member of the same group: they would fence each
    /// other forever. Give one an `id` (attribute) or a [`ConsumerBuilder::member_id`].
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

/// Everything needed to start one logical member.
#[derive(Debug, Clone)]
struct MemberPlan {
    label: String,
    /// Where the listener was declared, for errors.
    origin: String,
    member_id: String,
    weight: u32,
    consumer: ConsumerConfig,
    handler: BoxedHandler,
    start_from: StartFrom,
    shard_count: Option<u32>,
    hooks: LifecycleHooks,
}

/// The process-wide runtime. See the [module docs](self).
#[derive(Debug, Clone)]
pub struct Runtime {
    /// Redacted in `Debug`: the URL may carry a password.
    redis_url: crate::redact::RedisUrl,
    /// Certificates for `rediss://` beyond the system's roots (paths only: read at start).
    tls: TlsFiles,
    base_member_id: Option<String>,
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
    /// Environment values [`from_env`](Runtime::from_env) could not parse; `start` refuses them.
    env_errors: Vec<String>,
}

fn runtime_env_error(errors: &mut Vec<String>, name: &str, value: &str) {
    errors.push(format!("{name}={value:?} is not a positive integer"));
}

impl Runtime {
    /// A runtime for the Redis at `redis_url`, running every `#[stream_listener]` of the binary.
    pub fn new(redis_url: impl Into<String>) -> Self {
        Self {
            redis_url: crate::redact::RedisUrl::new(redis_url),
            tls: TlsFiles::default(),
            base_member_id: None,
            group_config: GroupConfig::default(),
            shard_count: DEFAULT_SHARD_COUNT,
            shutdown_timeout: Duration::from_secs(30),
            startup_timeout: None,
            annotated: true,
            builders: Vec::new(),
            states: States::default(),
            hooks: Vec::new(),
            env_overrides: true,
            env_errors: Vec::new(),
        }
    }

    /// [`Runtime::new`] with `REDIS_URL` (default `redis://127.0.0.1:6379`), its TLS files from
    /// `REDIS_TLS_CA_CERT`, `REDIS_TLS_CERT` and `REDIS_TLS_KEY` ([`TlsFiles::from_env`]), `STREAM_LISTENER_MEMBER_ID`,
    /// and the timing of groups this process creates from `STREAM_LISTENER_HEARTBEAT_INTERVAL_MS`,
    /// `STREAM_LISTENER_SESSION_TIMEOUT_MS`, `STREAM_LISTENER_REBALANCE_TIMEOUT_MS` and the shard count of
    /// streams it creates from `STREAM_LISTENER_DEFAULT_SHARD_COUNT` (a value that does not parse makes
    /// [`start`](Self::start) fail with [`RuntimeError::InvalidEnvironment`]). Listener settings have their
    /// own overrides ([`ListenerSpec::apply_env`]).
    pub fn from_env() -> Self {
        Self::from_lookup(|name| std::env::var(name).ok().filter(|v| !v.trim().is_empty()))
    }

    fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Self {
        let url = lookup("REDIS_URL").unwrap_or_else(|| "redis://127.0.0.1:6379".into());
        let mut runtime = Self::new(url);
        runtime.tls = TlsFiles::from_lookup(&lookup);
        runtime.base_member_id = lookup("STREAM_LISTENER_MEMBER_ID");
        let mut number = |name: &str, set: &mut dyn FnMut(u32)| {
            if let Some(value) = lookup(name) {
                match value.trim().parse::<u32>() {
                    Ok(n) if n > 0 => set(n),
                    _ => runtime_env_error(&mut runtime.env_errors, name, &value),
                }
            }
        };
        let mut config = runtime.group_config;
        let mut shards = runtime.shard_count;
        number("STREAM_LISTENER_HEARTBEAT_INTERVAL_MS", &mut |n| {
            config.heartbeat_interval_ms = i64::from(n)
        });
        number("STREAM_LISTENER_SESSION_TIMEOUT_MS", &mut |n| {
            config.session_timeout_ms = i64::from(n)
        });
        number("STREAM_LISTENER_REBALANCE_TIMEOUT_MS", &mut |n| {
            config.rebalance_timeout_ms = i64::from(n)
        });
        number("STREAM_LISTENER_DEFAULT_SHARD_COUNT", &mut |n| shards = n);
        runtime.group_config = config;
        runtime.shard_count = shards;
        runtime
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
    /// crash-loop.
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
        if !self.env_errors.is_empty() {
            return Err(RuntimeError::InvalidEnvironment(self.env_errors.join("; ")));
        }
        let plans = self.plans()?;
        if plans.is_empty() {
            return Err(RuntimeError::NoListeners);
        }
        check_unique_members(&plans)?;
        let client = crate::tls::open_target::<RuntimeError>(self.redis_url.expose(), &self.tls)?;
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
        let mut members = Vec::new();
        for plan in plans {
            let key = (
                plan.consumer.stream_prefix.clone(),
                plan.consumer.group.clone(),
            );
            let wakeup = wakeups[&key].register(&plan.member_id);
            members.push(
                self.start_member(&client, plan, wakeup, shutdown_rx.clone(), &exits)
                    .await?,
            );
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
        })
    }

    /// Every listener's spec: built, overridden from the environment, validated, its handler bound to
    /// its states; then one plan per member.
    fn plans(&self) -> Result<Vec<MemberPlan>, RuntimeError> {
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
        for (name, hooks) in &self.hooks {
            let mut found = false;
            for spec in specs.iter_mut().filter(|spec| &spec.name == name) {
                spec.hooks = hooks.clone();
                found = true;
            }
            if !found {
                return Err(RuntimeError::HooksForUnknownListener {
                    name: name.clone(),
                    known: specs.iter().map(|spec| spec.name.clone()).collect(),
                });
            }
        }
        let mut plans = Vec::new();
        for mut spec in specs {
            if self.env_overrides {
                spec.apply_env(|name| std::env::var(name).ok())?;
            }
            spec.validate()?;
            let origin = spec.origin.to_string();
            let states = spec.states.over(&self.states);
            let handler = spec
                .handler
                .as_ref()
                .expect("validated: a handler is set")
                .bind(&states)
                .map_err(|missing| RuntimeError::MissingState {
                    listener: origin.clone(),
                    missing,
                })?;
            let label = match &spec.origin {
                Origin::Annotated { path, .. } => path.clone(),
                Origin::Builder { .. } => format!("{}/{}", spec.stream, spec.group),
            };
            for member_id in spec.member_ids(self.base_member_id.as_deref()) {
                plans.push(MemberPlan {
                    label: label.clone(),
                    origin: origin.clone(),
                    consumer: spec.consumer_config(&member_id),
                    member_id,
                    weight: spec.weight,
                    handler: handler.clone(),
                    start_from: spec.start_from,
                    shard_count: spec.shard_count,
                    hooks: spec.hooks.clone(),
                });
            }
        }
        Ok(plans)
    }

    async fn start_member(
        &self,
        client: &RedisTarget,
        plan: MemberPlan,
        wakeup: std::sync::Arc<tokio::sync::Notify>,
        shutdown: watch::Receiver<bool>,
        exits: &supervise::Exits,
    ) -> Result<RunningMember, RuntimeError> {
        let owner = format!("member {}", plan.member_id);
        let interval = Duration::from_millis(self.group_config.heartbeat_interval_ms as u64);
        // The heartbeat connection is the member's own: never behind a blocking read. Its response timeout
        // is one heartbeat interval, so a stuck Redis shows up before the lease is at risk. Connecting may
        // take longer (a TLS handshake over a slow link, every node of a cluster): a connection timeout
        // below that would never connect at all; each heartbeat stays bounded by its own budget anyway.
        let options = ConnectOptions {
            response_timeout: Some(interval),
            connection_timeout: Some(interval.max(MIN_CONNECTION_TIMEOUT)),
            retries: Some(2),
            ..Default::default()
        };
        let mut conn = client.connect(options).await?;
        let stream = plan.consumer.stream_prefix.clone();
        let group = plan.consumer.group.clone();
        let topology = match Topology::load(&mut conn, &stream).await {
            Ok(topology) => topology,
            Err(TopologyError::Missing { .. }) => {
                let shards = plan.shard_count.unwrap_or(self.shard_count);
                Topology::ensure(&mut conn, &stream, shards).await?
            }
            Err(e) => return Err(e.into()),
        };
        Topology::ensure_group(&mut conn, &stream, &group, plan.start_from).await?;
        let sampler_conn = conn.clone();
        let store = GroupStore::create(
            conn,
            &stream,
            &group,
            topology.read_shard_count(),
            self.group_config,
        )?;
        let runtime_max_concurrency = plan.consumer.runtime_max_concurrency as u32;
        let mut consumer_config = plan.consumer;
        consumer_config.reclaim_idle =
            Duration::from_millis(self.group_config.session_timeout_ms.max(1) as u64);
        let deadline = OwnershipDeadline::new();
        let consumer = Consumer::connect(client.clone(), consumer_config, plan.handler)
            .await?
            .with_deadline(deadline.clone())
            .with_hooks(plan.hooks);
        let probe = consumer.probe();
        let pause = consumer.pause_handle();
        let health_deadline = deadline.clone();
        let identity = MemberIdentity {
            member_id: plan.member_id.as_str().into(),
            member_name: Some(plan.label.clone()),
            weight: plan.weight,
            runtime_max_concurrency,
        };
        let (commands_tx, commands_rx) = mpsc::unbounded_channel();
        let (reports_tx, reports_rx) = mpsc::unbounded_channel();
        // Every log line of the member (heartbeats, store, consumer jobs, handlers) carries who it is. At
        // ERROR level, so it is enabled whenever any of its events is.
        let span = tracing::error_span!("member", member = %plan.member_id, stream = %stream, group = %group);
        let consumer_task = tokio::spawn(supervise::supervised(
            owner.clone(),
            "consumer",
            exits.clone(),
            consumer
                .run(commands_rx, reports_tx)
                .instrument(span.clone()),
        ));
        let (status_tx, status) = watch::channel(MemberStatus::default());
        tokio::spawn(supervise::logged(
            format!("metrics of {owner}"),
            crate::metrics::follow_member(
                status.clone(),
                deadline.clone(),
                stream.clone(),
                group.clone(),
                plan.member_id.clone(),
                Some(crate::metrics::ShardSampler {
                    conn: sampler_conn,
                    every: interval * 10,
                }),
            )
            .instrument(span.clone()),
        ));
        let session = MemberSession::new(
            identity,
            self.group_config.session_timeout_ms,
            incarnation(),
        );
        span.in_scope(|| tracing::info!(listener = %plan.label, "member starting"));
        let heartbeat_task = tokio::spawn(supervise::supervised(
            owner,
            "heartbeat loop",
            exits.clone(),
            MemberLoop::new(session, store, deadline, commands_tx, reports_rx, shutdown)
                .with_status(status_tx)
                .with_shutdown_timeout(self.shutdown_timeout)
                .with_wakeup(wakeup)
                .run()
                .instrument(span.clone()),
        ));
        Ok(RunningMember {
            member_id: plan.member_id,
            span,
            probe,
            pause,
            deadline: health_deadline,
            status,
            heartbeat_task,
            consumer_task,
        })
    }
}

/// One started member.
#[derive(Debug)]
struct RunningMember {
    member_id: String,
    /// The `member` span (member, stream, group) its tasks run in, for the lines logged about it.
    span: tracing::Span,
    probe: crate::health::Probe,
    pause: PauseHandle,
    deadline: std::sync::Arc<OwnershipDeadline>,
    status: watch::Receiver<MemberStatus>,
    heartbeat_task: JoinHandle<()>,
    consumer_task: JoinHandle<()>,
}

/// A started runtime.
#[derive(Debug)]
pub struct RunningRuntime {
    shutdown: watch::Sender<bool>,
    members: Vec<RunningMember>,
    followers: Vec<JoinHandle<()>>,
    /// Kept for the members' lifetime; dropping one ends its subscription.
    _wakeups: Vec<Wakeups>,
    timeout: Duration,
    /// Member and follower tasks that ended while running (see `supervise.rs`).
    exits: mpsc::UnboundedReceiver<supervise::TaskExit>,
}

impl RunningRuntime {
    /// [`Runtime::run`] for a runtime already started: runs until SIGTERM or ctrl-c, then
    /// [`stop`](Self::stop)s. Take what you need first:
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), stream_listener::RuntimeError> {
    /// let running = stream_listener::Runtime::from_env().start().await?;
    /// let health = running.health_handle(); // for a probe endpoint, on another task or thread
    /// # drop(health);
    /// running.run_until_signal().await
    /// # }
    /// ```
    pub async fn run_until_signal(self) -> Result<(), RuntimeError> {
        self.run_until(wait_for_signal()).await
    }

    /// Runs until `stop` completes (a signal of the application's own, a channel), then
    /// [`stop`](Self::stop)s gracefully, returning its error if the shutdown missed its deadline. A
    /// supervised task that stops first is logged at ERROR, the rest is shut down, and the result is
    /// [`RuntimeError::TaskStopped`] naming it.
    pub async fn run_until(
        mut self,
        stop: impl std::future::Future<Output = ()>,
    ) -> Result<(), RuntimeError> {
        let exit = tokio::select! {
            () = stop => None,
            Some(exit) = self.exits.recv() => Some(exit),
        };
        let Some(exit) = exit else {
            tracing::info!("shutting down");
            return self.stop().await;
        };
        tracing::error!(owner = %exit.owner, task = exit.task, reason = %exit.reason, "a task of the runtime stopped while running; shutting the runtime down");
        if let Err(error) = self.stop().await {
            tracing::error!(%error, "shutdown incomplete");
        }
        Err(RuntimeError::TaskStopped {
            owner: exit.owner,
            task: exit.task,
            reason: exit.reason,
        })
    }

    /// The memberIds this process runs, in start order.
    pub fn member_ids(&self) -> Vec<String> {
        self.members.iter().map(|m| m.member_id.clone()).collect()
    }

    /// The ids [`pause`](Self::pause) and [`resume`](Self::resume) take: a listener's id is its member's
    /// id (one per member, so `concurrency = 4` gives four), in start order.
    pub fn listener_ids(&self) -> Vec<String> {
        self.member_ids()
    }

    /// Pauses a listener (Kafka's `pause`): no new read starts within one poll (a running batch finishes,
    /// the idle wait is interrupted); the member keeps heartbeating and keeps its shards. Entries keep
    /// accumulating in the streams until [`resume`](Self::resume).
    pub fn pause(&self, id: &str) -> Result<(), RuntimeError> {
        self.pause_handle(id)?.pause();
        Ok(())
    }

    /// Resumes a paused listener: reads start again where they stopped.
    pub fn resume(&self, id: &str) -> Result<(), RuntimeError> {
        self.pause_handle(id)?.resume();
        Ok(())
    }

    /// Whether a listener is paused.
    pub fn is_paused(&self, id: &str) -> Result<bool, RuntimeError> {
        Ok(self.pause_handle(id)?.is_paused())
    }

    fn pause_handle(&self, id: &str) -> Result<&PauseHandle, RuntimeError> {
        self.members
            .iter()
            .find(|m| m.member_id == id)
            .map(|m| &m.pause)
            .ok_or_else(|| RuntimeError::UnknownListener {
                id: id.to_owned(),
                known: self.member_ids(),
            })
    }

    /// Readiness and liveness of every member: heartbeating, joined and not self-fenced, no shard in a
    /// read error loop, no handler past its timeout (see [`crate::health`]).
    pub fn health(&self) -> crate::health::Health {
        crate::health::Health {
            members: self
                .members
                .iter()
                .map(|m| {
                    let status = m.status.borrow();
                    m.probe.member_health(
                        &m.member_id,
                        !m.heartbeat_task.is_finished(),
                        status.phase == Phase::Member && m.deadline.is_valid(),
                        status.failures,
                    )
                })
                .collect(),
        }
    }

    /// A cloneable handle on [`health`](Self::health) that outlives borrows of the runtime, for a probe
    /// endpoint on another task or thread (the `http` feature's `ProbeServer`).
    pub fn health_handle(&self) -> crate::health::HealthHandle {
        crate::health::HealthHandle {
            members: self
                .members
                .iter()
                .map(|m| crate::health::MemberWatch {
                    member_id: m.member_id.clone(),
                    probe: m.probe.clone(),
                    deadline: m.deadline.clone(),
                    status: m.status.clone(),
                })
                .collect(),
        }
    }

    /// The current status of every member.
    pub fn statuses(&self) -> Vec<(String, MemberStatus)> {
        self.members
            .iter()
            .map(|m| (m.member_id.clone(), m.status.borrow().clone()))
            .collect()
    }

    /// Graceful shutdown: every member revokes its shards, waits for in-flight handlers, acknowledges,
    /// reports REVOKED and leaves the group; bounded by the shutdown timeout. What missed the deadline is
    /// logged; [`stop`](Self::stop) returns it as an error.
    pub async fn shutdown(self) {
        if let Err(error) = self.stop().await {
            tracing::error!(%error, "shutdown incomplete");
        }
    }

    /// [`shutdown`](Self::shutdown), returning [`RuntimeError::ShutdownTimedOut`] naming every member that
    /// did not stop in time (its shards and running handlers). Those are aborted: their entries stay pending
    /// and the next owner claims them.
    pub async fn stop(self) -> Result<(), RuntimeError> {
        for member in &self.members {
            member.probe.take_aborted();
        }
        let begun = tokio::time::Instant::now();
        let _ = self.shutdown.send(true);
        for follower in self.followers {
            follower.abort();
        }
        let deadline = begun + self.timeout + Duration::from_secs(1);
        let mut stuck = Vec::new();
        for member in self.members {
            let heartbeat = member.heartbeat_task.abort_handle();
            // The heartbeat loop gives up the leave at the shutdown timeout (and fences the consumer).
            let heartbeat_late = tokio::time::timeout_at(deadline, member.heartbeat_task)
                .await
                .is_err()
                || begun.elapsed() >= self.timeout;
            if heartbeat_late {
                member.span.in_scope(|| {
                    tracing::warn!("the leave did not complete within the shutdown timeout")
                });
                heartbeat.abort();
            }
            // The heartbeat loop is gone, so the command channel is closed and the consumer winds down.
            let consumer = member.consumer_task.abort_handle();
            let consumer_late = tokio::time::timeout_at(deadline, member.consumer_task)
                .await
                .is_err();
            if heartbeat_late || consumer_late {
                let owned = member.status.borrow().owned.clone();
                let mut handlers = member.probe.take_aborted();
                handlers.extend(member.probe.in_flight());
                let what = format!(
                    "member {} ({}{}; shards {:?}; handlers running: {})",
                    member.member_id,
                    if heartbeat_late {
                        "leave not completed"
                    } else {
                        ""
                    },
                    match (heartbeat_late, consumer_late) {
                        (true, true) => ", consumer",
                        (false, true) => "consumer",
                        _ => "",
                    },
                    owned,
                    if handlers.is_empty() {
                        "none".to_owned()
                    } else {
                        handlers
                            .iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    }
                );
                member
                    .span
                    .in_scope(|| tracing::warn!(stuck = %what, "did not stop in time; aborting"));
                consumer.abort();
                stuck.push(what);
            }
        }
        if stuck.is_empty() {
            Ok(())
        } else {
            Err(RuntimeError::ShutdownTimedOut {
                timeout_ms: self.timeout.as_millis() as u64,
                stuck,
            })
        }
    }
}

/// Refuses two plans with the same member of the same group (they would fence each other forever).
fn check_unique_members(plans: &[MemberPlan]) -> Result<(), RuntimeError> {
    let mut seen: std::collections::HashMap<(&str, &str, &str), &MemberPlan> =
        std::collections::HashMap::new();
    for plan in plans {
        let key = (
            plan.consumer.stream_prefix.as_str(),
            plan.consumer.group.as_str(),
            plan.member_id.as_str(),
        );
        if let Some(first) = seen.insert(key, plan) {
            return Err(RuntimeError::DuplicateMemberId {
                member_id: plan.member_id.clone(),
                stream: plan.consumer.stream_prefix.clone(),
                group: plan.consumer.group.clone(),
                first: first.origin.clone(),
                second: plan.origin.clone(),
            });
        }
    }
    Ok(())
}

/// The shortest connection timeout of a member's heartbeat connection (see `start_member`).
const MIN_CONNECTION_TIMEOUT: Duration = Duration::from_secs(1);

/// A nonce that differs between processes and restarts using the same memberId.
fn incarnation() -> u64 {
    crate::util::random_u64() ^ u64::from(std::process::id())
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(error) => {
                // Library code does not panic over a signal handler: stop on ctrl-c only.
                tracing::warn!(%error, "cannot listen for SIGTERM; stopping on ctrl-c only");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_timing_and_shard_count_come_from_the_environment() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        let runtime = Runtime::from_lookup(env(&[
            ("REDIS_URL", "redis://10.0.0.9:6380"),
            ("STREAM_LISTENER_MEMBER_ID", "pod-1"),
            ("STREAM_LISTENER_HEARTBEAT_INTERVAL_MS", "250"),
            ("STREAM_LISTENER_SESSION_TIMEOUT_MS", "4000"),
            ("STREAM_LISTENER_REBALANCE_TIMEOUT_MS", "9000"),
            ("STREAM_LISTENER_DEFAULT_SHARD_COUNT", "12"),
            ("REDIS_TLS_CA_CERT", "/etc/redis/ca.pem"),
            ("REDIS_TLS_CERT", "/etc/redis/client.pem"),
            ("REDIS_TLS_KEY", "/etc/redis/client.key"),
        ]));
        assert_eq!(runtime.redis_url.expose(), "redis://10.0.0.9:6380");
        assert_eq!(runtime.base_member_id.as_deref(), Some("pod-1"));
        assert_eq!(
            runtime.group_config,
            GroupConfig {
                heartbeat_interval_ms: 250,
                session_timeout_ms: 4000,
                rebalance_timeout_ms: 9000,
            }
        );
        assert_eq!(runtime.shard_count, 12);
        assert_eq!(
            runtime.tls,
            TlsFiles {
                ca_cert: Some("/etc/redis/ca.pem".into()),
                cert: Some("/etc/redis/client.pem".into()),
                key: Some("/etc/redis/client.key".into()),
            }
        );
        assert!(runtime.env_errors.is_empty());

        let defaults = Runtime::from_lookup(env(&[]));
        assert_eq!(defaults.group_config, GroupConfig::default());
        assert_eq!(defaults.shard_count, DEFAULT_SHARD_COUNT);
        assert!(defaults.tls.is_empty());
    }

    #[tokio::test]
    async fn an_unparsable_runtime_setting_is_a_start_error_naming_it() {
        let runtime = Runtime::from_lookup(|name| {
            (name == "STREAM_LISTENER_SESSION_TIMEOUT_MS").then(|| "10s".to_owned())
        });
        let error = runtime.start().await.unwrap_err();
        assert_eq!(
            error.to_string(),
            "invalid environment: STREAM_LISTENER_SESSION_TIMEOUT_MS=\"10s\" is not a positive integer"
        );
    }

    /// A runtime of one member whose heartbeat loop runs `heartbeat` (supervised as `start` does), with
    /// a consumer that runs until shutdown.
    fn one_member(
        heartbeat: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> RunningRuntime {
        let (shutdown, mut shutdown_rx) = watch::channel(false);
        let (exits, exits_rx) = mpsc::unbounded_channel();
        let owner = "member pod-1-m0".to_owned();
        let consumer = async move {
            let _ = shutdown_rx.wait_for(|stop| *stop).await;
        };
        RunningRuntime {
            shutdown,
            members: vec![RunningMember {
                member_id: "pod-1-m0".into(),
                span: tracing::Span::none(),
                probe: crate::health::Probe::default(),
                pause: PauseHandle::new(),
                deadline: OwnershipDeadline::new(),
                status: watch::channel(MemberStatus::default()).1,
                heartbeat_task: tokio::spawn(supervise::supervised(
                    owner.clone(),
                    "heartbeat loop",
                    exits.clone(),
                    heartbeat,
                )),
                consumer_task: tokio::spawn(supervise::supervised(
                    owner, "consumer", exits, consumer,
                )),
            }],
            followers: Vec::new(),
            _wakeups: Vec::new(),
            timeout: Duration::from_millis(200),
            exits: exits_rx,
        }
    }

    /// Records the ERROR events of the current thread as `field=value` lines.
    #[derive(Default, Clone)]
    struct Errors(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

    impl tracing::Subscriber for Errors {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, event: &tracing::Event<'_>) {
            struct Fields(String);
            impl tracing::field::Visit for Fields {
                fn record_debug(
                    &mut self,
                    field: &tracing::field::Field,
                    value: &dyn std::fmt::Debug,
                ) {
                    self.0.push_str(&format!("{}={:?} ", field.name(), value));
                }
            }
            if *event.metadata().level() == tracing::Level::ERROR {
                let mut fields = Fields(String::new());
                event.record(&mut fields);
                self.0.lock().unwrap().push(fields.0);
            }
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    #[tokio::test]
    async fn run_fails_naming_the_member_whose_heartbeat_loop_panicked() {
        let errors = Errors::default();
        let _guard = tracing::subscriber::set_default(errors.clone());
        let running = one_member(async { panic!("boom") });
        let result = tokio::time::timeout(
            Duration::from_secs(10),
            running.run_until(std::future::pending()),
        )
        .await
        .expect("run noticed the dead member instead of running on");
        let error = result.expect_err("a dead member fails run");
        assert!(
            matches!(&error, RuntimeError::TaskStopped { owner, task: "heartbeat loop", reason }
                if owner == "member pod-1-m0" && reason == "panicked: boom"),
            "{error:?}"
        );
        assert!(error.to_string().contains("member pod-1-m0"), "{error}");
        let errors = errors.0.lock().unwrap();
        assert!(
            errors.iter().any(|e| e.contains("owner=member pod-1-m0")
                && e.contains("task=\"heartbeat loop\"")
                && e.contains("reason=panicked: boom")),
            "an ERROR names the member and the task: {errors:?}"
        );
    }

    #[tokio::test]
    async fn run_stops_cleanly_on_the_signal_while_every_task_runs() {
        let running = one_member(std::future::pending());
        let done = tokio::time::timeout(Duration::from_secs(10), running.run_until(async {}))
            .await
            .expect("stopped");
        // The heartbeat loop never ends by itself here: the shutdown aborts it and reports it stuck,
        // but no task stopped while running.
        assert!(
            !matches!(done, Err(RuntimeError::TaskStopped { .. })),
            "{done:?}"
        );
    }
}
