//! The engine: rules, their keyed state, and the clock. The only code that reads the time.
//!
//! A check finds the rule, reads the clock once, and applies the rule's limits to the key's
//! state under the key's shard lock ([`Store::update`]). Nothing here does I/O or awaits; a
//! shaping wait is returned in the decision for the caller to serve
//! ([`Clock::sleep`]).
//!
//! Scope: on a single node, global and local rules count the same way, here. In a cluster
//! ([`Engine::clustered`]), a `scope = "global"` rule's keys live in [`Global`] instead, whose
//! check takes the same arguments and reads only the key's lease or share (still one shard
//! lock, no network; see docs/design.md).
//!
//! Reload: [`Engine::reload`] builds the engine for a new rule list from a running one,
//! sharing the state of every rule whose definition did not change (the caller swaps it in,
//! see `server::reload`). A redefined rule starts with fresh counts; in a cluster, the global
//! rules cannot change without a restart.
//!
//! Reserve, then settle: [`Engine::reserve_uncounted`] is a check that, admitted, is also
//! remembered ([`crate::reserve::Reservations`]); [`Engine::settle`] gives back what the work
//! did not use, into the window or bucket it came from ([`KeyState::refund`]), or charges
//! what it used beyond. A clustered key's counts only grow, so there a refund becomes
//! *credit* at this node, which later checks of the key spend first (design.md §3.7).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::clock::Clock;
use crate::cluster::Exchange;
use crate::cluster::global::{Global, GlobalError, LOG_SUBSLOTS, Params};
use crate::cluster::tree::{Tree, TreeError, TreeKeys, TreeParams};
use crate::config::{Rule, Scope};
use crate::counter::Actor;
use crate::limiter::{Algorithm, Decision, KeyState, Limit, Nanos, Receipt, SECOND, Verdict};
use crate::metrics::Striped;
use crate::reserve::{
    Credit, Credits, Fade, ReservationId, ReservationParams, Reservations, SettleError,
};
use crate::store::{Full, Store};

/// Holds a check [`Engine::lease_pause`] paused until `done` (its lease is in:
/// [`Engine::lease_in`]), looking every millisecond, for at most `pause` plus as long again
/// and a few milliseconds (a round that runs late under load still lets it go admitted).
/// Returns how long it held the check.
pub async fn hold_for_lease(clock: &dyn Clock, done: impl Fn() -> bool, pause: Nanos) -> Nanos {
    let started = clock.now();
    let limit = 2 * pause + 10 * crate::limiter::MILLISECOND;
    let mut waited = 0;
    while !done() && waited < limit {
        clock.sleep(crate::limiter::MILLISECOND).await;
        waited += crate::limiter::MILLISECOND;
    }
    clock.now().saturating_sub(started)
}

/// What a key at the store's bound is told: try again after this long (fresh keys are swept
/// at least this often).
pub const STORE_FULL_RETRY: Nanos = SECOND;

/// The outcome of a check, for counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted (possibly after a shaping wait).
    Allowed,
    /// Denied for now.
    Denied,
    /// The cost can never be admitted under this rule.
    Never,
    /// A new key arrived while the store was full; denied without tracking.
    StoreFull,
}

impl Outcome {
    /// Every outcome, in the order metrics list them.
    pub const ALL: [Outcome; 4] = [
        Outcome::Allowed,
        Outcome::Denied,
        Outcome::Never,
        Outcome::StoreFull,
    ];

    /// The label used in responses and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Denied => "denied",
            Outcome::Never => "never",
            Outcome::StoreFull => "store_full",
        }
    }
}

/// A rule with its keys and counters.
#[derive(Debug)]
pub struct RuleState {
    /// The rule as configured.
    pub rule: Rule,
    /// Its keys. Shared with the rule's next definition when a reload changes only the
    /// numbers of its limits ([`keeps_counts`]), so the counts carry over.
    store: Arc<Store<KeyState>>,
    /// Checks by [`Outcome`], indexed as [`Outcome::ALL`]. Shared with the rule's next
    /// definition after a reload, so its metrics stay monotonic.
    outcomes: Arc<Striped<4>>,
    /// Clustered checks denied while the node's own view of the key's global remaining was
    /// at least the cost (design §3.3.3): the cluster's cost in false 429s. Shared across a
    /// reload like `outcomes`.
    denied_with_room: Arc<Striped<1>>,
    /// In a cluster, where a global rule's keys live.
    global: Option<Counted>,
    /// On a clustered rule, room settles gave back at this node (the cluster's counts only
    /// grow, so a refund cannot lower them): spent first by later checks of the key here.
    credits: Option<CreditStore>,
}

/// A clustered rule's credits by key ([`Credits`]), with the count of keys holding some, read
/// without a lock by every check: none (the common case) skips the lookup.
#[derive(Debug)]
struct CreditStore {
    keys: Arc<AtomicUsize>,
    store: Store<Credits>,
}

impl CreditStore {
    fn new(max_keys: usize) -> CreditStore {
        let keys = Arc::new(AtomicUsize::new(0));
        CreditStore {
            store: Store::new(keys.clone(), max_keys),
            keys,
        }
    }

    fn any(&self) -> bool {
        self.keys.load(Ordering::Relaxed) > 0
    }
}

/// What a settle needs of a reservation.
#[derive(Debug)]
pub struct Held {
    /// The rule's state the reservation was charged to. After a reload that redefined or
    /// removed the rule it is no longer the one served, and nothing is given back.
    state: Weak<RuleState>,
    rule: Box<str>,
    key: Box<str>,
    cost: u64,
    /// When it was charged.
    at: Nanos,
    charge: Charge,
}

/// Where a reservation's charge went.
#[derive(Debug)]
enum Charge {
    /// This node's store: where each limit counted it.
    Local(Box<[Receipt]>),
    /// The cluster's counts (or a credit here). A bucket's credit fades from `origin`: the
    /// charge's time, or the time of the earliest credit it was paid from.
    Cluster { origin: Nanos },
}

/// What a settle did.
#[derive(Debug, Clone)]
pub struct Settled<'e> {
    /// The rule's name.
    pub rule: String,
    /// The key.
    pub key: String,
    /// The reserved cost.
    pub reserved: u64,
    /// The actual cost settled.
    pub cost: u64,
    /// Units given back (below `reserved - cost` when the window closed or the bucket
    /// refilled meanwhile, see [`KeyState::refund`]).
    pub refunded: u64,
    /// Units charged beyond the reservation.
    pub charged: u64,
    /// Units beyond the reservation that could not be charged: a clustered key whose node
    /// held no room for them, a key the store had no room for, or a rule no longer served.
    pub unpaid: u64,
    /// Where the key stands afterwards (a status); `None` if the rule is no longer served.
    pub standing: Option<Checked<'e>>,
}

/// Where the cluster counts a global rule's keys.
#[derive(Debug)]
enum Counted {
    /// In [`Global`], under this index.
    Mesh(Arc<Global>, usize),
    /// In the tree's keys, under the rule's name (no lock of the [`Tree`]'s).
    Tree(Arc<TreeKeys>),
}

impl RuleState {
    /// Checks counted with `outcome` so far.
    pub fn outcome_count(&self, outcome: Outcome) -> u64 {
        self.outcomes.get(outcome as usize)
    }

    /// Clustered checks denied although the key's global remaining covered their cost.
    pub fn denied_with_room(&self) -> u64 {
        self.denied_with_room.get(0)
    }

    /// Keys this rule tracks now.
    pub fn active_keys(&self) -> usize {
        match &self.global {
            Some(Counted::Mesh(g, i)) => g.rule_keys(*i),
            Some(Counted::Tree(t)) => t.rule_keys(&self.rule.name),
            None => self.store.len(),
        }
    }

    /// Whether the cluster counts this rule's keys (a global rule on a clustered node).
    pub fn is_clustered(&self) -> bool {
        self.global.is_some()
    }
}

/// A decision together with the rule it was made under.
#[derive(Debug, Clone, Copy)]
pub struct Checked<'e> {
    /// The rule.
    pub rule: &'e RuleState,
    /// Which of the rule's limits the decision reports (the most restrictive).
    pub limit_index: usize,
    /// The decision.
    pub decision: Decision,
    /// How it is counted.
    pub outcome: Outcome,
    /// The cost checked (1 for a status).
    pub cost: u64,
}

/// No rule has that name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no rule named \"{0}\"")]
pub struct UnknownRule(pub String);

/// Rules, keyed state and the clock.
#[derive(Debug)]
pub struct Engine {
    clock: Arc<dyn Clock>,
    /// Each rule's state behind an `Arc`, so a reloaded engine can share an unchanged rule's
    /// keys with the engine that in-flight checks still use.
    rules: HashMap<Box<str>, Arc<RuleState>, foldhash::fast::RandomState>,
    /// Rule names in config order, for stable metrics output.
    order: Vec<Box<str>>,
    /// The key budget every rule's store draws on (carried into a reloaded engine).
    keys: Arc<AtomicUsize>,
    max_keys: usize,
    /// In a cluster, what counts the global rules (built once, for the process).
    global: Option<Exchange>,
    /// Evictions counted by rules that earlier reloads removed or redefined, so the total
    /// stays monotonic.
    evicted_before: u64,
    /// Open reservations (carried into a reloaded engine).
    reservations: Arc<Reservations<Held>>,
}

/// What a reload did to each rule, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuleChanges {
    /// Same definition: the rule keeps its keys and counts.
    pub kept: Vec<String>,
    /// Only the numbers of its limits changed (limit, burst; not for a leaky bucket): the
    /// rule keeps its keys and counts, read against the new numbers.
    pub relimited: Vec<String>,
    /// Redefined otherwise (an algorithm, a period, the limits, scope or `max_wait`): starts
    /// with fresh counts.
    pub changed: Vec<String>,
    /// New rules.
    pub added: Vec<String>,
    /// Rules no longer configured: their keys are dropped.
    pub removed: Vec<String>,
}

/// A reload that cannot be applied; the running rules stay in force.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReloadError {
    /// On a clustered node the global rules are counted by a [`Global`] (or a tree), and
    /// every node must agree on how each counts: over the mesh a global rule can be added,
    /// removed or relimited live, but a change of a limit's algorithm or period needs a
    /// (rolling) restart, and over the tree any change does.
    #[error(
        "changing global rules in a cluster needs a (rolling) restart: {} (the running rules stay in force)",
        .0.join(", ")
    )]
    GlobalRulesChanged(Vec<String>),
}

impl Engine {
    /// An engine serving `rules`, holding at most `max_keys` keys across them all.
    pub fn new(rules: Vec<Rule>, max_keys: usize, clock: Arc<dyn Clock>) -> Engine {
        Engine::build(
            rules,
            max_keys,
            clock,
            Arc::new(AtomicUsize::new(0)),
            None,
            &HashMap::default(),
            Arc::default(),
        )
    }

    /// This engine with reservations bounded by `params` instead of the defaults (any open
    /// reservations are dropped: call before serving).
    pub fn with_reservations(mut self, params: ReservationParams) -> Engine {
        self.reservations = Arc::new(Reservations::new(params));
        self
    }

    /// The open reservations and their counters.
    pub fn reservations(&self) -> &Reservations<Held> {
        &self.reservations
    }

    /// An engine whose global rules are counted across the cluster by a [`Global`] acting as
    /// `me` (returned too, for the cluster task to drive). Local rules stay local.
    pub fn clustered(
        rules: Vec<Rule>,
        max_keys: usize,
        clock: Arc<dyn Clock>,
        me: Actor,
        params: Params,
    ) -> Result<(Engine, Arc<Global>), GlobalError> {
        let keys = Arc::new(AtomicUsize::new(0));
        let global_rules = rules
            .iter()
            .filter(|r| r.scope == Scope::Global)
            .map(|r| (r.name.clone(), r.limits.clone()))
            .collect();
        let global = Arc::new(Global::new(
            me,
            params,
            global_rules,
            keys.clone(),
            max_keys,
        )?);
        let engine = Engine::build(
            rules,
            max_keys,
            clock,
            keys,
            Some(Exchange::Mesh(global.clone())),
            &HashMap::default(),
            Arc::default(),
        );
        Ok((engine, global))
    }

    /// An engine whose global rules are counted across the cluster by an aggregation [`Tree`]
    /// acting as `me` (returned too, for the cluster task to drive): fixed windows of one
    /// limit only. Local rules stay local. The tree holds at most `max_keys` keys of its own.
    pub fn clustered_tree(
        rules: Vec<Rule>,
        max_keys: usize,
        clock: Arc<dyn Clock>,
        me: Actor,
        params: TreeParams,
    ) -> Result<(Engine, Arc<Mutex<Tree>>), TreeError> {
        let mut global_rules = Vec::new();
        for r in rules.iter().filter(|r| r.scope == Scope::Global) {
            match &r.limits[..] {
                [limit] => global_rules.push((r.name.clone(), *limit)),
                _ => return Err(TreeError::Unsupported(r.name.clone())),
            }
        }
        let params = TreeParams { max_keys, ..params };
        let tree = Tree::new(me, global_rules, params, clock.now())?;
        let keys = tree.keys();
        let tree = Arc::new(Mutex::new(tree));
        let engine = Engine::build(
            rules,
            max_keys,
            clock,
            Arc::new(AtomicUsize::new(0)),
            Some(Exchange::Tree(tree.clone(), keys)),
            &HashMap::default(),
            Arc::default(),
        );
        Ok((engine, tree))
    }

    /// Builds the rules, taking each rule's state from `previous` when it holds one of the
    /// same definition, and its outcome counters when it holds one of the same name.
    fn build(
        rules: Vec<Rule>,
        max_keys: usize,
        clock: Arc<dyn Clock>,
        keys: Arc<AtomicUsize>,
        global: Option<Exchange>,
        previous: &HashMap<Box<str>, Arc<RuleState>, foldhash::fast::RandomState>,
        reservations: Arc<Reservations<Held>>,
    ) -> Engine {
        let order = rules.iter().map(|r| r.name.as_str().into()).collect();
        let rules = rules
            .into_iter()
            .map(|rule| {
                let old = previous.get(rule.name.as_str());
                if let Some(old) = old.filter(|old| old.rule == rule) {
                    return (rule.name.as_str().into(), old.clone());
                }
                let global = match &global {
                    _ if rule.scope != Scope::Global => None,
                    None => None,
                    Some(Exchange::Mesh(g)) => g
                        .rule_index(&rule.name)
                        .map(|i| Counted::Mesh(g.clone(), i)),
                    Some(Exchange::Tree(_, keys)) => Some(Counted::Tree(keys.clone())),
                };
                let store = match old {
                    Some(old) if keeps_counts(&old.rule, &rule) => {
                        // Its keys carry over; a bucket's spent tokens carry into the new burst.
                        if old
                            .rule
                            .limits
                            .iter()
                            .zip(&rule.limits)
                            .any(|(a, b)| a.algorithm() == Algorithm::TokenBucket && a != b)
                        {
                            let now = clock.now();
                            old.store.visit(|_, k| {
                                k.relimit(&old.rule.limits, &rule.limits, now);
                                true
                            });
                        }
                        old.store.clone()
                    }
                    _ => Arc::new(Store::new(keys.clone(), max_keys)),
                };
                let state = RuleState {
                    store,
                    outcomes: old.map(|o| o.outcomes.clone()).unwrap_or_default(),
                    denied_with_room: old.map(|o| o.denied_with_room.clone()).unwrap_or_default(),
                    rule,
                    credits: global.as_ref().map(|_| CreditStore::new(max_keys)),
                    global,
                };
                (state.rule.name.as_str().into(), Arc::new(state))
            })
            .collect();
        Engine {
            clock,
            rules,
            order,
            keys,
            max_keys,
            global,
            evicted_before: 0,
            reservations,
        }
    }

    /// The engine for `rules`, built from this one: a rule whose definition is unchanged
    /// shares this engine's state for it (its keys and counts carry over, and checks still
    /// running on this engine count in the same place); a rule whose limits changed only in
    /// their numbers keeps its keys and counts under the new numbers ([`keeps_counts`]);
    /// any other redefined rule and a new rule start fresh; a removed rule's keys go once the
    /// last in-flight check on this engine is done.
    ///
    /// On a clustered engine over the mesh, the global rules live in the [`Global`], which
    /// outlives reloads: a global rule whose limits change only in their numbers is relimited
    /// in place ([`Global::relimit`]: the cluster runs the smaller of its members' numbers),
    /// a new one is added to it ([`Global::add_rule`]) and a removed one stops being checked
    /// there while its keys drain ([`Global::remove_rule`]); a change of scope is a removal
    /// and an addition. A reload that would change a global limit's algorithm or period (or
    /// a leaky bucket's numbers), and over the tree any change of a global rule, is refused
    /// as a whole, and changes nothing. This engine keeps its rules; only the keys of a
    /// relimited token bucket, which the new engine shares, are carried to the new burst in
    /// place.
    pub fn reload(&self, rules: Vec<Rule>) -> Result<(Engine, RuleChanges), ReloadError> {
        if let Some(exchange) = &self.global {
            let globals = |rules: &mut dyn Iterator<Item = &Rule>| {
                let mut list: Vec<&Rule> = rules.filter(|r| r.scope == Scope::Global).collect();
                list.sort_by(|a, b| a.name.cmp(&b.name));
                list.into_iter().cloned().collect::<Vec<_>>()
            };
            let before = globals(&mut self.rules.values().map(|r| &r.rule));
            let after = globals(&mut rules.iter());
            let changed: Vec<&Rule> = after.iter().filter(|r| !before.contains(r)).collect();
            match exchange {
                // Over the tree every node must run the same global rules: its view hash
                // covers them.
                Exchange::Tree(..) => {
                    let mut names: Vec<String> = before
                        .iter()
                        .chain(&after)
                        .filter(|r| !(before.contains(r) && after.contains(r)))
                        .map(|r| format!("\"{}\"", r.name))
                        .collect();
                    names.dedup();
                    if !names.is_empty() {
                        return Err(ReloadError::GlobalRulesChanged(names));
                    }
                }
                // Over the mesh a global rule is added, removed or relimited in place
                // (design §3.8); only a change of a limit's algorithm or period (or a leaky
                // bucket's numbers) needs a restart. Nothing changes unless all of it can.
                Exchange::Mesh(global) => {
                    let refused: Vec<String> = changed
                        .iter()
                        .filter_map(|r| {
                            let e = global.can_add_rule(&r.name, &r.limits).err()?;
                            Some(format!("\"{}\" ({e})", r.name))
                        })
                        .collect();
                    if !refused.is_empty() {
                        return Err(ReloadError::GlobalRulesChanged(refused));
                    }
                    for rule in &changed {
                        if let Err(e) = global.add_rule(&rule.name, &rule.limits) {
                            return Err(ReloadError::GlobalRulesChanged(vec![format!(
                                "\"{}\" ({e})",
                                rule.name
                            )]));
                        }
                    }
                    for rule in before
                        .iter()
                        .filter(|b| !after.iter().any(|a| a.name == b.name))
                    {
                        if let Some(i) = global.rule_index(&rule.name) {
                            global.remove_rule(i);
                        }
                    }
                }
            }
        }
        let mut changes = RuleChanges::default();
        for rule in &rules {
            let name = rule.name.clone();
            match self.rules.get(rule.name.as_str()) {
                Some(old) if old.rule == *rule => changes.kept.push(name),
                Some(old) if keeps_counts(&old.rule, rule) => changes.relimited.push(name),
                Some(_) => changes.changed.push(name),
                None => changes.added.push(name),
            }
        }
        changes.removed = self
            .order
            .iter()
            .filter(|name| !rules.iter().any(|r| *r.name == ***name))
            .map(|name| name.to_string())
            .collect();
        let mut engine = Engine::build(
            rules,
            self.max_keys,
            self.clock.clone(),
            self.keys.clone(),
            self.global.clone(),
            &self.rules,
            self.reservations.clone(),
        );
        let dropped: u64 = self
            .rules
            .iter()
            .filter(|(name, old)| {
                !engine
                    .rules
                    .get(*name)
                    .is_some_and(|new| Arc::ptr_eq(&old.store, &new.store))
            })
            .map(|(_, old)| old.store.evictions())
            .sum();
        engine.evicted_before = self.evicted_before + dropped;
        Ok((engine, changes))
    }

    /// Keys held now across every rule (the budget `max_keys` bounds).
    pub fn keys(&self) -> usize {
        self.keys.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The clock decisions are made on.
    pub fn clock(&self) -> &dyn Clock {
        &*self.clock
    }

    /// The clock decisions are made on, shared.
    pub fn shared_clock(&self) -> Arc<dyn Clock> {
        self.clock.clone()
    }

    /// The named rule.
    pub fn rule(&self, name: &str) -> Result<&RuleState, UnknownRule> {
        self.rules
            .get(name)
            .map(|r| &**r)
            .ok_or_else(|| UnknownRule(name.to_owned()))
    }

    /// Every rule, in config order.
    pub fn rules(&self) -> impl Iterator<Item = &RuleState> {
        self.order
            .iter()
            .filter_map(|name| self.rules.get(name).map(|r| &**r))
    }

    /// May `key` spend `cost` under `rule` now? Charges the key if admitted. `max_wait` is how
    /// long the caller is willing to be held; the rule's own `max_wait` caps it.
    pub fn check(
        &self,
        rule: &str,
        key: &str,
        cost: u64,
        max_wait: Nanos,
    ) -> Result<Checked<'_>, UnknownRule> {
        let checked = self.check_uncounted(rule, key, cost, max_wait)?;
        self.count(&checked);
        Ok(checked)
    }

    /// Counts a check's outcome (what [`Engine::check`] does after deciding).
    pub fn count(&self, checked: &Checked<'_>) {
        checked.rule.outcomes.add(checked.outcome as usize, 1);
        if checked.outcome == Outcome::Denied
            && checked.rule.global.is_some()
            && checked.decision.remaining >= checked.cost
        {
            checked.rule.denied_with_room.add(0, 1);
        }
    }

    /// How long to hold a check of `key` that a clustered rule denied only because this node
    /// holds no lease for the key yet, and what its lease will be in by
    /// ([`Engine::lease_in`]): a key in the few milliseconds between a round's boundary and
    /// its instant (docs/design.md §3.3.1), one in a window this node holds no room of it in
    /// ([`Global::first_lease`]: a node back from a restart, in the window it came back in),
    /// or over the tree a key new at this node (the next round's grants). `None` for every
    /// other decision.
    pub fn lease_pause(&self, checked: &Checked<'_>, key: &str, cost: u64) -> Option<(Nanos, u64)> {
        let counted = checked.rule.global.as_ref()?;
        let Verdict::Deny { retry_after } = checked.decision.verdict else {
            return None;
        };
        if checked.outcome != Outcome::Denied || checked.decision.remaining < cost {
            return None;
        }
        match counted {
            Counted::Mesh(global, rule) => {
                if retry_after <= global.params().settle + crate::limiter::MILLISECOND {
                    return Some((retry_after, global.instants() + 1));
                }
                global.first_lease(*rule, checked.limit_index, key, self.clock.now())
            }
            // A key new at this node gets its first room from the next round's grants.
            Counted::Tree(keys) => (retry_after <= keys.longest_grant_wait())
                .then(|| (retry_after, keys.next_boundary())),
        }
    }

    /// Instants the cluster has processed (0 without a cluster; over the tree, complete
    /// rounds applied).
    pub fn instants(&self) -> u64 {
        match &self.global {
            None => 0,
            Some(Exchange::Mesh(global)) => global.instants(),
            Some(Exchange::Tree(_, keys)) => keys.complete_rounds(),
        }
    }

    /// Whether the lease a check paused at `mark` ([`Engine::lease_pause`]) waited for is in:
    /// over the mesh, the instant it named has run; over the tree, the grants of the round
    /// that took the check up are in.
    pub fn lease_in(&self, mark: u64) -> bool {
        match &self.global {
            Some(Exchange::Tree(_, keys)) => keys.granted_through(mark),
            _ => self.instants() >= mark,
        }
    }

    /// [`Engine::check`] without counting the outcome.
    pub fn check_uncounted(
        &self,
        rule: &str,
        key: &str,
        cost: u64,
        max_wait: Nanos,
    ) -> Result<Checked<'_>, UnknownRule> {
        let state = self.rule(rule)?;
        let now = self.clock.now();
        let max_wait = max_wait.min(state.rule.max_wait);
        let (result, _) = self.decide_key(state, key, cost, max_wait, now, false);
        Ok(checked(state, result, cost))
    }

    /// A check of `key` under `state` at `now`, charged if admitted. With `reserving`, also
    /// where the charge went, for a later settle (`None` when not admitted).
    fn decide_key(
        &self,
        state: &RuleState,
        key: &str,
        cost: u64,
        max_wait: Nanos,
        now: Nanos,
        reserving: bool,
    ) -> (Result<(usize, Decision), Full>, Option<Charge>) {
        let limits = &state.rule.limits[..];
        match &state.global {
            Some(counted) => {
                let (result, origin) = clustered_check(state, counted, key, cost, max_wait, now);
                (result, Some(Charge::Cluster { origin }))
            }
            None => {
                let mut receipts = None;
                let result = state.store.update(
                    key,
                    now,
                    || KeyState::fresh(limits),
                    |s| s.is_fresh(limits, now),
                    |s| {
                        let (i, d) = s.check(limits, now, cost, max_wait);
                        if reserving && d.allowed() {
                            receipts = Some(s.receipts(limits, now));
                        }
                        (i, d)
                    },
                );
                (result, receipts.map(Charge::Local))
            }
        }
    }

    /// [`Engine::check_uncounted`], and an admitted check is also held as a reservation, whose
    /// id is returned with it, for [`Engine::settle`]. With `max_reservations` open already,
    /// the answer is what a new key gets at `max_keys` (denied, [`Outcome::StoreFull`]) and
    /// nothing is charged.
    pub fn reserve_uncounted(
        &self,
        rule: &str,
        key: &str,
        cost: u64,
        max_wait: Nanos,
    ) -> Result<(Checked<'_>, Option<ReservationId>), UnknownRule> {
        let shared = self
            .rules
            .get(rule)
            .ok_or_else(|| UnknownRule(rule.to_owned()))?;
        let state = &**shared;
        let Some(claim) = self.reservations.claim() else {
            return Ok((checked(state, Err(Full), cost), None));
        };
        let now = self.clock.now();
        let max_wait = max_wait.min(state.rule.max_wait);
        let (result, charge) = self.decide_key(state, key, cost, max_wait, now, true);
        let checked = checked(state, result, cost);
        let id = match charge {
            Some(charge) if checked.outcome == Outcome::Allowed => {
                let held = Held {
                    state: Arc::downgrade(shared),
                    rule: rule.into(),
                    key: key.into(),
                    cost,
                    at: now,
                    charge,
                };
                Some(claim.fill(held, now))
            }
            _ => None,
        };
        Ok((checked, id))
    }

    /// Settles reservation `id` (as [`ReservationId`] prints it) with the `cost` the work
    /// actually had.
    ///
    /// Below the reservation, the difference is given back into the window or bucket the
    /// reservation was charged to, as far as that cannot admit more than a check of `cost`
    /// would have ([`KeyState::refund`]: nothing once the window has closed); on a clustered
    /// key it becomes credit at this node instead (design.md §3.7). Above it, the difference
    /// is charged whether it fits or not (the work is done): the key may go past its limit
    /// and is then denied until that has passed. On a clustered key the excess is charged
    /// only as far as this node holds room for it; the rest is reported unpaid.
    ///
    /// Refused, changing nothing: an id that is unknown here, one settled already, one that
    /// expired (its estimate stands).
    pub fn settle(&self, id: &str, cost: u64) -> Result<Settled<'_>, SettleError> {
        let id = ReservationId::parse(id).ok_or(SettleError::Unknown)?;
        let now = self.clock.now();
        let held = self.reservations.take(&id, now)?;
        let current = self.rules.get(&*held.rule);
        let same = current.filter(|c| std::ptr::eq(Arc::as_ptr(c), held.state.as_ptr()));
        let (mut refunded, mut charged, mut unpaid) = (0, 0, 0);
        if cost < held.cost {
            if let Some(state) = same {
                refunded = self.refund(state, &held, held.cost - cost, now);
            }
        } else if cost > held.cost {
            let extra = cost - held.cost;
            // Charged to the rule as it is now defined, if it still is: the work was done.
            charged = current.map_or(0, |state| charge_extra(state, &held.key, extra, now));
            unpaid = extra - charged;
        }
        let m = &self.reservations.metrics;
        m.refunded.fetch_add(refunded, Ordering::Relaxed);
        m.charged.fetch_add(charged, Ordering::Relaxed);
        m.unpaid.fetch_add(unpaid, Ordering::Relaxed);
        Ok(Settled {
            rule: held.rule.to_string(),
            key: held.key.to_string(),
            reserved: held.cost,
            cost,
            refunded,
            charged,
            unpaid,
            standing: current.map(|state| status_of(state, &held.key, now)),
        })
    }

    /// Gives `amount` units of `held` back to the key, at `now`: into its state, or as credit
    /// on a clustered key. Returns the units given back.
    fn refund(&self, state: &RuleState, held: &Held, amount: u64, now: Nanos) -> u64 {
        let limits = &state.rule.limits[..];
        let shaping = state.rule.max_wait > 0;
        match (&held.charge, &state.global, &state.credits) {
            (Charge::Local(receipts), None, _) => state
                .store
                .update_stored(&held.key, |s| {
                    s.refund(limits, receipts, amount, now, shaping)
                })
                .unwrap_or(0),
            (Charge::Cluster { origin }, Some(counted), Some(credits)) => {
                // A shaping rule's callers hold places in a queue: credit would let a later
                // check skip it.
                if shaping
                    && limits
                        .iter()
                        .any(|l| l.algorithm() == Algorithm::LeakyBucket)
                {
                    return 0;
                }
                let credit = credit_for(limits, counted, held, *origin, amount);
                let back = credit.spendable(now);
                if back == 0 {
                    return 0;
                }
                let credit = credit_for(limits, counted, held, *origin, back);
                let added = credits.store.update(
                    &held.key,
                    now,
                    Credits::default,
                    |c| c.is_spent(now),
                    |c| c.add(credit),
                );
                if added.is_ok() { back } else { 0 }
            }
            _ => 0,
        }
    }

    /// Where `key` stands under `rule`: what is left, and whether a check of cost 1 would be
    /// admitted now. Consumes nothing and stores nothing.
    pub fn status(&self, rule: &str, key: &str) -> Result<Checked<'_>, UnknownRule> {
        let state = self.rule(rule)?;
        Ok(status_of(state, key, self.clock.now()))
    }

    /// Evicts every key whose state equals a fresh key's; returns how many went.
    /// Also expires reservations past their timeout and forgets spent credit.
    pub fn sweep(&self) -> usize {
        let now = self.clock.now();
        self.reservations.sweep(now);
        self.rules
            .values()
            .map(|r| {
                if let Some(credits) = &r.credits {
                    credits.store.sweep(|c| c.is_spent(now));
                }
                let limits = &r.rule.limits[..];
                r.store.sweep(|s| s.is_fresh(limits, now))
            })
            .sum()
    }

    /// Keys evicted so far, across rules.
    pub fn evictions(&self) -> u64 {
        self.evicted_before
            + self
                .rules
                .values()
                .map(|r| r.store.evictions())
                .sum::<u64>()
    }
}

/// Whether a rule redefined from `old` to `new` keeps its keys and counts: the same limits in
/// the same order, each of the same algorithm and period, changed at most in its limit and
/// burst, with the same scope and `max_wait`. A window's counts and a log's entries do not
/// depend on the numbers: they are read against the new limit (a key over a lowered limit
/// waits until its window lets it in). A token bucket's keys are carried at the reload
/// ([`KeyState::relimit`]): what each spent carries over into the new burst. A leaky bucket's
/// state is scaled by its rate, so it starts afresh, as does a changed period or algorithm (a
/// window of another length has other counts).
fn keeps_counts(old: &Rule, new: &Rule) -> bool {
    old.scope == new.scope
        && old.max_wait == new.max_wait
        && old.limits.len() == new.limits.len()
        && old.limits.iter().zip(&new.limits).all(|(a, b)| {
            a.algorithm() == b.algorithm()
                && a.period() == b.period()
                && a.algorithm() != Algorithm::LeakyBucket
        })
}

/// A decision (or a full store) as a [`Checked`].
fn checked(state: &RuleState, result: Result<(usize, Decision), Full>, cost: u64) -> Checked<'_> {
    let (limit_index, decision, outcome) = match result {
        Ok((i, d)) => {
            let outcome = match d.verdict {
                Verdict::Admit { .. } => Outcome::Allowed,
                Verdict::Deny { .. } => Outcome::Denied,
                Verdict::Never => Outcome::Never,
            };
            (i, d, outcome)
        }
        Err(Full) => {
            let d = Decision {
                verdict: Verdict::Deny {
                    retry_after: STORE_FULL_RETRY,
                },
                limit: state.rule.limits[0].limit(),
                remaining: 0,
                reset_after: STORE_FULL_RETRY,
            };
            (0, d, Outcome::StoreFull)
        }
    };
    Checked {
        rule: state,
        limit_index,
        decision,
        outcome,
        cost,
    }
}

/// Where `key` stands under `state` at `now` (see [`Engine::status`]).
fn status_of<'e>(state: &'e RuleState, key: &str, now: Nanos) -> Checked<'e> {
    let limits = &state.rule.limits[..];
    let (limit_index, decision) = match &state.global {
        Some(counted) => standing(state, counted, key, now),
        None => state.store.read(key, |s| match s {
            Some(s) => s.status(limits, now),
            None => KeyState::fresh(limits).status(limits, now),
        }),
    };
    let outcome = if decision.allowed() {
        Outcome::Allowed
    } else {
        Outcome::Denied
    };
    Checked {
        rule: state,
        limit_index,
        decision,
        outcome,
        cost: 1,
    }
}

/// A clustered key's status.
fn standing(state: &RuleState, counted: &Counted, key: &str, now: Nanos) -> (usize, Decision) {
    match counted {
        Counted::Mesh(global, index) => global.status(*index, key, now),
        Counted::Tree(keys) => (
            0,
            keys.status(&state.rule.name, key, now)
                .expect("the tree runs every global rule"),
        ),
    }
}

/// A clustered key's check: paid from the key's credit at this node first and the rest by
/// the cluster, all or nothing. Also returns where a bucket credit of this charge would
/// start fading: `now`, or the time of the earliest credit it spent.
fn clustered_check(
    state: &RuleState,
    counted: &Counted,
    key: &str,
    cost: u64,
    max_wait: Nanos,
    now: Nanos,
) -> (Result<(usize, Decision), Full>, Nanos) {
    let cluster = |cost: u64| match counted {
        Counted::Mesh(global, index) => global.check(*index, key, cost, max_wait, now),
        Counted::Tree(keys) => keys
            .decide(&state.rule.name, key, cost, now)
            .expect("the tree runs every global rule")
            .map(|d| (0, d)),
    };
    let credits = match &state.credits {
        Some(credits) if credits.any() => credits,
        _ => return (cluster(cost), now),
    };
    if cost == 0 || cost > max_cost(&state.rule.limits) {
        return (cluster(cost), now);
    }
    // Under the credit's shard lock, so two checks cannot spend the same credit; the
    // cluster's own lock is taken inside it, never the other way round.
    let paid = credits.store.update_stored(key, |c| {
        let from_credit = c.spendable(now).min(cost);
        if from_credit == 0 {
            return None;
        }
        let result = if from_credit == cost {
            let (i, mut d) = standing(state, counted, key, now);
            d.verdict = Verdict::Admit { wait: 0 };
            Ok((i, d))
        } else {
            cluster(cost - from_credit)
        };
        let admitted = matches!(&result, Ok((_, d)) if d.allowed());
        let origin = if admitted {
            c.spend(from_credit, now)
        } else {
            now
        };
        Some((result, origin))
    });
    paid.flatten().unwrap_or_else(|| (cluster(cost), now))
}

/// Charges a settle's `extra` cost to `key` whether it fits or not; returns what was
/// charged. A clustered key is charged only what this node can: a check of the whole excess,
/// or failing that what credit the key has here (room the cluster counted already).
fn charge_extra(state: &RuleState, key: &str, extra: u64, now: Nanos) -> u64 {
    let limits = &state.rule.limits[..];
    let Some(counted) = &state.global else {
        let charged = state.store.update(
            key,
            now,
            || KeyState::fresh(limits),
            |s| s.is_fresh(limits, now),
            |s| s.charge(limits, now, extra),
        );
        return if charged.is_ok() { extra } else { 0 };
    };
    let (result, _) = clustered_check(state, counted, key, extra, 0, now);
    if matches!(result, Ok((_, d)) if d.allowed()) {
        return extra;
    }
    let from_credit = state.credits.as_ref().and_then(|credits| {
        credits.store.update_stored(key, |c| {
            let n = c.spendable(now).min(extra);
            if n > 0 {
                c.spend(n, now);
            }
            n
        })
    });
    from_credit.unwrap_or(0)
}

/// The largest cost a check under `limits` can ever be admitted with.
fn max_cost(limits: &[Limit]) -> u64 {
    limits.iter().map(Limit::max_cost).min().unwrap_or(0)
}

/// The credit of `amount` units a settle of `held` gives a clustered key: spendable until
/// the first of its windows' slots that counted the reservation ends, and fading at the
/// rate of its fastest bucket from `origin` (design.md §3.7).
fn credit_for(
    limits: &[Limit],
    counted: &Counted,
    held: &Held,
    origin: Nanos,
    amount: u64,
) -> Credit {
    let mut until = Nanos::MAX;
    let mut fade: Option<Fade> = None;
    for l in limits {
        if l.algorithm().has_burst() {
            let faster = fade.is_none_or(|f| {
                u128::from(l.limit()) * u128::from(f.period)
                    > u128::from(f.limit) * u128::from(l.period())
            });
            if faster {
                fade = Some(Fade {
                    reserved: held.cost,
                    limit: l.limit(),
                    period: l.period(),
                });
            }
        } else {
            let slot = slot_len(counted, l);
            until = until.min((held.at / slot + 1).saturating_mul(slot));
        }
    }
    Credit::new(amount, origin, until, fade)
}

/// The length of the slots the cluster counts a windowed limit in (design.md §3.4): its
/// period, but a sliding log's sub-slot over the mesh (the largest of whole rounds, at most
/// [`LOG_SUBSLOTS`] a period, as [`Global`] divides it).
fn slot_len(counted: &Counted, l: &Limit) -> Nanos {
    match (counted, l.algorithm()) {
        (Counted::Mesh(global, _), Algorithm::SlidingWindowLog) => {
            let round = global.params().round;
            let k = (1..=LOG_SUBSLOTS)
                .rev()
                .find(|k| l.period().is_multiple_of(k * round))
                .unwrap_or(1);
            l.period() / k
        }
        _ => l.period(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::config::{Config, Scope};
    use crate::limiter::{Algorithm, Limit, MILLISECOND};
    use crate::reserve::{ReservationParams, SettleError};

    const T0: Nanos = 1_700_000_000 * SECOND;

    fn rule(name: &str, algorithm: Algorithm, limit: u64, burst: Option<u64>) -> Rule {
        Rule {
            name: name.into(),
            limits: vec![Limit::new(algorithm, limit, SECOND, burst).unwrap()],
            scope: Scope::Local,
            max_wait: 0,
        }
    }

    /// A held check is let go as soon as its lease is in, or at its bound (twice the pause
    /// and 10 ms), and says how long it was held (the lease-wait metric counts it).
    #[tokio::test(start_paused = true)]
    async fn hold_for_lease_lets_go_when_the_lease_is_in_or_at_its_bound() {
        use std::sync::atomic::AtomicBool;
        for (lease_at, held) in [
            // In at 3 ms: let go then.
            (3, 3),
            // Late, past the 5 ms pause: still let go when it comes.
            (12, 12),
            // Never: twice the pause plus 10 ms.
            (u64::MAX, 20),
        ] {
            let clock = Arc::new(ManualClock::new(T0));
            let lease = Arc::new(AtomicBool::new(false));
            let hold = {
                let (clock, lease) = (clock.clone(), lease.clone());
                tokio::spawn(async move {
                    let done = || lease.load(Ordering::SeqCst);
                    hold_for_lease(&*clock, done, 5 * MILLISECOND).await
                })
            };
            let mut ms = 0;
            while !hold.is_finished() {
                assert!(ms < 100, "still held after {ms} ms");
                tokio::task::yield_now().await;
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                ms += 1;
                if ms == lease_at {
                    lease.store(true, Ordering::SeqCst);
                }
                clock.advance(MILLISECOND);
            }
            let waited = hold.await.expect("hold");
            assert_eq!(waited, held * MILLISECOND, "lease at {lease_at} ms");
        }
    }

    fn engine(rules: Vec<Rule>, max_keys: usize) -> (Arc<ManualClock>, Engine) {
        let clock = Arc::new(ManualClock::new(T0));
        let engine = Engine::new(rules, max_keys, clock.clone());
        (clock, engine)
    }

    #[test]
    fn engine_checks_and_counts_outcomes() {
        let (clock, e) = engine(vec![rule("r", Algorithm::TokenBucket, 2, None)], 10);
        assert_eq!(e.check("r", "k", 1, 0).unwrap().outcome, Outcome::Allowed);
        assert_eq!(e.check("r", "k", 1, 0).unwrap().outcome, Outcome::Allowed);
        assert_eq!(e.check("r", "k", 1, 0).unwrap().outcome, Outcome::Denied);
        assert_eq!(e.check("r", "k", 3, 0).unwrap().outcome, Outcome::Never);
        clock.advance(500 * MILLISECOND);
        assert_eq!(e.check("r", "k", 1, 0).unwrap().outcome, Outcome::Allowed);
        let r = e.rule("r").unwrap();
        assert_eq!(r.outcome_count(Outcome::Allowed), 3);
        assert_eq!(r.outcome_count(Outcome::Denied), 1);
        assert_eq!(r.outcome_count(Outcome::Never), 1);
        assert_eq!(
            e.check("nope", "k", 1, 0).unwrap_err(),
            UnknownRule("nope".into())
        );
    }

    #[test]
    fn engine_status_consumes_nothing_and_stores_nothing() {
        let (_, e) = engine(vec![rule("r", Algorithm::FixedWindow, 5, None)], 10);
        for _ in 0..3 {
            assert_eq!(e.status("r", "new").unwrap().decision.remaining, 5);
        }
        assert_eq!(e.rule("r").unwrap().active_keys(), 0);
        e.check("r", "k", 2, 0).unwrap();
        assert_eq!(e.status("r", "k").unwrap().decision.remaining, 3);
        assert_eq!(e.status("r", "k").unwrap().decision.remaining, 3);
    }

    #[test]
    fn engine_sweep_evicts_keys_once_fresh_and_idle() {
        let (clock, e) = engine(vec![rule("r", Algorithm::TokenBucket, 10, None)], 10);
        e.check("r", "a", 10, 0).unwrap();
        e.check("r", "b", 1, 0).unwrap();
        clock.advance(100 * MILLISECOND);
        // Both were used since the last sweep: kept, and marked idle.
        assert_eq!(e.sweep(), 0);
        assert_eq!(e.sweep(), 1); // b refilled and idle, a not refilled
        clock.advance(900 * MILLISECOND);
        assert_eq!(e.sweep(), 1);
        assert_eq!(e.evictions(), 2);
        assert_eq!(e.rule("r").unwrap().active_keys(), 0);
    }

    #[test]
    fn engine_at_max_keys_denies_new_keys_and_serves_known_ones() {
        let (_, e) = engine(
            vec![
                rule("a", Algorithm::TokenBucket, 10, None),
                rule("b", Algorithm::TokenBucket, 10, None),
            ],
            2,
        );
        e.check("a", "1", 1, 0).unwrap();
        e.check("b", "1", 1, 0).unwrap();
        let full = e.check("a", "2", 1, 0).unwrap();
        assert_eq!(full.outcome, Outcome::StoreFull);
        assert_eq!(
            full.decision.verdict,
            Verdict::Deny {
                retry_after: STORE_FULL_RETRY
            }
        );
        assert_eq!(e.check("a", "1", 1, 0).unwrap().outcome, Outcome::Allowed);
    }

    #[test]
    fn engine_caps_wait_by_rule_max_wait() {
        let mut r = rule("s", Algorithm::LeakyBucket, 10, Some(1));
        r.max_wait = 200 * MILLISECOND;
        let (_, e) = engine(vec![r], 10);
        assert!(e.check("s", "k", 1, SECOND).unwrap().decision.allowed());
        let waits: Vec<_> = (0..3)
            .map(|_| e.check("s", "k", 1, SECOND).unwrap().decision.verdict)
            .collect();
        assert_eq!(
            waits,
            [
                Verdict::Admit {
                    wait: 100 * MILLISECOND
                },
                Verdict::Admit {
                    wait: 200 * MILLISECOND
                },
                Verdict::Deny {
                    retry_after: 300 * MILLISECOND
                },
            ]
        );
        // A caller that will not wait is policed.
        assert!(!e.check("s", "k", 1, 0).unwrap().decision.allowed());
    }

    #[test]
    fn engine_check_is_atomic_across_threads() {
        let (_, e) = engine(vec![rule("r", Algorithm::FixedWindow, 1_000, None)], 10);
        let e = Arc::new(e);
        let admitted: usize = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    let e = &e;
                    s.spawn(move || {
                        (0..1_000)
                            .filter(|_| e.check("r", "hot", 1, 0).unwrap().decision.allowed())
                            .count()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(admitted, 1_000);
    }

    fn counts(e: &Engine, rule: &str) -> (u64, u64) {
        let r = e.rule(rule).unwrap();
        (
            r.outcome_count(Outcome::Allowed),
            r.outcome_count(Outcome::Denied),
        )
    }

    #[test]
    fn reload_keeps_unchanged_rules_counts_and_restarts_changed_ones() {
        let (clock, e) = engine(
            vec![
                rule("same", Algorithm::FixedWindow, 2, None),
                rule("grows", Algorithm::FixedWindow, 2, None),
                rule("gone", Algorithm::FixedWindow, 2, None),
            ],
            100,
        );
        for r in ["same", "grows", "gone"] {
            assert!(e.check(r, "k", 2, 0).unwrap().decision.allowed());
            assert!(!e.check(r, "k", 1, 0).unwrap().decision.allowed());
        }
        assert_eq!(e.keys(), 3);

        let (next, changes) = e
            .reload(vec![
                rule("added", Algorithm::TokenBucket, 1, None),
                rule("grows", Algorithm::SlidingWindowCounter, 5, None),
                rule("same", Algorithm::FixedWindow, 2, None),
            ])
            .unwrap();
        assert_eq!(
            changes,
            RuleChanges {
                kept: vec!["same".into()],
                relimited: vec![],
                changed: vec!["grows".into()],
                added: vec!["added".into()],
                removed: vec!["gone".into()],
            }
        );
        // Unchanged: the spent window carries over, and so do its metrics.
        assert!(!next.check("same", "k", 1, 0).unwrap().decision.allowed());
        assert_eq!(counts(&next, "same"), (1, 2));
        // Redefined (another algorithm): fresh counts under the new limit; outcome counters
        // continue.
        let grows = next.check("grows", "k", 5, 0).unwrap();
        assert!(grows.decision.allowed());
        assert_eq!(grows.decision.limit, 5);
        assert_eq!(counts(&next, "grows"), (2, 1));
        assert!(next.check("added", "k", 1, 0).unwrap().decision.allowed());
        assert_eq!(
            next.check("gone", "k", 1, 0).unwrap_err(),
            UnknownRule("gone".into())
        );
        // Config order is the new file's.
        let names: Vec<_> = next.rules().map(|r| r.rule.name.clone()).collect();
        assert_eq!(names, ["added", "grows", "same"]);
        // The old engine (what in-flight checks hold) still serves, sharing the kept rule.
        assert!(!e.check("same", "k", 1, 0).unwrap().decision.allowed());
        assert_eq!(counts(&next, "same"), (1, 3));
        // Once the old engine is gone, the removed and redefined rules' keys leave the budget:
        // same/k, grows/k (new) and added/k remain.
        drop(e);
        assert_eq!(next.keys(), 3);
        clock.advance(SECOND);
        assert!(next.check("same", "k", 2, 0).unwrap().decision.allowed());
    }

    /// A reload that changes only the numbers of a rule's limits (a tenant's quota raised or
    /// cut) keeps the keys' counts, read against the new numbers, for every algorithm but
    /// the leaky bucket (whose state is scaled by its rate) and for a composite rule; a
    /// changed period starts afresh. The kept store is shared, so the key budget counts each
    /// key once, before and after the old engine goes.
    #[test]
    fn reload_of_a_limits_numbers_keeps_the_counts() {
        let per =
            |algorithm, limit: u64, period| Limit::new(algorithm, limit, period, None).unwrap();
        let rules = |n: u64, period| -> Vec<Rule> {
            let mut rules: Vec<Rule> = [
                ("w", Algorithm::FixedWindow),
                ("l", Algorithm::SlidingWindowLog),
                ("c", Algorithm::SlidingWindowCounter),
                ("b", Algorithm::TokenBucket),
                ("q", Algorithm::LeakyBucket),
            ]
            .into_iter()
            .map(|(name, algorithm)| Rule {
                name: name.into(),
                limits: vec![per(algorithm, n, period)],
                scope: Scope::Local,
                max_wait: 0,
            })
            .collect();
            rules.push(Rule {
                name: "m".into(),
                limits: vec![
                    per(Algorithm::TokenBucket, 10 * n, SECOND),
                    per(Algorithm::SlidingWindowLog, n, period),
                ],
                scope: Scope::Local,
                max_wait: 0,
            });
            rules
        };
        let names = ["w", "l", "c", "b", "q", "m"];
        let (clock, e) = engine(rules(4, SECOND), 100);
        clock.advance(SECOND / 10);
        for r in names {
            assert!(e.check(r, "k", 3, 0).unwrap().decision.allowed(), "{r}");
        }
        // Raised to 6: 3 more, then no more (the bucket spent 3 of its burst, so 3 of the new
        // one are left, and none refilled).
        let (next, changes) = e.reload(rules(6, SECOND)).unwrap();
        assert_eq!(changes.relimited, ["w", "l", "c", "b", "m"]);
        assert_eq!(changes.changed, ["q"]);
        for r in ["w", "l", "c", "b", "m"] {
            let d = next.check(r, "k", 3, 0).unwrap().decision;
            assert!(d.allowed(), "{r}: {d:?}");
            assert_eq!(d.limit, 6, "{r}");
            assert!(!next.check(r, "k", 1, 0).unwrap().decision.allowed(), "{r}");
        }
        // The leaky bucket started afresh: its whole new burst.
        assert!(next.check("q", "k", 6, 0).unwrap().decision.allowed());
        // Each kept key once; the leaky bucket's old key goes with the old engine.
        assert_eq!(next.keys(), 7);
        drop(e);
        assert_eq!(next.keys(), 6);
        // Cut to 2: the 6 spent are over it, so nothing until the window lets them go.
        let (cut, changes) = next.reload(rules(2, SECOND)).unwrap();
        assert_eq!(changes.relimited, ["w", "l", "c", "b", "m"]);
        for r in ["w", "l", "c", "b", "m"] {
            let d = cut.check(r, "k", 1, 0).unwrap().decision;
            assert!(!d.allowed(), "{r}: {d:?}");
            assert_eq!(d.remaining, 0, "{r}");
        }
        // Another period: fresh counts.
        let (longer, changes) = cut.reload(rules(2, 2 * SECOND)).unwrap();
        assert_eq!(changes.changed, names);
        assert!(changes.relimited.is_empty());
        for r in ["w", "l", "c", "m"] {
            assert!(
                longer.check(r, "k", 2, 0).unwrap().decision.allowed(),
                "{r}"
            );
        }
    }

    /// A token bucket whose limit (and so burst) is raised or cut on reload carries what each
    /// key spent, not what it has left: a key that spent 2 of 4 has 8 of a new 10, one that
    /// spent all 4 has 6; cut to 3, both have none.
    #[test]
    fn a_relimited_bucket_carries_what_each_key_spent() {
        let hourly = |n: u64| Rule {
            name: "b".into(),
            limits: vec![Limit::new(Algorithm::TokenBucket, n, 3600 * SECOND, None).unwrap()],
            scope: Scope::Local,
            max_wait: 0,
        };
        let (_, e) = engine(vec![hourly(4)], 10);
        assert!(e.check("b", "half", 2, 0).unwrap().decision.allowed());
        assert!(e.check("b", "all", 4, 0).unwrap().decision.allowed());
        let (next, changes) = e.reload(vec![hourly(10)]).unwrap();
        assert_eq!(changes.relimited, ["b"]);
        for (key, left) in [("half", 8), ("all", 6)] {
            let d = next.check("b", key, left, 0).unwrap().decision;
            assert!(d.allowed(), "{key}: {d:?}");
            assert!(
                !next.check("b", key, 1, 0).unwrap().decision.allowed(),
                "{key}"
            );
        }
        let (cut, _) = next.reload(vec![hourly(3)]).unwrap();
        for key in ["half", "all"] {
            assert!(
                !cut.check("b", key, 1, 0).unwrap().decision.allowed(),
                "{key}"
            );
        }
        assert!(cut.check("b", "new", 3, 0).unwrap().decision.allowed());
    }

    #[test]
    fn reload_of_identical_rules_keeps_everything() {
        let rules = vec![rule("a", Algorithm::TokenBucket, 3, None)];
        let (_, e) = engine(rules.clone(), 10);
        e.check("a", "k", 3, 0).unwrap();
        let (next, changes) = e.reload(rules).unwrap();
        assert_eq!(changes.kept, ["a"]);
        assert!(changes.changed.is_empty() && changes.added.is_empty());
        assert!(!next.check("a", "k", 1, 0).unwrap().decision.allowed());
    }

    #[test]
    fn reload_changing_max_wait_is_a_redefinition() {
        let mut shaped = rule("s", Algorithm::LeakyBucket, 10, Some(1));
        let (_, e) = engine(vec![shaped.clone()], 10);
        shaped.max_wait = 100 * MILLISECOND;
        let (_, changes) = e.reload(vec![shaped]).unwrap();
        assert_eq!(changes.changed, ["s"]);
    }

    fn clustered(rules: Vec<Rule>) -> Engine {
        let clock = Arc::new(ManualClock::new(T0));
        let me = Actor::new("a".to_owned(), 1);
        let (e, _) = Engine::clustered(rules, 100, clock, me, Params::default()).unwrap();
        e
    }

    fn global(name: &str, limit: u64) -> Rule {
        Rule {
            scope: Scope::Global,
            ..rule(name, Algorithm::TokenBucket, limit, None)
        }
    }

    #[test]
    fn a_clustered_denial_with_room_left_is_counted_as_such() {
        let window = Rule {
            scope: Scope::Global,
            ..rule("w", Algorithm::FixedWindow, 10, None)
        };
        let local = rule("l", Algorithm::FixedWindow, 1, None);
        let e = clustered(vec![window, local]);
        // No round has run: the node holds no room of the key, though all 10 are left.
        let checked = e.check("w", "k", 2, 0).unwrap();
        assert_eq!(checked.outcome, Outcome::Denied);
        assert_eq!(checked.decision.remaining, 10);
        assert_eq!(e.check("w", "k", 11, 0).unwrap().outcome, Outcome::Never);
        // A local rule's denials are exact: none is counted.
        e.check("l", "k", 1, 0).unwrap();
        assert_eq!(e.check("l", "k", 1, 0).unwrap().outcome, Outcome::Denied);
        assert_eq!(e.rule("w").unwrap().denied_with_room(), 1);
        assert_eq!(e.rule("l").unwrap().denied_with_room(), 0);
    }

    #[test]
    fn clustered_reload_adds_removes_and_relimits_global_rules_but_refuses_a_new_algorithm() {
        let rules = vec![global("g", 10), rule("l", Algorithm::TokenBucket, 1, None)];
        let clock = Arc::new(ManualClock::new(T0));
        let me = Actor::new("a".to_owned(), 1);
        let (e, g) = Engine::clustered(rules, 100, clock, me, Params::default()).unwrap();
        let window = |name: &str| Rule {
            scope: Scope::Global,
            ..rule(name, Algorithm::FixedWindow, 10, None)
        };
        // A changed algorithm is refused, and so is the whole reload that carries it.
        let err = e.reload(vec![window("g"), window("h")]).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("changing global rules in a cluster needs a (rolling) restart: \"g\""),
            "{err}"
        );
        let ReloadError::GlobalRulesChanged(names) = err;
        assert_eq!(names.len(), 1, "{names:?}");
        assert_eq!(g.rule_index("h"), None, "a refused reload adds nothing");
        assert_eq!(g.numbers_in_force()["g"], [(10, 10)]);

        // A global rule's numbers change in place, on the same Global; a new global rule is
        // counted there too; local rules reload.
        let (next, changes) = e
            .reload(vec![
                global("g", 20),
                window("h"),
                rule("l", Algorithm::TokenBucket, 5, None),
            ])
            .unwrap();
        assert_eq!(changes.relimited, ["g", "l"]);
        assert_eq!(changes.added, ["h"]);
        assert_eq!(g.own_numbers()["g"], [(20, 20)]);
        assert_eq!(g.numbers_in_force()["g"], [(20, 20)]);
        let h = g.rule_index("h").expect("h is a global rule now");
        assert!(g.serves(h));
        assert_eq!(g.own_numbers()["h"], [(10, 10)]);
        assert!(next.rule("g").unwrap().is_clustered());
        assert!(next.rule("h").unwrap().is_clustered());
        assert!(!next.rule("l").unwrap().is_clustered());

        // Removing a global rule (here: making it local) stops it being served and
        // published; adding it back with the same algorithm serves it again, relimited.
        let (after, changes) = next
            .reload(vec![
                global("g", 20),
                Rule {
                    scope: Scope::Local,
                    ..window("h")
                },
            ])
            .unwrap();
        assert_eq!(changes.changed, ["h"]);
        assert!(!g.serves(h));
        assert!(!g.own_numbers().contains_key("h"));
        assert!(!after.rule("h").unwrap().is_clustered());
        let (back, _) = after
            .reload(vec![
                global("g", 20),
                Rule {
                    limits: vec![Limit::new(Algorithm::FixedWindow, 5, SECOND, None).unwrap()],
                    ..window("h")
                },
            ])
            .unwrap();
        assert_eq!(g.rule_index("h"), Some(h), "the same rule, with its keys");
        assert!(g.serves(h));
        assert_eq!(g.own_numbers()["h"], [(5, 5)]);
        assert!(back.rule("h").unwrap().is_clustered());
        // Back as a token bucket, it would count differently: refused.
        assert!(back.reload(vec![global("g", 20), global("h", 5)]).is_err());
    }

    #[test]
    fn single_node_reload_redefines_global_rules_like_local_ones() {
        let (clock, e) = engine(vec![global("g", 1)], 10);
        e.check("g", "k", 1, 0).unwrap();
        let (next, changes) = e.reload(vec![global("g", 2)]).unwrap();
        assert_eq!(changes.relimited, ["g"]);
        // The bucket spent 1 of its burst: 1 of the new one is left.
        assert!(next.check("g", "k", 1, 0).unwrap().decision.allowed());
        assert!(!next.check("g", "k", 1, 0).unwrap().decision.allowed());
        clock.advance(SECOND / 2);
        assert!(next.check("g", "k", 1, 0).unwrap().decision.allowed());
    }

    #[test]
    fn engine_serves_builtin_rules() {
        let config = Config::load(None, &Default::default()).unwrap();
        let (_, e) = engine(config.rules, 10);
        assert!(e.check("default", "k", 1, 0).unwrap().decision.allowed());
        assert_eq!(e.rules().next().unwrap().rule.name, "default");
    }

    /// Over the tree, a global rule's checks go to the tree and local rules stay local; a
    /// key's first checks are admitted at once from the node's base; a check past it, with
    /// room left, is held for the next round's grant (`lease_pause`), after which its lease
    /// is in and the check is admitted; a reload may not touch global rules.
    #[test]
    fn a_tree_engine_routes_global_rules_and_pauses_a_new_key_for_its_grant() {
        let clock = Arc::new(ManualClock::new(T0));
        let me = Actor::new("n0", 1);
        let rules = vec![
            rule("w", Algorithm::FixedWindow, 100, None),
            global("g", 10),
            rule("l", Algorithm::TokenBucket, 1, None),
        ];
        let rules: Vec<Rule> = rules
            .into_iter()
            .map(|mut r| {
                if r.name == "w" {
                    r.scope = Scope::Global;
                }
                r
            })
            .collect();
        // `g` is a global token bucket: the tree refuses it.
        assert_eq!(
            Engine::clustered_tree(
                rules.clone(),
                100,
                clock.clone(),
                me.clone(),
                TreeParams::default()
            )
            .err(),
            Some(TreeError::Unsupported("g".to_owned()))
        );
        let rules: Vec<Rule> = rules.into_iter().filter(|r| r.name != "g").collect();
        let (e, tree) =
            Engine::clustered_tree(rules, 100, clock.clone(), me.clone(), TreeParams::default())
                .unwrap();
        assert!(e.rule("w").unwrap().is_clustered() && !e.rule("l").unwrap().is_clustered());
        crate::cluster::lock(&tree).set_members(std::slice::from_ref(&me), T0);
        let round = TreeParams::default().round;
        // Past the start's freeze, a round at a time.
        for _ in 0..30 {
            clock.advance(round);
            crate::cluster::lock(&tree).tick(clock.now());
        }
        clock.advance(round / 2);
        // Alone, the base is the limit less the escrow margin: 95 of 100.
        for _ in 0..95 {
            assert_eq!(e.check("w", "k", 1, 0).unwrap().outcome, Outcome::Allowed);
        }
        let checked = e.check_uncounted("w", "k", 1, 0).unwrap();
        assert_eq!(checked.outcome, Outcome::Denied);
        let (pause, mark) = e
            .lease_pause(&checked, "k", 1)
            .expect("past its base, a key waits for its grant");
        assert_eq!(
            pause,
            crate::cluster::lock(&tree).keys().grant_wait(clock.now())
        );
        assert!(!e.lease_in(mark));
        clock.advance(round / 2);
        crate::cluster::lock(&tree).tick(clock.now());
        assert!(
            e.lease_in(mark),
            "the grants of the round that took the check up are in"
        );
        let checked = e.check("w", "k", 1, 0).unwrap();
        assert_eq!(
            (checked.outcome, checked.decision.remaining),
            (Outcome::Allowed, 4)
        );
        assert_eq!(e.rule("w").unwrap().active_keys(), 1);
        assert_eq!(e.status("w", "k").unwrap().decision.remaining, 4);
        // A denial for want of room is not held.
        let never = e.check_uncounted("w", "k", 101, 0).unwrap();
        assert_eq!(
            (never.outcome, e.lease_pause(&never, "k", 101)),
            (Outcome::Never, None)
        );
        assert_eq!(e.check("l", "k", 1, 0).unwrap().outcome, Outcome::Allowed);
        assert!(
            e.reload(vec![rule("l", Algorithm::TokenBucket, 1, None)])
                .is_err()
        );
    }

    // -----------------------------------------------------------------------------------
    // Reserve, then settle
    // -----------------------------------------------------------------------------------

    /// The start of a minute after [`T0`] (where the per-minute tests start their clock).
    const M0: Nanos = T0 - T0 % (60 * SECOND) + 60 * SECOND;

    fn per_minute(name: &str, algorithm: Algorithm, limit: u64) -> Rule {
        Rule {
            limits: vec![Limit::new(algorithm, limit, 60 * SECOND, None).unwrap()],
            ..rule(name, algorithm, limit, None)
        }
    }

    /// Reserves `cost`, which must be admitted; the id.
    fn reserve(e: &Engine, rule: &str, key: &str, cost: u64) -> String {
        let (checked, id) = e.reserve_uncounted(rule, key, cost, 0).unwrap();
        assert_eq!(checked.outcome, Outcome::Allowed, "{checked:?}");
        id.expect("an admitted reservation has an id").to_string()
    }

    fn remaining(e: &Engine, rule: &str, key: &str) -> u64 {
        e.status(rule, key).unwrap().decision.remaining
    }

    #[test]
    fn a_settle_below_the_reservation_gives_the_difference_back() {
        let (clock, e) = engine(vec![per_minute("w", Algorithm::FixedWindow, 10)], 10);
        clock.set(M0);
        let id = reserve(&e, "w", "k", 8);
        assert_eq!(remaining(&e, "w", "k"), 2);
        clock.advance(SECOND);
        let s = e.settle(&id, 3).unwrap();
        assert_eq!(
            (s.reserved, s.cost, s.refunded, s.charged, s.unpaid),
            (8, 3, 5, 0, 0)
        );
        assert_eq!(s.standing.unwrap().decision.remaining, 7);
        assert_eq!(remaining(&e, "w", "k"), 7);
        // Once only, and nothing moves.
        assert_eq!(e.settle(&id, 0).unwrap_err(), SettleError::AlreadySettled);
        assert_eq!(remaining(&e, "w", "k"), 7);
        // Another tag for the same serial: a forged or foreign id.
        let forged = format!(
            "{}{:016x}",
            &id[..16],
            u64::from_str_radix(&id[16..], 16).unwrap() ^ 1
        );
        for bad in ["", "nope", &"0".repeat(32), &forged] {
            assert_eq!(e.settle(bad, 0).unwrap_err(), SettleError::Unknown, "{bad}");
        }
        let m = &e.reservations().metrics;
        assert_eq!(m.made.load(Ordering::Relaxed), 1);
        assert_eq!(m.settled.load(Ordering::Relaxed), 1);
        assert_eq!(m.refunded.load(Ordering::Relaxed), 5);
    }

    #[test]
    fn a_settle_above_the_reservation_charges_past_the_limit() {
        let (clock, e) = engine(vec![per_minute("w", Algorithm::FixedWindow, 10)], 10);
        clock.set(M0);
        let id = reserve(&e, "w", "k", 4);
        clock.advance(SECOND);
        let s = e.settle(&id, 15).unwrap();
        assert_eq!((s.refunded, s.charged, s.unpaid), (0, 11, 0));
        let standing = s.standing.unwrap().decision;
        assert_eq!((standing.remaining, standing.allowed()), (0, false));
        // Refused until the window ends.
        let denied = e.check("w", "k", 1, 0).unwrap();
        assert_eq!(
            denied.decision.verdict,
            Verdict::Deny {
                retry_after: 59 * SECOND
            }
        );
        assert_eq!(e.reservations().metrics.charged.load(Ordering::Relaxed), 11);
    }

    #[test]
    fn a_settle_after_the_window_closed_gives_nothing_back() {
        let (clock, e) = engine(vec![per_minute("w", Algorithm::FixedWindow, 10)], 10);
        clock.set(M0 + 59 * SECOND);
        let id = reserve(&e, "w", "k", 8);
        clock.advance(SECOND);
        assert_eq!(e.settle(&id, 0).unwrap().refunded, 0);
        assert_eq!(remaining(&e, "w", "k"), 10);
        // ... and a sliding window counter's previous window still takes it.
        let (clock, e) = engine(
            vec![per_minute("c", Algorithm::SlidingWindowCounter, 10)],
            10,
        );
        clock.set(M0 + 59 * SECOND);
        let id = reserve(&e, "c", "k", 8);
        clock.advance(SECOND);
        assert_eq!(e.settle(&id, 0).unwrap().refunded, 8);
    }

    #[test]
    fn an_unsettled_reservation_expires_and_keeps_its_estimate() {
        let (clock, e) = engine(vec![per_minute("w", Algorithm::FixedWindow, 10)], 10);
        clock.set(M0);
        let e = e.with_reservations(ReservationParams {
            timeout: 10 * SECOND,
            max_open: 10,
        });
        let id = reserve(&e, "w", "k", 8);
        clock.advance(10 * SECOND);
        e.sweep();
        assert_eq!(e.reservations().metrics.expired.load(Ordering::Relaxed), 1);
        assert_eq!(e.settle(&id, 1).unwrap_err(), SettleError::Expired);
        assert_eq!(remaining(&e, "w", "k"), 2);
        assert_eq!(e.reservations().open(), 0);
    }

    #[test]
    fn at_max_reservations_a_reserve_is_store_full_and_charges_nothing() {
        let (_, e) = engine(vec![per_minute("w", Algorithm::FixedWindow, 10)], 10);
        let e = e.with_reservations(ReservationParams {
            timeout: 10 * SECOND,
            max_open: 1,
        });
        // A denied reservation gives its place back.
        let (denied, none) = e.reserve_uncounted("w", "a", 11, 0).unwrap();
        assert_eq!((denied.outcome, none), (Outcome::Never, None));
        let id = reserve(&e, "w", "a", 1);
        let (full, none) = e.reserve_uncounted("w", "b", 1, 0).unwrap();
        assert_eq!((full.outcome, none), (Outcome::StoreFull, None));
        assert_eq!(e.rule("w").unwrap().active_keys(), 1);
        e.settle(&id, 1).unwrap();
        reserve(&e, "w", "b", 1);
    }

    #[test]
    fn a_rule_relimited_or_redefined_since_the_reservation_gets_nothing_back() {
        let (_, e) = engine(vec![per_minute("w", Algorithm::FixedWindow, 10)], 10);
        let id = reserve(&e, "w", "k", 8);
        let (next, _) = e
            .reload(vec![per_minute("w", Algorithm::FixedWindow, 20)])
            .unwrap();
        let s = next.settle(&id, 2).unwrap();
        assert_eq!((s.refunded, s.unpaid), (0, 0));
        // Relimited, the rule kept its counts: the 8 reserved still count against the 20.
        assert_eq!(remaining(&next, "w", "k"), 12);
        // Another period: fresh counts, and nothing back either.
        let id = reserve(&next, "w", "k", 3);
        let two_minutes = Rule {
            limits: vec![Limit::new(Algorithm::FixedWindow, 20, 120 * SECOND, None).unwrap()],
            ..per_minute("w", Algorithm::FixedWindow, 20)
        };
        let (next, _) = next.reload(vec![two_minutes.clone()]).unwrap();
        assert_eq!(next.settle(&id, 1).unwrap().refunded, 0);
        assert_eq!(remaining(&next, "w", "k"), 20);
        // An unchanged rule keeps its reservations across a reload.
        let id = reserve(&next, "w", "k", 5);
        let (again, _) = next.reload(vec![two_minutes]).unwrap();
        assert_eq!(again.settle(&id, 1).unwrap().refunded, 4);
    }

    /// A clustered engine alone in its cluster, with its rounds run as the clock moves.
    struct Lone {
        clock: Arc<ManualClock>,
        engine: Engine,
        global: Arc<Global>,
    }

    impl Lone {
        fn new(rules: Vec<Rule>) -> Lone {
            let clock = Arc::new(ManualClock::new(T0));
            let me = Actor::new("a".to_owned(), 1);
            let (engine, global) =
                Engine::clustered(rules, 100, clock.clone(), me, Params::default()).unwrap();
            let lone = Lone {
                clock,
                engine,
                global,
            };
            lone.run_to(T0 + 2 * SECOND);
            lone
        }

        /// Runs every boundary and instant up to `to`, and leaves the clock there.
        fn run_to(&self, to: Nanos) {
            for _ in 0..100_000 {
                let next = self.global.next_tick(self.clock.now());
                if next > to {
                    self.clock.set(to);
                    return;
                }
                self.clock.set(next);
                self.global.tick(next);
                if self.global.next_tick(next) == next {
                    self.clock.set(next + 1);
                }
            }
            panic!("the rounds did not reach {to}");
        }
    }

    #[test]
    fn a_clustered_refund_is_credit_that_later_checks_here_spend_without_the_cluster() {
        let lone = Lone::new(vec![global_window("w", 10)]);
        let e = &lone.engine;
        lone.run_to(T0 + 3 * SECOND + 10 * MILLISECOND);
        let id = reserve(e, "w", "k", 8);
        assert_eq!(remaining(e, "w", "k"), 2);
        lone.run_to(T0 + 3 * SECOND + 40 * MILLISECOND);
        let s = e.settle(&id, 2).unwrap();
        assert_eq!(s.refunded, 6);
        // The cluster's count keeps the 8: its remaining does not move...
        assert_eq!(s.standing.unwrap().decision.remaining, 2);
        // ... but this node may admit 6 more from the credit, and the 2 the count leaves:
        // 2 + 8 = the limit in all, and not one more.
        for i in 0..8 {
            assert!(
                e.check("w", "k", 1, 0).unwrap().decision.allowed(),
                "check {i}"
            );
        }
        let denied = e.check("w", "k", 1, 0).unwrap();
        assert_eq!(denied.outcome, Outcome::Denied);
        assert_eq!(remaining(e, "w", "k"), 0);
        // A credit ends with its window.
        let id = reserve(&lone.engine, "w", "other", 5);
        let s = e.settle(&id, 0).unwrap();
        assert_eq!(s.refunded, 5);
        lone.run_to(T0 + 4 * SECOND + 50 * MILLISECOND);
        for _ in 0..10 {
            assert!(e.check("w", "other", 1, 0).unwrap().decision.allowed());
        }
        assert!(!e.check("w", "other", 1, 0).unwrap().decision.allowed());
        // A window closed before the settle gives no credit.
        let id = reserve(e, "w", "late", 4);
        lone.run_to(T0 + 5 * SECOND + 50 * MILLISECOND);
        assert_eq!(e.settle(&id, 0).unwrap().refunded, 0);
        assert_eq!(e.sweep(), 0);
    }

    #[test]
    fn a_clustered_credit_pays_part_of_a_check_and_the_cluster_the_rest() {
        let lone = Lone::new(vec![global_window("w", 10)]);
        let e = &lone.engine;
        lone.run_to(T0 + 3 * SECOND + 10 * MILLISECOND);
        let id = reserve(e, "w", "k", 6);
        e.settle(&id, 3).unwrap();
        // 3 of credit and 4 left in the count: 7 fits, 8 does not (and spends nothing).
        assert!(!e.check("w", "k", 8, 0).unwrap().decision.allowed());
        assert!(e.check("w", "k", 7, 0).unwrap().decision.allowed());
        assert!(!e.check("w", "k", 1, 0).unwrap().decision.allowed());
        // A settle above a clustered reservation is charged where the node has room.
        let id = reserve(e, "w", "b", 2);
        let s = e.settle(&id, 5).unwrap();
        assert_eq!((s.charged, s.unpaid), (3, 0));
        let id = reserve(e, "w", "c", 2);
        let s = e.settle(&id, 50).unwrap();
        assert_eq!((s.charged, s.unpaid), (0, 48));
    }

    #[test]
    fn a_clustered_bucket_credit_fades_at_the_buckets_rate() {
        let lone = Lone::new(vec![global("b", 10)]);
        let e = &lone.engine;
        let id = reserve(e, "b", "k", 10);
        assert!(!e.check("b", "k", 1, 0).unwrap().decision.allowed());
        assert_eq!(e.settle(&id, 4).unwrap().refunded, 6);
        // At once, the 6 are there (the bucket itself is empty). Half a second later, a
        // bucket charged only 4 would have refilled 5 of its 10: of the credit, at most
        // 10 − 5 = 5 in all may be spent by then, and 3 were.
        for _ in 0..3 {
            assert!(e.check("b", "k", 1, 0).unwrap().decision.allowed());
        }
        lone.run_to(lone.clock.now() + 500 * MILLISECOND);
        let credit = e
            .rule("b")
            .unwrap()
            .credits
            .as_ref()
            .unwrap()
            .store
            .read("k", |c| c.map(|c| c.spendable(lone.clock.now())));
        assert_eq!(credit, Some(2));
    }

    fn global_window(name: &str, limit: u64) -> Rule {
        Rule {
            scope: Scope::Global,
            ..rule(name, Algorithm::FixedWindow, limit, None)
        }
    }

    #[test]
    fn over_the_tree_a_refund_is_credit_too() {
        let clock = Arc::new(ManualClock::new(T0));
        let me = Actor::new("n0", 1);
        let (e, tree) = Engine::clustered_tree(
            vec![global_window("w", 10)],
            100,
            clock.clone(),
            me.clone(),
            TreeParams::default(),
        )
        .unwrap();
        crate::cluster::lock(&tree).set_members(std::slice::from_ref(&me), T0);
        let round = TreeParams::default().round;
        let tick = || {
            clock.advance(round);
            crate::cluster::lock(&tree).tick(clock.now());
        };
        for _ in 0..30 {
            tick();
        }
        // Alone, the node's base of the key is the whole limit.
        let id = reserve(&e, "w", "k", 8);
        let s = e.settle(&id, 1).unwrap();
        assert_eq!((s.refunded, s.standing.unwrap().decision.remaining), (7, 2));
        // 2 left of the base, 7 of credit: 9 more checks, as the limit allows.
        let admitted = (0..12)
            .filter(|_| e.check("w", "k", 1, 0).unwrap().decision.allowed())
            .count();
        assert_eq!(admitted, 9);
    }
}
