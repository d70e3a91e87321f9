//! Global fixed windows over an aggregation tree (docs/design.md §11), sans-IO.
//!
//! The full-mesh round protocol ([`global`](crate::cluster::global)) has every node send its
//! frame to every other node each round, so a node's traffic grows linearly with the cluster.
//! Here a round's inputs travel as *sums* instead: the view's members, ordered and rotated by
//! round, form a tree of fan-out `b`; at the round's boundary each node sends its parent the
//! sums of its subtree per (rule, key, slot): units admitted, room held, demand, and the raw
//! grant each member asks for. The root sends the totals back down, each child getting only
//! the keys its subtree reported, and its offset: the raw grants of the members before its
//! subtree in pre-order. A node's raw grant `r` is then its own interval `[o, o + r)` of
//! `[0, Σr)`, and it grants itself `r`, or `⌊(o + r)·F/Σr⌋ − ⌊o·F/Σr⌋` when `Σr` exceeds the
//! free room `F = C − admitted − held`, so the grants of a round sum to at most `F` when the
//! totals include every member of the view.
//! A node sends one message up and at most `b` down per round, each sized by the keys active
//! in its subtree, whatever the size of the cluster.
//!
//! Why the limit holds (each slot, each key):
//! - A node's *charge* `admitted + held` changes only at its boundaries (room above its
//!   target given back: smaller) and when it applies a round's grants (larger). A check
//!   moves a unit from held to admitted.
//! - A round's grants are applied only if its totals include every member of the view, and
//!   only before the node's next boundary (later, they are dropped). So when anyone applies
//!   round `n`'s grants, every member has taken its snapshot of round `n`, and every charge
//!   is its round-`n` snapshot plus at most its round-`n` grant: the sum stays within
//!   `C`.
//! - A member leaving the view (crash, restart as a new generation, cut off) takes its
//!   charge out of the sums. A node whose view loses a member, or that finds three or more
//!   boundaries due at once (it was stopped, and members may have come and gone unseen),
//!   therefore grants nothing more in any slot up to the one after its next round's
//!   boundary: a member could only have been granted room in slots up to that one. Those
//!   slots are served from what each node holds; later slots start from zero charge
//!   everywhere. The highest freeze of every member is in a round's totals, and every node
//!   takes it up before granting.
//! - Except when the member left on purpose ([`Tree::leave`]): it gave back all it held
//!   and handed its admissions to a *carrier*, which reports them as its own from a round
//!   named in the handoff. A member that loses it while the carrier is in its view, and
//!   whose new view's rounds are all from that round on, has nothing uncounted to freeze
//!   for ([`Tree::handed_off`]).
//! - A starting node freezes the same slots for itself (its previous incarnation may hold
//!   room there) until its first complete round, whose totals carry the freeze of every
//!   member that saw that incarnation leave. A member that saw it and left before that
//!   round left this node's view too, which froze them here. If no member in the round saw
//!   it (the whole cluster started or restarted, or those that did are cut off: `split`'s
//!   sides), the slots open then start afresh, as a standalone node's do when it restarts;
//!   [`TreeStats::vouched`] says which it was.
//! - Across a partition, each side's view holds its own members and each allots the whole
//!   limit in slots after its freeze: at most `sides × C` per slot, the bound of
//!   `on_partition = "split"` (design §5). When the sides merge, the totals include both
//!   sides' charges and nothing more is granted until the room is free again.
//!
//! - *Bases.* Every member claims `⌊C'/n⌋` of every key in each slot its boundary is the
//!   first to touch (`C'` the limit less the escrow margin, `n` its view's members) and
//!   reports the claim per (rule, slot) in every round's sums; the free room is the limit
//!   less admitted, held and the claims not in any reporter's counts. A claim is spent (a
//!   check takes it into the key's slot, [`Slot::take_base`]) only once a complete round
//!   shows every member in its view since the claim's round ([`Tree::confirm`]): every round
//!   that could grant in the slot then counted it. So a key's first check at any member is
//!   admitted at once in a based slot. See design §11.1.
//!
//! The view's hash covers the rules (name, limit, period), so nodes configured differently
//! never complete a round together. Sums larger than a frame go in parts.
//!
//! What the full mesh has that this does not (yet): sliding windows and buckets, starters
//! (a key's first check at a node waits for a round's grant in a slot it has no confirmed
//! base in), ghosts of crashed members (a crash freezes the open slots until they end),
//! `hold` across partitions, and counts readable by every node (a node sees totals only for
//! keys it reported).
//! A node runs it with `[cluster] exchange = "tree"` (`Engine::clustered_tree`, and the
//! round task of `cluster::node`); the simulation (`tree::sim`, `gossamer sim --tree`) runs
//! it on virtual time.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use crate::cluster::global::{ESCROW_MARGIN, MAX_PARTS, Output, PART_BYTES, Reject, split_by};
use crate::counter::{Actor, StableHasher};
use crate::limiter::{Algorithm, Decision, Limit, MILLISECOND, Nanos, Verdict};
use crate::store::{Full, Store, Visit};
use crate::wire::{Message, TreeBase, TreeEntry, TreeSums};

pub mod sim;
#[cfg(test)]
mod tests;

/// The default fan-out: each node has up to this many children.
pub const DEFAULT_FANOUT: usize = 8;
/// The default time a node waits for its children per level below it, from the boundary.
pub const DEFAULT_HOP: Nanos = 10 * MILLISECOND;
/// A key's totals go down to members that hold a base of it they did not report when what the
/// reporting members hold and the free room would not last its demand for this many rounds:
/// they take their base and give back what their target does not keep, so room moves to
/// where it is spent.
const PRESS_ROUNDS: u64 = 4;

/// How the tree runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeParams {
    /// The round length.
    pub round: Nanos,
    /// Children per node.
    pub fanout: usize,
    /// How long a node waits for its children, per level of its subtree, after its boundary.
    pub hop: Nanos,
    /// Keys this node tracks at most, across rules: a new key past it is refused
    /// ([`Full`]), as the store's `max_keys` refuses one.
    pub max_keys: usize,
}

impl Default for TreeParams {
    fn default() -> TreeParams {
        TreeParams {
            round: crate::cluster::global::DEFAULT_ROUND,
            fanout: DEFAULT_FANOUT,
            hop: DEFAULT_HOP,
            max_keys: usize::MAX,
        }
    }
}

/// A rule the tree cannot run.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TreeError {
    /// Only fixed windows (one limit per rule) run over the tree so far.
    #[error("rule {0}: the tree exchange runs single fixed-window limits only")]
    Unsupported(String),
    /// The fan-out must be at least 2.
    #[error("fan-out {0}: must be at least 2")]
    Fanout(usize),
}

/// Sums by (rule, key, slot). A hash map (with a fixed seed: its order is the same on every
/// run, and no decision depends on it): built from a boundary's visit of every key, an
/// ordered map spent most of a boundary comparing keys.
type Entries = hashbrown::HashMap<EntryKey, Sums, foldhash::fast::FixedState>;

/// (rule, key, slot): what an entry of the sums is about.
pub type EntryKey = (String, String, u64);

/// One (rule, key, slot)'s sums.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Sums {
    admitted: u64,
    held: u64,
    demand: u64,
    raw: u64,
    /// On the way down: the raw grants of the members before this subtree, in the tree's
    /// pre-order (see [`Tree::down`]). Not summed.
    offset: u64,
    /// The bases the reporting members took into `admitted` and `held` ([`Slot::based`]).
    based: u64,
}

impl Sums {
    fn add(&mut self, o: &Sums) {
        self.admitted = self.admitted.saturating_add(o.admitted);
        self.held = self.held.saturating_add(o.held);
        self.demand = self.demand.saturating_add(o.demand);
        self.raw = self.raw.saturating_add(o.raw);
        self.based = self.based.saturating_add(o.based);
    }
}

/// A subtree's (or the view's) sums for one round.
#[derive(Clone, Debug, Default)]
struct Agg {
    /// Members included.
    members: u64,
    /// The highest `frozen_through` among them.
    freeze: u64,
    /// The earliest round since which one of them has applied complete rounds without a
    /// gap (`u64::MAX`: none); see [`Tree::vouch_bound`].
    vouch: u64,
    /// The latest round from which one of them has held its view ([`Tree::view_since`]).
    since: u64,
    /// Per (rule, slot), the bases they claim ([`Claim`]).
    bases: BTreeMap<(String, u64), u64>,
    entries: Entries,
}

impl Agg {
    /// The bases of `e`'s slot held by members that did not report `e`: claimed, and not
    /// in the entry's `admitted` and `held`.
    fn unreported(&self, e: &EntryKey, s: Option<&Sums>) -> u64 {
        // A few (rule, slot)s at most: a scan, with no key to build per entry.
        let claimed = self
            .bases
            .iter()
            .find(|((rule, x), _)| *rule == e.0 && *x == e.2)
            .map_or(0, |(_, &units)| units);
        claimed.saturating_sub(s.map_or(0, |s| s.based))
    }
}

/// This node's base in one (rule, slot): `⌊C'/n⌋` of every key there (C' the limit less the
/// escrow margin, n the view's members), held without a grant and reported once per (rule,
/// slot), not per key. See [`Tree::claim`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Claim {
    /// Units of each key (0: none, or given up).
    units: u64,
    /// The round whose boundary claimed it: the first that could grant in the slot.
    from: u64,
    /// A complete round showed every member in this view since `from`: every round that
    /// could grant in the slot counted the claim, so it may be spent.
    confirmed: bool,
}

/// One slot of one key at this node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Slot {
    admitted: u64,
    /// Leased and not yet spent.
    held: u64,
    /// `admitted` at the last boundary (what the sums reported): admissions since are this
    /// node's own news, added to the last totals for `remaining`.
    reported: u64,
    /// Units a leaving member handed to this node ([`Tree::leave`]), added to `admitted`
    /// (and `reported`) at the boundary of round `pending_from`: the leaving member reports
    /// them in its sums before that round, this node from it on.
    pending: u64,
    /// The round from which `pending` is this node's to report.
    pending_from: u64,
    /// The base this node took into `held` here (0: none): from then on it is reported with
    /// the key, and never taken again in the slot, so the slot is kept until it ends.
    based: u64,
}

impl Slot {
    /// Nothing admitted, held, carried or based here: the slot need not be kept.
    fn is_empty(&self) -> bool {
        self.admitted == 0 && self.held == 0 && self.pending == 0 && self.based == 0
    }

    /// Takes this node's base of the slot into `held`, if it has one and has not yet.
    fn take_base(&mut self, base: u64) {
        if self.based == 0 && base > 0 {
            self.held += base;
            self.based = base;
        }
    }
}

/// One key at this node.
#[derive(Clone, Debug, Default)]
struct KeyState {
    slots: BTreeMap<u64, Slot>,
    /// Cost units asked for since the last boundary.
    arrivals: u64,
    /// Demand: arrivals per round in sixteenths of a unit, decaying ([`decay`]).
    demand: u64,
    /// The last complete round's totals: the view's demand, and per slot what was admitted.
    total_demand: u64,
    /// The round those totals are of.
    totals_round: Option<u64>,
    admitted_in: BTreeMap<u64, u64>,
}

impl KeyState {
    /// Keeps round `n`'s totals `t` of slot `x`: the view's demand and what was admitted.
    fn take_totals(&mut self, n: u64, x: u64, t: &Sums) {
        self.total_demand = t.demand;
        self.totals_round = Some(n);
        self.admitted_in.insert(x, t.admitted);
    }

    /// Nothing held, admitted or asked for: the key need not be kept.
    fn is_empty(&self) -> bool {
        self.slots.is_empty() && self.demand == 0 && self.arrivals == 0
    }
}

/// A round in progress at this node: from its boundary until its next one.
#[derive(Debug)]
struct RoundBuf {
    parent: Option<Actor>,
    children: Vec<Actor>,
    /// The boundary plus `hop` per level below this node: send up, complete or not.
    deadline: Nanos,
    /// This node's own contribution, raw grants included.
    own: Entries,
    /// This node's claims at the boundary, per (rule, slot) ([`Claim`]).
    bases: BTreeMap<(String, u64), u64>,
    /// Each child's subtree sums, by child node id.
    from_children: BTreeMap<String, Agg>,
    /// Parts of a child's sums (by child node id), or of the totals, until all are in.
    up_parts: BTreeMap<String, Vec<Option<TreeSums>>>,
    down_parts: Vec<Option<TreeSums>>,
    sent_up: bool,
    done: bool,
}

/// What the tree did, for tests and the simulation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TreeStats {
    /// Rounds whose totals included every member, applied here.
    pub complete_rounds: u64,
    /// Rounds whose totals arrived short of members (a child missed its deadline).
    pub short_rounds: u64,
    /// Messages for a round this node was not in, or from a node that is not its parent or
    /// child in it (late, another view, or never sent to it).
    pub ignored: u64,
    /// Units granted to this node.
    pub granted: u64,
    /// Units given back at boundaries (held above the target).
    pub released: u64,
    /// Sums not sent: more than [`MAX_PARTS`] parts.
    pub oversized: u64,
    /// Ticks that found three or more boundaries due (the node was stopped): each froze the
    /// open slots.
    pub gaps: u64,
    /// Leaving members whose admissions this node took over ([`Message::TreeHandoff`]).
    pub taken: u64,
    /// Members that left the view with their admissions carried by a member still in it: no
    /// freeze.
    pub left_carried: u64,
    /// Whether the complete round that lifted this node's start freeze showed a member that
    /// saw every round that could have granted its previous incarnation room
    /// ([`Tree::vouch_bound`]). False once lifted: nobody in it saw those rounds (the cluster
    /// started or restarted whole, or those that did are cut off), and the slots open at the
    /// start began afresh.
    pub vouched: bool,
}

/// A leaving node's handoff ([`Tree::leave`]).
#[derive(Debug)]
struct Leaving {
    /// The member asked to carry this node's admissions.
    carrier: Actor,
    /// From this round's boundary the carrier reports them, and this node no longer does
    /// (once it knows the carrier took them).
    from: u64,
    /// This node's admissions per (rule, key, slot) when it left: what it hands over.
    entries: Vec<TreeEntry>,
    /// The carrier said it took them.
    carried: bool,
    /// When the handoff was last sent (it is sent again each round until answered).
    sent_at: Nanos,
}

/// One node's side of the aggregation tree. See the module docs.
#[derive(Debug)]
pub struct Tree {
    me: Actor,
    params: TreeParams,
    /// The rules and their keys, shared with the checks.
    keys: Arc<TreeKeys>,
    /// The view: members in order, this node included when it is a member.
    members: Vec<Actor>,
    view: u64,
    /// No grant in any slot that a round up to this one could have granted room in (a
    /// member left without handing its admissions to another, or this node was stopped for
    /// rounds); the highest of every member's is in a round's totals, and every node takes
    /// it up from there.
    frozen_through: u64,
    /// The start freeze: no grant in any slot a round up to this one could have granted
    /// room in, since this node's previous incarnation, if any, may hold room there. Its own
    /// (not in the sums), and lifted (0) by this node's first complete round, whose totals
    /// carry the freeze of every member that saw that incarnation leave (module docs).
    start_freeze: u64,
    /// A member vouches for this node's start if it has applied complete rounds without a
    /// gap since this round or earlier: the first round that could grant room in the
    /// slot of the longest rule that was open when this node started ([`Tree::vouch_bound`]).
    vouch_bound: u64,
    /// The first complete round this node applied since it started or was stopped.
    since: Option<u64>,
    /// Set by [`Tree::leave`].
    leaving: Option<Leaving>,
    /// Members whose handoffs this node took, with the round they were carried from: a
    /// handoff sent again is answered again, not added twice.
    carrying: BTreeMap<Actor, u64>,
    /// Parts of a handoff (by sender node id), until all are in.
    handoff_parts: BTreeMap<String, Vec<Option<TreeSums>>>,
    /// Members that handed their admissions to a carrier before leaving, with the carrier
    /// and the round from which it reports them ([`Tree::handed_off`]).
    handoffs: BTreeMap<Actor, (Actor, u64)>,
    rounds: BTreeMap<u64, RoundBuf>,
    /// Messages for the next round, which arrived before this node's boundary (its clock
    /// behind the sender's): at most `fanout + 1`.
    early: Vec<(String, Message)>,
    /// The next boundary to take.
    next_round: u64,
    /// This node's bases per (rule, slot), claimed at the boundary of the first round that
    /// could grant in the slot ([`Tree::claim`]).
    claims: BTreeMap<(String, u64), Claim>,
    /// The first round of this node's current view.
    view_since: u64,
    stats: TreeStats,
}

/// The tree's rules and the keys it tracks, shared between the checks (which need no lock
/// but a key's shard's) and the [`Tree`] that runs the rounds (behind its own lock): a
/// boundary visits the keys 16 at a time under a shard's lock, so a check waits for a few
/// keys' work, not a boundary's.
#[derive(Debug)]
pub struct TreeKeys {
    rules: BTreeMap<String, TreeRule>,
    round: Nanos,
    fanout: usize,
    hop: Nanos,
    /// The tree's next boundary to take, its view's size and its complete rounds, as the
    /// [`Tree`] last set them.
    next_round: AtomicU64,
    members: AtomicUsize,
    complete_rounds: AtomicU64,
    /// One past the last complete round applied (0 before any): a check held for the grants
    /// of round `n` is let go once this passes `n` ([`TreeKeys::granted_through`]).
    applied_through: AtomicU64,
    /// The tree's `frozen_through`: a check denied in a slot frozen by a member leaving is
    /// told to retry at the slot's end, not after the next round (no grant comes there).
    /// Not the start freeze, which the first complete round lifts before it grants.
    frozen_through: AtomicU64,
}

#[derive(Debug)]
struct TreeRule {
    limit: Limit,
    keys: Store<KeyState>,
    /// This node's confirmed bases, (slot, units): what a check takes into a slot of a key
    /// that has not taken it yet ([`Slot::take_base`]).
    bases: RwLock<Vec<(u64, u64)>>,
}

impl TreeRule {
    /// This node's confirmed base in `slot`, 0 if none.
    fn base(&self, slot: u64) -> u64 {
        let bases = self.bases.read().unwrap_or_else(|p| p.into_inner());
        bases
            .iter()
            .find(|&&(x, _)| x == slot)
            .map_or(0, |&(_, units)| units)
    }
}

impl TreeKeys {
    /// Checks `cost` units of `key` under `rule` at `now`, charged if admitted: admitted
    /// from the room this node holds in the current slot; `Never` for a cost above the
    /// limit. The `remaining` it reports is the limit less the last totals this node
    /// received for the slot and its own admissions since its last boundary (an estimate:
    /// other members' admissions since are not known here). A denial with room left is
    /// retried after the next round's grant ([`TreeKeys::grant_wait`]); one without, at the
    /// slot's end. `Err(Full)`: a new key, with [`TreeParams::max_keys`] tracked already.
    /// `None`: no such rule.
    pub fn decide(
        &self,
        rule: &str,
        key: &str,
        cost: u64,
        now: Nanos,
    ) -> Option<Result<Decision, Full>> {
        let r = self.rules.get(rule)?;
        let limit = r.limit;
        let decided = r
            .keys
            .update(key, now, KeyState::default, KeyState::is_empty, |k| {
                let slot = now / limit.period();
                let s = k.slots.entry(slot).or_default();
                if s.based == 0 {
                    s.take_base(r.base(slot));
                }
                let mut decision =
                    decision(&limit, k.admitted_in.get(&slot).copied(), s, cost, now);
                match decision.verdict {
                    Verdict::Never => {}
                    Verdict::Admit { .. } => {
                        s.held -= cost;
                        s.admitted += cost;
                        k.arrivals = k.arrivals.saturating_add(cost);
                    }
                    Verdict::Deny {
                        ref mut retry_after,
                    } => {
                        if decision.remaining >= cost
                            && let Some(wait) = self.grant_wait_in(&limit, now)
                        {
                            *retry_after = wait.min(*retry_after);
                        }
                        k.arrivals = k.arrivals.saturating_add(cost);
                    }
                }
                if s.is_empty() {
                    k.slots.remove(&slot);
                }
                decision
            });
        Some(decided)
    }

    /// What a check of cost 1 of `key` would get at `now`, charging and storing nothing.
    /// `None`: no such rule.
    pub fn status(&self, rule: &str, key: &str, now: Nanos) -> Option<Decision> {
        let r = self.rules.get(rule)?;
        let slot = now / r.limit.period();
        let (s, total) = r.keys.read(key, |k| {
            let mut s = k
                .and_then(|k| k.slots.get(&slot))
                .copied()
                .unwrap_or_default();
            if s.based == 0 {
                s.take_base(r.base(slot));
            }
            (s, k.and_then(|k| k.admitted_in.get(&slot).copied()))
        });
        let mut d = decision(&r.limit, total, &s, 1, now);
        let room = d.remaining >= 1;
        match &mut d.verdict {
            Verdict::Admit { .. } => d.remaining += 1,
            Verdict::Deny { retry_after } if room => {
                if let Some(wait) = self.grant_wait_in(&r.limit, now) {
                    *retry_after = wait.min(*retry_after);
                }
            }
            _ => {}
        }
        Some(d)
    }

    /// How long from `now` until the next round's grants should be in: the next boundary,
    /// plus a hop per level of the tree up and down (the sums reach the root and come back).
    pub fn grant_wait(&self, now: Nanos) -> Nanos {
        let boundary = self.next_round.load(Ordering::Relaxed) * self.round;
        let members = self.members.load(Ordering::Relaxed);
        let mut levels = 0;
        let mut c = 1;
        while c < members {
            levels += 1;
            c = self.fanout * c + 1;
        }
        boundary.saturating_sub(now) + (2 * levels + 1) * self.hop
    }

    /// [`TreeKeys::grant_wait`] for a slot of `limit` that a grant can still come in: `None`
    /// if the slot holding `now` is frozen (a member left, or this node was stopped, since
    /// its rounds could grant there), so only what is held is spent there until it ends. A
    /// starting node's own freeze does not count: its first complete round lifts it, and
    /// grants.
    fn grant_wait_in(&self, limit: &Limit, now: Nanos) -> Option<Nanos> {
        let through = self.frozen_through.load(Ordering::Relaxed);
        let slot = now / limit.period();
        (!frozen(through, self.round, slot, limit.period())).then(|| self.grant_wait(now))
    }

    /// The longest [`TreeKeys::grant_wait`]: a round and the hops.
    pub fn longest_grant_wait(&self) -> Nanos {
        let next = self.next_round.load(Ordering::Relaxed);
        self.grant_wait(next.saturating_sub(1) * self.round)
    }

    /// Keys of `rule` this node tracks.
    pub fn rule_keys(&self, rule: &str) -> usize {
        self.rules.get(rule).map_or(0, |r| r.keys.len())
    }

    /// Rounds whose totals included every member of the view, applied here.
    pub fn complete_rounds(&self) -> u64 {
        self.complete_rounds.load(Ordering::Relaxed)
    }

    /// The round whose boundary takes up a check decided now: its grants are the first
    /// that can carry room for a key new at this node.
    pub fn next_boundary(&self) -> u64 {
        self.next_round.load(Ordering::Relaxed)
    }

    /// Whether the grants of every round up to `n` that completed have been applied: one
    /// past the last complete round applied is beyond `n`.
    pub fn granted_through(&self, n: u64) -> bool {
        self.applied_through.load(Ordering::Relaxed) > n
    }
}

impl Tree {
    /// A node starting at `now` with these rules (fixed windows only). It grants itself
    /// nothing in slots up to the one after its first boundary (its previous incarnation,
    /// if any, may hold room there that nobody counts any more).
    pub fn new(
        me: Actor,
        rules: Vec<(String, Limit)>,
        params: TreeParams,
        now: Nanos,
    ) -> Result<Tree, TreeError> {
        if params.fanout < 2 {
            return Err(TreeError::Fanout(params.fanout));
        }
        let mut by_name = BTreeMap::new();
        // One budget of `max_keys` across the rules.
        let budget = Arc::new(AtomicUsize::new(0));
        for (name, limit) in rules {
            if limit.algorithm() != Algorithm::FixedWindow {
                return Err(TreeError::Unsupported(name));
            }
            let keys = Store::new(budget.clone(), params.max_keys);
            let bases = RwLock::new(Vec::new());
            by_name.insert(name, TreeRule { limit, keys, bases });
        }
        let next_round = now / params.round + 1;
        let keys = Arc::new(TreeKeys {
            rules: by_name,
            round: params.round,
            fanout: params.fanout,
            hop: params.hop,
            next_round: AtomicU64::new(next_round),
            members: AtomicUsize::new(0),
            complete_rounds: AtomicU64::new(0),
            applied_through: AtomicU64::new(0),
            frozen_through: AtomicU64::new(0),
        });
        // The slot of the longest rule open now: rounds from one before it starts could
        // have granted the previous incarnation room there.
        let longest = keys
            .rules
            .values()
            .map(|r| r.limit.period())
            .max()
            .unwrap_or(1);
        let vouch_bound = ((now / longest) * longest / params.round).saturating_sub(1);
        let tree = Tree {
            me,
            params,
            keys,
            members: Vec::new(),
            view: 0,
            frozen_through: 0,
            start_freeze: next_round,
            vouch_bound,
            since: None,
            leaving: None,
            carrying: BTreeMap::new(),
            handoff_parts: BTreeMap::new(),
            handoffs: BTreeMap::new(),
            rounds: BTreeMap::new(),
            early: Vec::new(),
            next_round,
            claims: BTreeMap::new(),
            view_since: next_round,
            stats: TreeStats::default(),
        };
        Ok(tree)
    }

    /// Whether this node's start freeze still holds ([`Tree::vouch_bound`]).
    pub fn start_frozen(&self) -> bool {
        self.start_freeze > 0
    }

    /// How the tree runs.
    pub fn params(&self) -> &TreeParams {
        &self.params
    }

    /// What the tree did so far.
    pub fn stats(&self) -> &TreeStats {
        &self.stats
    }

    /// The rules and keys, for checks that need no lock of the tree's.
    pub fn keys(&self) -> Arc<TreeKeys> {
        self.keys.clone()
    }

    /// The view's hash (0 before the first view).
    pub fn view(&self) -> u64 {
        self.view
    }

    /// Freezes the slots a round up to `through` could grant room in (if not already).
    fn freeze(&mut self, through: u64) {
        self.frozen_through = self.frozen_through.max(through);
        self.publish_freeze();
    }

    /// This node's freeze, its start freeze included: no grant in a slot a round up to it
    /// could grant room in.
    fn frozen_until(&self) -> u64 {
        self.frozen_through.max(self.start_freeze)
    }

    fn publish_freeze(&self) {
        self.keys
            .frozen_through
            .store(self.frozen_through, Ordering::Relaxed);
    }

    /// Whether `x` is a slot that a round up to this node's freeze could have granted room
    /// in, for a limit of slots `len` long.
    fn frozen(&self, x: u64, len: Nanos) -> bool {
        frozen(self.frozen_until(), self.params.round, x, len)
    }

    /// The first round that could have granted room in the slot (of this node's longest
    /// rule) that was open when it started. A member that has applied complete rounds
    /// without a gap since this round or earlier *vouches* for this node's start: it saw
    /// every member that could hold room there, and each one that left since froze it,
    /// unless it handed its admissions to a member still in the view. When the first
    /// complete round's totals show no such member, nobody in it saw the rounds before this
    /// node started (the whole cluster started or restarted, or those that did are cut off):
    /// the open slots start afresh ([`TreeStats::vouched`] false).
    pub fn vouch_bound(&self) -> u64 {
        self.vouch_bound
    }

    /// Member `left` handed its admissions to `carrier`, which reports them from round
    /// `from` on (the leaving marker of [`Tree::leave`]'s caller). When `left` leaves the
    /// view, it freezes nothing if `carrier` is still in it and the new view's first round
    /// is `from` or later.
    pub fn handed_off(&mut self, left: Actor, carrier: Actor, from: u64) {
        if left != self.me {
            self.handoffs.insert(left, (carrier, from));
        }
    }

    /// The members the membership layer holds alive now (this node among them, or it takes
    /// part in no round). A member missing since the last view freezes the open slots.
    /// Returns the members lost (none if the view did not change).
    pub fn set_members(&mut self, members: &[Actor], now: Nanos) -> Vec<Actor> {
        let mut members = members.to_vec();
        members.sort();
        members.dedup();
        if members == self.members {
            return Vec::new();
        }
        let lost: Vec<Actor> = self
            .members
            .iter()
            .filter(|m| !members.contains(m))
            .cloned()
            .collect();
        // The new view's rounds start at the next boundary.
        let next = now / self.params.round + 1;
        let uncarried = lost.iter().any(|m| {
            // A member that handed its admissions to one still in the view left nothing
            // uncounted (it gave back all it held, and admits nothing more), if the carrier
            // reports them in every round of the new view.
            !self
                .handoffs
                .get(m)
                .is_some_and(|(carrier, from)| members.contains(carrier) && next >= *from)
        });
        if uncarried {
            // Rounds before the next boundary may still have granted the lost member room
            // in slots up to the one after that boundary.
            self.freeze(next);
        } else if !lost.is_empty() {
            self.stats.left_carried += lost.len() as u64;
        }
        self.handoffs.retain(|m, _| members.contains(m));
        self.handoff_parts
            .retain(|node, _| members.iter().any(|m| m.node == *node));
        // The rules are in the hash too: nodes whose limits differ (a rolling change of the
        // config) never complete a round together, since each would scale the same totals
        // against its own limit.
        let mut h = StableHasher::new();
        for m in &members {
            h.str(&m.node);
            h.u64(m.generation);
        }
        for (name, TreeRule { limit, .. }) in &self.keys.rules {
            h.str(name);
            h.u64(limit.limit());
            h.u64(limit.period());
        }
        self.view = h.finish();
        self.view_since = next;
        self.keys.members.store(members.len(), Ordering::Relaxed);
        self.members = members;
        // Rounds of the old view can no longer complete here.
        self.rounds.clear();
        self.early.clear();
        lost
    }

    /// Checks `cost` units of `key` under `rule` at `now` ([`TreeKeys::decide`]): admitted
    /// from the room this node holds in the current slot, or denied. `None`: no such rule.
    pub fn check(&self, rule: &str, key: &str, cost: u64, now: Nanos) -> Option<bool> {
        Some(
            self.keys
                .decide(rule, key, cost, now)?
                .is_ok_and(|d| d.allowed()),
        )
    }

    /// The view's members.
    pub fn members(&self) -> &[Actor] {
        &self.members
    }

    /// The admitted total of `key` in `slot` in the last complete round's totals this node
    /// received (only for keys it reported).
    pub fn known_total(&self, rule: &str, key: &str, slot: u64) -> Option<u64> {
        let r = self.keys.rules.get(rule)?;
        r.keys
            .read(key, |k| k.and_then(|k| k.admitted_in.get(&slot).copied()))
    }

    /// When [`tick`](Tree::tick) next has something to do.
    pub fn next_tick(&self) -> Nanos {
        let boundary = self.next_round * self.params.round;
        self.rounds
            .values()
            .filter(|r| !r.sent_up)
            .map(|r| r.deadline)
            .fold(boundary, Nanos::min)
    }

    /// Takes every boundary due by `now` and sends up what is past its deadline.
    pub fn tick(&mut self, now: Nanos) -> Vec<Output> {
        let mut out = Vec::new();
        if let Some(l) = self.leaving.as_mut()
            && !l.carried
            && now >= l.sent_at + self.params.round
        {
            l.sent_at = now;
            out.extend(self.send_handoff());
        }
        let current = now / self.params.round;
        if current >= self.next_round + 2 {
            // Three or more boundaries due at once: this node was stopped (paused) for
            // rounds, long enough for members to have come and gone without its seeing it,
            // and a view that looks unchanged may hide a member that held room since.
            // Freeze as a start does, and take only the current boundary.
            self.freeze(current + 1);
            self.stats.gaps += 1;
            // Nor does it vouch for anyone's start until it applies complete rounds again.
            self.since = None;
            self.rounds.clear();
            self.early.clear();
            self.next_round = current;
            self.keys.next_round.store(current, Ordering::Relaxed);
        }
        while self.next_round * self.params.round <= now {
            let n = self.next_round;
            self.next_round += 1;
            self.keys
                .next_round
                .store(self.next_round, Ordering::Relaxed);
            self.boundary(n, &mut out);
            for (from, message) in std::mem::take(&mut self.early) {
                // Only messages of this round were kept; others are counted as ignored.
                if let Ok(o) = self.receive(&from, message) {
                    out.extend(o);
                }
            }
        }
        let due: Vec<u64> = self
            .rounds
            .iter()
            .filter(|(_, r)| !r.sent_up && r.deadline <= now)
            .map(|(&n, _)| n)
            .collect();
        for n in due {
            self.send_up(n, &mut out);
        }
        out
    }

    /// Position `p`'s children and the levels below it, in a tree of `len` members.
    fn shape(&self, p: usize, len: usize) -> (Vec<usize>, u64) {
        let b = self.params.fanout;
        let children = (b * p + 1..=b * p + b).filter(|&c| c < len).collect();
        let mut levels = 0;
        let mut c = b * p + 1;
        while c < len {
            levels += 1;
            c = b * c + 1;
        }
        (children, levels)
    }

    fn boundary(&mut self, n: u64, out: &mut Vec<Output>) {
        // Grants of earlier rounds not applied by now are dropped (see the module docs).
        self.rounds.retain(|&r, _| r >= n);
        // A handoff's answer is sent again only while its sender may still be waiting.
        self.carrying.retain(|_, r| *r + 8 > n);
        let start = n * self.params.round;
        let next_start = start + self.params.round;
        // A start freeze whose slots have all ended has nothing left to hold.
        let longest = self.keys.rules.values().map(|r| r.limit.period()).max();
        if self.start_freeze > 0
            && longest
                .is_none_or(|len| !frozen(self.start_freeze, self.params.round, start / len, len))
        {
            self.start_freeze = 0;
        }
        self.claim(n);
        let mut own = Entries::default();
        // Asks go up in slots under the start freeze too: the first complete round lifts it
        // before it grants (a freeze in its totals still stops the grant).
        let (frozen_through, round) = (self.frozen_through, self.params.round);
        let members = self.members.len().max(1) as u64;
        let mut released = 0;
        let keys = self.keys.clone();
        // A leaving node gives back all it holds and asks for nothing; once its carrier
        // took its admissions, from the handoff's round on it reports none either.
        let leaving = self.leaving.as_ref().map(|l| l.carried && n >= l.from);
        for (rule, r) in &keys.rules {
            let (c, len) = (r.limit.limit(), r.limit.period());
            r.keys.visit_all(|key, k| {
                let (cur, next) = (start / len, next_start / len);
                k.demand = decay(k.demand, std::mem::take(&mut k.arrivals));
                if leaving.is_some() {
                    k.demand = 0;
                }
                k.slots.retain(|&s, _| s >= cur);
                k.admitted_in.retain(|&s, _| s >= cur);
                for s in k.slots.values_mut() {
                    // A leaving member's admissions, reported here from the handoff's round.
                    if s.pending > 0 && n >= s.pending_from {
                        s.admitted += s.pending;
                        s.pending = 0;
                    }
                }
                for x in if next == cur { cur..=cur } else { cur..=next } {
                    let s = k.slots.entry(x).or_default();
                    // The key's count as far as this node knows: the last totals, and its own
                    // admissions since.
                    let known = k.admitted_in.get(&x).copied().unwrap_or(0)
                        + s.admitted.saturating_sub(s.reported);
                    s.reported = s.admitted;
                    if leaving == Some(true) {
                        continue;
                    }
                    // The target: the room left, by this node's share of the demand.
                    // Without the last round's totals (this node did not report the key then),
                    // an even split. Rounded up, so every node with demand may hold a unit: the
                    // grants are scaled to the free room whatever the targets sum to.
                    let room = c.saturating_sub(k.admitted_in.get(&x).copied().unwrap_or(0));
                    let (share, total) = if k.totals_round == Some(n - 1) {
                        (k.demand, k.total_demand.max(k.demand).max(1))
                    } else {
                        (u64::from(k.demand > 0), members)
                    };
                    let target = if leaving.is_some() {
                        0
                    } else {
                        (u128::from(room) * u128::from(share)).div_ceil(u128::from(total)) as u64
                    };
                    // A node that took its base keeps its share of the room below the margin
                    // (the escrow) whatever its demand, so a quiet key stays served at once;
                    // near the limit the escrow shrinks to nothing and room follows demand.
                    // The count is taken as it will be two rounds on at the key's demand
                    // (a 256th of the totals' per round, see [`decay`]): what this node gives
                    // back now reaches the demand a round later, so a busy key's escrow
                    // shrinks ahead of its count instead of a round behind at every step.
                    let target = if s.based > 0 && leaving.is_none() {
                        let ahead = known.saturating_add(2 * k.total_demand.div_ceil(256));
                        let escrow = c.saturating_sub(c / ESCROW_MARGIN).saturating_sub(ahead);
                        target.max(escrow / members)
                    } else {
                        target
                    };
                    // A slot frozen by a member leaving is served from what is held: nothing is
                    // asked for there, and nothing given back (nobody could be granted it).
                    let frozen = frozen(frozen_through, round, x, len);
                    if s.held > target && !frozen {
                        released += s.held - target;
                        s.held = target;
                    }
                    let raw = if frozen {
                        0
                    } else {
                        target.saturating_sub(s.held)
                    };
                    if s.admitted > 0 || s.held > 0 || k.demand > 0 || s.based > 0 {
                        own.insert(
                            (rule.clone(), key.to_owned(), x),
                            Sums {
                                admitted: s.admitted,
                                held: s.held,
                                demand: k.demand,
                                raw,
                                offset: 0,
                                based: s.based,
                            },
                        );
                    }
                }
                k.slots.retain(|_, s| !s.is_empty());
                if k.is_empty() {
                    Visit::Drop
                } else {
                    Visit::Unlist
                }
            });
        }
        self.stats.released += released;
        let len = self.members.len();
        let Some(i) = self.members.iter().position(|m| *m == self.me) else {
            return;
        };
        // Rotated by round, so the root (position 0) moves from member to member.
        let p = (i + len - (n % len as u64) as usize) % len;
        let member = |q: usize| self.members[(q + (n % len as u64) as usize) % len].clone();
        let (children, levels) = self.shape(p, len);
        let parent = (p > 0).then(|| member((p - 1) / self.params.fanout));
        let children: Vec<Actor> = children.into_iter().map(member).collect();
        self.rounds.insert(
            n,
            RoundBuf {
                parent,
                deadline: start + levels * self.params.hop,
                children,
                own,
                bases: self.claimed(),
                from_children: BTreeMap::new(),
                up_parts: BTreeMap::new(),
                down_parts: Vec::new(),
                sent_up: false,
                done: false,
            },
        );
        if self.rounds[&n].children.is_empty() {
            self.send_up(n, out);
        }
    }

    /// Sends round `n`'s subtree sums to the parent, or, at the root, the totals down.
    fn send_up(&mut self, n: u64, out: &mut Vec<Output>) {
        let Some(r) = self.rounds.get_mut(&n) else {
            return;
        };
        if r.sent_up {
            return;
        }
        r.sent_up = true;
        let mut sums = Agg {
            members: 1,
            freeze: self.frozen_through,
            vouch: self.since.unwrap_or(u64::MAX),
            since: self.view_since,
            bases: r.bases.clone(),
            entries: r.own.clone(),
        };
        for child in r.from_children.values() {
            sums.members += child.members;
            sums.freeze = sums.freeze.max(child.freeze);
            sums.vouch = sums.vouch.min(child.vouch);
            sums.since = sums.since.max(child.since);
            for (b, units) in &child.bases {
                let sum = sums.bases.entry(b.clone()).or_default();
                *sum = sum.saturating_add(*units);
            }
            for (e, s) in &child.entries {
                sums.entries.entry(e.clone()).or_default().add(s);
            }
        }
        match r.parent.clone() {
            Some(parent) => {
                for part in self.encode(n, &sums) {
                    out.push(Output::To(parent.node.clone(), Message::TreeUp(part)));
                }
            }
            None => self.down(n, &sums, out),
        }
    }

    /// `sums` as messages of at most [`PART_BYTES`] of entries each. None past
    /// [`MAX_PARTS`]: the sums are not sent at all (leaving keys out would make the receiver
    /// count their charge as zero), and the round is short.
    fn encode(&mut self, n: u64, sums: &Agg) -> Vec<TreeSums> {
        let entries: Vec<TreeEntry> = sums
            .entries
            .iter()
            .map(|((rule, key, slot), s)| TreeEntry {
                rule: rule.clone(),
                key: key.clone(),
                slot: *slot,
                admitted: s.admitted,
                held: s.held,
                demand: s.demand,
                raw: s.raw,
                offset: s.offset,
                based: s.based,
            })
            .collect();
        let bases: Vec<TreeBase> = sums
            .bases
            .iter()
            .map(|((rule, slot), &units)| TreeBase {
                rule: rule.clone(),
                slot: *slot,
                units,
            })
            .collect();
        // Two length prefixes and seven varints of at most 10 bytes each, above the strings.
        let chunks = split_by(entries, PART_BYTES, |e| e.rule.len() + e.key.len() + 64);
        let Ok(parts) = u32::try_from(chunks.len()) else {
            self.stats.oversized += 1;
            return Vec::new();
        };
        if parts > MAX_PARTS {
            self.stats.oversized += 1;
            return Vec::new();
        }
        chunks
            .into_iter()
            .enumerate()
            .map(|(part, entries)| TreeSums {
                from: self.me.clone(),
                round: n,
                view: self.view,
                members: sums.members,
                freeze: sums.freeze,
                vouch: sums.vouch,
                since: sums.since,
                bases: bases.clone(),
                part: part as u32,
                parts,
                entries,
            })
            .collect()
    }

    /// Round `n`'s totals reached this node: pass each child the keys its subtree
    /// reported, and those where the asks exceed the free room while members of its subtree
    /// hold a base they did not report (so they take it and give back what their target does
    /// not need); and grant if the totals include every member.
    fn down(&mut self, n: u64, totals: &Agg, out: &mut Vec<Output>) {
        let Some(r) = self.rounds.get(&n) else {
            return;
        };
        let complete = totals.members == self.members.len() as u64;
        let keys = self.keys.clone();
        let free = |e: &EntryKey, t: &Sums| -> Option<u64> {
            let c = keys.rules.get(&e.0)?.limit.limit();
            Some(
                c.saturating_sub(t.admitted)
                    .saturating_sub(t.held)
                    .saturating_sub(totals.unreported(e, Some(t))),
            )
        };
        // Pressed: what the reporting members hold and the free room would not last the key's
        // demand (arrivals per round: a 256th of `demand`, see [`decay`]) for
        // [`PRESS_ROUNDS`] rounds.
        let pressed: Vec<&EntryKey> = if complete {
            totals
                .entries
                .iter()
                .filter(|(e, t)| {
                    totals.unreported(e, Some(t)) > 0
                        && free(e, t).is_some_and(|f| {
                            f.saturating_add(t.held) < PRESS_ROUNDS * t.demand.div_ceil(256)
                        })
                })
                .map(|(e, _)| e)
                .collect()
        } else {
            Vec::new()
        };
        // Each member's raw grants are an interval of the totals' `[0, Σr)` in pre-order
        // (a node's own, then each child's subtree in order): this subtree starts at the
        // entry's offset, a child's after this node's own and its earlier siblings'.
        let mut before: hashbrown::HashMap<&EntryKey, u64, foldhash::fast::FixedState> = r
            .own
            .iter()
            .filter_map(|(e, s)| Some((e, totals.entries.get(e)?.offset.saturating_add(s.raw))))
            .collect();
        let mut messages = Vec::new();
        for child in &r.children {
            let Some(reported) = r.from_children.get(&child.node) else {
                continue;
            };
            let mut entries = Entries::default();
            for (e, sub) in &reported.entries {
                let Some(t) = totals.entries.get(e) else {
                    continue;
                };
                let start = before.entry(e).or_insert(t.offset);
                entries.insert(
                    e.clone(),
                    Sums {
                        offset: *start,
                        ..*t
                    },
                );
                *start = start.saturating_add(sub.raw);
            }
            // Nobody in the child's subtree asked for these, so its offset is of no use.
            for &e in &pressed {
                if !reported.entries.contains_key(e) && reported.unreported(e, None) > 0 {
                    entries.insert(e.clone(), totals.entries[e]);
                }
            }
            let part = Agg {
                members: totals.members,
                freeze: totals.freeze,
                vouch: totals.vouch,
                since: totals.since,
                bases: totals.bases.clone(),
                entries,
            };
            messages.push((child.node.clone(), part));
        }
        drop(before);
        let Some(r) = self.rounds.get_mut(&n) else {
            return;
        };
        r.done = true;
        let own = std::mem::take(&mut r.own);
        for (node, sums) in messages {
            for part in self.encode(n, &sums) {
                out.push(Output::To(node.clone(), Message::TreeDown(part)));
            }
        }
        if !complete {
            self.stats.short_rounds += 1;
            return;
        }
        self.stats.complete_rounds += 1;
        self.keys
            .complete_rounds
            .store(self.stats.complete_rounds, Ordering::Relaxed);
        self.keys.applied_through.store(n + 1, Ordering::Relaxed);
        // Every member's freeze is in the totals: a member that saw another leave (which
        // this node may not have, if it was away) keeps everyone from granting where the
        // one that left may hold room.
        self.freeze(totals.freeze);
        // The first complete round lifts the start freeze: the freeze of every member that
        // saw this node's previous incarnation leave is in `totals.freeze`, taken up above.
        if self.start_freeze > 0 {
            self.start_freeze = 0;
            self.stats.vouched = totals.vouch <= self.vouch_bound;
        }
        self.confirm(n, totals.since);
        self.since.get_or_insert(n);
        if self.leaving.is_some() {
            // It gave back all it held and admits nothing more: no grant.
            return;
        }
        // Pressed keys: this node takes its base of them (if it has one and has not), so its
        // next boundary gives back what its target does not keep.
        for &e in &pressed {
            let (rule, key, x) = e;
            let Some(r) = keys.rules.get(rule) else {
                continue;
            };
            let base = r.base(*x);
            if base == 0 || own.get(e).is_some_and(|s| s.based > 0) {
                continue;
            }
            let t = totals.entries[e];
            // At `max_keys` the key is not stored: its base stays claimed, unspent.
            let _ = r.keys.update(
                key,
                n * self.params.round,
                KeyState::default,
                KeyState::is_empty,
                |k| {
                    k.slots.entry(*x).or_default().take_base(base);
                    k.take_totals(n, *x, &t);
                },
            );
        }
        let mut granted = 0;
        for (e, mine) in own {
            let Some(t) = totals.entries.get(&e) else {
                continue;
            };
            let Some(r) = keys.rules.get(&e.0) else {
                continue;
            };
            let (_, key, x) = &e;
            let frozen = self.frozen(*x, r.limit.period());
            // Scaled to the free room by the interval's ends, so the grants of the round sum to
            // exactly `⌊Σr · F / Σr⌋ = F` when they must be scaled (rounding each on its own
            // would lose up to a unit per member every round).
            let free = free(&e, t).unwrap_or(0);
            let g = if frozen || mine.raw == 0 {
                0
            } else if t.raw <= free {
                mine.raw
            } else {
                let at = |x: u64| u128::from(x) * u128::from(free) / u128::from(t.raw);
                (at(t.offset.saturating_add(mine.raw)) - at(t.offset)) as u64
            };
            let applied = r.keys.update_stored(key, |k| {
                k.take_totals(n, *x, t);
                if g > 0 {
                    k.slots.entry(*x).or_default().held += g;
                }
            });
            if applied.is_some() {
                granted += g;
            }
        }
        self.stats.granted += granted;
    }

    /// Claims this node's base in each slot that boundary `n` is the first to touch (the
    /// slot starts after the round does), `⌊C'/m⌋` with m the view's members, if it is a member
    /// and not leaving; forgets the claims of slots that ended; and gives up a claim not yet
    /// confirmed that its view changed since ([`Tree::confirm`] could never confirm it).
    /// A claim is reported in every round's sums until its slot ends, so every round that
    /// could grant in the slot counts it, unspent or not.
    fn claim(&mut self, n: u64) {
        let start = n * self.params.round;
        let next_start = start + self.params.round;
        let member = self.members.contains(&self.me) && self.leaving.is_none();
        let count = self.members.len().max(1) as u64;
        let keys = self.keys.clone();
        for (rule, r) in &keys.rules {
            let (c, len) = (r.limit.limit(), r.limit.period());
            let (cur, next) = (start / len, next_start / len);
            self.claims.retain(|(name, x), _| name != rule || *x >= cur);
            for x in cur..=next {
                self.claims
                    .entry((rule.clone(), x))
                    .or_insert_with(|| Claim {
                        units: if x > cur && member {
                            (c - c / ESCROW_MARGIN) / count
                        } else {
                            0
                        },
                        from: n,
                        confirmed: false,
                    });
            }
        }
        let since = self.view_since;
        for claim in self.claims.values_mut() {
            if !claim.confirmed && claim.from < since {
                claim.units = 0;
            }
        }
        self.publish_bases();
    }

    /// A complete round `n` whose members have all held their view since round `since`:
    /// each claim of a round from `since` on is counted in every round that could grant in
    /// its slot, so it may be spent; one of an earlier round never will be, and is given up.
    fn confirm(&mut self, n: u64, since: u64) {
        let mut changed = false;
        for claim in self.claims.values_mut() {
            if claim.units > 0 && !claim.confirmed && n >= claim.from {
                if since <= claim.from {
                    claim.confirmed = true;
                } else {
                    claim.units = 0;
                }
                changed = true;
            }
        }
        if changed {
            self.publish_bases();
        }
    }

    /// This node's claims with units, as its sums report them.
    fn claimed(&self) -> BTreeMap<(String, u64), u64> {
        self.claims
            .iter()
            .filter(|(_, c)| c.units > 0)
            .map(|(b, c)| (b.clone(), c.units))
            .collect()
    }

    /// Hands the confirmed claims to the checks ([`TreeRule::base`]).
    fn publish_bases(&self) {
        for (rule, r) in &self.keys.rules {
            let confirmed: Vec<(u64, u64)> = self
                .claims
                .iter()
                .filter(|((name, _), c)| name == rule && c.confirmed && c.units > 0)
                .map(|((_, x), c)| (*x, c.units))
                .collect();
            *r.bases.write().unwrap_or_else(|p| p.into_inner()) = confirmed;
        }
    }

    /// A message from `peer` (the authenticated sender).
    pub fn receive(&mut self, peer: &str, message: Message) -> Result<Vec<Output>, Reject> {
        let (up, sums) = match message {
            Message::TreeUp(s) => (true, s),
            Message::TreeDown(s) => (false, s),
            Message::TreeHandoff(s) => return self.carry(peer, s),
            Message::TreeCarried { from, round } => {
                if from.node != peer {
                    return Err(Reject::Impostor);
                }
                match self.leaving.as_mut() {
                    Some(l) if l.carrier == from && l.from == round => l.carried = true,
                    _ => self.stats.ignored += 1,
                }
                return Ok(Vec::new());
            }
            // A new peer greets (so the transport authenticates it); nothing to do here.
            Message::Hello { from, .. } if from.node == peer => return Ok(Vec::new()),
            Message::Hello { .. } => return Err(Reject::Impostor),
            _ => return Err(Reject::Unexpected),
        };
        if sums.from.node != peer || peer == self.me.node {
            return Err(Reject::Impostor);
        }
        if sums.parts == 0 || sums.parts > MAX_PARTS || sums.part >= sums.parts {
            return Err(Reject::BadParts);
        }
        // A member freezes at most through the round after its current one.
        if sums.freeze > sums.round.saturating_add(2) {
            return Err(Reject::RoundOutOfRange);
        }
        if sums.round == self.next_round && sums.view == self.view {
            // Sent before this node's boundary (its clock is behind): kept for it, a
            // duplicate in place of the first copy.
            let part = sums.part;
            let same = |(from, m): &(String, Message)| {
                *from == peer
                    && match (m, up) {
                        (Message::TreeUp(s), true) | (Message::TreeDown(s), false) => {
                            s.part == part
                        }
                        _ => false,
                    }
            };
            let message = if up {
                Message::TreeUp(sums)
            } else {
                Message::TreeDown(sums)
            };
            let found = self.early.iter().position(same);
            match found {
                Some(i) => self.early[i].1 = message,
                None if self.early.len() < 2 * (self.params.fanout + 1) => {
                    self.early.push((peer.to_owned(), message));
                }
                None => self.stats.ignored += 1,
            }
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        let view = self.view;
        let len = self.members.len() as u64;
        let n = sums.round;
        let Some(r) = self
            .rounds
            .get_mut(&n)
            .filter(|r| sums.view == view && !r.done)
        else {
            self.stats.ignored += 1;
            return Ok(out);
        };
        if up {
            // A child's subtree has at most len - 1 members; a child that already sent is
            // replaced (a duplicate), and nothing is taken once this node sent up.
            if r.sent_up
                || !r.children.contains(&sums.from)
                || sums.members == 0
                || sums.members >= len
            {
                self.stats.ignored += 1;
                return Ok(out);
            }
            let Some(agg) = gather(r.up_parts.entry(peer.to_owned()).or_default(), sums) else {
                return Ok(out);
            };
            r.from_children.insert(peer.to_owned(), agg);
            if r.from_children.len() == r.children.len() {
                self.send_up(n, &mut out);
            }
        } else {
            if r.parent.as_ref() != Some(&sums.from) || sums.members > len {
                self.stats.ignored += 1;
                return Ok(out);
            }
            let Some(agg) = gather(&mut r.down_parts, sums) else {
                return Ok(out);
            };
            self.down(n, &agg, &mut out);
        }
        Ok(out)
    }
}

impl Tree {
    /// Starts leaving on purpose (call it once nothing more is admitted here, after the
    /// HTTP drain): gives back all this node holds (and, taking no grant from now on, admits
    /// nothing more), and hands its admissions in the open slots to the member after it in
    /// the view, which reports them as its own from the round after next on. Returns the handoff to send; it is sent
    /// again each round (from [`Tree::tick`]) until the carrier answers. Once
    /// [`Tree::carried`] says so, the node can leave with a marker naming the carrier and
    /// the round, and the members that see it go freeze nothing ([`Tree::handed_off`]).
    /// Alone in its view it has nobody to hand to: nothing is sent, and those that see it
    /// go freeze the open slots as after a crash.
    pub fn leave(&mut self, now: Nanos) -> Vec<Output> {
        if self.leaving.is_some() {
            return Vec::new();
        }
        let Some(carrier) = self.carrier() else {
            return Vec::new();
        };
        // Its bases too: no check takes one from now on, and its next sums claim none.
        for claim in self.claims.values_mut() {
            claim.units = 0;
        }
        self.publish_bases();
        let mut entries = Vec::new();
        let mut released = 0;
        for (rule, r) in &self.keys.rules {
            let len = r.limit.period();
            r.keys.visit_all(|key, k| {
                k.slots.retain(|&x, _| (x + 1) * len > now);
                for (&slot, s) in &mut k.slots {
                    released += std::mem::take(&mut s.held);
                    // Its claims are gone, so no entry may say a base is in its counts: the
                    // others' unreported bases would be counted short by as much.
                    s.based = 0;
                    // Units carried for another leaving member are handed on too.
                    let admitted = s.admitted + s.pending;
                    if admitted > 0 {
                        entries.push(TreeEntry {
                            rule: rule.clone(),
                            key: key.to_owned(),
                            slot,
                            admitted,
                            held: 0,
                            demand: 0,
                            raw: 0,
                            offset: 0,
                            based: 0,
                        });
                    }
                }
                Visit::Unlist
            });
        }
        self.stats.released += released;
        // Two rounds ahead: the carrier must take it before its boundary of that round.
        let from = self.next_round + 2;
        self.leaving = Some(Leaving {
            carrier,
            from,
            entries,
            carried: false,
            sent_at: now,
        });
        self.send_handoff()
    }

    /// Once the carrier took this node's admissions ([`Tree::leave`]): the carrier, and the
    /// round from which it reports them.
    pub fn carried(&self) -> Option<(Actor, u64)> {
        self.leaving
            .as_ref()
            .filter(|l| l.carried)
            .map(|l| (l.carrier.clone(), l.from))
    }

    /// What this node hands over since [`Tree::leave`]: units per (rule, key, slot).
    pub fn handing(&self) -> Vec<(EntryKey, u64)> {
        self.leaving.as_ref().map_or_else(Vec::new, |l| {
            l.entries
                .iter()
                .map(|e| ((e.rule.clone(), e.key.clone(), e.slot), e.admitted))
                .collect()
        })
    }

    /// The member after this one in the view (wrapping), if any.
    fn carrier(&self) -> Option<Actor> {
        let i = self.members.iter().position(|m| *m == self.me)?;
        let len = self.members.len();
        (len > 1).then(|| self.members[(i + 1) % len].clone())
    }

    fn send_handoff(&mut self) -> Vec<Output> {
        let Some(l) = &self.leaving else {
            return Vec::new();
        };
        let chunks = split_by(l.entries.clone(), PART_BYTES, |e| {
            e.rule.len() + e.key.len() + 64
        });
        let Ok(parts) = u32::try_from(chunks.len()) else {
            return Vec::new();
        };
        if parts > MAX_PARTS {
            self.stats.oversized += 1;
            return Vec::new();
        }
        let to = l.carrier.node.clone();
        let round = l.from;
        chunks
            .into_iter()
            .enumerate()
            .map(|(part, entries)| {
                let sums = TreeSums {
                    from: self.me.clone(),
                    round,
                    view: self.view,
                    members: 1,
                    freeze: 0,
                    vouch: u64::MAX,
                    since: 0,
                    bases: Vec::new(),
                    part: part as u32,
                    parts,
                    entries,
                };
                Output::To(to.clone(), Message::TreeHandoff(sums))
            })
            .collect()
    }

    /// A leaving member's handoff: once every part is in, its admissions are added to
    /// this node's slots, reported from the handoff's round on, and the carrier answers.
    /// Refused (no answer: the member leaves as after a crash) if this node is leaving too,
    /// if its boundary of that round has passed, or if a key cannot be stored.
    fn carry(&mut self, peer: &str, sums: TreeSums) -> Result<Vec<Output>, Reject> {
        if sums.from.node != peer || peer == self.me.node {
            return Err(Reject::Impostor);
        }
        if sums.parts == 0 || sums.parts > MAX_PARTS || sums.part >= sums.parts {
            return Err(Reject::BadParts);
        }
        let (from, round) = (sums.from.clone(), sums.round);
        let answer = vec![Output::To(
            from.node.clone(),
            Message::TreeCarried {
                from: self.me.clone(),
                round,
            },
        )];
        if self.carrying.get(&from) == Some(&round) {
            // Sent again: the answer was lost.
            return Ok(answer);
        }
        // A round more than a few ahead is no handoff this node sent for (`leave` asks for
        // two rounds ahead; clocks differ by milliseconds).
        if self.leaving.is_some()
            || round < self.next_round
            || round > self.next_round.saturating_add(4)
            || !self.members.contains(&from)
        {
            self.stats.ignored += 1;
            return Ok(Vec::new());
        }
        let parts = self.handoff_parts.entry(peer.to_owned()).or_default();
        let Some(agg) = gather(parts, sums) else {
            return Ok(Vec::new());
        };
        self.handoff_parts.remove(peer);
        let now = self.next_round * self.params.round;
        let mut stored = true;
        for ((rule, key, slot), e) in agg.entries {
            let Some(r) = self.keys.rules.get(&rule) else {
                continue;
            };
            // A closed slot needs no count.
            if (slot + 1) * r.limit.period() <= now || e.admitted == 0 {
                continue;
            }
            let added = r
                .keys
                .update(&key, now, KeyState::default, KeyState::is_empty, |k| {
                    let s = k.slots.entry(slot).or_default();
                    s.pending = s.pending.saturating_add(e.admitted);
                    // Two handoffs with different rounds: reported from the earlier one (counted
                    // twice for a round or two, never missing).
                    s.pending_from = if s.pending == e.admitted {
                        round
                    } else {
                        s.pending_from.min(round)
                    };
                });
            stored &= added.is_ok();
        }
        if !stored {
            // What was stored is reported as well as by the member, which keeps reporting
            // all of it: counted twice, never missing.
            self.stats.ignored += 1;
            return Ok(Vec::new());
        }
        self.carrying.insert(from, round);
        self.stats.taken += 1;
        Ok(answer)
    }
}

/// A fixed window's answer to `cost` from what this node holds in its slot `s`, with
/// `total` the slot's admitted units in the last totals it received. Charges nothing.
fn decision(limit: &Limit, total: Option<u64>, s: &Slot, cost: u64, now: Nanos) -> Decision {
    let (c, len) = (limit.limit(), limit.period());
    let slot_end = (now / len + 1) * len;
    let used = total
        .unwrap_or(0)
        .saturating_add(s.admitted.saturating_sub(s.reported));
    let verdict = if cost > c {
        Verdict::Never
    } else if s.held >= cost {
        Verdict::Admit { wait: 0 }
    } else {
        Verdict::Deny {
            retry_after: slot_end - now,
        }
    };
    let used = match verdict {
        Verdict::Admit { .. } => used.saturating_add(cost),
        _ => used,
    };
    let remaining = c.saturating_sub(used);
    let reset_after = if used == 0 { 0 } else { slot_end - now };
    Decision {
        verdict,
        limit: c,
        remaining,
        reset_after,
    }
}

/// Whether a round up to `through` (of `round` each) could grant room in slot `x` of a
/// limit of slots `len` long: it grants in the slot of its boundary and of the next.
/// Saturating, so a huge `through` freezes everything rather than wrapping to nothing.
fn frozen(through: u64, round: Nanos, x: u64, len: Nanos) -> bool {
    x <= through.saturating_add(1).saturating_mul(round) / len
}

/// Keeps `sums` among the parts of one message; once every part is in, their entries as one
/// [`Agg`]. Parts that disagree on the part count, members or freeze are dropped, so the
/// message never completes.
fn gather(parts: &mut Vec<Option<TreeSums>>, sums: TreeSums) -> Option<Agg> {
    let count = sums.parts as usize;
    if parts.len() != count {
        parts.clear();
        parts.resize(count, None);
    }
    let first = parts.iter().flatten().next();
    if first.is_some_and(|f| {
        f.members != sums.members
            || f.freeze != sums.freeze
            || f.vouch != sums.vouch
            || f.since != sums.since
            || f.bases != sums.bases
    }) {
        return None;
    }
    let part = sums.part as usize;
    parts[part] = Some(sums);
    if parts.iter().any(Option::is_none) {
        return None;
    }
    let parts: Vec<TreeSums> = std::mem::take(parts).into_iter().flatten().collect();
    let mut agg = Agg {
        members: parts[0].members,
        freeze: parts[0].freeze,
        vouch: parts[0].vouch,
        since: parts[0].since,
        bases: BTreeMap::new(),
        entries: Entries::default(),
    };
    for b in &parts[0].bases {
        let sum = agg.bases.entry((b.rule.clone(), b.slot)).or_default();
        *sum = sum.saturating_add(b.units);
    }
    for e in parts.into_iter().flat_map(|p| p.entries) {
        agg.entries.insert(
            (e.rule, e.key, e.slot),
            Sums {
                admitted: e.admitted,
                held: e.held,
                demand: e.demand,
                raw: e.raw,
                offset: e.offset,
                based: e.based,
            },
        );
    }
    Some(agg)
}

/// Demand, in 1/16ths of a unit per round: arrivals added, and a sixteenth (rounded up) of
/// what was there taken off each round. A node whose checks come a few rounds apart keeps
/// a weight between them, so it keeps a unit of room for its next check instead of giving
/// it back every round.
fn decay(demand: u64, arrivals: u64) -> u64 {
    (demand - demand.div_ceil(16)).saturating_add(arrivals.saturating_mul(16))
}
