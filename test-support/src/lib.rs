//! Real `redis-server` processes for tests, benchmarks and the demo.
