use stream_listener::consumer::Message;
use stream_listener::stream_listener;

#[stream_listener(
    stream = "orders",
    group = "audit",
    concurrency = 2,
    id = "audit-host.1",
    batch_size = 50,
    block_ms = 0,
    ack = "ack_delete_acked",
    failure = "retry_then_dead_letter",
    max_deliveries = 7,
    initial_backoff_ms = 0,
    max_backoff_ms = 60000,
    jitter = true,
    dead_letter = "{orders}:audit-dlq",
    weight = 3, // a trailing comma is accepted
)]
async fn audit(msg: Message<serde_json::Value>) -> Result<(), String> {
    let _ = msg.payload;
    Ok(())
}

#[stream_listener(
    stream = "orders",
    group = "manual",
    ack = "manual",
    failure = "leave_pending"
)]
async fn manual(msg: Message<u64>) -> Result<(), stream_listener::consumer::AckError> {
    msg.ack().await
}

#[stream_listener(stream = "orders", group = "deleting", ack = "ack_delete_keepref")]
async fn deleting(_: Message<u64>) -> Result<(), String> {
    Ok(())
}

fn main() {
    let _ = (audit, manual, deleting);
}
