//! The user's lifecycle hooks: told when the member starts owning shards, when revoked shards are drained,
//! and when the member was fenced.
//!
//! Hooks are async closures (`|shards: Vec<u32>| async move { .. }`): a user who flushes a cache or commits
//! a sink's offsets on revocation needs to await. They run one at a time, in the order the events
//! happened, on a task of their own, so a slow hook never stalls reads of other shards. A revoked shard's
//! REVOKED report waits for its hook (the coordinator hands the shard on only after the hook returned), so
//! a hook that never returns holds the shard until the member's lease or shutdown ends it. A hook that
//! panics is caught and logged; the member goes on.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::panic::{catch, catch_panic};
use crate::util::BoxFuture;

type ShardsHook = Arc<dyn Fn(Vec<u32>) -> BoxFuture<'static, ()> + Send + Sync>;

/// Lifecycle callbacks of one listener. Set them with
/// [`ConsumerBuilder::on_shards_assigned`](crate::ConsumerBuilder::on_shards_assigned) and its siblings,
/// or, for an annotated listener, build them here and give them to [`Runtime::hooks`](crate::Runtime::hooks).
///
/// Hooks are async closures, run one at a time in the order of the events on a task of their own (a slow
/// hook never stalls reads). A revoked shard's REVOKED report waits for its hook, so the next owner starts
/// only after it returned; a hook that never returns holds the shard until the lease or shutdown ends it.
/// A panicking hook is caught and logged; the member goes on.
#[derive(Clone, Default)]
pub struct LifecycleHooks {
    assigned: Option<ShardsHook>,
    revoked: Option<ShardsHook>,
    fenced: Option<ShardsHook>,
}

impl std::fmt::Debug for LifecycleHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LifecycleHooks")
            .field("assigned", &self.assigned.is_some())
            .field("revoked", &self.revoked.is_some())
            .field("fenced", &self.fenced.is_some())
            .finish()
    }
}

fn boxed<F, Fut>(hook: F) -> ShardsHook
where
    F: Fn(Vec<u32>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    Arc::new(move |shards| Box::pin(hook(shards)))
}

impl LifecycleHooks {
    /// Called with the shards the member has just started owning (their reads may already run).
    pub fn on_shards_assigned<F, Fut>(mut self, hook: F) -> Self
    where
        F: Fn(Vec<u32>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.assigned = Some(boxed(hook));
        self
    }

    /// Called with revoked shards once their running handlers finished and their entries were
    /// acknowledged, before REVOKED is reported for them. Shards revoked together but drained at
    /// different moments (one had a handler running) come in separate calls, each shard once.
    pub fn on_shards_revoked<F, Fut>(mut self, hook: F) -> Self
    where
        F: Fn(Vec<u32>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.revoked = Some(boxed(hook));
        self
    }

    /// Called with the shards the member lost at once because it was fenced (or its lease ran out):
    /// nothing of them was acknowledged after the fence, and their handlers were aborted.
    pub fn on_fenced<F, Fut>(mut self, hook: F) -> Self
    where
        F: Fn(Vec<u32>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.fenced = Some(boxed(hook));
        self
    }

    /// Whether no hook is set.
    pub fn is_empty(&self) -> bool {
        self.assigned.is_none() && self.revoked.is_none() && self.fenced.is_none()
    }

    pub(crate) fn has_revoked(&self) -> bool {
        self.revoked.is_some()
    }
}

/// One event for the hook task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HookCall {
    Assigned(Vec<u32>),
    /// Answered on the runner's `done` channel with `(fence_generation, shards)` once the hook returned.
    Revoked(u64, Vec<u32>),
    Fenced(Vec<u32>),
}

/// Starts the task that runs the hooks in order. Revoked shards come back on `done` after their hook.
pub(crate) fn spawn_runner(
    hooks: LifecycleHooks,
    done: mpsc::UnboundedSender<(u64, Vec<u32>)>,
) -> mpsc::UnboundedSender<HookCall> {
    let (calls, mut rx) = mpsc::unbounded_channel::<HookCall>();
    // In the member's span: the hooks' own lines (and a panic's) say which member they are about.
    tokio::spawn(tracing::Instrument::in_current_span(async move {
        while let Some(call) = rx.recv().await {
            match call {
                HookCall::Assigned(shards) => {
                    call_hook("on_shards_assigned", &hooks.assigned, shards).await
                }
                HookCall::Revoked(generation, shards) => {
                    call_hook("on_shards_revoked", &hooks.revoked, shards.clone()).await;
                    let _ = done.send((generation, shards));
                }
                HookCall::Fenced(shards) => call_hook("on_fenced", &hooks.fenced, shards).await,
            }
        }
    }));
    calls
}

/// Runs one hook, catching a panic in the call or in the future.
async fn call_hook(name: &str, hook: &Option<ShardsHook>, shards: Vec<u32>) {
    let Some(hook) = hook else {
        return;
    };
    let panicked = match catch(|| hook(shards)) {
        Ok(future) => catch_panic(future).await.err(),
        Err(message) => Some(message),
    };
    if let Some(message) = panicked {
        tracing::error!(hook = name, panic = %message, "lifecycle hook panicked; the member goes on");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::*;

    type Log = Arc<Mutex<Vec<String>>>;

    fn hooks(log: &Log) -> LifecycleHooks {
        let (a, r, f) = (log.clone(), log.clone(), log.clone());
        LifecycleHooks::default()
            .on_shards_assigned(move |shards| {
                let log = a.clone();
                async move {
                    if shards == [13] {
                        panic!("unlucky shard");
                    }
                    log.lock().unwrap().push(format!("assigned {shards:?}"));
                }
            })
            .on_shards_revoked(move |shards| {
                let log = r.clone();
                async move {
                    // Slow: later calls still wait for it.
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    log.lock().unwrap().push(format!("revoked {shards:?}"));
                }
            })
            .on_fenced(move |shards| {
                let log = f.clone();
                // Panics in the call itself, not in the future.
                assert!(!shards.is_empty(), "fenced with nothing");
                async move { log.lock().unwrap().push(format!("fenced {shards:?}")) }
            })
    }

    #[tokio::test]
    async fn hooks_run_in_order_and_a_panicking_hook_is_caught() {
        let log = Log::default();
        let (done_tx, mut done) = mpsc::unbounded_channel();
        let calls = spawn_runner(hooks(&log), done_tx);
        calls.send(HookCall::Assigned(vec![1, 2])).unwrap();
        calls.send(HookCall::Assigned(vec![13])).unwrap();
        calls.send(HookCall::Revoked(4, vec![2])).unwrap();
        calls.send(HookCall::Fenced(Vec::new())).unwrap();
        calls.send(HookCall::Assigned(vec![3])).unwrap();
        calls.send(HookCall::Fenced(vec![1, 3])).unwrap();
        let answered = tokio::time::timeout(Duration::from_secs(5), done.recv())
            .await
            .unwrap();
        assert_eq!(answered, Some((4, vec![2])));
        // The REVOKED answer came after the (slow) hook returned: had it come first, the hook would still
        // be sleeping.
        assert!(
            log.lock().unwrap().iter().any(|e| e == "revoked [2]"),
            "{log:?}"
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while log.lock().unwrap().len() < 4 {
            assert!(tokio::time::Instant::now() < deadline, "{log:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(
            *log.lock().unwrap(),
            [
                "assigned [1, 2]",
                "revoked [2]",
                "assigned [3]",
                "fenced [1, 3]"
            ]
        );
    }

    #[test]
    fn an_empty_set_of_hooks_says_so() {
        assert!(LifecycleHooks::default().is_empty());
        assert!(!LifecycleHooks::default().on_fenced(|_| async {}).is_empty());
        assert!(LifecycleHooks::default()
            .on_shards_revoked(|_| async {})
            .has_revoked());
    }
}
