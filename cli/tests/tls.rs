//! The CLI over TLS (`rediss://`) against a `redis-server` with a self-signed certificate authority made by
//! `openssl` in the test: trusted through `--tls-ca-cert`, through `SSL_CERT_FILE` (the system-roots path,
//! which is also what the library's `Runtime` uses without TLS files), with a client certificate (mutual
//! TLS), and refused when the authority is not trusted; then the library itself (producer and `Runtime`)
//! over the same `rediss://` URL through the system roots. The library's own TLS files are tested in
//! `tests/tests/tls.rs`.

use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use stream_listener_test_support::tls;

/// A TLS-only redis-server child, killed on drop.
struct TlsRedis {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start() -> Option<TlsRedis> {
    if !tls::openssl_available() {
        return None;
    }
    let dir = std::env::temp_dir().join(format!("sl-cli-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    tls::certificates(&dir);
    let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let binary = std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".into());
    let child = Command::new(binary)
        .args([
            "--port",
            "0",
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .args(["--tls-port", &port.to_string()])
        .args([
            "--tls-cert-file",
            "server.pem",
            "--tls-key-file",
            "server.key",
        ])
        .args(["--tls-ca-cert-file", "ca.pem"])
        // Client certificates are checked when presented; the `Runtime` below presents none.
        .args(["--tls-auth-clients", "optional"])
        .current_dir(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn redis-server");
    let server = TlsRedis { child, port, dir };
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "redis-server (TLS) did not listen on {port}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(server)
}

fn cli(
    server: &TlsRedis,
    url: &str,
    tls: &[&str],
    env: &[(&str, PathBuf)],
    args: &[&str],
) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_stream-listener"));
    command
        .arg("--redis-url")
        .arg(url)
        .args(tls)
        .args(args)
        .current_dir(&server.dir)
        .env_remove("REDIS_URL")
        .env_remove("SSL_CERT_FILE")
        .env_remove("SSL_CERT_DIR");
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().expect("run the binary")
}

#[test]
fn rediss_with_a_self_signed_authority() {
    let Some(server) = start() else { return };
    let port = server.port;
    let url = format!("rediss://127.0.0.1:{port}/");
    let ca = server.dir.join("ca.pem");

    // Trusted with --tls-ca-cert: a command runs over TLS (no streams yet: an empty listing).
    let mut ready = None;
    let deadline = Instant::now() + Duration::from_secs(10);
    while ready.is_none() {
        let out = cli(
            &server,
            &url,
            &["--tls-ca-cert", "ca.pem"],
            &[],
            &["groups"],
        );
        if out.status.success() {
            ready = Some(out);
        } else {
            assert!(Instant::now() < deadline, "TLS never worked: {out:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let out = ready.unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "no stream-listener streams or groups found\n"
    );

    // With a client certificate (mutual TLS).
    let out = cli(
        &server,
        &url,
        &[
            "--tls-ca-cert",
            "ca.pem",
            "--tls-cert",
            "client.pem",
            "--tls-key",
            "client.key",
        ],
        &[],
        &["groups", "--json"],
    );
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"groups\": []"));

    // The system-roots path (what `Runtime` uses): the authority comes from SSL_CERT_FILE.
    let out = cli(
        &server,
        &url,
        &[],
        &[("SSL_CERT_FILE", ca.clone())],
        &["groups"],
    );
    assert!(out.status.success(), "{out:?}");

    // An untrusted authority is refused, clearly (a certificate problem, named as one), and the password
    // stays hidden.
    let secret_url = format!("rediss://default:topsecret@127.0.0.1:{port}/");
    let out = cli(&server, &secret_url, &[], &[], &["groups"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        stderr.starts_with(&format!(
            "error: Redis at rediss://default:***@127.0.0.1:{port}/: the TLS handshake failed on a \
             certificate"
        )),
        "{stderr}"
    );
    assert!(stderr.contains("UnknownIssuer"), "{stderr}");
    assert!(!stderr.contains("topsecret"), "{stderr}");

    // Plain redis:// against the TLS port fails rather than hanging.
    let out = cli(
        &server,
        &format!("redis://127.0.0.1:{port}/"),
        &[],
        &[],
        &["groups"],
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");

    // A missing CA file is named.
    let out = cli(
        &server,
        &url,
        &["--tls-ca-cert", "nope.pem"],
        &[],
        &["groups"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("TLS: CA certificate nope.pem"),
        "{out:?}"
    );

    library_over_tls(&server);
}

/// The library over TLS: a producer and a `Runtime` member on `rediss://`, trusting the test authority
/// through `SSL_CERT_FILE` (as a deployment would through the system's roots).
fn library_over_tls(server: &TlsRedis) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use stream_listener::coordinator::metadata::GroupConfig;
    use stream_listener::topology::Topology;
    use stream_listener::{ConsumerBuilder, Message, Producer, Runtime};

    // Only this test runs in this binary's process, and it sets the variable before any other thread
    // (the async runtime's) exists.
    std::env::set_var("SSL_CERT_FILE", server.dir.join("ca.pem"));
    let url = format!("rediss://127.0.0.1:{}/", server.port);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = redis::Client::open(url.as_str()).unwrap();
        let mut conn = client
            .get_connection_manager()
            .await
            .expect("TLS connection");
        Topology::ensure(&mut conn, "tls", 2).await.unwrap();
        let handled = Arc::new(AtomicUsize::new(0));
        let counter = handled.clone();
        let running = Runtime::new(url.clone())
            .without_default_logging()
            .without_annotated_listeners()
            .group_config(GroupConfig {
                heartbeat_interval_ms: 200,
                session_timeout_ms: 5_000,
                rebalance_timeout_ms: 10_000,
            })
            .consumer(ConsumerBuilder::new("tls", "g").handler(
                move |_msg: Message<serde_json::Value>| {
                    let counter = counter.clone();
                    async move {
                        counter.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, std::io::Error>(())
                    }
                },
            ))
            .start()
            .await
            .expect("the runtime starts over TLS");
        let producer = Producer::new(conn.clone(), "tls").await.unwrap();
        for i in 0..10 {
            producer
                .send(format!("k{i}"), &serde_json::json!({ "i": i }))
                .await
                .unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while handled.load(Ordering::SeqCst) < 10 {
            assert!(
                Instant::now() < deadline,
                "handled {} of 10 over TLS",
                handled.load(Ordering::SeqCst)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = running.stop().await;
    });
}
