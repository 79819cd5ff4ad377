//! A durable rmcp Streamable HTTP client: it survives crashes and restarts.
//!
//! [`DurableClientBuilder`] gives an rmcp transport, ready for rmcp's
//! `serve`, and a [`ClientHandle`] next to it. Inside the transport a
//! [`DurableHttpClient`] decorates rmcp's HTTP client (reqwest, or anything
//! implementing rmcp's `StreamableHttpClient`, such as rmcp's `AuthClient`)
//! and keeps the session in a store from `mcp-persist-core`, keyed by
//! endpoint URL and profile ([`ServerKey`](mcp_persist_core::ServerKey)).
//!
//! # What it guarantees
//!
//! * **No second handshake.** After a real `initialize` the session id and
//!   the whole `InitializeResult` are stored. A restarted process answers
//!   rmcp's `initialize` from the store (same JSON-RPC id, stored session
//!   id) and drops the `notifications/initialized` the server already has:
//!   its first request carries the old `Mcp-Session-Id`. The stored
//!   capabilities, server info and instructions are readable through
//!   [`ClientHandle::initialize_result`] before any network call.
//! * **Request ids never repeat within a session.** rmcp numbers requests
//!   from 0 in every process; the decorator renumbers them on the wire from
//!   blocks reserved in the store (one write per block, the next block
//!   reserved in the background) and maps answers back to rmcp's ids.
//! * **Answers are not lost.** Every request sent in a session is journaled
//!   with its method, params and the last SSE event id of its response
//!   stream. A restarted process lists them with
//!   [`ClientHandle::interrupted`] and collects them with
//!   [`ClientHandle::recover`]: resumed with `GET` and `Last-Event-ID`
//!   (missed progress and notifications, then the final answer, in rmcp's
//!   types), or, for a call the server answered with a task, by polling
//!   `tasks/get` ([`RecoveredTask`]; a server spoken to in the 2026-07-28
//!   revision has no sessions, and its task calls are journaled all the
//!   same, to be collected through the running client with
//!   [`RecoveredTask::collect_with`]), or, for a `tools/call` with no stream
//!   to resume (2026-07-28, or its session gone) to a server that
//!   advertised exactly-once calls, sent again with its idempotency key
//!   ([`Recovery::Reissue`]: every `tools/call` carries a key in `_meta`,
//!   see [`exactly_once`](crate::exactly_once)), or reported as lost with
//!   method and params. Nothing is sent again without the application
//!   deciding so, and nothing that could run twice. A
//!   request stays listed until its answer is collected or it is
//!   [dismissed](ClientHandle::dismiss), across any number of restarts and
//!   404s: a server that forgot the session gives
//!   [`RecoveryError::SessionGone`] when collecting (whatever error shape
//!   rmcp's HTTP client used for its 404), and from then on, in this
//!   process and the next ones, the request is [`Recovery::Lost`] with
//!   [`LostReason::SessionGone`], as are those of a session the application
//!   ended.
//! * **An answered call does not come back.** The mark that a request was
//!   answered is committed after rmcp has handed the answer on (see the
//!   window below), and at the latest when the client is dropped: a
//!   process that returns from `main` normally, without calling
//!   [`ClientHandle::flush`], never sees an answered call listed again.
//! * **Progress tokens never repeat within a session.** rmcp numbers them
//!   from 0 in every process too; the decorator sends each request's wire
//!   id as its token and gives progress back with the application's own
//!   token (the one in the request's params), or rmcp's. (rmcp's
//!   `reset_timeout_on_progress` watches rmcp's token, so a request that
//!   sets its own token and relies on that option should leave the token
//!   to rmcp.)
//! * **Server messages are not lost either.** The last event id of the
//!   session's standalone GET stream (server notifications and requests
//!   outside any request) is stored too; the first GET of a restarted process
//!   sends it as `Last-Event-ID`, so the server replays what it sent while no
//!   process listened. A server that refuses it (events expired, or none
//!   kept) gets a fresh GET. Messages that arrived within the journal's
//!   window before a crash may arrive again.
//! * **No stall, and a measured window.** Store writes go to a writer on a
//!   thread of its own, which commits each change
//!   [`journal_delay`](DurableClientBuilder::journal_delay) (10 ms by
//!   default) after it was made: a request answered within that window is
//!   never written, nor its answer deleted, so short calls cost no store
//!   write at all. Dropping the last [`ClientHandle`] commits whatever is
//!   pending at once and waits for it (at most 5 seconds); dropping the
//!   transport does the same for what came after. A `main` that returns
//!   drops its handle while the runtime still runs, so a runtime that shuts
//!   down cuts nothing. What a crash (SIGKILL, a power cut,
//!   `std::process::exit`) can cut is that window, exactly:
//!   - a request sent less than `journal_delay` before is not listed after
//!     the restart (the server may have run it);
//!   - an answer that reached the client less than `journal_delay`, plus
//!     one store write, before is listed again and can be collected a
//!     second time: answers are delivered at least once, never lost. Only
//!     requests in flight longer than `journal_delay` can come back this
//!     way. `cargo xtask bench client` measures the window on SQLite.
//!
//!   On a current-thread runtime (`#[tokio::test]`, `current_thread`) the
//!   drop cannot wait, since the runtime's one thread is the one dropping:
//!   it starts the commit, the client's writer thread finishes it, and the
//!   next client built for the same server in this process awaits it
//!   before reading the store, so it starts from what the dropped one
//!   ended with (a request dismissed there is not listed again).
//!
//!   A store whose connection is driven by the application's runtime
//!   (Redis) cannot take writes once that runtime has stopped, nor while a
//!   current-thread runtime's one thread waits: with such a store on a
//!   current-thread runtime, or when the handle is dropped before the
//!   transport's last answer, call [`ClientHandle::flush`] before
//!   returning from `main`.
//! * **The session outlives the process.** Dropping or closing the rmcp
//!   client sends no `DELETE`; [`ClientHandle::end_session`] does.
//! * **A lost session is said so.** On a 404 for the stored session the
//!   client forgets it, lets rmcp re-initialize, stores the new session, and
//!   tells the application through [`ClientNotice::SessionExpired`] and
//!   [`ClientNotice::NewSession`] (and a `tracing` warning), and
//!   [`ClientHandle::start`] says [`StartKind::Replaced`]: the server-side
//!   state of the old session is gone. A standalone GET answered 404 is not
//!   an error (rmcp would log one on every start after an expiry); the next
//!   request re-initializes.
//! * **A stale era verdict is re-probed once.** A request sent under the
//!   stored verdict and refused as an unsupported protocol version (-32022,
//!   -32004, -32001 in a JSON answer; nothing else is taken as proof) makes
//!   the client forget the verdict, send one `server/discover` (at most one
//!   per process), store what it finds and send
//!   [`ClientNotice::StaleVerdict`]. If the server still supports the
//!   request's modern version the request is sent once more; otherwise, or
//!   if the probe fails, the refusal is the answer: a running rmcp service
//!   cannot switch eras, the next start uses the new verdict. In a legacy
//!   session the verdict and the session are forgotten and the next start
//!   probes.
//! * **Bad state never reaches the wire.** A corrupt stored record, one of
//!   a newer schema, or one whose session id or `InitializeResult` no longer
//!   parses, starts a fresh session with a warning, and
//!   [`ClientHandle::start`] says why. A store that fails at runtime (disk
//!   full, database locked) turns the client into an in-memory one
//!   ([`ClientNotice::StoreDegraded`]); MCP calls keep working.
//! * **Its logs say which client.** Everything a client logs, from the
//!   builder, the transport, the streams it follows, the journal writer and
//!   the handle, is inside one `tracing` span per client,
//!   `mcp_persist_client`, whose fields `server` and `profile` name it; the
//!   lines themselves do not repeat them. The span is at `WARN` level, so a
//!   filter that keeps the client's warnings keeps the span too.
//!
//! # Example
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use mcp_persist_core::{MemoryStore, Stores};
//! use mcp_persist_transport_http::client::DurableClientBuilder;
//! use rmcp::{ServiceExt, model::CallToolRequestParams};
//!
//! // A durable backend in production: `FileStore`, `SqliteStore`, ...
//! let stores = Stores::new(MemoryStore::new());
//! let (transport, handle) = DurableClientBuilder::new("http://127.0.0.1:8080/mcp", &stores)
//!     .profile("default")
//!     .build()
//!     .await?;
//! if let Some(info) = handle.initialize_result() {
//!     println!("resuming with {} before any request", info.server_info.name);
//! }
//! // Answers a previous process never saw:
//! for recovery in handle.recover() {
//!     println!("interrupted: {}", recovery.request().method);
//! }
//! let client = ().serve(transport).await?;
//! let result = client.call_tool(CallToolRequestParams::new("echo")).await?;
//! println!("{result:?}");
//! // Closing keeps the session for the next process...
//! client.cancel().await?;
//! // ...unless the application ends it.
//! handle.end_session().await?;
//! # Ok(()) }
//! ```

mod answer;
mod builder;
mod decorator;
mod delegate;
mod era;
mod handle;
mod headers;
mod health;
mod ids;
mod inbox;
mod journal;
mod keys;
mod progress;
mod recovery;
mod report;
mod requests;
mod session;
mod spans;
mod streams;
mod tasks;
mod wire;

pub use self::{
    builder::{ClientStateSource, DEFAULT_ID_BLOCK, DurableClientBuilder, DurableTransport},
    decorator::DurableHttpClient,
    handle::ClientHandle,
    recovery::{
        LostReason, RecoveredAnswer, RecoveredMessage, RecoveredTask, Recovery, RecoveryError,
        ReissuedCall, ResumedRequest, TaskOutcome,
    },
    report::{ClientError, ClientNotice, StartKind},
};
