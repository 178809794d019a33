use serde::Deserialize;
use stream_listener::consumer::Message;
use stream_listener::stream_listener;

#[derive(Debug, Deserialize)]
pub struct Order {
    pub id: u64,
}

#[stream_listener(stream = "orders", group = "billing", concurrency = 4)]
async fn on_order(msg: Message<Order>) -> Result<(), String> {
    if msg.payload.id == 0 {
        return Err(format!("order {} has no id", msg.id));
    }
    Ok(())
}

fn main() {
    // Still callable as written.
    let _future = on_order;
}
