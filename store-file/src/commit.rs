//! Group commit: synced appends to many logs at once share one sync.
//!
//! Each log is its own file, so a synced append ends in a sync of that file,
//! and each such sync costs the disk a cache flush. When appends to several
//! logs wait at once, one of them leads a round and syncs the whole
//! filesystem once (`syncfs`): the data of every file written before the
//! round started reaches the disk, behind a single flush. A round with one
//! member syncs just its file, so a lone stream pays no more than before.
//!
//! `syncfs` also writes back whatever else is dirty on the same filesystem,
//! which is why [`FileStoreOptions::group_commit`](crate::FileStoreOptions)
//! can turn this off. It is used only where it reports write-back errors
//! (Linux 5.8 and later, the store and its logs on one filesystem); elsewhere
//! every append syncs its own file.

use std::{
    collections::HashMap,
    fs::{self, File},
    io,
    os::unix::fs::MetadataExt,
    path::Path,
    sync::{Condvar, Mutex, MutexGuard},
};

use mcp_persist_core::Error;
use tracing::{debug, trace};

use crate::fsio::io;

/// A failed round, as reported to each of its members.
#[derive(Debug)]
struct Failure {
    kind: io::ErrorKind,
    os_code: Option<i32>,
    message: String,
    /// Members that have not yet picked it up.
    unread: usize,
}

impl Failure {
    fn to_error(&self) -> io::Error {
        match self.os_code {
            Some(code) => io::Error::from_raw_os_error(code),
            None => io::Error::new(self.kind, self.message.clone()),
        }
    }
}

#[derive(Debug, Default)]
struct Rounds {
    /// Rounds started so far; the current one when `leading`.
    started: u64,
    /// Rounds finished so far (they finish in order).
    finished: u64,
    /// Whether a round is under way.
    leading: bool,
    /// Members registered for the next round to start.
    waiting: usize,
    /// Rounds that failed, until each member has read the failure.
    failed: HashMap<u64, Failure>,
}

/// How a round's leader syncs: its own file alone, or everything.
trait Syncer {
    /// Syncs the leader's own file: a round of one.
    fn sync_one(&self) -> io::Result<()>;
    /// Syncs every file of the filesystem: a round of several.
    fn sync_all(&self) -> io::Result<()>;
}

/// Rounds of syncs shared by the appends waiting at the same time.
#[derive(Debug, Default)]
struct GroupSync {
    rounds: Mutex<Rounds>,
    done: Condvar,
}

impl GroupSync {
    fn rounds(&self) -> MutexGuard<'_, Rounds> {
        // Counters only, never left half-updated: a poisoned lock is sound.
        self.rounds.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Returns once a sync that started after this call has finished: what
    /// the caller wrote before calling is on the disk, or the error says it
    /// may not be.
    fn sync(&self, syncer: &impl Syncer) -> io::Result<()> {
        let mut rounds = self.rounds();
        rounds.waiting += 1;
        // The first round to start from now on: a round under way may have
        // started before this caller's write.
        let mine = rounds.started + 1;
        loop {
            if rounds.finished >= mine {
                let Some(failure) = rounds.failed.get_mut(&mine) else {
                    return Ok(());
                };
                let error = failure.to_error();
                failure.unread -= 1;
                if failure.unread == 0 {
                    rounds.failed.remove(&mine);
                }
                return Err(error);
            }
            if rounds.leading {
                rounds = self.done.wait(rounds).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            // Lead the round: everyone waiting now (this caller included)
            // registered for it.
            rounds.leading = true;
            rounds.started += 1;
            let round = rounds.started;
            let members = std::mem::take(&mut rounds.waiting);
            drop(rounds);
            let result = if members > 1 {
                syncer.sync_all()
            } else {
                syncer.sync_one()
            };
            trace!(round, members, ok = result.is_ok(), "group commit round");
            rounds = self.rounds();
            rounds.finished = round;
            rounds.leading = false;
            if let Err(e) = result {
                rounds.failed.insert(
                    round,
                    Failure {
                        kind: e.kind(),
                        os_code: e.raw_os_error(),
                        message: e.to_string(),
                        unread: members,
                    },
                );
            }
            self.done.notify_all();
        }
    }
}

/// Whether `syncfs` reports write-back errors here (Linux 5.8 and later),
/// so a round's failure reaches its members.
fn syncfs_reports_errors() -> bool {
    #[cfg(target_os = "linux")]
    {
        reports_errors_from(&rustix::system::uname().release().to_string_lossy())
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

/// Whether a Linux kernel release string (`6.1.0-18-amd64`) is 5.8 or later.
fn reports_errors_from(release: &str) -> bool {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let mut number = || parts.next().and_then(|p| p.parse::<u32>().ok());
    match (number(), number()) {
        (Some(major), Some(minor)) => (major, minor) >= (5, 8),
        _ => false,
    }
}

/// Syncs the filesystem holding `root` (an open handle to the store
/// directory).
fn syncfs(root: &File) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        rustix::fs::syncfs(root).map_err(io::Error::from)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = root;
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "syncfs is Linux only",
        ))
    }
}

/// Group commit of a store's synced log appends, when it is on and
/// trustworthy here.
#[derive(Debug)]
pub(crate) struct GroupCommit {
    /// The store directory, open: `syncfs` syncs its filesystem.
    root: File,
    rounds: GroupSync,
}

impl GroupCommit {
    /// Group commit for the store in `root` with its logs in `log_dir`,
    /// when `wanted` and `syncfs` can be trusted with the logs: errors
    /// reported (Linux 5.8+) and one filesystem.
    pub(crate) fn new(wanted: bool, root: &Path, log_dir: &Path) -> Result<Option<Self>, Error> {
        if !wanted {
            return Ok(None);
        }
        if !syncfs_reports_errors() {
            debug!("group commit off: syncfs does not report write-back errors here");
            return Ok(None);
        }
        let root_file = File::open(root).map_err(io("open", root))?;
        let root_dev = root_file.metadata().map_err(io("inspect", root))?.dev();
        let log_dev = fs::metadata(log_dir).map_err(io("inspect", log_dir))?.dev();
        if root_dev != log_dev {
            debug!("group commit off: the logs are on another filesystem than the store");
            return Ok(None);
        }
        Ok(Some(GroupCommit {
            root: root_file,
            rounds: GroupSync::default(),
        }))
    }

    /// Syncs `file` (a segment just appended to) as one member of a round:
    /// alone, or with the whole filesystem for a round of several.
    pub(crate) fn sync(&self, file: &File) -> io::Result<()> {
        self.rounds.sync(&SegmentSync {
            file,
            root: &self.root,
        })
    }
}

/// A synced append's share of a group commit round: its segment alone, or
/// the whole filesystem for a round of several.
struct SegmentSync<'a> {
    file: &'a File,
    root: &'a File,
}

impl Syncer for SegmentSync<'_> {
    fn sync_one(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn sync_all(&self) -> io::Result<()> {
        syncfs(self.root)
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::{
            Arc,
            atomic::{AtomicUsize, Ordering},
        },
        thread,
        time::Duration,
    };

    use super::*;

    /// Counts the syncs, and holds the first round until `hold` callers are
    /// registered for the next one.
    struct Counting {
        group: Arc<GroupSync>,
        one: Arc<AtomicUsize>,
        all: Arc<AtomicUsize>,
        hold: usize,
        fail_all: bool,
    }

    impl Syncer for Counting {
        fn sync_one(&self) -> io::Result<()> {
            self.one.fetch_add(1, Ordering::SeqCst);
            while self.group.rounds().waiting < self.hold {
                thread::sleep(Duration::from_millis(1));
            }
            Ok(())
        }
        fn sync_all(&self) -> io::Result<()> {
            self.all.fetch_add(1, Ordering::SeqCst);
            if self.fail_all {
                Err(io::Error::from_raw_os_error(5))
            } else {
                Ok(())
            }
        }
    }

    /// One caller leads a round of its own; seven arriving during it share
    /// the next round, one `sync_all`. Returns each caller's result.
    fn two_rounds(fail_all: bool) -> (Vec<io::Result<()>>, usize, usize) {
        let group = Arc::new(GroupSync::default());
        let (one, all) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let syncer = |hold| Counting {
            group: Arc::clone(&group),
            one: Arc::clone(&one),
            all: Arc::clone(&all),
            hold,
            fail_all,
        };
        let first = {
            let (group, syncer) = (Arc::clone(&group), syncer(7));
            thread::spawn(move || group.sync(&syncer))
        };
        while one.load(Ordering::SeqCst) == 0 {
            thread::sleep(Duration::from_millis(1));
        }
        let rest: Vec<_> = (0..7)
            .map(|_| {
                let (group, syncer) = (Arc::clone(&group), syncer(0));
                thread::spawn(move || group.sync(&syncer))
            })
            .collect();
        let mut results = vec![first.join().expect("first caller")];
        results.extend(rest.into_iter().map(|t| t.join().expect("caller")));
        let (one, all) = (one.load(Ordering::SeqCst), all.load(Ordering::SeqCst));
        assert!(group.rounds().failed.is_empty(), "every failure was read");
        (results, one, all)
    }

    #[test]
    fn callers_waiting_together_share_one_sync() {
        let (results, one, all) = two_rounds(false);
        assert!(results.iter().all(Result::is_ok));
        // Without group commit that is eight syncs.
        assert_eq!((one, all), (1, 1));
    }

    #[test]
    fn a_failed_round_fails_its_members_only() {
        let (results, one, all) = two_rounds(true);
        assert_eq!((one, all), (1, 1));
        assert!(results[0].is_ok(), "the first round succeeded");
        for result in &results[1..] {
            let error = result.as_ref().expect_err("the shared round failed");
            assert_eq!(error.raw_os_error(), Some(5));
        }
    }

    #[test]
    fn syncfs_is_trusted_from_linux_5_8() {
        for (release, trusted) in [
            ("6.18.44-fc-v769", true),
            ("5.8.0", true),
            ("5.10.0-28-amd64", true),
            ("5.7.19", false),
            ("4.19.0-26-cloud-amd64", false),
            ("3", false),
            ("", false),
            ("not a release", false),
        ] {
            assert_eq!(reports_errors_from(release), trusted, "{release}");
        }
    }
}
