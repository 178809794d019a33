use stream_listener::consumer::Message;
use stream_listener::stream_listener;

#[stream_listener(stream = "orders", group = "billing", ack = "ack_and_delete")]
async fn handler(_msg: Message<u64>) -> Result<(), String> {
    Ok(())
}

fn main() {}
