//! The fence of one ownership of a shard: how Redis itself refuses a superseded owner.
//!
//! The member checks its self-fencing deadline right before every command (see the `job` module), but a
//! command that passed the check can still reach Redis late: the process froze with it queued in redis-rs
//! (a GC pause, SIGSTOP, a throttled container), or the client retried it after a reconnect. Only Redis can
//! refuse it, so every ownership carries a fence there:
//!
//! * The fence is an empty stream, [`names::shard_fence`] (`sl:fence:{<shard>}:<token>:<group>`), with a
//!   consumer group named like the shard's. The owner installs it ([`fence.lua`](INSTALL_SCRIPT)) before
//!   its first command on the shard. The shard's owner record, [`names::shard_owner`], holds the newest
//!   owner's fencing token; installing a newer token deletes the previous owner's fence, and an older one
//!   is refused (a zombie's install that arrives late changes nothing).
//! * Every group read names the fence as a second stream: `XREADGROUP ... STREAMS <shard> <fence> > >`.
//!   Redis looks up every stream's group before it serves any, so a read whose fence is gone fails with
//!   `NOGROUP` and delivers nothing. The fence never has entries, so the reply is the shard's alone, and the
//!   extra lookup costs next to nothing.
//! * Claims (`XAUTOCLAIM`, `XCLAIM`) and the consumer clean-up are single-key commands: they run inside
//!   [`fenced.lua`](FENCED_SCRIPT) (the clean-up inside its own script), which checks that the fence
//!   exists first.
//!
//! Tokens are member epochs, which grow with every grant and never go back across a loss of the group's
//! metadata (see `coordinator`), so the newest grant of a shard always wins. Keys share the shard's cluster
//! slot (hash tag), so the scripts and the two-stream read work on a cluster.
//!
//! A fence that is missing without a newer owner (Redis restarted empty, the key deleted) is installed
//! again by the next job after a fresh deadline check: the fence then adds nothing to the client's own
//! check, as before it.
//!
//! Not fenced in Redis, on purpose:
//! * Acknowledgements. An ack names only entries this member handled to the end, so one that arrives late
//!   acknowledges work that was done: the next owner, which claimed those entries, handles them again and
//!   its own ack finds nothing. Nothing is lost or reordered. Running every ack through the script cost a
//!   fifth of the consumer's throughput with 16 members (`benches/throughput.rs`, scenario `spread`).
//! * The dead-letter `XADD` (the dead-letter stream may live in another slot; a late one duplicates a
//!   dead letter, which the docs already allow), and re-creating a lost consumer group.

use std::sync::Arc;

use redis::{RedisError, RedisResult, Script};

use crate::connection::Connection;
use crate::names;

/// Installs an ownership's fence (its header says what `KEYS` and `ARGV` are).
pub(crate) const INSTALL_SCRIPT: &str = include_str!("fence.lua");

/// Runs a single-key command (a claim) only while the ownership's fence exists.
pub(crate) const FENCED_SCRIPT: &str = include_str!("fenced.lua");

/// The error code of a command [`FENCED_SCRIPT`] refused, or of an install a newer token refused.
pub(crate) const FENCED: &str = "FENCED";

/// `NOGROUP`: the shard stream or its consumer group does not exist (Redis restarted empty, a flush).
pub(crate) fn is_missing_group(error: &RedisError) -> bool {
    error.code() == Some("NOGROUP")
}

/// The Redis keys of one ownership of a shard by a group.
#[derive(Debug)]
pub(crate) struct Fence {
    /// This ownership's fence stream.
    pub(crate) key: Arc<str>,
    owner: String,
    shard_key: String,
    token: i64,
}

impl Fence {
    /// The fence of `group`'s ownership of shard stream `shard_key` at fencing token `token`.
    pub(crate) fn new(shard_key: &str, group: &str, token: i64) -> Self {
        Self {
            key: names::shard_fence(shard_key, group, token).into(),
            owner: names::shard_owner(shard_key, group),
            shard_key: shard_key.to_owned(),
            token,
        }
    }

    /// Installs the fence: deletes the previous owner's and records this token. A [`FENCED`] error when a
    /// newer token is recorded: this ownership is over, whatever the member was told. Idempotent (a retry
    /// after a lost answer installs nothing twice).
    ///
    /// The previous owner's fence is named by the token in the owner record, so the record is read first
    /// and the script (which may touch only the keys it is given) installs only if the record still holds
    /// what was read; a record that changed in between is read again.
    pub(crate) async fn install(
        &self,
        script: &Script,
        conn: &mut Connection,
        group: &str,
    ) -> RedisResult<()> {
        for _ in 0..INSTALL_ATTEMPTS {
            let current: Option<String> =
                redis::cmd("GET").arg(&self.owner).query_async(conn).await?;
            let previous = current
                .as_deref()
                .and_then(|t| t.parse::<i64>().ok())
                .filter(|&t| t > 0)
                .map_or_else(
                    || self.key.to_string(),
                    |t| names::shard_fence(&self.shard_key, group, t),
                );
            let status: i64 = script
                .key(&self.owner)
                .key(&*self.key)
                .key(previous)
                .arg(group)
                .arg(self.token)
                .arg(current.as_deref().unwrap_or(""))
                .invoke_async(conn)
                .await?;
            return match status {
                0 => Err(redis::make_extension_error(
                    FENCED.into(),
                    Some(format!(
                        "a newer owner's fence is in place (ours: {}): this ownership is over",
                        self.key
                    )),
                )),
                2 => {
                    tracing::warn!(owner = %self.owner, fence = %self.key, "the shard's owner record held no fencing token (corrupt?): replaced; a previous owner's fence, if any, stays");
                    Ok(())
                }
                3 => continue,
                _ => Ok(()),
            };
        }
        Err(redis::make_extension_error(
            "BUSY".into(),
            Some(format!(
                "the owner record {} changed under every one of {INSTALL_ATTEMPTS} installs",
                self.owner
            )),
        ))
    }
}

/// Reads of the owner record before an install gives up (each lost only to another owner's install in
/// between, which is rare: a shard changes owner once per hand-off).
const INSTALL_ATTEMPTS: usize = 8;

/// Whether `error` says this ownership's fence is gone: a read's `NOGROUP` naming it, or [`FENCED_SCRIPT`]'s
/// refusal. (A `NOGROUP` naming the shard stream is the shard's own group gone, handled apart.)
pub(crate) fn is_fence_error(error: &RedisError, fence: &Fence) -> bool {
    match error.code() {
        Some(FENCED) => true,
        Some("NOGROUP") => error.to_string().contains(&*fence.key),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fence_error_is_a_refusal_or_a_nogroup_naming_the_fence() {
        let fence = Fence::new("orders:3", "billing", 42);
        let ext =
            |code: &str, detail: String| redis::make_extension_error(code.into(), Some(detail));
        assert!(is_fence_error(&ext(FENCED, "gone".into()), &fence));
        let nogroup = |key: &str| {
            ext(
                "NOGROUP",
                format!("No such key '{key}' or consumer group 'billing' in XREADGROUP with GROUP option"),
            )
        };
        assert!(is_fence_error(&nogroup(&fence.key), &fence));
        assert!(!is_fence_error(&nogroup("orders:3"), &fence));
        assert!(!is_fence_error(&ext("ERR", fence.key.to_string()), &fence));
    }
}
