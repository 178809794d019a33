//! `audit`: the newest audit events of a group, human readable.

use redis::Value;

use crate::error::CliError;
use crate::redis_ctx::{value_text, Ctx};
use crate::table::{json_text, utc, Table};

/// Reads the newest `count` entries of `sl:{<stream>/<group>}:audit` (fields `event`, `revision`, `at`)
/// and prints them oldest first: time, store revision, event type, and the event's fields.
pub async fn run(
    ctx: &mut Ctx,
    stream: &str,
    group: &str,
    count: usize,
    json: bool,
) -> Result<String, CliError> {
    let store = ctx.existing_group(stream, group).await?;
    let key = store.keys().audit.clone();
    let entries: Vec<(String, Vec<(String, Value)>)> = redis::cmd("XREVRANGE")
        .arg(&key)
        .arg("+")
        .arg("-")
        .arg("COUNT")
        .arg(count)
        .query_async(&mut ctx.conn)
        .await?;
    if json {
        let events: Vec<serde_json::Value> =
            entries.iter().rev().map(|(id, f)| to_json(id, f)).collect();
        return Ok(json_text(&events));
    }
    if entries.is_empty() {
        return Ok(format!("no audit events in {key}\n"));
    }
    let mut table = Table::new(&["TIME", "REVISION", "EVENT", "DETAILS"]);
    for (id, fields) in entries.iter().rev() {
        table.row(row(id, fields));
    }
    Ok(table.render())
}

/// One audit entry as JSON: `id`, `atMs`, `revision` and the `event` object (or its raw text).
fn to_json(id: &str, fields: &[(String, Value)]) -> serde_json::Value {
    let field = |name: &str| {
        fields
            .iter()
            .find(|(f, _)| f == name)
            .and_then(|(_, v)| value_text(v))
    };
    let event = field("event").map(|text| {
        serde_json::from_str::<serde_json::Value>(&text).unwrap_or(serde_json::Value::String(text))
    });
    serde_json::json!({
        "id": id,
        "atMs": field("at").and_then(|at| at.parse::<i64>().ok()),
        "revision": field("revision").and_then(|r| r.parse::<i64>().ok()),
        "event": event,
    })
}

/// One audit entry as table cells; an entry that is not what the store writes is shown raw, not dropped.
fn row(id: &str, fields: &[(String, Value)]) -> Vec<String> {
    let field = |name: &str| {
        fields
            .iter()
            .find(|(f, _)| f == name)
            .and_then(|(_, v)| value_text(v))
    };
    let at = field("at")
        .and_then(|at| at.parse::<i64>().ok())
        .map_or_else(|| format!("(id {id})"), utc);
    let revision = field("revision").unwrap_or_else(|| "?".to_string());
    let (kind, details) = match field("event") {
        Some(event) => describe(&event),
        None => ("?".to_string(), format!("entry {id} has no `event` field")),
    };
    vec![at, revision, kind, details]
}

/// `(TYPE, "field=value ...")` of an event's JSON (`{"type": "MEMBER_JOINED", "memberId": ...}`).
fn describe(event: &str) -> (String, String) {
    let Ok(serde_json::Value::Object(mut fields)) = serde_json::from_str(event) else {
        return ("?".to_string(), event.to_string());
    };
    let kind = match fields.remove("type") {
        Some(serde_json::Value::String(kind)) => kind,
        _ => "?".to_string(),
    };
    let details = fields
        .iter()
        .map(|(name, value)| match value {
            serde_json::Value::String(s) => format!("{name}={s}"),
            other => format!("{name}={other}"),
        })
        .collect::<Vec<_>>()
        .join(" ");
    (kind, details)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_described_by_type_and_fields() {
        let (kind, details) =
            describe(r#"{"type":"SHARDS_ASSIGNED","memberId":"a","memberEpoch":3,"shards":[0,1]}"#);
        assert_eq!(kind, "SHARDS_ASSIGNED");
        for part in ["memberEpoch=3", "memberId=a", "shards=[0,1]"] {
            assert!(details.contains(part), "{details}");
        }
        assert_eq!(
            describe("not json"),
            ("?".to_string(), "not json".to_string())
        );
    }
}
