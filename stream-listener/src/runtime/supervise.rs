//! Supervision of the runtime's long-running tasks.
//!
//! A member's heartbeat loop and consumer, and a group's topology follower, run until shutdown. One that
//! ends before (a panic, or a loop that gave up, such as the heartbeat loop leaving after its consumer
//! died) is reported here, so that [`Runtime::run`](super::Runtime::run) logs an ERROR naming it and fails,
//! instead of running on with a dead member. Tasks nobody depends on (the wake-up subscription, the metrics
//! sampler) only log at ERROR when they panic.

use std::future::Future;

use tokio::sync::mpsc;

use crate::panic::catch_panic;

/// A supervised task that ended while the runtime was running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TaskExit {
    /// Whose task: `member <memberId>`, or `group <group> of stream <stream>`.
    pub(crate) owner: String,
    /// Which task: `heartbeat loop`, `consumer`, `topology follower`.
    pub(crate) task: &'static str,
    /// `ended`, or `panicked: <message> (at <file:line:column>)`.
    pub(crate) reason: String,
}

/// Where supervised tasks report that they ended.
pub(crate) type Exits = mpsc::UnboundedSender<TaskExit>;

/// Runs `future`, catching a panic, and reports on `exits` when it ends, however it ends. An aborted task
/// reports nothing (the runtime aborted it).
pub(crate) async fn supervised(
    owner: String,
    task: &'static str,
    exits: Exits,
    future: impl Future<Output = ()>,
) {
    let reason = match catch_panic(Box::pin(future)).await {
        Ok(()) => "ended".to_owned(),
        Err(message) => format!("panicked: {message}"),
    };
    let _ = exits.send(TaskExit {
        owner,
        task,
        reason,
    });
}

/// Runs `future`, logging at ERROR if it panics; for tasks whose end nothing depends on.
pub(crate) async fn logged(what: String, future: impl Future<Output = ()>) {
    if let Err(message) = catch_panic(Box::pin(future)).await {
        tracing::error!(task = %what, panic = %message, "a background task panicked");
    }
}
