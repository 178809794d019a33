//! A cluster write's parts, one pipeline per master. A batch of keyed messages touches many shards,
//! each of one slot; sent through the cluster connection, each shard's part is a request of its own (and
//! a hop through redis-rs's cluster task). Here the parts of one master go out as one pipeline, on a
//! connection of the producer's own to that master: each shard's part stays a `MULTI`/`EXEC` of its own
//! inside it (see the module docs of [`producer`](super)), so a part is written whole or not at all.
//!
//! The slot map is `CLUSTER SLOTS`, read once and again after any redirection. A part refused with
//! `MOVED` or `ASK` (its slot moved, or is migrating) was not written: it is sent again through the
//! cluster connection, which follows redirections, and the map is read again before the next write; so
//! are the parts of a master the producer cannot connect to (nothing was sent: a failover). A node's
//! pipeline that fails once sent (its connection broke, its reply did not come) is in doubt: the write
//! fails, as when the cluster connection fails a part, and the node's connection is made again.
//!
//! redis-rs's cluster pipelines cannot do this: on a `MOVED` or `ASK` in any reply it sends the whole
//! pipeline again, which would write the other shards' parts twice.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Cmd, RedisResult, Value};

use crate::connection::{parse_cluster_slots, NodeAddr, RedisTarget};

/// `(first slot, last slot, master)` ranges.
type SlotMap = Arc<Vec<(u16, u16, NodeAddr)>>;

/// One shard's part of a write: its slot and its XADDs.
pub(super) struct Part {
    pub(super) slot: u16,
    pub(super) commands: Vec<Cmd>,
}

impl Part {
    /// A part of more than one XADD is a transaction (see the module docs of [`producer`](super)).
    pub(super) fn transaction(&self) -> bool {
        self.commands.len() > 1
    }

    /// Replies a part answers with: its commands', and `MULTI`'s and `EXEC`'s around them.
    fn replies(&self) -> usize {
        self.commands.len() + if self.transaction() { 2 } else { 0 }
    }

    /// The part as a pipeline of its own, a transaction if it is one.
    pub(super) fn into_pipeline(self) -> redis::Pipeline {
        let transaction = self.transaction();
        let mut pipe = redis::Pipeline::with_capacity(self.commands.len());
        for cmd in self.commands {
            pipe.add_command(cmd);
        }
        if transaction {
            pipe.atomic();
        }
        pipe
    }
}

/// How a part fared.
pub(super) enum Answer {
    /// Its replies (a transaction's: `MULTI`, one per command, `EXEC`), or the error that failed it whole.
    Replies(RedisResult<Vec<Value>>),
    /// Refused with `MOVED` or `ASK`: nothing of it was written.
    Redirected,
}

/// The producer's connections to the cluster's masters and its slot map.
pub(super) struct Nodes {
    target: RedisTarget,
    config: AsyncConnectionConfig,
    slots: Mutex<Option<SlotMap>>,
    conns: Mutex<HashMap<NodeAddr, MultiplexedConnection>>,
}

impl std::fmt::Debug for Nodes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Nodes")
    }
}

impl Nodes {
    pub(super) fn new(target: RedisTarget, config: AsyncConnectionConfig) -> Self {
        Self {
            target,
            config,
            slots: Mutex::default(),
            conns: Mutex::default(),
        }
    }

    fn forget_slots(&self) {
        *self.slots.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    async fn slot_map(&self, cluster: &ClusterConnection) -> RedisResult<SlotMap> {
        if let Some(map) = self.slots.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            return Ok(map);
        }
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SLOTS");
        let mut conn = crate::connection::Connection::Cluster(cluster.clone());
        let value: Value = conn.query_one_node(&cmd, None).await?;
        let map = Arc::new(parse_cluster_slots(value)?);
        *self.slots.lock().unwrap_or_else(|p| p.into_inner()) = Some(map.clone());
        Ok(map)
    }

    async fn conn(&self, node: &NodeAddr) -> RedisResult<MultiplexedConnection> {
        if let Some(conn) = self
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(node)
        {
            return Ok(conn.clone());
        }
        let conn = self
            .target
            .node_connection(Some((&node.0, node.1)), &self.config)
            .await?;
        self.conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(node.clone(), conn.clone());
        Ok(conn)
    }

    fn forget_conn(&self, node: &NodeAddr) {
        self.conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(node);
    }

    /// Sends `parts`, one pipeline per master, and says how each fared, in order. Parts of slots the map
    /// does not place (or with no map) are [`Answer::Redirected`] too: the caller sends them through the
    /// cluster connection.
    pub(super) async fn send(&self, cluster: &ClusterConnection, parts: Vec<Part>) -> Vec<Answer> {
        let count = parts.len();
        let map = match self.slot_map(cluster).await {
            Ok(map) => map,
            Err(error) => {
                tracing::debug!(%error, "no slot map: the write goes shard by shard");
                return (0..count).map(|_| Answer::Redirected).collect();
            }
        };
        let mut by_node: HashMap<NodeAddr, Vec<(usize, Part)>> = HashMap::new();
        let mut answers: Vec<Option<Answer>> = (0..count).map(|_| None).collect();
        for (index, part) in parts.into_iter().enumerate() {
            let master = map
                .iter()
                .find(|(first, last, _)| (*first..=*last).contains(&part.slot))
                .map(|(_, _, master)| master.clone());
            match master {
                Some(master) => by_node.entry(master).or_default().push((index, part)),
                None => answers[index] = Some(Answer::Redirected),
            }
        }
        let sent = futures_util::future::join_all(
            by_node
                .into_iter()
                .map(|(node, parts)| self.send_to_node(node, parts)),
        )
        .await;
        for (index, answer) in sent.into_iter().flatten() {
            answers[index] = Some(answer);
        }
        answers
            .into_iter()
            .map(|answer| answer.unwrap_or(Answer::Redirected))
            .collect()
    }

    /// One master's parts as one pipeline, each part's commands between its `MULTI` and `EXEC`.
    async fn send_to_node(
        &self,
        node: NodeAddr,
        parts: Vec<(usize, Part)>,
    ) -> Vec<(usize, Answer)> {
        let mut pipe = redis::Pipeline::with_capacity(parts.iter().map(|(_, p)| p.replies()).sum());
        let mut layout = Vec::with_capacity(parts.len());
        for (index, part) in parts {
            let (transaction, replies) = (part.transaction(), part.replies());
            if transaction {
                pipe.cmd("MULTI");
            }
            for cmd in part.commands {
                pipe.add_command(cmd);
            }
            if transaction {
                pipe.cmd("EXEC");
            }
            layout.push((index, replies));
        }
        pipe.ignore_errors();
        let mut conn = match self.conn(&node).await {
            Ok(conn) => conn,
            Err(error) => {
                // Nothing was sent: through the cluster connection, which finds the slots' masters
                // again (a failover).
                tracing::debug!(%error, ?node, "cannot connect to a master: its parts go shard by shard");
                self.forget_slots();
                return layout
                    .into_iter()
                    .map(|(index, _)| (index, Answer::Redirected))
                    .collect();
            }
        };
        let reply: RedisResult<Vec<Value>> = pipe.query_async(&mut conn).await;
        let mut replies = match reply {
            Ok(replies) => replies.into_iter(),
            Err(error) => {
                // In doubt: any part may have been written. A fresh connection and map next time.
                self.forget_conn(&node);
                self.forget_slots();
                return layout
                    .into_iter()
                    .map(|(index, _)| (index, Answer::Replies(Err(clone_error(&error)))))
                    .collect();
            }
        };
        let mut out = Vec::with_capacity(layout.len());
        for (index, count) in layout {
            let answer: Vec<Value> = replies.by_ref().take(count).collect();
            if answer.iter().any(is_redirect) {
                self.forget_slots();
                out.push((index, Answer::Redirected));
            } else {
                out.push((index, Answer::Replies(Ok(answer))));
            }
        }
        out
    }
}

/// The error that failed a node's whole pipeline, for each of its parts.
fn clone_error(error: &redis::RedisError) -> redis::RedisError {
    redis::RedisError::from((
        error.kind(),
        "a node's part of the write failed",
        error.to_string(),
    ))
}

/// A `MOVED` or `ASK` refusal: the command was not run (while queued in a transaction, none of it was).
fn is_redirect(reply: &Value) -> bool {
    matches!(reply, Value::ServerError(error) if matches!(error.code(), "MOVED" | "ASK"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connection::{slot_of, ConnectOptions, Connection};
    use stream_listener_test_support::RedisCluster;

    fn xadd(key: &str, n: u32) -> Cmd {
        let mut cmd = redis::cmd("XADD");
        cmd.arg(key).arg("*").arg("n").arg(n);
        cmd
    }

    /// Parts of 8 keys over the 3 masters: keys 0-3 of 3 XADDs each (transactions), keys 4-7 of one.
    fn parts(prefix: &str) -> Vec<Part> {
        (0..8)
            .map(|i| {
                let key = format!("{prefix}:{i}");
                let n = if i < 4 { 3 } else { 1 };
                Part {
                    slot: slot_of(key.as_bytes()),
                    commands: (0..n).map(|j| xadd(&key, j)).collect(),
                }
            })
            .collect()
    }

    async fn lengths(conn: &mut Connection, prefix: &str) -> Vec<u64> {
        let mut out = Vec::new();
        for i in 0..8 {
            let len: u64 = redis::cmd("XLEN")
                .arg(format!("{prefix}:{i}"))
                .query_async(conn)
                .await
                .unwrap();
            out.push(len);
        }
        out
    }

    fn written(answers: &[Answer]) -> Vec<bool> {
        answers
            .iter()
            .map(|a| matches!(a, Answer::Replies(Ok(_))))
            .collect()
    }

    /// On a real cluster: every part written once, in one pipeline per master; with a stale map (every
    /// slot placed on one master), the parts of the other masters' slots are refused with `MOVED`,
    /// written nowhere, and said to be redirected, and the map is read again; a master's connection
    /// killed under the producer fails that master's parts (in doubt), and the next write connects again;
    /// a master that cannot be reached gets nothing, its parts said to be redirected.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn parts_go_per_master_and_a_moved_slot_or_a_broken_connection_is_never_written_twice() {
        let cluster = RedisCluster::start();
        let target = RedisTarget::open(&cluster.url()).unwrap();
        let mut admin = target.connect(ConnectOptions::default()).await.unwrap();
        let Connection::Cluster(conn) = admin.clone() else {
            panic!("a cluster connection");
        };
        let nodes = Nodes::new(target, AsyncConnectionConfig::new());

        let answers = nodes.send(&conn, parts("a")).await;
        assert_eq!(written(&answers), vec![true; 8]);
        for (i, answer) in answers.iter().enumerate() {
            let Answer::Replies(Ok(replies)) = answer else {
                unreachable!()
            };
            let expected = if i < 4 { 5 } else { 1 };
            assert_eq!(replies.len(), expected, "part {i}: {replies:?}");
        }
        assert_eq!(lengths(&mut admin, "a").await, [3, 3, 3, 3, 1, 1, 1, 1]);
        let masters: std::collections::BTreeSet<NodeAddr> =
            nodes.conns.lock().unwrap().keys().cloned().collect();
        assert_eq!(masters.len(), 3, "one connection per master: {masters:?}");

        // A stale map: every slot on one master.
        let one = masters.iter().next().unwrap().clone();
        *nodes.slots.lock().unwrap() = Some(Arc::new(vec![(0, 16383, one.clone())]));
        let on = |prefix: &str, node: &NodeAddr| -> Vec<bool> {
            (0..8)
                .map(|i| {
                    let slot = slot_of(format!("{prefix}:{i}").as_bytes());
                    cluster.nodes()[cluster.master_of(slot)].port() == node.1
                })
                .collect()
        };
        let on_one = on("b", &one);
        assert!(
            on_one.contains(&true) && on_one.contains(&false),
            "{on_one:?}"
        );
        let answers = nodes.send(&conn, parts("b")).await;
        assert_eq!(written(&answers), on_one, "only the master's own slots");
        assert!(answers
            .iter()
            .zip(&on_one)
            .all(|(a, own)| *own || matches!(a, Answer::Redirected)));
        let expected: Vec<u64> = (0..8)
            .map(|i| match (on_one[i], i < 4) {
                (false, _) => 0,
                (true, true) => 3,
                (true, false) => 1,
            })
            .collect();
        assert_eq!(
            lengths(&mut admin, "b").await,
            expected,
            "a refused part wrote nothing"
        );
        assert!(
            nodes.slots.lock().unwrap().is_none(),
            "the map is read again"
        );

        // Every client connection of one master killed, the producer's among them (the map read first).
        nodes.slot_map(&conn).await.unwrap();
        let port = one.1.to_string();
        cluster
            .cli(one.1, &["CLIENT", "KILL", "TYPE", "normal"])
            .unwrap_or_else(|e| panic!("CLIENT KILL on {port}: {e}"));
        let answers = nodes.send(&conn, parts("c")).await;
        let failed: Vec<bool> = answers
            .iter()
            .map(|a| matches!(a, Answer::Replies(Err(_))))
            .collect();
        assert!(on("c", &one).contains(&true));
        assert_eq!(failed, on("c", &one), "that master's parts fail, in doubt");
        let answers = nodes.send(&conn, parts("d")).await;
        assert_eq!(written(&answers), vec![true; 8], "connected again");
        assert_eq!(lengths(&mut admin, "d").await, [3, 3, 3, 3, 1, 1, 1, 1]);

        // A map naming a master that is gone (a failover): nothing can be sent there, so every part
        // goes through the cluster connection instead.
        let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = gone.local_addr().unwrap().port();
        drop(gone);
        *nodes.slots.lock().unwrap() = Some(Arc::new(vec![(0, 16383, ("127.0.0.1".into(), port))]));
        let answers = nodes.send(&conn, parts("e")).await;
        assert!(answers.iter().all(|a| matches!(a, Answer::Redirected)));
        assert_eq!(lengths(&mut admin, "e").await, [0; 8]);
        assert!(
            nodes.slots.lock().unwrap().is_none(),
            "the map is read again"
        );
    }
}
