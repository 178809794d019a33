use stream_listener::consumer::{Message, RawMessage};
use stream_listener::stream_listener;

#[stream_listener(stream = "blobs", group = "sizes")]
async fn on_blob(msg: RawMessage) -> Result<(), std::io::Error> {
    let _bytes: Vec<u8> = msg.into_payload();
    Ok(())
}

// `Message<Vec<u8>>` spelled out is raw too.
#[stream_listener(stream = "blobs", group = "copies")]
pub async fn on_blob_spelled_out(msg: Message<Vec<u8>>) -> std::io::Result<()> {
    let _bytes: Vec<u8> = msg.payload;
    Ok(())
}

fn main() {}
