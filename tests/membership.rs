//! Cluster scripts for membership: in memory on chitchat's `ChannelTransport` with paused
//! tokio time (each takes milliseconds of real time), plus one on real UDP loopback.
//!
//! Times printed with `--nocapture` are virtual (paused clock) except in the UDP test.

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use chitchat::transport::ChannelTransport;
use chitchat::{ChitchatConfig, ChitchatId, FailureDetectorConfig, ProtocolVersion};
use gossamer::cluster::membership::{Carried, Member, Membership, MembershipConfig, NodeMeta};
use tokio::time::{Instant, sleep, timeout};

const CLUSTER: &str = "test-cluster";
/// Generous bound for "within about a second" at the 100 ms default interval.
const DEATH_BOUND: Duration = Duration::from_millis(2_000);

fn addr(port: u16) -> SocketAddr {
    ([127, 0, 0, 1], port).into()
}

fn meta(port: u16, rules_hash: &str) -> NodeMeta {
    NodeMeta {
        quic_addr: addr(port + 1000),
        version: "0.1.0".into(),
        rules_hash: rules_hash.into(),
        limits: String::new(),
    }
}

fn config(node: &str, generation: u64, port: u16, seeds: &[u16]) -> MembershipConfig {
    let mut cfg = MembershipConfig::new(node, generation, addr(port), addr(port), CLUSTER);
    cfg.seeds = seeds.iter().map(|p| addr(*p).to_string()).collect();
    cfg
}

async fn start(transport: &ChannelTransport, node: &str, port: u16, seeds: &[u16]) -> Membership {
    start_gen(transport, node, 1, port, seeds, "rules-1").await
}

async fn start_gen(
    transport: &ChannelTransport,
    node: &str,
    generation: u64,
    port: u16,
    seeds: &[u16],
    rules_hash: &str,
) -> Membership {
    Membership::start_with_transport(
        config(node, generation, port, seeds),
        meta(port, rules_hash),
        transport,
    )
    .await
    .expect("membership starts")
}

/// The newest incarnation of `node` in `members`, if any.
fn newest<'a>(members: &'a [Member], node: &str) -> Option<&'a Member> {
    members
        .iter()
        .filter(|m| m.node_id == node)
        .max_by_key(|m| m.generation)
}

fn alive(members: &[Member], node: &str) -> bool {
    newest(members, node).is_some_and(|m| m.alive)
}

/// Known, and no incarnation of it alive.
fn dead(members: &[Member], node: &str) -> bool {
    newest(members, node).is_some() && members.iter().all(|m| m.node_id != node || !m.alive)
}

/// Every one of `nodes` alive with its meta, as `m` sees it.
fn sees_all(members: &[Member], nodes: &[(&str, u16)]) -> bool {
    nodes.iter().all(|(node, port)| {
        newest(members, node).is_some_and(|m| {
            m.alive
                && m.meta
                    .as_ref()
                    .is_some_and(|x| x.quic_addr == addr(port + 1000))
        })
    })
}

/// Polls `m` until `pred` holds; returns how long it took, or panics with the view.
async fn wait_until(
    m: &Membership,
    within: Duration,
    what: &str,
    pred: impl Fn(&[Member]) -> bool,
) -> Duration {
    let started = Instant::now();
    let waited = timeout(within, async {
        while !pred(&m.members()) {
            sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    match waited {
        Ok(()) => started.elapsed(),
        Err(_) => panic!("{what}: not within {within:?}; view: {:#?}", m.members()),
    }
}

async fn three_node_cluster(transport: &ChannelTransport) -> [Membership; 3] {
    let a = start(transport, "a", 7001, &[]).await;
    let b = start(transport, "b", 7002, &[7001]).await;
    let c = start(transport, "c", 7003, &[7001]).await;
    let all = [("a", 7001), ("b", 7002), ("c", 7003)];
    for m in [&a, &b, &c] {
        wait_until(m, Duration::from_secs(3), "converge", |v| sees_all(v, &all)).await;
    }
    [a, b, c]
}

#[tokio::test(start_paused = true)]
async fn three_nodes_from_one_seed_see_each_other_with_meta() {
    let transport = ChannelTransport::default();
    let started = Instant::now();
    let a = start(&transport, "a", 7001, &[]).await;
    let b = start(&transport, "b", 7002, &[7001]).await;
    let c = start(&transport, "c", 7003, &[7001]).await;
    let all = [("a", 7001), ("b", 7002), ("c", 7003)];
    for m in [&a, &b, &c] {
        wait_until(m, Duration::from_secs(2), "converge", |v| sees_all(v, &all)).await;
    }
    eprintln!(
        "3 nodes converged with meta after {:?} (virtual)",
        started.elapsed()
    );
    let view = a.members();
    let ids: Vec<&str> = view.iter().map(|m| m.node_id.as_str()).collect();
    assert_eq!(ids, ["a", "b", "c"], "sorted, one incarnation each");
    assert!(view[0].is_self && !view[1].is_self && !view[2].is_self);
    assert_eq!(view[1].gossip_addr, addr(7002));
    assert!(
        view.iter()
            .all(|m| m.last_seen.is_some_and(|d| d < Duration::from_secs(1)))
    );
    for m in [a, b, c] {
        m.shutdown().await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn a_stopped_node_is_reported_dead_by_the_others_within_two_seconds() {
    let transport = ChannelTransport::default();
    let [a, b, c] = three_node_cluster(&transport).await;
    // Let the failure detector collect a realistic sample of intervals.
    sleep(Duration::from_secs(2)).await;
    c.shutdown().await.unwrap();
    let stopped = Instant::now();
    let took_a = wait_until(&a, DEATH_BOUND, "a sees c dead", |v| dead(v, "c")).await;
    wait_until(&b, DEATH_BOUND, "b sees c dead", |v| dead(v, "c")).await;
    let took_b = stopped.elapsed();
    eprintln!("stopped node dead after {took_a:?} at a, {took_b:?} at b (virtual)");
    assert!(alive(&a.members(), "b") && alive(&b.members(), "a"));
    let c_seen = newest(&a.members(), "c").cloned().unwrap();
    assert!(c_seen.meta.is_some(), "a dead member keeps its last meta");
    assert!(c_seen.last_seen.unwrap() >= took_a.saturating_sub(Duration::from_millis(200)));
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_node_stopped_right_after_joining_is_reported_dead_within_two_seconds() {
    // With chitchat's default 5 s prior for the heartbeat interval this took ~17 s: the
    // failure detector had too few samples to trust. The prior is now the gossip interval.
    let transport = ChannelTransport::default();
    let a = start(&transport, "a", 7001, &[]).await;
    let b = start(&transport, "b", 7002, &[7001]).await;
    wait_until(&a, Duration::from_secs(2), "a sees b", |v| alive(v, "b")).await;
    b.shutdown().await.unwrap();
    let took = wait_until(&a, DEATH_BOUND, "a sees b dead", |v| dead(v, "b")).await;
    eprintln!("node stopped right after joining dead after {took:?} (virtual)");
    a.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_dead_node_is_forgotten_after_the_grace_period() {
    let transport = ChannelTransport::default();
    let mut cfg = config("a", 1, 7001, &[]);
    cfg.dead_node_grace_period = Duration::from_secs(10);
    let a = Membership::start_with_transport(cfg, meta(7001, "rules-1"), &transport)
        .await
        .unwrap();
    let b = start(&transport, "b", 7002, &[7001]).await;
    wait_until(&a, Duration::from_secs(2), "a sees b", |v| alive(v, "b")).await;
    b.shutdown().await.unwrap();
    wait_until(&a, DEATH_BOUND, "a sees b dead", |v| dead(v, "b")).await;
    sleep(Duration::from_secs(5)).await;
    assert!(
        dead(&a.members(), "b"),
        "still listed, as dead, within the grace period"
    );
    wait_until(&a, Duration::from_secs(6), "a forgets b", |v| {
        newest(v, "b").is_none()
    })
    .await;
    a.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_leaving_node_is_reported_dead_within_a_round_or_two() {
    let transport = ChannelTransport::default();
    let [a, b, c] = three_node_cluster(&transport).await;
    let mut watch_a = a.watch();
    watch_a.mark_unchanged();
    let started = Instant::now();
    let leaving = tokio::spawn(c.leave(Some(42)));
    let took = wait_until(&a, Duration::from_millis(500), "a sees c gone", |v| {
        dead(v, "c")
    })
    .await;
    let seen = wait_until(&b, Duration::from_millis(500), "b sees c gone", |v| {
        dead(v, "c")
    })
    .await;
    let c_at_b = newest(&b.members(), "c").cloned();
    assert!(
        c_at_b.is_some_and(|m| m.leaving && m.published_through == Some(42)),
        "b reads the round c published through from its marker ({seen:?})"
    );
    eprintln!(
        "leaving node dead at a after {took:?}, at both after {:?} (virtual)",
        started.elapsed()
    );
    leaving.await.unwrap().unwrap();
    assert!(watch_a.has_changed().unwrap(), "the watch was told");
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// Over the aggregation tree a leaving node names the member that took its admissions: the
/// others read the carrier and the round from its marker, and it is dead at once.
#[tokio::test(start_paused = true)]
async fn a_node_leaving_with_its_count_carried_names_the_carrier() {
    let transport = ChannelTransport::default();
    let [a, b, c] = three_node_cluster(&transport).await;
    let carried = Carried {
        node_id: "a".to_owned(),
        generation: 1,
        from: 17_000_000_042,
    };
    let leaving = tokio::spawn({
        let carried = carried.clone();
        async move { c.leave_carried(&carried).await }
    });
    wait_until(&b, Duration::from_millis(500), "b sees c gone", |v| {
        dead(v, "c")
    })
    .await;
    let c_at_b = newest(&b.members(), "c").cloned().expect("b knows c");
    assert!(c_at_b.leaving && !c_at_b.alive);
    assert_eq!(c_at_b.carried, Some(carried));
    assert_eq!(c_at_b.published_through, None);
    leaving.await.unwrap().unwrap();
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn isolating_a_node_makes_both_sides_see_each_other_dead_and_healing_restores_it() {
    let transport = ChannelTransport::default();
    let [a, b, c] = three_node_cluster(&transport).await;
    sleep(Duration::from_secs(1)).await;
    transport.remove_link(addr(7003), addr(7001)).await;
    transport.remove_link(addr(7003), addr(7002)).await;
    let took = wait_until(&a, DEATH_BOUND, "a sees c dead", |v| dead(v, "c")).await;
    wait_until(&b, DEATH_BOUND, "b sees c dead", |v| dead(v, "c")).await;
    wait_until(&c, DEATH_BOUND, "c sees a and b dead", |v| {
        dead(v, "a") && dead(v, "b")
    })
    .await;
    eprintln!("partitioned node dead after {took:?} (virtual)");
    assert!(
        alive(&a.members(), "b"),
        "the majority side still sees itself"
    );
    assert!(
        c.members().iter().any(|m| m.is_self && m.alive),
        "a node never sees itself dead"
    );

    transport.add_link(addr(7003), addr(7001)).await;
    transport.add_link(addr(7003), addr(7002)).await;
    let healed = wait_until(&a, Duration::from_secs(3), "a sees c again", |v| {
        alive(v, "c")
    })
    .await;
    wait_until(&c, Duration::from_secs(3), "c sees a, b again", |v| {
        alive(v, "a") && alive(v, "b")
    })
    .await;
    eprintln!("healed partition alive again after {healed:?} (virtual)");
    for m in [a, b, c] {
        m.shutdown().await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn one_cut_link_in_a_triangle_kills_nobody_because_heartbeats_travel_indirectly() {
    let transport = ChannelTransport::default();
    let [a, b, c] = three_node_cluster(&transport).await;
    transport.remove_link(addr(7001), addr(7002)).await;
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        assert!(alive(&a.members(), "b"), "{:#?}", a.members());
        assert!(alive(&b.members(), "a"), "{:#?}", b.members());
        sleep(Duration::from_millis(50)).await;
    }
    for m in [a, b, c] {
        m.shutdown().await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn a_two_node_link_cut_is_seen_from_both_sides_and_heals() {
    let transport = ChannelTransport::default();
    let a = start(&transport, "a", 7001, &[]).await;
    let b = start(&transport, "b", 7002, &[7001]).await;
    let both = [("a", 7001), ("b", 7002)];
    wait_until(&a, Duration::from_secs(2), "converge", |v| {
        sees_all(v, &both)
    })
    .await;
    wait_until(&b, Duration::from_secs(2), "converge", |v| {
        sees_all(v, &both)
    })
    .await;
    sleep(Duration::from_secs(1)).await;
    transport.remove_link(addr(7001), addr(7002)).await;
    wait_until(&a, DEATH_BOUND, "a sees b dead", |v| dead(v, "b")).await;
    wait_until(&b, DEATH_BOUND, "b sees a dead", |v| dead(v, "a")).await;
    transport.add_link(addr(7001), addr(7002)).await;
    wait_until(&a, Duration::from_secs(3), "a sees b", |v| alive(v, "b")).await;
    wait_until(&b, Duration::from_secs(3), "b sees a", |v| alive(v, "a")).await;
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_restarted_node_is_reported_with_its_new_generation_and_alive() {
    let transport = ChannelTransport::default();
    let [a, b, c] = three_node_cluster(&transport).await;
    sleep(Duration::from_secs(1)).await;
    c.shutdown().await.unwrap();
    // Back at once, before the failure detector could call the old incarnation dead.
    let c2 = start_gen(&transport, "c", 2, 7003, &[7001], "rules-1").await;
    for m in [&a, &b] {
        wait_until(m, Duration::from_secs(2), "new c alive", |v| {
            newest(v, "c").is_some_and(|m| m.generation == 2 && m.alive)
        })
        .await;
    }
    for m in [&a, &b] {
        let view = m.members();
        let cs: Vec<(u64, bool)> = view
            .iter()
            .filter(|m| m.node_id == "c")
            .map(|m| (m.generation, m.alive))
            .collect();
        assert!(cs == [(2, true)] || cs == [(1, false), (2, true)], "{cs:?}");
    }
    let all = [("a", 7001), ("b", 7002), ("c", 7003)];
    wait_until(&c2, Duration::from_secs(2), "new c sees all", |v| {
        sees_all(v, &all)
    })
    .await;
    // The new incarnation also learns about its old self, and reports it dead, not as self.
    let own: Vec<(u64, bool, bool)> = c2
        .members()
        .iter()
        .filter(|m| m.node_id == "c")
        .map(|m| (m.generation, m.alive, m.is_self))
        .collect();
    assert!(
        own == [(2, true, true)] || own == [(1, false, false), (2, true, true)],
        "{own:?}"
    );
    for m in [a, b, c2] {
        m.shutdown().await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn a_rules_hash_mismatch_is_detected_and_clears_after_a_reload() {
    let transport = ChannelTransport::default();
    let a = start(&transport, "a", 7001, &[]).await;
    let b = start(&transport, "b", 7002, &[7001]).await;
    let c = start_gen(&transport, "c", 1, 7003, &[7001], "rules-2").await;
    let all = [("a", 7001), ("b", 7002), ("c", 7003)];
    for m in [&a, &b, &c] {
        wait_until(m, Duration::from_secs(2), "converge", |v| sees_all(v, &all)).await;
    }
    assert_eq!(a.mismatched_rules(), ["c"]);
    assert_eq!(b.mismatched_rules(), ["c"]);
    assert_eq!(c.mismatched_rules(), ["a", "b"]);

    let mut watch_a = a.watch();
    watch_a.mark_unchanged();
    c.set_meta(meta(7003, "rules-1")).await;
    timeout(Duration::from_secs(1), watch_a.changed())
        .await
        .expect("a's watch fires on c's meta change")
        .unwrap();
    for m in [&a, &b, &c] {
        wait_until(m, Duration::from_secs(1), "no mismatch", |v| {
            v.iter()
                .all(|m| m.meta.as_ref().is_some_and(|x| x.rules_hash == "rules-1"))
        })
        .await;
        assert!(m.mismatched_rules().is_empty());
    }
    for m in [a, b, c] {
        m.shutdown().await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn a_peer_with_missing_or_garbage_keys_is_alive_with_no_meta() {
    let transport = ChannelTransport::default();
    let a = start(&transport, "a", 7001, &[]).await;
    // A chitchat node that is not gossamer: unparsable QUIC address, no version.
    let stranger = chitchat::spawn_chitchat(
        ChitchatConfig {
            chitchat_id: ChitchatId::new("stranger", 1, addr(7009)),
            cluster_id: CLUSTER.into(),
            gossip_interval: Duration::from_millis(100),
            listen_addr: addr(7009),
            seed_nodes: vec![addr(7001).to_string()],
            failure_detector_config: FailureDetectorConfig {
                initial_interval: Duration::from_millis(100),
                ..FailureDetectorConfig::default()
            },
            marked_for_deletion_grace_period: Duration::from_secs(3600),
            catchup_callback: None,
            extra_liveness_predicate: None,
            protocol_version: ProtocolVersion::V0,
        },
        vec![
            ("gossamer.quic_addr".into(), "not an address".into()),
            ("gossamer.rules_hash".into(), "x".into()),
            ("unrelated".into(), "\u{0}\u{ffff}".into()),
        ],
        &transport,
    )
    .await
    .unwrap();
    wait_until(&a, Duration::from_secs(2), "a sees the stranger", |v| {
        alive(v, "stranger")
    })
    .await;
    let view = a.members();
    assert_eq!(newest(&view, "stranger").unwrap().meta, None);
    assert!(a.mismatched_rules().is_empty(), "no meta, no verdict");
    stranger.shutdown().await.unwrap();
    a.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_different_cluster_id_is_never_a_member() {
    let transport = ChannelTransport::default();
    let a = start(&transport, "a", 7001, &[]).await;
    let mut cfg = config("other", 1, 7002, &[7001]);
    cfg.cluster_id = "another-cluster".into();
    let other = Membership::start_with_transport(cfg, meta(7002, "rules-1"), &transport)
        .await
        .unwrap();
    sleep(Duration::from_secs(2)).await;
    assert_eq!(a.members().len(), 1, "{:#?}", a.members());
    assert_eq!(other.members().len(), 1, "{:#?}", other.members());
    a.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn starting_twice_on_one_address_is_an_error_not_a_panic() {
    let transport = ChannelTransport::default();
    let a = start(&transport, "a", 7001, &[]).await;
    let err =
        Membership::start_with_transport(config("b", 1, 7001, &[]), meta(7001, "r"), &transport)
            .await
            .unwrap_err();
    assert!(err.to_string().contains("127.0.0.1:7001"), "{err}");
    a.shutdown().await.unwrap();
}

/// Ports that were free a moment ago (chitchat must advertise a concrete port, so port 0
/// cannot be used directly).
fn free_udp_ports(n: usize) -> Vec<u16> {
    let sockets: Vec<UdpSocket> = (0..n)
        .map(|_| UdpSocket::bind("127.0.0.1:0").expect("bind a UDP port"))
        .collect();
    sockets
        .iter()
        .map(|s| s.local_addr().expect("bound address").port())
        .collect()
}

#[tokio::test]
async fn three_nodes_converge_and_see_a_stopped_one_dead_over_real_udp_loopback() {
    let ports = free_udp_ports(3);
    let started = std::time::Instant::now();
    let mut nodes = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let name = ["a", "b", "c"][i];
        let seeds: &[u16] = if i == 0 { &[] } else { &ports[..1] };
        let m = Membership::start(config(name, 1, *port, seeds), meta(*port, "rules-1"))
            .await
            .unwrap();
        nodes.push(m);
    }
    let all: Vec<(&str, u16)> = ["a", "b", "c"]
        .into_iter()
        .zip(ports.iter().copied())
        .collect();
    for m in &nodes {
        wait_until(m, Duration::from_secs(5), "converge over UDP", |v| {
            sees_all(v, &all)
        })
        .await;
    }
    eprintln!(
        "3 nodes converged over UDP loopback in {:?} (real)",
        started.elapsed()
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let c = nodes.pop().unwrap();
    timeout(Duration::from_secs(2), c.shutdown())
        .await
        .unwrap()
        .unwrap();
    let took = wait_until(
        &nodes[0],
        Duration::from_secs(3),
        "a sees c dead over UDP",
        |v| dead(v, "c"),
    )
    .await;
    eprintln!("stopped node dead over UDP loopback after {took:?} (real)");
    for m in nodes {
        timeout(Duration::from_secs(2), m.shutdown())
            .await
            .unwrap()
            .unwrap();
    }
}
