//! The Redis side of granting a shard to an HTTP member, which reads it with a plain `XREADGROUP ... >`
//! and nothing else: no fence, no claim of pending entries, and a `NOGROUP` kills the Python client.
//!
//! So before a shard newly granted in a response reaches the member, the server
//! * creates every shard's consumer group ([`Topology::ensure_group`], from the first entry, as members
//!   of this library do), and
//! * checks the shard has no pending entries (`XPENDING` summary). Entries pending there belong to an
//!   earlier owner (a Rust member that was fenced, an HTTP member that was killed, the same memberId's
//!   previous incarnation); the HTTP member would never read them (it reads only new entries), so they
//!   would stay pending for good and the keys' later entries would be handled before them. Such a shard
//!   is *withheld*: the response lists it in `pendingShards`, not `assignedShards`, so the member does not
//!   read it, and it is offered again on every heartbeat until its pending entries are gone.
//!
//! Withholding is always safe: the member reads less than the coordinator allows. A failure of either
//! step withholds every new shard of that response.

use std::collections::BTreeSet;

use stream_listener::connection::Connection;
use stream_listener::coordinator::wire::{HeartbeatRequest, HeartbeatResponse, ShardId};
use stream_listener::routing::shard_stream_key;
use stream_listener::topology::{StartFrom, Topology};

/// Why a newly granted shard was withheld.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Withheld {
    /// It has this many pending entries of an earlier owner.
    Pending {
        /// The shard.
        shard: u32,
        /// Its pending entries.
        count: u64,
    },
    /// Redis failed while the server prepared the grant.
    Redis(String),
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

/// Prepares the shards newly granted in `response` (see the module doc) and withholds those that are not
/// safe to read; returns what was withheld and why.
pub async fn prepare(
    conn: &mut Connection,
    stream: &str,
    group: &str,
    req: &HeartbeatRequest,
    response: &mut HeartbeatResponse,
) -> Vec<Withheld> {
    let new = newly_granted(req, response);
    if new.is_empty() {
        return Vec::new();
    }
    let mut withheld_shards = BTreeSet::new();
    let mut reasons = Vec::new();
    match Topology::ensure_group(conn, stream, group, StartFrom::Earliest).await {
        Err(e) => {
            withheld_shards.extend(new.iter().copied());
            reasons.push(Withheld::Redis(format!("creating the shard groups: {e}")));
        }
        Ok(_) => {
            for &shard in &new {
                match pending_count(conn, &shard_stream_key(stream, shard), group).await {
                    Ok(0) => {}
                    Ok(count) => {
                        withheld_shards.insert(shard);
                        reasons.push(Withheld::Pending { shard, count });
                    }
                    Err(e) => {
                        withheld_shards.insert(shard);
                        reasons.push(Withheld::Redis(format!("XPENDING of shard {shard}: {e}")));
                    }
                }
            }
        }
    }
    withhold(response, &withheld_shards);
    reasons
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

/// Entries pending in `group` of `key` (the `XPENDING` summary's count).
async fn pending_count(conn: &mut Connection, key: &str, group: &str) -> redis::RedisResult<u64> {
    let reply: redis::Value = redis::cmd("XPENDING")
        .arg(key)
        .arg(group)
        .query_async(conn)
        .await?;
    match reply {
        redis::Value::Array(items) => match items.first() {
            Some(redis::Value::Int(n)) => Ok(u64::try_from(*n).unwrap_or(0)),
            _ => Ok(0),
        },
        _ => Ok(0),
    }
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
    fn withheld_shards_move_to_pending() {
        let mut answer = response(&[1, 5, 6], &[7]);
        withhold(&mut answer, &[5, 7].into_iter().collect());
        let indexes = |v: &[ShardId]| v.iter().map(|s| s.shard_index).collect::<Vec<_>>();
        assert_eq!(indexes(&answer.assignment.assigned_shards), [1, 6]);
        assert_eq!(indexes(&answer.assignment.pending_shards), [5, 7]);
    }
}
