//! The false-denial invariant (design §3.3.3): a check the cluster must admit at once, judged on
//! the true counts the simulation knows, which no node can see.
//!
//! A check of `cost` on a key at node i, with N members all reachable, must be admitted when
//! for every limit of its rule, with `C' = C − ⌊C/20⌋` (the limit less the escrow margin
//! m = 5%; for a bucket, its burst), `count` the key's true cluster-wide use (§3.4's budget
//! for a windowed limit, `burst − level` of one exact bucket fed every admission for a
//! bucket) and `own` what node i admitted of the key in its current round:
//!
//! ```text
//! count + cost ≤ C'      and      N · (own + cost) ≤ C' − count
//! ```
//!
//! The caller says which checks to judge (those made while every member is reachable).

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::cluster::global::ESCROW_MARGIN;
use crate::limiter::{Algorithm, Decision, Limit, Nanos};

/// One admission: when (by the admitting node's clock), where, how much.
#[derive(Clone, Copy, Debug)]
struct Admission {
    at: Nanos,
    node: usize,
    cost: u64,
}

/// Judges every check it is shown against the true counts; see the module docs.
#[derive(Debug)]
pub struct Judge {
    rules: HashMap<String, Vec<Limit>>,
    round: Nanos,
    /// Every admission per (rule, key), in the order made.
    admissions: HashMap<(String, String), Vec<Admission>>,
    /// Checks judged.
    pub judged: u64,
    /// Of which the invariant said must be admitted.
    pub must_admit: u64,
    /// Of which were denied: false denials.
    pub false_denials: u64,
    /// Of the false denials, those within [`Judge::gap`] of the start of the node's round:
    /// before the round's frames can all be in, so before its instant (design §3.3.1).
    pub in_gap: u64,
    /// How long after a round's start a denial counts as [`Judge::in_gap`].
    pub gap: Nanos,
    /// The first few false denials, one line each.
    pub examples: Vec<String>,
}

impl Judge {
    /// A judge for `rules` in a cluster of rounds of `round`.
    pub fn new(rules: &[(String, Vec<Limit>)], round: Nanos) -> Judge {
        Judge {
            rules: rules.iter().cloned().collect(),
            round,
            admissions: HashMap::new(),
            judged: 0,
            must_admit: 0,
            false_denials: 0,
            in_gap: 0,
            gap: 0,
            examples: Vec::new(),
        }
    }

    /// Records a check at `node` (whose clock read `now`) of `members` all reachable, and,
    /// if `judge`, judges its `decision`.
    #[allow(clippy::too_many_arguments)]
    pub fn check(
        &mut self,
        rule: &str,
        key: &str,
        node: usize,
        members: usize,
        now: Nanos,
        cost: u64,
        decision: &Decision,
        judge: bool,
    ) {
        let Some(limits) = self.rules.get(rule) else {
            return;
        };
        let id = (rule.to_owned(), key.to_owned());
        if judge {
            self.judged += 1;
            let past = self.admissions.get(&id).map_or(&[][..], Vec::as_slice);
            let round_start = now - now % self.round;
            let own: u64 = past
                .iter()
                .filter(|a| a.node == node && a.at >= round_start)
                .map(|a| a.cost)
                .sum();
            let must = limits
                .iter()
                .all(|l| admits(l, past, now, own, cost, members as u64));
            if must {
                self.must_admit += 1;
                if !decision.allowed() {
                    self.false_denials += 1;
                    if now - round_start <= self.gap {
                        self.in_gap += 1;
                    }
                    if self.examples.len() < 5 {
                        let mut line = String::new();
                        let _ = write!(
                            line,
                            "{rule}/{key} at node {node}, +{} ms into its round: cost {cost}, {own} admitted there this round, denied {:?} (remaining {}); true use",
                            (now - round_start) / 1_000_000,
                            decision.verdict,
                            decision.remaining,
                        );
                        for l in limits {
                            let _ = write!(line, " {:.1}/{}", used(l, past, now), cap(l));
                        }
                        self.examples.push(line);
                    }
                }
            }
        }
        if decision.allowed() {
            self.admissions.entry(id).or_default().push(Admission {
                at: now,
                node,
                cost,
            });
        }
    }

    /// One line: judged, must admit, false denials.
    pub fn line(&self) -> String {
        format!(
            "{} checks judged, {} far from the limit, {} of those denied ({} in the gap)",
            self.judged, self.must_admit, self.false_denials, self.in_gap
        )
    }
}

/// What the limit's count is measured against: the limit, or a bucket's burst.
fn cap(l: &Limit) -> u64 {
    match l.algorithm() {
        Algorithm::TokenBucket | Algorithm::LeakyBucket => l.burst(),
        _ => l.limit(),
    }
}

/// Whether `l` alone must admit `cost` at a node that admitted `own` this round.
fn admits(l: &Limit, past: &[Admission], now: Nanos, own: u64, cost: u64, n: u64) -> bool {
    let c = cap(l);
    let room = (c - c / ESCROW_MARGIN) as f64;
    let count = used(l, past, now);
    let eps = 1e-9;
    count + cost as f64 <= room + eps && (n * (own + cost)) as f64 <= room - count + eps
}

/// The key's true use under `l` at `now`: the budget of §3.4 over every admission (a log's
/// exact one), or the tokens one exact bucket fed every admission lacks.
fn used(l: &Limit, past: &[Admission], now: Nanos) -> f64 {
    let w = l.period();
    let sum = |keep: &dyn Fn(Nanos) -> bool| -> f64 {
        past.iter()
            .filter(|a| a.at <= now && keep(a.at))
            .map(|a| a.cost as f64)
            .sum()
    };
    match l.algorithm() {
        Algorithm::FixedWindow => sum(&|t| t / w == now / w),
        Algorithm::SlidingWindowLog => sum(&|t| t + w > now),
        Algorithm::SlidingWindowCounter => {
            let s = now / w;
            let elapsed = (now - s * w) as f64 / w as f64;
            let prev = sum(&|t| s > 0 && t / w == s - 1);
            prev * (1.0 - elapsed) + sum(&|t| t / w == s)
        }
        Algorithm::TokenBucket | Algorithm::LeakyBucket => {
            let b = l.burst() as f64;
            let rate = l.limit() as f64 / w as f64;
            let mut sorted: Vec<&Admission> = past.iter().filter(|a| a.at <= now).collect();
            sorted.sort_by_key(|a| a.at);
            let mut level = b;
            let mut at = sorted.first().map_or(now, |a| a.at);
            for a in sorted {
                level = (level + rate * (a.at - at) as f64).min(b) - a.cost as f64;
                at = a.at;
            }
            level = (level + rate * (now - at) as f64).min(b);
            b - level
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{SECOND, Verdict};

    fn denied() -> Decision {
        Decision {
            verdict: Verdict::Deny { retry_after: 1 },
            limit: 0,
            remaining: 0,
            reset_after: 0,
        }
    }

    fn admitted() -> Decision {
        Decision {
            verdict: Verdict::Admit { wait: 0 },
            ..denied()
        }
    }

    #[test]
    fn a_denial_within_the_nodes_share_of_the_room_is_false_and_one_beyond_it_is_not() {
        let fixed = Limit::new(Algorithm::FixedWindow, 60, SECOND, None).unwrap();
        let rules = vec![("r".to_owned(), vec![fixed])];
        let mut j = Judge::new(&rules, SECOND / 10);
        let t = 10 * SECOND;
        // 57 of room at 3 nodes: 19 each per round.
        for i in 0..19 {
            j.check("r", "k", 0, 3, t + i, 1, &admitted(), true);
        }
        assert_eq!(j.false_denials, 0);
        j.check("r", "k", 0, 3, t + 19, 1, &denied(), true);
        assert_eq!(j.false_denials, 0, "past its share of 57 − 19 = 38 over 3");
        // Another node may take a third of the 38 left: a denial of its 5th check is false.
        for i in 0..4 {
            j.check("r", "k", 1, 3, t + 20 + i, 1, &admitted(), true);
        }
        j.check("r", "k", 1, 3, t + 30, 1, &denied(), true);
        assert_eq!(j.false_denials, 1, "{:?}", j.examples);
        // The next window starts afresh; a check not judged is only recorded.
        j.check("r", "k", 2, 3, t + SECOND, 1, &denied(), false);
        assert_eq!((j.judged, j.false_denials), (25, 1));
    }

    #[test]
    fn a_bucket_counts_the_tokens_one_exact_bucket_lacks() {
        let tb = Limit::new(Algorithm::TokenBucket, 10, SECOND, Some(20)).unwrap();
        let past = [
            Admission {
                at: 0,
                node: 0,
                cost: 10,
            },
            Admission {
                at: SECOND / 2,
                node: 1,
                cost: 10,
            },
        ];
        // 20 − 10, +5 refilled, −10: 15 used; a second on, 10 refilled: 5.
        assert!((used(&tb, &past, SECOND / 2) - 15.0).abs() < 1e-6);
        assert!((used(&tb, &past, 3 * SECOND / 2) - 5.0).abs() < 1e-6);
    }
}
