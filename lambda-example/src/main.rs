//! `mcp-lambda-example`: the MCP server of this crate as an AWS Lambda
//! function (`lambda_http`, buffered responses), or with `--listen ADDR`
//! as a local HTTP server on the same store.
//!
//! Configuration comes from the environment ([`Settings`]): `MCP_STORE_URL`
//! (say `dynamodb://mcp-state?region=eu-west-1`; the table is made once
//! with `DynamoStore::create_table` or a URL with `create=1`),
//! `MCP_ALLOWED_HOSTS` (the function URL's host), and the AWS variables the
//! Lambda service sets. Logs go to stderr (`RUST_LOG`).

use std::{process::ExitCode, sync::Arc};

use bytes::Bytes;
use lambda_http::{Body, service_fn};
use mcp_persist_lambda_example::{Function, Settings, serve_http};

async fn run() -> anyhow::Result<()> {
    let settings = Settings::from_env()?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, address] = args.as_slice()
        && flag == "--listen"
    {
        return serve_http(settings, address).await;
    }
    if !args.is_empty() {
        anyhow::bail!("usage: mcp-lambda-example [--listen HOST:PORT]");
    }
    let function = Arc::new(Function::new(settings));
    lambda_http::run(service_fn(move |request: lambda_http::Request| {
        let function = function.clone();
        async move {
            let (parts, body) = request.into_parts();
            let request = http::Request::from_parts(parts, Bytes::copy_from_slice(body.as_ref()));
            let response = function
                .invoke(request)
                .await
                .map_err(|e| -> lambda_http::Error { format!("{e:#}").into() })?;
            let (parts, body) = response.into_parts();
            let body = if body.is_empty() {
                Body::Empty
            } else {
                match String::from_utf8(body.to_vec()) {
                    Ok(text) => Body::Text(text),
                    Err(e) => Body::Binary(e.into_bytes()),
                }
            };
            Ok::<_, lambda_http::Error>(lambda_http::Response::from_parts(parts, body))
        }
    }))
    .await
    .map_err(|e| anyhow::anyhow!("the Lambda runtime stopped: {e}"))
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .without_time()
        .init();
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mcp-lambda-example: {e:#}");
            ExitCode::FAILURE
        }
    }
}
