//! Checking every record file in full.

use mcp_persist_core::Error;

use super::{
    Kv,
    format::{HeaderRead, Stored, read_header},
};
use crate::fsio::{hashed_name, io, is_live, unix_ms};

/// What [`Kv::verify`] found.
#[derive(Debug, Default)]
pub(crate) struct KvCheck {
    pub(crate) live: u64,
    pub(crate) dead: u64,
    pub(crate) problems: Vec<String>,
}

impl Kv {
    /// Reads every record file in full and reports what does not check out.
    pub(crate) fn verify(&self) -> Result<KvCheck, Error> {
        let mut check = KvCheck::default();
        let now = unix_ms();
        for name in self.record_names()? {
            let path = self.store.kv_dir.join(&name);
            let key = match read_header(&path).map_err(io("read", &path))? {
                HeaderRead::Gone => continue,
                HeaderRead::Good(_, key) => key,
                HeaderRead::Bad(reason) => {
                    check.problems.push(format!("kv/{name}: {reason}"));
                    continue;
                }
            };
            if hashed_name("kv", &key) != name {
                check.problems.push(format!(
                    "kv/{name}: holds key {key:?}, which belongs elsewhere"
                ));
                continue;
            }
            match self.read_record(&key, &path) {
                Ok(Some(Stored::Value { expires_ms, .. })) if is_live(expires_ms, now) => {
                    check.live += 1;
                }
                Ok(Some(_)) => check.dead += 1,
                Ok(None) => {}
                Err(e) => check.problems.push(format!("kv/{name}: {e}")),
            }
        }
        Ok(check)
    }
}
