//! Publishes keyed orders: every key's orders land on one shard, in order.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 cargo run -p stream-listener-examples --bin producer
//! ```

use serde::Serialize;
use stream_listener::Producer;

#[derive(Debug, Serialize)]
struct Order {
    id: u64,
    amount_cents: u64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    // Creates the topology record and the 16 shard streams once; later calls find it unchanged.
    let producer = Producer::connect_creating(&url, "orders", 16).await?;

    for id in 1..=50 {
        let key = format!("customer-{}", id % 5);
        let order = Order {
            id,
            amount_cents: 100 * id,
        };
        let receipt = producer.send(&key, &order).await?;
        println!("{key} order {id} -> {} {}", receipt.stream, receipt.id);
    }
    Ok(())
}
