//! The `#[stream_listener]` attribute (filled in by the developer-surface work).
