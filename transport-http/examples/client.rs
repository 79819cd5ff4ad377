//! A durable MCP client: connects, calls tools, and survives a restart.
//!
//! ```text
//! cargo run -p mcp-persist-transport-http --example client -- \
//!     --url http://127.0.0.1:8080/mcp --store ./client-state.db [--backend sqlite|file] \
//!     [--profile default] <command>
//!
//! commands:
//!   status                 what is stored for the server (no network call)
//!   tools                  list the server's tools
//!   call <tool> [json]     call a tool with JSON arguments
//!   task <tool> [json]     call a tool that runs as a task, and poll it to its end
//!   recover                collect the answers of requests a previous run left in flight
//!   end                    end the session (DELETE) and forget it
//! ```
//!
//! Run `call` twice, or kill it during a slow call and run `recover`: the
//! second run sends no `initialize` and continues the stored session.

use std::sync::Arc;

use anyhow::{Context, Result, bail};
use mcp_persist_core::{KvStore, Stores};
use mcp_persist_transport_http::client::{
    DurableClientBuilder, RecoveredMessage, Recovery, TaskOutcome,
};
use rmcp::{
    ClientHandler, ServiceExt,
    model::{
        CallToolRequestParams, CallToolResponse, ClientCapabilities, ClientConfig, GetTaskParams,
        Implementation,
    },
};

/// The demo client's handler: it declares the tasks extension, so servers
/// may answer its tool calls with tasks.
#[derive(Clone)]
struct DemoClient;

impl ClientHandler for DemoClient {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::builder().enable_tasks().build(),
            Implementation::new("mcp-persist-demo-client", env!("CARGO_PKG_VERSION")),
        )
    }
}

struct Args {
    url: String,
    store: String,
    backend: String,
    profile: String,
    command: Vec<String>,
}

fn parse_args() -> Result<Args> {
    let mut url = None;
    let mut store = None;
    let mut backend = "sqlite".to_owned();
    let mut profile = "default".to_owned();
    let mut command = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--url" => url = args.next(),
            "--store" => store = args.next(),
            "--backend" => backend = args.next().context("--backend needs a value")?,
            "--profile" => profile = args.next().context("--profile needs a value")?,
            "-h" | "--help" => {
                println!(
                    "usage: client --url URL --store PATH [--backend sqlite|file] [--profile NAME] \
                     status|tools|call <tool> [json]|task <tool> [json]|recover|end"
                );
                std::process::exit(0);
            }
            _ => command.push(arg),
        }
    }
    Ok(Args {
        url: url.context("--url is required")?,
        store: store.context("--store is required")?,
        backend,
        profile,
        command,
    })
}

async fn open(backend: &str, path: &str) -> Result<Stores> {
    Ok(match backend {
        "sqlite" => Stores::new(mcp_persist_store_sqlite::SqliteStore::open(path).await?),
        "file" => {
            let kv: Arc<dyn KvStore> =
                Arc::new(mcp_persist_store_file::FileStore::open(path).await?);
            Stores::from_parts(kv, None)
        }
        other => bail!("unknown backend {other:?}: use sqlite or file"),
    })
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "mcp_persist_transport_http=info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = parse_args()?;
    let stores = open(&args.backend, &args.store).await?;
    let (transport, handle) = DurableClientBuilder::new(&args.url, &stores)
        .profile(&args.profile)
        .build()
        .await?;
    let command: Vec<&str> = args.command.iter().map(String::as_str).collect();

    match command.as_slice() {
        ["status"] | [] => {
            println!("start: {:?}", handle.start());
            println!("session: {:?}", handle.session_id());
            if let Some(info) = handle.initialize_result() {
                println!(
                    "server: {} {} (protocol {})",
                    info.server_info.name,
                    info.server_info.version,
                    info.protocol_version.as_str()
                );
                if let Some(instructions) = info.instructions {
                    println!("instructions: {instructions}");
                }
            }
            for request in handle.interrupted() {
                println!("interrupted: id {} {}", request.id, request.method);
            }
            return Ok(());
        }
        ["end"] => {
            handle.end_session().await?;
            println!("session ended");
            return Ok(());
        }
        _ => {}
    }

    let client = DemoClient.serve(transport).await?;
    match command.as_slice() {
        ["tools"] => {
            for tool in client.list_all_tools().await? {
                println!("{}: {}", tool.name, tool.description.unwrap_or_default());
            }
        }
        ["call", tool, rest @ ..] => {
            let mut params = CallToolRequestParams::new(tool.to_string());
            if let Some(json) = rest.first() {
                let value: serde_json::Value = serde_json::from_str(json)?;
                params = params.with_arguments(
                    value
                        .as_object()
                        .cloned()
                        .context("arguments must be a JSON object")?,
                );
            }
            let result = client.call_tool(params).await?;
            println!("{}", serde_json::to_string(&result)?);
        }
        ["task", tool, rest @ ..] => {
            let mut params = CallToolRequestParams::new(tool.to_string());
            if let Some(json) = rest.first() {
                let value: serde_json::Value = serde_json::from_str(json)?;
                params = params.with_arguments(
                    value
                        .as_object()
                        .cloned()
                        .context("arguments must be a JSON object")?,
                );
            }
            match client.peer().call_tool_once(params).await? {
                CallToolResponse::Task(created) => {
                    // The task id is in the journal before anything else.
                    handle.flush().await;
                    let id = created.task.task_id.clone();
                    println!("task {id} created");
                    loop {
                        let got = client
                            .peer()
                            .get_task(GetTaskParams::new(id.clone()))
                            .await?;
                        let status = got.task.status();
                        println!(
                            "task {id}: {status:?} {}",
                            got.task.task.status_message.clone().unwrap_or_default()
                        );
                        if status.is_terminal() {
                            println!("task {id}: final {}", serde_json::to_string(&got)?);
                            break;
                        }
                        let every = got
                            .task
                            .task
                            .poll_interval_ms
                            .unwrap_or(500)
                            .clamp(50, 5_000);
                        tokio::time::sleep(std::time::Duration::from_millis(every)).await;
                    }
                }
                CallToolResponse::Complete(result) => {
                    println!("{}", serde_json::to_string(&result)?);
                }
                other => println!("not a task: {other:?}"),
            }
        }
        ["recover"] => {
            for recovery in handle.recover() {
                match recovery {
                    Recovery::Resumable(resumed) => {
                        let id = resumed.request().id.clone();
                        let (seen, answer) = resumed.collect().await?;
                        for message in seen {
                            match message {
                                RecoveredMessage::Progress(p) => {
                                    println!("request {id}: missed {}", serde_json::to_string(&p)?)
                                }
                                RecoveredMessage::Notification(n) => {
                                    println!("request {id}: missed {}", serde_json::to_string(&n)?)
                                }
                                _ => {}
                            }
                        }
                        match answer {
                            Ok(result) => {
                                println!("request {id}: answer {}", serde_json::to_string(&result)?)
                            }
                            Err(error) => println!("request {id}: error {error}"),
                        }
                    }
                    Recovery::Task(task) => {
                        let id = task.request().id.clone();
                        match task.collect_with(client.peer()).await? {
                            TaskOutcome::Answer(Ok(result)) => {
                                println!("request {id}: answer {}", serde_json::to_string(&result)?)
                            }
                            TaskOutcome::Answer(Err(error)) => {
                                println!("request {id}: error {error}")
                            }
                            TaskOutcome::InputRequired(requests) => println!(
                                "request {id}: task {} waits for input {}",
                                task.task_id(),
                                serde_json::to_string(&requests)?
                            ),
                            other => println!("request {id}: task ended: {other:?}"),
                        }
                    }
                    Recovery::Lost {
                        request, reason, ..
                    } => {
                        println!(
                            "request {}: lost ({reason}) {} {}; not sent again",
                            request.id,
                            request.method,
                            request.params.clone().unwrap_or_default()
                        );
                        handle.dismiss(&request);
                    }
                    _ => {}
                }
            }
        }
        other => bail!("unknown command {other:?}; try --help"),
    }
    handle.flush().await;
    // Closing keeps the session for the next run.
    client.cancel().await?;
    Ok(())
}
