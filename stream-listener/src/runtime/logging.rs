//! Logging by default: a runtime started by an application that set up no `tracing` subscriber installs
//! one, so starts, joins, assignments, dead letters, timeouts and self-fences show on the terminal
//! instead of vanishing. An application with its own subscriber (or [`Runtime::without_default_logging`])
//! keeps full control: nothing is installed then.
//!
//! [`Runtime::without_default_logging`]: super::Runtime::without_default_logging

use std::io::IsTerminal;

use tracing::subscriber::NoSubscriber;

/// The filter when `RUST_LOG` is unset or does not parse.
pub(crate) const DEFAULT_FILTER: &str = "info";

/// Whether to install the default subscriber: asked to, no global subscriber set, and none in scope on
/// this thread either (a test's `set_default` counts as the application's).
fn wanted(enabled: bool, global_set: bool, in_scope: bool) -> bool {
    enabled && !global_set && !in_scope
}

/// Installs a `tracing_subscriber` fmt subscriber on stderr, filtered by `RUST_LOG` (default
/// [`DEFAULT_FILTER`]), as the global default, if [`wanted`]. Returns whether it did.
pub(crate) fn install_default(enabled: bool) -> bool {
    let in_scope = tracing::dispatcher::get_default(|d| !d.is::<NoSubscriber>());
    if !wanted(enabled, tracing::dispatcher::has_been_set(), in_scope) {
        return false;
    }
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_FILTER));
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .finish();
    // Another thread may have won the race: then the application's subscriber stays.
    tracing::subscriber::set_global_default(subscriber).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn installs_only_when_asked_and_nobody_else_did() {
        assert!(wanted(true, false, false));
        assert!(!wanted(false, false, false), "opted out");
        assert!(
            !wanted(true, true, false),
            "the application's global subscriber"
        );
        assert!(
            !wanted(true, false, true),
            "a subscriber in scope on this thread"
        );
    }

    #[test]
    fn a_subscriber_in_scope_is_kept() {
        let _guard = tracing::subscriber::set_default(tracing_subscriber::registry());
        assert!(!install_default(true));
    }
}
