//! Waiting on a running runtime, for tests and smoke checks: until a listener owns its shards
//! ([`RunningRuntime::wait_until_assigned`]), until a group has nothing left to do
//! ([`RunningRuntime::wait_until_idle`]). Both have a deadline and say what they saw last when it passes.
//! Whether a shard is idle is the pure [`shard_idle`].

use std::time::Duration;

use redis::Value;
use tokio::time::Instant;

use crate::connection::ConnectOptions;
use crate::coordinator::projection::GroupState;
use crate::member::session::Phase;
use crate::reply::GroupInfo;
use crate::topology::{Topology, TopologyError};

use super::running::RunningRuntime;

/// How often [`RunningRuntime::wait_until_idle`] looks at the group's shards.
const IDLE_POLL: Duration = Duration::from_millis(20);

/// Why a wait of [`RunningRuntime`] gave up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WaitError {
    /// The condition did not hold before the deadline.
    #[error("{what}: not within {} ms; last seen: {last}", .timeout.as_millis())]
    TimedOut {
        /// What was waited for.
        what: String,
        /// How long.
        timeout: Duration,
        /// What the wait saw last, for the test's failure message.
        last: String,
    },
    /// No listener of this runtime has that id ([`RunningRuntime::listener_ids`]).
    #[error("no listener with id `{id}` in this runtime (listeners: {})", .known.join(", "))]
    UnknownListener {
        /// The id asked for.
        id: String,
        /// The ids this runtime has.
        known: Vec<String>,
    },
    /// Redis failed while the group's shards were looked at.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// The stream's topology could not be read.
    #[error(transparent)]
    Topology(#[from] TopologyError),
}

impl RunningRuntime {
    /// Waits until the listener `listener_id` (a member id, see [`listener_ids`](Self::listener_ids))
    /// owns its shards: it is a member of its group, its lease is valid, and the group is stable (every
    /// member owns exactly its target, nothing on its way in or out). Returns the shards it owns, which
    /// may be none when the group has more members than shards.
    ///
    /// ```no_run
    /// # async fn demo(running: stream_listener::RunningRuntime) -> Result<(), stream_listener::runtime::WaitError> {
    /// use std::time::Duration;
    /// let id = running.listener_ids().remove(0);
    /// let shards = running.wait_until_assigned(&id, Duration::from_secs(10)).await?;
    /// assert!(!shards.is_empty());
    /// # Ok(()) }
    /// ```
    pub async fn wait_until_assigned(
        &self,
        listener_id: &str,
        timeout: Duration,
    ) -> Result<Vec<u32>, WaitError> {
        let member = self
            .members
            .iter()
            .find(|m| m.member_id == listener_id)
            .ok_or_else(|| WaitError::UnknownListener {
                id: listener_id.to_owned(),
                known: self.listener_ids(),
            })?;
        let deadline = Instant::now() + timeout;
        let mut status = member.status.clone();
        // Every heartbeat publishes a status, so the lease is looked at again at least once an interval.
        loop {
            {
                let now = status.borrow_and_update();
                if now.phase == Phase::Member
                    && member.deadline.is_valid()
                    && now.group_state == Some(GroupState::Stable)
                    && now.pending == 0
                    && now.revoking == 0
                {
                    return Ok(now.owned.clone());
                }
            }
            let changed = tokio::time::timeout_at(deadline, status.changed()).await;
            if !matches!(changed, Ok(Ok(()))) {
                let now = status.borrow();
                let stopped = if matches!(changed, Ok(Err(_))) {
                    " (its heartbeat loop has stopped)"
                } else {
                    ""
                };
                return Err(WaitError::TimedOut {
                    what: format!("listener {listener_id} owning its shards"),
                    timeout,
                    last: format!(
                        "phase {:?}, group {:?}, owned {:?}, {} on their way in, {} on their way out, lease {}{stopped}",
                        now.phase,
                        now.group_state,
                        now.owned,
                        now.pending,
                        now.revoking,
                        if member.deadline.is_valid() { "valid" } else { "not valid" },
                    ),
                });
            }
        }
    }

    /// Waits until `group` has nothing left to do on `stream`: on every shard it has read every entry
    /// (lag 0) and acknowledged every one it read (pending 0, so no retry is waiting out its backoff).
    /// Dead-lettered entries count as done. Looks every 20 ms, with one pipeline of `XINFO GROUPS` and
    /// `XREVRANGE + - COUNT 1` per shard (so it works on every supported Redis, and after entries were
    /// deleted, when Redis cannot tell the lag).
    ///
    /// ```no_run
    /// # async fn demo(running: stream_listener::RunningRuntime) -> Result<(), stream_listener::runtime::WaitError> {
    /// use std::time::Duration;
    /// // ... publish the test's entries, then:
    /// running.wait_until_idle("orders", "billing", Duration::from_secs(10)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn wait_until_idle(
        &self,
        stream: &str,
        group: &str,
        timeout: Duration,
    ) -> Result<(), WaitError> {
        let deadline = Instant::now() + timeout;
        let options = ConnectOptions {
            response_timeout: Some(timeout.max(Duration::from_millis(100))),
            ..ConnectOptions::default()
        };
        let mut conn = self.client.connect(options).await?;
        loop {
            let topology = Topology::load(&mut conn, stream).await?;
            let shards = topology.read_shard_count();
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for shard in 0..shards {
                let key = crate::names::shard_stream(stream, shard);
                pipe.cmd("XINFO").arg("GROUPS").arg(&key);
                pipe.cmd("XREVRANGE")
                    .arg(&key)
                    .arg("+")
                    .arg("-")
                    .arg("COUNT")
                    .arg(1);
            }
            let replies: Vec<redis::RedisResult<Value>> = pipe.query_async(&mut conn).await?;
            let busy: Vec<String> = (0..shards)
                .zip(replies.chunks(2))
                .filter_map(|(shard, pair)| {
                    let info = pair[0].as_ref().ok().and_then(|reply| {
                        crate::reply::xinfo_groups(reply)
                            .ok()?
                            .into_iter()
                            .find(|info| info.name == group)
                    });
                    let newest = pair[1]
                        .as_ref()
                        .ok()
                        .and_then(|reply| crate::reply::entries(reply.clone()).pop())
                        .map(|entry| entry.id);
                    shard_idle(info.as_ref(), newest.as_deref())
                        .err()
                        .map(|why| format!("shard {shard}: {why}"))
                })
                .collect();
            if busy.is_empty() {
                return Ok(());
            }
            if Instant::now() + IDLE_POLL > deadline {
                return Err(WaitError::TimedOut {
                    what: format!("group {group} of stream {stream} idle"),
                    timeout,
                    last: busy.join("; "),
                });
            }
            tokio::time::sleep(IDLE_POLL).await;
        }
    }
}

/// Whether a shard is idle for a group: the group exists there, has nothing pending, and no entry of the
/// stream is newer than the last one it was delivered (`newest`: the stream's newest entry, `None` when
/// it has none). `Err` says why not.
pub(crate) fn shard_idle(info: Option<&GroupInfo>, newest: Option<&str>) -> Result<(), String> {
    let Some(info) = info else {
        return Err("the group is not there (yet)".into());
    };
    let pending = info.pending.unwrap_or(0);
    if pending > 0 {
        return Err(format!("{pending} pending"));
    }
    let Some(newest) = newest else {
        return Ok(());
    };
    let last = info.last_delivered_id.as_deref().unwrap_or("0-0");
    match (entry_id(newest), entry_id(last)) {
        (Some(newest_id), Some(last_id)) if newest_id <= last_id => Ok(()),
        _ => Err(format!(
            "entry {newest} not read yet (last delivered {last})"
        )),
    }
}

/// A stream entry id `ms-seq` as a pair that orders like the ids.
fn entry_id(id: &str) -> Option<(u64, u64)> {
    let (ms, seq) = id.split_once('-')?;
    Some((ms.parse().ok()?, seq.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::consumer::PauseHandle;
    use crate::member::heartbeat::MemberStatus;
    use crate::member::lifecycle::OwnershipDeadline;
    use crate::runtime::member::RunningMember;
    use tokio::sync::{mpsc, watch};

    /// A runtime of one member `m0` whose status the test publishes, with no Redis behind it.
    fn one_member() -> (
        RunningRuntime,
        watch::Sender<MemberStatus>,
        Arc<OwnershipDeadline>,
    ) {
        let (status_tx, status) = watch::channel(MemberStatus::default());
        let deadline = OwnershipDeadline::new();
        let running = RunningRuntime {
            shutdown: watch::channel(false).0,
            members: vec![RunningMember {
                member_id: "m0".into(),
                span: tracing::Span::none(),
                probe: crate::health::Probe::default(),
                pause: PauseHandle::new(),
                deadline: deadline.clone(),
                status,
                heartbeat_task: tokio::spawn(async {}),
                consumer_task: tokio::spawn(async {}),
            }],
            followers: Vec::new(),
            _wakeups: Vec::new(),
            timeout: Duration::from_millis(100),
            exits: mpsc::unbounded_channel().1,
            client: crate::connection::RedisTarget::open("redis://127.0.0.1:1/").unwrap(),
        };
        (running, status_tx, deadline)
    }

    #[tokio::test]
    async fn waiting_for_an_assignment_ends_when_the_group_is_stable_and_the_lease_valid() {
        let (running, status, deadline) = one_member();
        let error = running
            .wait_until_assigned("m0", Duration::from_millis(30))
            .await
            .unwrap_err();
        assert!(
            matches!(&error, WaitError::TimedOut { last, .. } if last.contains("phase Joining")),
            "{error}"
        );
        assert!(error
            .to_string()
            .starts_with("listener m0 owning its shards: not within 30 ms"));
        // Joined, but the group still moves shards: not yet.
        let joined = MemberStatus {
            phase: Phase::Member,
            owned: vec![1, 2],
            group_state: Some(GroupState::Reconciling),
            pending: 1,
            ..MemberStatus::default()
        };
        status.send_replace(joined.clone());
        deadline.set(deadline.local_now().plus_ms(60_000));
        assert!(running
            .wait_until_assigned("m0", Duration::from_millis(30))
            .await
            .is_err());
        let waiting = running.wait_until_assigned("m0", Duration::from_secs(10));
        let settle = async {
            status.send_replace(MemberStatus {
                group_state: Some(GroupState::Stable),
                pending: 0,
                ..joined
            });
        };
        let (shards, ()) = tokio::join!(waiting, settle);
        assert_eq!(shards.unwrap(), [1, 2]);
        // Self-fenced: the lease is no longer valid.
        deadline.withdraw(5);
        assert!(running
            .wait_until_assigned("m0", Duration::from_millis(30))
            .await
            .is_err());
    }

    #[tokio::test]
    async fn waiting_for_an_unknown_listener_or_one_whose_heartbeat_loop_stopped_fails() {
        let (running, status, _) = one_member();
        let error = running
            .wait_until_assigned("m9", Duration::from_secs(10))
            .await
            .unwrap_err();
        assert!(
            matches!(&error, WaitError::UnknownListener { id, known } if id == "m9" && known == &["m0"]),
            "{error}"
        );
        drop(status);
        let error = running
            .wait_until_assigned("m0", Duration::from_secs(600))
            .await
            .unwrap_err();
        assert!(
            error.to_string().contains("its heartbeat loop has stopped"),
            "{error}"
        );
    }

    fn group(pending: u64, last: &str) -> GroupInfo {
        GroupInfo {
            name: "billing".into(),
            consumers: Some(1),
            pending: Some(pending),
            last_delivered_id: Some(last.into()),
            entries_read: None,
            lag: None,
        }
    }

    #[test]
    fn a_shard_is_idle_when_everything_was_read_and_acknowledged() {
        assert_eq!(shard_idle(Some(&group(0, "5-0")), Some("5-0")), Ok(()));
        // Newer entries were deleted after they were read: the newest left is older.
        assert_eq!(shard_idle(Some(&group(0, "9-3")), Some("5-0")), Ok(()));
        // An empty stream.
        assert_eq!(shard_idle(Some(&group(0, "0-0")), None), Ok(()));
    }

    #[test]
    fn a_shard_is_busy_with_unread_or_pending_entries_or_without_the_group() {
        assert_eq!(
            shard_idle(Some(&group(0, "5-0")), Some("5-1")),
            Err("entry 5-1 not read yet (last delivered 5-0)".into())
        );
        // Ids compare as numbers, not as text.
        assert!(shard_idle(Some(&group(0, "9-0")), Some("10-0")).is_err());
        assert_eq!(
            shard_idle(Some(&group(2, "5-0")), Some("5-0")),
            Err("2 pending".into())
        );
        assert!(shard_idle(None, None).is_err());
    }
}
