//! `exporter`: serve groups' lag, pending entries and oldest unacknowledged age over HTTP, for
//! Prometheus (`/metrics`) and KEDA's `metrics-api` scaler (`/lag/<stream>/<group>`), without being a
//! member (the library's `stream_listener::lag::LagExporter`).

use std::io::Write as _;
use std::sync::Arc;
use std::time::Duration;

use stream_listener::lag::{GroupName, LagExporter, LagOptions};

use crate::error::CliError;
use crate::redis_ctx::Ctx;

/// What `exporter` was asked for.
#[derive(Debug)]
pub struct Settings {
    /// Where to listen (`127.0.0.1:9464`; port 0: any free port).
    pub listen: String,
    /// `--group stream/group` (repeatable).
    pub groups: Vec<GroupName>,
    /// Discover groups from the keyspace too (always without `--group`).
    pub discover: bool,
    /// How long a scrape's answer is served again.
    pub cache: Duration,
    /// How often discovery scans the keyspace.
    pub discovery_interval: Duration,
    /// The most entries counted on a shard whose lag Redis cannot tell.
    pub count_limit: u64,
    /// About how many keys a discovery scans at most.
    pub scan_limit: usize,
}

/// Serves until SIGTERM or ctrl-c. Prints `listening on <addr>` (the bound address) once it accepts.
pub async fn run(ctx: &Ctx, settings: Settings) -> Result<String, CliError> {
    let options = LagOptions::default()
        .with_cache_ttl(settings.cache)
        .with_discovery_interval(settings.discovery_interval)
        .with_count_limit(settings.count_limit)
        .with_scan_limit(settings.scan_limit);
    let exporter = Arc::new(LagExporter::new(
        ctx.conn.clone(),
        settings.groups,
        settings.discover,
        options,
    ));
    let server = exporter
        .serve(&settings.listen, tokio::runtime::Handle::current())
        .map_err(|e| CliError::Refused(format!("cannot listen on {}: {e}", settings.listen)))?;
    let addr = server.local_addr();
    let mut stdout = std::io::stdout();
    writeln!(
        stdout,
        "listening on {addr}: /metrics (Prometheus), /lag and /lag/<stream>/<group> (JSON)"
    )?;
    stdout.flush()?;
    stop_signal().await?;
    // The probe thread may be inside a scrape, which needs this runtime: stop it while the runtime runs.
    tokio::task::spawn_blocking(move || drop(server))
        .await
        .map_err(|e| CliError::Io(std::io::Error::other(e)))?;
    Ok(String::new())
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
