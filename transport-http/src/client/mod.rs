//! Durable rmcp Streamable HTTP client.
