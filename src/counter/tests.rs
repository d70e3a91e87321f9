use super::*;
use proptest::prelude::*;

fn actor(node: &str) -> Actor {
    Actor::new(node, 1)
}

fn slot(key: &str, n: u64) -> SlotId {
    SlotId::new("api", key, n)
}

/// Every slot with all its dots, sorted: two replicas hold the same counts exactly when
/// their states are equal.
fn state(c: &Counters) -> Vec<Delta> {
    c.repair_for(&Digest::default())
}

/// `into` learns everything `from` knows (a full state merge).
fn merge(into: &mut Counters, from: &Counters) {
    into.apply_all(state(from));
}

/// Both replicas send each other a digest and apply the repair that answers it.
fn anti_entropy(a: &mut Counters, b: &mut Counters) {
    let (da, db) = (a.digest(), b.digest());
    a.apply_all(b.repair_for(&da));
    b.apply_all(a.repair_for(&db));
}

#[test]
fn add_counts_own_admissions_and_returns_the_absolute_dot() {
    let mut c = Counters::new(actor("a"));
    assert_eq!(c.add(slot("k", 0), 3), Dot::new(actor("a"), 3));
    assert_eq!(c.add(slot("k", 0), 2), Dot::new(actor("a"), 5));
    assert_eq!(c.add(slot("k", 1), 1), Dot::new(actor("a"), 1));
    assert_eq!((c.total(&slot("k", 0)), c.own(&slot("k", 0))), (5, 5));
    assert_eq!(c.others(&slot("k", 0)), 0);
    assert_eq!((c.len(), c.total(&slot("other", 0))), (2, 0));
}

#[test]
fn adding_zero_reports_the_count_without_creating_a_slot() {
    let mut c = Counters::new(actor("a"));
    assert_eq!(c.add(slot("k", 0), 0), Dot::new(actor("a"), 0));
    assert!(c.is_empty());
}

#[test]
fn apply_keeps_the_larger_count_per_actor_and_never_lowers_one() {
    let mut c = Counters::new(actor("a"));
    c.add(slot("k", 0), 4);
    assert!(c.apply(slot("k", 0), Dot::new(actor("b"), 7)));
    assert!(!c.apply(slot("k", 0), Dot::new(actor("b"), 7)), "duplicate");
    assert!(!c.apply(slot("k", 0), Dot::new(actor("b"), 2)), "older");
    assert!(
        !c.apply(slot("k", 0), Dot::new(actor("a"), 1)),
        "own, older"
    );
    assert!(
        !c.apply(slot("k", 0), Dot::new(actor("a"), 100)),
        "own, higher: only this node raises its own count"
    );
    assert_eq!(c.own(&slot("k", 0)), 4);
    // Only the claim above this node's count is refused: the older one is an echo.
    assert_eq!(c.refused(), 1);
    assert_eq!(c.total(&slot("k", 0)), 11);
    assert_eq!((c.own(&slot("k", 0)), c.others(&slot("k", 0))), (4, 7));
    assert!(c.apply(slot("k", 0), Dot::new(actor("b"), 9)));
    assert_eq!(c.total(&slot("k", 0)), 13);
}

#[test]
fn applying_a_zero_dot_creates_nothing() {
    let mut c = Counters::new(actor("a"));
    assert!(!c.apply(slot("k", 0), Dot::new(actor("b"), 0)));
    assert!(c.is_empty());
}

#[test]
fn borrowed_lookups_agree_with_slot_ids() {
    let mut c = Counters::new(actor("a"));
    assert_eq!(c.add_at("api", "k", 0, 2), 2);
    assert!(c.apply_at("api", "k", 0, &actor("b"), 5));
    assert!(!c.apply_at("api", "k", 0, &actor("b"), 5), "duplicate");
    assert_eq!(c.total_at("api", "k", 0), c.total(&slot("k", 0)));
    assert_eq!(
        (c.own_at("api", "k", 0), c.others_at("api", "k", 0)),
        (2, 5)
    );
    assert_eq!(c.count_at("api", "k", 0, &actor("b")), 5);
    assert_eq!(c.count_at("api", "k", 0, &actor("z")), 0, "unknown actor");
    assert_eq!(c.total_at("nope", "k", 0), 0, "unknown rule");
}

#[test]
fn an_actor_is_kept_while_a_slot_counts_it_and_freed_after() {
    let mut c = Counters::new(actor("a"));
    c.add(slot("k", 0), 1);
    assert!(!c.apply(slot("k", 0), Dot::new(actor("b"), 0)));
    assert_eq!(c.actors(), 1, "a refused dot interns nothing");
    c.apply(slot("k", 0), Dot::new(actor("b"), 3));
    c.apply(slot("k", 5), Dot::new(actor("b"), 1));
    c.apply(slot("k", 5), Dot::new(actor("c"), 1));
    assert_eq!(c.actors(), 3);
    c.forget_before("api", 1);
    assert_eq!(c.actors(), 3, "b still counts in slot 5");
    c.forget_before("api", 6);
    assert_eq!(
        (c.actors(), c.len()),
        (1, 0),
        "only this node's actor is left"
    );
    // A freed index is reused, and the counts stay apart.
    c.apply(slot("k", 7), Dot::new(actor("d"), 4));
    c.add(slot("k", 7), 1);
    assert_eq!(c.actors(), 2);
    assert_eq!(
        state(&c),
        vec![(
            slot("k", 7),
            vec![Dot::new(actor("a"), 1), Dot::new(actor("d"), 4)]
        )]
    );
}

#[test]
fn counts_relayed_through_a_peer_reach_a_third_replica() {
    let (mut a, mut b, mut c) = (
        Counters::new(actor("a")),
        Counters::new(actor("b")),
        Counters::new(actor("c")),
    );
    a.add(slot("k", 0), 3);
    b.apply_all(state(&a));
    b.add(slot("k", 0), 1);
    c.apply_all(state(&b));
    assert_eq!(c.total(&slot("k", 0)), 4);
    assert_eq!(c.others(&slot("k", 0)), 4);
    assert_eq!(state(&c), state(&b));
}

#[test]
fn counts_survive_a_crash_under_the_old_generation_and_restart_separately() {
    let old = Actor::new("a", 1);
    let mut a = Counters::new(old.clone());
    let mut b = Counters::new(actor("b"));
    a.add(slot("k", 0), 10);
    b.add(slot("k", 0), 5);
    b.apply_all(state(&a));
    a.apply_all(state(&b));
    // Admitted but never sent: lost with the crash.
    a.add(slot("k", 0), 2);
    drop(a);

    // The node restarts with a new generation and catches up from its peer.
    let mut a = Counters::new(Actor::new("a", 2));
    a.apply_all(b.repair_for(&a.digest()));
    assert_eq!((a.total(&slot("k", 0)), a.own(&slot("k", 0))), (15, 0));
    assert_eq!(a.add(slot("k", 0), 4), Dot::new(Actor::new("a", 2), 4));
    b.apply_all(state(&a));
    for c in [&a, &b] {
        assert_eq!(
            c.total(&slot("k", 0)),
            19,
            "10 (a, gen 1) + 5 (b) + 4 (a, gen 2)"
        );
    }
    // The old incarnation's dot arriving late (a relay, a repair) changes nothing.
    assert!(!b.apply(slot("k", 0), Dot::new(old, 10)));
    assert_eq!(state(&a), state(&b));
}

#[test]
fn replicas_that_missed_deltas_converge_after_digests_both_ways() {
    let mut a = Counters::new(actor("a"));
    let mut b = Counters::new(actor("b"));
    let mut deltas = Vec::new();
    for i in 0..100 {
        let id = slot(&format!("k{i}"), 0);
        deltas.push((id.clone(), vec![a.add(id, i + 1)]));
        if i % 3 == 0 {
            b.add(slot(&format!("k{i}"), 0), 1);
        }
        b.add(SlotId::new("other", format!("k{i}"), 7), 2);
    }
    // Only some of a's deltas got through, and none of b's.
    b.apply_all(deltas.into_iter().step_by(4));
    // Later counts in slots b already has: b is behind there, with the same actors.
    for i in 0..10 {
        a.add(slot(&format!("k{i}"), 0), 1);
    }
    assert_ne!(state(&a), state(&b));

    anti_entropy(&mut a, &mut b);
    assert_eq!(state(&a), state(&b));
    assert_eq!(a.len(), 200);
    assert_eq!(b.total(&slot("k3", 0)), 4 + 1 + 1);
    // Converged replicas repair nothing.
    assert!(a.repair_for(&b.digest()).is_empty());
    assert!(b.repair_for(&a.digest()).is_empty());
}

#[test]
fn anti_entropy_repairs_a_slot_that_is_only_behind_on_a_count() {
    let mut a = Counters::new(actor("a"));
    for i in 0..100 {
        a.add(slot(&format!("k{i}"), 0), 1);
    }
    let mut b = Counters::new(actor("b"));
    b.apply_all(state(&a));
    a.add(slot("k42", 0), 1);
    let repair = a.repair_for(&b.digest());
    assert!(repair.iter().any(|(id, _)| id == &slot("k42", 0)));
    assert!(
        repair.len() <= 2 * DIGEST_SLOTS_PER_BUCKET,
        "{} slots",
        repair.len()
    );
    b.apply_all(repair);
    assert_eq!(b.total(&slot("k42", 0)), 2);
    assert_eq!(state(&a), state(&b));
}

#[test]
fn repair_sends_slots_of_rules_the_peer_does_not_know() {
    let mut a = Counters::new(actor("a"));
    a.add(SlotId::new("r1", "k", 0), 1);
    a.add(SlotId::new("r2", "k", 0), 1);
    let mut b = Counters::new(actor("b"));
    b.apply_all(a.repair_for(&Digest::default()));
    // A hostile or broken digest (no buckets, too many) counts as knowing nothing.
    let bad = Digest {
        rules: vec![
            RuleDigest {
                rule: "r1".into(),
                buckets: vec![],
            },
            RuleDigest {
                rule: "r2".into(),
                buckets: vec![0; MAX_DIGEST_BUCKETS + 1],
            },
        ],
    };
    assert_eq!(a.repair_for(&bad).len(), 2);
    assert!(a.repair_for(&b.digest()).is_empty());
}

#[test]
fn digest_is_about_one_byte_per_slot() {
    let mut c = Counters::new(actor("a"));
    for i in 0..10_000 {
        c.add(slot(&format!("user-{i}"), 0), 1);
    }
    let d = c.digest();
    assert_eq!(d.rules.len(), 1);
    assert_eq!(d.rules[0].buckets.len(), 10_000 / DIGEST_SLOTS_PER_BUCKET);
    let bytes = bincode::serde::encode_to_vec(&d, bincode::config::standard()).unwrap();
    assert!(
        bytes.len() <= 10_000 * 9 / DIGEST_SLOTS_PER_BUCKET + 16,
        "{}",
        bytes.len()
    );
}

/// The digest's hash is part of the wire: nodes of different builds compare digests, and a
/// changed layout makes every repair a full dump. These values were computed by the release
/// whose wire version is 8; change them only with a wire version bump.
#[test]
fn digest_values_are_pinned() {
    let mut c = Counters::new(actor("a"));
    for i in 0..40u64 {
        let key = format!("key-{i:08}");
        let rule = if i % 3 == 0 { "km" } else { "other" };
        c.add(SlotId::new(rule, key.as_str(), 5), 1 + i % 4);
        if i % 10 == 0 {
            c.apply(SlotId::new("km", key.as_str(), 5), Dot::new(actor("b"), 2));
        }
        if i % 20 == 0 {
            c.apply(SlotId::new("km", key.as_str(), 5), Dot::new(actor("0"), 3));
        }
    }
    let d = c.digest();
    let sums: Vec<(&str, Vec<u64>)> = d
        .rules
        .iter()
        .map(|r| (r.rule.as_str(), r.buckets.clone()))
        .collect();
    let pinned: Vec<(&str, Vec<u64>)> = vec![
        ("km", vec![9757241345335760139, 9272024380557162445]),
        (
            "other",
            vec![
                11646046743621292755,
                6689023947345898537,
                7892994833375498613,
                8131881651634168612,
            ],
        ),
    ];
    assert_eq!(sums, pinned);
}

#[test]
fn digest_does_not_depend_on_insertion_order() {
    let (mut a, mut b) = (Counters::new(actor("a")), Counters::new(actor("b")));
    for i in 0..50 {
        a.apply(slot(&format!("k{i}"), 0), Dot::new(actor("x"), i + 1));
    }
    for i in (0..50).rev() {
        b.apply(slot(&format!("k{i}"), 0), Dot::new(actor("x"), i + 1));
    }
    assert_eq!(a.digest(), b.digest());
}

#[test]
fn forget_before_drops_only_older_slots_of_that_rule() {
    let mut c = Counters::new(actor("a"));
    for s in 0..5 {
        c.add(slot("k", s), 1);
        c.add(SlotId::new("other", "k", s), 1);
    }
    assert_eq!(c.forget_before("api", 3), 3);
    assert_eq!(c.len(), 7);
    assert_eq!((c.total(&slot("k", 2)), c.total(&slot("k", 3))), (0, 1));
    assert_eq!(c.total(&SlotId::new("other", "k", 0)), 1);
    // Forgotten slots leave the state, and a late dot cannot bring them back.
    assert!(
        state(&c)
            .iter()
            .all(|(id, _)| id.rule != "api" || id.slot >= 3)
    );
    assert!(!c.apply(slot("k", 1), Dot::new(actor("b"), 9)));
    assert_eq!(
        c.apply_all([(slot("k", 2), vec![Dot::new(actor("b"), 9)])]),
        0
    );
    assert_eq!(c.len(), 7);
    assert!(c.apply(slot("k", 3), Dot::new(actor("b"), 9)));
    // A lower floor later does not lower the floor.
    assert_eq!(c.forget_before("api", 1), 0);
    assert!(!c.apply(slot("k", 2), Dot::new(actor("b"), 9)));
}

#[test]
fn totals_saturate_instead_of_overflowing() {
    let mut c = Counters::new(actor("a"));
    c.add(slot("k", 0), u64::MAX - 1);
    assert_eq!(c.add(slot("k", 0), 5), Dot::new(actor("a"), u64::MAX));
    assert_eq!(c.add(slot("k", 0), 1), Dot::new(actor("a"), u64::MAX));
    assert!(c.apply(slot("k", 0), Dot::new(actor("b"), u64::MAX)));
    assert!(c.apply(slot("k", 0), Dot::new(actor("c"), 3)));
    assert_eq!(c.total(&slot("k", 0)), u64::MAX);
    assert_eq!(c.own(&slot("k", 0)), u64::MAX);
    assert_eq!(c.others(&slot("k", 0)), 0, "saturated total less own");
}

/// An admission by actor `.0` (of 3) in slot `.1` (of 3), of cost `.2`.
fn ops() -> impl Strategy<Value = Vec<(usize, u64, u64)>> {
    proptest::collection::vec((0usize..3, 0u64..3, 1u64..50), 1..60)
}

/// Runs `ops` on three replicas, each counting only its own admissions, and returns the
/// delta each op produced (the dot `add` returns) and the true totals.
fn run(ops: &[(usize, u64, u64)]) -> (Vec<Delta>, [u64; 3]) {
    let mut replicas: Vec<Counters> = ["a", "b", "c"]
        .iter()
        .map(|n| Counters::new(actor(n)))
        .collect();
    let mut deltas = Vec::new();
    let mut totals = [0; 3];
    for &(who, s, n) in ops {
        let dot = replicas[who].add(slot("k", s), n);
        deltas.push((slot("k", s), vec![dot]));
        totals[s as usize] += n;
    }
    (deltas, totals)
}

fn replica_with(me: &str, deltas: &[Delta]) -> Counters {
    let mut c = Counters::new(actor(me));
    c.apply_all(deltas.iter().cloned());
    c
}

proptest! {
    /// Deltas applied in any order, any number of times, give the true totals everywhere.
    #[test]
    fn deltas_in_any_order_and_duplicated_give_identical_totals(
        ops in ops(),
        seeds in proptest::collection::vec(any::<u64>(), 3),
        dup in proptest::collection::vec(any::<prop::sample::Index>(), 0..30),
    ) {
        let (deltas, totals) = run(&ops);
        let mut states = Vec::new();
        for (i, seed) in seeds.into_iter().enumerate() {
            let mut order: Vec<Delta> = deltas.clone();
            order.extend(dup.iter().map(|ix| ix.get(&deltas).clone()));
            // A seeded Fisher-Yates shuffle (xorshift), distinct per replica.
            let mut x = seed | 1;
            for j in (1..order.len()).rev() {
                x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                order.swap(j, (x % (j as u64 + 1)) as usize);
            }
            let c = replica_with(["x", "y", "z"][i], &order);
            for (s, &t) in totals.iter().enumerate() {
                prop_assert_eq!(c.total(&slot("k", s as u64)), t);
            }
            states.push(state(&c));
        }
        prop_assert_eq!(&states[0], &states[1]);
        prop_assert_eq!(&states[1], &states[2]);
    }

    /// State merge is commutative, associative and idempotent.
    #[test]
    fn merge_is_commutative_associative_and_idempotent(
        ops in ops(),
        split in proptest::collection::vec(0usize..3, 0..200),
    ) {
        let (deltas, _) = run(&ops);
        // Three replicas that each saw some of the deltas.
        let mut parts = [Vec::new(), Vec::new(), Vec::new()];
        for (i, d) in deltas.into_iter().enumerate() {
            parts[split.get(i).copied().unwrap_or(0)].push(d);
        }
        let [a, b, c] = [0, 1, 2].map(|i| replica_with("r", &parts[i]));
        let joined = |xs: &[&Counters]| {
            let mut r = Counters::new(actor("r"));
            for x in xs { merge(&mut r, x); }
            r
        };
        prop_assert_eq!(state(&joined(&[&a, &b])), state(&joined(&[&b, &a])));
        let ab = joined(&[&a, &b]);
        let bc = joined(&[&b, &c]);
        prop_assert_eq!(state(&joined(&[&ab, &c])), state(&joined(&[&a, &bc])));
        let mut again = joined(&[&a, &b]);
        merge(&mut again, &a);
        merge(&mut again, &ab);
        prop_assert_eq!(state(&again), state(&ab));
    }

    /// Counts with actors interned and freed (many actors, slots forgotten as time goes)
    /// read exactly as a plain map of (slot, actor) to the largest count applied.
    #[test]
    fn counters_read_as_a_plain_map_through_forgets(
        ops in proptest::collection::vec((0usize..6, 0u64..8, 0u64..50, any::<bool>()), 1..150),
    ) {
        use std::collections::HashMap;
        let actors: Vec<Actor> = (0..6).map(|i| Actor::new(format!("n{}", i % 3), i as u64 / 3)).collect();
        let mut c = Counters::new(actors[0].clone());
        let mut model: HashMap<(u64, Actor), u64> = HashMap::new();
        let mut floor = 0;
        for (who, s, n, forget) in ops {
            if forget {
                floor = floor.max(s);
                c.forget_before("api", s);
                model.retain(|(slot, _), _| *slot >= s);
                continue;
            }
            if who == 0 {
                // Own counts are kept below the floor too (the caller adds only to current
                // slots).
                c.add(slot("k", s), n);
                if n > 0 {
                    *model.entry((s, actors[0].clone())).or_default() += n;
                }
            } else {
                c.apply(slot("k", s), Dot::new(actors[who].clone(), n));
                if s >= floor && n > 0 {
                    let m = model.entry((s, actors[who].clone())).or_default();
                    *m = (*m).max(n);
                }
            }
            for x in 0..8 {
                let total: u64 = model.iter().filter(|((y, _), _)| *y == x).map(|(_, n)| n).sum();
                prop_assert_eq!(c.total(&slot("k", x)), total);
                for a in &actors {
                    let want = model.get(&(x, a.clone())).copied().unwrap_or(0);
                    prop_assert_eq!(c.count(&slot("k", x), a), want);
                }
            }
            let live: std::collections::HashSet<&Actor> = model.keys().map(|(_, a)| a).collect();
            prop_assert_eq!(c.actors(), 1 + live.iter().filter(|a| ***a != actors[0]).count());
        }
    }

    /// Two replicas that each missed some deltas converge after one exchange of digests
    /// and repairs.
    #[test]
    fn anti_entropy_converges_replicas_that_missed_deltas(
        ops in proptest::collection::vec((0usize..3, 0u64..40, 1u64..50), 1..200),
        lost in proptest::collection::vec(any::<bool>(), 0..200),
    ) {
        let (deltas, totals) = {
            let mut replicas: Vec<Counters> =
                ["a", "b", "c"].iter().map(|n| Counters::new(actor(n))).collect();
            let mut totals = std::collections::HashMap::new();
            let mut deltas = Vec::new();
            for &(who, s, n) in &ops {
                let id = slot(&format!("k{}", s % 7), s);
                let dot = replicas[who].add(id.clone(), n);
                deltas.push((id, vec![dot]));
                *totals.entry(slot(&format!("k{}", s % 7), s)).or_insert(0) += n;
            }
            (deltas, totals)
        };
        let (mut x, mut y) = (Counters::new(actor("x")), Counters::new(actor("y")));
        for (i, d) in deltas.into_iter().enumerate() {
            // Each delta reaches x, y, or both; none is lost by both.
            match (lost.get(i).copied().unwrap_or(false), i % 2 == 0) {
                (true, true) => { x.apply_all([d]); }
                (true, false) => { y.apply_all([d]); }
                (false, _) => { x.apply_all([d.clone()]); y.apply_all([d]); }
            }
        }
        anti_entropy(&mut x, &mut y);
        prop_assert_eq!(state(&x), state(&y));
        for (id, t) in totals {
            prop_assert_eq!(x.total(&id), t);
        }
    }
}

#[test]
fn peers_cannot_raise_this_nodes_own_count_through_a_batch() {
    let mut c = Counters::new(actor("a"));
    c.add(slot("k", 0), 1);
    let changed = c.apply_all([(
        slot("k", 0),
        vec![Dot::new(actor("a"), 50), Dot::new(actor("b"), 2)],
    )]);
    assert_eq!(changed, 1);
    assert_eq!((c.own(&slot("k", 0)), c.total(&slot("k", 0))), (1, 3));
    assert_eq!(c.refused(), 1);
}
