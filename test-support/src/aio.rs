//! Async helpers for tests and benchmarks against a [`RedisServer`](crate::RedisServer) (feature `aio`):
//! redis-rs connections, waits on a condition with a deadline (never a bare sleep), and the replies of the
//! stream and `INFO` commands that tests read back.
//!
//! Everything here is at the level of tokio and redis-rs; helpers that need the library's types live with
//! the integration tests (`stream-listener-tests`), so this crate never depends on the library it tests.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::FromRedisValue;
use tokio::time::Instant;

/// How often [`wait_until`] and [`wait_until_async`] check their condition.
pub const POLL: Duration = Duration::from_millis(10);

/// A [`ConnectionManager`] (reconnects after a server restart) with redis-rs's default settings.
///
/// # Panics
/// If the URL is invalid or the server does not answer.
pub async fn connect(url: &str) -> ConnectionManager {
    let client = redis::Client::open(url).unwrap_or_else(|e| panic!("bad Redis URL {url}: {e}"));
    ConnectionManager::new(client)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"))
}

/// A [`ConnectionManager`] whose connect and response timeouts are `timeout`, with `retries` reconnect
/// attempts per command (redis-rs's default when `None`): for tests that stop the server and must not hang.
///
/// # Panics
/// If the URL is invalid or the server does not answer.
pub async fn connect_with_timeouts(
    url: &str,
    timeout: Duration,
    retries: Option<usize>,
) -> ConnectionManager {
    let client = redis::Client::open(url).unwrap_or_else(|e| panic!("bad Redis URL {url}: {e}"));
    let mut config = ConnectionManagerConfig::new()
        .set_response_timeout(Some(timeout))
        .set_connection_timeout(Some(timeout));
    if let Some(retries) = retries {
        config = config.set_number_of_retries(retries);
    }
    ConnectionManager::new_with_config(client, config)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"))
}

/// A [`MultiplexedConnection`]: one socket, no reconnects (a killed server stays visible as errors).
///
/// # Panics
/// If the URL is invalid or the server does not answer.
pub async fn connect_multiplexed(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .unwrap_or_else(|e| panic!("bad Redis URL {url}: {e}"))
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"))
}

/// Polls `done` every [`POLL`] until it holds.
///
/// # Panics
/// After `timeout`, naming `what` and the timeout.
pub async fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    wait_until_async(what, timeout, || std::future::ready(done())).await;
}

/// Like [`wait_until`], with a condition that is itself async (it may query Redis).
///
/// # Panics
/// After `timeout`, naming `what` and the timeout.
pub async fn wait_until_async<F, Fut>(what: &str, timeout: Duration, done: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    if !poll_until(timeout, POLL, done).await {
        panic!("timed out after {timeout:?} waiting for {what}");
    }
}

/// Checks `done` every `every` until it holds (`true`) or `timeout` has passed (`false`); for callers that
/// report a timeout themselves. The condition is checked once more at the deadline.
pub async fn poll_until<F, Fut>(timeout: Duration, every: Duration, mut done: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if done().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(every).await;
    }
}

/// `XLEN key`.
///
/// # Panics
/// If the command fails.
pub async fn xlen(conn: &mut impl ConnectionLike, key: &str) -> u64 {
    redis::cmd("XLEN")
        .arg(key)
        .query_async(conn)
        .await
        .unwrap_or_else(|e| panic!("XLEN {key}: {e}"))
}

/// Every entry of a stream (`XRANGE key - +`) as `(id, fields)`; `F` is the field map's type, e.g.
/// `HashMap<String, String>`, `BTreeMap<String, Vec<u8>>` or `Vec<(String, String)>` (in stream order).
///
/// # Panics
/// If the command fails or a field map does not convert to `F`.
pub async fn xrange<F: FromRedisValue>(
    conn: &mut impl ConnectionLike,
    key: &str,
) -> Vec<(String, F)> {
    redis::cmd("XRANGE")
        .arg(key)
        .arg("-")
        .arg("+")
        .query_async(conn)
        .await
        .unwrap_or_else(|e| panic!("XRANGE {key} - +: {e}"))
}

/// The entries of a raw `XREADGROUP` / `XREAD` reply (`Value`, all streams in turn) as `(id, fields)`,
/// `fields` being the flat `[name, value, ...]` array, moved out of the reply (nothing is copied): for
/// hand-written baselines that parse replies themselves. A nil reply (nothing to read) has no entries.
pub fn read_reply_entries(reply: redis::Value) -> Vec<(Vec<u8>, Vec<redis::Value>)> {
    use redis::Value;
    let Value::Array(streams) = reply else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for stream in streams {
        let Value::Array(mut parts) = stream else {
            continue;
        };
        let Some(Value::Array(entries)) = parts.pop() else {
            continue;
        };
        out.extend(entries.into_iter().filter_map(|entry| {
            let Value::Array(mut pair) = entry else {
                return None;
            };
            let fields = match pair.pop()? {
                Value::Array(fields) => fields,
                _ => Vec::new(),
            };
            let Value::BulkString(id) = pair.pop()? else {
                return None;
            };
            Some((id, fields))
        }));
    }
    out
}

/// `XREADGROUP GROUP group consumer COUNT count STREAMS key >` without `BLOCK`, as
/// [`read_reply_entries`]: the entries never delivered to the group, at most `count`, none if there are none.
///
/// # Panics
/// If the command fails (no such group).
pub async fn xreadgroup(
    conn: &mut impl ConnectionLike,
    group: &str,
    consumer: &str,
    count: usize,
    key: &str,
) -> Vec<(Vec<u8>, Vec<redis::Value>)> {
    let reply: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(group)
        .arg(consumer)
        .arg("COUNT")
        .arg(count)
        .arg("STREAMS")
        .arg(key)
        .arg(">")
        .query_async(conn)
        .await
        .unwrap_or_else(|e| panic!("XREADGROUP {group} {key}: {e}"));
    read_reply_entries(reply)
}

/// `XACK key group id...`; returns how many were acknowledged.
///
/// # Panics
/// If the command fails.
pub async fn xack<I: redis::ToRedisArgs>(
    conn: &mut impl ConnectionLike,
    key: &str,
    group: &str,
    ids: I,
) -> i64 {
    redis::cmd("XACK")
        .arg(key)
        .arg(group)
        .arg(ids)
        .query_async(conn)
        .await
        .unwrap_or_else(|e| panic!("XACK {key} {group}: {e}"))
}

/// How many entries `group` has pending on `key` (the count of the `XPENDING key group` summary).
///
/// # Panics
/// If the command fails (no such key or group).
pub async fn xpending_count(conn: &mut impl ConnectionLike, key: &str, group: &str) -> i64 {
    let summary: (i64, redis::Value, redis::Value, redis::Value) = redis::cmd("XPENDING")
        .arg(key)
        .arg(group)
        .query_async(conn)
        .await
        .unwrap_or_else(|e| panic!("XPENDING {key} {group}: {e}"));
    summary.0
}

/// `INFO section` as text.
///
/// # Panics
/// If the command fails.
pub async fn info(conn: &mut impl ConnectionLike, section: &str) -> String {
    redis::cmd("INFO")
        .arg(section)
        .query_async(conn)
        .await
        .unwrap_or_else(|e| panic!("INFO {section}: {e}"))
}

/// The value of `field` in an `INFO` text (`field:value` lines), parsed; `None` if absent or unparsable.
pub fn info_field<T: std::str::FromStr>(info: &str, field: &str) -> Option<T> {
    info.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|value| value.trim().parse().ok())
}

/// Calls per command since the server started (or `CONFIG RESETSTAT`), from `INFO commandstats`: lower-case
/// command name (`xreadgroup`, `evalsha`, `client|list`) -> `calls`.
///
/// # Panics
/// If the command fails.
pub async fn command_calls(conn: &mut impl ConnectionLike) -> BTreeMap<String, u64> {
    parse_command_calls(&info(conn, "commandstats").await)
}

/// [`command_calls`] of an `INFO commandstats` text.
pub fn parse_command_calls(info: &str) -> BTreeMap<String, u64> {
    info.lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = stats.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
            Some((name.to_string(), calls.trim().parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::RedisServer;

    #[test]
    fn parses_info_fields_and_command_calls() {
        let text = "# Clients\r\nconnected_clients:3\r\nblocked_clients:1\r\n\
                    cmdstat_xreadgroup:calls=12,usec=40,usec_per_call=3.33\r\n\
                    cmdstat_client|list:calls=2,usec=1\r\n";
        assert_eq!(info_field::<u64>(text, "blocked_clients"), Some(1));
        assert_eq!(info_field::<u64>(text, "connected_clients"), Some(3));
        assert_eq!(info_field::<u64>(text, "blocked"), None);
        let calls = parse_command_calls(text);
        assert_eq!(calls.get("xreadgroup"), Some(&12));
        assert_eq!(calls.get("client|list"), Some(&2));
        assert_eq!(calls.len(), 2);
    }

    #[tokio::test]
    async fn streams_and_waits_against_a_real_server() {
        let server = RedisServer::start();
        let mut conn = connect(&server.url()).await;
        let mut multiplexed = connect_multiplexed(&server.url()).await;
        for n in 0..3 {
            let _: String = redis::cmd("XADD")
                .arg("s")
                .arg("*")
                .arg("n")
                .arg(n)
                .query_async(&mut conn)
                .await
                .unwrap();
        }
        assert_eq!(xlen(&mut multiplexed, "s").await, 3);
        let entries: Vec<(String, HashMap<String, String>)> = xrange(&mut conn, "s").await;
        let ns: Vec<&str> = entries.iter().map(|(_, f)| f["n"].as_str()).collect();
        assert_eq!(ns, ["0", "1", "2"]);

        let _: () = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg("s")
            .arg("g")
            .arg("0")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(xpending_count(&mut conn, "s", "g").await, 0);
        let reply: redis::Value = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg("g")
            .arg("c")
            .arg("COUNT")
            .arg(2)
            .arg("STREAMS")
            .arg("s")
            .arg(">")
            .query_async(&mut conn)
            .await
            .unwrap();
        let read = read_reply_entries(reply);
        let ids: Vec<&[u8]> = read.iter().map(|(id, _)| id.as_slice()).collect();
        let expected: Vec<&[u8]> = entries
            .iter()
            .take(2)
            .map(|(id, _)| id.as_bytes())
            .collect();
        assert_eq!(ids, expected);
        assert_eq!(
            read[1].1,
            [
                redis::Value::BulkString(b"n".to_vec()),
                redis::Value::BulkString(b"1".to_vec())
            ]
        );
        assert_eq!(read_reply_entries(redis::Value::Nil), []);
        assert_eq!(xpending_count(&mut conn, "s", "g").await, 2);
        let rest = xreadgroup(&mut conn, "g", "c", 10, "s").await;
        assert_eq!(rest.len(), 1);
        assert_eq!(rest[0].0, entries[2].0.as_bytes());
        assert_eq!(xreadgroup(&mut conn, "g", "c", 10, "s").await, []);
        let acked = xack(
            &mut conn,
            "s",
            "g",
            vec![entries[0].0.clone(), entries[2].0.clone()],
        )
        .await;
        assert_eq!(acked, 2);
        assert_eq!(xpending_count(&mut conn, "s", "g").await, 1);
        assert_eq!(command_calls(&mut conn).await.get("xreadgroup"), Some(&3));

        let mut polls = 0;
        wait_until("three polls", Duration::from_secs(5), || {
            polls += 1;
            polls == 3
        })
        .await;
        assert_eq!(polls, 3);
        let timed_out = poll_until(Duration::from_millis(30), POLL, || async { false }).await;
        assert!(!timed_out);
    }

    #[tokio::test]
    async fn a_connection_with_timeouts_fails_instead_of_hanging_once_the_server_is_gone() {
        let mut server = RedisServer::start();
        let mut conn =
            connect_with_timeouts(&server.url(), Duration::from_millis(500), Some(1)).await;
        let pong: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
        assert_eq!(pong, "PONG");
        server.kill();
        let started = Instant::now();
        let after: redis::RedisResult<String> = redis::cmd("PING").query_async(&mut conn).await;
        assert!(after.is_err(), "{after:?}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    #[should_panic(expected = "timed out after 50ms waiting for the impossible")]
    async fn wait_until_names_what_it_waited_for() {
        wait_until("the impossible", Duration::from_millis(50), || false).await;
    }
}
