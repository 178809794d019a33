//! The probe endpoint (feature `http`): `/livez` and `/readyz` answer 200 or 503 as
//! `RunningRuntime::health()` flips, and `/metrics` serves the Prometheus recorder's page. Loopback only.

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use stream_listener::http::ProbeServer;
use stream_listener::{ConsumerBuilder, Message};
use stream_listener_test_support::{wait_for_blocking, RedisServer};
use stream_listener_tests::{producer, test_runtime};
use tokio::time::Instant;

#[derive(Debug, Serialize, Deserialize)]
struct Job {
    key: String,
}

use stream_listener_test_support::http::get;

/// Starts polling `path` on an OS thread until it answers `code` (bounded by 20 s); join for the body.
fn watch(addr: SocketAddr, path: &'static str, code: u16) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut last = (0, String::new());
        wait_for_blocking(
            &format!("{path} to answer {code}"),
            Duration::from_secs(20),
            || {
                last = get(addr, path);
                (last.0 == code).then(|| last.1.clone())
            },
        )
    })
}

/// Polls `path` until it answers `code`; returns the body.
async fn wait_for(addr: SocketAddr, path: &'static str, code: u16) -> String {
    join(watch(addr, path, code)).await
}

/// Joins a watcher without blocking the runtime; re-raises its panic.
async fn join(watcher: std::thread::JoinHandle<String>) -> String {
    tokio::task::spawn_blocking(move || watcher.join())
        .await
        .unwrap()
        .unwrap_or_else(|e| std::panic::resume_unwind(e))
}

/// `GET path` without blocking the runtime.
async fn get_async(addr: SocketAddr, path: &'static str) -> (u16, String) {
    tokio::task::spawn_blocking(move || get(addr, path))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn probes_flip_with_health_and_metrics_are_served() {
    let prometheus = stream_listener::metrics::install_prometheus_recorder().unwrap();
    let mut redis = RedisServer::start();
    let url = redis.url();
    let producer = producer(&url, "probed", 2).await;
    let consumer = ConsumerBuilder::new("probed", "g")
        .member_id("solo")
        .handler_timeout(Duration::from_millis(200))
        .handler(|msg: Message<Job>| async move {
            if msg.payload.key == "block" && msg.delivery_count <= 1 {
                // Blocks its thread: the timeout cannot cancel it, so the member is not live meanwhile.
                // Only the first attempt blocks, so the retry after the timeout does not keep the
                // member unready below.
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
    let server = ProbeServer::start(
        "127.0.0.1:0",
        runtime.health_handle(),
        Some(Box::new(move || prometheus.render())),
    )
    .unwrap();
    let addr = server.local_addr();
    assert!(addr.ip().is_loopback());

    let body = wait_for(addr, "/readyz", 200).await;
    assert!(body.starts_with("solo live=true ready=true"), "{body}");
    assert_eq!(get_async(addr, "/livez").await.0, 200);
    let owned = "stream_listener_owned_shards{stream=\"probed\",group=\"g\",member=\"solo\"} 2";
    let start = Instant::now();
    loop {
        let (code, page) = get_async(addr, "/metrics").await;
        assert_eq!(code, 200);
        if page.contains(owned) {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{page}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(get_async(addr, "/nope").await.0, 404);

    // A handler blocking past its timeout: neither live nor ready, then both again once it returns.
    // The blocked worker can stall this runtime's timer driver (tokio drives timers from one parked
    // worker), so the watcher polls from an OS thread, started before the message is sent.
    let overdue = watch(addr, "/livez", 503);
    producer
        .send(
            "block",
            &Job {
                key: "block".into(),
            },
        )
        .await
        .unwrap();
    let body = join(overdue).await;
    assert!(body.contains("overdue_handlers=1"), "{body}");
    assert!(
        body.contains("ready=false"),
        "not ready while not live: {body}"
    );
    wait_for(addr, "/livez", 200).await;
    wait_for(addr, "/readyz", 200).await;

    // Redis gone: the member self-fences (not ready) but its heartbeat loop keeps trying (live).
    redis.kill();
    let body = wait_for(addr, "/readyz", 503).await;
    assert!(body.contains("joined=false"), "{body}");
    assert_eq!(get_async(addr, "/livez").await.0, 200);

    // Redis back (empty): the member rejoins and is ready again.
    redis.restart();
    wait_for(addr, "/readyz", 200).await;
    drop(server);
    let _ = runtime.stop().await;
}
