//! The library's own TLS certificates (`Runtime::tls*`, `Producer::connect_with_tls`): a `redis-server`
//! (and a Redis Cluster) whose TLS ports require a client certificate (`tls-auth-clients yes`), signed by a
//! certificate authority made with `openssl` in the test. Nothing here sets `SSL_CERT_FILE`: the
//! authority is trusted only through the files given. Under `CI` a missing `openssl` fails these tests
//! (`tls::openssl_available`).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stream_listener::preflight::Refusal;
use stream_listener::store::GroupKeys;
use stream_listener::{ConsumerBuilder, Message, Producer, RunningRuntime, RuntimeError, TlsFiles};
use stream_listener_test_support::tls::{ClientCerts, TlsRedisServer};
use stream_listener_test_support::RedisCluster;
use stream_listener_tests::{test_runtime, Order};
use tokio::time::Instant;

/// The authority and the client certificate of a server's (or cluster's) test certificates.
fn mutual(file: impl Fn(&str) -> PathBuf) -> TlsFiles {
    TlsFiles {
        ca_cert: Some(file("ca.pem")),
        cert: Some(file("client.pem")),
        key: Some(file("client.key")),
    }
}

/// A runtime with `tls` and one consumer of `stream`/`g` recording what it handles; a producer with the
/// same files sends `n` orders; waits until all were handled, in order per key. Returns the runtime,
/// still running.
async fn consume_over_tls(url: &str, tls: &TlsFiles, stream: &str, n: u32) -> RunningRuntime {
    let producer = Producer::connect_creating_with_tls(url, stream, 4, tls)
        .await
        .expect("the producer connects with the client certificate");
    let seen: Arc<Mutex<Vec<Order>>> = Arc::default();
    let handled = seen.clone();
    let running = test_runtime(url)
        .tls(tls.clone())
        .startup_timeout(Duration::from_secs(10))
        .consumer(
            ConsumerBuilder::new(stream, "g").handler(move |msg: Message<Order>| {
                let handled = handled.clone();
                async move {
                    handled.lock().unwrap().push(msg.payload);
                    Ok::<(), String>(())
                }
            }),
        )
        .start()
        .await
        .expect("the runtime starts with the client certificate");
    for seq in 0..n {
        let key = format!("k{}", seq % 5);
        let order = Order {
            key: key.clone(),
            seq,
        };
        producer.send(&key, &order).await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen.lock().unwrap().len() < n as usize {
        assert!(
            Instant::now() < deadline,
            "handled {} of {n} over mutual TLS",
            seen.lock().unwrap().len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seen = seen.lock().unwrap();
    let mut seqs: Vec<u32> = seen.iter().map(|o| o.seq).collect();
    seqs.sort_unstable();
    assert_eq!(seqs, (0..n).collect::<Vec<_>>(), "each order once");
    for k in 0..5 {
        let of_key: Vec<u32> = seen
            .iter()
            .filter(|o| o.key == format!("k{k}"))
            .map(|o| o.seq)
            .collect();
        assert!(of_key.windows(2).all(|w| w[0] < w[1]), "k{k}: {of_key:?}");
    }
    running
}

/// Starting a runtime with `tls` fails: the error, for its text.
async fn start_error(url: &str, tls: TlsFiles) -> RuntimeError {
    test_runtime(url)
        .tls(tls)
        .startup_timeout(Duration::from_millis(600))
        .consumer(
            ConsumerBuilder::new("refused", "g")
                .handler(|_msg: Message<Order>| async { Ok::<(), String>(()) }),
        )
        .start()
        .await
        .expect_err("the runtime must not start")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_and_a_producer_with_a_client_certificate_work_where_one_is_required() {
    let Some(redis) = TlsRedisServer::start(ClientCerts::Required) else {
        return;
    };
    let running = consume_over_tls(&redis.url(), &mutual(|f| redis.file(f)), "mtls", 40).await;
    running.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_client_certificate_or_the_authority_the_connection_is_refused_clearly() {
    let Some(redis) = TlsRedisServer::start(ClientCerts::Required) else {
        return;
    };
    let url = redis.url();

    // The authority alone: the server wants a client certificate.
    let ca_only = TlsFiles {
        ca_cert: Some(redis.file("ca.pem")),
        ..TlsFiles::default()
    };
    // A certificate problem is a start error at once, not retried.
    let error = start_error(&url, ca_only.clone()).await;
    let text = error.to_string();
    assert!(
        matches!(&error, RuntimeError::Refused(refused) if refused.refusal == Refusal::Certificate),
        "{error:?}"
    );
    assert!(
        text.starts_with(&format!(
            "Redis at {url}: the TLS handshake failed on a certificate"
        )),
        "{text}"
    );
    // The server's alert, as rustls reports it.
    assert!(text.ends_with("CertificateRequired)"), "{text}");
    let error = Producer::connect_with_tls(&url, "refused", &ca_only)
        .await
        .expect_err("the producer must not connect without its certificate");
    assert!(error.to_string().contains("CertificateRequired"), "{error}");

    // The client certificate without the authority: the server's certificate is not trusted (the
    // system's roots do not know the test authority).
    let no_ca = TlsFiles {
        ca_cert: None,
        ..mutual(|f| redis.file(f))
    };
    let text = start_error(&url, no_ca).await.to_string();
    assert!(
        text.starts_with(&format!(
            "Redis at {url}: the TLS handshake failed on a certificate"
        )),
        "{text}"
    );
    assert!(text.contains("UnknownIssuer"), "{text}");
}

#[tokio::test]
async fn an_unusable_tls_file_is_a_start_error_naming_it() {
    let dir = std::env::temp_dir().join(format!("sl-tls-files-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // No server needed: the files are read before any connection.
    let url = "rediss://127.0.0.1:1/";

    let missing = dir.join("no-such-ca.pem");
    let error = start_error(
        url,
        TlsFiles {
            ca_cert: Some(missing.clone()),
            ..TlsFiles::default()
        },
    )
    .await;
    assert!(matches!(error, RuntimeError::Tls(_)), "{error:?}");
    assert!(
        error
            .to_string()
            .starts_with(&format!("TLS: CA certificate {}: ", missing.display())),
        "{error}"
    );

    let empty = dir.join("empty.pem");
    std::fs::write(&empty, "").unwrap();
    let error = Producer::connect_with_tls(
        url,
        "s",
        &TlsFiles {
            ca_cert: Some(empty.clone()),
            ..TlsFiles::default()
        },
    )
    .await
    .expect_err("an empty CA file is refused");
    assert_eq!(
        error.to_string(),
        format!(
            "TLS: CA certificate {}: no PEM certificate in it",
            empty.display()
        )
    );

    // TLS files with a URL that is not TLS: refused, not silently ignored.
    let Some(redis) = TlsRedisServer::start(ClientCerts::Required) else {
        return;
    };
    let plain = redis.server().url();
    let error = start_error(&plain, mutual(|f| redis.file(f))).await;
    assert!(matches!(error, RuntimeError::Redis(_)), "{error:?}");
    assert!(error.to_string().contains("rediss://"), "{error}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_requiring_client_certificates_serves_a_runtime_and_a_producer_with_them() {
    let Some(cluster) = RedisCluster::start_tls_with(ClientCerts::Required) else {
        return;
    };
    let url = cluster.url();
    assert!(url.starts_with("rediss+cluster://"), "{url}");
    let tls = mutual(|f| cluster.tls_file(f).unwrap());
    let running = consume_over_tls(&url, &tls, "mtls-cluster", 60).await;
    // The connections opened per node, not through the cluster client, present the certificate too:
    // the idle wait's blocking reads (one per slot, straight to the slot's master) and the group's
    // wake-up subscription.
    let wake = GroupKeys::new("mtls-cluster", "g").wake;
    let sum = |args: &[&str], field: &dyn Fn(&str) -> Option<u64>| -> u64 {
        cluster
            .nodes()
            .iter()
            .map(|node| field(&cluster.cli(node.port(), args).unwrap()).unwrap_or(0))
            .sum()
    };
    let blocked = || {
        sum(&["INFO", "clients"], &|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("blocked_clients:"))
                .and_then(|n| n.trim().parse().ok())
        })
    };
    let subscribed = || {
        sum(&["PUBSUB", "NUMSUB", &wake], &|reply| {
            reply.lines().nth(1).and_then(|n| n.trim().parse().ok())
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while blocked() == 0 || subscribed() == 0 {
        assert!(
            Instant::now() < deadline,
            "blocked reads {}, wake-up subscriptions {}",
            blocked(),
            subscribed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    running.stop().await.unwrap();

    // Without the client certificate the cluster's nodes refuse.
    let ca_only = TlsFiles {
        ca_cert: tls.ca_cert.clone(),
        ..TlsFiles::default()
    };
    let error = start_error(&url, ca_only).await;
    assert!(
        matches!(&error, RuntimeError::Refused(refused) if refused.refusal == Refusal::Certificate),
        "{error:?}"
    );
    assert!(error.to_string().contains("CertificateRequired"), "{error}");
}
