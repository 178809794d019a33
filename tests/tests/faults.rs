//! Fault injection (issue 8, "Proof"): worker processes x members with keyed traffic, seeded random faults,
//! and a verification of the library's safety promises from what the handlers recorded and from Redis.
//!
//! ```text
//! cargo test -p stream-listener-tests --test faults -- --nocapture                  # short, seeded (CI)
//! FAULT_SEED=42 cargo test -p stream-listener-tests --test faults -- --nocapture    # replay a seed
//! FAULT_KINDS=stop cargo test -p stream-listener-tests --test faults -- --nocapture # one fault kind
//! FAULT_LONG=1 cargo test -p stream-listener-tests --test faults -- --nocapture     # >= 60 s of faults,
//!                                                                 # default and short group timings
//! ```
//!
//! The driver starts its own `redis-server` (loopback, free port, append-only file on), creates the
//! topology, runs `procs` worker processes (`chaos_worker`, `members` logical members each; the odd ones
//! with static membership, so their graceful exits announce the restart), produces keyed
//! traffic with per-key sequence numbers, and injects faults from a seeded schedule: `kill` (SIGKILL, then a
//! replacement with the same member ids), `stop` (SIGSTOP for 1.3-1.8 session timeouts, then SIGCONT), `term`
//! (SIGTERM, graceful exit, restart), `redis` (graceful Redis restart; the AOF keeps the data), `delmeta`
//! (`DEL` of the metadata header `sl:{<stream>/<group>}:meta`, of the member records `...:members`, or of
//! both, in turn) and `empty` (SIGKILL Redis, delete its data files, start it again on
//! the same port, empty, while the workers run); Redis stalls: `pause` (`CLIENT PAUSE ... ALL` for 1.3-1.8
//! session timeouts) and `sleep` (`DEBUG SLEEP` as long); and network faults on one worker's link, through
//! a proxy per worker (`test-support::proxy::FaultProxy`, single node): `blackhole` (nothing gets through
//! for 1.3-1.8 sessions, then what was sent arrives), `blip` (the same for a third to a half of a session,
//! within the lease), `latency` (150 ms each way for a session) and `resets` (every connection reset every
//! 1-3 s for two sessions). `FAULT_KINDS=kill,stop,term,redis,delmeta,empty,pause,sleep,blackhole,blip,
//! latency,resets` picks the kinds.
//!
//! What the checks read lives in a second `redis-server`, the record server, which is never faulted: the
//! workers' handle log (`chaos:log`, `chaos:done`) and a copy of the group's audit stream (`chaos:audit`,
//! copied as it grows; an `empty` fault pauses writes and waits for the copy before the kill).
//!
//! A `MONITOR` connection records every `XREADGROUP`, `XACK`, `XACKDEL`, `XCLAIM` and `XAUTOCLAIM` with its
//! Redis time and client address; the paused process's client ports are read from `/proc/<pid>/fd` and
//! `/proc/net/tcp` while it is stopped.
//!
//! Checks (each must hold; see [`Verdict`]):
//! - lost: every produced (key, seq) handled at least once, except entries produced before an `empty` fault
//!   and never handled: those were lost with Redis (counted as "wiped", not lost); everything produced
//!   after the restart must be handled;
//! - per-key order: the first handles of a key's seqs start in increasing seq order;
//! - overlaps: no two different owners (member id, pid) handle entries of one shard at the same time, except
//!   a handle in flight across a fault window (a SIGSTOP pause or a Redis outage) that carries a smaller
//!   fencing token than the other;
//! - fencing tokens (member epochs) of one shard never decrease in handle-start order (same exception),
//!   and one epoch is never carried by two members (epochs are unique by design); counted once per stale
//!   (shard, token);
//! - item 1 of the issue: after each SIGCONT (until the next fault), no `XREADGROUP`/`XACK`/`XCLAIM`/
//!   `XAUTOCLAIM` from the paused process (by client port, or by consumer name) on a shard, and no handler
//!   start by it, before the coordinator granted it that shard again (audit `SHARDS_ASSIGNED` after the
//!   SIGCONT; grants follow the rejoin), the handler's token not older than that grant;
//! - `XPENDING` of every shard empty after every worker stopped gracefully.
//!
//! It runs on a single node and on a Redis Cluster (the test process's shared one): there `MONITOR` watches
//! every master, a paused process's client ports are read per master, and the `redis`, `empty` and
//! `sleep` faults are left out (the shared cluster's nodes are never restarted; `tests/cluster.rs` fails
//! masters over), as are the network faults (cluster clients follow the nodes' own addresses).
//!
//! A `blackhole` past the lease counts as a pause for the checks (what the process sent meanwhile reaches
//! Redis late); its client ports are its proxy's connections.
//!
//! The recovery time of each fault (until every shard had a handle started after the fault, by a process
//! other than a paused victim) is printed, never asserted.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::aio::ConnectionManager;
use stream_listener::connection::{ConnectOptions, Connection, RedisTarget};
use stream_listener::coordinator::metadata::GroupConfig;
use stream_listener::store::GroupStore;
use stream_listener::topology::{StartFrom, Topology};
use stream_listener::Producer;
use stream_listener_test_support::aio::poll_until;
use stream_listener_test_support::monitor::parse_quoted;
use stream_listener_test_support::proxy::FaultProxy;
use stream_listener_test_support::rng::SplitMix64 as Rng;
use stream_listener_test_support::{RedisCluster, RedisServer};
use stream_listener_tests::{on_every_target, Target};
use tokio::process::{Child, Command};

const STREAM: &str = "orders";
const GROUP: &str = "chaos";
const LOG_KEY: &str = "chaos:log";
const DONE_KEY: &str = "chaos:done";
/// The copy of the group's audit stream on the record server (each entry's fields, plus `src`: its id).
const AUDIT_COPY_KEY: &str = "chaos:audit";
const WORKER: &str = env!("CARGO_BIN_EXE_chaos_worker");
/// Commands that read, claim or acknowledge: none may come from a paused process before it rejoined.
const WATCHED: [&str; 5] = ["XREADGROUP", "XACK", "XACKDEL", "XCLAIM", "XAUTOCLAIM"];
/// Graceful stop of a worker: its shutdown timeout is 20 s.
const STOP_DEADLINE: Duration = Duration::from_secs(45);
const POLL: Duration = Duration::from_millis(200);
/// The MONITOR thread gives up after this long, whatever happens to the test.
const MONITOR_LIFETIME: Duration = Duration::from_secs(1_800);

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn meta_key() -> String {
    format!("sl:{{{STREAM}/{GROUP}}}:meta")
}

fn members_key() -> String {
    format!("sl:{{{STREAM}/{GROUP}}}:members")
}

fn audit_key() -> String {
    format!("sl:{{{STREAM}/{GROUP}}}:audit")
}

/// Wall clock in microseconds since the epoch: the clock of the workers' `t0`, of Redis `TIME` and of
/// `MONITOR` (one machine).
fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

// ------------------------------------------------------------------------------------------------
// Scenario and schedule
// ------------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum FaultKind {
    Kill,
    Stop,
    Term,
    Redis,
    DelMeta,
    Empty,
    /// `CLIENT PAUSE <1.3-1.8 sessions> ALL` (every master of a cluster).
    Pause,
    /// `DEBUG SLEEP <1.3-1.8 sessions>` (single node).
    Sleep,
    /// The victim's link drops everything for 1.3-1.8 sessions, then delivers what was held.
    Blackhole,
    /// The same for a third to a half of a session, shorter than the lease.
    Blip,
    /// 150 ms each way on the victim's link for a session.
    Latency,
    /// The victim's connections are reset every 1-3 s for two sessions.
    Resets,
}

impl FaultKind {
    const ALL: [FaultKind; 12] = [
        FaultKind::Kill,
        FaultKind::Stop,
        FaultKind::Term,
        FaultKind::Redis,
        FaultKind::DelMeta,
        FaultKind::Empty,
        FaultKind::Pause,
        FaultKind::Sleep,
        FaultKind::Blackhole,
        FaultKind::Blip,
        FaultKind::Latency,
        FaultKind::Resets,
    ];

    fn name(self) -> &'static str {
        match self {
            FaultKind::Kill => "kill",
            FaultKind::Stop => "stop",
            FaultKind::Term => "term",
            FaultKind::Redis => "redis",
            FaultKind::DelMeta => "delmeta",
            FaultKind::Empty => "empty",
            FaultKind::Pause => "pause",
            FaultKind::Sleep => "sleep",
            FaultKind::Blackhole => "blackhole",
            FaultKind::Blip => "blip",
            FaultKind::Latency => "latency",
            FaultKind::Resets => "resets",
        }
    }

    /// Faults on one worker's link, through its proxy: a single node only (a cluster's clients follow
    /// the nodes' own addresses).
    fn is_network(self) -> bool {
        matches!(
            self,
            FaultKind::Blackhole | FaultKind::Blip | FaultKind::Latency | FaultKind::Resets
        )
    }

    /// How long the fault lasts, for a session of `session_ms` and a pause of `pause_pct` percent.
    fn busy(self, session_ms: u64, pause_pct: u64) -> Duration {
        Duration::from_millis(match self {
            FaultKind::Stop | FaultKind::Pause | FaultKind::Sleep | FaultKind::Blackhole => {
                session_ms * pause_pct / 100
            }
            FaultKind::Blip => session_ms * pause_pct / 400,
            FaultKind::Latency => session_ms,
            FaultKind::Resets => session_ms * 2,
            _ => 0,
        })
    }

    fn parse_list(text: &str) -> Vec<FaultKind> {
        let mut kinds: Vec<FaultKind> = text
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| {
                FaultKind::ALL
                    .into_iter()
                    .find(|k| k.name() == s)
                    .unwrap_or_else(|| panic!("unknown fault kind {s:?} in FAULT_KINDS"))
            })
            .collect();
        kinds.sort();
        kinds.dedup();
        kinds
    }
}

#[derive(Debug, Clone)]
struct Scenario {
    name: &'static str,
    seed: u64,
    procs: usize,
    members: u32,
    workers: u32,
    shards: u32,
    keys: u32,
    /// Messages per second.
    rate: u32,
    timing: GroupConfig,
    handle_ms: u64,
    /// How long faults are injected.
    fault_for: Duration,
    /// Gap between faults, uniform in [lo, hi] ms.
    gap_ms: (u64, u64),
    kinds: Vec<FaultKind>,
    /// How long to wait for every produced message to be handled after traffic stopped.
    drain_deadline: Duration,
}

/// One fault of the schedule, fixed by the seed before the run.
#[derive(Debug, Clone)]
struct PlannedFault {
    gap: Duration,
    kind: FaultKind,
    victim: usize,
    /// Pause length as a multiple of the session timeout, in percent.
    pause_pct: u64,
}

/// The schedule: every kind once (in seeded order) first, then seeded random kinds, until `fault_for`.
fn schedule(s: &Scenario) -> Vec<PlannedFault> {
    let mut rng = Rng(s.seed);
    let mut kinds = s.kinds.clone();
    for i in (1..kinds.len()).rev() {
        kinds.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut plan = Vec::new();
    let mut total = Duration::ZERO;
    for i in 0..10_000 {
        let kind = if i < kinds.len() {
            kinds[i]
        } else {
            s.kinds[rng.below(s.kinds.len() as u64) as usize]
        };
        let gap = Duration::from_millis(rng.range(s.gap_ms.0, s.gap_ms.1));
        let pause_pct = rng.range(130, 180);
        let victim = rng.below(s.procs as u64) as usize;
        let busy = kind.busy(s.timing.session_timeout_ms as u64, pause_pct);
        if i >= kinds.len() && total + gap > s.fault_for {
            break;
        }
        total += gap + busy;
        plan.push(PlannedFault {
            gap,
            kind,
            victim,
            pause_pct,
        });
    }
    plan
}

/// The seed of the CI run.
const CI_SEED: u64 = 2026;

/// `FAULT_SEED`, else a fixed seed in CI (a failure there must replay), else a new one each run.
fn env_seed() -> u64 {
    match std::env::var("FAULT_SEED") {
        Ok(s) if !s.trim().is_empty() => s.trim().parse().expect("FAULT_SEED must be a u64"),
        _ if std::env::var_os("CI").is_some() => CI_SEED,
        _ => now_us() % 1_000_000,
    }
}

fn env_kinds() -> Vec<FaultKind> {
    match std::env::var("FAULT_KINDS") {
        Ok(s) if !s.trim().is_empty() => FaultKind::parse_list(&s),
        _ => FaultKind::ALL.to_vec(),
    }
}

fn short_timing() -> GroupConfig {
    GroupConfig {
        heartbeat_interval_ms: 300,
        session_timeout_ms: 3_000,
        rebalance_timeout_ms: 6_000,
    }
}

fn short_scenario(seed: u64, kinds: Vec<FaultKind>) -> Scenario {
    Scenario {
        name: "short",
        seed,
        procs: 3,
        members: 2,
        workers: 2,
        shards: 16,
        keys: 128,
        rate: 300,
        timing: short_timing(),
        handle_ms: 2,
        fault_for: Duration::from_secs(22),
        gap_ms: (2_000, 3_500),
        kinds,
        drain_deadline: Duration::from_secs(45),
    }
}

fn long_scenarios(seed: u64, kinds: Vec<FaultKind>) -> Vec<Scenario> {
    let base = Scenario {
        name: "long-default-timing",
        seed,
        procs: 4,
        members: 4,
        workers: 2,
        shards: 32,
        keys: 256,
        rate: 400,
        timing: GroupConfig {
            heartbeat_interval_ms: 1_000,
            session_timeout_ms: 10_000,
            rebalance_timeout_ms: 30_000,
        },
        handle_ms: 2,
        fault_for: Duration::from_secs(75),
        gap_ms: (3_000, 6_000),
        kinds,
        drain_deadline: Duration::from_secs(120),
    };
    let short = Scenario {
        name: "long-short-timing",
        seed: seed.wrapping_add(1),
        timing: short_timing(),
        fault_for: Duration::from_secs(65),
        drain_deadline: Duration::from_secs(90),
        ..base.clone()
    };
    vec![base, short]
}

// ------------------------------------------------------------------------------------------------
// The test
// ------------------------------------------------------------------------------------------------

async fn fault_injection(target: Target) {
    let seed = env_seed();
    let mut kinds = env_kinds();
    if target == Target::Cluster {
        kinds.retain(|&k| {
            !matches!(k, FaultKind::Redis | FaultKind::Empty | FaultKind::Sleep) && !k.is_network()
        });
    }
    let long = std::env::var("FAULT_LONG").is_ok_and(|v| !v.is_empty() && v != "0");
    let scenarios = if long {
        long_scenarios(seed, kinds)
    } else {
        vec![short_scenario(seed, kinds)]
    };
    let mut failures = Vec::new();
    for scenario in scenarios {
        println!(
            "=== scenario {} on {target:?} (FAULT_SEED={} FAULT_KINDS={}{}) ===",
            scenario.name,
            seed,
            scenario
                .kinds
                .iter()
                .map(|k| k.name())
                .collect::<Vec<_>>()
                .join(","),
            if long { " FAULT_LONG=1" } else { "" }
        );
        match run_scenario(&scenario, target).await {
            Ok(verdict) => {
                if !verdict.ok() {
                    failures.push(format!(
                        "{}: {}",
                        scenario.name,
                        verdict.failed().join(", ")
                    ));
                }
            }
            Err(e) => failures.push(format!("{}: harness error: {e}", scenario.name)),
        }
    }
    assert!(
        failures.is_empty(),
        "fault injection failed (replay with FAULT_SEED={seed}): {}",
        failures.join("; ")
    );
}

on_every_target!(fault_injection);

/// The Redis under test: a node of its own with the append-only file on (the `redis` and `empty` faults
/// restart it), or the shared cluster.
#[derive(Debug)]
enum Backend {
    Single(RedisServer),
    Cluster(&'static RedisCluster),
}

impl Backend {
    fn start(target: Target) -> Backend {
        match target {
            // `DEBUG SLEEP` is off by default from Redis 7 on.
            Target::Single => Backend::Single(RedisServer::start_with_aof_and(vec![
                "--enable-debug-command".into(),
                "local".into(),
            ])),
            Target::Cluster => {
                // Scenarios share the cluster: each starts empty, as on its own single node. A group left
                // by the previous scenario would keep that scenario's timing (an existing group keeps its
                // own), so its pauses would no longer outlast the lease.
                let cluster = RedisCluster::shared();
                for node in &cluster.nodes()[..3] {
                    cluster
                        .cli(node.port(), &["FLUSHALL"])
                        .expect("FLUSHALL on a master of the shared cluster");
                }
                Backend::Cluster(cluster)
            }
        }
    }

    fn url(&self) -> String {
        match self {
            Backend::Single(server) => server.url(),
            Backend::Cluster(cluster) => cluster.url(),
        }
    }

    /// The nodes clients send commands to: `MONITOR` watches them, a paused process's ports are read for
    /// them. The shared cluster's first three nodes are its masters (it never fails over).
    fn command_ports(&self) -> Vec<u16> {
        match self {
            Backend::Single(server) => vec![server.port()],
            Backend::Cluster(cluster) => cluster.nodes()[..3].iter().map(|n| n.port()).collect(),
        }
    }

    /// The single node, for the faults that restart it.
    fn single(&mut self) -> Res<&mut RedisServer> {
        match self {
            Backend::Single(server) => Ok(server),
            Backend::Cluster(_) => Err("the shared cluster's nodes are not restarted".into()),
        }
    }
}

/// What happened to one fault, for the verification.
#[derive(Debug, Clone)]
struct FaultLog {
    kind: FaultKind,
    /// Process slot and its pid at the time (kill, stop, term).
    victim: Option<(String, u32)>,
    /// When the fault began (µs).
    at: u64,
    /// For `stop`: just after SIGSTOP returned and just before SIGCONT was sent (µs).
    pause: Option<(u64, u64)>,
    /// For `redis`: just before the shutdown and just after the restarted server answered (µs).
    outage: Option<(u64, u64)>,
    /// Client ports of the paused process, with the node they connect to (read while it was stopped).
    ports: Vec<(u16, u16)>,
    /// Member ids of the victim process.
    members: Vec<String>,
    note: String,
}

async fn run_scenario(s: &Scenario, target: Target) -> Res<Verdict> {
    let started = Instant::now();
    let stamp = move || format!("[{:>6.1}s]", started.elapsed().as_secs_f64());
    let plan = schedule(s);
    println!(
        "{} {} procs x {} members, {} shards, {} keys, {} msg/s, timing {:?}, {} faults planned",
        stamp(),
        s.procs,
        s.members,
        s.shards,
        s.keys,
        s.rate,
        s.timing,
        plan.len()
    );
    let mut server = Backend::start(target);
    let url = server.url();
    // Never faulted: the records must outlive a Redis restarted empty.
    let record_server = RedisServer::start();
    let record_url = record_server.url();
    let log_dir = std::env::temp_dir().join(format!(
        "sl-faults-{}-{target:?}-{}-{}",
        s.name,
        s.seed,
        std::process::id()
    ));
    fs::create_dir_all(&log_dir)?;
    println!(
        "{} redis {url}, records in {record_url}, worker logs in {}",
        stamp(),
        log_dir.display()
    );

    // Generous response timeout: the verification reads big pages from a loaded machine.
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_response_timeout(Some(Duration::from_secs(30)))
        .set_connection_timeout(Some(Duration::from_secs(5)));
    let options = ConnectOptions {
        response_timeout: Some(Duration::from_secs(30)),
        connection_timeout: Some(Duration::from_secs(5)),
        retries: None,
        ..Default::default()
    };
    let mut conn = RedisTarget::open(&url)?.connect(options).await?;
    let mut rec = redis::Client::open(record_url.as_str())?
        .get_connection_manager_with_config(config)
        .await?;
    Topology::ensure(&mut conn, STREAM, s.shards).await?;
    Topology::ensure_group(&mut conn, STREAM, GROUP, StartFrom::Earliest).await?;

    let monitor = Monitor::start(&server.command_ports());
    let audit_copy = AuditCopy::start(&url, rec.clone()).await?;

    let mut proxies = Vec::new();
    if let Backend::Single(single) = &server {
        for _ in 0..s.procs {
            proxies.push(FaultProxy::start(single.addr()).await);
        }
    }
    let urls = Urls {
        redis: url.clone(),
        record: record_url.clone(),
        proxies,
    };
    let mut procs: Vec<WorkerProc> = Vec::new();
    for slot in 0..s.procs {
        procs.push(WorkerProc::spawn(s, &urls, slot, 0, &log_dir)?);
    }

    // Traffic: rounds of one message per key, seq = round, paced to `rate`, until told to stop. Made as
    // `Producer::connect` makes it: on a cluster, its batches go straight to the masters.
    let producer =
        Producer::connect_to(&RedisTarget::open(&url)?, STREAM, None, Default::default()).await?;
    let stop_traffic = Arc::new(AtomicBool::new(false));
    // Traffic outlasts the whole schedule (its gaps and how long each fault lasts), not only `fault_for`:
    // a fault after the traffic stopped would test nothing.
    let planned_for: Duration = plan
        .iter()
        .map(|p| p.gap + p.kind.busy(s.timing.session_timeout_ms as u64, p.pause_pct))
        .sum();
    let max_rounds = (s.rate as u64 * (planned_for.as_secs() + 60)) / s.keys as u64;
    let traffic = tokio::spawn(produce(
        producer,
        s.keys,
        s.rate,
        max_rounds,
        stop_traffic.clone(),
    ));

    // Wait until traffic flows through every process before the first fault.
    // Before the first fault: every member joined and owns shards, nothing in motion, traffic handled.
    let members = s.procs * s.members as usize;
    let warm =
        poll_until(Duration::from_secs(60), POLL, || {
            let (mut conn, mut rec) = (conn.clone(), rec.clone());
            let target = s.keys as u64 * 2;
            async move {
                settled(&mut conn, members).await && scard(&mut rec).await.unwrap_or(0) >= target
            }
        })
        .await;
    println!(
        "{} warm (all {members} members own shards): {warm}",
        stamp()
    );

    let mut faults: Vec<FaultLog> = Vec::new();
    let mut crashed = 0;
    for (i, planned) in plan.iter().enumerate() {
        tokio::time::sleep(planned.gap).await; // the schedule's gap between faults (not a sync)
                                               // A worker that exited by itself (its start failed, say while Redis restarted) is replaced.
        for (slot, p) in procs.iter_mut().enumerate() {
            if let Ok(Some(status)) = p.child.try_wait() {
                crashed += 1;
                let generation = 100 + crashed;
                println!(
                    "{} {} (pid {}) exited by itself ({status}): restarted",
                    stamp(),
                    p.name,
                    p.pid
                );
                *p = WorkerProc::spawn(s, &urls, slot, generation, &log_dir)?;
            }
        }
        let log = inject(
            s,
            planned,
            &mut procs,
            &mut server,
            &mut conn,
            &audit_copy,
            &urls,
            &log_dir,
        )
        .await?;
        println!(
            "{} fault {:>2}: {:<7} {} {}",
            stamp(),
            i + 1,
            log.kind.name(),
            log.victim
                .as_ref()
                .map(|(n, p)| format!("{n} (pid {p})"))
                .unwrap_or_default(),
            log.note
        );
        faults.push(log);
    }
    // Let traffic run a little past the last fault, then stop it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop_traffic.store(true, Ordering::Relaxed);
    let Traffic {
        produced,
        retries,
        longest_wait,
    } = traffic.await??;
    let wipes = wipes(&faults);
    // Entries produced before a wipe may have gone with it; every other one must be handled.
    let required: Vec<String> = produced
        .iter()
        .enumerate()
        .flat_map(|(seq, ids)| ids.iter().enumerate().map(move |(k, &at)| (seq, k, at)))
        .filter(|&(_, _, at)| wiped_by(&wipes, at).is_none())
        .map(|(seq, k, _)| format!("{}/{seq}", key_name(k as u32)))
        .collect();
    let expected: u64 = produced.iter().map(|ids| ids.len() as u64).sum();
    println!(
        "{} traffic stopped: {} rounds, {expected} messages ({} produced after the last empty restart); \
         {retries} failed sends, the longest round waited {:.2} s",
        stamp(),
        produced.len(),
        required.len(),
        longest_wait.as_secs_f64()
    );

    let waiting = Arc::new(Mutex::new(required));
    let drained = poll_until(s.drain_deadline, POLL, || {
        let (mut rec, waiting) = (rec.clone(), waiting.clone());
        async move { still_unhandled(&mut rec, &waiting).await == Some(0) }
    })
    .await;
    let unhandled = waiting.lock().expect("waiting").len();
    println!(
        "{} drained: {drained} ({unhandled} entries produced after the last empty restart unhandled, {} handles recorded)",
        stamp(),
        scard(&mut rec).await.unwrap_or(0)
    );

    // SIGTERM to all at once (not one after another: that would only move shards around), then wait.
    for p in &procs {
        p.signal("CONT");
        p.signal("TERM");
    }
    let mut forced = 0;
    for p in procs.iter_mut() {
        if !p.wait_exit().await {
            forced += 1;
        }
    }
    println!("{} workers stopped ({forced} forced)", stamp());
    let monitor_lines = monitor.stop();
    let audit_copied = audit_copy.stop().await?;

    let records = read_records(&mut rec).await?;
    let audit = read_audit(&mut rec).await?;
    println!(
        "{} {} audit events copied, {} joins and grants read back",
        stamp(),
        audit_copied,
        audit.len()
    );
    // A fresh connection: the shared one may still hold a socket a restart or a wipe closed (its first
    // command would fail with a broken pipe before it reconnects).
    let mut conn = RedisTarget::open(&url)?.connect(options).await?;
    let pending = pending_per_shard(&mut conn, s.shards).await?;
    let dead_letters: u64 = redis::cmd("XLEN")
        .arg(format!("{STREAM}:dlq"))
        .query_async(&mut conn)
        .await
        .unwrap_or(0);
    let mut verdict = verify(
        &produced,
        &records,
        &faults,
        &audit,
        &monitor_lines,
        &pending,
        dead_letters,
        forced,
    );
    verdict.crashed = crashed as u64;
    verdict.print();
    if verdict.ok() {
        let _ = fs::remove_dir_all(&log_dir);
    } else if let Err(e) = dump(&log_dir, &records, &faults, &audit, &monitor_lines) {
        println!("could not write the raw data to {}: {e}", log_dir.display());
    }
    println!("{} scenario {} done (seed {})", stamp(), s.name, s.seed);
    drop(server);
    drop(record_server);
    Ok(verdict)
}

/// Writes what the verification saw as tab-separated files next to the worker logs, for digging into a
/// failure after the run (the Redis of the run is gone by then). A passing run removes that directory.
fn dump(
    dir: &Path,
    records: &[Record],
    faults: &[FaultLog],
    audit: &[AuditEvent],
    monitor: &[MonLine],
) -> std::io::Result<()> {
    let mut out =
        String::from("key\tseq\tshard\tid\tmember\tepoch\tt0_us\tt1_us\tdeliveries\tpid\n");
    for r in records {
        let _ = writeln!(
            out,
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
            r.key, r.seq, r.shard, r.id, r.member, r.epoch, r.t0, r.t1, r.deliveries, r.pid
        );
    }
    fs::write(dir.join("records.tsv"), out)?;
    let mut out = String::from("at_us\tport\tcommand\tconsumer\tkey\targs\n");
    for m in monitor {
        let _ = writeln!(
            out,
            "{}\t{}\t{}\t{}\t{}\t{}",
            m.at,
            m.port.map_or("lua".to_string(), |p| p.to_string()),
            m.command,
            m.consumer.as_deref().unwrap_or("-"),
            m.key,
            m.args
        );
    }
    fs::write(dir.join("monitor.tsv"), out)?;
    let mut out = String::from("at_us\tevent\tmember\tepoch\tshards\n");
    for e in audit {
        let _ = writeln!(
            out,
            "{}\t{}\t{}\t{}\t{:?}",
            e.at_us,
            if e.join { "join" } else { "grant" },
            e.member,
            e.epoch,
            e.shards
        );
    }
    fs::write(dir.join("audit.tsv"), out)?;
    let mut out = String::new();
    for f in faults {
        let _ = writeln!(out, "{f:?}");
    }
    fs::write(dir.join("faults.txt"), out)?;
    println!(
        "raw data (records, MONITOR, audit, faults) in {}",
        dir.display()
    );
    Ok(())
}

/// Whether the group's projection shows `members` members, each owning shards, none pending or revoking.
/// Every one of `members` members owns shards and nothing is in motion, from the group's projection
/// (computed from a load: nothing stores it).
async fn settled(conn: &mut Connection, members: usize) -> bool {
    let Ok(mut store) = GroupStore::open(conn.clone(), STREAM, GROUP) else {
        return false;
    };
    let Ok(Some(view)) = store.projection().await else {
        return false;
    };
    view.members.len() == members
        && view
            .members
            .iter()
            .all(|m| !m.owned.is_empty() && m.pending.is_empty() && m.revoking.is_empty())
}

async fn scard(conn: &mut ConnectionManager) -> redis::RedisResult<u64> {
    redis::cmd("SCARD").arg(DONE_KEY).query_async(conn).await
}

#[derive(Debug, serde::Serialize)]
struct Item {
    key: String,
    seq: u64,
}

fn key_name(k: u32) -> String {
    format!("key-{k:04}")
}

/// What the producer did.
#[derive(Debug)]
struct Traffic {
    /// Per round and key, when the entry that counts landed (its id's time, µs): the one of the round's
    /// successful send.
    produced: Vec<Vec<u64>>,
    /// Failed sends, and the longest time one round waited for a successful one.
    retries: u64,
    longest_wait: Duration,
}

/// Produces rounds of one message per key until told to stop.
async fn produce(
    producer: Producer<Connection>,
    keys: u32,
    rate: u32,
    max_rounds: u64,
    stop: Arc<AtomicBool>,
) -> Res<Traffic> {
    let round_every = Duration::from_secs_f64(keys as f64 / rate as f64);
    let start = tokio::time::Instant::now();
    let mut traffic = Traffic {
        produced: Vec::new(),
        retries: 0,
        longest_wait: Duration::ZERO,
    };
    for seq in 0..max_rounds {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let batch: Vec<(String, Item)> = (0..keys)
            .map(|k| {
                let key = key_name(k);
                (key.clone(), Item { key, seq })
            })
            .collect();
        // Redis may be restarting, or restarted empty until a member recreates the topology: retry the
        // round (a partly written round only duplicates entries).
        let mut attempt = 0;
        let first = tokio::time::Instant::now();
        let receipts = loop {
            attempt += 1;
            match producer.send_batch(&batch).await {
                Ok(receipts) => break receipts,
                Err(e) if attempt >= 150 => return Err(format!("round {seq}: {e}").into()),
                Err(_) => {
                    traffic.retries += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await
                }
            }
        };
        if attempt > 1 {
            traffic.longest_wait = traffic.longest_wait.max(first.elapsed());
        }
        traffic
            .produced
            .push(receipts.iter().map(|r| id_time_us(&r.id)).collect());
        tokio::time::sleep_until(start + round_every * (seq as u32 + 1)).await;
    }
    Ok(traffic)
}

/// The time of a stream entry id (`<ms>-<seq>`), µs.
fn id_time_us(id: &str) -> u64 {
    id.split('-')
        .next()
        .and_then(|ms| ms.parse::<u64>().ok())
        .map_or(0, |ms| ms * 1000)
}

/// Of `waiting` (`key/seq`), keeps those not yet in `chaos:done`; returns how many are left (`None` if the
/// record server did not answer).
async fn still_unhandled(
    rec: &mut ConnectionManager,
    waiting: &Mutex<Vec<String>>,
) -> Option<usize> {
    let names = waiting.lock().expect("waiting").clone();
    let mut left = Vec::new();
    for chunk in names.chunks(5_000) {
        let done: Vec<bool> = redis::cmd("SMISMEMBER")
            .arg(DONE_KEY)
            .arg(chunk)
            .query_async(rec)
            .await
            .ok()?;
        left.extend(
            chunk
                .iter()
                .zip(done)
                .filter(|(_, done)| !done)
                .map(|(name, _)| name.clone()),
        );
    }
    let n = left.len();
    *waiting.lock().expect("waiting") = left;
    Some(n)
}

/// The outage windows (down, up) of the `empty` faults, in order (µs).
fn wipes(faults: &[FaultLog]) -> Vec<(usize, (u64, u64))> {
    faults
        .iter()
        .enumerate()
        .filter(|(_, f)| f.kind == FaultKind::Empty)
        .filter_map(|(i, f)| f.outage.map(|w| (i, w)))
        .collect()
}

/// The first wipe (fault index) that an entry written at `at` (µs) was in Redis for: `down` is taken once
/// Redis stopped accepting writes, so every entry of the old server is older and every entry of the
/// restarted one newer.
fn wiped_by(wipes: &[(usize, (u64, u64))], at: u64) -> Option<usize> {
    wipes
        .iter()
        .find(|(_, (down, _))| at < *down)
        .map(|(i, _)| *i)
}

// ------------------------------------------------------------------------------------------------
// Worker processes and faults
// ------------------------------------------------------------------------------------------------

/// Where the workers connect: the Redis under test (on a single node through a proxy per worker slot, which
/// the network faults act on) and the record server.
#[derive(Debug)]
struct Urls {
    redis: String,
    record: String,
    proxies: Vec<FaultProxy>,
}

impl Urls {
    /// The proxy of worker `slot` (single node only).
    fn proxy(&self, slot: usize) -> Res<&FaultProxy> {
        self.proxies
            .get(slot)
            .ok_or_else(|| "network faults need a proxy per worker (single node only)".into())
    }

    /// The Redis URL of worker `slot`.
    fn worker(&self, slot: usize) -> String {
        self.proxies
            .get(slot)
            .map_or_else(|| self.redis.clone(), FaultProxy::url)
    }
}

#[derive(Debug)]
struct WorkerProc {
    name: String,
    child: Child,
    pid: u32,
}

impl WorkerProc {
    fn spawn(
        s: &Scenario,
        urls: &Urls,
        slot: usize,
        generation: usize,
        log_dir: &Path,
    ) -> Res<WorkerProc> {
        let name = format!("w{slot}");
        let log = fs::File::create(log_dir.join(format!("{name}-{generation}.log")))?;
        let child = Command::new(WORKER)
            .env("REDIS_URL", urls.worker(slot))
            .env("CHAOS_RECORD_URL", &urls.record)
            .env("CHAOS_SHARDS", s.shards.to_string())
            .env("CHAOS_PROC", &name)
            .env("CHAOS_MEMBERS", s.members.to_string())
            .env("CHAOS_WORKERS", s.workers.to_string())
            .env("CHAOS_STREAM", STREAM)
            .env("CHAOS_GROUP", GROUP)
            .env(
                "CHAOS_HEARTBEAT_MS",
                s.timing.heartbeat_interval_ms.to_string(),
            )
            .env("CHAOS_SESSION_MS", s.timing.session_timeout_ms.to_string())
            .env(
                "CHAOS_REBALANCE_MS",
                s.timing.rebalance_timeout_ms.to_string(),
            )
            .env("CHAOS_HANDLE_MS", s.handle_ms.to_string())
            // Odd slots run static membership: their graceful exits (`term`) announce the restart and
            // their replacements take the shards back; kills, pauses and the rest hit both kinds.
            .env("CHAOS_STATIC", (slot % 2).to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()?;
        let pid = child.id().ok_or("worker exited at once")?;
        Ok(WorkerProc { name, child, pid })
    }

    fn member_ids(&self, members: u32) -> Vec<String> {
        (0..members)
            .map(|m| format!("{}-m{m}", self.name))
            .collect()
    }

    fn signal(&self, signal: &str) {
        let _ = std::process::Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid.to_string())
            .status();
    }

    /// SIGTERM and wait for a graceful exit; SIGKILL after [`STOP_DEADLINE`]. Returns whether it was
    /// graceful.
    async fn terminate(&mut self) -> bool {
        self.signal("CONT"); // harmless when it runs; a stopped process cannot handle SIGTERM
        self.signal("TERM");
        self.wait_exit().await
    }

    /// Waits for the exit after a SIGTERM; SIGKILL after [`STOP_DEADLINE`]. Returns whether it exited by
    /// itself with success.
    async fn wait_exit(&mut self) -> bool {
        match tokio::time::timeout(STOP_DEADLINE, self.child.wait()).await {
            Ok(Ok(status)) => status.success(),
            _ => {
                let _ = self.child.kill().await;
                false
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn inject(
    s: &Scenario,
    planned: &PlannedFault,
    procs: &mut [WorkerProc],
    server: &mut Backend,
    conn: &mut Connection,
    audit_copy: &AuditCopy,
    urls: &Urls,
    log_dir: &Path,
) -> Res<FaultLog> {
    let slot = planned.victim;
    let mut log = FaultLog {
        kind: planned.kind,
        victim: None,
        at: now_us(),
        pause: None,
        outage: None,
        ports: Vec::new(),
        members: Vec::new(),
        note: String::new(),
    };
    match planned.kind {
        FaultKind::Kill | FaultKind::Term => {
            let p = &mut procs[slot];
            log.victim = Some((p.name.clone(), p.pid));
            log.members = p.member_ids(s.members);
            log.at = now_us();
            let graceful = if planned.kind == FaultKind::Kill {
                let _ = p.child.kill().await;
                true
            } else {
                p.terminate().await
            };
            let generation = 1 + fs::read_dir(log_dir)?
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(&p.name))
                .count();
            *p = WorkerProc::spawn(s, urls, slot, generation, log_dir)?;
            log.note = format!(
                "{}replaced by pid {}",
                if graceful {
                    ""
                } else {
                    "(SIGTERM timed out: SIGKILL) "
                },
                p.pid
            );
        }
        FaultKind::Stop => {
            let p = &procs[slot];
            log.victim = Some((p.name.clone(), p.pid));
            log.members = p.member_ids(s.members);
            let pause =
                Duration::from_millis(s.timing.session_timeout_ms as u64 * planned.pause_pct / 100);
            log.at = now_us();
            p.signal("STOP");
            // kill(2) only queues the signal: on a loaded machine the threads keep running for a while
            // (tens of ms were seen). The pause starts when every thread is stopped.
            let seen_by = Instant::now() + Duration::from_secs(5);
            let mut all_stopped = threads_stopped(p.pid);
            while !all_stopped && Instant::now() < seen_by {
                tokio::time::sleep(Duration::from_millis(2)).await;
                all_stopped = threads_stopped(p.pid);
            }
            let stopped = now_us();
            // The pause itself is the fault: a fixed length, past the lease.
            tokio::time::sleep(pause).await;
            log.ports = victim_ports(server, urls, slot, p.pid);
            let cont = now_us();
            p.signal("CONT");
            log.pause = Some((stopped, cont));
            log.note = format!(
                "paused {:.1} s ({}% of the session timeout), seen stopped {:.0} ms after SIGSTOP{}, {} client ports",
                pause.as_secs_f64(),
                planned.pause_pct,
                (stopped - log.at) as f64 / 1e3,
                if all_stopped { "" } else { " (NOT all threads seen stopped)" },
                log.ports.len()
            );
        }
        FaultKind::Redis => {
            let down = now_us();
            log.at = down;
            let server = server.single()?;
            tokio::task::block_in_place(|| server.restart_graceful());
            let up = now_us();
            log.outage = Some((down, up));
            log.note = format!("down {:.2} s", (up - down) as f64 / 1e6);
        }
        FaultKind::DelMeta => {
            // The snapshot is a header and a hash of member records: losing either, or both, is a loss.
            static ROUND: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            let keys = match ROUND.fetch_add(1, Ordering::Relaxed) % 3 {
                0 => vec![meta_key()],
                1 => vec![members_key()],
                _ => vec![meta_key(), members_key()],
            };
            log.at = now_us();
            // One retry: the first command after a restart or a wipe meets the closed socket.
            let n: i64 = match redis::cmd("DEL").arg(&keys).query_async(conn).await {
                Ok(n) => n,
                Err(_) => redis::cmd("DEL").arg(&keys).query_async(conn).await?,
            };
            log.note = format!("DEL {} -> {n}", keys.join(" "));
        }
        FaultKind::Empty => {
            // Stop writes first, so the audit copy can catch up with everything the wipe will erase;
            // clients see what a kill shows them (their writes never answered), a few ms earlier. A
            // connection of its own: on a shared one, reads would queue behind a paused write.
            let mut control = redis::Client::open(urls.redis.as_str())?
                .get_multiplexed_async_connection()
                .await?;
            let () = redis::cmd("CLIENT")
                .arg("PAUSE")
                .arg(10_000)
                .arg("WRITE")
                .query_async(&mut control)
                .await?;
            let down = now_us();
            log.at = down;
            let copied = audit_copy.catch_up(&mut control).await;
            let server = server.single()?;
            tokio::task::block_in_place(|| server.restart_empty());
            let up = now_us();
            log.outage = Some((down, up));
            log.note = format!(
                "SIGKILL, data files deleted, restarted empty: down {:.2} s{}",
                (up - down) as f64 / 1e6,
                if copied {
                    ""
                } else {
                    " (audit copy NOT complete)"
                }
            );
        }
        FaultKind::Pause | FaultKind::Sleep => {
            let stall = planned
                .kind
                .busy(s.timing.session_timeout_ms as u64, planned.pause_pct);
            log.at = now_us();
            let down = now_us();
            stall_redis(server, planned.kind, stall).await?;
            // Redis answers again (a stalled server queues the PING). A fresh connection: the shared one
            // may still hold a socket an earlier restart closed.
            let mut fresh = RedisTarget::open(&urls.redis)?
                .connect(ConnectOptions {
                    response_timeout: Some(Duration::from_secs(30)),
                    ..Default::default()
                })
                .await?;
            let _: String = redis::cmd("PING").query_async(&mut fresh).await?;
            let up = now_us();
            log.outage = Some((down, up));
            log.note = format!(
                "{} {:.1} s ({}% of the session timeout); answered again after {:.2} s",
                if planned.kind == FaultKind::Pause {
                    "CLIENT PAUSE ALL"
                } else {
                    "DEBUG SLEEP"
                },
                stall.as_secs_f64(),
                planned.pause_pct,
                (up - down) as f64 / 1e6
            );
        }
        FaultKind::Blackhole | FaultKind::Blip => {
            let p = &procs[slot];
            let proxy = urls.proxy(slot)?;
            log.victim = Some((p.name.clone(), p.pid));
            let cut = planned
                .kind
                .busy(s.timing.session_timeout_ms as u64, planned.pause_pct);
            log.at = now_us();
            proxy.blackhole(true);
            let from = now_us();
            tokio::time::sleep(cut).await; // the fault itself: a fixed length
            let ports = victim_ports(server, urls, slot, p.pid);
            let to = now_us();
            proxy.blackhole(false);
            if planned.kind == FaultKind::Blackhole {
                // Past the lease: from the group's side the process is gone, as if paused, and what it
                // sent meanwhile reaches Redis late (the pause checks apply).
                log.members = p.member_ids(s.members);
                log.pause = Some((from, to));
                log.ports = ports;
            }
            log.note = format!(
                "link cut {:.2} s ({} the lease)",
                cut.as_secs_f64(),
                if planned.kind == FaultKind::Blackhole {
                    "past"
                } else {
                    "within"
                }
            );
        }
        FaultKind::Latency => {
            let p = &procs[slot];
            let proxy = urls.proxy(slot)?;
            log.victim = Some((p.name.clone(), p.pid));
            let slow = planned.kind.busy(s.timing.session_timeout_ms as u64, 0);
            log.at = now_us();
            proxy.set_latency(NETWORK_LATENCY);
            tokio::time::sleep(slow).await; // the fault itself
            proxy.set_latency(Duration::ZERO);
            log.note = format!(
                "{} ms each way for {:.1} s",
                NETWORK_LATENCY.as_millis(),
                slow.as_secs_f64()
            );
        }
        FaultKind::Resets => {
            let p = &procs[slot];
            let proxy = urls.proxy(slot)?;
            log.victim = Some((p.name.clone(), p.pid));
            let until = Instant::now() + planned.kind.busy(s.timing.session_timeout_ms as u64, 0);
            log.at = now_us();
            let mut rng = Rng(planned.pause_pct ^ (slot as u64) << 8);
            let mut resets = 0;
            while Instant::now() < until && resets < 100 {
                // The fault's own rhythm: a reset every 1-3 s.
                tokio::time::sleep(Duration::from_millis(rng.range(1_000, 3_000))).await;
                proxy.reset_all();
                resets += 1;
            }
            log.note = format!("{resets} connection resets");
        }
    }
    Ok(log)
}

/// Added latency of a `latency` fault, each way: a 300 ms round trip.
const NETWORK_LATENCY: Duration = Duration::from_millis(150);

/// Stalls the Redis under test for `stall`: `CLIENT PAUSE ... ALL` on every master, or `DEBUG SLEEP` on the
/// single node (returns when the sleep is over).
async fn stall_redis(server: &Backend, kind: FaultKind, stall: Duration) -> Res<()> {
    let ms = stall.as_millis().to_string();
    let secs = format!("{:.3}", stall.as_secs_f64());
    let args: Vec<&str> = if kind == FaultKind::Pause {
        vec!["CLIENT", "PAUSE", &ms, "ALL"]
    } else {
        vec!["DEBUG", "SLEEP", &secs]
    };
    match server {
        Backend::Single(single) => {
            let mut control = redis::Client::open(single.url().as_str())?
                .get_multiplexed_async_connection_with_config(
                    &redis::AsyncConnectionConfig::new()
                        .set_response_timeout(Some(stall + Duration::from_secs(10))),
                )
                .await?;
            let mut cmd = redis::cmd(args[0]);
            cmd.arg(&args[1..]);
            let () = cmd.query_async(&mut control).await?;
        }
        Backend::Cluster(cluster) => {
            for node in &cluster.nodes()[..3] {
                tokio::task::block_in_place(|| cluster.cli(node.port(), &args))?;
            }
        }
    }
    if kind == FaultKind::Pause {
        // `CLIENT PAUSE` answers at once; the stall is the pause's length.
        tokio::time::sleep(stall).await;
    }
    Ok(())
}

/// The client ports (with the node they reach) of worker `slot` (pid `pid`) as Redis sees them: its own
/// sockets' ports, or those of its proxy's connections on a single node.
fn victim_ports(server: &Backend, urls: &Urls, slot: usize, pid: u32) -> Vec<(u16, u16)> {
    if let (Backend::Single(single), Some(proxy)) = (server, urls.proxies.get(slot)) {
        return proxy
            .upstream_ports()
            .into_iter()
            .map(|p| (single.port(), p))
            .collect();
    }
    server
        .command_ports()
        .into_iter()
        .flat_map(|node| client_ports(pid, node).into_iter().map(move |p| (node, p)))
        .collect()
}

/// Whether every thread of `pid` is stopped (state `T` in `/proc/<pid>/task/*/stat`).
fn threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    let mut any = false;
    for task in tasks.flatten() {
        let stat = fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // `pid (comm) S ...`: the state follows the last ')'.
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next());
        if state != Some("T") {
            return false;
        }
        any = true;
    }
    any
}

/// Local ports of `pid`'s TCP connections to `127.0.0.1:<redis_port>`: socket inodes from
/// `/proc/<pid>/fd`, matched in `/proc/net/tcp{,6}`.
fn client_ports(pid: u32, redis_port: u16) -> Vec<u16> {
    let mut inodes = HashSet::new();
    if let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fd")) {
        for entry in dir.flatten() {
            if let Ok(target) = fs::read_link(entry.path()) {
                let target = target.to_string_lossy().into_owned();
                if let Some(inode) = target
                    .strip_prefix("socket:[")
                    .and_then(|r| r.strip_suffix(']'))
                {
                    inodes.insert(inode.to_string());
                }
            }
        }
    }
    let port_of = |addr: &str| {
        addr.rsplit(':')
            .next()
            .and_then(|p| u16::from_str_radix(p, 16).ok())
    };
    let mut ports = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.len() > 9 && inodes.contains(cols[9]) && port_of(cols[2]) == Some(redis_port) {
                if let Some(port) = port_of(cols[1]) {
                    ports.push(port);
                }
            }
        }
    }
    ports.sort_unstable();
    ports.dedup();
    ports
}

// ------------------------------------------------------------------------------------------------
// MONITOR
// ------------------------------------------------------------------------------------------------

/// One watched command seen by `MONITOR`.
#[derive(Debug, Clone)]
struct MonLine {
    /// Redis time, µs.
    at: u64,
    /// The client's port (`None` for commands run by a script).
    port: Option<u16>,
    /// The port of the node that ran it.
    node: u16,
    command: String,
    /// The consumer name, for commands that carry one.
    consumer: Option<String>,
    key: String,
    /// The arguments after the command, for reports (`GROUP chaos w0-m1 COUNT 20 STREAMS orders:3 >`).
    args: String,
    /// Redis refused it: the ownership fence it names had been deleted by a newer owner (see
    /// [`MonState`]).
    refused: bool,
    /// The entry ids an `XACK` / `XACKDEL` acknowledges.
    ids: Vec<String>,
}

/// What one node's `MONITOR` feed has shown so far about ownership fences (`stream-listener`'s
/// `consumer/fence.rs`): the fences a newer owner's install script deleted, and not created again since.
/// A group read naming one of them fails with `NOGROUP` before serving anything, and a claim or ack run
/// through the fenced script is refused. Fences deleted before the feed started are unknown: commands
/// naming them count as accepted (the check can over-count, never under-count).
#[derive(Debug, Default)]
struct MonState {
    deleted: HashSet<String>,
}

/// The prefix of every ownership fence key.
const FENCE_PREFIX: &str = "sl:fence:";

#[derive(Debug)]
struct Monitor {
    stop: Arc<AtomicBool>,
    lines: Arc<Mutex<Vec<MonLine>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Monitor {
    /// A thread per node reading its monitor feed; it reconnects while Redis restarts.
    fn start(ports: &[u16]) -> Monitor {
        let stop = Arc::new(AtomicBool::new(false));
        let lines = Arc::new(Mutex::new(Vec::new()));
        let mut threads = Vec::new();
        for &port in ports {
            let (stop2, lines2) = (stop.clone(), lines.clone());
            let ready = Arc::new(AtomicBool::new(false));
            let ready2 = ready.clone();
            threads.push(std::thread::spawn(move || {
                // Bounded: one connection per Redis (re)start, and each connect attempt waits 50 ms.
                let born = Instant::now();
                for _ in 0..100_000 {
                    if stop2.load(Ordering::Relaxed) || born.elapsed() > MONITOR_LIFETIME {
                        return;
                    }
                    if monitor_once(port, &stop2, &lines2, &ready2).is_err() {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
            }));
            let deadline = Instant::now() + Duration::from_secs(10);
            while !ready.load(Ordering::Relaxed) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            assert!(
                ready.load(Ordering::Relaxed),
                "MONITOR on {port} did not start"
            );
        }
        Monitor {
            stop,
            lines,
            threads,
        }
    }

    /// Every node's lines, in Redis time order.
    fn stop(self) -> Vec<MonLine> {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads {
            let _ = thread.join();
        }
        let mut lines = self.lines.lock().expect("monitor lines").clone();
        lines.sort_by_key(|line| line.at);
        lines
    }
}

fn monitor_once(
    port: u16,
    stop: &AtomicBool,
    lines: &Mutex<Vec<MonLine>>,
    ready: &AtomicBool,
) -> std::io::Result<()> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let stream = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
    stream.set_read_timeout(Some(Duration::from_millis(200)))?;
    (&stream).write_all(b"MONITOR\r\n")?;
    let mut reader = BufReader::new(stream);
    let mut line = Vec::new();
    let mut state = MonState::default();
    let born = Instant::now();
    loop {
        if stop.load(Ordering::Relaxed) || born.elapsed() > MONITOR_LIFETIME {
            return Ok(());
        }
        match reader.read_until(b'\n', &mut line) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(_) if line.ends_with(b"\n") => {
                let text = String::from_utf8_lossy(&line).into_owned();
                line.clear();
                if text.starts_with("+OK") {
                    ready.store(true, Ordering::Relaxed);
                } else if let Some(mut parsed) = state.observe(text.trim_end()) {
                    parsed.node = port;
                    lines.lock().expect("monitor lines").push(parsed);
                }
            }
            Ok(_) => {} // partial line; keep reading
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(e),
        }
    }
}

/// `+1700000000.123456 [0 127.0.0.1:5555] "XREADGROUP" "GROUP" "g" "c" ...` -> a [`MonLine`] when the
/// command is watched, without fence replay (see [`MonState::observe`]).
#[cfg(test)]
fn parse_monitor_line(text: &str) -> Option<MonLine> {
    MonState::default().observe(text)
}

impl MonState {
    /// Reads one line of the node's feed, in order: a [`MonLine`] when the command is watched. A script's
    /// own commands (`[0 lua]`, fed after its `EVALSHA` line) only update the fence replay: the claims and
    /// acks they run are counted from their `EVALSHA` line, with the fence it names.
    fn observe(&mut self, text: &str) -> Option<MonLine> {
        let text = text.strip_prefix('+')?;
        let (time, rest) = text.split_once(' ')?;
        let (secs, micros) = time.split_once('.')?;
        let at = secs.parse::<u64>().ok()? * 1_000_000 + micros.parse::<u64>().ok()?;
        let rest = rest.strip_prefix('[')?;
        let (client, args) = rest.split_once(']')?;
        let from_script = client.split_whitespace().nth(1) == Some("lua");
        let port = client
            .split_whitespace()
            .nth(1)
            .and_then(|a| a.rsplit(':').next())
            .and_then(|p| p.parse().ok());
        let args = parse_quoted(args);
        let command = args.first()?.to_ascii_uppercase();
        if from_script {
            match (command.as_str(), args.get(1), args.get(2)) {
                ("DEL", Some(key), _) if key.starts_with(FENCE_PREFIX) => {
                    self.deleted.insert(key.clone());
                }
                ("XGROUP", _, Some(key)) if key.starts_with(FENCE_PREFIX) => {
                    self.deleted.remove(key);
                }
                _ => {}
            }
            return None;
        }
        // `EVALSHA <sha> 2 <shard> <fence> <command> <arguments after the shard>`: a claim behind the
        // fence, read as the command it runs (`<command> <shard> <arguments>`).
        let (command, args, fence) = match command.as_str() {
            "EVALSHA" | "EVAL" if args.get(4).is_some_and(|k| k.starts_with(FENCE_PREFIX)) => {
                let inner = args.get(5)?.to_ascii_uppercase();
                let mut run = vec![inner.clone(), args[3].clone()];
                run.extend_from_slice(&args[6..]);
                (inner, run, args.get(4).cloned())
            }
            "XREADGROUP" => {
                let streams = args
                    .iter()
                    .position(|a| a.eq_ignore_ascii_case("STREAMS"))?;
                let fence = args
                    .get(streams + 2)
                    .filter(|k| k.starts_with(FENCE_PREFIX))
                    .cloned();
                (command, args, fence)
            }
            _ => (command, args, None),
        };
        if !WATCHED.contains(&command.as_str()) {
            return None;
        }
        let (consumer, key) = match command.as_str() {
            "XREADGROUP" => {
                let streams = args
                    .iter()
                    .position(|a| a.eq_ignore_ascii_case("STREAMS"))?;
                (args.get(3).cloned(), args.get(streams + 1).cloned()?)
            }
            "XCLAIM" | "XAUTOCLAIM" => (args.get(3).cloned(), args.get(1).cloned()?),
            _ => (None, args.get(1).cloned()?),
        };
        // `XACK key group id...`, `XACKDEL key group mode IDS n id...`.
        let ids = match command.as_str() {
            "XACK" => args.iter().skip(3).cloned().collect(),
            "XACKDEL" => args.iter().skip(6).cloned().collect(),
            _ => Vec::new(),
        };
        Some(MonLine {
            at,
            port,
            node: 0,
            command,
            consumer,
            key,
            args: args[1..].join(" ").chars().take(120).collect(),
            refused: fence.is_some_and(|f| self.deleted.contains(&f)),
            ids,
        })
    }
}

// ------------------------------------------------------------------------------------------------
// The audit copy
// ------------------------------------------------------------------------------------------------

/// A task that copies the group's audit stream, as it grows, to the record server: an `empty` fault
/// would erase it, and the pause check needs every grant.
#[derive(Debug)]
struct AuditCopy {
    stop: Arc<AtomicBool>,
    /// The last copied source id.
    copied: Arc<Mutex<String>>,
    task: tokio::task::JoinHandle<Res<u64>>,
}

impl AuditCopy {
    async fn start(url: &str, rec: ConnectionManager) -> Res<AuditCopy> {
        // Its own connection: a blocking read would stall every other command on a shared one.
        let options = ConnectOptions {
            response_timeout: Some(Duration::from_secs(5)),
            connection_timeout: Some(Duration::from_millis(500)),
            retries: None,
            ..Default::default()
        };
        let from = RedisTarget::open(url)?.connect(options).await?;
        let stop = Arc::new(AtomicBool::new(false));
        let copied = Arc::new(Mutex::new("0-0".to_string()));
        let task = tokio::spawn(copy_audit(from, rec, copied.clone(), stop.clone()));
        Ok(AuditCopy { stop, copied, task })
    }

    /// With writes paused: waits until everything in the audit stream now is copied. Returns whether it
    /// was within the deadline.
    async fn catch_up(&self, conn: &mut redis::aio::MultiplexedConnection) -> bool {
        let last: Vec<(String, HashMap<String, String>)> = match redis::cmd("XREVRANGE")
            .arg(audit_key())
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(1)
            .query_async(conn)
            .await
        {
            Ok(last) => last,
            Err(_) => return false,
        };
        let Some((target, _)) = last.into_iter().next() else {
            return true;
        };
        let target = id_parts(&target);
        poll_until(Duration::from_secs(5), Duration::from_millis(5), || {
            let done = id_parts(&self.copied.lock().expect("copied")) >= target;
            std::future::ready(done)
        })
        .await
    }

    /// Stops the task; returns how many events it copied.
    async fn stop(self) -> Res<u64> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await?
    }
}

/// `<ms>-<seq>` as numbers, for ordering ids.
fn id_parts(id: &str) -> (u64, u64) {
    let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
    (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
}

async fn copy_audit(
    mut from: Connection,
    mut rec: ConnectionManager,
    copied: Arc<Mutex<String>>,
    stop: Arc<AtomicBool>,
) -> Res<u64> {
    type Reply = Option<Vec<(String, Vec<(String, Vec<(String, String)>)>)>>;
    let born = Instant::now();
    let mut last = "0-0".to_string();
    let mut count = 0;
    while !stop.load(Ordering::Relaxed) && born.elapsed() < MONITOR_LIFETIME {
        let reply: redis::RedisResult<Reply> = redis::cmd("XREAD")
            .arg("COUNT")
            .arg(1_000)
            .arg("BLOCK")
            .arg(100)
            .arg("STREAMS")
            .arg(audit_key())
            .arg(&last)
            .query_async(&mut from)
            .await;
        let entries = match reply {
            Ok(reply) => reply.into_iter().flatten().flat_map(|(_, e)| e),
            // Redis is restarting: try again.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let mut pipe = redis::pipe();
        let mut newest = None;
        for (id, fields) in entries {
            let cmd = pipe
                .cmd("XADD")
                .arg(AUDIT_COPY_KEY)
                .arg("*")
                .arg("src")
                .arg(&id);
            for (name, value) in fields {
                cmd.arg(name).arg(value);
            }
            count += 1;
            newest = Some(id);
        }
        let Some(newest) = newest else { continue };
        let () = pipe.query_async(&mut rec).await?;
        *copied.lock().expect("copied") = newest.clone();
        last = newest;
    }
    Ok(count)
}

// ------------------------------------------------------------------------------------------------
// Reading back
// ------------------------------------------------------------------------------------------------

/// One handle, as the worker recorded it.
#[derive(Debug, Clone)]
struct Record {
    key: String,
    seq: u64,
    shard: u32,
    id: String,
    member: String,
    epoch: i64,
    /// Handler start (worker wall clock, µs) and the time its record landed (Redis TIME, µs).
    t0: u64,
    t1: u64,
    deliveries: u32,
    pid: u32,
}

async fn read_records(conn: &mut ConnectionManager) -> Res<Vec<Record>> {
    let mut out = Vec::new();
    let mut start = "-".to_string();
    for _ in 0..100_000 {
        let page: Vec<(String, HashMap<String, String>)> = redis::cmd("XRANGE")
            .arg(LOG_KEY)
            .arg(&start)
            .arg("+")
            .arg("COUNT")
            .arg(2_000)
            .query_async(conn)
            .await?;
        let Some((last, _)) = page.last() else { break };
        start = format!("({last}");
        for (_, f) in &page {
            let get = |name: &str| f.get(name).cloned().unwrap_or_default();
            let num = |name: &str| get(name).parse::<u64>().unwrap_or(0);
            out.push(Record {
                key: get("k"),
                seq: num("s"),
                shard: num("sh") as u32,
                id: get("id"),
                member: get("m"),
                epoch: get("e").parse().unwrap_or(-1),
                t0: num("t0"),
                t1: num("t1"),
                deliveries: num("dc") as u32,
                pid: num("pid") as u32,
            });
        }
    }
    Ok(out)
}

/// A join (`MEMBER_JOINED`, `MEMBER_REJOINED`) or a grant (`SHARDS_ASSIGNED`) from the audit stream.
#[derive(Debug, Clone)]
struct AuditEvent {
    join: bool,
    member: String,
    epoch: i64,
    shards: Vec<u32>,
    /// The coordinator's `now` of the commit (Redis ms, here in µs): at or before the commit landed.
    at_us: u64,
}

/// The joins and grants of the audit copy on the record server.
async fn read_audit(rec: &mut ConnectionManager) -> Res<Vec<AuditEvent>> {
    let mut out = Vec::new();
    let mut start = "-".to_string();
    for _ in 0..10_000 {
        let page: Vec<(String, HashMap<String, String>)> = redis::cmd("XRANGE")
            .arg(AUDIT_COPY_KEY)
            .arg(&start)
            .arg("+")
            .arg("COUNT")
            .arg(2_000)
            .query_async(rec)
            .await?;
        let Some((last, _)) = page.last() else { break };
        start = format!("({last}");
        for (_, fields) in &page {
            let Some(event) = fields.get("event") else {
                continue;
            };
            let Ok(value) = serde_json::from_str::<serde_json::Value>(event) else {
                continue;
            };
            let join = match value["type"].as_str().unwrap_or_default() {
                "MEMBER_JOINED" | "MEMBER_REJOINED" => true,
                "SHARDS_ASSIGNED" => false,
                _ => continue,
            };
            let at_ms = fields
                .get("at")
                .and_then(|a| a.parse::<u64>().ok())
                .or_else(|| fields.get("src").map(|id| id_time_us(id) / 1000))
                .unwrap_or(0);
            out.push(AuditEvent {
                join,
                member: value["memberId"].as_str().unwrap_or_default().to_string(),
                epoch: value["memberEpoch"].as_i64().unwrap_or(-1),
                shards: value["shards"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|s| s.as_u64())
                            .map(|s| s as u32)
                            .collect()
                    })
                    .unwrap_or_default(),
                at_us: at_ms * 1000,
            });
        }
    }
    Ok(out)
}

/// `orders:7` -> 7.
fn shard_of(key: &str) -> Option<u32> {
    key.strip_prefix(STREAM)?.strip_prefix(':')?.parse().ok()
}

async fn pending_per_shard(conn: &mut Connection, shards: u32) -> Res<Vec<u64>> {
    let mut out = Vec::new();
    for shard in 0..shards {
        let reply: redis::Value = redis::cmd("XPENDING")
            .arg(format!("{STREAM}:{shard}"))
            .arg(GROUP)
            .query_async(conn)
            .await?;
        let count = match reply {
            redis::Value::Array(items) => match items.first() {
                Some(redis::Value::Int(n)) => *n as u64,
                _ => 0,
            },
            _ => 0,
        };
        out.push(count);
    }
    Ok(out)
}

// ------------------------------------------------------------------------------------------------
// Verification
// ------------------------------------------------------------------------------------------------

/// Why a handle is excused from the overlap and token checks: it was in flight across a fault window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InFlight {
    Pause,
    Outage,
}

fn in_flight_across(r: &Record, faults: &[FaultLog]) -> Option<InFlight> {
    for f in faults {
        if let (Some((stopped, cont)), Some((_, pid))) = (f.pause, &f.victim) {
            if r.pid == *pid && r.t0 <= stopped && r.t1 >= cont {
                return Some(InFlight::Pause);
            }
        }
        if let Some((down, up)) = f.outage {
            if r.t0 <= up && r.t1 >= down {
                return Some(InFlight::Outage);
            }
        }
    }
    None
}

#[derive(Debug, Default)]
struct PauseReport {
    victim: String,
    rejoin_ms: Option<u64>,
    /// Commands Redis accepted (the verdict fails on any).
    commands: usize,
    /// Commands that reached Redis and were refused by their ownership's fence.
    refused: usize,
    /// Acks that reached Redis late, each naming only entries this process had handled.
    late_acks: usize,
    first: Option<String>,
    handles: usize,
    first_handle: Option<String>,
    examples: Vec<String>,
    /// The audit stream (capped) no longer reaches back to the SIGCONT: the check may over-count.
    audit_incomplete: bool,
}

#[derive(Debug, Default)]
struct Verdict {
    produced: u64,
    handles: u64,
    unique: u64,
    lost: u64,
    /// Entries in Redis when an `empty` fault wiped it, never handled: gone with Redis, not lost.
    wiped: u64,
    lost_examples: Vec<String>,
    order_violations: u64,
    order_examples: Vec<String>,
    /// Handles that started while another owner's handle of the same shard was running.
    overlaps: u64,
    /// Pairs of such handles (one long handle can overlap many).
    overlap_pairs: u64,
    overlap_examples: Vec<String>,
    excused_pause: u64,
    excused_outage: u64,
    excused_not_stale: u64,
    /// Distinct (shard, token) that started after a higher token of the shard.
    token_decreases: u64,
    token_decrease_handles: u64,
    token_examples: Vec<String>,
    zombie_commands: u64,
    /// Commands of paused processes that Redis refused (their ownership's fence was gone): info.
    zombie_refused: u64,
    /// Late acks of paused processes naming only entries they handled: info.
    zombie_late_acks: u64,
    zombie_handles: u64,
    pauses: Vec<PauseReport>,
    pending: u64,
    pending_shards: Vec<(u32, u64)>,
    dead_letters: u64,
    forced_stops: u64,
    /// Workers that exited by themselves during the run (replaced).
    crashed: u64,
    faults: Vec<(String, String, f64, Option<f64>, String)>,
    /// (check, kind of the latest fault before the violation) -> violations.
    blamed: BTreeMap<(&'static str, String), u64>,
    monitor_lines: usize,
}

#[allow(clippy::too_many_arguments)]
fn verify(
    produced: &[Vec<u64>],
    records: &[Record],
    faults: &[FaultLog],
    audit: &[AuditEvent],
    monitor: &[MonLine],
    pending: &[u64],
    dead_letters: u64,
    forced: u64,
) -> Verdict {
    let mut v = Verdict {
        produced: produced.iter().map(|ids| ids.len() as u64).sum(),
        handles: records.len() as u64,
        dead_letters,
        forced_stops: forced,
        monitor_lines: monitor.len(),
        ..Verdict::default()
    };

    // Lost: every produced (key, seq) handled at least once; one that was in Redis when it was wiped and
    // never handled went with it ("wiped", per wipe: how many, and the oldest one's age at the wipe).
    let handled: HashSet<(&str, u64)> = records.iter().map(|r| (r.key.as_str(), r.seq)).collect();
    v.unique = handled.len() as u64;
    let wipes = wipes(faults);
    let mut wiped: BTreeMap<usize, (u64, u64)> = BTreeMap::new();
    for (seq, ids) in produced.iter().enumerate() {
        for (k, &at) in ids.iter().enumerate() {
            let key = key_name(k as u32);
            if handled.contains(&(key.as_str(), seq as u64)) {
                continue;
            }
            match wiped_by(&wipes, at) {
                Some(i) => {
                    v.wiped += 1;
                    let age = faults[i]
                        .outage
                        .map_or(0, |(down, _)| down.saturating_sub(at));
                    let w = wiped.entry(i).or_default();
                    *w = (w.0 + 1, w.1.max(age));
                }
                None => {
                    v.lost += 1;
                    v.blame("lost", at, faults);
                    if v.lost_examples.len() < 5 {
                        v.lost_examples.push(format!("{key}/{seq}"));
                    }
                }
            }
        }
    }

    // Per-key order: first handles (by start) of a key's seqs in increasing seq order.
    let mut by_key: BTreeMap<&str, Vec<&Record>> = BTreeMap::new();
    for r in records {
        by_key.entry(r.key.as_str()).or_default().push(r);
    }
    for (key, rs) in by_key.iter_mut() {
        rs.sort_by_key(|r| (r.t0, r.t1));
        let mut seen = HashSet::new();
        let mut max: Option<&Record> = None;
        for r in rs.iter() {
            if !seen.insert(r.seq) {
                continue; // a redelivery of an already-handled entry
            }
            match max {
                Some(m) if r.seq < m.seq => {
                    v.order_violations += 1;
                    // Every fault between the late entry's production (its id) and its first handle.
                    let produced_us =
                        r.id.split('-')
                            .next()
                            .and_then(|ms| ms.parse::<u64>().ok())
                            .map_or(r.t0, |ms| ms * 1000);
                    v.blame_window("order", produced_us, r.t0, faults);
                    if v.order_examples.len() < 5 {
                        v.order_examples.push(format!(
                            "{key}: seq {} (shard {}, {} epoch {}, dc {}) first handled after seq {} ({} epoch {}), {:.3} s later",
                            r.seq, r.shard, r.member, r.epoch, r.deliveries, m.seq, m.member, m.epoch,
                            (r.t0.saturating_sub(m.t0)) as f64 / 1e6
                        ));
                    }
                }
                _ => max = Some(r),
            }
        }
    }

    // Overlaps and fencing tokens, per shard in handle-start order.
    let mut by_shard: BTreeMap<u32, Vec<&Record>> = BTreeMap::new();
    for r in records {
        by_shard.entry(r.shard).or_default().push(r);
    }
    // Excused handles (shard, index), each counted once however many handles it overlapped.
    let mut excused_handles: HashSet<(u32, usize)> = HashSet::new();
    let mut stale: HashSet<(u32, &str, i64)> = HashSet::new();
    // Handles (shard, index) that started while another owner's handle of the shard was running.
    let mut overlapping: HashSet<(u32, usize)> = HashSet::new();
    let mut overlap_pairs = 0u64;
    for (shard, rs) in by_shard.iter_mut() {
        rs.sort_by_key(|r| (r.t0, r.t1));
        let excuse: Vec<Option<InFlight>> =
            rs.iter().map(|r| in_flight_across(r, faults)).collect();
        // Overlaps: a sweep keeping the handles still running at each start.
        let mut active: Vec<usize> = Vec::new();
        for (i, r) in rs.iter().enumerate() {
            active.retain(|&j| rs[j].t1 > r.t0);
            for &j in &active {
                let o = rs[j];
                if o.member == r.member && o.pid == r.pid {
                    continue;
                }
                // One of the two in flight across a fault window, with the smaller token: excused.
                let excused = match (excuse[j], excuse[i]) {
                    (Some(kind), None) if o.epoch < r.epoch => Some(kind),
                    (None, Some(kind)) if r.epoch < o.epoch => Some(kind),
                    _ => None,
                };
                match excused {
                    Some(kind) => {
                        let excused_one = if excuse[j].is_some() { j } else { i };
                        if excused_handles.insert((*shard, excused_one)) {
                            match kind {
                                InFlight::Pause => v.excused_pause += 1,
                                InFlight::Outage => v.excused_outage += 1,
                            }
                        }
                    }
                    None => {
                        if excuse[i].is_some() || excuse[j].is_some() {
                            v.excused_not_stale += 1;
                        }
                        overlap_pairs += 1;
                        if overlapping.insert((*shard, i)) {
                            v.overlaps += 1;
                            v.blame("overlap", r.t0, faults);
                        }
                        if v.overlap_examples.len() < 5 {
                            v.overlap_examples.push(format!(
                                "shard {shard}: {}@{} (pid {}) [{}..{}] and {}@{} (pid {}) [{}..{}] ({:.1} ms overlap)",
                                o.member, o.epoch, o.pid, o.id, rel(o.t0, o.t1),
                                r.member, r.epoch, r.pid, r.id, rel(r.t0, r.t1),
                                (o.t1.min(r.t1).saturating_sub(r.t0)) as f64 / 1e3
                            ));
                        }
                    }
                }
            }
            active.push(i);
        }
        // Tokens never decrease, the excused in-flight handles aside. Counted once per stale token.
        let mut max: Option<&Record> = None;
        for (i, r) in rs.iter().enumerate() {
            if excuse[i].is_some() {
                continue;
            }
            match max {
                // A smaller epoch, or the same epoch of another member (epochs are unique by design, so
                // a sink could not tell the two apart).
                Some(m) if r.epoch < m.epoch || (r.epoch == m.epoch && r.member != m.member) => {
                    v.token_decrease_handles += 1;
                    if stale.insert((*shard, r.member.as_str(), r.epoch)) {
                        v.token_decreases += 1;
                        // Across a metadata deletion the epochs restarted: blame that, not whatever
                        // fault came last.
                        match faults.iter().rev().find(|f| {
                            matches!(f.kind, FaultKind::DelMeta | FaultKind::Empty)
                                && m.t0 < f.at
                                && f.at <= r.t0
                        }) {
                            Some(f) => v.blame("token", f.at, faults),
                            None => v.blame("token", r.t0, faults),
                        }
                        if v.token_examples.len() < 5 {
                            v.token_examples.push(format!(
                                "shard {shard}: {}@{} (pid {}) started after {}@{} (pid {})",
                                r.member, r.epoch, r.pid, m.member, m.epoch, m.pid
                            ));
                        }
                    }
                }
                Some(m) if r.epoch == m.epoch => {}
                _ => max = Some(r),
            }
        }
    }

    v.overlap_pairs = overlap_pairs;

    // Item 1 at the Redis level: after SIGCONT (until the next fault), the paused process reads, claims
    // or acknowledges a shard only after the coordinator granted it that shard again (audit
    // `SHARDS_ASSIGNED` after the SIGCONT; a grant needs a rejoin first), and its handlers start only with
    // such a grant's token.
    for (n, f) in faults.iter().enumerate() {
        let (Some((_, cont)), Some((victim, pid))) = (f.pause, &f.victim) else {
            continue;
        };
        // What happens after the next fault (a metadata loss resets epochs, a restart reuses the member
        // ids) is not the pause's doing: the window ends there.
        let horizon = faults.get(n + 1).map(|g| g.at).unwrap_or(u64::MAX);
        let after_cont = |e: &&AuditEvent| e.at_us >= cont && e.at_us < horizon;
        let first_rejoin = audit
            .iter()
            .filter(after_cont)
            .filter(|e| e.join && f.members.contains(&e.member))
            .map(|e| e.at_us)
            .min();
        // Was `shard` granted after SIGCONT and by `at` to `member` (or, if unknown, to any of the
        // process's members), with an epoch at most `epoch` (if given)?
        let granted = |member: Option<&str>, shard: u32, at: u64, epoch: Option<i64>| {
            audit.iter().filter(after_cont).any(|e| {
                !e.join
                    && e.at_us <= at
                    && e.shards.contains(&shard)
                    && member.map_or(f.members.contains(&e.member), |m| e.member == m)
                    && epoch.is_none_or(|ep| e.epoch <= ep)
            })
        };
        let example = |line: &MonLine| {
            format!(
                "+{:.1} ms port {} {} {}",
                (line.at - cont) as f64 / 1e3,
                line.port.map_or("lua".to_string(), |p| p.to_string()),
                line.command,
                line.args
            )
        };
        let handled_by_victim: HashSet<&str> = records
            .iter()
            .filter(|r| r.pid == *pid)
            .map(|r| r.id.as_str())
            .collect();
        let mut report = PauseReport {
            victim: format!("{victim} (pid {pid})"),
            rejoin_ms: first_rejoin.map(|t| (t - cont) / 1000),
            audit_incomplete: audit.first().is_none_or(|e| e.at_us > cont),
            ..PauseReport::default()
        };
        for line in monitor {
            if line.at < cont || line.at >= horizon {
                continue;
            }
            let by_name = line
                .consumer
                .as_deref()
                .filter(|c| f.members.iter().any(|m| m == c));
            let by_port = line.port.is_some_and(|p| f.ports.contains(&(line.node, p)));
            if by_name.is_none() && !by_port {
                continue;
            }
            let Some(shard) = shard_of(&line.key) else {
                continue;
            };
            if line.refused {
                // It reached Redis, which refused it: the fence it names was gone.
                report.refused += 1;
                continue;
            }
            if granted(by_name, shard, line.at, None) {
                continue;
            }
            // Acks are not fenced in Redis: a late one must name only entries this process handled (it
            // acknowledges work that was done; the next owner handles them again).
            if !line.ids.is_empty()
                && line
                    .ids
                    .iter()
                    .all(|id| handled_by_victim.contains(id.as_str()))
            {
                report.late_acks += 1;
                if report.examples.len() < 4 {
                    report
                        .examples
                        .push(format!("late ack of its own: {}", example(line)));
                }
                continue;
            }
            report.commands += 1;
            v.blame("paused cmds", line.at, faults);
            if report.first.is_none() {
                report.first = Some(format!(
                    "{} {} {} +{:.1} ms",
                    line.command,
                    line.key,
                    line.consumer.as_deref().unwrap_or(""),
                    (line.at - cont) as f64 / 1e3
                ));
            }
            if report.examples.len() < 4 {
                report.examples.push(example(line));
            }
        }
        for r in records {
            if r.pid == *pid
                && r.t0 >= cont
                && r.t0 < horizon
                && !granted(Some(&r.member), r.shard, r.t0, Some(r.epoch))
            {
                report.handles += 1;
                v.blame("paused handles", r.t0, faults);
                if report.first_handle.is_none() {
                    report.first_handle = Some(format!(
                        "{}@{} shard {} {} +{:.1} ms",
                        r.member,
                        r.epoch,
                        r.shard,
                        r.id,
                        (r.t0 - cont) as f64 / 1e3
                    ));
                }
            }
        }
        v.zombie_commands += report.commands as u64;
        v.zombie_refused += report.refused as u64;
        v.zombie_late_acks += report.late_acks as u64;
        v.zombie_handles += report.handles as u64;
        v.pauses.push(report);
    }

    v.pending_shards = pending
        .iter()
        .enumerate()
        .filter(|(_, &n)| n > 0)
        .map(|(i, &n)| (i as u32, n))
        .collect();
    v.pending = pending.iter().sum();

    // Recovery: from the fault (a Redis stall: from when Redis answered again) until every shard had a
    // handle started after it (by anyone but a paused victim); approximate, from the records.
    let t_first = faults.first().map(|f| f.at).unwrap_or(0);
    for (i, f) in faults.iter().enumerate() {
        let excluded_pid = f.pause.and(f.victim.as_ref().map(|(_, p)| *p));
        let from = match f.kind {
            FaultKind::Pause | FaultKind::Sleep => f.outage.map_or(f.at, |(_, up)| up),
            _ => f.at,
        };
        let mut worst: Option<u64> = Some(0);
        let mut earliest: Option<u64> = None;
        for rs in by_shard.values() {
            let first = rs
                .iter()
                .filter(|r| r.t0 >= from && Some(r.pid) != excluded_pid)
                .map(|r| r.t0)
                .min();
            match first {
                Some(t) => {
                    worst = worst.map(|w| w.max(t - from));
                    earliest = Some(earliest.map_or(t, |e| e.min(t)));
                }
                None => worst = None,
            }
        }
        let resumed = match (f.kind, earliest) {
            (FaultKind::Pause | FaultKind::Sleep, Some(t)) => format!(
                "; first handle {:.0} ms after Redis answered",
                (t - from) as f64 / 1e3
            ),
            _ => String::new(),
        };
        v.faults.push((
            f.kind.name().to_string(),
            f.victim
                .as_ref()
                .map(|(n, p)| format!("{n}/{p}"))
                .unwrap_or_else(|| "-".into()),
            (f.at.saturating_sub(t_first)) as f64 / 1e6,
            worst.map(|w| w as f64 / 1e6),
            match wiped.get(&i) {
                Some((n, age)) => format!(
                    "{}{resumed}; {n} unhandled entries wiped (oldest {:.2} s old)",
                    f.note,
                    *age as f64 / 1e6
                ),
                None => format!("{}{resumed}", f.note),
            },
        ));
    }
    v
}

fn rel(t0: u64, t1: u64) -> String {
    format!(
        "{}.{:06}+{:.1}ms",
        t0 / 1_000_000,
        t0 % 1_000_000,
        (t1 - t0.min(t1)) as f64 / 1e3
    )
}

impl Verdict {
    /// Counts a violation against the kind of the latest fault that began before `at`.
    fn blame(&mut self, check: &'static str, at: u64, faults: &[FaultLog]) {
        let kind = faults
            .iter()
            .rev()
            .find(|f| f.at <= at)
            .map_or("(none)", |f| f.kind.name());
        *self.blamed.entry((check, kind.to_string())).or_default() += 1;
    }

    /// Counts a violation against every kind of fault that began in `[from, to]` (`a+b`), or the latest
    /// one before `to` when none did.
    fn blame_window(&mut self, check: &'static str, from: u64, to: u64, faults: &[FaultLog]) {
        let mut kinds: Vec<&str> = faults
            .iter()
            .filter(|f| f.at >= from && f.at <= to)
            .map(|f| f.kind.name())
            .collect();
        kinds.dedup();
        if kinds.is_empty() {
            self.blame(check, to, faults);
        } else {
            *self.blamed.entry((check, kinds.join("+"))).or_default() += 1;
        }
    }

    fn checks(&self) -> Vec<(&'static str, u64, bool)> {
        vec![
            ("lost (never handled)", self.lost, self.lost == 0),
            (
                "per-key order violations",
                self.order_violations,
                self.order_violations == 0,
            ),
            (
                "overlapping handles, 2 owners",
                self.overlaps,
                self.overlaps == 0,
            ),
            (
                "fencing token decreases (tokens)",
                self.token_decreases,
                self.token_decreases == 0,
            ),
            (
                "paused proc cmds w/o re-grant",
                self.zombie_commands,
                self.zombie_commands == 0,
            ),
            (
                "paused proc handles w/o re-grant",
                self.zombie_handles,
                self.zombie_handles == 0,
            ),
            ("XPENDING at the end", self.pending, self.pending == 0),
        ]
    }

    fn ok(&self) -> bool {
        self.checks().iter().all(|(_, _, ok)| *ok)
    }

    fn failed(&self) -> Vec<String> {
        self.checks()
            .into_iter()
            .filter(|(_, _, ok)| !ok)
            .map(|(name, n, _)| format!("{name} = {n}"))
            .collect()
    }

    fn print(&self) {
        let mut out = String::new();
        let _ = writeln!(out, "\nfaults:");
        let _ = writeln!(
            out,
            "  {:>2} {:>7}  {:<8} {:<12} {:>9}  note",
            "#", "at s", "kind", "victim", "recovery"
        );
        for (i, (kind, victim, at, recovery, note)) in self.faults.iter().enumerate() {
            let _ = writeln!(
                out,
                "  {:>2} {:>7.1}  {:<8} {:<12} {:>9}  {}",
                i + 1,
                at,
                kind,
                victim,
                recovery
                    .map(|r| format!("{r:.2} s"))
                    .unwrap_or_else(|| "never".into()),
                note
            );
        }
        if !self.pauses.is_empty() {
            let _ = writeln!(
                out,
                "\npauses (after SIGCONT until the next fault: MONITOR cmds on shards not re-granted; handle starts without a fresh grant):"
            );
            for p in &self.pauses {
                let _ = writeln!(
                    out,
                    "  {:<16} rejoin after {:>8}  read/ack/claim cmds accepted {:>4} (first: {}), refused by the fence {:>4}, late acks of its own handled entries {:>4}  handle starts w/o grant {:>4} (first: {})",
                    p.victim,
                    p.rejoin_ms.map(|ms| format!("{ms} ms")).unwrap_or_else(|| "never".into()),
                    p.commands,
                    p.first.as_deref().unwrap_or("-"),
                    p.refused,
                    p.late_acks,
                    p.handles,
                    p.first_handle.as_deref().unwrap_or("-")
                );
                for e in &p.examples {
                    let _ = writeln!(out, "    {e}");
                }
                if p.audit_incomplete {
                    let _ = writeln!(
                        out,
                        "    (audit stream trimmed before this SIGCONT: counts may be too high)"
                    );
                }
            }
        }
        let _ = writeln!(
            out,
            "\n+-----------------------------------+---------+--------+"
        );
        let _ = writeln!(
            out,
            "| check                             |   value | status |"
        );
        let _ = writeln!(
            out,
            "+-----------------------------------+---------+--------+"
        );
        for (name, value) in [
            ("produced", self.produced),
            ("handled (unique)", self.unique),
            ("wiped with Redis (never handled)", self.wiped),
            ("handles (total)", self.handles),
            (
                "duplicates (redeliveries)",
                self.handles - self.unique.min(self.handles),
            ),
            ("excused: in flight, pause", self.excused_pause),
            ("excused: in flight, Redis down", self.excused_outage),
            ("overlapping pairs (info)", self.overlap_pairs),
            ("paused cmds refused by fence (info)", self.zombie_refused),
            ("paused late acks, own work (info)", self.zombie_late_acks),
            (
                "handles with a decreased token",
                self.token_decrease_handles,
            ),
            ("dead letters", self.dead_letters),
            ("workers SIGKILLed at the end", self.forced_stops),
            ("workers that exited by themselves", self.crashed),
            ("MONITOR lines (watched cmds)", self.monitor_lines as u64),
        ] {
            let _ = writeln!(out, "| {name:<33} | {value:>7} |        |");
        }
        for (name, value, ok) in self.checks() {
            let _ = writeln!(
                out,
                "| {name:<33} | {value:>7} | {:<6} |",
                if ok { "ok" } else { "FAIL" }
            );
        }
        let _ = writeln!(
            out,
            "+-----------------------------------+---------+--------+"
        );
        if self.excused_not_stale > 0 {
            let _ = writeln!(
                out,
                "  {} overlaps involved a handle in flight across a fault window WITHOUT a stale token",
                self.excused_not_stale
            );
        }
        for (title, examples) in [
            ("lost", &self.lost_examples),
            ("order", &self.order_examples),
            ("overlap", &self.overlap_examples),
            ("token", &self.token_examples),
        ] {
            for e in examples {
                let _ = writeln!(out, "  {title}: {e}");
            }
        }
        if !self.blamed.is_empty() {
            let _ = writeln!(
                out,
                "  violations by the latest fault before them (order: every fault between the late entry's production and its first handle):"
            );
            for ((check, kind), n) in &self.blamed {
                let _ = writeln!(out, "    {check:<15} after {kind:<8} {n:>6}");
            }
        }
        if !self.pending_shards.is_empty() {
            let _ = writeln!(out, "  pending per shard: {:?}", self.pending_shards);
        }
        let _ = writeln!(out, "{}", if self.ok() { "PASS" } else { "FAIL" });
        println!("{out}");
    }
}

#[test]
fn monitor_lines_parse() {
    let line = r#"+1700000000.012345 [0 127.0.0.1:51234] "XREADGROUP" "GROUP" "chaos" "w1-m0" "COUNT" "20" "STREAMS" "orders:3" ">""#;
    let m = parse_monitor_line(line).expect("watched");
    assert_eq!(m.at, 1_700_000_000_012_345);
    assert_eq!(m.port, Some(51234));
    assert_eq!(m.consumer.as_deref(), Some("w1-m0"));
    assert_eq!(m.key, "orders:3");
    let ack = r#"+1700000000.5 [0 127.0.0.1:1] "XACK" "orders:1" "chaos" "1-0" "2-0""#;
    let acked = parse_monitor_line(ack).expect("watched");
    assert_eq!(
        (acked.consumer, acked.ids),
        (None, vec!["1-0".into(), "2-0".into()])
    );
    assert!(parse_monitor_line(r#"+1.000001 [0 lua] "GET" "x""#).is_none());
    // The fence replay: a read or a fenced claim naming a fence a script deleted is refused by Redis.
    let fence = "sl:fence:{orders:3}:7:chaos";
    let read = format!(
        r#"+2.0 [0 127.0.0.1:2] "XREADGROUP" "GROUP" "chaos" "w1-m0" "COUNT" "20" "STREAMS" "orders:3" "{fence}" ">" ">""#
    );
    let claim = format!(
        r#"+2.0 [0 127.0.0.1:2] "EVALSHA" "ab12" "2" "orders:3" "{fence}" "XAUTOCLAIM" "chaos" "w1-m0" "0" "0-0""#
    );
    let mut state = MonState::default();
    assert!(!state.observe(&read).expect("watched").refused);
    let claimed = state.observe(&claim).expect("watched");
    assert_eq!(
        (
            claimed.command.as_str(),
            claimed.consumer.as_deref(),
            claimed.key.as_str()
        ),
        ("XAUTOCLAIM", Some("w1-m0"), "orders:3")
    );
    assert!(!claimed.refused);
    assert!(state
        .observe(&format!(r#"+1.5 [0 lua] "DEL" "{fence}""#))
        .is_none());
    assert!(state.observe(&read).expect("watched").refused);
    assert!(state.observe(&claim).expect("watched").refused);
    state.observe(&format!(
        r#"+3.0 [0 lua] "XGROUP" "CREATE" "{fence}" "chaos" "$" "MKSTREAM""#
    ));
    assert!(!state.observe(&read).expect("watched").refused);
    assert_eq!(parse_quoted(r#""a\"b" "\x41c""#), vec!["a\"b", "Ac"]);
}

#[test]
fn schedule_is_seeded_and_covers_every_kind() {
    let s = short_scenario(7, FaultKind::ALL.to_vec());
    let a = schedule(&s);
    let b = schedule(&s);
    assert_eq!(format!("{a:?}"), format!("{b:?}"));
    let kinds: HashSet<FaultKind> = a.iter().map(|f| f.kind).collect();
    assert_eq!(kinds.len(), FaultKind::ALL.len(), "{a:?}");
    // The CI run restarts Redis empty at least once.
    let ci = schedule(&short_scenario(CI_SEED, FaultKind::ALL.to_vec()));
    assert!(ci.iter().any(|f| f.kind == FaultKind::Empty), "{ci:?}");
}

#[test]
fn an_unhandled_entry_is_wiped_by_the_first_empty_restart_after_it() {
    let fault = |kind, at: u64| FaultLog {
        kind,
        victim: None,
        at,
        pause: None,
        outage: (kind == FaultKind::Empty).then_some((at, at + 50)),
        ports: Vec::new(),
        members: Vec::new(),
        note: String::new(),
    };
    let faults = [
        fault(FaultKind::Empty, 1_000),
        fault(FaultKind::Redis, 2_000),
        fault(FaultKind::Empty, 3_000),
    ];
    let wipes = wipes(&faults);
    assert_eq!(wipes.len(), 2);
    assert_eq!(wiped_by(&wipes, 999), Some(0));
    assert_eq!(wiped_by(&wipes, 1_100), Some(2));
    assert_eq!(wiped_by(&wipes, 2_999), Some(2));
    // Written by the server restarted after the last wipe: must be handled.
    assert_eq!(wiped_by(&wipes, 3_100), None);
}
