//! Quickstart: one annotated listener, run until SIGTERM or ctrl-c. Logs go to stderr at INFO (the
//! runtime installs a subscriber when the application has none; `RUST_LOG` changes the filter).
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 cargo run -p stream-listener-examples --bin quickstart
//! ```

use serde::Deserialize;
use stream_listener::{stream_listener, Message};

/// The payload, decoded from the JSON the producer wrote.
#[derive(Debug, Deserialize)]
struct Order {
    id: u64,
    amount_cents: u64,
}

/// `concurrency = 2` starts two logical members of group `billing` in this process (`{base}-m0`,
/// `{base}-m1`); the group spreads the shards of `orders` over every member of every process.
/// Messages of one key always arrive in order, one at a time.
/// `shard_count = 16`: the stream's shards if this listener creates it (an existing stream keeps its own).
#[stream_listener(
    stream = "orders",
    group = "billing",
    concurrency = 2,
    shard_count = 16
)]
async fn on_order(msg: Message<Order>) -> Result<(), std::convert::Infallible> {
    println!(
        "shard {:>2} entry {} key {} order {} ({} cents, delivery {})",
        msg.shard, msg.id, msg.key, msg.payload.id, msg.payload.amount_cents, msg.delivery_count
    );
    // Returning Ok acknowledges the entry; an Err is retried and finally dead-lettered.
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), stream_listener::RuntimeError> {
    // Every #[stream_listener] of this binary; Redis from REDIS_URL; member id from STREAM_LISTENER_MEMBER_ID.
    stream_listener::Runtime::from_env().run().await
}
