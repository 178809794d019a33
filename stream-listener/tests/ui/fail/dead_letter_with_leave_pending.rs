use stream_listener::consumer::Message;
use stream_listener::stream_listener;

#[stream_listener(
    stream = "orders",
    group = "billing",
    failure = "leave_pending",
    dead_letter = "orders:dlq"
)]
async fn handler(_msg: Message<u64>) -> Result<(), String> {
    Ok(())
}

fn main() {}
