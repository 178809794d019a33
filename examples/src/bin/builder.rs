//! The same consumer registered explicitly with a [`ConsumerBuilder`] instead of the attribute.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 cargo run -p stream-listener-examples --bin builder
//! ```
//!
//! Logs go to stderr at INFO (the runtime's default subscriber; `RUST_LOG` changes the filter).

use serde::Deserialize;
use stream_listener::{ConsumerBuilder, Message, Runtime};

#[derive(Debug, Deserialize)]
struct Order {
    id: u64,
    amount_cents: u64,
}

#[tokio::main]
async fn main() -> Result<(), stream_listener::RuntimeError> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());

    // One member of group `billing`, with four local workers: it handles up to four shards at a time,
    // however many it owns. (Ordering per key is kept: one shard is never handled by two workers at once.)
    let billing = ConsumerBuilder::new("orders", "billing")
        .runtime_max_concurrency(4)
        .handler(|msg: Message<Order>| async move {
            println!(
                "shard {:>2} key {} order {} ({} cents)",
                msg.shard, msg.key, msg.payload.id, msg.payload.amount_cents
            );
            Ok::<(), std::convert::Infallible>(())
        });

    let running = Runtime::new(url)
        .without_annotated_listeners()
        .consumer(billing)
        .start()
        .await?;
    println!("started members {:?}", running.listener_ids());

    // `Runtime::run()` would do this for us: wait for ctrl-c, then leave the group gracefully.
    let _ = tokio::signal::ctrl_c().await;
    for (member, status) in running.statuses() {
        println!("{member}: {status:?}");
    }
    // A member that could not leave within the shutdown timeout is an error naming it.
    running.stop().await?;
    Ok(())
}
