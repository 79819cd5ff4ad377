//! Tailing readers woken by `LISTEN/NOTIFY`.
//!
//! Every append notifies the schema's channel with the log's name. One
//! dedicated connection per store listens (opened on the first
//! `wait_after`, reopened after a failure) and wakes the readers waiting on
//! that log. A notification carries nothing that matters: the tables are the
//! truth, and a reader re-reads them when woken and at least every poll
//! interval, so a notification lost (the listening connection dropped, the
//! server restarted) delays a reader by at most that interval, never loses
//! a record.

use std::{
    collections::HashMap,
    future::poll_fn,
    sync::{
        Arc, Mutex, Weak,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use tokio::sync::{Notify, mpsc, watch};
use tokio_postgres::{AsyncMessage, Config, Socket, tls::MakeTlsConnect};

use crate::tls::Tls;

/// The readers waiting on each log, and the task that wakes them.
pub(crate) struct Listener {
    waiting: Mutex<HashMap<String, (Arc<Notify>, usize)>>,
    started: AtomicBool,
    connected: AtomicBool,
    config: Config,
    tls: Tls,
    channel: String,
    /// Dropped with the store: the listening task then ends.
    shutdown: Mutex<Option<watch::Sender<()>>>,
}

/// A reader's registration: woken by appends to its log while it lives.
pub(crate) struct Interest {
    listener: Arc<Listener>,
    log: String,
    pub(crate) notify: Arc<Notify>,
}

impl Drop for Interest {
    fn drop(&mut self) {
        let mut waiting = self
            .listener
            .waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some((_, count)) = waiting.get_mut(&self.log) {
            *count -= 1;
            if *count == 0 {
                waiting.remove(&self.log);
            }
        }
    }
}

impl Listener {
    pub(crate) fn new(config: Config, tls: Tls, channel: String) -> Arc<Listener> {
        Arc::new(Listener {
            waiting: Mutex::new(HashMap::new()),
            started: AtomicBool::new(false),
            connected: AtomicBool::new(false),
            config,
            tls,
            channel,
            shutdown: Mutex::new(None),
        })
    }

    /// Whether the listening connection is up right now.
    pub(crate) fn is_connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    /// Registers a reader of `log`, starting the listening task if needed.
    pub(crate) fn interest(self: &Arc<Self>, log: &str) -> Interest {
        if !self.started.swap(true, Ordering::AcqRel) {
            let (tx, rx) = watch::channel(());
            *self.shutdown.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
            tokio::spawn(run(Arc::downgrade(self), rx));
        }
        let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        let entry = waiting
            .entry(log.to_owned())
            .or_insert_with(|| (Arc::new(Notify::new()), 0));
        entry.1 += 1;
        Interest {
            listener: Arc::clone(self),
            log: log.to_owned(),
            notify: Arc::clone(&entry.0),
        }
    }

    /// Stops the listening task.
    pub(crate) fn stop(&self) {
        self.shutdown
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
    }

    fn wake(&self, log: &str) {
        let waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((notify, _)) = waiting.get(log) {
            notify.notify_waiters();
        }
    }

    /// Wakes every reader: notifications may have been missed.
    fn wake_all(&self) {
        let waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        for (notify, _) in waiting.values() {
            notify.notify_waiters();
        }
    }
}

/// The listening task: connects, `LISTEN`s, dispatches, and reconnects
/// with a growing pause after a failure, until the store is dropped.
async fn run(listener: Weak<Listener>, mut shutdown: watch::Receiver<()>) {
    let mut pause = Duration::from_millis(50);
    loop {
        let Some(strong) = listener.upgrade() else {
            return;
        };
        let (config, tls, channel) = (
            strong.config.clone(),
            strong.tls.clone(),
            strong.channel.clone(),
        );
        drop(strong);
        let outcome = match tls {
            Tls::None => {
                session(
                    &config,
                    tokio_postgres::NoTls,
                    &channel,
                    &listener,
                    &mut shutdown,
                )
                .await
            }
            #[cfg(feature = "rustls")]
            Tls::Rustls(tls) => session(&config, tls, &channel, &listener, &mut shutdown).await,
        };
        match outcome {
            Ok(Ended::Shutdown) => return,
            Ok(Ended::Dropped) => pause = Duration::from_millis(50),
            Err(e) => {
                tracing::debug!(error = %e, "postgres listening connection failed; retrying");
            }
        }
        if let Some(strong) = listener.upgrade() {
            strong.connected.store(false, Ordering::Relaxed);
            strong.wake_all();
        }
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = shutdown.changed() => return,
        }
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

enum Ended {
    Shutdown,
    Dropped,
}

async fn session<T>(
    config: &Config,
    tls: T,
    channel: &str,
    listener: &Weak<Listener>,
    shutdown: &mut watch::Receiver<()>,
) -> Result<Ended, tokio_postgres::Error>
where
    T: MakeTlsConnect<Socket> + Send,
    T::Stream: Send + 'static,
    T::TlsConnect: Send,
    <T::TlsConnect as tokio_postgres::tls::TlsConnect<Socket>>::Future: Send,
{
    let (client, mut connection) = tokio::select! {
        c = config.connect(tls) => c?,
        _ = shutdown.changed() => return Ok(Ended::Shutdown),
    };
    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    let pump = tokio::spawn(async move {
        loop {
            match poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(n))) => {
                    if tx.send(n.payload().to_owned()).is_err() {
                        return;
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => return,
            }
        }
    });
    let listening = client.batch_execute(&format!("LISTEN \"{channel}\"")).await;
    if let Err(e) = listening {
        pump.abort();
        return Err(e);
    }
    match listener.upgrade() {
        Some(strong) => {
            strong.connected.store(true, Ordering::Relaxed);
            // Whatever was appended before LISTEN took effect was not
            // notified to this connection: every reader looks again.
            strong.wake_all();
        }
        None => {
            pump.abort();
            return Ok(Ended::Shutdown);
        }
    }
    tracing::debug!(channel, "listening for postgres appends");
    loop {
        tokio::select! {
            message = rx.recv() => match message {
                Some(log) => match listener.upgrade() {
                    Some(strong) => strong.wake(&log),
                    None => {
                        pump.abort();
                        return Ok(Ended::Shutdown);
                    }
                },
                None => return Ok(Ended::Dropped),
            },
            _ = shutdown.changed() => {
                pump.abort();
                return Ok(Ended::Shutdown);
            }
        }
    }
}
