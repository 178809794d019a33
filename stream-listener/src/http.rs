//! A tiny HTTP endpoint for Kubernetes probes and Prometheus scrapes (cargo feature `http`).
//!
//! | path | answer |
//! | --- | --- |
//! | `/livez` | `200` when every member is live ([`Health::live`]), else `503`; the body names each member |
//! | `/readyz` | `200` when every member is ready ([`Health::ready`]), else `503`; the body names each member |
//! | `/metrics` | the text a metrics renderer returns (for example `metrics::install_prometheus_recorder`'s handle), `404` without one |
//! | more | the routes given to [`ProbeServer::start_with_routes`] (the lag exporter's `/lag`) |
//!
//! One std thread, one connection at a time, HTTP/1.0-style (`Connection: close`): probes are tiny and
//! rare, and this keeps the library free of an HTTP framework. A client gets one second to send its
//! request line. Bind it to the pod's address (or loopback for a sidecar); it has no authentication.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::health::{Health, HealthHandle};

/// Renders the metrics page (Prometheus text format).
pub type MetricsRenderer = Box<dyn Fn() -> String + Send + Sync>;

/// Answers a request whose path is a route's path or below it (`/lag`, `/lag/orders/billing`); it gets
/// the path without the query.
pub type RouteHandler = Box<dyn Fn(&str) -> Response + Send + Sync>;

/// What a [`RouteHandler`] answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The status code (200, 404, 503, ...).
    pub status: u16,
    /// The `Content-Type`.
    pub content_type: &'static str,
    /// The body.
    pub body: String,
}

impl Response {
    /// A JSON body.
    pub fn json(status: u16, body: &serde_json::Value) -> Self {
        Self {
            status,
            content_type: "application/json",
            body: format!("{body}\n"),
        }
    }
}

/// The probe endpoint. Stops (and joins its thread) when dropped.
pub struct ProbeServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for ProbeServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl ProbeServer {
    /// Serves `health` (and `metrics`, if given) at `addr` (port 0: any free port, see
    /// [`local_addr`](Self::local_addr)) on a thread of its own.
    pub fn start(
        addr: impl ToSocketAddrs,
        health: HealthHandle,
        metrics: Option<MetricsRenderer>,
    ) -> std::io::Result<Self> {
        Self::start_with_routes(addr, health, metrics, Vec::new())
    }

    /// [`start`](Self::start) with more routes: each `(path, handler)` answers its path and the paths
    /// below it (`/lag` answers `/lag/orders/billing`), checked before the probes and `/metrics`.
    pub fn start_with_routes(
        addr: impl ToSocketAddrs,
        health: HealthHandle,
        metrics: Option<MetricsRenderer>,
        routes: Vec<(String, RouteHandler)>,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("stream-listener-probes".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    if stopping.load(Ordering::Acquire) {
                        break;
                    }
                    match stream {
                        Ok(stream) => {
                            if let Err(error) = answer(stream, &health, metrics.as_deref(), &routes)
                            {
                                tracing::debug!(%error, "probe request failed");
                            }
                        }
                        Err(error) => tracing::debug!(%error, "probe accept failed"),
                    }
                }
            })?;
        Ok(Self {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for ProbeServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the blocking accept; if that fails the thread ends at the next request instead.
        if TcpStream::connect_timeout(&self.addr, Duration::from_secs(1)).is_ok() {
            if let Some(thread) = self.thread.take() {
                let _ = thread.join();
            }
        }
    }
}

/// Reads one request and writes its answer.
fn answer(
    stream: TcpStream,
    health: &HealthHandle,
    metrics: Option<&(dyn Fn() -> String + Send + Sync)>,
    routes: &[(String, RouteHandler)],
) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(1)))?;
    stream.set_write_timeout(Some(Duration::from_secs(1)))?;
    let mut line = String::new();
    BufReader::new(Read::take(stream.try_clone()?, 8 * 1024)).read_line(&mut line)?;
    let path = line.split_whitespace().nth(1).unwrap_or("");
    let path = path.split('?').next().unwrap_or("");
    let (code, content_type, body) = route(path, health, metrics, routes);
    let reason = match code {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        500 => "Internal Server Error",
        _ => "Service Unavailable",
    };
    let mut stream = stream;
    write!(
        stream,
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    stream.flush()
}

/// Status code, content type and body for `path`.
fn route(
    path: &str,
    health: &HealthHandle,
    metrics: Option<&(dyn Fn() -> String + Send + Sync)>,
    routes: &[(String, RouteHandler)],
) -> (u16, &'static str, String) {
    const TEXT: &str = "text/plain; charset=utf-8";
    let below = |prefix: &str| {
        path == prefix
            || path
                .strip_prefix(prefix)
                .is_some_and(|rest| rest.starts_with('/'))
    };
    if let Some((_, handler)) = routes.iter().find(|(prefix, _)| below(prefix)) {
        let response = handler(path);
        return (response.status, response.content_type, response.body);
    }
    match path {
        "/livez" => {
            let health = health.health();
            (code(health.live()), TEXT, describe(&health))
        }
        "/readyz" => {
            let health = health.health();
            (code(health.ready()), TEXT, describe(&health))
        }
        "/metrics" => match metrics {
            Some(render) => (200, "text/plain; version=0.0.4; charset=utf-8", render()),
            None => (404, TEXT, "no metrics recorder served here\n".into()),
        },
        _ => {
            let mut paths = String::from("/livez, /readyz, /metrics");
            for (prefix, _) in routes {
                paths.push_str(", ");
                paths.push_str(prefix);
            }
            (404, TEXT, format!("not found: try {paths}\n"))
        }
    }
}

fn code(ok: bool) -> u16 {
    if ok {
        200
    } else {
        503
    }
}

/// One line per member, for whoever reads a failed probe's output (`kubectl describe pod`).
fn describe(health: &Health) -> String {
    let mut body = String::new();
    for m in &health.members {
        body.push_str(&format!(
            "{} live={} ready={} heartbeating={} joined={} heartbeat_failures={} failing_reads={:?} overdue_handlers={}\n",
            m.member_id,
            m.live(),
            m.ready(),
            m.heartbeating,
            m.joined,
            m.heartbeat_failures,
            m.failing_reads,
            m.overdue_handlers.len(),
        ));
    }
    body
}
