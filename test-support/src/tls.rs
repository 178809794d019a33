//! Test certificates made with `openssl`: a certificate authority, a server certificate for 127.0.0.1
//! and a client certificate (mutual TLS), all signed by the authority, for TLS servers and clusters.

use std::path::Path;
use std::process::Command;

/// Whether `openssl` can run. CI installs it (`scripts/install-redis.sh`): a TLS test that finds it
/// missing under `CI` fails instead of skipping, so a broken TLS path cannot hide.
///
/// # Panics
/// If `openssl` is missing and `CI` is set.
pub fn openssl_available() -> bool {
    if Command::new("openssl").arg("version").output().is_ok() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "no openssl to make a certificate, and CI must run the TLS tests"
    );
    eprintln!("SKIPPED: no openssl to make a certificate (scripts/install-redis.sh installs it)");
    false
}

fn openssl(dir: &Path, args: &[&str]) {
    let output = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl");
    assert!(output.status.success(), "openssl {args:?}: {output:?}");
}

/// Writes `ca.pem`/`ca.key`, `server.pem`/`server.key` and `client.pem`/`client.key` into `dir`: a CA,
/// a server certificate for 127.0.0.1 and a client certificate, both signed by the CA.
///
/// # Panics
/// If `openssl` fails.
pub fn certificates(dir: &Path) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-subj",
            "/CN=stream-listener test CA",
        ],
    );
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
         extendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    // An extension makes it an X.509 v3 certificate, which webpki requires.
    std::fs::write(
        dir.join("client.ext"),
        "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
    )
    .unwrap();
    for name in ["server", "client"] {
        openssl(
            dir,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
                "-subj",
                &format!("/CN={name}"),
            ],
        );
        let mut args = vec![
            "x509".to_string(),
            "-req".into(),
            "-in".into(),
            format!("{name}.csr"),
            "-CA".into(),
            "ca.pem".into(),
            "-CAkey".into(),
            "ca.key".into(),
            "-CAcreateserial".into(),
            "-days".into(),
            "2".into(),
            "-out".into(),
            format!("{name}.pem"),
        ];
        args.extend(["-extfile".into(), format!("{name}.ext")]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        openssl(dir, &args);
    }
}

/// Whether a TLS server asks for client certificates (`tls-auth-clients`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientCerts {
    /// `tls-auth-clients yes`: a client without a certificate signed by the authority is refused.
    Required,
    /// `tls-auth-clients optional`: checked when presented.
    Optional,
}

impl ClientCerts {
    pub(crate) fn redis_value(self) -> &'static str {
        match self {
            Self::Required => "yes",
            Self::Optional => "optional",
        }
    }
}

/// A [`RedisServer`](crate::RedisServer) that also listens on a TLS port with [`certificates`] (the
/// plain port stays open for this crate's own commands). Killed on drop.
#[derive(Debug)]
pub struct TlsRedisServer {
    server: crate::RedisServer,
    tls_port: u16,
    certs: crate::TempDir,
}

impl TlsRedisServer {
    /// Starts one, or `None` (skipped) without `openssl` outside `CI` (see [`openssl_available`]).
    ///
    /// # Panics
    /// If the certificates cannot be made or the server does not start.
    pub fn start(client_certs: ClientCerts) -> Option<TlsRedisServer> {
        if !openssl_available() {
            return None;
        }
        let certs = crate::TempDir::new().expect("a directory for the certificates");
        certificates(&certs.path);
        let mut last_error = None;
        for _ in 0..crate::PORT_ATTEMPTS {
            let tls_port = crate::free_port().expect("a free port");
            let file = |name: &str| certs.path.join(name).display().to_string();
            let extra = vec![
                "--tls-port".into(),
                tls_port.to_string(),
                "--tls-cert-file".into(),
                file("server.pem"),
                "--tls-key-file".into(),
                file("server.key"),
                "--tls-ca-cert-file".into(),
                file("ca.pem"),
                "--tls-auth-clients".into(),
                client_certs.redis_value().into(),
            ];
            match crate::RedisServer::try_start_with_args(extra, None) {
                Ok(server) => {
                    return Some(TlsRedisServer {
                        server,
                        tls_port,
                        certs,
                    })
                }
                // The TLS port was taken between the probe and the bind: pick another.
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => last_error = Some(e),
                Err(e) => panic!("could not start a TLS redis-server: {e}"),
            }
        }
        panic!("could not start a TLS redis-server: {last_error:?}")
    }

    /// `rediss://127.0.0.1:<tls port>/`.
    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}/", self.tls_port)
    }

    /// The TLS port.
    pub fn tls_port(&self) -> u16 {
        self.tls_port
    }

    /// The server (its plain port, its log).
    pub fn server(&self) -> &crate::RedisServer {
        &self.server
    }

    /// A file of the certificates' directory: `ca.pem`, `client.pem`, `client.key` (see
    /// [`certificates`]).
    pub fn file(&self, name: &str) -> std::path::PathBuf {
        self.certs.path.join(name)
    }
}
