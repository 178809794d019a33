//! The writer lock and batched commits: one process at a time writes a group, applying its own input and
//! the heartbeats others queued to one snapshot and committing them in one write (ARCHITECTURE.md, "Data
//! flow of a heartbeat", step 3). The lock is for speed only: the revision compare-and-set of
//! `commit.lua` stays the safety guard, so a writer that paused past the lock's expiry is refused at
//! commit like any stale writer.

use std::time::{Duration, Instant};

use redis::Script;

use crate::clock::StoreMillis;
use crate::connection::Connection;
use crate::coordinator::events::AuditEvent;
use crate::coordinator::metadata::MetadataError;
use crate::coordinator::wire::{HeartbeatRequest, HeartbeatResponse};
use crate::coordinator::{Change, Outcome, Writes};

use super::keys::WRITER_LOCK_MS;
use super::scripts::{self, decode_peek};
use super::snapshot::Snapshot;
use super::stats::Stat;
use super::{inbox, GroupKeys, GroupStore, StoreError, MAX_ATTEMPTS};

/// Batches one writer commits before letting others have a turn.
const MAX_BATCHES: usize = 64;
/// A queued heartbeat whose sender stops waiting this soon is not applied: its answer would come too late.
const DEADLINE_MARGIN_MS: i64 = 20;
/// How long a sender waits for its queued heartbeat to be applied before giving up.
const MAX_QUEUED_WAIT: Duration = Duration::from_secs(30);
/// The shortest and longest time one wait for the writer's turn blocks in Redis (see
/// [`GroupStore::turn_wait`]).
const TURN_WAIT_MS: (i64, i64) = (50, 500);

/// What a commit does for queued heartbeats: how many inbox entries it takes, the answers it pushes
/// (reply id, answer), and every member answered by it or by the caller's own response, with the number
/// of the commit's events its answer reflects (what it learns from the answer needs no wake-up; see
/// [`wakeup::to_wake`](super::wakeup::to_wake)).
#[derive(Debug, Default)]
pub(super) struct Answering {
    pub(super) taken: usize,
    pub(super) answers: Vec<(String, Vec<u8>)>,
    pub(super) answered: Vec<(String, usize)>,
}

/// A heartbeat computed on the cache that needs a commit, kept in case nobody else writes first.
pub(super) struct Prepared {
    pub(super) snapshot: Snapshot,
    pub(super) now: StoreMillis,
    pub(super) outcome: Outcome<HeartbeatResponse>,
}

/// The inputs of one batch, merged into one commit.
#[derive(Default)]
struct Batch {
    changed: bool,
    writes: Writes,
    events: Vec<AuditEvent>,
}

impl Batch {
    /// Folds one outcome in and returns its response. A lease check keeps the first value seen: the one
    /// in the store before the batch.
    fn add<R>(&mut self, outcome: Outcome<R>) -> R {
        self.changed |= outcome.change != Change::None;
        for (id, lease) in outcome.writes.lease_checks {
            if !self.writes.lease_checks.iter().any(|(seen, _)| *seen == id) {
                self.writes.lease_checks.push((id, lease));
            }
        }
        for id in outcome.writes.removed {
            if !self.writes.removed.contains(&id) {
                self.writes.removed.push(id);
            }
        }
        self.events.extend(outcome.events);
        outcome.response
    }
}

/// Releases the writer lock from a task of its own if the write that took it was abandoned (its future
/// dropped); [`disarm`](Self::disarm) it once the write ended and the lock is released in line.
pub(super) struct LockGuard {
    conn: Connection,
    release: Script,
    keys: GroupKeys,
    token: Option<String>,
}

impl LockGuard {
    pub(super) fn disarm(mut self) {
        self.token = None;
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let Some(token) = self.token.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // It expires by itself.
        };
        let (mut conn, release, keys) =
            (self.conn.clone(), self.release.clone(), self.keys.clone());
        runtime.spawn(async move {
            let _: Result<i64, _> = scripts::release(&release, &keys, &token)
                .invoke_async(&mut conn)
                .await;
        });
    }
}

impl GroupStore {
    /// Queues `req` for the writer and waits for its answer, becoming the writer when the lock is free.
    pub(super) async fn queued(
        &mut self,
        req: &HeartbeatRequest,
        prepared: Option<Prepared>,
    ) -> Result<HeartbeatResponse, StoreError> {
        self.defer_reload = false;
        self.in_flux = true;
        let id = format!("{:x}", crate::util::random_u64());
        let token = format!("{:x}", crate::util::random_u64());
        let ttl = self.queue_ttl_ms();
        let reply_key = self.keys.reply(&id);
        // Over a slow link, leave the lock to faster writers for an interval: they apply this heartbeat
        // with theirs, and none of theirs waits for our round trips.
        let defer_lock_until = self
            .slow_link()
            .then(|| Instant::now() + Duration::from_millis(self.interval_ms.max(0) as u64));
        let sent = Instant::now();
        let json = serde_json::to_string(req).expect("heartbeats serialize");
        let (taken, now): (i64, i64) = self
            .scripts
            .enqueue(
                &self.keys,
                &id,
                &json,
                ttl,
                &token,
                defer_lock_until.is_none(),
            )
            .invoke_async(&mut self.conn)
            .await?;
        self.last_round_trip = sent.elapsed();
        self.observe_time(now);
        self.stats.add(Stat::Queued, 1);
        let mut locked = taken == 1;
        let mut prepared = prepared;
        let give_up = Instant::now() + MAX_QUEUED_WAIT;
        loop {
            if locked {
                // If this future is dropped (the caller's timeout) while it has the lock, release it
                // anyway: otherwise every other writer would wait for it to expire.
                let guard = self.lock_guard(&token);
                let result = self.drain(Some((&id, req)), &token, prepared.take()).await;
                guard.disarm();
                self.unlock(&token).await;
                match result {
                    Err(error) => {
                        self.cache = None;
                        self.cancel(&id).await;
                        return Err(error);
                    }
                    Ok(Some(response)) => return Ok(response),
                    // The lock lapsed before this heartbeat was applied: wait again.
                    Ok(None) => locked = false,
                }
            }
            if Instant::now() > give_up {
                self.cancel(&id).await;
                return Err(StoreError::Contention);
            }
            // While it leaves the lock to others, a sender waits for its answer only: a release's one
            // wake-up must go to a waiter that will take the turn.
            let deferring = defer_lock_until.is_some_and(|until| Instant::now() < until);
            let mut wait = redis::cmd("BLPOP");
            wait.arg(&reply_key);
            if !deferring {
                wait.arg(&self.keys.turn);
            }
            let popped: Option<(String, Vec<u8>)> = wait
                .arg(self.turn_wait())
                .query_async(&mut self.conn)
                .await?;
            if let Some((_, answer)) = popped.filter(|(key, _)| *key == reply_key) {
                return self.answer(&reply_key, &answer);
            }
            self.stats.add(Stat::LockWaits, 1);
            if !deferring && self.try_lock(&token).await? {
                // The previous writer may have answered between the wait and the lock.
                let answer: Option<Vec<u8>> = redis::cmd("LPOP")
                    .arg(&reply_key)
                    .query_async(&mut self.conn)
                    .await?;
                if let Some(answer) = answer {
                    self.unlock(&token).await;
                    return self.answer(&reply_key, &answer);
                }
                locked = true;
            }
        }
    }

    /// Takes our queued heartbeat back (best effort: Redis may be what failed).
    async fn cancel(&mut self, id: &str) {
        let removed: Result<i64, _> = self
            .scripts
            .cancel(&self.keys, id)
            .invoke_async(&mut self.conn)
            .await;
        if let Err(error) = removed {
            tracing::debug!(%error, "taking a queued heartbeat back failed");
        }
    }

    /// An answer another process committed for us: `C` (our heartbeat changed the group) or `Q` (it
    /// only renewed our lease), then the response JSON. Our cache is behind that commit: it was taken.
    fn answer(&mut self, key: &str, answer: &[u8]) -> Result<HeartbeatResponse, StoreError> {
        self.cache = None;
        let (json, changed) = match answer.split_first() {
            Some((b'C', json)) => (json, true),
            Some((b'Q', json)) => (json, false),
            _ => (answer, false),
        };
        self.defer_reload = changed;
        serde_json::from_slice(json).map_err(|e| StoreError::Metadata {
            key: key.to_string(),
            source: MetadataError::Corrupt(e.to_string()),
        })
    }

    /// How long a queued heartbeat may be applied: as long as its sender waits for the answer (see
    /// [`attempt_budget`](crate::member::heartbeat::attempt_budget)).
    pub(super) fn queue_ttl_ms(&self) -> i64 {
        self.interval_ms.max(self.session_ms * 2 / 3).max(100)
    }

    /// How long one wait for the writer's turn blocks in Redis, in seconds. A release wakes one waiter at
    /// once, so this only bounds how late waiters notice a writer that died holding the lock (which
    /// expires after `WRITER_LOCK_MS` by itself), and each waiter polls the lock once per wait (a `BLPOP`
    /// and a `SET NX`): at a fixed 50 ms, every waiting member of a join storm polled 20 times a second.
    /// Half an interval less the last round trip, so that the wait's answer still comes within the
    /// heartbeat connection's response timeout (one interval) over a slow link; within 50-500 ms, less up
    /// to a quarter at random so that waiters do not poll in step.
    fn turn_wait(&self) -> f64 {
        let round_trip = self.last_round_trip.as_millis() as i64;
        let ms = (self.interval_ms / 2 - round_trip).clamp(TURN_WAIT_MS.0, TURN_WAIT_MS.1) as u64;
        (ms - crate::util::random_below(ms / 4 + 1)) as f64 / 1000.0
    }

    /// Whether this process's link to Redis is too slow for it to be the group's writer while others can
    /// be: a writer holds the lock for a few round trips (peek, reload, commit, release), and every
    /// heartbeat queued meanwhile waits for them. From a quarter of the heartbeat interval on, it takes the
    /// lock only when no other heartbeat is queued, and else leaves it to the others for an interval (see
    /// [`queued`](Self::queued)).
    fn slow_link(&self) -> bool {
        self.last_round_trip.as_millis() as i64 * 4 > self.interval_ms
    }

    /// As the writer: applies `own` and the queued heartbeats, a batch per commit, until the inbox is
    /// empty. Returns the answer to `own`, or `None` if the lock lapsed before it was applied.
    async fn drain(
        &mut self,
        mut own: Option<(&str, &HeartbeatRequest)>,
        token: &str,
        mut prepared: Option<Prepared>,
    ) -> Result<Option<HeartbeatResponse>, StoreError> {
        let mut own_response = None;
        let mut refusals = 0;
        for _ in 0..MAX_BATCHES {
            let (revision, now, entries) = match self.peek(token).await? {
                Some(peeked) => peeked,
                None => return Ok(own_response),
            };
            let only_own = entries.iter().all(|entry| {
                own.is_some_and(|(id, _)| {
                    inbox::decode(entry).is_ok_and(|queued| queued.reply_id == id)
                })
            });
            // Uncontended: nobody committed since this heartbeat was computed on the cache and nobody
            // else is queued, so what was computed is what a reload would compute.
            if let Some(mut ready) = prepared
                .take()
                .filter(|p| own.is_some() && only_own && p.snapshot.revision == revision)
            {
                let outcome = &ready.outcome;
                if self
                    .commit(
                        &mut ready.snapshot,
                        ready.now,
                        &outcome.writes,
                        &outcome.events,
                        &Answering {
                            taken: entries.len(),
                            answers: Vec::new(),
                            answered: own
                                .map(|(_, req)| (req.member_id.clone(), outcome.events.len()))
                                .into_iter()
                                .collect(),
                        },
                    )
                    .await?
                {
                    self.cache = Some(ready.snapshot);
                    return Ok(Some(ready.outcome.response));
                }
                continue;
            }
            let mut snapshot = match self.cache.take() {
                Some(snapshot) if snapshot.revision == revision => snapshot,
                _ => self.read_snapshot().await?,
            };
            let now = StoreMillis(now).max(self.now());
            let mut batch = Batch::default();
            let mut own_answer = None;
            if let Some((_, req)) = own {
                let outcome = snapshot.coordinator.heartbeat(req, now);
                own_answer = Some(batch.add(outcome));
            }
            // Members this batch answers learn from their answer what changed for them up to it; a later
            // heartbeat of the batch that moves their shards must still wake them.
            let mut answering = Answering {
                taken: entries.len(),
                answers: Vec::new(),
                answered: own
                    .iter()
                    .map(|(_, req)| (req.member_id.clone(), batch.events.len()))
                    .collect(),
            };
            let mut bad = 0;
            for entry in &entries {
                let queued = match inbox::decode(entry) {
                    Ok(queued) => queued,
                    Err(_) => {
                        bad += 1;
                        continue;
                    }
                };
                if own.is_some_and(|(id, _)| id == queued.reply_id)
                    || queued.deadline <= now.0 + DEADLINE_MARGIN_MS
                {
                    continue;
                }
                let outcome = snapshot.coordinator.heartbeat(&queued.request, now);
                let mut answer = vec![if outcome.change == Change::Metadata {
                    b'C'
                } else {
                    b'Q'
                }];
                serde_json::to_writer(&mut answer, &batch.add(outcome))
                    .expect("responses serialize");
                answering
                    .answered
                    .push((queued.request.member_id.clone(), batch.events.len()));
                answering.answers.push((queued.reply_id, answer));
            }
            if bad > 0 {
                tracing::warn!(inbox = %self.keys.inbox, bad, "skipped queued heartbeats that do not decode");
            }
            if batch.changed || !entries.is_empty() {
                let committed = self
                    .commit(&mut snapshot, now, &batch.writes, &batch.events, &answering)
                    .await?;
                if !committed {
                    refusals += 1;
                    if refusals >= MAX_ATTEMPTS {
                        return Err(StoreError::Contention);
                    }
                    continue;
                }
            }
            self.stats
                .add(Stat::Batched, answering.answers.len() as u64);
            self.cache = Some(snapshot);
            if let Some(answer) = own_answer {
                own_response = Some(answer);
                own = None;
            }
            if entries.len() < inbox::BATCH {
                break;
            }
        }
        Ok(own_response)
    }

    /// The writer's look at its next batch: `None` if the lock is no longer ours.
    async fn peek(&mut self, token: &str) -> Result<Option<(i64, i64, Vec<Vec<u8>>)>, StoreError> {
        let reply: Vec<redis::Value> = self
            .scripts
            .peek(&self.keys, token, inbox::BATCH)
            .invoke_async(&mut self.conn)
            .await?;
        let peeked = decode_peek(reply)?;
        self.observe_time(peeked.now);
        Ok(peeked
            .batch
            .map(|(revision, entries)| (revision, peeked.now, entries)))
    }

    pub(super) fn lock_guard(&self, token: &str) -> LockGuard {
        LockGuard {
            conn: self.conn.clone(),
            release: self.scripts.release.clone(),
            keys: self.keys.clone(),
            token: Some(token.to_string()),
        }
    }

    /// Takes the writer lock with `token` if it is free.
    async fn try_lock(&mut self, token: &str) -> Result<bool, StoreError> {
        let taken: Option<String> = redis::cmd("SET")
            .arg(&self.keys.writer)
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(WRITER_LOCK_MS)
            .query_async(&mut self.conn)
            .await?;
        Ok(taken.is_some())
    }

    /// Takes the writer lock, waiting in Redis for the writer to release it. Returns the token.
    pub(super) async fn lock(&mut self) -> Result<String, StoreError> {
        let token = format!("{:x}", crate::util::random_u64());
        loop {
            if self.try_lock(&token).await? {
                return Ok(token);
            }
            self.stats.add(Stat::LockWaits, 1);
            // Woken by the writer's release, or after a while to try again (a writer that died).
            let _: Option<(String, String)> = redis::cmd("BLPOP")
                .arg(&self.keys.turn)
                .arg(self.turn_wait())
                .query_async(&mut self.conn)
                .await?;
        }
    }

    /// Releases the writer lock if `token` still holds it (best effort: it expires by itself).
    pub(super) async fn unlock(&mut self, token: &str) {
        let released: Result<i64, _> = scripts::release(&self.scripts.release, &self.keys, token)
            .invoke_async(&mut self.conn)
            .await;
        if let Err(error) = released {
            tracing::debug!(%error, "releasing the writer lock failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(change: Change, checks: &[(&str, i64)], removed: &[&str]) -> Outcome<u32> {
        Outcome {
            response: 7,
            change,
            writes: Writes {
                lease_checks: checks.iter().map(|(id, l)| (id.to_string(), *l)).collect(),
                removed: removed.iter().map(|id| id.to_string()).collect(),
            },
            events: vec![AuditEvent::MemberJoined {
                member_id: "a".into(),
                member_epoch: 1,
            }],
        }
    }

    #[test]
    fn a_batch_keeps_the_first_lease_check_of_a_member_and_each_removal_once() {
        let mut batch = Batch::default();
        assert_eq!(batch.add(outcome(Change::None, &[("a", 10)], &["b"])), 7);
        assert!(!batch.changed, "nothing to write yet");
        batch.add(outcome(Change::Lease, &[("a", 20), ("c", 30)], &["b", "c"]));
        assert!(batch.changed);
        assert_eq!(
            batch.writes.lease_checks,
            [("a".to_string(), 10), ("c".to_string(), 30)],
            "the lease in the store before the batch"
        );
        assert_eq!(batch.writes.removed, ["b", "c"]);
        assert_eq!(batch.events.len(), 2);
    }
}
