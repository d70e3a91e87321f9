//! The one place that reads time.
//!
//! The engine asks a [`Clock`] for the current time and the HTTP layer asks it to hold a
//! shaped caller. Production uses [`SystemClock`]; tests and benchmarks use [`ManualClock`],
//! which only moves when told to, so time-dependent behaviour is tested exactly.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

use crate::limiter::Nanos;

/// A boxed future returned by [`Clock::sleep`].
pub type Sleep<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// A source of time.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Nanoseconds since the Unix epoch.
    fn now(&self) -> Nanos;
    /// Completes once `duration` nanoseconds have passed on this clock.
    fn sleep(&self, duration: Nanos) -> Sleep<'_>;
}

/// Wall-clock time, as nodes of a cluster must agree on window edges.
///
/// Algorithms tolerate the clock stepping back (they neither refill nor reopen windows), so
/// an NTP correction costs at most some under-admission.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[allow(clippy::disallowed_methods)] // this is the clock
    fn now(&self) -> Nanos {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }

    fn sleep(&self, duration: Nanos) -> Sleep<'_> {
        Box::pin(tokio::time::sleep(Duration::from_nanos(duration)))
    }
}

/// A clock that moves only when [`ManualClock::advance`] or [`ManualClock::set`] is called.
/// Sleepers wake when the clock passes their deadline.
#[derive(Debug, Default)]
pub struct ManualClock {
    now: AtomicU64,
    moved: Notify,
}

impl ManualClock {
    /// A clock reading `now`.
    pub fn new(now: Nanos) -> ManualClock {
        ManualClock {
            now: AtomicU64::new(now),
            moved: Notify::new(),
        }
    }

    /// Moves the clock forward by `by` nanoseconds.
    pub fn advance(&self, by: Nanos) {
        self.now.fetch_add(by, Ordering::SeqCst);
        self.moved.notify_waiters();
    }

    /// Sets the clock (it may go back, as a wall clock can).
    pub fn set(&self, now: Nanos) {
        self.now.store(now, Ordering::SeqCst);
        self.moved.notify_waiters();
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Nanos {
        self.now.load(Ordering::SeqCst)
    }

    fn sleep(&self, duration: Nanos) -> Sleep<'_> {
        let deadline = self.now().saturating_add(duration);
        Box::pin(async move {
            loop {
                let moved = self.moved.notified();
                tokio::pin!(moved);
                // Register before re-reading the time, so an advance in between is not missed.
                moved.as_mut().enable();
                if self.now() >= deadline {
                    return;
                }
                moved.await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn manual_clock_sleep_wakes_only_past_deadline() {
        let clock = std::sync::Arc::new(ManualClock::new(1_000));
        let c = clock.clone();
        let sleeper = tokio::spawn(async move { c.sleep(500).await });
        tokio::task::yield_now().await;
        clock.advance(499);
        tokio::task::yield_now().await;
        assert!(!sleeper.is_finished());
        clock.advance(1);
        tokio::time::timeout(Duration::from_secs(5), sleeper)
            .await
            .expect("sleeper woke")
            .expect("sleeper did not panic");
    }

    #[test]
    fn system_clock_reads_wall_time() {
        // 2020-01-01 as a sanity floor.
        assert!(SystemClock.now() > 1_577_836_800 * 1_000_000_000);
    }
}
