//! The origin's admin endpoints (group create / get / delete, stream and group `scale`, migrations and
//! rollback), mapped onto the library's topology ([`Topology::ensure`], [`Topology::ensure_group`],
//! [`Topology::resize`], [`Topology::rollback`], [`Topology::history`]) and group store
//! ([`GroupStore::create`], the projection).
//!
//! What differs from the origin, on purpose:
//! * The shard count belongs to the stream, not to a group: every group of a stream follows a resize.
//!   So the group `scale` is answered only when the group is the stream's only one (else `409
//!   SCALE_IS_PER_STREAM`); the stream `scale` is the real operation.
//! * A migration is a resize of the stream; its `reshardingId` is the topology version the resize
//!   produced. Its `state` is mapped from the library's: `DRAINING` while a shrink's removed shards are
//!   still read, `ACTIVE` until the resize's cut (old-layout writes may still arrive), `DEPRECATED` once
//!   past both (the library refuses the next resize until every group has also consumed the old shards
//!   below the cut: that refusal is the authoritative answer), `ROLLED_BACK` when a later rollback undid it.
//! * Only the stream's last migration can be rolled back (`Topology::rollback`): another one is `409
//!   NOT_LATEST_MIGRATION`.
//! * No safe equivalent, answered as errors rather than faked: scaling to zero shards (`501
//!   SCALE_TO_ZERO_UNSUPPORTED`: the library never removes every shard) and deleting a group (`501
//!   GROUP_DELETE_UNSUPPORTED`: the library has no deletion of a group's metadata that keeps its
//!   fencing guarantees for members that may still be running).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use redis::aio::ConnectionLike;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};
use stream_listener::coordinator::metadata::GroupConfig;
use stream_listener::coordinator::wire::{HeartbeatRequest, RuntimeConsumerCapacity};
use stream_listener::store::GroupStore;
use stream_listener::topology::{ResizeEvent, StartFrom, Topology, TopologyError};

use super::error::ApiError;
use super::{auth, monitor, AppState};

/// `CreateStreamRequest` / `CreateGroupRequest`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CreateRequest {
    initial_shard_count: Option<u32>,
    requested_by: String,
    #[allow(dead_code)]
    reason: Option<String>,
}

/// `ScaleStreamRequest` / `ScaleGroupRequest`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ScaleRequest {
    target_shard_count: u32,
    requested_by: String,
    reason: String,
    #[allow(dead_code)]
    deprecated_after: Option<String>,
}

/// `DeleteGroupRequest` and `RollbackMigrationRequest` (`force` only in the first).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct AuditedRequest {
    requested_by: String,
    reason: String,
    #[serde(default)]
    #[allow(dead_code)]
    force: bool,
}

fn malformed(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "MALFORMED_BODY", message)
}

/// The body as `T`: 400 `MALFORMED_BODY` when it is not JSON, misses a required field or has a blank
/// `requestedBy`/`reason`.
/// A `CreateStreamRequest` / `CreateCoordinatorGroupRequest` and its `initialShardCount`, refused when 0.
fn parse_create(
    body: Result<Bytes, BytesRejection>,
) -> Result<(CreateRequest, Option<u32>), ApiError> {
    let req: CreateRequest = parse(body)?;
    match req.initial_shard_count {
        Some(0) => Err(malformed("initialShardCount must be at least 1")),
        count => Ok((req, count)),
    }
}

fn parse<T: DeserializeOwned>(body: Result<Bytes, BytesRejection>) -> Result<T, ApiError> {
    let body = body.map_err(|e| ApiError::new(e.status(), "MALFORMED_BODY", e.body_text()))?;
    let value: Value = serde_json::from_slice(&body)
        .map_err(|e| malformed(format!("the body is not JSON: {e}")))?;
    for field in ["requestedBy", "reason"] {
        if value
            .get(field)
            .and_then(Value::as_str)
            .is_some_and(|s| s.trim().is_empty())
        {
            return Err(malformed(format!("{field} must not be blank")));
        }
    }
    serde_json::from_value(value).map_err(|e| malformed(format!("the body does not fit: {e}")))
}

fn redis_error(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "REDIS_UNAVAILABLE",
        format!("redis: {e}"),
    )
}

/// The library's topology errors as the origin's statuses.
fn topology_error(e: TopologyError) -> ApiError {
    let message = e.to_string();
    let (status, code) = match e {
        TopologyError::InvalidPrefix(_) => (StatusCode::BAD_REQUEST, "INVALID_STREAM"),
        TopologyError::ZeroShards => (StatusCode::BAD_REQUEST, "ZERO_SHARDS"),
        TopologyError::Missing { .. } => (StatusCode::NOT_FOUND, "STREAM_NOT_FOUND"),
        TopologyError::ShardCountMismatch { .. } => (StatusCode::CONFLICT, "SHARD_COUNT_MISMATCH"),
        TopologyError::NothingToRollBack { .. } => (StatusCode::CONFLICT, "NOTHING_TO_ROLL_BACK"),
        TopologyError::Concurrent { .. } => (StatusCode::CONFLICT, "CONCURRENT_RESIZE"),
        TopologyError::MigrationInProgress { .. } => {
            (StatusCode::CONFLICT, "MIGRATION_IN_PROGRESS")
        }
        TopologyError::Redis(e) => return redis_error(e),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "TOPOLOGY_ERROR"),
    };
    ApiError::new(status, code, message)
}

fn invalid_name(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "INVALID_NAME", e.to_string())
}

/// The topology of `stream`, or `None` when it has none.
async fn topology_of(
    conn: &mut (impl ConnectionLike + Send),
    stream: &str,
) -> Result<Option<Topology>, ApiError> {
    match Topology::load(conn, stream).await {
        Ok(t) => Ok(Some(t)),
        Err(TopologyError::Missing { .. }) => Ok(None),
        Err(e) => Err(topology_error(e)),
    }
}

/// The consumer groups on shard 0 of the stream (every group reads every shard).
async fn consumer_groups(
    conn: &mut (impl ConnectionLike + Send),
    topology: &Topology,
) -> Result<Vec<String>, ApiError> {
    let key = topology.stream_key(0);
    let exists: bool = redis::cmd("EXISTS")
        .arg(&key)
        .query_async(conn)
        .await
        .map_err(redis_error)?;
    if !exists {
        return Ok(Vec::new());
    }
    let groups: redis::Value = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(&key)
        .query_async(conn)
        .await
        .map_err(redis_error)?;
    Ok(stream_listener::reply::xinfo_groups(&groups)
        .map_err(redis_error)?
        .into_iter()
        .map(|g| g.name)
        .collect())
}

/// Redis time, ms.
async fn redis_ms(conn: &mut (impl ConnectionLike + Send)) -> Result<u64, ApiError> {
    let (secs, micros): (u64, u64) = redis::cmd("TIME")
        .query_async(conn)
        .await
        .map_err(redis_error)?;
    Ok(secs * 1000 + micros / 1000)
}

/// The origin's `MigrationState` of the resize that produced `version` (see the module docs).
fn migration_state(
    version: u64,
    topology: &Topology,
    history: &[ResizeEvent],
    now_ms: u64,
) -> &'static str {
    let rolled_back = history
        .iter()
        .any(|e| e.event == "ROLLED_BACK" && e.version == version + 1);
    if rolled_back {
        return "ROLLED_BACK";
    }
    let current = topology.version() == version;
    match topology.migration() {
        Some(_) if current && !topology.draining_shards().is_empty() => "DRAINING",
        Some(m) if current && now_ms < m.cut_ms() => "ACTIVE",
        _ => "DEPRECATED",
    }
}

/// The origin's `Migration` of one resize event.
fn migration_json(
    event: &ResizeEvent,
    topology: &Topology,
    history: &[ResizeEvent],
    now_ms: u64,
) -> Value {
    let at = auth::rfc3339(event.at_ms / 1000);
    let updated = history
        .iter()
        .filter(|e| e.version > event.version)
        .map(|e| e.at_ms)
        .min()
        .map_or_else(|| at.clone(), |ms| auth::rfc3339(ms / 1000));
    json!({
        "reshardingId": event.version.to_string(),
        "fromShardCount": event.from,
        "toShardCount": event.to,
        "state": migration_state(event.version, topology, history, now_ms),
        "kind": if event.event == "ROLLED_BACK" { "ROLLBACK" } else { "RESIZE" },
        "createdAt": at,
        "updatedAt": updated,
    })
}

/// The resize events of the stream (`RESIZED`, `ROLLED_BACK`), oldest first.
async fn resizes(
    conn: &mut (impl ConnectionLike + Send),
    stream: &str,
) -> Result<Vec<ResizeEvent>, ApiError> {
    Ok(Topology::history(conn, stream, 1000)
        .await
        .map_err(topology_error)?
        .into_iter()
        .filter(|e| e.event == "RESIZED" || e.event == "ROLLED_BACK")
        .collect())
}

/// The `Migration` of the resize that produced the topology's current version.
async fn current_migration(
    conn: &mut (impl ConnectionLike + Send),
    topology: &Topology,
) -> Result<Option<Value>, ApiError> {
    let history = resizes(conn, topology.prefix()).await?;
    let now = redis_ms(conn).await?;
    Ok(history
        .iter()
        .find(|e| e.version == topology.version())
        .map(|e| migration_json(e, topology, &history, now)))
}

/// `GroupResponse` of a group: the projection's view, or (metadata not written yet, no member ever
/// joined) an `EMPTY` group with zero epochs; `activeMigration` the current resize while it is not done.
async fn group_response(
    state: &AppState,
    stream: &str,
    group: &str,
    topology: &Topology,
) -> Result<Option<Value>, ApiError> {
    let mut store = GroupStore::open(state.conn.clone(), stream, group).map_err(invalid_name)?;
    let projection = store.projection().await.map_err(redis_error)?;
    let mut conn = state.conn.clone();
    let mut body = match projection {
        Some(p) => monitor::group(stream, &p),
        None => return Ok(None),
    };
    let active = current_migration(&mut conn, topology)
        .await?
        .filter(|m| m["state"] == "ACTIVE" || m["state"] == "DRAINING");
    body["activeMigration"] = active.unwrap_or(Value::Null);
    body["topologyVersion"] = json!(topology.version());
    Ok(Some(body))
}

fn group_not_found(stream: &str, group: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "GROUP_NOT_FOUND",
        format!("group {group:?} of stream {stream:?} has no metadata"),
    )
}

fn stream_not_found(stream: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "STREAM_NOT_FOUND",
        format!("stream {stream:?} has no topology"),
    )
}

/// `POST /coord/v1/streams/{stream}` (`createStreamGroup`): the stream's topology and its empty shard
/// streams ([`Topology::ensure`]). 409 `STREAM_EXISTS` when it has one.
pub async fn create_stream(
    State(state): State<Arc<AppState>>,
    Path(stream): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (req, count) = parse_create(body)?;
    let count = count.ok_or_else(|| {
        malformed("initialShardCount is required: this server has no default shard count")
    })?;
    let mut conn = state.conn.clone();
    if let Some(t) = topology_of(&mut conn, &stream).await? {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "STREAM_EXISTS",
            format!(
                "stream {stream:?} already has a topology ({} shards, version {})",
                t.shard_count(),
                t.version()
            ),
        ));
    }
    let topology = Topology::ensure(&mut conn, &stream, count)
        .await
        .map_err(topology_error)?;
    tracing::info!(stream = %stream, shards = count, requested_by = %req.requested_by, "stream created");
    Ok((
        StatusCode::CREATED,
        Json(json!({
            "streamPrefix": stream,
            "shardCount": topology.shard_count(),
            "metadataVersion": topology.version(),
        })),
    )
        .into_response())
}

/// `POST /coord/v1/streams/{stream}/groups/{group}` (`createCoordinatorGroup`): the topology if the
/// stream has none (`initialShardCount` then required), the consumer group on every shard from the
/// start ([`Topology::ensure_group`]), and the group's metadata with the library's default timings, by a
/// [`GroupStore::create`] handle whose join and leave are its first writes (the library writes a group's
/// metadata on a member's first heartbeat; the audit shows that member, `serve-create`). 409
/// `GROUP_EXISTS` when the group has metadata.
pub async fn create_group(
    State(state): State<Arc<AppState>>,
    Path((stream, group)): Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (req, initial_shard_count) = parse_create(body)?;
    let mut open = GroupStore::open(state.conn.clone(), &stream, &group).map_err(invalid_name)?;
    if open.projection().await.map_err(redis_error)?.is_some() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "GROUP_EXISTS",
            format!("group {group:?} of stream {stream:?} already exists"),
        ));
    }
    let mut conn = state.conn.clone();
    // The stream's topology, created here when it has none.
    match (topology_of(&mut conn, &stream).await?, initial_shard_count) {
        (Some(t), Some(n)) if t.shard_count() != n => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "SHARD_COUNT_MISMATCH",
                format!(
                    "stream {stream:?} has {} shards, not {n}: the shard count belongs to the stream (use its scale)",
                    t.shard_count()
                ),
            ))
        }
        (Some(_), _) => {}
        (None, Some(n)) => {
            Topology::ensure(&mut conn, &stream, n)
                .await
                .map_err(topology_error)?;
        }
        (None, None) => {
            return Err(malformed(format!(
                "stream {stream:?} has no topology yet: initialShardCount is required"
            )))
        }
    }
    let topology = Topology::ensure_group(&mut conn, &stream, &group, StartFrom::Earliest)
        .await
        .map_err(topology_error)?;
    let mut store = GroupStore::create(
        state.conn.clone(),
        &stream,
        &group,
        topology.shard_count(),
        GroupConfig::default(),
    )
    .map_err(invalid_name)?;
    let creator = format!("serve-create-{}", state.settings.server_id);
    let mut join = HeartbeatRequest {
        protocol_version: 1,
        request_id: format!("{creator}-join"),
        member_id: creator.clone(),
        member_name: Some("serve-create".into()),
        member_epoch: 0,
        metadata_version: 0,
        runtime_consumer_capacity: RuntimeConsumerCapacity::default(),
        owned_shards: Some(vec![]),
        revoking_shards: vec![],
        shard_progress: vec![],
        weight: None,
        restarting: false,
        hold_after_lease_ms: 0,
    };
    store.heartbeat(&join).await.map_err(redis_error)?;
    join.member_epoch = -1;
    join.request_id = format!("{creator}-leave");
    store.heartbeat(&join).await.map_err(redis_error)?;
    tracing::info!(stream = %stream, group = %group, requested_by = %req.requested_by, "group created");
    let body = group_response(&state, &stream, &group, &topology)
        .await?
        .ok_or_else(|| group_not_found(&stream, &group))?;
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// `GET /coord/v1/streams/{stream}/groups/{group}` (`getCoordinatorGroup`).
pub async fn get_group(
    State(state): State<Arc<AppState>>,
    Path((stream, group)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let mut conn = state.conn.clone();
    let topology = topology_of(&mut conn, &stream)
        .await?
        .ok_or_else(|| stream_not_found(&stream))?;
    group_response(&state, &stream, &group, &topology)
        .await?
        .map(Json)
        .ok_or_else(|| group_not_found(&stream, &group))
}

/// `DELETE /coord/v1/streams/{stream}/groups/{group}` (`deleteCoordinatorGroup`): no safe equivalent in
/// the library, so `501 GROUP_DELETE_UNSUPPORTED` (after the body and the group were checked).
pub async fn delete_group(
    State(state): State<Arc<AppState>>,
    Path((stream, group)): Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let _req: AuditedRequest = parse(body)?;
    let mut store = GroupStore::open(state.conn.clone(), &stream, &group).map_err(invalid_name)?;
    if store.projection().await.map_err(redis_error)?.is_none() {
        return Err(group_not_found(&stream, &group));
    }
    Err(ApiError::new(
        StatusCode::NOT_IMPLEMENTED,
        "GROUP_DELETE_UNSUPPORTED",
        "stream-listener has no deletion of a group's metadata that keeps its guarantees for members that \
         may still run (a deleted group is recreated by the next heartbeat of a Rust member, with fresh epochs \
         that no longer fence the old owners): stop every member, then remove the group's keys by hand",
    ))
}

/// Resizes the stream to `target` (the scale endpoints' common part): its `Migration` and the topology.
async fn scale(
    state: &AppState,
    stream: &str,
    req: &ScaleRequest,
) -> Result<(Value, Vec<String>), ApiError> {
    if req.target_shard_count == 0 {
        return Err(ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "SCALE_TO_ZERO_UNSUPPORTED",
            "stream-listener never removes every shard of a stream: scale to at least 1",
        ));
    }
    let mut conn = state.conn.clone();
    let current = topology_of(&mut conn, stream)
        .await?
        .ok_or_else(|| stream_not_found(stream))?;
    if current.shard_count() == req.target_shard_count {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "SHARD_COUNT_UNCHANGED",
            format!(
                "stream {stream:?} already has {} shards",
                current.shard_count()
            ),
        ));
    }
    let groups = consumer_groups(&mut conn, &current).await?;
    let topology = Topology::resize_with_grace(
        &mut conn,
        stream,
        req.target_shard_count,
        state.settings.resize_grace,
    )
    .await
    .map_err(topology_error)?;
    tracing::info!(
        stream = %stream, from = current.shard_count(), to = topology.shard_count(),
        requested_by = %req.requested_by, reason = %req.reason, "stream resized"
    );
    let migration = current_migration(&mut conn, &topology)
        .await?
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "AUDIT_MISSING",
                "the resize is done but its audit event is not found",
            )
        })?;
    Ok((migration, groups))
}

/// `POST /coord/v1/streams/{stream}/scale` (`scaleStreamShards`): [`Topology::resize`]; every group
/// follows. `202 StreamScaleResponse`.
pub async fn scale_stream(
    State(state): State<Arc<AppState>>,
    Path(stream): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: ScaleRequest = parse(body)?;
    let (migration, groups) = scale(&state, &stream, &req).await?;
    let migrations: Vec<Value> = groups
        .iter()
        .map(|g| {
            let mut m = migration.clone();
            m["consumerGroup"] = json!(g);
            m
        })
        .collect();
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({
            "streamPrefix": stream,
            "targetShardCount": req.target_shard_count,
            "affectedConsumerGroups": groups,
            "migrations": migrations,
        })),
    )
        .into_response())
}

/// `POST /coord/v1/streams/{stream}/groups/{group}/scale` (`startGroupResharding`): the stream's resize,
/// answered only when `group` is the stream's only consumer group (409 `SCALE_IS_PER_STREAM` otherwise:
/// here the shard count is the stream's). `202 Migration`.
pub async fn scale_group(
    State(state): State<Arc<AppState>>,
    Path((stream, group)): Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: ScaleRequest = parse(body)?;
    let mut conn = state.conn.clone();
    let topology = topology_of(&mut conn, &stream)
        .await?
        .ok_or_else(|| stream_not_found(&stream))?;
    let groups = consumer_groups(&mut conn, &topology).await?;
    if !groups.contains(&group) {
        return Err(group_not_found(&stream, &group));
    }
    if groups.len() > 1 {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "SCALE_IS_PER_STREAM",
            format!(
                "the shard count belongs to stream {stream:?}, read by the groups {groups:?}: scale the stream \
                 (POST /coord/v1/streams/{stream}/scale), every group follows"
            ),
        ));
    }
    let (mut migration, _) = scale(&state, &stream, &req).await?;
    migration["consumerGroup"] = json!(group);
    Ok((StatusCode::ACCEPTED, Json(migration)).into_response())
}

fn migration_id(id: &str) -> Result<u64, ApiError> {
    id.parse().map_err(|_| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "MIGRATION_NOT_FOUND",
            format!("no migration {id:?}: ids are topology versions"),
        )
    })
}

/// `GET .../groups/{group}/migrations/{id}` (`getReshardingMigration`).
pub async fn get_migration(
    State(state): State<Arc<AppState>>,
    Path((stream, _group, id)): Path<(String, String, String)>,
) -> Result<Json<Value>, ApiError> {
    let version = migration_id(&id)?;
    let mut conn = state.conn.clone();
    let topology = topology_of(&mut conn, &stream)
        .await?
        .ok_or_else(|| stream_not_found(&stream))?;
    let history = resizes(&mut conn, &stream).await?;
    let now = redis_ms(&mut conn).await?;
    history
        .iter()
        .find(|e| e.version == version)
        .map(|e| Json(migration_json(e, &topology, &history, now)))
        .ok_or_else(|| migration_id("-").unwrap_err())
}

/// `GET /coord/v1/monitoring/streams/{stream}/groups/{group}/migrations` (`listReshardingMigrations`).
pub async fn list_migrations(
    State(state): State<Arc<AppState>>,
    Path((stream, _group)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let mut conn = state.conn.clone();
    let topology = topology_of(&mut conn, &stream)
        .await?
        .ok_or_else(|| stream_not_found(&stream))?;
    let history = resizes(&mut conn, &stream).await?;
    let now = redis_ms(&mut conn).await?;
    let migrations: Vec<Value> = history
        .iter()
        .map(|e| migration_json(e, &topology, &history, now))
        .collect();
    let active = migrations
        .iter()
        .find(|m| m["state"] == "ACTIVE" || m["state"] == "DRAINING")
        .map(|m| m["reshardingId"].clone());
    Ok(Json(json!({
        "migrations": migrations,
        "activeReshardingId": active.unwrap_or(Value::Null),
    })))
}

/// `POST .../migrations/{id}/rollback` (`rollbackReshardingMigration`): [`Topology::rollback`] of the
/// stream's last resize, which must be `id` (409 `NOT_LATEST_MIGRATION` otherwise). `202 Migration`: the
/// one rolled back, `ROLLING_BACK`, with the rollback's own id.
pub async fn rollback(
    State(state): State<Arc<AppState>>,
    Path((stream, _group, id)): Path<(String, String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: AuditedRequest = parse(body)?;
    let version = migration_id(&id)?;
    let mut conn = state.conn.clone();
    let topology = topology_of(&mut conn, &stream)
        .await?
        .ok_or_else(|| stream_not_found(&stream))?;
    let history = resizes(&mut conn, &stream).await?;
    let Some(event) = history.iter().find(|e| e.version == version).cloned() else {
        return Err(migration_id("-").unwrap_err());
    };
    let latest = topology.version() == version && topology.migration().is_some();
    if !latest {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "NOT_LATEST_MIGRATION",
            format!(
                "only the stream's last migration ({}) can be rolled back",
                topology.version()
            ),
        ));
    }
    let after = Topology::rollback_with_grace(&mut conn, &stream, state.settings.resize_grace)
        .await
        .map_err(topology_error)?;
    tracing::info!(
        stream = %stream, migration = version, requested_by = %req.requested_by, reason = %req.reason,
        "migration rolled back"
    );
    let now = redis_ms(&mut conn).await?;
    let mut body = migration_json(&event, &after, &history, now);
    body["state"] = json!("ROLLING_BACK");
    body["rollbackReshardingId"] = json!(after.version().to_string());
    Ok((StatusCode::ACCEPTED, Json(body)).into_response())
}
