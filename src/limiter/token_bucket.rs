//! Token bucket: holds up to `burst` tokens, refilled at `limit` per `period`; a check of cost
//! `c` is admitted when the bucket holds at least `c` tokens, and spends them.
//!
//! Tokens are kept in scaled units (one token = `period` units, one nanosecond refills `limit`
//! units), so the refill is exact integer arithmetic for any rate. Pure: no I/O, no clock.
//!
//! Admissions over any interval of length `t` never exceed `burst + limit × t / period`
//! (property-tested below).
//!
//! Debt: a cost charged beyond the tokens held (a settle's actual cost above its
//! reservation) empties the bucket and moves `last` past `now` by the time the refill needs
//! to make up the shortfall; nothing refills before `last`, so the key is denied until then.

use super::{Decision, Limit, Nanos, Receipt, Verdict, div_ceil_nanos, div_u64};

/// One key's bucket. The default (empty, last refilled at the epoch) behaves as a full bucket
/// at any real time, because the refill since 1970 fills it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct State {
    /// Tokens in scaled units, as of `last`.
    tokens: u128,
    /// When `tokens` was last brought up to date; refilling resumes from here. Later than
    /// `now` when the key owes tokens (or the clock stepped back): nothing refills until then.
    last: Nanos,
    /// Whole tokens put back by refunds, ever (wrapping): see [`refund`].
    refunded: u64,
}

fn capacity(limit: &Limit) -> u128 {
    u128::from(limit.burst()) * u128::from(limit.period())
}

/// Tokens (scaled) the bucket holds at `now`. A clock that stepped back (or a debt) refills
/// nothing before `last`.
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
    // Nothing refills before `last` (a debt, or a clock that stepped back).
    let ahead = state.last.saturating_sub(now);
    let refill_time = |tokens: u128| ahead.saturating_add(div_ceil_nanos(cap - tokens, rate));
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
                retry_after: ahead.saturating_add(div_ceil_nanos(need - tokens, rate)),
            },
            limit: limit.limit(),
            remaining: div_u64(tokens, period),
            reset_after: refill_time(tokens),
        }
    }
}

/// Spends `cost` tokens at `now`. If the bucket holds fewer (`decide` did not admit it), it
/// is emptied and owes the rest: nothing refills until the shortfall would have.
pub fn commit(state: &mut State, limit: &Limit, now: Nanos, cost: u64) {
    let tokens = level(state, limit, now);
    let need = u128::from(cost) * u128::from(limit.period());
    state.last = state.last.max(now);
    if tokens >= need {
        state.tokens = tokens - need;
    } else {
        let short = div_ceil_nanos(need - tokens, u128::from(limit.limit()));
        state.tokens = 0;
        state.last = state.last.saturating_add(short);
    }
}

/// How far below full the bucket stood right after the charge just committed at `now`.
pub fn receipt(state: &State, limit: &Limit, now: Nanos) -> Receipt {
    Receipt {
        at: now,
        room: capacity(limit) - level(state, limit, now),
        refunded: state.refunded,
    }
}

/// Carries a key's bucket from `old` to `new` at `now`, a limit of the same period with
/// another rate or burst (a reload): the tokens spent carry over, not the tokens left, so a
/// raised burst gives the key the extra room at once (an idle key is full under the new
/// burst) and a cut one takes it away. Refilling goes on from now at the new rate.
pub fn relimit(state: &mut State, old: &Limit, new: &Limit, now: Nanos) {
    let spent = capacity(old) - level(state, old, now);
    state.tokens = capacity(new).saturating_sub(spent);
    state.last = state.last.max(now);
}

/// Puts back up to `amount` tokens of the charge `receipt` describes, at `now`.
///
/// Why not all of them: the refill since the charge may have reached the cap, where a bucket
/// charged less would have lost the excess; tokens put back now would then let it admit more
/// than that bucket. The charge left the bucket `receipt.room` below full, and the refill
/// since (`limit × elapsed`) can have closed at most that gap, so what is left of it,
/// `room − limit × (now − at)`, could not have been lost to the cap by a bucket charged less,
/// whatever was admitted in between: up to that much is put back. Refunds of other charges
/// since this one closed the gap too (a bucket charged less would have had them as well), so
/// they come off it first. Settled at once, all of it; once the bucket would have been full
/// anyway, nothing (and nothing is lost: a bucket that refilled to full holds what the
/// smaller charge would have left it).
pub fn refund(state: &mut State, limit: &Limit, receipt: &Receipt, amount: u64, now: Nanos) -> u64 {
    let period = u128::from(limit.period());
    let rate = u128::from(limit.limit());
    let refilled = u128::from(now.saturating_sub(receipt.at)) * rate;
    let others = u128::from(state.refunded.wrapping_sub(receipt.refunded)) * period;
    let left = receipt.room.saturating_sub(refilled).saturating_sub(others);
    let back = amount.min(div_u64(left, period));
    if back == 0 {
        return 0;
    }
    state.refunded = state.refunded.wrapping_add(back);
    let mut give = u128::from(back) * period;
    if state.last > now {
        // First pay off what the bucket owes (the time before it refills again).
        let owed = u128::from(state.last - now) * rate;
        if give < owed {
            // Rounded down: the debt shrinks by no more than was given.
            state.last -= u64::try_from(give / rate).unwrap_or(u64::MAX);
            return back;
        }
        give -= owed;
        state.last = now;
    }
    state.tokens = (level(state, limit, now) + give).min(capacity(limit));
    state.last = state.last.max(now);
    back
}

/// A full bucket, refilling from now on, is a fresh one.
pub fn is_fresh(state: &State, limit: &Limit, now: Nanos) -> bool {
    state.last <= now && level(state, limit, now) == capacity(limit)
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

    fn reserve(s: &mut State, l: &Limit, now: Nanos, cost: u64) -> Receipt {
        assert!(check(s, l, now, cost).allowed());
        receipt(s, l, now)
    }

    #[test]
    fn token_bucket_refund_at_once_puts_back_all_of_it() {
        let l = bucket(10, SECOND, 20);
        let mut s = State::default();
        let r = reserve(&mut s, &l, T0, 15);
        assert_eq!(refund(&mut s, &l, &r, 12, T0), 12);
        assert_eq!(decide(&s, &l, T0, 0).remaining, 17);
        // Capped at what the charge left below full.
        let mut t = State::default();
        let r = reserve(&mut t, &l, T0, 3);
        assert_eq!(refund(&mut t, &l, &r, 100, T0), 3);
        assert!(is_fresh(&t, &l, T0));
    }

    #[test]
    fn token_bucket_refund_shrinks_by_what_refilled_since() {
        // 10/s, burst 20: a full bucket reserves 20. A second later 10 have refilled. Had the
        // reservation been 5, the bucket would be full (15 + 10, capped at 20): 10 back, not 15.
        let l = bucket(10, SECOND, 20);
        let mut s = State::default();
        let r = reserve(&mut s, &l, T0, 20);
        assert_eq!(refund(&mut s, &l, &r, 15, T0 + SECOND), 10);
        assert_eq!(decide(&s, &l, T0 + SECOND, 0).remaining, 20);
    }

    #[test]
    fn token_bucket_refund_takes_off_what_other_refunds_put_back_since() {
        // 10/s, burst 10: two reservations, 5 then 4, from a full bucket (1 left). The first
        // is settled for nothing at once (5 back: 6). 300 ms on, 3 have refilled and a check
        // spends 3 (6). A bucket that never took the 4 would have been at 10 then, lost 3 to
        // its cap, and spent 3: 7. So only 1 of the 4 may come back, not the 4 its own room
        // alone allows (found by `reserve_then_settle_never_admits_more_than_checks_of_the_
        // actual_cost`).
        let l = bucket(10, SECOND, 10);
        let mut s = State::default();
        let a = reserve(&mut s, &l, T0, 5);
        let b = reserve(&mut s, &l, T0, 4);
        assert_eq!(refund(&mut s, &l, &a, 5, T0), 5);
        let later = T0 + 300 * MILLISECOND;
        assert!(check(&mut s, &l, later, 3).allowed());
        assert_eq!(refund(&mut s, &l, &b, 4, later), 1);
        assert_eq!(decide(&s, &l, later, 0).remaining, 7);
    }

    #[test]
    fn token_bucket_refund_after_the_bucket_refilled_and_was_spent_gives_nothing() {
        // The refill reached the cap before the settle and was spent: a bucket charged
        // nothing would have lost the same tokens to the cap, so none may come back.
        let l = bucket(1, SECOND, 10);
        let mut s = State::default();
        let r = reserve(&mut s, &l, T0, 10);
        assert!(check(&mut s, &l, T0 + 10 * SECOND, 10).allowed());
        assert_eq!(refund(&mut s, &l, &r, 10, T0 + 10 * SECOND), 0);
        assert!(!check(&mut s, &l, T0 + 10 * SECOND, 1).allowed());
    }

    #[test]
    fn token_bucket_charge_beyond_its_tokens_is_owed() {
        let l = bucket(10, SECOND, 20);
        let mut s = State::default();
        assert!(check(&mut s, &l, T0, 15).allowed());
        commit(&mut s, &l, T0, 15); // a settle's extra: 10 more than the bucket held
        let d = decide(&s, &l, T0, 1);
        assert_eq!(d.remaining, 0);
        // 10 owed (1 s), then 1 token (100 ms).
        assert_eq!(
            d.verdict,
            Verdict::Deny {
                retry_after: 1_100 * MILLISECOND
            }
        );
        assert_eq!(d.reset_after, 3 * SECOND);
        assert!(!is_fresh(&s, &l, T0 + 2 * SECOND));
        assert!(!check(&mut s, &l, T0 + 1_099 * MILLISECOND, 1).allowed());
        assert!(check(&mut s, &l, T0 + 1_100 * MILLISECOND, 1).allowed());
        assert!(is_fresh(&s, &l, T0 + 3_100 * MILLISECOND));
    }

    #[test]
    fn token_bucket_refund_pays_off_a_debt_first() {
        let l = bucket(10, SECOND, 20);
        let mut s = State::default();
        let r = reserve(&mut s, &l, T0, 10);
        commit(&mut s, &l, T0, 20); // owes 10: refills from T0 + 1 s
        assert_eq!(refund(&mut s, &l, &r, 5, T0), 5);
        // Owes 5: 500 ms, then a token in 100 ms.
        assert_eq!(
            decide(&s, &l, T0, 1).verdict,
            Verdict::Deny {
                retry_after: 600 * MILLISECOND
            }
        );
        let r = reserve(&mut s, &l, T0 + 3 * SECOND, 20);
        commit(&mut s, &l, T0 + 3 * SECOND, 2);
        assert_eq!(refund(&mut s, &l, &r, 20, T0 + 3 * SECOND), 20);
        assert_eq!(decide(&s, &l, T0 + 3 * SECOND, 0).remaining, 18);
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
