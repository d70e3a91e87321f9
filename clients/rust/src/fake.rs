//! A fake node for this crate's unit tests: answers every request on a free loopback port with
//! the same status and body, so that the client's handling of connections and answers can be
//! tested without the real binary (tests/rust_client.rs at the repository root runs that).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A fake node: what it answers and how it treats connections.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fake {
    pub status: u16,
    pub body: &'static str,
    /// Answers per connection, after which the fake hangs up.
    pub per_connection: usize,
    /// Says `Connection: close` on a connection's last answer (else hangs up unannounced).
    pub polite: bool,
    /// Hangs up only once the next request has arrived, unanswered: what a node whose idle
    /// timeout fires just as a request is sent does. Else at once after the last answer.
    pub late_hang_up: bool,
}

impl Fake {
    pub fn answering(status: u16, body: &'static str) -> Fake {
        Fake {
            status,
            body,
            per_connection: usize::MAX,
            polite: false,
            late_hang_up: false,
        }
    }

    /// Starts serving; the URL, and the count of connections accepted so far.
    pub async fn start(self) -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(self.serve(stream));
            }
        });
        (format!("http://{addr}"), accepted)
    }

    async fn serve(self, mut stream: TcpStream) {
        let mut buf = Vec::new();
        for answered in 1..=self.per_connection {
            if !read_request(&mut stream, &mut buf).await {
                return;
            }
            let close = answered == self.per_connection && self.polite;
            let answer = format!(
                "HTTP/1.1 {} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{}\r\n{}",
                self.status,
                self.body.len(),
                if close { "connection: close\r\n" } else { "" },
                self.body
            );
            if stream.write_all(answer.as_bytes()).await.is_err() {
                return;
            }
        }
        if self.late_hang_up {
            read_request(&mut stream, &mut buf).await;
        }
    }
}

/// Reads one request (head, and a body of its `content-length`) off `stream`, leaving what
/// follows it in `buf`; false at the end of the stream.
async fn read_request(stream: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().expect("a content-length"));
            if buf.len() >= end + 4 + length {
                buf.drain(..end + 4 + length);
                return true;
            }
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}
