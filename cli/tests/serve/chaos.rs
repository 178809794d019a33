//! Seeded faults on a mixed group (the HTTP member kind of the fault suite): a member of ours and two
//! HTTP members through `serve` (one as the Python client, one as Spring's), under keyed traffic, with
//! faults drawn from a seeded schedule, then the group's guarantees checked from what every member
//! handled and from Redis: nothing lost, nothing left pending, per-key order, never two owners of a
//! shard at once.
//!
//! ```text
//! cargo test -p stream-listener-cli --test serve chaos -- --nocapture                    # 6 faults (CI)
//! SERVE_CHAOS_SEED=7 SERVE_CHAOS_FAULTS=40 cargo test -p stream-listener-cli --test serve chaos -- --nocapture
//! ```
//!
//! The faults: `kill-http` (an HTTP member dies mid-traffic; a new one starts under the same id, as a
//! pod would), `freeze-http` (an HTTP member stops for 1.3-1.8 sessions, within its lease and the
//! server's hold, then goes on), `kill-server` (SIGKILL of the server, restarted on its address; the
//! Python member dies on the refused connection and is started again, the Spring one keeps reading),
//! `restart-rust` (the member of ours stops gracefully and starts again), `leave-http` (a graceful
//! leave, then a join), `restart-redis` (Redis shut down and started again with its append-only file:
//! every connection of every part breaks, the HTTP members die on theirs) and `delmeta` (the group's
//! metadata header, its member records, or both deleted, in turn: the store loses what it knew). A
//! member that died on a failed heartbeat or read is started again under its id after each fault.
//!
//! Left out, as the README's "Mixed-language groups" says of clients that do not fence themselves: a
//! freeze past the lease and the hold (the client then finishes the read it was in).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use stream_listener_test_support::rng::SplitMix64 as Rng;
use stream_listener_test_support::RedisServer;
use stream_listener_tests::TIMING;

use super::client::{HttpMember, Interval, Stop};
use super::log::Log;
use super::server::Server;
use super::{assert_complete, create_group, rust_member, wait_until, Production, SHARDS, WAIT};

/// The server's hold here: a freeze of up to 1.8 sessions stays within lease + hold.
const CHAOS_HOLD_MS: u64 = 3_000;
const KINDS: [&str; 7] = [
    "kill-http",
    "freeze-http",
    "kill-server",
    "restart-rust",
    "leave-http",
    "restart-redis",
    "delmeta",
];

/// Milliseconds uniform in `[from, to]`.
fn millis(rng: &mut Rng, from: u64, to: u64) -> Duration {
    Duration::from_millis(rng.range(from, to))
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The HTTP members: `(id, interval)`.
const HTTP: [(&str, Interval); 2] = [
    ("py-a", Interval::Server),
    ("jvm-b", Interval::Fixed(Duration::from_millis(300))),
];

struct Group {
    url: String,
    stream: &'static str,
    /// The server, while it runs, and the address it always has.
    server: Option<Server>,
    addr: String,
    log: Log,
    http: Vec<Option<HttpMember>>,
}

impl Group {
    fn start_http(&mut self, i: usize) {
        let (id, interval) = HTTP[i];
        self.http[i] = Some(HttpMember::start(
            &format!("http://{}", self.addr),
            &self.url,
            self.stream,
            super::GROUP,
            id,
            interval,
            self.log.clone(),
        ));
    }

    /// Starts again, under its id, every HTTP member that died (a refused or failed heartbeat).
    fn restart_the_dead(&mut self) -> usize {
        let mut restarted = 0;
        for i in 0..HTTP.len() {
            if self.http[i].as_ref().is_some_and(|m| m.died().is_some()) {
                drop(self.http[i].take());
                self.start_http(i);
                restarted += 1;
            }
        }
        restarted
    }

    fn restart_server(&mut self) {
        self.server = Some(Server::start_at(
            &self.url,
            &self.addr,
            &["--hold-after-lease-ms", &CHAOS_HOLD_MS.to_string()],
        ));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_seeded_faults_on_a_mixed_group_lose_nothing_and_never_give_a_shard_two_owners() {
    let seed = env_u64("SERVE_CHAOS_SEED", 26);
    let faults = env_u64("SERVE_CHAOS_FAULTS", 6);
    // Every loop is bounded by count and by this.
    let budget = Duration::from_secs(30 + faults * 15);
    let started = Instant::now();
    let mut rng = Rng(seed);
    let mut redis = RedisServer::start_with_aof();
    let url = redis.url();
    let stream = "chaos";
    let mut deleted_metadata = 0;
    create_group(&url, stream).await;
    let server = Server::start(&url, &["--hold-after-lease-ms", &CHAOS_HOLD_MS.to_string()]);
    let addr = server.addr.to_string();
    let mut group = Group {
        url: url.clone(),
        stream,
        server: Some(server),
        addr,
        log: Log::default(),
        http: vec![None, None],
    };
    let revoked = Arc::new(Mutex::new(BTreeMap::new()));
    let production = Production::start(&url, stream).await;
    let mut rust = Some(rust_member(&url, stream, "rust-a", &group.log, &revoked).await);
    for i in 0..HTTP.len() {
        group.start_http(i);
    }
    let log = group.log.clone();
    wait_until("every member handles entries", WAIT, || {
        let members = log.members();
        ["rust-a", "py-a", "jvm-b"]
            .iter()
            .all(|m| members.contains(*m))
    })
    .await;

    let session = Duration::from_millis(TIMING.session_timeout_ms as u64);
    let mut done: BTreeMap<&str, u32> = BTreeMap::new();
    let mut restarts = 0;
    for n in 0..faults {
        if started.elapsed() > budget {
            eprintln!("chaos: time budget spent after {n} faults");
            break;
        }
        let kind = KINDS[rng.below(KINDS.len() as u64) as usize];
        let victim = rng.below(HTTP.len() as u64) as usize;
        let at = Instant::now();
        match kind {
            "kill-http" => {
                if let Some(member) = group.http[victim].take() {
                    member.stop(Stop::Kill);
                }
                tokio::time::sleep(millis(&mut rng, 0, 500)).await;
                group.start_http(victim);
            }
            "freeze-http" => {
                let frozen = session.mul_f64(1.3 + rng.below(6) as f64 / 10.0);
                if let Some(member) = &group.http[victim] {
                    member
                        .shared
                        .frozen
                        .store(true, std::sync::atomic::Ordering::SeqCst);
                    tokio::time::sleep(frozen).await;
                    member
                        .shared
                        .frozen
                        .store(false, std::sync::atomic::Ordering::SeqCst);
                }
            }
            "kill-server" => {
                drop(group.server.take());
                tokio::time::sleep(millis(&mut rng, 100, 800)).await;
                group.restart_server();
            }
            "restart-rust" => {
                rust.take().unwrap().stop().await.unwrap();
                tokio::time::sleep(millis(&mut rng, 0, 500)).await;
                rust = Some(rust_member(&url, stream, "rust-a", &group.log, &revoked).await);
            }
            "leave-http" => {
                if let Some(member) = group.http[victim].take() {
                    let how = if matches!(HTTP[victim].1, Interval::Server) {
                        Stop::Leave
                    } else {
                        Stop::SpringLeave
                    };
                    assert_eq!(member.stop(how), None, "the leave is answered OK");
                }
                tokio::time::sleep(millis(&mut rng, 0, 500)).await;
                group.start_http(victim);
            }
            "restart-redis" => {
                tokio::task::block_in_place(|| redis.restart_graceful());
            }
            "delmeta" => {
                let header = format!("sl:{{{stream}/{}}}:meta", super::GROUP);
                let records = format!("sl:{{{stream}/{}}}:members", super::GROUP);
                let keys = match deleted_metadata % 3 {
                    0 => vec![header],
                    1 => vec![records],
                    _ => vec![header, records],
                };
                deleted_metadata += 1;
                let mut conn = stream_listener_tests::connection(&url).await;
                let n: i64 = redis::cmd("DEL")
                    .arg(&keys)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                assert!(n > 0, "{keys:?} existed");
            }
            _ => unreachable!(),
        }
        *done.entry(kind).or_default() += 1;
        // The group settles: dead members are started again, and every shard is handled again.
        let since = Instant::now();
        let settled =
            stream_listener_test_support::aio::poll_until(WAIT, Duration::from_millis(50), || {
                restarts += group.restart_the_dead();
                let handled = group
                    .log
                    .entries()
                    .iter()
                    .filter(|h| h.at > since)
                    .map(|h| {
                        stream_listener::routing::shard_for_key(h.order.key.as_bytes(), SHARDS)
                    })
                    .collect::<std::collections::BTreeSet<_>>()
                    .len();
                async move { handled == SHARDS as usize }
            })
            .await;
        assert!(
            settled,
            "fault {n} ({kind}, seed {seed}): the group never handled every shard again"
        );
        eprintln!(
            "chaos seed {seed} fault {n}: {kind} (victim {}) for {:?}, every shard handled again {:?} after it",
            HTTP[victim].0,
            since.duration_since(at),
            since.elapsed()
        );
        tokio::time::sleep(millis(&mut rng, 200, 1_000)).await;
    }

    let sent = production.stop().await;
    let log = group.log.clone();
    assert_complete(&url, stream, &log, &sent).await;
    let overlaps = log.overlaps(SHARDS, Duration::from_millis(50));
    assert_eq!(
        overlaps,
        vec![],
        "two owners of a shard at once (seed {seed})"
    );
    eprintln!(
        "chaos seed {seed}: {} produced, {} handled twice, faults {done:?}, {restarts} dead HTTP members started again, {:?}",
        sent.len(),
        log.duplicates().len(),
        started.elapsed()
    );
    for member in group.http.iter_mut().filter_map(Option::take) {
        member.stop(Stop::Kill);
    }
    rust.take().unwrap().stop().await.unwrap();
}
