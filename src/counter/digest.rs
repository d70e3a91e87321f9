//! Anti-entropy: a small digest of a replica's counters, and the repair that answers it.
//!
//! Deltas can be lost (a dropped frame, a peer that was down). Periodically a node sends a
//! peer its [`Digest`]; the peer answers with [`Counters::repair_for`], every slot where the
//! two may differ with all its dots; both sides do this, and they converge.
//!
//! # Design and size
//! Per rule, the slots are spread over `n` buckets by a hash of their id, and a bucket holds
//! the wrapping sum of its slots' fingerprints (a hash of the slot id and every
//! (actor, count) pair). Sums do not depend on iteration order, and a bucket can be
//! recomputed at any `n`: the sender picks `n = ⌈slots / DIGEST_SLOTS_PER_BUCKET⌉` (at most
//! [`MAX_DIGEST_BUCKETS`]) and the receiver buckets its own slots the same way to compare.
//! A bucket whose sums differ — or a rule the sender lacks — is repaired whole.
//!
//! Encoded (bincode varints), a bucket takes at most 9 bytes, so a digest costs about
//! 9 / [`DIGEST_SLOTS_PER_BUCKET`] ≈ 1.1 bytes per slot, plus the rule name, and at most
//! ~36 KiB per rule (10,000 slots of one rule: 1,250 buckets, ~11 KiB). A repair may be
//! over-complete by the other slots of a differing bucket (about 8); applying it is
//! idempotent. A differing slot goes unnoticed only if two 64-bit sums collide.
//!
//! The hash is FNV-1a over a fixed little-endian layout, so every node, platform and build
//! computes the same buckets. Changing it does not break correctness (repairs just become
//! complete dumps) but should go with a wire version bump.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

use crdts::Dot;

use super::{Actor, Counters, Delta, Slot, SlotId};

/// How many slots a digest bucket covers on average, when below [`MAX_DIGEST_BUCKETS`].
pub const DIGEST_SLOTS_PER_BUCKET: usize = 8;

/// The most buckets a rule's digest has (~36 KiB encoded). A received digest with more, or
/// with none, is treated as knowing nothing of that rule.
pub const MAX_DIGEST_BUCKETS: usize = 4096;

/// A summary of a replica's counters, compared by [`Counters::repair_for`]. The default
/// (empty) digest asks for everything.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Digest {
    /// One entry per rule with slots, sorted by rule name.
    pub rules: Vec<RuleDigest>,
}

/// The digest of one rule's slots.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleDigest {
    /// The rule's name.
    pub rule: String,
    /// Bucket `i` is the wrapping sum of the fingerprints of the slots whose id hashes to
    /// `i` modulo `buckets.len()`.
    pub buckets: Vec<u64>,
}

impl Counters {
    /// This replica's digest, for a peer to answer with [`Counters::repair_for`]. Hashes
    /// every slot: meant for a periodic anti-entropy round, not the check path.
    pub fn digest(&self) -> Digest {
        let prefixes = self.rule_prefixes();
        let mut by_ix: Vec<Vec<(u64, u64)>> = vec![Vec::new(); self.rules.len()];
        for slot in &self.slots {
            by_ix[slot.rule as usize].push(self.hashes(slot, prefixes[slot.rule as usize]));
        }
        let by_rule: BTreeMap<&str, Vec<(u64, u64)>> = by_ix
            .into_iter()
            .enumerate()
            .filter(|(_, slots)| !slots.is_empty())
            .map(|(ix, slots)| (self.rules[ix].0.as_str(), slots))
            .collect();
        let rules = by_rule
            .into_iter()
            .map(|(rule, slots)| {
                let n = slots
                    .len()
                    .div_ceil(DIGEST_SLOTS_PER_BUCKET)
                    .clamp(1, MAX_DIGEST_BUCKETS);
                let mut buckets = vec![0u64; n];
                for (id_hash, fingerprint) in slots {
                    let b = &mut buckets[bucket(id_hash, n)];
                    *b = b.wrapping_add(fingerprint);
                }
                RuleDigest {
                    rule: rule.to_owned(),
                    buckets,
                }
            })
            .collect();
        Digest { rules }
    }

    /// Every slot the owner of `theirs` may lack or be behind on, with all of this replica's
    /// dots there, sorted by slot id: the slots of rules `theirs` does not cover and of
    /// buckets whose sums differ. Applying the result makes the peer at least as new as this
    /// replica on every slot (up to a 64-bit collision). Against [`Digest::default`] this is
    /// the whole state, which is how a starting node catches up.
    ///
    /// `theirs` is untrusted: work and memory are bounded by this replica's slots and
    /// [`MAX_DIGEST_BUCKETS`] per rule.
    pub fn repair_for(&self, theirs: &Digest) -> Vec<Delta> {
        let theirs: HashMap<&str, &[u64]> = theirs
            .rules
            .iter()
            .filter(|r| (1..=MAX_DIGEST_BUCKETS).contains(&r.buckets.len()))
            .map(|r| (r.rule.as_str(), r.buckets.as_slice()))
            .collect();
        // Per rule index: their sums, and ours at their resolution.
        let theirs: Vec<Option<&[u64]>> = self
            .rules
            .iter()
            .map(|(rule, _)| theirs.get(rule.as_str()).copied())
            .collect();
        let mut ours: Vec<Vec<u64>> = theirs
            .iter()
            .map(|their| vec![0; their.map_or(0, <[u64]>::len)])
            .collect();
        let prefixes = self.rule_prefixes();
        // Each slot's bucket (None: rule unknown to them).
        let mut slots = Vec::with_capacity(self.slots.len());
        for slot in &self.slots {
            let ri = slot.rule as usize;
            let at = theirs[ri].map(|their| {
                let (id_hash, fingerprint) = self.hashes(slot, prefixes[ri]);
                let i = bucket(id_hash, their.len());
                ours[ri][i] = ours[ri][i].wrapping_add(fingerprint);
                i
            });
            slots.push((slot, at));
        }
        let mut repair: Vec<Delta> = slots
            .into_iter()
            .filter(|(slot, at)| {
                let ri = slot.rule as usize;
                at.is_none_or(|i| theirs[ri].is_some_and(|their| ours[ri][i] != their[i]))
            })
            .map(|(slot, _)| {
                let rule = self.rules[slot.rule as usize].0.as_str();
                let id = SlotId::new(rule, &*slot.key, slot.slot);
                (id, self.dots(slot))
            })
            .collect();
        repair.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        repair
    }
}

/// The bucket of a slot whose id hashes to `id_hash`, out of `n` (> 0).
fn bucket(id_hash: u64, n: usize) -> usize {
    // n ≤ MAX_DIGEST_BUCKETS, so both conversions are lossless.
    (id_hash % n as u64) as usize
}

impl Counters {
    /// Every dot of `slot`, in actor order (as a `VClock` iterates them).
    fn dots(&self, slot: &Slot) -> Vec<Dot<Actor>> {
        let mut dots: Vec<Dot<Actor>> = slot
            .counts()
            .map(|(ix, n)| Dot::new(self.actor(ix).clone(), n))
            .collect();
        dots.sort_unstable_by(|a, b| a.actor.cmp(&b.actor));
        dots
    }

    /// Per rule index, the hasher after the rule's name: where every slot id of the rule
    /// starts.
    fn rule_prefixes(&self) -> Vec<StableHasher> {
        self.rules
            .iter()
            .map(|(rule, _)| {
                let mut h = StableHasher::new();
                h.str(rule);
                h
            })
            .collect()
    }

    /// A slot's (id hash, fingerprint): the first places it in a bucket, the second covers
    /// the id and every (actor, count) pair, in actor order. `prefix` is its rule's entry of
    /// [`Counters::rule_prefixes`].
    fn hashes(&self, slot: &Slot, prefix: StableHasher) -> (u64, u64) {
        let mut h = prefix;
        h.str(&slot.key);
        h.u64(slot.slot);
        let id_hash = h.finish();
        let mut add = |actor: &Actor, n: u64| {
            h.str(&actor.node);
            h.u64(actor.generation);
            h.u64(n);
        };
        if slot.rest.is_empty() {
            // Nearly every slot: one actor, nothing to sort.
            add(self.actor(slot.first_actor), slot.first_count);
        } else {
            let mut counts: SmallVec<[(&Actor, u64); 8]> =
                slot.counts().map(|(ix, n)| (self.actor(ix), n)).collect();
            counts.sort_unstable_by(|a, b| a.0.cmp(b.0));
            for (actor, n) in counts {
                add(actor, n);
            }
        }
        (id_hash, h.finish())
    }
}

/// FNV-1a (64-bit) over a fixed layout, finished with a SplitMix64 mix so that the low bits
/// (used for buckets) depend on every input byte. Unlike `std`'s hashers, its output is
/// specified, so every node computes the same digest.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StableHasher(u64);

impl StableHasher {
    pub(crate) fn new() -> StableHasher {
        StableHasher(0xcbf2_9ce4_8422_2325)
    }

    pub(crate) fn bytes(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    pub(crate) fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }

    /// Length first, so ("ab", "c") and ("a", "bc") differ.
    pub(crate) fn str(&mut self, s: &str) {
        self.u64(s.len() as u64);
        self.bytes(s.as_bytes());
    }

    pub(crate) fn finish(&self) -> u64 {
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}
