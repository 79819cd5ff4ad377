//! Raw Streamable HTTP, as the load's clients speak it: JSON-RPC bodies,
//! SSE responses read event by event, both protocol revisions.

use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};

/// The legacy revision the load's sessions speak.
pub const LEGACY: &str = "2025-11-25";
/// The modern revision of its task and bus clients.
pub const MODERN: &str = "2026-07-28";

/// Why a request failed, as the report counts it.
#[derive(Debug)]
pub enum Failure {
    /// No connection (refused, reset, closed early): the instance is down.
    Connect(String),
    /// An HTTP status other than the one expected.
    Status(u16, String),
    /// No answer in time.
    Timeout,
    /// An answer that is not what the protocol says.
    Protocol(String),
}

impl Failure {
    /// The kind, as the report counts errors.
    pub fn kind(&self) -> String {
        match self {
            Failure::Connect(_) => "connection failed".into(),
            Failure::Status(status, _) => format!("HTTP {status}"),
            Failure::Timeout => "timeout".into(),
            Failure::Protocol(_) => "protocol".into(),
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Connect(e) => write!(f, "connection failed: {e}"),
            Failure::Status(s, body) => write!(f, "HTTP {s}: {body}"),
            Failure::Timeout => write!(f, "timeout"),
            Failure::Protocol(e) => write!(f, "protocol: {e}"),
        }
    }
}

impl std::error::Error for Failure {}

fn from_reqwest(e: reqwest::Error) -> Failure {
    if e.is_timeout() {
        Failure::Timeout
    } else if e.is_connect() || e.is_request() || e.is_body() || cut_short(&e) {
        Failure::Connect(e.to_string())
    } else {
        Failure::Protocol(e.to_string())
    }
}

/// A body that could not be decoded because its connection broke (an
/// instance killed while answering), not because it was malformed: some
/// error under it is an I/O error or says the connection or message ended.
fn cut_short(e: &reqwest::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        let text = cause.to_string();
        if cause.is::<std::io::Error>()
            || text.contains("connection")
            || text.contains("incomplete")
        {
            return true;
        }
        source = cause.source();
    }
    false
}

/// One server-sent event.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// Its id, if it had one.
    pub id: Option<String>,
    /// Its data parsed as JSON; `None` for an event without data (priming).
    pub message: Option<Value>,
}

/// An SSE response, read event by event.
pub struct Sse {
    response: reqwest::Response,
    buffer: String,
}

impl Sse {
    /// The next event; `None` when the stream ended.
    pub async fn next(&mut self, wait: Duration) -> Result<Option<Event>, Failure> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let raw: String = self.buffer.drain(..end + 2).collect();
                let mut id = None;
                let mut data = String::new();
                for line in raw.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        id = Some(v.trim().to_owned());
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim());
                    }
                }
                if id.is_none() && data.is_empty() {
                    continue;
                }
                let message = if data.is_empty() {
                    None
                } else {
                    Some(
                        serde_json::from_str(&data)
                            .map_err(|e| Failure::Protocol(format!("event data: {e}")))?,
                    )
                };
                return Ok(Some(Event { id, message }));
            }
            match tokio::time::timeout_at(deadline, self.response.chunk()).await {
                Err(_) => return Err(Failure::Timeout),
                Ok(Err(e)) => return Err(from_reqwest(e)),
                Ok(Ok(None)) => return Ok(None),
                Ok(Ok(Some(bytes))) => {
                    let text = String::from_utf8_lossy(&bytes);
                    self.buffer.push_str(&text.replace('\r', ""));
                }
            }
        }
    }
}

/// What a POST was answered with.
pub enum Answer {
    /// A JSON body.
    Json(Value),
    /// An SSE stream.
    Stream(Sse),
    /// 202 Accepted, no body.
    Accepted,
}

/// A client of the fleet: one HTTP connection pool and its timeouts.
#[derive(Clone)]
pub struct Wire {
    http: reqwest::Client,
    timeout: Duration,
}

impl Wire {
    /// A client whose every wait is bounded by `timeout`.
    pub fn new(timeout: Duration) -> Result<Wire> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .pool_idle_timeout(Duration::from_secs(30))
            .tcp_nodelay(true)
            .build()
            .context("building the HTTP client")?;
        Ok(Wire { http, timeout })
    }

    /// How long one wait may last.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// POSTs `body` with `headers`; the answer, by its content type.
    pub async fn post(
        &self,
        url: &str,
        headers: &[(&str, &str)],
        body: &Value,
    ) -> Result<Answer, Failure> {
        let mut request = self
            .http
            .post(url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        let response = tokio::time::timeout(self.timeout, request.body(body.to_string()).send())
            .await
            .map_err(|_| Failure::Timeout)?
            .map_err(from_reqwest)?;
        let status = response.status().as_u16();
        if status == 202 {
            return Ok(Answer::Accepted);
        }
        if status != 200 {
            let text = response.text().await.unwrap_or_default();
            return Err(Failure::Status(status, text));
        }
        let sse = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if sse {
            Ok(Answer::Stream(Sse {
                response,
                buffer: String::new(),
            }))
        } else {
            let text = tokio::time::timeout(self.timeout, response.text())
                .await
                .map_err(|_| Failure::Timeout)?
                .map_err(from_reqwest)?;
            serde_json::from_str(&text)
                .map(Answer::Json)
                .map_err(|e| Failure::Protocol(format!("JSON body: {e}")))
        }
    }

    /// POSTs a request and returns its JSON-RPC response (from a JSON body or
    /// the SSE stream that carries it), with the headers the server sent.
    pub async fn rpc(
        &self,
        url: &str,
        headers: &[(&str, &str)],
        body: &Value,
    ) -> Result<Value, Failure> {
        match self.post(url, headers, body).await? {
            Answer::Json(v) => Ok(v),
            Answer::Accepted => Err(Failure::Protocol("202 for a request".into())),
            Answer::Stream(mut sse) => loop {
                match sse.next(self.timeout).await? {
                    Some(Event {
                        message: Some(m), ..
                    }) if m.get("id").is_some() && m.get("method").is_none() => return Ok(m),
                    Some(_) => {}
                    None => {
                        return Err(Failure::Protocol("stream ended without a response".into()));
                    }
                }
            },
        }
    }

    /// A legacy `initialize` then `notifications/initialized` on `url` as
    /// `user`: the session id.
    pub async fn initialize(&self, url: &str, user: &str) -> Result<String, Failure> {
        let body = json!({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {
                "protocolVersion": LEGACY,
                "capabilities": {},
                "clientInfo": { "name": "mcp-persist-load", "version": "1" }
            }
        });
        let mut request = self
            .http
            .post(url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("x-demo-user", user);
        request = request.body(body.to_string());
        let response = tokio::time::timeout(self.timeout, request.send())
            .await
            .map_err(|_| Failure::Timeout)?
            .map_err(from_reqwest)?;
        let status = response.status().as_u16();
        let session = response
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let text = tokio::time::timeout(self.timeout, response.text())
            .await
            .map_err(|_| Failure::Timeout)?
            .map_err(from_reqwest)?;
        if status != 200 {
            return Err(Failure::Status(status, text));
        }
        if !text.contains("\"protocolVersion\"") {
            return Err(Failure::Protocol(format!("initialize answered {text}")));
        }
        let session = session.ok_or_else(|| Failure::Protocol("no Mcp-Session-Id".into()))?;
        let initialized = json!({ "jsonrpc": "2.0", "method": "notifications/initialized" });
        match self
            .post(url, &legacy_headers(user, &session), &initialized)
            .await?
        {
            Answer::Accepted => Ok(session),
            _ => Err(Failure::Protocol(
                "notifications/initialized not accepted".into(),
            )),
        }
    }

    /// A `GET` resuming after `last_event_id` in `session` on `url`.
    pub async fn resume(
        &self,
        url: &str,
        user: &str,
        session: &str,
        last_event_id: &str,
    ) -> Result<Sse, Failure> {
        let request = self
            .http
            .get(url)
            .header("accept", "text/event-stream")
            .header("x-demo-user", user)
            .header("mcp-session-id", session)
            .header("mcp-protocol-version", LEGACY)
            .header("last-event-id", last_event_id);
        let response = tokio::time::timeout(self.timeout, request.send())
            .await
            .map_err(|_| Failure::Timeout)?
            .map_err(from_reqwest)?;
        let status = response.status().as_u16();
        if status != 200 {
            let text = response.text().await.unwrap_or_default();
            return Err(Failure::Status(status, text));
        }
        Ok(Sse {
            response,
            buffer: String::new(),
        })
    }
}

/// The headers of a request in a legacy session.
pub fn legacy_headers<'a>(user: &'a str, session: &'a str) -> [(&'static str, &'a str); 3] {
    [
        ("x-demo-user", user),
        ("mcp-session-id", session),
        ("mcp-protocol-version", LEGACY),
    ]
}

/// The `_meta` every 2026-07-28 request carries (tasks and listening).
pub fn modern_meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientInfo": { "name": "mcp-persist-load", "version": "1" },
        "io.modelcontextprotocol/clientCapabilities": {
            "extensions": { "io.modelcontextprotocol/tasks": {} }
        }
    })
}

/// A 2026-07-28 request body and its headers' values: method and name.
pub fn modern_request(id: u64, method: &str, mut params: Value) -> Value {
    params["_meta"] = modern_meta();
    json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params })
}

/// The headers of a 2026-07-28 request.
pub fn modern_headers<'a>(
    user: &'a str,
    method: &'a str,
    name: Option<&'a str>,
) -> Vec<(&'static str, &'a str)> {
    let mut headers = vec![
        ("x-demo-user", user),
        ("mcp-protocol-version", MODERN),
        ("mcp-method", method),
    ];
    if let Some(name) = name {
        headers.push(("mcp-name", name));
    }
    headers
}

/// The JSON-RPC `result` of `response`, or a protocol failure naming its error.
pub fn result(response: &Value) -> Result<&Value, Failure> {
    match response.get("result") {
        Some(r) => Ok(r),
        None => Err(Failure::Protocol(format!("not a result: {response}"))),
    }
}

/// Fails unless `cond`, with `what`.
pub fn ensure(cond: bool, what: impl FnOnce() -> String) -> Result<(), Failure> {
    if cond {
        Ok(())
    } else {
        Err(Failure::Protocol(what()))
    }
}

/// Parses `answer` text as an anyhow error (for setup steps).
pub fn setup<T>(r: Result<T, Failure>, what: &str) -> Result<T> {
    match r {
        Ok(v) => Ok(v),
        Err(e) => bail!("{what}: {e}"),
    }
}
