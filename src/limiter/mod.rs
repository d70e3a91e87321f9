//! Pure rate-limit algorithms.
//!
//! Every function here is a plain function of `(state, now, cost)`: no I/O, no clock reads, no
//! locks. The engine reads the clock and owns concurrency; this module only decides.
//!
//! Each algorithm exposes the same three steps so that a rule with several limits can be
//! checked atomically (see [`KeyState`]):
//! - `decide(&state, limit, now, cost, max_wait) -> Decision` says what *would* happen;
//! - `commit(&mut state, limit, now, cost)` records an admission that `decide` allowed;
//! - `is_fresh(&state, limit, now)` says whether the state equals a fresh key's, so the key
//!   can be evicted without changing any future decision.
//!
//! A reservation (`POST /v1/reserve`, then `/v1/settle`) adds two steps:
//! - `receipt(&state, limit, now)`, taken right after a commit, says where the charge went;
//! - `refund(&mut state, limit, &receipt, amount, now)` gives back up to `amount` units of
//!   that charge, only as far as the state then admits no more than it would have had the
//!   charge been `amount` smaller (a closed window gets nothing back; a bucket gets back
//!   less the longer it has refilled since, see each algorithm).
//!
//! `commit` also takes a cost `decide` did not admit (a settle's actual cost above the
//! reservation: the work already happened): the state then owes it, and denies until the
//! debt has passed (a window counts past its limit, a token bucket refills nothing until the
//! shortfall is made up).
//!
//! A status query is `decide` with cost 0, which always admits and reports what is left.
//!
//! Time is [`Nanos`] since the Unix epoch. Bucket algorithms compute in *scaled* integer
//! units (time × limit, cost × period) in `u128`, so a rate such as 1 per 3 s is exact and no
//! rounding error accumulates.

pub mod fixed_window;
pub mod leaky_bucket;
pub mod sliding_counter;
pub mod sliding_log;
pub mod token_bucket;

use std::fmt;

/// Nanoseconds since the Unix epoch (or a duration in nanoseconds).
pub type Nanos = u64;

/// One millisecond in [`Nanos`].
pub const MILLISECOND: Nanos = 1_000_000;
/// One second in [`Nanos`].
pub const SECOND: Nanos = 1_000_000_000;

/// The largest `limit` a sliding window log accepts: the log holds at most one entry per
/// admitted unit of cost, 16 bytes each, so this bounds one key's log to 160 KiB (320 KiB
/// while its ring buffer grows).
pub const MAX_LOG_LIMIT: u64 = 10_000;
/// The largest `limit` or `burst` any algorithm accepts (keeps scaled arithmetic in `u128`).
pub const MAX_LIMIT: u64 = 1 << 40;
/// The shortest period accepted.
pub const MIN_PERIOD: Nanos = MILLISECOND;
/// The longest period accepted (366 days).
pub const MAX_PERIOD: Nanos = 366 * 24 * 3600 * SECOND;

/// Which algorithm a limit runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Refills `limit` tokens per `period` up to `burst`; a check spends `cost` tokens.
    TokenBucket,
    /// A meter of capacity `burst` draining at `limit` per `period`; can shape (queue) callers.
    LeakyBucket,
    /// Counts per window aligned to multiples of `period` since the Unix epoch.
    FixedWindow,
    /// Exact: remembers every admission of the last `period`.
    SlidingWindowLog,
    /// Previous window's count weighted by its overlap with the sliding window, plus the current.
    SlidingWindowCounter,
}

impl Algorithm {
    /// Every algorithm, in documentation order.
    pub const ALL: [Algorithm; 5] = [
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowLog,
        Algorithm::SlidingWindowCounter,
    ];

    /// The name used in config files.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::LeakyBucket => "leaky_bucket",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindowLog => "sliding_window_log",
            Algorithm::SlidingWindowCounter => "sliding_window_counter",
        }
    }

    /// Parses a config name.
    pub fn from_name(name: &str) -> Option<Algorithm> {
        Algorithm::ALL.into_iter().find(|a| a.name() == name)
    }

    /// Whether `burst` means anything for this algorithm (windowed ones count to `limit`).
    pub fn has_burst(self) -> bool {
        matches!(self, Algorithm::TokenBucket | Algorithm::LeakyBucket)
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a [`Limit`] could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// `limit` was 0 or above [`MAX_LIMIT`].
    #[error("limit must be between 1 and {MAX_LIMIT}, got {0}")]
    Limit(u64),
    /// `burst` was 0 or above [`MAX_LIMIT`].
    #[error("burst must be between 1 and {MAX_LIMIT}, got {0}")]
    Burst(u64),
    /// `burst` was set to something other than `limit` for a windowed algorithm.
    #[error("burst applies only to token_bucket and leaky_bucket; {0} counts up to limit")]
    BurstNotApplicable(Algorithm),
    /// `period` outside [`MIN_PERIOD`, `MAX_PERIOD`].
    #[error("period must be between 1ms and 366d")]
    Period,
    /// A sliding window log above [`MAX_LOG_LIMIT`].
    #[error(
        "sliding_window_log keeps one entry per admitted unit, so limit may be at most {MAX_LOG_LIMIT} (got {0}); use sliding_window_counter for larger limits"
    )]
    LogTooLarge(u64),
}

/// One validated limit: `limit` units per `period`, with a `burst` capacity for buckets.
///
/// Built only through [`Limit::new`], so `limit`, `burst` and `period` are never zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Limit {
    algorithm: Algorithm,
    limit: u64,
    period: Nanos,
    burst: u64,
}

impl Limit {
    /// Validates and builds a limit. `burst` defaults to `limit`.
    pub fn new(
        algorithm: Algorithm,
        limit: u64,
        period: Nanos,
        burst: Option<u64>,
    ) -> Result<Limit, LimitError> {
        if limit == 0 || limit > MAX_LIMIT {
            return Err(LimitError::Limit(limit));
        }
        if !(MIN_PERIOD..=MAX_PERIOD).contains(&period) {
            return Err(LimitError::Period);
        }
        let burst = burst.unwrap_or(limit);
        if burst == 0 || burst > MAX_LIMIT {
            return Err(LimitError::Burst(burst));
        }
        if !algorithm.has_burst() && burst != limit {
            return Err(LimitError::BurstNotApplicable(algorithm));
        }
        if algorithm == Algorithm::SlidingWindowLog && limit > MAX_LOG_LIMIT {
            return Err(LimitError::LogTooLarge(limit));
        }
        Ok(Limit {
            algorithm,
            limit,
            period,
            burst,
        })
    }

    /// The algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }
    /// Units admitted per period.
    pub fn limit(&self) -> u64 {
        self.limit
    }
    /// The period, in nanoseconds.
    pub fn period(&self) -> Nanos {
        self.period
    }
    /// The bucket capacity (equal to `limit` for windowed algorithms).
    pub fn burst(&self) -> u64 {
        self.burst
    }
    /// This limit with other numbers, each at least 1 (its algorithm and period kept; a
    /// windowed algorithm's burst follows its limit). The numbers come from limits already
    /// validated with this shape: the smaller or larger of two of them.
    pub fn with_numbers(&self, limit: u64, burst: u64) -> Limit {
        let limit = limit.max(1);
        Limit {
            limit,
            burst: if self.algorithm.has_burst() {
                burst.max(1)
            } else {
                limit
            },
            ..*self
        }
    }

    /// The largest cost one check can ever be admitted with.
    pub fn max_cost(&self) -> u64 {
        self.burst
    }

    /// Decides `cost` at `now` against `state` without changing it.
    pub fn decide(&self, state: &State, now: Nanos, cost: u64, max_wait: Nanos) -> Decision {
        match state {
            State::TokenBucket(s) => token_bucket::decide(s, self, now, cost),
            State::LeakyBucket(s) => leaky_bucket::decide(s, self, now, cost, max_wait),
            State::FixedWindow(s) => fixed_window::decide(s, self, now, cost),
            State::SlidingLog(s) => sliding_log::decide(s, self, now, cost),
            State::SlidingCounter(s) => sliding_counter::decide(s, self, now, cost),
        }
    }

    /// Records an admission of `cost` at `now` that [`Limit::decide`] allowed, or charges a
    /// cost it did not (the key then owes it: see the module doc).
    pub fn commit(&self, state: &mut State, now: Nanos, cost: u64) {
        match state {
            State::TokenBucket(s) => token_bucket::commit(s, self, now, cost),
            State::LeakyBucket(s) => leaky_bucket::commit(s, self, now, cost),
            State::FixedWindow(s) => fixed_window::commit(s, self, now, cost),
            State::SlidingLog(s) => sliding_log::commit(s, self, now, cost),
            State::SlidingCounter(s) => sliding_counter::commit(s, self, now, cost),
        }
    }

    /// Whether `state` makes the same decisions as a fresh key's from `now` on.
    pub fn is_fresh(&self, state: &State, now: Nanos) -> bool {
        match state {
            State::TokenBucket(s) => token_bucket::is_fresh(s, self, now),
            State::LeakyBucket(s) => leaky_bucket::is_fresh(s, self, now),
            State::FixedWindow(s) => fixed_window::is_fresh(s, self, now),
            State::SlidingLog(s) => sliding_log::is_fresh(s, self, now),
            State::SlidingCounter(s) => sliding_counter::is_fresh(s, self, now),
        }
    }

    /// Where the charge just committed at `now` went (call right after [`Limit::commit`]).
    pub fn receipt(&self, state: &State, now: Nanos) -> Receipt {
        match state {
            State::TokenBucket(s) => token_bucket::receipt(s, self, now),
            State::LeakyBucket(s) => leaky_bucket::receipt(s, self, now),
            State::FixedWindow(s) => fixed_window::receipt(s, self, now),
            State::SlidingLog(s) => sliding_log::receipt(s, self, now),
            State::SlidingCounter(s) => sliding_counter::receipt(s, self, now),
        }
    }

    /// Gives back up to `amount` units of the charge `receipt` describes, at `now`, as far as
    /// `state` then admits no more than it would have had that charge been `amount` smaller;
    /// returns the units given back (0 once the window it was counted in has closed).
    /// `shaping`: the rule may hold callers (a leaky bucket with `max_wait`), whose places
    /// behind the charge were already given out.
    pub fn refund(
        &self,
        state: &mut State,
        receipt: &Receipt,
        amount: u64,
        now: Nanos,
        shaping: bool,
    ) -> u64 {
        match state {
            State::TokenBucket(s) => token_bucket::refund(s, self, receipt, amount, now),
            State::LeakyBucket(s) => leaky_bucket::refund(s, self, receipt, amount, now, shaping),
            State::FixedWindow(s) => fixed_window::refund(s, self, receipt, amount, now),
            State::SlidingLog(s) => sliding_log::refund(s, self, receipt, amount, now),
            State::SlidingCounter(s) => sliding_counter::refund(s, self, receipt, amount, now),
        }
    }

    /// Carries `state`, kept under `old`, to this limit at `now`: the same algorithm and
    /// period with other numbers (a reload). Only a token bucket's state needs it (what it
    /// spent carries over, [`token_bucket::relimit`]); the windows' counts and a log's
    /// entries do not depend on the numbers.
    pub fn relimit(&self, state: &mut State, old: &Limit, now: Nanos) {
        if let State::TokenBucket(s) = state
            && (old.limit, old.burst) != (self.limit, self.burst)
        {
            token_bucket::relimit(s, old, self, now);
        }
    }

    /// The state of a key never seen before.
    pub fn fresh_state(&self) -> State {
        match self.algorithm {
            Algorithm::TokenBucket => State::TokenBucket(Default::default()),
            Algorithm::LeakyBucket => State::LeakyBucket(Default::default()),
            Algorithm::FixedWindow => State::FixedWindow(Default::default()),
            Algorithm::SlidingWindowLog => State::SlidingLog(Default::default()),
            Algorithm::SlidingWindowCounter => State::SlidingCounter(Default::default()),
        }
    }
}

/// One limit's state for one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// See [`token_bucket`].
    TokenBucket(token_bucket::State),
    /// See [`leaky_bucket`].
    LeakyBucket(leaky_bucket::State),
    /// See [`fixed_window`].
    FixedWindow(fixed_window::State),
    /// See [`sliding_log`].
    SlidingLog(sliding_log::State),
    /// See [`sliding_counter`].
    SlidingCounter(sliding_counter::State),
}

/// What a check gets: admitted (possibly after a wait), denied until later, or never.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Admitted. `wait` > 0 only for a shaping leaky bucket: a place was reserved and the
    /// caller must be held `wait` nanoseconds before going ahead.
    Admit {
        /// How long to hold the caller.
        wait: Nanos,
    },
    /// Not now: the same check would be admitted `retry_after` nanoseconds from now if
    /// nothing else were admitted meanwhile.
    Deny {
        /// Nanoseconds until the check could be admitted.
        retry_after: Nanos,
    },
    /// The cost exceeds what the limit can ever admit at once (cost > burst, or > limit for
    /// windowed algorithms). Retrying is pointless.
    Never,
}

/// A decision: the verdict and what the limit looks like for this key afterwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Admit, deny or never.
    pub verdict: Verdict,
    /// The limit's `limit` (units per period).
    pub limit: u64,
    /// Units that could still be admitted right now (after this check, if admitted).
    pub remaining: u64,
    /// Nanoseconds until the key is back to a fresh key's state (full bucket, empty window).
    pub reset_after: Nanos,
}

impl Decision {
    /// Whether the verdict admits.
    pub fn allowed(&self) -> bool {
        matches!(self.verdict, Verdict::Admit { .. })
    }

    /// Nanoseconds until a retry could succeed; 0 when admitted, `None` for never.
    pub fn retry_after(&self) -> Option<Nanos> {
        match self.verdict {
            Verdict::Admit { .. } => Some(0),
            Verdict::Deny { retry_after } => Some(retry_after),
            Verdict::Never => None,
        }
    }
}

/// Where a charge went in one limit's state, kept by a reservation so that a settle can give
/// back what the reservation did not use ([`Limit::refund`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Receipt {
    /// When the charge counts: a window's charge counts in the window holding `at`; a sliding
    /// log's is the entry logged at `at`; a bucket's was poured at `at`.
    pub at: Nanos,
    /// Buckets only (0 for windows), in scaled units (one unit of cost = `period`): how far
    /// the bucket stood from where it can no longer move right after the charge. A token
    /// bucket: below full (a fuller bucket loses tokens to its cap); a leaky bucket: above
    /// empty. The refill or drain since `at` eats into it, and a refund never exceeds what
    /// is left of it (see [`token_bucket::refund`]).
    pub room: u128,
    /// Buckets only (0 for windows): the bucket's count of whole units given back by refunds,
    /// as of the charge (wrapping). A refund of another charge since took from the same
    /// room, and a refund of this one takes only what is left of it (see
    /// [`token_bucket::refund`]).
    pub refunded: u64,
}

/// All limits' states for one key of a rule, checked and charged together.
///
/// A rule with one limit (the common case) keeps its state inline; a composite rule boxes a
/// slice, one state per limit, in the rule's order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyState {
    /// A rule with one limit.
    One(State),
    /// A rule with several limits.
    Many(Box<[State]>),
}

impl KeyState {
    /// The state of a key never seen before under `limits`.
    pub fn fresh(limits: &[Limit]) -> KeyState {
        match limits {
            [one] => KeyState::One(one.fresh_state()),
            many => KeyState::Many(many.iter().map(Limit::fresh_state).collect()),
        }
    }

    fn states(&self) -> &[State] {
        match self {
            KeyState::One(s) => std::slice::from_ref(s),
            KeyState::Many(s) => s,
        }
    }

    /// Carries the key from `old` to `new` limits (pairwise the same algorithm and period):
    /// [`Limit::relimit`].
    pub fn relimit(&mut self, old: &[Limit], new: &[Limit], now: Nanos) {
        for ((state, old), new) in self.states_mut().iter_mut().zip(old).zip(new) {
            new.relimit(state, old, now);
        }
    }

    fn states_mut(&mut self) -> &mut [State] {
        match self {
            KeyState::One(s) => std::slice::from_mut(s),
            KeyState::Many(s) => s,
        }
    }

    /// Checks `cost` against every limit; admits only if all admit, and then charges all.
    /// A denial charges none. Returns the index of the most restrictive limit and its
    /// decision: never over deny over admit; among denials the longest `retry_after`; among
    /// admissions the fewest `remaining` (with the longest wait any shaping limit imposes).
    pub fn check(
        &mut self,
        limits: &[Limit],
        now: Nanos,
        cost: u64,
        max_wait: Nanos,
    ) -> (usize, Decision) {
        // One limit (the common rule): no combining to do.
        if let (KeyState::One(state), [limit]) = (&mut *self, limits) {
            let decision = limit.decide(state, now, cost, max_wait);
            if decision.allowed() && cost > 0 {
                limit.commit(state, now, cost);
            }
            return (0, decision);
        }
        let (index, decision) = self.peek(limits, now, cost, max_wait);
        if decision.allowed() && cost > 0 {
            for (limit, state) in limits.iter().zip(self.states_mut()) {
                limit.commit(state, now, cost);
            }
        }
        (index, decision)
    }

    /// What [`KeyState::check`] would decide, without charging anything.
    pub fn peek(
        &self,
        limits: &[Limit],
        now: Nanos,
        cost: u64,
        max_wait: Nanos,
    ) -> (usize, Decision) {
        let mut index = 0;
        let mut worst: Option<Decision> = None;
        let mut wait = 0;
        for (i, (limit, state)) in limits.iter().zip(self.states()).enumerate() {
            let d = limit.decide(state, now, cost, max_wait);
            wait = wait.max(admit_wait(&d));
            if worst.is_none_or(|w| more_restrictive(&d, &w)) {
                index = i;
                worst = Some(d);
            }
        }
        let mut worst = worst.expect("a rule always has at least one limit");
        if let Verdict::Admit { .. } = worst.verdict {
            worst.verdict = Verdict::Admit { wait };
        }
        (index, worst)
    }

    /// What a status query reports: whether a check of cost 1 would be admitted now (and if
    /// not, when), from the limit that would bind it, with that limit's `remaining` and
    /// `reset_after` as they stand — nothing charged.
    pub fn status(&self, limits: &[Limit], now: Nanos) -> (usize, Decision) {
        let (index, next) = self.peek(limits, now, 1, 0);
        let current = limits[index].decide(&self.states()[index], now, 0, 0);
        let verdict = match next.verdict {
            Verdict::Admit { .. } => Verdict::Admit { wait: 0 },
            other => other,
        };
        (index, Decision { verdict, ..current })
    }

    /// Whether every limit's state equals a fresh key's.
    pub fn is_fresh(&self, limits: &[Limit], now: Nanos) -> bool {
        limits
            .iter()
            .zip(self.states())
            .all(|(limit, state)| limit.is_fresh(state, now))
    }

    /// Where the charge just committed at `now` went, one receipt per limit.
    pub fn receipts(&self, limits: &[Limit], now: Nanos) -> Box<[Receipt]> {
        limits
            .iter()
            .zip(self.states())
            .map(|(limit, state)| limit.receipt(state, now))
            .collect()
    }

    /// Gives back up to `amount` units of the charge `receipts` describe to every limit
    /// ([`Limit::refund`]); returns the least any limit got back, which is what the rule as a
    /// whole got back (a check must pass every limit).
    pub fn refund(
        &mut self,
        limits: &[Limit],
        receipts: &[Receipt],
        amount: u64,
        now: Nanos,
        shaping: bool,
    ) -> u64 {
        limits
            .iter()
            .zip(self.states_mut())
            .zip(receipts)
            .map(|((limit, state), receipt)| limit.refund(state, receipt, amount, now, shaping))
            .min()
            .unwrap_or(0)
    }

    /// Charges `cost` to every limit whether or not it fits (a settle's cost above its
    /// reservation): the key owes what does not fit, and is denied until it has passed.
    pub fn charge(&mut self, limits: &[Limit], now: Nanos, cost: u64) {
        if cost == 0 {
            return;
        }
        for (limit, state) in limits.iter().zip(self.states_mut()) {
            limit.commit(state, now, cost);
        }
    }
}

pub(crate) fn admit_wait(d: &Decision) -> Nanos {
    match d.verdict {
        Verdict::Admit { wait } => wait,
        _ => 0,
    }
}

pub(crate) fn more_restrictive(a: &Decision, b: &Decision) -> bool {
    match (a.verdict, b.verdict) {
        (Verdict::Never, Verdict::Never) => false,
        (Verdict::Never, _) => true,
        (_, Verdict::Never) => false,
        (Verdict::Deny { retry_after: x }, Verdict::Deny { retry_after: y }) => x > y,
        (Verdict::Deny { .. }, Verdict::Admit { .. }) => true,
        (Verdict::Admit { .. }, Verdict::Deny { .. }) => false,
        (Verdict::Admit { .. }, Verdict::Admit { .. }) => a.remaining < b.remaining,
    }
}

/// `ceil(a / b)` for positive `b`, saturating into `Nanos`.
pub(crate) fn div_ceil_nanos(a: u128, b: u128) -> Nanos {
    u64::try_from(a.div_ceil(b)).unwrap_or(u64::MAX)
}

/// `a / b` saturating into `u64`.
pub(crate) fn div_u64(a: u128, b: u128) -> u64 {
    u64::try_from(a / b).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use proptest::test_runner::TestCaseError;

    fn tb(limit: u64, period: Nanos, burst: u64) -> Limit {
        Limit::new(Algorithm::TokenBucket, limit, period, Some(burst)).unwrap()
    }

    #[test]
    fn limit_rejects_zero_and_misplaced_burst() {
        assert_eq!(
            Limit::new(Algorithm::TokenBucket, 0, SECOND, None),
            Err(LimitError::Limit(0))
        );
        assert_eq!(
            Limit::new(Algorithm::TokenBucket, 1, SECOND, Some(0)),
            Err(LimitError::Burst(0))
        );
        assert_eq!(
            Limit::new(Algorithm::FixedWindow, 10, SECOND, Some(20)),
            Err(LimitError::BurstNotApplicable(Algorithm::FixedWindow))
        );
        assert_eq!(
            Limit::new(Algorithm::SlidingWindowLog, MAX_LOG_LIMIT + 1, SECOND, None),
            Err(LimitError::LogTooLarge(MAX_LOG_LIMIT + 1))
        );
        assert_eq!(
            Limit::new(Algorithm::FixedWindow, 1, MILLISECOND - 1, None),
            Err(LimitError::Period)
        );
    }

    #[test]
    fn algorithm_names_round_trip() {
        for a in Algorithm::ALL {
            assert_eq!(Algorithm::from_name(a.name()), Some(a));
        }
        assert_eq!(Algorithm::from_name("gcra"), None);
    }

    #[test]
    fn composite_denial_charges_no_limit() {
        // 10/s burst 20, together with 30 per minute.
        let limits = [
            tb(10, SECOND, 20),
            Limit::new(Algorithm::SlidingWindowLog, 30, 60 * SECOND, None).unwrap(),
        ];
        let mut key = KeyState::fresh(&limits);
        let t0 = 1_000 * SECOND;
        for _ in 0..20 {
            assert!(key.check(&limits, t0, 1, 0).1.allowed());
        }
        // The bucket is empty: denied, and the log must not have recorded it.
        let (_, denied) = key.check(&limits, t0, 1, 0);
        assert_eq!(
            denied.verdict,
            Verdict::Deny {
                retry_after: 100 * MILLISECOND
            }
        );
        // After one second the bucket holds 10 again, but the log allows only 10 more.
        for _ in 0..10 {
            assert!(key.check(&limits, t0 + SECOND, 1, 0).1.allowed());
        }
        let (i, d) = key.check(&limits, t0 + 2 * SECOND, 1, 0);
        assert_eq!(i, 1);
        // The log (30/min) is now the binding limit: retry when the first entry leaves.
        assert_eq!(d.limit, 30);
        assert_eq!(
            d.verdict,
            Verdict::Deny {
                retry_after: 58 * SECOND
            }
        );
    }

    #[test]
    fn composite_reports_fewest_remaining_when_admitted() {
        let limits = [
            tb(10, SECOND, 20),
            Limit::new(Algorithm::FixedWindow, 5, 60 * SECOND, None).unwrap(),
        ];
        let mut key = KeyState::fresh(&limits);
        let (i, d) = key.check(&limits, 60 * SECOND, 1, 0);
        assert_eq!(i, 1);
        assert_eq!((d.limit, d.remaining), (5, 4));
    }

    #[test]
    fn composite_never_wins_over_deny() {
        let limits = [
            tb(10, SECOND, 20),
            Limit::new(Algorithm::FixedWindow, 5, 60 * SECOND, None).unwrap(),
        ];
        let mut key = KeyState::fresh(&limits);
        let (_, d) = key.check(&limits, 60 * SECOND, 6, 0);
        assert_eq!(d.verdict, Verdict::Never);
        assert_eq!(d.limit, 5);
        assert!(key.is_fresh(&limits, 60 * SECOND));
    }

    #[test]
    fn status_reports_what_is_left_and_whether_one_more_fits() {
        let limits = [tb(10, SECOND, 2)];
        let mut key = KeyState::fresh(&limits);
        let (_, d) = key.status(&limits, SECOND);
        assert_eq!((d.allowed(), d.remaining), (true, 2));
        key.check(&limits, SECOND, 2, 0);
        let before = key.clone();
        let (_, d) = key.status(&limits, SECOND);
        assert_eq!(
            d.verdict,
            Verdict::Deny {
                retry_after: 100 * MILLISECOND
            }
        );
        assert_eq!((d.remaining, d.reset_after), (0, 200 * MILLISECOND));
        assert_eq!(key, before);
    }

    #[test]
    fn huge_cost_on_a_used_key_is_never_for_every_algorithm() {
        for algorithm in Algorithm::ALL {
            let limits = [Limit::new(algorithm, 10, SECOND, None).unwrap()];
            let mut key = KeyState::fresh(&limits);
            let now = 1_000 * SECOND;
            assert!(key.check(&limits, now, 3, 0).1.allowed());
            let before = key.clone();
            for cost in [11, u64::MAX / 2, u64::MAX] {
                let (_, d) = key.check(&limits, now + 1, cost, u64::MAX);
                assert_eq!(d.verdict, Verdict::Never, "{algorithm} cost {cost}");
            }
            assert_eq!(key, before, "{algorithm}");
        }
    }

    /// One step of a run with reservations.
    #[derive(Clone, Debug)]
    enum Op {
        /// A check of `cost`, `dt` ms after the previous step.
        Check { dt: u64, cost: u64 },
        /// A reservation of `cost` whose work turns out to cost `actual`.
        Reserve { dt: u64, cost: u64, actual: u64 },
        /// Settles the `pick`-th open reservation (modulo their number).
        Settle { dt: u64, pick: usize },
    }

    fn ops() -> impl Strategy<Value = Vec<Op>> {
        let op = prop_oneof![
            3 => (0u64..400, 1u64..8).prop_map(|(dt, cost)| Op::Check { dt, cost }),
            2 => (0u64..400, 1u64..12, 0u64..14)
                .prop_map(|(dt, cost, actual)| Op::Reserve { dt, cost, actual }),
            2 => (0u64..1_500, 0usize..8).prop_map(|(dt, pick)| Op::Settle { dt, pick }),
        ];
        prop::collection::vec(op, 1..120)
    }

    /// Plays `ops` on two states of `limit`: `real` as the node does (a reservation charges
    /// its cost, a settle refunds or charges the difference), `plain` as if every reservation
    /// had been a check of its actual cost (a cost above the reservation is only known at the
    /// settle, so both charge it there). Asserts after every step that whatever `real` would
    /// admit, `plain` would admit too.
    fn play(limit: &Limit, max_wait: Nanos, ops: Vec<Op>) -> Result<(), TestCaseError> {
        let shaping = max_wait > 0;
        let (mut real, mut plain) = (limit.fresh_state(), limit.fresh_state());
        let mut open: Vec<(Receipt, u64, u64)> = Vec::new();
        let mut now = 1_700_000_000 * SECOND;
        for op in ops {
            match op {
                Op::Check { dt, cost } => {
                    now += dt * MILLISECOND;
                    if limit.decide(&real, now, cost, max_wait).allowed() {
                        limit.commit(&mut real, now, cost);
                        limit.commit(&mut plain, now, cost);
                    }
                }
                Op::Reserve { dt, cost, actual } => {
                    now += dt * MILLISECOND;
                    if limit.decide(&real, now, cost, max_wait).allowed() {
                        limit.commit(&mut real, now, cost);
                        let receipt = limit.receipt(&real, now);
                        let now_known = actual.min(cost);
                        if now_known > 0 {
                            prop_assert!(limit.decide(&plain, now, now_known, max_wait).allowed());
                            limit.commit(&mut plain, now, now_known);
                        }
                        open.push((receipt, cost, actual));
                    }
                }
                Op::Settle { dt, pick } => {
                    if open.is_empty() {
                        continue;
                    }
                    now += dt * MILLISECOND;
                    let (receipt, cost, actual) = open.swap_remove(pick % open.len());
                    if actual < cost {
                        let back = limit.refund(&mut real, &receipt, cost - actual, now, shaping);
                        prop_assert!(back <= cost - actual);
                    } else if actual > cost {
                        limit.commit(&mut real, now, actual - cost);
                        limit.commit(&mut plain, now, actual - cost);
                    }
                }
            }
            for c in 1..=limit.max_cost().min(40) {
                if limit.decide(&real, now, c, max_wait).allowed() {
                    prop_assert!(
                        limit.decide(&plain, now, c, max_wait).allowed(),
                        "cost {c} at {now}: {real:?} admits, {plain:?} would not"
                    );
                }
            }
        }
        Ok(())
    }

    proptest! {
        /// A reservation settled for less never leaves any algorithm admitting more than
        /// checks of the actual costs would have, over the same run.
        #[test]
        fn reserve_then_settle_never_admits_more_than_checks_of_the_actual_cost(
            algorithm in prop::sample::select(Algorithm::ALL.to_vec()),
            limit in 1u64..30, burst in 1u64..30, period_ms in 1u64..4_000,
            shaping in any::<bool>(), ops in ops(),
        ) {
            let burst = algorithm.has_burst().then_some(burst);
            let l = Limit::new(algorithm, limit, period_ms * MILLISECOND, burst).unwrap();
            let max_wait = if shaping && algorithm == Algorithm::LeakyBucket { SECOND } else { 0 };
            play(&l, max_wait, ops)?;
        }

        /// With reservations settled for less, a shaping leaky bucket still lets callers go
        /// no faster than burst + rate × t: a reservation leaves when admitted (after its
        /// wait) carrying its actual cost.
        #[test]
        fn shaped_departures_with_refunds_respect_the_leak_rate(
            limit in 1u64..20, burst in 1u64..20, period_ms in 10u64..2_000, ops in ops(),
        ) {
            let l = Limit::new(Algorithm::LeakyBucket, limit, period_ms * MILLISECOND, Some(burst)).unwrap();
            let max_wait = 2 * SECOND;
            let mut state = l.fresh_state();
            let mut open: Vec<(Receipt, u64, u64)> = Vec::new();
            let mut departures = Vec::new();
            let mut now = 1_700_000_000 * SECOND;
            for op in ops {
                match op {
                    Op::Check { dt, cost } => {
                        now += dt * MILLISECOND;
                        if let Verdict::Admit { wait } = l.decide(&state, now, cost, max_wait).verdict {
                            l.commit(&mut state, now, cost);
                            departures.push((now + wait, cost));
                        }
                    }
                    Op::Reserve { dt, cost, actual } => {
                        now += dt * MILLISECOND;
                        if let Verdict::Admit { wait } = l.decide(&state, now, cost, max_wait).verdict {
                            l.commit(&mut state, now, cost);
                            let receipt = l.receipt(&state, now);
                            departures.push((now + wait, actual.min(cost)));
                            open.push((receipt, cost, actual.min(cost)));
                        }
                    }
                    Op::Settle { dt, pick } => {
                        if open.is_empty() { continue; }
                        now += dt * MILLISECOND;
                        let (receipt, cost, actual) = open.swap_remove(pick % open.len());
                        l.refund(&mut state, &receipt, cost - actual, now, true);
                    }
                }
            }
            departures.sort();
            // As in leaky_bucket's own test: waits are rounded up to whole nanoseconds.
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

    #[test]
    fn composite_refund_gives_back_to_each_limit_and_reports_the_least() {
        // A bucket (10/s, burst 20) and a minute's window of 30.
        let limits = [
            tb(10, SECOND, 20),
            Limit::new(Algorithm::FixedWindow, 30, 60 * SECOND, None).unwrap(),
        ];
        let mut key = KeyState::fresh(&limits);
        let t0 = 1_699_999_980 * SECOND;
        assert!(key.check(&limits, t0, 20, 0).1.allowed());
        let receipts = key.receipts(&limits, t0);
        // 1.5 s on, the bucket has refilled 15 of the 20: 5 can come back there, all 12 to
        // the window.
        let now = t0 + 1_500 * MILLISECOND;
        assert_eq!(key.refund(&limits, &receipts, 12, now, false), 5);
        assert_eq!(key.peek(&limits, now, 0, 0).1.remaining, 20);
        let (_, window) = key.peek(&limits, now, 0, 0);
        assert_eq!(window.limit, 10);
        let KeyState::Many(states) = &key else {
            panic!("two limits")
        };
        assert_eq!(limits[1].decide(&states[1], now, 0, 0).remaining, 22);
        // A charge past both: owed in each.
        key.charge(&limits, now, 40);
        let (i, d) = key.peek(&limits, now, 1, 0);
        assert_eq!((i, d.allowed(), d.remaining), (1, false, 0));
    }

    #[test]
    fn zero_cost_check_charges_nothing() {
        let limits = [tb(10, SECOND, 10)];
        let mut key = KeyState::fresh(&limits);
        key.check(&limits, SECOND, 3, 0);
        let before = key.clone();
        let (_, d) = key.check(&limits, SECOND, 0, 0);
        assert_eq!(key, before);
        assert_eq!(d.remaining, 7);
    }
}
