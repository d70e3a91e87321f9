//! Sliding window log: exact. A check is admitted when the units admitted in the last `period`
//! (the half-open window `(now - period, now]`) plus its cost do not exceed `limit`. Every
//! admission is remembered until it leaves the window; denied checks are not logged.
//!
//! Memory: one entry (16 bytes) per admission still in the window, and admissions at the same
//! nanosecond share one entry, so a key holds at most `limit` entries. Config refuses a limit
//! above [`MAX_LOG_LIMIT`](super::MAX_LOG_LIMIT). Pure: no I/O, no clock.

use std::collections::VecDeque;

use super::{Decision, Limit, Nanos, Receipt, Verdict};

/// One key's log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct State {
    /// Admissions, oldest first: (time, units).
    entries: VecDeque<(Nanos, u64)>,
    /// Sum of the units in `entries`.
    total: u64,
}

/// Entries (from the front) that have left the window at `now`, and their units.
fn expired(state: &State, limit: &Limit, now: Nanos) -> (usize, u64) {
    let mut n = 0;
    let mut units = 0;
    for &(t, c) in &state.entries {
        if t.saturating_add(limit.period()) > now {
            break;
        }
        n += 1;
        units += c;
    }
    (n, units)
}

/// Decides `cost` at `now` without changing `state`.
pub fn decide(state: &State, limit: &Limit, now: Nanos, cost: u64) -> Decision {
    let (gone, gone_units) = expired(state, limit, now);
    let in_window = state.total - gone_units;
    let last_expiry = |extra: bool| {
        let newest = if extra {
            Some(now)
        } else {
            state.entries.iter().skip(gone).last().map(|&(t, _)| t)
        };
        newest.map_or(0, |t| (t + limit.period()).saturating_sub(now))
    };
    let verdict = if cost > limit.limit() {
        Verdict::Never
    } else if in_window.saturating_add(cost) <= limit.limit() {
        Verdict::Admit { wait: 0 }
    } else {
        // Wait until enough of the oldest admissions have left the window.
        let mut to_free = in_window.saturating_add(cost) - limit.limit();
        let mut retry_after = limit.period();
        for &(t, c) in state.entries.iter().skip(gone) {
            to_free = to_free.saturating_sub(c);
            if to_free == 0 {
                retry_after = (t + limit.period()).saturating_sub(now);
                break;
            }
        }
        Verdict::Deny { retry_after }
    };
    let admitted = matches!(verdict, Verdict::Admit { .. }) && cost > 0;
    let used = in_window.saturating_add(if admitted { cost } else { 0 });
    Decision {
        verdict,
        limit: limit.limit(),
        // A settle may have logged past the limit (`commit` of a cost not admitted).
        remaining: limit.limit().saturating_sub(used),
        reset_after: last_expiry(admitted),
    }
}

/// Logs `cost` at `now` and forgets what left the window. Past the limit if `decide` did not
/// admit it: the log then denies until enough has left the window.
pub fn commit(state: &mut State, limit: &Limit, now: Nanos, cost: u64) {
    let (gone, gone_units) = expired(state, limit, now);
    state.entries.drain(..gone);
    state.total -= gone_units;
    // Keep the log sorted even if the clock stepped back.
    let t = state.entries.back().map_or(now, |&(last, _)| last.max(now));
    match state.entries.back_mut() {
        Some((last, c)) if *last == t => *c = c.saturating_add(cost),
        _ => state.entries.push_back((t, cost)),
    }
    state.total = state.total.saturating_add(cost);
    if state.entries.capacity() > 4 * state.entries.len().max(4) {
        state.entries.shrink_to(2 * state.entries.len());
    }
}

/// The entry the charge just committed was logged in (its time: `now`, or the newest entry's
/// if the clock stepped back).
pub fn receipt(state: &State, _limit: &Limit, now: Nanos) -> Receipt {
    Receipt {
        at: state.entries.back().map_or(now, |&(t, _)| t),
        room: 0,
        refunded: 0,
    }
}

/// Takes up to `amount` units off the entry logged at `receipt.at`, if it is still in the
/// window at `now` (an entry that left it no longer matters). The log is then what it would
/// be had that charge been smaller.
pub fn refund(state: &mut State, limit: &Limit, receipt: &Receipt, amount: u64, now: Nanos) -> u64 {
    if receipt.at.saturating_add(limit.period()) <= now {
        return 0;
    }
    let Ok(i) = state.entries.binary_search_by_key(&receipt.at, |&(t, _)| t) else {
        return 0;
    };
    let units = &mut state.entries[i].1;
    let back = amount.min(*units);
    *units -= back;
    state.total -= back;
    if *units == 0 {
        state.entries.remove(i);
    }
    back
}

/// A log with nothing in the window is fresh.
pub fn is_fresh(state: &State, limit: &Limit, now: Nanos) -> bool {
    expired(state, limit, now).1 == state.total
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Algorithm, MILLISECOND, SECOND};
    use proptest::prelude::*;

    const T0: Nanos = 1_700_000_000 * SECOND;

    fn log(limit: u64, period: Nanos) -> Limit {
        Limit::new(Algorithm::SlidingWindowLog, limit, period, None).unwrap()
    }

    fn check(s: &mut State, l: &Limit, now: Nanos, cost: u64) -> Decision {
        let d = decide(s, l, now, cost);
        if d.allowed() {
            commit(s, l, now, cost);
        }
        d
    }

    #[test]
    fn sliding_log_denies_burst_across_window_edge() {
        // Unlike a fixed window, 2 × limit cannot pass around an edge.
        let l = log(5, SECOND);
        let mut s = State::default();
        assert!(check(&mut s, &l, T0 + 900 * MILLISECOND, 5).allowed());
        let d = check(&mut s, &l, T0 + SECOND, 1);
        assert_eq!(
            d.verdict,
            Verdict::Deny {
                retry_after: 900 * MILLISECOND
            }
        );
        assert!(check(&mut s, &l, T0 + 1_900 * MILLISECOND, 5).allowed());
    }

    #[test]
    fn sliding_log_retry_after_frees_just_enough() {
        let l = log(3, SECOND);
        let mut s = State::default();
        for i in 0..3 {
            assert!(check(&mut s, &l, T0 + i * 100 * MILLISECOND, 1).allowed());
        }
        // Cost 2 needs the two oldest to leave: at T0 + 1.1 s.
        let d = check(&mut s, &l, T0 + 500 * MILLISECOND, 2);
        assert_eq!(
            d.verdict,
            Verdict::Deny {
                retry_after: 600 * MILLISECOND
            }
        );
        assert_eq!(d.reset_after, 700 * MILLISECOND);
        assert!(!check(&mut s, &l, T0 + 1_100 * MILLISECOND - 1, 2).allowed());
        assert!(check(&mut s, &l, T0 + 1_100 * MILLISECOND, 2).allowed());
    }

    #[test]
    fn sliding_log_does_not_log_denials_and_forgets_expired() {
        let l = log(2, SECOND);
        let mut s = State::default();
        check(&mut s, &l, T0, 2);
        for i in 0..100 {
            assert!(!check(&mut s, &l, T0 + i, 1).allowed());
        }
        assert_eq!(s.entries.len(), 1);
        assert!(is_fresh(&s, &l, T0 + SECOND));
        check(&mut s, &l, T0 + SECOND, 1);
        assert_eq!(s.entries.len(), 1);
        assert_eq!(s.total, 1);
    }

    #[test]
    fn sliding_log_entries_stay_within_limit() {
        let l = log(100, SECOND);
        let mut s = State::default();
        for i in 0..10_000u64 {
            check(&mut s, &l, T0 + i * MILLISECOND, 1);
            assert!(s.entries.len() <= 100);
        }
        assert!(s.entries.capacity() <= 4 * 100);
    }

    #[test]
    fn sliding_log_refund_reduces_the_reservations_entry() {
        let l = log(10, SECOND);
        let mut s = State::default();
        assert!(check(&mut s, &l, T0, 2).allowed());
        assert!(check(&mut s, &l, T0 + 100 * MILLISECOND, 6).allowed());
        let r = receipt(&s, &l, T0 + 100 * MILLISECOND);
        assert_eq!(r.at, T0 + 100 * MILLISECOND);
        assert!(check(&mut s, &l, T0 + 200 * MILLISECOND, 1).allowed());
        assert_eq!(refund(&mut s, &l, &r, 4, T0 + 300 * MILLISECOND), 4);
        assert_eq!(
            s.entries,
            [
                (T0, 2),
                (T0 + 100 * MILLISECOND, 2),
                (T0 + 200 * MILLISECOND, 1)
            ]
        );
        assert_eq!(decide(&s, &l, T0 + 300 * MILLISECOND, 0).remaining, 5);
        // All of it: the entry goes.
        assert_eq!(refund(&mut s, &l, &r, 9, T0 + 300 * MILLISECOND), 2);
        assert_eq!(s.entries, [(T0, 2), (T0 + 200 * MILLISECOND, 1)]);
        assert_eq!(s.total, 3);
    }

    #[test]
    fn sliding_log_refund_of_an_entry_that_left_the_window_gives_nothing() {
        let l = log(10, SECOND);
        let mut s = State::default();
        assert!(check(&mut s, &l, T0, 5).allowed());
        let r = receipt(&s, &l, T0);
        assert_eq!(refund(&mut s, &l, &r, 5, T0 + SECOND), 0);
        assert_eq!(refund(&mut s, &l, &r, 2, T0 + SECOND - 1), 2);
    }

    #[test]
    fn sliding_log_charge_past_the_limit_denies_until_it_leaves() {
        let l = log(10, SECOND);
        let mut s = State::default();
        assert!(check(&mut s, &l, T0, 8).allowed());
        commit(&mut s, &l, T0 + 100 * MILLISECOND, 6);
        let d = decide(&s, &l, T0 + 200 * MILLISECOND, 1);
        assert_eq!(d.remaining, 0);
        // 14 logged: 5 must leave for 1 to fit, and the first entry (8) does at T0 + 1 s.
        assert_eq!(
            d.verdict,
            Verdict::Deny {
                retry_after: 800 * MILLISECOND
            }
        );
    }

    proptest! {
        /// In every window of length `period`, admitted ≤ limit.
        #[test]
        fn sliding_log_is_exact_in_every_window(
            limit in 1u64..20, period_ms in 1u64..2_000,
            steps in proptest::collection::vec((0u64..700, 1u64..6), 1..150),
        ) {
            let l = log(limit, period_ms * MILLISECOND);
            let mut s = State::default();
            let mut now = T0;
            let mut admitted = Vec::new();
            for (dt, cost) in steps {
                now += dt * MILLISECOND / 2;
                if check(&mut s, &l, now, cost).allowed() {
                    admitted.push((now, cost));
                }
            }
            for &(start, _) in &admitted {
                let sum: u64 = admitted.iter()
                    .filter(|&&(t, _)| t >= start && t < start + l.period())
                    .map(|&(_, c)| c).sum();
                prop_assert!(sum <= limit);
            }
        }
    }
}
