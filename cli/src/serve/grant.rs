//! The Redis side of granting a shard to an HTTP member, which reads it with a plain `XREADGROUP ... >`
//! and nothing else: no fence, no claim of pending entries, and a `NOGROUP` kills the Python client.
//!
//! So before a shard newly granted in a response reaches the member, the server
//! * creates every shard's consumer group ([`Topology::ensure_group`], from the first entry, as members
//!   of this library do), and
//! * deals with the shard's pending entries. They belong to an earlier owner: a Rust member leaves the
//!   entries it read but did not start pending at a revoke, for the next owner to claim; an HTTP member
//!   that was killed or frozen leaves what it read; so does the same memberId's previous incarnation.
//!   The HTTP member would never read them (it reads only new entries), so they would stay pending for
//!   good and the keys' later entries would be handled before them. The server **rewinds** the shard's
//!   group to just before the oldest pending entry (`XGROUP SETID`): the member's `XREADGROUP ... >` then
//!   delivers them again, in stream order, before anything newer (Redis moves an entry already pending
//!   to the consumer it is delivered to). Entries between the oldest pending one and the group's last
//!   delivered one that were acknowledged are delivered again too (at least once). Nobody else reads the
//!   shard meanwhile: the coordinator granted it, so its previous owner gave it up or its hold passed.
//! * When more than `max_rewind` entries would be delivered again (a poison entry left pending for good
//!   far behind, say), the shard is *withheld* instead: the response lists it in `pendingShards`, not
//!   `assignedShards`, so the member does not read it, and it is offered again on every heartbeat.
//!
//! Withholding is always safe: the member reads less than the coordinator allows. A failure of any step
//! withholds every new shard of that response.

use std::collections::BTreeSet;

use stream_listener::connection::Connection;
use stream_listener::coordinator::wire::{HeartbeatRequest, HeartbeatResponse, ShardId};
use stream_listener::routing::shard_stream_key;
use stream_listener::topology::{StartFrom, Topology};

/// What the server did about a newly granted shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prepared {
    /// It had pending entries: its group was rewound so that the member reads them first.
    Rewound {
        /// The shard.
        shard: u32,
        /// Its pending entries.
        pending: u64,
        /// Entries delivered again from the rewound position (the pending ones included).
        redelivered: u64,
    },
    /// Withheld: rewinding would deliver more than `max_rewind` entries again.
    Withheld {
        /// The shard.
        shard: u32,
        /// Its pending entries.
        pending: u64,
    },
    /// Withheld: Redis failed while the server prepared the grant.
    Failed(String),
}

/// Shards in `response.assignment.assigned_shards` that the request did not report owning: new to the
/// member with this response.
pub fn newly_granted(req: &HeartbeatRequest, response: &HeartbeatResponse) -> Vec<u32> {
    let owned: BTreeSet<u32> = req
        .owned_shards
        .iter()
        .flatten()
        .map(|s| s.shard_index)
        .collect();
    response
        .assignment
        .assigned_shards
        .iter()
        .map(|s| s.shard_index)
        .filter(|s| !owned.contains(s))
        .collect()
}

/// Prepares the shards newly granted in `response` (see the module doc), withholding those that cannot
/// be read safely; returns what it did about shards that needed more than their consumer group.
pub async fn prepare(
    conn: &mut Connection,
    stream: &str,
    group: &str,
    max_rewind: u64,
    req: &HeartbeatRequest,
    response: &mut HeartbeatResponse,
) -> Vec<Prepared> {
    let new = newly_granted(req, response);
    if new.is_empty() {
        return Vec::new();
    }
    let mut withheld = BTreeSet::new();
    let mut done = Vec::new();
    match Topology::ensure_group(conn, stream, group, StartFrom::Earliest).await {
        Err(e) => {
            withheld.extend(new.iter().copied());
            done.push(Prepared::Failed(format!("creating the shard groups: {e}")));
        }
        Ok(_) => {
            for &shard in &new {
                let key = shard_stream_key(stream, shard);
                match rewind(conn, &key, group, max_rewind).await {
                    Ok(None) => {}
                    Ok(Some((pending, redelivered))) if redelivered <= max_rewind => {
                        done.push(Prepared::Rewound {
                            shard,
                            pending,
                            redelivered,
                        });
                    }
                    Ok(Some((pending, _))) => {
                        withheld.insert(shard);
                        done.push(Prepared::Withheld { shard, pending });
                    }
                    Err(e) => {
                        withheld.insert(shard);
                        done.push(Prepared::Failed(format!("shard {shard}: {e}")));
                    }
                }
            }
        }
    }
    withhold(response, &withheld);
    done
}

/// Rewinds `group` of `key` to just before its oldest pending entry, unless that would deliver more
/// than `max_rewind` entries again. `None`: nothing pending; else `(pending, entries from the oldest
/// pending one to the last delivered one)`, rewound if the latter is at most `max_rewind`.
async fn rewind(
    conn: &mut Connection,
    key: &str,
    group: &str,
    max_rewind: u64,
) -> redis::RedisResult<Option<(u64, u64)>> {
    let summary: redis::Value = redis::cmd("XPENDING")
        .arg(key)
        .arg(group)
        .query_async(conn)
        .await?;
    let (pending, oldest) = match summary {
        redis::Value::Array(items) => {
            let count = match items.first() {
                Some(redis::Value::Int(n)) => u64::try_from(*n).unwrap_or(0),
                _ => 0,
            };
            let oldest = match items.get(1) {
                Some(redis::Value::BulkString(id)) => String::from_utf8(id.clone()).ok(),
                _ => None,
            };
            (count, oldest)
        }
        _ => (0, None),
    };
    let Some(oldest) = oldest.filter(|_| pending > 0) else {
        return Ok(None);
    };
    let groups: redis::Value = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(key)
        .query_async(conn)
        .await?;
    let last_delivered = stream_listener::reply::xinfo_groups(&groups)?
        .into_iter()
        .find(|g| g.name == group)
        .and_then(|g| g.last_delivered_id)
        .unwrap_or_else(|| oldest.clone());
    let behind: redis::Value = redis::cmd("XRANGE")
        .arg(key)
        .arg(&oldest)
        .arg(&last_delivered)
        .arg("COUNT")
        .arg(max_rewind.saturating_add(1))
        .query_async(conn)
        .await?;
    let redelivered = match behind {
        redis::Value::Array(entries) => entries.len() as u64,
        _ => 0,
    }
    // A pending entry deleted from the stream (XDEL) is still pending: count at least those.
    .max(pending.min(max_rewind.saturating_add(1)));
    if redelivered > max_rewind {
        return Ok(Some((pending, redelivered)));
    }
    let Some(before) = id_before(&oldest) else {
        return Ok(Some((pending, u64::MAX)));
    };
    let () = redis::cmd("XGROUP")
        .arg("SETID")
        .arg(key)
        .arg(group)
        .arg(before)
        .query_async(conn)
        .await?;
    Ok(Some((pending, redelivered)))
}

/// The greatest stream id below `id` (`ms-seq`); `None` for `0-0` or an id that does not parse.
fn id_before(id: &str) -> Option<String> {
    let (ms, seq) = id.split_once('-')?;
    let (ms, seq): (u64, u64) = (ms.parse().ok()?, seq.parse().ok()?);
    match (ms, seq) {
        (0, 0) => None,
        (ms, 0) => Some(format!("{}-{}", ms - 1, u64::MAX)),
        (ms, seq) => Some(format!("{ms}-{}", seq - 1)),
    }
}

/// Moves `shards` from `assignedShards` to `pendingShards`.
pub fn withhold(response: &mut HeartbeatResponse, shards: &BTreeSet<u32>) {
    if shards.is_empty() {
        return;
    }
    let assignment = &mut response.assignment;
    assignment
        .assigned_shards
        .retain(|s| !shards.contains(&s.shard_index));
    for &shard in shards {
        let shard = ShardId::new(shard);
        if !assignment.pending_shards.contains(&shard) {
            assignment.pending_shards.push(shard);
        }
    }
    assignment.pending_shards.sort();
}

#[cfg(test)]
mod tests {
    use super::*;
    use stream_listener::coordinator::wire::{
        Assignment, HeartbeatStatus, RuntimeConsumerCapacity,
    };

    fn req(owned: &[u32]) -> HeartbeatRequest {
        HeartbeatRequest {
            protocol_version: 1,
            request_id: "r".into(),
            member_id: "m".into(),
            member_name: None,
            member_epoch: 5,
            metadata_version: 1,
            runtime_consumer_capacity: RuntimeConsumerCapacity::default(),
            owned_shards: Some(owned.iter().copied().map(ShardId::new).collect()),
            revoking_shards: vec![],
            shard_progress: vec![],
            weight: None,
            restarting: false,
            hold_after_lease_ms: 0,
        }
    }

    fn response(assigned: &[u32], pending: &[u32]) -> HeartbeatResponse {
        HeartbeatResponse {
            response_to: "r".into(),
            status: HeartbeatStatus::Ok,
            member_id: "m".into(),
            member_epoch: 5,
            heartbeat_interval_ms: 1000,
            rebalance_timeout_ms: 1000,
            session_timeout_ms: 1000,
            group_epoch: 1,
            assignment_epoch: 1,
            metadata_version: 1,
            shard_count: 8,
            assignment: Assignment {
                assigned_shards: assigned.iter().copied().map(ShardId::new).collect(),
                pending_shards: pending.iter().copied().map(ShardId::new).collect(),
                metadata_version: 1,
            },
        }
    }

    #[test]
    fn only_shards_the_member_does_not_report_are_new() {
        assert_eq!(
            newly_granted(&req(&[1, 2]), &response(&[1, 2, 5, 6], &[])),
            [5, 6]
        );
        assert!(newly_granted(&req(&[1, 2]), &response(&[1], &[])).is_empty());
    }

    #[test]
    fn the_id_before_an_id() {
        assert_eq!(id_before("5-3").as_deref(), Some("5-2"));
        assert_eq!(id_before("5-0").as_deref(), Some("4-18446744073709551615"));
        assert_eq!(id_before("0-1").as_deref(), Some("0-0"));
        assert_eq!(id_before("0-0"), None);
        assert_eq!(id_before("garbage"), None);
    }

    #[test]
    fn withheld_shards_move_to_pending() {
        let mut answer = response(&[1, 5, 6], &[7]);
        withhold(&mut answer, &[5, 7].into_iter().collect());
        let indexes = |v: &[ShardId]| v.iter().map(|s| s.shard_index).collect::<Vec<_>>();
        assert_eq!(indexes(&answer.assignment.assigned_shards), [1, 6]);
        assert_eq!(indexes(&answer.assignment.pending_shards), [5, 7]);
    }
}
