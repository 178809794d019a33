//! Catching panics: the one future adapter that turns a panic while polling into an error, and the text
//! of a panic payload. Handlers, lifecycle hooks and the runtime's supervised tasks all go through here.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Runs `future`, turning a panic while polling it into `Err(message)` instead of unwinding through the
/// task that polls it. Box a future that is not `Unpin` first (`Box::pin`).
pub(crate) fn catch_panic<F: Future + Unpin>(future: F) -> CatchPanic<F> {
    CatchPanic(future)
}

/// The future of [`catch_panic`].
pub(crate) struct CatchPanic<F>(F);

impl<F: Future + Unpin> Future for CatchPanic<F> {
    type Output = Result<F::Output, String>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let future = Pin::new(&mut self.0);
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| future.poll(cx))) {
            Ok(poll) => poll.map(Ok),
            Err(panic) => Poll::Ready(Err(panic_message(&*panic))),
        }
    }
}

/// The text of a panic payload.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
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
    async fn a_panic_while_polling_is_its_message() {
        let caught = catch_panic(Box::pin(async { panic!("boom {}", 7) })).await;
        assert_eq!(caught, Err::<(), _>("boom 7".to_owned()));
        let caught = catch_panic(Box::pin(async { std::panic::panic_any(7u8) })).await;
        assert_eq!(caught, Err::<(), _>("non-string panic payload".to_owned()));
        assert_eq!(catch_panic(Box::pin(async { 3 })).await, Ok(3));
    }
}
