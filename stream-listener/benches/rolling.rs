//! A rolling restart, as Kubernetes does one: process after process, a new pod starts, becomes ready
//! (its members joined), then the old pod stops gracefully (its members leave). Measured: how many shard
//! moves the roll made against the minimum, and the longest time any shard had no owner reading it, in
//! heartbeat intervals (the bound: one interval plus the drain; the drain here is instant).
//!
//! Two rolls, each on a fresh redis-server: a **Deployment** (member ids from the pod, new ones for the new
//! pod, as with pod IPs: the new pod starts first, then the old one leaves) and a **StatefulSet** with
//! static membership (the pod stops, announcing a restart, then comes back under the same ids: the
//! group keeps its shards for it).
//!
//! `cargo bench -p stream-listener --bench rolling`
//! (`SL_BENCH_PROCESSES`: processes, default 100; `SL_BENCH_MEMBERS_PER_PROCESS`: default 4;
//! `SL_BENCH_SHARDS`: default 1024; `SL_BENCH_ROLL`: `deployment`, `statefulset` or `both`, the default.)
//!
//! Every member is a real [`MemberLoop`] (production pacing, 1 s heartbeats, its own store and connection)
//! with a consumption layer that drains at once: a `Revoke` is reported REVOKED on the spot, as a consumer
//! with nothing in flight would. All members live in this process on a 2-worker runtime. Ownership is
//! sampled every 10 ms from the members' own status (the shards each one reads now), so "unowned" means
//! that no member was reading the shard, whatever the metadata said.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use stream_listener::clock::StoreMillis;
use stream_listener::coordinator::metadata::GroupConfig;
use stream_listener::coordinator::projection::GroupState;
use stream_listener::member::heartbeat::{MemberLoop, MemberStatus};
use stream_listener::member::lifecycle::{OwnershipDeadline, ShardCommand, ShardReport};
use stream_listener::member::session::{MemberIdentity, MemberSession, Phase};
use stream_listener::store::wakeup::Wakeups;
use stream_listener::store::{GroupKeys, GroupStore};
use stream_listener::RedisTarget;
use stream_listener_test_support::aio::connect_with_timeouts;
use stream_listener_test_support::{env_u64, RedisServer};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

const STREAM: &str = "bench";
const GROUP: &str = "rolling";

async fn connect(url: &str) -> ConnectionManager {
    connect_with_timeouts(url, Duration::from_secs(5), Some(1)).await
}

/// One running member: its status, its stop switch and its task.
struct Member {
    status: watch::Receiver<MemberStatus>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

async fn start_member(
    url: &str,
    id: String,
    shards: u32,
    config: GroupConfig,
    wakeups: &Wakeups,
    restarts: bool,
) -> Member {
    let store =
        GroupStore::create(connect(url).await, STREAM, GROUP, shards, config).expect("store");
    let identity = MemberIdentity {
        member_id: Arc::from(id.as_str()),
        member_name: None,
        weight: 1,
        runtime_max_concurrency: 1,
    };
    let salt = id
        .bytes()
        .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64));
    let session = MemberSession::new(identity, config.session_timeout_ms, salt ^ rand_salt())
        .restarts(restarts);
    let (commands_tx, mut commands_rx) = mpsc::unbounded_channel();
    let (reports_tx, reports_rx) = mpsc::unbounded_channel();
    let (stop, stop_rx) = watch::channel(false);
    let (status_tx, status) = watch::channel(MemberStatus::default());
    tokio::spawn(async move {
        while let Some(command) = commands_rx.recv().await {
            if let ShardCommand::Revoke { shard } = command {
                let _ = reports_tx.send(ShardReport::Revoked { shard });
            }
        }
    });
    let member = MemberLoop::new(
        session,
        store,
        OwnershipDeadline::new(),
        commands_tx,
        reports_rx,
        stop_rx,
    )
    .with_status(status_tx)
    .with_wakeup(wakeups.register(&id));
    let task = tokio::spawn(async move {
        let _ = member.run().await;
    });
    Member { status, stop, task }
}

/// A process's members, sharing its wake-up subscription as the runtime's members do.
/// Differs between incarnations of one member id (their request ids must).
fn rand_salt() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(Instant::now())
}

async fn start_process(
    url: &str,
    name: &str,
    per_process: usize,
    shards: u32,
    restarts: bool,
) -> (Vec<Member>, Wakeups) {
    let channel = GroupKeys::new(STREAM, GROUP).wake;
    let wakeups = Wakeups::start(RedisTarget::open(url).expect("url"), channel);
    wakeups.subscribed(Duration::from_secs(1)).await;
    let mut members = Vec::with_capacity(per_process);
    for k in 0..per_process {
        let id = format!("{name}-{k}");
        members
            .push(start_member(url, id, shards, GroupConfig::default(), &wakeups, restarts).await);
    }
    (members, wakeups)
}

/// Who reads each shard, from the members' status, sampled; tracks moves and unowned stretches.
#[derive(Default)]
struct Ownership {
    /// The member index reading each shard at the last sample (`None`: nobody).
    owner: BTreeMap<u32, Option<usize>>,
    /// Since when each currently unowned shard has been unowned.
    unowned_since: BTreeMap<u32, Instant>,
    /// Grants observed: a shard newly read by a member that did not read it at the last sample.
    moves: u64,
    /// Every unowned stretch that ended, with its shard and the member that then read it.
    gaps: Vec<(Duration, u32, usize)>,
    /// Samples where a shard was read by two members at once.
    overlaps: u64,
}

impl Ownership {
    fn sample(&mut self, members: &[(usize, &watch::Receiver<MemberStatus>)], shards: u32) {
        let now = Instant::now();
        let mut readers: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for (index, status) in members {
            for &shard in &status.borrow().owned {
                readers.entry(shard).or_default().push(*index);
            }
        }
        for shard in 0..shards {
            let who = readers.get(&shard);
            if who.is_some_and(|w| w.len() > 1) {
                self.overlaps += 1;
            }
            let now_owner = who.and_then(|w| w.first().copied());
            let before = self.owner.insert(shard, now_owner).flatten();
            match (before, now_owner) {
                (_, None) => {
                    self.unowned_since.entry(shard).or_insert(now);
                }
                (before, Some(owner)) => {
                    if before != Some(owner) {
                        self.moves += 1;
                    }
                    if let Some(since) = self.unowned_since.remove(&shard) {
                        self.gaps.push((now - since, shard, owner));
                    }
                }
            }
        }
    }
}

fn main() {
    let processes = env_u64("SL_BENCH_PROCESSES", 100) as usize;
    let per_process = env_u64("SL_BENCH_MEMBERS_PER_PROCESS", 4) as usize;
    let shards = env_u64("SL_BENCH_SHARDS", 1024) as u32;
    // Under `cargo test --benches` run a token roll to prove it works.
    let (processes, shards) = if std::env::args().any(|a| a == "--bench") {
        (processes, shards)
    } else {
        (3, 16)
    };
    let interval = Duration::from_millis(GroupConfig::default().heartbeat_interval_ms as u64);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let modes: &[bool] = match std::env::var("SL_BENCH_ROLL").as_deref() {
        Ok("deployment") => &[false],
        Ok("statefulset") => &[true],
        _ => &[false, true],
    };
    println!(
        "rolling restart bench: {processes} processes x {per_process} members, {shards} shards, heartbeat {} ms",
        interval.as_millis(),
    );
    for &stateful in modes {
        let redis = RedisServer::start();
        println!(
            "\n{} (redis-server on port {})",
            if stateful {
                "StatefulSet, static membership: each pod stops (announcing a restart), then comes back under its ids"
            } else {
                "Deployment: each new pod starts and becomes ready, then the old pod leaves"
            },
            redis.port()
        );
        runtime.block_on(roll(
            &redis.url(),
            processes,
            per_process,
            shards,
            interval,
            stateful,
        ));
    }
}

async fn roll(
    url: &str,
    processes: usize,
    per_process: usize,
    shards: u32,
    interval: Duration,
    stateful: bool,
) {
    {
        let url = url.to_string();
        let mut observer = GroupStore::create(
            connect(&url).await,
            STREAM,
            GROUP,
            shards,
            GroupConfig::default(),
        )
        .expect("store");
        // All members, old and new, by index; `alive[i]` while member i runs.
        let mut members: Vec<Member> = Vec::new();
        let mut processes_now: Vec<Vec<usize>> = Vec::new();
        // Each process's wake-up subscription, dropped when the process stops.
        let mut subscriptions: Vec<Option<Wakeups>> = Vec::new();
        for p in 0..processes {
            let (started, wakeups) =
                start_process(&url, &format!("old{p}"), per_process, shards, stateful).await;
            subscriptions.push(Some(wakeups));
            let first = members.len();
            members.extend(started);
            processes_now.push((first..members.len()).collect());
        }
        let converge_deadline = Instant::now() + Duration::from_secs(120);
        let all = processes * per_process;
        loop {
            if let Ok((_, coordinator)) = observer.load().await {
                let view = coordinator.projection(StoreMillis(0));
                let live = view
                    .members
                    .iter()
                    .filter(|m| m.lease_deadline_ms > 0)
                    .count();
                let granted: usize = view.members.iter().map(|m| m.owned.len()).sum();
                if view.state == GroupState::Stable && live == all && granted == shards as usize {
                    break;
                }
            }
            assert!(
                Instant::now() < converge_deadline,
                "the old generation never converged"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        println!("  old generation converged: {all} members, every shard granted, STABLE");

        let mut ownership = Ownership::default();
        let mut alive: Vec<usize> = (0..members.len()).collect();
        let sample = |ownership: &mut Ownership, members: &[Member], alive: &[usize]| {
            let watched: Vec<(usize, &watch::Receiver<MemberStatus>)> =
                alive.iter().map(|&i| (i, &members[i].status)).collect();
            ownership.sample(&watched, shards);
        };
        sample(&mut ownership, &members, &alive);
        let moves_before = ownership.moves;
        let stats_before = stream_listener::store::stats();
        let roll_start = Instant::now();
        let step_limit = Duration::from_secs(60);
        for (p, old) in processes_now.iter().enumerate() {
            let step_start = Instant::now();
            // A StatefulSet replaces a pod in place: it stops (its members give their shards back and
            // leave announcing the restart), then starts under the same name, so with the same member
            // ids. A Deployment starts the new pod first and stops the old one once the new is ready.
            let starts_first = !stateful;
            for start in [starts_first, !starts_first] {
                if start {
                    // The new pod starts and becomes ready: each of its members joined (has an epoch).
                    let name = if stateful {
                        format!("old{p}")
                    } else {
                        format!("new{p}")
                    };
                    let (started, wakeups) =
                        start_process(&url, &name, per_process, shards, stateful).await;
                    subscriptions.push(Some(wakeups));
                    let first = members.len();
                    members.extend(started);
                    let new: Vec<usize> = (first..members.len()).collect();
                    alive.extend(&new);
                    while !new
                        .iter()
                        .all(|&i| members[i].status.borrow().phase == Phase::Member)
                    {
                        assert!(
                            step_start.elapsed() < step_limit,
                            "process {name} never became ready"
                        );
                        sample(&mut ownership, &members, &alive);
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                } else {
                    // The old pod stops gracefully: its members give their shards back and leave.
                    for &i in old {
                        let _ = members[i].stop.send(true);
                    }
                    while !old.iter().all(|&i| members[i].task.is_finished()) {
                        assert!(
                            step_start.elapsed() < step_limit,
                            "process old{p} never stopped"
                        );
                        sample(&mut ownership, &members, &alive);
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    alive.retain(|i| !old.contains(i));
                    subscriptions[p] = None;
                }
            }
        }
        let rolled = roll_start.elapsed();
        // Until every shard is read again by the new generation.
        let settle_deadline = Instant::now() + Duration::from_secs(60);
        while !ownership.unowned_since.is_empty() || ownership.owner.values().any(Option::is_none) {
            assert!(
                Instant::now() < settle_deadline,
                "shards stayed unowned after the roll"
            );
            sample(&mut ownership, &members, &alive);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let after = stream_listener::store::stats();
        let moves = ownership.moves - moves_before;
        let mut gaps = ownership.gaps.clone();
        gaps.sort();
        let (longest, shard, _) = gaps.last().copied().unwrap_or_default();
        let at =
            |q: f64| gaps.get(((gaps.len() as f64 * q) as usize).min(gaps.len().saturating_sub(1)));
        let ms = |g: Option<&(Duration, u32, usize)>| g.map_or(0, |g| g.0.as_millis());
        let to_new: Vec<_> = gaps.iter().filter(|g| g.2 >= all).collect();
        println!(
            "  rolled {processes} processes in {:.1} s ({:.2} s per process)",
            rolled.as_secs_f64(),
            rolled.as_secs_f64() / processes as f64
        );
        println!(
            "  shard moves: {moves} for {shards} shards = {:.2} per shard (minimum 1: every shard sat on an old \
             member that left)",
            moves as f64 / shards as f64
        );
        println!(
            "  longest time a shard had no member reading it: {} ms = {:.2} heartbeat intervals (shard {shard}; \
             goal <= 1 interval + the drain, here instant: {})",
            longest.as_millis(),
            longest.as_secs_f64() / interval.as_secs_f64(),
            if longest <= interval { "met" } else { "NOT met" }
        );
        println!(
            "  unowned stretches: {}, p50 {} ms, p90 {} ms, p99 {} ms, {} longer than one interval",
            gaps.len(),
            ms(at(0.5)),
            ms(at(0.9)),
            ms(at(0.99)),
            gaps.iter().filter(|g| g.0 > interval).count()
        );
        println!(
            "  of which {} went to a member of the new generation (p50 {} ms), {} to an old member that left later \
             (p50 {} ms)",
            to_new.len(),
            to_new.get(to_new.len() / 2).map_or(0, |g| g.0.as_millis()),
            gaps.len() - to_new.len(),
            {
                let old: Vec<_> = gaps.iter().filter(|g| g.2 < all).collect();
                old.get(old.len() / 2).map_or(0, |g| g.0.as_millis())
            }
        );
        println!(
            "  samples with a shard read by two members at once: {}",
            ownership.overlaps
        );
        let commits = after.commits - stats_before.commits;
        println!(
            "  store work during the roll: {commits} commits ({:.1} per process), {} refused, {:.1} KB committed \
             per process; {:.0} snapshot loads ({:.1} MB) per process",
            commits as f64 / processes as f64,
            after.conflicts - stats_before.conflicts,
            (after.commit_bytes - stats_before.commit_bytes) as f64 / processes as f64 / 1024.0,
            (after.loads - stats_before.loads) as f64 / processes as f64,
            (after.load_bytes - stats_before.load_bytes) as f64 / processes as f64 / 1024.0 / 1024.0
        );
        for &i in &alive {
            let _ = members[i].stop.send(true);
        }
        for member in members {
            let _ = tokio::time::timeout(Duration::from_secs(10), member.task).await;
        }
    }
}
