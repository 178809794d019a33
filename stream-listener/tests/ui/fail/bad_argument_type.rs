use stream_listener::stream_listener;

#[stream_listener(stream = "orders", group = "billing")]
async fn handler(_payload: String) -> Result<(), String> {
    Ok(())
}

fn main() {}
