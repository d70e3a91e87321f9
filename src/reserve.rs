//! Reserve, then settle: the bookkeeping behind `POST /v1/reserve` and `POST /v1/settle`.
//!
//! A reservation is charged at once, like a check (the engine does that); this module keeps
//! what a settle needs afterwards, and the credit a settle leaves on a clustered key:
//!
//! - [`Reservations`]: the open reservations by id, bounded (`max_open`) and expiring after
//!   `timeout` (an expired reservation keeps its estimate: nothing is given back). A settled or
//!   expired id is remembered as a *tombstone* for a while, so that settling twice answers
//!   409 and settling too late 410 rather than "unknown".
//! - [`Credits`]: on a clustered rule, counts are per-node grow-only counters merged by
//!   maximum, so a count cannot go down; a refund becomes credit at this node instead, spent
//!   by later checks of the key here before they go to the cluster (docs/design.md §3.7).
//!
//! Plain data structures: every method takes `now`, nothing here reads a clock or does I/O.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::limiter::{MAX_LIMIT, Nanos, SECOND};

/// How long a reservation stays open before it expires and keeps its estimate.
pub const DEFAULT_RESERVATION_TIMEOUT: Nanos = 600 * SECOND;
/// The most reservations open at once on a node.
pub const DEFAULT_MAX_RESERVATIONS: usize = 100_000;
/// The largest actual cost a settle accepts (the largest limit any rule can have).
pub const MAX_SETTLE_COST: u64 = MAX_LIMIT;

/// What bounds the reservations (`[server] reservation_timeout`, `max_reservations`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReservationParams {
    /// How long a reservation may wait for its settle; after that it expires, keeping its
    /// estimate.
    pub timeout: Nanos,
    /// The most reservations open at once; a reserve beyond it is answered like a check at
    /// `max_keys` (429, outcome `store_full`) and charges nothing.
    pub max_open: usize,
}

impl Default for ReservationParams {
    fn default() -> ReservationParams {
        ReservationParams {
            timeout: DEFAULT_RESERVATION_TIMEOUT,
            max_open: DEFAULT_MAX_RESERVATIONS,
        }
    }
}

/// A reservation's id as clients see it: 32 hex digits, a serial number and a tag that only
/// this process can compute from it (a keyed hash), so an id from another node, an earlier
/// run of this one or a guess is unknown here.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReservationId {
    serial: u64,
    tag: u64,
}

impl ReservationId {
    /// Reads an id as [`fmt::Display`] writes it; `None` for anything else.
    pub fn parse(s: &str) -> Option<ReservationId> {
        if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        Some(ReservationId {
            serial: u64::from_str_radix(&s[..16], 16).ok()?,
            tag: u64::from_str_radix(&s[16..], 16).ok()?,
        })
    }
}

impl fmt::Display for ReservationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}{:016x}", self.serial, self.tag)
    }
}

/// Why a settle was refused. Nothing was changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SettleError {
    /// No reservation has that id here: never made at this node (or by this run of it), or
    /// settled or expired long enough ago to be forgotten.
    #[error(
        "no reservation with that id at this node (made at another node or before a restart, or settled or expired long ago)"
    )]
    Unknown,
    /// The reservation was not settled within the timeout: it kept its estimate.
    #[error("the reservation expired before it was settled; its estimate stands")]
    Expired,
    /// The reservation was settled already.
    #[error("the reservation was settled already")]
    AlreadySettled,
}

/// Counters of reservations, rendered as `gossamer_reservations_*`.
#[derive(Debug, Default)]
pub struct ReservationMetrics {
    /// Reservations admitted (charged and given an id).
    pub made: AtomicU64,
    /// Reservations settled.
    pub settled: AtomicU64,
    /// Reservations that expired unsettled (their estimate stands).
    pub expired: AtomicU64,
    /// Units given back by settles below the reservation.
    pub refunded: AtomicU64,
    /// Units charged by settles above the reservation.
    pub charged: AtomicU64,
    /// Units of settles above the reservation that could not be charged (a clustered key
    /// whose node held no room for them, or a key the store had no room for).
    pub unpaid: AtomicU64,
}

/// Open reservations by id, each holding the engine's `T` (what it needs to settle).
#[derive(Debug)]
pub struct Reservations<T> {
    params: ReservationParams,
    /// Keys the tags' hash (SipHash with random keys, per process).
    secret: RandomState,
    table: Mutex<Table<T>>,
    /// What happened to reservations, for metrics.
    pub metrics: ReservationMetrics,
}

#[derive(Debug)]
struct Table<T> {
    /// The next serial number.
    next: u64,
    entries: HashMap<u64, Entry<T>, foldhash::fast::RandomState>,
    /// (deadline, serial) of every reservation made, in the order made: the sweep expires
    /// from the front. Entries settled meanwhile are skipped.
    by_deadline: VecDeque<(Nanos, u64)>,
    /// (forget at, serial) of expired reservations' tombstones.
    tombstones: VecDeque<(Nanos, u64)>,
    /// Open reservations.
    open: usize,
    /// Places claimed for reservations being charged now.
    claimed: usize,
    /// Tombstones (settled or expired) kept.
    closed: usize,
}

#[derive(Debug)]
struct Entry<T> {
    tag: u64,
    deadline: Nanos,
    state: EntryState<T>,
}

#[derive(Debug)]
enum EntryState<T> {
    Open(T),
    Settled,
    Expired,
}

/// A place held for a reservation while it is charged: [`Claim::fill`] makes it one; dropped
/// unfilled (the check was denied), the place is given back.
#[derive(Debug)]
pub struct Claim<'r, T> {
    reservations: &'r Reservations<T>,
    filled: bool,
}

impl<T> Claim<'_, T> {
    /// Opens the reservation, charged at `now`, holding `payload`; its id.
    pub fn fill(mut self, payload: T, now: Nanos) -> ReservationId {
        self.filled = true;
        let r = self.reservations;
        let mut t = r.lock();
        t.claimed -= 1;
        t.open += 1;
        let serial = t.next;
        t.next += 1;
        let tag = r.secret.hash_one(serial);
        let deadline = now.saturating_add(r.params.timeout);
        t.entries.insert(
            serial,
            Entry {
                tag,
                deadline,
                state: EntryState::Open(payload),
            },
        );
        t.by_deadline.push_back((deadline, serial));
        r.metrics.made.fetch_add(1, Ordering::Relaxed);
        ReservationId { serial, tag }
    }
}

impl<T> Drop for Claim<'_, T> {
    fn drop(&mut self) {
        if !self.filled {
            self.reservations.lock().claimed -= 1;
        }
    }
}

impl<T> Default for Reservations<T> {
    fn default() -> Reservations<T> {
        Reservations::new(ReservationParams::default())
    }
}

impl<T> Reservations<T> {
    /// An empty table bounded by `params`.
    pub fn new(params: ReservationParams) -> Reservations<T> {
        Reservations {
            params,
            secret: RandomState::new(),
            table: Mutex::new(Table {
                next: 1,
                entries: HashMap::default(),
                by_deadline: VecDeque::new(),
                tombstones: VecDeque::new(),
                open: 0,
                claimed: 0,
                closed: 0,
            }),
            metrics: ReservationMetrics::default(),
        }
    }

    /// The bounds.
    pub fn params(&self) -> ReservationParams {
        self.params
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table<T>> {
        // Every change below keeps the counts consistent between statements that could panic
        // (none are expected to), so a poisoned lock's table is still usable.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Holds a place for a reservation about to be charged; `None` when `max_open`
    /// reservations are open or being made already.
    pub fn claim(&self) -> Option<Claim<'_, T>> {
        let mut t = self.lock();
        if t.open + t.claimed >= self.params.max_open {
            return None;
        }
        t.claimed += 1;
        Some(Claim {
            reservations: self,
            filled: false,
        })
    }

    /// Reservations open now (expired ones the sweep has not reached yet included).
    pub fn open(&self) -> usize {
        self.lock().open
    }

    /// Takes the open reservation `id` out for settling at `now`: its payload. It is then
    /// remembered as settled until its deadline (a second settle gets
    /// [`SettleError::AlreadySettled`]). One past its deadline has expired.
    pub fn take(&self, id: &ReservationId, now: Nanos) -> Result<T, SettleError> {
        let mut t = self.lock();
        let t = &mut *t;
        let entry = t
            .entries
            .get_mut(&id.serial)
            .filter(|e| e.tag == id.tag)
            .ok_or(SettleError::Unknown)?;
        match entry.state {
            EntryState::Settled => return Err(SettleError::AlreadySettled),
            EntryState::Expired => return Err(SettleError::Expired),
            EntryState::Open(_) if now >= entry.deadline => {
                // The sweep has not reached it yet: expire it now (it moves to the
                // tombstones when the sweep does).
                entry.state = EntryState::Expired;
                t.open -= 1;
                t.closed += 1;
                self.metrics.expired.fetch_add(1, Ordering::Relaxed);
                return Err(SettleError::Expired);
            }
            EntryState::Open(_) => {}
        }
        let EntryState::Open(payload) = std::mem::replace(&mut entry.state, EntryState::Settled)
        else {
            unreachable!("matched as open above")
        };
        t.open -= 1;
        if t.closed < self.params.max_open {
            t.closed += 1;
        } else {
            // Too many tombstones: forget this one (a second settle is then "unknown").
            t.entries.remove(&id.serial);
        }
        self.metrics.settled.fetch_add(1, Ordering::Relaxed);
        Ok(payload)
    }

    /// Expires the reservations whose deadline is past at `now` (kept as tombstones for
    /// another `timeout`, so a late settle is told it expired) and forgets the tombstones
    /// due; returns how many expired.
    pub fn sweep(&self, now: Nanos) -> usize {
        let mut expired = 0;
        let mut t = self.lock();
        let t = &mut *t;
        while let Some(&(deadline, serial)) = t.by_deadline.front() {
            if deadline > now {
                break;
            }
            t.by_deadline.pop_front();
            let Some(entry) = t.entries.get_mut(&serial) else {
                continue;
            };
            match entry.state {
                EntryState::Open(_) => {
                    entry.state = EntryState::Expired;
                    t.open -= 1;
                    expired += 1;
                    if t.closed < self.params.max_open {
                        t.closed += 1;
                        let forget = deadline.saturating_add(self.params.timeout);
                        t.tombstones.push_back((forget, serial));
                    } else {
                        t.entries.remove(&serial);
                    }
                }
                EntryState::Expired => {
                    // Expired by a settle already (and counted in `closed`).
                    let forget = deadline.saturating_add(self.params.timeout);
                    t.tombstones.push_back((forget, serial));
                }
                EntryState::Settled => {
                    t.entries.remove(&serial);
                    t.closed -= 1;
                }
            }
        }
        while let Some(&(forget, serial)) = t.tombstones.front() {
            if forget > now {
                break;
            }
            t.tombstones.pop_front();
            if t.entries.remove(&serial).is_some() {
                t.closed -= 1;
            }
        }
        // Settled entries forgotten early leave their place in `by_deadline` behind: drop
        // those places once they outnumber the entries.
        if t.by_deadline.len() > 2 * t.entries.len() + 1024 {
            let entries = &t.entries;
            t.by_deadline.retain(|(_, s)| entries.contains_key(s));
        }
        self.metrics
            .expired
            .fetch_add(expired as u64, Ordering::Relaxed);
        expired
    }
}

/// How a bucket's credit fades: in total, at most `reserved − limit × (t − from) / period`
/// units may be spent by time `t` (see [`Credit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fade {
    /// The reservation's cost.
    pub reserved: u64,
    /// The bucket's rate: `limit` units per `period` (the fastest of the rule's buckets).
    pub limit: u64,
    /// See `limit`.
    pub period: Nanos,
}

/// Room a settle gave back on a clustered key, spendable at this node by later checks of
/// the key without asking the cluster (design.md §3.7).
///
/// Why it is safe: the cluster's count already includes the reserved cost, so admitting
/// `granted` more units here while that count is what decisions read admits no more than
/// the count says. That holds while the slot the reservation was counted in is the one
/// being read, so the credit ends with it (`until`). A bucket has no slot: its count is
/// tokens that refill, and a bucket charged less would have refilled up to its cap and lost
/// the rest; the credit fades at the bucket's rate from the reservation's time (as
/// [`token_bucket::refund`](crate::limiter::token_bucket::refund) gives back less the
/// longer the bucket refilled), so what is spent never exceeds what a bucket charged only
/// the actual cost would have held.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credit {
    granted: u64,
    used: u64,
    /// When the reservation was charged (or, if it was paid from earlier credit, that
    /// credit's time): where a fade starts.
    from: Nanos,
    /// Spendable before this time only.
    until: Nanos,
    fade: Option<Fade>,
}

impl Credit {
    /// `granted` units spendable until `until`, fading as `fade` says from `from`.
    pub fn new(granted: u64, from: Nanos, until: Nanos, fade: Option<Fade>) -> Credit {
        Credit {
            granted,
            used: 0,
            from,
            until,
            fade,
        }
    }

    /// Units spendable at `now`.
    pub fn spendable(&self, now: Nanos) -> u64 {
        if now >= self.until {
            return 0;
        }
        let mut total = self.granted;
        if let Some(f) = self.fade {
            let period = u128::from(f.period);
            let left = (u128::from(f.reserved) * period)
                .saturating_sub(u128::from(now.saturating_sub(self.from)) * u128::from(f.limit))
                / period;
            total = total.min(u64::try_from(left).unwrap_or(u64::MAX));
        }
        total.saturating_sub(self.used)
    }
}

/// One key's credits (usually one).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Credits(Vec<Credit>);

impl Credits {
    /// Adds a credit.
    pub fn add(&mut self, credit: Credit) {
        self.0.push(credit);
    }

    /// Units spendable at `now`, across the key's credits.
    pub fn spendable(&self, now: Nanos) -> u64 {
        self.0
            .iter()
            .map(|c| c.spendable(now))
            .fold(0, u64::saturating_add)
    }

    /// Spends `cost` units at `now` from the credits that end soonest; `cost` must be at
    /// most [`Credits::spendable`]. Returns the earliest `from` among the credits spent
    /// (where a reservation paid from them starts its own fade).
    pub fn spend(&mut self, mut cost: u64, now: Nanos) -> Nanos {
        let mut from = now;
        self.0.sort_by_key(|c| c.until);
        for c in &mut self.0 {
            if cost == 0 {
                break;
            }
            let take = c.spendable(now).min(cost);
            if take > 0 {
                c.used += take;
                cost -= take;
                from = from.min(c.from);
            }
        }
        debug_assert_eq!(cost, 0, "spent more than was spendable");
        self.0.retain(|c| c.spendable(now) > 0);
        from
    }

    /// Whether nothing is left to spend from `now` on (the key may be forgotten).
    pub fn is_spent(&self, now: Nanos) -> bool {
        self.spendable(now) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Algorithm, Limit, MILLISECOND, token_bucket};
    use proptest::prelude::*;

    const T0: Nanos = 1_700_000_000 * SECOND;

    fn table(max_open: usize) -> Reservations<&'static str> {
        Reservations::new(ReservationParams {
            timeout: 10 * SECOND,
            max_open,
        })
    }

    #[test]
    fn ids_print_and_parse_and_foreign_ids_are_unknown() {
        let r = table(10);
        let id = r.claim().unwrap().fill("a", T0);
        let text = id.to_string();
        assert_eq!(text.len(), 32);
        assert_eq!(ReservationId::parse(&text), Some(id));
        for bad in [
            "",
            "xyz",
            &text[..31],
            &format!("{text}0"),
            &text.replace(|c: char| c.is_ascii_digit(), "g"),
        ] {
            assert_eq!(ReservationId::parse(bad), None, "{bad:?}");
        }
        // The same serial from another table (another node or run) has another tag.
        let other = table(10);
        let foreign = other.claim().unwrap().fill("b", T0);
        assert_eq!(foreign.serial, id.serial);
        assert_ne!(foreign.tag, id.tag);
        assert_eq!(r.take(&foreign, T0), Err(SettleError::Unknown));
        assert_eq!(r.take(&id, T0), Ok("a"));
    }

    #[test]
    fn a_reservation_settles_once_then_is_remembered_until_its_deadline() {
        let r = table(10);
        let id = r.claim().unwrap().fill("a", T0);
        assert_eq!(r.open(), 1);
        assert_eq!(r.take(&id, T0 + SECOND), Ok("a"));
        assert_eq!(r.open(), 0);
        assert_eq!(
            r.take(&id, T0 + 2 * SECOND),
            Err(SettleError::AlreadySettled)
        );
        assert_eq!(r.sweep(T0 + 10 * SECOND), 0);
        assert_eq!(r.take(&id, T0 + 10 * SECOND), Err(SettleError::Unknown));
        assert_eq!(r.metrics.settled.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn an_unsettled_reservation_expires_at_its_deadline_and_says_so_for_another_timeout() {
        let r = table(10);
        let a = r.claim().unwrap().fill("a", T0);
        let b = r.claim().unwrap().fill("b", T0 + SECOND);
        assert_eq!(r.sweep(T0 + 10 * SECOND - 1), 0);
        assert_eq!(r.sweep(T0 + 10 * SECOND), 1);
        assert_eq!(r.open(), 1);
        assert_eq!(r.take(&a, T0 + 10 * SECOND), Err(SettleError::Expired));
        // Not swept yet, but past its deadline: expired all the same.
        assert_eq!(r.take(&b, T0 + 11 * SECOND), Err(SettleError::Expired));
        assert_eq!(r.take(&b, T0 + 12 * SECOND), Err(SettleError::Expired));
        assert_eq!(r.metrics.expired.load(Ordering::Relaxed), 2);
        assert_eq!(r.sweep(T0 + 11 * SECOND), 0);
        assert_eq!(r.take(&a, T0 + 19 * SECOND), Err(SettleError::Expired));
        r.sweep(T0 + 21 * SECOND);
        assert_eq!(r.take(&a, T0 + 21 * SECOND), Err(SettleError::Unknown));
        assert_eq!(r.take(&b, T0 + 21 * SECOND), Err(SettleError::Unknown));
        let t = r.lock();
        assert_eq!((t.entries.len(), t.open, t.closed), (0, 0, 0));
    }

    #[test]
    fn at_most_max_open_reservations_and_a_denied_claim_gives_its_place_back() {
        let r = table(2);
        let a = r.claim().unwrap();
        let b = r.claim().unwrap();
        assert!(r.claim().is_none());
        drop(b); // the check was denied
        let id = a.fill("a", T0);
        let c = r.claim().unwrap().fill("c", T0);
        assert!(r.claim().is_none());
        r.take(&id, T0).unwrap();
        assert!(r.claim().is_some());
        assert_eq!(r.take(&c, T0), Ok("c"));
    }

    #[test]
    fn tombstones_are_bounded_too() {
        let r = table(2);
        let ids: Vec<_> = (0..5)
            .map(|i| {
                let id = r.claim().unwrap().fill("x", T0 + i);
                r.take(&id, T0 + i).unwrap();
                id
            })
            .collect();
        // The first two are remembered as settled, the rest forgotten.
        assert_eq!(r.take(&ids[0], T0 + 9), Err(SettleError::AlreadySettled));
        assert_eq!(r.take(&ids[4], T0 + 9), Err(SettleError::Unknown));
        assert!(r.lock().entries.len() <= 2);
    }

    #[test]
    fn a_window_credit_is_spendable_until_its_slot_ends() {
        let mut c = Credits::default();
        c.add(Credit::new(5, T0, T0 + SECOND, None));
        assert_eq!(c.spendable(T0 + 999 * MILLISECOND), 5);
        assert_eq!(c.spend(3, T0 + 100 * MILLISECOND), T0);
        assert_eq!(c.spendable(T0 + 100 * MILLISECOND), 2);
        assert_eq!(c.spendable(T0 + SECOND), 0);
        assert!(c.is_spent(T0 + SECOND));
    }

    #[test]
    fn a_bucket_credit_fades_at_the_buckets_rate() {
        // Reserved 20 at T0 on 10/s; 15 given back. At T0 + 1 s at most 20 − 10 = 10 in all.
        let fade = Fade {
            reserved: 20,
            limit: 10,
            period: SECOND,
        };
        let mut c = Credits::default();
        c.add(Credit::new(15, T0, u64::MAX, Some(fade)));
        assert_eq!(c.spendable(T0), 15);
        assert_eq!(c.spendable(T0 + SECOND), 10);
        c.spend(4, T0 + SECOND);
        assert_eq!(c.spendable(T0 + SECOND), 6);
        assert_eq!(c.spendable(T0 + 1_500 * MILLISECOND), 1);
        assert_eq!(c.spendable(T0 + 2 * SECOND), 0);
    }

    /// One step of a bucket run with reservations whose refunds become credit.
    #[derive(Clone, Debug)]
    enum Op {
        Check { dt: u64, cost: u64 },
        Reserve { dt: u64, cost: u64, actual: u64 },
        Settle { dt: u64, pick: usize },
    }

    proptest! {
        /// A node's bucket (as a clustered node runs its share) whose refunds become fading
        /// credit: what is actually used (reservations at their actual cost, checks paid by
        /// the bucket or the credit) never exceeds burst + rate × t over any interval.
        #[test]
        fn bucket_credit_never_lets_the_bucket_pass_its_bound(
            limit in 1u64..30, burst in 1u64..30, period_ms in 10u64..3_000,
            ops in prop::collection::vec(prop_oneof![
                3 => (0u64..300, 1u64..8).prop_map(|(dt, cost)| Op::Check { dt, cost }),
                2 => (0u64..300, 1u64..12, 0u64..12)
                    .prop_map(|(dt, cost, actual)| Op::Reserve { dt, cost, actual }),
                2 => (0u64..1_000, 0usize..8).prop_map(|(dt, pick)| Op::Settle { dt, pick }),
            ], 1..150),
        ) {
            let period = period_ms * MILLISECOND;
            let l = Limit::new(Algorithm::TokenBucket, limit, period, Some(burst)).unwrap();
            let mut bucket = token_bucket::State::default();
            let mut credits = Credits::default();
            let mut open: Vec<(Nanos, u64, u64)> = Vec::new();
            let mut used: Vec<(Nanos, u64)> = Vec::new();
            let mut now = T0;
            // Pays `cost` from credit first, the rest from the bucket, all or nothing, as
            // the engine's clustered check does; the credit's `from` if admitted.
            let pay = |bucket: &mut token_bucket::State, credits: &mut Credits, now, cost| {
                let from_credit = credits.spendable(now).min(cost);
                let rest = cost - from_credit;
                if rest > 0 && !token_bucket::decide(bucket, &l, now, rest).allowed() {
                    return None;
                }
                if rest > 0 {
                    token_bucket::commit(bucket, &l, now, rest);
                }
                Some(if from_credit > 0 { credits.spend(from_credit, now) } else { now })
            };
            for op in ops {
                match op {
                    Op::Check { dt, cost } => {
                        now += dt * MILLISECOND;
                        if pay(&mut bucket, &mut credits, now, cost).is_some() {
                            used.push((now, cost));
                        }
                    }
                    Op::Reserve { dt, cost, actual } => {
                        now += dt * MILLISECOND;
                        if let Some(from) = pay(&mut bucket, &mut credits, now, cost) {
                            let actual = actual.min(cost);
                            used.push((now, actual));
                            open.push((from, cost, actual));
                        }
                    }
                    Op::Settle { dt, pick } => {
                        if open.is_empty() { continue; }
                        now += dt * MILLISECOND;
                        let (from, cost, actual) = open.swap_remove(pick % open.len());
                        let fade = Fade { reserved: cost, limit, period };
                        credits.add(Credit::new(cost - actual, from, u64::MAX, Some(fade)));
                    }
                }
            }
            for i in 0..used.len() {
                let mut sum = 0u128;
                for &(t, c) in &used[i..] {
                    sum += u128::from(c);
                    let span = u128::from(t - used[i].0);
                    prop_assert!(
                        sum * u128::from(period)
                            <= u128::from(burst) * u128::from(period) + span * u128::from(limit),
                        "{sum} used in {span} ns from {}", used[i].0
                    );
                }
            }
        }
    }
}
