//! A shard stream's entries, read for people: the origin's page of one shard
//! (`MonitoringStreamController.messages`, `StreamMessagesPageResponse`) and its Grafana message rows
//! (`/grafana/messages`: one shard or all merged by id, a record id found on any shard, the
//! dashboard's tail cursors). Reads only: `XRANGE`/`XREVRANGE` with exclusive cursors and `XLEN`;
//! nothing changes in the consumer group.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::Json;
use serde_json::{json, Value};
use stream_listener::routing::shard_stream_key;

use super::error::ApiError;
use super::grafana::selection;
use super::origin::{instant, invalid, unavailable};
use super::query::Query;
use super::{routes, AppState};

/// The most records one page returns (the origin's `MAX_MESSAGE_PAGE_SIZE`).
pub const MAX_MESSAGE_PAGE_SIZE: i64 = 1_000;
/// The most entries one tail page may read, over its shards (`__rsc_tail__:N` far from the end).
const TAIL_READ_LIMIT: usize = 100_000;

/// An `XRANGE`/`XREVRANGE` failure: Redis unreachable, or a cursor that is no stream id (`ERR
/// Invalid stream ID`).
pub(super) fn range_error(e: redis::RedisError, cursor: Option<&str>) -> ApiError {
    if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() {
        unavailable(e)
    } else {
        invalid(format!("cursor {cursor:?}: {e}"))
    }
}

/// A page's `limit`: 25 when absent, clamped to 1..=[`MAX_MESSAGE_PAGE_SIZE`]; not an integer is a 400.
pub(super) fn page_limit(text: Option<&str>) -> Result<usize, ApiError> {
    let limit: i64 = match text {
        None => 25,
        Some(l) => l
            .parse()
            .map_err(|_| invalid(format!("limit must be an integer, not {l:?}")))?,
    };
    Ok(usize::try_from(limit.clamp(1, MAX_MESSAGE_PAGE_SIZE)).expect("at most 1000"))
}

/// An entry's flat `[field, value, ..]` as a map.
pub(super) fn field_map(flat: &[String]) -> BTreeMap<&str, &str> {
    flat.chunks(2)
        .filter_map(|kv| Some((kv.first()?.as_str(), kv.get(1)?.as_str())))
        .collect()
}

/// Epoch milliseconds of a stream id (`<ms>-<seq>`).
pub(super) fn id_ms(id: &str) -> Option<i64> {
    id.split_once('-').map_or(id, |(ms, _)| ms).parse().ok()
}

/// `GET /coord/v1/monitoring/streams/{streamPrefix}/groups/{consumerGroup}/shards/{shardIndex}/messages`:
/// `StreamMessagesPageResponse`, `BACKWARD` (the default, newest first) or `FORWARD` from after the
/// cursor, `limit` (default 25) clamped to 1..=1000; `nextCursor` is the last record's id when more
/// follow.
pub async fn shard_page(
    State(state): State<Arc<AppState>>,
    Path((stream, group, shard)): Path<(String, String, String)>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Value>, ApiError> {
    let query = Query::parse(raw.as_deref());
    let shard: i64 = shard
        .parse()
        .map_err(|_| invalid(format!("shardIndex must be an integer, not {shard:?}")))?;
    let direction = Direction::parse(query.get("direction"))?;
    let limit = page_limit(query.get("limit"))?;
    let p = routes::projection(&state, &stream, &group).await?;
    let shard = u32::try_from(shard)
        .ok()
        .filter(|s| *s < p.shard_count)
        .ok_or_else(|| {
            invalid(format!(
                "shardIndex must be between 0 and {}",
                i64::from(p.shard_count) - 1
            ))
        })?;
    let key = shard_stream_key(&stream, shard);
    let cursor = query.get("cursor").map(str::trim).filter(|c| !c.is_empty());
    let mut page = read_shards(&state, &stream, &[shard], direction, |_| cursor, limit + 1).await?;
    let more = page.len() > limit;
    page.truncate(limit);
    let records: Vec<Value> = page
        .iter()
        .map(|Entry { id, fields, .. }| {
            let fields = field_map(fields);
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
        page.last().map(|e| e.id.clone())
    } else {
        None
    };
    Ok(Json(json!({
        "streamPrefix": stream,
        "consumerGroup": group,
        "shard": { "shardIndex": shard },
        "streamKey": key,
        "direction": direction.name(),
        "limit": limit,
        "records": records,
        "nextCursor": next,
    })))
}

/// Page order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Forward,
    Backward,
}

impl Direction {
    fn parse(text: Option<&str>) -> Result<Self, ApiError> {
        match text.unwrap_or("BACKWARD") {
            "FORWARD" => Ok(Self::Forward),
            "BACKWARD" => Ok(Self::Backward),
            other => Err(invalid(format!(
                "direction must be FORWARD or BACKWARD, not {other:?}"
            ))),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Forward => "FORWARD",
            Self::Backward => "BACKWARD",
        }
    }

    fn opposite(self) -> Self {
        match self {
            Self::Forward => Self::Backward,
            Self::Backward => Self::Forward,
        }
    }
}

/// A stream id as `(ms, seq)`, for ordering (a malformed one sorts first, as the origin's).
fn id_order(id: &str) -> (u64, u64) {
    let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
    (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
}

/// One entry read from a shard.
#[derive(Debug, Clone)]
struct Entry {
    shard: u32,
    id: String,
    fields: Vec<String>,
}

fn ordered(entries: &mut [Entry], direction: Direction) {
    entries.sort_by(|a, b| {
        let by_id = id_order(&a.id).cmp(&id_order(&b.id));
        let by_id = if direction == Direction::Forward {
            by_id
        } else {
            by_id.reverse()
        };
        by_id.then(a.shard.cmp(&b.shard))
    });
}

/// `__rsc_last__` (the last page: 0) or `__rsc_tail__:<n>` (n pages before it).
fn tail_distance(cursor: &str) -> Option<usize> {
    if cursor == "__rsc_last__" {
        return Some(0);
    }
    let n = cursor.strip_prefix("__rsc_tail__:")?;
    // A negative distance is the last page, as the origin coerces it.
    n.parse::<i64>()
        .ok()
        .map(|n| usize::try_from(n.max(0)).unwrap_or(usize::MAX))
}

/// `all:<shard>=<id>,..`: where each shard's part of a merged listing stopped.
fn merged_cursor(cursor: Option<&str>) -> HashMap<u32, String> {
    cursor
        .and_then(|c| c.strip_prefix("all:"))
        .map(|list| {
            list.split(',')
                .filter_map(|token| {
                    let (shard, id) = token.split_once('=')?;
                    let shard = shard.parse().ok()?;
                    (!id.is_empty()).then(|| (shard, id.to_string()))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn encode_merged(cursor: &HashMap<u32, String>) -> String {
    let mut parts: Vec<_> = cursor.iter().collect();
    parts.sort();
    let parts: Vec<String> = parts.iter().map(|(s, id)| format!("{s}={id}")).collect();
    format!("all:{}", parts.join(","))
}

/// The page of a tail cursor: `(offset from the end in read order, page size, distance actually
/// reached)` for `total` entries in pages of `limit`, `distance` pages before the last.
fn tail_window(total: u64, limit: usize, distance: usize) -> Option<(usize, usize, usize)> {
    let total = usize::try_from(total).unwrap_or(usize::MAX);
    if total == 0 {
        return None;
    }
    let pages = total.div_ceil(limit);
    let last = pages - 1;
    let target = last.saturating_sub(distance);
    let last_size = match total % limit {
        0 => limit,
        r => r,
    };
    if target == last {
        Some((0, last_size, 0))
    } else {
        Some((
            last_size + (last - target - 1) * limit,
            limit,
            last - target,
        ))
    }
}

/// `XRANGE`/`XREVRANGE` of up to `count` entries of `key` in `direction`, after `after` (exclusive) or
/// from the start.
fn range(key: &str, direction: Direction, after: Option<&str>, count: usize) -> redis::Cmd {
    let (name, start, end) = match direction {
        Direction::Forward => (
            "XRANGE",
            after.map_or("-".into(), |id| format!("({id}")),
            "+",
        ),
        Direction::Backward => (
            "XREVRANGE",
            after.map_or("+".into(), |id| format!("({id}")),
            "-",
        ),
    };
    let mut cmd = redis::cmd(name);
    cmd.arg(key).arg(start).arg(end).arg("COUNT").arg(count);
    cmd
}

/// Up to `count` entries of each of `shards` in `direction`, each after its `after` (exclusive): one
/// pipeline.
async fn read_shards<'a>(
    state: &AppState,
    stream: &str,
    shards: &[u32],
    direction: Direction,
    after: impl Fn(u32) -> Option<&'a str>,
    count: usize,
) -> Result<Vec<Entry>, ApiError> {
    let mut pipe = redis::pipe();
    for &shard in shards {
        pipe.add_command(range(
            &shard_stream_key(stream, shard),
            direction,
            after(shard),
            count,
        ));
    }
    let mut conn = state.conn.clone();
    let read: Vec<Vec<(String, Vec<String>)>> = pipe
        .query_async(&mut conn)
        .await
        .map_err(|e| range_error(e, shards.first().and_then(|&s| after(s))))?;
    Ok(shards
        .iter()
        .zip(read)
        .flat_map(|(&shard, entries)| {
            entries
                .into_iter()
                .map(move |(id, fields)| Entry { shard, id, fields })
        })
        .collect())
}

/// `GET .../grafana/messages?streamPrefix=&consumerGroup=[&shardIndex=0|all][&direction=BACKWARD]
/// [&cursor=][&recordId=][&limit=25]`: message rows of one shard, or of all merged by id; a `recordId`
/// finds that entry on any shard. Cursors: the previous page's `pageNextCursor` (a record id for one
/// shard, `all:<shard>=<id>,..` merged) or the dashboard's `__rsc_last__` / `__rsc_tail__:<n>`.
pub async fn grafana(
    State(state): State<Arc<AppState>>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Vec<Value>>, ApiError> {
    let query = Query::parse(raw.as_deref());
    let selected = selection(&query)?;
    let direction = Direction::parse(query.get("direction"))?;
    let limit = page_limit(query.get("limit"))?;
    let Some((stream, group)) = selected else {
        return Ok(Json(Vec::new()));
    };
    let p = routes::projection(&state, stream, group).await?;
    let record_id = query
        .get("recordId")
        .map(str::trim)
        .filter(|r| !r.is_empty());
    let cursor = query.get("cursor").map(str::trim).filter(|c| !c.is_empty());
    let selector = match record_id {
        Some(_) => "all",
        None => query
            .get("shardIndex")
            .filter(|s| !s.trim().is_empty())
            .unwrap_or("0"),
    };
    let shards: Vec<u32> =
        if matches!(selector, ".*" | "__all" | "$__all") || selector.eq_ignore_ascii_case("all") {
            (0..p.shard_count).collect()
        } else {
            let index: i64 = selector.parse().map_err(|_| {
                invalid(format!(
                    "shardIndex must be an integer or all, not {selector:?}"
                ))
            })?;
            match u32::try_from(index).ok().filter(|i| *i < p.shard_count) {
                Some(i) => vec![i],
                None => {
                    return Err(invalid(format!(
                        "shardIndex must be between 0 and {}",
                        i64::from(p.shard_count) - 1
                    )))
                }
            }
        };
    let key = |shard: u32| shard_stream_key(stream, shard);
    let mut conn = state.conn.clone();
    let mut lengths = redis::pipe();
    for &s in &shards {
        lengths.cmd("XLEN").arg(key(s));
    }
    let lengths: Vec<u64> = if shards.is_empty() {
        Vec::new()
    } else {
        lengths.query_async(&mut conn).await.map_err(unavailable)?
    };
    let total: u64 = lengths.iter().sum();

    let (entries, next): (Vec<Entry>, Option<String>) = if let Some(id) = record_id {
        let mut found = Vec::new();
        for &s in &shards {
            let mut conn = state.conn.clone();
            let hit: Vec<(String, Vec<String>)> = redis::cmd("XRANGE")
                .arg(key(s))
                .arg(id)
                .arg(id)
                .arg("COUNT")
                .arg(1)
                .query_async(&mut conn)
                .await
                .map_err(|e| range_error(e, Some(id)))?;
            found.extend(hit.into_iter().map(|(id, fields)| Entry {
                shard: s,
                id,
                fields,
            }));
        }
        (found, None)
    } else if let Some(distance) = cursor.and_then(tail_distance) {
        let Some((offset, size, reached)) = tail_window(total, limit, distance) else {
            return Ok(Json(Vec::new()));
        };
        let count = offset + size;
        if count.saturating_mul(shards.len()) > TAIL_READ_LIMIT {
            return Err(invalid(format!(
                "cursor {:?} is {count} entries from the end of {} shard(s): page there with the cursors of the pages before",
                cursor.unwrap_or_default(),
                shards.len()
            )));
        }
        let read_direction = direction.opposite();
        let mut all = read_shards(&state, stream, &shards, read_direction, |_| None, count).await?;
        ordered(&mut all, read_direction);
        let mut page: Vec<Entry> = all
            .into_iter()
            .take(count)
            .skip(offset)
            .take(size)
            .collect();
        ordered(&mut page, direction);
        let next = (reached > 0).then(|| format!("__rsc_tail__:{}", reached - 1));
        (page, next)
    } else if let [shard] = shards[..] {
        let mut page =
            read_shards(&state, stream, &[shard], direction, |_| cursor, limit + 1).await?;
        let more = page.len() > limit;
        page.truncate(limit);
        let next = if more {
            page.last().map(|e| e.id.clone())
        } else {
            None
        };
        (page, next)
    } else {
        let mut positions = merged_cursor(cursor);
        let after = |s: u32| positions.get(&s).map(String::as_str);
        let mut all = read_shards(&state, stream, &shards, direction, after, limit + 1).await?;
        ordered(&mut all, direction);
        let more = all.len() > limit;
        all.truncate(limit);
        let next = if more && !all.is_empty() {
            for e in &all {
                positions.insert(e.shard, e.id.clone());
            }
            Some(encode_merged(&positions))
        } else {
            None
        };
        (all, next)
    };
    Ok(Json(
        entries
            .iter()
            .map(|e| {
                let fields = field_map(&e.fields);
                let ms = id_ms(&e.id);
                json!({
                    "streamPrefix": stream,
                    "consumerGroup": group,
                    "shardIndex": e.shard,
                    "shardSelector": selector,
                    "shardLabel": format!(":{}", e.shard),
                    "streamKey": key(e.shard),
                    "recordId": e.id,
                    "payload": fields.get("payload"),
                    "fieldsJson": serde_json::to_string(&fields).expect("strings serialise"),
                    "pageDirection": direction.name(),
                    "pageLimit": limit,
                    "pageNextCursor": next,
                    "pageTotalMessages": total,
                    "recordTimestampMs": ms,
                    "recordTime": ms.map(instant),
                })
            })
            .collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_windows_are_the_origins() {
        // 60 entries in pages of 25: pages of 25, 25, 10; the last page is the 10 oldest (read order).
        assert_eq!(tail_window(60, 25, 0), Some((0, 10, 0)));
        assert_eq!(tail_window(60, 25, 1), Some((10, 25, 1)));
        assert_eq!(tail_window(60, 25, 2), Some((35, 25, 2)));
        // Past the first page: the first page.
        assert_eq!(tail_window(60, 25, 9), Some((35, 25, 2)));
        assert_eq!(tail_window(50, 25, 0), Some((0, 25, 0)));
        assert_eq!(tail_window(0, 25, 0), None);
        assert_eq!(tail_distance("__rsc_last__"), Some(0));
        assert_eq!(tail_distance("__rsc_tail__:3"), Some(3));
        assert_eq!(tail_distance("__rsc_tail__:-2"), Some(0));
        assert_eq!(tail_distance("__rsc_tail__:x"), None);
        assert_eq!(tail_distance("1-0"), None);
    }

    #[test]
    fn merged_cursors_round_trip_and_ignore_garbage() {
        let parsed = merged_cursor(Some("all:0=5-0,2=7-1,x=1-0,3=,4"));
        assert_eq!(parsed.len(), 2);
        assert_eq!(parsed[&0], "5-0");
        assert_eq!(parsed[&2], "7-1");
        assert_eq!(encode_merged(&parsed), "all:0=5-0,2=7-1");
        assert!(merged_cursor(Some("5-0")).is_empty());
        assert!(merged_cursor(None).is_empty());
    }

    #[test]
    fn ids_order_by_time_then_sequence_then_shard() {
        let e = |shard, id: &str| Entry {
            shard,
            id: id.into(),
            fields: vec![],
        };
        let mut v = vec![e(1, "10-0"), e(0, "9-5"), e(0, "10-0"), e(2, "10-1")];
        ordered(&mut v, Direction::Forward);
        let ids: Vec<_> = v.iter().map(|e| (e.shard, e.id.as_str())).collect();
        assert_eq!(ids, [(0, "9-5"), (0, "10-0"), (1, "10-0"), (2, "10-1")]);
        ordered(&mut v, Direction::Backward);
        let ids: Vec<_> = v.iter().map(|e| (e.shard, e.id.as_str())).collect();
        assert_eq!(ids, [(2, "10-1"), (0, "10-0"), (1, "10-0"), (0, "9-5")]);
    }

    #[test]
    fn ids_and_limits() {
        assert_eq!(id_ms("1700000000123-4"), Some(1_700_000_000_123));
        assert_eq!(page_limit(None).unwrap(), 25);
        assert_eq!(page_limit(Some("0")).unwrap(), 1);
        assert_eq!(page_limit(Some("5000")).unwrap(), 1000);
        assert!(page_limit(Some("ten")).is_err());
        assert!(Direction::parse(Some("SIDEWAYS")).is_err());
        assert_eq!(Direction::parse(None).unwrap(), Direction::Backward);
    }
}
