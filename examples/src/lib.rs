//! Runnable examples live in `src/bin`.
