//! The member side: what one logical member believes it owns, and the contract with the consumption layer.

pub mod heartbeat;
pub mod identity;
pub mod lifecycle;
pub mod session;
