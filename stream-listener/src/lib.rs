//! stream-listener: Kafka-style consumer groups for sharded Redis Streams.

pub mod consumer;
pub mod coordinator;
pub mod member;
pub mod producer;
pub mod routing;
pub mod topology;
