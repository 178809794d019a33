//! The CLI behind Redis Sentinel: `--redis-url redis+sentinel://...` finds the master, and after
//! `SENTINEL FAILOVER` a new run finds the new one.

use std::process::Command;

use stream_listener::connection::{ConnectOptions, RedisTarget};
use stream_listener::topology::{StartFrom, Topology};
use stream_listener_test_support::RedisSentinels;

/// Runs the binary with `--redis-url url` (and no `REDIS_URL`); asserts success and returns stdout.
fn cli(url: &str, args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_stream-listener"))
        .arg("--redis-url")
        .arg(url)
        .args(args)
        .env_remove("REDIS_URL")
        .output()
        .expect("run the binary");
    assert!(output.status.success(), "{output:#?}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_finds_the_master_through_the_sentinels_before_and_after_a_failover() {
    let sentinels = RedisSentinels::start(1);
    let url = sentinels.url();
    let mut conn = RedisTarget::open(&url)
        .unwrap()
        .connect(ConnectOptions::default())
        .await
        .unwrap();
    Topology::ensure(&mut conn, "orders", 2).await.unwrap();
    Topology::ensure_group(&mut conn, "orders", "billing", StartFrom::Earliest)
        .await
        .unwrap();
    let before = cli(&url, &["groups"]);
    assert!(
        before.contains("orders  2") || before.contains("billing"),
        "{before}"
    );
    let new = tokio::task::block_in_place(|| sentinels.failover()).unwrap();
    let after = cli(&url, &["groups"]);
    assert_eq!(before, after, "the new master {new} holds the same groups");
    // A name no sentinel monitors fails at once, naming the cause.
    let output = Command::new(env!("CARGO_BIN_EXE_stream-listener"))
        .arg("--redis-url")
        .arg(url.replace("/sl-master", "/nope"))
        .arg("groups")
        .env_remove("REDIS_URL")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("no sentinel monitors"), "{stderr}");
}
