//! The SQLite backend of mcp-persist. **Not built yet.**
//!
//! This crate will hold `SqliteStore`, implementing `KvStore` and `LogStore`
//! over one SQLite database in WAL mode, with group commit for log appends.
