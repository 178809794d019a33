//! The origin's Grafana endpoints (`GrafanaMonitoringController`, `/coord/v1/monitoring/grafana/*`):
//! flat rows for the Infinity data source of its dashboards, in its shapes: groups, variable options
//! (`{"__text", "__value"}`), members, shards, assignments and messages. Read-only, `READ`.
//!
//! Parameters as Spring binds them: a missing required one is a 400, a blank one an empty answer (the
//! dashboards send `streamPrefix=&consumerGroup=` before a variable is chosen; `shards` then lists
//! every group). Rates are this server's own observations, as the origin's: the change in a shard's
//! entries added (produced) and delivered (consumed) since an observation at least a second older.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};
use stream_listener::connection::slot_of;
use stream_listener::coordinator::metadata::MemberState;
use stream_listener::coordinator::projection::GroupProjection;
use stream_listener::lag::{GroupLag, LagSource, ShardLag};

use super::error::ApiError;
use super::offsets::{self, ShardDetail};
use super::origin::{self, instant, invalid};
use super::query::Query;
use super::{monitor, routes, AppState};

/// Rates are over at least this long (two panels loading at once must not divide by a millisecond).
const RATE_WINDOW: Duration = Duration::from_secs(1);
/// The most shards whose rates are remembered; past it they start over.
const RATES_KEPT: usize = 100_000;

/// One observation of a shard's counters.
#[derive(Debug, Clone, Copy)]
struct Observation {
    at: Instant,
    produced: u64,
    consumed: Option<u64>,
}

/// The last rates of a shard and the observation they will next be measured from.
#[derive(Debug, Clone, Copy)]
struct ShardRates {
    base: Observation,
    produced: Option<f64>,
    consumed: Option<f64>,
}

/// Produced and consumed entries per second by shard, as this server saw them change.
#[derive(Debug, Default)]
pub struct Rates(Mutex<HashMap<(String, String, u32), ShardRates>>);

impl Rates {
    /// Records `shard`'s counters now and returns its rates (`None` until a second has passed since
    /// the first observation, and after a counter went back: a deleted and recreated stream).
    fn observe(
        &self,
        group: (&str, &str),
        shard: &ShardLag,
        now: Instant,
    ) -> (Option<f64>, Option<f64>) {
        // Entries added (Redis >= 7) survive trimming; the length does not.
        let produced = shard.entries_added.unwrap_or(shard.length);
        let consumed =
            (shard.source != LagSource::AtLeast).then(|| produced.saturating_sub(shard.lag));
        let current = Observation {
            at: now,
            produced,
            consumed,
        };
        let mut rates = self.0.lock().expect("not poisoned");
        if rates.len() >= RATES_KEPT {
            rates.clear();
        }
        let key = (group.0.to_string(), group.1.to_string(), shard.shard);
        let entry = rates.entry(key).or_insert(ShardRates {
            base: current,
            produced: None,
            consumed: None,
        });
        let elapsed = now.duration_since(entry.base.at);
        if elapsed >= RATE_WINDOW {
            let secs = elapsed.as_secs_f64();
            let rate = |now: u64, then: u64| now.checked_sub(then).map(|d| d as f64 / secs);
            entry.produced = rate(current.produced, entry.base.produced);
            entry.consumed = match (current.consumed, entry.base.consumed) {
                (Some(now), Some(then)) => rate(now, then),
                _ => None,
            };
            entry.base = current;
        }
        (entry.produced, entry.consumed)
    }
}

/// A parameter Spring requires (`@RequestParam` without a default): 400 when absent.
fn required<'q>(query: &'q Query, name: &str) -> Result<&'q str, ApiError> {
    query.get(name).ok_or_else(|| {
        invalid(format!(
            "Required request parameter '{name}' for method parameter type String is not present"
        ))
    })
}

/// The required stream and group; `None` when either is blank (an unset dashboard variable).
pub(super) fn selection(query: &Query) -> Result<Option<(&str, &str)>, ApiError> {
    let stream = required(query, "streamPrefix")?;
    let group = required(query, "consumerGroup")?;
    Ok((!stream.trim().is_empty() && !group.trim().is_empty()).then_some((stream, group)))
}

/// The selected group's projection; `None` when the selection is blank.
async fn selected_projection(
    state: &AppState,
    raw: Option<&str>,
) -> Result<Option<(String, String, GroupProjection)>, ApiError> {
    let query = Query::parse(raw);
    let Some((stream, group)) = selection(&query)? else {
        return Ok(None);
    };
    let p = routes::projection(state, stream, group).await?;
    Ok(Some((stream.to_string(), group.to_string(), p)))
}

fn option(text: impl Into<String>, value: impl Into<String>) -> Value {
    json!({ "__text": text.into(), "__value": value.into() })
}

fn is_live(state: MemberState) -> bool {
    !matches!(state, MemberState::Expired | MemberState::Fenced)
}

/// `GET .../grafana/groups`: one row per group with metadata.
pub async fn groups(State(state): State<Arc<AppState>>) -> Result<Json<Vec<Value>>, ApiError> {
    let mut rows = Vec::new();
    for (stream, group) in origin::all_groups(&state).await? {
        let Some(view) = GroupView::load(&state, &stream, &group).await? else {
            continue;
        };
        rows.push(view.group_row(&state));
    }
    Ok(Json(rows))
}

/// `GET .../grafana/options/streams`: the streams with group metadata, sorted.
pub async fn stream_options(
    State(state): State<Arc<AppState>>,
) -> Result<Json<Vec<Value>>, ApiError> {
    let mut streams: Vec<String> = origin::all_groups(&state)
        .await?
        .into_iter()
        .map(|(stream, _)| stream)
        .collect();
    streams.dedup();
    Ok(Json(streams.iter().map(|s| option(s, s)).collect()))
}

/// `GET .../grafana/options/consumer-groups[?streamPrefix=]`: `"<stream> / <group>"` options, of one
/// stream when it is given and not blank.
pub async fn consumer_group_options(
    State(state): State<Arc<AppState>>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Vec<Value>>, ApiError> {
    let query = Query::parse(raw.as_deref());
    let only = query.get("streamPrefix").filter(|s| !s.trim().is_empty());
    Ok(Json(
        origin::all_groups(&state)
            .await?
            .into_iter()
            .filter(|(stream, _)| only.is_none_or(|only| only == stream))
            .map(|(stream, group)| option(format!("{stream} / {group}"), group))
            .collect(),
    ))
}

/// `GET .../grafana/options/shards?streamPrefix=&consumerGroup=`: `:<i>` for every shard.
pub async fn shard_options(
    State(state): State<Arc<AppState>>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Vec<Value>>, ApiError> {
    let Some((_, _, p)) = selected_projection(&state, raw.as_deref()).await? else {
        return Ok(Json(Vec::new()));
    };
    Ok(Json(
        (0..p.shard_count)
            .map(|i| option(format!(":{i}"), i.to_string()))
            .collect(),
    ))
}

/// `GET .../grafana/members?streamPrefix=&consumerGroup=`: one row per member, sorted by id.
pub async fn members(
    State(state): State<Arc<AppState>>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Vec<Value>>, ApiError> {
    let Some((stream, group, p)) = selected_projection(&state, raw.as_deref()).await? else {
        return Ok(Json(Vec::new()));
    };
    let mut members: Vec<_> = p.members.iter().collect();
    members.sort_by(|a, b| a.member_id.cmp(&b.member_id));
    let at = |ms: i64| (ms > 0).then(|| instant(ms));
    Ok(Json(
        members
            .into_iter()
            .map(|m| {
                json!({
                    "streamPrefix": stream,
                    "consumerGroup": group,
                    "memberId": m.member_id,
                    "memberName": m.member_name.as_deref().unwrap_or(&m.member_id),
                    "state": monitor::member_state(m.state),
                    "memberEpoch": m.member_epoch,
                    // Not recorded per member: which version a member applied is its own business.
                    "metadataVersion": null,
                    "currentShardCount": m.owned.len(),
                    "revokingShardCount": m.revoking.len(),
                    "runtimeMaxConcurrency": m.runtime_max_concurrency,
                    "activeConsumerWorkers": m.runtime_max_concurrency.saturating_sub(m.available_concurrency),
                    // Every heartbeat renews the lease to one session timeout from then.
                    "lastHeartbeatAt": (m.lease_deadline_ms > 0)
                        .then(|| instant(m.lease_deadline_ms - p.session_timeout_ms)),
                    "memberLeaseExpiresAt": at(m.lease_deadline_ms),
                })
            })
            .collect(),
    ))
}

/// `GET .../grafana/shards?streamPrefix=&consumerGroup=`: one row per shard read, of every group when
/// both are blank, of the matching groups when one is.
pub async fn shards(
    State(state): State<Arc<AppState>>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Vec<Value>>, ApiError> {
    let query = Query::parse(raw.as_deref());
    let stream = required(&query, "streamPrefix")?.trim();
    let group = required(&query, "consumerGroup")?.trim();
    let groups = if !stream.is_empty() && !group.is_empty() {
        vec![(stream.to_string(), group.to_string())]
    } else {
        origin::all_groups(&state)
            .await?
            .into_iter()
            .filter(|(s, g)| (stream.is_empty() || s == stream) && (group.is_empty() || g == group))
            .collect()
    };
    let single = groups.len() == 1 && !stream.is_empty() && !group.is_empty();
    let mut rows = Vec::new();
    for (stream, group) in &groups {
        match GroupView::load(&state, stream, group).await? {
            Some(view) => rows.extend(view.shard_rows(&state)),
            None if single => {
                return Err(ApiError::new(
                    StatusCode::NOT_FOUND,
                    "GROUP_NOT_FOUND",
                    format!("group {group:?} of stream {stream:?} has no metadata"),
                ))
            }
            // Deleted between the scan and the load.
            None => {}
        }
    }
    Ok(Json(rows))
}

/// `GET .../grafana/assignments?streamPrefix=&consumerGroup=`: target, current and revoking owners
/// per shard, comma-separated.
pub async fn assignments(
    State(state): State<Arc<AppState>>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Vec<Value>>, ApiError> {
    let Some((stream, group, p)) = selected_projection(&state, raw.as_deref()).await? else {
        return Ok(Json(Vec::new()));
    };
    let revoking = |shard: u32| -> String {
        let mut ids: Vec<&str> = p
            .members
            .iter()
            .filter(|m| is_live(m.state) && m.revoking.contains(&shard))
            .map(|m| m.member_id.as_str())
            .collect();
        ids.sort_unstable();
        ids.join(",")
    };
    Ok(Json(
        p.shards
            .iter()
            .map(|s| {
                json!({
                    "streamPrefix": stream,
                    "consumerGroup": group,
                    "shardIndex": s.shard_index,
                    "targetOwners": s.target.as_deref().unwrap_or(""),
                    "currentOwners": s.current.as_deref().unwrap_or(""),
                    "revokingOwners": revoking(s.shard_index),
                })
            })
            .collect(),
    ))
}

/// A group's metadata view, lag reading and shard details, read once for its rows.
struct GroupView {
    stream: String,
    projection: GroupProjection,
    lag: GroupLag,
    details: Vec<ShardDetail>,
}

impl GroupView {
    /// `None` when the group has no metadata.
    async fn load(state: &AppState, stream: &str, group: &str) -> Result<Option<Self>, ApiError> {
        let (lag, projection) = match offsets::lag_and_projection(state, stream, group).await {
            Ok((lag, Some(projection))) => (lag, projection),
            Ok((_, None)) => return Ok(None),
            Err(e) if e.status == StatusCode::NOT_FOUND => return Ok(None),
            Err(e) => return Err(e),
        };
        let details = offsets::shard_details(state, &lag).await?;
        Ok(Some(Self {
            stream: stream.to_string(),
            projection,
            lag,
            details,
        }))
    }

    /// `GrafanaGroupRow`.
    fn group_row(&self, state: &AppState) -> Value {
        let p = &self.projection;
        let live = || p.members.iter().filter(|m| is_live(m.state));
        let current: usize = live().map(|m| m.owned.len()).sum();
        let rates: Vec<_> = self.rates(state).collect();
        // Null until some shard has a rate, as the origin's `sumKnownOrNull`.
        let produced = rates.iter().filter_map(|r| r.0).reduce(|a, b| a + b);
        let consumed = rates.iter().filter_map(|r| r.1).reduce(|a, b| a + b);
        let memory: u64 = self.details.iter().filter_map(|d| d.memory).sum();
        json!({
            "streamPrefix": self.stream,
            "consumerGroup": p.group,
            "state": p.state,
            "groupEpoch": p.group_epoch,
            "assignmentEpoch": p.assignment_epoch,
            "metadataVersion": p.metadata_version,
            "shardCount": p.shard_count,
            "activeMembers": p.members.iter().filter(|m| matches!(m.state, MemberState::Joining | MemberState::Stable)).count(),
            "totalMembers": p.members.len(),
            "currentShards": current,
            "targetShards": p.shards.iter().filter(|s| s.target.is_some()).count(),
            "assignedShardRatio": format!("{current} / {}", p.shard_count),
            "revokingShards": live().map(|m| m.revoking.len()).sum::<usize>(),
            "totalStreamLength": self.lag.shards.iter().map(|s| s.length).sum::<u64>(),
            "totalPendingCount": self.lag.pending,
            "totalLag": self.lag.lag_exact.then_some(self.lag.lag),
            "producedPerSecond": produced,
            "consumedPerSecond": consumed,
            "totalMemoryUsageBytes": memory,
            "memoryUsageKnown": self.memory_known(),
        })
    }

    fn memory_known(&self) -> bool {
        self.lag
            .shards
            .iter()
            .zip(&self.details)
            .all(|(s, d)| !s.exists || d.memory.is_some())
    }

    /// Each shard's rates, observed now.
    fn rates<'a>(
        &'a self,
        state: &'a AppState,
    ) -> impl Iterator<Item = (Option<f64>, Option<f64>)> + 'a {
        let now = Instant::now();
        let group = (self.stream.as_str(), self.projection.group.as_str());
        self.lag
            .shards
            .iter()
            .map(move |s| state.rates.observe(group, s, now))
    }

    /// `GrafanaShardRow`s.
    fn shard_rows(&self, state: &AppState) -> Vec<Value> {
        let p = &self.projection;
        let view = |shard: u32| p.shards.iter().find(|s| s.shard_index == shard);
        self.lag
            .shards
            .iter()
            .zip(&self.details)
            .zip(self.rates(state))
            .map(|((shard, detail), (produced, consumed))| {
                let current = view(shard.shard)
                    .and_then(|s| s.current.as_deref())
                    .unwrap_or("");
                let target = view(shard.shard)
                    .and_then(|s| s.target.as_deref())
                    .unwrap_or("");
                let owner_state = match (current.is_empty(), target.is_empty()) {
                    (true, true) => "UNASSIGNED",
                    (true, false) => "PENDING_ACK",
                    _ if current == target => "CURRENT",
                    _ => "TRANSITIONING",
                };
                let exact = shard.source != LagSource::AtLeast;
                let node = detail.node.as_ref();
                json!({
                    "streamPrefix": self.stream,
                    "consumerGroup": p.group,
                    "shardCount": p.shard_count,
                    "shardIndex": shard.shard,
                    "shardLabel": format!(":{}", shard.shard),
                    "streamKey": shard.stream_key,
                    "redisSlot": slot_of(shard.stream_key.as_bytes()),
                    "redisNodeEndpoint": node.map(|n| &n.endpoint),
                    "redisNodeId": node.and_then(|n| n.id.as_ref()),
                    "redisSlotRangeStart": node.map(|n| n.start),
                    "redisSlotRangeEnd": node.map(|n| n.end),
                    "streamLength": shard.length,
                    "firstRecordId": detail.first_id,
                    "lastRecordId": detail.last_id,
                    "lastGeneratedId": detail.last_generated_id,
                    "groupLastDeliveredId": shard.last_delivered_id,
                    // Redis keeps neither per consumer.
                    "consumerLastDeliveredId": null,
                    "consumerLastAckedId": null,
                    "pendingCount": shard.pending,
                    "lag": exact.then_some(shard.lag),
                    "lagKnown": exact,
                    "lagAtLeast": (!exact).then_some(shard.lag),
                    "producedPerSecond": produced,
                    "consumedPerSecond": consumed,
                    "memoryUsageBytes": detail.memory,
                    "memoryUsageKnown": detail.memory.is_some(),
                    "targetOwnerMemberIds": target,
                    "currentOwnerMemberIds": current,
                    "ownerState": owner_state,
                    "ownerMemberIds": current,
                    "draining": shard.shard >= self.lag.shard_count,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(added: u64, lag: u64, source: LagSource) -> ShardLag {
        ShardLag {
            shard: 0,
            stream_key: "s:0".into(),
            exists: true,
            has_group: true,
            length: added,
            lag,
            source,
            pending: 0,
            oldest_unacked_age_ms: None,
            last_delivered_id: None,
            entries_read: None,
            entries_added: Some(added),
        }
    }

    #[test]
    fn rates_are_over_at_least_a_second_and_none_after_a_counter_went_back() {
        let rates = Rates::default();
        let g = ("s", "g");
        let t0 = Instant::now();
        let exact = LagSource::Redis;
        assert_eq!(rates.observe(g, &shard(100, 50, exact), t0), (None, None));
        // Half a second later: too soon, still nothing measured.
        let t1 = t0 + Duration::from_millis(500);
        assert_eq!(rates.observe(g, &shard(150, 50, exact), t1), (None, None));
        // Two seconds after the first: 200 added, 150 delivered.
        let t2 = t0 + Duration::from_secs(2);
        assert_eq!(
            rates.observe(g, &shard(300, 100, exact), t2),
            (Some(100.0), Some(75.0))
        );
        // Too soon again: the last rates stand.
        let t3 = t2 + Duration::from_millis(10);
        assert_eq!(
            rates.observe(g, &shard(900, 0, exact), t3),
            (Some(100.0), Some(75.0))
        );
        // The stream was deleted and made again: no rate across that.
        let t4 = t2 + Duration::from_secs(1);
        assert_eq!(rates.observe(g, &shard(10, 0, exact), t4), (None, None));
        // Only a lower bound of the lag: produced is known, consumed is not.
        let t5 = t4 + Duration::from_secs(1);
        assert_eq!(
            rates.observe(g, &shard(20, 5, LagSource::AtLeast), t5),
            (Some(10.0), None)
        );
    }
}
