//! Keep-alive HTTP/1.1 connections to one node, reused across calls and callers.
//!
//! Each request takes an idle connection (or opens one), sends one request on it and, once
//! the whole answer is read, puts it back for the next. Concurrent callers each get their own
//! connection; up to `max_idle` are kept. A request whose future is dropped, or that times
//! out, drops its connection: its state is unknown, so it is never reused.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::{HeaderMap, Method, Request, header};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::endpoint::Endpoint;

/// The sending half of one connection.
pub(crate) type Sender = SendRequest<Full<Bytes>>;

/// The largest answer read (the node's are a few hundred bytes).
const MAX_BODY: usize = 1 << 20;

const USER_AGENT: &str = concat!("gossamer-rust/", env!("CARGO_PKG_VERSION"));

/// Why a connection could not be opened.
#[derive(Debug)]
pub(crate) enum OpenError {
    /// TCP connect failed.
    Connect(std::io::Error),
    /// The HTTP/1.1 handshake failed.
    Handshake(hyper::Error),
}

/// Opens a connection to `authority` (`host:port`) and drives it on a task of its own, which
/// ends when the connection closes or its last `Sender` is dropped.
pub(crate) async fn open(authority: &str) -> Result<Sender, OpenError> {
    let stream = TcpStream::connect(authority)
        .await
        .map_err(OpenError::Connect)?;
    // Small requests, answered at once: do not let Nagle hold the next one back.
    let _ = stream.set_nodelay(true);
    let (sender, connection) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(OpenError::Handshake)?;
    tokio::spawn(connection);
    Ok(sender)
}

/// A whole answer.
#[derive(Debug)]
pub(crate) struct Answer {
    pub status: u16,
    pub body: Bytes,
}

/// The connections of one client.
#[derive(Debug)]
pub(crate) struct Pool {
    endpoint: Endpoint,
    connect_timeout: Duration,
    max_idle: usize,
    /// Never held across an `.await`.
    idle: Mutex<Vec<Sender>>,
}

/// How an exchange failed.
enum Failure {
    /// Before any of the answer arrived, in the way of a connection the node closed while it
    /// sat idle (the request was not written, or the connection closed or was reset before
    /// any answer): worth sending again on a new connection, if this one was reused.
    Stale(String),
    /// Anything else.
    Broken(String),
}

impl Pool {
    pub fn new(endpoint: Endpoint, connect_timeout: Duration, max_idle: usize) -> Pool {
        Pool {
            endpoint,
            connect_timeout,
            max_idle,
            idle: Mutex::new(Vec::new()),
        }
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Sends one request and reads the whole answer, within `timeout` of the connection
    /// being there (and `connect_timeout` to open one). A reused connection that turns out
    /// stale is replaced by a new one, once. The error says why there is no answer.
    pub async fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<Bytes>,
        timeout: Duration,
    ) -> Result<Answer, String> {
        let mut fresh = false;
        let mut deadline = None;
        loop {
            let (mut sender, reused) = self.take(fresh).await?;
            let deadline = *deadline.get_or_insert_with(|| Instant::now() + timeout);
            let request = self.build(&method, path, body.clone())?;
            match tokio::time::timeout_at(deadline, exchange(&mut sender, request)).await {
                Err(_) => return Err(format!("no answer within {timeout:?}")),
                Ok(Err(Failure::Stale(_))) if reused => fresh = true,
                Ok(Err(Failure::Stale(why) | Failure::Broken(why))) => return Err(why),
                Ok(Ok((answer, keep))) => {
                    if keep {
                        self.give(sender);
                    }
                    return Ok(answer);
                }
            }
        }
    }

    /// How many idle connections are kept now.
    #[cfg(test)]
    pub fn idle(&self) -> usize {
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// An idle connection that is still open (`true`), or a new one (`false`).
    async fn take(&self, fresh: bool) -> Result<(Sender, bool), String> {
        if !fresh {
            loop {
                let idle = self
                    .idle
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .pop();
                match idle {
                    Some(sender) if sender.is_closed() => continue,
                    Some(sender) => return Ok((sender, true)),
                    None => break,
                }
            }
        }
        let authority = &self.endpoint.authority;
        match tokio::time::timeout(self.connect_timeout, open(authority)).await {
            Ok(Ok(sender)) => Ok((sender, false)),
            Ok(Err(OpenError::Connect(e))) => Err(format!("cannot connect to {authority}: {e}")),
            Ok(Err(OpenError::Handshake(e))) => Err(format!("cannot connect to {authority}: {e}")),
            Err(_) => Err(format!(
                "cannot connect to {authority} within {:?}",
                self.connect_timeout
            )),
        }
    }

    fn give(&self, sender: Sender) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < self.max_idle {
            idle.push(sender);
        }
    }

    fn build(
        &self,
        method: &Method,
        path: &str,
        body: Option<Bytes>,
    ) -> Result<Request<Full<Bytes>>, String> {
        let mut request = Request::builder()
            .method(method.clone())
            .uri(path)
            .header(header::HOST, &self.endpoint.authority)
            .header(header::USER_AGENT, USER_AGENT)
            .header(header::ACCEPT, "application/json");
        if body.is_some() {
            request = request.header(header::CONTENT_TYPE, "application/json");
        }
        request
            .body(Full::new(body.unwrap_or_default()))
            .map_err(|e| format!("cannot build the request for {path:?}: {e}"))
    }
}

/// Sends `request` on `sender` and reads the whole answer; `true` if the connection may be
/// reused.
async fn exchange(
    sender: &mut Sender,
    request: Request<Full<Bytes>>,
) -> Result<(Answer, bool), Failure> {
    if let Err(e) = sender.ready().await {
        return Err(Failure::Stale(e.to_string()));
    }
    let response = match sender.try_send_request(request).await {
        Ok(response) => response,
        Err(e) => {
            let unsent = e.message().is_some();
            let e = e.into_error();
            let why = format!("{e}");
            return Err(if unsent || e.is_incomplete_message() || was_reset(&e) {
                Failure::Stale(why)
            } else {
                Failure::Broken(why)
            });
        }
    };
    let keep = !closes(response.headers());
    let status = response.status().as_u16();
    let body = Limited::new(response.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| Failure::Broken(format!("cannot read the answer: {e}")))?
        .to_bytes();
    Ok((Answer { status, body }, keep))
}

/// The connection was reset or its pipe broken: what writing to a socket the peer closed
/// while it sat idle gives.
fn was_reset(e: &hyper::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
            );
        }
        source = s.source();
    }
    false
}

/// The answer says `Connection: close`.
fn closes(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .any(|v| v.as_bytes().eq_ignore_ascii_case(b"close"))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    use tokio::net::TcpListener;

    use super::*;
    use crate::fake::Fake;

    fn pool(url: &str) -> Pool {
        Pool::new(Endpoint::parse(url).unwrap(), Duration::from_secs(2), 8)
    }

    async fn get(pool: &Pool) -> Result<Answer, String> {
        pool.request(Method::GET, "/x", None, Duration::from_secs(2))
            .await
    }

    #[tokio::test]
    async fn sequential_requests_reuse_one_connection() {
        let (url, accepted) = Fake::answering(200, "{}").start().await;
        let pool = pool(&url);
        for _ in 0..5 {
            let answer = get(&pool).await.unwrap();
            assert_eq!((answer.status, &answer.body[..]), (200, &b"{}"[..]));
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        assert_eq!(pool.idle(), 1);
    }

    #[tokio::test]
    async fn a_connection_the_node_closed_while_idle_is_replaced_without_an_error() {
        // One answer per connection, then the node hangs up without saying so.
        let fake = Fake {
            per_connection: 1,
            ..Fake::answering(200, "ok")
        };
        let (url, accepted) = fake.start().await;
        let pool = pool(&url);
        for i in 0..6 {
            let body = Bytes::from_static(b"{\"a\":1}");
            let answer = pool
                .request(Method::POST, "/x", Some(body), Duration::from_secs(2))
                .await
                .unwrap_or_else(|e| panic!("request {i}: {e}"));
            assert_eq!(&answer.body[..], b"ok");
            // Let the hang-up arrive before the next request, or not (every other one): both
            // must succeed.
            if i % 2 == 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 6);
    }

    #[tokio::test]
    async fn a_request_on_a_connection_closed_under_it_is_sent_again_on_a_new_one() {
        // The node takes each reused connection's request and hangs up without an answer:
        // the request never reached the limiter, so it is sent again, once.
        let fake = Fake {
            per_connection: 1,
            late_hang_up: true,
            ..Fake::answering(200, "ok")
        };
        let (url, accepted) = fake.start().await;
        let pool = pool(&url);
        for i in 0..4 {
            let body = Bytes::from_static(b"{\"a\":1}");
            let answer = pool
                .request(Method::POST, "/x", Some(body), Duration::from_secs(2))
                .await
                .unwrap_or_else(|e| panic!("request {i}: {e}"));
            assert_eq!(&answer.body[..], b"ok");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn a_new_connection_closed_without_an_answer_is_an_error_not_a_loop() {
        let fake = Fake {
            per_connection: 0,
            late_hang_up: true,
            ..Fake::answering(200, "ok")
        };
        let (url, accepted) = fake.start().await;
        let e = get(&pool(&url)).await.unwrap_err();
        assert!(!e.is_empty());
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn an_answer_saying_connection_close_is_not_kept() {
        let fake = Fake {
            per_connection: 1,
            polite: true,
            ..Fake::answering(200, "ok")
        };
        let (url, accepted) = fake.start().await;
        let pool = pool(&url);
        get(&pool).await.unwrap();
        assert_eq!(pool.idle(), 0);
        get(&pool).await.unwrap();
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn concurrent_requests_each_get_a_connection_and_at_most_max_idle_are_kept() {
        let (url, accepted) = Fake::answering(200, "{}").start().await;
        let pool = Arc::new(Pool::new(
            Endpoint::parse(&url).unwrap(),
            Duration::from_secs(2),
            3,
        ));
        let tasks: Vec<_> = (0..6)
            .map(|_| {
                let pool = pool.clone();
                tokio::spawn(async move { get(&pool).await.map(|a| a.status) })
            })
            .collect();
        for task in tasks {
            assert_eq!(task.await.unwrap(), Ok(200));
        }
        let opened = accepted.load(Ordering::SeqCst);
        assert!((1..=6).contains(&opened), "{opened}");
        assert!(pool.idle() <= 3);
        // The kept ones serve what follows: no new connection for sequential requests.
        for _ in 0..4 {
            get(&pool).await.unwrap();
        }
        assert_eq!(accepted.load(Ordering::SeqCst), opened);
    }

    #[tokio::test]
    async fn a_node_that_accepts_but_never_answers_times_out_and_the_connection_is_dropped() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // Accept and hold the connections without reading or answering.
        let holder = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        let pool = pool(&format!("http://{addr}"));
        let started = std::time::Instant::now();
        let e = pool
            .request(Method::GET, "/x", None, Duration::from_millis(100))
            .await
            .unwrap_err();
        assert!(e.contains("no answer within 100ms"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(2));
        assert_eq!(pool.idle(), 0);
        holder.abort();
    }

    #[tokio::test]
    async fn nothing_listening_is_a_connect_error() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let e = get(&pool(&format!("http://{addr}"))).await.unwrap_err();
        assert!(e.starts_with(&format!("cannot connect to {addr}")), "{e}");
    }

    #[tokio::test]
    async fn an_answer_over_the_size_limit_is_refused() {
        let big: &'static str = Box::leak("x".repeat(MAX_BODY + 1).into_boxed_str());
        let (url, _) = Fake::answering(200, big).start().await;
        let e = get(&pool(&url)).await.unwrap_err();
        assert!(e.starts_with("cannot read the answer"), "{e}");
    }
}
