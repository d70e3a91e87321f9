//! Global admission for `scope = "global"` rules: held leases for windowed limits and
//! demand-proportional shares for buckets (docs/design.md §2–§5).
//!
//! Sans-IO: no sockets, no clock reads, no tasks. The caller passes the time to every method,
//! feeds in what peers sent ([`Global::receive`]) and what membership says
//! ([`Global::set_members`]), calls [`Global::tick`] when [`Global::next_tick`] says, and
//! delivers the [`Output`]s. So the same code runs in the node (over QUIC) and in a simulation
//! on virtual time, where every test is exact.
//!
//! # A round
//! Rounds are `[nT, (n+1)T)` by the wall clock. At the *boundary* nT a node publishes, in one
//! [`RoundFrame`] to every peer, its own admitted counts per open slot, its smoothed demand per
//! key and the room it holds per slot (its lease, after handing back what it holds beyond
//! its target). At the *instant* nT + δ, if it holds every reachable peer's round-n frame and
//! all of them share its view of the cluster, it is *consistent* and computes, from those
//! frames alone, the same allocation every other consistent node computes: each node's target
//! share of the window's room and its grant out of the room nobody holds (windows), or its
//! share of the rate (buckets). A node that is not consistent is *degraded*: it takes no grant
//! and spends what it holds. Only a grant adds to a lease and only its holder shrinks it, so
//! leases and counts never sum past the limit (design §3.3.2) — staleness costs only
//! under-admission. Boundaries and instants visit only the keys something happened to
//! ([`Global::tick`]), so a round costs what changed, not what is stored.
//!
//! # The check path
//! [`Global::check`] takes one shard lock of one rule's [`Store`] and reads nothing else: the
//! key's lease, its own counts, and the peers' counts copied into the key at the last instant.
//! It never waits on the network.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};

use crdts::Dot;
use smallvec::SmallVec;

use crate::counter::{Actor, Counters, SlotId, SlotView, StableHasher};
use crate::limiter::{
    Algorithm, Decision, Limit, MILLISECOND, Nanos, Verdict, admit_wait, more_restrictive,
};
use crate::store::{Full, Seen, Store, Visit};
use crate::wire::{KeyReport, LimitReport, Message, RoundFrame};

/// Default round length T (the gossip interval).
pub const DEFAULT_ROUND: Nanos = 100 * MILLISECOND;
/// Default settle time δ from a boundary to its instant.
pub const DEFAULT_SETTLE: Nanos = 25 * MILLISECOND;
/// A peer that sends nothing for this many rounds in a row is suspected.
pub const DEFAULT_SUSPECT_AFTER: u32 = 3;
/// A peer whose frames keep coming, but each after the instant of its round (a peer too busy
/// to keep time, or whose clock is behind), is suspected only once it has missed this many
/// times `suspect_after` instants in a row: until then its lateness degrades rounds, and a
/// suspicion, each of which changes the view at every node, does not come and go with it.
pub const LATE_SUSPECT_FACTOR: u32 = 10;
/// Every this many rounds a node sends a digest (anti-entropy of counts) while its view is
/// settling ([`DIGESTS_AFTER_CHANGE`]). No full frame goes out on a timer: a peer that misses
/// more frames than the repeats cover asks for one.
pub const DEFAULT_FULL_EVERY: u64 = 10;
/// How many rounds after its view changes (a member joined, restarted, left, died or came
/// back) a node keeps sending a digest every `full_every` rounds. In a view that holds,
/// every member's own counts reach the others in its round frames, repeated until acked
/// (or in a full frame a receiver asks for), so a digest then finds nothing to repair that
/// the frames do not bring; what only anti-entropy brings is the counts of a member gone
/// (its last frames may have reached some nodes and not others), and those are settled in
/// the seconds after the view changes. Past them a digest goes out once every
/// [`DIGEST_EVERY_SETTLED`] rounds, a safety net. A digest costs about a byte per slot
/// counted in the cluster, so every second it was most of the cluster's traffic per check
/// for quiet users (design §2.2, anti-entropy).
pub const DIGESTS_AFTER_CHANGE: u64 = 100;
/// Rounds between digests in a view that has held for [`DIGESTS_AFTER_CHANGE`] rounds.
pub const DIGEST_EVERY_SETTLED: u64 = 600;
/// A key stays listed this many rounds after its last change (a frame repeating further back
/// lists it again). Without acknowledgements (`Params::acks` false, for tests) a frame repeats
/// the changes of this many rounds, so up to `REPEAT - 1` lost frames in a row do not break a
/// receiver's view of the sender.
pub const REPEAT: u64 = 3;
/// With acknowledgements, a change is repeated until every peer this node waits for has said
/// it holds it, for at most this many rounds (1 s at the defaults): a peer whose frames or
/// ticks ran late for a while fills its gap from the repeats instead of asking for a full
/// frame, whose visit of every key and size make the next frames later still (design §10,
/// "A full-frame storm"). A peer silent for longer is suspected by then and not waited for.
pub const MAX_REPEAT: u64 = 10;
/// A based fixed-window slot is left as it is, its bases implicit, while every participant
/// holds at least this many rounds of its demand (design §3.3.1, "Quiet keys"). Two cost
/// 0.4 points of the simulation's admitted share at the limit (a node's base ran low before
/// the others' came to it); four cost none, and no more bytes.
pub const QUIET_ROUNDS: u64 = 4;
/// A sliding window log is counted in the cluster per sub-slot of `period / k`, with k the
/// largest number up to this for which a sub-slot is a whole number of rounds.
pub const LOG_SUBSLOTS: u64 = 16;
/// A round's reports are split into parts of at most about this many encoded bytes.
pub const PART_BYTES: usize = 768 * 1024;
/// The most parts a round's frame may have (bounds what a peer can make a node buffer).
pub const MAX_PARTS: u32 = 64;
/// Rounds of frame arrival times a peer's clock offset is estimated from (5 s at 100 ms).
const OFFSET_SAMPLES: usize = 50;
/// Rounds a peer must have been heard in before its offset is estimated.
const OFFSET_MIN_SAMPLES: usize = 5;

/// Fixed-point scale of a bucket share: `SHARE_ONE` is the whole rate.
pub const SHARE_ONE: u64 = 1 << 20;
/// The demand-independent part of a window lease weight: 1/20 spread evenly (design §3.3.1).
const WINDOW_FLOOR: u64 = 20;
/// The escrow margin m of a windowed limit, as `1/ESCROW_MARGIN` of the limit: the room
/// below `(1 − m)·C` is held evenly by every participant, the rest follows demand (design
/// §3.3.1). A check is admitted at once while the key's count stays below `(1 − m)·C` and the
/// node's round stays within its even share of that room.
pub const ESCROW_MARGIN: u64 = 20;
/// The base eras a node keeps and publishes: a slot older than both is one it has no base in.
const MAX_ERAS: usize = 2;
/// The demand-independent part of a bucket share: 1/100 spread evenly (design §3.5).
const BUCKET_FLOOR: u64 = 100;

/// What a side of a partition does with the unreachable members' part of a limit (design §5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnPartition {
    /// Unreachable members keep their last share: the cluster never admits more than the limit.
    Hold,
    /// Once membership declares them dead, each side allots the whole limit among itself.
    Split,
}

impl OnPartition {
    /// The config name.
    pub fn name(self) -> &'static str {
        match self {
            OnPartition::Hold => "hold",
            OnPartition::Split => "split",
        }
    }
}

/// Timing and policy of the round protocol.
#[derive(Clone, Debug)]
pub struct Params {
    /// Round length T.
    pub round: Nanos,
    /// Settle δ: how long after a boundary its instant comes (`L + P + ε ≤ δ`).
    pub settle: Nanos,
    /// Rounds in a row with nothing from a peer before it is suspected (M); a peer whose
    /// frames come late is suspected after [`LATE_SUSPECT_FACTOR`] times as many.
    pub suspect_after: u32,
    /// Rounds between anti-entropy digests (K); a key peers reported on in the last 2K rounds
    /// is not forgotten.
    pub full_every: u64,
    /// What partitions do.
    pub on_partition: OnPartition,
    /// Visit every key at every boundary and instant, instead of only the keys something
    /// happened to (see [`Global::tick`]). For tests that check the two agree.
    pub visit_all: bool,
    /// Repeat a change only until every peer has said it holds it (`RoundFrame::acks`);
    /// `false` repeats every change for [`REPEAT`] rounds. For tests that compare the two.
    pub acks: bool,
    /// Hash keys from this seed rather than a random one (see [`Store::with_hash_seed`]):
    /// for the simulation, whose runs must repeat exactly.
    pub hash_seed: Option<u64>,
}

impl Default for Params {
    fn default() -> Params {
        Params {
            round: DEFAULT_ROUND,
            settle: DEFAULT_SETTLE,
            suspect_after: DEFAULT_SUSPECT_AFTER,
            full_every: DEFAULT_FULL_EVERY,
            on_partition: OnPartition::Hold,
            visit_all: false,
            acks: true,
            hash_seed: None,
        }
    }
}

/// A global rule could not be served with these [`Params`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GlobalError {
    /// A windowed limit's slots must start on round boundaries.
    #[error(
        "rule \"{rule}\": a global {algorithm} needs a period that is a multiple of {need_ms} ms (the gossip interval)"
    )]
    Period {
        /// The rule.
        rule: String,
        /// Its algorithm.
        algorithm: Algorithm,
        /// The period must be a multiple of this.
        need_ms: u64,
    },
    /// δ must leave room in the round.
    #[error("settle time must be shorter than half the round")]
    Settle,
    /// A rule's limits changed in more than their numbers (an algorithm, a period, a leaky
    /// bucket's rate, how many), or no such rule.
    #[error(
        "only the numbers of a global rule's limits (limit, burst) can change while the node runs"
    )]
    Relimit,
    /// A reload added more global rules than a process can hold ([`MAX_GLOBAL_RULES`]).
    #[error(
        "a node serves at most {MAX_GLOBAL_RULES} global rules over its life, removed ones included: restart it to add more"
    )]
    TooManyRules,
}

/// How many global rules a node can serve over its life: those it started with, plus those
/// reloads added (a removed rule keeps its place until the node restarts).
pub const MAX_GLOBAL_RULES: usize = 1024;

/// A member of the cluster as the membership layer reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberInfo {
    /// Its current incarnation.
    pub actor: Actor,
    /// Whether the failure detector holds it alive.
    pub alive: bool,
    /// It announced a graceful leave: it published its last counts and admits nothing more,
    /// so its share is released rather than held (design §5).
    pub left: bool,
    /// With `left`: every admission of this incarnation is in its round frames up to this
    /// round (it stopped admitting before that round's boundary). A peer that applied that
    /// frame knows its final counts and charges no retirement.
    pub published_through: Option<u64>,
    /// The numbers of its global rules' limits as it publishes them (`None`: it publishes
    /// none, as a node of an earlier version): the numbers in force are the smaller of this
    /// node's and those of every member taking part in the allotment (see [`Global::relimit`]).
    pub numbers: Option<Arc<RuleNumbers>>,
}

/// The numbers of a node's global rules as it publishes them: per rule name, `(limit, burst)`
/// of each of the rule's limits in order.
pub type RuleNumbers = BTreeMap<String, Vec<(u64, u64)>>;

/// Something for the caller to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// The same message to every member.
    ToAll(Message),
    /// A message to one member (by node id).
    To(String, Message),
}

/// Why a peer's message was refused (counted by reason).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reject {
    /// The message names a sender other than the authenticated peer.
    Impostor,
    /// The sender is not a member (yet).
    NotMember,
    /// An older incarnation of a node whose newer one is known.
    StaleGeneration,
    /// A round too far from ours (clock skew beyond what rounds tolerate, or a replay).
    RoundOutOfRange,
    /// A message kind this node does not expect from peers.
    Unexpected,
    /// A round frame whose part numbers make no sense.
    BadParts,
}

impl Reject {
    /// The metric label.
    pub fn name(self) -> &'static str {
        match self {
            Reject::Impostor => "impostor",
            Reject::NotMember => "not_member",
            Reject::StaleGeneration => "stale_generation",
            Reject::RoundOutOfRange => "round_out_of_range",
            Reject::Unexpected => "unexpected",
            Reject::BadParts => "bad_parts",
        }
    }
}

/// Counts of what the round protocol did, for metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Instants at which this node was consistent.
    pub consistent_rounds: u64,
    /// Instants at which it was degraded (took no lease).
    pub degraded_rounds: u64,
    /// Of those, the ones degraded only by a late frame right after a consistent one, which
    /// kept the sliding algorithms' starters open until the next boundary.
    pub kept_rounds: u64,
    /// Key reports dropped: unknown rule, wrong shape, absurd counts or holdings.
    pub reports_dropped: u64,
    /// A peer's counts ignored for a slot this node cannot read: more than one slot ahead of
    /// its clock, or older than the lookback (clock skew or a very late frame, design §4).
    pub dots_out_of_range: u64,
    /// Dots refused because a peer claimed this node's own actor.
    pub own_dots_refused: u64,
    /// Keys that could not be tracked because the store was full.
    pub store_full: u64,
    /// Keys whose counts took a retired actor's ghost ([`Global::retire`]).
    pub retired_ghosts: u64,
    /// Graceful leaves whose final frame was in, so no retirement was charged.
    pub final_leaves: u64,
    /// Keys visited by boundaries and instants: the listed ones (something happened to
    /// them) and, at a boundary, one shard's worth of the rest, swept for keys to forget; or
    /// every key at a full boundary and after a view change.
    pub key_visits: u64,
    /// [`Stats::key_visits`] per global rule, by name, in the rules' order.
    pub rule_visits: Vec<(String, u64)>,
    /// Full frames sent (every key with something to say named, every key visited), by
    /// cause: a membership change, or a peer that asked for one (it missed more of this
    /// node's frames than the repeats cover).
    pub full_frames: FullFrames,
    /// Instants that visited every key (their inputs moved for all: a view change, a
    /// suspicion, a side regrown).
    pub full_instants: u64,
    /// Times the numbers in force of some global limit changed ([`Global::relimit`], or a
    /// member's published numbers).
    pub numbers_changes: u64,
}

/// Full frames sent, by cause ([`Stats::full_frames`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FullFrames {
    /// A member joined, left or restarted (a suspicion that comes or goes sends none).
    pub view_changed: u64,
    /// A peer said it lacks this node's state (`want_full`).
    pub asked: u64,
}

/// How a limit counts in the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Fixed,
    Counter,
    Log,
    Bucket,
}

impl Kind {
    fn of(limit: &Limit) -> Kind {
        match limit.algorithm() {
            Algorithm::FixedWindow => Kind::Fixed,
            Algorithm::SlidingWindowCounter => Kind::Counter,
            Algorithm::SlidingWindowLog => Kind::Log,
            Algorithm::TokenBucket | Algorithm::LeakyBucket => Kind::Bucket,
        }
    }
}

/// One limit of a global rule with what the cluster needs to count it.
#[derive(Debug)]
struct GLimit {
    /// The limit as this node started with it: its algorithm and period hold for the
    /// process; its numbers are `numbers`.
    shape: Limit,
    /// The numbers in force, `(limit, burst)`: the smaller of this node's own and those of
    /// every member in the allotment that runs the rule (design §3.8). Written only
    /// under the round lock; the check path may read one half of a change before the other,
    /// a mix of two limits in force one after the other.
    numbers: [AtomicU64; 2],
    /// The largest numbers this node or any member has run the limit with since this node
    /// started: what a peer's frame may say it counted or holds is judged against them.
    ceiling: [AtomicU64; 2],
    kind: Kind,
    /// Length of one counting slot.
    slot_len: Nanos,
    /// Sub-slots per period (a log's; 1 for the others).
    subslots: u64,
    /// The counters' rule label for this limit (`rule`, or `rule#i` for the i-th limit).
    label: String,
}

impl GLimit {
    fn new(shape: Limit, kind: Kind, slot_len: Nanos, subslots: u64, label: String) -> GLimit {
        let pair = || [AtomicU64::new(shape.limit()), AtomicU64::new(shape.burst())];
        GLimit {
            shape,
            numbers: pair(),
            ceiling: pair(),
            kind,
            slot_len,
            subslots,
            label,
        }
    }

    /// The limit in force.
    fn limit(&self) -> Limit {
        self.shape.with_numbers(
            self.numbers[0].load(Ordering::Relaxed),
            self.numbers[1].load(Ordering::Relaxed),
        )
    }

    /// The largest limit run anywhere since this node started (see `ceiling`).
    fn ceiling(&self) -> Limit {
        self.shape.with_numbers(
            self.ceiling[0].load(Ordering::Relaxed),
            self.ceiling[1].load(Ordering::Relaxed),
        )
    }

    /// Slots a decision at slot `s` reads, oldest first: `s - span + 1 ..= s`.
    fn span(&self) -> u64 {
        match self.kind {
            Kind::Fixed | Kind::Bucket => 1,
            Kind::Counter => 2,
            Kind::Log => self.subslots + 1,
        }
    }

    /// The units the budget counts against `limit` at `now` in slot `s`, given each slot's
    /// count (design §3.4).
    fn budget(&self, s: u64, now: Nanos, count: impl Fn(u64) -> u64) -> u64 {
        match self.kind {
            Kind::Fixed | Kind::Bucket => count(s),
            Kind::Counter => {
                let prev = if s == 0 { 0 } else { count(s - 1) };
                self.weighted(s, now, prev).saturating_add(count(s))
            }
            Kind::Log => (s.saturating_sub(self.subslots)..=s)
                .map(&count)
                .fold(0u64, u64::saturating_add),
        }
    }

    /// A sliding counter's weight at `now` of a previous slot that holds `p`,
    /// ⌈p·(w − e)/w⌉ with e the time into slot `s`, capped at w.
    fn weighted(&self, s: u64, now: Nanos, p: u64) -> u64 {
        let w = u128::from(self.slot_len);
        let elapsed = u128::from(now.saturating_sub(s.saturating_mul(self.slot_len))).min(w);
        u64::try_from((u128::from(p) * (w - elapsed)).div_ceil(w)).unwrap_or(u64::MAX)
    }

    /// What a sliding counter's previous slot, holding `p`, fades by in slot `s` from `from`
    /// to `to`: the room its weight frees over that time (design §3.4, fade share).
    fn faded(&self, s: u64, from: Nanos, to: Nanos, p: u64) -> u64 {
        self.weighted(s, from, p)
            .saturating_sub(self.weighted(s, to, p))
    }

    /// A sliding counter's weighted share of a previous slot that holds `p`,
    /// ⌈p·(w − e)/w⌉ with e the time into slot `s` ([`GLimit::budget`]), only steps down as e
    /// grows: the first time from `now` at which it reads less than it does at `now`, or the
    /// end of `s` if it does not before then.
    fn fades_at(&self, s: u64, now: Nanos, p: u64) -> Nanos {
        let w = u128::from(self.slot_len);
        let start = s.saturating_mul(self.slot_len);
        let end = start.saturating_add(self.slot_len);
        let v = u128::from(self.weighted(s, now, p));
        let p = u128::from(p);
        if v == 0 {
            return end;
        }
        // ⌈p·(w − e)/w⌉ ≤ v − 1 ⟺ e ≥ w − (v − 1)·w/p: the least such e.
        let from = w - (v - 1) * w / p;
        start
            .saturating_add(u64::try_from(from).unwrap_or(u64::MAX))
            .min(end)
    }

    fn slot(&self, now: Nanos) -> u64 {
        now / self.slot_len
    }

    /// Whether its slots have bases (design §3.3.1): fixed windows only. A sliding budget
    /// reads earlier slots, whose counts can exceed their holders' bases (room granted by
    /// demand, a past incarnation's counts, a base of fewer participants), so a base there
    /// would be a claim on room already spent.
    fn based(&self) -> bool {
        self.kind == Kind::Fixed
    }

    /// Whether a boundary at `boundary_time`, which starts slot `cur`, carries what this node
    /// still holds of slot `cur − 1` into `cur` (design §3.3.1, carry): for the sliding
    /// algorithms, whose budget of `cur` counts all that was held of `cur − 1` as spent when
    /// `cur` was pre-leased (a round before it starts: so only where slots start on round
    /// boundaries, and the counter's earlier window weighs in whole there).
    fn carries(&self, cur: u64, boundary_time: Nanos) -> bool {
        self.kind != Kind::Fixed && cur > 0 && boundary_time == cur * self.slot_len
    }

    /// Whether a decision can read `slot` at `now`, now or in the next slot: not the far
    /// future, not past the lookback (design §4, far-off slots).
    fn readable(&self, slot: u64, now: Nanos) -> bool {
        let s = self.slot(now);
        slot <= s + 1 && slot + self.span() >= s
    }
}

/// One global rule.
#[derive(Debug)]
struct GRule {
    name: String,
    limits: Vec<GLimit>,
    store: Store<GKey>,
    /// Whether this node's configuration has the rule. A rule a reload removed keeps its
    /// keys until they are idle: the node checks none of them, and its frames report them
    /// (their counts, and room it gives back) as they drain (design §3.8, "Adding and removing
    /// a global rule").
    served: AtomicBool,
    /// Whether this node has had an all-reachable consistent instant since it began serving
    /// the rule (one that started with it did, in effect): until then its idea of which of
    /// the rule's keys were idle at the last such instant is not to be trusted, so a key new
    /// here is not one "idle at the record" (design §5, and §3.8, "Adding and removing a
    /// global rule").
    recorded: AtomicBool,
}

impl GRule {
    /// Rule `name` of `limits`, its keys counted against `keys` / `max_keys`.
    fn new(
        name: String,
        limits: Vec<Limit>,
        params: &Params,
        keys: &Arc<AtomicUsize>,
        max_keys: usize,
    ) -> Result<GRule, GlobalError> {
        let glimits = GRule::limits(&name, limits, params)?;
        let mut store = Store::new(keys.clone(), max_keys);
        if let Some(seed) = params.hash_seed {
            store = store.with_hash_seed(seed);
        }
        Ok(GRule {
            name,
            limits: glimits,
            store,
            served: AtomicBool::new(true),
            recorded: AtomicBool::new(true),
        })
    }

    /// Rule `name`'s limits as the cluster counts them, or why `params` cannot serve them.
    fn limits(name: &str, limits: Vec<Limit>, params: &Params) -> Result<Vec<GLimit>, GlobalError> {
        let mut glimits = Vec::new();
        for (i, limit) in limits.into_iter().enumerate() {
            let kind = Kind::of(&limit);
            let need = if kind == Kind::Bucket {
                1
            } else {
                params.round
            };
            if limit.period() % need != 0 {
                return Err(GlobalError::Period {
                    rule: name.to_owned(),
                    algorithm: limit.algorithm(),
                    need_ms: need / MILLISECOND,
                });
            }
            // A log counts in k sub-slots of whole rounds, k ≤ 16 as large as divides.
            let subslots = match kind {
                Kind::Log => (1..=LOG_SUBSLOTS)
                    .rev()
                    .find(|k| limit.period() % (k * params.round) == 0)
                    .unwrap_or(1),
                _ => 1,
            };
            let slot_len = limit.period() / subslots;
            let label = if i == 0 {
                name.to_owned()
            } else {
                format!("{name}#{i}")
            };
            glimits.push(GLimit::new(limit, kind, slot_len, subslots, label));
        }
        Ok(glimits)
    }

    /// Whether `limits` have this rule's algorithms and periods, so that a reload can keep
    /// its counts and relimit it ([`Global::relimit`]).
    fn fits(&self, limits: &[Limit]) -> bool {
        limits.len() == self.limits.len()
            && self.limits.iter().zip(limits).all(|(l, new)| {
                new.algorithm() == l.shape.algorithm()
                    && new.period() == l.shape.period()
                    && (new.algorithm() != Algorithm::LeakyBucket || *new == l.shape)
            })
    }
}

/// A node's global rules by index. Reloads append ([`Global::add_rule`]) and never remove,
/// so an index stays valid for the life of the process; the check path reads a rule without
/// a lock.
#[derive(Debug)]
struct Rules {
    slots: Box<[OnceLock<Box<GRule>>]>,
    len: AtomicUsize,
}

impl Rules {
    fn new(rules: Vec<GRule>) -> Rules {
        let slots: Box<[OnceLock<Box<GRule>>]> = (0..MAX_GLOBAL_RULES.max(rules.len()))
            .map(|_| OnceLock::new())
            .collect();
        let len = rules.len();
        for (slot, r) in slots.iter().zip(rules) {
            let _ = slot.set(Box::new(r));
        }
        Rules {
            slots,
            len: AtomicUsize::new(len),
        }
    }

    fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    fn get(&self, i: usize) -> Option<&GRule> {
        if i < self.len() {
            self.slots[i].get().map(|r| &**r)
        } else {
            None
        }
    }

    fn iter(&self) -> impl Iterator<Item = &GRule> {
        self.slots[..self.len()]
            .iter()
            .filter_map(|r| r.get().map(|r| &**r))
    }

    /// Appends `rule` (only under the round lock, so appends do not race): its index.
    fn push(&self, rule: GRule) -> Result<usize, GlobalError> {
        let i = self.len();
        let slot = self.slots.get(i).ok_or(GlobalError::TooManyRules)?;
        slot.set(Box::new(rule))
            .map_err(|_| GlobalError::TooManyRules)?;
        self.len.store(i + 1, Ordering::Release);
        Ok(i)
    }
}

impl std::ops::Index<usize> for Rules {
    type Output = GRule;

    fn index(&self, i: usize) -> &GRule {
        match self.get(i) {
            Some(r) => r,
            None => panic!("global rule {i} of {}", self.len()),
        }
    }
}

/// A key's lease of one slot: room this node holds. It grows only by a grant at a
/// consistent instant, and only this node shrinks it, by spending or by returning it at a
/// boundary (design §3.3.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Grant {
    slot: u64,
    /// Units this node may admit in `slot`, all told.
    allowance: u64,
    /// Of which admitted so far.
    used: u64,
    /// What this node should hold of the slot's room, as of the last instant that allotted
    /// it: a boundary returns what it holds beyond this.
    target: u64,
    /// A starter grant (design §3.3.1): valid until the instant after the one whose phase
    /// allowed it (`opened`), which charges it to this node as held room or ends it.
    starter: bool,
    /// Of `used`, the units a sliding counter admitted on its fade share in round `opened`
    /// (design §3.4): beyond the allowance, which grew with them.
    on_fade: u32,
    /// A sliding counter's fade seats, its part of the fade share ([`fade_seats`]), as the
    /// last allotment of the slot dealt them.
    fade_seats: u16,
    /// For a starter, the round of the instant that allowed it; for a lease, the round whose
    /// fade share `on_fade` counts.
    opened: u64,
}

impl Grant {
    fn spendable(&self) -> u64 {
        self.allowance.saturating_sub(self.used)
    }

    /// An allotment of nothing (a key found idle): no room held, none spent.
    fn is_empty(&self) -> bool {
        !self.starter && self.allowance == 0 && self.used == 0
    }

    /// Ends a starter: what it admitted stays admitted, the rest is given up.
    fn end_starter(&mut self) {
        self.allowance = self.used;
        self.starter = false;
    }
}

/// The (current, next) slots a windowed limit's grants were computed for (`set` false:
/// none yet): 16 bytes, whose `bool` leaves [`LState`] a niche for its tag, so a key's limit
/// state is no larger than its window state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Leased {
    cur: u64,
    /// How many slots after `cur` the next one is.
    ahead: u32,
    set: bool,
}

impl Leased {
    fn new(cur: u64, next: u64) -> Leased {
        Leased {
            cur,
            ahead: u32::try_from(next.saturating_sub(cur)).unwrap_or(u32::MAX),
            set: true,
        }
    }
}

/// A windowed limit's state for one key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct WState {
    /// This node's admissions per slot, oldest first (live: counted under the shard lock).
    own: Pairs,
    /// Every other actor's count per slot (ghosts included), as of the last instant.
    others: Pairs,
    /// Leases of the current slot and of the next one.
    grants: SmallVec<[Grant; 1]>,
    /// The room held as published at the last boundary, `(slot, units)`.
    published_held: Pairs,
    /// What the last fully consistent instant allotted, for ghosts during a partition.
    hold: Option<Box<HoldRecord>>,
    /// The (current, next) slots the grants were computed for.
    leased_for: Leased,
    /// A sliding counter allotted with every participant reachable: until when its budget
    /// reads what it read then ([`GLimit::fades_at`]), so that an allotment from the same
    /// inputs would be the same (0: not known to hold).
    steady_until: Nanos,
}

impl WState {
    fn own_in(&self, slot: u64) -> u64 {
        self.own
            .iter()
            .find(|(s, _)| *s == slot)
            .map_or(0, |(_, n)| *n)
    }

    fn others_in(&self, slot: u64) -> u64 {
        self.others
            .iter()
            .find(|(s, _)| *s == slot)
            .map_or(0, |(_, n)| *n)
    }
}

/// A bucket limit's state for one key: a local bucket of this node's share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct BState {
    /// Tokens in units of `1 / (period × SHARE_ONE)`; negative while shaping reservations
    /// are outstanding.
    level: i128,
    /// When `level` was last brought up to date.
    at: Nanos,
    /// This node's share of the rate, out of [`SHARE_ONE`]: held, like a window's room
    /// (design §3.5). It moves only at an instant with every participant's frame in: it
    /// grows there, into the share no frame says is held, and shrinks from the next
    /// boundary, whose frame publishes it. It follows demand.
    share: u64,
    /// This node's share of the burst (its bucket's capacity), held as `share` is. It is
    /// an escrow: all but `1/ESCROW_MARGIN` of the burst is split evenly, so a burst at any
    /// node finds its part of the tokens there, whichever node was busy before.
    burst: u64,
    /// Tokens clipped since the last frame (the capacity shrank below the level), in units
    /// of `1 / SHARE_ONE` token: the next frame gives them back.
    returned: u64,
    /// Smaller shares (rate, burst) decided at the last instant, held from the next boundary
    /// on (until then this node keeps using the shares its last frame published). 0: none.
    shrink_to: (u64, u64),
    /// Tokens (`1 / SHARE_ONE` units) the last instant found this node holding beyond its
    /// part of the cluster's tokens: the next boundary gives them back (at most its level),
    /// for the nodes short of theirs to take up (design §3.5).
    give: u64,
    /// What the last frame said the bucket lacked of its capacity, in whole tokens, rounded
    /// down to a multiple of [`short_step`]: 0 when full.
    short: u64,
    /// What the frame of round `.0` gave back (`.1`, as `returned`): the nodes with every
    /// participant's frame in take it up at that round's instant, by their targets.
    published: (u64, u64),
}

impl BState {
    fn rate(&self, limit: &Limit) -> i128 {
        i128::from(limit.limit()) * i128::from(self.share.max(1))
    }

    fn cap(&self, limit: &Limit) -> i128 {
        cap_of(limit, self.burst)
    }

    fn level_at(&self, limit: &Limit, now: Nanos) -> i128 {
        let elapsed = i128::from(now.saturating_sub(self.at));
        self.level
            .saturating_add(elapsed.saturating_mul(self.rate(limit)))
            .min(self.cap(limit))
    }

    /// An instant with every participant's frame in: the shares become `(rate, burst)`;
    /// tokens above the new capacity are clipped and set aside to be given back; then this
    /// node takes up `taken` (`1 / SHARE_ONE` token units) of what the participants gave
    /// back in this round's frames, up to its capacity (design §3.5).
    fn reshare(&mut self, limit: &Limit, (rate, burst): (u64, u64), taken: u64, now: Nanos) {
        let period = i128::from(limit.period());
        let level = self.level_at(limit, now);
        self.share = rate;
        self.burst = burst;
        let cap = self.cap(limit);
        let clipped = u64::try_from((level - cap).max(0) / period).unwrap_or(u64::MAX);
        self.returned = self.returned.saturating_add(clipped);
        let taken = i128::from(taken) * period;
        self.level = level.min(cap).saturating_add(taken).min(cap);
        self.at = self.at.max(now);
    }

    /// An instant with every participant's frame in: the new shares from the demands and
    /// what the participants' frames say, `(rate, burst, short)` each (this node first, see
    /// [`held_share`] and [`tokens_moved`]), and this node's part of `pool`, the tokens given
    /// back in this round's frames.
    fn move_share(
        &mut self,
        limit: &Limit,
        demands: &[u64],
        held: &[(u64, u64, u64)],
        pool: u64,
        now: Nanos,
    ) {
        let rates: Vec<u64> = held.iter().map(|h| h.0).collect();
        let bursts: Vec<u64> = held.iter().map(|h| h.1).collect();
        let (share, _) = held_share(demands, &rates, bucket_target);
        let (burst, _) = held_share(demands, &bursts, burst_target);
        let (taken, give) = tokens_moved(limit, demands, held, pool);
        self.give = give;
        // A smaller share is held from the next boundary: until then no one else can be
        // granted the room (the frames of this round say this node holds it), so this node
        // keeps using it.
        let smaller = |new: u64, old: u64| if new < old { new } else { 0 };
        self.shrink_to = (smaller(share, self.share), smaller(burst, self.burst));
        let kept = (share.max(self.share), burst.max(self.burst));
        self.reshare(limit, kept, taken, now);
    }

    /// The shares as the frame publishes them (none when both are the default), and what
    /// the bucket lacks of its capacity (none when full).
    fn held_report(&self, default: u64) -> Pairs {
        let mut report = Pairs::new();
        if self.share != default || self.burst != default {
            report.extend([(0, self.share), (1, self.burst)]);
        }
        if self.short > 0 {
            report.push((2, self.short));
        }
        report
    }

    /// What the bucket lacks of its capacity at `now`, in whole tokens, rounded down to a
    /// multiple of [`short_step`], as a frame publishes it.
    fn short_at(&self, limit: &Limit, now: Nanos) -> u64 {
        let token = i128::from(limit.period()) * i128::from(SHARE_ONE);
        let lacks = (self.cap(limit) - self.level_at(limit, now)).max(0) / token;
        let step = short_step(limit);
        u64::try_from(lacks).unwrap_or(u64::MAX) / step * step
    }

    /// Whether the last frame still says all of it at `now`: nothing to give back or give up,
    /// and the tokens it lacks as published.
    fn as_published(&self, limit: &Limit, now: Nanos) -> bool {
        self.returned == 0
            && self.shrink_to == (0, 0)
            && self.give == 0
            && self.short_at(limit, now) == self.short
    }

    /// A boundary: the shares the last instant gave up are given up, and the tokens it found
    /// beyond this node's part given back, as this frame publishes them.
    fn settle(&mut self, limit: &Limit, now: Nanos) {
        let (rate, burst) = std::mem::take(&mut self.shrink_to);
        let shrunk = |to: u64, from: u64| if to > 0 { to.min(from) } else { from };
        let to = (shrunk(rate, self.share), shrunk(burst, self.burst));
        if to != (self.share, self.burst) {
            self.reshare(limit, to, 0, now);
        }
        let give = std::mem::take(&mut self.give);
        if give > 0 {
            let period = i128::from(limit.period());
            let level = self.level_at(limit, now);
            let given = (i128::from(give) * period).min(level.max(0)) / period;
            self.level = level - given * period;
            self.at = self.at.max(now);
            self.returned = self
                .returned
                .saturating_add(u64::try_from(given).unwrap_or(0));
        }
        self.short = self.short_at(limit, now);
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum LState {
    Window(WState),
    Bucket(BState),
}

/// What a frame says of one key: demand, and per limit what is held: for a windowed limit
/// the room held, `(slot, units)` per slot; for a bucket limit `[(0, share)]` when the share
/// held is not the default one over the participants, else nothing.
type Summary = (u64, SmallVec<[Pairs; 1]>);

/// `(slot, units)` pairs: a key's counts or holdings per slot. Nearly always one (the
/// current slot), kept inline then, in the space of a `Vec`'s header.
type Pairs = SmallVec<[(u64, u64); 1]>;

/// One key of a global rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GKey {
    /// Cost units that arrived this round (admitted or not): the demand signal.
    arrivals: u64,
    /// The smoothed demand published at the last boundary.
    demand: u64,
    /// What the last frame said of this key (demand and holdings), to send only changes;
    /// none while it said the key is idle. Boxed: the table holds a `GKey` for every key, and
    /// only keys in use have a summary.
    sent: Option<Box<Summary>>,
    /// Own counts changed since the last frame.
    counts_dirty: bool,
    /// The last round whose frame carried a change of own counts, modulo 256: a frame
    /// repeats the counts while that round is at or after its `since` (until every peer has
    /// acked it, for at most [`MAX_REPEAT`] rounds), and otherwise leaves them out (a wrapped
    /// value only makes a frame carry them again).
    counts_in: u8,
    /// The last round whose frame carried a change of this key.
    changed_in: u64,
    /// Whether the last instant allotted this key (so it is not idle cluster-wide).
    known: bool,
    /// Whether the key's windowed limits are in use as of the last instant (counts, demand or
    /// room held), or since: this shuts their starters. The same as `known` but for a bucket
    /// beside them, which keeps the key known whether or not anyone uses its windows.
    windows_known: bool,
    /// Whether the last all-reachable consistent instant that visited this key found its
    /// windowed limits idle (no counts in any slot their budgets read, no room held, no
    /// demand), or it was new since: while a side holds for a partition, such a key may be
    /// admitted in the slots allotted before the side began to hold, up to a starter's size
    /// of this node's own use (design §5, "Keys idle at the record").
    idle_at_record: bool,
    /// Something an allocation reads changed since the last instant: a peer's report, or
    /// this node's counts, demand or holdings. An unchanged key is not allotted again.
    inputs_changed: bool,
    /// The last round in which a peer reported demand or holdings for this key (kept until
    /// its reports are surely idle, so the key is allotted, not mistaken for a new one).
    remote_round: u64,
    /// The round the key is queued to be listed again at (0: none); see [`dormant_until`].
    wake: u64,
    limits: Box<[LState]>,
}

impl GKey {
    /// A key nobody here has used. A bucket starts full at the default share, except on a
    /// node that has not settled (a starting or restarted one, see `Global::settled`): the
    /// key may be in use, its shares held by the others, and the old incarnation's tokens
    /// spent, so it starts empty at the floor share and grows like any other share (design
    /// §3.5, "Restart and join").
    fn fresh(rule: &GRule, now: Nanos, participants: u64, settled: bool) -> GKey {
        let share = if settled {
            default_share(participants)
        } else {
            (default_share(participants) / BUCKET_FLOOR).max(1)
        };
        let limits = rule
            .limits
            .iter()
            .map(|l| match l.kind {
                Kind::Bucket => {
                    let mut b = BState {
                        level: 0,
                        at: now,
                        share,
                        burst: share,
                        returned: 0,
                        shrink_to: (0, 0),
                        give: 0,
                        short: 0,
                        published: (0, 0),
                    };
                    if settled {
                        b.level = b.cap(&l.limit());
                    }
                    LState::Bucket(b)
                }
                _ => LState::Window(WState::default()),
            })
            .collect();
        GKey {
            arrivals: 0,
            demand: 0,
            sent: None,
            counts_dirty: false,
            counts_in: 0,
            changed_in: 0,
            known: false,
            windows_known: false,
            idle_at_record: rule.recorded.load(Ordering::Acquire),
            inputs_changed: true,
            remote_round: 0,
            wake: 0,
            limits,
        }
    }

    /// Whether forgetting the key changes nothing: no demand, no counts, no lease in use and
    /// full buckets holding the default share of `participants`.
    fn is_fresh(&self, rule: &GRule, now: Nanos, participants: u64) -> bool {
        self.arrivals == 0
            && self.demand == 0
            && self
                .sent
                .as_deref()
                .is_none_or(|(d, h)| *d == 0 && h.iter().all(|h| h.is_empty()))
            && self.limits.iter().zip(&rule.limits).all(|(s, l)| match s {
                LState::Window(w) => {
                    w.own.is_empty()
                        && w.others.iter().all(|(_, n)| *n == 0)
                        // Any lease kept, even an empty one: in a slot this node has a base
                        // in, an empty lease is a base given back, which forgetting the key
                        // would take again.
                        && w.grants.is_empty()
                }
                LState::Bucket(b) => {
                    b.returned == 0
                        && b.give == 0
                        && b.held_report(default_share(participants)).is_empty()
                        && b.level_at(&l.limit(), now) >= b.cap(&l.limit())
                }
            })
    }
}

/// The phase the check path reads without the round lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Phase {
    /// Between an instant and the next boundary.
    open: bool,
    /// The last instant was consistent and opened starters: with every participant
    /// reachable, or holding for a partition with the participants of the last
    /// all-reachable instant, in the slots allotted since ([`Global::starters_from`]).
    consistent: bool,
    /// The last instant was degraded only by a late frame, right after a consistent one
    /// (same view, every participant reachable): the sliding algorithms' starters stay open
    /// until the next boundary, which ends them (design §3.3.1, "Starters across a late
    /// frame").
    kept: bool,
    /// The last instant had every participant reachable: its holders return (and, for the
    /// sliding algorithms, carry) at the next boundary (`RoundState::returns`).
    returns: bool,
    /// The round of the last instant.
    round: u64,
}

impl Phase {
    /// Whether the last instant pre-leased the slots that start at round `n`'s boundary, so
    /// that the boundary (or a check before it, [`Global::carry_early`]) carries a sliding
    /// slot's holding into the next: it was the previous round's (so no boundary has run
    /// since, and its phase is still open), consistent, with every participant reachable.
    fn pre_leased(self, n: u64) -> bool {
        self.consistent && self.returns && self.round + 1 == n
    }
}

/// A peer as the round protocol tracks it.
#[derive(Debug)]
struct Peer {
    actor: Actor,
    alive: bool,
    /// Frame parts received, by (round, part), not yet applied.
    frames: BTreeMap<(u64, u32), RoundFrame>,
    /// The last round through which this node holds the peer's complete reports.
    complete_to: Option<u64>,
    /// The last round whose frame was applied (older frames arriving late are ignored).
    applied: Option<u64>,
    /// The round through which the peer's last applied frame said it holds this node's
    /// complete state (`RoundFrame::acks`; 0: none said). It decides only how long this
    /// node repeats a change: a receiver judges its completeness itself, and asks for a full
    /// frame when it is not complete.
    acked: u64,
    /// The view hash of each applied round, for the consistency check (last few only).
    views: BTreeMap<u64, u64>,
    /// What each applied round's frame said of the peer's starters (`RoundFrame::open`).
    opens: BTreeMap<u64, Option<u32>>,
    /// The base eras its last applied frame published (`RoundFrame::eras`).
    eras: Vec<(u64, u32)>,
    /// Instants in a row without its frame of the round.
    missed: u32,
    /// Instants in a row before which nothing came from it since the instant before.
    silent: u32,
    /// Part of a round frame came (of any round in range) since the last instant.
    heard: bool,
    suspected: bool,
    /// Last report per rule index, per key: demand and per-limit holdings.
    reports: Vec<HashMap<String, Summary, foldhash::fast::RandomState>>,
    /// Tokens its frame of round `returned_round` gave back, per rule index, per key: one
    /// entry per limit (0 for windowed limits). Only that round's instant takes them up.
    returned: Vec<HashMap<String, Vec<u64>, foldhash::fast::RandomState>>,
    returned_round: u64,
    /// A repair from this peer has been applied since it (re)appeared.
    pulled: bool,
    /// For its last [`OFFSET_SAMPLES`] rounds: when the first part of its frame arrived, less
    /// that round's boundary by this node's clock (ns). See [`Global::clock_offsets`].
    leads: std::collections::VecDeque<i64>,
    /// Its counts ignored because their slot was out of this node's range (see
    /// [`Stats::dots_out_of_range`]), since it (re)appeared.
    out_of_range: u64,
}

impl Peer {
    /// Whether this peer keeps instant `n` from being consistent (design §3.3.4): it is not
    /// suspected, and its complete round-n frame is missing or reported another view than
    /// `my_view`.
    fn breaks_consistency(&self, n: u64, my_view: Option<u64>) -> bool {
        !self.suspected && (self.complete_to != Some(n) || self.views.get(&n).copied() != my_view)
    }

    fn new(actor: Actor, alive: bool, rules: usize) -> Peer {
        Peer {
            actor,
            alive,
            frames: BTreeMap::new(),
            complete_to: None,
            applied: None,
            acked: 0,
            views: BTreeMap::new(),
            opens: BTreeMap::new(),
            eras: Vec::new(),
            missed: 0,
            silent: 0,
            heard: false,
            suspected: false,
            reports: (0..rules).map(|_| HashMap::default()).collect(),
            returned: (0..rules).map(|_| HashMap::default()).collect(),
            returned_round: 0,
            pulled: false,
            leads: std::collections::VecDeque::new(),
            out_of_range: 0,
        }
    }
}

/// What a fully consistent instant allotted a key's windowed limit, kept so that the sides
/// of a later partition can charge the unreachable members a ghost (design §5, `hold`).
/// Entries are in the order of [`RoundState::hold_nodes`].
#[derive(Clone, Debug, PartialEq, Eq)]
struct HoldRecord {
    slot: u64,
    /// Per node: its count in `slot` at the boundary plus the room it held and was granted
    /// (inline up to three nodes, so a record is one allocation).
    claims: SmallVec<[u64; 3]>,
}

/// Lookups of one key's slots of one limit in [`Counters`], each slot found once: an
/// allotment reads the same few slots many times over (a log's budget alone reads 17), and a
/// lookup hashes the key.
struct SlotReader<'a> {
    counters: &'a Counters,
    label: &'a str,
    key: &'a str,
    found: RefCell<SmallVec<[Found<'a>; 4]>>,
}

/// A slot looked up by a [`SlotReader`], and what was found.
type Found<'a> = (u64, Option<SlotView<'a>>);

impl<'a> SlotReader<'a> {
    /// Slots remembered at most (a log's span and the slots leased ahead fit).
    const REMEMBERED: usize = 24;

    fn new(counters: &'a Counters, label: &'a str, key: &'a str) -> SlotReader<'a> {
        SlotReader {
            counters,
            label,
            key,
            found: RefCell::new(SmallVec::new()),
        }
    }

    fn view(&self, slot: u64) -> Option<SlotView<'a>> {
        if let Some(&(_, view)) = self.found.borrow().iter().find(|(s, _)| *s == slot) {
            return view;
        }
        let view = self.counters.slot_view(self.label, self.key, slot);
        let mut found = self.found.borrow_mut();
        if found.len() < Self::REMEMBERED {
            found.push((slot, view));
        }
        view
    }

    fn total(&self, slot: u64) -> u64 {
        self.view(slot).map_or(0, |v| v.total())
    }

    fn others(&self, slot: u64) -> u64 {
        self.view(slot).map_or(0, |v| v.others())
    }

    fn count(&self, slot: u64, actor: &Actor) -> u64 {
        self.view(slot).map_or(0, |v| v.count(actor))
    }
}

/// One participant of an instant's allocation.
#[derive(Debug)]
struct Part<'a> {
    node: &'a str,
    actor: &'a Actor,
    /// `None` for this node.
    peer: Option<&'a Peer>,
    reachable: bool,
    /// Its position in [`RoundState::hold_nodes`].
    hold_index: Option<usize>,
    /// What its frame of this round said of its starters (`RoundFrame::open`).
    open: Option<u32>,
}

/// Buffers reused from key to key at an instant.
#[derive(Debug, Default)]
struct Scratch<'a> {
    demands: Vec<u64>,
    reports: Vec<Option<&'a Summary>>,
    /// Bucket shares held and tokens lacked, `(rate, burst, short)` per participant.
    shares: Vec<(u64, u64, u64)>,
}

/// State only the round task touches.
#[derive(Debug)]
struct RoundState {
    counters: Counters,
    peers: BTreeMap<String, Peer>,
    /// The last boundary processed.
    boundary: Option<u64>,
    /// The last instant processed.
    instant: Option<u64>,
    /// The view hash this node published at each recent boundary.
    my_views: BTreeMap<u64, u64>,
    /// What this node's frame of each recent round said of its starters (`RoundFrame::open`).
    my_opens: BTreeMap<u64, Option<u32>>,
    /// This node's base eras (`RoundFrame::eras`, design §3.3.1): none until its first
    /// instant with every participant's frame in; then one more each time the number of
    /// participants changes, from the round it changes in. At most [`MAX_ERAS`].
    my_eras: Vec<(u64, u32)>,
    /// The participants of the last fully consistent instant, in the order of every
    /// [`HoldRecord`].
    hold_nodes: Vec<Actor>,
    stats: Stats,
    /// The view changed since the last boundary: send full frames.
    view_changed: bool,
    /// The view of the last consistent instant.
    consistent_view: Option<u64>,
    /// Peers that left on purpose, with their final frame in, since the last consistent
    /// instant: a view that differs from that instant's by them alone keeps starters open
    /// (design §3.3.1, "Starters across a late frame").
    left_since: Vec<Actor>,
    /// While some participant is suspected: the instant the set of suspects last changed.
    /// Slots that could be allotted before it get no more room until it heals.
    hold_from: Option<u64>,
    /// Whether boundaries hand back room held beyond the last targets (not while holding
    /// for a partition).
    returns: bool,
    /// The peers that took part in the last instant's allotment.
    participated: Vec<Actor>,
    /// Peers that stopped taking part (declared dead under `split`) and may come back.
    excluded: Vec<Actor>,
    /// A peer asked for a full frame.
    full_requested: bool,
    /// The round of this node's last full frame: a peer's ask in a frame it built by then is
    /// not answered again.
    last_full: Option<u64>,
    /// Per limit label, the floor last passed to `Counters::forget_before`.
    floors: HashMap<String, u64>,
    /// Rounds at whose boundary dormant keys are to be listed again, with the rules they
    /// are of: the round their windowed limits' slots move (see [`dormant_until`]). Each key
    /// keeps its own round ([`GKey::wake`]), so a quiet key costs no entry here: at the
    /// round, one pass over the rule's keys lists those due.
    wakes: BTreeMap<u64, BTreeSet<usize>>,
    /// The keys each of the last [`MAX_REPEAT`] boundaries published a change of, as (rule
    /// index, key): a frame that repeats further back than [`REPEAT`] rounds (a peer's acks
    /// lag) lists them again, since a key goes dormant once [`REPEAT`] rounds have passed.
    changes: BTreeMap<u64, Vec<(usize, Box<str>)>>,
    /// Keys a degraded instant found waiting only to be allotted, as (rule index, key): listed
    /// again at the next consistent instant, so that the degraded ones between do not visit
    /// them each round.
    unallotted: Vec<(usize, Box<str>)>,
    /// A hash of what the last consistent instant's allotments read besides each key's own
    /// inputs; an instant that finds it changed visits every key (a degraded instant between
    /// allots nothing, so the comparison is with the last one that did).
    shared_inputs: Option<u64>,
    /// This node's own numbers of each rule's limits, `(limit, burst)` ([`Global::relimit`]).
    own_numbers: Vec<Vec<(u64, u64)>>,
    /// What each member taking part in the allotment publishes of its numbers
    /// (`MemberInfo::numbers`), alive or not.
    member_numbers: BTreeMap<String, Arc<RuleNumbers>>,
    /// The numbers in force changed since the last consistent instant: it visits every key
    /// and renews no lease as it was.
    numbers_moved: bool,
    /// A degraded instant found every key's inputs changed: the next consistent instant
    /// visits every key (a degraded one allots none, so it visits only the listed keys).
    visit_all_due: bool,
    /// The last round whose boundary found the view changed: digests go out every
    /// `full_every` rounds until [`DIGESTS_AFTER_CHANGE`] rounds after it.
    view_changed_in: u64,
}

/// Global admission for every global rule of a node. See the module docs.
#[derive(Debug)]
pub struct Global {
    me: Actor,
    params: Params,
    rules: Rules,
    by_name: RwLock<HashMap<String, usize>>,
    /// The key budget the rules' stores draw on, for rules a reload adds.
    keys: Arc<AtomicUsize>,
    max_keys: usize,
    /// [`Phase`] packed: bit 0 open, bit 1 consistent.
    phase: AtomicU64,
    /// Which slots the last instant opened starters in: those whose first instant (the one
    /// that could first allot them) is at or after this round. 0 while every participant
    /// is reachable; the round after `hold_from` while holding for a partition with the
    /// participants of the last all-reachable instant (design §5); `u64::MAX`: none.
    /// Stored before the phase, so a check that reads the phase first never sees it staler.
    starters_from: AtomicU64,
    /// Whether the last instant held for a partition (`RoundState::hold_from` set): no
    /// grant comes in the slots open then, so a check is not held for one.
    holding: AtomicBool,
    /// Starters open in slots nobody has a base in: those whose first instant is before this
    /// round (the earliest era any participant published; `u64::MAX`: nobody has one); and
    /// beside bases (`starters_beside_bases`).
    based_from: AtomicU64,
    /// Whether the last instant was all-reachable with every participant's latest era at the
    /// participants it had: then starters open also in slots others are based in, where this
    /// node is not (see [`Global::starters_in`]).
    starters_beside_bases: AtomicBool,
    /// This node's last two base eras ([`RoundState::my_eras`]), packed by [`pack_era`] for
    /// the check path: the latest and the one before (`u64::MAX`: none).
    era_latest: AtomicU64,
    era_prev: AtomicU64,
    /// Participants (this node included) at the last instant.
    participants: AtomicU64,
    /// Instants processed so far (for callers waiting for the next lease).
    instants: AtomicU64,
    /// Whether this node has joined: pulled the cluster's counts (or found it has no peer).
    /// Until then it is never consistent, so it grants no lease and no starter.
    joined: std::sync::atomic::AtomicBool,
    /// Whether this node has had an instant with every participant's frame in since it
    /// joined. The first frames after a view change list every active key, so from then on
    /// a bucket key this node has not met is one nobody holds a share of; until then a new
    /// bucket key starts empty at the floor share (design §3.5, "Restart and join").
    settled: std::sync::atomic::AtomicBool,
    /// Whether the shell stopped waiting for `settled` to call the node ready (see
    /// [`Global::ready`]).
    ready_unsettled: std::sync::atomic::AtomicBool,
    round: Mutex<RoundState>,
}

impl Global {
    /// Global admission for `rules` (name, limits) as node incarnation `me`. Keys count
    /// against `keys` / `max_keys` like the engine's local keys.
    pub fn new(
        me: Actor,
        params: Params,
        rules: Vec<(String, Vec<Limit>)>,
        keys: Arc<AtomicUsize>,
        max_keys: usize,
    ) -> Result<Global, GlobalError> {
        if params.settle.saturating_mul(2) >= params.round {
            return Err(GlobalError::Settle);
        }
        let grules = rules
            .into_iter()
            .map(|(name, limits)| GRule::new(name, limits, &params, &keys, max_keys))
            .collect::<Result<Vec<_>, _>>()?;
        let by_name = grules
            .iter()
            .enumerate()
            .map(|(i, r)| (r.name.clone(), i))
            .collect();
        Ok(Global {
            round: Mutex::new(RoundState {
                counters: Counters::new(me.clone()),
                peers: BTreeMap::new(),
                boundary: None,
                instant: None,
                my_views: BTreeMap::new(),
                my_opens: BTreeMap::new(),
                my_eras: Vec::new(),
                hold_nodes: Vec::new(),
                stats: Stats {
                    rule_visits: grules.iter().map(|r| (r.name.clone(), 0)).collect(),
                    ..Stats::default()
                },
                view_changed: true,
                consistent_view: None,
                left_since: Vec::new(),
                hold_from: None,
                returns: true,
                participated: Vec::new(),
                excluded: Vec::new(),
                full_requested: false,
                last_full: None,
                floors: HashMap::new(),
                wakes: BTreeMap::new(),
                changes: BTreeMap::new(),
                unallotted: Vec::new(),
                shared_inputs: None,
                visit_all_due: false,
                view_changed_in: 0,
                own_numbers: grules
                    .iter()
                    .map(|r| {
                        r.limits
                            .iter()
                            .map(|l| (l.shape.limit(), l.shape.burst()))
                            .collect()
                    })
                    .collect(),
                member_numbers: BTreeMap::new(),
                numbers_moved: false,
            }),
            me,
            params,
            rules: Rules::new(grules),
            by_name: RwLock::new(by_name),
            keys,
            max_keys,
            phase: AtomicU64::new(0),
            starters_from: AtomicU64::new(u64::MAX),
            holding: AtomicBool::new(false),
            based_from: AtomicU64::new(u64::MAX),
            starters_beside_bases: AtomicBool::new(false),
            era_latest: AtomicU64::new(u64::MAX),
            era_prev: AtomicU64::new(u64::MAX),
            participants: AtomicU64::new(1),
            instants: AtomicU64::new(0),
            joined: std::sync::atomic::AtomicBool::new(true),
            settled: std::sync::atomic::AtomicBool::new(true),
            ready_unsettled: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// This node's actor.
    pub fn me(&self) -> &Actor {
        &self.me
    }

    /// How many instants this node has processed: a caller told to wait for the next lease
    /// can tell when it has come.
    pub fn instants(&self) -> u64 {
        self.instants.load(Ordering::Acquire)
    }

    /// Whether this node's frame of `round` is out: that boundary ran and so did its instant
    /// (the shell sends a boundary's frame before it runs the instant).
    pub fn has_published(&self, round: u64) -> bool {
        let st = self.lock();
        st.instant.min(st.boundary).is_some_and(|r| r >= round)
    }

    /// The first round whose frame surely carries every admission made before this call: the
    /// one after the last boundary that ran.
    pub fn next_publication(&self) -> u64 {
        self.lock().boundary.map_or(0, |b| b + 1)
    }

    /// Whether a check of `key` under global rule `rule`, just denied at `now` by its limit
    /// `limit` with room left in the cluster, waits only for this node's first room of the key
    /// in the current slot: a window in which it holds nothing (no lease, no base: a node
    /// back from a restart, in the window it came back in; a starter an instant did not
    /// open). Then `(wait, instants)`: the instant that brings the room (the next one for a
    /// key in use elsewhere or before the next boundary, which publishes the check's demand;
    /// else the one after), as [`Global::instants`] will count it, and how long until it is
    /// due. `None` where the node holds room of the key there (spent: more follows demand, a
    /// round or more later), for buckets, while holding for a partition (no grant comes in
    /// the slots open then), and before the node has joined.
    pub fn first_lease(
        &self,
        rule: usize,
        limit: usize,
        key: &str,
        now: Nanos,
    ) -> Option<(Nanos, u64)> {
        let phase = self.phase();
        let instants = self.instants();
        // Not joined yet (still pulling the cluster's counts): no instant of it allots room.
        if self.holding.load(Ordering::Acquire) || !self.joined() {
            return None;
        }
        let r = self.rules.get(rule)?;
        let l = r.limits.get(limit)?;
        let s = l.slot(now);
        if self.my_base(l, s) > 0 {
            return None;
        }
        let known = r.store.read(key, |k| match k {
            None => Some(false),
            Some(k) => match k.limits.get(limit)? {
                LState::Window(w) if w.grants.iter().any(|g| g.slot == s && !g.is_empty()) => None,
                LState::Window(_) => Some(k.windows_known),
                LState::Bucket(_) => None,
            },
        })?;
        let t = self.params.round;
        let start = now - now % t;
        let due = if phase.open {
            start + t + self.params.settle
        } else {
            (start + self.params.settle).max(now + MILLISECOND)
        };
        let (due, instants) = if phase.open || known {
            (due, instants + 1)
        } else {
            (due + t, instants + 2)
        };
        Some((due - now, instants))
    }

    /// The protocol parameters.
    pub fn params(&self) -> &Params {
        &self.params
    }

    /// The index of the global rule `name`.
    pub fn rule_index(&self, name: &str) -> Option<usize> {
        self.by_name().get(name).copied()
    }

    fn by_name(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, usize>> {
        self.by_name
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn phase(&self) -> Phase {
        let p = self.phase.load(Ordering::Acquire);
        Phase {
            open: p & 1 != 0,
            consistent: p & 2 != 0,
            kept: p & 4 != 0,
            returns: p & 8 != 0,
            round: p >> 4,
        }
    }

    fn set_phase(&self, p: Phase) {
        self.phase.store(
            u64::from(p.open)
                | (u64::from(p.consistent) << 1)
                | (u64::from(p.kept) << 2)
                | (u64::from(p.returns) << 3)
                | (p.round << 4),
            Ordering::Release,
        );
    }

    /// The instant that can first allot slot `x` of `l` (it pre-leases it): the one of the
    /// round before the slot starts.
    fn first_instant(&self, l: &GLimit, x: u64) -> u64 {
        (x * l.slot_len / self.params.round).saturating_sub(1)
    }

    /// Whether the last instant opened starters in slot `x` of `l` (see
    /// [`Global::starters_from`]): where nobody has a base (a sliding algorithm's slots
    /// never have one, [`GLimit::based`]), or, for a fixed window, at an all-reachable
    /// instant with every participant's bases at the participants it had, where this node
    /// has none (design §3.3.1, starters beside bases). Read after the phase.
    fn starters_in(&self, l: &GLimit, x: u64) -> bool {
        let from = self.starters_from.load(Ordering::Acquire);
        let first = self.first_instant(l, x);
        from != u64::MAX
            && first >= from
            && (self.nobody_based(l, first)
                || (self.starters_beside_bases.load(Ordering::Acquire) && self.my_base(l, x) == 0))
    }

    /// Whether the last instant held for a partition with the participants of the last
    /// all-reachable instant (so its starters open only in the slots allotted since
    /// `hold_from`), and slot `x` of `l` could be allotted before that, with nobody based
    /// there: then a key the record found idle may be admitted up to a starter's size of this
    /// node's own use of the budget (design §5, "Keys idle at the record"). Read after the
    /// phase.
    fn idle_quota_in(&self, l: &GLimit, x: u64) -> bool {
        let from = self.starters_from.load(Ordering::Acquire);
        let first = self.first_instant(l, x);
        from != 0 && from != u64::MAX && first < from && self.nobody_based(l, first)
    }

    /// Whether nobody is based in a slot of `l` whose first instant is `first`: `l` has no
    /// bases, or the slot could be allotted before any participant's first era.
    fn nobody_based(&self, l: &GLimit, first: u64) -> bool {
        !l.based() || first < self.based_from.load(Ordering::Acquire)
    }

    /// Whether nobody was based in slot `x` of `l` as of the instant of round `n`: the slot
    /// could be allotted by then, and no participant's first era reaches it. A fixed
    /// window's starters there are kept across a late frame as a sliding algorithm's are
    /// (design §3.3.1): a new cluster's first windows and a restarted node's first one.
    fn unbased(&self, l: &GLimit, x: u64, n: u64) -> bool {
        let first = self.first_instant(l, x);
        first <= n && first < self.based_from.load(Ordering::Acquire)
    }

    /// The base a participant with `eras` holds in slot `x` of `l` (0 where `l` has none).
    fn base_in_eras(&self, l: &GLimit, eras: &[(u64, u32)], x: u64) -> u64 {
        if l.based() {
            base_of(eras, l.limit().limit(), self.first_instant(l, x))
        } else {
            0
        }
    }

    /// This node's base in slot `x` of the windowed limit `l` (design §3.3.1, bases): what it
    /// holds of every key it has published no holding for, from its last two eras.
    fn my_base(&self, l: &GLimit, x: u64) -> u64 {
        if !l.based() {
            return 0;
        }
        let first = self.first_instant(l, x);
        let c = l.limit().limit();
        // The era the slot falls in, and no more than any later era's (a base shrinks in the
        // open slots when the participants grow: design §3.3.1).
        let mut base = u64::MAX;
        for era in [&self.era_latest, &self.era_prev] {
            let packed = era.load(Ordering::SeqCst);
            if packed == u64::MAX {
                return 0;
            }
            base = base.min(base_units(c, packed & ((1 << ERA_N_BITS) - 1)));
            if packed >> ERA_N_BITS <= first {
                return base;
            }
        }
        0
    }

    /// Replaces this node's eras and publishes them to the check path.
    fn set_eras(&self, st: &mut RoundState, eras: Vec<(u64, u32)>) {
        st.my_eras = eras;
        let len = st.my_eras.len();
        // The older first: a check that reads the latest era after it changed reads the
        // previous one as it now is.
        self.era_prev.store(
            pack_era(len.checked_sub(2).map(|i| st.my_eras[i])),
            Ordering::SeqCst,
        );
        self.era_latest
            .store(pack_era(st.my_eras.last().copied()), Ordering::SeqCst);
    }

    /// From round `from` on, this node's base is a share over `n` participants (a new era,
    /// if that changes it).
    fn push_era(&self, st: &mut RoundState, from: u64, n: u64) {
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        if st.my_eras.last().is_some_and(|&(_, m)| m == n) {
            return;
        }
        let mut eras = std::mem::take(&mut st.my_eras);
        eras.push((from, n));
        if eras.len() > MAX_ERAS {
            eras.remove(0);
        }
        self.set_eras(st, eras);
    }

    fn lock(&self) -> MutexGuard<'_, RoundState> {
        self.round.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Time until the next instant after `now` (what a denied check waits for a new lease).
    fn until_instant(&self, now: Nanos, phase: Phase) -> Nanos {
        let t = self.params.round;
        let start = now - now % t;
        let instant = start + self.params.settle;
        if phase.open && phase.round >= now / t {
            // This round's instant ran early (every frame was in before δ): the next one.
            start + t + self.params.settle - now
        } else if now < instant {
            instant - now
        } else if !phase.open {
            // The instant is late (busy, or waiting for a frame): any moment now, and by half
            // a round unless this node is too busy to run it. A check held for its lease
            // waits that long at most: told a millisecond, it was refused after ~12 ms while
            // the instant that would have admitted it came a few ms later (design §10, "A new
            // key in the gap").
            (start + self.latest_settle())
                .saturating_sub(now)
                .max(MILLISECOND)
        } else {
            start + t + self.params.settle - now
        }
    }

    /// May `key` spend `cost` under global rule `rule` (an index from
    /// [`Global::rule_index`]) at `now`? Charges it if admitted. Same contract as
    /// [`KeyState::check`](crate::limiter::KeyState::check): the index of the most
    /// restrictive limit and its decision.
    pub fn check(
        &self,
        rule: usize,
        key: &str,
        cost: u64,
        max_wait: Nanos,
        now: Nanos,
    ) -> Result<(usize, Decision), Full> {
        let r = &self.rules[rule];
        let n = self.participants.load(Ordering::Relaxed);
        r.store.update_listed(
            key,
            now,
            || GKey::fresh(r, now, n, self.settled()),
            |k| k.is_fresh(r, now, n),
            |k| {
                // Read under the key's shard lock: a boundary or an instant sets the phase
                // before it visits any key, so a check after its visit of this key sees it (a
                // starter taken on a phase read before could outlive what its frame says).
                let phase = self.phase();
                self.carry_early(r, k, now, phase);
                let (index, decision) = self.decide(r, k, cost, max_wait, now, phase, n);
                charge(r, k, &decision, cost, now, n, phase.round, &|l, x| {
                    self.my_base(l, x)
                });
                (index, decision)
            },
        )
    }

    /// Carries the key's room into a sliding slot that starts at this round's boundary, as
    /// that boundary will (design §3.3.1, carry), for a check that comes before the boundary
    /// has visited the key: its timer is late, or it is still visiting other keys (at a
    /// sub-slot's edge every key in use in a log moves to the new slot, tens of ms of work
    /// on a busy node). Without it the check found no room in the new slot, and a key in use
    /// was held for the instant. The condition is the boundary's own (`pre_leased`): the
    /// last instant was the previous round's, consistent, with every participant reachable,
    /// so it took this node's holding of the slot that closed as spent in the new one. The
    /// holding moved, the boundary finds nothing left to carry.
    fn carry_early(&self, r: &GRule, k: &mut GKey, now: Nanos, phase: Phase) {
        let t = self.params.round;
        let n = now / t;
        if !phase.pre_leased(n) {
            return;
        }
        for (l, s) in r.limits.iter().zip(k.limits.iter_mut()) {
            let LState::Window(w) = s else { continue };
            let cur = l.slot(now);
            let before = |g: &Grant| g.slot + 1 == cur && !g.starter;
            if l.carries(cur, n * t) && w.grants.iter().any(before) {
                carry(w, cur);
                w.grants.retain(|g| !before(g));
            }
        }
    }

    /// Where `key` stands under global rule `rule` at `now`: what a check of cost 1 would
    /// get, charging nothing.
    pub fn status(&self, rule: usize, key: &str, now: Nanos) -> (usize, Decision) {
        let r = &self.rules[rule];
        let phase = self.phase();
        let n = self.participants.load(Ordering::Relaxed);
        r.store.read(key, |k| {
            let fresh;
            let k = match k {
                Some(k) => k,
                None => {
                    fresh = GKey::fresh(r, now, n, self.settled());
                    &fresh
                }
            };
            let (i, mut d) = self.decide(r, k, 1, 0, now, phase, n);
            let (_, current) = self.decide(r, k, 0, 0, now, phase, n);
            if let Verdict::Admit { .. } = d.verdict {
                d.verdict = Verdict::Admit { wait: 0 };
            }
            d.remaining = current.remaining;
            (i, d)
        })
    }

    /// What a check of one key would get, charging nothing: admitted only if every limit
    /// admits; reports the most restrictive limit, as
    /// [`KeyState::check`](crate::limiter::KeyState::check) does.
    #[allow(clippy::too_many_arguments)]
    fn decide(
        &self,
        rule: &GRule,
        key: &GKey,
        cost: u64,
        max_wait: Nanos,
        now: Nanos,
        phase: Phase,
        participants: u64,
    ) -> (usize, Decision) {
        let mut index = 0;
        let mut worst: Option<Decision> = None;
        let mut wait = 0;
        // A rule not yet recorded opens no starter (design §3.8): the last instant found its
        // keys idle knowing nothing of them.
        let known = key.windows_known || !rule.recorded.load(Ordering::Acquire);
        for (i, (l, s)) in rule.limits.iter().zip(key.limits.iter()).enumerate() {
            let d = match s {
                LState::Window(w) => self.decide_window(
                    l,
                    w,
                    (known, key.idle_at_record),
                    cost,
                    now,
                    phase,
                    participants,
                ),
                LState::Bucket(b) => {
                    decide_bucket(l, b, cost, max_wait, default_share(participants), now)
                }
            };
            wait = wait.max(admit_wait(&d));
            if worst.is_none_or(|w| more_restrictive(&d, &w)) {
                index = i;
                worst = Some(d);
            }
        }
        let Some(mut decision) = worst else {
            unreachable!("a rule always has at least one limit")
        };
        if let Verdict::Admit { .. } = decision.verdict {
            decision.verdict = Verdict::Admit { wait };
        }
        (index, decision)
    }

    #[allow(clippy::too_many_arguments)]
    fn decide_window(
        &self,
        l: &GLimit,
        w: &WState,
        (known, idle_at_record): (bool, bool),
        cost: u64,
        now: Nanos,
        phase: Phase,
        participants: u64,
    ) -> Decision {
        let c = l.limit().limit();
        let s = l.slot(now);
        let used = l.budget(s, now, |x| w.own_in(x).saturating_add(w.others_in(x)));
        let remaining = c.saturating_sub(used);
        let slot_end = (s + 1) * l.slot_len;
        let reset_after = slot_end - now + (l.span() - 1) * l.slot_len;
        let mut decision = Decision {
            verdict: Verdict::Admit { wait: 0 },
            limit: c,
            remaining: remaining.saturating_sub(cost),
            reset_after,
        };
        if cost > c {
            decision.verdict = Verdict::Never;
            decision.remaining = remaining;
            return decision;
        }
        let base = self.my_base(l, s);
        let spendable = match w.grants.iter().find(|g| g.slot == s) {
            // Room held as published (granted, or given back down to this), or a starter.
            Some(g) if base > 0 || !g.is_empty() => {
                let held = g.spendable();
                if cost <= held {
                    held
                } else {
                    held.saturating_add(self.fade_share(l, w, g, now, phase))
                }
            }
            // The base: what this node holds of every key it published no holding for.
            None if base > 0 => base.saturating_sub(l.budget(s, now, |x| w.own_in(x))),
            _ if !self.starters_in(l, s) => 0,
            // A starter running on from the slot before (this check came at the slot's edge,
            // before the boundary that carries it), or a new one.
            _ => match carried_starter(l, w, s, now) {
                Some(g) => g.spendable(),
                None if used == 0
                    && starter_allowed(l, known, phase, self.unbased(l, s, phase.round)) =>
                {
                    starter(l, participants)
                }
                None => 0,
            },
        };
        // Holding for a partition, in a slot allotted before the side began to hold: a key
        // the last all-reachable instant found idle takes up to a starter's size of this
        // node's own use (design §5, "Keys idle at the record").
        let spendable = if cost > spendable && idle_at_record && self.idle_quota_in(l, s) {
            let own = l.budget(s, now, |x| w.own_in(x));
            spendable.max(starter(l, participants).saturating_sub(own))
        } else {
            spendable
        };
        if cost <= spendable.min(remaining) {
            return decision;
        }
        let retry_after = if remaining < cost {
            (slot_end - now).max(self.until_instant(now, phase))
        } else {
            tracing::debug!(
                slot = s,
                grants = ?w.grants,
                base,
                starters = self.starters_in(l, s),
                used,
                own = l.budget(s, now, |x| w.own_in(x)),
                known,
                phase = ?phase,
                "a window check has room in the cluster but none at this node",
            );
            self.until_instant(now, phase)
        };
        decision.verdict = Verdict::Deny { retry_after };
        decision.remaining = remaining;
        decision
    }

    /// When the allotments of `now`'s round read a sliding counter's budget: at the round's
    /// boundary, whenever their instant runs, so that every node reads the same, and the room
    /// the previous window's fade frees from then on is nobody's but the fade shares'
    /// ([`Global::fade_share`]).
    fn counter_read(&self, now: Nanos) -> Nanos {
        now - now % self.params.round
    }

    /// A sliding counter's fade share at `now` under lease `g` (design §3.4, "fade
    /// share"): its fade seats' part of what the previous slot's weight has faded by since
    /// the round's boundary ([`Global::counter_read`]), less what it already admitted on it.
    /// Only in the round of an instant consistent with every participant reachable, from that
    /// instant to the next boundary: every node that may take a share then read its budget at
    /// the boundary, so nobody was granted that room, and dealt the seats from the same
    /// inputs (a key left unvisited has the inputs of the allotment that dealt its seats), so
    /// each seat has one holder.
    fn fade_share(&self, l: &GLimit, w: &WState, g: &Grant, now: Nanos, phase: Phase) -> u64 {
        let s = l.slot(now);
        if l.kind != Kind::Counter
            || s == 0
            || g.starter
            || g.slot != s
            || !(phase.open && phase.consistent && phase.returns)
            || phase.round != now / self.params.round
        {
            return 0;
        }
        let prev = w.own_in(s - 1).saturating_add(w.others_in(s - 1));
        let faded = l.faded(s, self.counter_read(now), now, prev);
        let taken = if g.opened == phase.round {
            u64::from(g.on_fade)
        } else {
            0
        };
        // What `on_fade` can count, at most.
        let most = u64::from(u32::MAX);
        fade_part(faded, g.fade_seats)
            .min(most)
            .saturating_sub(taken)
    }

    /// Brings membership up to date: every member but this node, with its current actor.
    /// A peer that is new (or back with a new incarnation) gets a digest at once, so it
    /// repairs this node's view and this node learns its counts.
    ///
    /// A peer back with a new generation retires its old actor ([`Global::retire`]), so
    /// `now` is needed.
    pub fn set_members(&self, members: &[MemberInfo], now: Nanos) -> Vec<Output> {
        let mut st = self.lock();
        let mut out = Vec::new();
        let listed: HashSet<&str> = members.iter().map(|m| m.actor.node.as_str()).collect();
        let before = st.peers.len();
        st.peers.retain(|node, _| listed.contains(node.as_str()));
        let mut changed = st.peers.len() != before;
        for m in members {
            if m.actor.node == self.me.node {
                continue;
            }
            if m.left {
                // Gone on purpose: stop holding its share, and charge its retirement unless
                // its final frame is in (then its counts are final). A later generation
                // joins as new.
                if st
                    .peers
                    .get(&m.actor.node)
                    .is_some_and(|p| p.actor.generation <= m.actor.generation)
                {
                    // Its final frame may still wait for this round's instant: apply what
                    // this round may already read.
                    if let Some(b) = st.boundary {
                        self.apply_buffered(&mut st, &m.actor.node, b, now);
                    }
                    let Some(old) = st.peers.remove(&m.actor.node) else {
                        continue;
                    };
                    let complete = old.actor == m.actor
                        && m.published_through
                            .is_some_and(|r| old.applied.is_some_and(|a| a >= r));
                    if complete {
                        st.stats.final_leaves += 1;
                        st.left_since.push(old.actor.clone());
                    } else {
                        self.retire(&mut st, &old, now);
                    }
                    changed = true;
                }
                continue;
            }
            match st.peers.get_mut(&m.actor.node) {
                Some(p) if p.actor.generation > m.actor.generation => {}
                Some(p) if p.actor == m.actor => {
                    if p.alive != m.alive {
                        p.alive = m.alive;
                        changed = true;
                    }
                }
                _ => {
                    let replaced = st.peers.insert(
                        m.actor.node.clone(),
                        Peer::new(m.actor.clone(), m.alive, self.rules.len()),
                    );
                    if let Some(old) = replaced {
                        self.retire(&mut st, &old, now);
                    }
                    changed = true;
                    let digest = st.counters.digest();
                    out.push(Output::To(
                        m.actor.node.clone(),
                        Message::Digest {
                            from: self.me.clone(),
                            digest,
                        },
                    ));
                }
            }
        }
        if changed {
            st.view_changed = true;
        }
        // A member's numbers count while it takes part in the allotment, alive or not: under
        // `hold` one this node cannot hear may still admit on its own numbers, and its share
        // is held until membership forgets it, so its numbers are too.
        st.member_numbers = members
            .iter()
            .filter(|m| !m.left)
            .filter(|m| {
                st.peers
                    .get(&m.actor.node)
                    .is_some_and(|p| p.actor == m.actor && self.participates(p))
            })
            .filter_map(|m| Some((m.actor.node.clone(), m.numbers.clone()?)))
            .collect();
        self.put_numbers_in_force(&mut st);
        out
    }

    /// This node's configuration changed the numbers of rule `rule`'s limits (a reload; a
    /// tenant's quota raised or cut). Their algorithms and periods must stay as the node
    /// started with them; a leaky bucket's numbers cannot change (its level is scaled by
    /// its rate). The numbers in force are the smaller of this node's and every
    /// member's (those that publish theirs), so a cut holds from when the first node has it,
    /// and a raise from when the last has it (design §3.8). Returns
    /// whether the numbers in force changed here.
    pub fn relimit(&self, rule: usize, limits: &[Limit]) -> Result<bool, GlobalError> {
        let r = self.rules.get(rule).ok_or(GlobalError::Relimit)?;
        if !r.fits(limits) {
            return Err(GlobalError::Relimit);
        }
        let mut st = self.lock();
        st.own_numbers[rule] = limits.iter().map(|l| (l.limit(), l.burst())).collect();
        Ok(self.put_numbers_in_force(&mut st))
    }

    /// Whether [`Global::add_rule`] would take rule `name` of `limits`: a name this node
    /// has never served, or one it served (or serves) with the same algorithms and periods.
    pub fn can_add_rule(&self, name: &str, limits: &[Limit]) -> Result<(), GlobalError> {
        match self.rule_index(name) {
            Some(i) if !self.rules[i].fits(limits) => Err(GlobalError::Relimit),
            Some(_) => Ok(()),
            None if self.rules.len() >= MAX_GLOBAL_RULES => Err(GlobalError::TooManyRules),
            None => GRule::limits(name, limits.to_vec(), &self.params).map(|_| ()),
        }
    }

    /// This node's configuration now has global rule `name` of `limits` (a reload added it):
    /// its index. A rule this node never served starts with no keys; since its peers' frames
    /// said nothing of it that this node kept, it asks each for a full frame, and its
    /// instants are not consistent until they are in (design §3.8, "Adding and removing a
    /// global rule"). A rule it served before, with the same algorithms and periods, is
    /// served again with its keys and counts, relimited to `limits`.
    pub fn add_rule(&self, name: &str, limits: &[Limit]) -> Result<usize, GlobalError> {
        self.can_add_rule(name, limits)?;
        if let Some(i) = self.rule_index(name) {
            self.rules[i].served.store(true, Ordering::Release);
            self.relimit(i, limits)?;
            return Ok(i);
        }
        let rule = GRule::new(
            name.to_owned(),
            limits.to_vec(),
            &self.params,
            &self.keys,
            self.max_keys,
        )?;
        let mut st = self.lock();
        // Appends happen under the round lock; another reload may have added it meanwhile.
        if let Some(i) = self.rule_index(name) {
            return Ok(i);
        }
        rule.recorded.store(st.peers.is_empty(), Ordering::Release);
        let i = self.rules.push(rule)?;
        self.by_name
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(name.to_owned(), i);
        st.own_numbers
            .push(limits.iter().map(|l| (l.limit(), l.burst())).collect());
        st.stats.rule_visits.push((name.to_owned(), 0));
        for p in st.peers.values_mut() {
            p.reports.resize_with(i + 1, HashMap::default);
            p.returned.resize_with(i + 1, HashMap::default);
            // What its frames said of the rule was dropped: ask for all of it again.
            p.complete_to = None;
        }
        st.visit_all_due = true;
        self.put_numbers_in_force(&mut st);
        Ok(i)
    }

    /// This node's configuration no longer has global rule `rule` (a reload removed it):
    /// it checks none of its keys from now on, and publishes no numbers for it. Its keys
    /// drain as they would if no one checked them here: the frames keep reporting their
    /// counts in the open slots and the room given back, and they are forgotten once idle.
    pub fn remove_rule(&self, rule: usize) {
        if let Some(r) = self.rules.get(rule) {
            r.served.store(false, Ordering::Release);
        }
    }

    /// Whether this node's configuration has global rule `rule`.
    pub fn serves(&self, rule: usize) -> bool {
        self.rules
            .get(rule)
            .is_some_and(|r| r.served.load(Ordering::Acquire))
    }

    /// Sets each limit's numbers in force from this node's own and the members'
    /// (`RoundState::member_numbers`), and raises the ceilings to every number seen. A
    /// member's numbers for a rule count only if they fit it: as many limits, each a valid
    /// limit of its algorithm and period. Returns whether any number in force changed.
    fn put_numbers_in_force(&self, st: &mut RoundState) -> bool {
        let mut moved = false;
        for (ri, r) in self.rules.iter().enumerate() {
            for (li, l) in r.limits.iter().enumerate() {
                let mut force = st.own_numbers[ri][li];
                let mut top = force;
                for numbers in st.member_numbers.values() {
                    let Some(theirs) = numbers.get(&r.name).filter(|v| v.len() == r.limits.len())
                    else {
                        continue;
                    };
                    let (limit, burst) = theirs[li];
                    let burst = l.shape.algorithm().has_burst().then_some(burst);
                    if Limit::new(l.shape.algorithm(), limit, l.shape.period(), burst).is_err() {
                        continue;
                    }
                    let burst = burst.unwrap_or(limit);
                    force = (force.0.min(limit), force.1.min(burst));
                    top = (top.0.max(limit), top.1.max(burst));
                }
                let was = (
                    l.numbers[0].swap(force.0, Ordering::Relaxed),
                    l.numbers[1].swap(force.1, Ordering::Relaxed),
                );
                l.ceiling[0].fetch_max(top.0, Ordering::Relaxed);
                l.ceiling[1].fetch_max(top.1, Ordering::Relaxed);
                if was != force {
                    moved = true;
                    tracing::info!(
                        rule = %l.label,
                        limit = force.0,
                        burst = force.1,
                        was_limit = was.0,
                        was_burst = was.1,
                        "a global limit's numbers in force changed"
                    );
                }
            }
        }
        if moved {
            st.numbers_moved = true;
            st.stats.numbers_changes += 1;
        }
        moved
    }

    /// This node's own numbers of its global rules, as it publishes them
    /// ([`MemberInfo::numbers`]).
    pub fn own_numbers(&self) -> RuleNumbers {
        self.own_numbers_in(&self.lock())
    }

    /// [`Global::own_numbers`] under the round lock.
    fn own_numbers_in(&self, st: &RoundState) -> RuleNumbers {
        self.rules
            .iter()
            .zip(&st.own_numbers)
            .filter(|(r, _)| r.served.load(Ordering::Acquire))
            .map(|(r, n)| (r.name.clone(), n.clone()))
            .collect()
    }

    /// The numbers in force of every global rule: the smaller of this node's own and those of
    /// every member in the allotment.
    pub fn numbers_in_force(&self) -> RuleNumbers {
        self.rules
            .iter()
            .filter(|r| r.served.load(Ordering::Acquire))
            .map(|r| {
                let n = r.limits.iter().map(|l| {
                    let l = l.limit();
                    (l.limit(), l.burst())
                });
                (r.name.clone(), n.collect())
            })
            .collect()
    }

    /// The members in the allotment (under `hold`, dead ones too) whose published numbers
    /// differ from this node's own, and how many live ones publish none (nodes of an earlier
    /// version).
    pub fn members_on_other_numbers(&self) -> (Vec<String>, usize) {
        let st = self.lock();
        let own = self.own_numbers_in(&st);
        let differ = st
            .member_numbers
            .iter()
            .filter(|(_, n)| ***n != own)
            .map(|(node, _)| node.clone())
            .collect();
        let silent = st
            .peers
            .values()
            .filter(|p| p.alive && !st.member_numbers.contains_key(&p.actor.node))
            .count();
        (differ, silent)
    }

    /// Marks whether this node has joined the cluster (see [`Global::joined`]). A node starts
    /// joined (a cluster of one); the shell unmarks it at start when it expects peers, and marks
    /// it once the pull is done. Until then no lease or starter is granted.
    /// Unmarking also unsettles it: its next new bucket keys start empty until an instant with
    /// every participant's frame in.
    pub fn set_joined(&self, joined: bool) {
        self.joined.store(joined, Ordering::Release);
        if !joined {
            self.settled.store(false, Ordering::Release);
            self.ready_unsettled.store(false, Ordering::Release);
        }
    }

    /// Whether the node may be sent checks (`/readyz` 200): it has joined, and has settled
    /// (its first instant with every participant's frame in has run, so a bucket key new at
    /// it starts full at its even share, not empty: design §3.5, "Restart and join"), or the
    /// shell stopped waiting for that ([`Global::ready_unsettled`]: peers out of reach).
    pub fn ready(&self) -> bool {
        self.joined()
            && (self.settled.load(Ordering::Acquire)
                || self.ready_unsettled.load(Ordering::Acquire))
    }

    /// Calls the node ready although it has not settled (see [`Global::ready`]).
    pub fn ready_unsettled(&self) {
        self.ready_unsettled.store(true, Ordering::Release);
    }

    /// Whether a new bucket key may start full at the default share (see `Global::settled`).
    fn settled(&self) -> bool {
        self.settled.load(Ordering::Acquire)
    }

    /// Whether this node takes leases (see [`Global::set_joined`]).
    pub fn joined(&self) -> bool {
        self.joined.load(Ordering::Acquire)
    }

    /// Whether this node has pulled the cluster's state: a repair from every live peer is in,
    /// and there is at least one.
    pub fn pulled(&self) -> bool {
        let st = self.lock();
        let mut alive = st.peers.values().filter(|p| p.alive).peekable();
        // At least one live peer (no vacuous truth while membership has not seen one alive yet).
        alive.peek().is_some() && alive.all(|p| p.pulled)
    }

    /// Peers known from membership.
    pub fn peer_count(&self) -> usize {
        self.lock().peers.len()
    }

    /// Handles one message from the authenticated peer `peer`.
    pub fn receive(&self, peer: &str, message: Message, now: Nanos) -> Result<Vec<Output>, Reject> {
        let mut st = self.lock();
        let current = now / self.params.round;
        let from = match &message {
            Message::Round(f) => &f.from,
            Message::Digest { from, .. } | Message::Repair { from, .. } => from,
            Message::Hello { .. }
            | Message::TreeUp(_)
            | Message::TreeDown(_)
            | Message::TreeHandoff(_)
            | Message::TreeCarried { .. } => {
                return Err(Reject::Unexpected);
            }
        };
        if from.node != peer || from.node == self.me.node {
            return Err(Reject::Impostor);
        }
        let Some(p) = st.peers.get_mut(peer) else {
            return Err(Reject::NotMember);
        };
        if from.generation < p.actor.generation {
            return Err(Reject::StaleGeneration);
        }
        if from.generation > p.actor.generation {
            // Restarted before membership told us: it is a new actor.
            let old = std::mem::replace(p, Peer::new(from.clone(), true, self.rules.len()));
            st.view_changed = true;
            self.retire(&mut st, &old, now);
        }
        match message {
            Message::Round(frame) => {
                // A late frame is still applied (if nothing newer was) while the repeats of
                // the frames after it reach back to it: it fills its receiver's gap, which
                // would otherwise take a full frame. Frames queue behind a long tick here, so
                // one that came on time can be handled rounds later.
                if frame.round + MAX_REPEAT < current || frame.round > current + 2 {
                    // Too late to apply, but the peer is there: only silence is suspected.
                    if frame.round < current
                        && let Some(p) = st.peers.get_mut(peer)
                    {
                        p.heard = true;
                    }
                    return Err(Reject::RoundOutOfRange);
                }
                if frame.parts == 0 || frame.parts > MAX_PARTS || frame.part >= frame.parts {
                    return Err(Reject::BadParts);
                }
                let Some(p) = st.peers.get_mut(peer) else {
                    return Err(Reject::NotMember);
                };
                if frame.part == 0 && frame.round + 2 >= current {
                    let boundary = frame.round.saturating_mul(self.params.round);
                    let lead = i128::from(now) - i128::from(boundary);
                    p.leads.push_back(i64::try_from(lead).unwrap_or(i64::MAX));
                    if p.leads.len() > OFFSET_SAMPLES {
                        p.leads.pop_front();
                    }
                }
                p.heard = true;
                p.frames.insert((frame.round, frame.part), frame);
                // Keep only rounds that can still be applied.
                let oldest = current.saturating_sub(MAX_REPEAT);
                p.frames.retain(|(round, _), _| *round >= oldest);
                Ok(Vec::new())
            }
            Message::Digest { digest, .. } => {
                // In parts that decode within the frame limit (a pull of 10,000 keys did not).
                let entries = st.counters.repair_for(&digest);
                Ok(split_by(entries, PART_BYTES, delta_bytes)
                    .into_iter()
                    .map(|entries| {
                        Output::To(
                            peer.to_owned(),
                            Message::Repair {
                                from: self.me.clone(),
                                entries,
                            },
                        )
                    })
                    .collect())
            }
            Message::Repair { entries, .. } => {
                let entries = entries
                    .into_iter()
                    .filter(|(slot, _)| self.slot_in_range(slot, now))
                    .collect::<Vec<_>>();
                let before = st.counters.refused();
                st.counters.apply_all(entries.iter().cloned());
                st.stats.own_dots_refused += st.counters.refused() - before;
                // Every key the repair counts is tracked from now on, with the counts it now
                // knows (for `remaining` at once), and allotted at the next instant.
                let members = self.participants.load(Ordering::Relaxed);
                let settled = self.settled();
                for (slot, _) in &entries {
                    let Some(rule) = self
                        .rules
                        .iter()
                        .find(|r| r.limits.iter().any(|l| l.label == slot.rule))
                    else {
                        continue;
                    };
                    let counters = &st.counters;
                    let tracked = rule.store.update_listed(
                        &slot.key,
                        now,
                        || GKey::fresh(rule, now, members, settled),
                        |_| false,
                        |k| {
                            k.inputs_changed = true;
                            for (l, s) in rule.limits.iter().zip(k.limits.iter_mut()) {
                                if let LState::Window(w) = s {
                                    let slots = SlotReader::new(counters, &l.label, &slot.key);
                                    copy_others(&slots, l, w, now);
                                }
                            }
                        },
                    );
                    if tracked.is_err() {
                        st.stats.store_full += 1;
                    }
                }
                if let Some(p) = st.peers.get_mut(peer) {
                    p.pulled = true;
                }
                Ok(Vec::new())
            }
            Message::Hello { .. }
            | Message::TreeUp(_)
            | Message::TreeDown(_)
            | Message::TreeHandoff(_)
            | Message::TreeCarried { .. } => Err(Reject::Unexpected),
        }
    }

    /// Whether a slot is one a decision can read now or next (not the future, not forgotten).
    fn slot_in_range(&self, slot: &SlotId, now: Nanos) -> bool {
        self.rules.iter().any(|r| {
            r.limits
                .iter()
                .any(|l| l.label == slot.rule && l.readable(slot.slot, now))
        })
    }

    /// When [`Global::tick`] next has work: the next boundary or instant after `now`.
    pub fn next_tick(&self, now: Nanos) -> Nanos {
        let t = self.params.round;
        let start = now - now % t;
        let st = self.lock();
        let n = start / t;
        if st.boundary != Some(n) {
            return now;
        }
        if st.instant != Some(n) {
            // The instant runs as soon as every frame of the round is in; without them, at
            // half a round. The node's round task is woken by each frame that arrives; until
            // then it looks at δ and every millisecond after.
            let due = start + self.params.settle;
            if self.frames_in(&st, n, now < due) {
                return now;
            }
            return if now < due {
                due
            } else {
                (now + MILLISECOND).min(start + self.latest_settle())
            };
        }
        start + t
    }

    /// How long after its boundary an instant waits at most for missing frames: half a round
    /// (at least δ).
    fn latest_settle(&self) -> Nanos {
        (self.params.round / 2).max(self.params.settle)
    }

    /// Whether the instant of round `n` has what it needs: this node's boundary ran and the
    /// round-n frame of every participating peer not suspected is in (applied, or every part
    /// buffered). With `every`, that of every peer this node knows, suspected, dead or not
    /// participating included: an instant that runs before δ must not run before any frame
    /// that could still come (only a frame present at an instant lifts a suspicion, and a
    /// peer a side of a split stopped counting may be about to come back; the simulation found
    /// buckets admitting past their bound under `split` when the early instant skipped it).
    fn frames_in(&self, st: &RoundState, n: u64, every: bool) -> bool {
        st.boundary == Some(n)
            && st
                .peers
                .values()
                .filter(|p| every || (self.participates(p) && !p.suspected))
                .all(|p| {
                    if p.applied.is_some_and(|a| a >= n) {
                        return true;
                    }
                    let mut parts = p.frames.range((n, 0)..(n + 1, 0));
                    parts
                        .next()
                        .is_some_and(|(_, f)| f.parts as usize == 1 + parts.count())
                })
    }

    /// Runs whatever boundary or instant is due at `now`, returning what to send.
    ///
    /// Both visit only the *listed* keys — those a check, a peer's report, a repair or a
    /// retirement touched, or whose slot's edge came, since an instant last found them
    /// dormant ([`dormant_until`]) — except a full boundary and an instant whose view,
    /// suspicions or side changed, which visit every key (design §2.2, "Round cost").
    pub fn tick(&self, now: Nanos) -> Vec<Output> {
        let t = self.params.round;
        let n = now / t;
        let mut out = Vec::new();
        let mut st = self.lock();
        if st.boundary.is_none_or(|b| b < n) {
            out.extend(self.boundary(&mut st, n, now));
        }
        // The instant runs once the round-n frame of every peer this node knows is in (before
        // δ), of every unsuspected participant (from δ), or at half a round without them: the
        // grants come from the round-n frames whenever they are computed, so running early
        // changes no grant, and waiting for a late frame spares a degraded round. Early, it
        // shortens the gap in which a key another node just began using waits for its room
        // to a millisecond or two on a LAN (design §3.3.4).
        if st.instant.is_none_or(|i| i < n)
            && (now >= n * t + self.latest_settle()
                || self.frames_in(&st, n, now < n * t + self.params.settle))
        {
            self.instant(&mut st, n, now);
        }
        out
    }

    /// Applies `node`'s buffered frames up to round `n`, in round order; a round with a part
    /// missing stays buffered (until a newer round is applied, or it leaves the range).
    fn apply_buffered(&self, st: &mut RoundState, node: &str, n: u64, now: Nanos) {
        let frames = match st.peers.get_mut(node) {
            Some(p) => {
                let later = p.frames.split_off(&(n + 1, 0));
                std::mem::replace(&mut p.frames, later)
            }
            None => return,
        };
        let mut rounds: BTreeMap<u64, Vec<RoundFrame>> = BTreeMap::new();
        for ((round, _), frame) in frames {
            rounds.entry(round).or_default().push(frame);
        }
        for (round, parts) in rounds {
            let complete = parts.iter().all(|f| f.parts as usize == parts.len());
            if complete {
                self.apply_round(st, node, parts, now);
            } else if let Some(p) = st.peers.get_mut(node) {
                // Its other parts may still come (a large frame's parts straddled this
                // instant): kept, it is applied at a later instant if nothing newer was.
                for f in parts {
                    p.frames.insert((round, f.part), f);
                }
            }
        }
    }

    /// This node's view hash: every participant (this node included) in node order, with
    /// whether it is suspected. Nodes with the same view compute the same allocation.
    fn view(&self, st: &RoundState) -> u64 {
        self.view_with(st, &[])
    }

    /// The view this node would have with `left` still taking part, unsuspected: with them,
    /// the view of the last consistent instant if they are all that changed since.
    fn view_with(&self, st: &RoundState, left: &[Actor]) -> u64 {
        let mut all: Vec<(&str, u64, bool)> = st
            .peers
            .iter()
            .filter(|(_, p)| self.participates(p))
            .map(|(node, p)| (node.as_str(), p.actor.generation, p.suspected))
            .chain(left.iter().map(|a| (a.node.as_str(), a.generation, false)))
            .collect();
        all.push((&self.me.node, self.me.generation, false));
        all.sort_unstable();
        let mut h = StableHasher::new();
        for (node, generation, suspected) in all {
            h.str(node);
            h.u64(generation);
            h.u64(u64::from(suspected));
        }
        h.finish()
    }

    /// Whether a peer is part of the allocation (reachable, or held per the partition mode).
    fn participates(&self, p: &Peer) -> bool {
        !p.suspected || self.params.on_partition == OnPartition::Hold || p.alive
    }

    /// The boundary of round `n`: snapshot own counts, publish the frame, open the gap.
    fn boundary(&self, st: &mut RoundState, n: u64, now: Nanos) -> Vec<Output> {
        let phase = self.phase();
        // Starters kept across a late frame end here (this frame says this node holds none);
        // a check that reads the phase after this (under its shard's lock, after the visit
        // below) opens none.
        self.set_phase(Phase {
            open: false,
            kept: false,
            ..phase
        });
        // No full frame goes out on a timer: a receiver that lacks this node's state asks
        // for one. A periodic one, sent by every node at the same boundary, made that round's
        // frames late at every node, and so its instant degraded (design §10).
        let full = st.view_changed || st.full_requested;
        let causes = &mut st.stats.full_frames;
        if st.view_changed {
            causes.view_changed += 1;
        } else if st.full_requested {
            causes.asked += 1;
        }
        if st.view_changed {
            st.view_changed_in = n;
        }
        st.view_changed = false;
        st.full_requested = false;
        if full {
            st.last_full = Some(n);
        }
        let want_full: Vec<String> = st
            .peers
            .iter()
            .filter(|(_, p)| !p.suspected && p.applied.is_some() && p.complete_to != p.applied)
            .map(|(node, _)| node.clone())
            .collect();
        let boundary_time = n * self.params.round;
        // A change goes out in the frame of its round and is repeated while some peer may
        // lack it: until every peer this node waits for has said it holds this node's state
        // through a later round (`acks`), for at most `MAX_REPEAT - 1` rounds. A suspected
        // peer is still waited for while its last ack is within reach of the repeats: one
        // back from a stall fills its gap from them.
        let repeat = if self.params.acks { MAX_REPEAT } else { REPEAT };
        let acked = st
            .peers
            .values()
            .filter(|p| self.participates(p) && (!p.suspected || p.acked + repeat > n))
            .map(|p| if self.params.acks { p.acked } else { 0 })
            .min()
            .unwrap_or(n);
        let fresh_from = (n + 1).saturating_sub(repeat).max(acked + 1).min(n);
        let default = default_share(self.participants.load(Ordering::Relaxed));
        // A node with a base moves to a new era when its participants change: the slots
        // first allotted from this round on are split over the new count (design §3.3.1).
        if !st.my_eras.is_empty() {
            let participants = 1 + st.peers.values().filter(|p| self.participates(p)).count();
            self.push_era(st, n, participants as u64);
        }
        // Dormant keys whose slots move now are listed again.
        let due = {
            let later = st.wakes.split_off(&(n + 1));
            std::mem::replace(&mut st.wakes, later)
        };
        let due: BTreeSet<usize> = due.into_values().flatten().collect();
        for ri in due {
            self.rules[ri].store.list_where(|k| {
                let woken = k.wake != 0 && k.wake <= n;
                if woken {
                    k.wake = 0;
                }
                woken
            });
        }
        // Changes older than a dormant key's last visit that this frame still repeats.
        // (Kept for every round a frame may repeat: `fresh_from` moves back when a peer's
        // acks do.)
        st.changes = st.changes.split_off(&(n + 1).saturating_sub(repeat));
        let older = fresh_from..(n + 1).saturating_sub(REPEAT).max(fresh_from);
        for (ri, key) in st.changes.range(older).flat_map(|(_, v)| v) {
            self.rules[*ri].store.list(key);
        }
        let mut changes = Vec::new();
        // A slot that starts now was pre-leased by this node's last instant if that was the
        // previous round's, consistent with every participant reachable: then what it holds
        // of the slot that closes was counted there as spent in the new one (see `carry`).
        let pre_leased = phase.pre_leased(n);
        // A full boundary visits (and lists) every key. Any other visits the listed keys and
        // sweeps one shard of the rest (a shard a round, every key in `SHARDS` rounds) for
        // keys to forget: a listed visit alone would never see a dormant one.
        let all = full || self.params.visit_all;
        let mut keys = Vec::new();
        let mut visits = 0;
        let mut swept_only = 0;
        for (ri, r) in self.rules.iter().enumerate() {
            // Whether a peer's last report on the key says it is in use there: forgetting the
            // key here would have its next check take it for a new one.
            let reported = |key: &str| st.peers.values().any(|p| p.reports[ri].contains_key(key));
            let swept_before = swept_only;
            let mut visit = |key: &str, k: &mut GKey, seen: Seen| -> Visit {
                // A full boundary and the swept shard forget the keys `keep` lets go.
                let forget =
                    |k: &GKey| (full || seen.swept) && !self.keep(r, k, n, now, reported(key));
                // Swept, not listed: dormant, so nothing to publish (and no visit counted).
                if !seen.listed && !all {
                    swept_only += 1;
                    return if forget(k) { Visit::Drop } else { Visit::Keep };
                }
                // A quiet key publishes nothing new; a full frame names it all the same, and
                // leaves it listed or not as it was (its report changes nothing at the peers,
                // and nothing here lists it for the instant).
                let quiet = quiet_boundary(r, k, n, boundary_time) && k.changed_in < fresh_from;
                if quiet && !full {
                    return if forget(k) { Visit::Drop } else { Visit::List };
                }
                let changed_in = k.changed_in;
                k.demand = smooth(k.demand, k.arrivals);
                k.arrivals = 0;
                let mut helds: SmallVec<[Pairs; 1]> = SmallVec::with_capacity(r.limits.len());
                let mut gives_back = false;
                for (l, s) in r.limits.iter().zip(k.limits.iter_mut()) {
                    let w = match s {
                        LState::Window(w) => w,
                        LState::Bucket(b) => {
                            // What the last instant decided to give up and give back goes
                            // now, as this frame publishes it.
                            b.settle(&l.limit(), now);
                            b.published = (n, std::mem::take(&mut b.returned));
                            gives_back |= b.published.1 > 0;
                            helds.push(b.held_report(default));
                            continue;
                        }
                    };
                    let cur = l.slot(boundary_time);
                    if pre_leased && l.carries(cur, boundary_time) {
                        carry(w, cur);
                    }
                    let oldest = cur.saturating_sub(l.span());
                    w.own.retain(|(slot, _)| *slot >= oldest);
                    w.others.retain(|(slot, _)| *slot >= oldest);
                    // A starter taken in the slot that closes runs on in the new one until
                    // the next instant, which charges or ends it there.
                    let carried = (!phase.kept
                        && !w.grants.iter().any(|g| g.slot == cur)
                        && self.starters_in(l, cur))
                    .then(|| carried_starter(l, w, cur, boundary_time))
                    .flatten();
                    w.grants.retain(|g| g.slot >= cur);
                    if phase.kept {
                        for g in w.grants.iter_mut().filter(|g| g.starter) {
                            g.end_starter();
                        }
                    }
                    w.grants.extend(carried.filter(|g| g.allowance > 0));
                    let mut held = Pairs::new();
                    for g in &mut w.grants {
                        // A starter runs on to the next instant, which charges it to this
                        // node (or ends it); it is no held room to publish.
                        if g.starter {
                            continue;
                        }
                        // Hand back what the last allotment no longer wants here (not while
                        // holding for a partition: nobody could be allotted it).
                        let mut left = g.allowance.saturating_sub(g.used);
                        if st.returns {
                            left = left.min(g.target);
                        }
                        g.allowance = g.used.saturating_add(left);
                        // Nothing held is published too where this node has a base: what it
                        // does not publish, it holds its base of.
                        if left > 0 || self.base_in_eras(l, &st.my_eras, g.slot) > 0 {
                            held.push((g.slot, left));
                        }
                    }
                    w.published_held = held.clone();
                    if k.counts_dirty {
                        for &(slot, count) in &w.own {
                            let have = st.counters.own_at(&l.label, key, slot);
                            if count > have {
                                st.counters.add_at(&l.label, key, slot, count - have);
                            }
                        }
                    }
                    helds.push(held);
                }
                let same = k
                    .sent
                    .as_deref()
                    .is_some_and(|(d, h)| *d == k.demand && *h == helds);
                let idle = k.demand == 0 && helds.iter().all(|h| h.is_empty());
                if gives_back || k.counts_dirty || !(same || (idle && k.sent.is_none())) {
                    k.changed_in = n;
                    k.inputs_changed = true;
                    changes.push((ri, Box::<str>::from(key)));
                }
                // Demand makes the key in use at the coming instant (no starter meanwhile).
                k.known |= !idle;
                k.windows_known |= !idle;
                if k.counts_dirty {
                    k.counts_in = n as u8;
                }
                // A full frame makes its receivers complete for this node (nothing it missed
                // before is still missing): it names every key with something to say, each
                // with all its counts. Otherwise a key's counts go out in the frames of the
                // rounds they changed in and the repeats after (from `fresh_from` on), and a
                // key listed for a change of room or demand alone leaves them out.
                let counts =
                    full || u64::from((n as u8).wrapping_sub(k.counts_in)) <= n - fresh_from;
                let counted = || {
                    k.limits
                        .iter()
                        .any(|s| matches!(s, LState::Window(w) if !w.own.is_empty()))
                };
                let listed = k.changed_in >= fresh_from || (full && (!idle || counted()));
                if listed {
                    let limits = k
                        .limits
                        .iter()
                        .zip(&helds)
                        .map(|(s, held)| match s {
                            LState::Window(w) => LimitReport {
                                counts: if counts { w.own.to_vec() } else { Vec::new() },
                                held: held.to_vec(),
                                ..LimitReport::default()
                            },
                            LState::Bucket(b) => LimitReport {
                                returned: if b.published.0 == n { b.published.1 } else { 0 },
                                share: held_of(held, 0),
                                burst: held_of(held, 1),
                                short: held_of(held, 2),
                                ..LimitReport::default()
                            },
                        })
                        .collect();
                    keys.push(KeyReport {
                        rule: r.name.clone(),
                        key: key.to_owned(),
                        demand: k.demand,
                        limits,
                    });
                }
                k.counts_dirty = false;
                match &mut k.sent {
                    _ if idle => k.sent = None,
                    Some(sent) => **sent = (k.demand, helds),
                    None => k.sent = Some(Box::new((k.demand, helds))),
                }
                if forget(k) {
                    Visit::Drop
                } else if quiet && k.changed_in == changed_in {
                    Visit::Keep
                } else {
                    Visit::List
                }
            };
            // Not full: every listed key stays listed (the instant decides).
            let v = r.store.visit_sweeping(n, all, &mut visit);
            visits += v;
            if let Some((_, count)) = st.stats.rule_visits.get_mut(ri) {
                *count += (v - (swept_only - swept_before)) as u64;
            }
        }
        st.stats.key_visits += (visits - swept_only) as u64;
        if !changes.is_empty() {
            st.changes.insert(n, changes);
        }
        let view = self.view(st);
        st.my_views.insert(n, view);
        // Whether this node may hold starters from its last instant, and at what size: the
        // next instant charges them (design §3.3.1).
        let open = phase
            .consistent
            .then(|| u32::try_from(self.participants.load(Ordering::Relaxed)).unwrap_or(u32::MAX));
        st.my_opens.insert(n, open);
        while st.my_opens.len() > 4 {
            st.my_opens.pop_first();
        }
        while st.my_views.len() as u64 > MAX_REPEAT + 2 {
            st.my_views.pop_first();
        }
        st.boundary = Some(n);
        let chunks = split_by(keys, PART_BYTES, report_bytes);
        let parts = chunks.len() as u32;
        let since = (!full).then_some(fresh_from);
        // What this node holds of each member of its view, in node id order (the members a
        // receiver with the same view lists the same way).
        let acks: Vec<u8> = st
            .peers
            .values()
            .filter(|p| self.participates(p))
            .map(|p| match p.complete_to {
                Some(c) if c <= n && n - c < 255 => (n - c) as u8,
                _ => 255,
            })
            .collect();
        let mut out: Vec<Output> = chunks
            .into_iter()
            .enumerate()
            .map(|(part, keys)| {
                Output::ToAll(Message::Round(RoundFrame {
                    from: self.me.clone(),
                    round: n,
                    view,
                    open,
                    eras: st.my_eras.clone(),
                    since,
                    part: part as u32,
                    parts,
                    want_full: want_full.clone(),
                    keys,
                    acks: acks.clone(),
                }))
            })
            .collect();
        let every = if n <= st.view_changed_in.saturating_add(DIGESTS_AFTER_CHANGE) {
            self.params.full_every
        } else {
            DIGEST_EVERY_SETTLED
        };
        if n.is_multiple_of(every.max(1)) && !st.peers.is_empty() {
            out.push(Output::ToAll(Message::Digest {
                from: self.me.clone(),
                digest: st.counters.digest(),
            }));
        }
        out
    }

    /// Whether the boundary of round `n` keeps a key: it holds state, a peer's last report
    /// says it is in use there (`reported`), or peers reported on it recently (it must be
    /// allotted, not mistaken for a new key).
    fn keep(&self, r: &GRule, k: &GKey, n: u64, now: Nanos, reported: bool) -> bool {
        reported
            || !k.is_fresh(r, now, self.participants.load(Ordering::Relaxed))
            || k.remote_round + 2 * self.params.full_every >= n
    }

    /// Applies a peer's round (all its parts): counts as dots, reports as the latest inputs.
    fn apply_round(&self, st: &mut RoundState, node: &str, parts: Vec<RoundFrame>, now: Nanos) {
        // This node's entry in the frame's `acks`, if the sender's view of the round is this
        // node's (then its members, less the sender, are this node's participants and itself).
        let ack_index = parts
            .first()
            .filter(|f| st.my_views.get(&f.round) == Some(&f.view))
            .map(|_| {
                st.peers
                    .iter()
                    .filter(|(name, p)| {
                        name.as_str() != node
                            && self.participates(p)
                            && name.as_str() < self.me.node.as_str()
                    })
                    .count()
            });
        let RoundState {
            counters,
            peers,
            stats,
            full_requested,
            last_full,
            ..
        } = st;
        let Some(p) = peers.get_mut(node) else { return };
        let Some(first) = parts.first() else { return };
        let wants_me = first.want_full.contains(&self.me.node);
        let (round, since, view, open) = (first.round, first.since, first.view, first.open);
        let header = RoundFrame {
            from: first.from.clone(),
            round,
            view,
            open,
            eras: first.eras.clone(),
            since,
            part: 0,
            parts: first.parts,
            want_full: Vec::new(),
            keys: Vec::new(),
            acks: Vec::new(),
        };
        let agree = parts.iter().all(|f| {
            f.from == p.actor
                && f.round == round
                && f.since == since
                && f.view == view
                && f.open == open
                && f.eras == header.eras
                && f.acks == first.acks
        });
        if !agree || p.applied.is_some_and(|a| a >= round) {
            return;
        }
        p.applied = Some(round);
        p.acked = ack_index
            .and_then(|i| first.acks.get(i))
            .filter(|&&d| d != 255)
            .map_or(0, |&d| round.saturating_sub(u64::from(d)));
        // A frame its sender built by the time this node's last full frame left (at the same
        // boundary) cannot know of it, and still asks: each such ask answered made a full
        // frame follow a full frame, on a loaded machine a storm of them (design §10).
        // (Waiting two rounds more for a full frame that runs late cost the simulation's
        // lossy seeds more denials than it saved.)
        if wants_me && last_full.is_none_or(|f| round > f) {
            *full_requested = true;
        }
        let frame = RoundFrame {
            keys: parts.into_iter().flat_map(|f| f.keys).collect(),
            ..header
        };
        // A full frame replaces the peer's reports: a key it no longer names (the peer forgot
        // it) loses its report without a word, so it is marked changed below.
        let mut replaced: Vec<HashMap<String, Summary, foldhash::fast::RandomState>> = Vec::new();
        match frame.since {
            None => {
                replaced = p.reports.iter_mut().map(std::mem::take).collect();
                p.complete_to = Some(frame.round);
            }
            Some(since) => {
                if p.complete_to
                    .is_some_and(|c| c + 1 >= since && c < frame.round)
                {
                    p.complete_to = Some(frame.round);
                }
            }
        }
        p.views.insert(frame.round, frame.view);
        while p.views.len() > 4 {
            p.views.pop_first();
        }
        p.opens.insert(frame.round, frame.open);
        while p.opens.len() > 4 {
            p.opens.pop_first();
        }
        // Only the last eras count (a longer list is not this version's).
        let skip = frame.eras.len().saturating_sub(MAX_ERAS);
        p.eras = frame.eras[skip..].to_vec();
        p.returned.iter_mut().for_each(HashMap::clear);
        p.returned_round = frame.round;
        let members = (peers.len() + 1) as u64;
        let settled = self.settled();
        let Some(p) = peers.get_mut(node) else { return };
        let by_name = self.by_name();
        for report in frame.keys {
            let Some(&ri) = by_name.get(&report.rule) else {
                stats.reports_dropped += 1;
                continue;
            };
            let rule = &self.rules[ri];
            if report.limits.len() != rule.limits.len() {
                stats.reports_dropped += 1;
                continue;
            }
            let mut helds: SmallVec<[Pairs; 1]> = SmallVec::with_capacity(rule.limits.len());
            let mut returned = Vec::new();
            let mut bad = false;
            let mut raised = false;
            for (li, (l, lr)) in rule.limits.iter().zip(&report.limits).enumerate() {
                if l.kind == Kind::Bucket {
                    // A bucket reports the share it holds (none: the default) and the tokens
                    // it gave back, at most a whole bucket (a level never exceeds its
                    // capacity: at most `burst`, or one unit). No counts, no room.
                    let most = l.ceiling().burst().max(1).saturating_mul(SHARE_ONE);
                    let returned_ok = lr.returned <= most;
                    let share_ok = lr.share <= SHARE_ONE && lr.burst <= SHARE_ONE;
                    let short_ok = lr.short <= l.ceiling().burst();
                    bad |= !returned_ok
                        || !share_ok
                        || !short_ok
                        || !lr.counts.is_empty()
                        || !lr.held.is_empty();
                    if returned_ok && lr.returned > 0 {
                        returned.resize(rule.limits.len(), 0);
                        returned[li] = lr.returned;
                    }
                    let mut held = Pairs::new();
                    if share_ok && (lr.share > 0 || lr.burst > 0) {
                        held.extend([(0, lr.share), (1, lr.burst)]);
                    }
                    if short_ok && lr.short > 0 {
                        held.push((2, lr.short));
                    }
                    helds.push(held);
                    continue;
                }
                bad |= lr.share > 0 || lr.burst > 0 || lr.short > 0 || lr.returned > 0;
                let cur = l.slot(now);
                let ceiling = l.ceiling().limit().saturating_mul(members);
                for &(slot, count) in &lr.counts {
                    if count > ceiling {
                        bad = true;
                        continue;
                    }
                    if !l.readable(slot, now) {
                        stats.dots_out_of_range += 1;
                        p.out_of_range += 1;
                        continue;
                    }
                    let before = counters.refused();
                    raised |= counters.apply_at(&l.label, &report.key, slot, &frame.from, count);
                    stats.own_dots_refused += counters.refused() - before;
                }
                // Room held: at most the limit, in the current or the next slot (a closed
                // slot's holding is moot). None held is kept too: in a slot where the sender
                // has a base, it says the base was given back.
                let mut held = Pairs::with_capacity(lr.held.len());
                for &(slot, units) in &lr.held {
                    if slot > cur + 1 || units > l.ceiling().limit() {
                        bad = true;
                    } else if slot >= cur {
                        held.push((slot, units));
                    }
                }
                helds.push(held);
            }
            if bad {
                stats.reports_dropped += 1;
            }
            let idle = report.demand == 0 && helds.iter().all(|h| h.is_empty());
            let active = !idle || report.limits.iter().any(|lr| !lr.counts.is_empty());
            // A report that says what this node already holds of the peer (a full frame
            // repeats every key the peer holds) changes no input: the key is not listed, so a
            // full frame costs its receiver no visit of the keys it did not change. Nor is it
            // marked known: the instant that last found it idle read the same report and
            // counts (a count raised since, or a changed report, listed it for the next).
            let old = match replaced.get(ri) {
                Some(old) => old.get(&report.key),
                None => p.reports[ri].get(&report.key),
            };
            let unchanged = !raised
                && returned.is_empty()
                && match old {
                    Some((demand, old_helds)) => {
                        !idle && *demand == report.demand && *old_helds == helds
                    }
                    None => idle,
                };
            let stored = || {
                rule.store
                    .update_stored(&report.key, |k| {
                        if !idle {
                            k.remote_round = k.remote_round.max(round);
                        }
                    })
                    .is_some()
            };
            // Unchanged, and stored here (or not, and not in use: nothing to track).
            if unchanged && (stored() || !active) {
                if !idle {
                    p.reports[ri].insert(report.key, (report.demand, helds));
                }
                continue;
            }
            let touch = |k: &mut GKey| {
                k.inputs_changed = true;
                // In use as of this round: no starter until an instant finds it idle
                // (starters open before the instant has visited every key).
                k.known |= active;
                k.windows_known |= active;
                if !idle {
                    k.remote_round = k.remote_round.max(round);
                }
            };
            if !active {
                // A key the peer reports unused (a full frame names every key it holds)
                // changes nothing here unless this node tracks it: tracking it afresh would
                // have each node's full frame keep every idle key alive at the others.
                rule.store.update_stored_listed(&report.key, touch);
            } else if rule
                .store
                .update_listed(
                    &report.key,
                    now,
                    || GKey::fresh(rule, now, members, settled),
                    |_| false,
                    touch,
                )
                .is_err()
            {
                stats.store_full += 1;
            }
            if !returned.is_empty() {
                p.returned[ri].insert(report.key.clone(), returned);
            }
            if idle {
                p.reports[ri].remove(&report.key);
            } else {
                p.reports[ri].insert(report.key, (report.demand, helds));
            }
        }
        for (ri, old) in replaced.into_iter().enumerate() {
            for key in old.keys().filter(|key| !p.reports[ri].contains_key(*key)) {
                self.rules[ri]
                    .store
                    .update_stored_listed(key, |k| k.inputs_changed = true);
            }
        }
        p.reports.iter_mut().for_each(shrink_map);
        p.returned.iter_mut().for_each(shrink_map);
    }

    /// The instant of round `n`: apply frames, decide consistency, allot leases and shares.
    fn instant(&self, st: &mut RoundState, n: u64, now: Nanos) {
        // Apply every buffered frame up to round n, in round order.
        let nodes: Vec<String> = st.peers.keys().cloned().collect();
        for node in &nodes {
            self.apply_buffered(st, node, n, now);
        }
        // Suspicion and consistency.
        let my_view = st.my_views.get(&n).copied();
        let mut consistent = my_view.is_some() && st.boundary == Some(n) && self.joined();
        let mut suspicion_changed = false;
        for p in st.peers.values_mut() {
            let has = p.complete_to == Some(n) || p.views.contains_key(&n);
            let heard = std::mem::take(&mut p.heard);
            if has {
                p.missed = 0;
                p.silent = 0;
                if p.suspected {
                    p.suspected = false;
                    suspicion_changed = true;
                }
            } else {
                // Silent, or only late: a late frame degrades the round but is no sign the
                // peer is gone (design §3.3.4).
                p.missed = p.missed.saturating_add(1);
                p.silent = if heard { 0 } else { p.silent.saturating_add(1) };
                let late_limit = self
                    .params
                    .suspect_after
                    .saturating_mul(LATE_SUSPECT_FACTOR);
                if !p.suspected && (p.silent >= self.params.suspect_after || p.missed >= late_limit)
                {
                    p.suspected = true;
                    suspicion_changed = true;
                }
            }
            if p.breaks_consistency(n, my_view) {
                consistent = false;
            }
        }
        // A suspicion that comes or goes sends no full frame: a peer that lacks this node's
        // state after it says so (`want_full`), and one back within the repeats fills its
        // gap from them. (Each change of a suspicion sent a full frame from every node, whose
        // size and visit of every key made the next frames late, and late frames more
        // suspicions: design §10, "A full-frame storm".)
        // Every participant's frame can come: under `split` a member declared dead takes no
        // part, so once every suspect is dead the side is whole again (design §5), and opens
        // starters and allots the open slots among its own members.
        let all_reachable = st
            .peers
            .values()
            .filter(|p| self.participates(p))
            .all(|p| !p.suspected);
        let hold_from_before = st.hold_from;
        // A side holds from the instant its set of suspects last changed: a slot its
        // members could have been allotted before then, by a set that included peers now
        // out of reach, gets no more room (design §5).
        if all_reachable {
            st.hold_from = None;
        } else if suspicion_changed || st.hold_from.is_none() {
            st.hold_from = Some(n);
        }
        self.holding
            .store(st.hold_from.is_some(), Ordering::Release);
        st.returns = all_reachable;
        let participants = 1 + st.peers.values().filter(|p| self.participates(p)).count() as u64;
        self.participants.store(participants, Ordering::Relaxed);
        // Under `split`, a side allots the whole room among its own members; when a member
        // that stopped taking part comes back, what the side holds is given up, since the
        // other side holds the same room (design §5).
        let now_in: Vec<Actor> = st
            .peers
            .values()
            .filter(|p| self.participates(p))
            .map(|p| p.actor.clone())
            .collect();
        let out: Vec<Actor> = st
            .participated
            .iter()
            .filter(|a| !now_in.contains(a))
            .cloned()
            .collect();
        st.excluded.extend(out);
        let listed: HashSet<&Actor> = st.peers.values().map(|p| &p.actor).collect();
        st.excluded.retain(|a| listed.contains(a));
        let back = now_in.iter().any(|a| st.excluded.contains(a));
        st.excluded.retain(|a| !now_in.contains(a));
        let regrown = self.params.on_partition == OnPartition::Split && back;
        st.participated = now_in;
        // Bases (design §3.3.1): a side that regrows gives up its bases with the rest of what
        // it holds (the other side held the same room); a node takes its first era at its
        // first instant with every participant's frame in, for the slots first allotted after
        // it: by then every participant counts it, since each one's frame of this round named
        // it in its view.
        if regrown {
            self.set_eras(st, Vec::new());
        }
        if consistent && all_reachable && st.my_eras.is_empty() {
            self.push_era(st, n + 1, participants);
        }
        // Every participant's eras, this node's first.
        let eras: Vec<&[(u64, u32)]> = std::iter::once(st.my_eras.as_slice())
            .chain(
                st.peers
                    .values()
                    .filter(|p| self.participates(p))
                    .map(|p| p.eras.as_slice()),
            )
            .collect();
        let based_from = eras
            .iter()
            .map(|e| e.first().map_or(u64::MAX, |&(from, _)| from))
            .min()
            .unwrap_or(u64::MAX);
        self.based_from.store(based_from, Ordering::Release);
        self.starters_beside_bases.store(
            consistent && all_reachable && eras_at(&eras, participants),
            Ordering::Release,
        );
        if consistent {
            st.stats.consistent_rounds += 1;
        } else {
            st.stats.degraded_rounds += 1;
            if tracing::enabled!(tracing::Level::DEBUG) {
                // Per peer that breaks it: the last round it is complete to, and whether its
                // frame of this round named this node's view.
                let missing: Vec<(&str, Option<u64>, Option<bool>)> = st
                    .peers
                    .iter()
                    .filter(|(_, p)| p.breaks_consistency(n, my_view))
                    .map(|(node, p)| {
                        let same_view = p.views.get(&n).map(|v| Some(*v) == my_view);
                        (node.as_str(), p.complete_to, same_view)
                    })
                    .collect();
                tracing::debug!(
                    round = n,
                    after_ms = (now - n * self.params.round) / MILLISECOND,
                    boundary = ?st.boundary,
                    last_instant = self.phase().round,
                    own_view = my_view.is_some(),
                    ?missing,
                    "degraded instant (these peers' frames missing, or on another view): no \
                     lease granted, and no starter until a consistent instant"
                );
            }
        }
        // Starters open now, before the keys are visited: a key no frame of this round
        // reports active and without own demand is idle at this instant whether or not it
        // was visited yet (apply_round and the boundary mark the others known). With every
        // participant reachable, in every slot; while holding for a partition, in the slots
        // first allotted since `hold_from` (each side is allotted its head count's part of
        // those, design §5), and only with the participants of the last all-reachable
        // instant, so that every side counts the same members, each at a starter's size.
        let with_record = st.hold_nodes.len() as u64 == participants
            && st.hold_nodes.contains(&self.me)
            && st
                .peers
                .values()
                .filter(|p| self.participates(p))
                .all(|p| st.hold_nodes.contains(&p.actor));
        let starters_from = match st.hold_from {
            _ if !consistent => u64::MAX,
            _ if all_reachable => 0,
            Some(h) if with_record => h + 1,
            _ => u64::MAX,
        };
        // Degraded only by a late frame, right after an instant that opened starters, with
        // the same view and every participant reachable: the sliding algorithms' starters
        // stay open until the next boundary, which ends them. The frame this node sent at
        // this round's boundary said it may hold starters, so an instant of the others that
        // finds a key used charges it a whole starter; its next frame says it holds none
        // (design §3.3.1, "Starters across a late frame").
        let before = self.phase();
        let kept = !consistent
            && all_reachable
            && !suspicion_changed
            && !regrown
            && self.joined()
            && before.consistent
            && before.round + 1 == n
            && my_view.is_some()
            && (st.consistent_view == my_view
                // The view changed only by peers that left on purpose, their final frames in:
                // the participants only shrank, so every starter, sized by its holder's count
                // of them, still fits (design §3.3.1, "Starters across a late frame").
                || (!st.left_since.is_empty()
                    && my_view == Some(self.view(st))
                    && st.consistent_view == Some(self.view_with(st, &st.left_since))));
        st.stats.kept_rounds += u64::from(kept);
        // A rule added since the last all-reachable consistent instant is allotted only
        // from the next one (design §3.8, "Adding and removing a global rule"); then all
        // its keys are visited.
        let newly_recorded: Vec<usize> = if consistent && all_reachable {
            self.rules
                .iter()
                .enumerate()
                .filter(|(_, r)| !r.recorded.swap(true, Ordering::AcqRel))
                .map(|(ri, _)| ri)
                .collect()
        } else {
            Vec::new()
        };
        self.starters_from
            .store(if kept { 0 } else { starters_from }, Ordering::Release);
        self.set_phase(Phase {
            open: true,
            consistent: starters_from != u64::MAX,
            kept,
            returns: all_reachable,
            round: n,
        });
        // Allot every key. The participants, this node first, then peers in node order.
        let boundary_next = (n + 1) * self.params.round;
        if consistent {
            for (ri, key) in std::mem::take(&mut st.unallotted) {
                self.rules[ri].store.list(&key);
            }
        }
        let st_ref: &RoundState = st;
        let parts: Vec<Part<'_>> = std::iter::once(Part {
            node: &self.me.node,
            actor: &self.me,
            peer: None,
            reachable: true,
            hold_index: st_ref.hold_nodes.iter().position(|h| *h == self.me),
            open: st_ref.my_opens.get(&n).copied().flatten(),
        })
        .chain(
            st_ref
                .peers
                .iter()
                .filter(|(_, p)| self.participates(p))
                .map(|(node, p)| Part {
                    node,
                    actor: &p.actor,
                    peer: Some(p),
                    reachable: !p.suspected,
                    hold_index: st_ref.hold_nodes.iter().position(|h| *h == p.actor),
                    open: p.opens.get(&n).copied().flatten(),
                }),
        )
        .collect();
        let mut scratch = Scratch::default();
        // Leases are renewed as they are when nothing they depend on changed: this instant is
        // consistent with the view of the last consistent one (so the same participants), and
        // the key's inputs did not change since (degraded instants in between keep the flag).
        let renewable = consistent && st_ref.consistent_view == my_view && !st_ref.numbers_moved;
        // Bucket shares move only when every participant's frame is in (not while a
        // participant is suspected under `hold`).
        let all_in = consistent && parts.iter().all(|p| p.reachable);
        let default = default_share(participants);
        // Every key is visited when the allocation's inputs changed for all of them (a view
        // change, a suspicion, a side regrown); otherwise only the listed ones, since a
        // dormant key's visit would change nothing (see [`dormant_until`]). What every key's
        // allotment reads besides its own inputs is hashed: the participants (who, reachable
        // or not, where in the hold record) and since when a side holds, compared with the
        // last consistent instant's (a degraded one changes no unchanged key).
        let mut h = StableHasher::new();
        for part in &parts {
            h.str(part.node);
            h.u64(part.actor.generation);
            h.u64(u64::from(part.reachable));
            h.u64(part.hold_index.map_or(u64::MAX, |i| i as u64));
        }
        h.u64(st_ref.hold_from.map_or(u64::MAX, |f| f));
        let shared_inputs = h.finish();
        let inputs_moved = suspicion_changed
            || st_ref.hold_from != hold_from_before
            || st_ref.shared_inputs != Some(shared_inputs)
            || (consistent && !renewable);
        // A degraded instant ends starters and refreshes counts, which only listed keys need
        // (a key with a starter or changed inputs is listed); every key's visit waits for the
        // next consistent instant, which allots. Visiting every key at each degraded instant
        // after a view change made those instants as slow as a full visit (100,000 keys),
        // slow rounds made late frames, and late frames more view changes.
        let all = regrown
            || self.params.visit_all
            || (consistent && (inputs_moved || st_ref.visit_all_due || st_ref.numbers_moved));
        let defer_all = !consistent && inputs_moved;
        let mut wakes = Vec::new();
        let mut unallotted = Vec::new();
        let mut visits = 0;
        let mut rule_visits = Vec::with_capacity(self.rules.len());
        for (ri, r) in self.rules.iter().enumerate() {
            // A rule this node added while a peer was out of reach knows nothing of what that
            // peer did with it: each instant is degraded for it until the rule is recorded.
            let recorded = r.recorded.load(Ordering::Acquire);
            let consistent = consistent && recorded;
            let kept = kept && recorded;
            let renewable = renewable && recorded;
            let all = all || newly_recorded.contains(&ri);
            let mut allot = |key: &str, k: &mut GKey| {
                if regrown {
                    for (l, s) in r.limits.iter().zip(k.limits.iter_mut()) {
                        match s {
                            LState::Window(w) => {
                                for g in &mut w.grants {
                                    g.allowance = g.used;
                                }
                            }
                            // Each side held shares summing to the whole; keep a floor and
                            // grow back from the room the merged frames show free.
                            LState::Bucket(b) => {
                                let floor = default / BUCKET_FLOOR;
                                let to = (b.share.min(floor).max(1), b.burst.min(floor).max(1));
                                b.reshare(&l.limit(), to, 0, now);
                            }
                        }
                    }
                }
                if !consistent {
                    // Degraded: no grant, what is held stays held, and the key stays as known
                    // as it was (no starter is granted until a consistent instant). A starter
                    // an earlier instant allowed ends: the consistent nodes charge it to this
                    // one now, but none will next round. Others' counts are refreshed for
                    // `remaining` where they changed.
                    for (l, s) in r.limits.iter().zip(k.limits.iter_mut()) {
                        if let LState::Window(w) = s {
                            let ends =
                                |g: &Grant| !kept || (l.based() && !self.unbased(l, g.slot, n));
                            for g in w.grants.iter_mut().filter(|g| g.starter && g.opened < n) {
                                if ends(g) {
                                    g.end_starter();
                                }
                            }
                        }
                    }
                    if k.inputs_changed {
                        for (l, s) in r.limits.iter().zip(k.limits.iter_mut()) {
                            if let LState::Window(w) = s {
                                self.copy_others(st_ref, l, key, w, now);
                            }
                        }
                    }
                    return;
                }
                let was_known = k.known;
                k.known = true;
                let changed = std::mem::replace(&mut k.inputs_changed, false);
                let has_starter = k.limits.iter().any(|s| match s {
                    LState::Window(w) => w.grants.iter().any(|g| g.starter),
                    LState::Bucket(_) => false,
                });
                if renewable
                    && was_known
                    && !changed
                    && !has_starter
                    // Read as the allotment reads: a sliding counter's budget at the
                    // round's boundary (the others' slots are the same then as now).
                    && renew(r, k, self.counter_read(now), boundary_next, all_reachable)
                {
                    // Renewed as it was: the last consistent instant had this view, so it was
                    // all-reachable if this one is, and set `idle_at_record` as it stands.
                    return;
                }
                let was_windows_known = std::mem::replace(&mut k.windows_known, true);
                scratch.demands.clear();
                scratch.reports.clear();
                for part in &parts {
                    let report = part.peer.and_then(|p| p.reports[ri].get(key));
                    let demand = match part.peer {
                        None => k.demand,
                        Some(_) => report.map_or(0, |(d, _)| *d),
                    };
                    scratch.demands.push(demand);
                    scratch.reports.push(report);
                }
                let demands = &scratch.demands;
                // A key nobody uses (no counts, demand or holdings, so no room is held) is
                // not *known*: its next check may take a starter.
                let mut idle = true;
                // Whether the windowed limits are idle (a bucket limit beside them aside).
                let mut windows_idle = true;
                for (li, (l, s)) in r.limits.iter().zip(k.limits.iter_mut()).enumerate() {
                    match s {
                        LState::Window(w) => {
                            // A check may have taken a starter on this key since starters
                            // opened above: then the key must be idle here.
                            let could_start = self.starters_in(l, l.slot(now))
                                && !was_windows_known
                                && w.own.is_empty()
                                && w.others.is_empty();
                            let in_use = self.lease(
                                st_ref,
                                &parts,
                                &scratch.reports,
                                demands,
                                (key, li),
                                l,
                                w,
                                now,
                                boundary_next,
                                all_reachable,
                            );
                            debug_assert!(
                                !(could_start && in_use),
                                "key {key} was open to a starter before instant {n} but is in use: demands {demands:?}, counts {} / {}, grants {:?}, reports {:?}",
                                SlotReader::new(&st_ref.counters, &l.label, key).total(l.slot(now)),
                                SlotReader::new(&st_ref.counters, &l.label, key)
                                    .total(l.slot(now) + 1),
                                w.grants,
                                scratch.reports,
                            );
                            idle &= !in_use;
                            windows_idle &= !in_use;
                        }
                        LState::Bucket(b) => {
                            idle = false;
                            // Shares move, and tokens given back in this round's frames are
                            // taken up, only when every participant's frame is in: then
                            // every consistent node reads the same shares, demands and pool.
                            // Otherwise the share is held as it is (design §3.5).
                            if !all_in {
                                continue;
                            }
                            let mut pool = if b.published.0 == n { b.published.1 } else { 0 };
                            scratch.shares.clear();
                            scratch.shares.push((b.share, b.burst, b.short));
                            for (part, report) in parts.iter().zip(&scratch.reports).skip(1) {
                                let held = report.and_then(|(_, h)| h.get(li));
                                let of = |i| held.map_or(0, |h| held_of(h, i));
                                let or_default = |s: u64| if s == 0 { default } else { s };
                                scratch
                                    .shares
                                    .push((or_default(of(0)), or_default(of(1)), of(2)));
                                if let Some(p) = part.peer
                                    && p.returned_round == n
                                    && let Some(r) = p.returned[ri].get(key)
                                {
                                    pool = pool.saturating_add(r[li]);
                                }
                            }
                            if calm_bucket(&l.limit(), demands, &scratch.shares, pool, default) {
                                continue;
                            }
                            b.move_share(&l.limit(), demands, &scratch.shares, pool, now);
                        }
                    }
                }
                if idle {
                    k.known = false;
                }
                if windows_idle {
                    k.windows_known = false;
                }
                if all_reachable {
                    k.idle_at_record = windows_idle;
                }
            };
            let visit = |key: &str, k: &mut GKey| -> Visit {
                allot(key, k);
                let dormant = dormant_until(r, k, n, now, self.params.round, all_reachable, true);
                let waiting = || dormant_until(r, k, n, now, self.params.round, false, false);
                match dormant {
                    // Degraded, and nothing to do but be allotted: listed again at the next
                    // consistent instant (or its slot's edge, whichever comes first).
                    None if !consistent
                        && !all
                        && let Some(wake) = waiting() =>
                    {
                        unallotted.push((ri, Box::<str>::from(key)));
                        if wake != u64::MAX && k.wake != wake {
                            k.wake = wake;
                            wakes.push((wake, ri));
                        }
                        Visit::Unlist
                    }
                    None => Visit::List,
                    Some(wake) => {
                        if wake != u64::MAX && k.wake != wake {
                            k.wake = wake;
                            wakes.push((wake, ri));
                        }
                        Visit::Unlist
                    }
                }
            };
            let v = if all {
                r.store.visit_all(visit)
            } else {
                r.store.visit_listed(visit)
            };
            visits += v;
            rule_visits.push(v);
        }
        if all_in {
            self.settled.store(true, Ordering::Release);
        }
        let hold_nodes: Option<Vec<Actor>> =
            (consistent && all_reachable).then(|| parts.iter().map(|p| p.actor.clone()).collect());
        drop(parts);
        drop(scratch);
        for (wake, ri) in wakes {
            st.wakes.entry(wake).or_default().insert(ri);
        }
        st.unallotted.extend(unallotted);
        // A key listed again and unlisted at each of many degraded instants is pushed each
        // time: keep the list within twice the keys stored.
        let stored: usize = self.rules.iter().map(|r| r.store.len()).sum();
        if st.unallotted.len() > 2 * stored + 1024 {
            st.unallotted.sort_unstable();
            st.unallotted.dedup();
        }
        if consistent {
            st.shared_inputs = Some(shared_inputs);
            st.visit_all_due = false;
            st.numbers_moved = false;
        } else if defer_all {
            st.visit_all_due = true;
        }
        st.stats.key_visits += visits as u64;
        for ((_, count), v) in st.stats.rule_visits.iter_mut().zip(rule_visits) {
            *count += v as u64;
        }
        st.stats.full_instants += u64::from(all);
        if let Some(nodes) = hold_nodes {
            st.hold_nodes = nodes;
        }
        if consistent {
            st.consistent_view = my_view;
            st.left_since.clear();
        }
        // Forget slots no decision can read any more (a scan of every slot: only when a
        // limit's oldest readable slot moves).
        for r in self.rules.iter() {
            for l in &r.limits {
                let floor = l.slot(now).saturating_sub(l.span());
                if st.floors.get(&l.label) != Some(&floor) {
                    st.counters.forget_before(&l.label, floor);
                    st.floors.insert(l.label.clone(), floor);
                }
            }
        }
        st.instant = Some(n);
        // Counted once every key is allotted: a check paused for its lease looks again now.
        self.instants.fetch_add(1, Ordering::Release);
    }

    /// Charges `old`, a peer's incarnation that will never speak again (its node is back as
    /// a newer generation), for what it may have admitted after its last frame: those
    /// admissions died with it, and if nobody counted them the slot would hand them out
    /// again (design §5, "A dead member under `hold`").
    ///
    /// For each key with a hold record, `old`'s count in each slot it may have admitted in
    /// becomes at least the smaller of its ghost there (what the record let it admit) and
    /// its known count plus twice its published demand for every round since its last
    /// applied frame (at most [`REPEAT`] + 1 rounds), plus one unit where it held room by its
    /// last frame or by the record's instant, in a slot still open at its last frame (a
    /// sparse key's check between two frames). The demand term keeps a long window's ghost
    /// to a few rounds of traffic instead of all the room the node held. The charge is an ordinary dot for `old`, so it reaches every peer,
    /// and the restarted node's pull, through anti-entropy, and the largest one wins.
    fn retire(&self, st: &mut RoundState, old: &Peer, now: Nanos) {
        let Some(i) = st.hold_nodes.iter().position(|a| *a == old.actor) else {
            return;
        };
        let members = st.hold_nodes.len().max(1) as u64;
        let current = now / self.params.round;
        let rounds = old
            .applied
            .map_or(REPEAT, |a| current.saturating_sub(a).min(REPEAT))
            + 1;
        // When its last applied frame's counts were taken.
        let last_frame = old.applied.map(|a| a * self.params.round);
        let mut ghosts = 0u64;
        for (ri, r) in self.rules.iter().enumerate() {
            let counters = &mut st.counters;
            let mut charged_keys: Vec<Box<str>> = Vec::new();
            r.store.visit(|key, k| {
                let report = old.reports.get(ri).and_then(|m| m.get(key));
                let demand = report.map_or(0, |(d, _)| *d);
                let mut any = false;
                for (li, (l, s)) in r.limits.iter().zip(k.limits.iter_mut()).enumerate() {
                    let LState::Window(w) = s else { continue };
                    let Some(rec) = w.hold.as_deref() else {
                        continue;
                    };
                    let held_in = |x: u64| {
                        report
                            .and_then(|(_, h)| h.get(li))
                            .and_then(|h| h.iter().find(|(s, _)| *s == x))
                            .map_or(0, |(_, units)| *units)
                    };
                    let c = l.limit().limit();
                    let cur = l.slot(now);
                    let mut charged = false;
                    // Slots from the record's to now's that a decision can still read.
                    for x in rec.slot.max(cur.saturating_sub(l.span()))..=cur {
                        let held = if x == rec.slot {
                            rec.claims.get(i).copied().unwrap_or(c)
                        } else {
                            c.div_ceil(members)
                        };
                        let known = counters.count_at(&l.label, key, x, &old.actor);
                        // A sparse key's last check may fall between its frames: one unit
                        // more where it held room, by its last frame or by the record's
                        // instant (a grant there reaches no frame of its holder's before the
                        // next boundary), if the slot was still open at its last frame.
                        let open_after_frame = last_frame.is_none_or(|t| t < (x + 1) * l.slot_len);
                        let had_room =
                            held_in(x) > 0 || (x == rec.slot && held > known && open_after_frame);
                        let unpublished = demand
                            .saturating_mul(2 * rounds)
                            .saturating_add(u64::from(had_room));
                        let ghost = held.min(known.saturating_add(unpublished));
                        if ghost > known && counters.apply_at(&l.label, key, x, &old.actor, ghost) {
                            charged = true;
                        }
                    }
                    if charged {
                        let slots = SlotReader::new(counters, &l.label, key);
                        copy_others(&slots, l, w, now);
                        any = true;
                    }
                }
                if any {
                    k.inputs_changed = true;
                    ghosts += 1;
                    charged_keys.push(key.into());
                }
                true
            });
            for key in charged_keys {
                r.store.list(&key);
            }
        }
        st.stats.retired_ghosts += ghosts;
    }

    /// Copies everyone else's counts into the key for `remaining`.
    fn copy_others(&self, st: &RoundState, l: &GLimit, key: &str, w: &mut WState, now: Nanos) {
        let slots = SlotReader::new(&st.counters, &l.label, key);
        copy_others(&slots, l, w, now);
    }

    /// A consistent instant's allotment for one windowed limit of one key (design §3.3.1).
    /// For each slot a lease can touch, the room left (`C` less the budget) is divided into
    /// *targets* by demand weight; a participant below its target is granted the difference
    /// out of the room nobody holds (scaled down if that is short), one above it returns
    /// the excess at its next boundary. Every consistent peer computes the same grants.
    /// `parts`, `reports` and `demands` are aligned: this node first, then the participating
    /// peers in node order.
    #[allow(clippy::too_many_arguments)]
    fn lease(
        &self,
        st: &RoundState,
        parts: &[Part<'_>],
        reports: &[Option<&Summary>],
        demands: &[u64],
        (key, li): (&str, usize),
        l: &GLimit,
        w: &mut WState,
        now: Nanos,
        boundary_next: Nanos,
        all_reachable: bool,
    ) -> bool {
        // A sliding counter's budget moves with time: every allotment of a round reads it at
        // the round's boundary (design §3.4, fade share).
        let now = if l.kind == Kind::Counter {
            self.counter_read(now)
        } else {
            now
        };
        let c = l.limit().limit();
        let cur = l.slot(now);
        let next = l.slot(boundary_next);
        let record = if all_reachable {
            None
        } else {
            w.hold.as_deref()
        };
        let n_parts = parts.len() as u128;
        // Holding for a partition, a slot allotted before the side began to hold, where
        // nobody is based, may be spent by any participant up to a starter's size of its own
        // use, on a key its record found idle (design §5, "Keys idle at the record"): each
        // is charged that much there, whatever its record said.
        let quota = c / parts.len().max(1) as u64;
        let quota_in = |y: u64| {
            let first = self.first_instant(l, y);
            st.hold_from.is_some_and(|h| first <= h) && self.nobody_based(l, first)
        };
        // Counts per slot: everyone known, with unreachable held members charged their ghost.
        let slots = SlotReader::new(&st.counters, &l.label, key);
        let count = |x: u64| -> u64 {
            let mut total = slots.total(x);
            for part in parts.iter().filter(|p| !p.reachable) {
                let known = slots.count(x, part.actor);
                let held = record.zip(part.hold_index);
                let ghost = match (held, part.hold_index) {
                    (Some((rec, i)), _) if x == rec.slot => {
                        let claim = rec.claims.get(i).copied().unwrap_or(c);
                        if quota_in(x) { claim.max(quota) } else { claim }
                    }
                    // A slot opened since the record: an even split. (The record's weights
                    // would follow demand, but each side's record may come from a different
                    // n0, and weights from different rounds can sum to more than one.)
                    (Some((rec, _)), _) if x > rec.slot => {
                        u64::try_from(u128::from(c).div_ceil(n_parts)).unwrap_or(c)
                    }
                    (Some(_), _) => known,
                    // Both were in the last fully consistent set, but the key had no record
                    // then (new during the partition): the sides split it evenly.
                    (None, Some(_)) => u64::try_from(u128::from(c).div_ceil(n_parts)).unwrap_or(c),
                    // Never consistent together (a new incarnation, or a member that joined
                    // during the partition): nothing is known of its share, so it is charged
                    // the whole limit.
                    (None, None) => c,
                };
                total = total - known.min(total) + known.max(ghost);
            }
            total
        };
        let reachable: Vec<usize> = (0..parts.len()).filter(|&i| parts[i].reachable).collect();
        let held_lists: Vec<&[(u64, u64)]> = reachable
            .iter()
            .map(|&i| match parts[i].peer {
                None => w.published_held.as_slice(),
                Some(_) => reports[i]
                    .and_then(|(_, helds)| helds.get(li))
                    .map_or(&[][..], |h| h.as_slice()),
            })
            .collect();
        let explicit_in = |j: usize, x: u64| -> Option<u64> {
            held_lists[j].iter().find(|(s, _)| *s == x).map(|(_, u)| *u)
        };
        // Bases (design §3.3.1): a participant that published no holding for a slot holds
        // its base there, less what its own counts take of the budget.
        let eras: Vec<&[(u64, u32)]> = reachable
            .iter()
            .map(|&i| {
                parts[i]
                    .peer
                    .map_or(st.my_eras.as_slice(), |p| p.eras.as_slice())
            })
            .collect();
        let base_in = |j: usize, x: u64| self.base_in_eras(l, eras[j], x);
        // When a slot's budget is read: now for the current slot, the next boundary for one
        // leased ahead.
        let read_at = |x: u64| if x == cur { now } else { boundary_next };
        let implicit_in = |j: usize, x: u64| -> u64 {
            let base = base_in(j, x);
            if base == 0 {
                return 0;
            }
            let actor = parts[reachable[j]].actor;
            base.saturating_sub(l.budget(x, read_at(x), |y| slots.count(y, actor)))
        };
        let held_in =
            |j: usize, x: u64| -> u64 { explicit_in(j, x).unwrap_or_else(|| implicit_in(j, x)) };
        let weights = lease_weights(&reachable.iter().map(|&i| demands[i]).collect::<Vec<_>>());
        // A sliding counter's fade seats, dealt over the reachable participants in node order,
        // the same at every node (design §3.4).
        let seats = if l.kind == Kind::Counter {
            let mut order: SmallVec<[usize; 8]> = (0..reachable.len()).collect();
            order.sort_by_key(|&j| parts[reachable[j]].node);
            fade_seats(&weights, &order)
        } else {
            SmallVec::new()
        };
        let den: u128 = weights.iter().sum::<u128>().max(1);
        let in_demand = demands.iter().any(|&d| d > 0);
        // This instant's grants and targets for this node, per slot, and whether it turns its
        // base there into a lease (it is granted more, or holds more than its target).
        let mut mine: Vec<(u64, u64, u64, bool, u64)> = Vec::with_capacity(2);
        let mut claims = None;
        // The earlier slots' holdings and grants, for a later slot's budget.
        let mut claimed_before: Vec<(u64, u64)> = Vec::new();
        // Whether this node is charged its own starter (and the room that adds to what it
        // holds).
        let round_now = now / self.params.round;
        let mut charged = false;
        // Whether the frames show a count in the current slot (then a starter not charged
        // ends: the others no longer count it).
        let mut used_in_cur = false;
        let mut helds_me = 0u64;
        let mut my_extra = 0u64;
        // Whether anyone uses the key: counts, demand or holdings in a slot allotted here.
        let mut in_use = in_demand;
        // For the sliding algorithms, whether anyone counted in a slot a budget from here on
        // reads, or demands the key. Room held, or claimed for an earlier slot, keeps such a
        // key in use only then: one whose counts have all left its window and that nobody
        // demands is idle, so its room goes back and it can be forgotten. (A log's slots
        // move every round: the room each instant leased ahead would otherwise keep the key
        // in use for ever.) A fixed window's slot moves once a period, and handing back its
        // room would hand back the base with it.
        let counted = l.based()
            || in_demand
            || (cur + 1 - l.span().min(cur + 1)..=next).any(|y| slots.total(y) > 0);
        let hold_from = st.hold_from;
        // A peer whose frame says its last instant was not consistent with every participant
        // reachable may have lost this node's frames: if it then holds for a partition, its
        // record is older than this instant, and it admits keys that record found idle up to
        // a starter's size (design §5, "Keys idle at the record"). So this node's claim on a
        // slot's budget (its counts and the room it holds) grows here to a starter's size at
        // most: whatever the record missed is then within what every other participant was
        // charged when the key was first used.
        let closed = parts
            .iter()
            .skip(1)
            .any(|p| p.reachable && p.open.is_none());
        // What this node holds in each slot after this instant, for a later slot's budget.
        let mut mine_held: SmallVec<[(u64, u64); 2]> = SmallVec::new();
        // Every slot from the current one to the one the next boundary falls in: a log's
        // sub-slots can be shorter than a round, so one may begin and end between two
        // instants.
        for x in cur..=next {
            // Holding for a partition: a slot that could have been allotted before this
            // side began to hold gets nothing more (the other side may have allotted its
            // room); it is served from what is held. Later slots are split evenly.
            if hold_from.is_some_and(|h| self.first_instant(l, x) <= h) {
                // What the reachable participants may still admit there, for a later slot's
                // budget: up to a starter's size each, less what each counted in it.
                if quota_in(x) {
                    let left: u64 = reachable
                        .iter()
                        .map(|&i| quota.saturating_sub(slots.count(x, parts[i].actor)))
                        .fold(0, u64::saturating_add);
                    claimed_before.push((x, left));
                }
                mine.push((x, 0, u64::MAX, false, 0));
                continue;
            }
            // The budget, with unreachable members charged their ghosts (`count`) or not
            // (`known`).
            let budget = |counted: &dyn Fn(u64) -> u64| {
                if x == cur {
                    l.budget(cur, now, counted)
                } else {
                    let upper = |y: u64| {
                        let claimed = claimed_before
                            .iter()
                            .find(|(s, _)| *s == y)
                            .map_or(0, |(_, u)| *u);
                        counted(y).saturating_add(claimed)
                    };
                    l.budget(x, boundary_next, upper)
                }
            };
            let a = budget(&count);
            let mut helds: Vec<u64> = (0..reachable.len()).map(|j| held_in(j, x)).collect();
            // The key's own use, without the ghosts of members out of reach: a key only they
            // are charged for is idle (no targets, and starters may open on it).
            let a_known = if hold_from.is_none() {
                a
            } else {
                budget(&|y| slots.total(y))
            };
            // Starters (design §3.3.1): a node whose frame says its last instant opened them
            // (consistent, with every participant reachable or holding with the participants
            // of the last all-reachable instant, §5) may hold a starter of a key found idle,
            // up to a share of the limit, spent before its boundary or since. Once the frames
            // show the key used (a count in the slot) and nothing that rules starters out (no
            // room held in the slot, no count past a starter's size), each such node is
            // charged its whole starter as held room. Until a count shows, a starter runs on.
            // A slot this node holds frozen never gets here; one it allots is charged whether
            // or not this node's own starters are open in it.
            let based = (0..reachable.len()).any(|j| base_in(j, x) > 0);
            let explicit_total: u64 = (0..reachable.len())
                .filter_map(|j| explicit_in(j, x))
                .fold(0, u64::saturating_add);
            if x == cur {
                // Only a slot with a count and no explicit room held can be charged (the common
                // cases cost no lookup), and only if every count the budget reads is a
                // reachable participant's in this slot, each within its starter or base.
                used_in_cur = a_known > 0;
                // Starters run beside bases when every participant is reachable and each
                // based one's latest era is at the participants there are: then the bases
                // (at most ⌊C'/N⌋ each) and the starters (⌊C/N⌋ each) sum to at most C.
                let beside = all_reachable && eras_at(&eras, parts.len() as u64);
                // A participant's use of the budget: its own counts, each slot the budget reads
                // (a sliding one reads earlier slots: a starter may have been spent in the
                // slot before, or its key first counted there by another).
                let own = |i: usize| l.budget(cur, now, |y| slots.count(y, parts[i].actor));
                let span = cur + 1 - l.span().min(cur + 1)..=cur;
                let started = used_in_cur
                    && (!based || beside)
                    && explicit_total == 0
                    && span.clone().map(|y| slots.total(y)).sum::<u64>()
                        == reachable
                            .iter()
                            .map(|&i| {
                                span.clone()
                                    .map(|y| slots.count(y, parts[i].actor))
                                    .sum::<u64>()
                            })
                            .sum::<u64>()
                    && reachable.iter().enumerate().all(|(j, &i)| {
                        let base = base_in(j, cur);
                        // A participant whose frame is not open holds no starter (its
                        // degraded instant, or its boundary after one that kept them, ended
                        // it); its counts are those of an ended one, at most an even split.
                        let size = if base > 0 {
                            base
                        } else {
                            c / u64::from(parts[i].open.unwrap_or(parts.len() as u32).max(1))
                        };
                        own(i) <= size
                    });
                if started {
                    for (j, &i) in reachable.iter().enumerate() {
                        if let Some(n) = parts[i].open
                            && base_in(j, cur) == 0
                        {
                            let size = c / u64::from(n.max(1));
                            helds[j] = helds[j].max(size.saturating_sub(own(i)));
                        }
                    }
                    charged = parts[0].open.is_some() && base_in(0, cur) == 0;
                    helds_me = helds[0];
                    my_extra = helds[0].saturating_sub(held_in(0, cur));
                }
            }
            let held_total: u64 = helds.iter().copied().fold(0, u64::saturating_add);
            let total = c.saturating_sub(a);
            let free = total.saturating_sub(held_total);
            // Bases alone do not make a key used: one nobody uses holds its bases as they are.
            in_use |= counted && (a_known > 0 || explicit_total > 0);
            // Targets, while the slot is in use (counts, demand or room held; an idle slot's
            // holdings all go back, so the key can be forgotten): the escrow, the room below
            // (1 − m)·C, evenly, so that every participant admits its share at once wherever
            // the demand was; the rest by demand weight. Room held keeps a slot in use: a
            // slot leased ahead (with the previous slot's holdings counted against it) is not
            // handed back at its start only to be leased again a round later.
            let active = counted && (a_known > 0 || in_demand || explicit_total > 0);
            let escrowed = escrow(c, a);
            let even = escrowed / reachable.len().max(1) as u64;
            // A deterministic order of the participants (hash of rule, key, slot and node
            // id), for the units a split leaves over.
            let order = || {
                let mut order: Vec<usize> = (0..reachable.len()).collect();
                order.sort_by_key(|&j| {
                    let mut h = StableHasher::new();
                    h.str(&l.label);
                    h.str(key);
                    h.u64(x);
                    h.str(parts[reachable[j]].node);
                    h.finish()
                });
                order
            };
            // A thin escrow (less than a unit per participant) goes one unit each to as many
            // participants as it has units, in that order, where their demands together are
            // below a unit a round each too: a split by such demand would pile units on the
            // few nodes a check last came to, which are no likelier than any other to get the
            // next one, while the units spread out each serve the next check that lands.
            let thin = even == 0
                && escrowed > 0
                && reachable
                    .iter()
                    .map(|&i| demands[i])
                    .fold(0, u64::saturating_add)
                    < reachable.len() as u64;
            let mut targets: Vec<u64> = if active && thin {
                let mut t = vec![0; reachable.len()];
                for &j in order().iter().take(escrowed as usize) {
                    t[j] = 1;
                }
                let rest = total - escrowed;
                for (tj, &wt) in t.iter_mut().zip(&weights) {
                    *tj += u64::try_from(u128::from(rest) * wt / den).unwrap_or(0);
                }
                t
            } else if active {
                let rest = total - even * reachable.len() as u64;
                weights
                    .iter()
                    .map(|&wt| even + u64::try_from(u128::from(rest) * wt / den).unwrap_or(0))
                    .collect()
            } else {
                vec![0; reachable.len()]
            };
            let mut left = if active {
                total - targets.iter().sum::<u64>().min(total)
            } else {
                0
            };
            if left > 0 {
                for j in order().into_iter().cycle() {
                    if left == 0 {
                        break;
                    }
                    targets[j] += 1;
                    left -= 1;
                }
            }
            // Above the escrow, a target is at most a round of its holder's demand (at least a
            // unit): room a node would not spend by the next instant stays free there, for
            // the participants whose demand shows up next.
            if active {
                for (j, t) in targets.iter_mut().enumerate() {
                    let d = demands[reachable[j]];
                    *t = (*t).min(even.saturating_add(d.max(1)));
                }
            }
            // A participant with no demand that holds its even share already is granted
            // nothing more: the unit or two above the escrow that its target may add moves
            // by demand, and granting it only to take it back at the next burst elsewhere
            // made every burst cost each idle holder a return and a grant (two reports).
            let mut grants: Vec<u64> = targets
                .iter()
                .zip(&helds)
                .zip(&reachable)
                .map(|((t, h), &i)| {
                    if active && !thin && demands[i] == 0 && *h >= even {
                        0
                    } else {
                        t.saturating_sub(*h)
                    }
                })
                .collect();
            // A based slot where every participant still holds its base, none published in
            // its place, and holds [`QUIET_ROUNDS`] rounds of its demand or more: nobody needs
            // room moved, so nobody is granted any, and the bases stay implicit and
            // unpublished (no conversion below). Far from the limit a check then costs the
            // wire only its count: a grant here turned each node's base into a published lease
            // after every check anywhere, for room nobody asked for. Granting less is always
            // safe, and a base kept beyond its target is room its holder does not return,
            // which every allotment counts as held (design §3.3.1, "Quiet keys").
            let quiet = l.based()
                && explicit_total == 0
                && (0..reachable.len()).all(|j| {
                    base_in(j, x) > 0
                        && demands[reachable[j]].saturating_mul(QUIET_ROUNDS) <= helds[j]
                });
            if quiet {
                grants.iter_mut().for_each(|g| *g = 0);
            }
            let wanted: u64 = grants.iter().copied().fold(0, u64::saturating_add);
            if wanted > free {
                for g in &mut grants {
                    *g = u64::try_from(u128::from(*g) * u128::from(free) / u128::from(wanted))
                        .unwrap_or(0);
                }
            }
            let granted: u64 = grants.iter().sum();
            // A sliding counter's fade share: what the participants may admit in the current
            // slot beyond what they hold, by the next boundary, whether or not this instant
            // lets this node take its share (another may): a later slot's budget and a
            // record's claims count it as spent.
            let fade = if x == cur && l.kind == Kind::Counter && cur > 0 {
                l.faded(cur, now, boundary_next, count(cur - 1))
            } else {
                0
            };
            claimed_before.push((x, held_total.saturating_add(granted).saturating_add(fade)));
            if x == cur && all_reachable {
                claims = Some(
                    reachable
                        .iter()
                        .enumerate()
                        .map(|(j, &i)| {
                            slots
                                .count(cur, parts[i].actor)
                                .saturating_add(helds[j])
                                .saturating_add(grants[j])
                                .saturating_add(fade_part(fade, seats.get(j).copied().unwrap_or(0)))
                        })
                        .collect(),
                );
            }
            // This node is parts[0], so first among the reachable. Its base becomes a lease
            // where it is granted more or holds more than its target (the next boundary gives
            // the excess back); elsewhere it stays implicit, and unpublished. A sliding
            // algorithm's slot leased ahead gives nothing back: its budget counts all that is
            // held in the current slot as spent, so its targets are low until its own
            // instants read the counts.
            let ahead = x != cur && l.kind != Kind::Fixed;
            let convert = active
                && !quiet
                && explicit_in(0, x).is_none()
                && base_in(0, x) > 0
                && (grants[0] > 0 || (!ahead && targets[0] < helds[0]));
            // Returns ahead: in the current slot, what this node keeps at the next boundary
            // is its target less its share of what the participants will likely spend before
            // the next instant (their demand, each up to its target). Every target falls by
            // about that much there, as the room shrinks by what is spent; a node that keeps
            // only what its next target will be frees the rest for the others' next instant
            // instead of the one after.
            let keep = if x == cur && active {
                let spend: u64 = reachable
                    .iter()
                    .zip(&targets)
                    .map(|(&i, &t)| demands[i].min(t))
                    .fold(0, u64::saturating_add);
                targets[0].saturating_sub((spend / reachable.len().max(1) as u64).min(even))
            } else {
                targets[0]
            };
            let target = if !ahead || !convert { keep } else { u64::MAX };
            let my_grant = if closed {
                let claim = l.budget(x, read_at(x), |y| {
                    let held = if y == x {
                        helds[0]
                    } else {
                        mine_held
                            .iter()
                            .find(|(s, _)| *s == y)
                            .map_or(0, |(_, u)| *u)
                    };
                    slots.count(y, &self.me).saturating_add(held)
                });
                // A starter still running counts whole: the check path may spend it.
                let starter = w
                    .grants
                    .iter()
                    .find(|g| g.starter && g.slot == x)
                    .map_or(0, |g| g.allowance);
                grants[0].min(quota.saturating_sub(claim.saturating_add(starter)))
            } else {
                grants[0]
            };
            mine_held.push((x, helds[0].saturating_add(my_grant)));
            mine.push((x, my_grant, target, convert, helds[0]));
        }
        // This node's starters: charged, the one of the current slot becomes held room (what
        // it holds is what it was charged: its count plus that room is the starter); a starter
        // from an earlier instant not charged ends here. One this instant allowed stays.
        for g in &mut w.grants {
            if !g.starter {
                continue;
            }
            if charged && g.slot == cur {
                // Its count and the room it holds now are what the others charge it (less,
                // if the participants changed since it was allowed).
                let charged_claim = slots.count(cur, &self.me).saturating_add(helds_me);
                g.allowance = g.allowance.min(charged_claim).max(g.used);
                g.starter = false;
                my_extra = 0;
            } else if g.opened < round_now
                && (!self.starters_in(l, cur) || g.slot != cur || used_in_cur)
            {
                g.end_starter();
            }
        }
        if my_extra > 0 {
            match w.grants.iter_mut().find(|g| g.slot == cur && !g.starter) {
                Some(g) => g.allowance = g.allowance.saturating_add(my_extra),
                None => w.grants.push(Grant {
                    slot: cur,
                    allowance: my_extra,
                    used: 0,
                    target: 0,
                    starter: false,
                    opened: 0,
                    on_fade: 0,
                    fade_seats: 0,
                }),
            }
        }
        for (x, grant, target, convert, held) in mine {
            // A starter still running where this instant grants: the frames showed no count
            // of it yet, so every consistent node took this node's claim on the slot as its
            // published count, what it held and the grant. The starter becomes that lease
            // (what it admitted stays admitted): kept beside it, a check finds one or the
            // other, and the lease, unused, was carried into the next slot while the
            // starter's count stayed in the budget (design §3.3.1, "Starters").
            if grant > 0
                && !w.grants.iter().any(|g| g.slot == x && !g.starter)
                && let Some(g) = w.grants.iter_mut().find(|g| g.slot == x && g.starter)
            {
                let claim = slots
                    .count(x, &self.me)
                    .saturating_add(held)
                    .saturating_add(grant);
                g.allowance = g.allowance.min(claim).max(g.used);
                g.starter = false;
                g.target = target;
                continue;
            }
            match w.grants.iter_mut().find(|g| g.slot == x && !g.starter) {
                Some(g) => {
                    g.allowance = g.allowance.saturating_add(grant);
                    g.target = target;
                }
                // What it holds of its base now (its live counts: what it admitted since the
                // boundary came out of it), plus the grant.
                None if convert => {
                    let used = w.own_in(x);
                    let left =
                        base_in(0, x).saturating_sub(l.budget(x, read_at(x), |y| w.own_in(y)));
                    w.grants.push(Grant {
                        slot: x,
                        allowance: used.saturating_add(left).saturating_add(grant),
                        used,
                        target,
                        starter: false,
                        opened: 0,
                        on_fade: 0,
                        fade_seats: 0,
                    });
                }
                None if grant > 0 => w.grants.push(Grant {
                    slot: x,
                    allowance: grant,
                    used: 0,
                    target,
                    starter: false,
                    opened: 0,
                    on_fade: 0,
                    fade_seats: 0,
                }),
                None => {}
            }
        }
        w.grants.sort_unstable_by_key(|g| g.slot);
        // A sliding counter's lease of the current slot takes its fade share by the seats
        // dealt by lease weight (design §3.4): this node's, first among the reachable.
        if l.kind == Kind::Counter
            && let Some(g) = w.grants.iter_mut().find(|g| g.slot == cur && !g.starter)
        {
            g.fade_seats = match reachable.first() {
                Some(0) => seats.first().copied().unwrap_or(0),
                _ => 0,
            };
        }
        w.leased_for = Leased::new(cur, next);
        // The budgets read above move with time only by a sliding counter's previous slot,
        // weighted: every participant's count there, all of them, and this node's own.
        w.steady_until = match cur.checked_sub(1) {
            Some(prev) if l.kind == Kind::Counter && all_reachable && next == cur => {
                let view = slots.view(prev);
                std::iter::once(w.own_in(prev))
                    .chain(view.map(|v| v.total()))
                    .chain(view.into_iter().flat_map(|v| v.counts()))
                    .map(|p| l.fades_at(cur, now, p))
                    .min()
                    .unwrap_or(0)
            }
            _ => 0,
        };
        copy_others(&slots, l, w, now);
        if let Some(claims) = claims {
            match &mut w.hold {
                Some(record) => **record = HoldRecord { slot: cur, claims },
                None => w.hold = Some(Box::new(HoldRecord { slot: cur, claims })),
            }
        }
        in_use
    }

    /// Every key's state, one line each, sorted (tests compare runs by it). The round a
    /// dormant key is queued to wake at is left out: it is bookkeeping of the visits.
    #[cfg(test)]
    pub(crate) fn dump(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for r in self.rules.iter() {
            r.store.visit(|key, k| {
                let mut k = k.clone();
                k.wake = 0;
                lines.push(format!("{} {key} {k:?}", r.name));
                true
            });
        }
        lines.sort_unstable();
        lines
    }

    /// Has the next boundary send a full frame, as a peer's ask (`want_full`) would.
    #[cfg(test)]
    pub(crate) fn ask_full(&self) {
        self.lock().full_requested = true;
    }

    /// Counts of what the round protocol did.
    pub fn stats(&self) -> Stats {
        self.lock().stats.clone()
    }

    /// The cluster-wide count this node knows for a windowed limit's slot (tests, status).
    pub fn known_total(&self, rule: &str, limit: usize, key: &str, slot: u64) -> u64 {
        self.slot_id(rule, limit, key, slot)
            .map_or(0, |id| self.lock().counters.total(&id))
    }

    /// `actor`'s count this node knows for a windowed limit's slot (simulation checks).
    pub fn known_count(
        &self,
        rule: &str,
        limit: usize,
        key: &str,
        slot: u64,
        actor: &Actor,
    ) -> u64 {
        self.slot_id(rule, limit, key, slot)
            .map_or(0, |id| self.lock().counters.count(&id, actor))
    }

    fn slot_id(&self, rule: &str, limit: usize, key: &str, slot: u64) -> Option<SlotId> {
        let l = self.rules[self.rule_index(rule)?].limits.get(limit)?;
        Some(SlotId::new(l.label.clone(), key, slot))
    }

    /// Each peer's estimated clock offset from this node's clock, in ns (positive: the
    /// peer's clock is ahead), for peers heard in at least [`OFFSET_MIN_SAMPLES`] of the last
    /// [`OFFSET_SAMPLES`] rounds (design §4). A frame of round n leaves its sender at its
    /// boundary `nT` by the sender's clock and arrives `d` later, so `arrival − nT = d −
    /// offset`; the least of that over the recent rounds is `d_min − offset`. The estimate
    /// thus understates a peer being ahead, and overstates it being behind, by the least
    /// one-way delay (plus how late the sender's round task ran at its best).
    pub fn clock_offsets(&self) -> Vec<(String, i64)> {
        self.lock()
            .peers
            .iter()
            .filter(|(_, p)| p.leads.len() >= OFFSET_MIN_SAMPLES)
            .filter_map(|(node, p)| Some((node.clone(), -*p.leads.iter().min()?)))
            .collect()
    }

    /// Peers this node suspects now.
    pub fn suspected(&self) -> Vec<String> {
        self.lock()
            .peers
            .iter()
            .filter(|(_, p)| p.suspected)
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// The peers this node cannot reach but still holds a share for (design §5: suspected
    /// and still taking part: always under `hold`, under `split` until membership declares
    /// them dead), and the participants in all, this node included.
    pub fn held_members(&self) -> (usize, usize) {
        let st = self.lock();
        let taking_part = st.peers.values().filter(|p| self.participates(p));
        let (held, all) = taking_part.fold((0, 1), |(held, all), p| {
            (held + usize::from(p.suspected), all + 1)
        });
        (held, all)
    }

    /// Per peer, its counts this node ignored because their slot was out of its range (more
    /// than one slot ahead of its clock, or older than the lookback): a clock off by about a
    /// window, or frames very late (design §4). Peers with none are left out.
    pub fn out_of_range(&self) -> Vec<(String, u64)> {
        self.lock()
            .peers
            .iter()
            .filter(|(_, p)| p.out_of_range > 0)
            .map(|(node, p)| (node.clone(), p.out_of_range))
            .collect()
    }

    /// Keys global rule `rule` tracks (rounds drop the ones that no longer matter).
    pub fn rule_keys(&self, rule: usize) -> usize {
        self.rules.get(rule).map_or(0, |r| r.store.len())
    }

    /// Keys of global rule `rule` the next round visits: those something happened to since
    /// they were last found dormant.
    pub fn listed_keys(&self, rule: usize) -> usize {
        self.rules.get(rule).map_or(0, |r| r.store.listed())
    }
}

/// The boundary of a key with nothing to publish (no demand, no arrivals, no new counts, no
/// room held, not changed within the last [`REPEAT`] rounds): prune old slots, without
/// building anything. Returns false, changing nothing, for any
/// other key.
fn quiet_boundary(rule: &GRule, k: &mut GKey, n: u64, boundary_time: Nanos) -> bool {
    let quiet = k.arrivals == 0
        && k.demand == 0
        && !k.counts_dirty
        && k.sent.as_deref().is_none_or(|(d, _)| *d == 0)
        && k.changed_in + REPEAT <= n
        && k.limits.iter().zip(&rule.limits).all(|(s, l)| match s {
            // Nothing to hand back, nothing held in a slot that closes now, and what it holds
            // is what it last published (a grant since must go out in a frame).
            LState::Window(w) => w.grants.iter().all(|g| {
                let published = w
                    .published_held
                    .iter()
                    .find(|(s, _)| *s == g.slot)
                    .map_or(0, |(_, u)| *u);
                !g.starter
                    && g.spendable() <= g.target
                    && g.spendable() == published
                    && (g.slot >= l.slot(boundary_time) || g.spendable() == 0)
            }),
            // Nothing to give back or give up, and its tokens as published (the frame must
            // say so).
            LState::Bucket(b) => b.as_published(&l.limit(), boundary_time),
        });
    if !quiet {
        return false;
    }
    for (l, s) in rule.limits.iter().zip(k.limits.iter_mut()) {
        if let LState::Window(w) = s {
            let cur = l.slot(boundary_time);
            let oldest = cur.saturating_sub(l.span());
            w.own.retain(|(slot, _)| *slot >= oldest);
            w.others.retain(|(slot, _)| *slot >= oldest);
            w.grants.retain(|g| g.slot >= cur);
        }
    }
    true
}

/// Whether a key is *dormant* after the instant of round `n` (at `now`), and until which
/// round: `None` if it must be visited again next round, else the round at whose boundary it
/// must be listed again (`u64::MAX`: never, by time alone).
///
/// A dormant key's visits change nothing until something happens to it — a check, a peer's
/// report, a repair or a retirement (each lists it again), or a full boundary or an instant
/// whose view or side changed (which visit every key) — or until the round returned, when a
/// windowed limit's slots move. So its boundary is quiet ([`quiet_boundary`]: nothing to
/// publish, grants as published and within their targets) and its instant changes nothing:
/// every windowed limit was allotted (or renewed) for the slots the next instant reads
/// (a known key is then renewed; an unknown one, idle, gets the same nothing again). A
/// sliding counter's budget fades with time: it is dormant only with every participant
/// reachable, and only until its budget reads less of its previous slot than at its last
/// allotment (`steady_until`); until then it is renewed, as [`renew`] says. Bucket keys
/// have no time-driven visit: shares move only on reports.
///
/// With `allotted` false, whether it would be dormant once allotted: the same, except that
/// its inputs may have changed and its windowed limits may not be allotted for the slots
/// the next instant reads (a degraded instant allots nothing).
fn dormant_until(
    rule: &GRule,
    k: &GKey,
    n: u64,
    now: Nanos,
    round: Nanos,
    all_reachable: bool,
    allotted: bool,
) -> Option<u64> {
    let idle = k.arrivals == 0
        && k.demand == 0
        && !k.counts_dirty
        && !(allotted && k.inputs_changed)
        && k.changed_in + REPEAT <= n + 1
        && k.sent.as_deref().is_none_or(|(d, _)| *d == 0);
    if !idle {
        return None;
    }
    let boundary_next = (n + 1) * round;
    let mut wake = u64::MAX;
    for (l, s) in rule.limits.iter().zip(k.limits.iter()) {
        match s {
            LState::Bucket(b) => {
                if !b.as_published(&l.limit(), now) {
                    return None;
                }
                // Listed again when the tokens it lacks fall a step below what was published
                // (a published shortfall is stale, never too small, until then).
                if b.short > 0 {
                    let token = i128::from(l.limit().period()) * i128::from(SHARE_ONE);
                    let above = b.cap(&l.limit()) - i128::from(b.short) * token + 1;
                    let need = (above - b.level_at(&l.limit(), now)).max(0);
                    let dt = u64::try_from(ceil_div(need, b.rate(&l.limit()))).unwrap_or(u64::MAX);
                    wake = wake.min(now.saturating_add(dt).div_ceil(round));
                }
            }
            LState::Window(w) => {
                let cur = l.slot(now);
                if allotted && w.leased_for != Leased::new(cur, l.slot(boundary_next)) {
                    return None;
                }
                if allotted && l.kind == Kind::Counter {
                    if !all_reachable {
                        return None;
                    }
                    wake = wake.min(w.steady_until / round);
                }
                let settled = w.grants.iter().all(|g| {
                    let published = w
                        .published_held
                        .iter()
                        .find(|(s, _)| *s == g.slot)
                        .map_or(0, |(_, u)| *u);
                    !g.starter && g.spendable() <= g.target && g.spendable() == published
                });
                if !settled {
                    return None;
                }
                // The last round whose next instant still reads `cur`: from the next one,
                // the slots move (and a grant in `cur` closes a round later).
                let edge = (cur + 1).saturating_mul(l.slot_len);
                wake = wake.min(edge.div_ceil(round).saturating_sub(1));
            }
        }
    }
    (wake > n + 1).then_some(wake)
}

/// Gives a map's memory back once most of its entries are gone (a peer's reports of keys
/// that went quiet), keeping a floor so that it does not shrink and regrow every round.
fn shrink_map<K: Eq + std::hash::Hash, V, S: std::hash::BuildHasher>(m: &mut HashMap<K, V, S>) {
    if let Some(target) = crate::store::shrink_target(m.len(), m.capacity(), 512) {
        m.shrink_to(target);
    }
}

/// Whether a key's allotment would grant nothing new: every windowed limit was allotted for
/// the same (current, next) slots from the same inputs (the caller checks those) and reads
/// the budgets it read then. A sliding counter's previous slot fades, so its budget moves
/// with time: it is renewed only while it reads the same (`steady_until`, with every
/// participant reachable, since an unreachable one's ghost is not weighed there).
/// Holdings stay as they are; buckets keep their share.
fn renew(rule: &GRule, k: &GKey, now: Nanos, boundary_next: Nanos, all_reachable: bool) -> bool {
    rule.limits
        .iter()
        .zip(k.limits.iter())
        .all(|(l, s)| match s {
            LState::Window(w) => {
                w.leased_for == Leased::new(l.slot(now), l.slot(boundary_next))
                    && (l.kind != Kind::Counter || (all_reachable && now < w.steady_until))
            }
            LState::Bucket(_) => true,
        })
}

/// Copies everyone else's counts in the slots a decision reads into the key (for
/// `remaining`).
fn copy_others(slots: &SlotReader<'_>, l: &GLimit, w: &mut WState, now: Nanos) {
    let cur = l.slot(now);
    w.others.clear();
    for x in cur.saturating_sub(l.span() - 1)..=cur + 1 {
        let n = slots.others(x);
        if n > 0 {
            w.others.push((x, n));
        }
    }
}

/// Whether a key nobody holds a lease for may be admitted on first touch under limit `l`
/// (design §3.3.1, starters): the last instant did not know the key (nobody used it, holds
/// room of it or asked for it) and was consistent with every participant reachable, or, for
/// a sliding algorithm or a fixed window's slot nobody is based in (`unbased`, see
/// [`Global::unbased`]), degraded only by a late frame right after such an instant
/// ([`Phase::kept`]). The gap after a boundary included: the next instant charges the starter
/// to this node whatever it spent (a kept one ends at the boundary). The caller also checks
/// that no count in the slots the budget reads is known.
fn starter_allowed(l: &GLimit, known: bool, phase: Phase, unbased: bool) -> bool {
    !known && (phase.consistent || (phase.kept && (!l.based() || unbased)))
}

/// Records a check's `decision` in the key: its cost as demand (unless it can never fit) and,
/// if admitted, as an admission under every limit.
#[allow(clippy::too_many_arguments)]
fn charge(
    rule: &GRule,
    key: &mut GKey,
    decision: &Decision,
    cost: u64,
    now: Nanos,
    participants: u64,
    opened: u64,
    base: &dyn Fn(&GLimit, u64) -> u64,
) {
    if cost == 0 {
        return;
    }
    if !matches!(decision.verdict, Verdict::Never) {
        key.arrivals = key.arrivals.saturating_add(cost);
    }
    if !decision.allowed() {
        return;
    }
    for (l, s) in rule.limits.iter().zip(key.limits.iter_mut()) {
        match s {
            LState::Window(w) => {
                let based = base(l, l.slot(now)) > 0;
                commit_window(l, w, cost, now, participants, opened, based);
                key.counts_dirty = true;
            }
            LState::Bucket(b) => {
                let level = b.level_at(&l.limit(), now);
                b.level = level - unit_cost(&l.limit(), cost);
                b.at = b.at.max(now);
            }
        }
    }
}

/// Bits of a packed era (see [`pack_era`]) that hold the participant count.
const ERA_N_BITS: u32 = 20;

/// An era packed into one word for the check path: `from << ERA_N_BITS | n`; `u64::MAX` for
/// none (and for one that does not fit, which then counts as no base).
fn pack_era(era: Option<(u64, u32)>) -> u64 {
    match era {
        Some((from, n)) if u64::from(n) < 1 << ERA_N_BITS && from < 1 << (64 - ERA_N_BITS) => {
            (from << ERA_N_BITS) | u64::from(n)
        }
        _ => u64::MAX,
    }
}

/// The seats a sliding counter's fade share is dealt in (design §3.4): unit u of what fades
/// goes to the holder of seat `u mod FADE_SEATS`. A participant's seats fit a `u16` mask.
const FADE_SEATS: u64 = 16;

/// The fade seats of each participant (`weights`, their lease weights, in `order`: node
/// order, the same at every node): [`FADE_SEATS`] apportioned by weight (largest
/// remainders, ties to the first in order), then dealt out interleaved (smooth weighted
/// round robin), so that a participant's part of a few units follows its weight too. One
/// mask per participant, aligned with `weights`; they cover every seat exactly once.
fn fade_seats(weights: &[u128], order: &[usize]) -> SmallVec<[u16; 8]> {
    let den: u128 = weights.iter().sum::<u128>().max(1);
    let total = u128::from(FADE_SEATS);
    let mut seats: SmallVec<[u64; 8]> = weights
        .iter()
        .map(|&w| u64::try_from(w * total / den).unwrap_or(0))
        .collect();
    let mut left = FADE_SEATS.saturating_sub(seats.iter().sum());
    let mut by_remainder: SmallVec<[usize; 8]> = order.iter().copied().collect();
    by_remainder.sort_by_key(|&j| std::cmp::Reverse(weights[j] * total % den));
    for &j in by_remainder.iter().cycle().take(order.len() * 2) {
        if left == 0 {
            break;
        }
        seats[j] += 1;
        left -= 1;
    }
    let mut masks: SmallVec<[u16; 8]> = smallvec::smallvec![0; weights.len()];
    let mut current: SmallVec<[i64; 8]> = smallvec::smallvec![0; weights.len()];
    for seat in 0..FADE_SEATS {
        let mut pick = None;
        for &j in order {
            current[j] += seats[j] as i64;
            if pick.is_none_or(|p: usize| current[j] > current[p]) {
                pick = Some(j);
            }
        }
        let Some(p) = pick else { break };
        current[p] -= FADE_SEATS as i64;
        masks[p] |= 1 << seat;
    }
    masks
}

/// What the holder of fade seats `mask` takes of `faded` units: those u < `faded` whose
/// seat, `u mod FADE_SEATS`, it holds. The holders' parts sum to exactly `faded`, and each
/// grows with it.
fn fade_part(faded: u64, mask: u16) -> u64 {
    (0..FADE_SEATS)
        .filter(|&seat| mask & (1 << seat) != 0 && faded > seat)
        .map(|seat| (faded - seat).div_ceil(FADE_SEATS))
        .sum()
}

/// A base over `n` participants: an even split of the limit below the escrow margin,
/// `⌊(C − ⌊C/20⌋)/n⌋` (design §3.3.1).
fn base_units(c: u64, n: u64) -> u64 {
    (c - c / ESCROW_MARGIN).checked_div(n).unwrap_or(0)
}

/// Moves the room this node still holds of slot `cur − 1`, which closes now, into its lease of
/// `cur` (design §3.3.1, carry), up to what the last allotment wanted it to hold there. The
/// instant that pre-leased `cur` (the previous round's, consistent: the caller checks) took
/// every holding of `cur − 1` as spent in the budget of `cur`; what this node did not spend of
/// its holding is that room, so it may spend it in `cur` instead. It publishes it as held from
/// this boundary on, and its target grows by as much, so the boundary does not give it back
/// before an instant in `cur` has allotted the slot again.
fn carry(w: &mut WState, cur: u64) {
    let Some(left) = w
        .grants
        .iter()
        .find(|g| g.slot + 1 == cur && !g.starter)
        .map(|g| g.spendable().min(g.target))
        .filter(|&u| u > 0)
    else {
        return;
    };
    match w.grants.iter_mut().find(|g| g.slot == cur && !g.starter) {
        Some(g) => {
            g.allowance = g.allowance.saturating_add(left);
            g.target = g.target.saturating_add(left);
        }
        None => w.grants.push(Grant {
            slot: cur,
            allowance: left,
            used: 0,
            target: left,
            starter: false,
            opened: 0,
            on_fade: 0,
            fade_seats: 0,
        }),
    }
    w.grants.sort_unstable_by_key(|g| g.slot);
}

/// Whether every participant's latest era (`eras`, one list each) is at `n` participants, or
/// it has none: then starters may run beside the bases (design §3.3.1).
fn eras_at(eras: &[&[(u64, u32)]], n: u64) -> bool {
    eras.iter()
        .all(|e| e.last().is_none_or(|&(_, m)| u64::from(m) == n))
}

/// A node's base in a slot of a limit of `c` whose first instant is `first`, from the eras it
/// published: the era the slot falls in, and no more than any later era's (when the
/// participants grow, a base shrinks in the slots already open too, as a return would: the
/// room goes to the newcomers); none before the first era.
fn base_of(eras: &[(u64, u32)], c: u64, first: u64) -> u64 {
    let mut base = u64::MAX;
    for &(from, n) in eras.iter().rev() {
        base = base.min(base_units(c, u64::from(n)));
        if from <= first {
            return base;
        }
    }
    0
}

/// A starter's allowance: an even split of the limit among the participants.
fn starter(l: &GLimit, participants: u64) -> u64 {
    l.limit().limit() / participants.max(1)
}

/// A starter still running from an earlier slot (one an instant allowed, not yet charged or
/// ended), carried into slot `s`: valid, like the one it continues, until the next instant,
/// and as large less what this node's own counts already take of the budget of `s` (for a
/// sliding algorithm, the starter's spending in the slot before). So a burst that straddles
/// a slot's edge is not held for the instant (design §3.3.1, "Starters across a slot's
/// edge"). The caller checks that the last instant opened starters in `s`.
fn carried_starter(l: &GLimit, w: &WState, s: u64, now: Nanos) -> Option<Grant> {
    let g = w.grants.iter().find(|g| g.starter && g.slot < s)?;
    Some(Grant {
        slot: s,
        allowance: g
            .allowance
            .saturating_sub(l.budget(s, now, |x| w.own_in(x))),
        used: 0,
        target: 0,
        starter: true,
        opened: g.opened,
        on_fade: 0,
        fade_seats: 0,
    })
}

/// Counts an admission of `cost` now: against the lease of the current slot, a new starter,
/// or (`based`, no lease) this node's base, which its own count alone tracks.
fn commit_window(
    l: &GLimit,
    w: &mut WState,
    cost: u64,
    now: Nanos,
    participants: u64,
    opened: u64,
    based: bool,
) {
    let s = l.slot(now);
    // A starter: its size, less what this node already counted in the slots the budget
    // reads. That is nothing for a starter proper (it opens only on a key unused there); for
    // a key idle at the record admitted while holding for a partition, it is what this node
    // admitted of it before (design §5, "Keys idle at the record").
    let starter = |w: &WState| Grant {
        slot: s,
        allowance: starter(l, participants)
            .saturating_sub(l.budget(s, now, |x| w.own_in(x)))
            .max(cost),
        used: cost,
        target: 0,
        starter: true,
        on_fade: 0,
        fade_seats: 0,
        opened,
    };
    match w.grants.iter().position(|g| g.slot == s) {
        // An instant that found the key idle left it an empty lease: a starter replaces it
        // (where there is no base; with one, an empty lease is a base given back).
        Some(i) if w.grants[i].is_empty() && !based => w.grants[i] = starter(w),
        // A lease (beyond it only for a key idle at the record, which takes its allowance
        // along so that it never holds less than it used).
        Some(i) => {
            let g = &mut w.grants[i];
            let beyond = g.used.saturating_add(cost).saturating_sub(g.allowance);
            if beyond > 0 && !g.starter {
                // Beyond the allowance of a lease: a sliding counter's fade share (or,
                // holding for a partition, a key idle at the record), counted for this round.
                if g.opened != opened {
                    g.opened = opened;
                    g.on_fade = 0;
                }
                g.on_fade = g
                    .on_fade
                    .saturating_add(u32::try_from(beyond).unwrap_or(u32::MAX));
            }
            g.used = g.used.saturating_add(cost);
            g.allowance = g.allowance.max(g.used);
        }
        None if based => {}
        // A starter (the only way to admit without a grant or a base): the one running on
        // from the slot before, if any.
        None => {
            let g = match carried_starter(l, w, s, now) {
                Some(mut g) => {
                    g.used = cost;
                    g.allowance = g.allowance.max(cost);
                    g
                }
                None => starter(w),
            };
            w.grants.push(g);
        }
    }
    match w.own.iter_mut().find(|(slot, _)| *slot == s) {
        Some((_, n)) => *n = n.saturating_add(cost),
        None => {
            w.own.push((s, cost));
            w.own.sort_unstable();
        }
    }
}

/// `⌈a / b⌉` for `a ≥ 0` (`b` at least 1).
fn ceil_div(a: i128, b: i128) -> i128 {
    let b = b.max(1);
    a / b + i128::from(a % b != 0)
}

fn unit_cost(limit: &Limit, cost: u64) -> i128 {
    i128::from(cost) * i128::from(limit.period()) * i128::from(SHARE_ONE)
}

/// A bucket limit's decision from this node's share of the bucket. A denial's `retry_after`
/// counts the refill at no less than `even`, the default share: a smaller share (a cold
/// node's, or a restarted node's floor share) grows with this node's demand within a round or
/// two, and a client told to wait the seconds its refill would take at that share comes back
/// long after the room is there. (A shaping wait is a promise, so it keeps the real rate.)
fn decide_bucket(
    l: &GLimit,
    b: &BState,
    cost: u64,
    max_wait: Nanos,
    even: u64,
    now: Nanos,
) -> Decision {
    let limit = &l.limit();
    let level = b.level_at(limit, now);
    let cap = b.cap(limit);
    let rate = b.rate(limit);
    let tokens = |level: i128| -> u64 {
        // This node's tokens scaled to the whole cluster's bucket (it holds `burst` of it).
        let scaled = level.max(0) / (i128::from(limit.period()) * i128::from(b.burst.max(1)));
        u64::try_from(scaled).unwrap_or(u64::MAX).min(limit.burst())
    };
    let refill = |level: i128| -> Nanos {
        u64::try_from(ceil_div((cap - level.min(cap)).max(0), rate)).unwrap_or(u64::MAX)
    };
    let need = unit_cost(limit, cost);
    let mut d = Decision {
        verdict: Verdict::Admit { wait: 0 },
        limit: limit.limit(),
        remaining: tokens(level - need),
        reset_after: refill(level - need),
    };
    if cost > limit.burst() {
        d.verdict = Verdict::Never;
        d.remaining = tokens(level);
        d.reset_after = refill(level);
        return d;
    }
    if level >= need {
        return d;
    }
    let wait = u64::try_from(ceil_div(need - level, rate)).unwrap_or(u64::MAX);
    if limit.algorithm() == Algorithm::LeakyBucket && wait <= max_wait && need <= cap {
        d.verdict = Verdict::Admit { wait };
        return d;
    }
    let even_rate = i128::from(limit.limit()) * i128::from(even.max(b.share).max(1));
    let retry_after = u64::try_from(ceil_div(need - level, even_rate)).unwrap_or(u64::MAX);
    d.verdict = Verdict::Deny { retry_after };
    d.remaining = tokens(level);
    d.reset_after = refill(level);
    d
}

/// What a report costs a receiver against the frame limit: decoding claims each element at
/// its size in memory (bincode's limit counts `size_of` per element, more than most elements
/// encode to), and the encoding is at most 20 bytes per integer pair.
fn report_bytes(r: &KeyReport) -> usize {
    std::mem::size_of::<KeyReport>()
        + r.rule.len()
        + r.key.len()
        + r.limits
            .iter()
            .map(|l| std::mem::size_of::<LimitReport>() + 20 * l.counts.len())
            .sum::<usize>()
}

/// What a repair entry costs a receiver against the frame limit (as [`report_bytes`]).
fn delta_bytes((slot, dots): &crate::counter::Delta) -> usize {
    std::mem::size_of::<crate::counter::Delta>()
        + slot.rule.len()
        + slot.key.len()
        + dots
            .iter()
            .map(|d| std::mem::size_of::<Dot<Actor>>() + d.actor.node.len())
            .sum::<usize>()
}

/// Splits `items` into runs of at most `limit` bytes by `size` (an item larger than the
/// limit gets a run of its own). Always at least one run.
pub(crate) fn split_by<T>(items: Vec<T>, limit: usize, size: impl Fn(&T) -> usize) -> Vec<Vec<T>> {
    let mut parts = vec![Vec::new()];
    let mut bytes = 0;
    for item in items {
        let s = size(&item);
        if bytes + s > limit && parts.last().is_some_and(|p| !p.is_empty()) {
            parts.push(Vec::new());
            bytes = 0;
        }
        bytes += s;
        if let Some(last) = parts.last_mut() {
            last.push(item);
        }
    }
    parts
}

/// The published demand: `(d̂ + arrivals) / 2`, rounded up while anything arrives (so a
/// steady 1 per round stays 1 rather than vanishing) and down once nothing does (so it decays
/// to 0).
fn smooth(demand: u64, arrivals: u64) -> u64 {
    let sum = demand.saturating_add(arrivals);
    if arrivals > 0 {
        sum.div_ceil(2)
    } else {
        sum / 2
    }
}

/// The escrow of a windowed limit `c` whose budget counts `a`: the room below `(1 − m)·c`
/// (design §3.3.1), at most the room left.
fn escrow(c: u64, a: u64) -> u64 {
    (c - c / ESCROW_MARGIN).saturating_sub(a)
}

/// Lease weights (numerators over their sum): `μ/N + (1 − μ)·d/D` with μ = 1/20, or even
/// when nobody has demand.
fn lease_weights(demands: &[u64]) -> Vec<u128> {
    let n = demands.len() as u128;
    let total: u128 = demands.iter().map(|&d| u128::from(d)).sum();
    if total == 0 {
        return vec![1; demands.len()];
    }
    let f = u128::from(WINDOW_FLOOR);
    demands
        .iter()
        .map(|&d| total + (f - 1) * n * u128::from(d))
        .collect()
}

/// The default bucket share of a key nobody has reported on: one over the participants.
fn default_share(participants: u64) -> u64 {
    SHARE_ONE / participants.max(1)
}

/// Participant `i`'s target bucket share out of [`SHARE_ONE`]: `μ_b/N + (1 − μ_b)·d_i/D`,
/// μ_b = 1/100, or `1/N` when nobody has demand; `total` is `D`. Targets sum to at most
/// [`SHARE_ONE`].
fn bucket_target(demands: &[u64], total: u128, i: usize) -> u64 {
    let n = demands.len() as u128;
    let one = u128::from(SHARE_ONE);
    if total == 0 {
        return u64::try_from(one / n.max(1)).unwrap_or(1);
    }
    let f = u128::from(BUCKET_FLOOR);
    let num = total + (f - 1) * n * u128::from(demands[i]);
    u64::try_from(one * num / (f * n * total)).unwrap_or(1)
}

/// Participant `i`'s target share of a bucket's burst out of [`SHARE_ONE`]: an escrow of
/// `(1 − m)/N` (m = `1/ESCROW_MARGIN`) plus `m` times its rate target, so far from the
/// limit every node holds nearly its even part of the tokens, whoever was busy (design
/// §3.5). Targets sum to at most [`SHARE_ONE`].
fn burst_target(demands: &[u64], total: u128, i: usize) -> u64 {
    if total == 0 {
        // Nobody demands the key: the default share, exactly (see `held_share`).
        return bucket_target(demands, total, i);
    }
    let n = (demands.len() as u64).max(1);
    let escrow = (SHARE_ONE - SHARE_ONE / ESCROW_MARGIN) / n;
    escrow + bucket_target(demands, total, i) / ESCROW_MARGIN
}

/// A bucket share out of a report's holdings, `(0, rate)` and `(1, burst)`, or `(2, short)`
/// what it lacks of its capacity; 0: the default share, or full.
fn held_of(held: &[(u64, u64)], which: u64) -> u64 {
    held.iter()
        .find(|(i, _)| *i == which)
        .map_or(0, |(_, s)| *s)
}

/// A bucket is calm (its shares stay as they are) while every participant holds at least this
/// many rounds of its demand in tokens, and half its capacity (design §3.5).
const CALM_ROUNDS: u64 = 8;

/// Whether an instant leaves a bucket's shares and tokens where they are (design §3.5, calm
/// buckets): someone demands it, nothing was given back in the round's frames (`pool`), and
/// every participant's `(rate, burst, short)` (`held`, aligned with `demands`) shows at least
/// the even burst share `default`, at most half its capacity missing, and [`CALM_ROUNDS`] of
/// its demand in tokens. A burst anywhere is then served from the tokens there; moving the
/// rate to where the demand came from, and back once it ended, cost every participant a
/// report each way for nothing.
fn calm_bucket(
    limit: &Limit,
    demands: &[u64],
    held: &[(u64, u64, u64)],
    pool: u64,
    default: u64,
) -> bool {
    pool == 0
        && demands.iter().any(|&d| d > 0)
        && held.iter().zip(demands).all(|(&(_, burst, short), &d)| {
            let cap = tokens_of(limit, burst);
            burst >= default
                && short.saturating_mul(2) <= cap
                && cap.saturating_sub(short) >= d.saturating_mul(CALM_ROUNDS)
        })
}

/// The capacity of a bucket holding `burst` of the burst (out of [`SHARE_ONE`]), in the units
/// of [`BState::level`]: at least one token.
fn cap_of(limit: &Limit, burst: u64) -> i128 {
    let unit = i128::from(limit.period()) * i128::from(SHARE_ONE);
    let share_cap = i128::from(limit.burst()) * i128::from(burst) * i128::from(limit.period());
    share_cap.max(unit)
}

/// The whole tokens of a bucket's capacity that a burst share (out of [`SHARE_ONE`]) holds,
/// at least one.
fn tokens_of(limit: &Limit, burst: u64) -> u64 {
    let token = i128::from(limit.period()) * i128::from(SHARE_ONE);
    u64::try_from(cap_of(limit, burst) / token).unwrap_or(u64::MAX)
}

/// The step a frame rounds a bucket's missing tokens down to: a 32nd of the burst, at least
/// one token, so a refilling bucket is published again a few dozen times at most.
fn short_step(limit: &Limit) -> u64 {
    limit.burst().div_ceil(32).max(1)
}

/// At an instant with every participant's frame in, the tokens a bucket moves (design §3.5),
/// in `1 / SHARE_ONE` token units: what this node takes up of `pool` (the tokens given back
/// in this round's frames), and what it gives back at its next boundary. `held` is each
/// participant's `(rate, burst, short)` as its frame says (this node first).
///
/// Every participant's tokens are its capacity less what it lacks; each one's part of their
/// sum is its burst target's (`u_i`). A node holding more than its part by over a token
/// gives the excess back; the pool goes first to the nodes short of their parts, each
/// its shortfall (all of them scaled down alike if the pool is smaller), and what is left by
/// burst target. Every node reads the same frames, so together they take up at most the pool.
fn tokens_moved(limit: &Limit, demands: &[u64], held: &[(u64, u64, u64)], pool: u64) -> (u64, u64) {
    let one = u128::from(SHARE_ONE);
    let burst = u128::from(limit.burst());
    let total_demand: u128 = demands.iter().map(|&d| u128::from(d)).sum();
    // Tokens, in 1/SHARE_ONE units: a capacity is at least one token.
    let tokens: Vec<u128> = held
        .iter()
        .map(|&(_, share, short)| {
            let cap = (burst * u128::from(share)).max(one);
            cap.saturating_sub(u128::from(short) * one)
        })
        .collect();
    let sum: u128 = tokens.iter().sum();
    let part = |i: usize| sum * u128::from(burst_target(demands, total_demand, i)) / one;
    let lacks: Vec<u128> = (0..held.len())
        .map(|i| part(i).saturating_sub(tokens[i]))
        .collect();
    let lacking: u128 = lacks.iter().sum();
    let pool = u128::from(pool);
    let by_target = |pool: u128| pool * u128::from(burst_target(demands, total_demand, 0)) / one;
    let taken = if lacking == 0 {
        by_target(pool)
    } else if pool <= lacking {
        pool * lacks[0] / lacking
    } else {
        lacks[0] + by_target(pool - lacking)
    };
    let mine = part(0);
    let give = if tokens[0] > mine + one {
        tokens[0] - mine
    } else {
        0
    };
    (
        u64::try_from(taken).unwrap_or(0),
        u64::try_from(give).unwrap_or(u64::MAX),
    )
}

/// This node's new bucket share at an instant where every participant's frame is in
/// (design §3.5), of the rate or of the burst, by `target`. `demands` and `held` (the shares
/// their frames say they hold) list this node first. Above one and a half times its target
/// it shrinks to the target; it grows only into the room no frame says is held, which every
/// such node splits the same way among those below their targets (in proportion to how far
/// below), so the shares held never sum to more than [`SHARE_ONE`]. The share is at least 1;
/// also returns this node's target.
fn held_share(demands: &[u64], held: &[u64], target: fn(&[u64], u128, usize) -> u64) -> (u64, u64) {
    let total: u128 = demands.iter().map(|&d| u128::from(d)).sum();
    let held_sum: u128 = held.iter().map(|&s| u128::from(s)).sum();
    let free = u128::from(SHARE_ONE).saturating_sub(held_sum);
    let short = |i: usize| u128::from(target(demands, total, i).saturating_sub(held[i]));
    let t0 = target(demands, total, 0);
    let mine = u128::from(t0.saturating_sub(held[0]));
    let mut grant = mine;
    if mine > 0 {
        let all: u128 = (0..demands.len()).map(short).sum();
        if all > free {
            grant = free * mine / all;
        }
    }
    // Within half the target above it, the share is kept: a share given up is free to the
    // others only a round later, so following every wobble of the demands wastes room. But
    // if the shares held sum past the whole (a node that took the default share of a key
    // before it heard that others hold it all), nobody keeps more than its target; nor when
    // nobody demands the key: the shares go back to the even split, so that the key is
    // fresh again once its bucket is full, and forgotten (design §3.5).
    let kept = if total > 0 && held[0] <= t0 + t0 / 2 && held_sum <= u128::from(SHARE_ONE) {
        held[0]
    } else {
        held[0].min(t0)
    };
    let share = u64::try_from(u128::from(kept) + grant)
        .unwrap_or(SHARE_ONE)
        .max(1);
    (share, t0)
}

#[cfg(test)]
mod tests;
