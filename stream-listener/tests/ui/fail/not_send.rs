use std::rc::Rc;

use stream_listener::consumer::Message;
use stream_listener::stream_listener;

async fn audit() {}

#[stream_listener(stream = "orders", group = "billing")]
async fn handler(msg: Message<u64>) -> Result<(), String> {
    let seen = Rc::new(msg.payload);
    audit().await;
    drop(seen);
    Ok(())
}

fn main() {}
