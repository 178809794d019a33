//! The user's lifecycle hooks and pause / resume, against real Redis: hooks in order across a rebalance
//! (a shard's next owner hears of it only after the last owner's revoked hook returned), `on_fenced` when
//! an operator fences the member, a panicking hook that does not stop the member, an annotated listener's
//! hooks given to the runtime by its name, pause within one poll while entries keep arriving, resume
//! handling everything, an unknown id or name refused by name, and a restart under static membership that
//! takes its own shards back without moving them anywhere else.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stream_listener::consumer::LifecycleHooks;
use stream_listener::coordinator::events::AuditEvent;
use stream_listener::coordinator::AdminCommand;
use stream_listener::member::session::Phase;
use stream_listener::store::{GroupKeys, GroupStore};
use stream_listener::{ConsumerBuilder, Message, RuntimeError};
use stream_listener_test_support::aio::{connect, wait_until};
use stream_listener_test_support::RedisServer;
use stream_listener_tests::{producer, test_runtime, Order, TIMING};
use tokio::time::Instant;

async fn produce(url: &str, stream: &str, shards: u32, from: u32, count: u32) {
    let producer = producer(url, stream, shards).await;
    let batch: Vec<(String, Order)> = (from..from + count)
        .map(|seq| {
            let key = format!("k{}", seq % 16);
            (key.clone(), Order { key, seq })
        })
        .collect();
    producer.send_batch(&batch).await.unwrap();
}

/// One hook call: (global sequence, member, event, shards).
type Event = (usize, &'static str, &'static str, Vec<u32>);

#[derive(Clone, Default)]
struct Journal {
    events: Arc<Mutex<Vec<Event>>>,
    seq: Arc<AtomicUsize>,
}

impl Journal {
    fn push(&self, member: &'static str, event: &'static str, shards: Vec<u32>) {
        let seq = self.seq.fetch_add(1, Ordering::SeqCst);
        self.events
            .lock()
            .unwrap()
            .push((seq, member, event, shards));
    }

    fn events(&self) -> Vec<Event> {
        let mut events = self.events.lock().unwrap().clone();
        events.sort_by_key(|e| e.0);
        events
    }

    /// Shards `member` owns according to its hooks.
    fn owned(&self, member: &str) -> BTreeSet<u32> {
        let mut owned = BTreeSet::new();
        for (_, m, event, shards) in self.events() {
            if m != member {
                continue;
            }
            for shard in shards {
                match event {
                    "assigned" => {
                        owned.insert(shard);
                    }
                    _ => {
                        owned.remove(&shard);
                    }
                }
            }
        }
        owned
    }

    fn hooked(&self, builder: ConsumerBuilder, member: &'static str) -> ConsumerBuilder {
        let (a, r, f) = (self.clone(), self.clone(), self.clone());
        builder
            .on_shards_assigned(move |shards| {
                let journal = a.clone();
                async move { journal.push(member, "assigned", shards) }
            })
            .on_shards_revoked(move |shards| {
                let journal = r.clone();
                async move {
                    // A slow hook: the next owner must still hear of the shard only after it returned.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    journal.push(member, "revoked", shards)
                }
            })
            .on_fenced(move |shards| {
                let journal = f.clone();
                async move { journal.push(member, "fenced", shards) }
            })
    }
}

fn member(stream: &str, id: &str, seen: Arc<Mutex<BTreeSet<u32>>>) -> ConsumerBuilder {
    ConsumerBuilder::new(stream, "g")
        .member_id(id)
        .runtime_max_concurrency(2)
        .batch_size(10)
        .handler(move |msg: Message<Order>| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().insert(msg.payload.seq);
                Ok::<(), String>(())
            }
        })
}

async fn start(url: &str, builder: ConsumerBuilder) -> stream_listener::RunningRuntime {
    test_runtime(url)
        .default_shard_count(4)
        .consumer(builder)
        .start()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hooks_are_called_in_order_across_a_rebalance() {
    let redis = RedisServer::start();
    let url = redis.url();
    produce(&url, "hooked", 4, 0, 200).await;
    let journal = Journal::default();
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let a = start(
        &url,
        journal.hooked(member("hooked", "a", seen.clone()), "a"),
    )
    .await;
    let all: BTreeSet<u32> = (0..4).collect();
    wait_until("a owns every shard", Duration::from_secs(20), || {
        journal.owned("a") == all
    })
    .await;
    let b = start(
        &url,
        journal.hooked(member("hooked", "b", seen.clone()), "b"),
    )
    .await;
    wait_until("b owns two shards", Duration::from_secs(20), || {
        journal.owned("b").len() == 2 && journal.owned("a").len() == 2
    })
    .await;
    // b leaves: its shards go back to a.
    b.stop().await.unwrap();
    wait_until("a owns every shard again", Duration::from_secs(20), || {
        journal.owned("a") == all && journal.owned("b").is_empty()
    })
    .await;
    produce(&url, "hooked", 4, 200, 100).await;
    wait_until("every order handled", Duration::from_secs(20), || {
        seen.lock().unwrap().len() == 300
    })
    .await;
    a.stop().await.unwrap();

    let events = journal.events();
    // Per member and shard: assigned, revoked, assigned, ... and never fenced here.
    let mut state: BTreeMap<(&str, u32), bool> = BTreeMap::new();
    // Per shard, who owns it according to the hooks: a next owner's `assigned` comes after the last
    // owner's `revoked`.
    let mut owner: BTreeMap<u32, &str> = BTreeMap::new();
    for (seq, member, event, shards) in &events {
        assert_ne!(*event, "fenced", "nobody was fenced: {events:?}");
        for shard in shards {
            let owned = state.entry((*member, *shard)).or_insert(false);
            match *event {
                "assigned" => {
                    assert!(
                        !*owned,
                        "#{seq}: {member} assigned {shard} twice: {events:?}"
                    );
                    *owned = true;
                    if let Some(other) = owner.insert(*shard, member) {
                        panic!("#{seq}: {member} assigned {shard} while {other} had not revoked it: {events:?}");
                    }
                }
                _ => {
                    assert!(
                        *owned,
                        "#{seq}: {member} revoked {shard} it did not own: {events:?}"
                    );
                    *owned = false;
                    assert_eq!(owner.remove(shard), Some(*member), "{events:?}");
                }
            }
        }
    }
    // a revoked what b got, and b's leave gave it back: at least a, b, a for two shards.
    let moved: Vec<&Event> = events.iter().filter(|e| e.2 == "revoked").collect();
    assert!(moved.len() >= 2, "{events:?}");
    assert!(
        owner.values().all(|m| *m == "a") || owner.is_empty(),
        "{events:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_fenced_is_called_when_the_member_is_fenced_and_a_panicking_hook_does_not_stop_it() {
    // For the panicking hook's line.
    stream_listener_tests::logs::capture();
    let redis = RedisServer::start();
    let url = redis.url();
    produce(&url, "fenced", 4, 0, 50).await;
    let journal = Journal::default();
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let panics = Arc::new(AtomicUsize::new(0));
    let counter = panics.clone();
    let builder = journal
        .hooked(member("fenced", "solo", seen.clone()), "solo")
        // Replaces the journal's assigned hook: records, then panics the first time.
        .on_shards_assigned({
            let journal = journal.clone();
            move |shards| {
                let journal = journal.clone();
                let first = counter.fetch_add(1, Ordering::SeqCst) == 0;
                async move {
                    journal.push("solo", "assigned", shards);
                    if first {
                        panic!("a hook that panics");
                    }
                }
            }
        });
    let runtime = start(&url, builder).await;
    let all: BTreeSet<u32> = (0..4).collect();
    wait_until("solo owns every shard", Duration::from_secs(20), || {
        journal.owned("solo") == all
    })
    .await;
    wait_until(
        "the first orders handled after the panic",
        Duration::from_secs(20),
        || seen.lock().unwrap().len() == 50,
    )
    .await;
    let mut store = GroupStore::create(connect(&url).await, "fenced", "g", 4, TIMING).unwrap();
    store
        .command(AdminCommand::FenceMember("solo".into()))
        .await
        .unwrap()
        .unwrap();
    wait_until("on_fenced called", Duration::from_secs(20), || {
        journal.events().iter().any(|e| e.2 == "fenced")
    })
    .await;
    let events = journal.events();
    let fenced = events.iter().find(|e| e.2 == "fenced").unwrap();
    assert_eq!(
        fenced.3.iter().copied().collect::<BTreeSet<_>>(),
        all,
        "the fence lost every shard: {events:?}"
    );
    // It rejoins (after the fenced hold) and is told again; later entries are handled.
    wait_until(
        "solo assigned again after the fence",
        Duration::from_secs(20),
        || {
            journal
                .events()
                .iter()
                .any(|e| e.0 > fenced.0 && e.2 == "assigned")
        },
    )
    .await;
    produce(&url, "fenced", 4, 50, 50).await;
    wait_until("every order handled", Duration::from_secs(20), || {
        seen.lock().unwrap().len() == 100
    })
    .await;
    assert!(
        panics.load(Ordering::SeqCst) >= 2,
        "the hook was called again after its panic"
    );
    runtime.stop().await.unwrap();

    // The panic was logged, saying which member, stream and group, like the member's other lines.
    let logged: Vec<_> = stream_listener_tests::logs::events()
        .into_iter()
        .filter(|e| {
            e.fields
                .0
                .get("message")
                .is_some_and(|m| m == "lifecycle hook panicked; the member goes on")
        })
        .collect();
    assert_eq!(logged.len(), 1, "{logged:#?}");
    assert_eq!(logged[0].fields.0["hook"], "on_shards_assigned");
    for (field, value) in [("member", "solo"), ("stream", "fenced"), ("group", "g")] {
        assert_eq!(
            logged[0].scope.get(field).map(String::as_str),
            Some(value),
            "{logged:#?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_stops_handling_within_one_poll_and_resume_handles_everything() {
    let redis = RedisServer::start();
    let url = redis.url();
    produce(&url, "paused", 4, 0, 100).await;
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let runtime = start(&url, member("paused", "solo", seen.clone())).await;
    assert_eq!(runtime.listener_ids(), ["solo"]);
    wait_until("the first orders handled", Duration::from_secs(20), || {
        seen.lock().unwrap().len() == 100
    })
    .await;
    runtime.pause("solo").unwrap();
    assert!(runtime.is_paused("solo").unwrap());
    let at_pause = seen.lock().unwrap().len();
    // Entries keep arriving while paused, in several rounds.
    for round in 0..5 {
        produce(&url, "paused", 4, 100 + round * 20, 20).await;
    }
    // Within one poll: at most the batches already running (2 workers x 10) may still finish.
    let watch_until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < watch_until {
        let handled = seen.lock().unwrap().len();
        assert!(
            handled <= at_pause + 20,
            "paused, yet {} handled",
            handled - at_pause
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Paused, not gone: it kept heartbeating and its shards.
    let (_, status) = runtime.statuses().remove(0);
    assert_eq!(status.phase, Phase::Member);
    assert_eq!(status.owned.len(), 4, "{status:?}");
    assert!(
        runtime
            .health()
            .members
            .iter()
            .all(|m| m.heartbeating && m.joined),
        "{:?}",
        runtime.health()
    );
    runtime.resume("solo").unwrap();
    assert!(!runtime.is_paused("solo").unwrap());
    wait_until(
        "every order handled after resume",
        Duration::from_secs(20),
        || seen.lock().unwrap().len() == 200,
    )
    .await;
    runtime.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_of_an_unknown_listener_id_is_an_error_naming_it() {
    let redis = RedisServer::start();
    let url = redis.url();
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let runtime = start(&url, member("unknown", "solo", seen)).await;
    for result in [runtime.pause("nope"), runtime.resume("nope")] {
        let error = result.unwrap_err();
        assert!(
            matches!(&error, RuntimeError::UnknownListener { id, known } if id == "nope" && known == &["solo"]),
            "{error:?}"
        );
        let text = error.to_string();
        assert!(text.contains("`nope`") && text.contains("solo"), "{text}");
    }
    assert!(runtime.is_paused("nope").is_err());
    assert!(!runtime.is_paused("solo").unwrap());
    runtime.stop().await.unwrap();
}

static HOOKED_HANDLED: AtomicUsize = AtomicUsize::new(0);

#[stream_listener::stream_listener(stream = "annotated-hooks", group = "g", id = "hooked")]
async fn on_hooked(msg: Message<Order>) -> Result<(), String> {
    drop(msg);
    HOOKED_HANDLED.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_annotated_listener_gets_its_hooks_from_the_runtime_by_name() {
    let redis = RedisServer::start();
    let url = redis.url();
    produce(&url, "annotated-hooks", 4, 0, 20).await;
    type Calls = Arc<Mutex<Vec<(&'static str, BTreeSet<u32>)>>>;
    let calls: Calls = Arc::default();
    let hook = |event: &'static str| {
        let calls = calls.clone();
        move |shards: Vec<u32>| {
            let calls = calls.clone();
            async move {
                calls
                    .lock()
                    .unwrap()
                    .push((event, shards.into_iter().collect()));
            }
        }
    };
    // The only runtime of this binary with its annotated listener (the others run builders only).
    let running = stream_listener::Runtime::new(&url)
        .without_default_logging()
        .group_config(TIMING)
        .hooks(
            "on_hooked",
            LifecycleHooks::default()
                .on_shards_assigned(hook("assigned"))
                .on_shards_revoked(hook("revoked")),
        )
        .start()
        .await
        .unwrap();
    let all: BTreeSet<u32> = (0..4).collect();
    wait_until("assigned every shard", Duration::from_secs(20), || {
        calls
            .lock()
            .unwrap()
            .iter()
            .any(|(e, shards)| *e == "assigned" && *shards == all)
    })
    .await;
    wait_until("every order handled", Duration::from_secs(20), || {
        HOOKED_HANDLED.load(Ordering::SeqCst) == 20
    })
    .await;
    running.stop().await.unwrap();
    // A graceful stop revokes every shard once, after its drain. Shards whose drains end at different
    // moments come in separate calls, so the calls after the last assignment partition the shards.
    let calls = calls.lock().unwrap();
    let last_assigned = calls.iter().rposition(|(e, _)| *e == "assigned").unwrap();
    let mut revoked: Vec<u32> = Vec::new();
    for (event, shards) in &calls[last_assigned + 1..] {
        assert_eq!(*event, "revoked", "{calls:?}");
        revoked.extend(shards);
    }
    revoked.sort_unstable();
    assert_eq!(revoked, all.into_iter().collect::<Vec<_>>(), "{calls:?}");
}

#[tokio::test]
async fn hooks_for_a_name_no_listener_has_are_a_start_error_naming_the_listeners() {
    // Refused before Redis is reached (nothing listens on port 1).
    let error = test_runtime("redis://127.0.0.1:1/")
        .consumer(
            ConsumerBuilder::new("orders", "billing")
                .handler(|_msg: Message<Order>| async { Ok::<(), String>(()) }),
        )
        .hooks("on_ordre", LifecycleHooks::default())
        .start()
        .await
        .unwrap_err();
    assert!(
        matches!(error, RuntimeError::HooksForUnknownListener { .. }),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "lifecycle hooks for `on_ordre`: no listener of this runtime has that name (listeners: orders_billing)"
    );
}

/// The coordinator's audit events of group `g` on `stream`, oldest first.
async fn audit(url: &str, stream: &str) -> Vec<AuditEvent> {
    let mut conn = connect(url).await;
    let page: Vec<(String, std::collections::HashMap<String, String>)> = redis::cmd("XRANGE")
        .arg(GroupKeys::new(stream, "g").audit)
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .unwrap();
    page.iter()
        .filter_map(|(_, fields)| fields.get("event"))
        .map(|event| serde_json::from_str(event).expect("an audit event"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_under_static_membership_takes_its_own_shards_back_and_nobody_else_gets_them() {
    let redis = RedisServer::start();
    let url = redis.url();
    let stream = "static";
    produce(&url, stream, 4, 0, 100).await;
    let journal = Journal::default();
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    // A session long enough for a restart of this process to fit in it.
    let timing = stream_listener::GroupConfig {
        session_timeout_ms: 6_000,
        ..TIMING
    };
    let start_static = |id: &'static str| {
        let builder = journal.hooked(member(stream, id, seen.clone()), id);
        let url = url.clone();
        async move {
            test_runtime(&url)
                .group_config(timing)
                .static_membership()
                .default_shard_count(4)
                .consumer(builder)
                .start()
                .await
                .unwrap()
        }
    };
    let a = start_static("a").await;
    let b = start_static("b").await;
    wait_until(
        "a and b own two shards each",
        Duration::from_secs(20),
        || journal.owned("a").len() == 2 && journal.owned("b").len() == 2,
    )
    .await;
    let a_shards = journal.owned("a");
    let b_shards = journal.owned("b");
    let before = journal.events().len();
    // a shuts down (a restart), entries keep coming meanwhile, and a comes back under its id.
    a.stop().await.unwrap();
    produce(&url, stream, 4, 100, 100).await;
    let a = start_static("a").await;
    wait_until("a owns its shards again", Duration::from_secs(20), || {
        journal.owned("a") == a_shards
    })
    .await;
    wait_until("every order handled", Duration::from_secs(20), || {
        seen.lock().unwrap().len() == 200
    })
    .await;
    // b was never given a's shards nor asked for its own: its hooks did not run again.
    let after: Vec<Event> = journal.events().split_off(before);
    assert!(after.iter().all(|e| e.1 == "a"), "{after:?}");
    assert_eq!(journal.owned("b"), b_shards);
    // From the records: the leave announced the restart, the rejoin fenced nothing, and every grant
    // after the leave went to a, with a higher epoch than any before.
    let events = audit(&url, stream).await;
    let left = events
        .iter()
        .position(|e| matches!(e, AuditEvent::MemberLeavingForRestart { member_id, .. } if member_id == "a"))
        .unwrap_or_else(|| panic!("no restart announced: {events:?}"));
    let before_epoch = events[..left]
        .iter()
        .filter_map(|e| match e {
            AuditEvent::ShardsAssigned { member_epoch, .. } => Some(*member_epoch),
            _ => None,
        })
        .max()
        .expect("grants before the leave");
    let later = &events[left..];
    assert!(
        later
            .iter()
            .any(|e| matches!(e, AuditEvent::MemberRejoined { member_id, .. } if member_id == "a")),
        "{later:?}"
    );
    assert!(
        !later.iter().any(|e| matches!(
            e,
            AuditEvent::MemberFenced { .. } | AuditEvent::HoldsReleased { .. }
        )),
        "{later:?}"
    );
    let grants: Vec<(&String, i64, &Vec<u32>)> = later
        .iter()
        .filter_map(|e| match e {
            AuditEvent::ShardsAssigned {
                member_id,
                member_epoch,
                shards,
            } => Some((member_id, *member_epoch, shards)),
            _ => None,
        })
        .collect();
    assert!(!grants.is_empty(), "{later:?}");
    for (member_id, epoch, shards) in &grants {
        assert_eq!(member_id.as_str(), "a", "{later:?}");
        assert!(*epoch > before_epoch, "tokens never go back: {later:?}");
        assert!(shards.iter().all(|s| a_shards.contains(s)), "{later:?}");
    }
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}
