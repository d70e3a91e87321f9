//! Sliding window counter: two fixed windows (aligned to the epoch as in
//! [`fixed_window`](super::fixed_window)), and an estimate of the sliding window's count as
//! the previous window's count weighted by how much of it the sliding window still overlaps,
//! plus the current window's count:
//!
//! `estimate = previous × (period − elapsed) / period + current`
//!
//! A check is admitted when `estimate + cost ≤ limit`. Constant memory (three integers); the
//! estimate assumes the previous window's admissions were spread evenly, so it can admit a
//! little more or less than an exact log when they were not. Compared with exact arithmetic
//! (all multiplied by `period`), never with floating point. Pure: no I/O, no clock.

use super::{Decision, Limit, Nanos, Receipt, Verdict, div_u64};

/// One key's two windows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct State {
    /// Index of the current window (start = `window × period`).
    window: u64,
    /// Units admitted in the window before `window`.
    previous: u64,
    /// Units admitted in `window`.
    current: u64,
}

/// (previous, current) counts as seen from the window holding `now`.
fn rolled(state: &State, limit: &Limit, now: Nanos) -> (u64, u64) {
    let w = now / limit.period();
    if w <= state.window {
        (state.previous, state.current)
    } else if w == state.window + 1 {
        (state.current, 0)
    } else {
        (0, 0)
    }
}

/// Decides `cost` at `now` without changing `state`.
pub fn decide(state: &State, limit: &Limit, now: Nanos, cost: u64) -> Decision {
    let period = u128::from(limit.period());
    let (prev, curr) = rolled(state, limit, now);
    let window_start = now / limit.period() * limit.period();
    let elapsed = u128::from(now - window_start);
    let cap = u128::from(limit.limit()) * period;
    // The estimate, multiplied by `period`.
    let estimate = u128::from(prev) * (period - elapsed) + u128::from(curr) * period;
    let after = estimate + u128::from(cost) * period;
    let verdict = if cost > limit.limit() {
        Verdict::Never
    } else if after <= cap {
        Verdict::Admit { wait: 0 }
    } else {
        Verdict::Deny {
            retry_after: retry_after(limit, now, window_start, prev, curr, cost),
        }
    };
    let admitted = matches!(verdict, Verdict::Admit { .. });
    let (used, curr_after) = if admitted {
        (after, curr + cost)
    } else {
        (estimate, curr)
    };
    let reset_after = if curr_after > 0 {
        window_start + 2 * limit.period() - now
    } else if prev > 0 {
        window_start + limit.period() - now
    } else {
        0
    };
    Decision {
        verdict,
        limit: limit.limit(),
        remaining: div_u64(cap.saturating_sub(used), period),
        reset_after,
    }
}

/// The earliest time, from `now`, at which `cost` fits, assuming nothing else is admitted.
fn retry_after(limit: &Limit, now: Nanos, start: Nanos, prev: u64, curr: u64, cost: u64) -> Nanos {
    let period = limit.period();
    // Smallest elapsed time `e` into a window with `weighted` units in the previous window
    // such that `weighted × (period − e) ≤ room × period`; `None` if no `e` < period works.
    let fits_at = |weighted: u64, room: u64| -> Option<Nanos> {
        if weighted == 0 {
            return Some(0);
        }
        let slack = u128::from(room) * u128::from(period) / u128::from(weighted);
        (slack > 0).then(|| period.saturating_sub(u64::try_from(slack).unwrap_or(u64::MAX)))
    };
    // Later in this window, as the previous window's weight declines.
    if curr.saturating_add(cost) <= limit.limit()
        && let Some(e) = fits_at(prev, limit.limit() - curr - cost)
    {
        return start + e - now;
    }
    // In the next window, where the current window becomes the previous one.
    if let Some(e) = fits_at(curr, limit.limit() - cost) {
        return start + period + e - now;
    }
    // Two windows on, everything counted now has left.
    start + 2 * period - now
}

/// Counts `cost` in the window holding `now`. Past the limit if `decide` did not admit it: the
/// estimate then denies until the count has weighed out.
pub fn commit(state: &mut State, limit: &Limit, now: Nanos, cost: u64) {
    let w = now / limit.period();
    if w > state.window {
        let (previous, current) = rolled(state, limit, now);
        *state = State {
            window: w,
            previous,
            current,
        };
    }
    state.current = state.current.saturating_add(cost);
}

/// The window the charge just committed was counted in (a later one than `now`'s if the
/// clock stepped back).
pub fn receipt(state: &State, limit: &Limit, _now: Nanos) -> Receipt {
    Receipt {
        at: state.window * limit.period(),
        room: 0,
        refunded: 0,
    }
}

/// Takes up to `amount` units off the count of the window `receipt` names, while that window
/// still weighs in the estimate at `now` (as the current window or the previous one); the
/// counts are then what they would be had the charge been smaller.
pub fn refund(state: &mut State, limit: &Limit, receipt: &Receipt, amount: u64, now: Nanos) -> u64 {
    let window = receipt.at / limit.period();
    if now / limit.period() > window + 1 {
        return 0;
    }
    let count = if state.window == window {
        &mut state.current
    } else if state.window == window + 1 {
        &mut state.previous
    } else {
        return 0;
    };
    let back = amount.min(*count);
    *count -= back;
    back
}

/// Fresh once both windows it can still see are empty.
pub fn is_fresh(state: &State, limit: &Limit, now: Nanos) -> bool {
    rolled(state, limit, now) == (0, 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Algorithm, MILLISECOND, SECOND};
    use proptest::prelude::*;

    const T0: Nanos = 1_700_000_000 * SECOND;

    fn counter(limit: u64, period: Nanos) -> Limit {
        Limit::new(Algorithm::SlidingWindowCounter, limit, period, None).unwrap()
    }

    fn check(s: &mut State, l: &Limit, now: Nanos, cost: u64) -> Decision {
        let d = decide(s, l, now, cost);
        if d.allowed() {
            commit(s, l, now, cost);
        }
        d
    }

    #[test]
    fn sliding_counter_weights_previous_window_by_overlap() {
        let l = counter(10, SECOND);
        let mut s = State::default();
        assert!(check(&mut s, &l, T0 + 500 * MILLISECOND, 10).allowed());
        // 25% into the next window, the previous window weighs 7.5: 2 more fit, not 3.
        let now = T0 + 1_250 * MILLISECOND;
        assert_eq!(decide(&s, &l, now, 0).remaining, 2);
        assert!(check(&mut s, &l, now, 2).allowed());
        let d = check(&mut s, &l, now, 1);
        // estimate 9.5: 1 more fits once the previous weight drops by 0.5, i.e. 50 ms on.
        assert_eq!(
            d.verdict,
            Verdict::Deny {
                retry_after: 50 * MILLISECOND
            }
        );
        assert!(!check(&mut s, &l, now + 50 * MILLISECOND - 1, 1).allowed());
        assert!(check(&mut s, &l, now + 50 * MILLISECOND, 1).allowed());
    }

    #[test]
    fn sliding_counter_full_current_window_waits_for_next() {
        let l = counter(4, SECOND);
        let mut s = State::default();
        assert!(check(&mut s, &l, T0 + 100 * MILLISECOND, 4).allowed());
        // cost 1 fits next window once 4 × (1 − e) ≤ 3, i.e. e = 250 ms.
        let d = check(&mut s, &l, T0 + 200 * MILLISECOND, 1);
        assert_eq!(
            d.verdict,
            Verdict::Deny {
                retry_after: 1_050 * MILLISECOND
            }
        );
        // cost 4 must wait two windows.
        let d = check(&mut s, &l, T0 + 200 * MILLISECOND, 4);
        assert_eq!(
            d.verdict,
            Verdict::Deny {
                retry_after: 1_800 * MILLISECOND
            }
        );
        assert_eq!(d.reset_after, 1_800 * MILLISECOND);
    }

    #[test]
    fn sliding_counter_cost_above_limit_is_never() {
        let l = counter(4, SECOND);
        assert_eq!(decide(&State::default(), &l, T0, 5).verdict, Verdict::Never);
    }

    #[test]
    fn sliding_counter_refund_reaches_the_current_and_the_previous_window() {
        let l = counter(10, SECOND);
        let mut s = State::default();
        assert!(check(&mut s, &l, T0 + 500 * MILLISECOND, 8).allowed());
        let r = receipt(&s, &l, T0 + 500 * MILLISECOND);
        assert_eq!(refund(&mut s, &l, &r, 2, T0 + 600 * MILLISECOND), 2);
        assert_eq!(decide(&s, &l, T0 + 600 * MILLISECOND, 0).remaining, 4);
        // In the next window it weighs as the previous one: 6 × 75% = 4.5 at 250 ms in.
        let now = T0 + 1_250 * MILLISECOND;
        assert!(check(&mut s, &l, now, 1).allowed());
        assert_eq!(decide(&s, &l, now, 0).remaining, 4);
        assert_eq!(refund(&mut s, &l, &r, 4, now), 4);
        // 2 × 75% + 1.
        assert_eq!(decide(&s, &l, now, 0).remaining, 7);
        // Two windows on it weighs nothing: nothing to give back.
        assert_eq!(refund(&mut s, &l, &r, 2, T0 + 2 * SECOND), 0);
    }

    proptest! {
        /// A denial's retry_after is exact.
        #[test]
        fn sliding_counter_retry_after_is_exact(
            limit in 1u64..30, period_ms in 1u64..3_000,
            steps in proptest::collection::vec((0u64..1_500, 1u64..10), 1..60),
            cost in 1u64..30,
        ) {
            let l = counter(limit, period_ms * MILLISECOND);
            let mut s = State::default();
            let mut now = T0;
            for (dt, c) in steps {
                now += dt * MILLISECOND / 3;
                check(&mut s, &l, now, c);
            }
            if let Verdict::Deny { retry_after } = decide(&s, &l, now, cost).verdict {
                prop_assert!(retry_after > 0);
                prop_assert!(!decide(&s, &l, now + retry_after - 1, cost).allowed());
                prop_assert!(decide(&s, &l, now + retry_after, cost).allowed());
            }
        }

        /// Never more than `limit` in one aligned window, nor 2 × limit in any period.
        #[test]
        fn sliding_counter_bounds_admissions(
            limit in 1u64..30, period_ms in 1u64..3_000,
            steps in proptest::collection::vec((0u64..1_000, 1u64..10), 1..200),
        ) {
            let l = counter(limit, period_ms * MILLISECOND);
            let mut s = State::default();
            let mut now = T0;
            let mut admitted = Vec::new();
            for (dt, c) in steps {
                now += dt * MILLISECOND / 3;
                if check(&mut s, &l, now, c).allowed() { admitted.push((now, c)); }
            }
            for &(start, _) in &admitted {
                let sum: u64 = admitted.iter()
                    .filter(|&&(t, _)| t >= start && t < start + l.period())
                    .map(|&(_, c)| c).sum();
                prop_assert!(sum <= 2 * limit);
                let w = start / l.period();
                let in_window: u64 = admitted.iter()
                    .filter(|&&(t, _)| t / l.period() == w).map(|&(_, c)| c).sum();
                prop_assert!(in_window <= limit);
            }
        }
    }
}
