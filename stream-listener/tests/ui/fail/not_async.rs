use stream_listener::consumer::Message;
use stream_listener::stream_listener;

#[stream_listener(stream = "orders", group = "billing")]
fn handler(_msg: Message<u64>) -> Result<(), String> {
    Ok(())
}

fn main() {
    // The function is still emitted on error, so uses of it do not add noise.
    let _ = handler;
}
