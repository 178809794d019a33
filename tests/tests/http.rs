//! The probe endpoint (feature `http`): `/livez` and `/readyz` answer 200 or 503 as
//! `RunningRuntime::health()` flips, and `/metrics` serves the Prometheus recorder's page. Loopback only.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use stream_listener::http::ProbeServer;
use stream_listener::{ConsumerBuilder, Message};
use stream_listener_test_support::RedisServer;
use stream_listener_tests::{producer, test_runtime};
use tokio::time::Instant;

#[derive(Debug, Serialize, Deserialize)]
struct Job {
    key: String,
}

/// `(status code, body)` of `GET path`.
async fn get(addr: SocketAddr, path: &'static str) -> (u16, String) {
    tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        write!(stream, "GET {path} HTTP/1.1\r\nHost: probe\r\n\r\n").unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        let code = response
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = response
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        (code, body)
    })
    .await
    .unwrap()
}

/// Polls `path` until it answers `code` (bounded by 20 s); returns the body.
async fn wait_for(addr: SocketAddr, path: &'static str, code: u16) -> String {
    let start = Instant::now();
    loop {
        let (got, body) = get(addr, path).await;
        if got == code {
            return body;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{path} never answered {code}: last {got} {body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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
            if msg.payload.key == "block" {
                // Blocks its thread: the timeout cannot cancel it, so the member is not live meanwhile.
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
    assert_eq!(get(addr, "/livez").await.0, 200);
    let owned = "stream_listener_owned_shards{stream=\"probed\",group=\"g\",member=\"solo\"} 2";
    let start = Instant::now();
    loop {
        let (code, page) = get(addr, "/metrics").await;
        assert_eq!(code, 200);
        if page.contains(owned) {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{page}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(get(addr, "/nope").await.0, 404);

    // A handler blocking past its timeout: neither live nor ready, then both again once it returns.
    producer
        .send(
            "block",
            &Job {
                key: "block".into(),
            },
        )
        .await
        .unwrap();
    let body = wait_for(addr, "/livez", 503).await;
    assert!(body.contains("overdue_handlers=1"), "{body}");
    assert_eq!(get(addr, "/readyz").await.0, 503);
    wait_for(addr, "/livez", 200).await;
    wait_for(addr, "/readyz", 200).await;

    // Redis gone: the member self-fences (not ready) but its heartbeat loop keeps trying (live).
    redis.kill();
    let body = wait_for(addr, "/readyz", 503).await;
    assert!(body.contains("joined=false"), "{body}");
    assert_eq!(get(addr, "/livez").await.0, 200);

    // Redis back (empty): the member rejoins and is ready again.
    redis.restart();
    wait_for(addr, "/readyz", 200).await;
    drop(server);
    let _ = runtime.stop().await;
}
