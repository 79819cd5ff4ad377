//! Group commit: synced appends to many logs at once share one sync.
//!
//! Each log is its own file, so a synced append ends in a sync of that file,
//! and each such sync costs the disk a cache flush. A synced append writes
//! its frames (on the blocking pool, or on its own task when it writes in
//! place while others are syncing: see `Logs::try_append_in_place`), then
//! hands its segment to the store's sync thread and waits for it without
//! holding a thread. That thread takes
//! every segment handed to it since its last round and syncs them in one
//! round: the whole filesystem once (`syncfs`) for several, behind a single
//! flush, or the segment alone (`fdatasync`) for one, so a lone stream pays
//! no more than before. A round starts after its members were handed over,
//! so after their writes: what each member wrote is on the disk when it
//! hears the round went well. An append that finds nothing being synced
//! (no member waiting or in a round, no other append syncing alone) syncs
//! its segment on the blocking thread that wrote it, as a round of one: the
//! hand-over to the sync thread and back cost a lone appender a sixth of
//! its rate (0.56–0.61 of raw append+fdatasync with it, 0.67–0.71 with
//! group commit off), and it now reaches 0.66–0.67.
//!
//! Before, each waiting append held a blocking thread until a round that
//! one of them led had finished: 64 appenders held 64 threads, and every
//! round woke them all. With the sync thread, appends to 64 logs at once
//! went from about 22,000 to 28,000–35,000 per second on a 2-core VM
//! (0.47 to 0.61 of 64 threads that each write and fdatasync their own
//! file, from 0.45), and group commit now beats syncing each append on its
//! own by a tenth to a third instead of matching it (`cargo xtask bench
//! file`). Most of what was left was the hand-over of each append's writes
//! to the blocking pool and back; an append written in place by its own
//! task while a round is pending skips it (0.63–0.66 of the raw threads
//! before, 0.70–0.91 after, in alternating runs).
//!
//! `syncfs` also writes back whatever else is dirty on the same filesystem,
//! which is why [`FileStoreOptions::group_commit`](crate::FileStoreOptions)
//! can turn this off. It is used only where it reports write-back errors
//! (Linux 5.8 and later, the store and its logs on one filesystem); elsewhere
//! every append syncs its own file.

use std::{
    fs::{self, File},
    io,
    os::unix::fs::MetadataExt,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
        mpsc,
    },
};

use mcp_persist_core::Error;
use tokio::sync::oneshot;
use tracing::{debug, trace};

use crate::fsio::io;

/// How a round syncs: one segment alone, or everything.
trait Syncer: Send + 'static {
    /// Syncs one segment: a round of one.
    fn sync_one(&self, file: &File) -> io::Result<()>;
    /// Syncs every file of the filesystem: a round of several.
    fn sync_all(&self) -> io::Result<()>;
}

/// A synced append waiting for its round.
struct Member {
    /// The segment it wrote to.
    file: Arc<File>,
    reply: oneshot::Sender<io::Result<()>>,
}

/// A round's error, as each of its members hears it.
fn shared(error: &io::Error) -> io::Error {
    match error.raw_os_error() {
        Some(code) => io::Error::from_raw_os_error(code),
        None => io::Error::new(error.kind(), error.to_string()),
    }
}

/// Rounds made and appends synced by them, since the store was opened, and
/// the syncs under way.
#[derive(Debug, Default)]
struct Counts {
    rounds: AtomicU64,
    members: AtomicU64,
    /// Appends handed over and not yet answered, plus a sync made alone.
    pending: AtomicUsize,
}

/// What a store's group commit has done since the store was opened
/// ([`FileStore::group_commit_stats`](crate::FileStore::group_commit_stats)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct GroupCommitStats {
    /// Syncs made: one per round.
    pub rounds: u64,
    /// Synced appends those rounds covered.
    pub appends: u64,
}

/// The sync thread: a round for every batch of members handed over, until
/// the store's handle (and so the sender) is gone.
fn serve(syncer: impl Syncer, members: mpsc::Receiver<Member>, counts: &Counts) {
    while let Ok(first) = members.recv() {
        let mut round = vec![first];
        round.extend(members.try_iter());
        let result = match round.as_slice() {
            [only] => syncer.sync_one(&only.file),
            _ => syncer.sync_all(),
        };
        let rounds = counts.rounds.fetch_add(1, Ordering::Relaxed) + 1;
        counts
            .members
            .fetch_add(round.len() as u64, Ordering::Relaxed);
        trace!(
            round = rounds,
            members = round.len(),
            ok = result.is_ok(),
            "group commit round"
        );
        for member in round {
            counts.pending.fetch_sub(1, Ordering::AcqRel);
            // A member whose append was dropped meanwhile hears nothing.
            let _ = member
                .reply
                .send(result.as_ref().map(|_| ()).map_err(shared));
        }
    }
}

/// The handle to a sync thread; dropping it lets the thread finish its
/// round and stop.
#[derive(Debug)]
struct Rounds {
    members: mpsc::Sender<Member>,
    counts: Arc<Counts>,
}

impl Rounds {
    fn spawn(syncer: impl Syncer) -> io::Result<Self> {
        let (members, queue) = mpsc::channel();
        let counts = Arc::new(Counts::default());
        let thread_counts = Arc::clone(&counts);
        std::thread::Builder::new()
            .name("mcp-persist-file-sync".to_owned())
            .spawn(move || serve(syncer, queue, &thread_counts))?;
        Ok(Rounds { members, counts })
    }

    fn stats(&self) -> GroupCommitStats {
        GroupCommitStats {
            rounds: self.counts.rounds.load(Ordering::Relaxed),
            appends: self.counts.members.load(Ordering::Relaxed),
        }
    }

    /// Returns once a round that started after this call has finished:
    /// what was written to `file` before is on the disk, or the error says
    /// it may not be.
    async fn sync(&self, file: Arc<File>) -> io::Result<()> {
        let gone = || io::Error::other("the store's sync thread stopped");
        let (reply, answer) = oneshot::channel();
        self.counts.pending.fetch_add(1, Ordering::AcqRel);
        if self.members.send(Member { file, reply }).is_err() {
            self.counts.pending.fetch_sub(1, Ordering::AcqRel);
            return Err(gone());
        }
        answer.await.unwrap_or_else(|_| Err(gone()))
    }

    /// Whether an append is handed over and unanswered, or syncing alone.
    fn busy(&self) -> bool {
        self.counts.pending.load(Ordering::Acquire) > 0
    }

    /// Runs `sync_one` (a segment's own sync) on the calling thread, as a
    /// round of one, when nothing else is being synced: no append handed
    /// over and unanswered, no other sync made alone. A lone stream then
    /// skips the hand-over to the sync thread and back, which cost a lone
    /// appender about a sixth of its rate. `None` when others are syncing:
    /// hand the segment over, to share their next round.
    fn alone(&self, sync_one: impl FnOnce() -> io::Result<()>) -> Option<io::Result<()>> {
        self.counts
            .pending
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed)
            .ok()?;
        let result = sync_one();
        self.counts.rounds.fetch_add(1, Ordering::Relaxed);
        self.counts.members.fetch_add(1, Ordering::Relaxed);
        self.counts.pending.fetch_sub(1, Ordering::AcqRel);
        Some(result)
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
    rounds: Rounds,
}

impl GroupCommit {
    /// Group commit for the store in `root` with its logs in `log_dir`,
    /// when `wanted` and `syncfs` can be trusted with the logs: errors
    /// reported (Linux 5.8+) and one filesystem. Starts the sync thread.
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
        let rounds = Rounds::spawn(Filesystem { root: root_file })
            .map_err(io("start the sync thread for", root))?;
        Ok(Some(GroupCommit { rounds }))
    }

    /// Syncs `file` (a segment just appended to) as one member of a round:
    /// alone, or with the whole filesystem for a round of several.
    pub(crate) async fn sync(&self, file: Arc<File>) -> io::Result<()> {
        self.rounds.sync(file).await
    }

    /// Syncs `file` on the calling thread when no other append is being
    /// synced, as a round of one; `None`: hand it to [`sync`](Self::sync).
    /// Blocking.
    pub(crate) fn sync_alone(&self, file: &File) -> Option<io::Result<()>> {
        self.rounds.alone(|| file.sync_data())
    }

    /// Whether another append is being synced now: one that hands its
    /// segment over shares that round.
    pub(crate) fn busy(&self) -> bool {
        self.rounds.busy()
    }

    pub(crate) fn stats(&self) -> GroupCommitStats {
        self.rounds.stats()
    }
}

/// The filesystem of a store: a round of one syncs its segment, a round of
/// several the whole filesystem.
struct Filesystem {
    /// The store directory, open: `syncfs` syncs its filesystem.
    root: File,
}

impl Syncer for Filesystem {
    fn sync_one(&self, file: &File) -> io::Result<()> {
        file.sync_data()
    }

    fn sync_all(&self) -> io::Result<()> {
        syncfs(&self.root)
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::{
            Arc,
            atomic::{AtomicUsize, Ordering},
        },
        time::Duration,
    };

    use super::*;

    /// Counts the syncs; the first one waits until `gate` opens (its
    /// sender is dropped), and a round of several fails when `fail_all`.
    struct Counting {
        one: Arc<AtomicUsize>,
        all: Arc<AtomicUsize>,
        gate: mpsc::Receiver<()>,
        fail_all: bool,
    }

    impl Syncer for Counting {
        fn sync_one(&self, _: &File) -> io::Result<()> {
            self.one.fetch_add(1, Ordering::SeqCst);
            let _ = self.gate.recv();
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

    /// A sync thread over a [`Counting`] syncer: the thread, its counts of
    /// syncs alone and of all, and the gate's sender (drop it to open).
    fn counting_rounds(
        fail_all: bool,
    ) -> (
        Arc<Rounds>,
        Arc<AtomicUsize>,
        Arc<AtomicUsize>,
        mpsc::Sender<()>,
    ) {
        let (one, all) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (held, gate) = mpsc::channel();
        let rounds = Rounds::spawn(Counting {
            one: Arc::clone(&one),
            all: Arc::clone(&all),
            gate,
            fail_all,
        })
        .expect("sync thread");
        (Arc::new(rounds), one, all, held)
    }

    /// One append has a round of its own; seven handed over while it runs
    /// share the next round, one `sync_all`. Returns each append's result
    /// and the syncs of each kind.
    async fn two_rounds(fail_all: bool) -> (Vec<io::Result<()>>, usize, usize) {
        let (rounds, one, all, held) = counting_rounds(fail_all);
        let file = Arc::new(tempfile::tempfile().expect("a file"));
        let first = tokio::spawn({
            let (rounds, file) = (Arc::clone(&rounds), Arc::clone(&file));
            async move { rounds.sync(file).await }
        });
        while one.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let rest: Vec<_> = (0..7)
            .map(|_| {
                let (rounds, file) = (Arc::clone(&rounds), Arc::clone(&file));
                tokio::spawn(async move { rounds.sync(file).await })
            })
            .collect();
        // Every one of them handed over before the first round ends.
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(held);
        let mut results = vec![first.await.expect("first append")];
        for append in rest {
            results.push(append.await.expect("append"));
        }
        (
            results,
            one.load(Ordering::SeqCst),
            all.load(Ordering::SeqCst),
        )
    }

    #[tokio::test]
    async fn appends_waiting_together_share_one_sync() {
        let (results, one, all) = two_rounds(false).await;
        assert!(results.iter().all(Result::is_ok));
        // Without group commit that is eight syncs.
        assert_eq!((one, all), (1, 1));
    }

    #[tokio::test]
    async fn a_failed_round_fails_its_members_only() {
        let (results, one, all) = two_rounds(true).await;
        assert_eq!((one, all), (1, 1));
        assert!(results[0].is_ok(), "the first round succeeded");
        for result in &results[1..] {
            let error = result.as_ref().expect_err("the shared round failed");
            assert_eq!(error.raw_os_error(), Some(5));
        }
    }

    /// A sync made alone runs on the caller's thread only while nothing
    /// else is being synced; while an append waits for its round, the next
    /// one is handed over to share a round.
    #[tokio::test]
    async fn a_lone_append_syncs_on_its_own_thread_only_when_nothing_else_syncs() {
        let (rounds, one, _, held) = counting_rounds(false);
        let mut alone = 0;
        assert!(
            rounds
                .alone(|| {
                    alone += 1;
                    Ok(())
                })
                .is_some_and(|r| r.is_ok())
        );
        assert_eq!((alone, one.load(Ordering::SeqCst)), (1, 0));

        let file = Arc::new(tempfile::tempfile().expect("a file"));
        let waiting = tokio::spawn({
            let (rounds, file) = (Arc::clone(&rounds), Arc::clone(&file));
            async move { rounds.sync(file).await }
        });
        while one.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(
            rounds
                .alone(|| unreachable!("synced alone while a round runs"))
                .is_none(),
            "an append waits in a round: the next shares the sync thread's"
        );
        drop(held);
        waiting.await.expect("task").expect("synced");
        // Answered: alone again.
        assert!(rounds.alone(|| Ok(())).is_some());
        assert_eq!(
            rounds.stats(),
            GroupCommitStats {
                rounds: 3,
                appends: 3
            }
        );
    }

    #[tokio::test]
    async fn an_append_hears_when_the_sync_thread_is_gone() {
        struct Panicking;
        impl Syncer for Panicking {
            fn sync_one(&self, _: &File) -> io::Result<()> {
                panic!("a sync that never returns");
            }
            fn sync_all(&self) -> io::Result<()> {
                panic!("a sync that never returns");
            }
        }
        let rounds = Rounds::spawn(Panicking).expect("sync thread");
        let file = Arc::new(tempfile::tempfile().expect("a file"));
        let error = rounds.sync(Arc::clone(&file)).await.expect_err("no sync");
        assert!(error.to_string().contains("sync thread stopped"), "{error}");
        let error = rounds.sync(file).await.expect_err("no sync");
        assert!(error.to_string().contains("sync thread stopped"), "{error}");
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
