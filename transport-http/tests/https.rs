//! The durable client over HTTPS: a durable server behind TLS on loopback,
//! with a certificate made by the test, and a tool call end to end.
//!
//! What it proves: a default build (feature `rustls`) speaks `https`, and a
//! configured `reqwest::Client` (here trusting only the test's certificate)
//! goes through `DurableClientBuilder::build_with_client`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{net::SocketAddr, sync::Arc};

use mcp_persist_core::{MemoryStore, Stores};
use mcp_persist_transport_http::{client::DurableClientBuilder, server::DurableServer};
use rmcp::{
    ErrorData, RoleServer, ServerHandler, ServiceExt,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult,
        PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
    },
    service::RequestContext,
};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, rustls, server::TlsStream};

/// Answers `echo` with its arguments as JSON text.
#[derive(Clone)]
struct Echo;

impl ServerHandler for Echo {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let schema = Arc::new(
            serde_json::json!({"type": "object"})
                .as_object()
                .cloned()
                .unwrap(),
        );
        Ok(ListToolsResult::with_all_items(vec![Tool::new(
            "echo", "echoes", schema,
        )]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let text = serde_json::to_string(&request.arguments).unwrap();
        Ok(CallToolResult::success(vec![ContentBlock::text(text)]).into())
    }
}

/// A TCP listener that completes a TLS handshake before handing a
/// connection to axum; a failed handshake is dropped and the next one taken.
struct TlsListener {
    tcp: TcpListener,
    tls: TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((stream, addr)) = self.tcp.accept().await else {
                continue;
            };
            match self.tls.accept(stream).await {
                Ok(tls) => return (tls, addr),
                Err(e) => eprintln!("TLS handshake from {addr} failed: {e}"),
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_client_calls_a_tool_over_https() {
    // A self-signed certificate for the loopback names, made here.
    let certified =
        rcgen::generate_simple_self_signed(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .expect("certificate");
    let cert_der = certified.cert.der().clone();
    let key_der = rustls::pki_types::PrivateKeyDer::try_from(certified.signing_key.serialize_der())
        .expect("private key");

    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut server_tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_no_client_auth()
        .with_single_cert(vec![cert_der], key_der)
        .expect("server TLS config");
    server_tls.alpn_protocols = vec![b"http/1.1".to_vec()];

    let server = DurableServer::builder(Stores::new(MemoryStore::new()))
        .build()
        .expect("server");
    let app = axum::Router::new().nest_service("/mcp", server.service(|| Ok(Echo)));
    let listener = TlsListener {
        tcp: TcpListener::bind("127.0.0.1:0").await.expect("bind"),
        tls: TlsAcceptor::from(Arc::new(server_tls)),
    };
    let port = listener.tcp.local_addr().expect("address").port();
    let serving = tokio::spawn(async move { axum::serve(listener, app).await });

    // The client trusts the test's certificate and nothing else.
    let http = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(certified.cert.pem().as_bytes()).unwrap()])
        .pool_max_idle_per_host(0)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("reqwest client");
    let stores = Stores::new(MemoryStore::new());
    let url = format!("https://localhost:{port}/mcp");
    let (transport, _handle) = DurableClientBuilder::new(&url, &stores)
        .build_with_client(http)
        .await
        .expect("durable client");
    let client = ().serve(transport).await.expect("initialize over https");

    let answer = client
        .call_tool(
            CallToolRequestParams::new("echo").with_arguments(
                serde_json::json!({"over": "tls"})
                    .as_object()
                    .cloned()
                    .unwrap(),
            ),
        )
        .await
        .expect("tool call over https");
    assert_eq!(answer.is_error, Some(false));
    let text = answer.content[0]
        .as_text()
        .expect("text content")
        .text
        .clone();
    assert_eq!(text, r#"{"over":"tls"}"#);

    client.cancel().await.expect("close the client");
    serving.abort();
}
