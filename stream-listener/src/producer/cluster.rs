//! A batch on a Redis Cluster: one `MULTI`/`EXEC` transaction per shard; the transactions of one
//! master in one pipeline, straight to it.
//!
//! Each shard's part is a transaction (one slot), written whole or not at all: a command refused while
//! queued (`OOM`, `MOVED`, `ASK`) aborts it. So a refused part wrote nothing and its resend is its only
//! write, and a batch sent again after a failure cannot put a shard's messages out of order (a plain
//! pipeline refused by a full master in its middle could take a later XADD once memory was freed, and
//! the resent batch would then write the earlier one after it). A part of one XADD is sent as it is: a
//! refused command was not run.
//!
//! A producer that knows its target (`Producer::connect` and its variants) keeps a connection to each
//! master ([`Masters`]) and sends all the transactions one master serves in one pipeline on it: a batch
//! over 8 shards on 3 masters is 3 round trips, not 8 through redis-rs's routing task. On its own
//! connection each reply is final, as redis-rs never resends it: a part the master refused because the
//! layout changed (`MOVED`, `ASK`, a failover: [`not_run_here`]) is sent again through the cluster
//! connection, which follows the layout, and the slot map is read again. A master whose connection
//! failed may have run any of its pipeline: all of it is sent again through the cluster connection,
//! at-least-once, as redis-rs resends a request whose connection failed.
//!
//! Through the cluster connection (those resends, and every batch of a producer made with
//! `Producer::new` over a connection, which has no target to open connections from) each part goes on
//! its own. The transaction matters there too: redis-rs answers `ASK` with one `ASKING` before the
//! resent pipeline, and Redis keeps that flag for a whole `MULTI` but for one plain command only, so a
//! plain pipeline's first XADD was written on the importing node and the rest sent back (`MOVED`), again
//! and again until the migration ended.

use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, Value};

use super::{replicas_short, ProducerError, Replies};
use crate::connection::{not_run_here, send_to_slots, Masters, NodeAddr};

/// One shard's XADDs in a write: the slot of its stream, the commands, their positions in the write.
pub(super) struct Part {
    pub(super) slot: u16,
    pub(super) cmds: Vec<Cmd>,
    pub(super) positions: Vec<usize>,
}

impl Part {
    /// One XADD needs no transaction (see the module docs).
    fn is_transaction(&self) -> bool {
        self.cmds.len() > 1
    }
}

/// Moves `cmds` into `pipe`, as a transaction if there is more than one.
fn write_into(pipe: &mut Pipeline, cmds: Vec<Cmd>) {
    let transaction = cmds.len() > 1;
    if transaction {
        pipe.cmd("MULTI");
    }
    for cmd in cmds {
        pipe.add_command(cmd);
    }
    if transaction {
        pipe.cmd("EXEC");
    }
}

/// Sends a write's parts: through `masters` when given, the rest (and what a master refused) through
/// `cluster`. `wait` (`WAIT`, with [`ProducerConfig::min_replicas`](super::ProducerConfig::min_replicas)
/// `wanted`) ends each pipeline.
pub(super) async fn send(
    cluster: &ClusterConnection,
    masters: Option<&Masters>,
    parts: Vec<Part>,
    len: usize,
    wait: Option<&Cmd>,
    wanted: u32,
) -> Result<Replies, ProducerError> {
    let mut replies = vec![Value::Nil; len];
    let mut short = None;
    let rest = match masters {
        Some(masters) => {
            to_masters(
                cluster,
                masters,
                parts,
                wait,
                wanted,
                &mut replies,
                &mut short,
            )
            .await?
        }
        None => parts,
    };
    if !rest.is_empty() {
        through_cluster(cluster, rest, wait, wanted, &mut replies, &mut short).await?;
    }
    Ok((replies, short))
}

/// Sends each master's parts in one pipeline on its own connection, at once; returns the parts to send
/// again through the cluster connection (refused, of a master whose connection failed, or of a slot
/// the map has no master for).
async fn to_masters(
    cluster: &ClusterConnection,
    masters: &Masters,
    parts: Vec<Part>,
    wait: Option<&Cmd>,
    wanted: u32,
    replies: &mut [Value],
    short: &mut Option<(usize, u32)>,
) -> Result<Vec<Part>, ProducerError> {
    let nodes = match masters
        .of_slots(cluster, parts.iter().map(|p| p.slot))
        .await
    {
        Ok(nodes) => nodes,
        Err(error) => {
            tracing::debug!(%error, "no slot map; the batch goes through the cluster connection");
            return Ok(parts);
        }
    };
    let mut rest = Vec::new();
    let mut by_node: Vec<(NodeAddr, Vec<Part>)> = Vec::new();
    for (part, node) in parts.into_iter().zip(nodes) {
        let Some(node) = node else {
            rest.push(part);
            continue;
        };
        match by_node.iter_mut().find(|(n, _)| *n == node) {
            Some((_, parts)) => parts.push(part),
            None => by_node.push((node, vec![part])),
        }
    }
    // Each master's pipeline: its parts one after the other, each its own transaction. The commands
    // are moved in, and copied back out only if the master refuses them.
    let sends: Vec<(NodeAddr, Pipeline, Vec<Sent>)> = by_node
        .into_iter()
        .map(|(node, parts)| {
            let mut pipe = redis::pipe();
            let sent = parts
                .into_iter()
                .map(|part| {
                    let transaction = part.is_transaction();
                    let first = pipe.len() + usize::from(transaction);
                    write_into(&mut pipe, part.cmds);
                    Sent {
                        slot: part.slot,
                        positions: part.positions,
                        first,
                        transaction,
                    }
                })
                .collect();
            if let Some(wait) = wait {
                pipe.add_command(wait.clone());
            }
            (node, pipe, sent)
        })
        .collect();
    let answers = futures_util::future::join_all(sends.iter().map(|(node, pipe, _)| async move {
        let mut conn = masters.connection(node).await?;
        redis::aio::ConnectionLike::req_packed_commands(&mut conn, pipe, 0, pipe.len()).await
    }))
    .await;
    for ((node, pipe, sent), answer) in sends.into_iter().zip(answers) {
        let answer = match answer {
            Ok(answer) => answer,
            Err(error) => {
                tracing::debug!(%error, host = %node.0, port = node.1, "a master's pipeline failed; its parts go through the cluster connection");
                masters.forget(Some(&node));
                rest.extend(sent.into_iter().map(|part| part.again(&pipe)));
                continue;
            }
        };
        let mut answer = answer.into_iter();
        let mut first_written = None;
        for part in sent {
            let taken: Vec<Value> = answer.by_ref().take(part.replies()).collect();
            let part_replies = if part.transaction {
                exec_replies(taken)
            } else {
                taken
            };
            // A transaction refused (or one XADD) ran nothing.
            let refused = part_replies
                .iter()
                .any(|r| matches!(r, Value::ServerError(e) if not_run_here(e)));
            if refused {
                masters.forget(None);
                rest.push(part.again(&pipe));
                continue;
            }
            first_written = first_written.or(part.positions.first().copied());
            place(replies, &part.positions, part_replies);
        }
        if wait.is_some() {
            if let (Some(n), Some(position)) =
                (replicas_short(answer.next(), wanted)?, first_written)
            {
                *short = short.or(Some((position, n)));
            }
        }
    }
    Ok(rest)
}

/// A part in a master's pipeline: its XADDs' positions in the write, where the first is in the
/// pipeline, and whether they are a transaction.
struct Sent {
    slot: u16,
    positions: Vec<usize>,
    first: usize,
    transaction: bool,
}

impl Sent {
    /// How many replies its commands get (`MULTI` and `EXEC` too).
    fn replies(&self) -> usize {
        self.positions.len() + if self.transaction { 2 } else { 0 }
    }

    /// The part again, its commands copied out of `pipe`, to be sent elsewhere.
    fn again(self, pipe: &Pipeline) -> Part {
        let cmds = pipe
            .cmd_iter()
            .skip(self.first)
            .take(self.positions.len())
            .cloned()
            .collect();
        Part {
            slot: self.slot,
            cmds,
            positions: self.positions,
        }
    }
}

/// Sends each part on its own through the cluster connection, at once (`send_to_slots`).
async fn through_cluster(
    cluster: &ClusterConnection,
    parts: Vec<Part>,
    wait: Option<&Cmd>,
    wanted: u32,
    replies: &mut [Value],
    short: &mut Option<(usize, u32)>,
) -> Result<(), ProducerError> {
    let (sends, parts): (Vec<_>, Vec<_>) = parts
        .into_iter()
        .map(|part| {
            let transaction = part.is_transaction();
            let mut pipe = redis::pipe();
            match wait {
                // `WAIT` after `EXEC` (inside it would not block): the transaction is spelled out.
                Some(wait) => {
                    write_into(&mut pipe, part.cmds);
                    pipe.add_command(wait.clone());
                }
                None => {
                    for cmd in part.cmds {
                        pipe.add_command(cmd);
                    }
                    if transaction {
                        pipe.atomic();
                    }
                }
            }
            ((Some(part.slot), pipe), (part.positions, transaction))
        })
        .unzip();
    let answers = send_to_slots(cluster, sends).await;
    for ((positions, transaction), answer) in parts.into_iter().zip(answers) {
        let mut answer = answer?;
        if wait.is_some() {
            if let Some(n) = replicas_short(answer.pop(), wanted)? {
                *short = short.or(positions.first().map(|&p| (p, n)));
            }
        }
        let answer = if transaction {
            exec_replies(answer)
        } else {
            answer
        };
        place(replies, &positions, answer);
    }
    Ok(())
}

/// Puts a part's replies where its XADDs are in the write.
fn place(replies: &mut [Value], positions: &[usize], answer: Vec<Value>) {
    for (&position, reply) in positions.iter().zip(answer) {
        replies[position] = reply;
    }
}

/// The per-command replies of one shard's transaction (`MULTI`, its XADDs, `EXEC`: every reply, in
/// order). A command refused while queued (`OOM`, `MOVED`) aborts the transaction, as does an `EXEC`
/// refused for the layout: nothing was written, and each command answers with that refusal.
fn exec_replies(replies: Vec<Value>) -> Vec<Value> {
    let n = replies.len().saturating_sub(2);
    let mut replies = replies.into_iter();
    let queued: Vec<Value> = replies.by_ref().skip(1).take(n).collect();
    match replies.next() {
        Some(Value::Array(executed)) if executed.len() == n => executed,
        exec => {
            let refusal = queued
                .into_iter()
                .find(|r| matches!(r, Value::ServerError(_)))
                .or(exec)
                .unwrap_or(Value::Nil);
            vec![refusal; n]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transactions_replies_are_its_commands_or_the_refusal_of_all() {
        let ok = || Value::Okay;
        let queued = || Value::SimpleString("QUEUED".into());
        let id = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let executed = vec![
            ok(),
            queued(),
            queued(),
            Value::Array(vec![id("1-0"), Value::Nil]),
        ];
        assert_eq!(exec_replies(executed), vec![id("1-0"), Value::Nil]);
        let error =
            |text: &str| redis::parse_redis_value(format!("-{text}\r\n").as_bytes()).unwrap();
        let oom = error("OOM command not allowed");
        let exec_abort = error("EXECABORT Transaction discarded");
        assert!(matches!(oom, Value::ServerError(_)));
        let refused = vec![ok(), queued(), oom.clone(), exec_abort.clone()];
        assert_eq!(exec_replies(refused), vec![oom.clone(), oom]);
        // An EXEC that failed without a queued refusal: each command gets EXEC's answer.
        assert_eq!(
            exec_replies(vec![ok(), queued(), exec_abort.clone()]),
            vec![exec_abort]
        );
        // An EXEC refused for the layout (the slot moved between the queueing and EXEC).
        let moved = error("MOVED 3999 127.0.0.1:7001");
        assert_eq!(
            exec_replies(vec![ok(), queued(), queued(), moved.clone()]),
            vec![moved.clone(), moved]
        );
    }
}
