//! The connection every command uses, and the Redis reads the library has no call for.

use std::collections::HashMap;
use std::time::Duration;

use redis::Value;
use stream_listener::connection::{ConnectOptions, Connection, RedisTarget};
use stream_listener::preflight;
use stream_listener::redact::{redact_url, RedisUrl};
use stream_listener::reply::{xinfo_groups, GroupInfo};
use stream_listener::store::{GroupKeys, GroupStore};
use stream_listener::tls::TlsFiles;

use crate::error::CliError;

/// A connection to the Redis the group lives in.
#[derive(Clone)]
pub struct Ctx {
    /// The connection (cheap to clone).
    pub conn: Connection,
    /// Where it goes, for a command that needs connections of its own (`serve`: one per store handle,
    /// since a store waits in Redis with `BLPOP`, which would block a shared connection).
    pub target: RedisTarget,
}

impl std::fmt::Debug for Ctx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ctx").finish_non_exhaustive()
    }
}

impl Ctx {
    /// Connects, failing fast when Redis is unreachable. A `rediss://` URL uses TLS, trusting `tls.ca_cert`
    /// (else the system's roots) and presenting `tls.cert`/`tls.key` when given (the library's
    /// [`TlsFiles`], so the files are checked as the runtime checks them). A `redis+cluster://h:p,h:p`
    /// URL connects to a Redis Cluster, `rediss+cluster://` over TLS, with the same files. Checked first
    /// as the runtime checks Redis at start ([`preflight::check`]): a wrong password, an ACL user without
    /// a command, a database index out of range, a refused certificate or a server too old is named as
    /// such. A URL that does not parse is named with `origin` (`--redis-url`, `REDIS_URL`).
    pub async fn connect(
        url: &str,
        origin: &'static str,
        tls: &TlsFiles,
    ) -> Result<Self, CliError> {
        // The URL may carry a password: only its redacted form goes into the error.
        let connect_error = |source| CliError::Connect {
            url: redact_url(url),
            source,
        };
        let mut target = RedisTarget::open_from(url, origin)?;
        if !tls.is_empty() {
            target = target.with_tls(tls.load()?).map_err(connect_error)?;
        }
        match preflight::check(&target, &RedisUrl::new(url)).await {
            Ok(_) => {}
            Err(preflight::Failure::Permanent(refused)) => return Err(refused.into()),
            Err(preflight::Failure::Transient(error)) => return Err(connect_error(error)),
        }
        let options = ConnectOptions {
            connection_timeout: Some(Duration::from_secs(3)),
            response_timeout: Some(Duration::from_secs(10)),
            retries: Some(1),
            ..Default::default()
        };
        let conn = target.connect(options).await.map_err(connect_error)?;
        Ok(Self { conn, target })
    }

    /// Redis time in milliseconds: the clock leases are measured with.
    pub async fn now_ms(&mut self) -> Result<i64, CliError> {
        let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut self.conn).await?;
        Ok(secs * 1000 + micros / 1000)
    }

    /// A store handle on an existing group; [`CliError::UnknownGroup`] if it has no metadata (the store
    /// would otherwise create the group on its first write).
    pub async fn existing_group(
        &mut self,
        stream: &str,
        group: &str,
    ) -> Result<GroupStore, CliError> {
        // Validates the names before they become keys.
        let store = GroupStore::open(self.conn.clone(), stream, group)?;
        let key = GroupKeys::new(stream, group).meta;
        let exists: bool = redis::cmd("EXISTS")
            .arg(&key)
            .query_async(&mut self.conn)
            .await?;
        if !exists {
            return Err(CliError::UnknownGroup {
                stream: stream.to_string(),
                group: group.to_string(),
                key,
            });
        }
        Ok(store)
    }

    /// Whether `key` exists.
    pub async fn exists(&mut self, key: &str) -> Result<bool, CliError> {
        Ok(redis::cmd("EXISTS")
            .arg(key)
            .query_async(&mut self.conn)
            .await?)
    }

    /// `XINFO GROUPS key`, one row per consumer group (empty if the stream does not exist).
    pub async fn consumer_groups(&mut self, key: &str) -> Result<Vec<GroupInfo>, CliError> {
        if !self.exists(key).await? {
            return Ok(Vec::new());
        }
        let groups: Value = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(key)
            .query_async(&mut self.conn)
            .await?;
        Ok(xinfo_groups(&groups)?)
    }

    /// `entries-added` of `XINFO STREAM key` (Redis >= 7; `None` before).
    pub async fn entries_added(&mut self, key: &str) -> Result<Option<u64>, CliError> {
        let info: HashMap<String, Value> = redis::cmd("XINFO")
            .arg("STREAM")
            .arg(key)
            .query_async(&mut self.conn)
            .await?;
        Ok(info
            .get("entries-added")
            .and_then(value_text)
            .and_then(|v| v.parse().ok()))
    }

    /// `XLEN key`.
    pub async fn stream_len(&mut self, key: &str) -> Result<u64, CliError> {
        Ok(redis::cmd("XLEN")
            .arg(key)
            .query_async(&mut self.conn)
            .await?)
    }
}

/// A scalar reply as text; `None` for nil and aggregates.
pub fn value_text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        Value::Double(d) => Some(d.to_string()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        Value::BigNumber(n) => Some(String::from_utf8_lossy(n).into_owned()),
        _ => None,
    }
}
