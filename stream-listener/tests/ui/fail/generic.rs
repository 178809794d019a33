use stream_listener::consumer::Message;
use stream_listener::stream_listener;

#[stream_listener(stream = "orders", group = "billing")]
async fn handler<T: Send>(_msg: Message<T>) -> Result<(), String> {
    Ok(())
}

fn main() {}
