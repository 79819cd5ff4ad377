//! What a client sees when it moves between instances: the SSE retry
//! interval the server was configured with on every stream, and a session
//! DELETE answered with a status every official SDK accepts.

mod support;

use mcp_persist_core::{MemoryStore, Stores};
use support::{Instance, raw_initialize, run_demo_server_if_asked};

#[test]
fn demo_server_process() {
    run_demo_server_if_asked();
}

/// The `retry:` values in an SSE body.
fn retries(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("retry:"))
        .map(|v| v.trim().to_owned())
        .collect()
}

async fn post_body(
    http: &reqwest::Client,
    url: &str,
    session: Option<&str>,
) -> anyhow::Result<String> {
    let mut request = http
        .post(url)
        .header("x-demo-user", "alice")
        .header("mcp-protocol-version", "2025-11-25")
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json");
    let body = match session {
        Some(session) => {
            request = request.header("mcp-session-id", session);
            serde_json::json!({"jsonrpc": "2.0", "id": 7, "method": "tools/list"})
        }
        None => serde_json::json!({
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "retry-test", "version": "1"}}
        }),
    };
    Ok(request.body(body.to_string()).send().await?.text().await?)
}

/// The configured interval, not rmcp's 3 s default, on POST and GET streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_retry_on_every_stream() -> anyhow::Result<()> {
    for configured in ["750", "200"] {
        let instance = Instance::in_process(
            Stores::new(MemoryStore::new()),
            &["--sse-retry-ms", configured],
        )
        .await?;
        let http = reqwest::Client::new();
        let url = instance.url();
        let init = post_body(&http, &url, None).await?;
        assert_eq!(
            retries(&init),
            vec![configured.to_owned()],
            "initialize: {init}"
        );
        let session = raw_initialize(&http, &url, "alice").await?;
        let post = post_body(&http, &url, Some(&session)).await?;
        assert_eq!(retries(&post), vec![configured.to_owned()], "POST: {post}");
        // The standalone GET stream: read its first event only.
        let mut get = http
            .get(&url)
            .header("x-demo-user", "alice")
            .header("mcp-session-id", &session)
            .header("mcp-protocol-version", "2025-11-25")
            .header("accept", "text/event-stream")
            .send()
            .await?;
        let first = tokio::time::timeout(std::time::Duration::from_secs(5), get.chunk())
            .await??
            .unwrap_or_default();
        let first = String::from_utf8_lossy(&first);
        assert_eq!(retries(&first), vec![configured.to_owned()], "GET: {first}");
    }
    Ok(())
}

/// DELETE of a session answers 204: the Python SDK accepts only 200 and
/// 204; an unknown id gets the same answer, so nothing tells them apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_answers_a_status_every_sdk_accepts() -> anyhow::Result<()> {
    let instance = Instance::in_process(Stores::new(MemoryStore::new()), &[]).await?;
    let http = reqwest::Client::new();
    let url = instance.url();
    let session = raw_initialize(&http, &url, "alice").await?;
    let delete = |id: String| {
        let (http, url) = (http.clone(), url.clone());
        async move {
            let r = http
                .delete(&url)
                .header("x-demo-user", "alice")
                .header("mcp-session-id", id)
                .header("mcp-protocol-version", "2025-11-25")
                .send()
                .await?;
            anyhow::Ok((r.status().as_u16(), r.text().await?))
        }
    };
    let own = delete(session.clone()).await?;
    assert_eq!(own.0, 204, "{own:?}");
    let again = delete(session).await?;
    let unknown = delete("0123456789abcdef".into()).await?;
    assert_eq!(again, unknown);
    assert!(matches!(unknown.0, 200 | 204 | 404), "{unknown:?}");
    Ok(())
}
