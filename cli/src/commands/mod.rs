//! One module per command; each command is one small function that returns the text to print.

pub mod admin;
pub mod audit;
pub mod dead_letters;
pub mod exporter;
pub mod groups;
pub mod reshard;
pub mod route;
pub mod seek;
pub mod shards;
pub mod status;
pub mod watch;
