use stream_listener::consumer::Message;
use stream_listener::stream_listener;

#[derive(Debug)]
struct Opaque;

#[stream_listener(stream = "orders", group = "billing")]
async fn handler(_msg: Message<u64>) -> Result<(), Opaque> {
    Ok(())
}

fn main() {}
