use std::fmt;

use stream_listener::consumer::Message;
use stream_listener::stream_listener;

#[derive(Debug)]
pub enum BillingError {
    Declined(String),
}

impl fmt::Display for BillingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Declined(why) => write!(f, "card declined: {why}"),
        }
    }
}

mod billing {
    use super::*;

    #[stream_listener(stream = "payments", group = "billing")]
    pub(crate) async fn charge(msg: Message<String>) -> Result<(), BillingError> {
        tokio_free_sleep().await;
        Err(BillingError::Declined(msg.payload))
    }

    async fn tokio_free_sleep() {}
}

fn main() {
    let _ = billing::charge;
}
