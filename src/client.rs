//! A small HTTP/1.1 client for the node's API, used by `gossamer check` and by the tests.
//! One connection per [`Client`], reused for every request.

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::{HeaderMap, Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Why a request could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The URL is not `http://host:port[/...]`.
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
    sender: SendRequest<Full<Bytes>>,
}

impl Client {
    /// Connects to `url` (`http://host:port`, a trailing path is ignored).
    pub async fn connect(url: &str) -> Result<Client, ClientError> {
        let authority = url
            .strip_prefix("http://")
            .map(|rest| rest.split('/').next().unwrap_or(rest))
            .filter(|a| !a.is_empty())
            .ok_or_else(|| ClientError::Url(url.to_owned()))?;
        let stream =
            TcpStream::connect(authority)
                .await
                .map_err(|source| ClientError::Connect {
                    addr: authority.to_owned(),
                    source,
                })?;
        let _ = stream.set_nodelay(true);
        let (sender, connection) = http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(connection);
        Ok(Client {
            host: authority.to_owned(),
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
