//! Real-network cluster tests of 3 nodes: every node is the real `gossamer` binary in its own
//! network namespace, and the network between them is Linux's (veths on a bridge, links cut
//! with `ip link`, one-way cuts and packet loss made with nftables inside the namespaces). The
//! lab itself is `tests/support/lab.rs`, shared with the 5-node chaos suite
//! (`tests/chaos.rs`).
//!
//! The lab's layout (a data bridge for gossip and QUIC, where the faults are made, and a
//! management bridge for the HTTP API the test drives) and its cleanup are described there.
//!
//! Needs root, `ip` (iproute2) and `nft` (nftables); without them each test says why and
//! passes. The scenarios run one at a time (a process-wide lock), so their figures are not
//! disturbed by each other on a small machine. Run with `--nocapture` to see the figures;
//! with `NETNS_TIMELINE=1` the partition scenarios also print admissions per 100 ms. The nodes
//! run `LAB_BIN` if set (a release build, say), log at the runner's `RUST_LOG` (`info` if
//! unset; `gossamer::cluster::global=debug` says why each degraded instant was), and keep
//! their logs after a pass with `LAB_KEEP_LOGS=1` (after a failure they always do).

#[path = "support/env.rs"]
mod env;
#[path = "support/lab.rs"]
mod lab;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lab::*;
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout};

// ---------------------------------------------------------------------------------------------
// Scenarios

/// 1. Three nodes form a cluster; under 2x load per window, the cluster admits at most the
///    limit in every window and at least 90% of it in every full window; the token bucket
///    admits at most burst + rate x time (+ the capacity floor of N - 1, design §3.5).
#[test]
fn formation_and_global_limit() {
    scenario(
        "formation",
        3,
        Duration::from_secs(60),
        |mut lab| async move {
            let tag = "formation";
            wait_formed(tag, &lab, Duration::from_secs(15)).await;
            let addrs = lab.addrs();
            let rate = 2.0 * W_LIMIT as f64 / W_PERIOD.as_secs_f64();
            let w = Load::start(&addrs, "w", "k1", rate, 2);
            let b = Load::start(&addrs, "bucket", "k1", 2.0 * BUCKET_RATE, 1);
            sleep(Duration::from_secs(10)).await;
            let w = w.stop().await;
            lab.assert_running();
            let b = b.stop().await;
            let full = check_windows(tag, &lab.wall, &w, W_PERIOD, W_LIMIT, 0, &[]);
            eprintln!(
                "[{tag}] fixed window per node admitted/answered: {}",
                per_node(&w, 3)
            );
            print_rounds(tag, &lab).await;
            assert!(!full.is_empty(), "[{tag}] no full window measured");
            // At least 90% of the limit, or of what was asked if the load generator fell short.
            for &(n, answered) in &full {
                let due = W_LIMIT.min(answered);
                assert!(
                    n * 10 >= due * 9,
                    "[{tag}] a full window admitted {n} < 90% of {due}: (admitted, answered) {full:?}"
                );
            }
            // Bucket: the bound over the span from the first check sent to the last answered.
            let first = b
                .samples
                .iter()
                .map(|s| s.sent)
                .min()
                .expect("bucket samples");
            let last = b
                .samples
                .iter()
                .map(|s| s.answered)
                .max()
                .expect("bucket samples");
            let span = (last - first).as_secs_f64();
            let admitted = b.admitted() as f64;
            let bound = BUCKET_BURST + BUCKET_RATE * span + 2.0;
            let central = BUCKET_BURST + BUCKET_RATE * span;
            eprintln!(
                "[{tag}] token bucket 100/s burst 100: admitted {admitted} in {span:.2} s; bound burst + rate x t + (N-1) = {bound:.0}; {:.1}% of a central bucket's {central:.0}",
                100.0 * admitted / central
            );
            eprintln!(
                "[{tag}] bucket per node admitted/answered: {}",
                per_node(&b, 3)
            );
            assert!(
                admitted <= bound,
                "[{tag}] bucket admitted {admitted} > {bound:.0}"
            );
            lab.finish();
        },
    );
}

/// 2. Under load, one node is SIGKILLed and restarted with the same id within the window:
///    every window stays within the limit exactly (design §5: the restart charges the dead
///    incarnation's ghost, so its unpublished last round is not handed out again), the
///    restarted node becomes ready and rejoins, and every node converges to the same
///    `remaining` for the tracer key, which counts every admission made before the crash
///    (plus at most the ghost). Prints when the restarted node first said ready, what it
///    counted then, and when it rejoined.
#[test]
fn kill_and_restart() {
    scenario("kill", 3, Duration::from_secs(90), |lab| {
        kill_restart(lab, "kill")
    });
}

async fn kill_restart(mut lab: Lab, tag: &str) {
    let slack = 0;
    away_from_day_edge(&lab, Duration::from_secs(60)).await;
    wait_formed(tag, &lab, Duration::from_secs(15)).await;
    let addrs = lab.addrs();
    let rate = 2.0 * W_LIMIT as f64 / W_PERIOD.as_secs_f64();
    let w = Load::start(&addrs, "w", "k2", rate, 2);
    let tracer = Load::start(&addrs, "long", "t2", 90.0, 1);
    // Kill 100 ms into a window (after 2 s or more of load) and restart 1 s later, in the
    // same window: the restarted node then admits against what the others did while it
    // was away.
    sleep(Duration::from_secs(2)).await;
    sleep(until_window_offset(
        &lab.wall,
        W_PERIOD,
        Duration::from_millis(100),
    ))
    .await;
    let victim = 2;
    let killed_at = Instant::now();
    lab.kill(victim);
    eprintln!("[{tag}] SIGKILL node-{victim}");
    sleep(Duration::from_secs(1)).await;
    let restarted_at = Instant::now();
    lab.start(victim);
    eprintln!("[{tag}] restarted node-{victim} (same id) after 1 s down");
    let ready = wait_ready(addrs[victim], Duration::from_secs(15))
        .await
        .expect("the restarted node says ready within 15 s");
    let at_ready = remaining_on(addrs[victim], "long", "t2").await;
    eprintln!(
        "[{tag}] node-{victim} first said ready {} ms after restart, counting {:?} tracer admissions then",
        ready.as_millis(),
        at_ready.map(|r| LONG_LIMIT - r)
    );
    wait_formed(tag, &lab, Duration::from_secs(15)).await;
    eprintln!(
        "[{tag}] node-{victim} rejoined (all see all, unsuspected, ready) {} ms after restart",
        restarted_at.elapsed().as_millis()
    );
    sleep(Duration::from_secs(2)).await;
    let tracer = tracer.stop().await;
    let w = w.stop().await;
    lab.assert_running();
    timeline(tag, &w, 3, w.started);
    check_windows(
        tag,
        &lab.wall,
        &w,
        W_PERIOD,
        W_LIMIT,
        slack,
        &[("kill", killed_at), ("restart", restarted_at)],
    );
    eprintln!(
        "[{tag}] fixed window per node admitted/answered: {}",
        per_node(&w, 3)
    );
    let (took, remaining) = wait_agree(tag, &lab, "long", "t2", Duration::from_secs(10)).await;
    let counted = LONG_LIMIT - remaining;
    let recorded = tracer.admitted();
    // What the crash may lose: the victim's admissions since its last boundary (answered
    // in the last round before the kill; 250 ms with margin) ...
    let last_round = tracer
        .samples
        .iter()
        .filter(|s| s.node == victim && s.allowed)
        .filter(|s| s.answered <= killed_at && killed_at - s.answered <= Duration::from_millis(250))
        .count() as u64;
    // ... and what it may count that the test never saw answered: its check in flight, and
    // the ghost the restart charges the dead incarnation (design §5: at most twice its
    // demand for each of up to 4 rounds, plus its gap credit). Its demand smooths the
    // checks each round brought it, so it is at most the most that one round of its last
    // second brought: counted over any 110 ms (a round, and a check's way there) by when
    // they were sent, answered or not. (The mean per round, rounded down, fell short of a
    // busy round's demand: CI once saw a gain of 31 against 29 allowed.)
    let mut sent: Vec<Instant> = tracer
        .samples
        .iter()
        .filter(|s| s.node == victim)
        .map(|s| s.sent)
        .chain(
            tracer
                .unanswered
                .iter()
                .filter(|(node, _)| *node == victim)
                .map(|(_, sent)| *sent),
        )
        .filter(|&t| t <= killed_at && killed_at - t <= Duration::from_secs(1))
        .collect();
    sent.sort_unstable();
    let per_round = (0..sent.len())
        .map(|i| {
            sent[i..]
                .iter()
                .take_while(|&&t| t - sent[i] <= Duration::from_millis(110))
                .count()
        })
        .max()
        .unwrap_or(0) as u64;
    let in_flight = 1 + 8 * (per_round + 1) + 4;
    // ... and the checks a live node answered after the client gave up (2 s: an overloaded
    // machine), which it may have admitted.
    let unseen = tracer
        .unanswered
        .iter()
        .filter(|(node, sent)| *node != victim || *sent >= restarted_at)
        .count() as u64;
    eprintln!(
        "[{tag}] tracer: {recorded} admissions answered ({}), {counted} counted by the cluster, agreed {} ms after the load stopped; the victim answered {last_round} in its last 250 ms; {unseen} checks to live nodes got no answer",
        per_node(&tracer, 3),
        took.as_millis()
    );
    assert!(
        counted + last_round >= recorded && counted <= recorded + in_flight + unseen,
        "[{tag}] the cluster counts {counted}, the test saw {recorded} admitted (may lose ≤ {last_round}, gain ≤ {in_flight} with the ghost and {unseen} unanswered)"
    );
    print_rounds(tag, &lab).await;
    lab.finish();
}

/// Admits a tracer load for a while, stops it, lets a round publish it, and returns how many
/// admissions the test saw.
async fn tracer_burst(lab: &Lab, key: &str) -> u64 {
    let tracer = Load::start(&lab.addrs(), "long", key, 90.0, 1);
    sleep(Duration::from_secs(2)).await;
    let tracer = tracer.stop().await;
    sleep(Duration::from_millis(500)).await;
    tracer.admitted()
}

/// 2b. A restarted node must not say ready before it has pulled the cluster's counts (design
///     §2.2 "Pull on start"): when `/readyz` first answers 200, the node's `remaining` for a
///     key admitted before the crash (and published: the load stopped 500 ms before) counts
///     those admissions.
#[test]
fn restarted_node_is_ready_only_after_pulling() {
    scenario(
        "ready-pulled",
        3,
        Duration::from_secs(60),
        |mut lab| async move {
            let tag = "ready-pulled";
            away_from_day_edge(&lab, Duration::from_secs(30)).await;
            wait_formed(tag, &lab, Duration::from_secs(15)).await;
            let recorded = tracer_burst(&lab, "t2b").await;
            let victim = 2;
            lab.kill(victim);
            sleep(Duration::from_millis(500)).await;
            lab.start(victim);
            let addr = lab.addrs()[victim];
            let ready = wait_ready(addr, Duration::from_secs(15))
                .await
                .expect("the restarted node says ready within 15 s");
            let counted = remaining_on(addr, "long", "t2b")
                .await
                .map(|r| LONG_LIMIT - r);
            eprintln!(
                "[{tag}] node-{victim} first said ready {} ms after restart, counting {counted:?} of the {recorded} tracer admissions made before the crash",
                ready.as_millis()
            );
            // Every admission made before the crash, plus the retired incarnation's charge
            // (design §5): on a key idle for 500 ms, only its gap credit (1 unit, the least
            // a key in use gets; 2 allowed).
            let counted = counted.unwrap_or(0);
            assert!(
                counted >= recorded && counted <= recorded + 2,
                "[{tag}] the restarted node counted {counted} of {recorded}: it said ready before it had pulled the counts"
            );
            lab.finish();
        },
    );
}

/// 2c. A node restarted at the same address rejoins promptly: within 2 s of its restart every
///     node sees every member alive and unsuspected and says ready (issue 3's 2 s target for
///     convergence; design §2.3 "Partition heal").
#[test]
fn restarted_node_rejoins_within_2s() {
    scenario("rejoin", 3, Duration::from_secs(60), |mut lab| async move {
        let tag = "rejoin";
        wait_formed(tag, &lab, Duration::from_secs(15)).await;
        tracer_burst(&lab, "t2c").await;
        let victim = 2;
        lab.kill(victim);
        sleep(Duration::from_millis(500)).await;
        lab.start(victim);
        eprintln!("[{tag}] node-{victim} killed and restarted after 500 ms");
        wait_formed(tag, &lab, Duration::from_secs(2)).await;
        lab.finish();
    });
}

/// 2e. A node restarted in the middle of a window whose room the others have spent, while
///     its data link is still down (it cannot reach its seeds, as after a reboot into a
///     partition), does not admit a burst on its own: the window's total stays within the
///     limit (`hold`: never above the limit through any partition). With the link up the same
///     happens about one run in three, when the burst beats the first gossip round.
#[test]
fn restarted_node_does_not_admit_a_burst_alone() {
    scenario("burst", 3, Duration::from_secs(60), |mut lab| async move {
        let tag = "burst";
        wait_formed(tag, &lab, Duration::from_secs(15)).await;
        let addrs = lab.addrs();
        let victim = 2;
        sleep(until_window_offset(
            &lab.wall,
            W_PERIOD,
            Duration::from_millis(100),
        ))
        .await;
        let killed_at = Instant::now();
        lab.kill(victim);
        // The others spend what they may of this window.
        let spend = Load::start(&addrs[..victim], "w", "k2e", 600.0, 2);
        sleep(Duration::from_millis(1200)).await;
        lab.link(victim, false);
        let restarted_at = Instant::now();
        lab.start(victim);
        // As soon as it answers at all (it says ready at once: see 2b).
        let mut up = None;
        for _ in 0..2000 {
            if request(addrs[victim], "/healthz", None).await.is_some() {
                up = Some(restarted_at.elapsed());
                break;
            }
            sleep(Duration::from_millis(2)).await;
        }
        let ready = request(addrs[victim], "/readyz", None).await.map(|r| r.0);
        // A burst of 200 concurrent checks at the restarted node.
        let burst: Vec<JoinHandle<Option<Sample>>> = (0..200)
            .map(|_| {
                let addr = addrs[victim];
                tokio::spawn(async move {
                    let sent = Instant::now();
                    let body = serde_json::json!({"rule": "w", "key": "k2e"});
                    let (status, json) = request(addr, "/v1/check", Some(&body)).await?;
                    Some(Sample {
                        node: victim,
                        sent,
                        answered: Instant::now(),
                        allowed: status == 200 && json["allowed"] == true,
                        reset_after_ms: json["reset_after_ms"].as_u64().unwrap_or(0),
                    })
                })
            })
            .collect();
        let mut samples = Vec::new();
        for task in burst {
            samples.extend(task.await.expect("burst task"));
        }
        let mut spent = spend.stop().await;
        lab.link(victim, true);
        let burst_admitted = samples.iter().filter(|s| s.allowed).count();
        eprintln!(
            "[{tag}] node-{victim} answered {:?} ms after restart (/readyz {ready:?}); the others admitted {}, the restarted node admitted {burst_admitted} of a burst of {}",
            up.map(|d| d.as_millis()),
            spent.admitted(),
            samples.len()
        );
        spent.samples.extend(samples);
        check_windows(
            tag,
            &lab.wall,
            &spent,
            W_PERIOD,
            W_LIMIT,
            0,
            &[("kill", killed_at), ("restart", restarted_at)],
        );
        lab.finish();
    });
}

/// 2d. A key checked once per round on each node, 10 ms after each round boundary (in the
///     gap before the round's leases, design §2.2), far below its limit, is admitted (at
///     least 95% of checks; a window with 99.9% of its room left has no reason to deny).
#[test]
fn low_rate_key_is_admitted() {
    scenario("low-rate", 3, Duration::from_secs(60), |lab| async move {
        let tag = "low-rate";
        away_from_day_edge(&lab, Duration::from_secs(30)).await;
        wait_formed(tag, &lab, Duration::from_secs(15)).await;
        let round = Duration::from_millis(100);
        sleep(until_window_offset(
            &lab.wall,
            round,
            Duration::from_millis(10),
        ))
        .await;
        let tracer = Load::start_phased(&lab.addrs(), "long", "t2d", 30.0, 1, false);
        sleep(Duration::from_secs(5)).await;
        let tracer = tracer.stop().await;
        let answered = tracer.samples.len() as u64;
        let admitted = tracer.admitted();
        eprintln!(
            "[{tag}] 1 check per round per node, 10 ms after the boundary, on a limit of {LONG_LIMIT}/day: admitted {admitted} of {answered} ({})",
            per_node(&tracer, 3)
        );
        // The first round of a key may deny while its lease is computed: allow 5%.
        assert!(
            admitted * 100 >= answered * 95,
            "[{tag}] admitted only {admitted} of {answered} checks of a key with nearly all its room left"
        );
        lab.finish();
    });
}

/// How a partition scenario cuts node `victim` off and heals it.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// `ip link set <data veth> down` (both directions).
    LinkDown,
    /// nftables in the victim's namespace drops input from the other nodes' data addresses.
    OneWay,
}

/// 3 and 4: under 2x load, node-2 is cut off for 3 s, starting 100 ms into a window; every
/// window stays within the limit exactly (`on_partition = "hold"`); after the heal every node
/// agrees on the tracer's `remaining`, which equals the limit minus every admission the test
/// saw. The token bucket, hot at node-2 (160/s, 20/s at the others) and, while node-2 is
/// cut off, hot at the others too (160/s each), never admits more than burst + rate × τ +
/// (N − 1) over any interval: shares are held, so neither side takes more than it held
/// (design §3.5; shares recomputed from the last demands went over in the simulation).
async fn partition(mut lab: Lab, tag: &str, fault: Fault) {
    let slack = 0;
    away_from_day_edge(&lab, Duration::from_secs(40)).await;
    wait_formed(tag, &lab, Duration::from_secs(15)).await;
    let addrs = lab.addrs();
    let victim = 2;
    let rate = 2.0 * W_LIMIT as f64 / W_PERIOD.as_secs_f64();
    let w = Load::start(&addrs, "w", "k3", rate, 2);
    let tracer = Load::start(&addrs, "long", "t3", 90.0, 1);
    let hot = Load::start(&addrs[2..3], "bucket", "b3", 160.0, 1);
    let cold = Load::start(&addrs[..2], "bucket", "b3", 40.0, 1);
    let monitor = Monitor::start(&addrs);
    // Cut 100 ms into a window, after 2 s or more of load: most of that window's room is
    // still unspent when the sides part.
    sleep(Duration::from_secs(2)).await;
    sleep(until_window_offset(
        &lab.wall,
        W_PERIOD,
        Duration::from_millis(100),
    ))
    .await;
    let table = "gossamer_cut";
    let cut_at = Instant::now();
    match fault {
        Fault::LinkDown => lab.link(victim, false),
        Fault::OneWay => {
            let others: Vec<String> = lab
                .nodes
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != victim)
                .map(|(_, n)| n.data_ip.to_string())
                .collect();
            let rules = format!(
                "table inet {table} {{\n  chain input {{\n    type filter hook input priority 0; policy accept;\n    ip saddr {{ {} }} drop\n  }}\n}}\n",
                others.join(", ")
            );
            lab.nft(victim, table, &rules);
        }
    }
    eprintln!("[{tag}] cut node-{victim} off ({fault:?})");
    let busy = Load::start(&addrs[..2], "bucket", "b3", 280.0, 1);
    sleep(Duration::from_secs(3)).await;
    let busy = busy.stop().await;
    let during = remaining_everywhere(&lab, "long", "t3").await;
    // Under `hold` each side sets aside the share of the members it cannot reach: node-2
    // holds two thirds of every limit for node-0 and node-1, they hold a third for node-2.
    let mut held = Vec::new();
    for addr in &addrs {
        let text = metrics(*addr).await;
        held.push((
            metric(&text, "gossamer_cluster_suspected_peers"),
            metric(&text, "gossamer_cluster_held_share"),
        ));
    }
    let tracer = tracer.stop().await;
    let healed_at = Instant::now();
    match fault {
        Fault::LinkDown => lab.link(victim, true),
        Fault::OneWay => lab.nft_delete(victim, table),
    }
    eprintln!(
        "[{tag}] healed; tracer remaining just before: {during:?}; suspected peers and held share: {held:?}"
    );
    // (A one-way cut leaves what the others suspect to how QUIC and chitchat fare with
    // half a path.)
    let both_ways = matches!(fault, Fault::LinkDown);
    for (i, (suspected, share)) in held.into_iter().enumerate().filter(|_| both_ways) {
        let others = if i == victim { 2.0 } else { 1.0 };
        assert_eq!(
            suspected,
            Some(others),
            "[{tag}] node-{i} suspects the other side"
        );
        assert!(
            share.is_some_and(|s| (s - others / 3.0).abs() < 1e-3),
            "[{tag}] node-{i} holds {share:?} of every limit for the other side"
        );
    }
    let (took, remaining) = wait_agree(tag, &lab, "long", "t3", Duration::from_secs(15)).await;
    wait_formed(tag, &lab, Duration::from_secs(15)).await;
    sleep(Duration::from_secs(1)).await;
    let w = w.stop().await;
    let (hot, cold) = (hot.stop().await, cold.stop().await);
    lab.assert_running();
    let monitor = monitor.stop().await;
    monitor.report(tag, cut_at);
    let bucket: Vec<&Sample> = [&hot, &cold, &busy]
        .iter()
        .flat_map(|l| l.samples.iter())
        .collect();
    let (admitted, excess) = bucket_excess(&bucket);
    eprintln!(
        "[{tag}] token bucket 100/s burst 100: {admitted} admitted ({} hot at node-2, {} at the others, {} of them while cut off); most above burst + rate x tau over any interval: {excess:.1} (allowed N - 1 = 2)",
        hot.admitted(),
        cold.admitted() + busy.admitted(),
        busy.admitted()
    );
    assert!(
        excess <= 2.0,
        "[{tag}] the bucket admitted {excess:.1} above burst + rate x tau"
    );
    timeline(tag, &w, 3, cut_at);
    check_windows(
        tag,
        &lab.wall,
        &w,
        W_PERIOD,
        W_LIMIT,
        slack,
        &[("cut", cut_at), ("heal", healed_at)],
    );
    eprintln!(
        "[{tag}] fixed window per node admitted/answered: {}",
        per_node(&w, 3)
    );
    let counted = LONG_LIMIT - remaining;
    let recorded = tracer.admitted();
    eprintln!(
        "[{tag}] tracer: {recorded} admitted ({}), {counted} counted by the cluster; agreed {} ms after the heal",
        per_node(&tracer, 3),
        took.as_millis()
    );
    // A check the node admitted after its client gave up (a timeout while the node was cut
    // off) is counted but never seen: up to one per request without an answer.
    assert!(
        counted >= recorded && counted <= recorded + tracer.failures,
        "[{tag}] after the heal the cluster counts {counted} tracer admissions, the test saw {recorded} ({} without answer)",
        tracer.failures
    );
    print_rounds(tag, &lab).await;
    lab.finish();
}

/// 3. Link cut and heal (both directions), held to the limit exactly, as `hold` promises
///    (design §5). (Before holdings, the sides over-admitted up to 303/300 when they began
///    to suspect each other in different rounds.)
#[test]
fn link_cut_and_heal() {
    scenario("link-cut", 3, Duration::from_secs(60), |lab| {
        partition(lab, "link-cut", Fault::LinkDown)
    });
}

/// 4. One-way cut (the victim hears nobody, everybody hears the victim) and heal, held to the
///    limit exactly (design §5). (Before holdings, 302-313/300: the cut-off node suspected
///    its peers rounds before they suspected it, and kept the lease it held at its own n0
///    while they re-divided it.)
#[test]
fn one_way_cut_and_heal() {
    scenario("one-way", 3, Duration::from_secs(60), |lab| {
        partition(lab, "one-way", Fault::OneWay)
    });
}

/// 4b. A global limit changed node by node under load (design §3.8): a fixed window of
///    100/s, 600 checks a second over the three nodes, raised to 300/s in each node's file
///    (then SIGHUP) one second apart, held five seconds, then cut back to 100/s at node-2
///    first and 1.5 and 3 s later at the others. The smaller numbers are in force until
///    every node has the larger: no window is over 300; none that ends before the last
///    node's raise is over 100, nor any that starts two windows after the first node's cut
///    (with 300 ms for gossip), though two files still say 300; and the windows between the
///    raise and the cut that the load fills get at least 90% of 300.
#[test]
fn a_limit_changed_node_by_node_holds_its_bound() {
    let rules = |limit: u64| {
        format!(
            "[[rule]]\nname = \"api\"\nalgorithm = \"fixed_window\"\nlimit = {limit}\nperiod = \"1s\"\n"
        )
    };
    let first = rules(100);
    scenario_config(
        "relimit",
        3,
        3,
        &first,
        Duration::from_secs(60),
        |mut lab| async move {
            let tag = "relimit";
            wait_formed(tag, &lab, Duration::from_secs(15)).await;
            sleep(Duration::from_secs(1)).await;
            let load = Load::start(&lab.addrs(), "api", "k", 600.0, 2);
            let mut events: Vec<(String, Instant)> = Vec::new();
            let schedule = [
                (2000, 0, 300),
                (1000, 1, 300),
                (1000, 2, 300),
                // Raised for 5 s: at least two whole windows fall 1.3 s after the last raise
                // and before the first cut wherever in a window the raise lands (with 4 s, a
                // raise late in a window left one, and the test failed).
                (5000, 2, 100),
                (1500, 0, 100),
                (1500, 1, 100),
            ];
            for (after_ms, node, limit) in schedule {
                sleep(Duration::from_millis(after_ms)).await;
                lab.set_config(node, &rules(limit));
                lab.signal(node, "HUP");
                events.push((format!("node-{node} to {limit}"), Instant::now()));
            }
            sleep(Duration::from_secs(3)).await;
            let loaded = load.stop().await;
            lab.assert_running();
            let marks: Vec<(&str, Instant)> =
                events.iter().map(|(n, t)| (n.as_str(), *t)).collect();
            check_windows(
                tag,
                &lab.wall,
                &loaded,
                Duration::from_secs(1),
                300,
                0,
                &marks,
            );
            // Per window (by the reset the node named, as `check_windows` places them).
            let mut per: std::collections::BTreeMap<u64, u64> = std::collections::BTreeMap::new();
            for s in loaded.samples.iter().filter(|s| s.allowed) {
                let end = lab.wall.ms(s.answered) + s.reset_after_ms as f64;
                *per.entry((end / 1000.0).round() as u64 - 1).or_default() += 1;
            }
            let raised = lab.wall.ms(events[2].1);
            let cut = lab.wall.ms(events[3].1);
            let (load_from, load_to) = (lab.wall.ms(loaded.started), lab.wall.ms(loaded.stopped));
            let mut lower = 0;
            let mut filled = 0;
            for (&w, &n) in &per {
                let (start, end) = (w as f64 * 1000.0, (w + 1) as f64 * 1000.0);
                if end <= raised || start >= cut + 300.0 + 2000.0 {
                    lower += 1;
                    assert!(
                        n <= 100,
                        "[{tag}] window {w} admitted {n}, over the 100 in force: {per:?}"
                    );
                }
                if start >= raised + 300.0 + 1000.0
                    && end <= cut
                    && start >= load_from
                    && end <= load_to
                {
                    filled += 1;
                    assert!(
                        n >= 270,
                        "[{tag}] window {w} admitted {n} of the 300 in force: {per:?}"
                    );
                }
            }
            eprintln!("[{tag}] {lower} windows held to 100, {filled} raised windows filled");
            assert!(
                lower >= 3 && filled >= 2,
                "[{tag}] too few windows judged: {per:?}"
            );
            lab.finish();
        },
    );
}

/// 5. 20% of UDP packets (gossip and QUIC) dropped on input in every namespace: the limit
///    holds in every window, within the same 10% tolerance as the other fault scenarios (one
///    CI run saw 304/300 in the first window under loss: a known gap, design.md §10); prints
///    what the loss costs in admissions.
#[test]
fn udp_loss_20_percent() {
    scenario("loss", 3, Duration::from_secs(60), |mut lab| async move {
        let tag = "loss";
        wait_formed(tag, &lab, Duration::from_secs(15)).await;
        let table = "gossamer_loss";
        let rules = format!(
            "table inet {table} {{\n  chain input {{\n    type filter hook input priority 0; policy accept;\n    meta l4proto udp numgen random mod 100 < 20 drop\n  }}\n}}\n"
        );
        for i in 0..lab.nodes.len() {
            lab.nft(i, table, &rules);
        }
        let before = print_rounds(tag, &lab).await;
        let addrs = lab.addrs();
        let rate = 2.0 * W_LIMIT as f64 / W_PERIOD.as_secs_f64();
        let w = Load::start(&addrs, "w", "k5", rate, 2);
        sleep(Duration::from_secs(10)).await;
        let w = w.stop().await;
        lab.assert_running();
        let after = print_rounds(tag, &lab).await;
        let full = check_windows(tag, &lab.wall, &w, W_PERIOD, W_LIMIT, W_LIMIT / 10, &[]);
        eprintln!("[{tag}] per node admitted/answered: {}", per_node(&w, 3));
        let degraded: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
        let admitted: Vec<u64> = full.iter().map(|f| f.0).collect();
        let mean = admitted.iter().sum::<u64>() as f64 / admitted.len().max(1) as f64;
        eprintln!(
            "[{tag}] with 20% UDP loss: full windows admitted {admitted:?} of {W_LIMIT} (mean {:.1}%), degraded rounds per node during the load: {degraded:?} of ~100",
            100.0 * mean / W_LIMIT as f64
        );
        lab.finish();
    });
}

/// Admissions of a token bucket of [`BUCKET_RATE`] and [`BUCKET_BURST`], and the most they
/// exceed `burst + rate × τ` over any interval τ: for admissions i..j by time sent, τ runs
/// from i's sending to the last answer among them (each was admitted in between), so the
/// figure can only be generous to the cluster by the answers' latency.
fn bucket_excess(samples: &[&Sample]) -> (usize, f64) {
    let mut admitted: Vec<&Sample> = samples.iter().copied().filter(|s| s.allowed).collect();
    admitted.sort_by_key(|s| s.sent);
    let mut worst = f64::MIN;
    for (i, first) in admitted.iter().enumerate() {
        let mut last = first.answered;
        for (k, s) in admitted[i..].iter().enumerate() {
            last = last.max(s.answered);
            let tau = last.saturating_duration_since(first.sent).as_secs_f64();
            let excess = (k + 1) as f64 - BUCKET_BURST - BUCKET_RATE * tau;
            worst = worst.max(excess);
        }
    }
    (admitted.len(), worst)
}

// ---------------------------------------------------------------------------------------------
// Quiet users: no false 429s (design §3.3.3)

/// The per-user tiers of a real API, every rule global: the workload of
/// `benches/false_denials.py` (a token bucket, the three windows, and the hybrid of
/// docs/configuration.md).
const TIERS: &str = include_str!("../benches/false_denials.toml");

/// What [`quiet_users`] saw, per rule (in [`TIERS`] order) and in all.
#[derive(Debug, Default, Clone)]
struct Quiet {
    rules: Vec<(&'static str, QuietRule)>,
    /// Checks that got neither a 200 nor a 429 (or no answer).
    failed: u64,
    /// Checks the nodes held for their lease (`gossamer_check_lease_waits_total`, summed).
    lease_waits: u64,
    /// (checks, denied) per node, and per second of the load.
    per_node: Vec<(u64, u64)>,
    per_second: Vec<(u64, u64)>,
    /// Checks of bursts sent to a node that did not say it was ready (`/readyz`) when the
    /// burst began, in all, and those of them that failed: left out of everything above. The
    /// DaemonSet as shipped routes nothing to such a node (the app fails open or closed), so
    /// the figures above are what its users see; these are what a `hostPort` setup adds.
    unready: QuietRule,
    unready_failed: u64,
}

#[derive(Debug, Default, Clone, Copy)]
struct QuietRule {
    checks: u64,
    denied: u64,
    /// Checks answered after more than 10 ms.
    slow: u64,
    /// The slowest answer, µs.
    max_us: u64,
}

impl Quiet {
    fn all(&self) -> QuietRule {
        self.rules
            .iter()
            .fold(QuietRule::default(), |a, (_, r)| QuietRule {
                checks: a.checks + r.checks,
                denied: a.denied + r.denied,
                slow: a.slow + r.slow,
                max_us: a.max_us.max(r.max_us),
            })
    }

    fn print(&self, tag: &str) {
        for (name, r) in self
            .rules
            .iter()
            .map(|(n, r)| (*n, *r))
            .chain([("all", self.all())])
        {
            eprintln!(
                "[{tag}] {name:>7}: {} checks, {} denied ({:.2}%), {} over 10 ms, slowest {:.1} ms",
                r.checks,
                r.denied,
                100.0 * r.denied as f64 / r.checks.max(1) as f64,
                r.slow,
                r.max_us as f64 / 1000.0
            );
        }
        eprintln!(
            "[{tag}] failed: {}, held for a lease by the nodes: {}",
            self.failed, self.lease_waits
        );
        let show = |v: &[(u64, u64)]| {
            v.iter()
                .map(|(c, d)| format!("{d}/{c}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let u = &self.unready;
        eprintln!(
            "[{tag}] sent to a node not ready (not counted above): {} checks, {} denied, {} over 10 ms, {} failed",
            u.checks, u.denied, u.slow, self.unready_failed
        );
        eprintln!("[{tag}] denied/checks per node: {}", show(&self.per_node));
        eprintln!(
            "[{tag}] denied/checks per second: {}",
            show(&self.per_second)
        );
    }
}

/// Per (rule, user): when each of its checks was sent.
type Sent = HashMap<(usize, u64), Vec<Instant>>;

/// Whether each node said it was ready (`/readyz` 200) when last asked.
type Ready = Arc<Vec<AtomicBool>>;

/// Asks every node's `/readyz` once (each within 100 ms) and records the answers in `ready`.
async fn poll_ready(
    addrs: &[std::net::SocketAddr],
    clients: &mut [Option<gossamer_client::raw::Client>],
    ready: &Ready,
) {
    for (i, addr) in addrs.iter().enumerate() {
        let ask = async {
            if clients[i].is_none() {
                clients[i] = gossamer_client::raw::Client::connect_addr(*addr).await.ok();
            }
            let reply = clients[i].as_mut()?.get("/readyz").await.ok()?;
            Some(reply.status.as_u16() == 200)
        };
        let ok = timeout(Duration::from_millis(100), ask)
            .await
            .ok()
            .flatten()
            .unwrap_or(false);
        if !ok {
            clients[i] = None;
        }
        ready[i].store(ok, Ordering::Relaxed);
    }
}

/// Keeps `ready` current, asking every 10 ms, until `until`.
async fn watch_ready(addrs: Vec<std::net::SocketAddr>, ready: Ready, until: Instant) {
    let mut clients: Vec<Option<gossamer_client::raw::Client>> =
        addrs.iter().map(|_| None).collect();
    while Instant::now() < until {
        poll_ready(&addrs, &mut clients, &ready).await;
        sleep(Duration::from_millis(10)).await;
    }
}

/// The rules of [`TIERS`] the quiet users call: (rule, at most per minute, at most per second).
type QuietRules = &'static [(&'static str, u64, u64)];

/// Every tier: no user comes past half of any limit of its rule.
const QUIET_RULES: QuietRules = &[
    ("bucket", 30, u64::MAX),
    ("fixed", 30, u64::MAX),
    ("log", 30, u64::MAX),
    ("counter", 30, u64::MAX),
    ("hybrid", 150, 5),
];

/// `users` users send bursts of 1 to 5 checks of one rule each, `bursts` bursts a second in
/// all, each burst to a random node, for `dur`, from `tasks` client tasks. No user comes near a
/// limit: a burst that would take a user past half of any limit of its rule (in the last
/// minute, and for the hybrid's bucket in the last second) is skipped, so every check is one
/// that a single exact counter would admit at once, and every 429 is false.
async fn quiet_users(
    addrs: Vec<std::net::SocketAddr>,
    ready: Ready,
    seed: u64,
    users: u64,
    bursts: f64,
    dur: Duration,
    rules: QuietRules,
) -> Quiet {
    let tasks = 6usize;
    let sent: Arc<Mutex<Sent>> = Arc::default();
    let period = Duration::from_secs_f64(tasks as f64 / bursts);
    let end = Instant::now() + dur;
    let mut handles = Vec::new();
    for t in 0..tasks {
        let addrs = addrs.clone();
        let ready = ready.clone();
        let sent = sent.clone();
        handles.push(tokio::spawn(async move {
            let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (t as u64 + 1);
            let mut next = move || {
                rng ^= rng >> 12;
                rng ^= rng << 25;
                rng ^= rng >> 27;
                rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
            };
            let mut clients: Vec<Option<gossamer_client::raw::Client>> =
                addrs.iter().map(|_| None).collect();
            let mut seen = vec![QuietRule::default(); rules.len()];
            let mut per_node = vec![(0u64, 0u64); addrs.len()];
            let mut by_second = vec![(0u64, 0u64); dur.as_secs() as usize + 1];
            let mut failed = 0u64;
            let (mut unready, mut unready_failed) = (QuietRule::default(), 0u64);
            sleep(period.mul_f64(t as f64 / tasks as f64)).await;
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while Instant::now() < end {
                tick.tick().await;
                let node = (next() % addrs.len() as u64) as usize;
                let rule = (next() % rules.len() as u64) as usize;
                let user = next() % users;
                let burst = 1 + next() % 5;
                let (name, per_minute, per_second) = rules[rule];
                {
                    let mut sent = sent.lock().unwrap_or_else(|p| p.into_inner());
                    let times = sent.entry((rule, user)).or_default();
                    let now = Instant::now();
                    times.retain(|&s| now.duration_since(s) < Duration::from_secs(61));
                    let last_second = times
                        .iter()
                        .filter(|&&s| now.duration_since(s) < Duration::from_millis(1100))
                        .count() as u64;
                    if times.len() as u64 + burst > per_minute || last_second + burst > per_second {
                        continue;
                    }
                    times.extend((0..burst).map(|_| now));
                }
                let body =
                    serde_json::json!({"rule": name, "key": format!("user-{user}"), "cost": 1});
                let was_ready = ready[node].load(Ordering::Relaxed);
                for _ in 0..burst {
                    if clients[node].is_none() {
                        clients[node] = timeout(
                            Duration::from_millis(500),
                            gossamer_client::raw::Client::connect_addr(addrs[node]),
                        )
                        .await
                        .ok()
                        .and_then(Result::ok);
                    }
                    let Some(client) = clients[node].as_mut() else {
                        *(if was_ready {
                            &mut failed
                        } else {
                            &mut unready_failed
                        }) += 1;
                        continue;
                    };
                    let started = Instant::now();
                    let reply =
                        timeout(Duration::from_secs(2), client.post("/v1/check", &body)).await;
                    let took = started.elapsed();
                    let r = if was_ready {
                        &mut seen[rule]
                    } else {
                        &mut unready
                    };
                    match reply {
                        Ok(Ok(reply))
                            if !was_ready && matches!(reply.status.as_u16(), 200 | 429) =>
                        {
                            r.checks += 1;
                            r.denied += u64::from(reply.status.as_u16() == 429);
                            r.slow += u64::from(took > Duration::from_millis(10));
                            r.max_us = r.max_us.max(took.as_micros() as u64);
                        }
                        Ok(Ok(reply)) if matches!(reply.status.as_u16(), 200 | 429) => {
                            r.checks += 1;
                            r.denied += u64::from(reply.status.as_u16() == 429);
                            r.slow += u64::from(took > Duration::from_millis(10));
                            r.max_us = r.max_us.max(took.as_micros() as u64);
                            let denied = u64::from(reply.status.as_u16() == 429);
                            let second = started.duration_since(end - dur).as_secs();
                            for tally in [
                                &mut per_node[node],
                                &mut by_second[(second as usize).min(dur.as_secs() as usize)],
                            ] {
                                tally.0 += 1;
                                tally.1 += denied;
                            }
                        }
                        _ => {
                            *(if was_ready {
                                &mut failed
                            } else {
                                &mut unready_failed
                            }) += 1;
                            clients[node] = None;
                        }
                    }
                }
            }
            (seen, failed, per_node, by_second, unready, unready_failed)
        }));
    }
    let mut quiet = Quiet {
        rules: rules
            .iter()
            .map(|(n, _, _)| (*n, QuietRule::default()))
            .collect(),
        failed: 0,
        lease_waits: 0,
        per_node: vec![(0, 0); addrs.len()],
        per_second: vec![(0, 0); dur.as_secs() as usize + 1],
        unready: QuietRule::default(),
        unready_failed: 0,
    };
    for h in handles {
        let (seen, failed, per_node, per_second, unready, unready_failed) =
            h.await.expect("client task");
        quiet.failed += failed;
        quiet.unready_failed += unready_failed;
        quiet.unready.checks += unready.checks;
        quiet.unready.denied += unready.denied;
        quiet.unready.slow += unready.slow;
        quiet.unready.max_us = quiet.unready.max_us.max(unready.max_us);
        for (total, (c, d)) in quiet.per_node.iter_mut().zip(per_node) {
            *total = (total.0 + c, total.1 + d);
        }
        for (total, (c, d)) in quiet.per_second.iter_mut().zip(per_second) {
            *total = (total.0 + c, total.1 + d);
        }
        for ((_, a), r) in quiet.rules.iter_mut().zip(seen) {
            a.checks += r.checks;
            a.denied += r.denied;
            a.slow += r.slow;
            a.max_us = a.max_us.max(r.max_us);
        }
    }
    quiet
}

/// 5. Many users far below their limits (design §3.3.3): 2,000 users of the tiers send bursts
///    of 1 to 5 checks to random nodes, 60 bursts a second for 6 s. Every 429 is false.
///
///    Asserted, on a healthy cluster of the debug build (what CI runs): no check fails, is
///    refused, is held for a lease or takes over 10 ms. What still refuses is in the scenarios
///    below, reported: a lost frame, a crash, a restart (design §3.3.3); a release build
///    (`LAB_BIN=target/release/gossamer`) is what design §3.3.3 reports.
#[test]
fn quiet_users_are_never_refused() {
    quiet_scenario("quiet-strict", QuietFault::None, |q| {
        let all = q.all();
        assert_eq!(q.failed + q.unready_failed, 0, "checks failed");
        assert!(all.checks > 600, "too few checks: {all:?}");
        // Every node is ready throughout; a check counted as sent to one that was not (its
        // /readyz slow to answer) must be admitted at once all the same.
        let u = &q.unready;
        assert_eq!(
            (all.denied + u.denied, all.slow + u.slow),
            (0, 0),
            "{all:?} {u:?}"
        );
        assert_eq!(q.lease_waits, 0, "checks held for a lease");
    });
}

/// 5b. The same users with 5% of UDP datagrams dropped at every node: reported, and only
///     failures asserted (a lost frame degrades a round: design §3.3.4).
#[test]
fn quiet_users_under_loss() {
    quiet_scenario("quiet-loss", QuietFault::Loss(5), |q| {
        assert_eq!(q.failed, 0, "checks failed")
    });
}

/// 5c. The same users while node-2 is killed 2 s into the load and restarted 1 s later:
///     reported (the bursts sent to node-2 while it is down fail).
#[test]
fn quiet_users_through_a_restart() {
    quiet_scenario("quiet-restart", QuietFault::Restart, |q| {
        let all = q.all();
        assert!(all.checks > 600, "too few checks: {all:?}");
    });
}

/// 5d. The same users while node-2 is stopped with SIGTERM (a graceful leave) and restarted
///     1 s later, as a rolling update does: reported.
#[test]
fn quiet_users_through_a_rolling_update() {
    quiet_scenario("quiet-update", QuietFault::Terminate, |q| {
        let all = q.all();
        assert!(all.checks > 600, "too few checks: {all:?}");
    });
}

/// 5e. The same users while node-2 is killed 2 s into the load and not restarted (its bursts
///     fail from then on), under the default `hold`, in the cluster's first window: from the
///     second after the kill, at most 2% refused (design §5, "Keys idle at the record": a
///     survivor admits a key that was idle when node-2 was lost, up to its share; before
///     that, about 70% were refused there). The kill's own second is reported: keys new at a
///     survivor between the kill and its suspicion are refused.
#[test]
fn quiet_users_after_a_crash() {
    quiet_scenario("quiet-crash", QuietFault::Crash, |q| {
        let all = q.all();
        assert!(all.checks > 400, "too few checks: {all:?}");
        assert_refused_after_the_kill(q, 3, 50);
    });
}

/// Asserts that of the checks from second `from` of the load on (node-2 is killed at 2 s), at
/// most one in `one_in` was refused.
fn assert_refused_after_the_kill(q: &Quiet, from: usize, one_in: u64) {
    let (checks, denied) = q.per_second[from..]
        .iter()
        .fold((0, 0), |(c, d), (c1, d1)| (c + c1, d + d1));
    assert!(checks > 100, "too few checks after the kill: {checks}");
    assert!(
        denied * one_in <= checks,
        "{denied} of {checks} refused from second {from} on: {:?}",
        q.per_second
    );
}

/// 5f. As 5e under `on_partition = "split"`: once the member is declared dead (about a
///     second), the side is whole again and refuses no more than a healthy one. Asserted
///     from 2 s after the kill: at most a tenth refused.
#[test]
fn quiet_users_after_a_crash_under_split() {
    quiet_scenario_config(
        "quiet-crash-split",
        "[cluster]\non_partition = \"split\"",
        QuietFault::Crash,
        false,
        |q| {
            let all = q.all();
            assert!(all.checks > 400, "too few checks: {all:?}");
            assert_refused_after_the_kill(q, 4, 10);
        },
    );
}

/// 5g. In a cluster up for longer than its longest window (the load starts in the minute
///     after it formed, so every node is based: design §3.3.1), no quiet check of a fixed
///     window or a bucket is refused, on the debug build too, whose rounds degrade under this
///     load (a degraded round refuses nothing where every node is based). The sliding
///     algorithms have no bases: a key new at a node after a degraded instant waits for the
///     next consistent one (a lease wait, or a 429 if that one degrades too), so theirs are
///     held to a loose bound and reported. Waits up to a minute.
#[test]
fn quiet_buckets_and_fixed_windows_in_a_based_window_are_never_refused() {
    quiet_scenario_config("quiet-based", "", QuietFault::None, true, |q| {
        let all = q.all();
        assert_eq!(q.failed, 0, "checks failed");
        assert!(all.checks > 600, "too few checks: {all:?}");
        for (rule, r) in &q.rules {
            if matches!(*rule, "fixed" | "bucket") {
                assert!(r.checks > 100, "{rule}: too few checks: {r:?}");
                assert_eq!(r.denied, 0, "{rule}: {r:?}");
            }
        }
        assert!(all.denied * 20 <= all.checks, "over 5% denied: {all:?}");
    });
}

/// 5h. As 5e (node-2 killed 2 s in and not restarted, under the default `hold`) in a based
///     window: the survivors keep their bases and refuse no quiet check of a fixed window or
///     a bucket. The sliding algorithms have no bases (design §3.3.1): a key new at a
///     survivor is served as a key idle at the record (design §5), so from the second after
///     the kill at most 2% of all checks are refused (before that rule, 17%: most of the
///     counter's). Waits up to a minute.
#[test]
fn quiet_buckets_and_fixed_windows_after_a_crash_in_a_based_window_are_never_refused() {
    quiet_scenario_config("quiet-crash-based", "", QuietFault::Crash, true, |q| {
        let all = q.all();
        assert!(all.checks > 400, "too few checks: {all:?}");
        for (rule, r) in &q.rules {
            if matches!(*rule, "fixed" | "bucket") {
                assert!(r.checks > 60, "{rule}: too few checks: {r:?}");
                assert_eq!(r.denied, 0, "{rule}: {r:?}");
            }
        }
        assert_refused_after_the_kill(q, 3, 50);
    });
}

/// The quiet users' fixed window of [`TIERS`] alone, over the aggregation tree (which runs
/// global fixed windows only).
const TREE_QUIET: &str = r#"
[cluster]
exchange = "tree"

[[rule]]
name = "fixed"
algorithm = "fixed_window"
limit = 60
period = "1m"
"#;

/// 5i. Over the aggregation tree (design §11.1), in a based window, through a crash of node-2
///     2 s into the load (not restarted): every member holds a base of every key, and the
///     crash freezes the open window but leaves the survivors their bases, so no quiet check
///     is refused (before bases a key's first check at a node waited for a round's grant, and
///     after the crash none came). Waits up to a minute.
#[test]
fn quiet_users_over_the_tree_in_a_based_window_are_never_refused() {
    let rules: QuietRules = &[("fixed", 30, u64::MAX)];
    let config = TREE_QUIET.to_owned();
    quiet_scenario_rules("quiet-tree", config, rules, QuietFault::Crash, true, |q| {
        let all = q.all();
        assert!(all.checks > 400, "too few checks: {all:?}");
        assert_eq!(all.denied, 0, "{all:?}: {:?}", q.per_second);
    });
}

/// What happens to the cluster while [`quiet_users`] runs.
#[derive(Debug, Clone, Copy)]
enum QuietFault {
    None,
    /// This percentage of UDP datagrams dropped at every node.
    Loss(u32),
    /// Node-2 killed 2 s into the load and restarted (same id) 1 s later.
    Restart,
    /// Node-2 stopped with SIGTERM (it leaves the cluster) 2 s into the load, and restarted
    /// 1 s later: a rolling update.
    Terminate,
    /// Node-2 killed 2 s into the load, not restarted (a machine lost).
    Crash,
}

/// Runs [`quiet_users`] on 3 nodes serving [`TIERS`] under `fault`, prints what it saw, and
/// hands it to `judge`.
fn quiet_scenario(tag: &'static str, fault: QuietFault, judge: impl FnOnce(&Quiet)) {
    // QUIET_BASED=1 starts these loads in a based window too (a measurement: it adds up to a
    // minute per run).
    let based = std::env::var_os("QUIET_BASED").is_some();
    quiet_scenario_config(tag, "", fault, based, judge);
}

/// [`quiet_scenario_rules`] on every tier.
fn quiet_scenario_config(
    tag: &'static str,
    cluster: &str,
    fault: QuietFault,
    based: bool,
    judge: impl FnOnce(&Quiet),
) {
    let config = format!("{cluster}\n{TIERS}");
    quiet_scenario_rules(tag, config, QUIET_RULES, fault, based, judge);
}

/// [`quiet_scenario`] with `config` (the addresses come from the command line), the quiet
/// users calling `rules`. With `based`, the load starts in the minute after the cluster
/// formed, as in a cluster that has been up longer than its longest window, where every node
/// is based (design §3.3.1); that waits up to a minute.
fn quiet_scenario_rules(
    tag: &'static str,
    config: String,
    rules: QuietRules,
    fault: QuietFault,
    based: bool,
    judge: impl FnOnce(&Quiet),
) {
    scenario_config(
        tag,
        3,
        3,
        &config,
        Duration::from_secs(if based { 130 } else { 60 }),
        |mut lab| async move {
            wait_formed(tag, &lab, Duration::from_secs(15)).await;
            // Let the first rounds settle, as a cluster that has been up a while would be.
            sleep(Duration::from_secs(1)).await;
            if based {
                // Past the minute window open when the cluster formed: every node is based
                // in the next one (design §3.3.1).
                let into = lab.wall.ms(Instant::now()).rem_euclid(60_000.0);
                let wait = Duration::from_secs_f64((61_000.0 - into) / 1e3);
                sleep(wait).await;
                eprintln!("[{tag}] waited {wait:?} for the next minute window");
            }
            if let QuietFault::Loss(loss) = fault {
                let table = "gossamer_loss";
                let rules = format!(
                    "table inet {table} {{\n  chain input {{\n    type filter hook input priority 0; policy accept;\n    meta l4proto udp numgen random mod 100 < {loss} drop\n  }}\n}}\n"
                );
                for i in 0..lab.nodes.len() {
                    lab.nft(i, table, &rules);
                }
            }
            let before = print_rounds(tag, &lab).await;
            let ready: Ready =
                Arc::new(lab.addrs().iter().map(|_| AtomicBool::new(false)).collect());
            let mut clients: Vec<_> = lab.addrs().iter().map(|_| None).collect();
            poll_ready(&lab.addrs(), &mut clients, &ready).await;
            let watcher = tokio::spawn(watch_ready(
                lab.addrs(),
                ready.clone(),
                Instant::now() + Duration::from_secs(8),
            ));
            let load = tokio::spawn(quiet_users(
                lab.addrs(),
                ready,
                1,
                2_000,
                60.0,
                Duration::from_secs(6),
                rules,
            ));
            if let QuietFault::Crash = fault {
                sleep(Duration::from_secs(2)).await;
                lab.kill(2);
                eprintln!("[{tag}] SIGKILL node-2, not restarted");
            }
            if let QuietFault::Restart | QuietFault::Terminate = fault {
                sleep(Duration::from_secs(2)).await;
                if let QuietFault::Restart = fault {
                    lab.kill(2);
                    eprintln!("[{tag}] SIGKILL node-2");
                } else {
                    let took = lab.terminate(2, Duration::from_secs(5)).await;
                    eprintln!("[{tag}] SIGTERM node-2: exited after {took:?}");
                }
                sleep(Duration::from_secs(1)).await;
                lab.start(2);
                eprintln!("[{tag}] restarted node-2 (same id) after 1 s down");
            }
            let mut q = load.await.expect("quiet users");
            watcher.abort();
            let mut waits_per_node = Vec::new();
            for addr in lab.addrs() {
                let text = metrics(addr).await;
                let waits = metric(&text, "gossamer_check_lease_waits_total");
                waits_per_node.push(waits.unwrap_or(0.0) as u64);
                q.lease_waits += waits.unwrap_or(0.0) as u64;
            }
            eprintln!("[{tag}] held for a lease per node: {waits_per_node:?}");
            if !matches!(fault, QuietFault::Crash) {
                lab.assert_running();
            }
            let after = print_rounds(tag, &lab).await;
            let degraded: Vec<u64> = after
                .iter()
                .zip(&before)
                .map(|(a, b)| a.saturating_sub(*b))
                .collect();
            eprintln!("[{tag}] degraded rounds per node during the load: {degraded:?} of ~60");
            q.print(tag);
            judge(&q);
            lab.finish();
        },
    );
}
