//! One bare HTTP/1.1 connection to a node, reused for every request, answering the whole
//! reply (status, headers, body) rather than a decision: for tools, benchmarks and tests that
//! look at the node's HTTP API itself (`gossamer demo`, the node's black-box tests). Apps
//! want [`Client`](crate::Client).

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{HeaderMap, Method, Request, StatusCode};

use crate::endpoint::Endpoint;
use crate::pool::{OpenError, Sender, open};

/// Why a request could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The URL is not `http://host[:port][/...]`.
    #[error("invalid URL {0:?}: expected http://host:port")]
    Url(String),
    /// Connecting failed.
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        /// Where.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// The HTTP exchange failed.
    #[error("HTTP error: {0}")]
    Http(#[from] hyper::Error),
    /// A request could not be built.
    #[error("invalid request: {0}")]
    Request(#[from] hyper::http::Error),
}

/// A response, fully read.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: HeaderMap,
    /// The body.
    pub body: Bytes,
}

impl Reply {
    /// The body parsed as JSON (`Null` if it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }

    /// A header as a string, if present and readable.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// A connection to one node.
#[derive(Debug)]
pub struct Client {
    host: String,
    sender: Sender,
}

impl Client {
    /// Connects to `url` (`http://host[:port]`; a path is ignored: requests name theirs).
    pub async fn connect(url: &str) -> Result<Client, ClientError> {
        let endpoint = Endpoint::parse(url).map_err(|_| ClientError::Url(url.to_owned()))?;
        let sender = open(&endpoint.authority).await.map_err(|e| match e {
            OpenError::Connect(source) => ClientError::Connect {
                addr: endpoint.authority.clone(),
                source,
            },
            OpenError::Handshake(e) => ClientError::Http(e),
        })?;
        Ok(Client {
            host: endpoint.authority,
            sender,
        })
    }

    /// Connects to a node listening at `addr`.
    pub async fn connect_addr(addr: SocketAddr) -> Result<Client, ClientError> {
        Client::connect(&format!("http://{addr}")).await
    }

    /// Sends one request and reads the whole response.
    pub async fn send(
        &mut self,
        method: Method,
        path: &str,
        body: impl Into<Bytes>,
    ) -> Result<Reply, ClientError> {
        let body = body.into();
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, &self.host);
        if !body.is_empty() {
            request = request.header(hyper::header::CONTENT_TYPE, "application/json");
        }
        let request = request.body(Full::new(body))?;
        self.sender.ready().await?;
        let response = self.sender.send_request(request).await?;
        let (parts, body) = response.into_parts();
        let body = body.collect().await?.to_bytes();
        Ok(Reply {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }

    /// `GET path`.
    pub async fn get(&mut self, path: &str) -> Result<Reply, ClientError> {
        self.send(Method::GET, path, Bytes::new()).await
    }

    /// `POST path` with a JSON body.
    pub async fn post(
        &mut self,
        path: &str,
        json: &serde_json::Value,
    ) -> Result<Reply, ClientError> {
        self.send(Method::POST, path, json.to_string()).await
    }
}
