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
use stream_listener::connection::slot_of;
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

/// The first id of an `XRANGE`/`XREVRANGE ... COUNT 1` reply.
fn first_id(reply: &redis::Value) -> Option<String> {
    let redis::Value::Array(entries) = reply else {
        return None;
    };
    let redis::Value::Array(entry) = entries.first()? else {
        return None;
    };
    match entry.first()? {
        redis::Value::BulkString(id) => String::from_utf8(id.clone()).ok(),
        redis::Value::SimpleString(id) => Some(id.clone()),
        _ => None,
    }
}

/// The group's shards as `lag::read_group` reads them and its monitoring projection (`None`: no
/// metadata yet), what both endpoints here start from.
async fn lag_and_projection(
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

/// `StreamShardOffsetsResponse`.
pub async fn offsets(
    State(state): State<Arc<AppState>>,
    Path((stream, group)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let (lag, projection) = lag_and_projection(&state, &stream, &group).await?;
    let mut conn = state.conn.clone();
    let owner = |shard: u32| -> Vec<String> {
        projection
            .as_ref()
            .and_then(|p| p.shards.iter().find(|s| s.shard_index == shard))
            .and_then(|s| s.current.clone())
            .into_iter()
            .collect()
    };
    let mut shards = Vec::new();
    let (mut total_memory, mut memory_known) = (0u64, true);
    for shard in &lag.shards {
        let key = &shard.stream_key;
        let mut pipe = redis::pipe();
        pipe.cmd("XRANGE")
            .arg(key)
            .arg("-")
            .arg("+")
            .arg("COUNT")
            .arg(1);
        pipe.cmd("XREVRANGE")
            .arg(key)
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(1);
        pipe.cmd("MEMORY").arg("USAGE").arg(key);
        let replies: Vec<redis::RedisResult<redis::Value>> =
            pipe.query_async(&mut conn).await.map_err(|e| {
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "REDIS_UNAVAILABLE",
                    format!("redis: {e}"),
                )
            })?;
        let reply = |i: usize| replies.get(i).and_then(|r| r.as_ref().ok());
        let memory = match reply(2) {
            Some(redis::Value::Int(n)) => u64::try_from(*n).ok(),
            _ => None,
        };
        match memory {
            Some(n) => total_memory += n,
            None if shard.exists => memory_known = false,
            None => {}
        }
        let exact = shard.source != LagSource::AtLeast;
        shards.push(json!({
            "shard": { "shardIndex": shard.shard },
            "streamKey": key,
            "redisSlot": slot_of(key.as_bytes()),
            "redisNodeEndpoint": null,
            "streamLength": shard.length,
            "firstRecordId": reply(0).and_then(first_id),
            "lastRecordId": reply(1).and_then(first_id),
            "groupLastDeliveredId": shard.last_delivered_id,
            "pendingCount": shard.pending,
            "lag": exact.then_some(shard.lag),
            "lagAtLeast": (!exact).then_some(shard.lag),
            "memoryUsageBytes": memory,
            "ownerMemberIds": owner(shard.shard),
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
        let Some(owner) = projection
            .shards
            .iter()
            .find(|s| s.shard_index == shard.shard)
            .and_then(|s| s.current.clone())
        else {
            continue;
        };
        let member = projection.members.iter().find(|m| m.member_id == owner);
        let pending = if shard.has_group {
            let summary: redis::Value = redis::cmd("XPENDING")
                .arg(&shard.stream_key)
                .arg(&group)
                .query_async(&mut conn)
                .await
                .map_err(|e| {
                    ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "REDIS_UNAVAILABLE",
                        format!("redis: {e}"),
                    )
                })?;
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
    let text = |v: &redis::Value| match v {
        redis::Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        redis::Value::SimpleString(s) => Some(s.clone()),
        redis::Value::Int(n) => Some(n.to_string()),
        _ => None,
    };
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
