//! The store's Lua scripts and their typed invocations: each script's `KEYS` and `ARGV` are built in one
//! place here, next to the decoding of its reply, so a layout is changed on both sides at once (each
//! `.lua` file's header says the same layout). [`CommitArgs`] builds `commit.lua`'s count-prefixed
//! `ARGV`, whose one wrong count would shift everything after it.

use redis::{Script, ScriptInvocation, Value};

use crate::coordinator::events::AuditEvent;

use super::keys::WRITER_LOCK_MS;
use super::snapshot::{CommitDelta, LoadReply};
use super::{GroupKeys, StoreError};

/// Audit entries kept (approximately).
const AUDIT_MAX_LEN: u64 = 10_000;

/// The store's scripts, loaded once per handle (redis-rs sends `EVALSHA`, then the script if Redis does
/// not know it).
#[derive(Debug)]
pub(super) struct Scripts {
    renew: Script,
    commit: Script,
    pub(super) release: Script,
    enqueue: Script,
    peek: Script,
    cancel: Script,
}

impl Scripts {
    pub(super) fn new() -> Self {
        Self {
            renew: Script::new(include_str!("renew.lua")),
            commit: Script::new(include_str!("commit.lua")),
            release: Script::new(include_str!("writer.lua")),
            enqueue: Script::new(include_str!("enqueue.lua")),
            peek: Script::new(include_str!("peek.lua")),
            cancel: Script::new(include_str!("cancel.lua")),
        }
    }

    /// `renew.lua`: renews `member`'s lease to Redis time + `session_ms` if the revision is still
    /// `revision` and nothing (an expired lease, the timer `next_timer`, -1 for none) needs a commit.
    pub(super) fn renew(
        &self,
        keys: &GroupKeys,
        revision: i64,
        member: &str,
        session_ms: i64,
        next_timer: i64,
    ) -> ScriptInvocation<'_> {
        let mut invocation = self.renew.prepare_invoke();
        invocation
            .key(&keys.rev)
            .key(&keys.leases)
            .key(&keys.meta)
            .key(&keys.members)
            .arg(revision)
            .arg(member)
            .arg(session_ms)
            .arg(next_timer);
        invocation
    }

    /// `commit.lua` with `args`.
    pub(super) fn commit(&self, keys: &GroupKeys, args: &CommitArgs<'_>) -> ScriptInvocation<'_> {
        let mut invocation = self.commit.prepare_invoke();
        for key in args.keys(keys) {
            invocation.key(key);
        }
        for arg in args.argv() {
            invocation.arg(arg.as_slice());
        }
        invocation
    }

    /// `enqueue.lua`: queues `heartbeat` (JSON) under reply id `id` for `ttl_ms`, and takes the writer
    /// lock with `token` if it is free (when `take_lock` is false, only if nothing else is queued).
    pub(super) fn enqueue(
        &self,
        keys: &GroupKeys,
        id: &str,
        heartbeat: &str,
        ttl_ms: i64,
        token: &str,
        take_lock: bool,
    ) -> ScriptInvocation<'_> {
        let mut invocation = self.enqueue.prepare_invoke();
        invocation
            .key(&keys.inbox)
            .key(&keys.writer)
            .arg(id)
            .arg(heartbeat)
            .arg(ttl_ms)
            .arg(token)
            .arg(WRITER_LOCK_MS)
            .arg(if take_lock { 1 } else { 0 });
        invocation
    }

    /// `peek.lua`: whether `token` still holds the writer lock (extending it), the revision, Redis time
    /// and up to `batch` queued heartbeats (decoded by [`decode_peek`]).
    pub(super) fn peek(&self, keys: &GroupKeys, token: &str, batch: usize) -> ScriptInvocation<'_> {
        let mut invocation = self.peek.prepare_invoke();
        invocation
            .key(&keys.writer)
            .key(&keys.rev)
            .key(&keys.inbox)
            .arg(token)
            .arg(WRITER_LOCK_MS)
            .arg(batch);
        invocation
    }

    /// `cancel.lua`: takes the queued heartbeat `id` back out of the inbox.
    pub(super) fn cancel(&self, keys: &GroupKeys, id: &str) -> ScriptInvocation<'_> {
        let mut invocation = self.cancel.prepare_invoke();
        invocation.key(&keys.inbox).arg(id);
        invocation
    }
}

/// `writer.lua`: releases the writer lock if `token` still holds it, and wakes one waiting writer. A free
/// function of the script, for the lock guard's task, which owns a clone of it.
pub(super) fn release<'a>(
    release: &'a Script,
    keys: &GroupKeys,
    token: &str,
) -> ScriptInvocation<'a> {
    let mut invocation = release.prepare_invoke();
    invocation
        .key(&keys.writer)
        .key(&keys.turn)
        .arg(token)
        .arg(WRITER_LOCK_MS);
    invocation
}

/// Everything one `commit.lua` call carries. [`CommitArgs::argv`] is the one place its `ARGV` is laid out,
/// in the order the header of `commit.lua` documents and the script reads.
#[derive(Debug)]
pub(super) struct CommitArgs<'a> {
    /// The revision the snapshot was read at (the compare-and-set).
    pub(super) revision: i64,
    /// What to write; its `committed_at` is the `now` the core used.
    pub(super) delta: &'a CommitDelta,
    /// Members the core removed, with the lease it relied on: it must still be the stored one.
    pub(super) lease_checks: &'a [(String, i64)],
    pub(super) events: &'a [AuditEvent],
    /// Entries taken from the head of the inbox.
    pub(super) taken: usize,
    /// How long an answer waits for its sender.
    pub(super) answer_ttl_ms: i64,
    /// (reply id, answer) of each queued heartbeat applied.
    pub(super) answers: &'a [(String, Vec<u8>)],
    /// The wake-up channel.
    pub(super) wake_channel: &'a str,
    /// The members to wake.
    pub(super) wake: &'a [&'a str],
}

impl CommitArgs<'_> {
    /// `KEYS`: meta, rev, leases, audit, projection, inbox, members, then one reply key per answer.
    fn keys(&self, keys: &GroupKeys) -> Vec<String> {
        let mut all = vec![
            keys.meta.clone(),
            keys.rev.clone(),
            keys.leases.clone(),
            keys.audit.clone(),
            keys.projection.clone(),
            keys.inbox.clone(),
            keys.members.clone(),
        ];
        all.extend(self.answers.iter().map(|(id, _)| keys.reply(id)));
        all
    }

    /// `ARGV`, as `commit.lua`'s header lays it out.
    fn argv(&self) -> Vec<Vec<u8>> {
        fn number(n: impl ToString) -> Vec<u8> {
            n.to_string().into_bytes()
        }
        fn text(s: &str) -> Vec<u8> {
            s.as_bytes().to_vec()
        }
        let delta = self.delta;
        let mut argv = vec![
            number(self.revision),
            number(delta.committed_at.0),
            delta.header.clone(),
            number(AUDIT_MAX_LEN),
            number(delta.expected_records.map_or(-1, |n| n as i64)),
        ];
        argv.push(number(self.lease_checks.len()));
        for (id, lease) in self.lease_checks {
            argv.extend([text(id), number(lease)]);
        }
        argv.push(number(delta.leases.len()));
        for (id, lease) in &delta.leases {
            argv.extend([text(id), number(lease)]);
        }
        argv.push(number(delta.removed.len()));
        argv.extend(delta.removed.iter().map(|id| text(id)));
        argv.push(number(delta.records.len()));
        for (id, json) in &delta.records {
            argv.extend([text(id), json.clone()]);
        }
        argv.push(number(delta.gone.len()));
        argv.extend(delta.gone.iter().map(|id| text(id)));
        argv.push(number(self.events.len()));
        argv.extend(
            self.events
                .iter()
                .map(|event| serde_json::to_vec(event).expect("events serialize")),
        );
        argv.extend([
            number(self.taken),
            number(self.answer_ttl_ms),
            number(self.answers.len()),
        ]);
        argv.extend(self.answers.iter().map(|(_, answer)| answer.clone()));
        argv.extend([text(self.wake_channel), text(&self.wake.join(" "))]);
        argv
    }
}

/// A script's `{ok, now, value?}` reply (`renew.lua`, `commit.lua`), decoded without indexing blindly:
/// `(true, now, Some(value))` or `(false, now, None)`.
pub(super) fn decode_reply(
    script: &'static str,
    reply: Vec<i64>,
) -> Result<(bool, i64, Option<i64>), StoreError> {
    match reply.as_slice() {
        [1, now, value] => Ok((true, *now, Some(*value))),
        [0, now] => Ok((false, *now, None)),
        _ => Err(StoreError::Reply { script, reply }),
    }
}

/// The load: the revision, Redis time, header, leases, member records and the revision again, in one
/// pipeline of plain reads. Not a script: a script copies every record and lease into Lua and back, which
/// made a load of 2,000 members cost Redis 2.7 ms against 1.2 ms for the same reads, and a group that
/// large has every member load at least once after a join storm. Not `MULTI`/`EXEC` either: it needs
/// no atomicity, only to know whether a commit came between its reads. A commit writes the header, the records and a new revision (never an earlier
/// one) at once, so the same revision before and after the reads means no commit came between them
/// ([`decode_load`]); leases only move forward between commits, as in any load.
pub(super) fn load(keys: &GroupKeys) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.cmd("GET")
        .arg(&keys.rev)
        .cmd("TIME")
        .cmd("GET")
        .arg(&keys.meta)
        .cmd("ZRANGE")
        .arg(&keys.leases)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .cmd("HGETALL")
        .arg(&keys.members)
        .cmd("GET")
        .arg(&keys.rev);
    pipe
}

/// The load's reply as redis-rs decodes it: revision, `TIME` (seconds, microseconds), header, leases,
/// records, revision.
pub(super) type LoadTuple = (
    Option<i64>,
    (i64, i64),
    Option<Vec<u8>>,
    Vec<(String, i64)>,
    Vec<(String, Vec<u8>)>,
    Option<i64>,
);

/// What a load read, or `None` if a commit came between its reads (the revision moved): read again.
pub(super) fn decode_load(
    (revision, (secs, micros), meta, leases, records, revision_after): LoadTuple,
) -> Option<LoadReply> {
    (revision == revision_after).then(|| LoadReply {
        meta,
        revision: revision.unwrap_or(0),
        leases,
        now: secs * 1000 + micros / 1000,
        records,
    })
}

/// `peek.lua`'s reply.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Peeked {
    /// Redis time.
    pub(super) now: i64,
    /// The revision and the queued entries, or `None` if the lock is no longer the caller's.
    pub(super) batch: Option<(i64, Vec<Vec<u8>>)>,
}

/// Decodes `peek.lua`'s `{has_lock, revision, now, entry*}`.
pub(super) fn decode_peek(reply: Vec<Value>) -> Result<Peeked, StoreError> {
    let shape = |what| StoreError::Shape {
        script: "peek.lua",
        what,
    };
    let mut values = reply.into_iter();
    let (Some(Value::Int(has_lock)), Some(Value::Int(revision)), Some(Value::Int(now))) =
        (values.next(), values.next(), values.next())
    else {
        return Err(shape("the header {has_lock, revision, now}"));
    };
    if has_lock != 1 {
        return Ok(Peeked { now, batch: None });
    }
    let entries = values
        .map(|value| match value {
            Value::BulkString(bytes) => Ok(bytes),
            _ => Err(shape("an entry that is not a string")),
        })
        .collect::<Result<_, _>>()?;
    Ok(Peeked {
        now,
        batch: Some((revision, entries)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::StoreMillis;
    use proptest::prelude::*;

    /// What `commit.lua` reads from `ARGV`, walked the way the script walks it (`i` from 6, each group
    /// prefixed by its count). Fails if anything is left over or missing.
    #[derive(Debug, PartialEq)]
    struct Read {
        revision: i64,
        now: i64,
        header: Vec<u8>,
        audit_max_len: u64,
        records_seen: i64,
        checks: Vec<(String, i64)>,
        leases: Vec<(String, i64)>,
        removed: Vec<String>,
        records: Vec<(String, Vec<u8>)>,
        gone: Vec<String>,
        events: Vec<Vec<u8>>,
        taken: usize,
        ttl: i64,
        answers: Vec<Vec<u8>>,
        wake_channel: String,
        wake: String,
    }

    fn read(argv: &[Vec<u8>]) -> Read {
        let text = |i: usize| String::from_utf8(argv[i].clone()).unwrap();
        let int = |i: usize| text(i).parse::<i64>().unwrap();
        let mut i = 5; // ARGV[6] in Lua
        let count = |i: &mut usize| {
            let n = int(*i) as usize;
            *i += 1;
            n
        };
        let pairs = |i: &mut usize, n: usize| -> Vec<(String, Vec<u8>)> {
            let read = (0..n)
                .map(|k| (text(*i + 2 * k), argv[*i + 2 * k + 1].clone()))
                .collect();
            *i += 2 * n;
            read
        };
        let ints = |pairs: Vec<(String, Vec<u8>)>| {
            pairs
                .into_iter()
                .map(|(id, v)| (id, String::from_utf8(v).unwrap().parse().unwrap()))
                .collect()
        };
        let n = count(&mut i);
        let checks = ints(pairs(&mut i, n));
        let n = count(&mut i);
        let leases = ints(pairs(&mut i, n));
        let n = count(&mut i);
        let removed = (i..i + n).map(text).collect();
        i += n;
        let n = count(&mut i);
        let records = pairs(&mut i, n);
        let n = count(&mut i);
        let gone = (i..i + n).map(text).collect();
        i += n;
        let n = count(&mut i);
        let events = argv[i..i + n].to_vec();
        i += n;
        let taken = count(&mut i);
        let ttl = int(i);
        i += 1;
        let n = count(&mut i);
        let answers = argv[i..i + n].to_vec();
        i += n;
        assert_eq!(argv.len(), i + 2, "the wake channel and payload end ARGV");
        Read {
            revision: int(0),
            now: int(1),
            header: argv[2].clone(),
            audit_max_len: int(3) as u64,
            records_seen: int(4),
            checks,
            leases,
            removed,
            records,
            gone,
            events,
            taken,
            ttl,
            answers,
            wake_channel: text(i),
            wake: text(i + 1),
        }
    }

    fn ids(n: usize, prefix: &str) -> Vec<String> {
        (0..n).map(|k| format!("{prefix}{k}")).collect()
    }

    proptest! {
        /// Every group of `commit.lua`'s ARGV comes back where the script looks for it, whatever the
        /// counts (a wrong count would shift everything after it).
        #[test]
        fn commit_argv_is_read_back_as_it_was_built(
            checks in 0..4usize, leases in 0..4usize, removed in 0..4usize, records in 0..4usize,
            gone in 0..4usize, answers in 0..4usize, taken in 0..600usize, replace in any::<bool>(),
            woken in 0..3usize, events in 0..3usize,
        ) {
            let delta = CommitDelta {
                committed_at: StoreMillis(1_700_000_000_123),
                header: br#"{"schemaVersion":2}"#.to_vec(),
                expected_records: (!replace).then_some(records + gone),
                records: ids(records, "r").into_iter().map(|id| (id.clone(), format!("{{\"{id}\":1}}").into_bytes())).collect(),
                gone: ids(gone, "g"),
                leases: ids(leases, "l").into_iter().enumerate().map(|(k, id)| (id, 10 + k as i64)).collect(),
                removed: ids(removed, "x"),
            };
            let lease_checks: Vec<(String, i64)> =
                ids(checks, "c").into_iter().enumerate().map(|(k, id)| (id, 20 + k as i64)).collect();
            let answers: Vec<(String, Vec<u8>)> =
                ids(answers, "a").into_iter().map(|id| (id.clone(), format!("C{{\"{id}\":0}}").into_bytes())).collect();
            let events: Vec<AuditEvent> = ids(events, "e")
                .into_iter()
                .map(|member_id| AuditEvent::MemberJoined { member_id, member_epoch: 5 })
                .collect();
            let woken_ids = ids(woken, "w");
            let wake: Vec<&str> = woken_ids.iter().map(String::as_str).collect();
            let args = CommitArgs {
                revision: 42,
                delta: &delta,
                lease_checks: &lease_checks,
                events: &events,
                taken,
                answer_ttl_ms: 1500,
                answers: &answers,
                wake_channel: "sl:{orders/billing}:wake",
                wake: &wake,
            };
            let read = read(&args.argv());
            prop_assert_eq!(read, Read {
                revision: 42,
                now: delta.committed_at.0,
                header: delta.header.clone(),
                audit_max_len: AUDIT_MAX_LEN,
                records_seen: if replace { -1 } else { (records + gone) as i64 },
                checks: lease_checks.clone(),
                leases: delta.leases.clone(),
                removed: delta.removed.clone(),
                records: delta.records.clone(),
                gone: delta.gone.clone(),
                events: events.iter().map(|e| serde_json::to_vec(e).unwrap()).collect(),
                taken,
                ttl: 1500,
                answers: answers.iter().map(|(_, a)| a.clone()).collect(),
                wake_channel: "sl:{orders/billing}:wake".into(),
                wake: woken_ids.join(" "),
            });
            // KEYS[8..]: one reply key per answer, in the answers' order.
            let keys = GroupKeys::new("orders", "billing");
            let all = args.keys(&keys);
            prop_assert_eq!(all.len(), 7 + answers.len());
            prop_assert_eq!(&all[5], &keys.inbox);
            prop_assert_eq!(&all[6], &keys.members);
            for (k, (id, _)) in answers.iter().enumerate() {
                prop_assert_eq!(&all[7 + k], &keys.reply(id));
            }
        }

        /// Script replies come from Redis: a wrong shape is an error, never a panic.
        #[test]
        fn script_replies_decode_or_fail_cleanly(reply in proptest::collection::vec(any::<i64>(), 0..6)) {
            match decode_reply("renew.lua", reply.clone()) {
                Ok((true, now, Some(v))) => prop_assert_eq!(reply, vec![1, now, v]),
                Ok((false, now, None)) => prop_assert_eq!(reply, vec![0, now]),
                Ok(other) => prop_assert!(false, "impossible decode {:?}", other),
                Err(StoreError::Reply { reply: r, .. }) => prop_assert_eq!(r, reply),
                Err(other) => prop_assert!(false, "wrong error {}", other),
            }
        }
    }

    #[test]
    fn a_load_whose_reads_straddle_a_commit_is_read_again() {
        let reply = |before, after| -> LoadTuple {
            (
                before,
                (1_700_000_000, 5_000),
                Some(b"{}".to_vec()),
                vec![],
                vec![],
                after,
            )
        };
        let read = decode_load(reply(Some(7), Some(7))).expect("one revision throughout");
        assert_eq!((read.revision, read.now), (7, 1_700_000_000_005));
        assert!(
            decode_load(reply(Some(7), Some(8))).is_none(),
            "a commit came between"
        );
        assert!(
            decode_load(reply(Some(7), None)).is_none(),
            "the revision went"
        );
        assert!(
            decode_load(reply(None, Some(1))).is_none(),
            "the group was created meanwhile"
        );
        assert_eq!(
            decode_load(reply(None, None)).map(|r| r.revision),
            Some(0),
            "no group yet"
        );
    }

    #[test]
    fn peek_decodes_the_batch_only_while_the_lock_is_held() {
        let entry = Value::BulkString(b"1 ab {}".to_vec());
        assert_eq!(
            decode_peek(vec![
                Value::Int(1),
                Value::Int(7),
                Value::Int(99),
                entry.clone()
            ])
            .unwrap(),
            Peeked {
                now: 99,
                batch: Some((7, vec![b"1 ab {}".to_vec()]))
            }
        );
        assert_eq!(
            decode_peek(vec![Value::Int(1), Value::Int(7), Value::Int(99)]).unwrap(),
            Peeked {
                now: 99,
                batch: Some((7, Vec::new()))
            }
        );
        assert_eq!(
            decode_peek(vec![Value::Int(0), Value::Int(0), Value::Int(99)]).unwrap(),
            Peeked {
                now: 99,
                batch: None
            }
        );
    }

    #[test]
    fn a_peek_of_the_wrong_shape_is_a_shape_error() {
        for reply in [
            vec![],
            vec![Value::Int(1), Value::Int(7)],
            vec![Value::Int(1), Value::Nil, Value::Int(99)],
            vec![Value::Int(1), Value::Int(7), Value::Int(99), Value::Int(3)],
        ] {
            match decode_peek(reply.clone()) {
                Err(StoreError::Shape {
                    script: "peek.lua", ..
                }) => {}
                other => panic!("{reply:?}: {other:?}"),
            }
        }
    }
}
