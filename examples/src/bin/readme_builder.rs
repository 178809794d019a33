use serde::Deserialize;
use stream_listener::{ConsumerBuilder, Message, Runtime};

#[derive(Debug, Deserialize)]
struct Order {
    id: u64,
    amount_cents: u64,
}

#[tokio::main]
async fn main() -> Result<(), stream_listener::RuntimeError> {
    // One member of group `billing` with four local workers: it handles up to four of its shards at
    // once (never one shard twice at once, so per-key order holds).
    let billing = ConsumerBuilder::new("orders", "billing")
        .runtime_max_concurrency(4)
        .handler(|msg: Message<Order>| async move {
            println!(
                "order {} ({} cents) from shard {}",
                msg.payload.id, msg.payload.amount_cents, msg.shard
            );
            Ok::<(), std::convert::Infallible>(())
        });
    // REDIS_URL as above; only this builder's member, none of the binary's #[stream_listener]s.
    Runtime::from_env()
        .without_annotated_listeners()
        .consumer(billing)
        .run()
        .await
}
