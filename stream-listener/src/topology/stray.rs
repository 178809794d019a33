//! Entries written to the logical stream's own name: `XADD orders ...` by hand, or a producer in another
//! language that forgot the shard suffix, creates a Redis stream `orders` next to the shard streams
//! `orders:0..n`, which no group reads. Nothing fails, so it is looked for: the runtime's topology
//! follower warns about it, and the CLI's `status` shows it.

use redis::aio::ConnectionLike;

use super::{Topology, TopologyError};

impl Topology {
    /// The number of entries in a Redis stream at the logical name `prefix` itself (`None` when there is
    /// no such stream, or the key holds another type): entries nobody reads ([`stray_warning`]).
    pub async fn stray_entries<C>(conn: &mut C, prefix: &str) -> Result<Option<u64>, TopologyError>
    where
        C: ConnectionLike + Send,
    {
        crate::routing::validate_prefix(prefix)?;
        let kind: String = redis::cmd("TYPE").arg(prefix).query_async(conn).await?;
        if kind != "stream" {
            return Ok(None);
        }
        Ok(Some(
            redis::cmd("XLEN").arg(prefix).query_async(conn).await?,
        ))
    }
}

/// What to say about `entries` found at the logical name `prefix` of a stream with `shard_count` shards.
pub fn stray_warning(prefix: &str, shard_count: u32, entries: u64) -> String {
    let last = shard_count.saturating_sub(1);
    format!(
        "the Redis stream `{prefix}` (the logical stream's own name) holds {entries} entries that no \
         group reads: the shards are `{prefix}:0`..`{prefix}:{last}`; produce with \
         stream_listener::Producer, or XADD to the key's shard (`stream-listener route --stream {prefix} \
         KEY` prints it)"
    )
}

/// Whether the follower warns about `now` entries at the logical name, having last seen `last`: when
/// they first appear and whenever more arrive, not on every tick.
pub(crate) fn worth_warning(last: Option<u64>, now: Option<u64>) -> bool {
    match (last, now) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some(last), Some(now)) => now > last,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_follower_warns_when_stray_entries_appear_or_grow() {
        assert!(worth_warning(None, Some(1)));
        assert!(worth_warning(Some(1), Some(3)));
        assert!(!worth_warning(Some(3), Some(3)), "nothing new");
        assert!(!worth_warning(Some(3), Some(2)), "trimmed by hand");
        assert!(!worth_warning(None, None));
        assert!(!worth_warning(Some(3), None), "deleted");
    }

    #[test]
    fn the_warning_names_the_shards_and_the_way_out() {
        let text = stray_warning("orders", 16, 2);
        assert!(text.contains("`orders` (the logical stream's own name) holds 2 entries"));
        assert!(text.contains("`orders:0`..`orders:15`"));
        assert!(text.contains("stream-listener route --stream orders KEY"));
    }
}
