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
