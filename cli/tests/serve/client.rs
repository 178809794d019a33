//! An HTTP member that behaves as the origin's documented clients do (read from
//! `clients/python/redisstream/consumer.py` and the Spring starter's `CoordinatorManagedConsumer.kt`):
//! * it dies on any non-200, a refused connection, a timeout or a missing key in the body;
//! * it adopts every returned `memberEpoch` except on `UNKNOWN_MEMBER_ID` / `FENCED_MEMBER_EPOCH` (then
//!   0, with its shards dropped) and `RETRY` (nothing changes);
//! * it reads only while its last status is `OK`, only new entries (`XREADGROUP ... >`), all its shards
//!   in one multi-key read; it never claims pending entries and never reads through a fence;
//! * it reports `ownedShards` = what it reads, never `revokingShards` (Python), or leaves the Spring way:
//!   `memberEpoch` -1 with every shard in both `ownedShards` and `revokingShards` (REVOKED);
//! * it heartbeats at the server's interval (Python) or at a fixed one (Spring's fixed 3 s, scaled down).
//!
//! Each handled entry is recorded in the shared [`Log`] (key, seq, who, when), then acknowledged.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use stream_listener_tests::Order;

use crate::log::Log;

/// How the member stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// SIGKILL-like: stops at once, acknowledging nothing more, sending nothing.
    Kill,
    /// Spring's graceful leave, then stop.
    SpringLeave,
    /// Our graceful leave: `memberEpoch` -1, nothing owned, every shard REVOKED.
    Leave,
}

/// What the member thread shares with the test.
#[derive(Debug, Default)]
pub struct Shared {
    /// The shards it reads now.
    pub assigned: Mutex<BTreeSet<u32>>,
    /// The last response's `pendingShards`.
    pub pending: Mutex<BTreeSet<u32>>,
    /// The last status.
    pub status: Mutex<String>,
    /// When it first read each shard (after the test started it).
    pub first_read: Mutex<std::collections::BTreeMap<u32, Instant>>,
    /// Why it died, if it did.
    pub died: Mutex<Option<String>>,
    /// Heartbeats answered.
    pub heartbeats: std::sync::atomic::AtomicU64,
    /// Heartbeats that failed (a Spring member goes on).
    pub failed: std::sync::atomic::AtomicU64,
    /// When the last heartbeat was sent: its lease ends no earlier than a session after.
    pub last_sent: Mutex<Option<Instant>>,
    /// Set by the test to freeze it (SIGSTOP-like: no heartbeat, no read, nothing acknowledged).
    pub frozen: AtomicBool,
    /// Set by the test: leave (or die) now.
    stop: Mutex<Option<Stop>>,
    /// Set by the test: read entries but do not acknowledge them (a handler that never finishes).
    pub hold_acks: AtomicBool,
    /// Set by the test: freeze right after the next read that returns entries, before handling them (a
    /// SIGSTOP with a read in flight); the test ends the freeze. How many entries that read returned.
    pub freeze_after_read: AtomicBool,
    pub in_flight: std::sync::atomic::AtomicUsize,
}

/// A running HTTP member.
#[derive(Debug)]
pub struct HttpMember {
    /// What it shares.
    pub shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// How it heartbeats.
#[derive(Debug, Clone, Copy)]
pub enum Interval {
    /// The server's `heartbeatIntervalMs`, and it dies on any failure (Python).
    Server,
    /// A fixed interval whatever the server says, and a failed heartbeat is only counted: it keeps its
    /// assignment and goes on reading (Spring's `runCatching` around each heartbeat).
    Fixed(Duration),
}

impl HttpMember {
    /// Starts member `id` of `group` on `stream` against the server at `base` (`http://host:port`).
    pub fn start(
        base: &str,
        redis_url: &str,
        stream: &str,
        group: &str,
        id: &str,
        interval: Interval,
        log: Log,
    ) -> Self {
        let shared = Arc::new(Shared::default());
        let mut state = State {
            base: base.to_string(),
            stream: stream.to_string(),
            group: group.to_string(),
            id: id.to_string(),
            epoch: 0,
            metadata_version: 0,
            agent: ureq::Agent::config_builder()
                .timeout_global(Some(Duration::from_secs(5)))
                .http_status_as_error(false)
                .build()
                .into(),
            redis: DataConnection::open(redis_url),
            shared: shared.clone(),
            log,
            seq: 0,
        };
        let thread = std::thread::Builder::new()
            .name(format!("http-member-{id}"))
            .spawn(move || {
                if let Err(why) = state.run(interval) {
                    *state.shared.died.lock().unwrap() = Some(why);
                }
            })
            .unwrap();
        Self {
            shared,
            thread: Some(thread),
        }
    }

    /// The shards it reads now.
    pub fn assigned(&self) -> BTreeSet<u32> {
        self.shared.assigned.lock().unwrap().clone()
    }

    /// The last response's `pendingShards`.
    pub fn pending(&self) -> BTreeSet<u32> {
        self.shared.pending.lock().unwrap().clone()
    }

    /// Why it died, if it did.
    pub fn died(&self) -> Option<String> {
        self.shared.died.lock().unwrap().clone()
    }

    /// Stops it as `how` and waits for its thread; why it died, if it did (a refused leave, say).
    pub fn stop(mut self, how: Stop) -> Option<String> {
        *self.shared.stop.lock().unwrap() = Some(how);
        self.shared.frozen.store(false, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap();
        }
        self.died()
    }
}

impl Drop for HttpMember {
    fn drop(&mut self) {
        *self.shared.stop.lock().unwrap() = Some(Stop::Kill);
        self.shared.frozen.store(false, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

struct State {
    base: String,
    stream: String,
    group: String,
    id: String,
    epoch: i64,
    metadata_version: i64,
    agent: ureq::Agent,
    redis: DataConnection,
    shared: Arc<Shared>,
    log: Log,
    seq: u64,
}

impl State {
    fn run(&mut self, interval: Interval) -> Result<(), String> {
        let mut next_heartbeat = Instant::now();
        loop {
            let stop = *self.shared.stop.lock().unwrap();
            match stop {
                Some(Stop::Kill) => return Ok(()),
                Some(Stop::SpringLeave) => return self.leave(true),
                Some(Stop::Leave) => return self.leave(false),
                None => {}
            }
            if self.shared.frozen.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            let now = Instant::now();
            if now >= next_heartbeat {
                next_heartbeat = now
                    + match (interval, self.heartbeat()) {
                        (Interval::Server, answered) => answered?,
                        (Interval::Fixed(fixed), Ok(_)) => fixed,
                        (Interval::Fixed(fixed), Err(_)) => {
                            self.shared.failed.fetch_add(1, Ordering::SeqCst);
                            fixed
                        }
                    };
            }
            if !self.poll()? {
                // The Python client's idle pause (min(0.05, interval)).
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    fn url(&self) -> String {
        format!(
            "{}/coord/v1/streams/{}/groups/{}/members/{}/heartbeat",
            self.base, self.stream, self.group, self.id
        )
    }

    fn post(&mut self, body: &Value) -> Result<Value, String> {
        self.seq += 1;
        *self.shared.last_sent.lock().unwrap() = Some(Instant::now());
        let mut response = self
            .agent
            .post(&self.url())
            .send_json(body)
            .map_err(|e| format!("heartbeat failed: {e}"))?;
        let status = response.status().as_u16();
        let text = response
            .body_mut()
            .read_to_string()
            .map_err(|e| format!("heartbeat body: {e}"))?;
        if status >= 400 {
            return Err(format!("heartbeat answered {status}: {text}"));
        }
        let value: Value =
            serde_json::from_str(&text).map_err(|e| format!("not JSON: {e}: {text}"))?;
        // The Python client's HeartbeatResponse.from_json: these keys must be there.
        for key in [
            "status",
            "memberId",
            "memberEpoch",
            "heartbeatIntervalMs",
            "groupEpoch",
            "assignmentEpoch",
            "metadataVersion",
        ] {
            if value.get(key).is_none() {
                return Err(format!("response lacks {key}: {text}"));
            }
        }
        self.shared.heartbeats.fetch_add(1, Ordering::SeqCst);
        Ok(value)
    }

    fn shard_list(set: &BTreeSet<u32>) -> Vec<Value> {
        set.iter().map(|s| json!({ "shardIndex": s })).collect()
    }

    /// One heartbeat, applied as `ManagedConsumer.apply_heartbeat_response` does; returns the server's
    /// interval.
    fn heartbeat(&mut self) -> Result<Duration, String> {
        let owned = self.shared.assigned.lock().unwrap().clone();
        let body = json!({
            "protocolVersion": 1,
            "requestId": format!("{}-{}", self.id, self.seq),
            "memberId": self.id,
            "memberName": self.id,
            "memberEpoch": self.epoch,
            "metadataVersion": self.metadata_version,
            "runtimeConsumerCapacity": {"runtimeMaxConcurrency": 1, "availableConcurrency": 1},
            "ownedShards": Self::shard_list(&owned),
            "revokingShards": [],
            "shardProgress": [],
        });
        let r = self.post(&body)?;
        let status = r["status"].as_str().unwrap_or_default().to_string();
        let shards = |key: &str| -> BTreeSet<u32> {
            r["assignment"][key]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| s["shardIndex"].as_u64())
                .map(|s| s as u32)
                .collect()
        };
        let interval = Duration::from_millis(r["heartbeatIntervalMs"].as_u64().unwrap_or(3000));
        *self.shared.status.lock().unwrap() = status.clone();
        match status.as_str() {
            "UNKNOWN_MEMBER_ID" | "FENCED_MEMBER_EPOCH" => {
                self.epoch = 0;
                self.metadata_version = r["metadataVersion"].as_i64().unwrap_or(0);
                self.shared.assigned.lock().unwrap().clear();
                self.shared.pending.lock().unwrap().clear();
            }
            "RETRY" => {}
            _ => {
                self.epoch = r["memberEpoch"].as_i64().unwrap_or(0);
                self.metadata_version = r["metadataVersion"].as_i64().unwrap_or(0);
                let assigned = shards("assignedShards");
                if status == "OK" {
                    *self.shared.assigned.lock().unwrap() = assigned;
                } else if status == "SYNC_METADATA" || status == "REVOKE_PENDING" {
                    self.shared
                        .assigned
                        .lock()
                        .unwrap()
                        .retain(|s| assigned.contains(s));
                }
                *self.shared.pending.lock().unwrap() = shards("pendingShards");
            }
        }
        Ok(interval)
    }

    /// A graceful leave: epoch -1, every shard REVOKED; listed in `ownedShards` too if `spring` (its
    /// `leaveOnce`), else nothing owned (ours).
    fn leave(&mut self, spring: bool) -> Result<(), String> {
        let owned = self.shared.assigned.lock().unwrap().clone();
        if self.epoch == 0 && owned.is_empty() {
            return Ok(());
        }
        let revoking: Vec<Value> = owned
            .iter()
            .map(|s| json!({"shard": {"shardIndex": s}, "state": "REVOKED", "inFlight": 0, "ackedAt": "2026-01-01T00:00:00Z"}))
            .collect();
        let body = json!({
            "protocolVersion": 1,
            "requestId": format!("{}-leave-{}", self.id, self.seq),
            "memberId": self.id,
            "memberName": self.id,
            "memberEpoch": -1,
            "metadataVersion": self.metadata_version,
            "runtimeConsumerCapacity": {"runtimeMaxConcurrency": 1, "availableConcurrency": 1},
            "ownedShards": if spring { Self::shard_list(&owned) } else { vec![] },
            "revokingShards": revoking,
        });
        let r = self.post(&body)?;
        if r["status"] != "OK" {
            return Err(format!("leave answered {r}"));
        }
        self.shared.assigned.lock().unwrap().clear();
        Ok(())
    }

    /// One read of every assigned shard (only while the last status is OK), each entry handled and
    /// acknowledged; whether anything was read.
    fn poll(&mut self) -> Result<bool, String> {
        if self.shared.status.lock().unwrap().as_str() != "OK" {
            return Ok(false);
        }
        let shards = self.shared.assigned.lock().unwrap().clone();
        if shards.is_empty() {
            return Ok(false);
        }
        let keys: Vec<String> = shards
            .iter()
            .map(|s| format!("{}:{s}", self.stream))
            .collect();
        let mut replies = Vec::new();
        match &mut self.redis {
            // The Python client's one read of every assigned shard.
            DataConnection::Node(conn) => {
                replies.push(read_group(&self.group, &self.id, &keys, Some(50)).query(conn));
            }
            // The shards' streams hash to different slots: a read each (Spring's one container per
            // shard), without blocking so that one idle shard does not hold up the others.
            DataConnection::Cluster(conn) => {
                for key in &keys {
                    replies.push(
                        read_group(&self.group, &self.id, std::slice::from_ref(key), None)
                            .query(conn),
                    );
                }
            }
        }
        let mut entries = Vec::new();
        for reply in replies {
            let reply: redis::Value = reply.map_err(|e| format!("XREADGROUP: {e}"))?;
            entries.extend(parse_read(reply));
        }
        let mut any = false;
        let read: usize = entries.iter().map(|(_, list)| list.len()).sum();
        if read > 0 && self.shared.freeze_after_read.swap(false, Ordering::SeqCst) {
            self.shared.in_flight.store(read, Ordering::SeqCst);
            self.shared.frozen.store(true, Ordering::SeqCst);
            while self.shared.frozen.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        for (key, entry_list) in entries {
            let shard: u32 = key.rsplit(':').next().unwrap().parse().unwrap();
            self.shared
                .first_read
                .lock()
                .unwrap()
                .entry(shard)
                .or_insert_with(Instant::now);
            for (id, fields) in entry_list {
                any = true;
                if self.shared.hold_acks.load(Ordering::SeqCst)
                    || *self.shared.stop.lock().unwrap() == Some(Stop::Kill)
                {
                    continue;
                }
                let order: Order = serde_json::from_slice(&fields).map_err(|e| e.to_string())?;
                self.log.push(&order, &self.id);
                let mut xack = redis::cmd("XACK");
                xack.arg(&key).arg(&self.group).arg(&id);
                let _: i64 = self.redis.query(&xack).map_err(|e| format!("XACK: {e}"))?;
            }
        }
        Ok(any)
    }
}

/// Where an HTTP member reads and acknowledges: one node, a Redis Cluster (a
/// `redis+cluster://h:p,h:p` URL, as the library takes it) through redis-rs's cluster client, or the
/// master a sentinel of `redis+sentinel://h:p,h:p/<name>` names when it opens (as redis-py's
/// `Sentinel.master_for` finds it; a member opened after a failover reads from the new master).
enum DataConnection {
    Node(redis::Connection),
    Cluster(Box<redis::cluster::ClusterConnection>),
}

impl DataConnection {
    fn open(url: &str) -> Self {
        match url.strip_prefix("redis+cluster://") {
            Some(hosts) => {
                let seeds: Vec<String> = hosts.split(',').map(|h| format!("redis://{h}")).collect();
                let client = redis::cluster::ClusterClient::new(seeds).unwrap();
                Self::Cluster(Box::new(client.get_connection().unwrap()))
            }
            None => match url.strip_prefix("redis+sentinel://") {
                Some(rest) => {
                    let (hosts, name) = rest.split_once('/').expect("redis+sentinel://hosts/name");
                    let name = name.split('/').next().unwrap();
                    let master = hosts
                        .split(',')
                        .find_map(|h| {
                            let mut sentinel = redis::Client::open(format!("redis://{h}"))
                                .ok()?
                                .get_connection()
                                .ok()?;
                            let (host, port): (String, u16) = redis::cmd("SENTINEL")
                                .arg("GET-MASTER-ADDR-BY-NAME")
                                .arg(name)
                                .query(&mut sentinel)
                                .ok()?;
                            Some(format!("redis://{host}:{port}"))
                        })
                        .expect("a sentinel names the master");
                    Self::Node(
                        redis::Client::open(master)
                            .unwrap()
                            .get_connection()
                            .unwrap(),
                    )
                }
                None => Self::Node(redis::Client::open(url).unwrap().get_connection().unwrap()),
            },
        }
    }

    fn query<T: redis::FromRedisValue>(&mut self, cmd: &redis::Cmd) -> redis::RedisResult<T> {
        match self {
            Self::Node(conn) => cmd.query(conn),
            Self::Cluster(conn) => cmd.query(conn),
        }
    }
}

/// `XREADGROUP GROUP group id COUNT 10 [BLOCK ms] STREAMS keys.. >..`.
fn read_group(group: &str, id: &str, keys: &[String], block_ms: Option<u64>) -> redis::Cmd {
    let mut cmd = redis::cmd("XREADGROUP");
    cmd.arg("GROUP").arg(group).arg(id).arg("COUNT").arg(10);
    if let Some(ms) = block_ms {
        cmd.arg("BLOCK").arg(ms);
    }
    cmd.arg("STREAMS").arg(keys);
    for _ in keys {
        cmd.arg(">");
    }
    cmd
}

/// One stream's entries in a read: `(entry id, payload)`.
type Entries = Vec<(String, Vec<u8>)>;

/// `(stream key, [(entry id, payload)])` of an `XREADGROUP` reply (RESP2: `[[key, [[id, [f, v, ..]], ..]], ..]`),
/// the payload being the producer's `p` field.
fn parse_read(reply: redis::Value) -> Vec<(String, Entries)> {
    use redis::Value;
    let text = |v: &Value| match v {
        Value::BulkString(b) => Some(b.clone()),
        Value::SimpleString(s) => Some(s.clone().into_bytes()),
        _ => None,
    };
    let Value::Array(streams) = reply else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for stream in streams {
        let Value::Array(parts) = stream else {
            continue;
        };
        let (Some(key), Some(Value::Array(entries))) = (parts.first().and_then(text), parts.get(1))
        else {
            continue;
        };
        let mut list = Vec::new();
        for entry in entries {
            let Value::Array(pair) = entry else { continue };
            let (Some(id), Some(Value::Array(fields))) = (pair.first().and_then(text), pair.get(1))
            else {
                continue;
            };
            let payload = fields
                .chunks(2)
                .find(|f| f.first().and_then(text).as_deref() == Some(b"p"))
                .and_then(|f| f.get(1).and_then(text))
                .unwrap_or_default();
            list.push((String::from_utf8(id).unwrap(), payload));
        }
        out.push((String::from_utf8(key).unwrap(), list));
    }
    out
}
