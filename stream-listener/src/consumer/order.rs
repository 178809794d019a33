//! The order barrier of a resize: whether an entry may be handled now, or waits for its key's old shard.
//!
//! Before an entry is handled, its key is placed with [`Topology::placement`](crate::topology::Topology::placement)
//! against the stream's topology (cached, re-read every [`LAYOUT_REFRESH`](super::shard_io::LAYOUT_REFRESH), and
//! at once when an entry newer than the cached read is routed here by neither layout). An entry of a key
//! that moved here with the last resize waits until the group has consumed the key's old shard below
//! `min(entry id, cut)`. Until then the job stops at that entry (later entries of the shard wait too, so
//! per-key order holds within the shard), acknowledges what it finished, and hands the rest of the batch
//! back to the scheduler, which retries the shard after a short delay, starting with those entries. They
//! stay pending in Redis under this consumer, so a revoke or crash hands them to the next owner as usual;
//! they are kept in memory rather than re-claimed so that waiting does not raise their delivery count
//! (every `XAUTOCLAIM` adds one, and enough of them would dead-letter an entry that never failed).
//!
//! A key that moved out of a shard a shrink removed waits the same way, for that shard's entries older than
//! its own while the shard drains (see [`Topology::placement`](crate::topology::Topology::placement)). An
//! entry about to be handled that a producer wrote with a stale layout after the cut is counted and logged
//! (`ShardIo::note_stale_write`).

use std::time::Duration;

use super::entry::Entry;
use super::shard_io::{Layout, ShardIo, MOVED_KEY_RETRY};
use crate::topology::Placement;

/// The order barrier of a resize: `None` if `entry` may be handled now, else how long to defer it (see the
/// module docs). The topology comes from the consumer's cache, at most `LAYOUT_REFRESH` old when the
/// entry is placed; `refreshed` limits forced re-reads to one per job.
pub(super) async fn gate(
    io: &ShardIo,
    shard: u32,
    refreshed: &mut bool,
    entry: &Entry,
) -> Option<Duration> {
    let (Some(key), Some(entry_ms)) = (entry.raw_key(), entry.id_ms()) else {
        return None;
    };
    let mut layout: Option<Layout> = io.layout(false).await;
    loop {
        let view = layout.as_ref()?;
        // Routed with a newer topology than ours: re-read it once.
        if !*refreshed
            && entry
                .topology_version()
                .is_some_and(|v| v > view.topology.version())
        {
            *refreshed = true;
            layout = io.layout(true).await;
            continue;
        }
        match view.topology.placement(key, shard, entry_ms) {
            Placement::Current | Placement::Previous => return None,
            Placement::Misrouted => {
                // Newer than our read: routed by a topology we have not seen yet. Re-read it once.
                if *refreshed || entry_ms < view.read_ms {
                    return None;
                }
                *refreshed = true;
                layout = io.layout(true).await;
            }
            Placement::Moved { from, before_ms } => {
                let version = view.topology.version();
                return match io.old_shard_consumed(version, from, before_ms).await {
                    Ok(wait) => wait,
                    Err(error) => {
                        tracing::warn!(shard, from, %error, "cannot check the moved key's old shard; deferring");
                        Some(MOVED_KEY_RETRY)
                    }
                };
            }
        }
    }
}
