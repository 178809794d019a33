//! `dead-letters`: list a stream's dead letters (optionally one group's, with payloads), show one, replay
//! them to the group that failed them, or purge them.
//!
//! # Replaying to the failed group only
//!
//! A shard stream is shared by every consumer group of the stream, so re-publishing a dead letter as a plain
//! entry would hand it again to groups that handled it fine. A replay therefore writes the entry's original
//! key, payload and headers (fields `k`, `p`, and `sl_headers` when it has any, so a trace goes on through
//! the replay) to the shard its key routes to now, plus `sl_only_group = <group>`
//! ([`stream_listener::replay::ONLY_GROUP_FIELD`]) and `sl_replay_of = <dead letter id>`. Consumers of
//! every other group acknowledge such an entry without running their handler, so only the failed group
//! handles it, in key order with the key's newer entries, with a fresh delivery count.
//!
//! Trade-offs, and the alternatives not chosen:
//! * Other groups still read (and acknowledge) the entry: one extra read per group, no handler call.
//! * Consumers that do not know the field (the spec's JVM and Python clients, older builds of this library)
//!   handle it like any entry; `--to-all-groups` makes that explicit for a replay meant for everyone.
//! * `XCLAIM ... FORCE` of the original entry into the failed group's pending list would touch no other
//!   group, but works only while the original still exists (not after `ack_delete` or trimming), and the
//!   running owner picks up another consumer's pending entry only at a takeover or once it has been idle
//!   for a session timeout, then handles it out of order with the key's newer entries.
//! * A per-group retry stream would need every consumer to read a second stream per shard, and would lose
//!   the order with the key's newer entries.
//!
//! Publishing comes before deleting from the DLQ: a failure in between leaves a duplicate, never a loss.

use std::io::{BufRead as _, IsTerminal as _, Write as _};

use redis::Value;
use stream_listener::names::dead_letter_field as dlq;
use stream_listener::names::field::{
    HEADERS as HEADERS_FIELD, KEY as KEY_FIELD, ONLY_GROUP as ONLY_GROUP_FIELD,
    PAYLOAD as PAYLOAD_FIELD, REPLAY_OF as REPLAY_OF_FIELD,
};
use stream_listener::topology::Topology;
use stream_listener::{Headers, Producer};

use crate::error::CliError;
use crate::redis_ctx::{value_text, Ctx};
use crate::table::{json_text, or_dash, truncate, Table};

/// Widest error text shown in the list.
const ERROR_WIDTH: usize = 72;
/// Widest payload shown in the list with `--payloads`.
const PAYLOAD_WIDTH: usize = 60;
/// Entries read per `XRANGE` page when filtering or bulk-processing.
const PAGE: usize = 500;

/// One stream entry: id and raw field/value pairs.
type Entry = (String, Vec<(String, Value)>);

/// Which dead letters a bulk command acts on.
#[derive(Debug, Clone)]
pub enum Selection {
    /// These entry ids.
    Ids(Vec<String>),
    /// Every entry (of one group, if given).
    All {
        /// Only the dead letters of this group.
        group: Option<String>,
    },
}

use stream_listener::names::dead_letter_stream as dlq_key;

/// Lists the oldest `count` entries of `<stream>:dlq` (of `group` only, if given): group, shard, source
/// id, deliveries, key, error, and with `payloads` the payload.
pub async fn list(
    ctx: &mut Ctx,
    stream: &str,
    group: Option<&str>,
    count: usize,
    payloads: bool,
    json: bool,
) -> Result<String, CliError> {
    let key = dlq_key(stream);
    let total = ctx.stream_len(&key).await?;
    let entries = matching(ctx, &key, group, Some(count)).await?;
    if json {
        let rows: Vec<serde_json::Value> = entries.iter().map(entry_json).collect();
        return Ok(json_text(&serde_json::json!({
            "dlq": key,
            "total": total,
            "entries": rows,
        })));
    }
    if entries.is_empty() {
        return Ok(match group {
            Some(group) if total > 0 => {
                format!("no dead letters of group `{group}` in {key} ({total} of other groups)\n")
            }
            _ => format!("no dead letters in {key}\n"),
        });
    }
    let mut header = vec![
        "ID",
        "GROUP",
        "SHARD",
        "SOURCE ID",
        "DELIVERIES",
        "KEY",
        "ERROR",
    ];
    if payloads {
        header.push("PAYLOAD");
    }
    let mut table = Table::new(&header);
    for (id, fields) in &entries {
        let field = |name: &str| text_field(fields, name);
        let mut row = vec![
            id.clone(),
            or_dash(field(dlq::GROUP)),
            or_dash(field(dlq::SHARD)),
            or_dash(field(dlq::SOURCE_ID)),
            or_dash(field(dlq::DELIVERY_COUNT)),
            or_dash(field(KEY_FIELD)),
            or_dash(field(dlq::ERROR).map(|e| one_line(&truncate(&e, ERROR_WIDTH)))),
        ];
        if payloads {
            row.push(or_dash(
                bytes_field(fields, PAYLOAD_FIELD)
                    .map(|p| one_line(&truncate(&payload_text(&p), PAYLOAD_WIDTH))),
            ));
        }
        table.row(row);
    }
    let mut out = table.render();
    let of_group = group.map_or_else(String::new, |g| format!(" of group `{g}`"));
    out.push_str(&format!(
        "\n{} dead letter{}{of_group} shown; {total} in {key}\n",
        entries.len(),
        plural(entries.len())
    ));
    Ok(out)
}

/// Every field of dead letter `id`, the payload in full.
pub async fn show(ctx: &mut Ctx, stream: &str, id: &str, json: bool) -> Result<String, CliError> {
    let key = dlq_key(stream);
    let entry = one(ctx, &key, id).await?;
    if json {
        return Ok(json_text(&entry_json(&entry)));
    }
    let (_, fields) = &entry;
    let mut out = format!("id                {id}\n");
    for (label, name) in [
        ("group", dlq::GROUP),
        ("shard", dlq::SHARD),
        ("source stream", dlq::SOURCE_STREAM),
        ("source id", dlq::SOURCE_ID),
        ("consumer", dlq::CONSUMER),
        ("deliveries", dlq::DELIVERY_COUNT),
        ("key", KEY_FIELD),
        ("error", dlq::ERROR),
    ] {
        out.push_str(&format!(
            "{label:<18}{}\n",
            or_dash(text_field(fields, name))
        ));
    }
    let known = [
        dlq::GROUP,
        dlq::SHARD,
        dlq::SOURCE_STREAM,
        dlq::SOURCE_ID,
        dlq::CONSUMER,
        dlq::DELIVERY_COUNT,
        dlq::ERROR,
        KEY_FIELD,
        PAYLOAD_FIELD,
    ];
    for (name, value) in fields.iter().filter(|(n, _)| !known.contains(&n.as_str())) {
        out.push_str(&format!("{name:<18}{}\n", or_dash(value_text(value))));
    }
    out.push_str("payload\n");
    match bytes_field(fields, PAYLOAD_FIELD) {
        Some(payload) => {
            let text = match serde_json::from_slice::<serde_json::Value>(&payload) {
                Ok(value) => serde_json::to_string_pretty(&value).expect("JSON values serialize"),
                Err(_) => payload_text(&payload),
            };
            for line in text.lines() {
                out.push_str(&format!("  {line}\n"));
            }
        }
        None => out.push_str("  (none: the entry has no `p` field)\n"),
    }
    Ok(out)
}

/// Replays the selected dead letters to the group that failed each of them (see the module docs), or to
/// every group with `to_all_groups`, then deletes them from the DLQ. `--all` asks for confirmation.
pub async fn replay(
    ctx: &mut Ctx,
    stream: &str,
    selection: &Selection,
    to_all_groups: bool,
    yes: bool,
    json: bool,
) -> Result<String, CliError> {
    let key = dlq_key(stream);
    let entries = selected(ctx, &key, selection).await?;
    if let Selection::All { group } = selection {
        if entries.is_empty() {
            if json {
                return Ok(json_text(&serde_json::json!({
                    "dlq": key, "replayed": [], "skipped": [],
                })));
            }
            return Ok(nothing(&key, group.as_deref()));
        }
        let whom = if to_all_groups {
            "every group of the stream"
        } else {
            "the group that failed each"
        };
        confirm(
            &format!(
                "replay {} dead letter{} from {key} to {whom}?",
                entries.len(),
                plural(entries.len())
            ),
            yes,
        )?;
    }
    let topology = Topology::load(&mut ctx.conn, stream).await?;
    let mut out = String::new();
    let mut skipped = 0;
    let mut replayed_json = Vec::new();
    let mut skipped_json = Vec::new();
    for (id, fields) in &entries {
        match replay_one(ctx, &topology, &key, id, fields, to_all_groups).await {
            Ok(replayed) => {
                let whom = match &replayed.group {
                    Some(group) => format!("group `{group}` only"),
                    None => "every group".to_string(),
                };
                out.push_str(&format!(
                    "replayed {id} (key {}) to {} as {} for {whom}; deleted it from {key}\n",
                    replayed.key, replayed.target, replayed.new_id,
                ));
                replayed_json.push(serde_json::json!({
                    "id": id,
                    "key": replayed.key,
                    "stream": replayed.target,
                    "newId": replayed.new_id,
                    "group": replayed.group,
                }));
            }
            // One bad entry must not stop a bulk replay; a single one is an error.
            Err(e) if matches!(selection, Selection::All { .. }) => {
                skipped += 1;
                out.push_str(&format!("skipped {id}: {e}\n"));
                skipped_json.push(serde_json::json!({ "id": id, "error": e.to_string() }));
            }
            Err(e) => return Err(e),
        }
    }
    if json {
        return Ok(json_text(&serde_json::json!({
            "dlq": key,
            "replayed": replayed_json,
            "skipped": skipped_json,
        })));
    }
    if matches!(selection, Selection::All { .. }) {
        out.push_str(&format!(
            "replayed {} of {} dead letters from {key}\n",
            entries.len() - skipped,
            entries.len()
        ));
    }
    Ok(out)
}

async fn replay_one(
    ctx: &mut Ctx,
    topology: &Topology,
    key: &str,
    id: &str,
    fields: &[(String, Value)],
    to_all_groups: bool,
) -> Result<Replayed, CliError> {
    let missing = |field: &str| CliError::Corrupt {
        key: key.to_string(),
        reason: format!("dead letter {id} has no `{field}` field: cannot replay it"),
    };
    let partition_key = bytes_field(fields, KEY_FIELD).ok_or_else(|| missing(KEY_FIELD))?;
    let payload = bytes_field(fields, PAYLOAD_FIELD).ok_or_else(|| missing(PAYLOAD_FIELD))?;
    let headers = match bytes_field(fields, HEADERS_FIELD) {
        None => Headers::new(),
        Some(raw) => Headers::decode(&raw).map_err(|e| CliError::Corrupt {
            key: key.to_string(),
            reason: format!("dead letter {id}: {e}: cannot replay it"),
        })?,
    };
    let (target, new_id, group) = if to_all_groups {
        let producer = Producer::new(ctx.conn.clone(), topology.prefix()).await?;
        let receipt = producer
            .send_bytes_with_headers(&partition_key, &payload, &headers)
            .await?;
        (receipt.stream, receipt.id, None)
    } else {
        let group = text_field(fields, dlq::GROUP).ok_or_else(|| CliError::Corrupt {
            key: key.to_string(),
            reason: format!(
                "dead letter {id} names no group (no `{}` field): replay it with --to-all-groups",
                dlq::GROUP
            ),
        })?;
        let target = topology.stream_key(topology.shard_for_key(&partition_key));
        // Every other group acknowledges the replay unhandled: if this one does not read the shard,
        // nobody would handle it.
        if !ctx
            .consumer_groups(&target)
            .await?
            .iter()
            .any(|g| g.name == group)
        {
            return Err(CliError::Refused(format!(
                "dead letter {id}: group `{group}` has no consumer group on {target}, so nothing would \
                 handle the replay (use --to-all-groups to publish it for every group)"
            )));
        }
        let mut xadd = redis::cmd("XADD");
        xadd.arg(&target)
            .arg("*")
            .arg(KEY_FIELD)
            .arg(&partition_key)
            .arg(PAYLOAD_FIELD)
            .arg(&payload);
        if !headers.is_empty() {
            xadd.arg(HEADERS_FIELD).arg(headers.encode());
        }
        let new_id: String = xadd
            .arg(ONLY_GROUP_FIELD)
            .arg(&group)
            .arg(REPLAY_OF_FIELD)
            .arg(id)
            .query_async(&mut ctx.conn)
            .await?;
        (target, new_id, Some(group))
    };
    let _: u64 = redis::cmd("XDEL")
        .arg(key)
        .arg(id)
        .query_async(&mut ctx.conn)
        .await?;
    Ok(Replayed {
        key: String::from_utf8_lossy(&partition_key).into_owned(),
        target,
        new_id,
        group,
    })
}

/// One replayed dead letter.
struct Replayed {
    /// Its partition key.
    key: String,
    /// The shard stream it went to.
    target: String,
    /// Its id there.
    new_id: String,
    /// The one group it is for (`None`: every group).
    group: Option<String>,
}

/// Deletes the selected dead letters from the DLQ, after confirmation.
pub async fn purge(
    ctx: &mut Ctx,
    stream: &str,
    selection: &Selection,
    yes: bool,
    json: bool,
) -> Result<String, CliError> {
    let key = dlq_key(stream);
    let entries = selected(ctx, &key, selection).await?;
    if entries.is_empty() {
        if json {
            return Ok(json_text(
                &serde_json::json!({ "dlq": key, "deleted": 0, "ids": [] }),
            ));
        }
        let group = match selection {
            Selection::All { group } => group.as_deref(),
            Selection::Ids(_) => None,
        };
        return Ok(nothing(&key, group));
    }
    confirm(
        &format!(
            "delete {} dead letter{} from {key} for good?",
            entries.len(),
            plural(entries.len())
        ),
        yes,
    )?;
    let mut deleted = 0u64;
    for chunk in entries.chunks(PAGE) {
        let mut cmd = redis::cmd("XDEL");
        cmd.arg(&key);
        for (id, _) in chunk {
            cmd.arg(id);
        }
        deleted += cmd.query_async::<u64>(&mut ctx.conn).await?;
    }
    if json {
        let ids: Vec<&str> = entries.iter().map(|(id, _)| id.as_str()).collect();
        return Ok(json_text(
            &serde_json::json!({ "dlq": key, "deleted": deleted, "ids": ids }),
        ));
    }
    Ok(format!(
        "deleted {deleted} dead letter{} from {key}\n",
        plural(deleted as usize)
    ))
}

fn nothing(key: &str, group: Option<&str>) -> String {
    match group {
        Some(group) => format!("no dead letters of group `{group}` in {key}: nothing to do\n"),
        None => format!("no dead letters in {key}: nothing to do\n"),
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// Asks on the terminal unless `yes`; refuses when stdin is not a terminal (a script must say `--yes`).
fn confirm(question: &str, yes: bool) -> Result<(), CliError> {
    if yes {
        return Ok(());
    }
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return Err(CliError::Refused(format!(
            "{question} This needs confirmation: pass --yes (stdin is not a terminal); nothing changed"
        )));
    }
    let mut stderr = std::io::stderr();
    write!(stderr, "{question} [y/N] ")?;
    stderr.flush()?;
    let mut answer = String::new();
    stdin.lock().read_line(&mut answer)?;
    if matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes") {
        Ok(())
    } else {
        Err(CliError::Refused("not confirmed; nothing changed".into()))
    }
}

/// The entries a selection names; an unknown id is an error.
async fn selected(ctx: &mut Ctx, key: &str, selection: &Selection) -> Result<Vec<Entry>, CliError> {
    match selection {
        Selection::Ids(ids) => {
            let mut entries = Vec::with_capacity(ids.len());
            for id in ids {
                entries.push(one(ctx, key, id).await?);
            }
            Ok(entries)
        }
        Selection::All { group } => matching(ctx, key, group.as_deref(), None).await,
    }
}

async fn one(ctx: &mut Ctx, key: &str, id: &str) -> Result<Entry, CliError> {
    let entries: Vec<Entry> = redis::cmd("XRANGE")
        .arg(key)
        .arg(id)
        .arg(id)
        .query_async(&mut ctx.conn)
        .await?;
    entries
        .into_iter()
        .next()
        .ok_or_else(|| CliError::NotFound(format!("no dead letter with id {id} in {key}")))
}

/// The oldest entries of `key` (of `group` only, if given), at most `limit`; reads in pages up to the
/// newest entry that existed when it started, so entries added meanwhile do not keep it going.
async fn matching(
    ctx: &mut Ctx,
    key: &str,
    group: Option<&str>,
    limit: Option<usize>,
) -> Result<Vec<Entry>, CliError> {
    let newest: Vec<Entry> = redis::cmd("XREVRANGE")
        .arg(key)
        .arg("+")
        .arg("-")
        .arg("COUNT")
        .arg(1)
        .query_async(&mut ctx.conn)
        .await?;
    let Some((end, _)) = newest.into_iter().next() else {
        return Ok(Vec::new());
    };
    let limit = limit.unwrap_or(usize::MAX);
    let mut out = Vec::new();
    let mut start = "-".to_string();
    loop {
        let page: Vec<Entry> = redis::cmd("XRANGE")
            .arg(key)
            .arg(&start)
            .arg(&end)
            .arg("COUNT")
            .arg(PAGE)
            .query_async(&mut ctx.conn)
            .await?;
        let Some((last, _)) = page.last() else {
            return Ok(out);
        };
        start = format!("({last}");
        let full = page.len() == PAGE;
        for entry in page {
            if group.is_none_or(|g| text_field(&entry.1, dlq::GROUP).as_deref() == Some(g)) {
                out.push(entry);
                if out.len() >= limit {
                    return Ok(out);
                }
            }
        }
        if !full {
            return Ok(out);
        }
    }
}

fn entry_json((id, fields): &Entry) -> serde_json::Value {
    let text = |name: &str| text_field(fields, name);
    let payload = bytes_field(fields, PAYLOAD_FIELD).map(|p| {
        serde_json::from_slice::<serde_json::Value>(&p)
            .unwrap_or_else(|_| serde_json::Value::String(payload_text(&p)))
    });
    serde_json::json!({
        "id": id,
        "group": text(dlq::GROUP),
        "shard": text(dlq::SHARD).and_then(|s| s.parse::<u32>().ok()),
        "sourceStream": text(dlq::SOURCE_STREAM),
        "sourceId": text(dlq::SOURCE_ID),
        "consumer": text(dlq::CONSUMER),
        "deliveries": text(dlq::DELIVERY_COUNT).and_then(|s| s.parse::<u64>().ok()),
        "key": text(KEY_FIELD),
        "error": text(dlq::ERROR),
        "payload": payload,
    })
}

/// A payload as text: UTF-8 as is, anything else as `0x` and hex.
fn payload_text(payload: &[u8]) -> String {
    match std::str::from_utf8(payload) {
        Ok(text) => text.to_string(),
        Err(_) => {
            let hex: String = payload.iter().map(|b| format!("{b:02x}")).collect();
            format!("0x{hex}")
        }
    }
}

/// Line breaks as spaces, so a table row stays one line.
fn one_line(text: &str) -> String {
    text.replace(['\n', '\r'], " ")
}

fn text_field(fields: &[(String, Value)], name: &str) -> Option<String> {
    fields
        .iter()
        .find(|(f, _)| f == name)
        .and_then(|(_, v)| value_text(v))
}

fn bytes_field(fields: &[(String, Value)], name: &str) -> Option<Vec<u8>> {
    fields
        .iter()
        .find(|(f, _)| f == name)
        .and_then(|(_, v)| match v {
            Value::BulkString(bytes) => Some(bytes.clone()),
            other => value_text(other).map(String::into_bytes),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_print_as_text_or_hex() {
        assert_eq!(payload_text(br#"{"a":1}"#), r#"{"a":1}"#);
        assert_eq!(payload_text(&[0xff, 0x00]), "0xff00");
        assert_eq!(one_line("a\nb\r\nc"), "a b  c");
    }
}
