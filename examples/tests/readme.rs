//! The README's snippets are complete programs that run as written: every ```` ```rust ```` block of the
//! README is one of `src/bin/readme_*.rs` byte for byte (so cargo compiles it), and these tests run those
//! binaries against a redis-server of their own: the README's producer sends, the README's consumers
//! handle, and the consumer's default logs show its start, join and shards, and a dead letter.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use stream_listener_test_support::RedisServer;

const README: &str = include_str!("../../README.md");

/// The README's rust blocks, in order: the binary that is each one.
const BLOCKS: &[(&str, &str)] = &[
    (
        "readme_consumer",
        include_str!("../src/bin/readme_consumer.rs"),
    ),
    (
        "readme_producer",
        include_str!("../src/bin/readme_producer.rs"),
    ),
    (
        "readme_builder",
        include_str!("../src/bin/readme_builder.rs"),
    ),
];

/// The one `Order` of the README and of every example.
const ORDER: &str = "struct Order {\n    id: u64,\n    amount_cents: u64,\n}\n";

/// Every fenced block whose info string starts with `rust`: (info string, body).
fn rust_blocks(markdown: &str) -> Vec<(&str, &str)> {
    let mut blocks = Vec::new();
    let mut rest = markdown;
    while let Some(at) = rest.find("\n```") {
        let fence = &rest[at + 4..];
        let (info, body) = fence.split_once('\n').unwrap_or((fence, ""));
        let end = body.find("\n```").map_or(body.len(), |e| e + 1);
        if info.starts_with("rust") {
            blocks.push((info, &body[..end]));
        }
        rest = &body[end..];
        rest = rest.strip_prefix("```").unwrap_or(rest);
    }
    blocks
}

#[test]
fn every_readme_rust_block_is_a_binary_of_this_crate() {
    let blocks = rust_blocks(README);
    let names: Vec<&str> = BLOCKS.iter().map(|(name, _)| *name).collect();
    assert_eq!(
        blocks.len(),
        BLOCKS.len(),
        "README rust blocks vs {names:?}"
    );
    for ((info, body), (name, file)) in blocks.iter().zip(BLOCKS) {
        assert_eq!(
            *info, "rust",
            "{name}: a plain ```rust block (no no_run, no hidden lines)"
        );
        assert!(
            body == file,
            "the README's block differs from examples/src/bin/{name}.rs: copy one to the other"
        );
    }
    let bins = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/bin");
    let mut readme_bins: Vec<String> = std::fs::read_dir(bins)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|f| f.starts_with("readme"))
        .collect();
    readme_bins.sort();
    let mut expected: Vec<String> = names.iter().map(|n| format!("{n}.rs")).collect();
    expected.sort();
    assert_eq!(
        readme_bins, expected,
        "a readme binary the README does not show"
    );
}

#[test]
fn the_block_extractor_finds_blocks_and_their_info_strings() {
    let markdown =
        "x\n```sh\nls\n```\n\n```rust,no_run\nfn a() {}\n```\ntext\n```rust\nfn b() {}\n```\n";
    assert_eq!(
        rust_blocks(markdown),
        [("rust,no_run", "fn a() {}\n"), ("rust", "fn b() {}\n")]
    );
}

#[test]
fn every_example_declares_the_same_order() {
    let bins = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/bin");
    let mut checked = 0;
    for entry in std::fs::read_dir(bins).unwrap() {
        let path = entry.unwrap().path();
        let code = std::fs::read_to_string(&path).unwrap();
        if let Some(at) = code.find("struct Order") {
            assert!(
                code[at..].starts_with(ORDER),
                "{} declares another Order than the README's",
                path.display()
            );
            checked += 1;
        }
    }
    assert!(checked >= 7, "only {checked} examples declare an Order");
}

/// A line a child printed, and on which stream.
#[derive(Debug)]
enum Line {
    Out(String),
    Err(String),
}

/// A README binary running against `redis`, its lines arriving on a channel. Killed when dropped.
struct Running {
    child: Child,
    lines: mpsc::Receiver<Line>,
    seen: Vec<Line>,
}

impl Running {
    fn start(binary: &str, redis: &RedisServer) -> Running {
        let mut child = Command::new(binary)
            .env("REDIS_URL", redis.url())
            .env_remove("RUST_LOG")
            .env("STREAM_LISTENER_MEMBER_ID", "readme")
            .env("STREAM_LISTENER_HEARTBEAT_INTERVAL_MS", "100")
            .env("STREAM_LISTENER_SESSION_TIMEOUT_MS", "2000")
            .env("STREAM_LISTENER_REBALANCE_TIMEOUT_MS", "4000")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the binary");
        let (tx, lines) = mpsc::channel();
        forward(child.stdout.take().unwrap(), tx.clone(), Line::Out);
        forward(child.stderr.take().unwrap(), tx, Line::Err);
        Running {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits up to 30 s until `done` holds for the lines seen so far.
    fn wait_for(&mut self, what: &str, done: impl Fn(&[Line]) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !done(&self.seen) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(_) => panic!("no {what} within 30 s; lines: {:#?}", self.seen),
            }
        }
    }

    /// SIGTERM, then the exit status within 20 s.
    fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        let term = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(term.success());
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "no exit within 20 s of SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
    }
}

fn forward(from: impl Read + Send + 'static, to: mpsc::Sender<Line>, tag: fn(String) -> Line) {
    std::thread::spawn(move || {
        for line in BufReader::new(from).lines().map_while(Result::ok) {
            if to.send(tag(line)).is_err() {
                break;
            }
        }
    });
}

fn stdout_has(lines: &[Line], text: &str) -> bool {
    lines
        .iter()
        .any(|l| matches!(l, Line::Out(l) if l.contains(text)))
}

fn stderr_has(lines: &[Line], parts: &[&str]) -> bool {
    lines
        .iter()
        .any(|l| matches!(l, Line::Err(l) if parts.iter().all(|p| l.contains(p))))
}

/// The ids of `order <id> (995 cents) from shard ...` lines.
fn handled(lines: &[Line]) -> std::collections::BTreeSet<u64> {
    lines
        .iter()
        .filter_map(|l| match l {
            Line::Out(l) => l.strip_prefix("order "),
            Line::Err(_) => None,
        })
        .filter(|rest| rest.contains(" (995 cents) from shard "))
        .filter_map(|rest| rest.split(' ').next()?.parse().ok())
        .collect()
}

/// Runs the README's producer to its end: it sends orders 1..=10.
fn produce(redis: &RedisServer) {
    let output = Command::new(env!("CARGO_BIN_EXE_readme_producer"))
        .env("REDIS_URL", redis.url())
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "sent 10 orders\n");
}

#[test]
fn the_readme_consumer_logs_by_default_and_handles_what_the_readme_producer_sends() {
    let redis = RedisServer::start();
    let mut consumer = Running::start(env!("CARGO_BIN_EXE_readme_consumer"), &redis);
    // The default subscriber: INFO lines on stderr, each in its member's span.
    consumer.wait_for("start, join and assignment logs", |lines| {
        stderr_has(lines, &["INFO", "member=readme-m0", "member starting"])
            && stderr_has(lines, &["INFO", "readme-m0", "joined the group", "epoch="])
            && stderr_has(
                lines,
                &["INFO", "readme-m0", "assignment changed", "assigned=["],
            )
    });
    produce(&redis);
    consumer.wait_for("every order handled", |lines| {
        handled(lines) == (1..=10).collect()
    });
    assert!(stdout_has(&consumer.seen, "by FencingToken"));

    // A payload that is not an Order is dead-lettered, and says so.
    let url = redis.url();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let producer = stream_listener::Producer::connect(&url, "orders")
            .await
            .unwrap();
        producer
            .send("customer-1", &serde_json::json!({ "id": "one" }))
            .await
            .unwrap();
    });
    consumer.wait_for("a dead letter's WARN", |lines| {
        stderr_has(
            lines,
            &[
                "WARN",
                "dead-lettering entry",
                "undecodable payload",
                "orders:dlq",
            ],
        )
    });

    let status = consumer.terminate();
    assert!(status.success(), "{status}");
}

#[test]
fn the_readme_builder_handles_what_the_readme_producer_sends() {
    let redis = RedisServer::start();
    let mut consumer = Running::start(env!("CARGO_BIN_EXE_readme_builder"), &redis);
    consumer.wait_for("its member's start", |lines| {
        stderr_has(lines, &["INFO", "member starting"])
    });
    produce(&redis);
    consumer.wait_for("every order handled", |lines| {
        handled(lines) == (1..=10).collect()
    });
    let status = consumer.terminate();
    assert!(status.success(), "{status}");
}
