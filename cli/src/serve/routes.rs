//! The router: the endpoints, and around every request a tracing span, an access log line (method, path,
//! status, duration: never a header, a query string or a body, so never a credential), the body limit
//! and the timeout.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, MatchedPath, Path, Request, State};
use axum::http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::Value;
use stream_listener::connection::slot_of;
use stream_listener::coordinator::wire::HeartbeatResponse;
use stream_listener::store::{GroupStore, StoreError};
use stream_listener::topology::{Topology, TopologyError};
use tracing::Instrument as _;

use super::error::ApiError;
use super::{adapt, admin, auth, grafana, grant, messages, monitor, offsets, origin, AppState};

/// Every route of the API this server speaks.
pub fn router(state: Arc<AppState>) -> Router {
    let limit = state.settings.body_limit;
    Router::new()
        .route("/coord/v1/monitoring/health", get(health))
        .route(
            "/coord/v1/streams/{stream}/groups/{group}/members/{member}/heartbeat",
            post(heartbeat),
        )
        .route(
            "/coord/v1/streams/{stream}/groups/{group}/producer-routing",
            get(producer_routing),
        )
        .route("/coord/v1/auth/login", post(login))
        .route("/coord/v1/openapi.json", get(openapi))
        .route("/metrics", get(metrics))
        .route(
            "/coord/v1/monitoring/streams/{stream}/groups/{group}",
            get(monitoring_group),
        )
        .route(
            "/coord/v1/monitoring/streams/{stream}/groups/{group}/members",
            get(monitoring_members),
        )
        .route(
            "/coord/v1/monitoring/streams/{stream}/groups/{group}/assignments",
            get(monitoring_assignments),
        )
        .route("/coord/v1/streams/{stream}", post(admin::create_stream))
        .route(
            "/coord/v1/streams/{stream}/groups/{group}",
            post(admin::create_group)
                .get(admin::get_group)
                .delete(admin::delete_group),
        )
        .route(
            "/coord/v1/streams/{stream}/scale",
            post(admin::scale_stream),
        )
        .route(
            "/coord/v1/streams/{stream}/groups/{group}/scale",
            post(admin::scale_group),
        )
        .route(
            "/coord/v1/streams/{stream}/groups/{group}/migrations/{id}",
            get(admin::get_migration),
        )
        .route(
            "/coord/v1/streams/{stream}/groups/{group}/migrations/{id}/rollback",
            post(admin::rollback),
        )
        .route(
            "/coord/v1/monitoring/streams/{stream}/groups/{group}/migrations",
            get(admin::list_migrations),
        )
        .route(
            "/coord/v1/monitoring/streams/{stream}/groups/{group}/offsets",
            get(offsets::offsets),
        )
        .route(
            "/coord/v1/monitoring/streams/{stream}/groups/{group}/consumption",
            get(offsets::consumption),
        )
        .route("/coord/v1/monitoring/session", get(origin::session))
        .route(
            "/coord/v1/monitoring/compatibility",
            get(origin::compatibility),
        )
        .route("/coord/v1/monitoring/groups", get(origin::groups))
        .route(
            "/coord/v1/monitoring/streams/{stream}/groups/{group}/shards/{shard}/messages",
            get(messages::shard_page),
        )
        .route("/coord/v1/monitoring/grafana/groups", get(grafana::groups))
        .route(
            "/coord/v1/monitoring/grafana/options/streams",
            get(grafana::stream_options),
        )
        .route(
            "/coord/v1/monitoring/grafana/options/consumer-groups",
            get(grafana::consumer_group_options),
        )
        .route(
            "/coord/v1/monitoring/grafana/options/shards",
            get(grafana::shard_options),
        )
        .route(
            "/coord/v1/monitoring/grafana/members",
            get(grafana::members),
        )
        .route("/coord/v1/monitoring/grafana/shards", get(grafana::shards))
        .route(
            "/coord/v1/monitoring/grafana/assignments",
            get(grafana::assignments),
        )
        .route(
            "/coord/v1/monitoring/grafana/messages",
            get(messages::grafana),
        )
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), authorize))
        .layer(middleware::from_fn_with_state(state.clone(), around))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

/// The span, the timeout and the access log of one request.
async fn around(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let method = req.method().clone();
    // The path only: a query string could carry a token.
    let path = req.uri().path().to_string();
    // The route's template for the metrics' label (bounded: never the path itself).
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |m| m.as_str().to_string());
    let span = tracing::info_span!("request", %method, path = %path);
    let started = Instant::now();
    let timeout = state.settings.request_timeout;
    let response = async {
        match tokio::time::timeout(timeout, next.run(req)).await {
            Ok(response) => response,
            Err(_) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "TIMEOUT",
                format!("no answer within {} ms", timeout.as_millis()),
            )
            .into_response(),
        }
    }
    .instrument(span.clone())
    .await;
    let status = response.status().as_u16().to_string();
    let labels = [
        ("method", method.to_string()),
        ("route", route),
        ("status", status),
    ];
    metrics::counter!("stream_listener_serve_requests_total", &labels).increment(1);
    metrics::histogram!(
        "stream_listener_serve_request_duration_seconds",
        &labels[..2]
    )
    .record(started.elapsed().as_secs_f64());
    span.in_scope(|| {
        tracing::info!(
            target: "stream_listener::serve::access",
            status = response.status().as_u16(),
            elapsed_ms = started.elapsed().as_secs_f64() * 1000.0,
            "{method} {path}"
        );
    });
    response
}

/// Unix seconds now (token expiry; the server's own clock).
fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// 401 with an empty body and the challenges, as the origin answers.
fn unauthorized() -> Response {
    Response::builder()
        .status(StatusCode::UNAUTHORIZED)
        .header(WWW_AUTHENTICATE, r#"Basic realm="stream-listener""#)
        .header(WWW_AUTHENTICATE, r#"Bearer realm="stream-listener""#)
        .body(Body::empty())
        .expect("a valid response")
}

/// The role check of `auth.rs` (nothing when no user is configured).
async fn authorize(State(state): State<Arc<AppState>>, mut req: Request, next: Next) -> Response {
    let Some(auth) = &state.auth else {
        return next.run(req).await;
    };
    let Some(required) = auth::required_role(
        req.uri().path(),
        req.method().as_str(),
        auth.authenticate_heartbeats,
    ) else {
        return next.run(req).await;
    };
    let header = req
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let Some(claims) = auth.authenticate(header, now_secs()) else {
        return unauthorized();
    };
    if !claims.roles.iter().any(|r| r.grants(required)) {
        return ApiError::new(
            StatusCode::FORBIDDEN,
            "FORBIDDEN",
            format!("{} needs the role {required:?}", req.uri().path()),
        )
        .into_response();
    }
    // Who is calling, for `/monitoring/session`.
    req.extensions_mut().insert(claims);
    next.run(req).await
}

/// `POST /coord/v1/auth/login`: `{username, password}` (or Basic) -> a signed token.
async fn login(
    State(state): State<Arc<AppState>>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Response {
    let Some(auth) = &state.auth else {
        return ApiError::new(
            StatusCode::NOT_FOUND,
            "AUTH_DISABLED",
            "no user is configured: nothing needs a login",
        )
        .into_response();
    };
    let now = now_secs();
    let from_body = serde_json::from_slice::<Value>(&body).ok().and_then(|v| {
        let name = v.get("username")?.as_str()?.to_string();
        let password = v.get("password")?.as_str()?.to_string();
        Some((name, password))
    });
    let user = match &from_body {
        Some((name, password)) => auth.check_password(name, password).cloned(),
        None => auth
            .authenticate(
                headers.get(AUTHORIZATION).and_then(|v| v.to_str().ok()),
                now,
            )
            .filter(|_| {
                headers
                    .get(AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.to_ascii_lowercase().starts_with("basic "))
            })
            .and_then(|claims| auth.check_user(&claims.sub).cloned()),
    };
    let Some(user) = user else {
        return unauthorized();
    };
    let (token, claims) = auth.issue(&user, now);
    Json(serde_json::json!({
        "accessToken": token,
        "tokenType": "Bearer",
        "expiresAt": auth::rfc3339(claims.exp),
        "expiresInSeconds": claims.exp - now,
        "roles": claims.roles,
    }))
    .into_response()
}

/// The OpenAPI 3.1 document of what this server serves.
async fn openapi() -> Response {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        include_str!("openapi.json"),
    )
        .into_response()
}

/// `GET /metrics`: the library's metrics (those of the code it runs: the store's totals, the topology's
/// stale writes) and the server's own (`stream_listener_serve_requests_total`
/// by method, route template and status; `stream_listener_serve_request_duration_seconds` by method and
/// route), Prometheus text. `READ` when users are configured (Prometheus scrapes with Basic).
async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    // The library's store totals of this process (every heartbeat and admin write goes through a
    // `GroupStore`), as a member's runtime publishes them.
    use stream_listener::metrics as m;
    let stats = stream_listener::store::stats();
    metrics::counter!(m::STORE_COMMITS).absolute(stats.commits);
    metrics::counter!(m::STORE_CONFLICTS).absolute(stats.conflicts);
    metrics::counter!(m::STORE_LOADS).absolute(stats.loads);
    metrics::counter!(m::STORE_LOCK_WAITS).absolute(stats.lock_waits);
    match &state.metrics {
        Some(render) => (
            [(
                axum::http::header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            (render.0)(),
        )
            .into_response(),
        None => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "METRICS_UNAVAILABLE",
            "no metrics recorder could be installed in this process",
        )
        .into_response(),
    }
}

/// The group's monitoring projection, from a fresh load (an `open` handle: never creates the group).
pub(super) async fn projection(
    state: &AppState,
    stream: &str,
    group: &str,
) -> Result<stream_listener::coordinator::projection::GroupProjection, ApiError> {
    let mut store = GroupStore::open(state.conn.clone(), stream, group)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "INVALID_NAME", e.to_string()))?;
    match store.projection().await {
        Ok(Some(projection)) => Ok(projection),
        Ok(None) => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "GROUP_NOT_FOUND",
            format!("group {group:?} of stream {stream:?} has no metadata"),
        )),
        Err(e) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "STORE_UNAVAILABLE",
            e.to_string(),
        )),
    }
}

/// `GET /coord/v1/monitoring/streams/{stream}/groups/{group}`.
async fn monitoring_group(
    State(state): State<Arc<AppState>>,
    Path((stream, group)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let p = projection(&state, &stream, &group).await?;
    Ok(Json(monitor::group(&stream, &p)))
}

/// `GET .../members`.
async fn monitoring_members(
    State(state): State<Arc<AppState>>,
    Path((stream, group)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let p = projection(&state, &stream, &group).await?;
    Ok(Json(monitor::members(&p)))
}

/// `GET .../assignments`.
async fn monitoring_assignments(
    State(state): State<Arc<AppState>>,
    Path((stream, group)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let p = projection(&state, &stream, &group).await?;
    Ok(Json(monitor::assignments(&p)))
}

async fn not_found(req: Request<Body>) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "NOT_FOUND",
        format!("no route for {} {}", req.method(), req.uri().path()),
    )
}

/// `GET /coord/v1/monitoring/health`: the origin's `HealthResponse`; 503 when Redis does not answer a
/// `PING` within a second (a readiness probe can use it).
async fn health(State(state): State<Arc<AppState>>) -> Response {
    let mut conn = state.conn.clone();
    let ping = tokio::time::timeout(
        Duration::from_secs(1),
        redis::cmd("PING").query_async::<String>(&mut conn),
    )
    .await;
    let redis_up = matches!(ping, Ok(Ok(_)));
    let body = serde_json::json!({
        "status": if redis_up { "UP" } else { "DOWN" },
        "coordinatorId": state.settings.server_id,
        "redis": if redis_up { "UP" } else { "DOWN" },
        "loop": "UP",
    });
    let status = if redis_up {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

/// `POST .../members/{member}/heartbeat`: always `200` with a complete `HeartbeatResponse` once the body
/// is JSON (the Python client dies on anything else); see `adapt.rs` and `grant.rs`.
async fn heartbeat(
    State(state): State<Arc<AppState>>,
    Path((stream, group, member)): Path<(String, String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<HeartbeatResponse>, ApiError> {
    let body = body.map_err(|e| ApiError::new(e.status(), "MALFORMED_BODY", e.body_text()))?;
    let body: Value = serde_json::from_slice(&body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "MALFORMED_BODY",
            format!("the body is not JSON: {e}"),
        )
    })?;
    let handles = state.handles(&stream, &group);
    let req = match adapt::request(&body, &member) {
        Ok(mut req) => {
            // Whatever the body says: this member reads without self-fencing (see grant.rs, ARCHITECTURE).
            req.hold_after_lease_ms = state.settings.hold_after_lease_ms;
            req
        }
        Err(refusal) => {
            tracing::warn!(member = %member, status = ?refusal.status, "heartbeat refused: {}", refusal.reason);
            return Ok(Json(adapt::refused(&refusal, &member, handles.timings())));
        }
    };
    let mut store = match handles.take(&state, &stream, &group).await {
        Ok(store) => store,
        Err(StoreError::InvalidName(name)) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "INVALID_NAME",
                format!(
                    "invalid name {name:?}: must be non-empty and contain no '{{', '}}' or '/'"
                ),
            ))
        }
        Err(e) => {
            tracing::warn!(member = %member, "heartbeat not applied: {e}");
            return Ok(Json(adapt::retry(&req, handles.timings())));
        }
    };
    // The store gets most of the request's time; what is left answers RETRY before the request times out.
    let budget = state.settings.request_timeout.mul_f64(0.8);
    let answer = match tokio::time::timeout(budget, store.heartbeat(&req)).await {
        Ok(Ok(response)) => {
            handles.put_back(store);
            handles.saw(adapt::Timings::of(&response));
            response
        }
        Ok(Err(e)) => {
            tracing::warn!(member = %member, "heartbeat not applied: {e}");
            return Ok(Json(adapt::retry(&req, handles.timings())));
        }
        Err(_) => {
            tracing::warn!(member = %member, "heartbeat not applied within {} ms", budget.as_millis());
            return Ok(Json(adapt::retry(&req, handles.timings())));
        }
    };
    let mut answer = adapt::response(&req, answer);
    let mut conn = state.conn.clone();
    let max_rewind = state.settings.max_rewind;
    for done in grant::prepare(&mut conn, &stream, &group, max_rewind, &req, &mut answer).await {
        match done {
            grant::Prepared::Rewound { .. } => {
                tracing::info!(member = %member, "pending entries delivered again to the HTTP member: {done:?}");
            }
            _ => tracing::warn!(member = %member, "shard withheld from the HTTP member: {done:?}"),
        }
    }
    Ok(Json(answer))
}

/// `GET .../producer-routing`: the stream's shard count and keys, `metadataVersion` = the topology's
/// version (Spring refreshes its routing cache only when it changes), a Redis Cluster slot per shard key.
async fn producer_routing(
    State(state): State<Arc<AppState>>,
    Path((stream, group)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let mut conn = state.conn.clone();
    let topology = Topology::load(&mut conn, &stream)
        .await
        .map_err(|e| match e {
            TopologyError::Missing { .. } => ApiError::new(
                StatusCode::NOT_FOUND,
                "STREAM_NOT_FOUND",
                format!("stream {stream:?} has no topology"),
            ),
            TopologyError::Redis(e) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "REDIS_UNAVAILABLE",
                format!("redis: {e}"),
            ),
            other => ApiError::new(StatusCode::BAD_REQUEST, "INVALID_STREAM", other.to_string()),
        })?;
    let shards: Vec<Value> = (0..topology.shard_count())
        .map(|index| {
            let key = topology.stream_key(index);
            serde_json::json!({
                "shardIndex": index,
                "redisSlot": slot_of(key.as_bytes()),
                "streamKey": key,
            })
        })
        .collect();
    Ok(Json(serde_json::json!({
        "streamPrefix": stream,
        "consumerGroup": group,
        "metadataVersion": topology.version(),
        "shardCount": topology.shard_count(),
        "streamKeyPattern": format!("{stream}:{{shardIndex}}"),
        "shards": shards,
    })))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    /// `/a/{x}/b` -> `/a/{}/b`: the router and the document name path parameters differently.
    fn shape(path: &str) -> String {
        let mut out = String::new();
        let mut in_param = false;
        for c in path.chars() {
            match c {
                '{' => {
                    in_param = true;
                    out.push_str("{}");
                }
                '}' => in_param = false,
                _ if in_param => {}
                c => out.push(c),
            }
        }
        out
    }

    /// Every `(METHOD, path shape)` that [`router`](super::router) registers, read from this file's
    /// `.route("<path>", get(..).post(..))` calls.
    fn routed() -> BTreeSet<(String, String)> {
        let source = include_str!("routes.rs");
        let body = &source[source.find("pub fn router(").unwrap()..];
        let body = &body[..body.find("\n}\n").unwrap()];
        let mut found = BTreeSet::new();
        for call in body.split(".route(").skip(1) {
            let path = call.split('"').nth(1).unwrap();
            // The call ends at its closing parenthesis.
            let mut depth = 1;
            let end = call
                .char_indices()
                .find(|&(_, c)| {
                    depth += match c {
                        '(' => 1,
                        ')' => -1,
                        _ => 0,
                    };
                    depth == 0
                })
                .unwrap()
                .0;
            let call = &call[..end];
            for method in ["get", "post", "put", "patch", "delete"] {
                let called = call.match_indices(&format!("{method}(")).any(|(at, _)| {
                    at == 0
                        || !call.as_bytes()[at - 1].is_ascii_alphanumeric()
                            && call.as_bytes()[at - 1] != b'_'
                });
                if called {
                    found.insert((method.to_ascii_uppercase(), shape(path)));
                }
            }
        }
        found
    }

    #[test]
    fn the_document_lists_exactly_the_routes() {
        let document: serde_json::Value =
            serde_json::from_str(include_str!("openapi.json")).unwrap();
        let mut documented = BTreeSet::new();
        for (path, item) in document["paths"].as_object().unwrap() {
            for method in ["get", "post", "put", "patch", "delete"] {
                if item.get(method).is_some() {
                    documented.insert((method.to_ascii_uppercase(), shape(path)));
                }
            }
        }
        let routed = routed();
        assert!(routed.len() > 30, "the parse found {routed:?}");
        let undocumented: Vec<_> = routed.difference(&documented).collect();
        let unrouted: Vec<_> = documented.difference(&routed).collect();
        assert!(
            undocumented.is_empty() && unrouted.is_empty(),
            "served but not documented: {undocumented:?}; documented but not served: {unrouted:?}"
        );
    }
}
