use serde::Deserialize;
use stream_listener::{stream_listener, Message};

#[derive(Debug, Deserialize)]
struct Order {
    id: u64,
    amount_cents: u64,
}

// Four logical members in this process, each with its own heartbeat, epoch and shards. The stream is
// created with 16 shards if nobody created it yet (an existing stream keeps its count).
#[stream_listener(
    stream = "orders",
    group = "billing",
    concurrency = 4,
    shard_count = 16
)]
async fn on_order(msg: Message<Order>) -> Result<(), String> {
    // msg.token is (memberId, memberEpoch): guard your own writes against a zombie owner.
    println!(
        "order {} ({} cents) from shard {} by {:?}",
        msg.payload.id, msg.payload.amount_cents, msg.shard, msg.token
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), stream_listener::RuntimeError> {
    // Every #[stream_listener] of the binary; REDIS_URL (default redis://127.0.0.1:6379); until
    // SIGTERM/ctrl-c, then a graceful leave. Logs go to stderr at INFO (RUST_LOG=debug for more).
    stream_listener::Runtime::from_env().run().await
}
