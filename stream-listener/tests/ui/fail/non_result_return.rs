use stream_listener::consumer::Message;
use stream_listener::stream_listener;

#[stream_listener(stream = "orders", group = "billing")]
async fn handler(_msg: Message<u64>) -> bool {
    true
}

fn main() {}
