//! The origin's system monitoring endpoints: the session (who is calling), the protocol compatibility
//! and every group (its `MonitoringSystemController` and `MonitoringGroupController.listGroups`), in
//! its JSON shapes; and what they share with the Grafana rows (the group listing, Java's time formats).

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde_json::{json, Value};

use super::auth::Claims;
use super::error::ApiError;
use super::{adapt, monitor, routes, AppState};

/// The most keys the group listing's `SCAN` visits.
const GROUPS_SCAN_LIMIT: usize = 1_000_000;

pub(super) fn invalid(message: impl Into<String>) -> ApiError {
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

pub(super) fn unavailable(e: redis::RedisError) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "REDIS_UNAVAILABLE",
        format!("redis: {e}"),
    )
}

/// Every `(stream, group)` with metadata on this Redis (a bounded `SCAN` of every master), sorted.
pub(super) async fn all_groups(state: &AppState) -> Result<Vec<(String, String)>, ApiError> {
    let mut conn = state.conn.clone();
    let found = stream_listener::lag::scan_namespace(&mut conn, GROUPS_SCAN_LIMIT)
        .await
        .map_err(unavailable)?;
    if found.truncated {
        tracing::warn!("listing groups: the scan stopped at {GROUPS_SCAN_LIMIT} keys");
    }
    Ok(found
        .streams
        .into_iter()
        .flat_map(|(stream, groups)| groups.into_iter().map(move |g| (stream.clone(), g)))
        .collect())
}

/// `GET /coord/v1/monitoring/groups`: `GroupsResponse`, every group with metadata, sorted by stream
/// then group.
pub async fn groups(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let mut groups = Vec::new();
    for (stream, group) in all_groups(&state).await? {
        match routes::projection(&state, &stream, &group).await {
            Ok(p) => groups.push(monitor::group(&stream, &p)),
            // Deleted between the scan and the load.
            Err(e) if e.status == StatusCode::NOT_FOUND => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Json(json!({ "groups": groups })))
}

/// Java's `Instant.toString` of epoch milliseconds.
pub(super) fn instant(ms: i64) -> String {
    let secs = super::auth::rfc3339(u64::try_from(ms.div_euclid(1000)).unwrap_or(0));
    match ms.rem_euclid(1000) {
        0 => secs,
        millis => format!("{}.{millis:03}Z", secs.trim_end_matches('Z')),
    }
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
    }
}
