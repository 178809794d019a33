//! A started runtime ([`RunningRuntime`]): what it reports while it runs (health, statuses), pause and
//! resume of its listeners, and the graceful stop with its report of what did not stop in time.

use std::fmt;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::consumer::PauseHandle;
use crate::health::InFlight;
use crate::member::heartbeat::MemberStatus;
use crate::member::session::Phase;
use crate::store::wakeup::Wakeups;

use super::member::RunningMember;
use super::supervise::TaskExit;
use super::RuntimeError;

/// A started runtime.
#[derive(Debug)]
pub struct RunningRuntime {
    pub(super) shutdown: watch::Sender<bool>,
    pub(super) members: Vec<RunningMember>,
    pub(super) followers: Vec<JoinHandle<()>>,
    /// Kept for the members' lifetime; dropping one ends its subscription.
    pub(super) _wakeups: Vec<Wakeups>,
    pub(super) timeout: Duration,
    /// Member and follower tasks that ended while running (see `supervise.rs`).
    pub(super) exits: mpsc::UnboundedReceiver<TaskExit>,
    /// Where its Redis is, for the waits (`wait.rs`).
    pub(super) client: crate::connection::RedisTarget,
}

impl RunningRuntime {
    /// [`Runtime::run`](super::Runtime::run) for a runtime already started: runs until SIGTERM or
    /// ctrl-c, then [`stop`](Self::stop)s. Take what you need first:
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), stream_listener::RuntimeError> {
    /// let running = stream_listener::Runtime::from_env().start().await?;
    /// let health = running.health_handle(); // for a probe endpoint, on another task or thread
    /// # drop(health);
    /// running.run_until_signal().await
    /// # }
    /// ```
    ///
    /// A second signal during the graceful stop (the operator's second ctrl-c) aborts what is still
    /// running at once: the result is then [`RuntimeError::ShutdownForced`], naming it.
    pub async fn run_until_signal(self) -> Result<(), RuntimeError> {
        // The second listener is made only when polled, after the first signal: one signal never
        // completes both.
        self.run_until_forced(
            super::signal::wait_for_signal(),
            super::signal::wait_for_signal(),
        )
        .await
    }

    /// Runs until `stop` completes (a signal of the application's own, a channel), then
    /// [`stop`](Self::stop)s gracefully, returning its error if the shutdown missed its deadline. A
    /// supervised task that stops first is logged at ERROR, the rest is shut down, and the result is
    /// [`RuntimeError::TaskStopped`] naming it.
    pub async fn run_until(
        self,
        stop: impl std::future::Future<Output = ()>,
    ) -> Result<(), RuntimeError> {
        self.run_until_forced(stop, std::future::pending()).await
    }

    /// [`run_until`](Self::run_until), where `force` completing during the graceful stop aborts what is
    /// still running ([`RuntimeError::ShutdownForced`]).
    async fn run_until_forced(
        mut self,
        stop: impl std::future::Future<Output = ()>,
        force: impl std::future::Future<Output = ()>,
    ) -> Result<(), RuntimeError> {
        let exit = tokio::select! {
            () = stop => None,
            Some(exit) = self.exits.recv() => Some(exit),
        };
        let Some(exit) = exit else {
            tracing::info!("shutting down (a second signal aborts what is still running)");
            return self.stop_or_force(force).await;
        };
        tracing::error!(owner = %exit.owner, task = exit.task, reason = %exit.reason, "a task of the runtime stopped while running; shutting the runtime down");
        if let Err(error) = self.stop_or_force(force).await {
            tracing::error!(%error, "shutdown incomplete");
        }
        Err(RuntimeError::TaskStopped {
            owner: exit.owner,
            task: exit.task,
            reason: exit.reason,
        })
    }

    /// The ids [`pause`](Self::pause) and [`resume`](Self::resume) take: a listener's id is its member's
    /// id (one per member, so `concurrency = 4` gives four), in start order.
    pub fn listener_ids(&self) -> Vec<String> {
        self.members.iter().map(|m| m.member_id.clone()).collect()
    }

    /// Pauses a listener (Kafka's `pause`): no new read starts within one poll (a running batch finishes,
    /// the idle wait is interrupted); the member keeps heartbeating and keeps its shards. Entries keep
    /// accumulating in the streams until [`resume`](Self::resume).
    pub fn pause(&self, id: &str) -> Result<(), RuntimeError> {
        self.pause_handle(id)?.pause();
        Ok(())
    }

    /// Resumes a paused listener: reads start again where they stopped.
    pub fn resume(&self, id: &str) -> Result<(), RuntimeError> {
        self.pause_handle(id)?.resume();
        Ok(())
    }

    /// Whether a listener is paused.
    pub fn is_paused(&self, id: &str) -> Result<bool, RuntimeError> {
        Ok(self.pause_handle(id)?.is_paused())
    }

    fn pause_handle(&self, id: &str) -> Result<&PauseHandle, RuntimeError> {
        self.members
            .iter()
            .find(|m| m.member_id == id)
            .map(|m| &m.pause)
            .ok_or_else(|| RuntimeError::UnknownListener {
                id: id.to_owned(),
                known: self.listener_ids(),
            })
    }

    /// Readiness and liveness of every member: heartbeating, joined and not self-fenced, no shard in a
    /// read error loop, no handler past its timeout (see [`crate::health`]).
    pub fn health(&self) -> crate::health::Health {
        crate::health::Health {
            members: self
                .members
                .iter()
                .map(|m| {
                    let status = m.status.borrow();
                    m.probe.member_health(
                        &m.member_id,
                        !m.heartbeat_task.is_finished(),
                        status.phase == Phase::Member && m.deadline.is_valid(),
                        status.failures,
                    )
                })
                .collect(),
        }
    }

    /// A cloneable handle on [`health`](Self::health) that outlives borrows of the runtime, for a probe
    /// endpoint on another task or thread (the `http` feature's `ProbeServer`).
    pub fn health_handle(&self) -> crate::health::HealthHandle {
        crate::health::HealthHandle {
            members: self
                .members
                .iter()
                .map(|m| crate::health::MemberWatch {
                    member_id: m.member_id.clone(),
                    probe: m.probe.clone(),
                    deadline: m.deadline.clone(),
                    status: m.status.clone(),
                })
                .collect(),
        }
    }

    /// The current status of every member.
    pub fn statuses(&self) -> Vec<(String, MemberStatus)> {
        self.members
            .iter()
            .map(|m| (m.member_id.clone(), m.status.borrow().clone()))
            .collect()
    }

    /// Graceful shutdown: every member revokes its shards, waits for in-flight handlers, acknowledges,
    /// reports REVOKED and leaves the group; bounded by the shutdown timeout. Returns
    /// [`RuntimeError::ShutdownTimedOut`] naming every member that did not stop in time (its shards and
    /// running handlers). Those are aborted: their entries stay pending and the next owner claims them.
    pub async fn stop(self) -> Result<(), RuntimeError> {
        self.stop_or_force(std::future::pending()).await
    }

    /// [`stop`](Self::stop), unless `force` completes first: then every member not stopped yet is aborted
    /// at once and reported ([`RuntimeError::ShutdownForced`]).
    async fn stop_or_force(
        self,
        force: impl std::future::Future<Output = ()>,
    ) -> Result<(), RuntimeError> {
        for member in &self.members {
            member.probe.take_aborted();
        }
        let begun = tokio::time::Instant::now();
        let _ = self.shutdown.send(true);
        for follower in self.followers {
            follower.abort();
        }
        let deadline = begun + self.timeout + Duration::from_secs(1);
        let mut force = Forced::new(force);
        let mut stuck = Vec::new();
        for mut member in self.members {
            // The heartbeat loop gives up the leave at the shutdown timeout (and fences the consumer).
            let heartbeat_late = !force
                .finished_by(&mut member.heartbeat_task, deadline)
                .await
                || begun.elapsed() >= self.timeout;
            if heartbeat_late {
                member.span.in_scope(|| {
                    tracing::warn!("the leave did not complete within the shutdown timeout")
                });
                member.heartbeat_task.abort();
            }
            // The heartbeat loop is gone, so the command channel is closed and the consumer winds down.
            let consumer_late = !force.finished_by(&mut member.consumer_task, deadline).await;
            if heartbeat_late || consumer_late {
                let mut handlers = member.probe.take_aborted();
                handlers.extend(member.probe.in_flight());
                let what = Stuck {
                    member_id: &member.member_id,
                    leave: heartbeat_late,
                    consumer: consumer_late,
                    shards: member.status.borrow().owned.clone(),
                    handlers,
                }
                .to_string();
                member
                    .span
                    .in_scope(|| tracing::warn!(stuck = %what, "did not stop in time; aborting"));
                member.consumer_task.abort();
                stuck.push(what);
            }
        }
        if force.forced {
            Err(RuntimeError::ShutdownForced { stuck })
        } else if stuck.is_empty() {
            Ok(())
        } else {
            Err(RuntimeError::ShutdownTimedOut {
                timeout_ms: self.timeout.as_millis() as u64,
                stuck,
            })
        }
    }
}

/// The future that forces a shutdown (a second signal), which stays forced once it has completed.
struct Forced<F> {
    force: std::pin::Pin<Box<F>>,
    forced: bool,
}

impl<F: std::future::Future<Output = ()>> Forced<F> {
    fn new(force: F) -> Self {
        Self {
            force: Box::pin(force),
            forced: false,
        }
    }

    /// Waits for `task` until `deadline` or until the shutdown is forced; whether it finished.
    async fn finished_by(
        &mut self,
        task: &mut JoinHandle<()>,
        deadline: tokio::time::Instant,
    ) -> bool {
        if self.forced {
            return task.is_finished();
        }
        tokio::select! {
            biased;
            _ = task => true,
            () = tokio::time::sleep_until(deadline) => false,
            () = self.force.as_mut() => {
                tracing::warn!("a second stop signal: aborting what is still running");
                self.forced = true;
                false
            }
        }
    }
}

/// A member that did not stop within the shutdown timeout, as [`RunningRuntime::stop`] reports it:
/// `member <id> (<what>; shards [..]; handlers running: <handlers or none>)`.
struct Stuck<'a> {
    member_id: &'a str,
    /// Its leave did not complete.
    leave: bool,
    /// Its consumer did not wind down.
    consumer: bool,
    /// The shards it still owned.
    shards: Vec<u32>,
    /// Its handlers aborted or still running.
    handlers: Vec<InFlight>,
}

impl fmt::Display for Stuck<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match (self.leave, self.consumer) {
            (true, true) => "leave not completed, consumer",
            (true, false) => "leave not completed",
            (false, _) => "consumer",
        };
        write!(
            f,
            "member {} ({what}; shards {:?}; handlers running: ",
            self.member_id, self.shards
        )?;
        if self.handlers.is_empty() {
            f.write_str("none")?;
        }
        for (i, handler) in self.handlers.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{handler}")?;
        }
        f.write_str(")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::member::lifecycle::OwnershipDeadline;
    use crate::runtime::supervise;

    /// A runtime of one member whose heartbeat loop runs `heartbeat` (supervised as `start` does), with
    /// a consumer that runs until shutdown.
    fn one_member(
        heartbeat: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> RunningRuntime {
        let (shutdown, mut shutdown_rx) = watch::channel(false);
        let (exits, exits_rx) = mpsc::unbounded_channel();
        let owner = "member pod-1-m0".to_owned();
        let consumer = async move {
            let _ = shutdown_rx.wait_for(|stop| *stop).await;
        };
        RunningRuntime {
            shutdown,
            members: vec![RunningMember {
                member_id: "pod-1-m0".into(),
                span: tracing::Span::none(),
                probe: crate::health::Probe::default(),
                pause: PauseHandle::new(),
                deadline: OwnershipDeadline::new(),
                status: watch::channel(MemberStatus::default()).1,
                heartbeat_task: tokio::spawn(supervise::supervised(
                    owner.clone(),
                    "heartbeat loop",
                    exits.clone(),
                    heartbeat,
                )),
                consumer_task: tokio::spawn(supervise::supervised(
                    owner, "consumer", exits, consumer,
                )),
            }],
            followers: Vec::new(),
            _wakeups: Vec::new(),
            timeout: Duration::from_millis(200),
            exits: exits_rx,
            client: crate::connection::RedisTarget::open("redis://127.0.0.1:1/").unwrap(),
        }
    }

    /// The ERROR lines `tracing-subscriber` wrote (without colours).
    fn errors(logs: &crate::util::LogBuffer) -> Vec<String> {
        logs.text()
            .lines()
            .filter(|line| line.contains("ERROR"))
            .map(str::to_owned)
            .collect()
    }

    #[tokio::test]
    async fn run_fails_naming_the_member_whose_heartbeat_loop_panicked() {
        let logs = crate::util::LogBuffer::default();
        let writer = logs.clone();
        let _guard = tracing::subscriber::set_default(
            tracing_subscriber::fmt()
                .with_ansi(false)
                .with_writer(move || writer.clone())
                .finish(),
        );
        let running = one_member(async { panic!("boom") });
        let result = tokio::time::timeout(
            Duration::from_secs(10),
            running.run_until(std::future::pending()),
        )
        .await
        .expect("run noticed the dead member instead of running on");
        let error = result.expect_err("a dead member fails run");
        assert!(
            matches!(&error, RuntimeError::TaskStopped { owner, task: "heartbeat loop", reason }
                if owner == "member pod-1-m0"
                    && reason.starts_with("panicked: boom (at stream-listener/src/runtime/running.rs:")),
            "{error:?}"
        );
        assert!(error.to_string().contains("member pod-1-m0"), "{error}");
        let errors = errors(&logs);
        assert!(
            errors.iter().any(|e| e.contains("owner=member pod-1-m0")
                && e.contains("task=\"heartbeat loop\"")
                && e.contains("reason=panicked: boom")),
            "an ERROR names the member and the task: {errors:?}"
        );
    }

    #[tokio::test]
    async fn run_stops_cleanly_on_the_signal_while_every_task_runs() {
        let running = one_member(std::future::pending());
        let done = tokio::time::timeout(Duration::from_secs(10), running.run_until(async {}))
            .await
            .expect("stopped");
        // The heartbeat loop never ends by itself here: the shutdown aborts it and reports it stuck,
        // but no task stopped while running.
        assert!(
            !matches!(done, Err(RuntimeError::TaskStopped { .. })),
            "{done:?}"
        );
    }

    #[tokio::test]
    async fn a_second_signal_aborts_a_stuck_stop_at_once_naming_what_was_stuck() {
        let mut running = one_member(std::future::pending());
        // Without the second signal this stop would wait out a shutdown timeout of ten minutes.
        running.timeout = Duration::from_secs(600);
        let result = tokio::time::timeout(
            Duration::from_secs(10),
            running.run_until_forced(async {}, async {}),
        )
        .await
        .expect("the second signal ended the stop at once");
        let Err(RuntimeError::ShutdownForced { stuck }) = &result else {
            panic!("{result:?}");
        };
        assert_eq!(stuck.len(), 1, "{stuck:?}");
        assert!(
            stuck[0].starts_with("member pod-1-m0 (leave not completed"),
            "{stuck:?}"
        );
        let text = result.unwrap_err().to_string();
        assert!(
            text.starts_with(
                "shutdown forced by a second signal; aborted: member pod-1-m0 (leave not completed"
            ),
            "{text}"
        );
    }

    #[test]
    fn a_stuck_member_names_what_did_not_stop_its_shards_and_its_handlers() {
        let stuck = |leave, consumer, handlers| Stuck {
            member_id: "10.0.0.7-m0",
            leave,
            consumer,
            shards: vec![3],
            handlers,
        };
        let running = InFlight {
            shard: 3,
            id: "1764531000000-0".into(),
            running_for: Duration::from_millis(30950),
            timeout: None,
        };
        assert_eq!(
            stuck(true, true, vec![running.clone()]).to_string(),
            "member 10.0.0.7-m0 (leave not completed, consumer; shards [3]; handlers running: \
             shard 3 entry 1764531000000-0 running for 30950 ms)"
        );
        assert_eq!(
            stuck(true, false, Vec::new()).to_string(),
            "member 10.0.0.7-m0 (leave not completed; shards [3]; handlers running: none)"
        );
        assert_eq!(
            stuck(false, true, vec![running.clone(), running]).to_string(),
            "member 10.0.0.7-m0 (consumer; shards [3]; handlers running: \
             shard 3 entry 1764531000000-0 running for 30950 ms, shard 3 entry 1764531000000-0 running for 30950 ms)"
        );
    }
}
