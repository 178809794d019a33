//! Certificates for `rediss://` and `rediss+cluster://`: a certificate authority to trust instead of the
//! system's roots, and a client certificate for servers that require one (`tls-auth-clients yes`, mutual
//! TLS). [`TlsFiles`] names the PEM files; [`TlsFiles::load`] reads and checks them, and
//! [`RedisTarget::with_tls`](crate::connection::RedisTarget::with_tls) connects with them, on one node or a cluster.
//!
//! The runtime ([`Runtime::tls`](crate::Runtime::tls), [`Runtime::from_env`](crate::Runtime::from_env)),
//! the producer ([`Producer::connect_with_tls`](crate::Producer::connect_with_tls)) and the CLI
//! (`--tls-ca-cert`, `--tls-cert`, `--tls-key`) all go through here, with the same environment variables.

#[cfg(feature = "tls")]
use std::path::Path;
use std::path::PathBuf;

/// Environment variable naming the PEM file of the certificate authority to trust.
pub const CA_CERT_ENV: &str = "REDIS_TLS_CA_CERT";
/// Environment variable naming the PEM file of the client certificate (mutual TLS).
pub const CERT_ENV: &str = "REDIS_TLS_CERT";
/// Environment variable naming the PEM file of the client certificate's private key.
pub const KEY_ENV: &str = "REDIS_TLS_KEY";

/// PEM files for TLS connections. Empty (the default): the system's roots (or `SSL_CERT_FILE`), no client
/// certificate.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate authority to trust instead of the system's roots.
    pub ca_cert: Option<PathBuf>,
    /// A client certificate (mutual TLS); needs [`key`](Self::key).
    pub cert: Option<PathBuf>,
    /// The client certificate's private key; needs [`cert`](Self::cert).
    pub key: Option<PathBuf>,
}

/// Why the TLS files cannot be used. Names the file, never its contents.
#[derive(thiserror::Error, stream_listener_macros::ReportDebug)]
#[non_exhaustive]
pub enum TlsError {
    /// A file could not be read.
    #[error("{what} {}: {source}", .path.display())]
    Read {
        /// Which file (`CA certificate`, `client certificate`, `client key`).
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file was read but holds no usable PEM item.
    #[error("{what} {}: {reason}", .path.display())]
    Invalid {
        /// Which file.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// What is wrong with it (never its contents).
        reason: &'static str,
    },
    /// A client certificate without its key, or a key without its certificate.
    #[error("a client {given} needs a client {missing} too (REDIS_TLS_CERT and REDIS_TLS_KEY go together)")]
    Incomplete {
        /// The one given (`certificate` or `key`).
        given: &'static str,
        /// The one missing.
        missing: &'static str,
    },
    /// TLS files were given to a build without the `tls` feature.
    #[error("TLS files given, but stream-listener was built without its `tls` feature")]
    Unsupported,
}

impl TlsFiles {
    /// The files named by `REDIS_TLS_CA_CERT`, `REDIS_TLS_CERT` and `REDIS_TLS_KEY` (unset or empty: none).
    pub fn from_env() -> Self {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    pub(crate) fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Self {
        let path = |name| {
            lookup(name)
                .filter(|v| !v.trim().is_empty())
                .map(PathBuf::from)
        };
        Self {
            ca_cert: path(CA_CERT_ENV),
            cert: path(CERT_ENV),
            key: path(KEY_ENV),
        }
    }

    /// Whether no file is named (the system's roots, no client certificate).
    pub fn is_empty(&self) -> bool {
        self.ca_cert.is_none() && self.cert.is_none() && self.key.is_none()
    }

    /// Reads the files and checks that each holds what it should (a PEM certificate, a PEM private key),
    /// so a wrong file fails at start, naming it, rather than as a handshake error on every connection.
    #[cfg(feature = "tls")]
    pub fn load(&self) -> Result<redis::TlsCertificates, TlsError> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};

        let certificates = |path: &Path, what: &'static str| {
            let bytes = read(path, what)?;
            let parsed: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(&bytes).collect();
            match parsed {
                Ok(certs) if !certs.is_empty() => Ok(bytes),
                Ok(_) => Err(invalid(path, what, "no PEM certificate in it")),
                Err(_) => Err(invalid(path, what, "not a valid PEM certificate")),
            }
        };
        let root_cert = self
            .ca_cert
            .as_deref()
            .map(|path| certificates(path, "CA certificate"))
            .transpose()?;
        let client_tls = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                let client_cert = certificates(cert, "client certificate")?;
                let client_key = read(key, "client key")?;
                // The parser's error is not passed on: it may quote a line of the key.
                if PrivateKeyDer::from_pem_slice(&client_key).is_err() {
                    return Err(invalid(
                        key,
                        "client key",
                        "no PEM private key (PKCS#1, PKCS#8 or SEC1) in it",
                    ));
                }
                Some(redis::ClientTlsConfig {
                    client_cert,
                    client_key,
                })
            }
            (Some(_), None) => {
                return Err(TlsError::Incomplete {
                    given: "certificate",
                    missing: "key",
                })
            }
            (None, Some(_)) => {
                return Err(TlsError::Incomplete {
                    given: "key",
                    missing: "certificate",
                })
            }
            (None, None) => None,
        };
        Ok(redis::TlsCertificates {
            client_tls,
            root_cert,
        })
    }
}

#[cfg(feature = "tls")]
fn read(path: &Path, what: &'static str) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_owned(),
        source,
    })
}

#[cfg(feature = "tls")]
fn invalid(path: &Path, what: &'static str, reason: &'static str) -> TlsError {
    TlsError::Invalid {
        what,
        path: path.to_owned(),
        reason,
    }
}

/// `url` (from `origin`, named if it does not parse) as a [`RedisTarget`](crate::connection::RedisTarget),
/// with `tls`'s certificates when any file is named: what the runtime and the producer connect to.
pub(crate) fn open_target<E>(
    url: &str,
    origin: &'static str,
    tls: &TlsFiles,
) -> Result<crate::connection::RedisTarget, E>
where
    E: From<redis::RedisError> + From<TlsError> + From<crate::connection::InvalidUrl>,
{
    let target = crate::connection::RedisTarget::open_from(url, origin)?;
    if tls.is_empty() {
        return Ok(target);
    }
    #[cfg(feature = "tls")]
    {
        Ok(target.with_tls(tls.load()?)?)
    }
    #[cfg(not(feature = "tls"))]
    {
        Err(TlsError::Unsupported.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_env_reads_the_three_variables_and_ignores_empty_ones() {
        let files = TlsFiles::from_lookup(|name| match name {
            CA_CERT_ENV => Some("/etc/redis/ca.pem".into()),
            CERT_ENV => Some(" ".into()),
            KEY_ENV => Some("/etc/redis/client.key".into()),
            _ => None,
        });
        assert_eq!(
            files,
            TlsFiles {
                ca_cert: Some("/etc/redis/ca.pem".into()),
                cert: None,
                key: Some("/etc/redis/client.key".into()),
            }
        );
        assert!(TlsFiles::from_lookup(|_| None).is_empty());
    }

    #[cfg(feature = "tls")]
    #[test]
    fn load_names_the_file_that_is_missing_or_wrong_and_never_its_contents() {
        let dir = std::env::temp_dir().join(format!("sl-tls-load-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let not_pem = dir.join("notes.txt");
        std::fs::write(&not_pem, "secret-looking text, not a certificate\n").unwrap();

        let missing = dir.join("nope.pem");
        let error = TlsFiles {
            ca_cert: Some(missing.clone()),
            ..TlsFiles::default()
        }
        .load()
        .unwrap_err();
        assert!(matches!(error, TlsError::Read { .. }), "{error:?}");
        assert!(
            error
                .to_string()
                .starts_with(&format!("CA certificate {}: ", missing.display())),
            "{error}"
        );

        let error = TlsFiles {
            ca_cert: Some(not_pem.clone()),
            ..TlsFiles::default()
        }
        .load()
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            format!(
                "CA certificate {}: no PEM certificate in it",
                not_pem.display()
            )
        );

        // A key file that is no key: named, its text not quoted. (The certificate is checked first, so
        // give it one that passes: the same check reads it.)
        let cert = dir.join("cert.pem");
        std::fs::write(
            &cert,
            "-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let error = TlsFiles {
            cert: Some(cert.clone()),
            key: Some(not_pem.clone()),
            ..TlsFiles::default()
        }
        .load()
        .unwrap_err();
        let text = error.to_string();
        assert!(
            text.starts_with(&format!(
                "client key {}: no PEM private key",
                not_pem.display()
            )),
            "{text}"
        );
        assert!(!text.contains("secret-looking"), "{text}");

        let error = TlsFiles {
            cert: Some(cert),
            ..TlsFiles::default()
        }
        .load()
        .unwrap_err();
        assert!(matches!(error, TlsError::Incomplete { .. }), "{error}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
