//! A group's backlog read from Redis by anyone, member or not: per shard its lag (entries not delivered
//! to the group yet), pending entries (delivered, not acknowledged), the age of its oldest
//! unacknowledged entry; for the group its live members and shard count. The lag exporter
//! ([`LagExporter`], the CLI's `exporter`) serves it to Prometheus and KEDA.
//!
//! **When Redis reports no lag.** `XINFO GROUPS` answers `lag` nil when it cannot tell: after an
//! `XDEL` of an entry after the group's last delivered id, after `XGROUP SETID` without `ENTRIESREAD`,
//! or on Redis 6.2, which has no `lag`. Then [`read_group`] counts the entries after the last delivered
//! id itself (`XRANGE (<last-delivered-id> + COUNT limit+1`, inside the read's script, so only the count
//! crosses the network): exact up to [`LagOptions::count_limit`] entries ([`LagSource::Counted`]);
//! above it the lag is reported as the limit, a lower bound ([`LagSource::AtLeast`]). `entries-added -
//! entries-read` is no substitute: Redis gives up on it precisely when entries were deleted after the
//! position (the difference would count them) or `entries-read` is unknown.
//!
//! **Cost.** One `HMGET` for the topology, then one pipeline of one `EVALSHA` per shard (its script
//! reads `XINFO STREAM`, `XINFO GROUPS`, `XPENDING` and the first undelivered entry on the shard's node)
//! plus one for the group's leases: `shards + 2` commands, two round trips (on a cluster the pipeline is
//! split per slot and sent to the masters at once). A node that does not have the script yet gets it
//! once by `EVAL`.

mod exporter;

pub use exporter::{GroupName, LagExporter, Scrape, ScrapedGroup};

use redis::Value;
use serde::Serialize;

use crate::connection::Connection;
use crate::routing::shard_stream_key;
use crate::topology::{Topology, TopologyError};

/// One read of a shard: KEYS the shard stream, ARGV group and count limit.
const READ_SCRIPT: &str = include_str!("read.lua");
/// A seek that keeps the lag known: KEYS the shard stream, ARGV group, position and count limit.
const SEEK_SCRIPT: &str = include_str!("seek.lua");
/// The group's live members at Redis time: KEYS its leases.
const LIVE_SCRIPT: &str = "local t = redis.call('TIME') \
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) \
    return redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')";

/// Whether a key exists, as a script so it rides the same pipeline: KEYS the key.
const EXISTS_SCRIPT: &str = "return redis.call('EXISTS', KEYS[1])";

/// How [`read_group`] and the exporter read.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LagOptions {
    /// The most entries counted on a shard whose lag Redis cannot tell (default 10,000); above it the
    /// lag is reported as this many, a lower bound.
    pub count_limit: u64,
    /// How long a scrape's answer is served again to later scrapes (default 1 s): concurrent scrapes
    /// share one read.
    pub cache_ttl: std::time::Duration,
    /// How often the exporter scans the keyspace for streams and groups (default 30 s).
    pub discovery_interval: std::time::Duration,
    /// About how many keys one discovery scans at most (default 100,000; of all masters together).
    pub scan_limit: usize,
}

impl Default for LagOptions {
    fn default() -> Self {
        Self {
            count_limit: 10_000,
            cache_ttl: std::time::Duration::from_secs(1),
            discovery_interval: std::time::Duration::from_secs(30),
            scan_limit: 100_000,
        }
    }
}

impl LagOptions {
    /// The default options with `count_limit`.
    pub fn with_count_limit(mut self, limit: u64) -> Self {
        self.count_limit = limit;
        self
    }

    /// The default options with `cache_ttl`.
    pub fn with_cache_ttl(mut self, ttl: std::time::Duration) -> Self {
        self.cache_ttl = ttl;
        self
    }

    /// The default options with `discovery_interval`.
    pub fn with_discovery_interval(mut self, interval: std::time::Duration) -> Self {
        self.discovery_interval = interval;
        self
    }

    /// The default options with `scan_limit`.
    pub fn with_scan_limit(mut self, limit: usize) -> Self {
        self.scan_limit = limit;
        self
    }
}

/// Where a shard's lag comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum LagSource {
    /// `XINFO GROUPS`'s `lag`.
    Redis,
    /// Redis reported none; the entries after the last delivered id were counted.
    Counted,
    /// Redis reported none and more than the count limit follow: the lag is at least the value.
    AtLeast,
    /// No shard stream or no consumer group on it: nothing to read (0).
    Absent,
}

/// One group on one shard stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShardLag {
    /// Shard index.
    pub shard: u32,
    /// The shard stream's key.
    pub stream_key: String,
    /// Whether the shard stream exists.
    pub exists: bool,
    /// Whether the group has a consumer group on it.
    pub has_group: bool,
    /// `XLEN`.
    pub length: u64,
    /// Entries not delivered to the group yet (see [`source`](Self::source)).
    pub lag: u64,
    /// Where `lag` comes from.
    pub source: LagSource,
    /// Entries delivered and not acknowledged (`XPENDING`).
    pub pending: u64,
    /// Age of the oldest entry the group has not acknowledged, pending or not delivered yet (by its id's
    /// time against the shard node's clock); `None` when there is none.
    pub oldest_unacked_age_ms: Option<u64>,
    /// The group's last delivered id.
    pub last_delivered_id: Option<String>,
    /// `entries-read` (Redis >= 7, when Redis knows it).
    pub entries_read: Option<u64>,
    /// `entries-added` (Redis >= 7).
    pub entries_added: Option<u64>,
}

/// One group of one stream, at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupLag {
    /// Logical stream.
    pub stream: String,
    /// Consumer group.
    pub group: String,
    /// The topology's shard count.
    pub shard_count: u32,
    /// Members whose lease is ahead of Redis time (0 with no consumers running).
    pub live_members: u64,
    /// Entries not delivered yet, over every shard (including a shrink's draining shards).
    pub lag: u64,
    /// Whether every shard's lag is exact (none is [`LagSource::AtLeast`]).
    pub lag_exact: bool,
    /// Entries delivered and not acknowledged, over every shard.
    pub pending: u64,
    /// `lag + pending`: what the group still has to handle.
    pub backlog: u64,
    /// The oldest unacknowledged entry's age over every shard.
    pub oldest_unacked_age_ms: Option<u64>,
    /// Per shard stream read.
    pub shards: Vec<ShardLag>,
}

/// Why a group could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LagError {
    /// The stream has no topology record.
    #[error("unknown stream `{stream}`: no topology record (Redis key `{key}`)")]
    UnknownStream {
        /// The stream.
        stream: String,
        /// The missing key.
        key: String,
    },
    /// Neither metadata nor a consumer group on any shard stream.
    #[error("unknown group `{group}` of stream `{stream}`: no metadata and no consumer group on its shard streams")]
    UnknownGroup {
        /// The stream.
        stream: String,
        /// The group.
        group: String,
    },
    /// The topology record is unreadable.
    #[error("stream `{stream}`: {source}")]
    Topology {
        /// The stream.
        stream: String,
        /// Why.
        #[source]
        source: TopologyError,
    },
    /// A name that cannot name keys.
    #[error("group `{group}` of `{stream}`: {reason}")]
    InvalidName {
        /// The stream.
        stream: String,
        /// The group.
        group: String,
        /// Why.
        reason: String,
    },
    /// A shard's read failed or answered something unexpected.
    #[error("shard stream `{key}`: {message}")]
    Shard {
        /// The shard stream.
        key: String,
        /// What Redis said.
        message: String,
    },
    /// Redis failed.
    #[error(transparent)]
    Redis(#[from] redis::RedisError),
}

/// Reads `group` of `stream`: the topology, then every shard the group reads and its leases in one
/// pipeline (see the module docs for the cost and the lag Redis cannot tell).
pub async fn read_group(
    conn: &mut Connection,
    stream: &str,
    group: &str,
    options: &LagOptions,
) -> Result<GroupLag, LagError> {
    let keys = crate::store::GroupKeys::new(stream, group);
    if let Err(e) = crate::store::GroupStore::open(conn.clone(), stream, group) {
        return Err(LagError::InvalidName {
            stream: stream.to_owned(),
            group: group.to_owned(),
            reason: e.to_string(),
        });
    }
    let topology = match Topology::load(conn, stream).await {
        Ok(topology) => topology,
        Err(TopologyError::Missing { key, .. }) => {
            return Err(LagError::UnknownStream {
                stream: stream.to_owned(),
                key,
            })
        }
        Err(source) => {
            return Err(LagError::Topology {
                stream: stream.to_owned(),
                source,
            })
        }
    };
    let shards: Vec<u32> = (0..topology.read_shard_count()).collect();
    let shard_keys: Vec<String> = shards
        .iter()
        .map(|&s| shard_stream_key(stream, s))
        .collect();
    let read = redis::Script::new(READ_SCRIPT);
    let live = redis::Script::new(LIVE_SCRIPT);
    let exists = redis::Script::new(EXISTS_SCRIPT);
    let invocations: Vec<Invocation<'_>> = shard_keys
        .iter()
        .map(|key| Invocation {
            script: &read,
            source: READ_SCRIPT,
            key,
            args: vec![group.to_owned(), options.count_limit.to_string()],
        })
        .chain([
            Invocation {
                script: &live,
                source: LIVE_SCRIPT,
                key: &keys.leases,
                args: vec![],
            },
            // The metadata header's existence tells a group nobody has joined from an unknown one.
            Invocation {
                script: &exists,
                source: EXISTS_SCRIPT,
                key: &keys.meta,
                args: vec![],
            },
        ])
        .collect();
    let mut replies = run_scripts(conn, &invocations).await?;
    let has_meta = matches!(replies.pop(), Some(Ok(Value::Int(1))));
    let live_members = match replies.pop() {
        Some(Ok(Value::Int(n))) => u64::try_from(n).unwrap_or(0),
        Some(Err(e)) => return Err(e.into()),
        _ => 0,
    };
    let mut rows = Vec::with_capacity(shards.len());
    for ((shard, key), reply) in shards.iter().zip(&shard_keys).zip(replies) {
        let reply = reply.map_err(|e| LagError::Shard {
            key: key.clone(),
            message: e.to_string(),
        })?;
        rows.push(
            shard_lag(*shard, key, &reply, options.count_limit).ok_or_else(|| LagError::Shard {
                key: key.clone(),
                message: format!("unexpected reply {reply:?}"),
            })?,
        );
    }
    if !has_meta && !rows.iter().any(|r| r.has_group) {
        return Err(LagError::UnknownGroup {
            stream: stream.to_owned(),
            group: group.to_owned(),
        });
    }
    let lag = rows.iter().map(|r| r.lag).sum();
    let pending = rows.iter().map(|r| r.pending).sum();
    Ok(GroupLag {
        stream: stream.to_owned(),
        group: group.to_owned(),
        shard_count: topology.shard_count(),
        live_members,
        lag,
        lag_exact: rows.iter().all(|r| r.source != LagSource::AtLeast),
        pending,
        backlog: lag + pending,
        oldest_unacked_age_ms: rows.iter().filter_map(|r| r.oldest_unacked_age_ms).max(),
        shards: rows,
    })
}

/// One script call of a pipeline: the script (and its source, for `EVAL`), one key, its arguments.
struct Invocation<'a> {
    script: &'a redis::Script,
    source: &'static str,
    key: &'a str,
    args: Vec<String>,
}

/// Runs every invocation in one pipeline by `EVALSHA`; the ones a node answers `NOSCRIPT` are sent
/// again by `EVAL` (which caches the script there). Per invocation its reply or error.
async fn run_scripts(
    conn: &mut Connection,
    invocations: &[Invocation<'_>],
) -> Result<Vec<redis::RedisResult<Value>>, redis::RedisError> {
    let build = |pipe: &mut redis::Pipeline, inv: &Invocation<'_>, by_hash: bool| {
        let cmd = if by_hash {
            pipe.cmd("EVALSHA").arg(inv.script.get_hash())
        } else {
            pipe.cmd("EVAL").arg(inv.source)
        };
        cmd.arg(1).arg(inv.key).arg(&inv.args);
    };
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for inv in invocations {
        build(&mut pipe, inv, true);
    }
    let mut replies: Vec<redis::RedisResult<Value>> = pipe.query_async(conn).await?;
    let missing: Vec<usize> = replies
        .iter()
        .enumerate()
        .filter(|(_, r)| matches!(r, Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)))
        .map(|(i, _)| i)
        .collect();
    if !missing.is_empty() {
        let mut again = redis::pipe();
        again.ignore_errors();
        for &i in &missing {
            build(&mut again, &invocations[i], false);
        }
        let answers: Vec<redis::RedisResult<Value>> = again.query_async(conn).await?;
        for (i, answer) in missing.into_iter().zip(answers) {
            replies[i] = answer;
        }
    }
    Ok(replies)
}

/// A shard's row from `read.lua`'s reply (run with `count_limit`); `None` for another shape.
fn shard_lag(shard: u32, key: &str, reply: &Value, count_limit: u64) -> Option<ShardLag> {
    let Value::Array(items) = reply else {
        return None;
    };
    if items.len() != 12 {
        return None;
    }
    let int = |i: usize| match &items[i] {
        Value::Int(n) => Some(*n),
        _ => None,
    };
    let count = |i: usize| int(i).and_then(|n| u64::try_from(n).ok());
    let id = |i: usize| match &items[i] {
        Value::BulkString(b) if !b.is_empty() => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) if !s.is_empty() => Some(s.clone()),
        _ => None,
    };
    let exists = int(0)? == 1;
    let has_group = int(1)? == 1;
    let now_ms = count(11)?;
    let redis_lag = count(5);
    let counted = count(10);
    let (lag, source) = match (has_group, redis_lag, counted) {
        (false, _, _) => (0, LagSource::Absent),
        (true, Some(lag), _) => (lag, LagSource::Redis),
        (true, None, Some(n)) => lag_from_count(n, count_limit),
        (true, None, None) => return None,
    };
    let oldest = [id(7), id(9)]
        .into_iter()
        .flatten()
        .filter_map(|id| id_ms(&id))
        .min();
    Some(ShardLag {
        shard,
        stream_key: key.to_owned(),
        exists,
        has_group,
        length: count(2).unwrap_or(0),
        lag,
        source,
        pending: count(6).unwrap_or(0),
        oldest_unacked_age_ms: oldest.map(|ms| now_ms.saturating_sub(ms)),
        last_delivered_id: id(8),
        entries_read: count(4),
        entries_added: count(3),
    })
}

/// The lag from a count of at most `limit + 1` entries after the last delivered id.
fn lag_from_count(counted: u64, limit: u64) -> (u64, LagSource) {
    if counted > limit {
        (limit, LagSource::AtLeast)
    } else {
        (counted, LagSource::Counted)
    }
}

/// The millisecond part of an entry id.
fn id_ms(id: &str) -> Option<u64> {
    id.split('-').next()?.parse().ok()
}

/// Moves `group`'s last delivered id on the shard stream `key` to `position` (an entry id, `0` or `$`)
/// with `XGROUP SETID … ENTRIESREAD n`, `n` = entries added minus the entries after the position, so
/// Redis keeps reporting the group's lag (Redis >= 7; one script call, atomic). Returns `n`; `None`
/// when the lag could not be kept: the server has no `entries-added` (before 7), or more than
/// `count_limit` entries follow the position (both move with a plain `SETID`).
pub async fn set_position(
    conn: &mut Connection,
    key: &str,
    group: &str,
    position: &str,
    count_limit: u64,
) -> Result<Option<u64>, redis::RedisError> {
    let read: i64 = redis::Script::new(SEEK_SCRIPT)
        .key(key)
        .arg(group)
        .arg(position)
        .arg(count_limit)
        .invoke_async(conn)
        .await?;
    Ok(u64::try_from(read).ok())
}

/// What a bounded `SCAN` of the library's namespace found ([`scan_namespace`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Namespace {
    /// Streams with a topology record or group metadata, each with the groups that have metadata.
    pub streams: std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
    /// Whether the scan stopped at its limit before the end of the keyspace.
    pub truncated: bool,
    /// About how many keys the scan visited (`SCAN` visits about `COUNT` keys per call, matching or not).
    pub scanned: usize,
}

/// Topology records (`sl:topology:{S}`) and group metadata (`sl:{S/G}:meta`) found by a `SCAN` of every
/// master, stopping after about `scan_limit` keys (shared by the masters).
pub async fn scan_namespace(
    conn: &mut Connection,
    scan_limit: usize,
) -> Result<Namespace, redis::RedisError> {
    const SCAN_COUNT: usize = 1000;
    let masters = conn.masters().await?;
    let nodes: Vec<Option<(&str, u16)>> = if masters.is_empty() {
        vec![None]
    } else {
        masters
            .iter()
            .map(|(h, p)| Some((h.as_str(), *p)))
            .collect()
    };
    let mut found = Namespace::default();
    'nodes: for node in nodes {
        let mut cursor: u64 = 0;
        loop {
            if found.scanned >= scan_limit {
                found.truncated = true;
                break 'nodes;
            }
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(cursor)
                .arg("MATCH")
                .arg(crate::names::NAMESPACE_PATTERN)
                .arg("COUNT")
                .arg(SCAN_COUNT);
            let (next, keys): (u64, Vec<String>) = conn.query_one_node(&cmd, node).await?;
            found.scanned += SCAN_COUNT;
            for key in keys {
                match crate::names::parse(&key) {
                    Some(crate::names::Parsed::Topology { stream }) => {
                        found.streams.entry(stream).or_default();
                    }
                    Some(crate::names::Parsed::GroupMeta { stream, group }) => {
                        found.streams.entry(stream).or_default().insert(group);
                    }
                    None => {}
                }
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
    }
    Ok(found)
}

/// Every `(stream, group)` this Redis holds: topology records and group metadata found by a bounded
/// `SCAN` of every master ([`scan_namespace`]), plus the consumer groups on each stream's shard 0 that no
/// member joined yet (the library's own groups left out). The bool: whether the scan stopped at
/// `scan_limit` keys.
pub async fn discover(
    conn: &mut Connection,
    scan_limit: usize,
) -> Result<(Vec<(String, String)>, bool), redis::RedisError> {
    let Namespace {
        streams, truncated, ..
    } = scan_namespace(conn, scan_limit).await?;
    let mut found = Vec::new();
    for (stream, mut groups) in streams {
        let key = shard_stream_key(&stream, 0);
        let mut cmd = redis::cmd("XINFO");
        cmd.arg("GROUPS").arg(&key);
        // A missing shard stream (or another type) has no consumer groups to add.
        if let Ok(reply) = cmd.query_async::<Value>(conn).await {
            if let Ok(infos) = crate::reply::xinfo_groups(&reply) {
                for info in infos {
                    if !crate::names::is_internal_group(&info.name) {
                        groups.insert(info.name);
                    }
                }
            }
        }
        found.extend(groups.into_iter().map(|g| (stream.clone(), g)));
    }
    Ok((found, truncated))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_count_above_the_limit_is_a_lower_bound() {
        assert_eq!(lag_from_count(0, 10), (0, LagSource::Counted));
        assert_eq!(lag_from_count(10, 10), (10, LagSource::Counted));
        assert_eq!(lag_from_count(11, 10), (10, LagSource::AtLeast));
    }

    #[test]
    fn ids_give_their_milliseconds() {
        assert_eq!(id_ms("1700000000000-3"), Some(1_700_000_000_000));
        assert_eq!(id_ms("17"), Some(17));
        assert_eq!(id_ms("x-1"), None);
    }
}
