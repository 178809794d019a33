use stream_listener::consumer::Message;
use stream_listener::stream_listener;

// Every problem of one invocation is reported at once, arguments and signature alike.
#[stream_listener(
    stream = "",
    concurrency = 0,
    ack = "nack",
    colour = "blue",
    batch_size = "10"
)]
fn handler(_msg: Message<u64>, _extra: u32) {}

fn main() {}
