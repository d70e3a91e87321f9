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

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use crate::clock::Clock;
use crate::cluster::global::{Global, GlobalError, Params};
use crate::config::{Rule, Scope};
use crate::counter::Actor;
use crate::limiter::{Decision, KeyState, Nanos, SECOND, Verdict};
use crate::metrics::Striped;
use crate::store::{Full, Store};

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
    /// Checks by [`Outcome`], indexed as [`Outcome::ALL`].
    outcomes: Striped<4>,
    /// In a cluster, a global rule's keys live in [`Global`] under this index.
    global: Option<(Arc<Global>, usize)>,
}

impl RuleState {
    /// Checks counted with `outcome` so far.
    pub fn outcome_count(&self, outcome: Outcome) -> u64 {
        self.outcomes.get(outcome as usize)
    }

    /// Keys this rule tracks now.
    pub fn active_keys(&self) -> usize {
        match &self.global {
            Some((g, i)) => g.rule_keys(*i),
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
}

/// No rule has that name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no rule named \"{0}\"")]
pub struct UnknownRule(pub String);

/// Rules, keyed state and the clock.
#[derive(Debug)]
pub struct Engine {
    clock: Arc<dyn Clock>,
    rules: HashMap<Box<str>, RuleState, foldhash::fast::RandomState>,
    /// Rule names in config order, for stable metrics output.
    order: Vec<Box<str>>,
}

impl Engine {
    /// An engine serving `rules`, holding at most `max_keys` keys across them all.
    pub fn new(rules: Vec<Rule>, max_keys: usize, clock: Arc<dyn Clock>) -> Engine {
        Engine::build(rules, max_keys, clock, Arc::new(AtomicUsize::new(0)), None)
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
        let engine = Engine::build(rules, max_keys, clock, keys, Some(global.clone()));
        Ok((engine, global))
    }

    fn build(
        rules: Vec<Rule>,
        max_keys: usize,
        clock: Arc<dyn Clock>,
        keys: Arc<AtomicUsize>,
        global: Option<Arc<Global>>,
    ) -> Engine {
        let order = rules.iter().map(|r| r.name.as_str().into()).collect();
        let rules = rules
            .into_iter()
            .map(|rule| {
                let global = global
                    .as_ref()
                    .filter(|_| rule.scope == Scope::Global)
                    .and_then(|g| Some((g.clone(), g.rule_index(&rule.name)?)));
                let state = RuleState {
                    store: Store::new(keys.clone(), max_keys),
                    rule,
                    outcomes: Default::default(),
                    global,
                };
                (state.rule.name.as_str().into(), state)
            })
            .collect();
        Engine {
            clock,
            rules,
            order,
        }
    }

    /// The clock decisions are made on.
    pub fn clock(&self) -> &dyn Clock {
        &*self.clock
    }

    /// The named rule.
    pub fn rule(&self, name: &str) -> Result<&RuleState, UnknownRule> {
        self.rules
            .get(name)
            .ok_or_else(|| UnknownRule(name.to_owned()))
    }

    /// Every rule, in config order.
    pub fn rules(&self) -> impl Iterator<Item = &RuleState> {
        self.order.iter().filter_map(|name| self.rules.get(name))
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
    }

    /// How long to hold a check that a clustered rule denied only because this node holds no
    /// lease for the key yet (a new key in the few milliseconds between a round's boundary
    /// and its instant, docs/design.md §3.3.1): the wait until the instant, when the key gets
    /// its lease. `None` for every other decision.
    pub fn lease_pause(&self, checked: &Checked<'_>, cost: u64) -> Option<Nanos> {
        let (global, _) = checked.rule.global.as_ref()?;
        match checked.decision.verdict {
            Verdict::Deny { retry_after }
                if checked.outcome == Outcome::Denied
                    && checked.decision.remaining >= cost
                    && retry_after <= global.params().settle + crate::limiter::MILLISECOND =>
            {
                Some(retry_after)
            }
            _ => None,
        }
    }

    /// Instants the cluster has processed (0 without a cluster): see [`Engine::lease_pause`].
    pub fn instants(&self, checked: &Checked<'_>) -> u64 {
        checked
            .rule
            .global
            .as_ref()
            .map_or(0, |(global, _)| global.instants())
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
            Some((global, index)) => global.check(*index, key, cost, max_wait, now),
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
        })
    }

    /// Where `key` stands under `rule`: what is left, and whether a check of cost 1 would be
    /// admitted now. Consumes nothing and stores nothing.
    pub fn status(&self, rule: &str, key: &str) -> Result<Checked<'_>, UnknownRule> {
        let state = self.rule(rule)?;
        let limits = &state.rule.limits[..];
        let now = self.clock.now();
        let (limit_index, decision) = match &state.global {
            Some((global, index)) => global.status(*index, key, now),
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
        self.rules.values().map(|r| r.store.evictions()).sum()
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

    #[test]
    fn engine_serves_builtin_rules() {
        let config = Config::load(None, &Default::default()).unwrap();
        let (_, e) = engine(config.rules, 10);
        assert!(e.check("default", "k", 1, 0).unwrap().decision.allowed());
        assert_eq!(e.rules().next().unwrap().rule.name, "default");
    }
}
