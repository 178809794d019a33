use stream_listener::consumer::Message;
use stream_listener::stream_listener;

// The first wait above the bound of every wait: reported on the first wait's literal.
#[stream_listener(
    stream = "orders",
    group = "billing",
    initial_backoff_ms = 5000,
    max_backoff_ms = 100
)]
async fn handler(_msg: Message<u64>) -> Result<(), String> {
    Ok(())
}

fn main() {}
