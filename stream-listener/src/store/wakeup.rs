//! Wake-ups: a commit that grants or revokes shards of members it does not answer publishes their
//! memberIds on the group's wake channel (`sl:{<stream>/<group>}:wake`, inside `commit.lua`), and those
//! members heartbeat at once instead of at their next interval. A hand-off (a leave, a REVOKED report, an
//! expiry) then takes a few round trips instead of up to a heartbeat interval.
//!
//! Only a shortcut: nothing depends on a wake-up arriving. A lost one (no subscriber yet, a dropped
//! connection, a failover) leaves the interval pacing, which every safety and liveness argument assumes
//! anyway. A wake-up only brings a heartbeat forward, so a forged one costs a heartbeat and nothing else.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use crate::connection::RedisTarget;
use crate::coordinator::events::AuditEvent;

/// The subscription is the process's, shared by its members of a group, so its lines carry no member:
/// they get a target of their own rather than the store's (whose lines are each about one member).
const LOG_TARGET: &str = "stream_listener::wakeup";

/// The members a commit must wake: those whose shards its events grant or revoke, unless the member's
/// own answer in this commit already reflects that event (`answered`: memberId and how many of `events`
/// came before its answer was built). A heartbeat later in the same batch can move a member answered
/// earlier, and that member must still be woken. In order, without repeats.
pub fn to_wake<'a>(events: &'a [AuditEvent], answered: &[(String, usize)]) -> Vec<&'a str> {
    let mut wake: Vec<&str> = Vec::new();
    for (index, event) in events.iter().enumerate() {
        let member = match event {
            AuditEvent::ShardsAssigned { member_id, .. }
            | AuditEvent::ShardsRevokeRequested { member_id, .. } => member_id.as_str(),
            _ => continue,
        };
        let told = answered
            .iter()
            .any(|(id, seen)| id == member && index < *seen);
        if !told && !wake.contains(&member) {
            wake.push(member);
        }
    }
    wake
}

/// One process's subscription to a group's wake channel, shared by its members in that group.
/// Unsubscribes when dropped.
#[derive(Debug)]
pub struct Wakeups {
    members: Arc<Mutex<HashMap<String, Arc<Notify>>>>,
    /// Becomes `true` once the subscription is in place (and again after each resubscription).
    subscribed: watch::Receiver<bool>,
    task: JoinHandle<()>,
}

impl Wakeups {
    /// Subscribes to `channel` on `target` (on a cluster through a seed node: `PUBLISH` reaches every
    /// node), reconnecting with backoff for as long as it lives.
    pub fn start(target: RedisTarget, channel: String) -> Self {
        let members: Arc<Mutex<HashMap<String, Arc<Notify>>>> = Arc::default();
        let (subscribed_tx, subscribed) = watch::channel(false);
        let task = tokio::spawn(subscribe(target, channel, members.clone(), subscribed_tx));
        Self {
            members,
            subscribed,
            task,
        }
    }

    /// Waits until the subscription is in place, at most `timeout`; returns whether it is. Members that
    /// start before it may miss a wake-up and fall back to the interval, so the runtime waits a little.
    pub async fn subscribed(&self, timeout: Duration) -> bool {
        let mut subscribed = self.subscribed.clone();
        let done = tokio::time::timeout(timeout, subscribed.wait_for(|s| *s)).await;
        matches!(done, Ok(Ok(_)))
    }

    /// What wakes `member_id`: notified (one stored permit) each time a commit names it.
    pub fn register(&self, member_id: &str) -> Arc<Notify> {
        self.members
            .lock()
            // Plain data: a panic elsewhere cannot leave it half-updated.
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(member_id.to_owned())
            .or_default()
            .clone()
    }
}

impl Drop for Wakeups {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn subscribe(
    target: RedisTarget,
    channel: String,
    members: Arc<Mutex<HashMap<String, Arc<Notify>>>>,
    subscribed: watch::Sender<bool>,
) {
    let mut failures = 0u32;
    loop {
        let switches = target.master_switches();
        match target.pubsub().await {
            Ok(mut pubsub) => match pubsub.subscribe(&channel).await {
                Ok(()) => {
                    failures = 0;
                    subscribed.send_replace(true);
                    let mut messages = pubsub.on_message();
                    // Behind Sentinel, a switch of the master ends the subscription: the old master
                    // no longer hears the heartbeats' publications.
                    let switched = target.master_switched(switches);
                    tokio::pin!(switched);
                    while let Some(message) = tokio::select! {
                        message = messages.next() => message,
                        () = &mut switched => None,
                    } {
                        let Ok(payload) = message.get_payload::<String>() else {
                            continue;
                        };
                        // Plain data: a panic elsewhere cannot leave it half-updated.
                        let members = members
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner);
                        for id in payload.split(' ') {
                            if let Some(notify) = members.get(id) {
                                notify.notify_one();
                            }
                        }
                    }
                    subscribed.send_replace(false);
                    tracing::debug!(target: LOG_TARGET, %channel, "wake-up subscription ended; resubscribing");
                }
                Err(error) => {
                    tracing::debug!(target: LOG_TARGET, %channel, %error, "wake-up subscribe failed")
                }
            },
            Err(error) => {
                tracing::debug!(target: LOG_TARGET, %channel, %error, "wake-up connection failed")
            }
        }
        failures = failures.saturating_add(1);
        let backoff = crate::util::exponential_backoff(
            Duration::from_millis(100),
            failures,
            Duration::from_secs(5),
        );
        tokio::time::sleep(crate::util::equal_jitter(
            backoff,
            crate::util::random_u64(),
        ))
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assigned(member: &str) -> AuditEvent {
        AuditEvent::ShardsAssigned {
            member_id: member.into(),
            member_epoch: 7,
            shards: vec![1],
        }
    }

    #[test]
    fn rule_a_commit_wakes_members_it_granted_or_revoked_but_did_not_answer() {
        let events = vec![
            assigned("b"),
            AuditEvent::ShardsRevokeRequested {
                member_id: "c".into(),
                shards: vec![2],
            },
            assigned("a"),
            assigned("b"),
            AuditEvent::ShardsRevoked {
                member_id: "d".into(),
                shards: vec![3],
            },
        ];
        assert_eq!(to_wake(&events, &[("a".to_owned(), 5)]), vec!["b", "c"]);
        assert!(to_wake(&[], &[]).is_empty());
    }

    #[test]
    fn rule_a_member_answered_early_in_a_batch_is_woken_by_a_later_grant() {
        // a was answered after the first event; the batch then granted it more.
        let events = vec![assigned("a"), assigned("b"), assigned("a")];
        assert_eq!(
            to_wake(&events, &[("a".to_owned(), 1), ("b".to_owned(), 2)]),
            vec!["a"]
        );
    }
}
