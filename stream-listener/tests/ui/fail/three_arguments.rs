use stream_listener::consumer::Message;
use stream_listener::{stream_listener, State};

#[stream_listener(stream = "orders", group = "billing")]
async fn handler(_msg: Message<u64>, _db: State<u32>, _extra: u32) -> Result<(), String> {
    Ok(())
}

fn main() {}
