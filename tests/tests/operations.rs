//! Operating a service, against real Redis: handler timeouts, retries that do not hold a worker, duplicate
//! member ids refused at start, startup while Redis is still down, a shutdown that misses its deadline.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use stream_listener::consumer::{dead_letter_fields, FailurePolicy};
use stream_listener::{ConsumerBuilder, Message, Producer, Runtime};
use stream_listener_test_support::aio::{connect, wait_until, xpending_count, xrange};
use stream_listener_test_support::{wait_for_blocking, RedisServer};
use stream_listener_tests::{logs, producer, start_one, test_runtime, Order};
use tokio::time::Instant;

/// Sends `key` once, returning its shard.
async fn send(producer: &Producer, key: &str, seq: u32) -> u32 {
    let job = Order {
        key: key.to_owned(),
        seq,
    };
    producer.send(key, &job).await.unwrap().shard
}

/// Keys (`{prefix}{i}`) that route to `shard` of two, `n` of them, each sent once.
async fn send_to_shard(producer: &Producer, prefix: &str, shard: u32, n: usize) -> Vec<String> {
    let mut sent = Vec::new();
    let mut i = 0;
    while sent.len() < n {
        assert!(i < 10_000, "no key routes to shard {shard}");
        let key = format!("{prefix}{i}");
        i += 1;
        if stream_listener::routing::shard_for_key(key.as_bytes(), 2) == shard {
            send(producer, &key, 0).await;
            sent.push(key);
        }
    }
    sent
}

async fn dead_letters(url: &str, stream: &str) -> Vec<HashMap<String, String>> {
    let entries = xrange(&mut connect(url).await, &format!("{stream}:dlq")).await;
    entries.into_iter().map(|(_, fields)| fields).collect()
}

fn failing_policy(max_deliveries: u32, initial_backoff: Duration) -> FailurePolicy {
    let mut policy = FailurePolicy::default();
    policy.max_deliveries = max_deliveries;
    policy.initial_backoff = initial_backoff;
    policy.max_backoff = initial_backoff * 4;
    // These tests hold a shard for exactly the backoff.
    policy.jitter = false;
    policy
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_handler_times_out_is_retried_then_dead_lettered_while_other_shards_flow() {
    static HANG_ATTEMPTS: AtomicU32 = AtomicU32::new(0);
    static HANDLED: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let redis = RedisServer::start();
    let url = redis.url();
    let producer = producer(&url, "hung", 2).await;
    let hung_shard = send(&producer, "hang", 0).await;
    let consumer = ConsumerBuilder::new("hung", "g")
        .member_id("solo")
        .runtime_max_concurrency(2)
        .handler_timeout(Duration::from_millis(800))
        .failure(failing_policy(3, Duration::from_millis(50)))
        .handler(|msg: Message<Order>| async move {
            if msg.payload.key == "hang" {
                HANG_ATTEMPTS.fetch_add(1, Ordering::SeqCst);
                std::future::pending::<()>().await;
            }
            HANDLED.lock().unwrap().push(msg.payload.key.clone());
            Ok::<(), String>(())
        });
    let runtime = start_one(&url, consumer).await;
    wait_until("the first hung attempt", Duration::from_secs(20), || {
        HANG_ATTEMPTS.load(Ordering::SeqCst) >= 1
    })
    .await;
    // While the handler hangs (three attempts of 0.8 s), the other shard keeps flowing.
    let others = send_to_shard(&producer, "other", 1 - hung_shard, 10).await;
    wait_until("the other shard's entries", Duration::from_secs(2), || {
        let handled = HANDLED.lock().unwrap();
        others.iter().all(|k| handled.contains(k))
    })
    .await;
    assert!(
        dead_letters(&url, "hung").await.is_empty(),
        "the other shard flowed while the hung entry was still being retried"
    );
    // Behind the hung entry, its shard waits (per-key order), then goes on after the dead letter.
    let behind = send_to_shard(&producer, "behind", hung_shard, 3).await;
    let start = Instant::now();
    let letters = loop {
        let letters = dead_letters(&url, "hung").await;
        if !letters.is_empty() {
            break letters;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "no dead letter");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(letters.len(), 1);
    let letter = &letters[0];
    assert_eq!(letter[dead_letter_fields::DELIVERY_COUNT], "3");
    assert!(
        letter[dead_letter_fields::ERROR].contains("timed out after 800 ms"),
        "{letter:?}"
    );
    assert_eq!(
        HANG_ATTEMPTS.load(Ordering::SeqCst),
        3,
        "retried, then dead-lettered"
    );
    wait_until(
        "the entries behind the hung one",
        Duration::from_secs(5),
        || {
            let handled = HANDLED.lock().unwrap();
            behind.iter().all(|k| handled.contains(k))
        },
    )
    .await;
    let _ = runtime.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_backoff_holds_its_shard_but_not_the_only_worker() {
    static FAILURES: Mutex<Vec<Instant>> = Mutex::new(Vec::new());
    static HANDLED: Mutex<Vec<(String, Instant)>> = Mutex::new(Vec::new());
    let redis = RedisServer::start();
    let url = redis.url();
    let producer = producer(&url, "backoff", 2).await;
    let bad_shard = send(&producer, "bad", 0).await;
    let consumer = ConsumerBuilder::new("backoff", "g")
        .member_id("solo")
        .runtime_max_concurrency(1)
        .failure(failing_policy(2, Duration::from_secs(3)))
        .handler(|msg: Message<Order>| async move {
            if msg.payload.key == "bad" {
                FAILURES.lock().unwrap().push(Instant::now());
                return Err("always fails".to_owned());
            }
            HANDLED
                .lock()
                .unwrap()
                .push((msg.payload.key.clone(), Instant::now()));
            Ok(())
        });
    let runtime = start_one(&url, consumer).await;
    wait_until("the first failure", Duration::from_secs(20), || {
        !FAILURES.lock().unwrap().is_empty()
    })
    .await;
    let first_failure = FAILURES.lock().unwrap()[0];
    // Behind the failing entry on its shard, and on the other shard.
    let behind = send_to_shard(&producer, "behind", bad_shard, 2).await;
    let others = send_to_shard(&producer, "other", 1 - bad_shard, 5).await;
    wait_until("the other shard's entries", Duration::from_secs(2), || {
        let handled = HANDLED.lock().unwrap();
        others.iter().all(|k| handled.iter().any(|(h, _)| h == k))
    })
    .await;
    let handled_others = HANDLED.lock().unwrap().clone();
    assert!(
        handled_others
            .iter()
            .filter(|(k, _)| others.contains(k))
            .all(|(_, at)| at.duration_since(first_failure) < Duration::from_secs(2)),
        "the other shard did not wait for the 3 s backoff"
    );
    assert!(
        handled_others.iter().all(|(k, _)| !behind.contains(k)),
        "entries behind the failing one wait for it"
    );
    wait_until(
        "the entries behind the failing one",
        Duration::from_secs(20),
        || {
            let handled = HANDLED.lock().unwrap();
            behind.iter().all(|k| handled.iter().any(|(h, _)| h == k))
        },
    )
    .await;
    let failures = FAILURES.lock().unwrap().clone();
    assert_eq!(failures.len(), 2, "max_deliveries = 2");
    assert!(failures[1].duration_since(failures[0]) >= Duration::from_secs(3));
    let handled = HANDLED.lock().unwrap().clone();
    assert!(
        handled
            .iter()
            .filter(|(k, _)| behind.contains(k))
            .all(|(_, at)| *at >= failures[1]),
        "per-key order on the failing shard"
    );
    assert_eq!(dead_letters(&url, "backoff").await.len(), 1);
    let _ = runtime.stop().await;
}

#[stream_listener::stream_listener(stream = "dup", group = "g", id = "dup")]
async fn on_dup(msg: Message<Order>) -> Result<(), String> {
    drop(msg);
    Ok(())
}

#[tokio::test]
async fn two_listeners_with_one_member_id_are_refused_at_start_naming_both() {
    let handler = |msg: Message<Order>| async move {
        drop(msg);
        Ok::<(), String>(())
    };
    // Nothing is contacted before the check: no server needed.
    let url = "redis://127.0.0.1:1/";

    // The annotated listener runs `dup-m0`; a builder asks for the same member of the same group.
    let error = Runtime::new(url)
        .without_default_logging()
        .consumer(
            ConsumerBuilder::new("dup", "g")
                .member_id("dup-m0")
                .handler(handler),
        )
        .start()
        .await
        .unwrap_err();
    let text = error.to_string();
    assert!(text.contains("`dup-m0`"), "{text}");
    assert!(
        text.contains("#[stream_listener] operations::on_dup (tests/tests/operations.rs:"),
        "{text}"
    );
    assert!(
        text.contains("ConsumerBuilder::new(\"dup\", \"g\") (consumer #1"),
        "{text}"
    );

    // Two builders of one group get the same default id (`{base}-{group}`).
    let error = Runtime::new(url)
        .without_default_logging()
        .without_annotated_listeners()
        .base_member_id("host")
        .consumer(ConsumerBuilder::new("orders", "billing").handler(handler))
        .consumer(ConsumerBuilder::new("orders", "billing").handler(handler))
        .start()
        .await
        .unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains("member `host-billing` of group `billing` on stream `orders`"),
        "{text}"
    );
    assert!(
        text.contains("consumer #1") && text.contains("consumer #2"),
        "{text}"
    );

    // The same id in two different groups is fine (and fails later, on the unreachable server).
    let result = Runtime::new(url)
        .without_default_logging()
        .without_annotated_listeners()
        .base_member_id("host")
        .startup_timeout(Duration::from_millis(300))
        .consumer(ConsumerBuilder::new("orders", "billing").handler(handler))
        .consumer(ConsumerBuilder::new("orders", "shipping").handler(handler))
        .start()
        .await;
    assert!(
        !matches!(
            result,
            Err(stream_listener::RuntimeError::DuplicateMemberId { .. })
        ),
        "{result:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runtime_waits_for_a_redis_that_comes_up_after_it_and_then_consumes() {
    static HANDLED: Mutex<Vec<String>> = Mutex::new(Vec::new());
    // A free loopback port with nothing listening yet: start a server to own the port, then stop it.
    let mut redis = RedisServer::start();
    let url = redis.url();
    redis.kill();
    assert!(!redis.ping(), "the server is down");
    let consumer = ConsumerBuilder::new("late", "g").member_id("solo").handler(
        |msg: Message<Order>| async move {
            HANDLED.lock().unwrap().push(msg.payload.key);
            Ok::<(), String>(())
        },
    );
    let start = test_runtime(&url).consumer(consumer).start();
    let mut start = Box::pin(start);
    // It keeps trying well past the old 0.5 s (several attempts) instead of failing.
    tokio::select! {
        result = &mut start => panic!("start returned while Redis was down: {result:?}"),
        _ = tokio::time::sleep(Duration::from_millis(1_500)) => {}
    }
    tokio::task::block_in_place(|| redis.restart());
    let runtime = tokio::time::timeout(Duration::from_secs(20), start)
        .await
        .expect("started within 20 s of Redis coming up")
        .unwrap();
    let producer = producer(&url, "late", 16).await;
    for i in 0..5 {
        send(&producer, &format!("k{i}"), 0).await;
    }
    wait_until("every entry handled", Duration::from_secs(20), || {
        HANDLED.lock().unwrap().len() == 5
    })
    .await;
    let _ = runtime.stop().await;
}

#[tokio::test]
async fn the_startup_limit_gives_up_with_an_error_naming_the_redacted_url() {
    logs::capture();
    // Port 1 on loopback: nothing listens there.
    let error = Runtime::new("redis://alice:secret@127.0.0.1:1/")
        .without_default_logging()
        .without_annotated_listeners()
        .startup_timeout(Duration::from_millis(500))
        .consumer(
            ConsumerBuilder::new("orders", "g").handler(|msg: Message<Order>| async move {
                drop(msg);
                Ok::<(), String>(())
            }),
        )
        .start()
        .await
        .unwrap_err();
    let text = error.to_string();
    assert!(text.contains("unreachable"), "{text}");
    assert!(!text.contains("secret"), "{text}");
    let stream_listener::RuntimeError::Unreachable(unreachable) = &error else {
        panic!("{error:?}");
    };
    let attempts = unreachable.attempts;
    assert!(attempts >= 2, "{error:?}");

    // Each failed attempt was logged, a WARN with its number, then the last one an ERROR; the URL
    // redacted in every line.
    let lines: Vec<logs::Captured> = logs::events()
        .into_iter()
        .filter(|e| e.target == "stream_listener::startup")
        .filter(|e| {
            e.fields
                .0
                .get("url")
                // With credentials: this test's URL has them; another test of this binary may log the
                // same port without any at the same time (the log capture is process-wide).
                .is_some_and(|u| u.contains("@127.0.0.1:1/"))
        })
        .collect();
    for line in &lines {
        assert_eq!(
            line.fields.0["url"], "redis://alice:***@127.0.0.1:1/",
            "{line:#?}"
        );
        assert!(!format!("{line:?}").contains("secret"), "{line:#?}");
    }
    let retries: Vec<String> = lines
        .iter()
        .filter(|e| e.level == tracing::Level::WARN)
        .map(|e| e.fields.0["attempt"].clone())
        .collect();
    let expected: Vec<String> = (1..attempts).map(|n| n.to_string()).collect();
    assert_eq!(retries, expected, "{lines:#?}");
    let gave_up: Vec<&logs::Captured> = lines
        .iter()
        .filter(|e| e.level == tracing::Level::ERROR)
        .collect();
    assert_eq!(gave_up.len(), 1, "{lines:#?}");
    assert_eq!(gave_up[0].fields.0["attempts"], attempts.to_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_that_misses_its_deadline_is_an_error_naming_what_was_stuck() {
    static STARTED: AtomicU32 = AtomicU32::new(0);
    // It looks for its own member's lines only (other tests of this binary log too).
    logs::capture();
    let redis = RedisServer::start();
    let url = redis.url();
    let producer = producer(&url, "stuck", 2).await;
    let consumer = ConsumerBuilder::new("stuck", "g")
        .member_id("stuck-solo")
        .handler(|msg: Message<Order>| async move {
            drop(msg);
            STARTED.fetch_add(1, Ordering::SeqCst);
            // Ignores shutdown: never returns.
            std::future::pending::<()>().await;
            Ok::<(), String>(())
        });
    let runtime = test_runtime(&url)
        .shutdown_timeout(Duration::from_secs(1))
        .consumer(consumer)
        .start()
        .await
        .unwrap();
    let shard = send(&producer, "k", 0).await;
    wait_until("the handler started", Duration::from_secs(20), || {
        STARTED.load(Ordering::SeqCst) == 1
    })
    .await;
    let begun = Instant::now();
    let error = runtime.stop().await.unwrap_err();
    assert!(
        begun.elapsed() < Duration::from_secs(5),
        "bounded by the timeout: {:?}",
        begun.elapsed()
    );
    let text = error.to_string();
    assert!(
        text.contains("shutdown missed its deadline of 1000 ms"),
        "{text}"
    );
    assert!(
        text.contains("member stuck-solo (leave not completed"),
        "{text}"
    );
    assert!(
        text.contains(&format!("handlers running: shard {shard} entry ")),
        "{text}"
    );
    // The entry stays pending for the next owner.
    let mut conn = connect(&url).await;
    let pending = xpending_count(&mut conn, &format!("stuck:{shard}"), "g").await;
    assert_eq!(pending, 1, "{text}");

    // The warnings about the stuck member say which member, stream and group, like its other lines.
    for message in [
        "the leave did not complete within the shutdown timeout",
        "did not stop in time; aborting",
    ] {
        let lines: Vec<_> = logs::events()
            .into_iter()
            .filter(|e| {
                e.fields.0.get("message").is_some_and(|m| m == message)
                    && [e.fields.0.get("member"), e.scope.get("member")]
                        .contains(&Some(&"stuck-solo".to_owned()))
            })
            .collect();
        assert_eq!(lines.len(), 1, "{message}: {lines:#?}");
        for (field, value) in [
            ("member", "stuck-solo"),
            ("stream", "stuck"),
            ("group", "g"),
        ] {
            assert_eq!(
                lines[0].scope.get(field).map(String::as_str),
                Some(value),
                "{message}: {lines:#?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_started_runtime_runs_until_told_and_its_health_handle_serves_meanwhile() {
    static HANDLED: AtomicU32 = AtomicU32::new(0);
    let redis = RedisServer::start();
    let url = redis.url();
    let producer = producer(&url, "until", 2).await;
    let consumer = ConsumerBuilder::new("until", "g")
        .member_id("solo")
        .handler(|_msg: Message<Order>| async move {
            HANDLED.fetch_add(1, Ordering::SeqCst);
            Ok::<(), String>(())
        });
    let running = test_runtime(&url).consumer(consumer).start().await.unwrap();
    // What `Runtime::run` cannot give: a handle for a probe endpoint while it runs.
    let health = running.health_handle();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(running.run_until(async {
        let _ = stopped.await;
    }));
    wait_until("ready while running", Duration::from_secs(20), || {
        health.health().ready()
    })
    .await;
    send(&producer, "k", 0).await;
    wait_until("handled while running", Duration::from_secs(20), || {
        HANDLED.load(Ordering::SeqCst) == 1
    })
    .await;
    assert!(!run.is_finished(), "runs until told");
    stop.send(()).unwrap();
    run.await.unwrap().expect("a graceful stop");
    assert!(!health.health().live(), "its heartbeat loop has ended");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn health_flips_when_a_handler_hangs_past_its_timeout_and_when_redis_goes_away() {
    let mut redis = RedisServer::start();
    let url = redis.url();
    let producer = producer(&url, "healthy", 2).await;
    let consumer = ConsumerBuilder::new("healthy", "g")
        .member_id("solo")
        .handler_timeout(Duration::from_millis(200))
        .handler(|msg: Message<Order>| async move {
            if msg.payload.key == "block" && msg.delivery_count <= 1 {
                // Blocks its thread: the timeout cannot cancel it. Only the first attempt blocks,
                // so the retry after the timeout does not keep the member unready below.
                std::thread::sleep(Duration::from_millis(2_000));
            }
            Ok::<(), String>(())
        });
    let runtime = test_runtime(&url)
        .shutdown_timeout(Duration::from_millis(500))
        .consumer(consumer)
        .start()
        .await
        .unwrap();
    wait_until("ready", Duration::from_secs(20), || {
        runtime.health().ready()
    })
    .await;
    assert!(runtime.health().live());

    // A handler that blocks its worker thread can stall this runtime's timer driver (tokio drives
    // timers from one parked worker), so a check paced by `tokio::time::sleep` may not run until the
    // handler returns. Probe from an OS thread, as a probe outside the stalled runtime would.
    let handle = runtime.health_handle();
    let watcher = std::thread::spawn(move || {
        wait_for_blocking(
            "not live while the handler overruns",
            Duration::from_secs(10),
            || Some(handle.health()).filter(|health| !health.live()),
        )
    });
    let shard = send(&producer, "block", 0).await;
    let health = tokio::task::spawn_blocking(move || watcher.join())
        .await
        .unwrap()
        .unwrap_or_else(|e| std::panic::resume_unwind(e));
    assert!(!health.ready());
    let overdue = &health.members[0].overdue_handlers;
    assert_eq!(overdue.len(), 1, "{health:?}");
    assert_eq!(overdue[0].shard, shard);
    wait_until(
        "live again once it returned",
        Duration::from_secs(10),
        || runtime.health().ready(),
    )
    .await;

    redis.kill();
    wait_until("not ready without Redis", Duration::from_secs(10), || {
        !runtime.health().ready()
    })
    .await;
    let member = &runtime.health().members[0];
    assert!(!member.joined, "self-fenced: {member:?}");
    assert!(member.heartbeating, "the loop keeps trying: {member:?}");
    let _ = runtime.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_not_ready_while_a_shards_reads_keep_failing_and_ready_again_once_they_work() {
    static HANDLED: AtomicU32 = AtomicU32::new(0);
    let redis = RedisServer::start();
    let url = redis.url();
    let producer = producer(&url, "unreadable", 2).await;
    let consumer = ConsumerBuilder::new("unreadable", "g")
        .member_id("solo")
        .handler(|_msg: Message<Order>| async move {
            HANDLED.fetch_add(1, Ordering::SeqCst);
            Ok::<(), String>(())
        });
    let runtime = start_one(&url, consumer).await;
    wait_until("ready", Duration::from_secs(20), || {
        runtime.health().ready()
    })
    .await;

    // Shard 0's stream becomes a string: every read of it fails (WRONGTYPE) while the heartbeats,
    // on their own keys, go on.
    let mut conn = connect(&url).await;
    redis::pipe()
        .cmd("DEL")
        .arg("unreadable:0")
        .cmd("SET")
        .arg("unreadable:0")
        .arg("not a stream")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    wait_until(
        "not ready while reads fail",
        Duration::from_secs(20),
        || !runtime.health().ready(),
    )
    .await;
    let health = runtime.health();
    let member = &health.members[0];
    assert!(
        member.live(),
        "a read error loop is not a dead process: {member:?}"
    );
    assert!(member.joined, "{member:?}");
    assert_eq!(member.failing_reads.len(), 1, "{member:?}");
    assert_eq!(member.failing_reads[0].0, 0, "{member:?}");
    assert!(
        member.failing_reads[0].1 >= stream_listener::health::READ_ERROR_LOOP,
        "{member:?}"
    );

    // The stream is back (with its group): reads work and the member is ready again, and handles.
    redis::pipe()
        .cmd("DEL")
        .arg("unreadable:0")
        .cmd("XGROUP")
        .arg("CREATE")
        .arg("unreadable:0")
        .arg("g")
        .arg("0")
        .arg("MKSTREAM")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    wait_until("ready again", Duration::from_secs(20), || {
        runtime.health().ready()
    })
    .await;
    let mut key = 0;
    while stream_listener::routing::shard_for_key(format!("k{key}").as_bytes(), 2) != 0 {
        key += 1;
    }
    send(&producer, &format!("k{key}"), 0).await;
    wait_until(
        "handled on the repaired shard",
        Duration::from_secs(20),
        || HANDLED.load(Ordering::SeqCst) == 1,
    )
    .await;
    let _ = runtime.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_written_to_the_logical_name_are_warned_about_when_they_appear_and_grow() {
    logs::capture();
    let redis = RedisServer::start();
    let url = redis.url();
    let stream = "strayname";
    let _producer = producer(&url, stream, 2).await;
    let runtime = start_one(
        &url,
        ConsumerBuilder::new(stream, "g").handler(|msg: Message<Order>| async move {
            drop(msg);
            Ok::<(), String>(())
        }),
    )
    .await;
    let warnings = || -> Vec<String> {
        logs::events()
            .into_iter()
            .filter(|e| e.level == tracing::Level::WARN)
            .filter(|e| e.fields.0.get("stream").is_some_and(|s| s == stream))
            .filter_map(|e| e.fields.0.get("message").cloned())
            .filter(|m| m.contains("the logical stream's own name"))
            .collect()
    };
    let mut conn = connect(&url).await;
    xadd_to_the_logical_name(&mut conn, stream).await;
    wait_until(
        "a warning about the stray entry",
        Duration::from_secs(20),
        || !warnings().is_empty(),
    )
    .await;
    let first = warnings();
    assert_eq!(first.len(), 1, "{first:?}");
    assert!(
        first[0].contains("holds 1 entries that no group reads"),
        "{first:?}"
    );
    assert!(
        first[0].contains("`strayname:0`..`strayname:1`"),
        "{first:?}"
    );
    xadd_to_the_logical_name(&mut conn, stream).await;
    wait_until(
        "a warning about the second one",
        Duration::from_secs(20),
        || warnings().len() == 2,
    )
    .await;
    assert!(
        warnings()[1].contains("holds 2 entries"),
        "{:?}",
        warnings()
    );
    let _ = runtime.stop().await;
}

/// `XADD <stream> * k a p {}`: the logical name, not a shard.
async fn xadd_to_the_logical_name(conn: &mut redis::aio::ConnectionManager, stream: &str) {
    let _: String = redis::cmd("XADD")
        .arg(stream)
        .arg("*")
        .arg("k")
        .arg("a")
        .arg("p")
        .arg("{}")
        .query_async(conn)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_is_one_warn_per_attempt_with_its_message_and_location() {
    logs::capture();
    let redis = RedisServer::start();
    let url = redis.url();
    let stream = "poison";
    let producer = producer(&url, stream, 2).await;
    let runtime = start_one(
        &url,
        ConsumerBuilder::new(stream, "g")
            .failure(failing_policy(3, Duration::from_millis(10)))
            .handler(|msg: Message<Order>| async move {
                if msg.payload.seq == 7 {
                    panic!("poison order {}", msg.payload.key);
                }
                Ok::<(), String>(())
            }),
    )
    .await;
    send(&producer, "bad", 7).await;
    wait_until("the poison dead-lettered", Duration::from_secs(20), || {
        logs::events().iter().any(|e| {
            e.scope.get("stream").is_some_and(|s| s == stream)
                && e.fields
                    .0
                    .get("message")
                    .is_some_and(|m| m == "dead-lettering entry")
        })
    })
    .await;
    let panics: Vec<String> = logs::events()
        .into_iter()
        .filter(|e| e.scope.get("stream").is_some_and(|s| s == stream))
        .filter(|e| e.level == tracing::Level::WARN)
        .filter(|e| {
            e.fields.0.get("message").map(String::as_str)
                == Some("handler panicked; the attempt counts as failed")
        })
        .map(|e| e.fields.0["panic"].clone())
        .collect();
    assert_eq!(panics.len(), 3, "one per attempt: {panics:?}");
    for panic in &panics {
        assert!(
            panic.starts_with("poison order bad (at tests/tests/operations.rs:"),
            "{panic}"
        );
    }
    let letters = dead_letters(&url, stream).await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    let _ = runtime.stop().await;
}
