//! rmcp integration for mcp-persist. **Not built yet.**
//!
//! This crate will hold: a decorator over rmcp's `StreamableHttpClient` that
//! resumes a legacy session after a restart without a new `initialize`,
//! continues request numbering and journals in-flight requests; rmcp
//! `CredentialStore`/`StateStore` implementations keyed by issuer and
//! resource; and rmcp `SessionStore`/`EventStore` implementations with a
//! session-to-principal binding layer, all over `mcp-persist-core`'s typed
//! stores. Until then it exports nothing.
