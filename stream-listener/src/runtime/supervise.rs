//! Supervision of the runtime's long-running tasks.
//!
//! A member's heartbeat loop and consumer, and a group's topology follower, run until shutdown. One that
//! ends before (a panic, or a loop that gave up, such as the heartbeat loop leaving after its consumer
//! died) is reported here, so that [`Runtime::run`](super::Runtime::run) logs an ERROR naming it and fails,
//! instead of running on with a dead member. Tasks nobody depends on (the wake-up subscription, the metrics
//! sampler) only log at ERROR when they panic.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::sync::mpsc;

use crate::consumer::panic_message;

/// A supervised task that ended while the runtime was running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TaskExit {
    /// Whose task: `member <memberId>`, or `group <group> of stream <stream>`.
    pub(crate) owner: String,
    /// Which task: `heartbeat loop`, `consumer`, `topology follower`.
    pub(crate) task: &'static str,
    /// `ended`, or `panicked: <message>`.
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
    let reason = match CatchPanic(Box::pin(future)).await {
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
    if let Err(message) = CatchPanic(Box::pin(future)).await {
        tracing::error!(task = %what, panic = %message, "a background task panicked");
    }
}

/// A future that turns a panic while polling into `Err(message)`.
struct CatchPanic<F>(Pin<Box<F>>);

impl<F: Future> Future for CatchPanic<F> {
    type Output = Result<F::Output, String>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let future = self.0.as_mut();
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| future.poll(cx))) {
            Ok(poll) => poll.map(Ok),
            Err(panic) => Poll::Ready(Err(panic_message(&*panic))),
        }
    }
}
