//! `stream-listener exporter`: the binary started on a free loopback port (`--listen 127.0.0.1:0`, the
//! address it prints), scraped over HTTP, its numbers compared with `XINFO GROUPS` / `XPENDING`; an
//! unknown stream and a corrupt topology are errors of their scrape only; on a single node and on a
//! cluster (groups discovered on every master). No member runs: the exporter is not one.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use redis::Value;
use stream_listener::reply::xinfo_groups;
use stream_listener::routing::shard_stream_key;
use stream_listener::topology::{StartFrom, Topology};
use stream_listener::{Connection, Producer, RedisTarget};
use stream_listener_test_support::{wait_for_blocking, RedisCluster, RedisServer};

/// The exporter process, killed on drop.
struct Exporter {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Exporter {
    /// Starts `stream-listener --redis-url url exporter --listen 127.0.0.1:0 args..` and waits (20 s at
    /// most) for the address it prints.
    fn start(url: &str, args: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_stream-listener"))
            .args(["--redis-url", url, "exporter", "--listen", "127.0.0.1:0"])
            .args(args)
            .env_remove("REDIS_URL")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("run the binary");
        let stdout = child.stdout.take().unwrap();
        let (sender, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        let line = lines
            .recv_timeout(Duration::from_secs(20))
            .expect("the exporter prints where it listens");
        let addr = line
            .strip_prefix("listening on ")
            .and_then(|rest| {
                rest.split(':')
                    .take(2)
                    .collect::<Vec<_>>()
                    .join(":")
                    .parse()
                    .ok()
            })
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
        Self { child, addr }
    }

    /// `(status code, body)` of `GET path`.
    fn get(&self, path: &str) -> (u16, String) {
        stream_listener_test_support::http::get(self.addr, path)
    }

    fn json(&self, path: &str) -> (u16, serde_json::Value) {
        let (code, body) = self.get(path);
        (
            code,
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}")),
        )
    }
}

async fn connect(url: &str) -> Connection {
    RedisTarget::open(url)
        .unwrap()
        .connect(Default::default())
        .await
        .unwrap()
}

/// `(lag, pending)` of `group` on every shard, as Redis says (`XINFO GROUPS`, checked against
/// `XPENDING`'s count).
async fn truth(conn: &mut Connection, stream: &str, group: &str, shards: u32) -> Vec<(u64, u64)> {
    let mut rows = Vec::new();
    for shard in 0..shards {
        let key = shard_stream_key(stream, shard);
        let reply: Value = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(&key)
            .query_async(conn)
            .await
            .unwrap();
        let info = xinfo_groups(&reply)
            .unwrap()
            .into_iter()
            .find(|g| g.name == group)
            .unwrap();
        let (count, ..): (u64, Value, Value, Value) = redis::cmd("XPENDING")
            .arg(&key)
            .arg(group)
            .query_async(conn)
            .await
            .unwrap();
        assert_eq!(info.pending, Some(count));
        rows.push((info.lag.expect("Redis knows the lag here"), count));
    }
    rows
}

/// Makes some of `group`'s entries pending: `count` delivered on shard 0.
async fn deliver(conn: &mut Connection, stream: &str, group: &str, count: usize) {
    let _: Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(group)
        .arg("c")
        .arg("COUNT")
        .arg(count)
        .arg("STREAMS")
        .arg(shard_stream_key(stream, 0))
        .arg(">")
        .query_async(conn)
        .await
        .unwrap();
}

/// The exporter's per-shard `(lag, pending)` and totals of `stream/group`.
fn exported(exporter: &Exporter, stream: &str, group: &str) -> (Vec<(u64, u64)>, u64, u64) {
    let (code, body) = exporter.json(&format!("/lag/{stream}/{group}"));
    assert_eq!(code, 200, "{body}");
    let shards = body["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["lag"].as_u64().unwrap(), s["pending"].as_u64().unwrap()))
        .collect();
    (
        shards,
        body["lag"].as_u64().unwrap(),
        body["pending"].as_u64().unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exporter_serves_redis_numbers_and_errors_per_group_on_a_single_node() {
    let server = RedisServer::start();
    let url = server.url();
    let mut conn = connect(&url).await;
    let producer = Producer::connect_creating(&url, "orders", 4).await.unwrap();
    Topology::ensure_group(&mut conn, "orders", "billing", StartFrom::Earliest)
        .await
        .unwrap();
    for i in 0..30 {
        producer.send(format!("k{i}"), &i).await.unwrap();
    }
    deliver(&mut conn, "orders", "billing", 3).await;
    let _: () = redis::cmd("HSET")
        .arg("sl:topology:{broken}")
        .arg("shardCount")
        .arg("-1")
        .query_async(&mut conn)
        .await
        .unwrap();
    let exporter = Exporter::start(
        &url,
        &[
            "--group",
            "orders/billing",
            "--group",
            "nowhere/billing",
            "--group",
            "broken/billing",
            "--cache-ms",
            "100",
        ],
    );
    let want = truth(&mut conn, "orders", "billing", 4).await;
    let (shards, lag, pending) = exported(&exporter, "orders", "billing");
    assert_eq!(shards, want);
    assert_eq!((lag, pending), (27, 3));
    let (_, body) = exporter.json("/lag/orders/billing");
    assert_eq!(
        (body["liveMembers"].as_u64(), body["shardCount"].as_u64()),
        (Some(0), Some(4))
    );
    assert!(body["oldestUnackedAgeMs"].as_u64().is_some(), "{body}");

    let (code, body) = exporter.json("/lag/nowhere/billing");
    assert_eq!(code, 404);
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("unknown stream `nowhere`"),
        "{body}"
    );
    let (code, body) = exporter.json("/lag/broken/billing");
    assert_eq!(code, 503);
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("sl:topology:{broken}"),
        "{body}"
    );
    let (code, metrics) = exporter.get("/metrics");
    assert_eq!(code, 200);
    for line in [
        "stream_listener_group_lag{stream=\"orders\",group=\"billing\"} 27\n",
        "stream_listener_group_pending{stream=\"orders\",group=\"billing\"} 3\n",
        "stream_listener_group_backlog{stream=\"orders\",group=\"billing\"} 30\n",
        "stream_listener_group_live_members{stream=\"orders\",group=\"billing\"} 0\n",
        "stream_listener_group_up{stream=\"nowhere\",group=\"billing\"} 0\n",
        "stream_listener_group_up{stream=\"broken\",group=\"billing\"} 0\n",
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }

    // More entries: the exporter follows (its cache is 100 ms), still up after the bad scrapes.
    for i in 0..10 {
        producer.send(format!("more{i}"), &i).await.unwrap();
    }
    let want = truth(&mut conn, "orders", "billing", 4).await;
    let got = wait_for_blocking(
        "the exporter to see 10 more",
        Duration::from_secs(20),
        || {
            let got = exported(&exporter, "orders", "billing");
            (got.1 == 37).then_some(got)
        },
    );
    assert_eq!(got.0, want);
    drop(exporter);
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exporter_discovers_groups_on_every_master_of_a_cluster() {
    let cluster = RedisCluster::shared();
    let url = cluster.url();
    let mut conn = connect(&url).await;
    let streams: Vec<String> = (0..6).map(|i| format!("exported{i}")).collect();
    for (i, stream) in streams.iter().enumerate() {
        let producer = Producer::connect_creating(&url, stream, 4).await.unwrap();
        Topology::ensure_group(&mut conn, stream, "g", StartFrom::Earliest)
            .await
            .unwrap();
        for n in 0..(5 + i as u32) {
            producer.send(format!("k{n}"), &n).await.unwrap();
        }
    }
    deliver(&mut conn, &streams[0], "g", 1).await;
    let exporter = Exporter::start(&url, &[]);
    let (code, all) = exporter.json("/lag");
    assert_eq!(code, 200);
    let listed: Vec<String> = all["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            format!(
                "{}/{}",
                g["stream"].as_str().unwrap(),
                g["group"].as_str().unwrap()
            )
        })
        .collect();
    for stream in &streams {
        assert!(
            listed.contains(&format!("{stream}/g")),
            "{stream} in {listed:?}"
        );
    }
    for (i, stream) in streams.iter().enumerate() {
        let want = truth(&mut conn, stream, "g", 4).await;
        let (shards, lag, pending) = exported(&exporter, stream, "g");
        assert_eq!(shards, want, "{stream}");
        let delivered = u64::from(i == 0);
        assert_eq!(
            (lag, pending),
            (5 + i as u64 - delivered, delivered),
            "{stream}"
        );
    }
}
