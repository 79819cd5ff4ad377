//! A resumed stream that ends before any new event still tells the client
//! where it is: every resumed stream starts with a priming event carrying
//! the resumed-from id, so a client that only keeps the ids it saw on the
//! stream it reads (the TypeScript SDK does) resumes from the same place,
//! on any instance, and gets the rest of the call exactly once.

use std::time::Duration;

use crate::support::{Instance, raw_initialize_as};
use anyhow::Context as _;
use mcp_persist_core::{MemoryStore, Stores};
use serde_json::{Value, json};

/// One SSE event as a client reads it.
#[derive(Debug, Clone, Default, PartialEq)]
struct Event {
    id: Option<String>,
    data: String,
    retry: Option<u64>,
}

/// Splits complete SSE events off the front of `buffer`.
fn take_events(buffer: &mut String) -> Vec<Event> {
    let mut events = Vec::new();
    while let Some(end) = buffer.find("\n\n") {
        let block: String = buffer.drain(..end + 2).collect();
        let mut event = Event::default();
        let mut seen = false;
        for line in block.lines() {
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "id" => {
                    event.id = Some(value.to_owned());
                    seen = true;
                }
                "data" => {
                    if !event.data.is_empty() {
                        event.data.push('\n');
                    }
                    event.data.push_str(value);
                    seen = true;
                }
                "retry" => {
                    event.retry = value.parse().ok();
                    seen = true;
                }
                _ => {}
            }
        }
        if seen {
            events.push(event);
        }
    }
    events
}

/// Reads `response` to its end, as SSE events.
async fn read_all(mut response: reqwest::Response) -> anyhow::Result<Vec<Event>> {
    let mut buffer = String::new();
    let mut events = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        buffer.push_str(std::str::from_utf8(&chunk)?);
        events.extend(take_events(&mut buffer));
    }
    Ok(events)
}

async fn resume(
    http: &reqwest::Client,
    url: &str,
    session: &str,
    last_event_id: &str,
) -> anyhow::Result<Vec<Event>> {
    let response = http
        .get(url)
        .header("x-demo-user", "alice")
        .header("mcp-session-id", session)
        .header("mcp-protocol-version", "2025-11-25")
        .header("accept", "text/event-stream")
        .header("last-event-id", last_event_id)
        .send()
        .await?;
    anyhow::ensure!(
        response.status() == 200,
        "resume answered {}",
        response.status()
    );
    read_all(response).await
}

/// The message an event carries, if any.
fn message(event: &Event) -> Option<Value> {
    if event.data.trim().is_empty() {
        None
    } else {
        serde_json::from_str(&event.data).ok()
    }
}

/// A call runs on A; its client keeps only the ids of the stream it reads,
/// and resumes on B, whose tail window (300 ms) is shorter than the pause
/// between two progress notifications (900 ms). Each resumed stream that
/// ends silently must start with the resumed-from id, so the client can
/// resume from it again; in the end every notification and the answer
/// arrive exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_resumed_stream_keeps_the_clients_place_on_any_instance() -> anyhow::Result<()> {
    let stores = Stores::new(MemoryStore::new());
    let args = ["--tail-idle-ms", "300", "--sse-retry-ms", "50"];
    let a = Instance::in_process(stores.clone(), &args).await?;
    let b = Instance::in_process(stores, &args).await?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()?;
    let session = raw_initialize_as(&http, &a.url(), "alice", "priming-test").await?;

    // The call on A: four steps 900 ms apart. Read it up to the first
    // progress notification, then drop the connection.
    let mut response = http
        .post(a.url())
        .header("x-demo-user", "alice")
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", "2025-11-25")
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .body(
            json!({
                "jsonrpc": "2.0", "id": 7, "method": "tools/call",
                "params": {
                    "name": "slow_progress",
                    "arguments": {"count": 4, "delay_ms": 900, "tag": "p"},
                    "_meta": {"progressToken": "tok"}
                }
            })
            .to_string(),
        )
        .send()
        .await?;
    anyhow::ensure!(
        response.status() == 200,
        "call answered {}",
        response.status()
    );
    let mut buffer = String::new();
    let first = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let chunk = response
                .chunk()
                .await?
                .context("the call's stream ended before its first progress")?;
            buffer.push_str(std::str::from_utf8(&chunk)?);
            for event in take_events(&mut buffer) {
                if message(&event).is_some_and(|m| m["method"] == "notifications/progress") {
                    return anyhow::Ok(event);
                }
            }
        }
    })
    .await
    .context("no first progress within 20 s")??;
    drop(response);
    let mut progress = vec![message(&first).context("first")?["params"]["progress"].clone()];
    let mut last_id = first.id.clone().context("the progress event has an id")?;

    // Resume on B, as a client that keeps only what each stream shows it.
    let mut answer = None;
    let mut silent_streams = 0;
    for _ in 0..100 {
        let events = resume(&http, &b.url(), &session, &last_id).await?;
        let head = events
            .first()
            .with_context(|| format!("the stream resumed after {last_id} carried no event"))?;
        assert_eq!(
            head.id.as_deref(),
            Some(last_id.as_str()),
            "a resumed stream starts with the resumed-from id: {events:?}"
        );
        assert!(
            message(head).is_none(),
            "the priming event carries no message: {head:?}"
        );
        assert_eq!(head.retry, Some(50), "it carries the retry hint: {head:?}");
        if events.len() == 1 {
            silent_streams += 1;
        }
        // What the client keeps: the last id it saw on this stream.
        for event in &events {
            if let Some(id) = &event.id {
                last_id = id.clone();
            }
            let Some(message) = message(event) else {
                continue;
            };
            if message["method"] == "notifications/progress" {
                progress.push(message["params"]["progress"].clone());
            } else if message["id"] == 7 {
                assert!(answer.is_none(), "the answer arrived twice");
                answer = Some(message);
            }
        }
        if answer.is_some() {
            break;
        }
    }
    let answer = answer.context("the answer never arrived")?;
    assert_eq!(answer["result"]["content"][0]["text"], "done p", "{answer}");
    assert_eq!(
        progress,
        vec![json!(1.0), json!(2.0), json!(3.0), json!(4.0)],
        "every progress notification exactly once, in order"
    );
    assert!(
        silent_streams > 0,
        "the scenario had a resumed stream that ended with nothing new"
    );
    Ok(())
}
