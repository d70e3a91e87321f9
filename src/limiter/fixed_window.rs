//! Fixed window: at most `limit` units per window, windows aligned to multiples of `period`
//! since the Unix epoch, so every node of a cluster agrees on where a window starts and ends.
//!
//! Cheap and simple, with the known weakness that up to `2 × limit` can pass around a window
//! edge (the end of one window and the start of the next). Pure: no I/O, no clock.

use super::{Decision, Limit, Nanos, Receipt, Verdict};

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
        // A settle may have charged past the limit (`commit` of a cost not admitted).
        remaining: limit.limit().saturating_sub(used),
        reset_after: if used == 0 { 0 } else { until_next },
    }
}

/// Counts `cost` in the window holding `now`. Past the limit if `decide` did not admit it: the
/// window then denies until it ends.
pub fn commit(state: &mut State, limit: &Limit, now: Nanos, cost: u64) {
    let window = now / limit.period();
    if window > state.window {
        *state = State { window, count: 0 };
    }
    state.count = state.count.saturating_add(cost);
}

/// The window the charge just committed was counted in (a later one than `now`'s if the
/// clock stepped back: see [`count`]).
pub fn receipt(state: &State, limit: &Limit, _now: Nanos) -> Receipt {
    Receipt {
        at: state.window * limit.period(),
        room: 0,
        refunded: 0,
    }
}

/// Takes up to `amount` units off the count of the window `receipt` names, if that window is
/// still the one counting at `now`; a closed window gets nothing back (its count no longer
/// matters). The result is the count the window would hold had the charge been smaller.
pub fn refund(state: &mut State, limit: &Limit, receipt: &Receipt, amount: u64, now: Nanos) -> u64 {
    let window = receipt.at / limit.period();
    if state.window != window || now / limit.period() > window {
        return 0;
    }
    let back = amount.min(state.count);
    state.count -= back;
    back
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

    /// Reserves `cost` as a check would (admitted), returning the receipt.
    fn reserve(s: &mut State, l: &Limit, now: Nanos, cost: u64) -> Receipt {
        assert!(check(s, l, now, cost).allowed());
        receipt(s, l, now)
    }

    #[test]
    fn fixed_window_refund_in_the_open_window_can_be_spent_again() {
        let l = window(10, 60 * SECOND);
        let mut s = State::default();
        let r = reserve(&mut s, &l, T0 + 10 * SECOND, 8);
        assert_eq!(decide(&s, &l, T0 + 20 * SECOND, 0).remaining, 2);
        assert_eq!(refund(&mut s, &l, &r, 5, T0 + 20 * SECOND), 5);
        assert_eq!(decide(&s, &l, T0 + 20 * SECOND, 0).remaining, 7);
        assert!(check(&mut s, &l, T0 + 30 * SECOND, 7).allowed());
        assert!(!check(&mut s, &l, T0 + 30 * SECOND, 1).allowed());
        // Never more than was counted.
        let mut t = State::default();
        let r = reserve(&mut t, &l, T0, 3);
        assert_eq!(refund(&mut t, &l, &r, 50, T0), 3);
        assert!(is_fresh(&t, &l, T0));
    }

    #[test]
    fn fixed_window_refund_after_the_window_closed_gives_nothing() {
        let l = window(10, 60 * SECOND);
        let mut s = State::default();
        let r = reserve(&mut s, &l, T0 + 59 * SECOND, 10);
        let before = s.clone();
        assert_eq!(refund(&mut s, &l, &r, 10, T0 + 60 * SECOND), 0);
        assert_eq!(s, before);
        // Nor into the next window's count.
        assert!(check(&mut s, &l, T0 + 61 * SECOND, 4).allowed());
        assert_eq!(refund(&mut s, &l, &r, 10, T0 + 61 * SECOND), 0);
        assert_eq!(decide(&s, &l, T0 + 61 * SECOND, 0).remaining, 6);
    }

    #[test]
    fn fixed_window_charge_past_the_limit_denies_until_the_window_ends() {
        let l = window(10, 60 * SECOND);
        let mut s = State::default();
        assert!(check(&mut s, &l, T0, 8).allowed());
        commit(&mut s, &l, T0 + SECOND, 7); // a settle's extra cost: 15 of 10
        let d = decide(&s, &l, T0 + SECOND, 1);
        assert_eq!(d.remaining, 0);
        assert_eq!(
            d.verdict,
            Verdict::Deny {
                retry_after: 59 * SECOND
            }
        );
        assert!(check(&mut s, &l, T0 + 60 * SECOND, 10).allowed());
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
