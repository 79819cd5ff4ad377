//! What the integration tests share: where moto is, clients and stores on
//! it, the conformance fixture, and an HTTP proxy that plays a throttling
//! Secrets Manager.
//!
//! `cargo xtask test` starts `moto_server` and passes its address in
//! `MCP_PERSIST_MOTO_URL`. Without it, a test fails under CI and otherwise
//! prints a notice and skips.

#![allow(dead_code, unreachable_pub)]

use std::{
    collections::hash_map::RandomState,
    hash::{BuildHasher, Hasher},
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU32, AtomicU64, Ordering},
    },
    time::Duration,
};

use mcp_persist_store_vault::{
    SecretsManagerStore, SecretsManagerStoreBuilder,
    aws_sdk_secretsmanager::{
        Client, Config,
        config::{BehaviorVersion, Credentials, Region},
    },
};
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::{TcpListener, TcpStream},
    sync::Notify,
};

pub const URL_VAR: &str = "MCP_PERSIST_MOTO_URL";

/// Whether we run under CI, where a missing service is a failure.
pub fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// moto's address; `None` (after a notice) when it is not set outside CI.
/// Under CI a missing address fails the test.
pub fn moto_url() -> Option<String> {
    match std::env::var(URL_VAR) {
        Ok(v) if !v.trim().is_empty() => Some(v.trim().to_owned()),
        _ => {
            assert!(
                !under_ci(),
                "{URL_VAR} is not set; under CI the Secrets Manager tests must run (start moto with `cargo xtask test`)"
            );
            eprintln!(
                "notice: {URL_VAR} is not set; skipping (run `cargo xtask test` to start moto)"
            );
            None
        }
    }
}

/// A client for `endpoint` with fake credentials, as tests use.
pub fn client(endpoint: &str) -> Client {
    let config = Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("testing", "testing", None, None, "tests"))
        .endpoint_url(endpoint)
        .build();
    Client::from_conf(config)
}

/// A prefix no other test uses.
pub fn unique_prefix(what: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.write_u32(std::process::id());
    format!("test/{what}/{:016x}/", hasher.finish())
}

/// A builder for a store on `endpoint` under `prefix`, without the write
/// rate limit (moto has none, and the conformance races write a lot).
pub fn builder(endpoint: &str, prefix: &str) -> SecretsManagerStoreBuilder {
    SecretsManagerStore::builder(prefix)
        .client(client(endpoint))
        .max_writes_per_second(None)
}

pub async fn store(endpoint: &str, prefix: &str) -> SecretsManagerStore {
    builder(endpoint, prefix)
        .build()
        .await
        .unwrap_or_else(|e| panic!("building the store failed: {e}"))
}

/// Opens a fresh store of the conformance suite on moto, under the place's
/// own prefix. A missing moto is a failure that says how to start it.
pub async fn open_at(
    place: mcp_persist_core::conformance::crash::Place,
) -> Result<SecretsManagerStore, mcp_persist_core::Error> {
    let url = std::env::var(URL_VAR).unwrap_or_default();
    assert!(
        !url.trim().is_empty(),
        "{URL_VAR} is not set: start moto with `cargo xtask services` (or run `cargo xtask test`)"
    );
    builder(url.trim(), &format!("test/{}/", place.name))
        .build()
        .await
}

/// A loopback HTTP proxy in front of moto that answers calls of one
/// Secrets Manager operation with `ThrottlingException` while its budget
/// lasts, can hold the first call of an operation until released, and
/// counts the calls that reach it.
pub struct Proxy {
    pub url: String,
    state: Arc<ProxyState>,
}

struct ProxyState {
    upstream: SocketAddr,
    throttle_target: Mutex<String>,
    throttle_left: AtomicU32,
    throttled: AtomicU32,
    lose_target: Mutex<String>,
    lose_left: AtomicU32,
    /// The operation to hold, after letting this many of its calls through.
    hold_target: Mutex<Option<(String, u32)>>,
    holding: Notify,
    held: AtomicU32,
    release: Notify,
    calls: Mutex<Vec<String>>,
}

impl Proxy {
    pub async fn start(moto_url: &str) -> Proxy {
        let upstream: SocketAddr = moto_url
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .parse()
            .expect("moto's address is host:port");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let state = Arc::new(ProxyState {
            upstream,
            throttle_target: Mutex::new(String::new()),
            throttle_left: AtomicU32::new(0),
            throttled: AtomicU32::new(0),
            lose_target: Mutex::new(String::new()),
            lose_left: AtomicU32::new(0),
            hold_target: Mutex::new(None),
            holding: Notify::new(),
            held: AtomicU32::new(0),
            release: Notify::new(),
            calls: Mutex::new(Vec::new()),
        });
        let accept_state = state.clone();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(serve(socket, accept_state.clone()));
            }
        });
        Proxy { url, state }
    }

    /// Answers the next `times` calls of `operation` with throttling.
    pub fn throttle(&self, operation: &str, times: u32) {
        *self.state.throttle_target.lock().expect("lock") = operation.to_owned();
        self.state.throttled.store(0, Ordering::SeqCst);
        self.state.throttle_left.store(times, Ordering::SeqCst);
    }

    /// How many throttling answers were given since [`Proxy::throttle`].
    pub fn throttled(&self) -> u32 {
        self.state.throttled.load(Ordering::SeqCst)
    }

    /// Forwards the next `times` calls of `operation` to moto, but answers
    /// them with an internal error, as if the answer was lost on the way.
    pub fn lose_answers(&self, operation: &str, times: u32) {
        *self.state.lose_target.lock().expect("lock") = operation.to_owned();
        self.state.lose_left.store(times, Ordering::SeqCst);
    }

    /// Holds the next call of `operation` until [`Proxy::release`].
    pub fn hold(&self, operation: &str) {
        self.hold_after(operation, 0);
    }

    /// Lets `skip` calls of `operation` through, then holds the next one
    /// until [`Proxy::release`].
    pub fn hold_after(&self, operation: &str, skip: u32) {
        *self.state.hold_target.lock().expect("lock") = Some((operation.to_owned(), skip));
    }

    /// Waits until a call is held.
    pub async fn until_held(&self) {
        loop {
            let notified = self.state.holding.notified();
            if self.state.held.load(Ordering::SeqCst) > 0 {
                return;
            }
            tokio::time::timeout(Duration::from_secs(30), notified)
                .await
                .expect("a call reached the proxy");
        }
    }

    pub fn release(&self) {
        self.state.release.notify_one();
    }

    /// The operations of every call forwarded or answered, in order.
    pub fn calls(&self) -> Vec<String> {
        self.state.calls.lock().expect("lock").clone()
    }

    pub fn count(&self, operation: &str) -> usize {
        self.calls().iter().filter(|c| *c == operation).count()
    }
}

/// Reads one HTTP/1.1 message head and body (Content-Length only).
async fn read_message<R: AsyncBufReadExt + Unpin>(reader: &mut R) -> Option<(String, Vec<u8>)> {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).await.ok()? == 0 {
            return None;
        }
        head.push_str(&line);
        if line == "\r\n" {
            break;
        }
    }
    let length = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body).await.ok()?;
    Some((head, body))
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

async fn serve(socket: TcpStream, state: Arc<ProxyState>) {
    let (read, mut write) = socket.into_split();
    let mut reader = BufReader::new(read);
    while let Some((head, body)) = read_message(&mut reader).await {
        // `X-Amz-Target: secretsmanager.GetSecretValue`
        let operation = header(&head, "x-amz-target")
            .and_then(|t| t.rsplit('.').next())
            .unwrap_or("")
            .to_owned();
        state.calls.lock().expect("lock").push(operation.clone());
        let throttle = *state.throttle_target.lock().expect("lock") == operation
            && state
                .throttle_left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
        let response = if throttle {
            state.throttled.fetch_add(1, Ordering::SeqCst);
            let body = r#"{"__type":"ThrottlingException","message":"Rate exceeded"}"#;
            format!(
                "HTTP/1.1 400 Bad Request\r\nContent-Type: application/x-amz-json-1.1\r\n\
                 x-amzn-ErrorType: ThrottlingException\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .into_bytes()
        } else {
            let hold = {
                let mut target = state.hold_target.lock().expect("lock");
                match target.as_mut() {
                    Some((op, 0)) if *op == operation => {
                        *target = None;
                        true
                    }
                    Some((op, skip)) if *op == operation => {
                        *skip -= 1;
                        false
                    }
                    _ => false,
                }
            };
            if hold {
                state.held.fetch_add(1, Ordering::SeqCst);
                state.holding.notify_waiters();
                state.release.notified().await;
            }
            let response = match forward(state.upstream, &head, &body).await {
                Some(response) => response,
                None => return,
            };
            let lose = *state.lose_target.lock().expect("lock") == operation
                && state
                    .lose_left
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok();
            if lose {
                let body = r#"{"__type":"InternalServiceError","message":"lost"}"#;
                format!(
                    "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/x-amz-json-1.1\r\n\
                     Content-Length: {}\r\n\r\n{body}",
                    body.len()
                )
                .into_bytes()
            } else {
                response
            }
        };
        if write.write_all(&response).await.is_err() {
            return;
        }
    }
}

/// Sends one request to moto on a fresh connection and returns its response.
async fn forward(upstream: SocketAddr, head: &str, body: &[u8]) -> Option<Vec<u8>> {
    let mut socket = TcpStream::connect(upstream).await.ok()?;
    socket.write_all(head.as_bytes()).await.ok()?;
    socket.write_all(body).await.ok()?;
    let mut reader = BufReader::new(socket);
    let (head, body) = read_message(&mut reader).await?;
    // The client's connection stays open: drop any `Connection: close`.
    let mut response: Vec<u8> = head
        .split_inclusive("\r\n")
        .filter(|l| !l.to_ascii_lowercase().starts_with("connection:"))
        .collect::<String>()
        .into_bytes();
    response.extend_from_slice(&body);
    Some(response)
}
