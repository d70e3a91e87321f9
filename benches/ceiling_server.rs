//! The loopback HTTP ceiling: what a check could cost over HTTP/1.1 if the limiter were free.
//!
//! A minimal hyper 1 server on the tokio multi-thread runtime, with gossamer's accept loop
//! shape (TCP_NODELAY, keep-alive, one task per connection). `POST /v1/check` reads the body,
//! parses gossamer's JSON shape (`{"rule","key","cost","wait_ms"}`, strings borrowed from the
//! body) with serde_json, and answers a fixed 200 with a JSON body of the same length and the
//! same headers as gossamer's answer to an admitted check on the built-in `default` rule for a
//! 12-byte key. No rule, store, clock or metrics: `benches/http_load.sh` compares gossamer
//! against it.
//!
//! Usage: `cargo run --release --example ceiling_server -- --http 127.0.0.1:17071`

use std::borrow::Cow;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::ExitCode;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use tokio::net::TcpListener;

/// Gossamer's answer to `{"rule":"default","key":"user-0001234"}` on a fresh key, byte for
/// byte (the same length as for any 12-byte key with two-digit `remaining` and `reset_after_ms`).
const BODY: &[u8] = br#"{"allowed":true,"rule":"default","key":"user-0001234","limit":100,"remaining":99,"reset_after_ms":10,"retry_after_ms":0,"outcome":"allowed"}"#;

static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
static RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("ratelimit-limit");
static RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("ratelimit-remaining");
static RATELIMIT_RESET: HeaderName = HeaderName::from_static("ratelimit-reset");

/// The check body, as gossamer accepts it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // parsed to pay for parsing, never used
struct CheckBody<'a> {
    #[serde(borrow, default)]
    rule: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    key: Option<Cow<'a, str>>,
    #[serde(default)]
    cost: Option<u64>,
    #[serde(default)]
    wait_ms: Option<u64>,
}

fn empty(status: StatusCode) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = status;
    response
}

async fn handle(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    if request.uri().path() != "/v1/check" {
        return Ok(empty(StatusCode::NOT_FOUND));
    }
    if request.method() != Method::POST {
        return Ok(empty(StatusCode::METHOD_NOT_ALLOWED));
    }
    let body = match request.into_body().collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return Ok(empty(StatusCode::BAD_REQUEST)),
    };
    let parsed: CheckBody<'_> = match serde_json::from_slice(&body) {
        Ok(parsed) => parsed,
        Err(_) => return Ok(empty(StatusCode::BAD_REQUEST)),
    };
    if parsed.rule.is_none() || parsed.key.is_none() {
        return Ok(empty(StatusCode::BAD_REQUEST));
    }
    let mut response = Response::new(Full::new(Bytes::from_static(BODY)));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(
        RATELIMIT_POLICY.clone(),
        HeaderValue::from_static("\"default\";q=100;w=1"),
    );
    headers.insert(
        RATELIMIT.clone(),
        HeaderValue::from_static("\"default\";r=99;t=1"),
    );
    headers.insert(RATELIMIT_LIMIT.clone(), HeaderValue::from_static("100"));
    headers.insert(RATELIMIT_REMAINING.clone(), HeaderValue::from_static("99"));
    headers.insert(RATELIMIT_RESET.clone(), HeaderValue::from_static("1"));
    Ok(response)
}

fn parse_args() -> Result<SocketAddr, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [flag, addr] if flag == "--http" => addr
            .parse()
            .map_err(|e| format!("bad address {addr:?}: {e}")),
        _ => Err("usage: ceiling_server --http ADDR".into()),
    }
}

async fn serve(addr: SocketAddr) -> std::io::Result<()> {
    let listener = TcpListener::bind(addr).await?;
    eprintln!("ceiling_server listening on {}", listener.local_addr()?);
    let mut builder = http1::Builder::new();
    builder.keep_alive(true);
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                eprintln!("accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let connection = builder.serve_connection(TokioIo::new(stream), service_fn(handle));
        tokio::spawn(async move {
            let _ = connection.await;
        });
    }
}

fn main() -> ExitCode {
    let addr = match parse_args() {
        Ok(addr) => addr,
        Err(e) => {
            eprintln!("ceiling_server: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ceiling_server: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(serve(addr)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ceiling_server: {e}");
            ExitCode::from(2)
        }
    }
}
