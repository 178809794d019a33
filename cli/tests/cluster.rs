//! The `stream-listener` binary against a Redis Cluster of its own (3 masters + 3 replicas): `groups`
//! must scan every master, since each holds only the keys of its slots.

use std::collections::BTreeSet;
use std::process::Command;

use stream_listener::connection::{slot_of, ConnectOptions};
use stream_listener::topology::{StartFrom, Topology};
use stream_listener::RedisTarget;
use stream_listener_test_support::RedisCluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_finds_the_streams_of_every_master() {
    let cluster = RedisCluster::start();
    let url = cluster.url();
    let mut conn = RedisTarget::open(&url)
        .unwrap()
        .connect(ConnectOptions::default())
        .await
        .unwrap();
    let streams: Vec<String> = (0..12).map(|i| format!("s{i}")).collect();
    for stream in &streams {
        Topology::ensure(&mut conn, stream, 2).await.unwrap();
        Topology::ensure_group(&mut conn, stream, "g", StartFrom::Earliest)
            .await
            .unwrap();
    }
    // The topology records live on more than one master, or this test would not test the fan-out.
    let masters: BTreeSet<usize> = streams
        .iter()
        .map(|s| cluster.master_of(slot_of(format!("sl:topology:{{{s}}}").as_bytes())))
        .collect();
    assert!(masters.len() > 1, "all on masters {masters:?}");

    let output = Command::new(env!("CARGO_BIN_EXE_stream-listener"))
        .args(["--redis-url", &url, "groups", "--json"])
        .env_remove("REDIS_URL")
        .output()
        .expect("run the binary");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    let json: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(json["truncated"], false, "{stdout}");
    let listed: BTreeSet<String> = json["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            assert_eq!(g["group"], "g", "{g}");
            assert_eq!(g["shards"], 2, "{g}");
            g["stream"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(listed, streams.into_iter().collect::<BTreeSet<_>>());
}

/// `rediss+cluster://` with the TLS flags: the CLI connects to every node with the given authority and
/// client certificate (the library's `RedisTarget::with_tls`), on a cluster that requires one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_over_mutual_tls_on_a_cluster() {
    use stream_listener_test_support::tls::ClientCerts;
    let Some(cluster) = RedisCluster::start_tls_with(ClientCerts::Required) else {
        return;
    };
    let url = cluster.url();
    let file = |name: &str| cluster.tls_file(name).unwrap();
    let run = |flags: &[(&str, std::path::PathBuf)]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_stream-listener"));
        command.args(["--redis-url", &url]);
        for (flag, path) in flags {
            command.arg(flag).arg(path);
        }
        command
            .args(["groups", "--json"])
            .env_remove("REDIS_URL")
            .env_remove("REDIS_TLS_CA_CERT")
            .env_remove("REDIS_TLS_CERT")
            .env_remove("REDIS_TLS_KEY")
            .output()
            .expect("run the binary")
    };
    let output = run(&[
        ("--tls-ca-cert", file("ca.pem")),
        ("--tls-cert", file("client.pem")),
        ("--tls-key", file("client.key")),
    ]);
    assert!(output.status.success(), "{output:?}");
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(json["groups"], serde_json::json!([]), "{json}");

    // Without the client certificate the nodes refuse it.
    let output = run(&[("--tls-ca-cert", file("ca.pem"))]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("CertificateRequired"), "{stderr}");
}
