//! Reclaiming expired records and deletion markers.

use std::{fs, io};

use mcp_persist_core::Error;
use tracing::debug;

use super::{
    Kv,
    format::{HeaderRead, KIND_TOMBSTONE, read_header},
};
use crate::fsio::{io, io_error, is_live, unix_ms};

impl Kv {
    /// Removes tombstones and records expired for longer than the sweep
    /// margin, after raising the version floor above them so their versions
    /// are never handed out again.
    pub(crate) fn sweep(&self) -> Result<u64, Error> {
        // A record expired within the margin stays: the clock may have been
        // stepped forward, and deleting would make that step permanent.
        let cutoff = self.store.sweep_cutoff_ms(unix_ms());
        let mut candidates = Vec::new();
        for name in self.record_names()? {
            let path = self.store.kv_dir.join(&name);
            if let HeaderRead::Good(header, _) = read_header(&path).map_err(io("read", &path))?
                && (header.kind == KIND_TOMBSTONE || !is_live(header.expires_ms, cutoff))
            {
                candidates.push((name, header.version));
            }
        }
        let mut removed = 0;
        if let Some(max) = candidates.iter().map(|(_, v)| *v).max() {
            self.store.raise_version_floor(max)?;
            for (name, _) in &candidates {
                let _guard = self.store.lock_stripe("kv", name)?;
                let path = self.store.kv_dir.join(name);
                // Look again under the lock: the key may have been written since.
                let still_dead = matches!(
                    read_header(&path).map_err(io("read", &path))?,
                    HeaderRead::Good(h, _) if (h.kind == KIND_TOMBSTONE || !is_live(h.expires_ms, self.store.sweep_cutoff_ms(unix_ms())))
                        && h.version <= max
                );
                if still_dead {
                    match fs::remove_file(&path) {
                        Ok(()) => removed += 1,
                        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                        Err(e) => return Err(io_error("remove", &path, e)),
                    }
                }
            }
            crate::fsio::sync_dir(&self.store.kv_dir)?;
        }
        let temps = crate::fsio::remove_stale_temps(&self.store.kv_dir, crate::STALE_TEMP_AGE)?;
        debug!(removed, temps, "swept expired records");
        Ok(removed)
    }
}
