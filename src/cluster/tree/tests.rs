//! The aggregation tree: its shape, its grants, its refusals, and the simulation's seeds.

use super::sim::{LEAVE_WAIT, TreeSetup, TreeSim, run, scale};
use super::*;
use crate::cluster::sim::START;
use crate::limiter::SECOND;

const MS: Nanos = MILLISECOND;

fn window(c: u64) -> Vec<(String, Limit)> {
    vec![(
        "w".to_owned(),
        Limit::new(Algorithm::FixedWindow, c, SECOND, None).expect("valid"),
    )]
}

/// The seeds CI runs (`gossamer sim --tree --seeds 1..10001` runs more).
const CI_SEEDS: std::ops::RangeInclusive<u64> = 1..=40;

/// Seeds the sweep found breaking an invariant once, run in CI too. 899: a node that left on
/// purpose still reported a base in its counts after giving up its claims, so the others'
/// unclaimed bases were counted short and a window admitted 255 of 250.
const REGRESSION_SEEDS: [u64; 1] = [899];

#[test]
fn fixed_seeds_keep_every_invariant() {
    let mut failed = Vec::new();
    for seed in CI_SEEDS.chain(REGRESSION_SEEDS) {
        let setup = TreeSetup::from_seed(seed);
        let outcome = run(&setup);
        if !outcome.violations.is_empty() {
            failed.push(outcome.describe(&setup));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// Units admitted of key `k` in slot `slot` (counted from the simulation's start).
fn admitted_in(sim: &TreeSim, slot: u64) -> u64 {
    sim.admitted
        .get(&("w".to_owned(), "k".to_owned(), START / SECOND + slot))
        .copied()
        .unwrap_or(0)
}

/// Found in review: A pauses, so B's view becomes {B}; B pauses and A resumes, so A's view
/// becomes {A}, and A admits the whole limit of the next slot alone; A pauses and B
/// resumes. B's view is still {B}, unchanged, so no departure freezes it, and no totals
/// carry A's charge. B froze anyway: it found several boundaries due at once.
#[test]
fn a_node_back_from_a_pause_grants_nothing_where_others_may_hold_room() {
    let mut sim = TreeSim::new(3, window(100), TreeParams::default(), 11);
    sim.view_lag = (50 * MS, 50 * MS);
    sim.advance(2 * SECOND);
    sim.crash(2);
    sim.advance(SECOND + 100 * MS); // +3.1 s: slot 3
    sim.pause(0, true);
    sim.advance(200 * MS);
    sim.pause(1, true);
    sim.pause(0, false);
    sim.advance(800 * MS); // +4.1 s: slot 4, node 0 alone
    for _ in 0..300 {
        sim.advance(MS);
        sim.check(0, "w", "k", 1);
    }
    let alone = admitted_in(&sim, 4);
    assert!(alone >= 50, "node 0 admitted {alone} alone");
    sim.pause(0, true);
    sim.pause(1, false);
    for _ in 0..500 {
        sim.advance(MS);
        sim.check(1, "w", "k", 1);
    }
    assert!(
        admitted_in(&sim, 4) <= 100,
        "{} in slot 4",
        admitted_in(&sim, 4)
    );
    assert!(sim.node(1).expect("up").stats().gaps > 0);
}

/// Node 3 pauses after node 1's first incarnation left its view and before the second
/// joined; the second admits in slot 3 and pauses; node 3 resumes to a view of the same
/// members as before its pause. It must not grant itself slot 3's room, which the totals
/// no longer show held: its gap freezes it, and so do the others' freezes in the totals.
#[test]
fn a_node_away_while_another_came_and_went_grants_nothing_where_it_held_room() {
    let mut sim = TreeSim::new(4, window(100), TreeParams::default(), 13);
    sim.view_lag = (50 * MS, 50 * MS);
    sim.advance(2 * SECOND);
    sim.crash(1);
    sim.advance(100 * MS);
    sim.pause(3, true);
    sim.advance(100 * MS);
    sim.restart(1);
    sim.advance(800 * MS); // +3.0 s: slot 3
    for _ in 0..400 {
        sim.advance(MS);
        sim.check(1, "w", "k", 1);
    }
    let before = admitted_in(&sim, 3);
    assert!(before >= 50, "node 1 admitted {before}");
    sim.pause(1, true);
    sim.advance(100 * MS);
    sim.pause(3, false);
    for _ in 0..450 {
        sim.advance(MS);
        sim.check(3, "w", "k", 1);
        sim.check(0, "w", "k", 1);
    }
    assert!(
        admitted_in(&sim, 3) <= 100,
        "{} in slot 3",
        admitted_in(&sim, 3)
    );
}

#[test]
fn every_member_but_the_root_has_one_parent_and_the_root_waits_a_hop_per_level() {
    let me = Actor::new("n0", 1);
    let tree = Tree::new(me, window(10), TreeParams::default(), 0).expect("valid");
    for len in [1, 2, 8, 9, 73, 1000] {
        // Every position but the root is the child of exactly one, its parent.
        let mut parents = vec![0usize; len];
        for q in 0..len {
            for c in tree.shape(q, len).0 {
                assert_eq!((c - 1) / DEFAULT_FANOUT, q, "{c} of {len}");
                parents[c] += 1;
            }
        }
        assert_eq!(parents[0], 0);
        assert!(parents.iter().skip(1).all(|&c| c == 1), "{len}");
        let (_, levels) = tree.shape(0, len);
        let depth = (1..len)
            .map(|mut p| {
                let mut d = 0;
                while p > 0 {
                    p = (p - 1) / DEFAULT_FANOUT;
                    d += 1;
                }
                d
            })
            .max()
            .unwrap_or(0);
        assert_eq!(levels, depth, "{len}");
    }
}

/// Two rounds on three nodes: the node with twice the demand gets more of the room, the
/// node without demand less (what it keeps of its base: its escrow), and the grants sum to
/// the limit, not past it.
#[test]
fn grants_follow_demand_and_sum_to_at_most_the_free_room() {
    let mut sim = TreeSim::new(3, window(90), TreeParams::default(), 1);
    sim.advance(2 * SECOND);
    // Round 1 of slot 2: demand at nodes 0 and 1 only, twice as much at node 1.
    for _ in 0..2 {
        for _ in 0..10 {
            sim.check(0, "w", "k", 1);
            sim.check(1, "w", "k", 1);
            sim.check(1, "w", "k", 1);
        }
        sim.advance(100 * MS);
    }
    // The second round's grants (the first split evenly: no node had totals of the key).
    sim.advance(50 * MS);
    let slot = sim.clock(0) / SECOND;
    let held: Vec<u64> = (0..3)
        .map(|i| {
            let t = sim.node(i).expect("up");
            t.keys.rules["w"].keys.read("k", |k| {
                k.and_then(|k| k.slots.get(&slot))
                    .map_or(0, |s| s.held + s.admitted)
            })
        })
        .collect();
    assert!(held.iter().sum::<u64>() <= 90, "{held:?}");
    assert!(held[1] > held[0] && held[0] > held[2], "{held:?}");
    // Scaled by intervals of the raw grants, the second round hands out the rest exactly.
    assert_eq!(held.iter().sum::<u64>(), 90, "{held:?}");
}

/// Under load at many times the limit, no window admits more than the limit, and a
/// window of the load admits nearly all of it.
#[test]
fn a_window_admits_the_limit_and_no_more() {
    for nodes in [1, 2, 5, 17] {
        let mut sim = TreeSim::new(nodes, window(100), TreeParams::default(), 3);
        sim.advance(2 * SECOND);
        for ms in 0..3000 {
            sim.advance(MS);
            sim.check(ms % nodes, "w", "k", 1);
        }
        let windows: Vec<u64> = sim.admitted.values().copied().collect();
        assert!(windows.iter().all(|&w| w <= 100), "{nodes}: {windows:?}");
        // The first window waits for its first grant; the last is cut short.
        let whole = &windows[1..windows.len() - 1];
        assert!(
            whole.len() >= 2 && whole.iter().all(|&w| w >= 90),
            "{nodes}: {windows:?}"
        );
    }
}

/// A node that just started grants itself nothing in the slot it started in nor in the
/// next one (its last incarnation may hold room there), and then takes part.
#[test]
fn a_restarted_node_waits_out_its_old_incarnation_slots() {
    let mut sim = TreeSim::new(3, window(100), TreeParams::default(), 5);
    sim.advance(2 * SECOND + 500 * MS);
    sim.restart(2);
    let started = sim.clock(2) / SECOND;
    let mut first = None;
    for _ in 0..3000 {
        sim.advance(MS);
        if sim.check(2, "w", "k", 1) && first.is_none() {
            first = Some(sim.clock(2) / SECOND);
        }
    }
    let first = first.expect("admits again");
    assert!(
        first > started,
        "first admitted in slot {first}, started in {started}"
    );
    assert!(
        first <= started + 2,
        "first admitted in slot {first}, started in {started}"
    );
}

/// Traffic per node does not grow with the cluster: from 10 to 100 nodes, with the same
/// keys, the mean bytes per node fall and the most any node sends stays within a small
/// factor (the root and inner nodes carry their subtree's keys). The full mesh grows ×8.
#[test]
fn bytes_per_node_do_not_grow_with_the_cluster() {
    let small = scale(10, 10, 7);
    let large = scale(100, 10, 7);
    assert!(
        large.bytes_per_node_second < small.bytes_per_node_second * 1.5,
        "{small:?} {large:?}"
    );
    assert!(
        large.max_bytes_per_node_second < small.max_bytes_per_node_second * 3.0,
        "{small:?} {large:?}"
    );
    assert!(large.messages_per_node_second <= 20.0, "{large:?}");
    assert!(small.worst_window <= 1000 && large.worst_window <= 1000);
}

#[test]
fn bad_rules_and_fanouts_are_refused() {
    let me = Actor::new("n0", 1);
    let bucket = vec![(
        "b".to_owned(),
        Limit::new(Algorithm::TokenBucket, 10, SECOND, None).expect("valid"),
    )];
    assert_eq!(
        Tree::new(me.clone(), bucket, TreeParams::default(), 0).err(),
        Some(TreeError::Unsupported("b".to_owned()))
    );
    let params = TreeParams {
        fanout: 1,
        ..TreeParams::default()
    };
    assert_eq!(
        Tree::new(me, window(1), params, 0).err(),
        Some(TreeError::Fanout(1))
    );
}

/// A message naming another sender than the authenticated peer is refused; one from a
/// node that is not this node's child (or parent) in the round, or of another view, or
/// with a member count no subtree has, changes nothing.
#[test]
fn messages_from_the_wrong_place_change_nothing() {
    let members: Vec<Actor> = (0..3).map(|i| Actor::new(format!("n{i}"), 1)).collect();
    let mut t =
        Tree::new(members[0].clone(), window(100), TreeParams::default(), 0).expect("valid");
    t.set_members(&members, 0);
    let round = 100 * MS;
    let _ = t.tick(round);
    // Round 1: positions rotate by one, so n0 is at position 2: a leaf whose parent is n1
    // (position 0, the root).
    let sums = |from: &Actor, members: u64, view: u64| {
        let mut s = one_entry(from, 1, 0, 16, 100);
        s.view = view;
        s.members = members;
        s
    };
    let view = t.view();
    assert_eq!(
        t.receive("n2", Message::TreeDown(sums(&members[1], 3, view))),
        Err(Reject::Impostor)
    );
    assert_eq!(
        t.receive(
            "n1",
            Message::Repair {
                from: members[1].clone(),
                entries: Vec::new(),
            }
        ),
        Err(Reject::Unexpected)
    );
    let before = t.stats().clone();
    for (peer, message) in [
        ("n2", Message::TreeDown(sums(&members[2], 3, view))),
        ("n1", Message::TreeDown(sums(&members[1], 3, view ^ 1))),
        ("n1", Message::TreeDown(sums(&members[1], 4, view))),
        ("n1", Message::TreeUp(sums(&members[1], 1, view))),
    ] {
        assert_eq!(t.receive(peer, message), Ok(Vec::new()));
    }
    assert_eq!(t.stats().ignored, before.ignored + 4);
    assert_eq!(t.stats().complete_rounds, before.complete_rounds);
    // The real parent's totals are taken.
    assert!(
        t.receive("n1", Message::TreeDown(sums(&members[1], 3, view)))
            .is_ok()
    );
    assert_eq!(t.stats().complete_rounds, before.complete_rounds + 1);
    // Round 3: n0 is the root, its children n1 and n2. Sums from a stranger, or claiming
    // the whole view, or with a freeze past the next round, are not taken.
    let _ = t.tick(3 * round);
    let round3 = |from: &Actor, members: u64| {
        let mut s = sums(from, members, view);
        s.round = 3;
        s
    };
    let stranger = Actor::new("n9", 1);
    let mut late_freeze = round3(&members[1], 1);
    late_freeze.freeze = 6;
    assert_eq!(
        t.receive("n1", Message::TreeUp(late_freeze)),
        Err(Reject::RoundOutOfRange)
    );
    let ignored = t.stats().ignored;
    for (peer, message) in [
        ("n9", Message::TreeUp(round3(&stranger, 1))),
        ("n1", Message::TreeUp(round3(&members[1], 3))),
    ] {
        assert_eq!(t.receive(peer, message), Ok(Vec::new()));
    }
    assert_eq!(t.stats().ignored, ignored + 2);
    // Both real children: the root completes the round and sends each its totals.
    let out1 = t.receive("n1", Message::TreeUp(round3(&members[1], 1)));
    assert_eq!(out1, Ok(Vec::new()), "waits for n2");
    let out2 = t
        .receive("n2", Message::TreeUp(round3(&members[2], 1)))
        .expect("taken");
    assert_eq!(out2.len(), 2, "{out2:?}");
    assert_eq!(t.stats().complete_rounds, before.complete_rounds + 2);
}

/// Sums larger than a frame go in parts, and a round completes (and grants) only once every
/// part is in; a part with a part number past its count is refused.
#[test]
fn sums_larger_than_a_frame_go_in_parts() {
    let mut sim = TreeSim::new(2, window(1_000_000), TreeParams::default(), 9);
    sim.advance(2 * SECOND);
    // 12,000 keys of 80 bytes at node 0: over a megabyte of sums a round.
    let keys: Vec<String> = (0..12_000).map(|i| format!("{i:080}")).collect();
    for k in &keys {
        sim.check(0, "w", k, 1);
    }
    let (sent, complete) = (
        sim.messages_sent[0],
        sim.node(0).expect("up").stats().complete_rounds,
    );
    // The boundary at +100 ms sends the sums; the round's totals are back a few ms later.
    sim.advance(150 * MS);
    let t = sim.node(0).expect("up");
    assert!(
        sim.messages_sent[0] - sent >= 3,
        "{} messages",
        sim.messages_sent[0] - sent
    );
    assert_eq!(t.stats().complete_rounds, complete + 2, "{:?}", t.stats());
    assert_eq!(t.stats().oversized, 0);
    // The grants came with the last part: every key is admitted now.
    assert!(keys.iter().all(|k| sim.check(0, "w", k, 1)));

    let me = Actor::new("n0", 1);
    let mut t = Tree::new(me, window(10), TreeParams::default(), 0).expect("valid");
    let bad = TreeSums {
        from: Actor::new("n1", 1),
        round: 1,
        view: 0,
        members: 1,
        freeze: 0,
        vouch: u64::MAX,
        since: 0,
        bases: Vec::new(),
        part: 2,
        parts: 2,
        entries: Vec::new(),
    };
    assert_eq!(t.receive("n1", Message::TreeUp(bad)), Err(Reject::BadParts));
}

/// What the engine gets from a check over the tree, on one node alone in its view (the root
/// and its own only member: its sums are the totals at once): a cost above the limit is
/// `Never`; a key's first check is admitted at once from the node's base (the whole limit,
/// alone), `remaining` counting its own admissions; past the limit a check is denied until
/// the slot ends; `status` charges nothing; a new key past `max_keys` is refused.
#[test]
fn a_lone_node_answers_checks_with_the_whole_decision() {
    let me = Actor::new("n0", 1);
    let params = TreeParams {
        max_keys: 2,
        ..TreeParams::default()
    };
    let round = params.round;
    let mut tree = Tree::new(me.clone(), window(10), params, START).expect("valid");
    tree.set_members(std::slice::from_ref(&me), START);
    // Past the start's freeze (the slots a previous incarnation could hold room in), a
    // round at a time (three boundaries at once would freeze as a pause does).
    let mut now = START;
    while now < START + 3 * SECOND {
        now += round;
        tree.tick(now);
    }
    let keys = tree.keys();
    now += round / 2;
    let never = keys.decide("w", "k", 11, now).unwrap().unwrap();
    assert_eq!((never.verdict, never.remaining), (Verdict::Never, 10));
    for left in (0..=9).rev() {
        let d = keys.decide("w", "k", 1, now).unwrap().unwrap();
        assert_eq!(d.verdict, Verdict::Admit { wait: 0 }, "{left} left");
        assert_eq!((d.limit, d.remaining), (10, left));
        assert_eq!(d.reset_after, SECOND - round / 2, "the slot ends at +4 s");
    }
    assert_eq!(tree.stats().granted, 0, "served from the base, not a grant");
    let over = keys.decide("w", "k", 1, now).unwrap().unwrap();
    assert_eq!(
        (over.verdict, over.remaining),
        (
            Verdict::Deny {
                retry_after: SECOND - round / 2
            },
            0
        ),
        "nothing left in the slot: retry when it ends"
    );
    let status = keys.status("w", "k", now).unwrap();
    assert_eq!(
        status,
        keys.status("w", "k", now).unwrap(),
        "status charges nothing"
    );
    assert_eq!((status.allowed(), status.remaining), (false, 0));
    // A fresh key's slot holds the base too.
    let fresh = keys.status("w", "other", now).unwrap();
    assert_eq!((fresh.allowed(), fresh.remaining), (true, 10));
    assert!(keys.decide("w", "k2", 1, now).unwrap().is_ok());
    assert_eq!(
        keys.decide("w", "k3", 1, now),
        Some(Err(Full)),
        "max_keys is 2"
    );
    assert_eq!(keys.rule_keys("w"), 2);
    assert_eq!(keys.decide("nope", "k", 1, now), None);
    // The boundary reports the base taken; alone, the node grants itself nothing more.
    now += round / 2;
    assert!(tree.tick(now).is_empty(), "nothing to send alone");
    assert_eq!(tree.stats().granted, 0);
}

/// A new peer's greeting is accepted (it changes nothing); one naming another sender is an
/// impostor's.
#[test]
fn a_greeting_changes_nothing_and_must_name_its_sender() {
    let me = Actor::new("n0", 1);
    let mut tree = Tree::new(me.clone(), window(10), TreeParams::default(), START).expect("valid");
    tree.set_members(&[me.clone(), Actor::new("n1", 1)], START);
    let hello = |node: &str| Message::Hello {
        from: Actor::new(node, 1),
        rules_hash: 0,
    };
    assert_eq!(tree.receive("n1", hello("n1")), Ok(Vec::new()));
    assert_eq!(tree.receive("n1", hello("n2")), Err(Reject::Impostor));
    assert_eq!(tree.stats(), &TreeStats::default());
}

/// In a frozen slot (here: a member left the view without handing its admissions over, so
/// it may hold room there) no grant comes: a check with room left in the totals is told to
/// retry when the slot ends, not after the next round. Found by the real-network suite:
/// under a 1-day window the retry said 100 ms all day.
#[test]
fn a_check_in_a_frozen_slot_is_told_to_retry_when_it_ends() {
    let me = Actor::new("n0", 1);
    let tree = {
        let mut t = Tree::new(me.clone(), window(10), TreeParams::default(), START).expect("valid");
        t.set_members(&[me.clone(), Actor::new("n1", 1)], START);
        t.set_members(std::slice::from_ref(&me), START + 5 * MS);
        t
    };
    let now = START + 10 * MS;
    let d = tree.keys().decide("w", "k", 1, now).unwrap().unwrap();
    assert_eq!(
        d.verdict,
        Verdict::Deny {
            retry_after: SECOND - 10 * MS
        }
    );
    assert_eq!(d.remaining, 10);
    let s = tree.keys().status("w", "k", now).unwrap();
    assert_eq!(
        s.verdict,
        Verdict::Deny {
            retry_after: SECOND - 10 * MS
        }
    );
}

/// Sums from `from` for `round`, of one member, with one entry: key `k` of rule `w` in slot
/// 0, with these `admitted`, `demand` and `raw`.
fn one_entry(from: &Actor, round: u64, admitted: u64, demand: u64, raw: u64) -> TreeSums {
    TreeSums {
        from: from.clone(),
        round,
        view: 0,
        members: 1,
        freeze: 0,
        vouch: u64::MAX,
        since: 0,
        bases: Vec::new(),
        part: 0,
        parts: 1,
        entries: vec![TreeEntry {
            rule: "w".to_owned(),
            key: "k".to_owned(),
            slot: 0,
            admitted,
            held: 0,
            demand,
            raw,
            offset: 0,
            based: 0,
        }],
    }
}

/// Checks `key` once a millisecond for `ms` milliseconds, at each of `nodes` in turn.
fn hammer(sim: &mut TreeSim, nodes: &[usize], key: &str, ms: u64) {
    for t in 0..ms {
        sim.advance(MS);
        sim.check(nodes[t as usize % nodes.len()], "w", key, 1);
    }
}

/// Units admitted of `key` in `slot` (counted from the simulation's start).
fn admitted_of(sim: &TreeSim, key: &str, slot: u64) -> u64 {
    sim.admitted
        .get(&("w".to_owned(), key.to_owned(), START / SECOND + slot))
        .copied()
        .unwrap_or(0)
}

/// Node 2 admits 40 of a window of 100 and leaves, then nodes 0 and 1 want the rest of the
/// window. Left on purpose (its carrier takes its 40), nothing freezes: the window admits
/// exactly 100. Crashed, the window is frozen: the others hold nothing of the key, so it
/// stays at 40 until it ends. The same when the carrier never answers (the leaving node
/// gives up and leaves as after a crash).
#[test]
fn a_node_that_leaves_on_purpose_hands_over_its_count_and_freezes_nothing() {
    let run = |how: &str| {
        let mut sim = TreeSim::new(3, window(100), TreeParams::default(), 21);
        sim.view_lag = (50 * MS, 50 * MS);
        sim.advance(2 * SECOND);
        // Slot 2: node 2 alone checks the key, 40 times.
        let mut n = 0;
        while n < 40 {
            sim.advance(MS);
            if sim.check(2, "w", "k", 1) {
                n += 1;
            }
        }
        assert!(sim.clock(2) < START + 2 * SECOND + 300 * MS);
        sim.advance(300 * MS - (sim.now - START - 2 * SECOND));
        match how {
            "leave" => sim.leave(2),
            "unanswered" => {
                sim.net.loss = 1000;
                sim.leave(2);
            }
            _ => sim.crash(2),
        }
        sim.advance(LEAVE_WAIT + 50 * MS);
        sim.net.loss = 0;
        assert!(sim.node(2).is_none(), "{how}: node 2 is gone");
        hammer(&mut sim, &[0, 1], "k", 1000 - 300 - 550 - 1);
        let stats = sim.node(0).expect("up").stats().clone();
        (admitted_of(&sim, "k", 2), stats)
    };
    let (left, stats) = run("leave");
    assert_eq!(left, 100, "{stats:?}");
    assert_eq!(stats.left_carried, 1, "{stats:?}");
    // A crash freezes the slot: the survivors spend what they hold, their bases (what the
    // node's demand left them of the escrow) included, and no more.
    let (crashed, _) = run("crash");
    assert!(crashed > 40 && crashed <= 100, "{crashed}");
    let (unanswered, stats) = run("unanswered");
    assert!(
        unanswered > 40 && unanswered <= 100,
        "{unanswered} {stats:?}"
    );
    assert_eq!(stats.left_carried, 0);
}

/// A node restarted after leaving on purpose finds members that saw every round since
/// before its slot opened: its start freeze is lifted at its first complete round, and it
/// admits a new key within the slot it started in. The window still admits no more than
/// its limit. Restarted after a crash, the survivors froze the slot.
#[test]
fn a_node_back_after_leaving_on_purpose_serves_the_slot_it_started_in() {
    let mut sim = TreeSim::new(3, window(100), TreeParams::default(), 23);
    sim.view_lag = (50 * MS, 50 * MS);
    sim.advance(2 * SECOND);
    hammer(&mut sim, &[0, 1, 2], "k", 30);
    sim.leave(2);
    // It stays until the round from which its carrier reports its admissions.
    sim.advance(250 * MS);
    assert!(sim.node(2).is_some());
    sim.advance(150 * MS);
    assert!(sim.node(2).is_none());
    sim.restart(2);
    assert!(!sim.node(2).expect("up").stats().vouched);
    let started = sim.clock(2) / SECOND;
    let mut first = None;
    for _ in 0..600 {
        sim.advance(MS);
        if sim.check(2, "w", "new", 1) && first.is_none() {
            first = Some(sim.clock(2) / SECOND);
        }
        sim.check(0, "w", "k", 1);
        sim.check(2, "w", "k", 1);
    }
    assert!(sim.node(2).expect("up").stats().vouched);
    assert_eq!(first, Some(started), "admitted in the slot it started in");
    assert!(admitted_of(&sim, "k", 2) <= 100);
    assert!(admitted_of(&sim, "new", 2) <= 100);
}

/// When every node restarts at once, nobody saw the rounds that granted the previous
/// incarnations room, and the counts of the slot open then went with them: the first
/// complete round lifts every start freeze with no member vouching, and the slot starts
/// afresh, as a standalone node's window does when it restarts (design §2.4, "Lost with
/// every node"). It is served within a few rounds of the restart, and admits at most its
/// limit anew.
#[test]
fn a_cluster_restarted_whole_starts_the_open_slot_afresh() {
    let mut sim = TreeSim::new(3, window(100), TreeParams::default(), 25);
    sim.view_lag = (50 * MS, 50 * MS);
    sim.advance(SECOND + 500 * MS);
    hammer(&mut sim, &[0, 1, 2], "k", 550);
    let before = admitted_of(&sim, "k", 2);
    assert!(before > 0);
    // A power cut: every node down, back 20 ms later in slot 2 (+2.07 s; slot 3 opens at
    // +3 s).
    for i in 0..3 {
        sim.crash(i);
    }
    sim.advance(20 * MS);
    for i in 0..3 {
        sim.restart(i);
        assert!(sim.node(i).expect("up").start_frozen());
    }
    let restarted = sim.now;
    let mut first = None;
    for t in 0..900u64 {
        sim.advance(MS);
        if sim.check((t % 3) as usize, "w", "k", 1) && first.is_none() {
            first = Some(sim.now - restarted);
        }
    }
    for i in 0..3 {
        let t = sim.node(i).expect("up");
        assert!(
            !t.start_frozen() && !t.stats().vouched,
            "n{i}: {:?}",
            t.stats()
        );
    }
    let first = first.expect("the slot it restarted in is served");
    assert!(
        first <= 300 * MS,
        "first admitted {} ms after the restart",
        first / MS
    );
    let anew = admitted_of(&sim, "k", 2) - before;
    assert!(anew > 0 && anew <= 100, "{anew} admitted anew");
}

/// A node restarts after a crash, and the survivors, which saw its previous incarnation's
/// rounds, crash before it completes a round with them. They left its view, which froze
/// the open slot here: it admits nothing more there, though the cluster was never down
/// whole, and serves the next slot. (Its start freeze alone would not cover this, since its
/// first complete round, alone, lifts it.)
#[test]
fn a_node_whose_survivors_crash_before_its_first_round_keeps_their_slot_frozen() {
    let mut sim = TreeSim::new(3, window(100), TreeParams::default(), 27);
    sim.view_lag = (50 * MS, 50 * MS);
    sim.advance(SECOND + 200 * MS);
    let mut n = 0;
    while n < 30 {
        sim.advance(MS);
        if sim.check((n % 3) as usize, "w", "k", 1) {
            n += 1;
        }
    }
    assert!(sim.now < START + SECOND + 400 * MS);
    sim.crash(2);
    sim.advance(20 * MS);
    sim.restart(2);
    sim.advance(10 * MS);
    sim.crash(0);
    sim.crash(1);
    assert!(sim.node(2).expect("up").start_frozen());
    hammer(&mut sim, &[2], "k", 1_500 - 230 - 400);
    let t = sim.node(2).expect("up");
    assert!(!t.start_frozen() && !t.stats().vouched, "{:?}", t.stats());
    assert_eq!(
        admitted_of(&sim, "k", 1),
        30,
        "nothing more in the frozen slot"
    );
    assert!(admitted_of(&sim, "k", 2) > 0, "serves the next slot");
}

/// A carrier takes a handoff once, answers it every time it is sent (its answer may have
/// been lost), and refuses one from a peer that is not in its view, one that names
/// another sender, and one whose round it already passed.
#[test]
fn a_carrier_takes_a_handoff_once_and_refuses_bad_ones() {
    let members: Vec<Actor> = (0..3).map(|i| Actor::new(format!("n{i}"), 1)).collect();
    let mut t =
        Tree::new(members[0].clone(), window(100), TreeParams::default(), 0).expect("valid");
    t.set_members(&members, 0);
    let handoff = |from: &Actor, round: u64| Message::TreeHandoff(one_entry(from, round, 7, 0, 0));
    let answer = Output::To(
        "n1".to_owned(),
        Message::TreeCarried {
            from: members[0].clone(),
            round: 3,
        },
    );
    assert_eq!(
        t.receive("n1", handoff(&members[1], 3)),
        Ok(vec![answer.clone()])
    );
    assert_eq!(t.receive("n1", handoff(&members[1], 3)), Ok(vec![answer]));
    assert_eq!(t.stats().taken, 1);
    assert_eq!(
        t.receive("n2", handoff(&members[1], 3)),
        Err(Reject::Impostor)
    );
    let stranger = Actor::new("n9", 1);
    assert_eq!(t.receive("n9", handoff(&stranger, 3)), Ok(Vec::new()));
    // Rounds 1 and 2 pass: round 2's handoff comes too late for this node to report it
    // from that round.
    let _ = t.tick(250 * MS);
    assert_eq!(t.receive("n2", handoff(&members[2], 2)), Ok(Vec::new()));
    assert_eq!(t.stats().taken, 1);
    // The 7 units are this node's own from round 3: in its sums, once.
    let out = t.tick(300 * MS);
    let reported: Vec<u64> = out
        .iter()
        .filter_map(|o| match o {
            Output::To(_, Message::TreeUp(s)) => Some(s.entries.iter().map(|e| e.admitted).sum()),
            _ => None,
        })
        .collect();
    assert!(reported.iter().all(|&a| a == 7), "{reported:?}");
}

/// A leaving node admits nothing more, gives back what it holds, and once its carrier
/// answered it reports none of its admissions from the handoff's round on.
#[test]
fn a_leaving_node_admits_nothing_and_stops_reporting_once_carried() {
    let members: Vec<Actor> = (0..2).map(|i| Actor::new(format!("n{i}"), 1)).collect();
    let mut t =
        Tree::new(members[0].clone(), window(100), TreeParams::default(), 0).expect("valid");
    t.set_members(&members, 0);
    let out = t.leave(10 * MS);
    assert!(matches!(
        out.as_slice(),
        [Output::To(to, Message::TreeHandoff(h))] if to == "n1" && h.round == 3
    ));
    assert!(
        !t.keys()
            .decide("w", "k", 1, 20 * MS)
            .unwrap()
            .unwrap()
            .allowed()
    );
    assert_eq!(t.carried(), None);
    // Not answered: sent again a round later.
    assert!(
        t.tick(110 * MS)
            .iter()
            .any(|o| matches!(o, Output::To(_, Message::TreeHandoff(_))))
    );
    t.receive(
        "n1",
        Message::TreeCarried {
            from: members[1].clone(),
            round: 3,
        },
    )
    .expect("an answer");
    assert_eq!(t.carried(), Some((members[1].clone(), 3)));
    assert!(
        t.tick(210 * MS)
            .iter()
            .all(|o| !matches!(o, Output::To(_, Message::TreeHandoff(_))))
    );
}

/// A member that leaves the view freezes nothing only if its carrier is still in the view
/// and reports its admissions in every round of the new view; otherwise the open slots
/// freeze as after a crash.
#[test]
fn a_handoff_spares_the_freeze_only_when_the_carrier_reports_every_new_round() {
    let members: Vec<Actor> = (0..3).map(|i| Actor::new(format!("n{i}"), 1)).collect();
    let left_carried = |carrier: usize, from: u64| {
        let mut t =
            Tree::new(members[0].clone(), window(100), TreeParams::default(), 0).expect("valid");
        t.set_members(&members, 0);
        t.handed_off(members[2].clone(), members[carrier].clone(), from);
        // At 0.25 s the new view's first round is round 3.
        t.set_members(&members[..2], 250 * MS);
        t.stats().left_carried
    };
    assert_eq!(left_carried(1, 3), 1);
    assert_eq!(left_carried(0, 2), 1);
    // The carrier reports them from round 4: round 3 would count them nowhere.
    assert_eq!(left_carried(1, 4), 0);
    // The carrier left too.
    assert_eq!(left_carried(2, 3), 0);
}

/// The quiet users' rules: fixed windows (all the tree runs) of 60 per second, as the
/// mesh's tiers, and of 60 per 10 s, whose slot spans a hundred rounds.
fn quiet_rules() -> Vec<(String, Limit)> {
    let fixed = |c, len| Limit::new(Algorithm::FixedWindow, c, len, None).expect("valid");
    vec![
        ("fixed 60/s".to_owned(), fixed(60, SECOND)),
        ("fixed 60/10 s".to_owned(), fixed(60, 10 * SECOND)),
    ]
}

/// When [`tree_quiet_users`] starts its load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum QuietFrom {
    /// At once, as the nodes start (together: no start freeze is lifted, so each waits out
    /// the slots it started in).
    Start,
    /// Once every node has applied a complete round.
    Round,
    /// Once the slots of the start freeze have ended (in every rule) and every node has
    /// applied a complete round since.
    Thawed,
}

/// Runs the cluster until every node has applied a complete round past the ones it had.
fn until_a_complete_round(sim: &mut TreeSim, nodes: usize) {
    let before: Vec<u64> = (0..nodes)
        .map(|i| sim.node(i).expect("up").stats().complete_rounds)
        .collect();
    let done = |sim: &TreeSim| {
        (0..nodes).all(|i| sim.node(i).expect("up").stats().complete_rounds > before[i])
    };
    for _ in 0..2000 {
        if done(sim) {
            return;
        }
        sim.advance(MS);
    }
    panic!("no complete round at every node in 2 s");
}

/// What [`tree_quiet_users`] found for one rule.
struct Quiet {
    rule: String,
    judge: crate::cluster::sim::judge::Judge,
    /// Of the judge's false denials, those in the first two rounds of the rule's window (by
    /// the checking node's clock).
    early: u64,
}

/// `users` users of every rule send bursts of 1 to 5 checks, `bursts` a second, each burst
/// to a random node, for `dur` from `from`, on a healthy network (1 ms, no loss); every
/// check is judged, per rule. The mesh's `quiet_users`, for the tree.
fn tree_quiet_users(
    nodes: usize,
    seed: u64,
    users: u64,
    bursts: u64,
    dur: Nanos,
    from: QuietFrom,
) -> Vec<Quiet> {
    let rules = quiet_rules();
    let params = TreeParams::default();
    let round = params.round;
    let judged: Vec<(String, Vec<Limit>)> = rules
        .iter()
        .map(|(name, l)| (name.clone(), vec![*l]))
        .collect();
    let mut sim = TreeSim::new(nodes, rules.clone(), params, seed);
    sim.net.delay = MS;
    match from {
        QuietFrom::Start => {}
        QuietFrom::Round => until_a_complete_round(&mut sim, nodes),
        QuietFrom::Thawed => {
            // A node starting at `START` freezes the slots its first boundary's round could
            // grant room in: up to the one holding `START` plus two rounds.
            let thawed = rules
                .iter()
                .map(|(_, l)| ((START + 2 * round) / l.period() + 1) * l.period())
                .max()
                .expect("rules");
            sim.advance(thawed - sim.now);
            until_a_complete_round(&mut sim, nodes);
        }
    }
    let gap = sim.grant_hops();
    let mut out: Vec<Quiet> = rules
        .iter()
        .map(|(name, _)| {
            let mut judge = crate::cluster::sim::judge::Judge::new(&judged, round);
            judge.gap = gap;
            Quiet {
                rule: name.clone(),
                judge,
                early: 0,
            }
        })
        .collect();
    let end = sim.now + dur;
    while sim.now < end {
        sim.advance(MS);
        if sim.random() % 1000 >= bursts {
            continue;
        }
        let node = sim.between(0, nodes as u64) as usize;
        let r = sim.between(0, rules.len() as u64) as usize;
        let key = format!("user-{}", sim.between(0, users));
        for _ in 0..sim.between(1, 6) {
            let now = sim.clock(node);
            let d = sim
                .check_decision(node, &rules[r].0, &key, 1)
                .expect("running, a rule, keys unbounded");
            let q = &mut out[r];
            let before = q.judge.false_denials;
            q.judge.check(&q.rule, &key, node, nodes, now, 1, &d, true);
            if q.judge.false_denials > before && now % rules[r].1.period() < 2 * round {
                q.early += 1;
            }
        }
    }
    out
}

/// One row of [`tree_quiet_table`]: (rule, checks far from the limit, false denials, of
/// which in a window's first two rounds, of which in a round's gap).
type QuietRow = (String, u64, u64, u64, u64);

/// What [`tree_quiet_users`] found, per rule, summed over `seeds`: 200 users, 300 bursts a
/// second, 6 s each, as the mesh's table.
fn tree_quiet_table(
    nodes: usize,
    seeds: std::ops::RangeInclusive<u64>,
    from: QuietFrom,
) -> Vec<QuietRow> {
    let mut table: Vec<QuietRow> = Vec::new();
    for seed in seeds {
        for (i, q) in tree_quiet_users(nodes, seed, 200, 300, 6 * SECOND, from)
            .into_iter()
            .enumerate()
        {
            if table.len() <= i {
                table.push((q.rule.clone(), 0, 0, 0, 0));
            }
            table[i].1 += q.judge.must_admit;
            table[i].2 += q.judge.false_denials;
            table[i].3 += q.early;
            table[i].4 += q.judge.in_gap;
        }
    }
    table
}

/// The tree's quiet users (design §3.3.3, as the mesh's `quiet_users_table`): `cargo test
/// --release --lib tree_quiet_users_table -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement: prints the tree's false denials of quiet users per rule"]
fn tree_quiet_users_table() {
    println!(
        "| nodes | load from | rule | far from the limit | false denials | in a window's first 2 rounds | in a round's gap |"
    );
    println!("|---|---|---|---|---|---|---|");
    for from in [QuietFrom::Start, QuietFrom::Round, QuietFrom::Thawed] {
        for nodes in [1, 3, 5] {
            for (rule, far, denied, early, in_gap) in tree_quiet_table(nodes, 1..=3, from) {
                println!(
                    "| {nodes} | {from:?} | {rule} | {far} | {denied} ({:.2}%) | {early} | {in_gap} |",
                    100.0 * denied as f64 / far.max(1) as f64
                );
            }
        }
    }
}

/// Quiet users far from their limits, once the cluster has run past the windows it started
/// in (a start waits those out, see the table): a lone node denies none, as a standalone
/// node; on 3 and 5 nodes every member's base serves a key's first checks, so all but a
/// few of the checks the false-denial judge covers are admitted (the few: a key a busy
/// round took a node's base of, waiting for its grant).
#[test]
fn tree_quiet_users_far_from_their_limits_are_admitted_at_once() {
    for nodes in [1, 3, 5] {
        for (rule, far, denied, _, _) in tree_quiet_table(nodes, 1..=1, QuietFrom::Thawed) {
            assert!(far > 1000, "{nodes} nodes, {rule}: {far} judged");
            let allowed = if nodes == 1 { 0 } else { far / 100 };
            assert!(
                denied <= allowed,
                "{nodes} nodes, {rule}: {denied} of {far} denied"
            );
        }
    }
}

/// Far from the limit the tree is invisible: once the cluster has run a slot's first round
/// in one view, every member holds a base of every key there, so a key's first check at any
/// member is admitted at once, in the slot's first millisecond as later. Without bases each
/// such check waited for a round's grant.
#[test]
fn a_keys_first_check_at_any_member_is_admitted_at_once() {
    for nodes in [3, 5] {
        let mut sim = TreeSim::new(nodes, window(100), TreeParams::default(), 31);
        sim.advance(3 * SECOND);
        // The first millisecond of slot 3, then later in it, each time fresh keys at
        // every member.
        let mut refused = Vec::new();
        for (step, ms) in [1, 250, 499].into_iter().enumerate() {
            sim.advance(ms * MS - sim.now % SECOND);
            for i in 0..nodes {
                let key = format!("fresh-{step}-{i}");
                if !sim.check(i, "w", &key, 1) {
                    refused.push(key);
                }
            }
        }
        assert!(refused.is_empty(), "{nodes} nodes refused {refused:?}");
    }
}

/// Near the limit bases cost nothing measurable: a hot key at three times its limit gets
/// nearly all of it, spread evenly or 80/10/10 (98%), or all at one node (95%), on 3 and 5
/// nodes. A node
/// that never saw the key gives back its base when the key's totals reach it (pressed),
/// keeping only its escrow, which shrinks to nothing near the limit.
#[test]
fn a_hot_key_at_three_times_its_limit_gets_nearly_all_of_it() {
    for nodes in [3usize, 5] {
        for spread in ["even", "80/10/10", "one node"] {
            let mut sim = TreeSim::new(nodes, window(200), TreeParams::default(), 37);
            sim.advance(3 * SECOND);
            // 600 per second: per node per ms, in millionths.
            let weight = |i: usize| -> u64 {
                match (spread, i) {
                    ("even", _) => 600_000 / nodes as u64,
                    (_, 0) if spread == "80/10/10" => 480_000,
                    ("80/10/10", _) => 120_000 / (nodes as u64 - 1),
                    (_, 0) => 600_000,
                    _ => 0,
                }
            };
            for _ in 0..5000 {
                sim.advance(MS);
                for i in 0..nodes {
                    if sim.random() % 1_000_000 < weight(i) {
                        sim.check(i, "w", "k", 1);
                    }
                }
            }
            let windows: Vec<u64> = (3..8).map(|x| admitted_in(&sim, x)).collect();
            let share = windows.iter().sum::<u64>() as f64 / (200.0 * windows.len() as f64);
            assert!(windows.iter().all(|&w| w <= 200), "{windows:?}");
            // Alone on the key, a node waits for the others' escrow to shrink to nothing,
            // a round a step: the margin's worth (as over the mesh).
            let floor = if spread == "one node" { 0.95 } else { 0.98 };
            assert!(
                share >= floor,
                "{nodes} nodes, {spread}: {windows:?} ({:.1}%)",
                share * 100.0
            );
        }
    }
}

/// A check at a node before its first complete round (its start freeze) is told to retry
/// after the next round's grants, not at the end of the window (the first complete round
/// lifts the freeze and grants what the boundary before it asked for), and a retry then is
/// admitted.
#[test]
fn a_check_in_the_start_freeze_is_told_to_retry_after_a_round() {
    let ten = vec![(
        "w".to_owned(),
        Limit::new(Algorithm::FixedWindow, 100, 10 * SECOND, None).expect("valid"),
    )];
    let mut sim = TreeSim::new(3, ten, TreeParams::default(), 31);
    sim.view_lag = (50 * MS, 50 * MS);
    sim.advance(2 * SECOND);
    // Node 0 leaves on purpose (nothing freezes) and comes back.
    sim.leave(0);
    sim.advance(400 * MS);
    assert!(sim.node(0).is_none());
    sim.restart(0);
    sim.advance(5 * MS);
    assert!(sim.node(0).expect("up").start_frozen());
    let d = sim.check_decision(0, "w", "k", 1).expect("a rule");
    let Verdict::Deny { retry_after } = d.verdict else {
        panic!("admitted in the start freeze: {d:?}")
    };
    assert!(
        retry_after <= 300 * MS,
        "retry after {} ms",
        retry_after / MS
    );
    sim.advance(retry_after);
    let mut admitted_after = None;
    for t in 0..300u64 {
        if sim.check(0, "w", "k", 1) {
            admitted_after = Some(t);
            break;
        }
        sim.advance(MS);
    }
    assert!(!sim.node(0).expect("up").start_frozen());
    assert!(
        admitted_after.is_some_and(|t| t <= 150),
        "admitted {admitted_after:?} ms after the retry"
    );
}
