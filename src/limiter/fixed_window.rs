//! Fixed window: at most `limit` units per window, windows aligned to multiples of `period`
//! since the Unix epoch, so every node of a cluster agrees on where a window starts and ends.
//!
//! Cheap and simple, with the known weakness that up to `2 × limit` can pass around a window
//! edge (the end of one window and the start of the next). Pure: no I/O, no clock.

use super::{Decision, Limit, Nanos, Verdict};

/// One key's window.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct State {
    /// The window's index: its start is `window × period`.
    window: u64,
    /// Units admitted in that window.
    count: u64,
}

/// Units counted in the window that holds `now`. A clock that stepped back into an earlier
/// window keeps the later window's count (the conservative choice).
fn count(state: &State, limit: &Limit, now: Nanos) -> u64 {
    if now / limit.period() > state.window {
        0
    } else {
        state.count
    }
}

/// Decides `cost` at `now` without changing `state`.
pub fn decide(state: &State, limit: &Limit, now: Nanos, cost: u64) -> Decision {
    let count = count(state, limit, now);
    let window_end = (now / limit.period() + 1) * limit.period();
    let until_next = window_end - now;
    // Saturating: a hostile cost near u64::MAX must come out as `Never`, not overflow.
    let used_after = count.saturating_add(cost);
    let verdict = if cost > limit.limit() {
        Verdict::Never
    } else if used_after <= limit.limit() {
        Verdict::Admit { wait: 0 }
    } else {
        Verdict::Deny {
            retry_after: until_next,
        }
    };
    let used = if matches!(verdict, Verdict::Admit { .. }) {
        used_after
    } else {
        count
    };
    Decision {
        verdict,
        limit: limit.limit(),
        remaining: limit.limit() - used,
        reset_after: if used == 0 { 0 } else { until_next },
    }
}

/// Counts `cost` in the window holding `now`; `decide` must have admitted it.
pub fn commit(state: &mut State, limit: &Limit, now: Nanos, cost: u64) {
    let window = now / limit.period();
    if window > state.window {
        *state = State { window, count: 0 };
    }
    state.count += cost;
}

/// A window with nothing counted at `now` is fresh.
pub fn is_fresh(state: &State, limit: &Limit, now: Nanos) -> bool {
    count(state, limit, now) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Algorithm, MILLISECOND, SECOND};
    use proptest::prelude::*;

    /// A whole minute since the epoch.
    const T0: Nanos = 1_699_999_980 * SECOND;

    fn window(limit: u64, period: Nanos) -> Limit {
        Limit::new(Algorithm::FixedWindow, limit, period, None).unwrap()
    }

    fn check(s: &mut State, l: &Limit, now: Nanos, cost: u64) -> Decision {
        let d = decide(s, l, now, cost);
        if d.allowed() {
            commit(s, l, now, cost);
        }
        d
    }

    #[test]
    fn fixed_window_edges_are_aligned_to_the_epoch() {
        let l = window(3, 60 * SECOND);
        let mut s = State::default();
        // 10 s into a minute: three pass, the fourth waits for the next minute.
        let now = T0 + 10 * SECOND;
        for _ in 0..3 {
            assert!(check(&mut s, &l, now, 1).allowed());
        }
        let d = check(&mut s, &l, now, 1);
        assert_eq!(
            d.verdict,
            Verdict::Deny {
                retry_after: 50 * SECOND
            }
        );
        assert_eq!((d.remaining, d.reset_after), (0, 50 * SECOND));
        assert!(!check(&mut s, &l, T0 + 60 * SECOND - 1, 1).allowed());
        assert!(check(&mut s, &l, T0 + 60 * SECOND, 1).allowed());
    }

    #[test]
    fn fixed_window_admits_twice_the_limit_across_an_edge() {
        let l = window(5, SECOND);
        let mut s = State::default();
        assert!(check(&mut s, &l, T0 + SECOND - MILLISECOND, 5).allowed());
        assert!(check(&mut s, &l, T0 + SECOND, 5).allowed());
    }

    #[test]
    fn fixed_window_cost_above_limit_is_never() {
        let l = window(5, SECOND);
        assert_eq!(decide(&State::default(), &l, T0, 6).verdict, Verdict::Never);
    }

    #[test]
    fn fixed_window_clock_step_back_keeps_the_later_count() {
        let l = window(1, SECOND);
        let mut s = State::default();
        assert!(check(&mut s, &l, T0 + SECOND, 1).allowed());
        assert!(!check(&mut s, &l, T0, 1).allowed());
    }

    proptest! {
        /// Per aligned window, admitted ≤ limit.
        #[test]
        fn fixed_window_never_exceeds_limit_per_window(
            limit in 1u64..30, period_ms in 1u64..3_000,
            steps in proptest::collection::vec((0u64..1_000, 1u64..10), 1..200),
        ) {
            let l = window(limit, period_ms * MILLISECOND);
            let mut s = State::default();
            let mut now = T0;
            let mut per_window = std::collections::HashMap::new();
            for (dt, cost) in steps {
                now += dt * MILLISECOND / 3;
                if check(&mut s, &l, now, cost).allowed() {
                    *per_window.entry(now / l.period()).or_insert(0) += cost;
                }
            }
            prop_assert!(per_window.values().all(|&n| n <= limit));
        }
    }
}
