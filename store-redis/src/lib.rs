//! The Redis backend of mcp-persist. **Not built yet.**
//!
//! This crate will hold `RedisStore`, implementing `KvStore` and `LogStore`
//! over Redis or Redis Cluster: compare-and-swap in Lua, TTL with `PX`, logs
//! as Redis Streams.
