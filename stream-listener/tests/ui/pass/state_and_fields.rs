use std::sync::Arc;

use stream_listener::{stream_listener, Fields, Message, State};

#[derive(Clone)]
struct Db {
    name: Arc<str>,
}

#[stream_listener(stream = "orders", group = "stateful", start_from = "latest", shard_count = 8)]
async fn stateful(msg: Message<u64>, State(db): State<Db>) -> Result<(), String> {
    let _ = (msg.payload, db.name);
    Ok(())
}

#[stream_listener(stream = "orders", group = "foreign")]
async fn foreign(msg: Message<Fields>) -> Result<(), stream_listener::FieldError> {
    let _amount: u64 = msg.payload.get("amount")?;
    Ok(())
}

#[stream_listener(stream = "orders", group = "foreign-state")]
async fn foreign_with_state(
    msg: Message<Fields>,
    state: stream_listener::State<Arc<String>>,
) -> Result<(), String> {
    let _ = (msg.payload.len(), state.0);
    Ok(())
}

fn main() {
    let _ = (stateful, foreign, foreign_with_state);
}
