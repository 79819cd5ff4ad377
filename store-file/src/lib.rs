//! A crash-safe directory backend for mcp-persist. **Not built yet.**
//!
//! This crate will hold `FileStore`, implementing `KvStore` and `LogStore`
//! over one directory: atomic record files (temp file, fsync, rename, fsync
//! of the directory), cross-process compare-and-swap through a lock file,
//! and checksummed log segments whose torn tail is cut on open.
