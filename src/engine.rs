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

use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};

use crate::clock::Clock;
use crate::cluster::Exchange;
use crate::cluster::global::{Global, GlobalError, Params};
use crate::cluster::tree::{Tree, TreeError, TreeKeys, TreeParams};
use crate::config::{Rule, Scope};
use crate::counter::Actor;
use crate::limiter::{Decision, KeyState, Nanos, SECOND, Verdict};
use crate::metrics::Striped;
use crate::store::{Full, Store};

/// Holds a check [`Engine::lease_pause`] paused until the cluster's next instant has run
/// (`instants` no longer reads `seen`), and at most a few milliseconds past `pause`, as
/// [`Engine::lease_comes_early`] says: from the start, looking every millisecond, or after
/// sleeping `pause`.
pub async fn hold_for_lease(
    clock: &dyn Clock,
    instants: impl Fn() -> u64,
    seen: u64,
    pause: Nanos,
    early: bool,
) {
    // The round task may run the instant a little late: a few milliseconds more.
    let mut limit = 10 * crate::limiter::MILLISECOND;
    if early {
        limit += pause;
    } else {
        clock.sleep(pause).await;
    }
    let mut waited = 0;
    while instants() == seen && waited < limit {
        clock.sleep(crate::limiter::MILLISECOND).await;
        waited += crate::limiter::MILLISECOND;
    }
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
    store: Store<KeyState>,
    /// Checks by [`Outcome`], indexed as [`Outcome::ALL`]. Shared with the rule's next
    /// definition after a reload, so its metrics stay monotonic.
    outcomes: Arc<Striped<4>>,
    /// Clustered checks denied while the node's own view of the key's global remaining was
    /// at least the cost (design §3.3.3): the cluster's cost in false 429s. Shared across a
    /// reload like `outcomes`.
    denied_with_room: Arc<Striped<1>>,
    /// In a cluster, where a global rule's keys live.
    global: Option<Counted>,
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
}

/// What a reload did to each rule, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuleChanges {
    /// Same definition: the rule keeps its keys and counts.
    pub kept: Vec<String>,
    /// Redefined (algorithm, limits, scope or `max_wait`): starts with fresh counts.
    pub changed: Vec<String>,
    /// New rules.
    pub added: Vec<String>,
    /// Rules no longer configured: their keys are dropped.
    pub removed: Vec<String>,
}

/// A reload that cannot be applied; the running rules stay in force.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReloadError {
    /// On a clustered node the global rules are counted by a [`Global`] built at start, and
    /// every node must agree on them: changing them needs a (rolling) restart.
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
        )
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
                let state = RuleState {
                    store: Store::new(keys.clone(), max_keys),
                    outcomes: old.map(|o| o.outcomes.clone()).unwrap_or_default(),
                    denied_with_room: old.map(|o| o.denied_with_room.clone()).unwrap_or_default(),
                    rule,
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
        }
    }

    /// The engine for `rules`, built from this one: a rule whose definition is unchanged
    /// shares this engine's state for it (its keys and counts carry over, and checks still
    /// running on this engine count in the same place); a redefined rule and a new rule start
    /// fresh; a removed rule's keys go once the last in-flight check on this engine is done.
    ///
    /// On a clustered engine, global rules are fixed for the process: a reload that would add,
    /// remove or redefine one (including a change of scope) is refused as a whole. Pure: this
    /// engine is not changed.
    pub fn reload(&self, rules: Vec<Rule>) -> Result<(Engine, RuleChanges), ReloadError> {
        if self.global.is_some() {
            let globals = |rules: &mut dyn Iterator<Item = &Rule>| {
                let mut list: Vec<&Rule> = rules.filter(|r| r.scope == Scope::Global).collect();
                list.sort_by(|a, b| a.name.cmp(&b.name));
                list.into_iter().cloned().collect::<Vec<_>>()
            };
            let before = globals(&mut self.rules.values().map(|r| &r.rule));
            let after = globals(&mut rules.iter());
            if before != after {
                let mut names: Vec<String> = before
                    .iter()
                    .chain(&after)
                    .filter(|r| !(before.contains(r) && after.contains(r)))
                    .map(|r| format!("\"{}\"", r.name))
                    .collect();
                names.dedup();
                return Err(ReloadError::GlobalRulesChanged(names));
            }
        }
        let mut changes = RuleChanges::default();
        for rule in &rules {
            let name = rule.name.clone();
            match self.rules.get(rule.name.as_str()) {
                Some(old) if old.rule == *rule => changes.kept.push(name),
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
        );
        let dropped: u64 = self
            .rules
            .iter()
            .filter(|(name, old)| {
                !engine
                    .rules
                    .get(*name)
                    .is_some_and(|new| Arc::ptr_eq(old, new))
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

    /// How long to hold a check that a clustered rule denied only because this node holds no
    /// lease for the key yet (a new key in the few milliseconds between a round's boundary
    /// and its instant, docs/design.md §3.3.1): the wait until the instant, when the key gets
    /// its lease. `None` for every other decision.
    pub fn lease_pause(&self, checked: &Checked<'_>, cost: u64) -> Option<Nanos> {
        let counted = checked.rule.global.as_ref()?;
        let Verdict::Deny { retry_after } = checked.decision.verdict else {
            return None;
        };
        if checked.outcome != Outcome::Denied || checked.decision.remaining < cost {
            return None;
        }
        let longest = match counted {
            Counted::Mesh(global, _) => global.params().settle + crate::limiter::MILLISECOND,
            // A key new at this node gets its first room from the next round's grants.
            Counted::Tree(keys) => keys.longest_grant_wait(),
        };
        (retry_after <= longest).then_some(retry_after)
    }

    /// Whether a check [`Engine::lease_pause`] held may look again as soon as the next
    /// instant has run: over the mesh an instant runs as soon as every frame of its round is
    /// in, often long before the pause is up; over the tree a new key's room comes with the
    /// grants of the round the pause names, not with the next one applied.
    pub fn lease_comes_early(&self) -> bool {
        matches!(self.global, Some(Exchange::Mesh(_)))
    }

    /// Instants the cluster has processed (0 without a cluster; over the tree, complete
    /// rounds applied): see [`Engine::lease_pause`].
    pub fn instants(&self) -> u64 {
        match &self.global {
            None => 0,
            Some(Exchange::Mesh(global)) => global.instants(),
            Some(Exchange::Tree(_, keys)) => keys.complete_rounds(),
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
        let limits = &state.rule.limits[..];
        let now = self.clock.now();
        let max_wait = max_wait.min(state.rule.max_wait);
        let result = match &state.global {
            Some(Counted::Mesh(global, index)) => global.check(*index, key, cost, max_wait, now),
            Some(Counted::Tree(keys)) => keys
                .decide(&state.rule.name, key, cost, now)
                .expect("the tree runs every global rule")
                .map(|d| (0, d)),
            None => state.store.update(
                key,
                now,
                || KeyState::fresh(limits),
                |s| s.is_fresh(limits, now),
                |s| s.check(limits, now, cost, max_wait),
            ),
        };
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
                let limit = limits[0].limit();
                let d = Decision {
                    verdict: Verdict::Deny {
                        retry_after: STORE_FULL_RETRY,
                    },
                    limit,
                    remaining: 0,
                    reset_after: STORE_FULL_RETRY,
                };
                (0, d, Outcome::StoreFull)
            }
        };
        Ok(Checked {
            rule: state,
            limit_index,
            decision,
            outcome,
            cost,
        })
    }

    /// Where `key` stands under `rule`: what is left, and whether a check of cost 1 would be
    /// admitted now. Consumes nothing and stores nothing.
    pub fn status(&self, rule: &str, key: &str) -> Result<Checked<'_>, UnknownRule> {
        let state = self.rule(rule)?;
        let limits = &state.rule.limits[..];
        let now = self.clock.now();
        let (limit_index, decision) = match &state.global {
            Some(Counted::Mesh(global, index)) => global.status(*index, key, now),
            Some(Counted::Tree(keys)) => (
                0,
                keys.status(&state.rule.name, key, now)
                    .expect("the tree runs every global rule"),
            ),
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
        Ok(Checked {
            rule: state,
            limit_index,
            decision,
            outcome,
            cost: 1,
        })
    }

    /// Evicts every key whose state equals a fresh key's; returns how many went.
    pub fn sweep(&self) -> usize {
        let now = self.clock.now();
        self.rules
            .values()
            .map(|r| {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::config::{Config, Scope};
    use crate::limiter::{Algorithm, Limit, MILLISECOND};

    const T0: Nanos = 1_700_000_000 * SECOND;

    fn rule(name: &str, algorithm: Algorithm, limit: u64, burst: Option<u64>) -> Rule {
        Rule {
            name: name.into(),
            limits: vec![Limit::new(algorithm, limit, SECOND, burst).unwrap()],
            scope: Scope::Local,
            max_wait: 0,
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
                rule("grows", Algorithm::FixedWindow, 5, None),
                rule("same", Algorithm::FixedWindow, 2, None),
            ])
            .unwrap();
        assert_eq!(
            changes,
            RuleChanges {
                kept: vec!["same".into()],
                changed: vec!["grows".into()],
                added: vec!["added".into()],
                removed: vec!["gone".into()],
            }
        );
        // Unchanged: the spent window carries over, and so do its metrics.
        assert!(!next.check("same", "k", 1, 0).unwrap().decision.allowed());
        assert_eq!(counts(&next, "same"), (1, 2));
        // Redefined: fresh counts under the new limit; outcome counters continue.
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
    fn clustered_reload_refuses_any_change_to_global_rules() {
        let e = clustered(vec![
            global("g", 10),
            rule("l", Algorithm::TokenBucket, 1, None),
        ]);
        let refused = [
            vec![global("g", 20), rule("l", Algorithm::TokenBucket, 1, None)],
            vec![global("g", 10), global("h", 1)],
            vec![rule("l", Algorithm::TokenBucket, 1, None)],
            vec![rule("g", Algorithm::TokenBucket, 10, None)],
        ];
        for rules in refused {
            let err = e.reload(rules.clone()).unwrap_err();
            assert!(
                err.to_string()
                    .starts_with("changing global rules in a cluster needs a (rolling) restart"),
                "{err}"
            );
        }
        let ReloadError::GlobalRulesChanged(names) = e.reload(vec![global("g", 20)]).unwrap_err();
        assert_eq!(names, ["\"g\""]);
        // Local rules reload; unchanged global rules stay with the same Global.
        let (next, changes) = e
            .reload(vec![
                global("g", 10),
                rule("l", Algorithm::TokenBucket, 5, None),
            ])
            .unwrap();
        assert_eq!(changes.changed, ["l"]);
        assert!(next.rule("g").unwrap().is_clustered());
        assert!(!next.rule("l").unwrap().is_clustered());
    }

    #[test]
    fn single_node_reload_redefines_global_rules_like_local_ones() {
        let (_, e) = engine(vec![global("g", 1)], 10);
        e.check("g", "k", 1, 0).unwrap();
        let (next, changes) = e.reload(vec![global("g", 2)]).unwrap();
        assert_eq!(changes.changed, ["g"]);
        assert!(next.check("g", "k", 2, 0).unwrap().decision.allowed());
    }

    #[test]
    fn engine_serves_builtin_rules() {
        let config = Config::load(None, &Default::default()).unwrap();
        let (_, e) = engine(config.rules, 10);
        assert!(e.check("default", "k", 1, 0).unwrap().decision.allowed());
        assert_eq!(e.rules().next().unwrap().rule.name, "default");
    }

    /// Over the tree, a global rule's checks go to the tree and local rules stay local; a
    /// key's first check is held for the next round's grant (`lease_pause`), after which
    /// `instants` has moved and the check is admitted; a reload may not touch global rules.
    #[test]
    fn a_tree_engine_routes_global_rules_and_pauses_a_new_key_for_its_grant() {
        let clock = Arc::new(ManualClock::new(T0));
        let me = Actor::new("n0", 1);
        let rules = vec![
            rule("w", Algorithm::FixedWindow, 10, None),
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
        let checked = e.check_uncounted("w", "k", 1, 0).unwrap();
        assert_eq!(checked.outcome, Outcome::Denied);
        let pause = e
            .lease_pause(&checked, 1)
            .expect("a new key waits for its grant");
        assert_eq!(
            pause,
            crate::cluster::lock(&tree).keys().grant_wait(clock.now())
        );
        let seen = e.instants();
        clock.advance(round / 2);
        crate::cluster::lock(&tree).tick(clock.now());
        assert_ne!(e.instants(), seen, "a complete round is an instant");
        let checked = e.check("w", "k", 1, 0).unwrap();
        assert_eq!(
            (checked.outcome, checked.decision.remaining),
            (Outcome::Allowed, 9)
        );
        assert_eq!(e.rule("w").unwrap().active_keys(), 1);
        assert_eq!(e.status("w", "k").unwrap().decision.remaining, 9);
        // A denial for want of room is not held.
        let never = e.check_uncounted("w", "k", 11, 0).unwrap();
        assert_eq!(
            (never.outcome, e.lease_pause(&never, 11)),
            (Outcome::Never, None)
        );
        assert_eq!(e.check("l", "k", 1, 0).unwrap().outcome, Outcome::Allowed);
        assert!(
            e.reload(vec![rule("l", Algorithm::TokenBucket, 1, None)])
                .is_err()
        );
    }
}
