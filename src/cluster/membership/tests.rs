//! The pure parts: meta parsing, the tracker's supersession, liveness, `last_seen` and
//! mismatch reporting, and config validation. Cluster behaviour is in `tests/membership.rs`.

use std::collections::HashMap;

use super::*;

fn addr(port: u16) -> SocketAddr {
    ([127, 0, 0, 1], port).into()
}

fn id(node: &str, generation: u64, port: u16) -> ChitchatId {
    ChitchatId::new(node, generation, addr(port))
}

fn meta(hash: &str) -> NodeMeta {
    NodeMeta {
        quic_addr: addr(9000),
        version: "0.1.0".into(),
        rules_hash: hash.into(),
        limits: String::new(),
    }
}

fn seen(id: ChitchatId, heartbeat: u64, hash: Option<&str>, alive: bool) -> Observed {
    Observed {
        id,
        heartbeat,
        meta: hash.map(meta),
        leaving: false,
        published_through: None,
        carried: None,
        detector_alive: alive,
    }
}

fn by_key(members: &[Member]) -> HashMap<(String, u64), &Member> {
    members
        .iter()
        .map(|m| ((m.node_id.clone(), m.generation), m))
        .collect()
}

#[test]
fn meta_round_trips_through_its_keys_including_ipv6() {
    for quic_addr in ["10.0.0.7:7000", "[2001:db8::1]:7000"] {
        let meta = NodeMeta {
            quic_addr: quic_addr.parse().unwrap(),
            version: "1.2.3".into(),
            rules_hash: "abc".into(),
            limits: String::new(),
        };
        let kv: HashMap<&str, String> = meta.key_values().into_iter().collect();
        let back = NodeMeta::from_keys(|k| kv.get(k).map(String::as_str));
        assert_eq!(back, Some(meta));
    }
}

#[test]
fn meta_with_a_missing_or_unparsable_key_is_none() {
    let full: HashMap<&str, &str> = [
        (KEY_QUIC_ADDR, "127.0.0.1:7000"),
        (KEY_VERSION, "1"),
        (KEY_RULES_HASH, "h"),
    ]
    .into_iter()
    .collect();
    for missing in [KEY_QUIC_ADDR, KEY_VERSION, KEY_RULES_HASH] {
        let mut kv = full.clone();
        kv.remove(missing);
        assert_eq!(
            NodeMeta::from_keys(|k| kv.get(k).copied()),
            None,
            "{missing}"
        );
    }
    for bad in [
        "",
        "127.0.0.1",
        "localhost:7000",
        "127.0.0.1:99999",
        "\u{0}",
    ] {
        let mut kv = full.clone();
        kv.insert(KEY_QUIC_ADDR, bad);
        assert_eq!(NodeMeta::from_keys(|k| kv.get(k).copied()), None, "{bad:?}");
    }
}

#[test]
fn members_are_sorted_by_node_id_then_generation() {
    let me = id("b", 5, 2);
    let mut tracker = Tracker::new(me.clone());
    let update = tracker.update(
        vec![
            seen(id("c", 1, 3), 4, Some("h"), true),
            seen(me, 9, Some("h"), true),
            seen(id("a", 7, 1), 4, Some("h"), false),
            seen(id("a", 3, 1), 4, Some("h"), false),
        ],
        Instant::now(),
    );
    let order: Vec<(&str, u64)> = update
        .members
        .iter()
        .map(|m| (m.node_id.as_str(), m.generation))
        .collect();
    assert_eq!(order, [("a", 3), ("a", 7), ("b", 5), ("c", 1)]);
}

#[test]
fn a_newer_generation_supersedes_an_older_one_even_if_the_detector_still_hears_it() {
    let me = id("a", 1, 1);
    let mut tracker = Tracker::new(me.clone());
    let update = tracker.update(
        vec![
            seen(me, 9, Some("h"), true),
            seen(id("b", 100, 2), 4, Some("h"), true),
            seen(id("b", 200, 2), 2, Some("h"), true),
        ],
        Instant::now(),
    );
    let members = by_key(&update.members);
    assert!(!members[&("b".into(), 100)].alive);
    assert!(members[&("b".into(), 200)].alive);
}

#[test]
fn self_is_alive_and_a_newer_self_generation_is_reported_once() {
    let me = id("a", 1, 1);
    let mut tracker = Tracker::new(me.clone());
    let observed = vec![
        seen(me.clone(), 9, Some("h"), true),
        seen(id("a", 2, 7), 3, Some("h"), true),
    ];
    let first = tracker.update(observed.clone(), Instant::now());
    assert_eq!(first.newer_self, Some(2));
    assert!(first.members.iter().all(|m| m.alive));
    let again = tracker.update(observed, Instant::now());
    assert_eq!(again.newer_self, None);
}

#[test]
fn leaving_or_undetected_peers_are_dead_and_missing_meta_is_kept_as_none() {
    let me = id("a", 1, 1);
    let mut tracker = Tracker::new(me.clone());
    let mut leaving = seen(id("b", 1, 2), 4, Some("h"), true);
    leaving.leaving = true;
    let update = tracker.update(
        vec![
            seen(me, 9, Some("h"), true),
            leaving,
            seen(id("c", 1, 3), 4, None, false),
            seen(id("d", 1, 4), 4, None, true),
        ],
        Instant::now(),
    );
    let members = by_key(&update.members);
    assert!(!members[&("b".into(), 1)].alive);
    assert!(!members[&("c".into(), 1)].alive);
    assert!(members[&("d".into(), 1)].alive);
    assert_eq!(members[&("d".into(), 1)].meta, None);
}

#[test]
fn last_seen_counts_from_the_last_heartbeat_change() {
    let me = id("a", 1, 1);
    let peer = id("b", 1, 2);
    let mut tracker = Tracker::new(me.clone());
    let t0 = Instant::now();
    let at = |tracker: &mut Tracker, heartbeat, secs| {
        let update = tracker.update(
            vec![
                seen(me.clone(), 1, Some("h"), true),
                seen(peer.clone(), heartbeat, Some("h"), true),
            ],
            t0 + Duration::from_secs(secs),
        );
        let members = by_key(&update.members);
        (
            members[&("a".into(), 1)].last_seen,
            members[&("b".into(), 1)].last_seen,
        )
    };
    assert_eq!(at(&mut tracker, 0, 0).1, None, "no heartbeat heard yet");
    assert_eq!(at(&mut tracker, 5, 1).1, Some(Duration::ZERO));
    assert_eq!(at(&mut tracker, 5, 3).1, Some(Duration::from_secs(2)));
    assert_eq!(at(&mut tracker, 6, 4).1, Some(Duration::ZERO));
    assert_eq!(at(&mut tracker, 6, 4).0, Some(Duration::ZERO), "self");
}

#[test]
fn a_rules_mismatch_is_reported_once_per_change_of_either_hash() {
    let me = id("a", 1, 1);
    let peer = id("b", 1, 2);
    let mut tracker = Tracker::new(me.clone());
    let mut round = |ours: &str, theirs: &str| {
        let update = tracker.update(
            vec![
                seen(me.clone(), 1, Some(ours), true),
                seen(peer.clone(), 1, Some(theirs), true),
            ],
            Instant::now(),
        );
        assert_eq!(
            mismatched_rules(&update.members),
            if ours == theirs {
                vec![]
            } else {
                vec!["b".to_string()]
            }
        );
        update.mismatches.len()
    };
    assert_eq!(round("h1", "h2"), 1);
    assert_eq!(round("h1", "h2"), 0, "same pair again: no new report");
    assert_eq!(round("h1", "h3"), 1, "peer reloaded");
    assert_eq!(round("h4", "h3"), 1, "we reloaded");
    assert_eq!(round("h3", "h3"), 0, "agree");
    assert_eq!(round("h3", "h2"), 1, "differ again after agreeing");
}

#[test]
fn dead_peers_and_peers_without_meta_are_not_mismatches() {
    let me = id("a", 1, 1);
    let mut tracker = Tracker::new(me.clone());
    let update = tracker.update(
        vec![
            seen(me, 1, Some("h1"), true),
            seen(id("b", 1, 2), 1, Some("h2"), false),
            seen(id("c", 1, 3), 1, None, true),
        ],
        Instant::now(),
    );
    assert!(mismatched_rules(&update.members).is_empty());
    assert!(update.mismatches.is_empty());
}

#[test]
fn same_view_ignores_last_seen_only() {
    let me = id("a", 1, 1);
    let mut tracker = Tracker::new(me.clone());
    let t0 = Instant::now();
    let observed = vec![
        seen(me, 1, Some("h"), true),
        seen(id("b", 1, 2), 3, Some("h"), true),
    ];
    let before = tracker.update(observed.clone(), t0).members;
    let later = tracker
        .update(observed.clone(), t0 + Duration::from_secs(5))
        .members;
    assert_ne!(before, later);
    assert!(same_view(&before, &later));
    let mut changed = observed;
    changed[1].meta = Some(meta("other"));
    let after_meta = tracker.update(changed, t0).members;
    assert!(!same_view(&before, &after_meta));
}

#[test]
fn config_validation_names_the_field() {
    let good = MembershipConfig::new("a", 1, addr(7000), addr(7000), "c");
    assert!(good.validate().is_ok());
    type Breaker = fn(&mut MembershipConfig);
    let cases: Vec<(&str, Breaker)> = vec![
        ("node_id", |c| c.node_id.clear()),
        ("cluster_id", |c| c.cluster_id.clear()),
        ("listen", |c| c.listen = addr(0)),
        ("advertise", |c| c.advertise = addr(0)),
        ("advertise", |c| {
            c.advertise = "0.0.0.0:7000".parse().unwrap()
        }),
        ("gossip_interval", |c| c.gossip_interval = Duration::ZERO),
        ("phi_threshold", |c| c.phi_threshold = f64::NAN),
        ("phi_threshold", |c| c.phi_threshold = 0.0),
    ];
    for (field, break_it) in cases {
        let mut cfg = good.clone();
        break_it(&mut cfg);
        match cfg.validate() {
            Err(MembershipError::InvalidConfig { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field}: {other:?}"),
        }
    }
}

#[test]
fn the_failure_detector_prior_is_the_gossip_interval() {
    let mut cfg = MembershipConfig::new("a", 1, addr(7000), addr(7000), "c");
    cfg.gossip_interval = Duration::from_millis(250);
    let chitchat = cfg.chitchat_config();
    assert_eq!(
        chitchat.failure_detector_config.initial_interval,
        Duration::from_millis(250)
    );
    assert_eq!(
        chitchat.failure_detector_config.dead_node_grace_period,
        DEFAULT_DEAD_NODE_GRACE_PERIOD
    );
}

/// The tree's leaving marker names the carrier (a node id may hold spaces) and the round;
/// anything else names none.
#[test]
fn a_carried_marker_reads_back_and_nothing_else_reads_as_one() {
    let carried = Carried {
        node_id: "node a".to_owned(),
        generation: 1_700_000_000_123,
        from: 17_000_000_042,
    };
    assert_eq!(Carried::parse(&carried.marker()), Some(carried));
    for other in [
        "1",
        "through 42",
        "carried",
        "carried 1 2",
        "carried 1 2 ",
        "carried x 2 a",
    ] {
        assert_eq!(Carried::parse(other), None, "{other:?}");
    }
}
