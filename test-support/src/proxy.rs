//! A loopback TCP proxy in front of a Redis server that injects network faults (feature `aio`).
//!
//! Each fault is one a real network or a frozen process brings:
//! - [`hold`](FaultProxy::hold): what clients send is kept, replies still flow back. A command that passed
//!   every check in the client and was on its way when the process froze reaches Redis only later, after
//!   the world moved on; [`release`](FaultProxy::release) forwards everything held, in order.
//! - [`hold_connection_from`](FaultProxy::hold_connection_from): the same, for one connection only (the
//!   one that sends a pattern): a command still on its way while the client's other connections go on.
//! - [`lose_reply_after`](FaultProxy::lose_reply_after): the next command that contains a pattern reaches
//!   Redis, Redis runs it, and the connection is reset before the reply gets back: a reset (or an EOF)
//!   right after a command reached Redis.
//! - [`delay_reply_after`](FaultProxy::delay_reply_after): the same command's reply (and everything after
//!   it on that connection) arrives only after a delay, so the client's response timeout fires first.
//! - [`blackhole`](FaultProxy::blackhole): nothing gets through either way until lifted (TCP retransmits, so
//!   what was sent arrives then, unless a side gave up and closed).
//! - [`set_latency`](FaultProxy::set_latency): every chunk waits that long, each way (a slow link).
//! - [`reset_all`](FaultProxy::reset_all): every open connection is closed at once.
//!
//! And one that is no fault: [`rewrite_replies`](FaultProxy::rewrite_replies) replaces bytes in what the
//! server answers, so a client sees, say, another server version.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;

/// What happens to the reply of the next command that contains the armed pattern.
#[derive(Debug, Clone, Copy)]
enum ReplyFault {
    /// Drop it and close the connection.
    Lose,
    /// Deliver it (and what follows) this much later.
    Delay(Duration),
}

/// How long replies are dropped after an armed command before its connection is closed.
const LOSE_GRACE: Duration = Duration::from_millis(100);

#[derive(Debug, Default)]
struct Shared {
    /// Client bytes sent while held, for [`FaultProxy::held`].
    held: Vec<u8>,
    /// One-shot: the pattern and what to do with its reply.
    armed: Option<(Vec<u8>, ReplyFault)>,
    /// One-shot: hold from the first chunk that contains this pattern on (that chunk included).
    hold_from: Option<Vec<u8>>,
    /// One-shot: the same, for the connection that sends it only.
    hold_connection_from: Option<Vec<u8>>,
    /// How many armed faults fired.
    fired: u64,
    /// The local ports of the open connections to the server, by connection.
    upstream: std::collections::BTreeMap<u64, u16>,
    /// Connections opened so far (their ids).
    opened: u64,
    /// Replacements in replies, each of the same length (RESP lengths stay right).
    rewrites: Vec<(Vec<u8>, Vec<u8>)>,
}

/// The proxy's switches, read by every connection's pumps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Switches {
    holding: bool,
    /// The one connection held (by id), if any.
    held_connection: Option<u64>,
    blackhole: bool,
    latency: Duration,
    /// Bumped by `reset_all`: connections opened before close.
    resets: u64,
}

/// A proxy to one server; dropping it stops accepting (open connections live on until either side closes).
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    switches: watch::Sender<Switches>,
    shared: Arc<Mutex<Shared>>,
    accept: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// A proxy on a free loopback port, forwarding to `upstream`.
    ///
    /// # Panics
    /// If no loopback port can be bound.
    pub async fn start(upstream: SocketAddr) -> FaultProxy {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .expect("bind a loopback port for the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let switches = watch::Sender::new(Switches::default());
        let shared = Arc::new(Mutex::new(Shared::default()));
        let (rx, state, tx) = (switches.subscribe(), shared.clone(), switches.clone());
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                let id = {
                    let mut shared = state.lock().expect("proxy state");
                    shared.opened += 1;
                    let id = shared.opened;
                    if let Ok(local) = server.local_addr() {
                        shared.upstream.insert(id, local.port());
                    }
                    id
                };
                let state = state.clone();
                let (rx, tx) = (rx.clone(), tx.clone());
                tokio::spawn(async move {
                    connection(id, client, server, rx, tx, state.clone()).await;
                    state.lock().expect("proxy state").upstream.remove(&id);
                });
            }
        });
        FaultProxy {
            addr,
            switches,
            shared,
            accept,
        }
    }

    /// `redis://127.0.0.1:<port>` of the proxy.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// The proxy's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn shared(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().expect("proxy state")
    }

    /// From now on, keep what clients send instead of forwarding it (what they sent before, even if the
    /// proxy has not forwarded it yet, still reaches the server).
    pub fn hold(&self) {
        self.shared().held.clear();
        self.switches.send_modify(|s| s.holding = true);
    }

    /// Holds from the first chunk a client sends that contains `pattern` on (that chunk included), as
    /// [`hold`](Self::hold) does: what was sent before it reaches the server, that command and what follows
    /// wait for [`release`](Self::release).
    pub fn hold_from(&self, pattern: &str) {
        let mut shared = self.shared();
        shared.held.clear();
        shared.hold_from = Some(pattern.as_bytes().to_vec());
    }

    /// Holds what ONE connection sends from its first chunk that contains `pattern` on (that chunk included),
    /// until [`release`](Self::release); the other connections go on.
    pub fn hold_connection_from(&self, pattern: &str) {
        let mut shared = self.shared();
        shared.held.clear();
        shared.hold_connection_from = Some(pattern.as_bytes().to_vec());
    }

    /// What clients sent since [`hold`](Self::hold), as text (RESP is mostly ASCII).
    pub fn held(&self) -> String {
        String::from_utf8_lossy(&self.shared().held).into_owned()
    }

    /// Forward everything held, in order, and everything sent from now on.
    pub fn release(&self) {
        self.switches.send_modify(|s| {
            s.holding = false;
            s.held_connection = None;
        });
    }

    /// The next command containing `pattern` (say `XREADGROUP`) reaches Redis; the reply that follows is
    /// dropped and the connection closed (every other reply still in flight on it is lost too).
    pub fn lose_reply_after(&self, pattern: &str) {
        self.shared().armed = Some((pattern.as_bytes().to_vec(), ReplyFault::Lose));
    }

    /// The next command containing `pattern` reaches Redis; what Redis answers on that connection from then
    /// on is delivered `delay` later.
    pub fn delay_reply_after(&self, pattern: &str, delay: Duration) {
        self.shared().armed = Some((pattern.as_bytes().to_vec(), ReplyFault::Delay(delay)));
    }

    /// How many faults armed by [`lose_reply_after`](Self::lose_reply_after) or
    /// [`delay_reply_after`](Self::delay_reply_after) have fired.
    pub fn fired(&self) -> u64 {
        self.shared().fired
    }

    /// The local ports of the proxy's open connections to the server: what the server sees as this
    /// proxy's clients (`CLIENT LIST`, `MONITOR`).
    pub fn upstream_ports(&self) -> Vec<u16> {
        self.shared().upstream.values().copied().collect()
    }

    /// While on, nothing gets through in either direction; what was sent is delivered when lifted.
    pub fn blackhole(&self, on: bool) {
        self.switches.send_modify(|s| s.blackhole = on);
    }

    /// Every chunk waits `latency` before it is forwarded, each way (so a round trip takes twice that).
    pub fn set_latency(&self, latency: Duration) {
        self.switches.send_modify(|s| s.latency = latency);
    }

    /// From now on, every `from` in a reply chunk is replaced by `to` (say `redis_version:7.0.15` by
    /// `redis_version:6.2.99`, so a client takes the server for 6.2). A reply split between two chunks
    /// across `from` is left as it is: keep `from` in a short reply, like `INFO server`'s.
    ///
    /// # Panics
    /// If the two differ in length, which would break the RESP length prefixes.
    pub fn rewrite_replies(&self, from: &str, to: &str) {
        assert!(!from.is_empty(), "a rewrite of something");
        assert_eq!(from.len(), to.len(), "a rewrite keeps the length");
        self.shared()
            .rewrites
            .push((from.as_bytes().to_vec(), to.as_bytes().to_vec()));
    }

    /// Closes every connection open now (new ones are accepted as usual).
    pub fn reset_all(&self) {
        self.switches.send_modify(|s| s.resets += 1);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// One client connection: a pump each way, each chunk stamped when read and forwarded once the switches
/// allow it; both pumps end when either side closes, on a reset, or when an armed fault closes it.
async fn connection(
    id: u64,
    client: TcpStream,
    server: TcpStream,
    switches: watch::Receiver<Switches>,
    hold: watch::Sender<Switches>,
    shared: Arc<Mutex<Shared>>,
) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let born = switches.borrow().resets;
    let (from_client, to_client) = client.into_split();
    let (from_server, to_server) = server.into_split();
    // Set by the client pump when an armed pattern goes by, taken by the reply pump at its next chunk.
    let fault: Arc<Mutex<Option<ReplyFault>>> = Arc::default();
    let armed = fault.clone();
    let rewrites = shared.clone();
    let upstream = pump(
        from_client,
        to_server,
        switches.clone(),
        born,
        move |s: &Switches| s.holding || s.held_connection == Some(id),
        move |chunk: &mut Vec<u8>, switches: Switches| {
            let chunk = chunk.as_slice();
            let mut holding = switches.holding || switches.held_connection == Some(id);
            let mut state = shared.lock().expect("proxy state");
            // Set before the chunk is queued, so the writer holds it.
            if state.hold_from.as_ref().is_some_and(|p| contains(chunk, p)) {
                state.hold_from = None;
                hold.send_modify(|s| s.holding = true);
                holding = true;
            }
            if state
                .hold_connection_from
                .as_ref()
                .is_some_and(|p| contains(chunk, p))
            {
                state.hold_connection_from = None;
                hold.send_modify(|s| s.held_connection = Some(id));
                holding = true;
            }
            if holding {
                state.held.extend_from_slice(chunk);
            }
            if let Some((pattern, reply_fault)) = &state.armed {
                if contains(chunk, pattern) {
                    *armed.lock().expect("armed fault") = Some(*reply_fault);
                    state.armed = None;
                    state.fired += 1;
                }
            }
            holding
        },
        None,
    );
    let downstream = pump(
        from_server,
        to_client,
        switches,
        born,
        |_: &Switches| false,
        move |chunk: &mut Vec<u8>, _| {
            for (from, to) in &rewrites.lock().expect("proxy state").rewrites {
                let mut at = 0;
                while let Some(found) = chunk[at..].windows(from.len()).position(|w| w == from) {
                    chunk[at + found..at + found + to.len()].copy_from_slice(to);
                    at += found + to.len();
                }
            }
            false
        },
        Some(fault),
    );
    // Either pump ending closes the connection both ways.
    tokio::select! {
        _ = upstream => {}
        _ = downstream => {}
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

/// Reads chunks from `from` and writes them to `to` in order, each no earlier than its read time plus the
/// latency, and only while no blackhole is on. `seen` looks at every chunk read (and the switches then),
/// may change it, and says whether it is held: a held chunk (and so every chunk behind it) is written
/// only once `holding` is false. A chunk read before a hold is not held: it was sent before the client
/// froze. `reply_fault` (downstream only) drops or delays the next chunk after an armed command.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    switches: watch::Receiver<Switches>,
    born: u64,
    holding: impl Fn(&Switches) -> bool + Send,
    mut seen: impl FnMut(&mut Vec<u8>, Switches) -> bool + Send,
    reply_fault: Option<Arc<Mutex<Option<ReplyFault>>>>,
) {
    let (chunks, mut queue) = tokio::sync::mpsc::unbounded_channel::<(Instant, bool, Vec<u8>)>();
    let mut reset = switches.clone();
    let mut gate = switches.clone();
    let read = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            // Read the switch first: `seen` may flip it (`hold_from`), which needs the watch unborrowed.
            let now = *switches.borrow();
            let mut chunk = buf[..n].to_vec();
            let held = seen(&mut chunk, now);
            if chunks.send((Instant::now(), held, chunk)).is_err() {
                break;
            }
        }
        // The writer forwards what was read, then closes its side.
        drop(chunks);
        std::future::pending::<()>().await;
    };
    let write = async move {
        while let Some((at, held, chunk)) = queue.recv().await {
            let fault = reply_fault
                .as_ref()
                .and_then(|f| f.lock().expect("armed fault").take());
            match fault {
                Some(ReplyFault::Lose) => {
                    // Drop what Redis answers for a moment (so the armed command surely reached Redis and
                    // ran, even behind replies to earlier commands), then close.
                    let until = Instant::now() + LOSE_GRACE;
                    while let Ok(Some(_)) = tokio::time::timeout_at(until, queue.recv()).await {}
                    break;
                }
                Some(ReplyFault::Delay(delay)) => tokio::time::sleep(delay).await,
                None => {}
            }
            let latency = gate.borrow().latency;
            tokio::time::sleep_until(at + latency).await;
            let stopped = |s: &Switches| s.blackhole || (held && holding(s));
            if gate.wait_for(|s| !stopped(s)).await.is_err() || to.write_all(&chunk).await.is_err()
            {
                break;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::select! {
        _ = read => {}
        _ = write => {}
        _ = reset.wait_for(|s| s.resets != born) => {}
    }
}
