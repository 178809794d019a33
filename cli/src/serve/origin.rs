//! The origin's remaining monitoring endpoints: the session (who is calling), the protocol
//! compatibility, every group, and one shard's messages (its `MonitoringSystemController`,
//! `MonitoringGroupController.listGroups` and `MonitoringStreamController.messages`), in its JSON shapes.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde_json::{json, Value};
use stream_listener::routing::shard_stream_key;

use super::auth::Claims;
use super::error::ApiError;
use super::{adapt, monitor, routes, AppState};

/// The most records one page returns (the origin's `MAX_MESSAGE_PAGE_SIZE`).
pub const MAX_MESSAGE_PAGE_SIZE: i64 = 1_000;

/// The most keys the group listing's `SCAN` visits.
const GROUPS_SCAN_LIMIT: usize = 1_000_000;

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "INVALID_REQUEST", message)
}

/// `GET /coord/v1/monitoring/session`: `MonitoringSessionResponse` of the authenticated caller (the
/// origin answers `authenticated: true` whatever it is; without users configured nobody is named).
pub async fn session(claims: Option<Extension<Claims>>) -> Json<Value> {
    let (username, roles) = match claims {
        Some(Extension(claims)) => {
            let mut roles: Vec<&str> = claims.roles.iter().map(|r| r.name()).collect();
            roles.sort_unstable();
            (Some(claims.sub), roles)
        }
        None => (None, Vec::new()),
    };
    Json(json!({ "authenticated": true, "username": username, "roles": roles }))
}

/// Java's `Duration.toString` of milliseconds (`PT3S`, `PT1M`, `PT0.5S`, `PT1M30S`), as Jackson writes
/// a `Duration`.
pub fn iso_duration(ms: i64) -> String {
    if ms == 0 {
        return "PT0S".into();
    }
    let (hours, rest) = (ms / 3_600_000, ms % 3_600_000);
    let (minutes, rest) = (rest / 60_000, rest % 60_000);
    let mut out = String::from("PT");
    if hours != 0 {
        out.push_str(&format!("{hours}H"));
    }
    if minutes != 0 {
        out.push_str(&format!("{minutes}M"));
    }
    if rest != 0 {
        let (secs, millis) = (rest / 1000, rest % 1000);
        if millis == 0 {
            out.push_str(&format!("{secs}S"));
        } else {
            let frac = format!("{millis:03}");
            out.push_str(&format!("{secs}.{}S", frac.trim_end_matches('0')));
        }
    }
    out
}

/// `GET /coord/v1/monitoring/compatibility`: `CoordinatorCompatibilityResponse`. Coordination version 1
/// only (the one the heartbeat adapter speaks); its timing defaults are this library's group defaults
/// (what a group created without timings gets), `memberLeaseTtl` being our session timeout.
pub async fn compatibility() -> Json<Value> {
    let t = adapt::Timings::default();
    let release = |major: u32, minor: u32, patch: u32| {
        json!({
            "major": major, "minor": minor, "patch": patch, "qualifier": null,
            "version": format!("{major}.{minor}.{patch}"),
        })
    };
    Json(json!({
        "currentCoordinationVersion": 1,
        "supportedCoordinationVersions": { "min": 1, "max": 1 },
        "coordinationVersions": [{
            "version": 1,
            "status": "ACTIVE",
            "introducedIn": release(0, 1, 0),
            "deprecatedIn": null,
            "minimumSupportedUntil": release(1, 0, 0),
            "removedIn": null,
            "timingDefaults": {
                "heartbeatInterval": iso_duration(t.heartbeat_interval_ms),
                "memberLeaseTtl": iso_duration(t.session_timeout_ms),
                "rebalanceTimeout": iso_duration(t.rebalance_timeout_ms),
            },
        }],
    }))
}

/// `GET /coord/v1/monitoring/groups`: `GroupsResponse`, every group with metadata on this Redis (a
/// bounded `SCAN` of every master), sorted by stream then group.
pub async fn groups(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let mut conn = state.conn.clone();
    let found = stream_listener::lag::scan_namespace(&mut conn, GROUPS_SCAN_LIMIT)
        .await
        .map_err(|e| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "REDIS_UNAVAILABLE",
                format!("redis: {e}"),
            )
        })?;
    if found.truncated {
        tracing::warn!("monitoring/groups: the scan stopped at {GROUPS_SCAN_LIMIT} keys");
    }
    let mut groups = Vec::new();
    for (stream, names) in &found.streams {
        for group in names {
            match routes::projection(&state, stream, group).await {
                Ok(p) => groups.push(monitor::group(stream, &p)),
                // Deleted between the scan and the load.
                Err(e) if e.status == StatusCode::NOT_FOUND => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(Json(json!({ "groups": groups })))
}

/// The query of a messages page.
#[derive(Debug, Default)]
struct PageQuery {
    direction: Option<String>,
    cursor: Option<String>,
    limit: Option<String>,
}

/// `application/x-www-form-urlencoded` decoding of one query component.
fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = &bytes[i + 1..i + 3];
                match std::str::from_utf8(hex)
                    .ok()
                    .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl PageQuery {
    /// The known parameters (the first of each; others ignored, as Spring does).
    fn parse(raw: Option<&str>) -> Self {
        let mut q = Self::default();
        for pair in raw.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let slot = match decode(name).as_str() {
                "direction" => &mut q.direction,
                "cursor" => &mut q.cursor,
                "limit" => &mut q.limit,
                _ => continue,
            };
            slot.get_or_insert_with(|| decode(value));
        }
        q
    }
}

/// Epoch milliseconds of a stream id (`<ms>-<seq>`).
fn id_ms(id: &str) -> Option<i64> {
    id.split_once('-').map_or(id, |(ms, _)| ms).parse().ok()
}

/// Java's `Instant.toString` of epoch milliseconds.
fn instant(ms: i64) -> String {
    let secs = super::auth::rfc3339(u64::try_from(ms.div_euclid(1000)).unwrap_or(0));
    match ms.rem_euclid(1000) {
        0 => secs,
        millis => format!("{}.{millis:03}Z", secs.trim_end_matches('Z')),
    }
}

/// `GET /coord/v1/monitoring/streams/{streamPrefix}/groups/{consumerGroup}/shards/{shardIndex}/messages`:
/// `StreamMessagesPageResponse`, read with `XRANGE` (`FORWARD`, from the cursor) or `XREVRANGE`
/// (`BACKWARD`, the default, newest first), `limit` (default 25) clamped to 1..=1000; the cursor
/// record itself is left out and `nextCursor` is the last record's id when more follow. Nothing
/// changes in the consumer group.
pub async fn messages(
    State(state): State<Arc<AppState>>,
    Path((stream, group, shard)): Path<(String, String, String)>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Value>, ApiError> {
    let query = PageQuery::parse(raw.as_deref());
    let shard: i64 = shard
        .parse()
        .map_err(|_| invalid(format!("shardIndex must be an integer, not {shard:?}")))?;
    let direction = match query.direction.as_deref().unwrap_or("BACKWARD") {
        "BACKWARD" => "BACKWARD",
        "FORWARD" => "FORWARD",
        other => {
            return Err(invalid(format!(
                "direction must be FORWARD or BACKWARD, not {other:?}"
            )))
        }
    };
    let limit: i64 = match query.limit.as_deref() {
        None => 25,
        Some(l) => l
            .parse()
            .map_err(|_| invalid(format!("limit must be an integer, not {l:?}")))?,
    };
    let p = routes::projection(&state, &stream, &group).await?;
    if !(0..i64::from(p.shard_count)).contains(&shard) {
        return Err(invalid(format!(
            "shardIndex must be between 0 and {}",
            i64::from(p.shard_count) - 1
        )));
    }
    let shard = u32::try_from(shard).expect("checked above");
    let key = shard_stream_key(&stream, shard);
    let limit = limit.clamp(1, MAX_MESSAGE_PAGE_SIZE);
    let cursor = query.cursor.filter(|c| !c.trim().is_empty());
    let fetch = limit + if cursor.is_none() { 1 } else { 2 };
    let mut cmd = if direction == "FORWARD" {
        let mut c = redis::cmd("XRANGE");
        c.arg(&key).arg(cursor.as_deref().unwrap_or("-")).arg("+");
        c
    } else {
        let mut c = redis::cmd("XREVRANGE");
        c.arg(&key).arg(cursor.as_deref().unwrap_or("+")).arg("-");
        c
    };
    cmd.arg("COUNT").arg(fetch);
    let mut conn = state.conn.clone();
    let fetched: Vec<(String, Vec<String>)> = cmd.query_async(&mut conn).await.map_err(|e| {
        if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "REDIS_UNAVAILABLE",
                format!("redis: {e}"),
            )
        } else {
            // An invalid cursor id (`ERR Invalid stream ID`).
            invalid(format!("cursor {cursor:?}: {e}"))
        }
    })?;
    let fetched: Vec<_> = fetched
        .into_iter()
        .filter(|(id, _)| cursor.as_deref() != Some(id.as_str()))
        .collect();
    let more = fetched.len() > usize::try_from(limit).expect("at most 1000");
    let page = &fetched[..fetched
        .len()
        .min(usize::try_from(limit).expect("at most 1000"))];
    let records: Vec<Value> = page
        .iter()
        .map(|(id, flat)| {
            let fields: BTreeMap<&str, &str> = flat
                .chunks(2)
                .filter_map(|kv| Some((kv.first()?.as_str(), kv.get(1)?.as_str())))
                .collect();
            let ms = id_ms(id);
            json!({
                "streamPrefix": stream,
                "consumerGroup": group,
                "shard": { "shardIndex": shard },
                "streamKey": key,
                "recordId": id,
                "fields": fields,
                "payload": fields.get("payload"),
                "recordTimestampMs": ms,
                "recordTime": ms.map(instant),
            })
        })
        .collect();
    let next = if more {
        page.last().map(|(id, _)| id.clone())
    } else {
        None
    };
    Ok(Json(json!({
        "streamPrefix": stream,
        "consumerGroup": group,
        "shard": { "shardIndex": shard },
        "streamKey": key,
        "direction": direction,
        "limit": limit,
        "records": records,
        "nextCursor": next,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_instants_are_javas() {
        assert_eq!(iso_duration(3_000), "PT3S");
        assert_eq!(iso_duration(60_000), "PT1M");
        assert_eq!(iso_duration(90_500), "PT1M30.5S");
        assert_eq!(iso_duration(3_600_000), "PT1H");
        assert_eq!(iso_duration(0), "PT0S");
        assert_eq!(instant(0), "1970-01-01T00:00:00Z");
        assert_eq!(instant(1_001), "1970-01-01T00:00:01.001Z");
        assert_eq!(id_ms("1700000000123-4"), Some(1_700_000_000_123));
        let q = PageQuery::parse(Some("limit=2&cursor=1-0%2B&direction=FORWARD&limit=9&x=1"));
        assert_eq!(
            (
                q.limit.as_deref(),
                q.cursor.as_deref(),
                q.direction.as_deref()
            ),
            (Some("2"), Some("1-0+"), Some("FORWARD"))
        );
        assert_eq!(decode("a%2"), "a%2");
        assert_eq!(decode("%+1%é"), "% 1%é");
    }
}
