//! How long `acquire` sleeps after a denial, and the generator of its jitter.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How long to sleep before asking again after a denial whose `retry_after_ms` is
/// `retry_after_ms`, with `left` until the caller's deadline; `None` to give up (the node's
/// wait ends after the deadline, or never ends).
///
/// The wait is the node's `retry_after_ms` (milliseconds, not the whole-second
/// `Retry-After` header, which would turn a 10/s rule's 100 ms into a second) plus `draw`
/// (in [0, 1)) times `jitter` of it, so that callers denied together do not return together.
/// Jitter is only ever added (asking before `retry_after_ms` would be denied again) and never
/// takes the sleep past the deadline.
pub(crate) fn next_wait(
    retry_after_ms: Option<u64>,
    left: Duration,
    jitter: f64,
    draw: f64,
) -> Option<Duration> {
    // A denial carries at least 1 ms; guard against 0 so that a loop cannot spin.
    let wait = Duration::from_millis(retry_after_ms?.max(1));
    if wait > left {
        return None;
    }
    // In whole nanoseconds (the cast saturates): Duration::mul_f64 panics on overflow.
    let extra = Duration::from_nanos((wait.as_nanos() as f64 * draw * jitter) as u64);
    Some(wait.saturating_add(extra).min(left))
}

/// A lock-free SplitMix64 stream: the jitter needs spread, not cryptographic quality, and no
/// third-party crate.
#[derive(Debug)]
pub(crate) struct Jitter {
    state: AtomicU64,
}

const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

impl Jitter {
    /// A stream seeded from the process's per-map random keys (`RandomState`), so that two
    /// clients, or two processes, draw different waits.
    pub fn from_entropy() -> Jitter {
        let mut hasher = RandomState::new().build_hasher();
        hasher.write_u64(GAMMA);
        Jitter::seeded(hasher.finish())
    }

    /// A stream that repeats for the same seed.
    pub fn seeded(seed: u64) -> Jitter {
        Jitter {
            state: AtomicU64::new(seed),
        }
    }

    /// The next draw, uniform in [0, 1).
    pub fn draw(&self) -> f64 {
        let mut z = self
            .state
            .fetch_add(GAMMA, Ordering::Relaxed)
            .wrapping_add(GAMMA);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        // The top 53 bits, as the mantissa of a double in [0, 1).
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn waits_the_nodes_milliseconds_not_a_whole_second() {
        assert_eq!(next_wait(Some(100), 2000 * MS, 0.1, 0.0), Some(100 * MS));
        assert_eq!(next_wait(Some(13), 2000 * MS, 0.0, 0.9), Some(13 * MS));
    }

    #[test]
    fn adds_up_to_jitter_of_the_wait_and_never_less() {
        assert_eq!(next_wait(Some(100), 2000 * MS, 0.1, 0.5), Some(105 * MS));
        let most = next_wait(Some(100), 2000 * MS, 0.1, 0.999_999).unwrap();
        assert!(most >= 109 * MS && most < 110 * MS, "{most:?}");
    }

    #[test]
    fn jitter_never_passes_the_deadline() {
        assert_eq!(next_wait(Some(100), 103 * MS, 0.1, 0.9), Some(103 * MS));
        assert_eq!(next_wait(Some(100), 100 * MS, 1.0, 0.9), Some(100 * MS));
    }

    #[test]
    fn gives_up_when_the_wait_ends_after_the_deadline_or_never() {
        assert_eq!(next_wait(Some(101), 100 * MS, 0.1, 0.0), None);
        assert_eq!(next_wait(Some(1), Duration::ZERO, 0.1, 0.0), None);
        assert_eq!(next_wait(None, Duration::from_secs(3600), 0.1, 0.0), None);
    }

    #[test]
    fn a_zero_wait_still_sleeps_a_millisecond() {
        assert_eq!(next_wait(Some(0), 10 * MS, 0.0, 0.0), Some(MS));
        assert_eq!(next_wait(Some(0), Duration::ZERO, 0.0, 0.0), None);
    }

    #[test]
    fn draws_are_in_the_unit_interval_spread_and_repeat_per_seed() {
        let a = Jitter::seeded(7);
        let draws: Vec<f64> = (0..10_000).map(|_| a.draw()).collect();
        assert!(draws.iter().all(|d| (0.0..1.0).contains(d)));
        let mean = draws.iter().sum::<f64>() / draws.len() as f64;
        assert!((mean - 0.5).abs() < 0.02, "mean {mean}");
        // Every tenth of the interval gets its share (1,000 expected each).
        for decile in 0..10 {
            let lo = f64::from(decile) / 10.0;
            let n = draws.iter().filter(|d| (lo..lo + 0.1).contains(*d)).count();
            assert!((850..1150).contains(&n), "decile {decile}: {n}");
        }
        let b = Jitter::seeded(7);
        assert!(draws.iter().take(5).all(|d| *d == b.draw()));
        assert_ne!(Jitter::seeded(8).draw(), draws[0]);
    }
}
