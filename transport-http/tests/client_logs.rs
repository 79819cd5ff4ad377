//! Every line the durable client logs carries the `tracing` span of the
//! client it comes from, `mcp_persist_client{server=… profile=…}`, and
//! only that one: two clients of one process (two profiles of one server)
//! are told apart by their spans, across a fresh start, a resume, a 404 and
//! an ended session, and no line repeats the server in its own fields.
//!
//! Its own test binary, so that the global subscriber sees every event: a
//! subscriber set for one thread misses the events whose callsite a test on
//! another thread reached first.

mod client_support;

use std::{
    io::Write,
    sync::{Arc, Mutex},
};

use mcp_persist_core::MemoryStore;
use mcp_persist_transport_http::client::{ClientHandle, DurableClientBuilder, DurableTransport};
use rmcp::{ServiceExt, model::CallToolRequestParams};
use serde_json::json;

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log buffer").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn echo(n: i64) -> CallToolRequestParams {
    CallToolRequestParams::new("echo")
        .with_arguments(json!({ "n": n }).as_object().cloned().expect("object"))
}

type Transport = DurableTransport;

async fn build(url: &str, store: &Arc<MemoryStore>, profile: &str) -> (Transport, ClientHandle) {
    DurableClientBuilder::new(url, store.clone())
        .profile(profile)
        .build()
        .await
        .expect("build")
}

/// One process of one client: a call, then a close that keeps the session.
async fn call_once(transport: Transport, handle: &ClientHandle, n: i64) {
    let client = ().serve(transport).await.expect("serve");
    client.call_tool(echo(n)).await.expect("echo");
    handle.flush().await;
    client.cancel().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_line_a_client_logs_carries_its_own_span() {
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("mcp_persist_transport_http::client=debug")
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    tracing::subscriber::set_global_default(subscriber).expect("first subscriber");

    let server = client_support::start_server(1).await;
    let store = Arc::new(MemoryStore::new());

    // First processes: two fresh sessions, one per profile.
    let (ta, a) = build(&server.url, &store, "a").await;
    let (tb, b) = build(&server.url, &store, "b").await;
    tokio::join!(call_once(ta, &a, 1), call_once(tb, &b, 2));
    drop((a, b));

    // The server forgets both; the next processes resume, meet the 404,
    // re-initialize, and `a` ends its new session.
    server.forget_all_sessions().await;
    let (ta, a) = build(&server.url, &store, "a").await;
    let (tb, b) = build(&server.url, &store, "b").await;
    tokio::join!(call_once(ta, &a, 3), call_once(tb, &b, 4));
    a.end_session().await.expect("end session");
    drop((a, b));

    // And `a` starts fresh after that.
    let (_ta, a) = build(&server.url, &store, "a").await;
    a.flush().await;

    let text = String::from_utf8(logs.0.lock().expect("logs").clone()).expect("utf-8");
    let span_of = |profile: &str| {
        format!(
            "mcp_persist_client{{server={} profile={profile}}}",
            server.url
        )
    };
    let lines: Vec<&str> = text.lines().collect();
    assert!(!lines.is_empty(), "the client logged nothing");
    for line in &lines {
        assert_eq!(
            line.matches("mcp_persist_client{").count(),
            1,
            "a line outside exactly one client span: {line}\n{text}"
        );
        let (_, own) = line.rsplit_once("}: ").expect("a line in a span");
        assert!(
            !own.contains(server.url.as_str()),
            "the server repeated in a line's own fields: {line}"
        );
    }
    let expected: &[(&str, &[&str])] = &[
        (
            "a",
            &[
                "no stored session",
                "new session initialized",
                "resuming stored session",
                "answered 404",
                "session ended by the application",
            ],
        ),
        (
            "b",
            &[
                "no stored session",
                "new session initialized",
                "resuming stored session",
                "answered 404",
            ],
        ),
    ];
    for (profile, messages) in expected {
        let span = span_of(profile);
        let own: Vec<&&str> = lines.iter().filter(|l| l.contains(&span)).collect();
        for message in *messages {
            assert!(
                own.iter().any(|l| l.contains(message)),
                "no `{message}` in the span of profile {profile}:\n{text}"
            );
        }
    }
    assert!(
        !lines
            .iter()
            .any(|l| l.contains(&span_of("b")) && l.contains("ended by the application")),
        "b's span carries a's end of session:\n{text}"
    );
}
