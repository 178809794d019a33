//! One test per rule of the spec, named after the rule.

use super::*;
use wire::{RevokingShard, RuntimeConsumerCapacity};

const HB: i64 = 1_000;
const SESSION: i64 = 10_000;
const REBALANCE: i64 = 30_000;

fn group(shards: u32) -> Coordinator {
    Coordinator::new(
        "g",
        shards,
        GroupConfig {
            heartbeat_interval_ms: HB,
            session_timeout_ms: SESSION,
            rebalance_timeout_ms: REBALANCE,
        },
    )
}

fn req(member: &str, epoch: i64, request_id: &str) -> HeartbeatRequest {
    HeartbeatRequest {
        protocol_version: 1,
        request_id: request_id.into(),
        member_id: member.into(),
        member_name: None,
        member_epoch: epoch,
        metadata_version: 0,
        runtime_consumer_capacity: RuntimeConsumerCapacity::default(),
        owned_shards: None,
        revoking_shards: vec![],
        shard_progress: vec![],
        weight: None,
        restarting: false,
        hold_after_lease_ms: 0,
    }
}

fn restarting(mut r: HeartbeatRequest) -> HeartbeatRequest {
    r.restarting = true;
    r
}

fn owned(mut r: HeartbeatRequest, shards: &[u32]) -> HeartbeatRequest {
    r.owned_shards = Some(shards.iter().copied().map(ShardId::new).collect());
    r
}

fn revoked(mut r: HeartbeatRequest, shards: &[u32], state: RevokeState) -> HeartbeatRequest {
    r.revoking_shards = shards
        .iter()
        .map(|&s| RevokingShard {
            shard: ShardId::new(s),
            state,
            in_flight: 0,
            acked_at: None,
        })
        .collect();
    r
}

fn shards(list: &[ShardId]) -> Vec<u32> {
    list.iter().map(|s| s.shard_index).collect()
}

/// Joins `member` and confirms its first assignment; returns its epoch.
fn join_and_settle(c: &mut Coordinator, member: &str, now: i64) -> i64 {
    let r = c
        .heartbeat(&req(member, 0, &format!("{member}-join")), StoreMillis(now))
        .response;
    assert_eq!(r.status, HeartbeatStatus::Ok);
    let assigned = shards(&r.assignment.assigned_shards);
    let r2 = c.heartbeat(
        &owned(
            req(member, r.member_epoch, &format!("{member}-c")),
            &assigned,
        ),
        StoreMillis(now),
    );
    assert!(r2.response.status.is_accepted(), "{:?}", r2.response.status);
    r2.response.member_epoch
}

fn member<'a>(c: &'a Coordinator, id: &str) -> &'a MemberRecord {
    &c.metadata().members[id]
}

#[test]
fn join_bumps_group_epoch_and_assigns_all_shards_to_the_first_member() {
    let mut c = group(4);
    let out = c.heartbeat(&req("a", 0, "j1"), StoreMillis(0));
    assert_eq!(out.response.status, HeartbeatStatus::Ok);
    assert!(out.response.member_epoch > 0);
    assert_eq!(out.response.group_epoch, 1);
    assert_eq!(out.response.assignment_epoch, 1);
    assert_eq!(
        shards(&out.response.assignment.assigned_shards),
        [0, 1, 2, 3]
    );
    assert_eq!(out.change, Change::Metadata);
    assert!(matches!(out.events[0], AuditEvent::MemberJoined { .. }));
}

#[test]
fn replayed_join_does_not_bump_epochs_twice() {
    let mut c = group(4);
    let first = c.heartbeat(&req("a", 0, "j1"), StoreMillis(0)).response;
    let replay = c.heartbeat(&req("a", 0, "j1"), StoreMillis(100));
    assert_eq!(replay.response.member_epoch, first.member_epoch);
    assert_eq!(replay.response.group_epoch, first.group_epoch);
    assert_eq!(replay.response.assignment, first.assignment);
    assert_eq!(replay.change, Change::Lease);
}

#[test]
fn rejoin_of_known_member_drops_old_ownership_and_issues_fresh_epoch() {
    let mut c = group(2);
    let e1 = join_and_settle(&mut c, "a", 0);
    let group_epoch = c.metadata().group_epoch;
    // The process restarted (same memberId, new request): a new incarnation.
    let out = c.heartbeat(&req("a", 0, "restart-join"), StoreMillis(1_000));
    assert!(out.response.member_epoch > e1);
    assert_eq!(
        c.metadata().group_epoch,
        group_epoch + 2,
        "fence of the old incarnation + join"
    );
    assert!(out
        .events
        .iter()
        .any(|e| matches!(e, AuditEvent::MemberRejoined { .. })));
    // The old incarnation may still read until its lease passes: its shards are not free, only pending.
    assert!(out.response.assignment.assigned_shards.is_empty());
    assert_eq!(shards(&out.response.assignment.pending_shards), [0, 1]);
    // Its old epoch is fenced.
    let stale = c
        .heartbeat(&owned(req("a", e1, "old"), &[0, 1]), StoreMillis(1_500))
        .response;
    assert_eq!(stale.status, HeartbeatStatus::FencedMemberEpoch);
    // Once the old lease has passed, the new incarnation gets the shards.
    let _ = c.tick(StoreMillis(SESSION + 1));
    let now = c
        .heartbeat(
            &req("a", out.response.member_epoch, "n1"),
            StoreMillis(SESSION + 1),
        )
        .response;
    assert_eq!(shards(&now.assignment.assigned_shards), [0, 1]);
}

#[test]
fn stale_member_epoch_is_fenced_without_touching_the_live_member() {
    let mut c = group(2);
    let e = join_and_settle(&mut c, "a", 0);
    let before = c.clone();
    let out = c.heartbeat(&req("a", e - 1, "x"), StoreMillis(10));
    assert_eq!(out.response.status, HeartbeatStatus::FencedMemberEpoch);
    assert_eq!(out.change, Change::None);
    assert_eq!(c, before);
}

#[test]
fn future_member_epoch_is_rejected() {
    let mut c = group(2);
    let e = join_and_settle(&mut c, "a", 0);
    let before = member(&c, "a").clone();
    let out = c.heartbeat(&owned(req("a", e + 1, "x"), &[0, 1]), StoreMillis(10));
    assert_eq!(out.response.status, HeartbeatStatus::FencedMemberEpoch);
    // The live member is untouched; an epoch nobody issued is also evidence of lost writes.
    assert_eq!(member(&c, "a"), &before);
    assert!(loss_detected(&out.events));
}

fn loss_detected(events: &[AuditEvent]) -> bool {
    events
        .iter()
        .any(|e| matches!(e, AuditEvent::MetadataLossDetected { .. }))
}

/// a owned 4 shards; b joined and a has revoked 2 of them, so b was granted them (a new epoch for b).
/// Returns the group, b's previous epoch, a's remaining shards, and the shards that moved.
fn handed_over_to_b() -> (Coordinator, i64, Vec<u32>, Vec<u32>) {
    let mut c = group(4);
    let ea = join_and_settle(&mut c, "a", 0);
    let eb = join_and_settle(&mut c, "b", 0);
    let a_resp = c.heartbeat(&req("a", ea, "a1"), StoreMillis(10)).response;
    let a_keeps = shards(&a_resp.assignment.assigned_shards);
    let gone: Vec<u32> = (0..4).filter(|s| !a_keeps.contains(s)).collect();
    let revoke = revoked(
        owned(req("a", ea, "a2"), &a_keeps),
        &gone,
        RevokeState::Revoked,
    );
    let _ = c.heartbeat(&revoke, StoreMillis(20));
    (c, eb, a_keeps, gone)
}

#[test]
fn lost_response_previous_epoch_with_valid_ownership_is_accepted() {
    let (mut c, eb, _a_keeps, gone) = handed_over_to_b();
    // b's grant response is lost: b still sends its previous epoch, owning nothing new.
    let grant = member(&c, "b").member_epoch;
    assert!(grant > eb);
    let out = c
        .heartbeat(&owned(req("b", eb, "b-lagging"), &[]), StoreMillis(30))
        .response;
    assert!(out.status.is_accepted(), "{:?}", out.status);
    assert_eq!(out.member_epoch, grant);
    assert_eq!(shards(&out.assignment.assigned_shards), gone);
}

#[test]
fn lost_response_previous_epoch_claiming_foreign_shard_is_fenced() {
    let (mut c, eb, a_keeps, _gone) = handed_over_to_b();
    let out = c
        .heartbeat(
            &owned(req("b", eb, "b-lagging"), &[a_keeps[0]]),
            StoreMillis(30),
        )
        .response;
    assert_eq!(out.status, HeartbeatStatus::FencedMemberEpoch);
}

#[test]
fn unknown_member_with_positive_epoch_gets_unknown_member_id() {
    let mut c = group(2);
    join_and_settle(&mut c, "a", 0);
    let issued = c.metadata().last_member_epoch;
    let out = c.heartbeat(&req("ghost", issued, "x"), StoreMillis(0));
    assert_eq!(out.response.status, HeartbeatStatus::UnknownMemberId);
    assert_eq!(out.change, Change::None);
}

// ---- duplicate REVOKED after a re-grant (issue: a healthy member was fenced) ----

#[test]
fn ownership_rule_6_duplicate_revoked_after_the_shard_was_granted_back_is_ignored() {
    let mut c = group(2);
    let ea = join_and_settle(&mut c, "a", 0);
    join_and_settle(&mut c, "b", 0);
    let moving: Vec<u32> = member(&c, "a").revoking.keys().copied().collect();
    let keep: Vec<u32> = member(&c, "a").assigned.iter().copied().collect();
    let report = revoked(
        owned(req("a", ea, "a1"), &keep),
        &moving,
        RevokeState::Revoked,
    );
    assert!(c
        .heartbeat(&report, StoreMillis(10))
        .response
        .status
        .is_accepted());
    // The response is lost. b expires, so the shard goes back to a at an epoch a has not seen yet.
    let _ = c.tick(StoreMillis(SESSION));
    assert!(!c.metadata().members.contains_key("b"));
    let regranted = member(&c, "a").member_epoch;
    assert!(regranted > ea);
    assert!(moving.iter().all(|s| member(&c, "a").assigned.contains(s)));
    // a repeats its report under its previous epoch: a duplicate, not a violation.
    let out = c.heartbeat(&report, StoreMillis(SESSION + 5));
    assert!(out.response.status.is_accepted(), "{:?}", out.events);
    assert_eq!(out.response.member_epoch, regranted);
    assert_eq!(shards(&out.response.assignment.assigned_shards), vec![0, 1]);
    assert!(c.invariant_violations().is_empty());
}

// ---- recovery after the store lost metadata ----

fn created(creation: Creation, now: i64) -> Coordinator {
    let config = GroupConfig {
        heartbeat_interval_ms: HB,
        session_timeout_ms: SESSION,
        rebalance_timeout_ms: REBALANCE,
    };
    Coordinator::create("g", 4, config, StoreMillis(now), creation)
}

#[test]
fn recovery_a_group_recreated_after_loss_grants_nothing_for_a_session_timeout() {
    let t0 = 1_000_000;
    let mut c = created(Creation::AfterLoss, t0);
    let r = c
        .heartbeat(&req("a", 0, "a-join"), StoreMillis(t0))
        .response;
    assert!(r.status.is_accepted());
    assert!(r.assignment.assigned_shards.is_empty());
    assert_eq!(r.assignment.pending_shards.len(), 4);
    assert_eq!(c.next_timer(), Some(StoreMillis(t0 + SESSION)));
    let before = c.heartbeat(
        &owned(req("a", r.member_epoch, "a1"), &[]),
        StoreMillis(t0 + SESSION - 1),
    );
    assert!(before.response.assignment.assigned_shards.is_empty());
    let after = c.heartbeat(
        &owned(req("a", r.member_epoch, "a2"), &[]),
        StoreMillis(t0 + SESSION),
    );
    assert_eq!(after.response.assignment.assigned_shards.len(), 4);
    assert_eq!(c.metadata().grants_paused_until_ms, 0);
    assert_eq!(c.next_timer(), None);
}

#[test]
fn recovery_a_fresh_group_waits_two_heartbeat_intervals_before_its_first_grant() {
    let t0 = 1_000_000;
    let mut c = created(Creation::Fresh, t0);
    let r = c
        .heartbeat(&req("a", 0, "a-join"), StoreMillis(t0))
        .response;
    assert!(r.assignment.assigned_shards.is_empty());
    let out = c.heartbeat(
        &owned(req("a", r.member_epoch, "a1"), &[]),
        StoreMillis(t0 + 2 * HB),
    );
    assert_eq!(out.response.assignment.assigned_shards.len(), 4);
}

#[test]
fn recovery_epochs_of_a_recreated_group_are_above_its_predecessors() {
    let mut old = created(Creation::Fresh, 1_000_000);
    let t = 1_000_000 + 2 * HB;
    let e_old = join_and_settle(&mut old, "a", t);
    // Many epochs in one millisecond still stay below the next millisecond's floor.
    for i in 0..50 {
        join_and_settle(&mut old, &format!("m{i}"), t);
    }
    let last_old = old.metadata().last_member_epoch;
    assert!(last_old > e_old);
    let mut new = created(Creation::AfterLoss, t + 1);
    let r = new
        .heartbeat(&req("b", 0, "b-join"), StoreMillis(t + 1))
        .response;
    assert!(
        r.member_epoch > last_old,
        "{} <= {last_old}",
        r.member_epoch
    );
}

#[test]
fn recovery_a_member_of_the_lost_state_reveals_the_loss_and_extends_the_pause() {
    let t0 = 1_000_000;
    let mut old = created(Creation::Fresh, t0);
    let e = join_and_settle(&mut old, "a", t0 + 2 * HB);
    let version = old.metadata().metadata_version;
    // Everything was lost (FLUSHDB): the store sees no trace and creates a fresh group.
    let t1 = t0 + 60_000;
    let mut c = created(Creation::Fresh, t1);
    let mut hb = owned(req("a", e, "a-old"), &[0, 1, 2, 3]);
    hb.metadata_version = version;
    let out = c.heartbeat(&hb, StoreMillis(t1 + HB));
    assert_eq!(out.response.status, HeartbeatStatus::UnknownMemberId);
    assert!(loss_detected(&out.events));
    assert_eq!(out.change, Change::Metadata);
    assert_eq!(c.metadata().grants_paused_until_ms, t1 + HB + SESSION);
    assert!(c.metadata().metadata_version > version);
    // A new member that joins meanwhile gets nothing until a's lease has surely run out.
    let r = c
        .heartbeat(&req("b", 0, "b-join"), StoreMillis(t1 + 2 * HB))
        .response;
    let eb = r.member_epoch;
    assert!(eb > e);
    let early = c.heartbeat(
        &owned(req("b", eb, "b1"), &[]),
        StoreMillis(t1 + HB + SESSION - 1),
    );
    assert!(early.response.assignment.assigned_shards.is_empty());
    let late = c.heartbeat(
        &owned(req("b", eb, "b2"), &[]),
        StoreMillis(t1 + HB + SESSION),
    );
    assert_eq!(late.response.assignment.assigned_shards.len(), 4);
}

#[test]
fn recovery_a_metadata_version_the_store_never_wrote_pauses_grants() {
    let mut c = group(2);
    let e = join_and_settle(&mut c, "a", 0);
    let mut hb = owned(req("a", e, "a-ahead"), &[0, 1]);
    hb.metadata_version = c.metadata().metadata_version + 5;
    let out = c.heartbeat(&hb, StoreMillis(100));
    assert!(loss_detected(&out.events));
    assert_eq!(c.metadata().grants_paused_until_ms, 100 + SESSION);
    // The member itself keeps what it has: only new grants wait.
    assert!(out.response.status.is_accepted());
    assert_eq!(shards(&out.response.assignment.assigned_shards), vec![0, 1]);
}

// ---- implausible counters: garbage, not evidence ----

/// Store time in 2023, so epochs are in their real range.
const T_REAL: i64 = 1_700_000_000_000;

/// A real-clock group with `a` settled on all 4 shards, past the creation pause; returns a's epoch and now.
fn real_clock_group() -> (Coordinator, i64, i64) {
    let mut c = created(Creation::Fresh, T_REAL);
    let now = T_REAL + 2 * HB;
    let e = join_and_settle(&mut c, "a", now);
    assert_eq!(member(&c, "a").assigned.len(), 4);
    (c, e, now)
}

/// Applies `hb` and checks it was refused as INVALID_REQUEST without any effect on the group.
fn assert_refused_without_effect(c: &mut Coordinator, hb: &HeartbeatRequest, now: i64) {
    let before = c.clone();
    let out = c.heartbeat(hb, StoreMillis(now));
    assert_eq!(
        out.response.status,
        HeartbeatStatus::InvalidRequest,
        "{hb:?}"
    );
    assert_eq!(out.change, Change::None, "{hb:?}");
    assert!(out.events.is_empty(), "{:?}", out.events);
    assert_eq!(c, &before, "{hb:?}");
}

#[test]
fn an_implausible_member_epoch_is_rejected_and_changes_nothing() {
    let (mut c, e, now) = real_clock_group();
    let too_far = plausible_limit(now + 1) + 1;
    for epoch in [i64::MAX, too_far] {
        // From the live member, from a stranger, and claiming the live member's shards.
        assert_refused_without_effect(&mut c, &req("a", epoch, "garbage"), now + 1);
        assert_refused_without_effect(&mut c, &req("x", epoch, "garbage"), now + 1);
        assert_refused_without_effect(
            &mut c,
            &owned(req("a", epoch, "garbage"), &[0, 1, 2, 3]),
            now + 1,
        );
    }
    // The next join gets an ordinary epoch (no overflow, nothing raised) and no grant pause.
    let r = c
        .heartbeat(&req("b", 0, "b-join"), StoreMillis(now + 2))
        .response;
    assert_eq!(r.member_epoch, epoch_floor(now + 2));
    assert!(r.member_epoch > e);
    assert_eq!(c.metadata().grants_paused_until_ms, 0);
    let a = c
        .heartbeat(
            &owned(req("a", e, "a1"), &[0, 1, 2, 3]),
            StoreMillis(now + 3),
        )
        .response;
    assert_eq!(
        a.status,
        HeartbeatStatus::RevokePending,
        "a gives b its share"
    );
}

#[test]
fn an_implausible_metadata_version_is_rejected_and_changes_nothing() {
    let (mut c, e, now) = real_clock_group();
    for version in [i64::MAX, plausible_limit(now + 1) + 1, -1, i64::MIN] {
        let mut hb = owned(req("a", e, "garbage"), &[0, 1, 2, 3]);
        hb.metadata_version = version;
        assert_refused_without_effect(&mut c, &hb, now + 1);
        let mut join = req("x", 0, "garbage-join");
        join.metadata_version = version;
        assert_refused_without_effect(&mut c, &join, now + 1);
    }
}

#[test]
fn a_plausible_epoch_above_the_counter_is_still_evidence_of_loss() {
    let (mut c, _e, now) = real_clock_group();
    // The highest epoch a store whose clock ran a day ahead of ours could have issued.
    let limit = plausible_limit(now);
    assert_eq!(limit, epoch_floor(now + 24 * 60 * 60 * 1000));
    let out = c.heartbeat(&owned(req("x", limit, "lost"), &[0]), StoreMillis(now));
    assert_eq!(out.response.status, HeartbeatStatus::UnknownMemberId);
    assert!(loss_detected(&out.events));
    assert_eq!(c.metadata().last_member_epoch, limit);
    assert_eq!(c.metadata().grants_paused_until_ms, now + SESSION);
    // So is a plausible metadata version above the store's.
    let (mut c, e, now) = real_clock_group();
    let mut hb = owned(req("a", e, "ahead"), &[0, 1, 2, 3]);
    hb.metadata_version = limit;
    let out = c.heartbeat(&hb, StoreMillis(now));
    assert!(out.response.status.is_accepted());
    assert!(loss_detected(&out.events));
    assert!(c.metadata().metadata_version > limit);
}

#[test]
fn a_malformed_join_changes_nothing_not_even_as_evidence_of_loss() {
    let (mut c, _e, now) = real_clock_group();
    // A join still claiming shards, from a member that saw a (plausible) newer metadata version.
    let mut hb = revoked(req("x", 0, "x-join"), &[0], RevokeState::Revoking);
    hb.metadata_version = c.metadata().metadata_version + 5;
    assert_refused_without_effect(&mut c, &hb, now + 1);
    let mut hb = owned(req("x", 0, "x-join"), &[1]);
    hb.metadata_version = c.metadata().metadata_version + 5;
    assert_refused_without_effect(&mut c, &hb, now + 1);
}

#[test]
fn an_epoch_or_version_the_store_issued_itself_is_never_implausible() {
    // A counter beyond the clock bound (the store's clock went back) still answers its own members.
    let (mut c, _e, now) = real_clock_group();
    let back = now - 2 * PLAUSIBLE_CLOCK_LEAD_MS;
    let r = c
        .heartbeat(&req("b", 0, "b-join"), StoreMillis(back))
        .response;
    assert!(r.member_epoch > plausible_limit(back));
    let mut hb = owned(req("b", r.member_epoch, "b1"), &[]);
    hb.metadata_version = c.metadata().metadata_version;
    let out = c.heartbeat(&hb, StoreMillis(back));
    assert!(
        out.response.status.is_accepted(),
        "{:?}",
        out.response.status
    );
}

#[test]
fn next_member_epoch_never_overflows() {
    let mut c = group(2);
    c.meta.last_member_epoch = i64::MAX;
    let r = c.heartbeat(&req("a", 0, "a-join"), StoreMillis(0)).response;
    assert!(r.status.is_accepted());
    assert_eq!(
        r.member_epoch,
        i64::MAX,
        "stays at the top instead of wrapping"
    );
    assert_eq!(c.metadata().last_member_epoch, i64::MAX);
}

#[test]
fn deadlines_and_counters_never_overflow_at_extreme_store_times() {
    // At i64::MAX itself every lease has run out at once; one before, deadlines still lie ahead.
    let now = i64::MAX - 1;
    let mut c = created(Creation::AfterLoss, now);
    c.meta.grants_paused_until_ms = 0;
    c.meta.group_epoch = i64::MAX;
    c.meta.assignment_epoch = i64::MAX;
    c.meta.metadata_version = i64::MAX;
    let r = c
        .heartbeat(&req("a", 0, "a-join"), StoreMillis(now))
        .response;
    assert!(r.status.is_accepted(), "{:?}", r.status);
    // Rejoin times as extreme as the store may hold (the flap window).
    c.meta.members.get_mut("a").unwrap().rejoins = vec![i64::MIN, i64::MAX];
    let r = c
        .heartbeat(&req("a", 0, "a-again"), StoreMillis(now))
        .response;
    assert!(r.status.is_accepted(), "{:?}", r.status);
    // Its response was lost: the replay renews the lease.
    let replay = c
        .heartbeat(&req("a", 0, "a-again"), StoreMillis(now))
        .response;
    assert_eq!(replay.member_epoch, r.member_epoch);
    // The old incarnation's hold would keep the shards from it until the end of time.
    c.meta.holds.clear();
    // A renewal with grants, a second member (revocation deadlines), evidence of a loss (the pause).
    let a = c
        .heartbeat(
            &owned(req("a", r.member_epoch, "a1"), &[]),
            StoreMillis(now),
        )
        .response;
    assert_eq!(a.assignment.assigned_shards.len(), 4, "{now}: {a:?}");
    let b = c
        .heartbeat(&req("b", 0, "b-join"), StoreMillis(now))
        .response;
    assert!(b.status.is_accepted(), "{now}: {:?}", b.status);
    assert!(!member(&c, "a").revoking.is_empty());
    let out = c.heartbeat(&req("z", 5, "z"), StoreMillis(now));
    assert!(loss_detected(&out.events));
    assert_eq!(c.metadata().grants_paused_until_ms, i64::MAX);
    let _ = c.tick(StoreMillis(i64::MAX));
    assert!(c.invariant_violations().is_empty());
}

#[test]
fn stored_metadata_with_implausible_counters_or_timings_is_refused() {
    let now = StoreMillis(T_REAL);
    let (c, _e, _) = real_clock_group();
    let good = c.into_metadata();
    assert!(Coordinator::from_metadata(good.clone(), now).is_ok());
    let limit = plausible_limit(T_REAL + PLAUSIBLE_CLOCK_LEAD_MS);
    let mut at_limit = good.clone();
    at_limit.last_member_epoch = limit;
    at_limit.metadata_version = limit;
    assert!(Coordinator::from_metadata(at_limit, now).is_ok());
    let mangles: [fn(&mut GroupMetadata); 9] = [
        |m| m.last_member_epoch = i64::MAX,
        |m| m.last_member_epoch = -1,
        |m| m.metadata_version = i64::MAX,
        |m| m.group_epoch = i64::MIN,
        |m| m.assignment_epoch = i64::MAX,
        |m| m.config.session_timeout_ms = i64::MAX,
        |m| m.config.heartbeat_interval_ms = 0,
        |m| m.config.rebalance_timeout_ms = -5,
        |m| m.shard_count = 0,
    ];
    for mangle in mangles {
        let mut meta = good.clone();
        mangle(&mut meta);
        assert!(
            matches!(
                Coordinator::from_metadata(meta.clone(), now),
                Err(MetadataError::Corrupt(_))
            ),
            "{meta:?}"
        );
    }
}

#[test]
fn a_new_group_bounds_its_timings() {
    let config = GroupConfig {
        heartbeat_interval_ms: -1,
        session_timeout_ms: i64::MAX,
        rebalance_timeout_ms: 0,
    };
    let c = Coordinator::create("g", 1, config, StoreMillis(T_REAL), Creation::Fresh);
    let stored = c.metadata().config;
    assert_eq!(stored.heartbeat_interval_ms, 1);
    assert_eq!(stored.session_timeout_ms, metadata::MAX_TIMING_MS);
    assert_eq!(stored.rebalance_timeout_ms, 1);
    // What it creates, it can load again.
    assert!(Coordinator::from_metadata(c.into_metadata(), StoreMillis(T_REAL)).is_ok());
}

#[test]
fn unsupported_protocol_and_malformed_requests_change_nothing() {
    let mut c = group(2);
    let mut r = req("a", 0, "j");
    r.protocol_version = 2;
    assert_eq!(
        c.heartbeat(&r, StoreMillis(0)).response.status,
        HeartbeatStatus::UnsupportedProtocol
    );
    let dup = owned(req("a", 3, "j"), &[1, 1]);
    assert_eq!(
        c.heartbeat(&dup, StoreMillis(0)).response.status,
        HeartbeatStatus::InvalidRequest
    );
    let joining_with_shards = owned(req("a", 0, "j"), &[0]);
    assert_eq!(
        c.heartbeat(&joining_with_shards, StoreMillis(0))
            .response
            .status,
        HeartbeatStatus::InvalidRequest
    );
    assert_eq!(
        c.heartbeat(&req("", 0, "j"), StoreMillis(0))
            .response
            .status,
        HeartbeatStatus::InvalidRequest
    );
    assert_eq!(
        c.heartbeat(&req("a", -2, "j"), StoreMillis(0))
            .response
            .status,
        HeartbeatStatus::InvalidRequest
    );
    assert!(c.metadata().members.is_empty());
}

#[test]
fn leave_revokes_then_removes_after_revoked() {
    let mut c = group(2);
    let e = join_and_settle(&mut c, "a", 0);
    join_and_settle(&mut c, "b", 0);
    let a_owned: Vec<u32> = member(&c, "a").assigned_or_revoking().collect();
    let group_epoch = c.metadata().group_epoch;
    // Leave while still owning: LEAVING, shards revoking, b gets them as pending only.
    let out = c.heartbeat(&req("a", LEAVE_EPOCH, "l1"), StoreMillis(100));
    assert_eq!(out.response.member_epoch, e);
    assert_eq!(member(&c, "a").state, MemberState::Leaving);
    assert_eq!(c.metadata().group_epoch, group_epoch + 1);
    assert_eq!(member(&c, "b").pending().collect::<Vec<_>>(), a_owned);
    // REVOKED: a is removed, b gets the shards.
    let out = c.heartbeat(
        &revoked(
            owned(req("a", LEAVE_EPOCH, "l2"), &[]),
            &a_owned,
            RevokeState::Revoked,
        ),
        StoreMillis(200),
    );
    assert_eq!(out.response.member_epoch, LEAVE_EPOCH);
    assert!(!c.metadata().members.contains_key("a"));
    assert!(out
        .events
        .iter()
        .any(|e| matches!(e, AuditEvent::MemberLeft { .. })));
    assert_eq!(member(&c, "b").assigned.len(), 2);
}

/// Two members of 4 shards; `a` leaves for a restart and reports REVOKED: its shards.
fn a_away_for_a_restart(c: &mut Coordinator) -> Vec<u32> {
    let ea = join_and_settle(c, "a", 0);
    join_and_settle(c, "b", 0);
    let a_shards: Vec<u32> = member(c, "a").assigned.iter().copied().collect();
    assert_eq!(a_shards.len(), 2);
    let group_epoch = c.metadata().group_epoch;
    let out = c.heartbeat(
        &restarting(revoked(
            owned(req("a", LEAVE_EPOCH, "a-l1"), &[]),
            &a_shards,
            RevokeState::Revoking,
        )),
        StoreMillis(100),
    );
    assert_eq!(out.response.status, HeartbeatStatus::RevokePending);
    assert_eq!(out.response.member_epoch, ea);
    assert!(out.response.assignment.pending_shards.is_empty());
    assert!(out
        .events
        .iter()
        .any(|e| matches!(e, AuditEvent::MemberLeavingForRestart { kept_until_ms, .. } if *kept_until_ms == 100 + SESSION)));
    assert_eq!(
        c.metadata().group_epoch,
        group_epoch,
        "nobody else's target moves"
    );
    assert_eq!(
        member(c, "b").pending().count(),
        0,
        "b is given none of a's shards"
    );
    let out = c.heartbeat(
        &restarting(revoked(
            owned(req("a", LEAVE_EPOCH, "a-l2"), &[]),
            &a_shards,
            RevokeState::Revoked,
        )),
        StoreMillis(200),
    );
    assert_eq!(out.response.member_epoch, LEAVE_EPOCH, "the leave is done");
    assert!(member(c, "a").is_away());
    assert_eq!(
        member(c, "a").target.iter().copied().collect::<Vec<_>>(),
        a_shards
    );
    assert_eq!(member(c, "b").assigned.len(), 2);
    assert_eq!(member(c, "b").pending().count(), 0);
    a_shards
}

#[test]
fn a_leave_for_a_restart_keeps_the_target_and_the_rejoin_takes_the_shards_back_at_once() {
    let mut c = group(4);
    let a_shards = a_away_for_a_restart(&mut c);
    let previous = member(&c, "a").member_epoch;
    // Nothing moves while it is away.
    let out = c.tick(StoreMillis(SESSION / 2));
    assert!(out.events.is_empty(), "{:?}", out.events);
    // The new incarnation joins within the session: its shards at once, no fence, no hold.
    let out = c.heartbeat(
        &req("a", 0, "a-restarted-join"),
        StoreMillis(SESSION / 2 + 1),
    );
    assert_eq!(out.response.status, HeartbeatStatus::Ok);
    assert!(out.response.member_epoch > previous);
    assert_eq!(shards(&out.response.assignment.assigned_shards), a_shards);
    assert!(c.metadata().holds.is_empty());
    assert!(!out
        .events
        .iter()
        .any(|e| matches!(e, AuditEvent::MemberFenced { .. })));
    assert!(out
        .events
        .iter()
        .any(|e| matches!(e, AuditEvent::MemberRejoined { previous_epoch, .. } if *previous_epoch == previous)));
    assert_eq!(member(&c, "b").assigned.len(), 2, "b kept its own");
    assert!(!member(&c, "a").restarting);
    assert!(
        member(&c, "a").rejoins.is_empty(),
        "an announced restart is no flap"
    );
}

#[test]
fn a_member_away_for_a_restart_that_does_not_come_back_expires_and_its_shards_move() {
    let mut c = group(4);
    a_away_for_a_restart(&mut c);
    let eb = member(&c, "b").member_epoch;
    let _ = c.heartbeat(&req("b", eb, "b1"), StoreMillis(SESSION - 1));
    let out = c.tick(StoreMillis(200 + SESSION));
    assert!(out
        .events
        .iter()
        .any(|e| matches!(e, AuditEvent::MemberExpired { member_id, .. } if member_id == "a")));
    assert!(!c.metadata().members.contains_key("a"));
    assert_eq!(member(&c, "b").target.len(), 4);
    let b = c
        .heartbeat(
            &req("b", member(&c, "b").member_epoch, "b2"),
            StoreMillis(200 + SESSION),
        )
        .response;
    assert_eq!(
        b.assignment.assigned_shards.len(),
        4,
        "free at once: a gave them back"
    );
}

#[test]
fn repeated_restarts_announced_as_such_are_not_taken_for_a_duplicate_member_id() {
    let mut c = group(4);
    let mut now = 0;
    let e = join_and_settle(&mut c, "a", now);
    let mut epoch = e;
    for round in 0..(FLAP_REJOINS + 2) {
        now += 100;
        let out = c.heartbeat(
            &restarting(revoked(
                owned(req("a", LEAVE_EPOCH, &format!("a-l{round}")), &[]),
                &[0, 1, 2, 3],
                RevokeState::Revoked,
            )),
            StoreMillis(now),
        );
        assert_eq!(out.response.member_epoch, LEAVE_EPOCH);
        now += 100;
        let out = c.heartbeat(&req("a", 0, &format!("a-j{round}")), StoreMillis(now));
        assert_eq!(out.response.assignment.assigned_shards.len(), 4);
        assert!(out.response.member_epoch > epoch, "epochs only grow");
        epoch = out.response.member_epoch;
        assert!(!out
            .events
            .iter()
            .any(|e| matches!(e, AuditEvent::DuplicateMemberIdSuspected { .. })));
        let _ = c.heartbeat(
            &owned(req("a", epoch, &format!("a-c{round}")), &[0, 1, 2, 3]),
            StoreMillis(now),
        );
    }
    assert!(!member(&c, "a").duplicate_suspected);
}

#[test]
fn a_rejoin_before_the_restart_leave_gave_everything_back_fences_what_is_still_held() {
    let mut c = group(4);
    join_and_settle(&mut c, "a", 0);
    join_and_settle(&mut c, "b", 0);
    let a_shards: Vec<u32> = member(&c, "a").assigned.iter().copied().collect();
    let _ = c.heartbeat(
        &restarting(revoked(
            owned(req("a", LEAVE_EPOCH, "a-l1"), &[]),
            &a_shards,
            RevokeState::Draining,
        )),
        StoreMillis(100),
    );
    let lease = member(&c, "a").lease_deadline_ms;
    // The new incarnation comes up while the old one may still be handling its shards.
    let out = c.heartbeat(&req("a", 0, "a-new"), StoreMillis(200));
    assert!(out
        .events
        .iter()
        .any(|e| matches!(e, AuditEvent::MemberFenced { .. })));
    assert!(out.response.assignment.assigned_shards.is_empty());
    assert_eq!(
        shards(&out.response.assignment.pending_shards),
        a_shards,
        "kept for it"
    );
    for s in &a_shards {
        assert_eq!(c.metadata().holds[s].until_ms, lease);
    }
    let ea = out.response.member_epoch;
    let eb = member(&c, "b").member_epoch;
    let _ = c.heartbeat(&req("b", eb, "b-alive"), StoreMillis(SESSION / 2));
    let _ = c.tick(StoreMillis(lease));
    let out = c.heartbeat(&owned(req("a", ea, "a-after"), &[]), StoreMillis(lease));
    assert_eq!(shards(&out.response.assignment.assigned_shards), a_shards);
    assert_eq!(
        member(&c, "b").assigned.len(),
        2,
        "nothing went to b meanwhile"
    );
}

#[test]
fn a_plain_leave_after_a_leave_for_a_restart_gives_the_shards_to_the_others() {
    let mut c = group(4);
    a_away_for_a_restart(&mut c);
    let group_epoch = c.metadata().group_epoch;
    let out = c.heartbeat(
        &owned(req("a", LEAVE_EPOCH, "a-gone"), &[]),
        StoreMillis(300),
    );
    assert_eq!(out.response.member_epoch, LEAVE_EPOCH);
    assert!(!c.metadata().members.contains_key("a"));
    assert!(c.metadata().group_epoch > group_epoch);
    assert_eq!(member(&c, "b").target.len(), 4);
}

#[test]
fn restarting_on_a_heartbeat_that_is_not_a_leave_is_refused_and_changes_nothing() {
    let mut c = group(4);
    let e = join_and_settle(&mut c, "a", 0);
    let before = c.metadata().clone();
    for epoch in [0, e] {
        let out = c.heartbeat(&restarting(req("a", epoch, "odd")), StoreMillis(10));
        assert_eq!(out.response.status, HeartbeatStatus::InvalidRequest);
        assert_eq!(out.change, Change::None);
    }
    assert_eq!(c.metadata(), &before);
}

#[test]
fn leave_of_drained_member_removes_it_at_once() {
    let mut c = group(2);
    join_and_settle(&mut c, "a", 0);
    let out = c.heartbeat(
        &revoked(
            owned(req("a", LEAVE_EPOCH, "l"), &[]),
            &[0, 1],
            RevokeState::Revoked,
        ),
        StoreMillis(10),
    );
    assert_eq!(out.response.member_epoch, LEAVE_EPOCH);
    assert!(c.metadata().members.is_empty());
    assert_eq!(
        c.projection(StoreMillis(10)).state,
        projection::GroupState::Empty
    );
}

#[test]
fn expiry_fences_member_and_frees_its_shards() {
    let mut c = group(4);
    let ea = join_and_settle(&mut c, "a", 0);
    join_and_settle(&mut c, "b", 0);
    // Only b keeps heartbeating.
    let eb = member(&c, "b").member_epoch;
    let _ = c.heartbeat(&req("b", eb, "b0"), StoreMillis(SESSION - 1));
    let group_epoch = c.metadata().group_epoch;
    let out = c.tick(StoreMillis(SESSION));
    assert!(out
        .events
        .iter()
        .any(|e| matches!(e, AuditEvent::MemberExpired { .. })));
    assert!(c.metadata().group_epoch > group_epoch);
    assert!(
        c.metadata().holds.is_empty(),
        "an expired lease leaves nothing to hold"
    );
    let b = c
        .heartbeat(&req("b", eb, "b"), StoreMillis(SESSION))
        .response;
    assert_eq!(
        b.assignment.assigned_shards.len() + b.assignment.pending_shards.len(),
        4
    );
    // a comes back: fenced, must rejoin.
    assert_eq!(
        c.heartbeat(&req("a", ea, "a"), StoreMillis(SESSION + 1))
            .response
            .status,
        HeartbeatStatus::FencedMemberEpoch
    );
}

/// A member of the HTTP server: it does not self-fence, so its shards are held `hold` past its lease.
fn unfenced(mut r: HeartbeatRequest, hold: i64) -> HeartbeatRequest {
    r.hold_after_lease_ms = hold;
    r
}

/// Joins `member` as [`unfenced`] with `hold` and confirms its first assignment; returns its epoch.
fn join_unfenced_and_settle(c: &mut Coordinator, member: &str, hold: i64, now: i64) -> i64 {
    let r = c
        .heartbeat(
            &unfenced(req(member, 0, &format!("{member}-join")), hold),
            StoreMillis(now),
        )
        .response;
    assert_eq!(r.status, HeartbeatStatus::Ok);
    let assigned = shards(&r.assignment.assigned_shards);
    let r2 = c.heartbeat(
        &owned(
            req(member, r.member_epoch, &format!("{member}-c")),
            &assigned,
        ),
        StoreMillis(now),
    );
    assert!(r2.response.status.is_accepted(), "{:?}", r2.response.status);
    assert_eq!(member_hold(c, member), hold);
    r2.response.member_epoch
}

fn member_hold(c: &Coordinator, id: &str) -> i64 {
    member(c, id).hold_after_lease_ms
}

#[test]
fn expiry_of_a_member_that_does_not_self_fence_holds_its_shards_past_its_lease() {
    const GRACE: i64 = 5_000;
    let mut c = group(4);
    join_unfenced_and_settle(&mut c, "http", GRACE, 0);
    let held: Vec<u32> = member(&c, "http").assigned_or_revoking().collect();
    assert_eq!(held.len(), 4, "alone in the group, it has every shard");
    let eb = join_and_settle(&mut c, "rust", 0);
    // Only the Rust member heartbeats from now on; the HTTP member's lease passes at SESSION.
    let mut t = HB;
    while t < SESSION + GRACE {
        let b = c
            .heartbeat(&req("rust", eb, &format!("b{t}")), StoreMillis(t))
            .response;
        let eb_now = b.member_epoch;
        let b_has: Vec<u32> = shards(&b.assignment.assigned_shards);
        assert!(
            b_has.iter().all(|s| !held.contains(s)),
            "at {t}: granted {b_has:?}, still held for the HTTP member {held:?}"
        );
        if t >= SESSION {
            assert!(!c.metadata().members.contains_key("http"), "expired at {t}");
            assert!(held
                .iter()
                .all(|s| c.metadata().holds[s].until_ms == SESSION + GRACE));
        }
        assert_eq!(eb_now, member(&c, "rust").member_epoch);
        t += HB;
    }
    let b = c
        .heartbeat(
            &req("rust", member(&c, "rust").member_epoch, "b-end"),
            StoreMillis(SESSION + GRACE),
        )
        .response;
    assert!(c.metadata().holds.is_empty(), "released at lease + grace");
    assert_eq!(
        b.assignment.assigned_shards.len() + b.assignment.pending_shards.len(),
        4
    );
    assert!(c.invariant_violations().is_empty());
}

#[test]
fn a_fenced_member_that_does_not_self_fence_is_held_past_its_lease() {
    const GRACE: i64 = 7_000;
    let mut c = group(2);
    join_unfenced_and_settle(&mut c, "http", GRACE, 0);
    let held: Vec<u32> = member(&c, "http").assigned_or_revoking().collect();
    // A restart under the same memberId: the old incarnation is fenced and may still be reading.
    let r = c
        .heartbeat(
            &unfenced(req("http", 0, "http-again"), GRACE),
            StoreMillis(HB),
        )
        .response;
    assert_eq!(r.status, HeartbeatStatus::Ok);
    assert!(r.assignment.assigned_shards.is_empty());
    for s in &held {
        assert_eq!(c.metadata().holds[s].until_ms, SESSION + GRACE, "shard {s}");
    }
    // Past the old lease but within the grace: still nothing.
    let r = c
        .heartbeat(
            &owned(req("http", r.member_epoch, "h1"), &[]),
            StoreMillis(SESSION + 1),
        )
        .response;
    assert!(r.assignment.assigned_shards.is_empty(), "{r:?}");
    // A member of ours fenced the same way is held only until its lease.
    let mut plain = group(2);
    join_and_settle(&mut plain, "rust", 0);
    let _ = plain.heartbeat(&req("rust", 0, "rust-again"), StoreMillis(HB));
    assert!(plain
        .metadata()
        .holds
        .values()
        .all(|h| h.until_ms == SESSION));
}

#[test]
fn a_hold_after_lease_out_of_range_is_refused_and_changes_nothing() {
    for hold in [-1, wire::MAX_HOLD_AFTER_LEASE_MS + 1] {
        let mut c = group(2);
        let before = c.metadata().clone();
        let r = c
            .heartbeat(&unfenced(req("http", 0, "j"), hold), StoreMillis(0))
            .response;
        assert_eq!(r.status, HeartbeatStatus::InvalidRequest, "{hold}");
        assert_eq!(c.metadata(), &before);
    }
}

#[test]
fn rebalance_timeout_fences_stuck_member() {
    let mut c = group(2);
    let ea = join_and_settle(&mut c, "a", 0);
    join_and_settle(&mut c, "b", 0);
    // a keeps heartbeating but never reports REVOKED.
    let mut t = 0;
    while t < REBALANCE {
        t += HB;
        let _ = c.heartbeat(&req("a", ea, &format!("a{t}")), StoreMillis(t));
        let eb = member(&c, "b").member_epoch;
        let _ = c.heartbeat(&req("b", eb, &format!("b{t}")), StoreMillis(t));
    }
    assert!(
        !c.metadata().members.contains_key("a"),
        "fenced at the rebalance timeout"
    );
    assert!(c
        .metadata()
        .tombstones
        .iter()
        .any(|t| t.state == MemberState::Fenced));
    // Its shard in a fenced hold is released when its lease passes, then b gets it.
    assert_eq!(
        c.metadata().holds.len(),
        2,
        "its assigned and its revoking shard"
    );
    let mut b = None;
    for t in (t..=t + SESSION).step_by(HB as usize) {
        let eb = member(&c, "b").member_epoch;
        b = Some(
            c.heartbeat(&req("b", eb, &format!("b{t}")), StoreMillis(t))
                .response,
        );
    }
    assert!(c.metadata().holds.is_empty());
    assert_eq!(b.unwrap().assignment.assigned_shards.len(), 2);
}

#[test]
fn revoke_before_assign_new_owner_gets_shard_only_after_revoked() {
    let mut c = group(2);
    let ea = join_and_settle(&mut c, "a", 0);
    let out = c.heartbeat(&req("b", 0, "bj"), StoreMillis(10)).response;
    // Step 1-2: shard removed from a, b sees it pending.
    assert!(out.assignment.assigned_shards.is_empty());
    assert_eq!(out.assignment.pending_shards.len(), 1);
    let moving = out.assignment.pending_shards[0].shard_index;
    let a = c
        .heartbeat(&owned(req("a", ea, "a1"), &[0, 1]), StoreMillis(20))
        .response;
    assert_eq!(a.status, HeartbeatStatus::RevokePending);
    assert!(!shards(&a.assignment.assigned_shards).contains(&moving));
    // Still draining: nothing moves.
    let a_keep: Vec<u32> = shards(&a.assignment.assigned_shards);
    let _ = c.heartbeat(
        &revoked(
            owned(req("a", ea, "a2"), &a_keep),
            &[moving],
            RevokeState::Draining,
        ),
        StoreMillis(30),
    );
    assert!(member(&c, "b").assigned.is_empty());
    // Step 4-6: REVOKED, b gets it as assigned.
    let _ = c.heartbeat(
        &revoked(
            owned(req("a", ea, "a3"), &a_keep),
            &[moving],
            RevokeState::Revoked,
        ),
        StoreMillis(40),
    );
    let b = c
        .heartbeat(&req("b", out.member_epoch, "b1"), StoreMillis(50))
        .response;
    assert_eq!(shards(&b.assignment.assigned_shards), [moving]);
    assert!(
        b.member_epoch > out.member_epoch,
        "a grant is a new member epoch"
    );
}

#[test]
fn revoke_before_assign_expiry_of_old_owner_releases_shard() {
    let mut c = group(2);
    join_and_settle(&mut c, "a", 0);
    let b = c.heartbeat(&req("b", 0, "bj"), StoreMillis(10)).response;
    let eb = b.member_epoch;
    let _ = c.heartbeat(&req("b", eb, "b1"), StoreMillis(SESSION - 1));
    let _ = c.tick(StoreMillis(SESSION));
    let out = c
        .heartbeat(
            &req("b", member(&c, "b").member_epoch, "b2"),
            StoreMillis(SESSION),
        )
        .response;
    assert_eq!(out.assignment.assigned_shards.len(), 2);
}

#[test]
fn ownership_rule_1_owned_must_be_assigned_or_pending() {
    let mut c = group(4);
    let ea = join_and_settle(&mut c, "a", 0);
    let _ = c.command(AdminCommand::SetShardCount(6), StoreMillis(0));
    let a = c.heartbeat(&req("a", ea, "a1"), StoreMillis(1)).response;
    let e = a.member_epoch;
    // Shard 9 does not exist; a claims it.
    let out = c.heartbeat(&owned(req("a", e, "a2"), &[0, 9]), StoreMillis(2));
    assert_eq!(out.response.status, HeartbeatStatus::FencedMemberEpoch);
    assert!(out.events.iter().any(
        |e| matches!(e, AuditEvent::MemberFenced { reason, .. } if reason.contains("shard 9"))
    ));
}

#[test]
fn ownership_rule_2_revoking_must_match_removed_shards() {
    let mut c = group(2);
    let ea = join_and_settle(&mut c, "a", 0);
    let out = c.heartbeat(
        &revoked(owned(req("a", ea, "a1"), &[1]), &[0], RevokeState::Revoking),
        StoreMillis(1),
    );
    assert_eq!(out.response.status, HeartbeatStatus::FencedMemberEpoch);
    // Nothing it claimed is granted: its shards are in a fenced hold until its lease passes.
    assert_eq!(c.metadata().holds.len(), 2);
}

#[test]
fn ownership_rule_3_cannot_claim_shard_of_other_live_member() {
    let mut c = group(2);
    join_and_settle(&mut c, "a", 0);
    let eb = join_and_settle(&mut c, "b", 0);
    // b claims shard 0 while a still holds it (revoking or assigned).
    let a_holds: Vec<u32> = member(&c, "a").assigned_or_revoking().collect();
    let out = c.heartbeat(&owned(req("b", eb, "b1"), &[a_holds[0]]), StoreMillis(2));
    assert_eq!(out.response.status, HeartbeatStatus::FencedMemberEpoch);
    assert!(c.metadata().members.contains_key("a"));
    assert!(!c.metadata().members.contains_key("b"));
}

#[test]
fn ownership_rule_4_stale_member_epochs_are_rejected() {
    let mut c = group(2);
    let e = join_and_settle(&mut c, "a", 0);
    assert_eq!(
        c.heartbeat(&req("a", e - 1, "x"), StoreMillis(1))
            .response
            .status,
        HeartbeatStatus::FencedMemberEpoch
    );
}

#[test]
fn ownership_rule_5_stale_metadata_version_triggers_reconciliation() {
    let mut c = group(2);
    let e = join_and_settle(&mut c, "a", 0);
    let mut r = owned(req("a", e, "x"), &[0, 1]);
    r.metadata_version = 0;
    let out = c.heartbeat(&r, StoreMillis(1)).response;
    assert_eq!(out.status, HeartbeatStatus::SyncMetadata);
    assert_eq!(shards(&out.assignment.assigned_shards), [0, 1]);
    let mut r = req("a", e, "y");
    r.metadata_version = out.metadata_version;
    assert_eq!(
        c.heartbeat(&r, StoreMillis(2)).response.status,
        HeartbeatStatus::Ok
    );
}

#[test]
fn ownership_rule_6_duplicate_revoked_reports_are_ignored() {
    let mut c = group(2);
    let ea = join_and_settle(&mut c, "a", 0);
    join_and_settle(&mut c, "b", 0);
    let moving: Vec<u32> = member(&c, "a").revoking.keys().copied().collect();
    let keep: Vec<u32> = member(&c, "a").assigned.iter().copied().collect();
    let _ = c.heartbeat(
        &revoked(
            owned(req("a", ea, "a1"), &keep),
            &moving,
            RevokeState::Revoked,
        ),
        StoreMillis(10),
    );
    let ea = member(&c, "a").member_epoch;
    // The same report again (its response was lost), even after b got the shard.
    let out = c.heartbeat(
        &revoked(
            owned(req("a", ea, "a1"), &keep),
            &moving,
            RevokeState::Revoked,
        ),
        StoreMillis(20),
    );
    assert!(out.response.status.is_accepted());
    assert!(c.invariant_violations().is_empty());
}

#[test]
fn invalid_report_fences_reporter_and_grants_nothing() {
    let mut c = group(2);
    let ea = join_and_settle(&mut c, "a", 0);
    let out = c.heartbeat(&owned(req("a", ea, "a1"), &[0, 1, 7]), StoreMillis(5));
    assert_eq!(out.response.status, HeartbeatStatus::FencedMemberEpoch);
    assert!(out.response.assignment.assigned_shards.is_empty());
    let b = c.heartbeat(&req("b", 0, "bj"), StoreMillis(6)).response;
    assert!(
        b.assignment.assigned_shards.is_empty(),
        "in a fenced hold until a's lease passes"
    );
}

#[test]
fn two_members_with_same_member_id_are_detected() {
    let mut c = group(2);
    let mut t = 0;
    let mut events = Vec::new();
    // Two processes alternately rejoin under one memberId, each fenced by the other's join.
    for i in 0..4 {
        t += HB;
        events.extend(
            c.heartbeat(
                &req("twin", 0, &format!("p{}-join-{i}", i % 2)),
                StoreMillis(t),
            )
            .events,
        );
    }
    assert!(events
        .iter()
        .any(|e| matches!(e, AuditEvent::DuplicateMemberIdSuspected { .. })));
    let view = c.projection(StoreMillis(t));
    assert!(view
        .members
        .iter()
        .any(|m| m.member_id == "twin" && m.duplicate_suspected));
}

#[test]
fn sticky_assignment_balanced_group_moves_nothing_on_heartbeats() {
    let mut c = group(7);
    for m in ["a", "b", "c"] {
        join_and_settle(&mut c, m, 0);
    }
    let assignment_epoch = c.metadata().assignment_epoch;
    for m in ["a", "b", "c"] {
        let e = member(&c, m).member_epoch;
        let _ = c.heartbeat(&req(m, e, "x"), StoreMillis(1));
    }
    assert_eq!(c.metadata().assignment_epoch, assignment_epoch);
}

#[test]
fn assignment_epoch_stays_when_group_epoch_changes_without_new_target() {
    let mut c = group(2);
    join_and_settle(&mut c, "a", 0);
    join_and_settle(&mut c, "b", 0);
    // A third member joins a 2-shard group: group epoch moves, target does not.
    let before = c.metadata().assignment_epoch;
    let _ = c.heartbeat(&req("c", 0, "cj"), StoreMillis(1));
    assert_eq!(c.metadata().assignment_epoch, before);
}

#[test]
fn weights_are_static_configuration_not_reported_concurrency() {
    let mut c = group(8);
    let mut heavy = req("a", 0, "aj");
    heavy.weight = Some(3);
    let _ = c.heartbeat(&heavy, StoreMillis(0));
    let mut busy = req("b", 0, "bj");
    busy.runtime_consumer_capacity = RuntimeConsumerCapacity {
        runtime_max_concurrency: 64,
        available_concurrency: 64,
    };
    let _ = c.heartbeat(&busy, StoreMillis(0));
    assert_eq!(member(&c, "a").target.len(), 6);
    assert_eq!(member(&c, "b").target.len(), 2);
}

#[test]
fn shard_count_shrink_revokes_out_of_range_shards_and_grow_assigns_new_ones() {
    let mut c = group(4);
    let e = join_and_settle(&mut c, "a", 0);
    let ge = c.metadata().group_epoch;
    assert_eq!(
        c.command(AdminCommand::SetShardCount(2), StoreMillis(1))
            .response,
        Ok(())
    );
    assert_eq!(c.metadata().group_epoch, ge + 1);
    assert_eq!(
        c.metadata().resharding.as_ref().unwrap().state,
        MigrationState::Draining
    );
    let out = c
        .heartbeat(&owned(req("a", e, "a1"), &[0, 1, 2, 3]), StoreMillis(2))
        .response;
    assert_eq!(shards(&out.assignment.assigned_shards), [0, 1]);
    let _ = c.heartbeat(
        &revoked(
            owned(req("a", e, "a2"), &[0, 1]),
            &[2, 3],
            RevokeState::Revoked,
        ),
        StoreMillis(3),
    );
    assert_eq!(
        c.metadata().resharding.as_ref().unwrap().state,
        MigrationState::Active
    );
    let _ = c.command(AdminCommand::SetShardCount(3), StoreMillis(4));
    let e = member(&c, "a").member_epoch;
    assert_eq!(
        shards(
            &c.heartbeat(&req("a", e, "a3"), StoreMillis(5))
                .response
                .assignment
                .assigned_shards
        ),
        [0, 1, 2]
    );
    assert_eq!(
        c.command(AdminCommand::SetShardCount(0), StoreMillis(6))
            .response,
        Err(CommandError::ZeroShards)
    );
}

/// A rollback is a stream-level resize back to the previous count (`Topology::rollback`); the group
/// follows it like any other change: no rollback of its own that the stream would undo again.
#[test]
fn resharding_back_to_the_previous_count_is_an_ordinary_shard_count_change() {
    let mut c = group(4);
    join_and_settle(&mut c, "a", 0);
    let _ = c.command(AdminCommand::SetShardCount(8), StoreMillis(1));
    let ge = c.metadata().group_epoch;
    let out = c.command(AdminCommand::SetShardCount(4), StoreMillis(2));
    assert_eq!(out.response, Ok(()));
    assert_eq!(c.metadata().shard_count, 4);
    assert_eq!(c.metadata().group_epoch, ge + 1);
    assert!(out
        .events
        .iter()
        .any(|e| matches!(e, AuditEvent::ShardCountChanged { from: 8, to: 4 })));
}

#[test]
fn steady_state_heartbeat_only_renews_the_lease() {
    let mut c = group(2);
    let e = join_and_settle(&mut c, "a", 0);
    let v = c.metadata().metadata_version;
    let mut r = req("a", e, "s");
    r.metadata_version = v;
    let out = c.heartbeat(&r, StoreMillis(500));
    assert_eq!(out.change, Change::Lease);
    assert_eq!(out.response.status, HeartbeatStatus::Ok);
    assert!(out.events.is_empty());
    assert_eq!(c.metadata().metadata_version, v);
}

#[test]
fn next_deadline_reports_leases_timeouts_and_holds() {
    let mut c = group(2);
    assert_eq!(c.next_deadline(), None);
    join_and_settle(&mut c, "a", 0);
    assert_eq!(c.next_deadline(), Some(StoreMillis(SESSION)));
    join_and_settle(&mut c, "b", 0);
    assert_eq!(
        c.next_timer(),
        Some(StoreMillis(REBALANCE)),
        "a's revocation"
    );
}

#[test]
fn member_states_and_group_states_follow_the_lifecycle() {
    let mut c = group(2);
    let r = c.heartbeat(&req("a", 0, "j"), StoreMillis(0)).response;
    assert_eq!(member(&c, "a").state, MemberState::Joining);
    assert_eq!(
        c.projection(StoreMillis(0)).state,
        projection::GroupState::Reconciling
    );
    let _ = c.heartbeat(
        &owned(req("a", r.member_epoch, "c"), &[0, 1]),
        StoreMillis(1),
    );
    assert_eq!(member(&c, "a").state, MemberState::Stable);
    assert_eq!(
        c.projection(StoreMillis(1)).state,
        projection::GroupState::Stable
    );
    let _ = c.heartbeat(&req("b", 0, "bj"), StoreMillis(2));
    assert_eq!(
        c.projection(StoreMillis(2)).state,
        projection::GroupState::Assigning
    );
    let json = serde_json::to_value(c.projection(StoreMillis(2))).unwrap();
    assert_eq!(json["state"], "ASSIGNING");
    assert_eq!(json["members"][0]["state"], "STABLE");
}

#[test]
fn same_inputs_same_outputs() {
    let run = || {
        let mut c = group(16);
        let mut outs = Vec::new();
        for (i, m) in ["a", "b", "c"].iter().enumerate() {
            outs.push(c.heartbeat(&req(m, 0, "j"), StoreMillis(i as i64)));
        }
        (c, outs)
    };
    assert_eq!(run(), run());
}

/// Garbage heartbeats (extremes of every numeric field, from strangers and under honest members' ids,
/// some sent as the inbox sends them) interleaved with honest members. The store's queued path applies
/// each decoded entry with [`Coordinator::heartbeat`], the entry point driven here.
mod garbage {
    use super::*;
    use proptest::prelude::*;

    const HONEST: usize = 3;
    const IDS: [&str; 6] = ["h0", "h1", "h2", "x", "y", ""];

    /// A number chosen relative to the group's state when the step runs.
    #[derive(Debug, Clone)]
    enum Pick {
        Fixed(i64),
        Floor(i64),
        Limit(i64),
        Counter(i64),
        Honest(usize),
    }

    #[derive(Debug, Clone)]
    struct Garbage {
        member: usize,
        protocol: u32,
        request_id: &'static str,
        epoch: Pick,
        version: Pick,
        owned: Option<Vec<u32>>,
        revoking: Vec<(u32, RevokeState, u32)>,
        weight: Option<u32>,
        capacity: (u32, u32),
        pending_count: u64,
        queued: bool,
    }

    #[derive(Debug, Clone)]
    enum Step {
        Honest(usize),
        Garbage(Box<Garbage>),
        Advance(i64),
        Tick,
    }

    fn pick() -> impl Strategy<Value = Pick> {
        let extremes = prop::sample::select(vec![
            0,
            1,
            -1,
            -2,
            i64::MIN,
            i64::MIN + 1,
            i64::MAX,
            i64::MAX - 1,
            i64::from(u32::MAX),
            i64::from(i32::MAX),
            i64::from(i32::MIN),
        ]);
        let near = || prop::sample::select(vec![-1000, -1, 0, 1, 1000]);
        prop_oneof![
            3 => extremes.prop_map(Pick::Fixed),
            1 => any::<i64>().prop_map(Pick::Fixed),
            2 => near().prop_map(Pick::Floor),
            2 => near().prop_map(Pick::Limit),
            2 => near().prop_map(Pick::Counter),
            2 => (0..HONEST).prop_map(Pick::Honest),
        ]
    }

    fn garbage() -> impl Strategy<Value = Garbage> {
        let u32s =
            || prop::sample::select(vec![0, 1, 2, 3, 4, 5, u32::MAX / 2, u32::MAX - 1, u32::MAX]);
        let state = prop::sample::select(vec![
            RevokeState::Revoking,
            RevokeState::Draining,
            RevokeState::Revoked,
        ]);
        (
            (
                0..IDS.len(),
                prop::sample::select(vec![1, 1, 1, 0, 2, u32::MAX]),
                prop::sample::select(vec!["g1", "g2", "", "h0-join"]),
                pick(),
                pick(),
            ),
            (
                proptest::option::of(proptest::collection::vec(u32s(), 0..4)),
                proptest::collection::vec((u32s(), state, u32s()), 0..3),
                proptest::option::of(u32s()),
                (u32s(), u32s()),
                prop::sample::select(vec![0, 1, u64::MAX]),
                any::<bool>(),
            ),
        )
            .prop_map(
                |(
                    (member, protocol, request_id, epoch, version),
                    (owned, revoking, weight, capacity, pending_count, queued),
                )| Garbage {
                    member,
                    protocol,
                    request_id,
                    epoch,
                    version,
                    owned,
                    revoking,
                    weight,
                    capacity,
                    pending_count,
                    queued,
                },
            )
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (0..HONEST).prop_map(Step::Honest),
            4 => garbage().prop_map(|g| Step::Garbage(Box::new(g))),
            2 => prop::sample::select(vec![1, HB / 2, HB, SESSION, 3 * SESSION]).prop_map(Step::Advance),
            1 => Just(Step::Tick),
        ]
    }

    /// A member that follows the protocol: sends what it was told, gives back what was taken.
    #[derive(Debug)]
    struct Honest {
        id: String,
        epoch: i64,
        version: i64,
        owned: BTreeSet<u32>,
        revoked: BTreeSet<u32>,
        sent: u64,
        highest_epoch: i64,
    }

    impl Honest {
        fn new(i: usize) -> Self {
            Self {
                id: IDS[i].to_string(),
                epoch: 0,
                version: 0,
                owned: BTreeSet::new(),
                revoked: BTreeSet::new(),
                sent: 0,
                highest_epoch: 0,
            }
        }

        fn request(&mut self) -> HeartbeatRequest {
            self.sent += 1;
            let mut r = req(&self.id, self.epoch, &format!("{}-{}", self.id, self.sent));
            r.metadata_version = self.version;
            r.weight = Some(1);
            if self.epoch != JOIN_EPOCH {
                let holds: Vec<u32> = self.owned.iter().copied().collect();
                let gave_back: Vec<u32> = self.revoked.iter().copied().collect();
                r = revoked(owned(r, &holds), &gave_back, RevokeState::Revoked);
            }
            r
        }

        fn on_response(&mut self, resp: &HeartbeatResponse) -> Result<(), TestCaseError> {
            prop_assert!(
                !matches!(
                    resp.status,
                    HeartbeatStatus::InvalidRequest | HeartbeatStatus::UnsupportedProtocol
                ),
                "honest {} refused: {:?}",
                self.id,
                resp
            );
            // A leave forged under its id took it out of the group (answered with the leave epoch).
            if resp.status.requires_rejoin() || resp.member_epoch == LEAVE_EPOCH {
                *self = Self {
                    sent: self.sent,
                    highest_epoch: self.highest_epoch,
                    ..Self::new(0)
                }
                .named(&self.id);
                return Ok(());
            }
            if !resp.status.is_accepted() {
                return Ok(());
            }
            prop_assert!(
                resp.member_epoch >= self.highest_epoch,
                "{}'s epoch went back from {} to {}",
                self.id,
                self.highest_epoch,
                resp.member_epoch
            );
            self.highest_epoch = resp.member_epoch;
            let assigned: BTreeSet<u32> = shards(&resp.assignment.assigned_shards)
                .into_iter()
                .collect();
            self.revoked = self.owned.difference(&assigned).copied().collect();
            self.owned = assigned;
            self.epoch = resp.member_epoch;
            self.version = resp.metadata_version;
            Ok(())
        }

        fn named(mut self, id: &str) -> Self {
            self.id = id.to_string();
            self
        }
    }

    fn resolve(pick: &Pick, now: i64, counter: i64, honest: &[Honest], version: bool) -> i64 {
        match *pick {
            Pick::Fixed(v) => v,
            Pick::Floor(d) => epoch_floor(now).saturating_add(d),
            Pick::Limit(d) => plausible_limit(now).saturating_add(d),
            Pick::Counter(d) => counter.saturating_add(d),
            Pick::Honest(i) if version => honest[i].version,
            Pick::Honest(i) => honest[i].epoch,
        }
    }

    fn build(g: &Garbage, c: &Coordinator, now: i64, honest: &[Honest]) -> HeartbeatRequest {
        let meta = c.metadata();
        let mut r = req(IDS[g.member], 0, g.request_id);
        r.protocol_version = g.protocol;
        r.member_epoch = resolve(&g.epoch, now, meta.last_member_epoch, honest, false);
        r.metadata_version = resolve(&g.version, now, meta.metadata_version, honest, true);
        r.owned_shards = g
            .owned
            .as_ref()
            .map(|o| o.iter().copied().map(ShardId::new).collect());
        r.revoking_shards = g
            .revoking
            .iter()
            .map(|&(s, state, in_flight)| RevokingShard {
                shard: ShardId::new(s),
                state,
                in_flight,
                acked_at: None,
            })
            .collect();
        r.weight = g.weight;
        r.runtime_consumer_capacity = RuntimeConsumerCapacity {
            runtime_max_concurrency: g.capacity.0,
            available_concurrency: g.capacity.1,
        };
        r.shard_progress = r
            .owned_shards
            .iter()
            .flatten()
            .map(|&shard| wire::ShardProgress {
                shard,
                stream_key: "s".into(),
                last_delivered_id: None,
                last_acked_id: None,
                pending_count: g.pending_count,
                updated_at: None,
            })
            .collect();
        if g.queued {
            // What `enqueue.lua` stores and the writer decodes.
            let json = serde_json::to_string(&r).expect("heartbeats serialize");
            r = serde_json::from_str(&json).expect("heartbeats decode");
        }
        r
    }

    proptest! {
        #[test]
        fn garbage_heartbeats_never_break_the_group(steps in proptest::collection::vec(step(), 1..80)) {
            let mut c = created(Creation::Fresh, T_REAL);
            let mut now = T_REAL;
            let mut honest: Vec<Honest> = (0..HONEST).map(Honest::new).collect();
            for step in &steps {
                match step {
                    Step::Honest(i) => {
                        let r = honest[*i].request();
                        let out = c.heartbeat(&r, StoreMillis(now));
                        honest[*i].on_response(&out.response)?;
                    }
                    Step::Garbage(g) => {
                        // Timers first, so that whatever changes below is the heartbeat's doing.
                        let _ = c.tick(StoreMillis(now));
                        let before = c.clone();
                        let r = build(g, &c, now, &honest);
                        let meta = c.metadata();
                        let limit = plausible_limit(now);
                        let implausible = r.member_epoch > limit.max(meta.last_member_epoch)
                            || r.metadata_version < 0
                            || r.metadata_version > limit.max(meta.metadata_version);
                        let out = c.heartbeat(&r, StoreMillis(now));
                        let refused = matches!(
                            out.response.status,
                            HeartbeatStatus::InvalidRequest | HeartbeatStatus::UnsupportedProtocol
                        );
                        prop_assert!(!implausible || refused, "implausible {:?} got {:?}", r, out.response.status);
                        if refused {
                            prop_assert_eq!(out.change, Change::None);
                            prop_assert!(out.events.is_empty(), "{:?}", out.events);
                            prop_assert!(c == before, "a refused {:?} changed the group", r);
                        }
                    }
                    Step::Advance(ms) => now += ms,
                    Step::Tick => {
                        let _ = c.tick(StoreMillis(now));
                    }
                }
                let meta = c.metadata();
                prop_assert!(c.invariant_violations().is_empty(), "{:?}", c.invariant_violations());
                // Evidence may raise a counter up to the limit; the group counts on from there (an
                // epoch per member and step at most, a version per step).
                let slack = (steps.len() * IDS.len()) as i64;
                prop_assert!(
                    meta.last_member_epoch <= plausible_limit(now) + slack,
                    "last member epoch {} above the plausible {}",
                    meta.last_member_epoch,
                    plausible_limit(now)
                );
                prop_assert!(meta.metadata_version <= plausible_limit(now) + slack);
                prop_assert!(meta.grants_paused_until_ms <= now + SESSION);
            }
        }
    }
}
