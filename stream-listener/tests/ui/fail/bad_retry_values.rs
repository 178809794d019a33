use stream_listener::consumer::Message;
use stream_listener::stream_listener;

// Retry settings of the wrong kind, each reported on its value.
#[stream_listener(
    stream = "orders",
    group = "billing",
    jitter = "yes",
    initial_backoff_ms = "100",
    max_backoff_ms = -5
)]
async fn handler(_msg: Message<u64>) -> Result<(), String> {
    Ok(())
}

fn main() {}
