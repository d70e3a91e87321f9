//! All-or-nothing checks of several (rule, key, cost) at once: either every item is charged,
//! or none is (the RLS's requests and `POST /v1/check/batch`).
//!
//! The engine charges one key at a time, atomically under that key's shard lock, so a batch
//! is decided in two steps:
//! 1. *predict*: read each item's standing ([`Engine::status`], which charges nothing); if
//!    any item cannot be admitted, the batch is denied and nothing is charged;
//! 2. *charge*: charge the items one by one ([`Engine::check_uncounted`]), stopping at the
//!    first that is denied.
//!
//! What holds under concurrency: every charge is an ordinary atomic check-and-charge, so a
//! batch never admits more than any rule's limit allows, whatever runs beside it. A
//! concurrent check can only spend room between the two steps; then step 2 stops at the
//! item that no longer fits and the batch is denied, but the items charged before it in
//! this batch stay charged (the engine has no refund). That is the one way a denied batch
//! changes counters, it errs towards admitting less, and it needs a race inside the few
//! microseconds between the two steps on the same key. A batch of one item is a single
//! check, exact.
//!
//! Items of cost 0 are status queries: reported, never charged, never a reason to deny.

use crate::engine::{Checked, Engine, Outcome, UnknownRule};
use crate::limiter::{Decision, Nanos, Verdict};

/// One item of a batch.
#[derive(Debug, Clone, Copy)]
pub struct Item<'e, 'a> {
    /// The engine that counts it (a batch may span engines: the RLS's dynamic limits live in
    /// one of their own).
    pub engine: &'e Engine,
    /// The rule.
    pub rule: &'a str,
    /// The key.
    pub key: &'a str,
    /// The cost; 0 only reports where the key stands.
    pub cost: u64,
}

/// What happened to one item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Charged (the batch was admitted).
    Charged,
    /// This item is why the batch was denied; nothing of it was charged.
    Denied,
    /// It would have fit, but the batch was denied for another item: not charged.
    NotCharged,
    /// A status query (cost 0): not charged.
    Reported,
}

/// One item's decision.
#[derive(Debug, Clone, Copy)]
pub struct ItemResult<'e> {
    /// The decision (the charge's, or the standing that predicted it).
    pub checked: Checked<'e>,
    /// What was done.
    pub fate: Fate,
}

/// A batch's outcome.
#[derive(Debug)]
pub enum Step<'e> {
    /// Decided: whether every item was admitted, and each item's result, in order.
    Done(bool, Vec<ItemResult<'e>>),
    /// An item is a clustered key this node holds no lease for yet (see
    /// [`Engine::lease_pause`]): wait this long, then decide again without pausing. The
    /// second value is what the lease will be in by ([`Engine::lease_in`]).
    Pause(Nanos, u64),
}

/// Decides `items` all or nothing (see the module doc) and counts each decided item's
/// outcome. With `may_pause`, a denial that a clustered key's first lease would lift is
/// returned as [`Step::Pause`] instead, charging nothing.
pub fn check_all<'e>(items: &[Item<'e, '_>], may_pause: bool) -> Result<Step<'e>, UnknownRule> {
    let charging = items.iter().filter(|i| i.cost > 0).count();
    // Unknown rules are refused before anything is charged.
    for item in items {
        item.engine.rule(item.rule)?;
    }
    if charging <= 1 {
        // At most one charge: a single exact check, and standings for the rest.
        let mut results = Vec::with_capacity(items.len());
        let mut admitted = true;
        for item in items {
            let engine = item.engine;
            if item.cost == 0 {
                results.push(ItemResult {
                    checked: engine.status(item.rule, item.key)?,
                    fate: Fate::Reported,
                });
                continue;
            }
            let checked = engine.check_uncounted(item.rule, item.key, item.cost, 0)?;
            if may_pause
                && let Some((pause, mark)) = engine.lease_pause(&checked, item.key, item.cost)
            {
                return Ok(Step::Pause(pause, mark));
            }
            engine.count(&checked);
            admitted = checked.outcome == Outcome::Allowed;
            let fate = if admitted {
                Fate::Charged
            } else {
                Fate::Denied
            };
            results.push(ItemResult { checked, fate });
        }
        return Ok(Step::Done(admitted, results));
    }
    let mut standing = Vec::with_capacity(items.len());
    for item in items {
        standing.push(item.engine.status(item.rule, item.key)?);
    }
    // Predict.
    let mut predicted: Vec<ItemResult<'e>> = Vec::with_capacity(items.len());
    let mut fits = true;
    for (item, status) in items.iter().zip(standing) {
        if item.cost == 0 {
            predicted.push(ItemResult {
                checked: status,
                fate: Fate::Reported,
            });
            continue;
        }
        if status.decision.allowed() && status.decision.remaining >= item.cost {
            predicted.push(ItemResult {
                checked: status,
                fate: Fate::NotCharged,
            });
            continue;
        }
        let denied = denial(status, item.cost);
        let engine = item.engine;
        if may_pause && let Some((pause, mark)) = engine.lease_pause(&denied, item.key, item.cost) {
            return Ok(Step::Pause(pause, mark));
        }
        fits = false;
        predicted.push(ItemResult {
            checked: denied,
            fate: Fate::Denied,
        });
    }
    if !fits {
        for (item, r) in items.iter().zip(&predicted) {
            if r.fate == Fate::Denied {
                item.engine.count(&r.checked);
            }
        }
        return Ok(Step::Done(false, predicted));
    }
    // Charge.
    let mut admitted = true;
    for (item, result) in items.iter().zip(predicted.iter_mut()) {
        if item.cost == 0 || !admitted {
            continue;
        }
        let checked = item
            .engine
            .check_uncounted(item.rule, item.key, item.cost, 0)?;
        item.engine.count(&checked);
        if checked.outcome == Outcome::Allowed {
            *result = ItemResult {
                checked,
                fate: Fate::Charged,
            };
        } else {
            admitted = false;
            *result = ItemResult {
                checked,
                fate: Fate::Denied,
            };
        }
    }
    Ok(Step::Done(admitted, predicted))
}

/// A standing that cannot take `cost` as a denial: `Never` when the cost exceeds what the
/// rule's limit could ever hold, else denied until the standing's retry (or window reset).
fn denial(status: Checked<'_>, cost: u64) -> Checked<'_> {
    let limit = &status.rule.rule.limits[status.limit_index];
    let (verdict, outcome) = if cost > limit.max_cost() {
        (Verdict::Never, Outcome::Never)
    } else {
        let retry_after = match status.decision.verdict {
            Verdict::Deny { retry_after } => retry_after,
            _ => status.decision.reset_after,
        };
        (Verdict::Deny { retry_after }, Outcome::Denied)
    };
    Checked {
        decision: Decision {
            verdict,
            ..status.decision
        },
        outcome,
        ..status
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::clock::ManualClock;
    use crate::config::{Rule, Scope};
    use crate::limiter::{Algorithm, Limit, SECOND};

    const T0: Nanos = 1_700_000_000 * SECOND;

    fn engine() -> Engine {
        let rule = |name: &str, limit| Rule {
            name: name.into(),
            limits: vec![Limit::new(Algorithm::FixedWindow, limit, SECOND, None).unwrap()],
            scope: Scope::Global,
            max_wait: 0,
        };
        Engine::new(
            vec![rule("a", 5), rule("b", 2)],
            100,
            Arc::new(ManualClock::new(T0)),
        )
    }

    fn done<'e>(step: Step<'e>) -> (bool, Vec<ItemResult<'e>>) {
        match step {
            Step::Done(ok, results) => (ok, results),
            Step::Pause(..) => panic!("no cluster, no pause"),
        }
    }

    fn remaining(e: &Engine, rule: &str, key: &str) -> u64 {
        e.status(rule, key).unwrap().decision.remaining
    }

    #[test]
    fn a_batch_charges_every_item_or_none() {
        let e = &engine();
        let items = [
            Item {
                engine: e,
                rule: "a",
                key: "k",
                cost: 1,
            },
            Item {
                engine: e,
                rule: "b",
                key: "k",
                cost: 1,
            },
        ];
        for _ in 0..2 {
            let (ok, results) = done(check_all(&items, true).unwrap());
            assert!(ok);
            assert!(results.iter().all(|r| r.fate == Fate::Charged));
        }
        // b is spent: the third batch is denied and a is not charged.
        let (ok, results) = done(check_all(&items, true).unwrap());
        assert!(!ok);
        assert_eq!(
            results.iter().map(|r| r.fate).collect::<Vec<_>>(),
            [Fate::NotCharged, Fate::Denied]
        );
        assert_eq!(remaining(e, "a", "k"), 3);
        assert_eq!(e.rule("b").unwrap().outcome_count(Outcome::Denied), 1);
        assert_eq!(e.rule("a").unwrap().outcome_count(Outcome::Allowed), 2);
    }

    #[test]
    fn a_cost_above_any_limit_is_never_and_charges_nothing() {
        let e = &engine();
        let items = [
            Item {
                engine: e,
                rule: "a",
                key: "k",
                cost: 1,
            },
            Item {
                engine: e,
                rule: "b",
                key: "k",
                cost: 3,
            },
        ];
        let (ok, results) = done(check_all(&items, true).unwrap());
        assert!(!ok);
        assert_eq!(results[1].checked.outcome, Outcome::Never);
        assert_eq!(remaining(e, "a", "k"), 5);
    }

    #[test]
    fn status_items_are_reported_and_never_deny() {
        let e = &engine();
        e.check("b", "k", 2, 0).unwrap();
        let items = [
            Item {
                engine: e,
                rule: "a",
                key: "k",
                cost: 2,
            },
            Item {
                engine: e,
                rule: "b",
                key: "k",
                cost: 0,
            },
            Item {
                engine: e,
                rule: "a",
                key: "j",
                cost: 1,
            },
        ];
        let (ok, results) = done(check_all(&items, true).unwrap());
        assert!(ok);
        assert_eq!(results[1].fate, Fate::Reported);
        assert_eq!(results[1].checked.decision.remaining, 0);
        assert_eq!(remaining(e, "a", "k"), 3);
        assert_eq!(remaining(e, "a", "j"), 4);
        assert_eq!(remaining(e, "b", "k"), 0);
    }

    #[test]
    fn an_unknown_rule_refuses_the_batch_before_any_charge() {
        let e = &engine();
        let items = [
            Item {
                engine: e,
                rule: "a",
                key: "k",
                cost: 1,
            },
            Item {
                engine: e,
                rule: "zz",
                key: "k",
                cost: 1,
            },
        ];
        assert!(check_all(&items, true).is_err());
        assert_eq!(remaining(e, "a", "k"), 5);
    }

    /// Threads race batches over the same two keys: no rule ever admits past its limit, and
    /// every admitted batch charged both of its items.
    #[test]
    fn concurrent_batches_never_over_admit() {
        let e = Arc::new(engine());
        let admitted: u64 = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|t| {
                    let e: &Engine = &e;
                    s.spawn(move || {
                        let mut n = 0;
                        for i in 0..200 {
                            let items = if (t + i) % 2 == 0 {
                                vec![
                                    Item {
                                        engine: e,
                                        rule: "a",
                                        key: "k",
                                        cost: 1,
                                    },
                                    Item {
                                        engine: e,
                                        rule: "b",
                                        key: "k",
                                        cost: 1,
                                    },
                                ]
                            } else {
                                vec![Item {
                                    engine: e,
                                    rule: "b",
                                    key: "k",
                                    cost: 1,
                                }]
                            };
                            if let Step::Done(true, _) = check_all(&items, false).unwrap() {
                                n += 1;
                            }
                        }
                        n
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(
            admitted, 2,
            "b holds 2 per window, and every batch charges b"
        );
        assert_eq!(remaining(&e, "b", "k"), 0);
        assert!(remaining(&e, "a", "k") >= 3);
    }
}
