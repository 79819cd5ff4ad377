//! Ctrl-C during `copy`: the first one asks the copy to stop at the next
//! record boundary and say where it stopped; a second one ends the process
//! at once.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::fail::Code;

static REQUESTED: AtomicBool = AtomicBool::new(false);

/// Starts listening for Ctrl-C (SIGINT) on the running tokio runtime.
pub(crate) fn install() {
    tokio::spawn(async {
        if tokio::signal::ctrl_c().await.is_err() {
            return;
        }
        REQUESTED.store(true, Ordering::SeqCst);
        if tokio::signal::ctrl_c().await.is_ok() {
            std::process::exit(Code::Interrupted as i32);
        }
    });
}

/// Whether Ctrl-C was pressed.
pub(crate) fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}
