//! A consumer that serves its metrics for Prometheus at `/metrics`.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 METRICS_ADDR=127.0.0.1:9464 cargo run -p stream-listener-examples --bin metrics
//! curl -s http://127.0.0.1:9464/metrics | grep stream_listener_
//! ```

use serde::Deserialize;
use stream_listener::{ConsumerBuilder, Message, Runtime};

#[derive(Debug, Deserialize)]
struct Order {
    id: u64,
    amount_cents: u64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::var("METRICS_ADDR").unwrap_or_else(|_| "127.0.0.1:9464".into());
    stream_listener::metrics::install_prometheus(addr.parse()?)?;
    println!("metrics at http://{addr}/metrics");

    let billing = ConsumerBuilder::new("orders", "billing")
        .runtime_max_concurrency(4)
        .handler_timeout(std::time::Duration::from_secs(5))
        .handler(|msg: Message<Order>| async move {
            let _ = (msg.payload.id, msg.payload.amount_cents);
            Ok::<(), std::convert::Infallible>(())
        });
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    // Until SIGTERM or ctrl-c; a shutdown that misses its deadline exits non-zero.
    Runtime::new(url)
        .without_annotated_listeners()
        .consumer(billing)
        .run()
        .await?;
    Ok(())
}
