use serde::Serialize;

#[derive(Debug, Serialize)]
struct Order {
    id: u64,
    amount_cents: u64,
}

#[tokio::main]
async fn main() -> Result<(), stream_listener::ProducerError> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    // Creates the stream with 16 shards unless it exists; `Producer::connect` only opens an existing one.
    let producer = stream_listener::Producer::connect_creating(&url, "orders", 16).await?;
    for id in 1..=10 {
        // The key picks the shard: the orders of one customer are handled in the order sent.
        let customer = format!("customer-{}", id % 3);
        let order = Order {
            id,
            amount_cents: 995,
        };
        producer.send(&customer, &order).await?;
    }
    println!("sent 10 orders");
    Ok(())
}
