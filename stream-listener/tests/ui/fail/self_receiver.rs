use stream_listener::consumer::Message;
use stream_listener::stream_listener;

struct Billing;

impl Billing {
    #[stream_listener(stream = "orders", group = "billing")]
    async fn handler(&self, _msg: Message<u64>) -> Result<(), String> {
        Ok(())
    }
}

fn main() {}
