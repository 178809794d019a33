//! `route`: the shard and shard stream a partition key goes to, under the stream's current topology, as
//! the library's producer routes it (for producers in other languages, and for finding a key's entries).

use stream_listener::topology::Topology;

use crate::error::CliError;
use crate::redis_ctx::Ctx;
use crate::table::{json_text, Table};

/// Routes each of `keys` (their UTF-8 bytes) with the stream's shard count from its topology record.
pub async fn run(
    ctx: &mut Ctx,
    stream: &str,
    keys: &[String],
    json: bool,
) -> Result<String, CliError> {
    let topology = Topology::load(&mut ctx.conn, stream).await?;
    let routes: Vec<(&str, u32, String)> = keys
        .iter()
        .map(|key| {
            let shard = topology.shard_for_key(key.as_bytes());
            (key.as_str(), shard, topology.stream_key(shard))
        })
        .collect();
    if json {
        let rows: Vec<_> = routes
            .iter()
            .map(|(key, shard, stream_key)| {
                serde_json::json!({ "key": key, "shard": shard, "streamKey": stream_key })
            })
            .collect();
        return Ok(json_text(&serde_json::json!({
            "stream": stream,
            "shardCount": topology.shard_count(),
            "topologyVersion": topology.version(),
            "routes": rows,
        })));
    }
    let mut table = Table::new(&["KEY", "SHARD", "STREAM"]);
    for (key, shard, stream_key) in routes {
        table.row(vec![key.to_string(), shard.to_string(), stream_key]);
    }
    let mut out = table.render();
    out.push_str(&format!(
        "\nstream `{stream}`: {} shards (topology version {})\n",
        topology.shard_count(),
        topology.version()
    ));
    Ok(out)
}
