//! Redis for the tests: not started yet (the Redis backend is not built).

/// Running Redis servers, stopped on drop.
pub(crate) struct RedisServices;

impl RedisServices {
    /// The environment variables that tell tests where the servers are.
    pub(crate) fn env(&self) -> Vec<(String, String)> {
        Vec::new()
    }
}

/// Starts the Redis servers the tests need.
pub(crate) fn start() -> anyhow::Result<RedisServices> {
    Ok(RedisServices)
}
