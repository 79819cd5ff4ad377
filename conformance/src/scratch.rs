//! Scratch directories for client state that one run uses and drops.

/// Removes a directory when dropped (best effort).
pub(crate) struct RemoveOnDrop(pub(crate) std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            tracing::debug!(error = %e, dir = %self.0.display(), "could not remove the client state");
        }
    }
}
