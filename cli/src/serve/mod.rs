//! `serve`: the spec origin's HTTP API v1 over our metadata store, so the origin's unchanged Python and
//! Spring clients join the same groups as members of this library (issue #26).
//!
//! The server is stateless: every heartbeat goes through a [`GroupStore`] on the same Redis, exactly as a
//! Rust member's does, so any number of replicas can run side by side and next to Rust members. What it
//! keeps in memory is only a cache (idle store handles per group, each with its cached snapshot, and the
//! group's timings as last seen).
//!
//! The files: this one (settings, state, the listener and graceful shutdown); `routes.rs` (the router,
//! the endpoints, per-request span, access log, timeout and authorization); `auth.rs` (users, roles,
//! login tokens); `adapt.rs` (what the HTTP clients send and expect, translated); `grant.rs` (the
//! Redis side of a grant to an HTTP member); `monitor.rs` (the origin's monitoring views from our
//! projection); `admin.rs` (group create / get / delete, scale, migrations, rollback on the topology);
//! `offsets.rs` (the monitoring offsets and consumption); `origin.rs` (session, compatibility, every group, a shard's messages); `error.rs` (the error body); `openapi.json` (the document
//! served at `/coord/v1/openapi.json`).

mod adapt;
mod admin;
mod auth;
mod error;
mod grafana;
mod grant;
mod messages;
mod monitor;
mod offsets;
mod origin;
mod query;
mod routes;

use std::collections::HashMap;
use std::io::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stream_listener::connection::{ConnectOptions, Connection, RedisTarget};
use stream_listener::store::GroupStore;

use crate::error::CliError;
use crate::redis_ctx::Ctx;

pub use adapt::Timings;

/// What `serve` was asked for.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where to listen (`127.0.0.1:8080`; port 0: any free port).
    pub listen: String,
    /// The largest request body accepted, in bytes.
    pub body_limit: usize,
    /// How long one request may take before it is answered `503` (a heartbeat: `200 RETRY`).
    pub request_timeout: Duration,
    /// How long in-flight requests get to finish after SIGTERM or ctrl-c.
    pub shutdown_grace: Duration,
    /// This replica's name in `/monitoring/health` (`coordinatorId`).
    pub server_id: String,
    /// How long past its lease an HTTP member's shards stay in a fenced hold when it expires or is
    /// fenced (`holdAfterLeaseMs` on its join): these clients do not self-fence.
    pub hold_after_lease_ms: i64,
    /// The most entries a grant to an HTTP member may deliver again to hand it a shard's pending entries
    /// (see `grant.rs`); a shard that needs more is withheld.
    pub max_rewind: u64,
    /// The grace of the resizes the admin endpoints make (scale, rollback; see
    /// `Topology::resize_with_grace`).
    pub resize_grace: Duration,
}

/// Who may call what: users, token secret and lifetime (see `auth.rs`).
#[derive(Debug, Clone)]
pub struct AuthSettings {
    /// `name:password:ROLE[,ROLE..]` lines; no user: nothing is authenticated.
    pub users: String,
    /// The HMAC key of login tokens, shared by every replica.
    pub token_secret: Option<String>,
    /// How long a login's token is valid.
    pub token_ttl: Duration,
    /// Heartbeats need the `MEMBER` role.
    pub authenticate_heartbeats: bool,
}

/// What every request shares.
#[derive(Debug)]
pub struct AppState {
    conn: Connection,
    target: RedisTarget,
    settings: Settings,
    auth: Option<auth::Auth>,
    groups: Mutex<HashMap<(String, String), Arc<GroupHandles>>>,
    /// Shard rates as this server observed them, for the Grafana rows.
    rates: grafana::Rates,
    /// Renders the process's metrics (the library's and the server's own) at `/metrics`, in the
    /// Prometheus text format; `None` if another recorder was installed first.
    metrics: Option<Render>,
}

/// Renders the metrics page.
struct Render(Box<dyn Fn() -> String + Send + Sync>);

impl std::fmt::Debug for Render {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Render")
    }
}

/// Idle store handles of one group (each keeps its cached snapshot, so a steady heartbeat is one
/// `renew` script) and the group's timings as last seen.
#[derive(Debug, Default)]
struct GroupHandles {
    idle: Mutex<Vec<GroupStore>>,
    timings: Mutex<Option<Timings>>,
}

/// Idle handles kept per group (each with its own connection); more concurrent heartbeats open more,
/// and drop them afterwards.
const IDLE_HANDLES: usize = 64;

impl AppState {
    fn handles(&self, stream: &str, group: &str) -> Arc<GroupHandles> {
        let mut groups = self.groups.lock().expect("not poisoned");
        groups
            .entry((stream.to_string(), group.to_string()))
            .or_default()
            .clone()
    }
}

impl GroupHandles {
    /// An idle handle, or a new one on the existing group (a heartbeat never creates a group: its shard
    /// count and timings are the Rust members' or the operator's) with a connection of its own: a store
    /// waits for the group's writer in Redis (`BLPOP`), which would stall every other request on a
    /// shared connection.
    async fn take(
        &self,
        state: &AppState,
        stream: &str,
        group: &str,
    ) -> Result<GroupStore, stream_listener::store::StoreError> {
        if let Some(store) = self.idle.lock().expect("not poisoned").pop() {
            return Ok(store);
        }
        // Validate the names before connecting.
        GroupStore::open(state.conn.clone(), stream, group)?;
        let options = ConnectOptions {
            connection_timeout: Some(Duration::from_secs(3)),
            response_timeout: Some(state.settings.request_timeout / 2),
            retries: Some(1),
            ..Default::default()
        };
        let conn = state.target.connect(options).await?;
        GroupStore::open(conn, stream, group)
    }

    fn put_back(&self, store: GroupStore) {
        let mut idle = self.idle.lock().expect("not poisoned");
        if idle.len() < IDLE_HANDLES {
            idle.push(store);
        }
    }

    fn timings(&self) -> Timings {
        self.timings
            .lock()
            .expect("not poisoned")
            .unwrap_or_default()
    }

    fn saw(&self, timings: Timings) {
        *self.timings.lock().expect("not poisoned") = Some(timings);
    }
}

/// Serves until SIGTERM or ctrl-c, then lets in-flight requests finish (up to the grace). Prints
/// `listening on <addr>` (the bound address) once it accepts.
pub async fn run(ctx: &Ctx, settings: Settings, auth: AuthSettings) -> Result<String, CliError> {
    init_logging();
    let users = auth::parse_users(&auth.users).map_err(CliError::Refused)?;
    let auth = if users.is_empty() {
        None
    } else {
        // A blank secret is none, as the origin's `token-secret` is.
        let secret = match auth
            .token_secret
            .as_deref()
            .filter(|s| !s.trim().is_empty())
        {
            Some(secret) => secret.to_string(),
            None => auth::fallback_secret(&users).ok_or_else(|| {
                CliError::Refused(
                    "users are configured: --token-secret is required (or an ADMIN user, whose \
                     name and password make the origin's fallback secret)"
                        .into(),
                )
            })?,
        };
        Some(
            auth::Auth::new(users, &secret, auth.token_ttl, auth.authenticate_heartbeats)
                .map_err(CliError::Refused)?,
        )
    };
    let listener = tokio::net::TcpListener::bind(&settings.listen)
        .await
        .map_err(|e| CliError::Refused(format!("cannot listen on {}: {e}", settings.listen)))?;
    let addr = listener.local_addr()?;
    let grace = settings.shutdown_grace;
    let state = Arc::new(AppState {
        conn: ctx.conn.clone(),
        target: ctx.target.clone(),
        settings,
        auth,
        groups: Mutex::default(),
        rates: grafana::Rates::default(),
        metrics: match stream_listener::metrics::install_prometheus_recorder() {
            Ok(handle) => Some(Render(Box::new(move || handle.render()))),
            Err(e) => {
                tracing::warn!("no /metrics: {e}");
                None
            }
        },
    });
    let app = routes::router(state);
    let mut stdout = std::io::stdout();
    writeln!(stdout, "listening on {addr}: /coord/v1 (HTTP API v1)")?;
    stdout.flush()?;
    let (stopping, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = axum::serve(listener, app).with_graceful_shutdown(async move {
        let _ = stop_signal().await;
        tracing::info!("stopping: finishing in-flight requests");
        let _ = stopping.send(());
    });
    let server = tokio::spawn(async move { server.await });
    // After the signal, in-flight requests get the grace; then the server is dropped with them.
    let outcome = tokio::select! {
        done = server => Some(done),
        () = async { let _ = stopped.await; tokio::time::sleep(grace).await } => None,
    };
    match outcome {
        Some(Ok(Ok(()))) | None => Ok(String::new()),
        Some(Ok(Err(e))) => Err(CliError::Io(e)),
        Some(Err(e)) => Err(CliError::Io(std::io::Error::other(e))),
    }
}

/// Structured logs on stderr (`RUST_LOG`, default `info`); stdout is for the address line.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// SIGTERM or ctrl-c.
async fn stop_signal() -> std::io::Result<()> {
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r,
            _ = term.recv() => Ok(()),
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c().await
    }
}
