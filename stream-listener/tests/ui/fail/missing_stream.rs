use stream_listener::consumer::Message;
use stream_listener::stream_listener;

#[stream_listener(group = "billing")]
async fn handler(_msg: Message<u64>) -> Result<(), String> {
    Ok(())
}

fn main() {}
