//! Slow and idle clients: one watchdog per connection instead of a timer per request.
//!
//! hyper's `header_read_timeout` arms and disarms a timer for every request, which measured
//! as a visible share of a check's CPU. Here the connection's socket is wrapped
//! ([`Watched`]) so that reads and writes record when a request started arriving and when the
//! connection was last active; a watchdog that wakes a few times per timeout closes the
//! connection when
//! - a request has been arriving or waiting for its answer for longer than the request
//!   timeout plus the longest shaping wait (slow headers, slow bodies, stalled peers), or
//! - the connection has been idle between requests for longer than the idle timeout.
//!
//! The request handler still bounds a slow body on its own (answering 408 within the request
//! timeout); the watchdog is the backstop that also covers slow headers and idle keep-alive.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
// tokio's `Instant` is the system's in a release build, and follows paused time in tests.
use tokio::time::Instant;

/// How long a connection may stall.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// From the first byte of a request to the first byte of its answer.
    pub request: Duration,
    /// Between the end of an answer and the first byte of the next request.
    pub idle: Duration,
}

impl Limits {
    /// How often the watchdog looks: a quarter of the shorter limit, within 10 ms to 1 s.
    fn tick(&self) -> Duration {
        (self.request.min(self.idle) / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
    }
}

/// What the socket wrapper records, in milliseconds since `epoch` (0 meaning "none").
#[derive(Debug)]
pub struct Activity {
    epoch: Instant,
    /// When the request now being received or answered began arriving (+1), or 0.
    request_since: AtomicU64,
    /// When bytes last moved either way (+1).
    last: AtomicU64,
}

impl Activity {
    /// A fresh record for a connection accepted now.
    pub fn new() -> Arc<Activity> {
        let activity = Activity {
            epoch: Instant::now(),
            request_since: AtomicU64::new(0),
            last: AtomicU64::new(0),
        };
        activity.last.store(activity.now(), Ordering::Relaxed);
        Arc::new(activity)
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX - 1) + 1
    }

    fn read(&self) {
        let now = self.now();
        if self.request_since.load(Ordering::Relaxed) == 0 {
            self.request_since.store(now, Ordering::Relaxed);
        }
        self.last.store(now, Ordering::Relaxed);
    }

    fn wrote(&self) {
        // An answer is going out: the request it answers is no longer waiting.
        self.request_since.store(0, Ordering::Relaxed);
        self.last.store(self.now(), Ordering::Relaxed);
    }

    /// Whether the connection has stalled past `limits` now.
    fn stalled(&self, limits: &Limits) -> bool {
        let now = self.now();
        let over =
            |since: u64, limit: Duration| Duration::from_millis(now.saturating_sub(since)) > limit;
        match self.request_since.load(Ordering::Relaxed) {
            0 => over(self.last.load(Ordering::Relaxed), limits.idle),
            since => over(since, limits.request),
        }
    }
}

/// Completes when the connection behind `activity` has stalled past `limits`.
pub async fn watch(activity: Arc<Activity>, limits: Limits) {
    let mut tick = tokio::time::interval(limits.tick());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if activity.stalled(&limits) {
            return;
        }
    }
}

/// A socket that records its [`Activity`].
#[derive(Debug)]
pub struct Watched<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S> Watched<S> {
    /// Wraps `inner`, recording into `activity`.
    pub fn new(inner: S, activity: Arc<Activity>) -> Watched<S> {
        Watched { inner, activity }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(result, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.read();
        }
        result
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(result, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.wrote();
        }
        result
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(result, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.wrote();
        }
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            request: Duration::from_millis(100),
            idle: Duration::from_millis(200),
        }
    }

    #[test]
    fn a_fresh_connection_is_not_stalled() {
        assert!(!Activity::new().stalled(&limits()));
    }

    #[tokio::test(start_paused = true)]
    async fn an_unanswered_request_stalls_after_the_request_limit() {
        let activity = Activity::new();
        activity.read();
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(!activity.stalled(&limits()));
        tokio::time::advance(Duration::from_millis(2)).await;
        assert!(activity.stalled(&limits()));
        activity.wrote();
        assert!(!activity.stalled(&limits()));
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_stalls_after_the_idle_limit() {
        let activity = Activity::new();
        activity.read();
        activity.wrote();
        tokio::time::advance(Duration::from_millis(150)).await;
        assert!(
            !activity.stalled(&limits()),
            "idle, but within the idle limit"
        );
        tokio::time::advance(Duration::from_millis(52)).await;
        assert!(activity.stalled(&limits()));
    }

    #[tokio::test(start_paused = true)]
    async fn watch_returns_once_the_connection_stalls() {
        let activity = Activity::new();
        activity.read();
        let watching = tokio::spawn(watch(activity.clone(), limits()));
        tokio::time::sleep(Duration::from_millis(90)).await;
        assert!(!watching.is_finished());
        // Paused time jumps ahead to the next tick once every task is idle.
        tokio::time::timeout(Duration::from_secs(1), watching)
            .await
            .expect("the watchdog fires within a tick of the limit")
            .expect("no panic");
    }
}
