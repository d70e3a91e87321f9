//! A concurrent keyed store: sharded, bounded, evicting keys whose state is fresh.
//!
//! The store owns concurrency and memory; what a value means is the caller's business (the
//! engine keeps one [`KeyState`](crate::limiter::KeyState) per key). Each key's update runs
//! under its shard's lock, so a check-and-update on one key is atomic, and keys in different
//! shards never contend.
//!
//! Eviction: a sweep removes keys whose value is fresh (equal to a new key's, so forgetting
//! them changes no decision) and that were not updated since the previous sweep, so a busy
//! key is not dropped and re-created every sweep.
//!
//! Bound: the store never holds more than `max_keys` keys in all (one counter may be shared by
//! several stores). A new key arriving at the bound first evicts the fresh keys of its shard
//! (at most once per [`FULL_SWEEP_EVERY`]); if the store is still full, the new key is refused
//! with [`Full`] and nothing is stored. Existing keys are never evicted while they hold state,
//! because forgetting a key's state would reset its limit.
//!
//! Listing: a key can be *listed* ([`Store::update_listed`], [`Store::list`]), and
//! [`Store::visit_listed`] visits only listed keys, at a cost in their number rather than the
//! store's. The cluster's rounds use it to visit only the keys something happened to.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use hashbrown::HashTable;

use crate::limiter::Nanos;

/// Keys a visit handles per hold of a shard's lock ([`Store::visit_listed`]).
pub const VISIT_BATCH: usize = 16;

/// Number of shards; a power of two.
pub const SHARDS: usize = 64;
/// A shard's table is not shrunk below this many slots.
const SHRINK_FLOOR: usize = 256;
/// How often a shard at the bound may be swept on behalf of a new key.
pub const FULL_SWEEP_EVERY: Nanos = 100_000_000;

/// The store holds `max_keys` keys already and none of them could be evicted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the key store is full")]
pub struct Full;

/// The capacity a collection of `len` entries and `capacity` should shrink to, if any: twice
/// its entries (at least `floor`), once it holds more than twice that. A table that keeps
/// less than a quarter of its room gives memory back; one whose entries come and go stays.
pub(crate) fn shrink_target(len: usize, capacity: usize, floor: usize) -> Option<usize> {
    let target = (2 * len).max(floor);
    (capacity > 2 * target).then_some(target)
}

/// The shard of a key hashed to `hash`: bits 51 to 56, which the shard's own table does not
/// read. A `hashbrown` table places an entry by the hash's low bits and tags it with the top
/// seven (each probe compares the full key only where the tag matches); a shard picked by the
/// top bits, as it was, left every key of a shard with one of two tags, so a lookup compared
/// the key with about half the entries of every group it probed (43% of a clustered node's
/// round time, `perf` on `benches/false_denials.py`).
fn shard_index(hash: u64) -> usize {
    (hash >> 51) as usize % SHARDS
}

/// A sharded map from string keys to `V`.
#[derive(Debug)]
pub struct Store<V> {
    shards: Box<[Shard<V>]>,
    hasher: foldhash::fast::SeedableRandomState,
    /// Keys held, possibly shared with other stores that draw on the same budget.
    keys: Arc<AtomicUsize>,
    max_keys: usize,
    /// When the store was last swept on behalf of a new key at the bound (0: never).
    last_full_sweep: AtomicU64,
    /// Keys removed because their value was fresh, by any sweep.
    evictions: AtomicU64,
}

/// Cache-line aligned so neighbouring shards' locks do not false-share.
#[derive(Debug)]
#[repr(align(128))]
struct Shard<V> {
    inner: Mutex<ShardInner<V>>,
}

#[derive(Debug)]
struct ShardInner<V> {
    table: HashTable<Entry<V>>,
    /// The keys of this shard that are *listed*, for [`Store::visit_listed`]: every entry
    /// with `listed` set is named here. A name may outlive its entry (an evicted key) or
    /// appear twice (a key evicted and listed again); `visit_listed` skips those.
    listed: Vec<Box<str>>,
}

#[derive(Debug)]
struct Entry<V> {
    key: Box<str>,
    value: V,
    /// Set by every update, cleared by every sweep: a key used since the last sweep is kept
    /// even if its value is fresh, so a busy key is not evicted and re-created each sweep.
    touched: bool,
    /// Whether the key is named in its shard's list (see [`Store::visit_listed`]).
    listed: bool,
}

/// What a visit does with a key: drop it, or keep it and say whether it stays listed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Visit {
    /// Remove the key.
    Drop,
    /// Keep it, listed.
    List,
    /// Keep it, not listed: later listed visits pass it by until it is listed again.
    Unlist,
    /// Keep it, listed or not as it was.
    Keep,
}

/// How a visit ([`Store::visit_sweeping`]) came to a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen {
    /// The key was listed.
    pub listed: bool,
    /// The key is in the shard this visit sweeps.
    pub swept: bool,
}

/// A dropped store (a rule removed or redefined by a reload) gives its keys back to the budget
/// it shares with the other stores.
impl<V> Drop for Store<V> {
    fn drop(&mut self) {
        let held: usize = self
            .shards
            .iter_mut()
            .map(|s| {
                s.inner
                    .get_mut()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .table
                    .len()
            })
            .sum();
        self.keys.fetch_sub(held, Ordering::Relaxed);
    }
}

impl<V> Store<V> {
    /// An empty store that counts its keys in `keys` and refuses new keys once `keys` reaches
    /// `max_keys`.
    pub fn new(keys: Arc<AtomicUsize>, max_keys: usize) -> Store<V> {
        Store {
            shards: (0..SHARDS)
                .map(|_| Shard {
                    inner: Mutex::new(ShardInner {
                        table: HashTable::new(),
                        listed: Vec::new(),
                    }),
                })
                .collect(),
            hasher: foldhash::fast::SeedableRandomState::random(),
            keys,
            max_keys,
            last_full_sweep: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
        }
    }

    /// This empty store with its keys hashed from `seed` rather than a random seed, so that
    /// which shard holds a key, and so the order of visits and which sweep
    /// ([`Store::visit_sweeping`]) sees it, repeat from run to run (the simulation's). A node
    /// keeps the random seed: its keys come from clients.
    pub fn with_hash_seed(mut self, seed: u64) -> Store<V> {
        debug_assert!(
            self.is_empty(),
            "a store's hashing changes only while it is empty"
        );
        self.hasher = foldhash::fast::SeedableRandomState::with_seed(
            seed,
            foldhash::SharedSeed::global_fixed(),
        );
        self
    }

    fn shard(&self, hash: u64) -> MutexGuard<'_, ShardInner<V>> {
        lock(&self.shards[shard_index(hash)])
    }

    /// Runs `f` on the value for `key`, atomically with respect to other calls for that key.
    ///
    /// A key not in the store starts from `fresh()`; it is stored only if `is_fresh` says the
    /// value is no longer fresh after `f` (a denied check on a new key stores nothing). At the
    /// bound, a new key gets [`Full`] and `f` does not run.
    pub fn update<R>(
        &self,
        key: &str,
        now: Nanos,
        fresh: impl FnOnce() -> V,
        is_fresh: impl Fn(&V) -> bool,
        f: impl FnOnce(&mut V) -> R,
    ) -> Result<R, Full> {
        self.update_with(key, now, false, fresh, is_fresh, f)
    }

    /// [`Store::update`], and the key (if stored) is listed for the next
    /// [`Store::visit_listed`].
    pub fn update_listed<R>(
        &self,
        key: &str,
        now: Nanos,
        fresh: impl FnOnce() -> V,
        is_fresh: impl Fn(&V) -> bool,
        f: impl FnOnce(&mut V) -> R,
    ) -> Result<R, Full> {
        self.update_with(key, now, true, fresh, is_fresh, f)
    }

    fn update_with<R>(
        &self,
        key: &str,
        now: Nanos,
        list: bool,
        fresh: impl FnOnce() -> V,
        is_fresh: impl Fn(&V) -> bool,
        f: impl FnOnce(&mut V) -> R,
    ) -> Result<R, Full> {
        let hash = self.hasher.hash_one(key);
        {
            let mut shard = self.shard(hash);
            if let Some(value) = touch(&mut shard, hash, key, list) {
                return Ok(f(value));
            }
            if !self.at_bound() {
                return Ok(self.insert_new(&mut shard, hash, key, list, fresh, is_fresh, f));
            }
        }
        // At the bound: make room if a sweep is due, then look once more. The shard lock is
        // released meanwhile because a sweep takes every shard's lock in turn.
        self.sweep_if_due(now, &is_fresh);
        let mut shard = self.shard(hash);
        if let Some(value) = touch(&mut shard, hash, key, list) {
            return Ok(f(value));
        }
        if self.at_bound() {
            return Err(Full);
        }
        Ok(self.insert_new(&mut shard, hash, key, list, fresh, is_fresh, f))
    }

    /// Runs `f` on the value of `key`, if it is stored; `None` if not (nothing is created).
    pub fn update_stored<R>(&self, key: &str, f: impl FnOnce(&mut V) -> R) -> Option<R> {
        let hash = self.hasher.hash_one(key);
        let mut shard = self.shard(hash);
        touch(&mut shard, hash, key, false).map(f)
    }

    /// Runs `f` on the value of `key` and lists it, if it is stored; `None` if not (nothing is
    /// created).
    pub fn update_stored_listed<R>(&self, key: &str, f: impl FnOnce(&mut V) -> R) -> Option<R> {
        let hash = self.hasher.hash_one(key);
        let mut shard = self.shard(hash);
        touch(&mut shard, hash, key, true).map(f)
    }

    /// Lists `key` for the next [`Store::visit_listed`], if it is stored.
    pub fn list(&self, key: &str) {
        let hash = self.hasher.hash_one(key);
        let mut shard = self.shard(hash);
        let inner = &mut *shard;
        if let Some(e) = inner.table.find_mut(hash, |e| &*e.key == key)
            && !e.listed
        {
            e.listed = true;
            inner.listed.push(e.key.clone());
        }
    }

    fn at_bound(&self) -> bool {
        self.keys.load(Ordering::Relaxed) >= self.max_keys
    }

    #[allow(clippy::too_many_arguments)]
    fn insert_new<R>(
        &self,
        shard: &mut ShardInner<V>,
        hash: u64,
        key: &str,
        list: bool,
        fresh: impl FnOnce() -> V,
        is_fresh: impl Fn(&V) -> bool,
        f: impl FnOnce(&mut V) -> R,
    ) -> R {
        let mut value = fresh();
        let result = f(&mut value);
        if !is_fresh(&value) {
            self.keys.fetch_add(1, Ordering::Relaxed);
            let hasher = &self.hasher;
            let key: Box<str> = key.into();
            if list {
                shard.listed.push(key.clone());
            }
            shard.table.insert_unique(
                hash,
                Entry {
                    key,
                    value,
                    touched: true,
                    listed: list,
                },
                |e| hasher.hash_one(&*e.key),
            );
        }
        result
    }

    /// Sweeps the whole store unless another sweep for a full store ran in the last
    /// [`FULL_SWEEP_EVERY`]: a flood of new keys at the bound costs one sweep per interval,
    /// not one per key.
    fn sweep_if_due(&self, now: Nanos, is_fresh: &impl Fn(&V) -> bool) {
        let last = self.last_full_sweep.load(Ordering::Relaxed);
        let due = last == 0 || now.saturating_sub(last) >= FULL_SWEEP_EVERY;
        if due
            && self
                .last_full_sweep
                .compare_exchange(last, now.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            // Under pressure, any fresh key may go: forgetting it changes no decision.
            self.sweep_where(is_fresh, false);
        }
    }

    /// Runs `f` on the value for `key`, or on `None` if the key is not stored.
    pub fn read<R>(&self, key: &str, f: impl FnOnce(Option<&V>) -> R) -> R {
        let hash = self.hasher.hash_one(key);
        let shard = self.shard(hash);
        f(shard.table.find(hash, |e| &*e.key == key).map(|e| &e.value))
    }

    /// Removes every key whose value `is_fresh` says is fresh and that has not been updated
    /// since the previous sweep; returns how many went. Locks one shard at a time.
    pub fn sweep(&self, is_fresh: impl Fn(&V) -> bool) -> usize {
        self.sweep_where(is_fresh, true)
    }

    /// Removes fresh keys; with `idle_only`, only those not updated since the last sweep.
    fn sweep_where(&self, is_fresh: impl Fn(&V) -> bool, idle_only: bool) -> usize {
        let evicted = self.retain(|e| {
            let keep = (idle_only && e.touched) || !is_fresh(&e.value);
            e.touched = false;
            keep
        });
        self.evictions.fetch_add(evicted as u64, Ordering::Relaxed);
        evicted
    }

    /// Runs `f` on every key and its value, one shard at a time, and removes the keys for
    /// which `f` returns `false` (not counted as evictions). For the cluster's round task;
    /// holds each shard's lock while it visits that shard, so keep `f` short.
    pub fn visit(&self, mut f: impl FnMut(&str, &mut V) -> bool) -> usize {
        self.retain(|e| f(&e.key, &mut e.value))
    }

    /// Runs `f` on every value, one shard at a time (a few microseconds of each shard's
    /// lock: `f` should only look at the value), and lists the keys it returns true for.
    pub fn list_where(&self, mut f: impl FnMut(&mut V) -> bool) {
        for shard in self.shards.iter() {
            let mut inner = lock(shard);
            let inner = &mut *inner;
            for e in inner.table.iter_mut() {
                if f(&mut e.value) && !e.listed {
                    e.listed = true;
                    inner.listed.push(e.key.clone());
                }
            }
        }
    }

    /// Runs `f` on every key, one shard at a time, and drops, lists or unlists each as `f`
    /// says; returns how many keys it visited. Holds a shard's lock for at most
    /// [`VISIT_BATCH`] keys at a time (see [`Store::visit_listed`]); a key added to a shard
    /// after its visit began is left for the next visit (a check lists it).
    pub fn visit_all(&self, mut f: impl FnMut(&str, &mut V) -> Visit) -> usize {
        self.visit_names(
            |k, v, _| f(k, v),
            |_, inner| (all_names(inner), false, false),
        )
    }

    /// Runs `f` on every listed key (each once), one shard at a time, and drops, keeps
    /// listed or unlists each as `f` says; returns how many keys it visited. Costs in the
    /// number of listed keys, not in the keys stored: the cluster's rounds visit only the
    /// keys something happened to.
    ///
    /// A shard's lock is held for at most [`VISIT_BATCH`] keys at a time, so a check on a
    /// key of the shard being visited waits for a few keys' visits, not the whole shard's
    /// (a shard of 100,000 active keys holds ~1,600 of them, several ms of round work).
    /// Between batches a check may list a key again; the next visit dedups it.
    pub fn visit_listed(&self, mut f: impl FnMut(&str, &mut V) -> Visit) -> usize {
        self.visit_names(
            |k, v, _| f(k, v),
            |_, inner| (listed_names(inner), true, false),
        )
    }

    /// [`Store::visit_listed`] (with `every`, [`Store::visit_all`]), and besides every key
    /// of one shard, `sweep` modulo [`SHARDS`], listed or not. `f` is told how the visit came
    /// to each key ([`Seen`]). Called with `sweep` counting up, it sweeps every key once per
    /// [`SHARDS`] calls at a cost of one shard's keys per call, where a whole visit would
    /// cost every key at once (the cluster's rounds forget their idle keys this way).
    pub fn visit_sweeping(
        &self,
        sweep: u64,
        every: bool,
        f: impl FnMut(&str, &mut V, Seen) -> Visit,
    ) -> usize {
        let swept = (sweep % SHARDS as u64) as usize;
        self.visit_names(f, |i, inner| {
            if every || i == swept {
                (all_names(inner), false, i == swept)
            } else {
                (listed_names(inner), true, false)
            }
        })
    }

    /// Visits, shard by shard, the keys `names` takes out of the shard (under its lock), in
    /// batches of [`VISIT_BATCH`] under the lock each; where `names` says so, only those still
    /// listed. `names` also says whether the shard is the one swept, and `f` is told so.
    fn visit_names(
        &self,
        mut f: impl FnMut(&str, &mut V, Seen) -> Visit,
        mut names: impl FnMut(usize, &mut ShardInner<V>) -> (Vec<Box<str>>, bool, bool),
    ) -> usize {
        let mut visited = 0;
        let mut removed = 0;
        for (i, shard) in self.shards.iter().enumerate() {
            let (todo, only_listed, swept) = names(i, &mut lock(shard));
            let mut todo = todo.into_iter().peekable();
            let removed_before = removed;
            while todo.peek().is_some() {
                let mut inner = lock(shard);
                let inner = &mut *inner;
                for name in todo.by_ref().take(VISIT_BATCH) {
                    let hash = self.hasher.hash_one(&*name);
                    let Ok(mut entry) = inner.table.find_entry(hash, |e| e.key == name) else {
                        continue;
                    };
                    // A name that outlived its listing (the key was unlisted since).
                    if only_listed && !entry.get().listed {
                        continue;
                    }
                    visited += 1;
                    let e = entry.get_mut();
                    let seen = Seen {
                        listed: e.listed,
                        swept,
                    };
                    match f(&e.key, &mut e.value, seen) {
                        Visit::Drop => {
                            entry.remove();
                            removed += 1;
                        }
                        Visit::List => {
                            e.listed = true;
                            inner.listed.push(name);
                        }
                        Visit::Unlist => e.listed = false,
                        // `visit_all` took every name off the list: put a listed one back.
                        Visit::Keep => {
                            if e.listed {
                                inner.listed.push(name);
                            }
                        }
                    }
                }
            }
            if removed > removed_before {
                self.shrink(&mut lock(shard));
            }
        }
        self.keys.fetch_sub(removed, Ordering::Relaxed);
        visited
    }

    /// How many keys are listed.
    pub fn listed(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                s.inner
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .table
                    .iter()
                    .filter(|e| e.listed)
                    .count()
            })
            .sum()
    }

    /// Keeps the entries `keep` says to keep, one shard at a time, and returns how many went.
    fn retain(&self, mut keep: impl FnMut(&mut Entry<V>) -> bool) -> usize {
        let mut removed = 0;
        for shard in self.shards.iter() {
            let mut inner = shard
                .inner
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let before = inner.table.len();
            inner.table.retain(&mut keep);
            removed += before - inner.table.len();
            self.shrink(&mut inner);
        }
        self.keys.fetch_sub(removed, Ordering::Relaxed);
        removed
    }

    /// Gives memory back after a burst of keys has gone, but keeps a floor: keys that come
    /// and go every sweep would otherwise shrink and regrow the table each time.
    fn shrink(&self, inner: &mut ShardInner<V>) {
        let table = inner.table.capacity();
        if let Some(target) = shrink_target(inner.table.len(), table, SHRINK_FLOOR) {
            let hasher = &self.hasher;
            inner.table.shrink_to(target, |e| hasher.hash_one(&*e.key));
        }
        let listed = inner.listed.capacity();
        if let Some(target) = shrink_target(inner.listed.len(), listed, SHRINK_FLOOR) {
            inner.listed.shrink_to(target);
        }
    }

    /// Keys evicted so far, by background sweeps and by sweeps made for a new key at the bound.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    /// Keys held by this store.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                s.inner
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .table
                    .len()
            })
            .sum()
    }

    /// Whether this store holds no key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A shard's lock. A panic while holding it cannot leave a value half-updated in a way that
/// matters more than refusing all further checks would, so poisoning is ignored.
fn lock<V>(shard: &Shard<V>) -> MutexGuard<'_, ShardInner<V>> {
    shard
        .inner
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Every key of a shard, for a visit of them all; the shard's list is emptied (a visit keeps
/// a listed key listed by naming it again).
fn all_names<V>(inner: &mut ShardInner<V>) -> Vec<Box<str>> {
    inner.listed.clear();
    inner.table.iter().map(|e| e.key.clone()).collect()
}

/// The listed keys of a shard, each once, taken off its list (a visit names again those that
/// stay listed).
fn listed_names<V>(inner: &mut ShardInner<V>) -> Vec<Box<str>> {
    let mut names = std::mem::take(&mut inner.listed);
    names.sort_unstable();
    names.dedup();
    names
}

/// The value of `key` if the shard holds it, marked as used since the last sweep (and
/// listed, with `list`).
fn touch<'s, V>(
    shard: &'s mut ShardInner<V>,
    hash: u64,
    key: &str,
    list: bool,
) -> Option<&'s mut V> {
    let entry = shard.table.find_mut(hash, |e| &*e.key == key)?;
    entry.touched = true;
    if list && !entry.listed {
        entry.listed = true;
        shard.listed.push(entry.key.clone());
    }
    Some(&mut entry.value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    fn store(max: usize) -> Store<u64> {
        Store::new(Arc::new(AtomicUsize::new(0)), max)
    }

    fn add(s: &Store<u64>, key: &str, n: u64) -> Result<u64, Full> {
        s.update(
            key,
            0,
            || 0,
            |v| *v == 0,
            |v| {
                *v += n;
                *v
            },
        )
    }

    /// The keys of one shard must spread over the seven-bit tags its table compares before
    /// a key (`hashbrown` takes them from the hash's top bits): picking the shard from those
    /// bits left two tags per shard, and every lookup compared half the keys it probed.
    #[test]
    fn a_shards_keys_spread_over_its_tables_tags() {
        let s = store(1);
        let mut tags = std::collections::HashSet::new();
        let mut in_shard = 0;
        for i in 0..100_000 {
            let hash = s.hasher.hash_one(format!("user-{i}"));
            if shard_index(hash) == 3 {
                in_shard += 1;
                tags.insert(hash >> 57);
            }
        }
        assert!(in_shard > 1_000, "{in_shard} keys in the shard");
        assert!(
            tags.len() >= 100,
            "{} tags of 128 for {in_shard} keys",
            tags.len()
        );
    }

    #[test]
    fn store_update_is_atomic_per_key() {
        let s = Arc::new(store(1_000));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let s = s.clone();
                thread::spawn(move || {
                    for i in 0..10_000 {
                        add(&s, &format!("k{}", i % 7), 1).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let total: u64 = (0..7)
            .map(|i| s.read(&format!("k{i}"), |v| *v.unwrap()))
            .sum();
        assert_eq!(total, 40_000);
        assert_eq!(s.len(), 7);
    }

    #[test]
    fn store_does_not_keep_values_that_stay_fresh() {
        let s = store(10);
        assert_eq!(add(&s, "a", 0), Ok(0));
        assert!(s.is_empty());
        assert_eq!(s.keys.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn store_sweep_evicts_only_fresh_values() {
        let s = store(10);
        add(&s, "a", 1).unwrap();
        add(&s, "b", 2).unwrap();
        // Updated since the last sweep: kept even though fresh.
        assert_eq!(s.sweep(|v| *v < 2), 0);
        assert_eq!(s.sweep(|v| *v < 2), 1);
        assert_eq!(s.len(), 1);
        assert_eq!(s.keys.load(Ordering::Relaxed), 1);
        assert_eq!(s.read("b", |v| v.copied()), Some(2));
    }

    #[test]
    fn store_keeps_a_fresh_key_that_is_used_between_sweeps() {
        let s = store(10);
        for _ in 0..5 {
            add(&s, "busy", 0).unwrap_or_default();
            add(&s, "busy", 1).unwrap();
            assert_eq!(s.sweep(|_| true), 0);
        }
        assert_eq!(s.sweep(|_| true), 1);
    }

    #[test]
    fn store_at_bound_refuses_new_keys_but_serves_known_ones() {
        let s = store(3);
        for k in ["a", "b", "c"] {
            add(&s, k, 1).unwrap();
        }
        assert_eq!(add(&s, "d", 1), Err(Full));
        assert_eq!(add(&s, "a", 1), Ok(2));
        assert_eq!(s.len(), 3);
    }

    #[test]
    fn store_at_bound_evicts_fresh_keys_for_a_new_one() {
        let s = store(2);
        add(&s, "a", 1).unwrap();
        add(&s, "b", 3).unwrap();
        // With values of 2 or less counting as fresh, "a" can give its place to "c".
        let fresh_below_3 = |v: &u64| *v < 3;
        let r = s.update(
            "c",
            1,
            || 0,
            fresh_below_3,
            |v| {
                *v += 5;
                *v
            },
        );
        assert_eq!(r, Ok(5));
        assert_eq!(s.len(), 2);
        assert_eq!(s.evictions(), 1);
        assert_eq!(s.read("a", |v| v.copied()), None);
        // The next full sweep is not due for FULL_SWEEP_EVERY: a new key is refused.
        assert_eq!(
            s.update("d", 2, || 0, fresh_below_3, |v| *v += 5),
            Err(Full)
        );
    }

    fn listed_add(s: &Store<u64>, key: &str, n: u64) {
        s.update_listed(key, 0, || 0, |v| *v == 0, |v| *v += n)
            .unwrap();
    }

    fn visit_listed(s: &Store<u64>, f: impl Fn(&str, u64) -> Visit) -> Vec<String> {
        let mut seen = Vec::new();
        s.visit_listed(|k, v| {
            seen.push(k.to_owned());
            f(k, *v)
        });
        seen.sort();
        seen
    }

    #[test]
    fn store_visits_only_listed_keys_each_once() {
        let s = store(10);
        listed_add(&s, "a", 1);
        listed_add(&s, "b", 1);
        add(&s, "c", 1).unwrap();
        listed_add(&s, "a", 1);
        assert_eq!(s.listed(), 2);
        // Kept listed, then unlisted: a listed key is visited once per pass.
        assert_eq!(visit_listed(&s, |_, _| Visit::List), ["a", "b"]);
        assert_eq!(
            visit_listed(&s, |k, _| if k == "a" {
                Visit::Unlist
            } else {
                Visit::List
            }),
            ["a", "b"]
        );
        assert_eq!(visit_listed(&s, |_, _| Visit::Unlist), ["b"]);
        assert_eq!(visit_listed(&s, |_, _| Visit::List), Vec::<String>::new());
        // Listed again by an update or by name; a name not stored lists nothing.
        listed_add(&s, "c", 1);
        s.list("a");
        s.list("zz");
        assert_eq!(visit_listed(&s, |_, _| Visit::List), ["a", "c"]);
        assert_eq!(s.read("c", |v| v.copied()), Some(2));
    }

    #[test]
    fn store_listed_visits_survive_eviction_and_drop_keys() {
        let s = store(10);
        listed_add(&s, "a", 1);
        listed_add(&s, "b", 2);
        // "a" evicted while listed, then back: its name is in the list twice, visited once.
        assert_eq!(s.sweep(|_| false), 0);
        assert_eq!(s.sweep(|v| *v == 1), 1);
        listed_add(&s, "a", 5);
        assert_eq!(visit_listed(&s, |_, _| Visit::List), ["a", "b"]);
        // A listed visit may drop a key: it goes from the store and the budget.
        assert_eq!(
            visit_listed(&s, |k, _| if k == "b" { Visit::Drop } else { Visit::List }),
            ["a", "b"]
        );
        assert_eq!(s.len(), 1);
        assert_eq!(s.keys.load(Ordering::Relaxed), 1);
        assert_eq!(visit_listed(&s, |_, _| Visit::List), ["a"]);
    }

    /// Shards of many more keys than a visit's batch: every key is visited once, and drops,
    /// listings and the budget come out as with a single batch.
    #[test]
    fn store_visits_in_batches_visit_each_key_once() {
        let n = SHARDS * VISIT_BATCH * 3;
        let s = store(n);
        let names: Vec<String> = (0..n).map(|i| format!("key-{i}")).collect();
        for (i, k) in names.iter().enumerate() {
            listed_add(&s, k, i as u64 + 1);
        }
        // Drop every third, unlist every third, keep the rest listed.
        let what = |v: u64| match v % 3 {
            0 => Visit::Drop,
            1 => Visit::Unlist,
            _ => Visit::List,
        };
        let mut all = names.clone();
        all.sort();
        assert_eq!(visit_listed(&s, |_, v| what(v)), all);
        let kept: Vec<&String> = names
            .iter()
            .filter(|k| s.read(k, |v| v.is_some()))
            .collect();
        assert_eq!(kept.len(), n - n / 3);
        assert_eq!(s.keys.load(Ordering::Relaxed), n - n / 3);
        let mut listed: Vec<String> = names
            .iter()
            .enumerate()
            .filter(|(i, _)| (i + 1) % 3 == 2)
            .map(|(_, k)| k.clone())
            .collect();
        listed.sort();
        assert_eq!(s.listed(), listed.len());
        assert_eq!(visit_listed(&s, |_, _| Visit::List), listed);
        // A full visit sees every stored key once and lists them all again.
        let mut seen = 0;
        assert_eq!(
            s.visit_all(|_, _| {
                seen += 1;
                Visit::List
            }),
            n - n / 3
        );
        assert_eq!(seen, n - n / 3);
        assert_eq!(s.listed(), n - n / 3);
    }

    #[test]
    fn store_visit_all_sets_every_listing() {
        let s = store(10);
        for (k, n) in [("a", 1), ("b", 2), ("c", 3)] {
            add(&s, k, n).unwrap();
        }
        listed_add(&s, "a", 0);
        let visited = s.visit_all(|_, v| match *v {
            1 => Visit::Unlist,
            2 => Visit::List,
            _ => Visit::Drop,
        });
        assert_eq!(visited, 3);
        assert_eq!(s.len(), 2);
        assert_eq!(s.keys.load(Ordering::Relaxed), 2);
        assert_eq!(s.listed(), 1);
        assert_eq!(visit_listed(&s, |_, _| Visit::List), ["b"]);
    }

    /// A sweeping visit sees the listed keys and, besides, every key of one shard; over
    /// [`SHARDS`] sweeps every key once. An unlisted key kept stays unlisted.
    #[test]
    fn a_sweeping_visit_sees_every_key_once_per_cycle() {
        let n = 2_000;
        let s = store(n);
        for i in 0..n {
            add(&s, &format!("key-{i}"), 1).unwrap();
        }
        listed_add(&s, "key-0", 1);
        let mut unlisted_seen = std::collections::HashMap::new();
        let mut listed_seen = 0;
        for sweep in 0..SHARDS as u64 {
            s.visit_sweeping(sweep, false, |k, _, seen| {
                assert!(seen.swept || seen.listed, "{k}");
                if seen.listed {
                    listed_seen += 1;
                    Visit::List
                } else {
                    *unlisted_seen.entry(k.to_owned()).or_insert(0) += 1;
                    Visit::Keep
                }
            });
        }
        // "key-0" in every sweep (listed), every other key in exactly one.
        assert_eq!(listed_seen, SHARDS);
        assert_eq!(unlisted_seen.len(), n - 1);
        assert!(unlisted_seen.values().all(|&c| c == 1));
        assert_eq!(s.listed(), 1);
        // A sweep may drop the unlisted keys it sees.
        let dropped: usize = (0..SHARDS as u64)
            .map(|sweep| {
                let mut d = 0;
                s.visit_sweeping(sweep, false, |_, _, seen| {
                    if seen.listed {
                        Visit::List
                    } else {
                        d += 1;
                        Visit::Drop
                    }
                });
                d
            })
            .sum();
        assert_eq!(dropped, n - 1);
        assert_eq!(s.len(), 1);
        assert_eq!(s.keys.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn store_budget_is_shared_between_stores() {
        let keys = Arc::new(AtomicUsize::new(0));
        let a: Store<u64> = Store::new(keys.clone(), 2);
        let b: Store<u64> = Store::new(keys.clone(), 2);
        add(&a, "x", 1).unwrap();
        add(&b, "x", 1).unwrap();
        assert_eq!(add(&a, "y", 1), Err(Full));
        assert_eq!(keys.load(Ordering::Relaxed), 2);
    }
}
