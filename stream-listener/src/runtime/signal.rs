//! The stop signal of [`Runtime::run`](super::Runtime::run): SIGTERM (on Unix) or ctrl-c.

/// Completes on SIGTERM or ctrl-c (ctrl-c only where SIGTERM cannot be listened for).
pub(super) async fn wait_for_signal() {
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(error) => {
                // Library code does not panic over a signal handler: stop on ctrl-c only.
                tracing::warn!(%error, "cannot listen for SIGTERM; stopping on ctrl-c only");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
