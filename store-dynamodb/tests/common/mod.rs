//! What the integration tests share: where moto is, clients and stores on
//! it, the conformance fixture, and a loopback proxy that plays a
//! throttling DynamoDB.
//!
//! `cargo xtask test` starts `moto_server` and passes its address in
//! `MCP_PERSIST_MOTO_URL`. Without it a test fails under CI, and otherwise
//! prints a notice and skips.

#![allow(dead_code, unreachable_pub)]

use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU32, AtomicU64, Ordering},
    },
};

use mcp_persist_store_dynamodb::{
    DynamoStore, DynamoStoreBuilder,
    aws_sdk_dynamodb::{
        Client, Config,
        config::{BehaviorVersion, Credentials, Region},
    },
};
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::{TcpListener, TcpStream},
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
                "{URL_VAR} is not set; under CI the DynamoDB tests must run (start moto with `cargo xtask test`)"
            );
            eprintln!(
                "notice: {URL_VAR} is not set; skipping (run `cargo xtask test` to start moto)"
            );
            None
        }
    }
}

/// A client for `endpoint` in `region` with fake credentials, as tests use.
pub fn client_in(endpoint: &str, region: &str) -> Client {
    let config = Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(region.to_owned()))
        .credentials_provider(Credentials::new("testing", "testing", None, None, "tests"))
        .endpoint_url(endpoint)
        .build();
    Client::from_conf(config)
}

pub fn client(endpoint: &str) -> Client {
    client_in(endpoint, "us-east-1")
}

/// A table name no other test uses.
pub fn unique_table(what: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    format!(
        "t-{what}-{}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0)
    )
}

/// moto counts a binary attribute by its base64 text, so an item holds
/// about three quarters of DynamoDB's 400 KB there.
pub const MOTO_VALUE_LIMIT: usize = 300_000;

pub fn builder(endpoint: &str, table: &str) -> DynamoStoreBuilder {
    DynamoStore::builder(table)
        .client(client(endpoint))
        .poll_interval(std::time::Duration::from_millis(20))
        .max_value_bytes(MOTO_VALUE_LIMIT)
}

/// A fresh table on moto and a store in it.
pub async fn fresh_store(endpoint: &str, what: &str) -> DynamoStore {
    let table = unique_table(what);
    DynamoStore::create_table(&client(endpoint), &table)
        .await
        .unwrap_or_else(|e| panic!("creating the table failed: {e}"));
    builder(endpoint, &table)
        .build()
        .await
        .unwrap_or_else(|e| panic!("opening the store failed: {e}"))
}

/// Opens the conformance suite's store at a place: its own table, created
/// (idempotently) by whoever opens it first, as a deployment's setup step
/// would. A missing moto is a failure that says how to start it.
pub async fn open_at(
    place: mcp_persist_core::conformance::crash::Place,
) -> Result<DynamoStore, mcp_persist_core::Error> {
    let url = std::env::var(URL_VAR).unwrap_or_default();
    assert!(
        !url.trim().is_empty(),
        "{URL_VAR} is not set: start moto with `cargo xtask services` (or run `cargo xtask test`)"
    );
    let table = format!("mcp-{}", place.name);
    DynamoStore::create_table(&client(url.trim()), &table).await?;
    builder(url.trim(), &table).build().await
}

/// A loopback HTTP proxy in front of moto that answers calls of one
/// DynamoDB operation with `ThrottlingException` while its budget lasts,
/// and counts the calls that reach it.
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

    /// Forwards the next `times` calls of `operation` to moto, but answers
    /// them with an internal error, as if the answer was lost on the way.
    pub fn lose_answers(&self, operation: &str, times: u32) {
        *self.state.lose_target.lock().expect("lock") = operation.to_owned();
        self.state.lose_left.store(times, Ordering::SeqCst);
    }

    /// How many throttling answers were given since [`Proxy::throttle`].
    pub fn throttled(&self) -> u32 {
        self.state.throttled.load(Ordering::SeqCst)
    }

    /// How many calls of `operation` reached the proxy.
    pub fn count(&self, operation: &str) -> usize {
        self.state
            .calls
            .lock()
            .expect("lock")
            .iter()
            .filter(|c| *c == operation)
            .count()
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

async fn serve(socket: TcpStream, state: Arc<ProxyState>) {
    let (read, mut write) = socket.into_split();
    let mut reader = BufReader::new(read);
    while let Some((head, body)) = read_message(&mut reader).await {
        // `X-Amz-Target: DynamoDB_20120810.UpdateItem`
        let operation = head
            .lines()
            .find_map(|l| {
                let (n, v) = l.split_once(':')?;
                n.eq_ignore_ascii_case("x-amz-target").then(|| v.trim())
            })
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
            let body = r#"{"__type":"com.amazonaws.dynamodb.v20120810#ThrottlingException","message":"Rate of requests exceeds the allowed throughput."}"#;
            format!(
                "HTTP/1.1 400 Bad Request\r\nContent-Type: application/x-amz-json-1.0\r\n\
                 Content-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .into_bytes()
        } else {
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
                let body = r#"{"__type":"com.amazonaws.dynamodb.v20120810#InternalServerError","message":"lost"}"#;
                format!(
                    "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/x-amz-json-1.0\r\n\
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
