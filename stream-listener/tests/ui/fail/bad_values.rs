use stream_listener::consumer::Message;
use stream_listener::stream_listener;

// Values of the wrong kind or out of range, each reported on its literal.
#[stream_listener(
    stream = orders,
    group = "billing",
    id = "billing host",
    weight = -1,
    block_ms = "5",
    failure = "retry",
    dead_letter = ""
)]
async fn handler(_msg: Message<u64>) -> Result<(), String> {
    Ok(())
}

fn main() {}
