use stream_listener::stream_listener;

#[stream_listener(stream = "orders", group = "billing")]
async fn handler() -> Result<(), String> {
    Ok(())
}

fn main() {}
