//! Clusters of [`Global`]s on virtual time, over a simulated network that round-trips every
//! message through the wire codec and can delay, drop and cut. Seeded, so every run is exact.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use super::*;
use crate::cluster::sim::judge::Judge;
use crate::cluster::sim::{START, Sim};
use crate::limiter::SECOND;
use crate::wire;

const MS: Nanos = MILLISECOND;

fn fixed(limit: u64, period: Nanos) -> Limit {
    Limit::new(Algorithm::FixedWindow, limit, period, None).unwrap()
}

fn bucket(alg: Algorithm, limit: u64, period: Nanos, burst: u64) -> Limit {
    Limit::new(alg, limit, period, Some(burst)).unwrap()
}

fn rules_fixed() -> Vec<(String, Vec<Limit>)> {
    vec![("api".into(), vec![fixed(100, SECOND)])]
}

#[test]
fn one_node_admits_exactly_the_limit_per_window() {
    let mut sim = Sim::new(1, rules_fixed(), Params::default(), 1);
    sim.advance(200 * MS);
    sim.load("api", "k", &[400], 5 * SECOND);
    for (w, n) in sim.per_window() {
        assert!(n <= 100, "window {w}: {n}");
    }
    // Full windows (not the first, partly before load) admit the whole limit.
    let full: Vec<u64> = sim.per_window().values().copied().skip(1).take(4).collect();
    assert!(full.iter().all(|&n| n >= 97), "{full:?}");
}

#[test]
fn three_nodes_uniform_load_stay_within_the_limit_and_near_it() {
    for seed in 1..=5 {
        let mut sim = Sim::new(3, rules_fixed(), Params::default(), seed);
        sim.advance(300 * MS);
        // 2x load: 200 per second over 3 nodes.
        sim.load("api", "user-42", &[67, 67, 67], 10 * SECOND);
        let windows = sim.per_window();
        for (w, n) in &windows {
            assert!(*n <= 100, "seed {seed} window {w}: {n}");
        }
        let full: u64 = windows.values().skip(1).take(8).sum();
        assert!(
            full >= 8 * 95,
            "seed {seed}: {full} of 800 in 8 full windows"
        );
    }
}

#[test]
fn skewed_load_is_served_by_demand_weighted_leases() {
    let mut sim = Sim::new(3, rules_fixed(), Params::default(), 7);
    sim.advance(300 * MS);
    sim.load("api", "k", &[160, 20, 20], 10 * SECOND);
    let windows = sim.per_window();
    assert!(windows.values().all(|&n| n <= 100), "{windows:?}");
    let full: u64 = windows.values().skip(1).take(8).sum();
    assert!(full >= 8 * 95, "{full} of 800");
}

#[test]
fn every_node_reports_the_same_remaining_once_converged() {
    let mut sim = Sim::new(3, rules_fixed(), Params::default(), 3);
    sim.advance(300 * MS);
    // Align to the start of a window, then admit a few on each node.
    let to_next = SECOND - sim.now % SECOND;
    sim.advance(to_next + 150 * MS);
    for i in 0..3 {
        for _ in 0..5 {
            assert!(sim.check(i, "api", "k", 1).allowed());
        }
    }
    sim.advance(300 * MS);
    let remaining: Vec<u64> = (0..3)
        .map(|i| {
            let g = sim.nodes[i].as_ref().unwrap();
            g.status(0, "k", sim.now).1.remaining
        })
        .collect();
    assert_eq!(remaining, vec![85, 85, 85]);
}

#[test]
fn a_partition_under_hold_never_admits_more_than_the_limit_and_heals_without_loss() {
    for seed in 1..=3 {
        let mut sim = Sim::new(3, rules_fixed(), Params::default(), seed);
        sim.advance(300 * MS);
        sim.load("api", "k", &[67, 67, 67], 2 * SECOND);
        sim.partition(&[2]);
        sim.load("api", "k", &[67, 67, 67], 3 * SECOND);
        for (w, n) in sim.per_window() {
            assert!(n <= 100, "seed {seed} window {w}: {n}");
        }
        assert_eq!(sim.nodes[0].as_ref().unwrap().suspected(), vec!["node-2"]);
        sim.net.cut.clear();
        sim.load("api", "k", &[67, 67, 67], 2 * SECOND);
        for (w, n) in sim.per_window() {
            assert!(n <= 100, "seed {seed} window {w}: {n}");
        }
        // Converged: every node knows every admission of the current window.
        sim.advance(1500 * MS);
        let w = sim.now / SECOND;
        let truth = sim.per_window().get(&w).copied().unwrap_or(0);
        for i in 0..3 {
            let g = sim.nodes[i].as_ref().unwrap();
            assert_eq!(g.known_total("api", 0, "k", w), truth, "node {i}");
        }
        assert!(sim.nodes[0].as_ref().unwrap().suspected().is_empty());
    }
}

#[test]
fn under_hold_a_new_key_is_admitted_at_once_in_windows_opened_since_the_cut() {
    for seed in 1..=3 {
        let mut sim = Sim::new(3, rules_fixed(), Params::default(), seed);
        sim.advance(300 * MS);
        sim.partition(&[2]);
        sim.advance(600 * MS);
        assert_eq!(sim.node(0).suspected(), vec!["node-2"]);
        assert_eq!(sim.node(2).suspected(), vec!["node-0", "node-1"]);
        // The window open at the cut is held as it was (design §5); from the next one on,
        // each side opens starters in the windows it splits by head count.
        sim.advance(2 * SECOND - sim.now % SECOND);
        for w in 0..4 {
            sim.advance(150 * MS);
            let key = format!("fresh-{w}");
            // A user's first burst, on both sides of the cut: admitted at once.
            for i in [0, 1, 2] {
                for c in 0..5 {
                    let d = sim.check(i, "api", &key, 1);
                    assert!(
                        d.allowed(),
                        "seed {seed} window {w} node {i} check {c}: {d:?}"
                    );
                }
            }
            // Then flat out everywhere: both sides together stay within the limit.
            sim.load("api", &key, &[900, 900, 900], 800 * MS);
            sim.advance(SECOND - sim.now % SECOND);
        }
        for (w, n) in sim.per_window() {
            assert!(n <= 100, "seed {seed} window {w}: {n}");
        }
    }
}

#[test]
fn split_lets_each_side_use_the_whole_limit_once_the_other_is_dead() {
    let params = Params {
        on_partition: OnPartition::Split,
        ..Params::default()
    };
    let mut sim = Sim::new(3, rules_fixed(), params, 5);
    sim.advance(300 * MS);
    sim.partition(&[2]);
    sim.advance(500 * MS);
    // Membership declares the other side dead.
    let dead = |sim: &mut Sim, i: usize, others: &[usize]| {
        let members: Vec<MemberInfo> = (0..3)
            .filter(|&j| j != i)
            .map(|j| MemberInfo {
                actor: Actor::new(sim.names[j].clone(), 1),
                alive: !others.contains(&j),
                left: false,
                published_through: None,
                numbers: None,
            })
            .collect();
        let out = sim.nodes[i]
            .as_ref()
            .unwrap()
            .set_members(&members, sim.now);
        sim.route(i, out);
    };
    dead(&mut sim, 0, &[2]);
    dead(&mut sim, 1, &[2]);
    dead(&mut sim, 2, &[0, 1]);
    sim.advance(500 * MS);
    sim.load("api", "k", &[200, 200, 200], 3 * SECOND);
    let side: BTreeMap<u64, u64> = sim
        .admitted
        .iter()
        .filter(|((i, _), _)| *i == 2)
        .map(|((_, w), n)| (*w, *n))
        .collect();
    let full: Vec<u64> = side.values().copied().skip(1).take(2).collect();
    assert!(full.iter().all(|&n| n >= 95), "isolated side {full:?}");
}

#[test]
fn a_crashed_and_restarted_node_loses_no_published_count() {
    let mut sim = Sim::new(
        3,
        vec![("api".into(), vec![fixed(1000, 10 * SECOND)])],
        Params::default(),
        9,
    );
    sim.window = 10 * SECOND;
    let to_next = 10 * SECOND - sim.now % (10 * SECOND);
    sim.advance(to_next + 300 * MS);
    sim.load("api", "k", &[50, 50, 50], 2 * SECOND);
    // Let a round publish everything, then crash node 1 and restart it.
    sim.advance(200 * MS);
    sim.crash(1);
    sim.advance(500 * MS);
    sim.restart(1);
    sim.advance(500 * MS);
    let w = sim.now / (10 * SECOND);
    let truth = sim.per_window().get(&w).copied().unwrap_or(0);
    assert!(truth > 200);
    // Every node knows every admission, plus the same ghost of the killed incarnation (what
    // it may have admitted unpublished: at most its claim, so the window stays ≤ 1000).
    let known: Vec<u64> = (0..3)
        .map(|i| sim.nodes[i].as_ref().unwrap().known_total("api", 0, "k", w))
        .collect();
    assert!(known.iter().all(|&k| k == known[0]), "{known:?}");
    assert!(
        known[0] >= truth && known[0] <= 1000,
        "{known:?} vs {truth}"
    );
    assert!(sim.nodes[1].as_ref().unwrap().pulled());
    assert!(sim.nodes[0].as_ref().unwrap().stats().retired_ghosts > 0);
}

#[test]
fn twenty_percent_message_loss_costs_admissions_not_the_limit() {
    let mut sim = Sim::new(3, rules_fixed(), Params::default(), 11);
    sim.net.loss = 200;
    sim.advance(300 * MS);
    sim.load("api", "k", &[67, 67, 67], 10 * SECOND);
    let windows = sim.per_window();
    assert!(windows.values().all(|&n| n <= 100), "{windows:?}");
    let full: u64 = windows.values().skip(1).take(8).sum();
    assert!(full >= 8 * 80, "{full} of 800");
}

#[test]
fn delay_within_the_settle_time_costs_nothing() {
    let mut sim = Sim::new(5, rules_fixed(), Params::default(), 13);
    sim.net.delay = 20 * MS;
    sim.advance(300 * MS);
    sim.load("api", "k", &[40, 40, 40, 40, 40], 10 * SECOND);
    let windows = sim.per_window();
    assert!(windows.values().all(|&n| n <= 100), "{windows:?}");
    let full: u64 = windows.values().skip(1).take(8).sum();
    assert!(full >= 8 * 95, "{full} of 800");
}

#[test]
fn buckets_share_the_rate_by_demand() {
    let mut sim = Sim::new(3, rules_bucket(), Params::default(), 17);
    sim.advance(300 * MS);
    sim.load("b", "k", &[160, 20, 20], 10 * SECOND);
    let total = sim.total();
    // At most burst + rate × time (+ one unit per node of capacity floor).
    assert!(total <= 100 + 1000 + 3, "{total}");
    assert!(total >= 1000, "{total}");
}

/// `f` of the state of `key`'s first limit under the first rule at node `i` (`None` if the
/// node does not hold the key).
fn first_limit<R>(sim: &Sim, i: usize, key: &str, f: impl FnOnce(Option<&LState>) -> R) -> R {
    sim.node(i).rules[0]
        .store
        .read(key, |k| f(k.map(|k| &k.limits[0])))
}

/// The room node `i` published as held for key "u" of the first rule's first limit, per slot.
fn held(sim: &Sim, i: usize) -> Vec<(u64, u64)> {
    first_limit(sim, i, "u", |s| match s {
        Some(LState::Window(w)) => w.published_held.to_vec(),
        _ => Vec::new(),
    })
}

/// A bucket far from its limit keeps its shares where they are (design §3.5, calm buckets):
/// a user's bursts of two tokens, each at another node, leave every node its even share of
/// the rate and the burst, so nothing about the shares goes on the wire. Before, each burst
/// moved nearly all the rate to its node and back once its demand ended, a report from every
/// node each way. A hot key still moves them (`buckets_share_the_rate_by_demand`).
#[test]
fn a_calm_bucket_keeps_its_shares_where_they_are() {
    let share = |sim: &Sim, i: usize| {
        first_limit(sim, i, "u", |s| match s {
            Some(LState::Bucket(b)) => Some((b.share, b.burst)),
            _ => None,
        })
    };
    for seed in 1..=3 {
        let rules = vec![(
            "b".into(),
            vec![bucket(Algorithm::TokenBucket, 60, 60 * SECOND, 60)],
        )];
        let mut sim = Sim::new(3, rules, Params::default(), seed);
        sim.advance(300 * MS);
        let default = default_share(3);
        for burst in 0..6 {
            let at = burst % 3;
            for _ in 0..2 {
                let d = sim.check(at, "b", "u", 1);
                assert!(matches!(d.verdict, Verdict::Admit { wait: 0 }), "{d:?}");
            }
            for _ in 0..10 {
                sim.advance(DEFAULT_ROUND);
                for i in 0..3 {
                    if let Some(s) = share(&sim, i) {
                        assert_eq!(
                            s,
                            (default, default),
                            "seed {seed}, burst {burst} at node {at}: node {i}'s shares"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn sliding_algorithms_hold_their_budget_in_the_cluster() {
    let rules = vec![
        (
            "c".into(),
            vec![Limit::new(Algorithm::SlidingWindowCounter, 100, SECOND, None).unwrap()],
        ),
        (
            "l".into(),
            vec![Limit::new(Algorithm::SlidingWindowLog, 100, 1600 * MS, None).unwrap()],
        ),
    ];
    let mut sim = Sim::new(3, rules, Params::default(), 19);
    sim.advance(300 * MS);
    sim.load("c", "k", &[67, 67, 67], 5 * SECOND);
    let windows = sim.per_window();
    assert!(windows.values().all(|&n| n <= 100), "{windows:?}");
    sim.admitted.clear();
    sim.window = 1600 * MS;
    sim.load("l", "k", &[67, 67, 67], 8 * SECOND);
    let windows = sim.per_window();
    assert!(windows.values().all(|&n| n <= 100), "{windows:?}");
    assert!(sim.total() > 300);
}

#[test]
fn hostile_messages_are_refused() {
    let (g, now) = with_peer_b();
    let frame = |from: Actor, round: u64| {
        Message::Round(RoundFrame {
            from,
            round,
            view: 0,
            open: None,
            eras: Vec::new(),
            since: None,
            part: 0,
            parts: 1,
            want_full: vec![],
            acks: vec![],
            keys: vec![],
        })
    };
    let n = now / DEFAULT_ROUND;
    assert_eq!(
        g.receive("b", frame(Actor::new("c", 1), n), now),
        Err(Reject::Impostor)
    );
    assert_eq!(
        g.receive("c", frame(Actor::new("c", 1), n), now),
        Err(Reject::NotMember)
    );
    assert_eq!(
        g.receive("b", frame(Actor::new("b", 4), n), now),
        Err(Reject::StaleGeneration)
    );
    assert_eq!(
        g.receive("b", frame(Actor::new("b", 5), n + 50), now),
        Err(Reject::RoundOutOfRange)
    );
    // A late frame is taken while the repeats of the later ones reach back to it.
    assert!(
        g.receive("b", frame(Actor::new("b", 5), n - MAX_REPEAT), now)
            .is_ok()
    );
    assert_eq!(
        g.receive("b", frame(Actor::new("b", 5), n - MAX_REPEAT - 1), now),
        Err(Reject::RoundOutOfRange)
    );
    assert_eq!(
        g.receive("a", frame(Actor::new("a", 1), n), now),
        Err(Reject::Impostor)
    );
    let mut parts = frame(Actor::new("b", 5), n);
    if let Message::Round(f) = &mut parts {
        f.part = 3;
        f.parts = 2;
    }
    assert_eq!(g.receive("b", parts, now), Err(Reject::BadParts));
    // A report with absurd counts, an unknown rule, a wrong shape, and tokens given back on
    // a window: dropped, counted, and no counter moves.
    let bad = Message::Round(RoundFrame {
        from: Actor::new("b", 5),
        round: n,
        view: 0,
        open: None,
        eras: Vec::new(),
        since: None,
        part: 0,
        parts: 1,
        want_full: vec![],
        acks: vec![],
        keys: vec![
            KeyReport {
                rule: "api".into(),
                key: "k".into(),
                demand: 1,
                limits: vec![LimitReport {
                    counts: vec![(now / SECOND, u64::MAX)],
                    ..LimitReport::default()
                }],
            },
            KeyReport {
                rule: "nope".into(),
                key: "k".into(),
                demand: 1,
                limits: vec![],
            },
            KeyReport {
                rule: "api".into(),
                key: "k".into(),
                demand: 1,
                limits: vec![],
            },
            // Tokens given back on a windowed limit (only buckets give tokens back).
            KeyReport {
                rule: "api".into(),
                key: "k".into(),
                demand: 1,
                limits: vec![LimitReport {
                    returned: 1,
                    ..LimitReport::default()
                }],
            },
        ],
    });
    assert!(g.receive("b", bad, now).is_ok());
    g.tick(now);
    g.tick(now + DEFAULT_SETTLE);
    assert_eq!(g.stats().reports_dropped, 4);
    assert_eq!(g.known_total("api", 0, "k", now / SECOND), 0);
    // Counts for slots this node cannot read (two ahead of its clock, and long past):
    // ignored and counted apart; the report's other counts still apply.
    let slot = (now + DEFAULT_ROUND) / SECOND;
    let skewed = Message::Round(RoundFrame {
        from: Actor::new("b", 5),
        round: n + 1,
        view: 0,
        open: None,
        eras: Vec::new(),
        since: Some(n + 1),
        part: 0,
        parts: 1,
        want_full: vec![],
        acks: vec![],
        keys: vec![KeyReport {
            rule: "api".into(),
            key: "k".into(),
            demand: 1,
            limits: vec![LimitReport {
                counts: vec![(slot - 5, 4), (slot, 3), (slot + 2, 7)],
                ..LimitReport::default()
            }],
        }],
    });
    assert!(g.receive("b", skewed, now + DEFAULT_ROUND).is_ok());
    g.tick(now + DEFAULT_ROUND);
    g.tick(now + DEFAULT_ROUND + DEFAULT_SETTLE);
    let stats = g.stats();
    assert_eq!((stats.dots_out_of_range, stats.reports_dropped), (2, 4));
    // Counted against the peer that sent them, for the per-peer metric and warning.
    assert_eq!(g.out_of_range(), vec![("b".to_owned(), 2)]);
    assert_eq!(g.known_total("api", 0, "k", slot), 3);
    assert_eq!(g.known_total("api", 0, "k", slot + 2), 0);
}

/// A node `a` with one peer `b`, and the boundary of a round.
fn with_peer_b() -> (Global, Nanos) {
    let g = Global::new(
        Actor::new("a", 1),
        Params::default(),
        rules_fixed(),
        Arc::new(AtomicUsize::new(0)),
        1000,
    )
    .unwrap();
    let t0 = (START / DEFAULT_ROUND + 1) * DEFAULT_ROUND;
    let b = MemberInfo {
        actor: Actor::new("b", 5),
        alive: true,
        left: false,
        published_through: None,
        numbers: None,
    };
    g.set_members(&[b], t0);
    (g, t0)
}

/// Part `part` of `parts` of `b`'s empty frame of `round`, asking `a` for a full one or not.
fn frame_of_b(round: u64, since: Option<u64>, (part, parts): (u32, u32), asks: bool) -> Message {
    Message::Round(RoundFrame {
        from: Actor::new("b", 5),
        round,
        view: 0,
        open: None,
        eras: Vec::new(),
        since,
        part,
        parts,
        want_full: if asks { vec!["a".to_owned()] } else { vec![] },
        acks: vec![],
        keys: vec![],
    })
}

/// This node's round frame among `out`: (whether it is full, whom it asks for a full one).
fn my_frame(out: &[Output]) -> (bool, Vec<String>) {
    out.iter()
        .find_map(|o| match o {
            Output::ToAll(Message::Round(f)) => Some((f.since.is_none(), f.want_full.clone())),
            _ => None,
        })
        .expect("a round frame")
}

/// A round whose parts straddle an instant (one in before it, one after) is applied at the
/// next instant, in round order: a full frame in two parts still makes its receiver complete.
/// (Its parts were dropped at the first instant, and the receiver asked for another full
/// frame, itself in parts: under load, a full frame every round.)
#[test]
fn a_frame_whose_parts_straddle_an_instant_is_applied_at_the_next() {
    const R: Nanos = DEFAULT_ROUND;
    let (g, t0) = with_peer_b();
    let n = t0 / R;
    let _ = g.tick(t0);
    g.receive("b", frame_of_b(n, None, (0, 2), false), t0 + 5 * MS)
        .unwrap();
    let _ = g.tick(t0 + R / 2);
    g.receive("b", frame_of_b(n, None, (1, 2), false), t0 + R / 2 + 5 * MS)
        .unwrap();
    let _ = g.tick(t0 + R);
    g.receive(
        "b",
        frame_of_b(n + 1, Some(n + 1), (0, 1), false),
        t0 + R + 5 * MS,
    )
    .unwrap();
    let _ = g.tick(t0 + R + R / 2);
    assert_eq!(my_frame(&g.tick(t0 + 2 * R)).1, Vec::<String>::new());
}

/// A peer asks for a full frame in every frame it sends until one is in, so an ask built by
/// the time the last full frame left is not answered again: one full frame per trip, not one
/// per round.
#[test]
fn a_peers_asks_for_a_full_frame_are_answered_once_per_trip() {
    const R: Nanos = DEFAULT_ROUND;
    let (g, t0) = with_peer_b();
    let n = t0 / R;
    let mut full = Vec::new();
    for k in 0..7 {
        let out = g.tick(t0 + k * R);
        full.push(my_frame(&out).0);
        g.receive(
            "b",
            frame_of_b(n + k, Some(n + k), (0, 1), true),
            t0 + k * R + 5 * MS,
        )
        .unwrap();
        let _ = g.tick(t0 + k * R + R / 2);
    }
    // The first frame is full (a new member); the ask of round n was built as it left, the
    // one of n + 1 gets one at n + 2, the next at n + 4.
    assert_eq!(full, [true, false, true, false, true, false, true]);
}

#[test]
fn config_periods_must_fit_rounds() {
    let err = Global::new(
        Actor::new("a", 1),
        Params::default(),
        vec![("x".into(), vec![fixed(10, 150 * MS)])],
        Arc::new(AtomicUsize::new(0)),
        10,
    )
    .unwrap_err();
    assert!(err.to_string().contains("multiple of 100 ms"), "{err}");
}

#[test]
fn a_new_key_is_admitted_in_the_gap_and_waits_only_after_a_degraded_instant() {
    let mut sim = Sim::new(3, rules_fixed(), Params::default(), 23);
    sim.advance(300 * MS);
    // At a boundary, the round's frames still on the wire: the last instant was consistent,
    // so a key it found idle takes a starter, which the next instant charges to this node.
    let to_boundary = DEFAULT_ROUND - sim.now % DEFAULT_ROUND;
    sim.advance(to_boundary);
    for _ in 0..5 {
        assert!(sim.check(0, "api", "fresh", 1).allowed());
    }
    sim.advance(10 * MS);
    for _ in 0..5 {
        assert!(sim.check(1, "api", "fresh", 1).allowed());
    }
    // A peer's frame lost: the instant is degraded. In a window nobody is based in (this
    // one opened before the cluster's first era), right after a consistent instant, it keeps
    // the starters open until the next boundary, so a new key is still admitted at once.
    sim.net.cut.insert((2, 0));
    let to_boundary = DEFAULT_ROUND - sim.now % DEFAULT_ROUND;
    sim.advance(to_boundary + DEFAULT_ROUND / 2 + 5 * MS);
    assert!(sim.check(0, "api", "kept", 1).allowed());
    // Two degraded instants in a row open no starter: a new key waits for the next
    // consistent instant, told to retry when it is due.
    sim.advance(DEFAULT_ROUND);
    sim.net.cut.clear();
    let d = sim.check(0, "api", "late", 1);
    assert!(!d.allowed(), "{d:?}");
    assert_eq!(d.remaining, 100);
    let mut waited = 0;
    while !sim.check(0, "api", "late", 1).allowed() {
        sim.advance(MS);
        waited += 1;
        assert!(waited <= DEFAULT_ROUND / MS, "no lease {waited} ms on");
    }
}

/// A user's first burst of 5 on `key` at each of three nodes, every check admitted at once;
/// then `dur` flat out everywhere, and no window of `key` over the limit of 100.
fn first_bursts_then_flat_out(sim: &mut Sim, seed: u64, key: &str, dur: Nanos) {
    for i in [0, 1, 2] {
        for c in 0..5 {
            let d = sim.check(i, "api", key, 1);
            assert!(d.allowed(), "seed {seed} node {i} check {c}: {d:?}");
        }
    }
    sim.load("api", key, &[900, 900, 900], dur);
    assert_no_window_over(sim, seed, key);
}

/// No window of `key` admitted more than the limit of 100.
fn assert_no_window_over(sim: &Sim, seed: u64, key: &str) {
    for (w, n) in sim.key_windows(key) {
        assert!(n <= 100, "seed {seed} {key} window {w}: {n}");
    }
}

/// Every window after the first consistent instant is based (design §3.3.1): a key new at a
/// node is admitted at once from the node's base even right after a degraded instant, and
/// flat out everywhere the cluster still admits at most the limit.
#[test]
fn after_a_degraded_instant_a_new_key_is_admitted_at_once_from_the_base() {
    for seed in 1..=3 {
        let mut sim = Sim::new(3, rules_fixed(), Params::default(), seed);
        sim.advance(2 * SECOND - sim.now % SECOND + 200 * MS);
        sim.net.cut.insert((2, 0));
        let to_boundary = DEFAULT_ROUND - sim.now % DEFAULT_ROUND;
        sim.advance(to_boundary + DEFAULT_ROUND / 2 + 5 * MS);
        sim.net.cut.clear();
        // The base is ⌊(100 − 5)/3⌋ = 31: a user's first burst is far inside it.
        first_bursts_then_flat_out(&mut sim, seed, "late", 2 * SECOND);
    }
}

/// Under `hold`, the window open at the cut keeps every base as it was (a base is held room):
/// a key new at either side is admitted at once there too, and both sides together stay
/// within the limit.
#[test]
fn under_hold_a_new_key_is_admitted_at_once_in_the_window_open_at_the_cut() {
    for seed in 1..=3 {
        let mut sim = Sim::new(3, rules_fixed(), Params::default(), seed);
        sim.advance(2 * SECOND - sim.now % SECOND + 100 * MS);
        sim.partition(&[2]);
        sim.advance(600 * MS);
        assert_eq!(sim.node(0).suspected(), vec!["node-2"]);
        first_bursts_then_flat_out(&mut sim, seed, "cut", 1500 * MS);
    }
}

/// A restarted node has no base in a window first allotted before its first all-reachable
/// instant (its old incarnation may hold one there), but once its instants are all-reachable
/// and every participant's bases are at the participants there are, it opens starters beside
/// the others' bases (design §3.3.1): a key new at it is admitted at once, as at the others.
/// From the next window on it is based too. Flat out everywhere, no window goes over.
#[test]
fn a_restarted_node_opens_starters_beside_the_bases_of_the_window_it_came_back_in() {
    for seed in 1..=3 {
        let mut sim = Sim::new(3, rules_fixed(), Params::default(), seed);
        sim.advance(2 * SECOND - sim.now % SECOND + 100 * MS);
        sim.load("api", "old", &[0, 0, 900], 100 * MS);
        sim.crash(2);
        sim.advance(50 * MS);
        sim.restart(2);
        // Still pulling the cluster's counts: no instant of it allots room, nothing is held.
        assert!(!sim.node(2).joined());
        assert!(sim.node(2).first_lease(0, 0, "new", sim.clock(2)).is_none());
        sim.advance(400 * MS);
        assert!(sim.node(0).suspected().is_empty(), "seed {seed}");
        assert!(sim.check(0, "api", "new", 1).allowed(), "seed {seed}");
        let d = sim.check(2, "api", "new", 1);
        assert!(
            d.allowed(),
            "seed {seed}: no starter beside the others' bases: {d:?}"
        );
        // Charged its starter, it holds room: a denial is not held for a first lease.
        sim.advance(2 * DEFAULT_ROUND);
        assert!(sim.node(2).first_lease(0, 0, "new", sim.clock(2)).is_none());
        sim.load("api", "new", &[900, 900, 900], 300 * MS);
        sim.advance(SECOND - sim.now % SECOND + 200 * MS);
        for c in 0..5 {
            let d = sim.check(2, "api", "next", 1);
            assert!(d.allowed(), "seed {seed} check {c}: {d:?}");
        }
        sim.load("api", "next", &[900, 900, 900], SECOND);
        for key in ["old", "new", "next"] {
            assert_no_window_over(&sim, seed, key);
        }
    }
}

/// A hot key at one node takes the others' bases (they publish them given back, as 0), and a
/// key given back is not forgotten while its window is open: a late burst at a node that gave
/// its base away waits for room instead of taking the base again.
#[test]
fn a_base_given_back_is_not_taken_again() {
    for seed in 1..=3 {
        let mut sim = Sim::new(3, rules_fixed(), Params::default(), seed);
        sim.advance(2 * SECOND - sim.now % SECOND);
        let w = sim.now / SECOND + 1;
        sim.load("api", "hot", &[0, 900, 0], 2 * SECOND + 700 * MS);
        // Alone, it takes all but the escrow margin (5%).
        let hot = sim.key_windows("hot").get(&w).copied().unwrap_or(0);
        assert!(hot >= 95, "seed {seed}: the hot node admitted {hot} of 100");
        // A full boundary (which forgets fresh keys) between, then bursts at the others.
        sim.advance(150 * MS);
        for _ in 0..40 {
            sim.check(0, "api", "hot", 1);
            sim.check(2, "api", "hot", 1);
        }
        sim.load("api", "hot", &[900, 900, 900], 2 * SECOND);
        assert_no_window_over(&sim, seed, "hot");
    }
}

mod hostile {
    use proptest::prelude::*;

    use super::*;
    use crate::cluster::fuzzing;

    fn report() -> impl Strategy<Value = KeyReport> {
        let slot = prop_oneof![
            Just(fuzzing::NOW / SECOND),
            Just(fuzzing::NOW / SECOND + 1),
            Just(fuzzing::NOW / (100 * MS)),
            any::<u64>(),
        ];
        let limit = (
            proptest::collection::vec((slot.clone(), any::<u64>()), 0..3),
            proptest::collection::vec((slot, any::<u64>()), 0..3),
            prop_oneof![Just(0), Just(SHARE_ONE), any::<u64>()],
            prop_oneof![Just(0), Just(SHARE_ONE / 2), Just(SHARE_ONE), any::<u64>()],
            prop_oneof![Just(0), Just(SHARE_ONE / 3), Just(SHARE_ONE), any::<u64>()],
            prop_oneof![Just(0), Just(50), Just(101), any::<u64>()],
        )
            .prop_map(
                |(counts, held, returned, share, burst, short)| LimitReport {
                    counts,
                    held,
                    returned,
                    burst,
                    short,
                    share,
                },
            );
        (
            prop_oneof![Just("w"), Just("c"), Just("l"), Just("t"), Just("nope")],
            prop_oneof![Just("k".to_owned()), any::<String>()],
            any::<u64>(),
            proptest::collection::vec(limit, 0..3),
        )
            .prop_map(|(rule, key, demand, limits)| KeyReport {
                rule: rule.to_owned(),
                key,
                demand,
                limits,
            })
    }

    fn message() -> impl Strategy<Value = Message> {
        let actor = prop_oneof![
            Just(Actor::new("a", 1)),
            Just(Actor::new("b", 5)),
            Just(Actor::new("b", 4)),
            Just(Actor::new("b", 6)),
            Just(Actor::new("c", 1)),
        ];
        let round = fuzzing::NOW / (100 * MS);
        (
            actor,
            prop_oneof![Just(round), Just(round + 1), any::<u64>()],
            any::<u64>(),
            proptest::option::of(any::<u64>()),
            proptest::collection::vec(report(), 0..6),
        )
            .prop_map(|(from, round, view, since, keys)| {
                Message::Round(RoundFrame {
                    from,
                    round,
                    view,
                    open: None,
                    eras: Vec::new(),
                    since,
                    part: 0,
                    parts: 1,
                    want_full: vec![],
                    acks: vec![],
                    keys,
                })
            })
    }

    proptest! {
        /// Whatever a peer sends, the node does not panic, never lets a peer raise its own
        /// count, and keeps no count above what the cluster could admit.
        #[test]
        fn hostile_frames_never_poison_a_node(m in message()) {
            fuzzing::frame(&wire::encode(&m).unwrap());
        }

        #[test]
        fn hostile_bytes_never_poison_a_node(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut framed = vec![wire::WIRE_VERSION];
            framed.extend_from_slice(&bytes);
            fuzzing::frame(&framed);
        }
    }
}

#[test]
fn a_round_too_large_for_one_frame_goes_in_parts() {
    let mut sim = Sim::new(3, rules_fixed(), Params::default(), 29);
    sim.advance(350 * MS);
    // 24,000 keys with 48-byte names, all changed in one round: over 1 MiB of reports each.
    for i in 0..24_000 {
        let d = sim.check(
            i % 3,
            "api",
            &format!("tenant-{i:08}-user-0000-{:024}", 0),
            1,
        );
        assert!(d.allowed());
    }
    sim.advance(500 * MS);
    let w = sim.now / SECOND;
    for i in 0..3 {
        let g = sim.nodes[i].as_ref().unwrap();
        for k in [7, 23_998] {
            let key = format!("tenant-{k:08}-user-0000-{:024}", 0);
            assert_eq!(g.known_total("api", 0, &key, w), 1, "node {i} key {k}");
        }
        let stats = g.stats();
        assert!(stats.degraded_rounds <= 2, "{stats:?}");
    }
    assert_eq!(sim.rejects, 0);
}

#[test]
fn a_node_killed_mid_round_and_restarted_within_the_window_never_pushes_it_over() {
    // A node killed between boundaries takes its admissions since the last frame with it.
    // Its restart (a new actor) must not let the cluster count those as never made.
    let mut worst = 0;
    for seed in 1..=12u64 {
        let mut sim = Sim::new(
            3,
            vec![("api".into(), vec![fixed(300, 3 * SECOND)])],
            Params::default(),
            seed,
        );
        sim.window = 3 * SECOND;
        let to_next = 3 * SECOND - sim.now % (3 * SECOND);
        sim.advance(to_next + 300 * MS);
        // Half a window of load, then a kill at a seeded point inside a round.
        // The load (120/s) fills a window (100/s) only near its end, so at the kill node 1
        // holds a lease it is spending.
        sim.load("api", "k", &[40, 40, 40], 1000 * MS + (seed * 7 % 100) * MS);
        sim.crash(1);
        sim.load("api", "k", &[60, 0, 60], (seed % 4) * 150 * MS);
        sim.restart(1);
        sim.load("api", "k", &[60, 60, 60], 3 * SECOND);
        for (w, n) in sim.per_window() {
            worst = worst.max(n);
            assert!(n <= 300, "seed {seed} window {w}: {n}");
        }
    }
    assert!(worst >= 250, "the load should fill the windows: {worst}");
}

#[test]
fn a_graceful_leave_releases_its_share_and_loses_no_count() {
    let mut sim = Sim::new(3, rules_fixed(), Params::default(), 23);
    sim.advance(300 * MS);
    sim.load("api", "k", &[67, 67, 67], 2 * SECOND);
    let left_in = sim.now / SECOND;
    sim.leave(2);
    sim.advance(100 * MS);
    // Every admission of the window it left in is counted by the others, exactly: its final
    // frame was in when they heard of the leave, so no retirement was charged.
    let truth = sim.per_window()[&left_in];
    for i in 0..2 {
        let g = sim.nodes[i].as_ref().unwrap();
        let known = g.known_total("api", 0, "k", left_in);
        assert_eq!(known, truth, "node {i}");
        let stats = g.stats();
        assert_eq!(
            (stats.final_leaves, stats.retired_ghosts),
            (1, 0),
            "node {i}"
        );
    }
    sim.advance(SECOND);
    let w = sim.now / SECOND;
    sim.load("api", "k", &[100, 100, 0], 4 * SECOND);
    let windows = sim.per_window();
    assert!(windows.values().all(|&n| n <= 100), "{windows:?}");
    // With the leaver's share released, the two left fill whole windows (hold would keep a
    // third of each for the departed node).
    let full: Vec<u64> = windows.range(w + 1..w + 4).map(|(_, &n)| n).collect();
    assert!(full.iter().all(|&n| n >= 95), "{full:?}");
    assert!(sim.nodes[0].as_ref().unwrap().suspected().is_empty());
}

#[test]
fn a_restarted_node_pulls_twenty_thousand_keys_in_parts() {
    // Short keys are the worst case: decoding claims each entry at its size in memory, far
    // more than its few encoded bytes (one repair of these did not decode before parts).
    let mut sim = Sim::new(3, rules_fixed(), Params::default(), 31);
    sim.advance(350 * MS);
    let w = sim.now / SECOND;
    for i in 0..20_000 {
        assert!(sim.check(i % 2, "api", &format!("k{i}"), 1).allowed());
    }
    sim.advance(300 * MS);
    sim.crash(2);
    sim.advance(50 * MS);
    sim.restart(2);
    sim.advance(200 * MS);
    assert_eq!(sim.now / SECOND, w, "still in the window");
    let g = sim.nodes[2].as_ref().unwrap();
    assert!(g.pulled());
    for k in [0, 7, 19_999] {
        // The admission, plus at most what node 2's retired incarnation held (an idle
        // node's floor share of the room: 1 or 2 units).
        let known = g.known_total("api", 0, &format!("k{k}"), w);
        assert!((1..=3).contains(&known), "key {k}: {known}");
    }
    assert_eq!(sim.rejects, 0);
}

fn rules_bucket() -> Vec<(String, Vec<Limit>)> {
    vec![(
        "b".into(),
        vec![bucket(Algorithm::TokenBucket, 100, SECOND, 100)],
    )]
}

/// The most a bucket of `rate`/s and `burst` was exceeded by over any interval of the run:
/// admissions in [t, u] less `burst + rate·(u − t + 1 ms)`, from per-ms admissions
/// (`sim.window` = 1 ms).
fn worst_excess(sim: &Sim, rate: u64, burst: u64) -> i64 {
    worst_excess_from(sim, rate, burst, 0)
}

/// [`worst_excess`] over the intervals that start at or after `from` (virtual time).
fn worst_excess_from(sim: &Sim, rate: u64, burst: u64, from: Nanos) -> i64 {
    assert_eq!(sim.window, MS);
    crate::cluster::sim::worst_excess(&sim.per_window(), from / MS..=u64::MAX, rate, burst)
}

#[test]
fn held_shares_keep_skewed_and_moving_buckets_near_a_central_one() {
    // 2x load for 10 s on a fresh key: a central bucket (full at the start) admits
    // 100 + 10 × 100 = 1,100; issue 3 asked for ±5% under skew and ±10% with the hot node
    // moving every 2 s. Without giving clipped tokens back, the fresh key's even split lost
    // a burst (skewed: 1,031 of 1,100 at 3 nodes, 973 at 5; moving: 919 at 5); with the
    // burst in escrow but tokens left where they were, the moving hot node of 5 got
    // 1,047-1,058 (design §3.5).
    for seed in 1..=3 {
        for (n, loads) in [(3, vec![160, 20, 20]), (5, vec![160, 10, 10, 10, 10])] {
            for moving in [false, true] {
                let mut sim = Sim::new(n, rules_bucket(), Params::default(), seed);
                sim.window = MS;
                sim.advance(300 * MS);
                for step in 0..5 {
                    let mut l = loads.clone();
                    if moving {
                        l.rotate_right(step % n);
                    }
                    sim.load("b", "k", &l, 2 * SECOND);
                }
                let (total, excess) = (sim.total(), worst_excess(&sim, 100, 100));
                let what = format!("seed {seed}, {n} nodes, moving {moving}: {total}, +{excess}");
                let least = 1070;
                assert!((least..=1100 + n as u64).contains(&total), "{what}");
                assert!(excess <= n as i64, "{what}");
            }
        }
    }
}

#[test]
fn bucket_shares_and_given_back_tokens_never_push_a_bucket_past_its_bound() {
    // The hot node moves every second, over lossy or slow links, or node 0 is cut off for
    // 3 s from its turn as the hot node (under `hold`): both ways, both ways while demand
    // rises on both sides, heard by nobody, or hearing nobody. Shares are held and grow
    // only into room nobody holds, and whatever is given back is taken up at most once, so
    // no interval admits more than burst + rate × τ plus the one-unit capacity floor of
    // each node (design §3.5).
    for seed in 1..=4 {
        for (n, loads) in [(3, vec![160, 20, 20]), (5, vec![160, 10, 10, 10, 10])] {
            for fault in [
                "loss",
                "delay",
                "partition",
                "busy partition",
                "unheard",
                "deaf",
            ] {
                let mut sim = Sim::new(n, rules_bucket(), Params::default(), seed);
                sim.window = MS;
                match fault {
                    "loss" => sim.net.loss = 200,
                    "delay" => sim.net.delay = 20 * MS,
                    _ => {}
                }
                sim.advance(300 * MS);
                for step in 0..10 {
                    let mut l = loads.clone();
                    l.rotate_right(step % n);
                    if step == 3 {
                        match fault {
                            "partition" | "busy partition" => sim.partition(&[0]),
                            "unheard" => sim.net.cut.extend((1..n).map(|b| (0, b))),
                            "deaf" => sim.net.cut.extend((1..n).map(|b| (b, 0))),
                            _ => {}
                        }
                    }
                    if step == 6 {
                        sim.net.cut.clear();
                    }
                    if (3..6).contains(&step) && fault == "busy partition" {
                        // Demand rises on both sides of the cut.
                        l = vec![160; n];
                    }
                    sim.load("b", "k", &l, SECOND);
                }
                let (total, excess) = (sim.total(), worst_excess(&sim, 100, 100));
                assert!(
                    excess <= n as i64,
                    "seed {seed}, {n} nodes, {fault}: {total} admitted, +{excess}"
                );
            }
        }
    }
}

#[test]
fn a_split_heal_gives_up_what_both_sides_held_of_a_bucket() {
    // Under `split` each side takes the whole bucket once the other is declared dead, so
    // at the heal the shares held sum to 2. Each node cuts its share to the floor when a
    // member comes back and grows again from what the merged frames show free: from the
    // heal on, no interval admits more than burst + rate × τ plus the capacity floor.
    let params = Params {
        on_partition: OnPartition::Split,
        ..Params::default()
    };
    for seed in 1..=8 {
        let mut sim = Sim::new(3, rules_bucket(), params.clone(), seed);
        sim.window = MS;
        sim.advance(300 * MS);
        sim.load("b", "k", &[67, 67, 67], 2 * SECOND);
        sim.partition(&[0]);
        sim.load("b", "k", &[67, 67, 67], 3 * SECOND);
        let during = sim.total();
        sim.net.cut.clear();
        let heal = sim.now;
        sim.load("b", "k", &[67, 67, 67], 3 * SECOND);
        let after = sim.total() - during;
        let excess = worst_excess_from(&sim, 100, 100, heal);
        assert!(
            excess <= 3,
            "seed {seed}: {after} after the heal, +{excess}"
        );
        assert!(after >= 250, "seed {seed}: {after} after the heal");
    }
}

#[test]
fn a_restarted_node_takes_no_bucket_share_that_others_hold() {
    // Node 2 is cold, so nodes 0 and 1 hold nearly the whole bucket between them, full.
    // Node 2 crashes and restarts (a new incarnation, whose keys are fresh), and all three
    // get busy at once. A fresh key at the default share of 1/3 with a full bucket, on top
    // of the full buckets the others hold, admitted 34 more than burst + rate × τ (and 17
    // once the node had joined but not yet heard the others' frames). Keys a node creates
    // before its first instant with every frame in start empty at the floor share.
    let mut first_denied = 0;
    for seed in 1..=4 {
        for (quietly, joined) in [(false, false), (true, false), (false, true), (true, true)] {
            let mut sim = Sim::new(3, rules_bucket(), Params::default(), seed);
            sim.window = MS;
            sim.advance(300 * MS);
            sim.load("b", "k", &[20, 20, 0], 3 * SECOND);
            sim.crash(2);
            sim.advance(50 * MS);
            if quietly {
                sim.restart_quietly(2);
            } else {
                sim.restart(2);
            }
            // Buckets keep no counts, so the pull does not name the key: a node that has
            // joined meets it first in the full frames the view change brings.
            for _ in 0..100 {
                if !joined || sim.node(2).joined() {
                    break;
                }
                sim.advance(MS);
            }
            let from = sim.now;
            let before = sim.total();
            // The restarted node's first check finds its bucket empty at the floor share of
            // 1/300: the refill at that share would take 3 s, but the share grows within
            // rounds, so the client is told to come back after an even share's refill of
            // one token, 1 / (100/s / 3) = 30 ms (it was told 3 s).
            let first = sim.check(2, "b", "k", 1);
            if let Verdict::Deny { retry_after } = first.verdict {
                assert!(retry_after <= 31 * MS, "{first:?}");
                first_denied += 1;
            }
            sim.load("b", "k", &[100, 100, 100], 5 * SECOND);
            let after = sim.total() - before;
            let excess = worst_excess_from(&sim, 100, 100, from);
            let what = format!(
                "seed {seed}, quietly {quietly}, load from join {joined}: {after} in 5 s, +{excess}"
            );
            assert!(excess <= 3, "{what}");
            assert!(after >= 450, "{what}");
        }
    }
    assert!(first_denied >= 4, "{first_denied} first checks denied");
}

/// A restarted node says ready (`/readyz`) only once it has settled: joined, and an instant
/// with every participant's frame in has run, so a bucket key new at it starts full at its
/// part of the burst rather than empty at the floor share. A user's first burst there, sent
/// as soon as it is ready, is admitted whole.
#[test]
fn a_restarted_node_is_ready_once_its_new_buckets_start_full() {
    for seed in 1..=3 {
        let mut sim = Sim::new(3, rules_bucket(), Params::default(), seed);
        sim.advance(300 * MS);
        sim.load("b", "busy", &[20, 20, 0], SECOND);
        sim.crash(2);
        sim.advance(50 * MS);
        sim.restart(2);
        let (mut joined_at, mut ready_at) = (None, None);
        for _ in 0..2_000 {
            sim.advance(MS);
            let node = sim.node(2);
            if node.joined() && joined_at.is_none() {
                joined_at = Some(sim.now);
            }
            assert!(
                !node.ready() || node.joined(),
                "seed {seed}: ready unjoined"
            );
            if node.ready() {
                ready_at = Some(sim.now);
                break;
            }
        }
        let (joined_at, ready_at) = (joined_at.unwrap(), ready_at.expect("ready within 2 s"));
        assert!(
            ready_at > joined_at && ready_at - joined_at <= 3 * DEFAULT_ROUND,
            "seed {seed}: joined at {joined_at}, ready at {ready_at}"
        );
        // Its part of the burst: (1 − 1/20)/3 of 100 and a little, so 30 pass at once.
        let admitted = (0..30)
            .filter(|_| sim.check(2, "b", "fresh", 1).allowed())
            .count();
        assert_eq!(admitted, 30, "seed {seed}");
    }
}

#[test]
fn tokens_move_from_the_nodes_above_their_part_to_those_short_of_it() {
    // 3 nodes, a bucket of 100, nobody's demand, default shares: node 0 has spent its third,
    // the others are full. The 66 tokens left are each node's part alike, 22: nodes 1 and 2
    // give back 11 each, and a round later node 0 takes up nearly all of the pool (it lacks
    // 22 of its part; the rest goes by burst target, a third to it).
    let limit = bucket(Algorithm::TokenBucket, 100, SECOND, 100);
    let third = SHARE_ONE / 3;
    let held = [(third, third, 33), (third, third, 0), (third, third, 0)];
    let tokens = |units: u64| units as f64 / SHARE_ONE as f64;
    let (taken, give) = tokens_moved(&limit, &[0, 0, 0], &held, 0);
    assert_eq!((taken, give), (0, 0));
    let (_, give) = tokens_moved(&limit, &[0, 0, 0], &[held[1], held[0], held[2]], 0);
    assert!((tokens(give) - 11.1).abs() < 0.1, "{}", tokens(give));
    let pool = 2 * give;
    let (taken, _) = tokens_moved(&limit, &[0, 0, 0], &held, pool);
    assert!(
        tokens(pool - taken) < 0.2,
        "{} of {}",
        tokens(taken),
        tokens(pool)
    );
    // Once they are even, nobody gives and the pool (tokens clipped elsewhere) goes by the
    // burst targets.
    let even = [(third, third, 11), (third, third, 11), (third, third, 11)];
    assert_eq!(tokens_moved(&limit, &[0, 0, 0], &even, 0), (0, 0));
    let (taken, _) = tokens_moved(&limit, &[0, 0, 0], &even, 3 * SHARE_ONE);
    assert!(taken <= SHARE_ONE);
}

mod moved {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Whatever the frames say, the nodes that read them take up at most the pool
        /// together: each computes its own part with itself first (design §3.5).
        #[test]
        fn the_nodes_take_up_at_most_the_pool(
            held in proptest::collection::vec((1..=SHARE_ONE, 1..=SHARE_ONE, 0..=200u64), 1..8),
            demands in proptest::collection::vec(0..1_000u64, 8),
            pool in 0..(300 * SHARE_ONE),
            burst in 1..=200u64,
        ) {
            let limit = bucket(Algorithm::TokenBucket, 100, SECOND, burst);
            let n = held.len();
            let demands = &demands[..n];
            let mut sum = 0u128;
            for i in 0..n {
                let mut h = held.clone();
                let mut d = demands.to_vec();
                h.swap(0, i);
                d.swap(0, i);
                sum += u128::from(tokens_moved(&limit, &d, &h, pool).0);
            }
            prop_assert!(sum <= u128::from(pool), "{sum} > {pool}");
        }
    }
}

#[test]
fn held_shares_that_sum_past_the_whole_shrink_to_their_targets() {
    let third = SHARE_ONE / 3;
    // Equal demands: targets of a third each. Within the whole, a share up to 1.5 × its
    // target is kept, and one above it shrinks to the target.
    assert_eq!(
        held_share(
            &[10, 10, 10],
            &[third * 3 / 2 - 8, third / 2, third / 2],
            bucket_target
        )
        .0,
        third * 3 / 2 - 8
    );
    assert_eq!(
        held_share(
            &[10, 10, 10],
            &[third * 2, third / 2, third / 2],
            bucket_target
        )
        .0,
        third
    );
    // Past the whole (a fresh key taken at the default share while the others held it
    // all): nobody keeps more than its target, and nobody grows.
    let (share, target) = held_share(
        &[10, 10, 10],
        &[SHARE_ONE / 2 - 1, SHARE_ONE / 2 - 1, third],
        bucket_target,
    );
    assert_eq!((share, target), (third, third));
    assert_eq!(
        held_share(
            &[10, 10, 10],
            &[third - 5, SHARE_ONE / 2, SHARE_ONE / 2],
            bucket_target
        )
        .0,
        third - 5
    );
}

#[test]
fn each_node_estimates_its_peers_clock_offsets_from_frame_arrivals() {
    // Frames leave at each sender's boundary by its own clock and take 1 ms plus up to 5 ms
    // of jitter, which the least arrival over the rounds mostly filters out, so node i
    // reads peer j's offset as skew_j − skew_i less the 1 ms delay and a little jitter.
    let mut sim = Sim::new(3, rules_fixed(), Params::default(), 3);
    sim.skew = vec![0, 7 * MS as i64, -4 * MS as i64];
    sim.net.jitter = 5 * MS;
    sim.advance(3 * SECOND);
    for i in 0..3 {
        let estimates: BTreeMap<String, i64> = sim.node(i).clock_offsets().into_iter().collect();
        assert_eq!(estimates.len(), 2, "node {i}: {estimates:?}");
        for j in (0..3).filter(|&j| j != i) {
            let truth = sim.skew[j] - sim.skew[i];
            let estimate = estimates[&sim.names[j]];
            assert!(
                (truth - 3 * MS as i64..=truth).contains(&estimate),
                "node {i} reads node {j} at {estimate} ns, truth {truth} ns"
            );
        }
    }
}

/// Rounds visit only the keys something happened to: 300 keys checked once each, on a
/// bucket rule and a fixed-window rule, go dormant (unlisted) once their demand has decayed
/// and their frames have repeated, and are left alone until a full boundary or (windows)
/// their slot's edge. Visiting every key every time, the same run visits several times more.
#[test]
fn rounds_visit_only_keys_with_activity() {
    let rules = vec![
        (
            "b".to_owned(),
            // Slow to refill: a key checked once stays short of a token (not fresh), so
            // it stays tracked while dormant.
            vec![bucket(Algorithm::TokenBucket, 100, 3600 * SECOND, 100)],
        ),
        ("w".to_owned(), vec![fixed(100, SECOND)]),
    ];
    let visits = |visit_all: bool| {
        let params = Params {
            visit_all,
            ..Params::default()
        };
        let mut sim = Sim::new(3, rules.clone(), params, 11);
        sim.advance(300 * MS);
        for key in 0..300 {
            let i = key % 3;
            assert!(sim.check(i, "b", &format!("k{key}"), 1).allowed());
            // A window's first check on a new key may wait for a starter: no matter.
            sim.check(i, "w", &format!("k{key}"), 1);
            sim.advance(MS);
        }
        // Demand decays in a round or two, frames repeat a change for three.
        sim.advance(SECOND);
        let before: Vec<u64> = (0..3).map(|i| sim.node(i).stats().key_visits).collect();
        sim.advance(3 * SECOND);
        let during: u64 = (0..3)
            .map(|i| sim.node(i).stats().key_visits - before[i])
            .sum();
        // Mid-slot, away from the window's edge: nothing listed.
        let to_mid = SECOND - sim.now % SECOND + 500 * MS;
        sim.advance(to_mid);
        let listed: Vec<usize> = (0..3)
            .flat_map(|i| [sim.node(i).listed_keys(0), sim.node(i).listed_keys(1)])
            .collect();
        let tracked: usize = (0..3).map(|i| sim.node(i).rule_keys(0)).sum();
        (during, listed, tracked)
    };
    let (listed_visits, listed, tracked) = visits(false);
    let (all_visits, _, all_tracked) = visits(true);
    assert_eq!(tracked, all_tracked);
    // Each node keeps at least the keys it checked (their buckets are short).
    assert!(tracked >= 300, "bucket keys tracked: {tracked}");
    assert_eq!(
        listed,
        vec![0; 6],
        "keys listed mid-slot, per node and rule"
    );
    assert!(
        listed_visits * 4 < all_visits,
        "{listed_visits} key visits in 3 s, against {all_visits} visiting every key"
    );
}

/// A frame repeats a key's counts for [`REPEAT`] rounds after they change, and no longer:
/// the room a quiet sliding key holds moves to each new sub-slot, and reporting that must
/// not send its counts again (anti-entropy repairs counts a peer missed).
#[test]
fn a_frame_sends_a_keys_counts_only_while_they_are_new() {
    let log = Limit::new(Algorithm::SlidingWindowLog, 100, 8 * SECOND, None).unwrap();
    let mut sim = Sim::new(3, vec![("log".to_owned(), vec![log])], Params::default(), 5);
    sim.advance(300 * MS);
    let first = sim.now / (SECOND / 2);
    let mut admitted = 0;
    for key in 0..30 {
        // A window's first check on a new key may wait for a starter: no matter.
        admitted += u64::from(sim.check(key % 3, "log", &format!("k{key}"), 1).allowed());
        sim.advance(MS);
    }
    let last = sim.now / (SECOND / 2);
    assert!(admitted > 0);
    sim.advance(SECOND);
    let before = sim.traffic;
    sim.advance(3 * SECOND);
    let t = sim.traffic.since(before);
    // The keys hold room, which moves at every sub-slot edge (each 0.5 s).
    assert!(t.key_reports >= 30, "{t:?}");
    assert_eq!(t.counted_reports, 0, "{t:?}");
    // A full frame (one a peer asked for) makes its receivers complete for its sender: each
    // node sends each peer the counts of every key it admitted.
    for i in 0..3 {
        sim.node(i).ask_full();
    }
    let before = sim.traffic;
    sim.advance(DEFAULT_ROUND);
    let t = sim.traffic.since(before);
    assert_eq!(t.counted_reports, 2 * admitted, "{t:?}");
    for i in 0..3 {
        let counted: u64 = (0..30)
            .flat_map(|key| (first..=last).map(move |slot| (key, slot)))
            .map(|(key, slot)| sim.node(i).known_total("log", 0, &format!("k{key}"), slot))
            .sum();
        assert_eq!(counted, admitted, "node {i}");
    }
}

/// On a healthy cluster a change goes out in its round's frame and the next one: by then
/// every peer's frame has said it holds the first (`acks`), so there is no third.
#[test]
fn a_change_every_peer_has_is_not_repeated() {
    let rules = vec![("w".to_owned(), vec![fixed(1000, 3600 * SECOND)])];
    let reported = |acks: bool| {
        let params = Params {
            acks,
            ..Params::default()
        };
        let mut sim = Sim::new(3, rules.clone(), params, 3);
        sim.advance(2 * SECOND + 50 * MS - sim.now % (100 * MS));
        sim.watch = Some(("k".to_owned(), Vec::new()));
        assert!(sim.check(0, "w", "k", 1).allowed());
        sim.advance(2 * SECOND);
        let w = sim.now / (3600 * SECOND);
        for i in 0..3 {
            assert_eq!(sim.node(i).known_total("w", 0, "k", w), 1, "node {i}");
        }
        let (_, seen) = sim.watch.take().unwrap();
        seen
    };
    let acked = reported(true);
    let repeated = reported(false);
    // Node 0 counts the check and its demand moves for a round or two; the others' holdings
    // follow. Each change goes out once more with acks, twice more without.
    for node in 0..3 {
        let rounds = |seen: &[(usize, u64)]| -> Vec<u64> {
            seen.iter()
                .filter(|(n, _)| *n == node)
                .map(|(_, r)| *r)
                .collect()
        };
        let (a, r) = (rounds(&acked), rounds(&repeated));
        assert!(
            a.iter().all(|x| r.contains(x)),
            "node {node}: {a:?} against {r:?}"
        );
        let last = |v: &[u64]| v.iter().copied().max().unwrap_or(0);
        assert!(
            !a.is_empty() && last(&a) < last(&r),
            "node {node}: {a:?} against {r:?}"
        );
    }
}

/// A node stalled for half a second (a tick that visited every key of a large store, on a
/// busy machine) sends no frame meanwhile, and the frames sent to it wait until it runs
/// again. Its peers suspect it, and each is missing five of the other's frames. The
/// repeats, which reach back to each peer's last acknowledgement, and the late frames,
/// which are still applied, fill both gaps: nobody sends a full frame, whose size and
/// visit of every key would make the next frames late in their turn (design §10, "A
/// full-frame storm").
#[test]
fn a_stalled_node_catches_up_without_full_frames() {
    let rules = vec![("w".to_owned(), vec![fixed(1000, 3600 * SECOND)])];
    let mut sim = Sim::new(3, rules, Params::default(), 11);
    sim.advance(SECOND + 30 * MS - sim.now % DEFAULT_ROUND);
    for key in 0..60 {
        assert!(sim.check(key % 3, "w", &format!("k{key}"), 1).allowed());
    }
    sim.advance(300 * MS);
    let full = |sim: &Sim| -> Vec<(u64, u64)> {
        (0..3)
            .map(|i| {
                let f = sim.node(i).stats().full_frames;
                (f.asked, f.view_changed)
            })
            .collect()
    };
    let before = full(&sim);
    sim.pause(2, 500 * MS);
    // Counts the stalled node learns only from the frames held for it (a key new while a
    // peer is silent may be refused: no matter).
    let mut admitted = vec![1; 60];
    for key in 60..90 {
        admitted.push(u64::from(
            sim.check(key % 2, "w", &format!("k{key}"), 1).allowed(),
        ));
        sim.advance(10 * MS);
    }
    assert!(admitted[60..].iter().sum::<u64>() > 0);
    sim.advance(SECOND);
    assert_eq!(sim.node(0).suspected(), Vec::<String>::new());
    assert_eq!(full(&sim), before, "(asked, view changed) per node");
    // Caught up: every instant from here on is consistent.
    let rounds = |sim: &Sim| -> Vec<(u64, u64)> {
        (0..3)
            .map(|i| {
                let s = sim.node(i).stats();
                (s.consistent_rounds, s.degraded_rounds)
            })
            .collect()
    };
    let was = rounds(&sim);
    sim.advance(5 * DEFAULT_ROUND);
    let now: Vec<(u64, u64)> = was.iter().map(|(c, d)| (c + 5, *d)).collect();
    assert_eq!(rounds(&sim), now, "(consistent, degraded) per node");
    let w = sim.now / (3600 * SECOND);
    for i in 0..3 {
        for (key, &admitted) in admitted.iter().enumerate() {
            let known = sim.node(i).known_total("w", 0, &format!("k{key}"), w);
            assert_eq!(known, admitted, "node {i} k{key}");
        }
    }
}

/// A peer whose frames keep coming, each after the instant of its round (here its clock is
/// 70 ms behind, so its frame of round n leaves 20 ms after the others' instant), degrades
/// rounds but is not suspected until it has missed [`LATE_SUSPECT_FACTOR`] times M
/// instants; a suspicion that came and went with each late frame would change every node's
/// view each time (design §3.3.4). A silent peer is suspected after M.
#[test]
fn a_peer_whose_frames_come_late_is_suspected_only_after_a_long_while() {
    let rules = vec![("w".to_owned(), vec![fixed(1000, 3600 * SECOND)])];
    let mut sim = Sim::new(3, rules, Params::default(), 7);
    sim.advance(SECOND);
    assert!(sim.node(0).suspected().is_empty());
    let degraded = sim.node(0).stats().degraded_rounds;
    sim.skew[2] = -70 * MS as i64;
    let late_limit = u64::from(DEFAULT_SUSPECT_AFTER * LATE_SUSPECT_FACTOR) * DEFAULT_ROUND;
    sim.advance(late_limit - 5 * DEFAULT_ROUND);
    for i in 0..2 {
        assert!(
            sim.node(i).suspected().is_empty(),
            "node {i} suspects {:?}",
            sim.node(i).suspected()
        );
    }
    assert!(
        sim.node(0).stats().degraded_rounds > degraded + 10,
        "the late frames degrade rounds"
    );
    sim.advance(10 * DEFAULT_ROUND);
    for i in 0..2 {
        assert_eq!(sim.node(i).suspected(), vec!["node-2"], "node {i}");
    }
    // Silent: suspected after M rounds (and a round for the instant).
    sim.skew[2] = 0;
    sim.advance(2 * SECOND);
    assert!(sim.node(0).suspected().is_empty());
    sim.partition(&[2]);
    sim.advance(u64::from(DEFAULT_SUSPECT_AFTER + 1) * DEFAULT_ROUND);
    assert_eq!(sim.node(0).suspected(), vec!["node-2"]);
}

/// While rounds are degraded (here by a peer whose frames all come late), a key waiting only
/// to be allotted is not visited each round: the degraded instants allot nothing, so it waits
/// unlisted for the next consistent instant. Visiting such keys at every round made a
/// degraded stretch as slow as a full visit, and slow rounds late frames (design §2.2).
#[test]
fn degraded_rounds_do_not_visit_keys_waiting_to_be_allotted() {
    let rules = vec![("w".to_owned(), vec![fixed(1000, 3600 * SECOND)])];
    let mut sim = Sim::new(3, rules, Params::default(), 13);
    sim.advance(SECOND);
    sim.skew[2] = -70 * MS as i64;
    sim.advance(5 * DEFAULT_ROUND);
    let keys = 300;
    for key in 0..keys {
        // Degraded: no starter, so most are refused; no matter.
        sim.check(key % 2, "w", &format!("k{key}"), 1);
    }
    // Demand fades in a few rounds; then each key only waits to be allotted.
    sim.advance(10 * DEFAULT_ROUND);
    let before = sim.node(0).stats();
    sim.advance(10 * DEFAULT_ROUND);
    let after = sim.node(0).stats();
    assert!(sim.node(0).suspected().is_empty());
    assert_eq!(
        after.consistent_rounds, before.consistent_rounds,
        "all degraded"
    );
    let visits = after.key_visits - before.key_visits;
    assert!(visits < 20, "{visits} key visits in 10 degraded rounds");
    // Once the rounds are consistent again, every key is allotted room: admitted at once.
    sim.skew[2] = 0;
    sim.advance(SECOND);
    assert!(sim.node(0).stats().consistent_rounds > after.consistent_rounds);
    for key in 0..keys {
        assert!(
            sim.check(key % 2, "w", &format!("k{key}"), 1).allowed(),
            "k{key}"
        );
    }
}

/// A full frame repeats every key its sender holds. A report that says what the receiver
/// already holds lists no key there, so the instant after a full frame visits only the keys
/// that changed, not every key (the boundary that sends one visits every key of its own).
#[test]
fn a_full_frame_that_changes_nothing_costs_its_receivers_no_visits() {
    let rules = vec![("w".to_owned(), vec![fixed(1000, 3600 * SECOND)])];
    let mut sim = Sim::new(3, rules, Params::default(), 9);
    sim.advance(2 * SECOND);
    let keys = 600;
    for key in 0..keys {
        // A window's first check on a new key may wait for a starter: no matter.
        sim.check(key % 3, "w", &format!("k{key}"), 1);
        sim.advance(MS);
    }
    sim.advance(2 * SECOND);
    // Every node sends a full frame at its next boundary (as if a peer had asked), then
    // across that round's instant.
    sim.advance(DEFAULT_ROUND - sim.now % DEFAULT_ROUND - 10 * MS);
    for i in 0..3 {
        sim.node(i).ask_full();
    }
    let before: Vec<u64> = (0..3).map(|i| sim.node(i).stats().key_visits).collect();
    let tracked: Vec<usize> = (0..3).map(|i| sim.node(i).rule_keys(0)).collect();
    sim.advance(90 * MS);
    for i in 0..3 {
        assert!(tracked[i] >= keys / 3, "node {i} tracks {}", tracked[i]);
        let visits = sim.node(i).stats().key_visits - before[i];
        // The full boundary visits every key; the instant, next to none.
        assert!(
            visits >= tracked[i] as u64 && visits < tracked[i] as u64 + 20,
            "node {i}: {visits} visits of {} keys",
            tracked[i]
        );
    }
}

/// The tiers of an API's users: every algorithm at 60 per second, and the hybrid of a bucket
/// of 10/s with bursts of 20 and a sliding log of 300 a minute.
fn rules_tiers() -> Vec<(String, Vec<Limit>)> {
    rules_tiers_per(SECOND)
}

/// [`rules_tiers`] with the single limits of 60 per `period` (the hybrid as it is).
fn rules_tiers_per(period: Nanos) -> Vec<(String, Vec<Limit>)> {
    let per_second = |alg| Limit::new(alg, 60, period, None).unwrap();
    vec![
        ("fixed".into(), vec![per_second(Algorithm::FixedWindow)]),
        (
            "counter".into(),
            vec![per_second(Algorithm::SlidingWindowCounter)],
        ),
        ("log".into(), vec![per_second(Algorithm::SlidingWindowLog)]),
        (
            "bucket".into(),
            vec![bucket(Algorithm::TokenBucket, 60, period, 60)],
        ),
        (
            "hybrid".into(),
            vec![
                bucket(Algorithm::TokenBucket, 10, SECOND, 20),
                Limit::new(Algorithm::SlidingWindowLog, 300, 60 * SECOND, None).unwrap(),
            ],
        ),
    ]
}

/// `users` users of every rule of `rules` send bursts of 1 to 5 checks, `bursts` a second,
/// each burst to a random node, for `dur`; every check after the first 300 ms is judged, per
/// rule. Returns the judges, and what the nodes sent.
fn quiet_users(
    rules: Vec<(String, Vec<Limit>)>,
    nodes: usize,
    seed: u64,
    users: u64,
    bursts: u64,
    dur: Nanos,
) -> (Vec<(String, Judge)>, crate::cluster::sim::Traffic) {
    let mut judges: Vec<(String, Judge)> = rules
        .iter()
        .map(|(name, _)| {
            let mut judge = Judge::new(&rules, DEFAULT_ROUND);
            // Frames take 1 ms: the instant runs by the round's second millisecond.
            judge.gap = 2 * MS;
            (name.clone(), judge)
        })
        .collect();
    let mut sim = Sim::new(nodes, rules, Params::default(), seed);
    sim.advance(300 * MS);
    let end = sim.now + dur;
    while sim.now < end {
        sim.advance(MS);
        if sim.random() % 1000 >= bursts {
            continue;
        }
        let node = sim.between(0, nodes as u64) as usize;
        let rule = sim.between(0, judges.len() as u64) as usize;
        let key = format!("user-{}", sim.between(0, users));
        for _ in 0..sim.between(1, 6) {
            let d = sim.check(node, &judges[rule].0, &key, 1);
            let now = sim.clock(node);
            let (name, judge) = &mut judges[rule];
            judge.check(name, &key, node, nodes, now, 1, &d, true);
        }
    }
    (judges, sim.traffic)
}

/// What [`quiet_users`] found, per rule: (rule, far from the limit, false denials, of which
/// in the gap), summed over `seeds`.
fn quiet_table(nodes: usize, seeds: std::ops::RangeInclusive<u64>) -> Vec<(String, u64, u64, u64)> {
    let mut table: Vec<(String, u64, u64, u64)> = Vec::new();
    for seed in seeds {
        for (i, (rule, j)) in quiet_users(rules_tiers(), nodes, seed, 200, 300, 6 * SECOND)
            .0
            .into_iter()
            .enumerate()
        {
            if table.len() <= i {
                table.push((rule, 0, 0, 0));
            }
            table[i].1 += j.must_admit;
            table[i].2 += j.false_denials;
            table[i].3 += j.in_gap;
        }
    }
    table
}

#[test]
fn quiet_users_far_from_their_limits_are_admitted_at_once() {
    // Alone, every rule is a standalone node's.
    for (rule, far, denied, _) in quiet_table(1, 1..=2) {
        assert!(far > 1_500, "{rule}: {far}");
        assert_eq!(
            denied, 0,
            "{rule}: {denied} of {far} denied far from the limit"
        );
    }
    // With peers, a log far from its limit is denied only in a round's gap: a key that
    // another node began using in the previous round, checked here before the round's frames
    // are in (design §3.3.3); a fixed window's base and a counter's carry leave none. A bucket's burst is held evenly (§3.5), so a burst at any node
    // finds its part of the tokens there: a bucket of 60 is never short, but one of 20 over
    // 3 or 5 nodes (the hybrid's) holds 4-7 tokens at each, and a node that spent them a
    // round before waits for its refill while the others still hold theirs.
    for nodes in [3, 5] {
        for (rule, far, denied, in_gap) in quiet_table(nodes, 1..=2) {
            let what =
                format!("{nodes} nodes, {rule}: {denied} of {far} denied, {in_gap} in the gap");
            match rule.as_str() {
                // A counter's key in use carries its holding into the next window (design
                // §3.3.1, carry), so its gap refuses nothing either.
                "fixed" | "counter" => assert_eq!(denied, 0, "{what}"),
                "log" => {
                    assert_eq!(denied, in_gap, "{what}");
                    assert!(denied * 50 < far, "{what}");
                }
                "bucket" => assert_eq!(denied, 0, "{what}"),
                _ => assert!(denied * 100 < far, "{what}"),
            }
        }
    }
}

/// A burst at one node costs each idle node at most one change of the room it holds (a return
/// as the escrow shrinks, or its first grant), not a return and then a grant back a round
/// later: an idle holder at its even share is granted nothing above the escrow (design
/// §3.3.1). Each change is a report to every peer. Before the rule, each idle node changed
/// its holding twice per burst.
#[test]
fn a_burst_elsewhere_costs_an_idle_holder_at_most_one_change_of_its_room() {
    for seed in 1..=3 {
        let rules = vec![("fixed".into(), vec![fixed(60, 60 * SECOND)])];
        let mut sim = Sim::new(3, rules, Params::default(), seed);
        // Into a window every node is based in, well before its end.
        sim.advance(60 * SECOND - sim.now % (60 * SECOND) + 2 * SECOND);
        for burst in 0..6 {
            let at = burst % 3;
            for _ in 0..3 {
                let d = sim.check(at, "fixed", "u", 1);
                assert!(matches!(d.verdict, Verdict::Admit { wait: 0 }), "{d:?}");
            }
            let mut last: Vec<_> = (0..3).map(|i| held(&sim, i)).collect();
            let mut changes = [0; 3];
            for _ in 0..10 {
                sim.advance(DEFAULT_ROUND);
                for (i, last) in last.iter_mut().enumerate() {
                    let now = held(&sim, i);
                    changes[i] += usize::from(now != *last);
                    *last = now;
                }
            }
            for i in (0..3).filter(|&i| i != at) {
                assert!(
                    changes[i] <= 1,
                    "seed {seed}, burst {burst} at node {at}: node {i} changed its room {} \
                     times: {:?}",
                    changes[i],
                    held(&sim, i)
                );
            }
        }
    }
}

/// A key far below its limit in a window every node is based in is left as it is: each node
/// keeps its base implicit, so the only thing a check costs the wire is its count, reported
/// by the node that admitted it. Once one node's demand outgrows its base, room moves again.
#[test]
fn a_quiet_key_in_a_based_window_publishes_no_room() {
    for seed in 1..=3 {
        let rules = vec![("fixed".into(), vec![fixed(60, 60 * SECOND)])];
        let mut sim = Sim::new(3, rules, Params::default(), seed);
        sim.advance(60 * SECOND - sim.now % (60 * SECOND) + 2 * SECOND);
        sim.watch = Some(("u".to_owned(), Vec::new()));
        for burst in 0..6 {
            let at = burst % 3;
            for _ in 0..3 {
                let d = sim.check(at, "fixed", "u", 1);
                assert!(matches!(d.verdict, Verdict::Admit { wait: 0 }), "{d:?}");
            }
            for _ in 0..5 {
                sim.advance(DEFAULT_ROUND);
                for i in 0..3 {
                    assert!(
                        held(&sim, i).is_empty(),
                        "seed {seed}, burst {burst}: node {i}"
                    );
                }
            }
            let (_, seen) = sim.watch.as_mut().unwrap();
            assert!(
                seen.iter().all(|&(from, _)| from == at),
                "seed {seed}, burst {burst} at node {at}: reported by {seen:?}"
            );
            seen.clear();
        }
        // Node 0 takes more than its base in a round: its demand now needs room moved.
        for _ in 0..30 {
            sim.check(0, "fixed", "u", 1);
        }
        sim.advance(3 * DEFAULT_ROUND);
        assert!(
            !held(&sim, 0).is_empty(),
            "seed {seed}: no room moved to node 0"
        );
    }
}

/// Anti-entropy follows the view: a digest every `full_every` rounds while the view settles
/// after a change, and one every [`DIGEST_EVERY_SETTLED`] rounds once it has held for
/// [`DIGESTS_AFTER_CHANGE`] (the round frames carry every live member's counts). A restart
/// brings the digests back, and with them the repairs.
#[test]
fn digests_go_out_while_the_view_settles_and_rarely_after() {
    let rules = vec![("fixed".into(), vec![fixed(1000, 3600 * SECOND)])];
    let mut sim = Sim::new(3, rules, Params::default(), 1);
    sim.advance(300 * MS);
    for i in 0..300 {
        sim.check(i % 3, "fixed", &format!("k{i}"), 1);
    }
    sim.advance(DIGESTS_AFTER_CHANGE * DEFAULT_ROUND + 2 * SECOND);
    let before = sim.traffic;
    sim.advance(10 * SECOND);
    let settled = sim.traffic.since(before).other;
    sim.crash(2);
    sim.advance(SECOND);
    sim.restart(2);
    let before = sim.traffic;
    sim.advance(10 * SECOND);
    let settling = sim.traffic.since(before).other;
    assert!(
        settling > 0 && settled * 5 <= settling,
        "anti-entropy bytes in 10 s: {settled} in a settled view, {settling} after a restart"
    );
}

/// What quiet users cost the network: key reports and bytes sent, with the false denials,
/// for 3 nodes and 2,000 users over 10 s, with the tiers per second and per minute
/// (`cargo test --release --lib quiet_users_traffic -- --ignored --nocapture`).
#[test]
#[ignore = "a measurement: prints what quiet users cost the network"]
fn quiet_users_traffic() {
    for (per, period) in [("second", SECOND), ("minute", 60 * SECOND)] {
        for seed in 1..=3 {
            let rules = rules_tiers_per(period);
            let (judges, t) = quiet_users(rules, 3, seed, 2_000, 300, 10 * SECOND);
            let denied: u64 = judges.iter().map(|(_, j)| j.false_denials).sum();
            let far: u64 = judges.iter().map(|(_, j)| j.must_admit).sum();
            println!(
                "per {per}, seed {seed}: {} key reports ({} with counts) in {} frames, {} B of \
                 frames, {} B other; {denied} of {far} checks far from the limit denied",
                t.key_reports,
                t.counted_reports,
                t.round_frames,
                t.frames + t.empty_frames,
                t.other
            );
        }
    }
}

/// What each tier alone costs the network under quiet users: key reports a check, 3 nodes,
/// 400 users of one rule per minute over 10 s (`cargo test --release --lib
/// quiet_users_traffic_per_rule -- --ignored --nocapture`).
#[test]
#[ignore = "a measurement: prints what quiet users of each rule cost the network"]
fn quiet_users_traffic_per_rule() {
    for rule in rules_tiers_per(60 * SECOND) {
        let name = rule.0.clone();
        let (judges, t) = quiet_users(vec![rule], 3, 1, 400, 60, 10 * SECOND);
        let checks: u64 = judges.iter().map(|(_, j)| j.must_admit).sum();
        println!(
            "{name}: {} key reports ({} with counts) for {checks} checks: {:.1} a check",
            t.key_reports,
            t.counted_reports,
            t.key_reports as f64 / checks.max(1) as f64
        );
    }
}

/// The table of design §3.3.3: `cargo test --release --lib quiet_users_table -- --ignored
/// --nocapture`.
#[test]
#[ignore = "a measurement: prints the false denials of quiet users per rule"]
fn quiet_users_table() {
    for nodes in [1, 3, 5] {
        for (rule, far, denied, in_gap) in quiet_table(nodes, 1..=3) {
            println!(
                "| {nodes} | {rule} | {far} | {denied} ({:.2}%) | {in_gap} |",
                100.0 * denied as f64 / far.max(1) as f64
            );
        }
    }
}

/// Admitted over 8 full windows of a hot key at three times its limit, as a part of the
/// ideal (the limit per window), per node count and load split.
fn at_the_limit(nodes: usize, per_mille: &[u64], seed: u64) -> f64 {
    at_a_limit_of(100, nodes, per_mille, seed)
}

/// [`at_the_limit`] for a fixed window of `limit` a second.
fn at_a_limit_of(limit: u64, nodes: usize, per_mille: &[u64], seed: u64) -> f64 {
    let rules = vec![("api".into(), vec![fixed(limit, SECOND)])];
    let mut sim = Sim::new(nodes, rules, Params::default(), seed);
    sim.advance(300 * MS);
    sim.load("api", "hot", per_mille, 10 * SECOND);
    let windows = sim.per_window();
    assert!(windows.values().all(|&n| n <= limit), "{windows:?}");
    let full: u64 = windows.values().skip(1).take(8).sum();
    full as f64 / (8 * limit) as f64
}

/// A thin limit over many nodes, at twice the limit, each node's checks random: 20 nodes
/// sharing 20/s and 30 sharing 30/s, two checks a second at each node, seeds 1–3. A node
/// then gets a check in one round of five, so a unit is best held one to a node, not piled
/// where the last check came (design §3.3.3, "Thin limits"). Demand-weighted units admitted
/// 51–66% of the limit; spread a unit a node, with targets above the escrow capped at a
/// round of demand, 80–89%.
#[test]
fn a_thin_limit_over_many_nodes_is_spread_a_unit_a_node() {
    for (limit, nodes) in [(20u64, 20usize), (30, 30)] {
        for seed in 1..=3 {
            let share = at_a_limit_of(limit, nodes, &vec![2 * limit / nodes as u64; nodes], seed);
            assert!(
                share >= 0.78,
                "{nodes} nodes sharing {limit}/s, seed {seed}: {:.1}%",
                100.0 * share
            );
        }
    }
}

#[test]
fn a_hot_key_at_three_times_its_limit_gets_nearly_all_of_it() {
    for seed in 1..=3 {
        for (nodes, load) in [
            (3, vec![100, 100, 100]),
            (3, vec![240, 30, 30]),
            (5, vec![60, 60, 60, 60, 60]),
            (5, vec![240, 15, 15, 15, 15]),
        ] {
            let share = at_the_limit(nodes, &load, seed);
            assert!(
                share >= 0.98,
                "seed {seed}, {load:?}: {:.1}%",
                100.0 * share
            );
        }
    }
}

#[test]
#[ignore = "a measurement: 100 nodes sharing 100/s"]
fn hundred_nodes_share_a_limit() {
    for seed in 1..=2 {
        let share = at_the_limit(100, &[2; 100], seed);
        println!(
            "100 nodes, 2x load, seed {seed}: {:.1}% of the limit",
            100.0 * share
        );
    }
}

/// A base is the era the slot falls in, never more than a later era's: when the participants
/// grow (a cluster of one is joined), the first node's base of the whole limit shrinks in the
/// slots already open, so the newcomers can be granted room there; when they shrink, an open
/// slot's base stays as it was.
#[test]
fn a_base_shrinks_in_open_slots_when_the_participants_grow() {
    // C = 100, C' = 95: one participant 95, three 31, two 47.
    let grew = [(10, 1), (20, 3)];
    assert_eq!(base_of(&grew, 100, 5), 0, "before the first era");
    assert_eq!(base_of(&grew, 100, 15), 31);
    assert_eq!(base_of(&grew, 100, 25), 31);
    let shrank = [(10, 3), (20, 2)];
    assert_eq!(base_of(&shrank, 100, 15), 31);
    assert_eq!(base_of(&shrank, 100, 25), 47);
}

/// Starters beside bases never take a window over: a node restarted at a random moment of a
/// window, into a cluster whose others are based there, opens starters on keys idle
/// everywhere while its old incarnation's keys stay charged; then every key, old and new,
/// is checked flat out at every node. 3 and 5 nodes, 40 seeds each.
#[test]
fn starters_beside_bases_keep_every_window_within_the_limit() {
    let mut opened = 0;
    for nodes in [3usize, 5] {
        for seed in 1..=40u64 {
            let mut sim = Sim::new(nodes, rules_fixed(), Params::default(), seed);
            sim.advance(2 * SECOND - sim.now % SECOND + (seed * 37 % 500) * MS);
            // Steady before the crash: its retirement charges twice its last published demand
            // a round (design §5); a burst that more than doubles within its last round is
            // not covered.
            let mut old_load = vec![0; nodes];
            old_load[nodes - 1] = 40;
            sim.load("api", "old", &old_load, 400 * MS);
            if std::env::var("DBG").is_ok() {
                eprintln!("crash at {}", sim.now / MS);
            }
            sim.crash(nodes - 1);
            sim.advance((20 + seed * 13 % 180) * MS);
            if std::env::var("DBG").is_ok() {
                eprintln!("restart at {}", sim.now / MS);
            }
            sim.restart(nodes - 1);
            sim.advance((300 + seed * 29 % 400) * MS);
            // The restarted node's first check of a key idle everywhere: a starter.
            opened += u32::from(sim.check(nodes - 1, "api", "new", 1).allowed());
            let mut spot = vec![0; nodes];
            spot[nodes - 1] = 900;
            spot[0] = 300;
            sim.load("api", "new", &spot, 200 * MS);
            sim.load("api", "old", &vec![900; nodes], 1500 * MS);
            sim.load("api", "new", &vec![900; nodes], 1500 * MS);
            for key in ["old", "new"] {
                for (w, n) in sim.key_windows(key) {
                    assert!(
                        n <= 100,
                        "{nodes} nodes, seed {seed}, {key} window {w}: {n}"
                    );
                }
            }
        }
    }
    assert!(
        opened >= 60,
        "{opened} of 80 restarted nodes opened a starter"
    );
}

/// Runs `dur` of load on `key` under every rule of `rules` at once, as [`Sim::load`] does for
/// one, and records each admission (when, by the admitting node's clock) per rule.
fn load_logged(
    sim: &mut Sim,
    rules: &[&str],
    key: &str,
    per_mille: &[u64],
    dur: Nanos,
    logs: &mut [Vec<Nanos>],
) {
    let end = sim.now + dur;
    while sim.now < end {
        sim.advance(MS);
        for (i, &p) in per_mille.iter().enumerate() {
            for (r, rule) in rules.iter().enumerate() {
                if sim.running(i) && sim.random() % 1000 < p {
                    let at = sim.clock(i);
                    if sim.check(i, rule, key, 1).allowed() {
                        logs[r].push(at);
                    }
                }
            }
        }
    }
}

/// Loads `key` under `rule` flat out at every node of `sim` for 2 s after the admissions in
/// `log`, and asserts that the exact sliding budget of `limit` (of 100) never went over at
/// any of them; returns the admissions in all.
fn flat_out_within(
    sim: &mut Sim,
    rule: &str,
    limit: &Limit,
    key: &str,
    log: Vec<Nanos>,
    what: &str,
) -> usize {
    let mut logs = vec![log];
    let load = vec![1000; sim.nodes.len()];
    load_logged(sim, &[rule], key, &load, 2 * SECOND, &mut logs);
    let worst = worst_sliding(limit, &logs[0]);
    assert!(worst <= 100.0 + 1e-9, "{what}: a budget of {worst:.2}");
    logs[0].len()
}

/// The most a sliding limit's exact budget read at any admission: for a log, what was
/// admitted in the period ending there; for a counter, the previous window's count weighted
/// by what is left of it, plus the current window's (§3.4).
fn worst_sliding(l: &Limit, log: &[Nanos]) -> f64 {
    let w = l.period();
    let mut worst: f64 = 0.0;
    for &t in log {
        let count = |keep: &dyn Fn(Nanos) -> bool| -> f64 {
            log.iter().filter(|&&a| a <= t && keep(a)).count() as f64
        };
        let used = match l.algorithm() {
            Algorithm::SlidingWindowLog => count(&|a| a + w > t),
            _ => {
                let s = t / w;
                let elapsed = (t - s * w) as f64 / w as f64;
                count(&|a| a / w + 1 == s) * (1.0 - elapsed) + count(&|a| a / w == s)
            }
        };
        worst = worst.max(used);
    }
    worst
}

/// Asserts that no admission in `logs` (one per limit) read an exact budget over the limit of
/// 100; `what` names the run in the message.
fn assert_sliding_within(names: &[&str], limits: &[Limit], logs: &[Vec<Nanos>], what: &str) {
    for (r, l) in limits.iter().enumerate() {
        let worst = worst_sliding(l, &logs[r]);
        assert!(
            worst <= 100.0 + 1e-9,
            "{what}, {}: a budget of {worst:.2}",
            names[r]
        );
    }
}

/// The sliding rules of the tests below: a log whose sub-slot is a round, one whose sub-slot
/// is ten, and a sliding counter, each 100 per period.
type Rules = Vec<(String, Vec<Limit>)>;

fn rules_sliding() -> (Vec<&'static str>, Vec<Limit>, Rules) {
    let names = vec!["log", "long", "counter"];
    let limits = vec![
        Limit::new(Algorithm::SlidingWindowLog, 100, 1600 * MS, None).unwrap(),
        Limit::new(Algorithm::SlidingWindowLog, 100, 16 * SECOND, None).unwrap(),
        Limit::new(Algorithm::SlidingWindowCounter, 100, SECOND, None).unwrap(),
    ];
    let rules = one_limit_each(&names, &limits);
    (names, limits, rules)
}

/// A rule per name, of the limit beside it.
fn one_limit_each(names: &[&str], limits: &[Limit]) -> Rules {
    names
        .iter()
        .zip(limits)
        .map(|(n, l)| ((*n).to_string(), vec![*l]))
        .collect()
}

/// A sliding budget never goes over, whoever spent the earlier slots it reads. A hot key at
/// 9× its limit, 80% of it at one node: that node holds most of each slot by demand, and the
/// next slot's budget still counts what it spent. Bases there (design §3.3.1) took the
/// counter to 115 of 100 on 5 nodes: each node's base was a claim on a budget the busy
/// node's counts had already spent. Then a node is killed and the others go on.
#[test]
fn a_sliding_budget_holds_under_skewed_load_and_a_crash() {
    let (names, limits, rules) = rules_sliding();
    for nodes in [3usize, 5] {
        for seed in 1..=10u64 {
            let mut sim = Sim::new(nodes, rules.clone(), Params::default(), seed);
            sim.advance(300 * MS);
            let mut logs = vec![Vec::new(); names.len()];
            let mut load = vec![100; nodes];
            load[0] = 900;
            load_logged(&mut sim, &names, "hot", &load, 3 * SECOND, &mut logs);
            sim.crash(nodes - 1);
            load[nodes - 1] = 0;
            load_logged(&mut sim, &names, "hot", &load, 3 * SECOND, &mut logs);
            assert_sliding_within(
                &names,
                &limits,
                &logs,
                &format!("{nodes} nodes, seed {seed}"),
            );
            for (r, log) in logs.iter().enumerate() {
                assert!(log.len() >= 100, "{}: {}", names[r], log.len());
            }
        }
    }
}

/// A node restarted into a busy cluster opens starters on sliding keys idle everywhere (the
/// log's earlier sub-slots and the counter's previous window included), and no budget goes
/// over: after the restart, every key, old and new, flat out everywhere. 3 and 5 nodes, 30
/// seeds each.
#[test]
fn a_restarted_node_opens_starters_on_sliding_keys_within_the_limit() {
    let (names, limits, rules) = rules_sliding();
    let mut opened = vec![0u32; names.len()];
    let mut runs = 0;
    for nodes in [3usize, 5] {
        for seed in 1..=30u64 {
            runs += 1;
            let mut sim = Sim::new(nodes, rules.clone(), Params::default(), seed);
            sim.advance(2 * SECOND - sim.now % SECOND + (seed * 37 % 500) * MS);
            let mut old = vec![Vec::new(); names.len()];
            let mut new = vec![Vec::new(); names.len()];
            // Steady use of "old" at the node that then crashes (its retirement charges twice
            // its last published demand a round, design §5), and a little elsewhere.
            let mut old_load = vec![0; nodes];
            old_load[nodes - 1] = 30;
            old_load[0] = 5;
            load_logged(&mut sim, &names, "old", &old_load, 400 * MS, &mut old);
            sim.crash(nodes - 1);
            sim.advance((20 + seed * 13 % 180) * MS);
            sim.restart(nodes - 1);
            sim.advance((300 + seed * 29 % 400) * MS);
            // The restarted node's first check of a key idle everywhere: a starter.
            for (r, name) in names.iter().enumerate() {
                let at = sim.clock(nodes - 1);
                if sim.check(nodes - 1, name, "new", 1).allowed() {
                    opened[r] += 1;
                    new[r].push(at);
                }
            }
            let mut spot = vec![0; nodes];
            spot[nodes - 1] = 900;
            spot[0] = 300;
            load_logged(&mut sim, &names, "new", &spot, 200 * MS, &mut new);
            for _ in 0..5 {
                load_logged(
                    &mut sim,
                    &names,
                    "old",
                    &vec![900; nodes],
                    150 * MS,
                    &mut old,
                );
                load_logged(
                    &mut sim,
                    &names,
                    "new",
                    &vec![900; nodes],
                    150 * MS,
                    &mut new,
                );
            }
            for (key, logs) in [("old", &old), ("new", &new)] {
                assert_sliding_within(
                    &names,
                    &limits,
                    logs,
                    &format!("{nodes} nodes, seed {seed}, {key}"),
                );
            }
        }
    }
    for (r, name) in names.iter().enumerate() {
        assert!(
            opened[r] * 4 >= runs * 3,
            "{name}: {} of {runs} restarted nodes opened a starter",
            opened[r]
        );
    }
}

/// An instant runs as soon as every frame of its round is in, often a millisecond after the
/// boundary rather than δ after it. A check denied between that instant and δ waits for the
/// next round's instant, and its `retry_after` says so: it said "δ less the time since the
/// boundary", so a check held for that lease (`Engine::lease_pause`) was let go and denied
/// just before the room it waited for came (new keys at a node unbased in a sliding log's
/// sub-slot, on real nodes).
#[test]
fn a_denial_after_an_early_instant_waits_for_the_next_one() {
    for seed in 1..=3 {
        let mut sim = Sim::new(3, rules_fixed(), Params::default(), seed);
        sim.advance(2 * SECOND - sim.now % SECOND + 100 * MS);
        // Node 0 spends much of the window: node 2 holds its part of what is left.
        sim.load("api", "hot", &[900, 0, 0], 60 * MS);
        // 5 ms after a boundary: the round's frames are in (1 ms each), so its instant ran.
        let round = DEFAULT_ROUND;
        sim.advance(round - sim.clock(2) % round + 5 * MS);
        let denied = (0..100).find_map(|_| match sim.check(2, "api", "hot", 1) {
            d if d.allowed() => None,
            d => Some(d),
        });
        let d = denied.expect("node 2 spends what it holds");
        let Verdict::Deny { retry_after } = d.verdict else {
            panic!("seed {seed}: {d:?}");
        };
        assert!(
            d.remaining >= 1,
            "seed {seed}: room left in the cluster: {d:?}"
        );
        assert!(
            retry_after >= round - 5 * MS,
            "seed {seed}: retry_after {retry_after} ns, before the next round's instant"
        );
        // Waiting that long brings more room.
        sim.advance(retry_after);
        let d = sim.check(2, "api", "hot", 1);
        assert!(d.allowed(), "seed {seed}: {d:?}");
    }
}

/// A hot key at three times its limit on the sliding algorithms, admitted per second (design
/// §3.3.3): `cargo test --release --lib sliding_hot_keys_table -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement: prints what a hot sliding key is admitted"]
fn sliding_hot_keys_table() {
    let (names, _, rules) = rules_sliding();
    for (nodes, load) in [
        (3, vec![100, 100, 100]),
        (3, vec![240, 30, 30]),
        (5, vec![60; 5]),
    ] {
        for r in [0usize, 2] {
            let mut admitted = 0;
            for seed in 1..=3u64 {
                let mut sim = Sim::new(nodes, rules.clone(), Params::default(), seed);
                sim.advance(300 * MS);
                let mut logs = vec![Vec::new()];
                load_logged(&mut sim, &[names[r]], "hot", &load, 10 * SECOND, &mut logs);
                admitted += logs[0].len();
            }
            println!(
                "{nodes} nodes, load {load:?} per mille, {}: {:.1} per second",
                names[r],
                admitted as f64 / 30.0
            );
        }
    }
}

/// Starters charged across slots: a sliding key first counted at one node in the last
/// millisecond of a slot, and taken by another node's starter in the first millisecond of the
/// next (before the instant: it does not know the key is used), then spent flat out by every
/// node. The instant's frames show the count in the earlier slot; the starters were charged
/// only where every count was in the current slot, so both ended uncharged and the one spent
/// in the new slot was counted by nobody: 101 of 100 on every seed. Each open node is now
/// charged its starter less its whole use of the budget.
#[test]
fn a_starter_spent_in_the_slot_after_the_keys_first_count_is_charged() {
    let (names, limits, rules) = rules_sliding();
    for r in [0usize, 2] {
        let slot = if r == 0 { DEFAULT_ROUND } else { SECOND };
        for nodes in [3usize, 5] {
            for seed in 1..=10u64 {
                let mut sim = Sim::new(nodes, rules.clone(), Params::default(), seed);
                sim.advance(2 * SECOND - sim.now % SECOND);
                let mut logs = vec![Vec::new()];
                sim.advance(slot - sim.clock(nodes - 1) % slot - MS);
                for (i, wait) in [(nodes - 1, 2 * MS), (0, 10 * MS)] {
                    let at = sim.clock(i);
                    if sim.check(i, names[r], "k", 1).allowed() {
                        logs[0].push(at);
                    }
                    sim.advance(wait);
                }
                let what = format!("{nodes} nodes, seed {seed}, {}", names[r]);
                let [log] = logs.try_into().expect("one log");
                let admitted = flat_out_within(&mut sim, names[r], &limits[r], "k", log, &what);
                assert!(admitted >= 100, "{what}: {admitted}");
            }
        }
    }
}

/// A burst that straddles a slot's edge is admitted at once (design §3.3.1, "Starters across
/// a slot's edge"). A key's first checks take a starter just before a sliding slot ends; the
/// rest of its burst comes at the edge, before the node's boundary has run (a check racing
/// the round's timer) and in the gap after it, before the instant. The starter runs on into
/// the new slot until that instant: without it, the budget of the new slot reads the
/// starter's own counts, the key looks used, and the checks were held for the instant (a
/// quiet user's check held 15-30 ms on real nodes). Another node takes its own starter in
/// the gap too; then every node flat out, and no budget goes over.
#[test]
fn a_burst_across_a_slots_edge_runs_on_its_starter() {
    let (names, limits, rules) = rules_sliding();
    let slots = [100 * MS, SECOND, SECOND];
    for nodes in [3usize, 5] {
        for seed in 1..=3u64 {
            let mut sim = Sim::new(nodes, rules.clone(), Params::default(), seed);
            sim.advance(2 * SECOND - sim.now % SECOND + 300 * MS);
            // (rule, key, admissions), with and without a check racing the boundary.
            let mut runs = Vec::new();
            for (r, rule) in names.iter().enumerate() {
                for race in [true, false] {
                    let key = format!("edge-{r}-{race}");
                    let what = format!("{nodes} nodes, seed {seed}, {rule}, race {race}");
                    let ri = sim.node(0).rule_index(rule).expect("a global rule");
                    let mut log = Vec::new();
                    let mut edge = (sim.now / slots[r] + 1) * slots[r];
                    if edge - sim.now < 50 * MS {
                        edge += slots[r];
                    }
                    sim.advance(edge - 20 * MS - sim.now);
                    for c in 0..2 {
                        let at = sim.clock(0);
                        let d = sim.check(0, rule, &key, 1);
                        assert!(d.allowed(), "{what}: check {c} before the edge: {d:?}");
                        log.push(at);
                    }
                    sim.advance(19 * MS);
                    if race {
                        // At the edge, the node's timer not yet run.
                        let at = sim.clock(0) + MS;
                        assert_eq!(at, edge);
                        let (_, d) = sim.node(0).check(ri, &key, 1, 0, at).expect("room");
                        assert!(
                            d.allowed(),
                            "{what}: at the edge, before the boundary: {d:?}"
                        );
                        log.push(at);
                    }
                    // In the gap: the boundary has run, the instant has not (frames take 1 ms).
                    sim.advance(MS);
                    for (i, c) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                        let at = sim.clock(i);
                        let d = sim.check(i, rule, &key, 1);
                        assert!(d.allowed(), "{what}: node {i} check {c} in the gap: {d:?}");
                        log.push(at);
                    }
                    let phase = sim.node(0).phase();
                    assert!(
                        !phase.open && phase.round + 1 == edge / DEFAULT_ROUND,
                        "{what}: not in the gap after the edge: {phase:?}"
                    );
                    runs.push((r, key, log));
                }
            }
            for (r, key, log) in runs {
                let what = format!("{nodes} nodes, seed {seed}, {key}");
                let admitted = flat_out_within(&mut sim, names[r], &limits[r], &key, log, &what);
                assert!(admitted >= 100, "{what}: {admitted}");
            }
        }
    }
}

/// A key in use at a node holds room in a sliding slot; at the slot's edge the node's
/// boundary carries what it did not spend into the new slot (design §3.3.1, carry). A check
/// that comes at the edge before the boundary has visited the key (the round's timer late,
/// or the boundary still busy with other keys: at a log's sub-slot edge every key in use
/// moves, tens of ms on a busy node) carries it the same way and is admitted. Without it the
/// check found no room in the new slot, the key's own counts kept it from a starter, and it
/// was held for the instant (seen on real nodes at every sub-slot edge of a busy run). Then
/// the boundary runs (nothing carried twice) and every node flat out: within the budget.
#[test]
fn a_check_at_a_slots_edge_before_the_boundary_carries_the_keys_room() {
    let (names, limits, rules) = rules_sliding();
    let slots = [100 * MS, SECOND, SECOND];
    for nodes in [3usize, 5] {
        for seed in 1..=3u64 {
            let mut sim = Sim::new(nodes, rules.clone(), Params::default(), seed);
            sim.advance(2 * SECOND - sim.now % SECOND + 300 * MS);
            for (r, rule) in names.iter().enumerate() {
                let what = format!("{nodes} nodes, seed {seed}, {rule}");
                let key = format!("busy-{r}");
                let ri = sim.node(0).rule_index(rule).expect("a global rule");
                let mut log = vec![Vec::new()];
                // In use at node 0 for a few rounds, well below the limit: its room now
                // comes from instants' grants, not a starter.
                let mut edge = (sim.now / slots[r] + 1) * slots[r];
                if edge - sim.now < 350 * MS {
                    edge += slots[r];
                }
                while sim.now + 60 * MS < edge {
                    let at = sim.clock(0);
                    if sim.check(0, rule, &key, 1).allowed() {
                        log[0].push(at);
                    }
                    sim.advance(60 * MS);
                }
                sim.advance(edge - MS - sim.now);
                let before = edge / slots[r] - 1;
                let holds = |sim: &Sim| {
                    sim.node(0).rules[ri]
                        .store
                        .read(&key, |k| match k.map(|k| &k.limits[0]) {
                            Some(LState::Window(w)) => w
                                .grants
                                .iter()
                                .map(|g| (g.slot, g.starter, g.spendable()))
                                .collect::<Vec<_>>(),
                            _ => Vec::new(),
                        })
                };
                let held = holds(&sim);
                // (A counter's next window is pre-leased room of its own, as the previous
                // window's weight falls: it needs no carry, and is checked all the same.)
                assert!(
                    *rule == "counter"
                        || held
                            .iter()
                            .any(|&(x, starter, left)| x == before && !starter && left > 0),
                    "{what}: no room held before the edge: {held:?}"
                );
                // At the edge, the node's timer not yet run.
                let at = sim.clock(0) + MS;
                assert_eq!(at, edge);
                let (_, d) = sim.node(0).check(ri, &key, 1, 0, at).expect("room");
                assert!(
                    d.allowed(),
                    "{what}: at the edge, before the boundary: {d:?}, holding {held:?}"
                );
                log[0].push(at);
                sim.advance(MS);
                let after = holds(&sim);
                let now_held: u64 = after
                    .iter()
                    .filter(|&&(x, _, _)| x == before + 1)
                    .map(|&(_, _, left)| left)
                    .sum();
                let was: u64 = held
                    .iter()
                    .filter(|&&(x, _, _)| x == before || x == before + 1)
                    .map(|&(_, _, left)| left)
                    .sum();
                assert!(
                    now_held < was,
                    "{what}: carried twice? before the edge {held:?}, after {after:?}"
                );
                let [log] = log.try_into().expect("one log");
                flat_out_within(&mut sim, rule, &limits[r], &key, log, &what);
            }
        }
    }
}

/// The sliding budgets under the faults the seeded sweep draws for fixed windows (which it
/// judges; it does not judge sliding ones): a hot key 80% at one node, then 10% loss with
/// jitter, a node that hears nothing, a partition, a paused node, each for a second or so,
/// then healed. Under `hold`, a log never admits more than its limit in any period, and a
/// sliding counter never more than its limit in an aligned window (the guarantees of design
/// §3.4).
#[test]
fn sliding_budgets_hold_through_loss_cuts_and_pauses() {
    let (names, limits, rules) = rules_sliding();
    for nodes in [3usize, 5] {
        for seed in 1..=8u64 {
            let mut sim = Sim::new(nodes, rules.clone(), Params::default(), seed);
            sim.advance(300 * MS);
            let mut logs = vec![Vec::new(); names.len()];
            let mut load = vec![150; nodes];
            load[0] = 900;
            load_logged(&mut sim, &names, "hot", &load, 1500 * MS, &mut logs);
            sim.net.loss = 100;
            sim.net.jitter = 30 * MS;
            load_logged(&mut sim, &names, "hot", &load, 1200 * MS, &mut logs);
            sim.net.loss = 0;
            sim.net.jitter = 0;
            // Node 1 hears nothing.
            for b in 0..nodes {
                if b != 1 {
                    sim.net.cut.insert((b, 1));
                }
            }
            load_logged(&mut sim, &names, "hot", &load, 1200 * MS, &mut logs);
            sim.net.cut.clear();
            load_logged(&mut sim, &names, "hot", &load, 600 * MS, &mut logs);
            sim.partition(&[nodes - 1]);
            load_logged(&mut sim, &names, "hot", &load, 1500 * MS, &mut logs);
            sim.net.cut.clear();
            load_logged(&mut sim, &names, "hot", &load, 600 * MS, &mut logs);
            sim.pause(0, 400 * MS);
            load_logged(&mut sim, &names, "hot", &load, 1500 * MS, &mut logs);
            for (r, l) in limits.iter().enumerate() {
                let (worst, what) = match l.algorithm() {
                    Algorithm::SlidingWindowLog => (worst_sliding(l, &logs[r]), "a period"),
                    _ => {
                        let mut windows: BTreeMap<u64, u64> = BTreeMap::new();
                        for t in &logs[r] {
                            *windows.entry(t / l.period()).or_default() += 1;
                        }
                        let most = windows.values().copied().max().unwrap_or(0);
                        (most as f64, "an aligned window")
                    }
                };
                assert!(
                    worst <= 100.0 + 1e-9,
                    "{nodes} nodes, seed {seed}, {}: {worst:.2} in {what}",
                    names[r]
                );
            }
        }
    }
}

/// A sliding key new at a node right after an instant degraded only by a late frame (a peer's
/// frame lost, nobody suspected, the view unchanged): the node's frame of that round said it
/// may hold starters, so it keeps them open until its next boundary, and a user's first burst
/// is admitted at once (design §3.3.1, "Starters across a late frame"). Before, it was denied
/// until the next consistent instant. Then flat out everywhere, within the budget.
#[test]
fn after_a_late_frame_a_new_sliding_key_is_admitted_at_once() {
    let (names, limits, rules) = rules_sliding();
    for seed in 1..=3 {
        let mut sim = Sim::new(3, rules.clone(), Params::default(), seed);
        sim.advance(2 * SECOND - sim.now % SECOND + 200 * MS);
        sim.net.cut.insert((2, 0));
        let to_boundary = DEFAULT_ROUND - sim.now % DEFAULT_ROUND;
        sim.advance(to_boundary + DEFAULT_ROUND / 2 + 5 * MS);
        sim.net.cut.clear();
        let g = sim.nodes[0].as_ref().unwrap();
        assert!(g.suspected().is_empty(), "seed {seed}");
        assert_eq!(g.stats().kept_rounds, 1, "seed {seed}: {:?}", g.stats());
        let mut logs = vec![Vec::new(); names.len()];
        for (r, rule) in names.iter().enumerate() {
            for c in 0..5 {
                let at = sim.clock(0);
                let d = sim.check(0, rule, "late", 1);
                assert!(d.allowed(), "seed {seed} {rule} check {c}: {d:?}");
                logs[r].push(at);
            }
        }
        load_logged(&mut sim, &names, "late", &[900; 3], 2 * SECOND, &mut logs);
        assert_sliding_within(&names, &limits, &logs, &format!("seed {seed}"));
    }
}

/// A key new at a node in the gap after a degraded instant (its first check held there,
/// since no starter is open) is admitted by a starter at the next consistent instant, for
/// the hybrid (a bucket beside a sliding log) as for a log alone. The instant visits the key
/// (it was checked) and finds its log idle, since the held check's demand goes out only at
/// the next boundary. It marked the hybrid's key in use all the same, for its bucket, which
/// shut the log's starter: the held check was refused, and the key waited a round more (seen
/// on real nodes after a late frame: hybrid checks refused with the log's room all there).
/// Then the key flat out at every node, within the log's budget.
#[test]
fn a_hybrid_key_held_in_a_degraded_gap_starts_at_the_next_instant() {
    let rules = rules_tiers();
    let names = ["log", "hybrid"];
    for nodes in [3usize, 5] {
        for seed in 1..=3u64 {
            let what = format!("{nodes} nodes, seed {seed}");
            let mut sim = Sim::new(nodes, rules.clone(), Params::default(), seed);
            sim.advance(2 * SECOND - sim.now % SECOND + 250 * MS);
            // Node 0 misses node 1's frames for two rounds: its instants there are degraded,
            // and the second is not kept (starters stay open only right after a consistent
            // instant).
            sim.net.cut.insert((1, 0));
            let to_boundary = DEFAULT_ROUND - sim.now % DEFAULT_ROUND;
            sim.advance(to_boundary + DEFAULT_ROUND + DEFAULT_ROUND / 2 + 5 * MS);
            sim.net.cut.clear();
            let p = sim.node(0).phase();
            assert!(!p.consistent && !p.kept, "{what}: {p:?}");
            // In the gap after the next boundary: held (refused, told to wait for the
            // instant a few ms away).
            let to_boundary = DEFAULT_ROUND - sim.now % DEFAULT_ROUND;
            sim.advance(to_boundary);
            let p = sim.node(0).phase();
            assert!(!p.open && !p.consistent, "{what}: not in the gap: {p:?}");
            for rule in names {
                let d = sim.check(0, rule, "new", 1);
                assert!(!d.allowed(), "{what}, {rule}: admitted in the gap: {d:?}");
            }
            // The instant, consistent: the held checks are admitted.
            sim.advance(5 * MS);
            let p = sim.node(0).phase();
            assert!(
                p.open && p.consistent,
                "{what}: not after a consistent instant: {p:?}"
            );
            let mut logs = vec![Vec::new(); names.len()];
            for (r, rule) in names.iter().enumerate() {
                let at = sim.clock(0);
                let d = sim.check(0, rule, "new", 1);
                assert!(d.allowed(), "{what}, {rule}: after the instant: {d:?}");
                logs[r].push(at);
            }
            let mut load = vec![1000; nodes];
            load[nodes - 1] = 500;
            load_logged(&mut sim, &names, "new", &load, 1500 * MS, &mut logs);
            let limits: Vec<Limit> = names
                .iter()
                .map(|n| {
                    let (_, ls) = rules.iter().find(|(name, _)| name == n).unwrap();
                    *ls.last().unwrap()
                })
                .collect();
            assert_sliding_within(&names, &limits, &logs, &what);
        }
    }
}

/// A member that leaves on purpose (a rolling update) changes the view, and the instants
/// until every node has heard of it are degraded. A node whose view differs from the last
/// consistent one by the leaver alone keeps its starters open as for a late frame (design
/// §3.3.1, "Starters across a late frame"): the participants only shrank, so each starter,
/// sized by its holder's count of them, still fits. Node 0 hears gossip with the round's
/// boundary, the others a millisecond later, after theirs (without this, a sliding key new at node 0 in
/// those instants was held for the next consistent one). Every survivor checks new keys
/// through the leave, each admitted at once; then each key flat out everywhere, within its
/// budget.
#[test]
fn after_a_graceful_leave_a_new_sliding_key_is_admitted_at_once() {
    let (names, limits, rules) = rules_sliding();
    for nodes in [3usize, 5] {
        for seed in 1..=2 {
            let what = format!("{nodes} nodes, seed {seed}");
            let mut sim = Sim::new(nodes, rules.clone(), Params::default(), seed);
            for i in 1..nodes {
                sim.gossip_at[i] = MS;
            }
            sim.advance(2 * SECOND - sim.now % SECOND + 250 * MS);
            sim.leave(nodes - 1);
            let survivors = nodes - 1;
            // A new key every 2 ms for two rounds, at every survivor; the keys checked while
            // node 0 kept its starters are then loaded flat out.
            let mut kept_keys: Vec<(String, Vec<Vec<Nanos>>)> = Vec::new();
            for step in 0..100 {
                sim.advance(2 * MS);
                // Not in the gap after a degraded instant: the boundary there ends kept
                // starters, and a new key waits for the instant, a few ms (§3.3.1).
                if (0..survivors).any(|i| {
                    let p = sim.node(i).phase();
                    !p.open && !p.consistent
                }) {
                    continue;
                }
                let key = format!("new-{step}");
                let mut log = vec![Vec::new(); names.len()];
                for (r, rule) in names.iter().enumerate() {
                    for i in 0..survivors {
                        let at = sim.clock(i);
                        let d = sim.check(i, rule, &key, 1);
                        assert!(d.allowed(), "{what}, step {step}, node {i}, {rule}: {d:?}");
                        log[r].push(at);
                    }
                }
                if sim.node(0).phase().kept {
                    kept_keys.push((key, log));
                }
            }
            assert_eq!(sim.node(0).stats().final_leaves, 1, "{what}");
            assert!(!kept_keys.is_empty(), "{what}: node 0 kept no starter");
            let mut load = vec![1000; nodes];
            load[nodes - 1] = 0;
            for (key, mut log) in kept_keys {
                load_logged(&mut sim, &names, &key, &load, 1600 * MS, &mut log);
                assert_sliding_within(&names, &limits, &log, &format!("{what}, {key}"));
            }
        }
    }
}

/// Instants at every running node of `sim` that kept their starters across a late frame.
fn kept_rounds(sim: &Sim) -> u64 {
    sim.nodes
        .iter()
        .flatten()
        .map(|g| g.stats().kept_rounds)
        .sum()
}

/// A fixed window nobody is based in (here an hour's, opened before the cluster formed) keeps
/// its starters across a late frame as the sliding algorithms do, and never goes over: under
/// 15% frame loss, a new key every 20 ms at a random node, then checked flat out at every
/// node for 300 ms. Without the kept starters a new key at a node whose last instant was degraded
/// was refused in such a window (a new cluster's first window, of an hour or a day).
#[test]
fn starters_kept_across_late_frames_keep_every_unbased_fixed_window() {
    const C: u64 = 30;
    let rules = vec![("w".to_owned(), vec![fixed(C, 3600 * SECOND)])];
    for nodes in [3usize, 5] {
        let (mut kept, mut first_admitted, mut keys) = (0, 0, 0);
        for seed in 1..=3u64 {
            let mut sim = Sim::new(nodes, rules.clone(), Params::default(), seed);
            sim.advance(2 * SECOND - sim.now % SECOND);
            sim.net.loss = 150;
            let mut admitted: Vec<u64> = Vec::new();
            let start = sim.now;
            while sim.now < start + 3 * SECOND {
                sim.advance(MS);
                let t = sim.now - start;
                if t.is_multiple_of(20 * MS) {
                    let first = (sim.random() % nodes as u64) as usize;
                    let k = admitted.len();
                    let allowed = sim.check(first, "w", &format!("k{k}"), 1).allowed();
                    first_admitted += u64::from(allowed);
                    admitted.push(u64::from(allowed));
                }
                let live = (t / (20 * MS)).saturating_sub(15) as usize..admitted.len();
                for k in live {
                    for i in 0..nodes {
                        if sim.random() % 1000 < 600 {
                            let allowed = sim.check(i, "w", &format!("k{k}"), 1).allowed();
                            admitted[k] += u64::from(allowed);
                        }
                    }
                }
            }
            for (k, &n) in admitted.iter().enumerate() {
                assert!(n <= C, "{nodes} nodes, seed {seed}, k{k}: {n} admitted");
            }
            keys += admitted.len();
            kept += kept_rounds(&sim);
        }
        assert!(
            kept >= 10,
            "{nodes} nodes: {kept} instants kept their starters"
        );
        eprintln!("{nodes} nodes: {first_admitted} of {keys} first checks admitted");
    }
}

/// Starters kept across late frames never push a sliding budget over. Under 15% frame loss
/// (many instants degraded by one late frame, few peers suspected), a new key appears every
/// 20 ms at a random node and is then checked at every node for 300 ms: keys taken by a
/// starter at a node whose last instant was degraded while another node's lost frame already
/// showed the key used. Every key's exact budget is read at every admission.
#[test]
fn starters_kept_across_late_frames_keep_every_sliding_budget() {
    let (names, limits, rules) = rules_sliding();
    for nodes in [3usize, 5] {
        let mut kept = 0;
        for seed in 1..=3u64 {
            let mut sim = Sim::new(nodes, rules.clone(), Params::default(), seed);
            sim.advance(2 * SECOND - sim.now % SECOND);
            sim.net.loss = 150;
            let mut logs: Vec<Vec<Vec<Nanos>>> = Vec::new();
            let start = sim.now;
            let end = start + 3 * SECOND;
            while sim.now < end {
                sim.advance(MS);
                let t = sim.now - start;
                if t.is_multiple_of(20 * MS) {
                    logs.push(vec![Vec::new(); names.len()]);
                    let first = (sim.random() % nodes as u64) as usize;
                    let k = logs.len() - 1;
                    for (r, rule) in names.iter().enumerate() {
                        let at = sim.clock(first);
                        if sim.check(first, rule, &format!("k{k}"), 1).allowed() {
                            logs[k][r].push(at);
                        }
                    }
                }
                let live = (t / (20 * MS)).saturating_sub(15) as usize..logs.len();
                for k in live {
                    for i in 0..nodes {
                        for (r, rule) in names.iter().enumerate() {
                            if sim.random() % 1000 < 200 {
                                let at = sim.clock(i);
                                if sim.check(i, rule, &format!("k{k}"), 1).allowed() {
                                    logs[k][r].push(at);
                                }
                            }
                        }
                    }
                }
            }
            for (k, per_rule) in logs.iter().enumerate() {
                let what = format!("{nodes} nodes, seed {seed}, k{k}");
                assert_sliding_within(&names, &limits, per_rule, &what);
            }
            kept += kept_rounds(&sim);
        }
        assert!(
            kept >= 10,
            "{nodes} nodes: {kept} instants kept their starters"
        );
    }
}

/// A hot key at one and a half times its limit, `load` per mille a millisecond per node, for
/// 4 s past the first window: (far from the limit, of which denied), judged on `rule`.
fn hot_key_judged(rule: (&str, Limit), load: &[u64], seed: u64) -> (u64, u64) {
    let nodes = load.len();
    let rules = vec![(rule.0.to_owned(), vec![rule.1])];
    let mut judge = Judge::new(&rules, DEFAULT_ROUND);
    let mut sim = Sim::new(nodes, rules, Params::default(), seed);
    sim.advance(2 * SECOND - sim.now % SECOND);
    let end = sim.now + 4 * SECOND;
    while sim.now < end {
        sim.advance(MS);
        for (i, &p) in load.iter().enumerate() {
            if sim.random() % 1000 < p {
                let d = sim.check(i, rule.0, "hot", 1);
                judge.check(rule.0, "hot", i, nodes, sim.clock(i), 1, &d, true);
            }
        }
    }
    (judge.must_admit, judge.false_denials)
}

/// A hot key busy at other nodes still gets its share of the room every round: a node spends
/// what it holds within the round, and the others hand back what their next targets will not
/// want at the boundary (returns ahead, design §3.3.1), not a round later. At one and a half
/// times the limit, 80% of the load at one node or spread evenly, on 3 and 5 nodes, seeds 1–3.
/// Without returns ahead a fixed window denied 15% (3 nodes) and 21% (5 nodes) of the
/// checks design §3.3.3 says it must admit at once at the hot node, and a log or counter
/// 9–20%. What is left is at the end of a window, within a few units of the margin: a hot
/// node that spent its round's share waits for the next instant, and a log counts an
/// admission until its whole sub-slot of one round has left the period.
#[test]
fn a_hot_key_busy_at_other_nodes_gets_its_share_of_the_room_every_round() {
    let algs = [
        ("fixed", fixed(100, SECOND)),
        (
            "log",
            Limit::new(Algorithm::SlidingWindowLog, 100, 1600 * MS, None).unwrap(),
        ),
        (
            "counter",
            Limit::new(Algorithm::SlidingWindowCounter, 100, SECOND, None).unwrap(),
        ),
    ];
    for load in [
        vec![100u64, 25, 25],
        vec![50, 50, 50],
        vec![90, 15, 15, 15, 15],
        vec![30; 5],
    ] {
        for (name, l) in &algs {
            let (mut far, mut denied) = (0, 0);
            for seed in 1..=3 {
                let (f, d) = hot_key_judged((name, *l), &load, seed);
                far += f;
                denied += d;
            }
            let what = format!("{load:?}, {name}: {denied} of {far} denied");
            assert!(far > 250, "{what}");
            match *name {
                "fixed" => assert!(denied * 50 <= far, "{what}"),
                _ => assert!(denied * 100 <= 8 * far, "{what}"),
            }
        }
    }
}

/// A cluster whose keys went quiet sends no key in its frames, though they hold counts in an
/// hour's window: no full frame goes out on a timer (one sent by every node at the same
/// boundary, naming every counted key, made that round's frames late everywhere, design
/// §10). Its boundaries still sweep the store a shard a round, so keys whose window passed
/// are forgotten, on every node.
#[test]
fn a_quiet_cluster_sends_no_keys_and_forgets_them() {
    let rules = vec![
        ("hour".to_owned(), vec![fixed(1000, 3600 * SECOND)]),
        ("second".to_owned(), vec![fixed(1000, SECOND)]),
    ];
    let mut sim = Sim::new(3, rules, Params::default(), 17);
    sim.advance(2 * SECOND);
    let keys = 600;
    for key in 0..keys {
        for rule in ["hour", "second"] {
            sim.check(key % 3, rule, &format!("k{key}"), 1);
        }
        sim.advance(MS);
    }
    sim.advance(SECOND);
    for rule in 0..2 {
        let tracked: Vec<usize> = (0..3).map(|i| sim.node(i).rule_keys(rule)).collect();
        assert!(tracked.iter().all(|&t| t >= keys / 3), "{tracked:?}");
    }
    let before: Vec<Stats> = (0..3).map(|i| sim.node(i).stats()).collect();
    // Their last changes go out in the first rounds; nothing after.
    sim.advance(5 * SECOND);
    let quiet = sim.traffic;
    sim.advance(10 * SECOND);
    assert_eq!(sim.traffic.since(quiet).key_reports, 0);
    for (i, before) in before.iter().enumerate() {
        let after = sim.node(i).stats();
        assert_eq!(after.full_frames, before.full_frames, "node {i}");
        assert!(
            sim.node(i).rule_keys(0) >= keys / 3,
            "node {i} forgot counted keys"
        );
        assert_eq!(
            sim.node(i).rule_keys(1),
            0,
            "node {i} still tracks idle keys"
        );
    }
}

/// An instant that runs late (here a peer's clock is 40 ms behind, so its frame comes after
/// δ but within half a round) tells a check in its gap to retry when it is due at the
/// latest, so a check held for its lease (`Engine::lease_pause`) is still held when it runs,
/// and admitted then. Told a millisecond, as it was, a held check gave up after ~12 ms and
/// was refused a few milliseconds before the instant that would have admitted it.
#[test]
fn a_check_in_a_late_instants_gap_is_told_to_wait_for_it() {
    let log = Limit::new(Algorithm::SlidingWindowLog, 100, 3200 * MS, None).unwrap();
    let mut sim = Sim::new(
        3,
        vec![("log".to_owned(), vec![log])],
        Params::default(),
        29,
    );
    sim.advance(SECOND);
    // Its frames after every instant: degraded instants, which open no starter.
    sim.skew[2] = -70 * MS as i64;
    sim.advance(5 * DEFAULT_ROUND);
    // Then, once an instant went degraded, within half a round: the next instant is late,
    // but consistent.
    let to_boundary = DEFAULT_ROUND - sim.now % DEFAULT_ROUND;
    sim.advance(to_boundary + 55 * MS);
    let degraded = sim.node(0).stats().degraded_rounds;
    sim.skew[2] = -40 * MS as i64;
    sim.advance(DEFAULT_ROUND - 55 * MS + 30 * MS);
    assert_eq!(sim.node(0).stats().degraded_rounds, degraded);
    let d = sim.check(0, "log", "fresh", 1);
    let Verdict::Deny { retry_after } = d.verdict else {
        panic!("{d:?}")
    };
    assert!(retry_after >= 10 * MS, "{d:?}");
    sim.advance(retry_after);
    let d = sim.check(0, "log", "fresh", 1);
    assert!(d.allowed(), "{d:?}");
}

/// Design §5 ("Keys idle at the record"): what quiet users see in the seconds after one of 3
/// nodes crashes under `hold` in a cluster up for a while. Each 10 ms a new key is checked
/// once at a survivor, under a sliding log, a sliding counter and a fixed window of 60 per
/// 6 s; printed per 100 ms: of 10 checks, how many were admitted. The fixed window is based
/// (§3.3.1) and refuses none. A sliding key is refused between the survivors' first degraded
/// instant and the suspicion, about 200 ms; from then on each survivor admits a key its record
/// found idle up to a starter's size (before that rule, a sliding key new after the crash
/// waited for the log's next sub-slot or the counter's next window). `cargo test --release
/// --lib quiet_keys_after_a_crash_under_hold -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement: prints what new keys are admitted after a crash under hold"]
fn quiet_keys_after_a_crash_under_hold() {
    let names = ["log", "counter", "fixed"];
    let limits = [
        Limit::new(Algorithm::SlidingWindowLog, 60, 6 * SECOND, None).unwrap(),
        Limit::new(Algorithm::SlidingWindowCounter, 60, 6 * SECOND, None).unwrap(),
        Limit::new(Algorithm::FixedWindow, 60, 6 * SECOND, None).unwrap(),
    ];
    let rules = one_limit_each(&names, &limits);
    for seed in 1..=3u64 {
        let mut sim = Sim::new(3, rules.clone(), Params::default(), seed);
        // Past the first 6-s window, and into the next one by a seed's worth.
        sim.advance(12 * SECOND + seed * 1700 * MS);
        sim.crash(2);
        let mut k = 0u64;
        let mut rows = Vec::new();
        let mut refused = [0u32; 3];
        for step in 0..40 {
            let mut admitted = [0u32; 3];
            for _ in 0..10 {
                sim.advance(10 * MS);
                k += 1;
                let key = format!("u{seed}-{k}");
                for (r, rule) in names.iter().enumerate() {
                    if sim.check((k % 2) as usize, rule, &key, 1).allowed() {
                        admitted[r] += 1;
                    } else {
                        refused[r] += 1;
                    }
                }
            }
            if admitted != [10; 3] {
                rows.push(format!(
                    "{}–{} ms: {admitted:?}",
                    step * 100,
                    step * 100 + 100
                ));
            }
        }
        println!(
            "seed {seed}: refused of 400 (log, counter, fixed) {refused:?}; the 100-ms steps \
             with a refusal: {}",
            rows.join(", ")
        );
    }
}

/// Keys idle at the record (design §5) never push a budget over. Three and five nodes serve
/// the sliding rules and a fixed window of an hour (its first window, which nobody is based
/// in). Around a fault at node 0 — a crash, a two-way cut, a one-way cut in either
/// direction, or a stall of a second — a new key starts every 40 ms, from 400 ms before the fault to 400 ms after,
/// and is checked flat out at every node that runs, for 2 s. Node 0 may take a starter on a
/// new key, and be granted at an instant the others never see; the others, holding, admit
/// keys their record found idle up to a starter's size each. Every key's exact budget is read
/// at every admission (the fixed window's count in it).
#[test]
fn keys_idle_at_the_record_keep_every_budget_through_a_fault() {
    let (mut names, mut limits, mut rules) = rules_sliding();
    names.push("hour");
    limits.push(fixed(100, 3600 * SECOND));
    rules.push(("hour".to_owned(), vec![fixed(100, 3600 * SECOND)]));
    let mut admitted_after = 0u64;
    for nodes in [3usize, 5] {
        for seed in 1..=30u64 {
            let mut sim = Sim::new(nodes, rules.clone(), Params::default(), seed);
            sim.advance(SECOND + (seed * 97 % 1000) * MS);
            let fault = sim.now + 400 * MS;
            let kind = seed % 5;
            let mut logs: Vec<Vec<Vec<Nanos>>> = Vec::new();
            let start = sim.now;
            let mut faulted = false;
            while sim.now < fault + 2400 * MS {
                sim.advance(MS);
                if !faulted && sim.now >= fault {
                    faulted = true;
                    match kind {
                        0 => sim.crash(0),
                        1 => sim.partition(&[0]),
                        // Nobody hears node 0; it hears everyone.
                        2 => (1..nodes).for_each(|j| {
                            sim.net.cut.insert((0, j));
                        }),
                        // Node 0 hears nobody; everyone hears it.
                        3 => (1..nodes).for_each(|j| {
                            sim.net.cut.insert((j, 0));
                        }),
                        // Node 0 stops for a second (a stall), then goes on.
                        _ => sim.pause(0, SECOND),
                    }
                }
                let t = sim.now - start;
                if t.is_multiple_of(40 * MS) && sim.now < fault + 400 * MS {
                    logs.push(vec![Vec::new(); names.len()]);
                }
                for (k, log) in logs.iter_mut().enumerate() {
                    for i in 0..nodes {
                        if !sim.running(i) || sim.random() % 1000 >= 500 {
                            continue;
                        }
                        for (r, rule) in names.iter().enumerate() {
                            let at = sim.clock(i);
                            if sim.check(i, rule, &format!("k{k}"), 1).allowed() {
                                log[r].push(at);
                                admitted_after += u64::from(i > 0 && sim.now > fault + 500 * MS);
                            }
                        }
                    }
                }
            }
            for (k, log) in logs.iter().enumerate() {
                let what = format!("{nodes} nodes, seed {seed}, fault {kind}, k{k}");
                assert_sliding_within(&names[..3], &limits[..3], &log[..3], &what);
                assert!(log[3].len() <= 100, "{what}, hour: {}", log[3].len());
            }
        }
    }
    assert!(admitted_after > 0, "nothing admitted after the faults");
}

/// [`GLimit::fades_at`] names the first time a sliding counter's weighted previous slot
/// reads less: every time before it reads as `now` does, and it (inside the slot) reads less.
/// Checked against [`GLimit::budget`] at every nanosecond of a short slot.
#[test]
fn a_counters_fade_time_is_when_its_budget_first_steps_down() {
    // A slot of 97 ns (the limit's own period plays no part here), to try every time in it.
    let limit = Limit::new(Algorithm::SlidingWindowCounter, 50, SECOND, None).unwrap();
    let l = GLimit::new(limit, Kind::Counter, 97, 1, "c".into());
    let s = 5;
    let start = s * l.slot_len;
    let end = start + l.slot_len;
    for p in [0, 1, 2, 3, 7, 50, 96, 97, 98, 500] {
        let budget = |t: Nanos| l.budget(s, t, |y| if y == s - 1 { p } else { 2 });
        for now in start..end {
            let at = l.fades_at(s, now, p);
            assert!(at > now && at <= end, "p {p} now {now}: {at}");
            for t in now..at {
                assert_eq!(
                    budget(t),
                    budget(now),
                    "p {p} now {now}: steps at {t}, not {at}"
                );
            }
            if at < end {
                assert!(budget(at) < budget(now), "p {p} now {now}: no step at {at}");
            }
        }
    }
}

/// A key holds an `LState` per limit: its enum tag must fit in a niche of the window state
/// (`Leased::set`), or every key of every algorithm pays 16 bytes more (its alignment is
/// the bucket's `i128`). It did once: heap per key 331 -> 347 bytes (`tests/memory.rs`).
#[test]
fn a_limits_state_takes_no_room_for_its_tag() {
    assert_eq!(std::mem::size_of::<LState>(), std::mem::size_of::<WState>());
}

/// A limit's numbers changed node by node, as a ConfigMap reaches the nodes seconds apart:
/// raised from 100/s to 300/s at node 0, then 0.4 s later at node 1, then 0.9 s later at
/// node 2; then cut back to 100/s at node 2 first and a second apart at the others. Three
/// nodes at three times the higher limit. The smaller numbers are in force until every live
/// member has the larger (design §3.8): a raise holds from the last node's
/// reload, a cut from the first node's, each once gossip has carried it (100 ms here) and the
/// slot open then and the one pre-leased beside it have passed. No window is ever over the
/// higher limit; none before the raise is in force is over the lower, nor any after the cut
/// is, though two nodes still run the higher for 1.5 and 3.5 s; the windows of the raised
/// limit get nearly all of it, and those after the cut nearly all of the lower one. A token
/// bucket (burst = limit) is held to its rate plus its burst a window.
#[test]
fn a_limit_changed_node_by_node_holds_the_smaller_until_every_node_has_it() {
    for alg in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowLog,
        Algorithm::SlidingWindowCounter,
        Algorithm::TokenBucket,
    ] {
        let limit = |n| Limit::new(alg, n, SECOND, alg.has_burst().then_some(n)).unwrap();
        let burst = if alg.has_burst() { 2 } else { 1 };
        for seed in 1..=3 {
            let rules = vec![("api".to_string(), vec![limit(100)])];
            let mut sim = Sim::new(3, rules, Params::default(), seed);
            sim.advance(1300 * MS);
            let load = [300, 300, 300];
            sim.load("api", "k", &load, 2 * SECOND);
            sim.relimit(0, "api", vec![limit(300)]);
            sim.load("api", "k", &load, 400 * MS);
            sim.relimit(1, "api", vec![limit(300)]);
            sim.load("api", "k", &load, 900 * MS);
            sim.relimit(2, "api", vec![limit(300)]);
            let raised = sim.now;
            sim.load("api", "k", &load, 4 * SECOND);
            sim.relimit(2, "api", vec![limit(100)]);
            let cut = sim.now;
            sim.load("api", "k", &load, 1500 * MS);
            sim.relimit(0, "api", vec![limit(100)]);
            sim.load("api", "k", &load, 2 * SECOND);
            sim.relimit(1, "api", vec![limit(100)]);
            sim.load("api", "k", &load, 2 * SECOND);
            let end = sim.now;
            // Windows whole within a stretch: from the first window starting at or after
            // `from` to the last one ending by `to`.
            let within = |from: Nanos, to: Nanos| from.div_ceil(SECOND)..to / SECOND;
            let settled = |at: Nanos| at + 100 * MS + 2 * SECOND;
            let windows = sim.per_window();
            for (w, n) in &windows {
                let lower = within(0, raised).contains(w) || within(settled(cut), end).contains(w);
                let most = burst * if lower { 100 } else { 300 };
                assert!(
                    *n <= most,
                    "{alg:?} seed {seed}, window {w}: {n} over {most}: {windows:?}"
                );
            }
            // A sliding algorithm at three times a limit of 300/s admits less than the limit
            // over the mesh whether or not it was raised (the same load on 300/s from the
            // start: 225–300 a window for the log, 270–273 for the counter; 90–91 for the
            // counter on 100/s), so the raise is shown by twice the old limit there.
            let (raised_least, cut_least) = match alg {
                Algorithm::FixedWindow => (285, 95),
                _ => (200, 88),
            };
            for (range, least) in [
                (within(settled(raised), cut), raised_least),
                (within(settled(cut), end), cut_least),
            ] {
                assert!(!range.is_empty());
                for w in range {
                    let n = windows.get(&w).copied().unwrap_or(0);
                    assert!(
                        n >= least,
                        "{alg:?} seed {seed}, window {w}: {n} under {least}: {windows:?}"
                    );
                }
            }
        }
    }
}

/// A global rule added to a running cluster node by node, as a ConfigMap reaches the nodes
/// seconds apart (design §3.8, "Adding and removing a global rule"), then removed at one node.
/// Every node that has the rule offers a hot key 300/s against a limit of 100/s, and checks a
/// quiet key as soon as it adds the rule. No window is over the limit (a bucket: its rate plus
/// its burst) at any stage; once every node has the rule the windows get nearly all of it; a
/// quiet key's first check at a node that just added the rule is admitted at once for a fixed
/// window (its base) and a bucket (its share of the burst), and within three rounds for the
/// sliding algorithms (their starters wait for the peers' full frames: asked for at the next
/// boundary, sent at the one after). The node that removes the
/// rule checks none of its keys again.
#[test]
fn a_global_rule_added_node_by_node_holds_its_limit_and_serves_quiet_keys() {
    for alg in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowLog,
        Algorithm::SlidingWindowCounter,
        Algorithm::TokenBucket,
    ] {
        let limit = |n| Limit::new(alg, n, SECOND, alg.has_burst().then_some(n)).unwrap();
        let most = if alg.has_burst() { 200 } else { 100 };
        for seed in 1..=3 {
            let rules = vec![("api".to_string(), vec![limit(100)])];
            let mut sim = Sim::new(3, rules, Params::default(), seed);
            sim.advance(1300 * MS);
            sim.load("api", "k", &[100, 100, 100], SECOND);
            let mut has = [false; 3];
            let mut windows: BTreeMap<u64, u64> = BTreeMap::new();
            let mut run = |sim: &mut Sim, has: &[bool; 3], dur: Nanos| {
                let end = sim.now + dur;
                while sim.now < end {
                    sim.advance(MS);
                    for (i, &has) in has.iter().enumerate() {
                        if sim.random() % 1000 < 100 && has && sim.running(i) {
                            let d = sim.check(i, "new", "hot", 1);
                            if d.allowed() {
                                *windows.entry(sim.now / SECOND).or_default() += 1;
                            }
                        }
                    }
                }
            };
            let mut all_from = 0;
            for (i, gap) in [(0, 1700 * MS), (2, 900 * MS), (1, 8 * SECOND)] {
                sim.add_rule(i, "new", vec![limit(100)]);
                has[i] = true;
                all_from = sim.now;
                let quiet = format!("quiet-{i}");
                let at_once = sim.check(i, "new", &quiet, 1).allowed();
                let mut waited = 0;
                let mut admitted = at_once;
                while !admitted && waited < 300 {
                    sim.advance(10 * MS);
                    waited += 10;
                    admitted = sim.check(i, "new", &quiet, 1).allowed();
                }
                match alg {
                    Algorithm::FixedWindow | Algorithm::TokenBucket => assert!(
                        at_once,
                        "{alg:?} seed {seed}: a quiet key at node {i} just after it added the rule"
                    ),
                    _ => assert!(
                        admitted,
                        "{alg:?} seed {seed}: a quiet key at node {i} 300 ms after it added the rule"
                    ),
                }
                run(&mut sim, &has, gap);
            }
            let removed = sim.now;
            sim.remove_rule(1, "new");
            has[1] = false;
            let index = sim.node(1).rule_index("new").expect("kept while it drains");
            assert!(!sim.node(1).serves(index));
            run(&mut sim, &has, 3 * SECOND);
            for (w, n) in &windows {
                assert!(
                    *n <= most,
                    "{alg:?} seed {seed}, window {w}: {n} over {most}: {windows:?}"
                );
            }
            // Every node has had the rule for a round and more: nearly all of the limit. A
            // sliding log's windows run in a sawtooth at saturation (design §3.4: its room
            // frees a sub-slot late, 1/11 over many windows here), so its mean is judged.
            let settled = (all_from + 600 * MS).div_ceil(SECOND)..removed / SECOND;
            let got: Vec<u64> = settled
                .map(|w| windows.get(&w).copied().unwrap_or(0))
                .collect();
            assert!(got.len() >= 5, "{got:?}");
            if alg == Algorithm::SlidingWindowLog {
                let mean = got.iter().sum::<u64>() / got.len() as u64;
                assert!(mean >= 88, "{alg:?} seed {seed}: {got:?}");
            } else {
                assert!(got.iter().all(|&n| n >= 95), "{alg:?} seed {seed}: {got:?}");
            }
        }
    }
}

/// What the sliding algorithms lose at saturation (design §7): a hot key at three times the
/// limit, on 1, 3 and 5 nodes, the load even or 80% at one node, seed 1. A sliding counter's
/// previous window fades continuously; an allotment reads it at the round's boundary, and the
/// room the fade frees after that goes to the nodes' fade shares, dealt by demand (design
/// §3.4). So a window loses only the shares a node cannot use before its round ends: 97.1–98.1%
/// of the limit at w = 1 s (99.0% on one node), 99.8% at 10 s. Without the shares the room of each window's last
/// round of fade was lost, `limit·T/w` a window: 91% at w = 1 s, 99% at 10 s. A sliding log
/// counts in k sub-slots of whole rounds (k ≤ 16, as large as divides w: 10 for w = 1 s, 15
/// for a minute) and reads k + 1 of them, so at saturation its room frees a sub-slot late:
/// 1/(k + 1) over many windows (1/11 here, 90.9%), taken in a run of short windows every
/// k + 1 (so a span of 7 windows reads 85.7%, or 100%).
#[test]
fn sliding_algorithms_at_saturation_lose_what_the_error_budget_says() {
    let run = |alg: Algorithm, secs: u64, windows: usize, load: &[u64]| {
        let l = Limit::new(alg, 100 * secs, secs * SECOND, None).unwrap();
        let rules = vec![("api".to_string(), vec![l])];
        let mut sim = Sim::new(load.len(), rules, Params::default(), 1);
        sim.window = secs * SECOND;
        sim.advance(300 * MS);
        sim.load("api", "hot", load, (windows as u64 + 3) * secs * SECOND);
        let w: Vec<u64> = sim.per_window().values().copied().collect();
        assert!(
            w.iter().all(|&n| n <= 100 * secs),
            "{alg:?} {secs} s: {w:?}"
        );
        let full: u64 = w.iter().skip(2).take(windows).sum();
        full as f64 / (windows as u64 * 100 * secs) as f64
    };
    let even = [100, 100, 100];
    for (alg, secs, windows, load, least, most) in [
        (Algorithm::SlidingWindowCounter, 1, 8, &even[..], 0.96, 1.0),
        (
            Algorithm::SlidingWindowCounter,
            1,
            8,
            &[240, 30, 30],
            0.96,
            1.0,
        ),
        (Algorithm::SlidingWindowCounter, 1, 8, &[60; 5], 0.96, 1.0),
        (
            Algorithm::SlidingWindowCounter,
            1,
            8,
            &[240, 15, 15, 15, 15],
            0.96,
            1.0,
        ),
        (Algorithm::SlidingWindowCounter, 1, 8, &[300], 0.98, 1.0),
        (Algorithm::SlidingWindowCounter, 10, 8, &even, 0.99, 1.0),
        (Algorithm::SlidingWindowLog, 1, 33, &even, 0.895, 0.925),
    ] {
        let share = run(alg, secs, windows, load);
        eprintln!("{alg:?}, {secs} s windows, {load:?}: {:.1}%", 100.0 * share);
        assert!(
            (least..=most).contains(&share),
            "{alg:?}, {secs} s windows, {load:?}: {:.1}%",
            100.0 * share
        );
    }
}

/// The fade seats of a sliding counter (design §3.4) are dealt so that each seat has exactly
/// one holder, whatever the weights and however many participants (more than the seats too),
/// and the holders' parts of any number of faded units sum to exactly that number, each
/// growing with it: so shares taken at different times of a round never sum past what faded.
/// A part follows its holder's weight: 80% of the demand takes 12 or 13 of the 16 seats, and
/// of 10 units the busy holder takes 7 or 8.
#[test]
fn fade_seats_deal_every_unit_once_and_follow_demand() {
    let cases: Vec<Vec<u64>> = vec![
        vec![0, 0, 0],
        vec![24, 3, 3],
        vec![10, 10, 10, 10, 10],
        vec![24, 1, 1, 1, 1],
        vec![5],
        (0..40).map(|i| i % 7).collect(),
    ];
    for demands in cases {
        let weights = lease_weights(&demands);
        // Node order is not index order: reversed here.
        let order: Vec<usize> = (0..demands.len()).rev().collect();
        let masks = fade_seats(&weights, &order);
        let mut seen = 0u32;
        for m in &masks {
            assert_eq!(u32::from(*m) & seen, 0, "{demands:?}: a seat dealt twice");
            seen |= u32::from(*m);
        }
        assert_eq!(seen, 0xffff, "{demands:?}: a seat without a holder");
        let mut last = vec![0u64; masks.len()];
        for f in 0..200u64 {
            let parts: Vec<u64> = masks.iter().map(|&m| fade_part(f, m)).collect();
            assert_eq!(parts.iter().sum::<u64>(), f, "{demands:?}, {f} units");
            for (p, l) in parts.iter().zip(&last) {
                assert!(p >= l, "{demands:?}, {f} units: a part shrank");
            }
            last = parts;
        }
    }
    let masks = fade_seats(&lease_weights(&[24, 3, 3]), &[0, 1, 2]);
    assert!((12..=13).contains(&masks[0].count_ones()), "{masks:?}");
    assert!((7..=8).contains(&fade_part(10, masks[0])), "{masks:?}");
}

/// The workload of `benches/bytes_per_check.py` in the simulation: 3 nodes, one global rule of
/// 60 a minute (each tier of [`rules_tiers_per`] in turn), `users` users, user u always at node
/// u mod 3, 250 checks a second for 10 s after 2 s of warm-up, in the cluster's first window
/// (nobody based) and in one that opens 12 s or more after it formed (the fixed window based,
/// the view settled). Prints the encoded bytes a check, summed over the nodes (`cargo test
/// --release --lib bytes_per_check_in_the_simulation -- --ignored --nocapture`).
#[test]
#[ignore = "a measurement: prints the cluster's bytes per check"]
fn bytes_per_check_in_the_simulation() {
    println!(
        "| rule | window | users | round frames, B a check | digests and repairs, B a check |"
    );
    println!("|---|---|---:|---:|---:|");
    for (name, limits) in rules_tiers_per(60 * SECOND) {
        for settled in [false, true] {
            for users in [5_000u64, 50_000] {
                if name != "fixed" && users != 5_000 {
                    continue;
                }
                let rules = vec![(name.clone(), limits.clone())];
                let mut sim = Sim::new(3, rules, Params::default(), 1);
                sim.advance(300 * MS);
                if settled {
                    let at = sim.now + 12 * SECOND;
                    sim.advance(at - at % (60 * SECOND) + 60 * SECOND + 500 * MS - sim.now);
                }
                let warm = sim.now + 2 * SECOND;
                let end = warm + 10 * SECOND;
                let mut before = None;
                let mut checks = 0u64;
                while sim.now < end {
                    if before.is_none() && sim.now >= warm {
                        before = Some(sim.traffic);
                    }
                    sim.advance(4 * MS);
                    let u = sim.between(0, users);
                    sim.check((u % 3) as usize, &name, &format!("user-{u}"), 1);
                    checks += u64::from(before.is_some());
                }
                let t = sim.traffic.since(before.unwrap());
                let per = |b: u64| b as f64 / checks as f64;
                println!(
                    "| {name} | {} | {users} | {:.0} | {:.0} |",
                    if settled { "settled" } else { "first" },
                    per(t.frames + t.empty_frames),
                    per(t.other)
                );
            }
        }
    }
}
