//! Real-network chaos suite (issue 4, part 2): 5 nodes of the real `gossamer` binary, each in
//! its own network namespace, real UDP (chitchat) and QUIC between them, under load, through
//! the faults a cluster meets in production: a rolling restart, a one-way partition, a node
//! paused past failure detection, a flapping link, 30% UDP loss and a node joining mid-load.
//! The lab (namespaces, bridges, nodes, nftables, load generators) is `tests/support/lab.rs`,
//! shared with `tests/netns.rs`; its layout and cleanup are described there.
//!
//! Every scenario runs the same two loads: `w` (300 per 3 s fixed window, at 2x its limit,
//! spread evenly over the nodes) and a *tracer* on `long` (10⁶ per day, 90 checks/s), whose
//! admissions the test records. Each checks, and prints as one `FIGURES` line:
//!
//! - **windows**: every 3 s window of `w` admits at most the limit plus the extra design.md
//!   allows for that fault (cited at each scenario), and the over-admission summed over all
//!   windows stays within that extra too (the design's extras are once per fault, not per
//!   window);
//! - **convergence**: once the faults stop (and the tracer with them), every node reports the
//!   same `remaining` for the tracer within [`CONVERGE`] (stretched when the machine is so
//!   loaded that the nodes run fewer rounds than one per T: [`converge_bound`]);
//! - **counts**: the cluster's count of the tracer, once it agrees, is at least the admissions
//!   the test saw less what a crash may lose (design §2.4: the unpublished last round of a
//!   stopped node) and at most those plus what the cluster may count that the test never saw
//!   (a retired actor's charge, design §5; requests admitted after the client gave up);
//! - **whole**: at the end every node sees all 5 members alive and unsuspected, says
//!   `/readyz` 200, and no node process exited on its own.
//!
//! Needs root, `ip` and `nft` (each test says why and passes without them). Run with
//! `cargo test --test chaos -- --nocapture --test-threads=1` to see the figures. Every
//! scenario holds each window to the limit exactly. `CHAOS_SEED=n` replays the flapping schedule of a run (it prints its seed);
//! `CHAOS_TIMELINE=1` prints admissions per node per 500 ms.

#[path = "support/env.rs"]
mod env;
#[path = "support/lab.rs"]
mod lab;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lab::*;
use tokio::time::sleep;

/// Nodes in every scenario.
const N: usize = 5;
/// Round length T (design §1: `gossip_interval`, 100 ms by default, which the lab keeps).
const T: Duration = Duration::from_millis(100);
/// Missing frames before a peer is suspected (design §3.3.4).
const M: u32 = 3;
/// Tracer checks per second, over all nodes.
const TRACER_RATE: f64 = 90.0;
/// Longest a scenario may take, lab setup and cleanup aside: a guard against a hang. They take
/// 10-15 s on an otherwise idle 2-core machine, and up to ~40 s when other builds share it.
const SCENARIO_LIMIT: Duration = Duration::from_secs(60);
/// How soon after the faults stop every node must agree on the tracer's `remaining`. Design
/// §2.3: a heal converges within the reconnect time plus T + 2(L + P), inside issue 3's 2 s
/// target when chitchat and QUIC see the peer again within ~1.5 s; a lost frame within one
/// anti-entropy period, (K + 1)·T + 2(L + P) ≈ 1.1 s. Plus 1 s for this measurement on 2
/// shared cores: every poll reads 5 nodes one after the other on fresh connections, and the
/// value must hold for 150 ms.
const CONVERGE: Duration = Duration::from_secs(3);

/// The slowest node's pace: on-time rounds (consistent or degraded; a round that runs late
/// counts as neither) per round of wall time, over `span` (which this waits). 1 on an idle
/// machine; lower when the nodes are starved of CPU. Nodes that do not answer are skipped.
async fn pace(lab: &Lab, span: Duration) -> f64 {
    async fn rounds(lab: &Lab) -> Vec<Option<f64>> {
        let mut out = Vec::new();
        for addr in lab.addrs() {
            let text = metrics(addr).await;
            let c = metric(&text, "gossamer_cluster_rounds_total{state=\"consistent\"}");
            let d = metric(&text, "gossamer_cluster_rounds_total{state=\"degraded\"}");
            out.push(c.zip(d).map(|(c, d)| c + d));
        }
        out
    }
    let before = rounds(lab).await;
    let from = Instant::now();
    sleep(span).await;
    let after = rounds(lab).await;
    let due = from.elapsed().as_secs_f64() / T.as_secs_f64();
    before
        .iter()
        .zip(&after)
        .filter_map(|(b, a)| Some((a.as_ref()? - b.as_ref()?) / due))
        .fold(1.0_f64, f64::min)
        .max(0.0)
}

/// [`CONVERGE`] at `pace`: the design's bounds count rounds (T, K·T) and a starved node runs
/// fewer of them per second, so the bound stretches by 1/pace (at most 4x: below a pace of
/// 1/4 the nodes are not running the protocol the design describes at all).
fn converge_bound(pace: f64) -> Duration {
    CONVERGE.mul_f64(1.0 / pace.clamp(0.25, 1.0))
}

/// `w` at twice its limit.
fn w_rate() -> f64 {
    2.0 * W_LIMIT as f64 / W_PERIOD.as_secs_f64()
}

/// (index, HTTP address) of the nodes `nodes`.
fn on(lab: &Lab, nodes: impl IntoIterator<Item = usize>) -> Vec<(usize, SocketAddr)> {
    nodes
        .into_iter()
        .map(|i| (i, lab.nodes[i].http()))
        .collect()
}

/// Admissions per `w` window, by the window each node reported (as [`check_windows`]).
fn window_totals(wall: &Wall, loaded: &Loaded) -> BTreeMap<u64, u64> {
    let w = W_PERIOD.as_millis() as f64;
    let mut per = BTreeMap::new();
    for s in loaded.samples.iter().filter(|s| s.allowed) {
        let end = wall.ms(s.answered) + s.reset_after_ms as f64;
        *per.entry((end / w).round() as u64 - 1).or_default() += 1;
    }
    per
}

/// Admissions answered by the nodes `nodes` in [from, to].
fn admitted_between(loaded: &Loaded, nodes: &[usize], from: Instant, to: Instant) -> u64 {
    loaded
        .samples
        .iter()
        .filter(|s| s.allowed && nodes.contains(&s.node))
        .filter(|s| s.answered >= from && s.answered <= to)
        .count() as u64
}

/// Merges the samples of several loads of the same (rule, key) into one.
fn merge(parts: Vec<Loaded>) -> Loaded {
    let started = parts.iter().map(|l| l.started).min().expect("a load");
    let stopped = parts.iter().map(|l| l.stopped).max().expect("a load");
    let mut out = Loaded {
        samples: Vec::new(),
        failures: 0,
        unanswered: Vec::new(),
        started,
        stopped,
    };
    for p in parts {
        out.samples.extend(p.samples);
        out.failures += p.failures;
        out.unanswered.extend(p.unanswered);
    }
    out.samples.sort_by_key(|s| s.answered);
    out
}

/// What one scenario measured.
#[derive(Debug, Default)]
struct Figures {
    /// Admitted in each full window of `w`.
    full: Vec<u64>,
    /// The largest window total.
    worst: u64,
    /// Over-admission summed over the windows.
    over: u64,
    /// The extra the design allows for this fault.
    allowance: u64,
    /// From the end of the faults to the tracer's agreement.
    converged: Duration,
    /// Tracer admissions the test saw.
    recorded: u64,
    /// Tracer admissions the cluster counts, once it agrees.
    counted: u64,
    /// What the count may fall short of `recorded` (crashes).
    may_lose: u64,
    /// What the count may exceed `recorded` by (retired actors, unanswered requests).
    may_gain: u64,
    /// From the end of the faults until the cluster was whole again.
    whole: Duration,
    /// The slowest node's on-time rounds per round of wall time before the faults ([`pace`]).
    pace: f64,
}

impl Figures {
    /// Prints the scenario's one summary line (`grep FIGURES` collects a run's).
    fn print(&self, tag: &str) {
        let lost = self.recorded as i64 - self.counted as i64;
        // The machine's 1-minute load average (other builds share it): context for the pace.
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let load = load.split_whitespace().next().unwrap_or("?");
        eprintln!(
            "[{tag}] FIGURES: load {load}, pace {:.2}; full windows {:?} of {W_LIMIT}; worst window {} (over by {}, summed over windows {}, allowed {}); tracer converged {} ms after the faults stopped; tracer admitted {}, counted {} (lost {lost}; may lose {}, may gain {}); whole again {} ms after the faults stopped",
            self.pace,
            self.full,
            self.worst,
            self.worst.saturating_sub(W_LIMIT),
            self.over,
            self.allowance,
            self.converged.as_millis(),
            self.recorded,
            self.counted,
            self.may_lose,
            self.may_gain,
            self.whole.as_millis(),
        );
    }
}

/// With `CHAOS_TIMELINE` set: per node, admitted/answered checks of `loaded` per 500 ms from
/// the start of the load (a debugging aid).
fn chaos_timeline(tag: &str, what: &str, loaded: &Loaded) {
    if std::env::var_os("CHAOS_TIMELINE").is_none() {
        return;
    }
    let step = Duration::from_millis(500);
    let slots = ((loaded.stopped - loaded.started).as_millis() / step.as_millis()) as usize + 2;
    for i in 0..N {
        let mut per = vec![(0u32, 0u32); slots.min(200)];
        for s in loaded.samples.iter().filter(|s| s.node == i) {
            let b = ((s.answered.saturating_duration_since(loaded.started)).as_millis()
                / step.as_millis()) as usize;
            if let Some(slot) = per.get_mut(b) {
                slot.0 += u32::from(s.allowed);
                slot.1 += 1;
            }
        }
        let line: Vec<String> = per.iter().map(|(a, n)| format!("{a}/{n}")).collect();
        eprintln!(
            "[{tag}] {what} node-{i} admitted/answered per 500 ms: {}",
            line.join(" ")
        );
    }
}

/// Both ends of every scenario, polled together from `faults_end` on: every node agrees on
/// the tracer's `remaining` (how long that took, and what it counts), and the cluster is
/// whole again (all members alive and unsuspected everywhere, every node ready, no node
/// process exited on its own). The tracer must be stopped.
async fn settle(tag: &str, lab: &mut Lab, key: &str, faults_end: Instant, f: &mut Figures) {
    let asked = Instant::now();
    let lab_ref: &Lab = lab;
    let ((took, remaining), formed) = tokio::join!(
        wait_agree(tag, lab_ref, "long", key, Duration::from_secs(15)),
        wait_formed(tag, lab_ref, Duration::from_secs(15)),
    );
    f.converged = (asked - faults_end) + took;
    f.counted = LONG_LIMIT - remaining;
    f.whole = (asked - faults_end) + formed;
    lab.assert_running();
}

/// Prints the figures and the windows of `w` (with `events`), then asserts them: every
/// window, and the over-admission summed over the windows, within `f.allowance`; the
/// tracer's agreement within [`CONVERGE`]; its count within
/// [recorded − may_lose, recorded + may_gain].
fn verdict(tag: &str, lab: &Lab, w: &Loaded, events: &[(&str, Instant)], f: &mut Figures) {
    let totals = window_totals(&lab.wall, w);
    let period = W_PERIOD.as_millis() as f64;
    let (start, end) = (lab.wall.ms(w.started), lab.wall.ms(w.stopped));
    f.full = totals
        .iter()
        .filter(|&(&i, _)| i as f64 * period >= start && (i + 1) as f64 * period <= end)
        .map(|(_, &n)| n)
        .collect();
    f.worst = totals.values().copied().max().unwrap_or(0);
    f.over = totals.values().map(|n| n.saturating_sub(W_LIMIT)).sum();
    f.print(tag);
    eprintln!("[{tag}] per node admitted/answered: {}", per_node(w, N));
    chaos_timeline(tag, "w", w);
    // Prints every window; asserts each within the limit plus the allowance.
    check_windows(tag, &lab.wall, w, W_PERIOD, W_LIMIT, f.allowance, events);
    assert!(
        f.over <= f.allowance,
        "[{tag}] admitted {} over the limit summed over the windows, the design allows {} for this fault",
        f.over,
        f.allowance
    );
    assert!(
        f.counted + f.may_lose >= f.recorded && f.counted <= f.recorded + f.may_gain,
        "[{tag}] the cluster counts {} tracer admissions, the test saw {} (may lose {}, may gain {})",
        f.counted,
        f.recorded,
        f.may_lose,
        f.may_gain
    );
    let bound = converge_bound(f.pace);
    assert!(
        f.converged <= bound,
        "[{tag}] the nodes agreed on the tracer {} ms after the faults stopped (bound {} ms at pace {:.2})",
        f.converged.as_millis(),
        bound.as_millis(),
        f.pace
    );
}

/// The loads every scenario runs on the nodes `nodes`: `w` at 2x its limit (in proportion to
/// the nodes loaded, out of [`N`]) and the tracer.
fn loads(lab: &Lab, nodes: &[usize], key: &str) -> (Load, Load) {
    let share = nodes.len() as f64 / N as f64;
    let nodes = on(lab, nodes.iter().copied());
    let w = Load::start_on(&nodes, "w", key, w_rate() * share, 2, true);
    let tracer = Load::start_on(&nodes, "long", key, TRACER_RATE * share, 1, true);
    (w, tracer)
}

/// Waits past the start of the next window, `offset` into it.
async fn into_next_window(lab: &Lab, offset: Duration) {
    sleep(until_window_offset(&lab.wall, W_PERIOD, offset)).await;
}

/// `ip saddr` drop rule for node `victim`'s input from every other node's data address.
fn one_way_rules(lab: &Lab, victim: usize, table: &str) -> String {
    let others: Vec<String> = lab
        .nodes
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != victim)
        .map(|(_, n)| n.data_ip.to_string())
        .collect();
    format!(
        "table inet {table} {{\n  chain input {{\n    type filter hook input priority 0; policy accept;\n    ip saddr {{ {} }} drop\n  }}\n}}\n",
        others.join(", ")
    )
}

/// What the retirement of a restarted node's old actor may add to the tracer's count (design
/// §5, "A dead member under hold"): at most twice its demand per round for up to 4 rounds,
/// plus its gap credit (at least 1, §10 "A minimum credit"), plus its check in flight. Its
/// demand per round is about what it admitted per round in the second before it stopped.
fn retirement_charge(tracer: &Loaded, victim: usize, stopped: Instant) -> u64 {
    let last_second = tracer
        .samples
        .iter()
        .filter(|s| s.node == victim && s.allowed)
        .filter(|s| s.answered <= stopped && stopped - s.answered <= Duration::from_secs(1))
        .count() as u64;
    let per_round = last_second / 10;
    1 + 2 * 4 * (per_round + 1) + 4
}

// ---------------------------------------------------------------------------------------------
// 1. Rolling restart

/// 1. Rolling restart of every node under load: SIGTERM (the node leaves, then drains), wait
///    for its exit, start it again with the same id, wait until it says ready, next node.
///
///    Windows: the limit exactly. Under `hold` a member that left keeps its share (design §5,
///    "A dead member under hold"), charged as a ghost (§3.3.4: at least what it can have
///    admitted unseen), and when it returns its old actor is retired with a charge of its
///    possible unpublished admissions (§5, §10 "Retirement"), so its last round is not handed
///    out again: the design's extra for a restart is 0 (§7, "Crash": admission 0).
///
///    Counts: each stop may lose the node's admissions since its last boundary (§2.4,
///    `lost ≤ r_i·T`; here what it answered from 250 ms before SIGTERM to its exit, the drain
///    included) and may gain the retirement charge ([`retirement_charge`]) and its requests
///    cut by the stop.
#[test]
fn rolling_restart() {
    scenario("rolling", N, SCENARIO_LIMIT, |lab| rolling(lab, "rolling"));
}

async fn rolling(mut lab: Lab, tag: &str) {
    away_from_day_edge(&lab, Duration::from_secs(60)).await;
    wait_formed(tag, &lab, Duration::from_secs(15)).await;
    let all: Vec<usize> = (0..N).collect();
    let (w, tracer) = loads(&lab, &all, "c1");
    let pace = pace(&lab, Duration::from_secs(2)).await;
    let mut stops = Vec::new();
    let mut events: Vec<(String, Instant)> = Vec::new();
    for victim in 0..N {
        let asked = Instant::now();
        let exit = lab.terminate(victim, Duration::from_secs(12)).await;
        let exited = Instant::now();
        lab.start(victim);
        let ready = wait_ready(lab.nodes[victim].http(), Duration::from_secs(15))
            .await
            .unwrap_or_else(|| panic!("[{tag}] node-{victim} not ready within 15 s"));
        eprintln!(
            "[{tag}] node-{victim}: SIGTERM, exited after {:?} ms, restarted, ready {} ms after its start",
            exit.map(|d| d.as_millis()),
            ready.as_millis()
        );
        assert!(
            exit.is_some(),
            "[{tag}] node-{victim} did not exit on SIGTERM"
        );
        stops.push((victim, asked, exited));
        events.push((format!("term-{victim}"), asked));
    }
    let faults_end = Instant::now();
    let tracer = tracer.stop().await;
    chaos_timeline(tag, "tracer", &tracer);
    let mut f = Figures {
        pace,
        ..Figures::default()
    };
    settle(tag, &mut lab, "c1", faults_end, &mut f).await;
    let w = w.stop().await;
    f.recorded = tracer.admitted();
    let mut drained = 0;
    let mut asym = 0;
    let mut drains = Vec::new();
    for &(victim, asked, exited) in &stops {
        let others: Vec<usize> = (0..N).filter(|&i| i != victim).collect();
        asym += admitted_between(&w, &others, asked, asked + 2 * T);
        f.may_lose += admitted_between(
            &tracer,
            &[victim],
            asked - Duration::from_millis(250),
            exited,
        );
        f.may_gain += retirement_charge(&tracer, victim, asked);
        let d = admitted_between(&w, &[victim], asked, exited);
        drains.push(format!(
            "node-{victim} {d} in {} ms",
            (exited - asked).as_millis()
        ));
        drained += d;
    }
    f.may_gain += tracer.unanswered.len() as u64;
    // Printed for comparison: before holdings, windows could exceed the limit by up to this.
    f.allowance = 0;
    eprintln!(
        "[{tag}] w admitted by each node between its SIGTERM and its exit: {} (sum {drained}); by the others in the 2 rounds after each SIGTERM: {asym}",
        drains.join(", ")
    );
    eprintln!(
        "[{tag}] tracer per node admitted/answered: {}; {} requests unanswered",
        per_node(&tracer, N),
        tracer.unanswered.len()
    );
    print_rounds(tag, &lab).await;
    let events: Vec<(&str, Instant)> = events.iter().map(|(n, t)| (n.as_str(), *t)).collect();
    verdict(tag, &lab, &w, &events, &mut f);
    lab.finish();
}

/// 1c. What a node admits while it drains after SIGTERM is counted. Node-2 takes a tracer
///     load of 200 checks/s on `long` (whose lease is then nearly the whole day's room), gets
///     SIGTERM while its clients keep their connections and keep checking, and is restarted
///     once it exited. Design §2.4: a stop loses at most the node's admissions since its last
///     boundary (`lost ≤ r_i·T`, one round), and the retirement of its old actor (§5) then
///     counts them "approximately and from above". So the cluster's count, once it agrees,
///     is at least what the test saw admitted less one round of node-2's admissions. And when
///     every survivor had node-2's final frame (its leave marker names that round), no
///     retirement is charged, so the count is at most what was admitted.
#[test]
fn sigterm_drain_is_counted() {
    scenario("drain", N, SCENARIO_LIMIT, |mut lab| async move {
        let tag = "drain";
        away_from_day_edge(&lab, Duration::from_secs(40)).await;
        wait_formed(tag, &lab, Duration::from_secs(15)).await;
        let victim = 2;
        let hot = Load::start_on(&on(&lab, [victim]), "long", "c1c", w_rate(), 4, true);
        sleep(Duration::from_secs(1)).await;
        let asked = Instant::now();
        let exit = lab.terminate(victim, Duration::from_secs(12)).await;
        let exited = Instant::now();
        lab.start(victim);
        let ready = wait_ready(lab.nodes[victim].http(), Duration::from_secs(15)).await;
        let hot = hot.stop().await;
        let (took, remaining) = wait_agree(tag, &lab, "long", "c1c", Duration::from_secs(15)).await;
        let counted = LONG_LIMIT - remaining;
        let recorded = hot.admitted();
        let drained = admitted_between(&hot, &[victim], asked, exited);
        let last_round = admitted_between(&hot, &[victim], asked - T, asked);
        eprintln!(
            "[{tag}] node-{victim} exited {:?} ms after SIGTERM, admitting {drained} meanwhile, {last_round} in the round before; ready {:?} ms after its restart; the cluster agreed after {} ms",
            exit.map(|d| d.as_millis()),
            ready.map(|d| d.as_millis()),
            took.as_millis()
        );
        eprintln!(
            "[{tag}] tracer: {recorded} admitted, {counted} counted (lost {}; may lose {last_round})",
            recorded as i64 - counted as i64
        );
        assert!(
            counted + last_round >= recorded,
            "[{tag}] the cluster counts {counted} admissions, the test saw {recorded}: {} lost, more than the round before the stop ({last_round}); node-{victim} admitted {drained} between SIGTERM and its exit",
            recorded - counted
        );
        // A peer that had node-2's final frame when it heard of the leave charges no
        // retirement: if every survivor says so, the count is exact (up to checks the test
        // sent but saw no answer to).
        let mut finals = Vec::new();
        for i in (0..N).filter(|&i| i != victim) {
            let text = metrics(lab.nodes[i].http()).await;
            finals.push(metric(&text, "gossamer_cluster_final_leaves_total").unwrap_or(0.0));
        }
        let unanswered = hot.unanswered.len() as u64;
        eprintln!(
            "[{tag}] final leaves seen by the survivors: {finals:?}; {unanswered} checks unanswered"
        );
        if finals.iter().all(|&f| f >= 1.0) {
            assert!(
                counted <= recorded + unanswered,
                "[{tag}] every survivor had node-{victim}'s final frame, yet the cluster counts {counted} of {recorded} admitted (+{unanswered} unanswered)"
            );
        }
        lab.finish();
    });
}

// ---------------------------------------------------------------------------------------------
// 2. One-way partition

/// 2. One-way partition: node-2 hears nobody (nftables drops its input from the other data
///    addresses) while everybody still hears it, for 3 s from 100 ms into a window, then
///    heals.
///
///    Windows: the limit, exactly (design §5, "When the sides disagree"): a one-way cut is
///    asymmetric for M + 1 = 4 rounds, but the four others can only be granted room nobody
///    holds, and node-2 spends only what it holds. (Before holdings, the sides together
///    over-admitted up to what the four others admitted in those rounds.)
///
///    Counts: no crash, so none lost (§2.4); none gained but requests without an answer.
#[test]
fn one_way_partition() {
    scenario("one-way", N, SCENARIO_LIMIT, |mut lab| async move {
        let tag = "one-way";
        away_from_day_edge(&lab, Duration::from_secs(40)).await;
        wait_formed(tag, &lab, Duration::from_secs(15)).await;
        let all: Vec<usize> = (0..N).collect();
        let (w, tracer) = loads(&lab, &all, "c2");
        let monitor = Monitor::start(&lab.addrs());
        let pace = pace(&lab, Duration::from_secs(2)).await;
        into_next_window(&lab, Duration::from_millis(100)).await;
        let victim = 2;
        let table = "gossamer_oneway";
        let rules = one_way_rules(&lab, victim, table);
        let cut = Instant::now();
        lab.nft(victim, table, &rules);
        eprintln!("[{tag}] node-{victim} hears nobody (one-way cut)");
        sleep(Duration::from_secs(3)).await;
        let tracer = tracer.stop().await;
        let healed = Instant::now();
        lab.nft_delete(victim, table);
        eprintln!("[{tag}] healed");
        let mut f = Figures {
            pace,
            ..Figures::default()
        };
        settle(tag, &mut lab, "c2", healed, &mut f).await;
        sleep(Duration::from_millis(500)).await;
        let w = w.stop().await;
        monitor.stop().await.report(tag, cut);
        let others: Vec<usize> = all.iter().copied().filter(|&i| i != victim).collect();
        let asym = admitted_between(&w, &others, cut, cut + T * (M + 2));
        eprintln!(
            "[{tag}] the others admitted {asym} in the {} rounds after the cut (what design §5 allowed over the limit before holdings; now nothing)",
            M + 2
        );
        f.allowance = 0;
        f.recorded = tracer.admitted();
        f.may_gain = tracer.unanswered.len() as u64;
        print_rounds(tag, &lab).await;
        verdict(tag, &lab, &w, &[("cut", cut), ("heal", healed)], &mut f);
        lab.finish();
    });
}

// ---------------------------------------------------------------------------------------------
// 3. A node paused past failure detection

/// 3. Node-2 is stopped with SIGSTOP for 2 s (past suspicion after M = 3 rounds, and past
///    chitchat's failure detection, ~0.5 s) from 100 ms into a window, then continued. Its
///    HTTP port keeps accepting connections (the kernel does), so its checks queue up; the
///    load's clients give up after 2 s.
///
///    Windows: the limit, exactly. To its peers the pause is a two-way cut (no frames either
///    way); each side spends only the room it holds (design §5). Its resumption is a heal
///    (§5, "On heal": no extra).
///
///    Counts: nothing lost (no crash, §2.4); the paused node may admit the checks that were
///    queued while it slept, after their clients gave up (the load's unanswered requests).
#[test]
fn paused_node() {
    scenario("pause", N, SCENARIO_LIMIT, |mut lab| async move {
        let tag = "pause";
        away_from_day_edge(&lab, Duration::from_secs(40)).await;
        wait_formed(tag, &lab, Duration::from_secs(15)).await;
        let all: Vec<usize> = (0..N).collect();
        let (w, tracer) = loads(&lab, &all, "c3");
        let monitor = Monitor::start(&lab.addrs());
        let pace = pace(&lab, Duration::from_secs(2)).await;
        into_next_window(&lab, Duration::from_millis(100)).await;
        let victim = 2;
        let stopped = Instant::now();
        lab.pause(victim);
        eprintln!("[{tag}] SIGSTOP node-{victim}");
        sleep(Duration::from_secs(2)).await;
        let resumed = Instant::now();
        lab.resume(victim);
        eprintln!("[{tag}] SIGCONT node-{victim}");
        // Waits for the checks in flight at the paused node: answered now, or given up.
        let tracer = tracer.stop().await;
        let mut f = Figures {
            pace,
            ..Figures::default()
        };
        settle(tag, &mut lab, "c3", resumed, &mut f).await;
        sleep(Duration::from_millis(500)).await;
        let w = w.stop().await;
        monitor.stop().await.report(tag, stopped);
        let others: Vec<usize> = all.iter().copied().filter(|&i| i != victim).collect();
        let asym = admitted_between(&w, &others, stopped, stopped + 2 * T);
        eprintln!(
            "[{tag}] the others admitted {asym} in the 2 rounds after the stop (allowed over the limit before holdings; now nothing)"
        );
        f.allowance = 0;
        f.recorded = tracer.admitted();
        f.may_gain = tracer.unanswered.len() as u64;
        eprintln!(
            "[{tag}] tracer per node admitted/answered: {}; unanswered {}",
            per_node(&tracer, N),
            tracer.unanswered.len()
        );
        print_rounds(tag, &lab).await;
        verdict(
            tag,
            &lab,
            &w,
            &[("stop", stopped), ("cont", resumed)],
            &mut f,
        );
        lab.finish();
    });
}

// ---------------------------------------------------------------------------------------------
// 4. A flapping link

/// A small deterministic generator for the flapping schedule (xorshift64*).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [lo, hi] milliseconds.
    fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.next() % (hi - lo + 1))
    }
}

/// 4. Node-2's data link goes down and up every 300–700 ms (seeded: `CHAOS_SEED`) for about
///    4 s, from 100 ms into a window, then stays up.
///
///    Windows: the limit, exactly. Each down is a two-way cut (each side spends what it holds,
///    design §5); a cut shorter than M rounds only degrades rounds (§3.3.4, no extra).
///
///    Counts: nothing lost, nothing gained (no crash, §2.4).
#[test]
fn flapping_link() {
    scenario("flap", N, SCENARIO_LIMIT, |mut lab| async move {
        let tag = "flap";
        let seed = std::env::var("CHAOS_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(lab.wall.unix_ms as u64);
        let mut rng = Rng::new(seed);
        away_from_day_edge(&lab, Duration::from_secs(40)).await;
        wait_formed(tag, &lab, Duration::from_secs(15)).await;
        let all: Vec<usize> = (0..N).collect();
        let (w, tracer) = loads(&lab, &all, "c4");
        let monitor = Monitor::start(&lab.addrs());
        let pace = pace(&lab, Duration::from_secs(2)).await;
        into_next_window(&lab, Duration::from_millis(100)).await;
        let victim = 2;
        let began = Instant::now();
        let mut cuts = Vec::new();
        let mut schedule = Vec::new();
        // At most 14 phases of ≥ 300 ms: bounded in count, and stops after 4 s.
        for phase in 0..14 {
            if began.elapsed() >= Duration::from_secs(4) {
                break;
            }
            let down = phase % 2 == 0;
            let hold = rng.ms(300, 700);
            if down {
                cuts.push(Instant::now());
            }
            lab.link(victim, !down);
            schedule.push(format!(
                "{} {}",
                if down { "down" } else { "up" },
                hold.as_millis()
            ));
            sleep(hold).await;
        }
        lab.link(victim, true);
        let healed = Instant::now();
        eprintln!(
            "[{tag}] seed {seed}: node-{victim}'s link went down {} times in {} ms (ms per phase: {})",
            cuts.len(),
            (healed - began).as_millis(),
            schedule.join(", ")
        );
        let tracer = tracer.stop().await;
        let mut f = Figures {
            pace,
            ..Figures::default()
        };
        settle(tag, &mut lab, "c4", healed, &mut f).await;
        sleep(Duration::from_millis(500)).await;
        let w = w.stop().await;
        monitor.stop().await.report(tag, began);
        let asym: u64 = cuts
            .iter()
            .map(|&c| admitted_between(&w, &all, c, c + 2 * T))
            .sum();
        eprintln!(
            "[{tag}] the cluster admitted {asym} in the 2 rounds after each of the {} cuts (allowed over the limit before holdings; now nothing)",
            cuts.len()
        );
        f.allowance = 0;
        f.recorded = tracer.admitted();
        f.may_gain = tracer.unanswered.len() as u64;
        print_rounds(tag, &lab).await;
        let mut events: Vec<(&str, Instant)> = cuts.iter().map(|&c| ("down", c)).collect();
        events.push(("healed", healed));
        verdict(tag, &lab, &w, &events, &mut f);
        lab.finish();
    });
}

// ---------------------------------------------------------------------------------------------
// 5. 30% UDP loss

/// 5. 30% of UDP packets (chitchat and QUIC) dropped on input in every namespace
///    (`numgen random mod 100 < 30`) for 8 s under load, from 100 ms into a window, then
///    removed.
///
///    Windows: the limit exactly: a node missing a frame is degraded and takes no lease
///    (design §3.3.4, §7 "Late or lost frames": 0). Counts: nothing lost or gained (§2.4:
///    dots are absolute, so a lost frame is healed by the next one or by anti-entropy).
#[test]
fn udp_loss_30_percent() {
    scenario("loss", N, SCENARIO_LIMIT, |mut lab| async move {
        let tag = "loss";
        away_from_day_edge(&lab, Duration::from_secs(40)).await;
        wait_formed(tag, &lab, Duration::from_secs(15)).await;
        let table = "gossamer_loss";
        let rules = format!(
            "table inet {table} {{\n  chain input {{\n    type filter hook input priority 0; policy accept;\n    meta l4proto udp numgen random mod 100 < 30 drop\n  }}\n}}\n"
        );
        let all: Vec<usize> = (0..N).collect();
        let (w, tracer) = loads(&lab, &all, "c5");
        let monitor = Monitor::start(&lab.addrs());
        let pace = pace(&lab, Duration::from_secs(1)).await;
        into_next_window(&lab, Duration::from_millis(100)).await;
        let before = print_rounds(tag, &lab).await;
        let lossy = Instant::now();
        for i in 0..N {
            lab.nft(i, table, &rules);
        }
        sleep(Duration::from_secs(8)).await;
        let during = print_rounds(tag, &lab).await;
        let tracer = tracer.stop().await;
        let clean = Instant::now();
        for i in 0..N {
            lab.nft_delete(i, table);
        }
        eprintln!("[{tag}] loss removed");
        let mut f = Figures {
            pace,
            ..Figures::default()
        };
        settle(tag, &mut lab, "c5", clean, &mut f).await;
        sleep(Duration::from_millis(500)).await;
        let w = w.stop().await;
        let seen = monitor.stop().await;
        seen.report(tag, lossy);
        let degraded: Vec<u64> = during.iter().zip(&before).map(|(a, b)| a - b).collect();
        let suspicions = seen.0.iter().filter(|(_, _, s)| !s.is_empty()).count();
        eprintln!(
            "[{tag}] with 30% UDP loss: degraded rounds per node {degraded:?} of ~{}; {suspicions} changes to a non-empty suspected set seen",
            (clean - lossy).as_millis() / T.as_millis()
        );
        f.allowance = 0;
        f.recorded = tracer.admitted();
        f.may_gain = tracer.unanswered.len() as u64;
        print_rounds(tag, &lab).await;
        verdict(tag, &lab, &w, &[("loss", lossy), ("clean", clean)], &mut f);
        lab.finish();
    });
}

// ---------------------------------------------------------------------------------------------
// 6. A node joining mid-load

/// 6. Four nodes run under load; node-4 (seeded with them, as they are with it) starts 2 s
///    into the load, 100 ms into a window, and once it says ready it takes its part of the
///    load (a fifth of each). The tracer stops 3 s later.
///
///    Windows: the limit exactly. A joining node takes no lease and grants no starter until
///    it has pulled every live peer's counts (design §10, "Joining"); the others charge a
///    participant they were never consistent with the whole limit (§10, "Ghost of a
///    stranger"); a membership change costs degraded rounds only (§3.3.4). Extra: 0.
///
///    Counts: nothing lost or gained (§2.4). "Whole" is measured from the joiner's start;
///    convergence from the tracer's stop.
#[test]
fn node_joins_mid_load() {
    scenario_started("join", N, N - 1, SCENARIO_LIMIT, |mut lab| async move {
        let tag = "join";
        away_from_day_edge(&lab, Duration::from_secs(40)).await;
        let first: Vec<usize> = (0..N - 1).collect();
        wait_formed_among(tag, &lab, &first, Duration::from_secs(15)).await;
        let (w, tracer) = loads(&lab, &first, "c6");
        let monitor = Monitor::start(&lab.addrs());
        let pace = pace(&lab, Duration::from_secs(2)).await;
        into_next_window(&lab, Duration::from_millis(100)).await;
        let joiner = N - 1;
        let joined = Instant::now();
        lab.start(joiner);
        let ready = wait_ready(lab.nodes[joiner].http(), Duration::from_secs(15))
            .await
            .unwrap_or_else(|| panic!("[{tag}] node-{joiner} not ready within 15 s"));
        let ready_at = Instant::now();
        eprintln!(
            "[{tag}] node-{joiner} started under load, ready after {} ms",
            ready.as_millis()
        );
        let (w5, tracer5) = loads(&lab, &[joiner], "c6");
        let whole = wait_formed(tag, &lab, Duration::from_secs(15)).await;
        sleep(Duration::from_secs(3)).await;
        let tracer = merge(vec![tracer.stop().await, tracer5.stop().await]);
        let settled = Instant::now();
        let mut f = Figures {
            pace,
            ..Figures::default()
        };
        settle(tag, &mut lab, "c6", settled, &mut f).await;
        f.whole = (ready_at - joined) + whole;
        sleep(Duration::from_millis(500)).await;
        let w = merge(vec![w.stop().await, w5.stop().await]);
        monitor.stop().await.report(tag, joined);
        f.allowance = 0;
        f.recorded = tracer.admitted();
        f.may_gain = tracer.unanswered.len() as u64;
        print_rounds(tag, &lab).await;
        verdict(
            tag,
            &lab,
            &w,
            &[("start", joined), ("ready", ready_at)],
            &mut f,
        );
        lab.finish();
    });
}

// ---------------------------------------------------------------------------------------------
// 7. A node leaving for good

/// 7. A node that leaves for good (SIGTERM, not restarted: a scale-down) releases its share.
///    Design §5, "A dead member under hold": its share stays held until it restarts, *or it
///    leaves gracefully (SIGTERM announces the leave before the drain)*, or chitchat forgets
///    it. So once node-4 has left, the four others, under 2x load, admit the whole limit again
///    in every full window (at least 90% of it, as `tests/netns.rs` asks of a formed cluster).
#[test]
fn graceful_leave_releases_its_share() {
    scenario("leave", N, SCENARIO_LIMIT, |mut lab| async move {
        let tag = "leave";
        wait_formed(tag, &lab, Duration::from_secs(15)).await;
        let all: Vec<usize> = (0..N).collect();
        let (w, tracer) = loads(&lab, &all, "c7");
        let pace = pace(&lab, Duration::from_secs(2)).await;
        let leaver = N - 1;
        let asked = Instant::now();
        let exit = lab.terminate(leaver, Duration::from_secs(12)).await;
        eprintln!(
            "[{tag}] node-{leaver} left (SIGTERM), exited after {:?} ms; pace {pace:.2}",
            exit.map(|d| d.as_millis())
        );
        let w = w.stop().await;
        let _ = tracer.stop().await;
        let rest: Vec<usize> = (0..N - 1).collect();
        let after = Load::start_on(
            &on(&lab, rest.iter().copied()),
            "w",
            "c7",
            w_rate(),
            2,
            true,
        );
        into_next_window(&lab, Duration::ZERO).await;
        sleep(W_PERIOD * 2 + Duration::from_millis(200)).await;
        let after = after.stop().await;
        lab.assert_running();
        let full = check_windows(
            tag,
            &lab.wall,
            &merge(vec![w, after]),
            W_PERIOD,
            W_LIMIT,
            0,
            &[("leave", asked)],
        );
        let last: Vec<u64> = full.iter().rev().take(2).map(|x| x.0).collect();
        eprintln!(
            "[{tag}] the last two full windows after the leave admitted {last:?} of {W_LIMIT}"
        );
        assert!(
            last.iter().all(|&n| n * 10 >= W_LIMIT * 9),
            "[{tag}] after node-{leaver} left, full windows admitted {last:?} < 90% of {W_LIMIT}"
        );
        lab.finish();
    });
}

// ---------------------------------------------------------------------------------------------
// The lab's cleanup

/// The nftables table the cleanup tests make in a node's namespace.
const CLEANUP_TABLE: &str = "gossamer_cleanup";

/// Names a lab made, as `ip` lists them.
#[derive(Debug, Default, Clone)]
struct Made {
    namespaces: Vec<String>,
    links: Vec<String>,
    pids: Vec<u32>,
    /// The lab's log directory, which a failed scenario keeps for reading.
    logs: PathBuf,
}

/// Panics unless every namespace and link in `made` is gone (their nftables tables lived in
/// the namespaces and go with them; the root namespace's tables are checked too).
fn assert_removed(what: &str, made: &Made) {
    assert!(
        !made.namespaces.is_empty(),
        "{what}: the lab recorded nothing"
    );
    let namespaces = sh_quiet(&["ip", "netns", "list"]);
    for ns in &made.namespaces {
        assert!(
            !namespaces.split_whitespace().any(|n| n == ns),
            "{what}: namespace {ns} is left: {namespaces}"
        );
    }
    let links = sh_quiet(&["ip", "-o", "link", "show"]);
    for link in &made.links {
        assert!(
            !links.contains(&format!(": {link}:")) && !links.contains(&format!(": {link}@")),
            "{what}: link {link} is left"
        );
    }
    for pid in &made.pids {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "{what}: node process {pid} is left"
        );
    }
    // Other programs may add tables to the root namespace meanwhile: look for ours only.
    let tables = sh_quiet(&["nft", "list", "tables"]);
    assert!(
        !tables.contains(CLEANUP_TABLE),
        "{what}: table {CLEANUP_TABLE} is in the root namespace: {tables}"
    );
}

/// Runs a scenario of 2 nodes that makes an nftables table, pauses a node and then fails
/// (panics, or overruns its time limit), and checks that the lab removed everything it made.
fn cleanup_after(what: &str, limit: Duration, overrun: bool) {
    if let Some(why) = unavailable() {
        eprintln!("[{what}] skipped: {why}");
        return;
    }
    let made = Arc::new(Mutex::new(Made::default()));
    let record = made.clone();
    let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        scenario(what, 2, limit, |mut lab| async move {
            *record.lock().expect("record") = Made {
                namespaces: lab.namespaces.clone(),
                links: lab.host_links.iter().chain(&lab.bridges).cloned().collect(),
                pids: lab
                    .nodes
                    .iter()
                    .filter_map(|n| n.child.as_ref().map(std::process::Child::id))
                    .collect(),
                logs: lab.dir.clone(),
            };
            let rules = format!(
                "table inet {CLEANUP_TABLE} {{\n  chain input {{\n    type filter hook input priority 0; policy accept;\n    meta l4proto udp drop\n  }}\n}}\n"
            );
            lab.nft(0, CLEANUP_TABLE, &rules);
            sleep(Duration::from_millis(300)).await;
            lab.pause(1);
            if overrun {
                sleep(Duration::from_secs(30)).await;
            }
            panic!("[{}] a deliberate failure", lab.name);
        });
    }));
    assert!(failed.is_err(), "[{what}] the scenario was meant to fail");
    let made = made.lock().expect("record").clone();
    assert_removed(what, &made);
    // The failure was deliberate: its logs, kept as for any failure, are not worth keeping.
    let _ = std::fs::remove_dir_all(&made.logs);
    eprintln!(
        "[{what}] removed after the failure: {} namespaces, {} links, {} processes",
        made.namespaces.len(),
        made.links.len(),
        made.pids.len()
    );
}

/// A scenario that panics leaves no namespace, link, bridge, nftables table or node process
/// behind (a SIGSTOPped node included).
#[test]
fn lab_cleans_up_after_a_panic() {
    cleanup_after("cleanup-panic", Duration::from_secs(20), false);
}

/// The same when the scenario overruns its time limit.
#[test]
fn lab_cleans_up_after_a_timeout() {
    cleanup_after("cleanup-timeout", Duration::from_secs(2), true);
}
