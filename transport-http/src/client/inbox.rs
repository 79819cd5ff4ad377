//! Server messages the handle hands to the running rmcp client (recovered
//! notifications), delivered on the session's standalone stream as if they
//! had arrived there.

use std::{
    sync::{Arc, Mutex},
    task::Poll,
};

use futures::{StreamExt, stream::BoxStream};
use rmcp::transport::streamable_http_client::SseError;
use sse_stream::Sse;
use tokio::sync::mpsc;

use super::health::lock;

type SseStream = BoxStream<'static, Result<Sse, SseError>>;

/// Messages waiting for the running rmcp client.
#[derive(Debug)]
pub(crate) struct Inbox {
    tx: mpsc::UnboundedSender<Sse>,
    rx: Arc<Mutex<mpsc::UnboundedReceiver<Sse>>>,
}

impl Inbox {
    pub(crate) fn new() -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Inbox {
            tx,
            rx: Arc::new(Mutex::new(rx)),
        }
    }

    /// Queues a JSON-RPC message (its JSON text) for the rmcp client. It
    /// reaches the client's handler once the session's standalone stream
    /// is open (at once while the client runs).
    pub(crate) fn deliver(&self, json: String) {
        // The receiver lives as long as `self`.
        let _ = self.tx.send(Sse {
            data: Some(json),
            ..Sse::default()
        });
    }

    /// The standalone stream with the queued messages mixed in. It ends
    /// when `stream` ends, so rmcp reconnects as usual; messages queued
    /// meanwhile wait for the next stream.
    pub(crate) fn merge(&self, mut stream: SseStream) -> SseStream {
        let rx = self.rx.clone();
        futures::stream::poll_fn(move |cx| {
            if let Poll::Ready(Some(event)) = lock(&rx).poll_recv(cx) {
                return Poll::Ready(Some(Ok(event)));
            }
            stream.poll_next_unpin(cx)
        })
        .boxed()
    }
}
