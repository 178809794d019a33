// `ack = "ack_delete"` still compiles (as `ack_delete_keepref`), with a deprecation warning at the value;
// denied here so the warning shows in the expected output.
#![deny(deprecated)]

use stream_listener::consumer::Message;
use stream_listener::stream_listener;

#[stream_listener(stream = "orders", group = "billing", ack = "ack_delete")]
async fn handler(_msg: Message<u64>) -> Result<(), String> {
    Ok(())
}

fn main() {}
