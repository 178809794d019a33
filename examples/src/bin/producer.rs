//! Publishes keyed orders: every key's orders land on one shard, in order.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 cargo run -p stream-listener-examples --bin producer
//! ```

use serde::Serialize;
use stream_listener::topology::Topology;
use stream_listener::Producer;

#[derive(Debug, Serialize)]
struct Order {
    key: String,
    seq: u64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let mut conn = redis::Client::open(url)?.get_connection_manager().await?;

    // Creates the topology record and the 16 shard streams once; later calls return it unchanged.
    Topology::ensure(&mut conn, "orders", 16).await?;
    let producer = Producer::new(conn, "orders").await?;

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
