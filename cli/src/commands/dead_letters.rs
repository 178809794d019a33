//! `dead-letters`: list a stream's dead letters, or replay one.

use redis::Value;
use stream_listener::consumer::{dead_letter_fields as dlq, KEY_FIELD, PAYLOAD_FIELD};
use stream_listener::Producer;

use crate::error::CliError;
use crate::redis_ctx::{value_text, Ctx};
use crate::table::{or_dash, truncate, Table};

/// Widest error text shown in the list.
const ERROR_WIDTH: usize = 72;

/// One stream entry: id and raw field/value pairs.
type Entry = (String, Vec<(String, Value)>);

/// The default dead-letter stream of `stream`: `<stream>:dlq`.
fn dlq_key(stream: &str) -> String {
    format!("{stream}:dlq")
}

/// Lists the oldest `count` entries of `<stream>:dlq`: group, shard, source id, deliveries, key, error.
pub async fn list(ctx: &mut Ctx, stream: &str, count: usize) -> Result<String, CliError> {
    let key = dlq_key(stream);
    let total = ctx.stream_len(&key).await?;
    if total == 0 {
        return Ok(format!("no dead letters in {key}\n"));
    }
    let entries: Vec<Entry> = redis::cmd("XRANGE")
        .arg(&key)
        .arg("-")
        .arg("+")
        .arg("COUNT")
        .arg(count)
        .query_async(&mut ctx.conn)
        .await?;
    let mut table = Table::new(&[
        "ID",
        "GROUP",
        "SHARD",
        "SOURCE ID",
        "DELIVERIES",
        "KEY",
        "ERROR",
    ]);
    for (id, fields) in &entries {
        let field = |name: &str| text_field(fields, name);
        table.row(vec![
            id.clone(),
            or_dash(field(dlq::GROUP)),
            or_dash(field(dlq::SHARD)),
            or_dash(field(dlq::SOURCE_ID)),
            or_dash(field(dlq::DELIVERY_COUNT)),
            or_dash(field(KEY_FIELD)),
            or_dash(field(dlq::ERROR).map(|e| truncate(&e, ERROR_WIDTH))),
        ]);
    }
    let mut out = table.render();
    out.push_str(&format!(
        "\n{} of {total} dead letters in {key}\n",
        entries.len()
    ));
    Ok(out)
}

/// Publishes dead letter `id` again with its original key and payload (fields `k` and `p`), routed by the
/// library's producer to the key's shard under the current topology, then deletes it from the DLQ.
/// Publishing comes first: a failure in between leaves a duplicate, never a loss.
pub async fn replay(ctx: &mut Ctx, stream: &str, id: &str) -> Result<String, CliError> {
    let key = dlq_key(stream);
    let entries: Vec<Entry> = redis::cmd("XRANGE")
        .arg(&key)
        .arg(id)
        .arg(id)
        .query_async(&mut ctx.conn)
        .await?;
    let Some((_, fields)) = entries.into_iter().next() else {
        return Err(CliError::NotFound(format!(
            "no dead letter with id {id} in {key}"
        )));
    };
    let missing = |field: &str| CliError::Corrupt {
        key: key.clone(),
        reason: format!("dead letter {id} has no `{field}` field: cannot replay it"),
    };
    let partition_key = bytes_field(&fields, KEY_FIELD).ok_or_else(|| missing(KEY_FIELD))?;
    let payload = bytes_field(&fields, PAYLOAD_FIELD).ok_or_else(|| missing(PAYLOAD_FIELD))?;
    let producer = Producer::new(ctx.conn.clone(), stream).await?;
    let receipt = producer.send_bytes(&partition_key, &payload).await?;
    let _: u64 = redis::cmd("XDEL")
        .arg(&key)
        .arg(id)
        .query_async(&mut ctx.conn)
        .await?;
    Ok(format!(
        "replayed {id} (key {}) to {} as {}; deleted it from {key}\n",
        String::from_utf8_lossy(&partition_key),
        receipt.stream,
        receipt.id
    ))
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
