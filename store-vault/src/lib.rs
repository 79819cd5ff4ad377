//! The AWS Secrets Manager backend of mcp-persist. **Not built yet.**
//!
//! This crate will hold `SecretsManagerStore`, implementing `KvStore` (and
//! deliberately no `LogStore`) over AWS Secrets Manager, for credentials.
