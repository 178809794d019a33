//! Publishes keyed orders: every key's orders land on one shard, in order.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 cargo run -p stream-listener-examples --bin producer
//! ```

use serde::Serialize;
use stream_listener::Producer;

#[derive(Debug, Serialize)]
struct Order {
    key: String,
    seq: u64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    // Creates the topology record and the 16 shard streams once; later calls find it unchanged.
    let producer = Producer::connect_creating(&url, "orders", 16).await?;

    for seq in 0..10 {
        for customer in 0..5 {
            let key = format!("customer-{customer}");
            let receipt = producer
                .send(
                    &key,
                    &Order {
                        key: key.clone(),
                        seq,
                    },
                )
                .await?;
            println!("{key} seq {seq} -> {} {}", receipt.stream, receipt.id);
        }
    }
    Ok(())
}
