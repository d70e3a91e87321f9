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
//! # Why not `crdts::Map`, `crdts::GCounter` or `crdts::VClock`
//! `crdts::Map` needs each actor's ops in causal order (an out-of-order apply silently loses
//! the earlier op) and its merge validation is quadratic; a plain map of slot → counter with
//! dot deltas has neither problem. A slot's counter holds what a `crdts::VClock` (the state of
//! a `crdts::GCounter`) holds, one count per actor merged by per-actor maximum, and dots are
//! `crdts::Dot`s. It is not stored as a `VClock`: that is a `BTreeMap` of cloned actors, about
//! 600 bytes for a slot one actor counts in, and a node holds a slot per active key. Here
//! actors are interned once per [`Counters`] and a slot keeps `(actor index, count)` pairs,
//! the first inline.
//!
//! # Cost
//! The check path ([`Counters::total`], [`Counters::own`]) is a hash lookup and a `u64` read:
//! totals are kept up to date, saturating at `u64::MAX`, whenever a count changes. The `_at`
//! forms look a slot up by borrowed rule, key and slot number, allocating nothing. A slot
//! costs its table entry (64 bytes), its key's bytes, and 16 bytes per actor past the first.

mod digest;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::hash::BuildHasher;

use crdts::Dot;
use hashbrown::HashTable;

use crate::store::shrink_target;
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

/// A slot with the latest dot of some of its actors: the unit of every repair. Applying it
/// ([`Counters::apply_all`]) is idempotent and may happen in any order.
pub type Delta = (SlotId, Vec<Dot<Actor>>);

/// An interned actor: its index in [`Counters::actors`].
type ActorIx = u32;

/// This node's own actor's index.
const ME: ActorIx = 0;

/// The slot table is not shrunk below this many slots.
const SLOTS_FLOOR: usize = 2048;

/// Where a slot of (rule index, key, slot) sits in the table.
fn slot_hash(hasher: &foldhash::fast::RandomState, rule: u32, key: &str, slot: u64) -> u64 {
    hasher.hash_one((rule, key, slot))
}

/// A slot found in [`Counters`] ([`Counters::slot_view`]): its counts without another lookup.
#[derive(Clone, Copy, Debug)]
pub struct SlotView<'a> {
    counters: &'a Counters,
    slot: &'a Slot,
}

impl<'a> SlotView<'a> {
    /// [`Counters::total`] of this slot.
    pub fn total(&self) -> u64 {
        self.slot.total
    }

    /// [`Counters::others`] of this slot.
    pub fn others(&self) -> u64 {
        self.slot.total.saturating_sub(self.slot.get(ME))
    }

    /// Every actor's count in this slot (each actor counted in it once, in no set order).
    pub fn counts(self) -> impl Iterator<Item = u64> + 'a {
        self.slot.counts().map(|(_, n)| n)
    }

    /// [`Counters::count`] of this slot.
    pub fn count(&self, actor: &Actor) -> u64 {
        self.counters
            .actor_ix
            .get(actor)
            .map_or(0, |&ix| self.slot.get(ix))
    }
}

/// One slot's counter, keyed by (rule index, key, slot), with its per-actor counts (the
/// state of a `GCounter`). Nearly every slot is counted in by one actor, so the first count
/// is inline and only the others take an allocation; the fields pack into 64 bytes (the
/// table holds one per key and slot in use).
#[derive(Clone, Debug)]
struct Slot {
    key: Box<str>,
    slot: u64,
    /// The sum of the counts, saturating: what the check path reads, kept current on every
    /// change so a check never sums.
    total: u64,
    rule: u32,
    /// The first actor counted in the slot, and its count.
    first_actor: ActorIx,
    first_count: u64,
    /// The other actors' counts (rare: a slot another node also counted in).
    rest: Box<[(ActorIx, u64)]>,
}

impl Slot {
    /// Whether this is the slot of (`rule`, `key`, `slot`).
    fn is(&self, rule: u32, key: &str, slot: u64) -> bool {
        self.rule == rule && self.slot == slot && *self.key == *key
    }

    /// `actor`'s count here (0 if it has none).
    fn get(&self, actor: ActorIx) -> u64 {
        if self.first_actor == actor {
            return self.first_count;
        }
        self.rest
            .iter()
            .find(|(a, _)| *a == actor)
            .map_or(0, |(_, n)| *n)
    }

    /// Every (actor, count) of the slot, the first actor first.
    fn counts(&self) -> impl Iterator<Item = (ActorIx, u64)> + '_ {
        std::iter::once((self.first_actor, self.first_count)).chain(self.rest.iter().copied())
    }

    /// Raises `actor`'s count to `count` if that is higher. Returns `None` if it was not,
    /// else whether the actor was new to the slot.
    fn raise(&mut self, actor: ActorIx, count: u64) -> Option<bool> {
        let had = if self.first_actor == actor {
            &mut self.first_count
        } else if let Some(pair) = self.rest.iter_mut().find(|(a, _)| *a == actor) {
            &mut pair.1
        } else {
            let mut rest = std::mem::take(&mut self.rest).into_vec();
            rest.push((actor, count));
            self.rest = rest.into_boxed_slice();
            self.total = self.total.saturating_add(count);
            return Some(true);
        };
        let old = *had;
        if count <= old {
            return None;
        }
        *had = count;
        // Counts only grow, so adding the increase keeps `total` = min(sum, u64::MAX).
        self.total = self.total.saturating_add(count - old);
        Some(false)
    }
}

/// An interned actor and how many slots count it.
#[derive(Debug)]
struct Interned {
    actor: Actor,
    /// Slots with a count of this actor; at 0 the index is free for another actor (never
    /// for [`ME`]).
    slots: u64,
}

/// This node's view of every global counter: its own counts exactly, its peers' as far as
/// their dots have arrived.
#[derive(Debug)]
pub struct Counters {
    /// Every actor some slot counts, by index; [`ME`] is this node's incarnation, the only
    /// one [`Counters::add`] counts for. A freed index is `None` until reused.
    actors: Vec<Option<Interned>>,
    actor_ix: HashMap<Actor, ActorIx, foldhash::fast::RandomState>,
    free_actors: Vec<ActorIx>,
    /// Every rule label seen, by index, with its floor: the oldest slot still kept (dots for
    /// older slots are ignored, so a lagging peer cannot bring back a forgotten window).
    rules: Vec<(String, Option<u64>)>,
    slots: HashTable<Slot>,
    hasher: foldhash::fast::RandomState,
    /// Dots from peers that claimed this node's own actor above its count, refused (only this
    /// node knows its own count; a higher claim is a bug or an attack).
    refused: u64,
}

impl Counters {
    /// Empty counters for the node incarnation `me`.
    pub fn new(me: Actor) -> Counters {
        let mut actor_ix = HashMap::default();
        actor_ix.insert(me.clone(), ME);
        Counters {
            actors: vec![Some(Interned {
                actor: me,
                slots: 0,
            })],
            actor_ix,
            free_actors: Vec::new(),
            rules: Vec::new(),
            slots: HashTable::new(),
            hasher: foldhash::fast::RandomState::default(),
            refused: 0,
        }
    }

    /// The actor this node counts as.
    pub fn me(&self) -> &Actor {
        self.actor(ME)
    }

    fn actor(&self, ix: ActorIx) -> &Actor {
        match &self.actors[ix as usize] {
            Some(i) => &i.actor,
            None => unreachable!("a slot names only interned actors"),
        }
    }

    /// Counts `n` admissions of this node in `slot` and returns the dot that tells peers so
    /// (this node's new absolute count there). Own counts saturate at `u64::MAX`.
    pub fn add(&mut self, slot: SlotId, n: u64) -> Dot<Actor> {
        let count = self.add_at(&slot.rule, &slot.key, slot.slot, n);
        Dot::new(self.me().clone(), count)
    }

    /// [`Counters::add`] by borrowed slot id; returns this node's new count there.
    ///
    /// Counts even in a slot older than the rule's floor ([`Counters::forget_before`]): the
    /// caller only adds to current slots, and peers that forgot the slot ignore the dot.
    pub fn add_at(&mut self, rule: &str, key: &str, slot: u64, n: u64) -> u64 {
        let count = self.own_at(rule, key, slot).saturating_add(n);
        self.merge(rule, key, slot, ME, count);
        count
    }

    /// Merges a peer's `dot` for `slot`: `dot.actor`'s count becomes the larger of ours and
    /// the dot's. Returns whether anything changed. Never lowers a count; applying the same
    /// dot again, or an older one, changes nothing. Dots for slots older than the rule's floor
    /// ([`Counters::forget_before`]) are ignored, and so are zero counts.
    ///
    /// A dot for this node's own actor changes nothing: only this node raises its own count.
    /// One above that count is refused and counted ([`Counters::refused`]); one at or below
    /// it is a peer's repair echoing it back.
    pub fn apply(&mut self, slot: SlotId, dot: Dot<Actor>) -> bool {
        self.apply_at(&slot.rule, &slot.key, slot.slot, &dot.actor, dot.counter)
    }

    /// [`Counters::apply`] by borrowed slot id and dot.
    pub fn apply_at(&mut self, rule: &str, key: &str, slot: u64, actor: &Actor, n: u64) -> bool {
        if actor == self.me() {
            // A repair echoes this node's own counts back: only a claim above them is refused.
            if n > self.own_at(rule, key, slot) {
                self.refused += 1;
            }
            return false;
        }
        if n == 0 || self.is_forgotten(rule, slot) {
            return false;
        }
        let ix = self.intern(actor);
        let raised = self.merge(rule, key, slot, ix, n);
        self.release_if_unused(ix);
        raised
    }

    /// Applies every dot of every delta, as [`Counters::apply`] does one. Returns how many
    /// dots changed a count.
    pub fn apply_all(&mut self, deltas: impl IntoIterator<Item = Delta>) -> usize {
        let mut changed = 0;
        for (slot, dots) in deltas {
            for dot in dots {
                let raised =
                    self.apply_at(&slot.rule, &slot.key, slot.slot, &dot.actor, dot.counter);
                changed += usize::from(raised);
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
        self.total_at(&slot.rule, &slot.key, slot.slot)
    }

    /// One slot's counts, looked up once for several reads (`None` for an unknown slot).
    pub fn slot_view(&self, rule: &str, key: &str, slot: u64) -> Option<SlotView<'_>> {
        self.find(rule, key, slot).map(|slot| SlotView {
            counters: self,
            slot,
        })
    }

    /// [`Counters::total`] by borrowed slot id.
    pub fn total_at(&self, rule: &str, key: &str, slot: u64) -> u64 {
        self.slot_view(rule, key, slot).map_or(0, |v| v.total())
    }

    /// This node's own count in `slot` (exact: only this node raises it).
    pub fn own(&self, slot: &SlotId) -> u64 {
        self.own_at(&slot.rule, &slot.key, slot.slot)
    }

    /// [`Counters::own`] by borrowed slot id.
    pub fn own_at(&self, rule: &str, key: &str, slot: u64) -> u64 {
        self.find(rule, key, slot).map_or(0, |s| s.get(ME))
    }

    /// `actor`'s count in `slot` as far as this node knows (0 if unknown).
    pub fn count(&self, slot: &SlotId, actor: &Actor) -> u64 {
        self.count_at(&slot.rule, &slot.key, slot.slot, actor)
    }

    /// [`Counters::count`] by borrowed slot id.
    pub fn count_at(&self, rule: &str, key: &str, slot: u64, actor: &Actor) -> u64 {
        self.slot_view(rule, key, slot)
            .map_or(0, |v| v.count(actor))
    }

    /// Everyone else's count in `slot`: [`Counters::total`] less [`Counters::own`] (so also
    /// saturated when the total is).
    pub fn others(&self, slot: &SlotId) -> u64 {
        self.others_at(&slot.rule, &slot.key, slot.slot)
    }

    /// [`Counters::others`] by borrowed slot id.
    pub fn others_at(&self, rule: &str, key: &str, slot: u64) -> u64 {
        self.slot_view(rule, key, slot).map_or(0, |v| v.others())
    }

    /// Forgets every slot of `rule` older than `slot` (windows that can no longer affect a
    /// decision), and from then on ignores dots for them. Returns how many slots went.
    /// Scans all slots: meant for a periodic sweep, not the check path.
    pub fn forget_before(&mut self, rule: &str, slot: u64) -> usize {
        let ri = self.rule_ix(rule);
        let floor = &mut self.rules[ri as usize].1;
        *floor = Some(floor.map_or(slot, |f| f.max(slot)));
        let before = self.slots.len();
        let actors = &mut self.actors;
        let mut freed = Vec::new();
        self.slots.retain(|s| {
            if s.rule != ri || s.slot >= slot {
                return true;
            }
            for (ix, _) in s.counts() {
                if let Some(i) = &mut actors[ix as usize] {
                    i.slots -= 1;
                    if i.slots == 0 && ix != ME {
                        freed.push(ix);
                    }
                }
            }
            false
        });
        for ix in freed {
            self.release_if_unused(ix);
        }
        // Give memory back once most slots are gone (not for a few: the table would shrink
        // and regrow as windows turn).
        let len = self.slots.len();
        if let Some(target) = shrink_target(len, self.slots.capacity(), SLOTS_FLOOR) {
            let hasher = &self.hasher;
            self.slots
                .shrink_to(target, |s| slot_hash(hasher, s.rule, &s.key, s.slot));
        }
        before - len
    }

    /// Slots held.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether no slot is held.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Actors interned: this node's and every other one some slot counts.
    pub fn actors(&self) -> usize {
        self.actor_ix.len()
    }

    /// Whether `slot` of `rule` is older than what the rule keeps.
    fn is_forgotten(&self, rule: &str, slot: u64) -> bool {
        self.rule_of(rule)
            .and_then(|ri| self.rules[ri as usize].1)
            .is_some_and(|f| slot < f)
    }

    /// The index of `rule`, if seen. Rules are few (the caller's limit labels), so a scan
    /// beats a map.
    fn rule_of(&self, rule: &str) -> Option<u32> {
        self.rules
            .iter()
            .position(|(r, _)| r == rule)
            .map(|i| i as u32)
    }

    /// The index of `rule`, interning it on first sight.
    fn rule_ix(&mut self, rule: &str) -> u32 {
        if let Some(i) = self.rule_of(rule) {
            return i;
        }
        self.rules.push((rule.to_owned(), None));
        (self.rules.len() - 1) as u32
    }

    fn find(&self, rule: &str, key: &str, slot: u64) -> Option<&Slot> {
        let ri = self.rule_of(rule)?;
        self.slots
            .find(slot_hash(&self.hasher, ri, key, slot), |s| {
                s.is(ri, key, slot)
            })
    }

    /// The index of `actor`, interning it (with no slots yet) if new.
    fn intern(&mut self, actor: &Actor) -> ActorIx {
        if let Some(&ix) = self.actor_ix.get(actor) {
            return ix;
        }
        let entry = Some(Interned {
            actor: actor.clone(),
            slots: 0,
        });
        let ix = match self.free_actors.pop() {
            Some(ix) => {
                self.actors[ix as usize] = entry;
                ix
            }
            None => {
                self.actors.push(entry);
                ActorIx::try_from(self.actors.len() - 1).expect("fewer than 2^32 actors")
            }
        };
        self.actor_ix.insert(actor.clone(), ix);
        ix
    }

    /// Frees `ix` for reuse if no slot counts it (never [`ME`]).
    fn release_if_unused(&mut self, ix: ActorIx) {
        if ix == ME {
            return;
        }
        if let Some(i) = &self.actors[ix as usize]
            && i.slots == 0
        {
            self.actor_ix.remove(&i.actor);
            self.actors[ix as usize] = None;
            self.free_actors.push(ix);
        }
    }

    /// Raises `actor`'s count in `slot` to `count` (per-actor maximum), creating the slot
    /// only if `count` is above 0. Returns whether the count rose.
    fn merge(&mut self, rule: &str, key: &str, slot: u64, actor: ActorIx, count: u64) -> bool {
        if count == 0 {
            return false;
        }
        let ri = self.rule_ix(rule);
        let hash = slot_hash(&self.hasher, ri, key, slot);
        let found = self.slots.find_mut(hash, |s| s.is(ri, key, slot));
        let new_actor = match found {
            Some(s) => match s.raise(actor, count) {
                None => return false,
                Some(new_actor) => new_actor,
            },
            None => {
                let hasher = &self.hasher;
                self.slots.insert_unique(
                    hash,
                    Slot {
                        key: key.into(),
                        slot,
                        total: count,
                        rule: ri,
                        first_actor: actor,
                        first_count: count,
                        rest: Box::default(),
                    },
                    |s| slot_hash(hasher, s.rule, &s.key, s.slot),
                );
                true
            }
        };
        if new_actor && let Some(i) = &mut self.actors[actor as usize] {
            i.slots += 1;
        }
        true
    }
}
