use stream_listener::consumer::Message;
use stream_listener::stream_listener;

#[stream_listener(stream = "orders", group = "billing", start_from = "middle", shard_count = 0)]
async fn handler(_msg: Message<u64>) -> Result<(), String> {
    Ok(())
}

fn main() {}
