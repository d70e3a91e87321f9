//! Token bucket: holds up to `burst` tokens, refilled at `limit` per `period`; a check of cost
//! `c` is admitted when the bucket holds at least `c` tokens, and spends them.
//!
//! Tokens are kept in scaled units (one token = `period` units, one nanosecond refills `limit`
//! units), so the refill is exact integer arithmetic for any rate. Pure: no I/O, no clock.
//!
//! Admissions over any interval of length `t` never exceed `burst + limit × t / period`
//! (property-tested below).

use super::{Decision, Limit, Nanos, Verdict, div_ceil_nanos, div_u64};

/// One key's bucket. The default (empty, last refilled at the epoch) behaves as a full bucket
/// at any real time, because the refill since 1970 fills it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct State {
    /// Tokens in scaled units, as of `last`.
    tokens: u128,
    /// When `tokens` was last brought up to date.
    last: Nanos,
}

fn capacity(limit: &Limit) -> u128 {
    u128::from(limit.burst()) * u128::from(limit.period())
}

/// Tokens (scaled) the bucket holds at `now`. A clock that stepped back refills nothing.
fn level(state: &State, limit: &Limit, now: Nanos) -> u128 {
    let elapsed = u128::from(now.saturating_sub(state.last));
    state
        .tokens
        .saturating_add(elapsed.saturating_mul(u128::from(limit.limit())))
        .min(capacity(limit))
}

/// Decides `cost` at `now` without changing `state`.
pub fn decide(state: &State, limit: &Limit, now: Nanos, cost: u64) -> Decision {
    let period = u128::from(limit.period());
    let rate = u128::from(limit.limit());
    let cap = capacity(limit);
    let tokens = level(state, limit, now);
    let refill_time = |tokens: u128| div_ceil_nanos(cap - tokens, rate);
    if cost > limit.burst() {
        return Decision {
            verdict: Verdict::Never,
            limit: limit.limit(),
            remaining: div_u64(tokens, period),
            reset_after: refill_time(tokens),
        };
    }
    let need = u128::from(cost) * period;
    if tokens >= need {
        let left = tokens - need;
        Decision {
            verdict: Verdict::Admit { wait: 0 },
            limit: limit.limit(),
            remaining: div_u64(left, period),
            reset_after: refill_time(left),
        }
    } else {
        Decision {
            verdict: Verdict::Deny {
                retry_after: div_ceil_nanos(need - tokens, rate),
            },
            limit: limit.limit(),
            remaining: div_u64(tokens, period),
            reset_after: refill_time(tokens),
        }
    }
}

/// Spends `cost` tokens at `now`; `decide` must have admitted it.
pub fn commit(state: &mut State, limit: &Limit, now: Nanos, cost: u64) {
    let tokens = level(state, limit, now);
    state.tokens = tokens.saturating_sub(u128::from(cost) * u128::from(limit.period()));
    state.last = state.last.max(now);
}

/// A full bucket is a fresh one.
pub fn is_fresh(state: &State, limit: &Limit, now: Nanos) -> bool {
    level(state, limit, now) == capacity(limit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Algorithm, MILLISECOND, SECOND};
    use proptest::prelude::*;

    const T0: Nanos = 1_700_000_000 * SECOND;

    fn bucket(limit: u64, period: Nanos, burst: u64) -> Limit {
        Limit::new(Algorithm::TokenBucket, limit, period, Some(burst)).unwrap()
    }

    fn check(s: &mut State, l: &Limit, now: Nanos, cost: u64) -> Decision {
        let d = decide(s, l, now, cost);
        if d.allowed() {
            commit(s, l, now, cost);
        }
        d
    }

    #[test]
    fn token_bucket_admits_burst_then_refills_at_rate() {
        let l = bucket(10, SECOND, 20);
        let mut s = State::default();
        for i in 0..20 {
            let d = check(&mut s, &l, T0, 1);
            assert!(d.allowed());
            assert_eq!(d.remaining, 19 - i);
        }
        let d = check(&mut s, &l, T0, 1);
        assert_eq!(
            d.verdict,
            Verdict::Deny {
                retry_after: 100 * MILLISECOND
            }
        );
        assert_eq!(d.reset_after, 2 * SECOND);
        assert!(!check(&mut s, &l, T0 + 99 * MILLISECOND, 1).allowed());
        assert!(check(&mut s, &l, T0 + 100 * MILLISECOND, 1).allowed());
        assert!(!check(&mut s, &l, T0 + 100 * MILLISECOND, 1).allowed());
    }

    #[test]
    fn token_bucket_is_exact_for_rates_that_do_not_divide_a_nanosecond() {
        // 1 token per 3 s: the retry time is exact, not rounded per refill.
        let l = bucket(1, 3 * SECOND, 1);
        let mut s = State::default();
        assert!(check(&mut s, &l, T0, 1).allowed());
        assert_eq!(
            decide(&s, &l, T0 + 1, 1).verdict,
            Verdict::Deny {
                retry_after: 3 * SECOND - 1
            }
        );
        // 3 tokens per 1 s, repeatedly: 3 tokens after exactly 1 s, not a nanosecond sooner.
        let l3 = bucket(3, SECOND, 3);
        let mut s3 = State::default();
        let mut now = T0;
        for _ in 0..100 {
            assert!(check(&mut s3, &l3, now, 3).allowed());
            assert!(!check(&mut s3, &l3, now + SECOND - 1, 3).allowed());
            now += SECOND;
        }
    }

    #[test]
    fn token_bucket_cost_above_burst_is_never() {
        let l = bucket(10, SECOND, 20);
        let s = State::default();
        assert_eq!(decide(&s, &l, T0, 21).verdict, Verdict::Never);
        assert!(decide(&s, &l, T0, 20).allowed());
    }

    #[test]
    fn token_bucket_clock_step_back_refills_nothing() {
        let l = bucket(1, SECOND, 1);
        let mut s = State::default();
        assert!(check(&mut s, &l, T0, 1).allowed());
        assert!(!check(&mut s, &l, T0 - 10 * SECOND, 1).allowed());
        assert!(check(&mut s, &l, T0 + SECOND, 1).allowed());
    }

    #[test]
    fn token_bucket_fresh_once_full() {
        let l = bucket(10, SECOND, 10);
        let mut s = State::default();
        assert!(is_fresh(&s, &l, T0));
        check(&mut s, &l, T0, 5);
        assert!(!is_fresh(&s, &l, T0 + 499 * MILLISECOND));
        assert!(is_fresh(&s, &l, T0 + 500 * MILLISECOND));
    }

    proptest! {
        /// Over every prefix of a run, admitted ≤ burst + rate × elapsed.
        #[test]
        fn token_bucket_never_admits_more_than_burst_plus_rate(
            limit in 1u64..50, burst in 1u64..50, period_ms in 1u64..5_000,
            steps in proptest::collection::vec((0u64..2_000, 1u64..10), 1..200),
        ) {
            let l = bucket(limit, period_ms * MILLISECOND, burst);
            let mut s = State::default();
            let mut now = T0;
            let mut admitted: u128 = 0;
            for (dt_ms, cost) in steps {
                now += dt_ms * MILLISECOND / 10;
                if check(&mut s, &l, now, cost).allowed() {
                    admitted += u128::from(cost);
                }
                let elapsed = u128::from(now - T0);
                let bound = u128::from(burst) * u128::from(l.period())
                    + elapsed * u128::from(limit);
                prop_assert!(admitted * u128::from(l.period()) <= bound);
            }
        }

        /// A denial's retry_after is exact: one nanosecond earlier is still denied, at
        /// retry_after the same check is admitted.
        #[test]
        fn token_bucket_retry_after_is_exact(
            limit in 1u64..50, burst in 1u64..50, period_ms in 1u64..5_000,
            spend in 0u64..50, cost in 1u64..50,
        ) {
            let l = bucket(limit, period_ms * MILLISECOND, burst);
            let mut s = State::default();
            let spend = spend.min(burst);
            if spend > 0 { check(&mut s, &l, T0, spend); }
            if let Verdict::Deny { retry_after } = decide(&s, &l, T0, cost).verdict {
                prop_assert!(retry_after > 0);
                prop_assert!(!decide(&s, &l, T0 + retry_after - 1, cost).allowed());
                prop_assert!(decide(&s, &l, T0 + retry_after, cost).allowed());
            }
        }
    }
}
