//! The consumed-before check of the moved-key rule: has a group read and acknowledged a shard up to a cut?

use redis::aio::ConnectionLike;
use redis::Script;

use super::TopologyError;

const CONSUMED_SCRIPT: &str = include_str!("consumed.lua");

/// Whether a group (or every group) consumed a stream below a bound; see [`consumed_before`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConsumedBefore {
    /// Every entry below the bound was delivered and acknowledged (or the stream / group does not exist).
    Yes,
    /// Not yet.
    No {
        /// Redis time of the check, in ms.
        now_ms: u64,
        /// The group still holding entries below the bound; `None` when Redis time has not reached the
        /// bound yet (entries below it may still be written).
        group: Option<String>,
    },
}

/// Whether consumer group `group` (every group when `None`) of the stream key `stream` has consumed every
/// entry with an id below `{before_ms}-0`: Redis time has reached `before_ms` (no entry below it can be
/// added any more), the group's last-delivered-id is at or past the last entry below it, and none of them
/// is pending. A group that does not exist on the stream counts as done (it never reads it), and so does a
/// stream that does not exist (a retired shard). One script, so the answer is consistent.
pub async fn consumed_before<C>(
    conn: &mut C,
    stream: &str,
    group: Option<&str>,
    before_ms: u64,
) -> Result<ConsumedBefore, TopologyError>
where
    C: ConnectionLike + Send,
{
    if before_ms == 0 {
        return Ok(ConsumedBefore::Yes);
    }
    let (consumed, now, blocking): (i64, String, String) = Script::new(CONSUMED_SCRIPT)
        .key(stream)
        .arg(group.unwrap_or(""))
        .arg(before_ms)
        .arg(format!("{}-{}", before_ms - 1, u64::MAX))
        .invoke_async(conn)
        .await?;
    if consumed == 1 {
        return Ok(ConsumedBefore::Yes);
    }
    Ok(ConsumedBefore::No {
        now_ms: now.parse().unwrap_or(0),
        group: (!blocking.is_empty()).then_some(blocking),
    })
}
