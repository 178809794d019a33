use stream_listener::consumer::Message;
use stream_listener::stream_listener;

#[stream_listener(stream = "orders", group = "billing", topic = "orders")]
async fn handler(_msg: Message<u64>) -> Result<(), String> {
    Ok(())
}

fn main() {}
