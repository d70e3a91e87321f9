//! Cluster-wide counts for global rules: grow-only CRDT counters with dot deltas.
//!
//! Pure: no I/O, no clock reads, no locks, no async. Nothing here needs the time: the caller
//! says which time slot (a window index, say) a count belongs to, and which slots are old
//! enough to forget. The cluster layer moves the values this module produces; the engine
//! reads the totals.
//!
//! # Model
//! Every node incarnation is an [`Actor`] (node id + generation). For each [`SlotId`]
//! (rule, key, time slot) a [`Counters`] holds one grow-only counter: the count each actor
//! has admitted in that slot. A node only ever raises its own actor's count ([`Counters::add`]);
//! it learns other actors' counts as [`Dot`]s (`actor`, absolute count) and keeps the larger
//! of what it has and what it hears ([`Counters::apply`]). Because a dot carries an absolute
//! count, applying is a per-actor maximum: idempotent, commutative and order-free, so dots may
//! be lost, duplicated, reordered or relayed by any peer, and the latest dot per actor is a
//! complete delta. Anti-entropy ([`Counters::digest`], [`Counters::repair_for`]) heals what
//! deltas missed.
//!
//! A restarted node takes a new generation, so its new counts never collide with the counts
//! its previous incarnation gave out; those stay in the cluster under the old actor until
//! their slot is forgotten ([`Counters::forget_before`]). Admissions a node made but had not
//! yet sent when it crashed are lost with it (at most one gossip round of its own counts).
//!
//! # Why not `crdts::Map` or `crdts::GCounter`
//! `crdts::Map` needs each actor's ops in causal order (an out-of-order apply silently loses
//! the earlier op) and its merge validation is quadratic; a plain map of slot → counter with
//! dot deltas has neither problem. Each slot's counter is a [`crdts::VClock`], which is the
//! whole state of a `crdts::GCounter` (a `GCounter` is a `VClock` inside): `GCounter` hides
//! the per-actor counts that [`Counters::own`], deltas and digests need, reads only as a heap
//! `BigUint`, and its `inc_many` overflows instead of saturating. The dot and the per-actor
//! maximum (`VClock::apply`) are the same.
//!
//! # Cost
//! The check path ([`Counters::total`], [`Counters::own`]) is a hash lookup and a `u64` read:
//! totals are kept up to date, saturating at `u64::MAX`, whenever a count changes.

mod digest;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::mem;

use crdts::{CmRDT, Dot, VClock};
use serde::{Deserialize, Serialize};

pub(crate) use digest::StableHasher;
pub use digest::{DIGEST_SLOTS_PER_BUCKET, Digest, MAX_DIGEST_BUCKETS, RuleDigest};

/// One incarnation of a node: the unit that owns counts.
///
/// A node takes a new `generation` every time it starts (its start time in milliseconds
/// works, as it grows across restarts), so a restarted node never reuses — and so never
/// double-counts or overwrites — the counts of its previous life.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Actor {
    /// The node's stable id.
    pub node: String,
    /// Grows on every restart of `node`.
    pub generation: u64,
}

impl Actor {
    /// The actor of `node` in its incarnation `generation`.
    pub fn new(node: impl Into<String>, generation: u64) -> Actor {
        Actor {
            node: node.into(),
            generation,
        }
    }
}

/// What one counter counts: admissions under `rule` for `key` in time slot `slot`.
///
/// The slot is whatever index the rule's algorithm counts by (for a fixed window, the window
/// number since the Unix epoch), so every node puts an admission in the same slot as long as
/// their clocks agree on it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SlotId {
    /// The rule's name.
    pub rule: String,
    /// The key being limited.
    pub key: String,
    /// The time slot, increasing with time.
    pub slot: u64,
}

impl SlotId {
    /// The counter of `key` under `rule` in time slot `slot`.
    pub fn new(rule: impl Into<String>, key: impl Into<String>, slot: u64) -> SlotId {
        SlotId {
            rule: rule.into(),
            key: key.into(),
            slot,
        }
    }
}

/// A slot with the latest dot of some of its actors: the unit of every delta and repair.
/// Applying it ([`Counters::apply_all`]) is idempotent and may happen in any order.
pub type Delta = (SlotId, Vec<Dot<Actor>>);

/// One slot's counter.
#[derive(Clone, Debug, Default)]
struct Slot {
    /// Each actor's count in this slot (the state of a `GCounter`).
    counts: VClock<Actor>,
    /// The sum of `counts`, saturating: what the check path reads, kept current on every
    /// change so a check never sums or touches a big integer.
    total: u64,
    /// Actors whose count changed since the last [`Counters::take_deltas`]. Non-empty exactly
    /// when the slot is queued in [`Counters::dirty`]. A handful of actors at most, so a
    /// vector beats a set.
    changed: Vec<Actor>,
}

impl Slot {
    /// Raises `dot.actor`'s count to `dot.counter` if that is higher. Returns whether the
    /// count changed.
    fn raise(&mut self, dot: Dot<Actor>) -> bool {
        let old = self.counts.get(&dot.actor);
        if dot.counter <= old {
            return false;
        }
        // Counts only grow, so adding the increase keeps `total` = min(sum, u64::MAX).
        self.total = self.total.saturating_add(dot.counter - old);
        if !self.changed.contains(&dot.actor) {
            self.changed.push(dot.actor.clone());
        }
        self.counts.apply(dot);
        true
    }

    /// The latest dot of every actor.
    fn dots(&self) -> Vec<Dot<Actor>> {
        self.counts
            .iter()
            .map(|d| Dot::new(d.actor.clone(), d.counter))
            .collect()
    }
}

/// This node's view of every global counter: its own counts exactly, its peers' as far as
/// their dots have arrived.
#[derive(Debug)]
pub struct Counters {
    /// This node's actor: the only one [`Counters::add`] counts for.
    me: Actor,
    slots: HashMap<SlotId, Slot, foldhash::fast::RandomState>,
    /// Slots with changes not yet handed out by [`Counters::take_deltas`], in the order they
    /// first changed. May name a slot that was forgotten since; those are skipped.
    dirty: Vec<SlotId>,
    /// Per rule, the oldest slot still kept: dots for older slots are ignored, so a lagging
    /// peer cannot bring back a window that was already forgotten.
    floors: HashMap<String, u64, foldhash::fast::RandomState>,
    /// Dots from peers that claimed this node's own actor, refused (only this node knows its
    /// own count; a higher claim is a bug or an attack).
    refused: u64,
}

impl Counters {
    /// Empty counters for the node incarnation `me`.
    pub fn new(me: Actor) -> Counters {
        Counters {
            me,
            slots: HashMap::default(),
            dirty: Vec::new(),
            floors: HashMap::default(),
            refused: 0,
        }
    }

    /// The actor this node counts as.
    pub fn me(&self) -> &Actor {
        &self.me
    }

    /// Counts `n` admissions of this node in `slot` and returns the dot that tells peers so
    /// (this node's new absolute count there). Own counts saturate at `u64::MAX`.
    ///
    /// Counts even in a slot older than the rule's floor ([`Counters::forget_before`]): the
    /// caller only adds to current slots, and peers that forgot the slot ignore the dot.
    pub fn add(&mut self, slot: SlotId, n: u64) -> Dot<Actor> {
        // Not `GCounter::inc_many`, which adds without saturating.
        let dot = Dot::new(self.me.clone(), self.own(&slot).saturating_add(n));
        self.merge(slot, [dot.clone()]);
        dot
    }

    /// Merges a peer's `dot` for `slot`: `dot.actor`'s count becomes the larger of ours and
    /// the dot's. Returns whether anything changed. Never lowers a count; applying the same
    /// dot again, or an older one, changes nothing. A changed slot is relayed by the next
    /// [`Counters::take_deltas`]. Dots for slots older than the rule's floor
    /// ([`Counters::forget_before`]) are ignored, and so are zero counts.
    ///
    /// A dot for this node's own actor is refused and counted ([`Counters::refused`]): only
    /// this node raises its own count.
    pub fn apply(&mut self, slot: SlotId, dot: Dot<Actor>) -> bool {
        if dot.actor == self.me {
            self.refused += 1;
            return false;
        }
        !self.is_forgotten(&slot) && self.merge(slot, [dot]) > 0
    }

    /// Applies every dot of every delta, as [`Counters::apply`] does one (with one lookup per
    /// slot). Returns how many dots changed a count.
    pub fn apply_all(&mut self, deltas: impl IntoIterator<Item = Delta>) -> usize {
        let mut changed = 0;
        for (slot, mut dots) in deltas {
            let before = dots.len();
            dots.retain(|d| d.actor != self.me);
            self.refused += (before - dots.len()) as u64;
            if !self.is_forgotten(&slot) {
                changed += self.merge(slot, dots);
            }
        }
        changed
    }

    /// Dots refused so far because a peer claimed this node's own actor.
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// The cluster-wide count in `slot` as far as this node knows: its own count plus the
    /// latest count it has from every other actor, saturating at `u64::MAX`. 0 for an unknown
    /// slot.
    pub fn total(&self, slot: &SlotId) -> u64 {
        self.slots.get(slot).map_or(0, |s| s.total)
    }

    /// This node's own count in `slot` (exact: only this node raises it).
    pub fn own(&self, slot: &SlotId) -> u64 {
        self.slots.get(slot).map_or(0, |s| s.counts.get(&self.me))
    }

    /// `actor`'s count in `slot` as far as this node knows (0 if unknown).
    pub fn count(&self, slot: &SlotId, actor: &Actor) -> u64 {
        self.slots.get(slot).map_or(0, |s| s.counts.get(actor))
    }

    /// Forgets the record of which slots changed, for callers that never take deltas.
    pub fn clear_changes(&mut self) {
        for id in mem::take(&mut self.dirty) {
            if let Some(state) = self.slots.get_mut(&id) {
                state.changed.clear();
            }
        }
    }

    /// Everyone else's count in `slot`: [`Counters::total`] less [`Counters::own`] (so also
    /// saturated when the total is).
    pub fn others(&self, slot: &SlotId) -> u64 {
        self.slots
            .get(slot)
            .map_or(0, |s| s.total.saturating_sub(s.counts.get(&self.me)))
    }

    /// For every slot that changed since the last call — by this node's own adds and by
    /// dots applied from peers, so deltas are relayed — the latest dot of each actor that
    /// changed there. Clears the record of changes.
    ///
    /// A peer that applies the result sees each of those slots at least as new as this node
    /// does now. Slots come in the order they first changed.
    pub fn take_deltas(&mut self) -> Vec<Delta> {
        let mut deltas = Vec::with_capacity(self.dirty.len());
        for id in mem::take(&mut self.dirty) {
            let Some(state) = self.slots.get_mut(&id) else {
                continue; // forgotten since it changed
            };
            if state.changed.is_empty() {
                continue; // queued twice (forgotten and re-created)
            }
            let dots = mem::take(&mut state.changed)
                .into_iter()
                .map(|actor| {
                    let counter = state.counts.get(&actor);
                    Dot::new(actor, counter)
                })
                .collect();
            deltas.push((id, dots));
        }
        deltas
    }

    /// Like [`Counters::take_deltas`], but only this node's own dots: what a full mesh sends,
    /// where every peer hears every node directly and relaying would multiply the traffic by
    /// the number of nodes. Peers' changes are cleared without being handed out.
    pub fn take_own_deltas(&mut self) -> Vec<Delta> {
        let mut deltas = Vec::new();
        for id in mem::take(&mut self.dirty) {
            let Some(state) = self.slots.get_mut(&id) else {
                continue;
            };
            let changed = mem::take(&mut state.changed);
            if changed.contains(&self.me) {
                let counter = state.counts.get(&self.me);
                deltas.push((id, vec![Dot::new(self.me.clone(), counter)]));
            }
        }
        deltas
    }

    /// Forgets every slot of `rule` older than `slot` (windows that can no longer affect a
    /// decision), and from then on ignores dots for them. Returns how many slots went.
    /// Scans all slots: meant for a periodic sweep, not the check path.
    pub fn forget_before(&mut self, rule: &str, slot: u64) -> usize {
        match self.floors.get_mut(rule) {
            Some(floor) => *floor = (*floor).max(slot),
            None => {
                self.floors.insert(rule.to_owned(), slot);
            }
        }
        let before = self.slots.len();
        self.slots
            .retain(|id, _| id.rule != rule || id.slot >= slot);
        let gone = before - self.slots.len();
        if gone > 0 {
            let slots = &self.slots;
            self.dirty.retain(|id| slots.contains_key(id));
        }
        gone
    }

    /// Slots held.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether no slot is held.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Whether `slot` is older than what its rule keeps.
    fn is_forgotten(&self, slot: &SlotId) -> bool {
        self.floors.get(&slot.rule).is_some_and(|&f| slot.slot < f)
    }

    /// Raises counts in `slot` to `dots` (per-actor maximum), creating the slot only if a
    /// count changes and queueing it for the next deltas. Returns how many dots raised a count.
    fn merge(&mut self, slot: SlotId, dots: impl IntoIterator<Item = Dot<Actor>>) -> usize {
        match self.slots.entry(slot) {
            Entry::Occupied(mut entry) => {
                let state = entry.get_mut();
                let was_clean = state.changed.is_empty();
                let raised = dots.into_iter().map(|d| usize::from(state.raise(d))).sum();
                if was_clean && raised > 0 {
                    self.dirty.push(entry.key().clone());
                }
                raised
            }
            Entry::Vacant(entry) => {
                let mut state = Slot::default();
                let raised = dots.into_iter().map(|d| usize::from(state.raise(d))).sum();
                if raised > 0 {
                    self.dirty.push(entry.key().clone());
                    entry.insert(state);
                }
                raised
            }
        }
    }
}
