//! `GET /coord/v1/monitoring/streams/{stream}/groups/{group}/offsets` (the origin's
//! `getStreamShardOffsets`, `StreamShardOffsetsResponse`), from [`stream_listener::lag::read_group`]
//! (length, lag, pending, last delivered id per shard the group reads, a shrink's draining shards
//! included), the projection (each shard's current owner) and per shard `XRANGE`/`XREVRANGE COUNT 1`
//! (first and last record ids) and `MEMORY USAGE` (null, and `memoryUsageKnown: false`, where refused).
//!
//! Lag is mapped, not passed through: the origin's `lag` is null where Redis cannot calculate it; ours
//! is exact where Redis reports it or the entries were counted, and only a lower bound when more than the
//! count limit follow: then `lag` is null and `lagAtLeast` carries the bound.
//!
//! And `GET .../consumption` (`getConsumptionProgress`): each owned shard's owner and position.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};
use stream_listener::connection::{slot_of, Connection};
use stream_listener::coordinator::projection::GroupProjection;
use stream_listener::lag::{read_group, GroupLag, LagError, LagOptions, LagSource};
use stream_listener::store::GroupStore;

use super::error::ApiError;
use super::AppState;

fn lag_error(e: LagError) -> ApiError {
    let message = e.to_string();
    let (status, code) = match e {
        LagError::UnknownStream { .. } => (StatusCode::NOT_FOUND, "STREAM_NOT_FOUND"),
        LagError::UnknownGroup { .. } => (StatusCode::NOT_FOUND, "GROUP_NOT_FOUND"),
        LagError::InvalidName { .. } => (StatusCode::BAD_REQUEST, "INVALID_NAME"),
        _ => (StatusCode::SERVICE_UNAVAILABLE, "REDIS_UNAVAILABLE"),
    };
    ApiError::new(status, code, message)
}

/// The group's shards as `lag::read_group` reads them and its monitoring projection (`None`: no
/// metadata yet), what both endpoints here start from.
pub(super) async fn lag_and_projection(
    state: &AppState,
    stream: &str,
    group: &str,
) -> Result<(GroupLag, Option<GroupProjection>), ApiError> {
    let mut conn = state.conn.clone();
    let lag = read_group(&mut conn, stream, group, &LagOptions::default())
        .await
        .map_err(lag_error)?;
    let mut store = GroupStore::open(state.conn.clone(), stream, group)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "INVALID_NAME", e.to_string()))?;
    let projection = store.projection().await.map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "STORE_UNAVAILABLE",
            e.to_string(),
        )
    })?;
    Ok((lag, projection))
}

/// What `XINFO STREAM` and `MEMORY USAGE` add to a shard's lag reading, and where the shard lives.
#[derive(Debug, Clone, Default)]
pub(super) struct ShardDetail {
    /// The oldest entry's id.
    pub first_id: Option<String>,
    /// The newest entry's id.
    pub last_id: Option<String>,
    /// The stream's last generated id (beyond `last_id` when entries were deleted).
    pub last_generated_id: Option<String>,
    /// `MEMORY USAGE`; `None` where refused or the stream does not exist.
    pub memory: Option<u64>,
    /// The master serving the key's slot (Redis Cluster only).
    pub node: Option<SlotOwner>,
}

/// A slot range's master, from `CLUSTER SLOTS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SlotOwner {
    /// `host:port`.
    pub endpoint: String,
    /// The node id, where `CLUSTER SLOTS` gives it.
    pub id: Option<String>,
    /// First slot of its range.
    pub start: u16,
    /// Last slot of its range.
    pub end: u16,
}

fn text(v: &redis::Value) -> Option<String> {
    match v {
        redis::Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        redis::Value::SimpleString(s) => Some(s.clone()),
        redis::Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

/// A reply's fields as `(name, value)` pairs: a RESP3 map or a RESP2 flat array.
fn fields(reply: &redis::Value) -> Vec<(String, &redis::Value)> {
    match reply {
        redis::Value::Map(pairs) => pairs
            .iter()
            .filter_map(|(k, v)| Some((text(k)?, v)))
            .collect(),
        redis::Value::Array(flat) => flat
            .chunks(2)
            .filter_map(|kv| Some((text(kv.first()?)?, kv.get(1)?)))
            .collect(),
        _ => Vec::new(),
    }
}

/// `first-entry`, `last-entry` and `last-generated-id` of an `XINFO STREAM` reply.
fn stream_ids(reply: &redis::Value) -> (Option<String>, Option<String>, Option<String>) {
    let (mut first, mut last, mut generated) = (None, None, None);
    let entry_id = |v: &redis::Value| match v {
        redis::Value::Array(entry) => entry.first().and_then(text),
        _ => None,
    };
    for (name, value) in fields(reply) {
        match name.as_str() {
            "first-entry" => first = entry_id(value),
            "last-entry" => last = entry_id(value),
            "last-generated-id" => generated = text(value),
            _ => {}
        }
    }
    (first, last, generated)
}

/// `CLUSTER SLOTS` (`[[start, end, [host, port, id, ..], replicas..], ..]`) as slot owners.
fn slot_owners(reply: &redis::Value) -> Vec<SlotOwner> {
    let redis::Value::Array(ranges) = reply else {
        return Vec::new();
    };
    let int = |v: Option<&redis::Value>| match v {
        Some(redis::Value::Int(n)) => u16::try_from(*n).ok(),
        _ => None,
    };
    ranges
        .iter()
        .filter_map(|range| {
            let redis::Value::Array(range) = range else {
                return None;
            };
            let redis::Value::Array(master) = range.get(2)? else {
                return None;
            };
            let host = text(master.first()?)?;
            let port = int(master.get(1))?;
            Some(SlotOwner {
                endpoint: format!("{host}:{port}"),
                id: master.get(2).and_then(text),
                start: int(range.first())?,
                end: int(range.get(1))?,
            })
        })
        .collect()
}

fn unavailable(e: redis::RedisError) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "REDIS_UNAVAILABLE",
        format!("redis: {e}"),
    )
}

/// Each shard's [`ShardDetail`], in `lag.shards`' order: one pipeline of `XINFO STREAM` and `MEMORY
/// USAGE` for the shards that exist, and on a cluster one `CLUSTER SLOTS`.
pub(super) async fn shard_details(
    state: &AppState,
    lag: &GroupLag,
) -> Result<Vec<ShardDetail>, ApiError> {
    let mut conn = state.conn.clone();
    let mut pipe = redis::pipe();
    for shard in lag.shards.iter().filter(|s| s.exists) {
        pipe.cmd("XINFO").arg("STREAM").arg(&shard.stream_key);
        pipe.cmd("MEMORY").arg("USAGE").arg(&shard.stream_key);
    }
    let replies: Vec<redis::RedisResult<redis::Value>> = if pipe.is_empty() {
        Vec::new()
    } else {
        pipe.query_async(&mut conn).await.map_err(unavailable)?
    };
    let owners = if matches!(state.conn, Connection::Cluster(_)) {
        let reply: redis::Value = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
        slot_owners(&reply)
    } else {
        Vec::new()
    };
    let mut replies = replies.into_iter();
    Ok(lag
        .shards
        .iter()
        .map(|shard| {
            let slot = slot_of(shard.stream_key.as_bytes());
            let node = owners
                .iter()
                .find(|o| (o.start..=o.end).contains(&slot))
                .cloned();
            if !shard.exists {
                return ShardDetail {
                    node,
                    ..ShardDetail::default()
                };
            }
            let info = replies.next().and_then(Result::ok);
            let memory = match replies.next() {
                Some(Ok(redis::Value::Int(n))) => u64::try_from(n).ok(),
                _ => None,
            };
            let (first_id, last_id, last_generated_id) =
                info.as_ref().map(stream_ids).unwrap_or_default();
            ShardDetail {
                first_id,
                last_id,
                last_generated_id,
                memory,
                node,
            }
        })
        .collect())
}

/// A shard's current owner in the projection.
pub(super) fn current_owner(projection: Option<&GroupProjection>, shard: u32) -> Option<&str> {
    projection?
        .shards
        .iter()
        .find(|s| s.shard_index == shard)?
        .current
        .as_deref()
}

/// `StreamShardOffsetsResponse`.
pub async fn offsets(
    State(state): State<Arc<AppState>>,
    Path((stream, group)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let (lag, projection) = lag_and_projection(&state, &stream, &group).await?;
    let details = shard_details(&state, &lag).await?;
    let mut shards = Vec::new();
    let (mut total_memory, mut memory_known) = (0u64, true);
    for (shard, detail) in lag.shards.iter().zip(&details) {
        let key = &shard.stream_key;
        match detail.memory {
            Some(n) => total_memory += n,
            None if shard.exists => memory_known = false,
            None => {}
        }
        let exact = shard.source != LagSource::AtLeast;
        shards.push(json!({
            "shard": { "shardIndex": shard.shard },
            "streamKey": key,
            "redisSlot": slot_of(key.as_bytes()),
            "redisNodeEndpoint": detail.node.as_ref().map(|n| &n.endpoint),
            "streamLength": shard.length,
            "firstRecordId": detail.first_id,
            "lastRecordId": detail.last_id,
            "groupLastDeliveredId": shard.last_delivered_id,
            "pendingCount": shard.pending,
            "lag": exact.then_some(shard.lag),
            "lagAtLeast": (!exact).then_some(shard.lag),
            "memoryUsageBytes": detail.memory,
            "ownerMemberIds": current_owner(projection.as_ref(), shard.shard).into_iter().collect::<Vec<_>>(),
            "draining": shard.shard >= lag.shard_count,
        }));
    }
    Ok(Json(json!({
        "streamPrefix": stream,
        "consumerGroup": group,
        "shards": shards,
        "totalStreamLength": lag.shards.iter().map(|s| s.length).sum::<u64>(),
        "totalPendingCount": lag.pending,
        "totalLag": lag.lag_exact.then_some(lag.lag),
        "totalMemoryUsageBytes": total_memory,
        "memoryUsageKnown": memory_known,
    })))
}

/// `GET .../consumption` (the origin's `getConsumptionProgress`, `ConsumptionProgressResponse`): one row
/// per shard with a current owner (the projection), the group's last delivered id on it and the owner's
/// own pending count there (`XPENDING` summary). `lastAckedId` and `updatedAt` are always `null`: Redis
/// records neither.
pub async fn consumption(
    State(state): State<Arc<AppState>>,
    Path((stream, group)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let (lag, projection) = lag_and_projection(&state, &stream, &group).await?;
    let mut conn = state.conn.clone();
    let Some(projection) = projection else {
        return Ok(Json(json!({ "progress": [] })));
    };
    let mut progress = Vec::new();
    for shard in &lag.shards {
        let Some(owner) = current_owner(Some(&projection), shard.shard).map(str::to_owned) else {
            continue;
        };
        let member = projection.members.iter().find(|m| m.member_id == owner);
        let pending = if shard.has_group {
            let summary: redis::Value = redis::cmd("XPENDING")
                .arg(&shard.stream_key)
                .arg(&group)
                .query_async(&mut conn)
                .await
                .map_err(unavailable)?;
            consumer_pending(&summary, &owner)
        } else {
            0
        };
        progress.push(json!({
            "streamPrefix": stream,
            "consumerGroup": group,
            "memberId": owner,
            "memberName": member.and_then(|m| m.member_name.clone()),
            "memberState": member.map(|m| super::monitor::member_state(m.state)),
            "shard": { "shardIndex": shard.shard },
            "streamKey": shard.stream_key,
            "lastDeliveredId": shard.last_delivered_id,
            "lastAckedId": null,
            "pendingCount": pending,
            "updatedAt": null,
        }));
    }
    Ok(Json(json!({ "progress": progress })))
}

/// `consumer`'s count in an `XPENDING key group` summary (`[count, min, max, [[consumer, n], ..]]`).
fn consumer_pending(summary: &redis::Value, consumer: &str) -> u64 {
    let redis::Value::Array(parts) = summary else {
        return 0;
    };
    let Some(redis::Value::Array(consumers)) = parts.get(3) else {
        return 0;
    };
    consumers
        .iter()
        .filter_map(|c| match c {
            redis::Value::Array(pair) if pair.len() == 2 => {
                Some((text(&pair[0])?, text(&pair[1])?))
            }
            _ => None,
        })
        .find(|(name, _)| name == consumer)
        .and_then(|(_, n)| n.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::Value as V;

    #[test]
    fn a_consumers_count_in_an_xpending_summary() {
        let bulk = |s: &str| V::BulkString(s.as_bytes().to_vec());
        let summary = V::Array(vec![
            V::Int(5),
            bulk("1-0"),
            bulk("9-0"),
            V::Array(vec![
                V::Array(vec![bulk("py-0"), bulk("3")]),
                V::Array(vec![bulk("rust-1"), bulk("2")]),
            ]),
        ]);
        assert_eq!(consumer_pending(&summary, "py-0"), 3);
        assert_eq!(consumer_pending(&summary, "rust-1"), 2);
        assert_eq!(consumer_pending(&summary, "other"), 0);
        let empty = V::Array(vec![V::Int(0), V::Nil, V::Nil, V::Nil]);
        assert_eq!(consumer_pending(&empty, "py-0"), 0);
    }
}
