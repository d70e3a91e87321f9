//! Leaky bucket as a meter: a bucket of capacity `burst` that drains at `limit` per `period`.
//! A check of cost `c` pours `c` units in; it conforms when the bucket does not overflow. Up to
//! `burst` pass back to back, then admissions are spaced at the leak rate.
//!
//! - **Policing** (`max_wait` = 0): a non-conforming check is denied.
//! - **Shaping** (`max_wait` > 0): a check that would conform within `max_wait` reserves its
//!   place now (the water is poured at once, above the brim) and the caller is held until the
//!   level has drained to where it fits. Because the reservation is part of the state, the
//!   next caller queues behind it: concurrent waiters leave evenly spaced, `period / limit`
//!   apart per unit, and the output never exceeds the leak rate.
//!
//! The state is one number: the scaled time at which the bucket will be empty (the
//! "theoretical arrival time" of GCRA, which is this meter in other words). Policing makes
//! exactly the decisions a token bucket with the same parameters makes — a test checks it —
//! the difference is shaping. Pure: no I/O, no clock.

use super::{Decision, Limit, Nanos, Receipt, Verdict, div_ceil_nanos, div_u64};

/// One key's meter.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct State {
    /// Scaled time (nanoseconds × `limit`) at which the bucket drains empty, reservations
    /// included. At or before the current time, the bucket is empty.
    empty_at: u128,
    /// Whole units taken back out by refunds, ever (wrapping): see [`refund`].
    refunded: u64,
}

/// The bucket's content at `now`, in scaled units (one unit of cost = `period`).
fn level(state: &State, limit: &Limit, now: Nanos) -> u128 {
    state
        .empty_at
        .saturating_sub(u128::from(now) * u128::from(limit.limit()))
}

/// Decides `cost` at `now` without changing `state`. With `max_wait` > 0 a check that fits
/// within `max_wait` is admitted with that wait.
pub fn decide(state: &State, limit: &Limit, now: Nanos, cost: u64, max_wait: Nanos) -> Decision {
    let period = u128::from(limit.period());
    let rate = u128::from(limit.limit());
    let cap = u128::from(limit.burst()) * period;
    let level = level(state, limit, now);
    let remaining = |level: u128| div_u64(cap.saturating_sub(level), period);
    if cost > limit.burst() {
        return Decision {
            verdict: Verdict::Never,
            limit: limit.limit(),
            remaining: remaining(level),
            reset_after: div_ceil_nanos(level, rate),
        };
    }
    let after = level + u128::from(cost) * period;
    let wait = div_ceil_nanos(after.saturating_sub(cap), rate);
    if wait <= max_wait {
        Decision {
            verdict: Verdict::Admit { wait },
            limit: limit.limit(),
            remaining: remaining(after),
            reset_after: div_ceil_nanos(after, rate),
        }
    } else {
        Decision {
            verdict: Verdict::Deny { retry_after: wait },
            limit: limit.limit(),
            remaining: remaining(level),
            reset_after: div_ceil_nanos(level, rate),
        }
    }
}

/// Pours `cost` in at `now` (reserving a place if the caller is to wait). A cost `decide` did
/// not admit overflows the brim: the bucket then denies until it has drained below it.
pub fn commit(state: &mut State, limit: &Limit, now: Nanos, cost: u64) {
    let now_scaled = u128::from(now) * u128::from(limit.limit());
    state.empty_at = state.empty_at.max(now_scaled) + u128::from(cost) * u128::from(limit.period());
}

/// The bucket's level right after the charge just committed at `now`.
pub fn receipt(state: &State, limit: &Limit, now: Nanos) -> Receipt {
    Receipt {
        at: now,
        room: level(state, limit, now),
        refunded: state.refunded,
    }
}

/// Takes up to `amount` units of the charge `receipt` describes back out of the bucket, at
/// `now`.
///
/// The mirror of [`token_bucket::refund`](super::token_bucket::refund): a bucket that drains
/// empty loses its deficit, so only what the charge's level minus the drain since
/// (`room − limit × (now − at)`) still holds can come out, less what refunds of other charges
/// since took out; the bucket never goes below empty. `shaping`: callers may have been given
/// places behind the charge (waits), which already fixed when they leave; taking the charge
/// out from under them would let later callers leave alongside them. So a shaping rule gives back only while nothing was poured
/// after the charge (it is still the bucket's last).
pub fn refund(
    state: &mut State,
    limit: &Limit,
    receipt: &Receipt,
    amount: u64,
    now: Nanos,
    shaping: bool,
) -> u64 {
    let period = u128::from(limit.period());
    let rate = u128::from(limit.limit());
    if shaping && state.empty_at != receipt.room + u128::from(receipt.at) * rate {
        return 0;
    }
    let drained = u128::from(now.saturating_sub(receipt.at)) * rate;
    // Refunds of other charges since this one took from the same level.
    let others = u128::from(state.refunded.wrapping_sub(receipt.refunded)) * period;
    let back = amount
        .min(div_u64(
            receipt.room.saturating_sub(drained).saturating_sub(others),
            period,
        ))
        .min(div_u64(level(state, limit, now), period));
    state.empty_at -= u128::from(back) * period;
    state.refunded = state.refunded.wrapping_add(back);
    back
}

/// An empty bucket is a fresh one.
pub fn is_fresh(state: &State, limit: &Limit, now: Nanos) -> bool {
    level(state, limit, now) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Algorithm, MILLISECOND, SECOND, token_bucket};
    use proptest::prelude::*;

    const T0: Nanos = 1_700_000_000 * SECOND;

    fn meter(limit: u64, period: Nanos, burst: u64) -> Limit {
        Limit::new(Algorithm::LeakyBucket, limit, period, Some(burst)).unwrap()
    }

    fn check(s: &mut State, l: &Limit, now: Nanos, cost: u64, max_wait: Nanos) -> Decision {
        let d = decide(s, l, now, cost, max_wait);
        if d.allowed() {
            commit(s, l, now, cost);
        }
        d
    }

    #[test]
    fn leaky_bucket_passes_burst_back_to_back_then_spaces_at_leak_rate() {
        let l = meter(10, SECOND, 5);
        let mut s = State::default();
        for _ in 0..5 {
            assert!(check(&mut s, &l, T0, 1, 0).allowed());
        }
        assert_eq!(
            check(&mut s, &l, T0, 1, 0).verdict,
            Verdict::Deny {
                retry_after: 100 * MILLISECOND
            }
        );
        // Then one every 100 ms.
        for i in 1..=10 {
            let now = T0 + i * 100 * MILLISECOND;
            assert!(check(&mut s, &l, now, 1, 0).allowed(), "at step {i}");
            assert!(!check(&mut s, &l, now, 1, 0).allowed(), "at step {i}");
        }
    }

    #[test]
    fn leaky_bucket_shaping_reserves_evenly_spaced_places() {
        let l = meter(10, SECOND, 2);
        let mut s = State::default();
        let max_wait = SECOND;
        let waits: Vec<_> = (0..14)
            .map(|_| check(&mut s, &l, T0, 1, max_wait).verdict)
            .collect();
        // Two pass at once, then one place every 100 ms up to the 1 s limit on waiting.
        let mut expected = vec![Verdict::Admit { wait: 0 }; 2];
        expected.extend((1..=10).map(|i| Verdict::Admit {
            wait: i * 100 * MILLISECOND,
        }));
        expected.push(Verdict::Deny {
            retry_after: 1_100 * MILLISECOND,
        });
        expected.push(Verdict::Deny {
            retry_after: 1_100 * MILLISECOND,
        });
        assert_eq!(waits, expected);
    }

    #[test]
    fn leaky_bucket_cost_above_burst_is_never_even_when_shaping() {
        let l = meter(10, SECOND, 2);
        let s = State::default();
        assert_eq!(
            decide(&s, &l, T0, 3, 3_600 * SECOND).verdict,
            Verdict::Never
        );
    }

    #[test]
    fn leaky_bucket_fresh_once_drained() {
        let l = meter(10, SECOND, 10);
        let mut s = State::default();
        check(&mut s, &l, T0, 4, 0);
        assert!(!is_fresh(&s, &l, T0 + 399 * MILLISECOND));
        assert!(is_fresh(&s, &l, T0 + 400 * MILLISECOND));
    }

    fn reserve(s: &mut State, l: &Limit, now: Nanos, cost: u64, max_wait: Nanos) -> Receipt {
        assert!(check(s, l, now, cost, max_wait).allowed());
        receipt(s, l, now)
    }

    #[test]
    fn leaky_bucket_refund_takes_out_what_has_not_drained() {
        let l = meter(10, SECOND, 20);
        let mut s = State::default();
        let r = reserve(&mut s, &l, T0, 20, 0);
        let mut at_once = s.clone();
        assert_eq!(refund(&mut at_once, &l, &r, 5, T0, false), 5);
        assert_eq!(decide(&at_once, &l, T0, 0, 0).remaining, 5);
        // 1 s later 10 have drained. Had the charge been 5, the bucket would have drained
        // empty half a second ago and lost the rest of the drain: only 10 of 15 come out.
        assert_eq!(refund(&mut s, &l, &r, 15, T0 + SECOND, false), 10);
        assert!(is_fresh(&s, &l, T0 + SECOND));
    }

    #[test]
    fn leaky_bucket_refund_takes_off_what_other_refunds_took_out_since() {
        // 10/s, burst 10: two charges, 5 then 4, into an empty bucket (9). The first is
        // settled for nothing at once (4). 300 ms on, 3 have drained and a check pours 3 (4).
        // A bucket that never took the 4 would have drained empty, lost 3, and held 3: only
        // 1 of the 4 may come out.
        let l = meter(10, SECOND, 10);
        let mut s = State::default();
        let a = reserve(&mut s, &l, T0, 5, 0);
        let b = reserve(&mut s, &l, T0, 4, 0);
        assert_eq!(refund(&mut s, &l, &a, 5, T0, false), 5);
        let later = T0 + 300 * MILLISECOND;
        assert!(check(&mut s, &l, later, 3, 0).allowed());
        assert_eq!(refund(&mut s, &l, &b, 4, later, false), 1);
        assert_eq!(decide(&s, &l, later, 0, 0).remaining, 7);
    }

    #[test]
    fn leaky_bucket_shaping_refunds_only_the_last_charge() {
        let l = meter(10, SECOND, 2);
        let wait = SECOND;
        let mut s = State::default();
        let r = reserve(&mut s, &l, T0, 2, wait);
        // Nothing poured since: the whole reservation can come out.
        let mut alone = s.clone();
        assert_eq!(refund(&mut alone, &l, &r, 2, T0, true), 2);
        // A caller was given a place behind it (leaving in 100 ms): taking the reservation out
        // would let the next caller leave at once, beside it. Nothing comes back.
        assert_eq!(
            check(&mut s, &l, T0, 1, wait).verdict,
            Verdict::Admit {
                wait: 100 * MILLISECOND
            }
        );
        let before = s.clone();
        assert_eq!(refund(&mut s, &l, &r, 2, T0, true), 0);
        assert_eq!(s, before);
        // Policing (no places given out), the same refund is safe.
        assert_eq!(refund(&mut s, &l, &r, 2, T0, false), 2);
    }

    proptest! {
        /// Policing is the token bucket seen from the other side: same decisions, always.
        #[test]
        fn leaky_bucket_policing_decides_as_token_bucket(
            limit in 1u64..50, burst in 1u64..50, period_ms in 1u64..5_000,
            steps in proptest::collection::vec((0u64..2_000, 0u64..60), 1..200),
        ) {
            let lb = meter(limit, period_ms * MILLISECOND, burst);
            let tb = Limit::new(Algorithm::TokenBucket, limit, period_ms * MILLISECOND, Some(burst)).unwrap();
            let (mut ls, mut ts) = (State::default(), token_bucket::State::default());
            let mut now = T0;
            for (dt, cost) in steps {
                now += dt * MILLISECOND / 7;
                let a = check(&mut ls, &lb, now, cost, 0);
                let b = token_bucket::decide(&ts, &tb, now, cost);
                if b.allowed() { token_bucket::commit(&mut ts, &tb, now, cost); }
                prop_assert_eq!(a, b);
            }
        }

        /// With shaping, the times at which callers leave never exceed burst + rate × t.
        #[test]
        fn leaky_bucket_shaped_departures_respect_the_leak_rate(
            limit in 1u64..20, burst in 1u64..20, period_ms in 10u64..2_000,
            max_wait_ms in 0u64..3_000,
            steps in proptest::collection::vec((0u64..500, 1u64..5), 1..150),
        ) {
            let l = meter(limit, period_ms * MILLISECOND, burst);
            let mut s = State::default();
            let mut now = T0;
            let mut departures = Vec::new();
            for (dt, cost) in steps {
                now += dt * MILLISECOND;
                let d = check(&mut s, &l, now, cost, max_wait_ms * MILLISECOND);
                if let Verdict::Admit { wait } = d.verdict {
                    prop_assert!(wait <= max_wait_ms * MILLISECOND);
                    departures.push((now + wait, cost));
                }
            }
            departures.sort();
            // Any window [a, b] of departures carries at most burst + rate × (b - a). Waits
            // are rounded up to whole nanoseconds, so a departure may be up to 1 ns later than
            // its exact time, which can shorten a window by that much: allow 1 ns.
            for i in 0..departures.len() {
                let mut sum = 0u128;
                for &(t, c) in &departures[i..] {
                    sum += u128::from(c);
                    let span = u128::from(t - departures[i].0) + 1;
                    prop_assert!(
                        sum * u128::from(l.period())
                            <= u128::from(burst) * u128::from(l.period()) + span * u128::from(limit)
                    );
                }
            }
        }
    }
}
