//! The README's complete example runs: `src/bin/readme.rs` is its code block (after the file's doc
//! comment), and this test starts that binary against a redis-server
//! of its own, produces with the README's `Order`, and waits for every order to be printed as handled.
//! Then SIGTERM: the runtime leaves the group and the process exits 0.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use stream_listener_test_support::RedisServer;

const README: &str = include_str!("../../README.md");
const BINARY: &str = include_str!("../src/bin/readme.rs");

/// The README's producing snippet declares this `Order` (a hidden line); the test uses the same.
const PRODUCER_ORDER: &str =
    "# #[derive(serde::Serialize)] struct Order { id: u64, amount_cents: u64 }";

#[derive(serde::Serialize)]
struct Order {
    id: u64,
    amount_cents: u64,
}

/// The first ```` ```rust ```` block after `heading`.
fn code_block(heading: &str) -> &'static str {
    let at = README.find(heading).expect("heading in the README");
    let start = README[at..].find("```rust").expect("a rust block") + at;
    let body = README[start..].find('\n').unwrap() + start + 1;
    let end = README[body..].find("```").unwrap() + body;
    &README[body..end]
}

#[test]
fn the_binary_is_the_readme_example() {
    let (_doc, code) = BINARY.split_once("\n\n").unwrap();
    assert!(
        code == code_block("## A complete small example"),
        "examples/src/bin/readme.rs differs from the README's complete example: copy the block again"
    );
    assert!(
        README.contains(PRODUCER_ORDER),
        "the README's producer Order changed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_example_handles_what_the_readme_producer_sends() {
    let redis = RedisServer::start();
    let mut child = Command::new(env!("CARGO_BIN_EXE_readme"))
        .env("REDIS_URL", redis.url())
        .env("STREAM_LISTENER_MEMBER_ID", "readme")
        .env("STREAM_LISTENER_HEARTBEAT_INTERVAL_MS", "100")
        .env("STREAM_LISTENER_SESSION_TIMEOUT_MS", "2000")
        .env("STREAM_LISTENER_REBALANCE_TIMEOUT_MS", "4000")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the readme binary");
    let stdout = child.stdout.take().unwrap();
    let (lines_tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });

    // As the README's producing snippet does.
    let producer = stream_listener::Producer::connect_creating(&redis.url(), "orders", 16)
        .await
        .unwrap();
    const ORDERS: u64 = 20;
    for id in 1..=ORDERS {
        let order = Order {
            id,
            amount_cents: 995,
        };
        producer
            .send(&format!("customer-{}", id % 7), &order)
            .await
            .unwrap();
    }

    let mut handled = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while handled.len() < ORDERS as usize {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = lines
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("only {handled:?} handled within 30 s"));
        // "order 7 (995 cents) from shard 3 by FencingToken { .. }"
        if let Some(rest) = line.strip_prefix("order ") {
            let (id, rest) = rest.split_once(' ').unwrap();
            assert!(rest.starts_with("(995 cents) from shard "), "{line}");
            handled.insert(id.parse::<u64>().unwrap());
        }
    }
    assert_eq!(handled, (1..=ORDERS).collect());

    let term = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "no exit within 20 s of SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
}
