//! A batch on a Redis Cluster: one part per shard (one slot); the parts of one master in one pipeline,
//! straight to it.
//!
//! A part in which a key repeats is a `MULTI`/`EXEC` transaction, written whole or not at all: a
//! command refused while queued (`OOM`, `MOVED`, `ASK`) aborts it. A plain pipeline refused by a full
//! master in its middle could take a later XADD of the same key once memory was freed, and the resent
//! batch would then write the earlier one after it. A part of distinct keys has no order to keep and is
//! sent plain: each XADD is written or refused on its own, and a refused command was not run.
//!
//! A producer that knows its target (`Producer::connect` and its variants) keeps a connection to each
//! master ([`Masters`]) and sends all the parts one master serves in one pipeline on it: a batch over
//! 8 shards on 3 masters is 3 round trips, not 8 through redis-rs's routing task. On its own connection
//! each reply is final, as redis-rs never resends it: the XADDs the master refused because the layout
//! changed (`MOVED`, `ASK`, a failover: [`not_run_here`]; a refused transaction, all of its XADDs) are
//! sent again through the cluster connection, which follows the layout, after those of their shard
//! that were written, and the slot map is read again. A master whose connection failed may have run any
//! of its pipeline: all of it is sent again through the cluster connection, at-least-once, as redis-rs
//! resends a request whose connection failed.
//!
//! Through the cluster connection (those resends, and every batch of a producer made with
//! `Producer::new` over a connection, which has no target to open connections from) each part goes on
//! its own, and every part of more than one XADD is a transaction: redis-rs answers `ASK` with one
//! `ASKING` before the resent pipeline, and Redis keeps that flag for a whole `MULTI` but for one plain
//! command only, so a plain pipeline's first XADD was written on the importing node and the rest sent
//! back (`MOVED`), again and again until the migration ended.

use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, Value};

use super::{exec_replies, replicas_short, write_into, ProducerError, Replies};
use crate::connection::{not_run_here, send_to_slots, Masters, NodeAddr};

/// One shard's XADDs in a write: the slot of its stream, the commands, their positions in the write,
/// and whether a key is in it more than once.
pub(super) struct Part {
    pub(super) slot: u16,
    pub(super) cmds: Vec<Cmd>,
    pub(super) positions: Vec<usize>,
    pub(super) repeats: bool,
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
            let commands = parts.iter().map(|p| p.cmds.len() + 2).sum::<usize>() + 1;
            let mut pipe = redis::Pipeline::with_capacity(commands);
            let sent = parts
                .into_iter()
                .map(|part| {
                    // Every reply here is final, so a plain part's refused XADDs alone are sent
                    // again: only a repeated key needs the transaction (see `Pipelines`).
                    let transaction = part.repeats;
                    let first = pipe.len() + usize::from(transaction);
                    write_into(&mut pipe, part.cmds, transaction);
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
                rest.extend(sent.iter().map(|part| {
                    let all: Vec<usize> = (0..part.positions.len()).collect();
                    part.again(&pipe, &all)
                }));
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
            // A refused XADD ran nothing; a refused transaction, none of its XADDs (each answers
            // with the refusal).
            let refused: Vec<usize> = part_replies
                .iter()
                .enumerate()
                .filter(|(_, r)| matches!(r, Value::ServerError(e) if not_run_here(e)))
                .map(|(j, _)| j)
                .collect();
            if !refused.is_empty() {
                masters.forget(None);
                rest.push(part.again(&pipe, &refused));
            }
            for (j, (&position, reply)) in part.positions.iter().zip(part_replies).enumerate() {
                if !refused.contains(&j) {
                    first_written = first_written.or(Some(position));
                    replies[position] = reply;
                }
            }
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

    /// Its XADDs `which` (indices into the part, in order) again, copied out of `pipe`, to be sent
    /// elsewhere.
    fn again(&self, pipe: &Pipeline, which: &[usize]) -> Part {
        let cmds: Vec<&Cmd> = pipe
            .cmd_iter()
            .skip(self.first)
            .take(self.positions.len())
            .collect();
        Part {
            slot: self.slot,
            cmds: which.iter().map(|&j| cmds[j].clone()).collect(),
            positions: which.iter().map(|&j| self.positions[j]).collect(),
            repeats: self.transaction,
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
            // Any part of more than one XADD: redis-rs follows `ASK` with one `ASKING`, which Redis
            // keeps for a whole transaction but for one plain command only (see the module docs).
            let transaction = part.cmds.len() > 1;
            let mut pipe = redis::pipe();
            match wait {
                // `WAIT` after `EXEC` (inside it would not block): the transaction is spelled out.
                Some(wait) => {
                    write_into(&mut pipe, part.cmds, transaction);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// What a master refused is copied out of its pipeline by position in the part: a plain part's
    /// refused XADDs alone, each with its position in the write.
    #[test]
    fn a_refused_xadd_is_sent_again_alone_and_a_refused_transaction_whole() {
        let xadd = |n: usize| {
            let mut cmd = redis::cmd("XADD");
            cmd.arg("s").arg("*").arg("n").arg(n);
            cmd
        };
        let mut pipe = redis::pipe();
        write_into(&mut pipe, vec![xadd(0), xadd(1), xadd(2)], false);
        write_into(&mut pipe, vec![xadd(3), xadd(4)], true);
        let plain = Sent {
            slot: 7,
            positions: vec![10, 11, 12],
            first: 0,
            transaction: false,
        };
        let transaction = Sent {
            slot: 8,
            positions: vec![20, 21],
            first: 4,
            transaction: true,
        };
        assert_eq!(plain.replies(), 3);
        assert_eq!(transaction.replies(), 4);
        let n_of = |part: &Part| -> Vec<Vec<u8>> {
            part.cmds
                .iter()
                .map(|cmd| match cmd.args_iter().last() {
                    Some(redis::Arg::Simple(n)) => n.to_vec(),
                    _ => unreachable!(),
                })
                .collect()
        };
        let again = plain.again(&pipe, &[1, 2]);
        assert_eq!((again.slot, &again.positions), (7, &vec![11, 12]));
        assert_eq!(n_of(&again), [b"1".to_vec(), b"2".to_vec()]);
        assert!(!again.repeats);
        let again = transaction.again(&pipe, &[0, 1]);
        assert_eq!((again.slot, &again.positions), (8, &vec![20, 21]));
        assert_eq!(n_of(&again), [b"3".to_vec(), b"4".to_vec()]);
        assert!(again.repeats, "a transaction is sent again as one");
    }
}
