//! Catching panics: the one place that turns a panic in a call ([`catch`]) or while polling a future
//! ([`catch_panic`]) into an error, and the text of a panic payload. Handlers, lifecycle hooks and the
//! runtime's supervised tasks all go through here.
//!
//! A caught panic is the caller's to report (a handler attempt's WARN, a hook's ERROR), once, with its
//! message and location. So while a catcher runs, the process's panic hook stays quiet: the first catch
//! wraps the hook in place (the default one, or the application's) in one that only records where a
//! caught panic happened; panics outside a catcher go to the wrapped hook as before. Without this, a
//! poison message printed the default hook's lines (and with `RUST_BACKTRACE=1` a whole backtrace) on
//! every attempt.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

thread_local! {
    /// Catchers running on this thread: a panic while any runs is caught and reported by it.
    static CATCHING: Cell<u32> = const { Cell::new(0) };
    /// Where this thread's last caught panic happened (`file:line:column`), taken by [`catch`].
    static LOCATION: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Wraps the panic hook in place, once (see the module docs).
fn quiet_hook() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    if std::thread::panicking() {
        return; // the hook cannot be changed while this thread unwinds; the next catch does it
    }
    INSTALLED.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if CATCHING.get() > 0 {
                let at = info.location().map(ToString::to_string);
                LOCATION.set(at);
            } else {
                previous(info);
            }
        }));
    });
}

/// Calls `f`, turning a panic into `Err("<message> (at <file:line:column>)")`, with the panic hook
/// quiet meanwhile.
pub(crate) fn catch<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    quiet_hook();
    CATCHING.set(CATCHING.get() + 1);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    CATCHING.set(CATCHING.get() - 1);
    result.map_err(|panic| {
        let message = panic_message(&*panic);
        match LOCATION.take() {
            Some(at) => format!("{message} (at {at})"),
            None => message,
        }
    })
}

/// Runs `future`, turning a panic while polling it into `Err(message)` ([`catch`]) instead of unwinding
/// through the task that polls it. Box a future that is not `Unpin` first (`Box::pin`).
pub(crate) fn catch_panic<F: Future + Unpin>(future: F) -> CatchPanic<F> {
    CatchPanic(future)
}

/// The future of [`catch_panic`].
pub(crate) struct CatchPanic<F>(F);

impl<F: Future + Unpin> Future for CatchPanic<F> {
    type Output = Result<F::Output, String>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let future = Pin::new(&mut self.0);
        match catch(|| future.poll(cx)) {
            Ok(poll) => poll.map(Ok),
            Err(message) => Poll::Ready(Err(message)),
        }
    }
}

/// The text of a panic payload.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panic_while_polling_is_its_message_and_location() {
        let line = line!() + 1;
        let caught = catch_panic(Box::pin(async { panic!("boom {}", 7) })).await;
        let at = format!("boom 7 (at stream-listener/src/panic.rs:{line}:");
        assert!(caught.as_ref().unwrap_err().starts_with(&at), "{caught:?}");
        let caught = catch_panic(Box::pin(async { std::panic::panic_any(7u8) })).await;
        let text = caught.unwrap_err();
        assert!(text.starts_with("non-string panic payload (at "), "{text}");
        assert_eq!(catch_panic(Box::pin(async { 3 })).await, Ok(3));
        assert_eq!(catch(|| 4), Ok(4));
    }

    /// Run in a child process (the hook is process-wide): with `RUST_BACKTRACE=1`, a caught panic
    /// prints nothing, and a panic outside every catcher still reaches the hook it wrapped.
    #[test]
    fn caught_panics_leave_the_hook_quiet_and_others_do_not() {
        const CHILD: &str = "SL_PANIC_HOOK_CHILD";
        if std::env::var_os(CHILD).is_some() {
            for attempt in 0..3 {
                assert!(catch(|| panic!("caught poison {attempt}")).is_err());
            }
            let uncaught = std::thread::spawn(|| panic!("uncaught elsewhere")).join();
            assert!(uncaught.is_err());
            return;
        }
        let output = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "panic::tests::caught_panics_leave_the_hook_quiet_and_others_do_not",
            ])
            .args(["--nocapture", "--test-threads=1"])
            .env(CHILD, "1")
            .env("RUST_BACKTRACE", "1")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{stderr}");
        assert!(!stderr.contains("caught poison"), "{stderr}");
        assert!(stderr.contains("uncaught elsewhere"), "{stderr}");
        assert_eq!(stderr.matches("stack backtrace").count(), 1, "{stderr}");
    }
}
