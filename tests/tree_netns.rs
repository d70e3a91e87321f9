//! Real-network tests of the aggregation tree (`[cluster] exchange = "tree"`, design.md §11.1):
//! every node is the real `gossamer` binary in its own network namespace, and the network
//! between them is Linux's (veths on a bridge, links cut with `ip link`, packet loss made with
//! nftables inside the namespaces). The lab is `tests/support/lab.rs`, shared with
//! `tests/netns.rs` and `tests/chaos.rs`; its layout (a data bridge for gossip and QUIC, where
//! the faults are made, and a management bridge for the HTTP API the test drives) and its
//! cleanup are described there. Here every lab serves [`TREE_CONFIG`]: the lab's `w` with
//! the tree exchange, and the token bucket local (the tree runs global fixed windows only).
//!
//! What the tree promises, and what each scenario checks of it, on `w` (300 per 3 s fixed
//! window) under twice its limit spread over every node:
//!
//! - while the view is stable and every node agrees, at most the limit in every window, and
//!   nearly all of it (1);
//! - when a member leaves the view without handing its admissions over (kill -9, a pause)
//!   or a node finds itself paused, the open slots are frozen and nodes spend only what they
//!   hold: every window within the limit exactly, no extra (2, 3);
//! - a member that gets SIGTERM hands its admissions to another before it leaves, and its
//!   next incarnation is vouched for by the members that stayed: nothing freezes, and every
//!   window during a rolling restart admits the limit, no more (6);
//! - across a partition each side allots the whole limit (`on_partition = "split"`): at most
//!   2 × the limit in the windows the cut overlaps, the limit again once the sides have merged
//!   (4);
//! - lost packets make rounds short (no grants), never over-admit (5).
//!
//! Every scenario prints its windows (admitted per window, by node, against the limit), what
//! each node admitted, and each node's `gossamer_cluster_tree_*` metrics at the end.
//!
//! Windows are counted as the lab counts them (the window each answer's `reset_after_ms`
//! names), except for answers with `reset_after_ms` 0, which name no window: a denial in a
//! slot with nothing counted (as the local fixed window answers). Those are counted in the
//! window they were answered in ([`fresh_answers`]); an *admitted* check must never say 0
//! (it counts itself: fixed in 38e3f9a, when the first admission of a slot at a node said 0
//! and was counted in the window before).
//!
//! Needs root, `ip` (iproute2) and `nft` (nftables); without them each test says why and
//! passes. The scenarios run one at a time (the lab's process-wide lock). Run with
//! `cargo test --test tree_netns -- --nocapture` to see the figures.

#[path = "support/env.rs"]
mod env;
#[path = "support/lab.rs"]
mod lab;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use lab::*;
use tokio::task::JoinHandle;
use tokio::time::sleep;

/// The lab's rule `w` with the tree exchange; `bucket` is local (a global token bucket is
/// refused over the tree), and `long` is left out (a global window longer than a minute is
/// refused over the tree: a view change freezes the open window until it ends). `on_partition` is left to its default, `split`.
const TREE_CONFIG: &str = r#"
[cluster]
exchange = "tree"

[[rule]]
name = "w"
algorithm = "fixed_window"
limit = 300
period = "3s"

[[rule]]
name = "bucket"
algorithm = "token_bucket"
limit = 100
period = "1s"
burst = 100
scope = "local"
"#;

/// Round length (`gossip_interval`, 100 ms by default, which the lab keeps).
const T: Duration = Duration::from_millis(100);
/// Longest a 3-node scenario may take (setup and cleanup aside): a guard against a hang.
const SCENARIO_LIMIT: Duration = Duration::from_secs(60);

/// Runs a scenario of `nodes` nodes serving [`TREE_CONFIG`].
fn tree_scenario<F, Fut>(name: &str, nodes: usize, limit: Duration, body: F)
where
    F: FnOnce(Lab) -> Fut,
    Fut: Future<Output = ()>,
{
    scenario_config(name, nodes, nodes, TREE_CONFIG, limit, body);
}

/// `w` at twice its limit.
fn w_rate() -> f64 {
    2.0 * W_LIMIT as f64 / W_PERIOD.as_secs_f64()
}

// ---------------------------------------------------------------------------------------------
// Helpers

/// One node's `gossamer_cluster_tree_*` metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct TreeStats {
    members: u64,
    complete: u64,
    short: u64,
    granted: u64,
    released: u64,
    ignored: u64,
    gaps: u64,
    too_large: u64,
    /// Leaving members' admissions this node took over.
    taken: u64,
    /// Members that left this node's view with their admissions carried: nothing frozen.
    left_carried: u64,
}

impl TreeStats {
    /// `None`: the node did not answer, or it does not run the tree.
    async fn of(addr: SocketAddr) -> Option<TreeStats> {
        let text = metrics(addr).await;
        let get = |name: &str| metric(&text, name).map(|v| v as u64);
        Some(TreeStats {
            members: get("gossamer_cluster_tree_members")?,
            complete: get("gossamer_cluster_tree_rounds_total{state=\"complete\"}")?,
            short: get("gossamer_cluster_tree_rounds_total{state=\"short\"}")?,
            granted: get("gossamer_cluster_tree_units_total{what=\"granted\"}")?,
            released: get("gossamer_cluster_tree_units_total{what=\"released\"}")?,
            ignored: get("gossamer_cluster_tree_messages_ignored_total")?,
            gaps: get("gossamer_cluster_tree_gaps_total")?,
            too_large: get("gossamer_cluster_tree_sums_too_large_total")?,
            taken: get("gossamer_cluster_tree_handoffs_total{what=\"taken\"}")?,
            left_carried: get("gossamer_cluster_tree_handoffs_total{what=\"left_carried\"}")?,
        })
    }
}

/// Every node's tree metrics (`None` for a node that does not answer).
async fn tree_stats(lab: &Lab) -> Vec<Option<TreeStats>> {
    let mut out = Vec::new();
    for addr in lab.addrs() {
        out.push(TreeStats::of(addr).await);
    }
    out
}

/// Prints every node's tree metrics; returns them.
async fn print_tree(tag: &str, lab: &Lab) -> Vec<Option<TreeStats>> {
    let stats = tree_stats(lab).await;
    for (i, s) in stats.iter().enumerate() {
        match s {
            Some(s) => eprintln!(
                "[{tag}] node-{i} tree: members {}, rounds complete {} / short {}, units granted {} / released {}, messages ignored {}, gaps {}, sums too large {}, handoffs taken {}, left carried {}",
                s.members,
                s.complete,
                s.short,
                s.granted,
                s.released,
                s.ignored,
                s.gaps,
                s.too_large,
                s.taken,
                s.left_carried
            ),
            None => eprintln!("[{tag}] node-{i} tree: no metrics"),
        }
    }
    stats
}

/// Short rounds per node between two readings (`None` where either is missing).
fn short_between(before: &[Option<TreeStats>], after: &[Option<TreeStats>]) -> Vec<Option<u64>> {
    before
        .iter()
        .zip(after)
        .map(|(b, a)| Some(a.as_ref()?.short.saturating_sub(b.as_ref()?.short)))
        .collect()
}

/// Polls until each node of `members` sees the newest incarnation of every other alive
/// (`/v1/cluster`; over the tree nobody is ever `suspected`), says `/readyz` 200, has exactly
/// `members.len()` members in its tree view (`gossamer_cluster_tree_members`) and has
/// completed two rounds since it first had them all. Returns how long that took.
async fn wait_tree_formed(tag: &str, lab: &Lab, members: &[usize], within: Duration) -> Duration {
    let start = Instant::now();
    let step = Duration::from_millis(50);
    let ids: Vec<String> = members.iter().map(|&i| lab.nodes[i].id.clone()).collect();
    // Per node: its complete rounds when its view was first seen whole.
    let mut whole_at: BTreeMap<usize, u64> = BTreeMap::new();
    let mut last = Vec::new();
    while start.elapsed() < within {
        last.clear();
        for &i in members {
            let addr = lab.nodes[i].http();
            match request(addr, "/v1/cluster", None).await {
                Some((200, v)) => last.extend(
                    view_problems(&v, &ids)
                        .into_iter()
                        .map(|p| format!("node-{i} sees {p}")),
                ),
                other => last.push(format!("node-{i}: no /v1/cluster ({other:?})")),
            }
            if request(addr, "/readyz", None)
                .await
                .is_none_or(|(s, _)| s != 200)
            {
                last.push(format!("node-{i} not ready"));
            }
            match TreeStats::of(addr).await {
                Some(s) if s.members == members.len() as u64 => {
                    let base = *whole_at.entry(i).or_insert(s.complete);
                    if s.complete < base + 2 {
                        last.push(format!(
                            "node-{i}: {} complete rounds with its whole view",
                            s.complete - base
                        ));
                    }
                }
                Some(s) => {
                    whole_at.remove(&i);
                    last.push(format!("node-{i}: {} tree members", s.members));
                }
                None => {
                    whole_at.remove(&i);
                    last.push(format!("node-{i}: no tree metrics"));
                }
            }
        }
        if last.is_empty() {
            let took = start.elapsed();
            eprintln!(
                "[{tag}] tree formed: every node has {} members in its view, ready, rounds complete, after {} ms",
                members.len(),
                took.as_millis()
            );
            return took;
        }
        sleep(step).await;
    }
    panic!("[{tag}] the tree did not form within {within:?}: {last:?}");
}

/// Counts the answers whose `reset_after_ms` is 0 in the window they were answered in (see
/// the file's doc): sets their `reset_after_ms` to the time from the answer to that window's
/// end, so that [`check_windows`] counts them there. Returns (admitted, denied) answers so
/// moved, and how many of them were sent in the window before (their decision may have been
/// made there: ambiguous).
fn fresh_answers(wall: &Wall, loaded: &mut Loaded) -> (u64, u64, u64) {
    let w = W_PERIOD.as_millis() as f64;
    let (mut admitted, mut denied, mut ambiguous) = (0, 0, 0);
    for s in loaded.samples.iter_mut().filter(|s| s.reset_after_ms == 0) {
        let at = wall.ms(s.answered);
        let end = ((at / w).floor() + 1.0) * w;
        s.reset_after_ms = (end - at) as u64;
        if s.allowed {
            admitted += 1;
        } else {
            denied += 1;
        }
        if (wall.ms(s.sent) / w).floor() != (at / w).floor() {
            ambiguous += 1;
        }
    }
    (admitted, denied, ambiguous)
}

/// [`fresh_answers`], printed; panics if an admitted check said `reset_after_ms` 0.
fn fix_fresh(tag: &str, wall: &Wall, loaded: &mut Loaded) {
    let (a, d, amb) = fresh_answers(wall, loaded);
    eprintln!(
        "[{tag}] answers with reset_after_ms 0 (denied in a slot with nothing counted), counted in the window they were answered in: {d} ({amb} sent in the window before)"
    );
    assert_eq!(
        a, 0,
        "[{tag}] {a} admitted checks said reset_after_ms 0 (the window they counted in ends later)"
    );
}

/// Admissions per window index (as [`check_windows`] counts them).
fn window_totals(wall: &Wall, loaded: &Loaded) -> BTreeMap<u64, u64> {
    let w = W_PERIOD.as_millis() as f64;
    let mut per = BTreeMap::new();
    for s in loaded.samples.iter().filter(|s| s.allowed) {
        let end = wall.ms(s.answered) + s.reset_after_ms as f64;
        *per.entry((end / w).round() as u64 - 1).or_default() += 1;
    }
    per
}

/// The index of the window holding `t`.
fn window_of(wall: &Wall, t: Instant) -> u64 {
    (wall.ms(t) / W_PERIOD.as_millis() as f64).floor() as u64
}

/// The instant window `idx` starts.
fn window_start(wall: &Wall, idx: u64) -> Instant {
    let ms = idx as f64 * W_PERIOD.as_millis() as f64 - wall.unix_ms;
    if ms >= 0.0 {
        wall.at + Duration::from_secs_f64(ms / 1e3)
    } else {
        wall.at - Duration::from_secs_f64(-ms / 1e3)
    }
}

/// Waits past the start of the next window, `offset` into it.
async fn into_next_window(lab: &Lab, offset: Duration) {
    sleep(until_window_offset(&lab.wall, W_PERIOD, offset)).await;
}

/// Samples every node's tree view size every 100 ms; keeps the changes.
struct ViewMonitor {
    stop: Arc<AtomicBool>,
    task: JoinHandle<Vec<(Instant, usize, Option<u64>)>>,
}

impl ViewMonitor {
    fn start(addrs: &[SocketAddr]) -> ViewMonitor {
        let stop = Arc::new(AtomicBool::new(false));
        let addrs = addrs.to_vec();
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut last: Vec<Option<Option<u64>>> = vec![None; addrs.len()];
            let mut changes = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                for (i, addr) in addrs.iter().enumerate() {
                    let members = TreeStats::of(*addr).await.map(|s| s.members);
                    if last[i] != Some(members) {
                        changes.push((Instant::now(), i, members));
                        last[i] = Some(members);
                    }
                }
                sleep(Duration::from_millis(100)).await;
            }
            changes
        });
        ViewMonitor { stop, task }
    }

    /// Stops; prints every change after each node's first reading, in ms from `origin`.
    async fn stop(self, tag: &str, origin: Instant) -> Vec<(Instant, usize, Option<u64>)> {
        self.stop.store(true, Ordering::Relaxed);
        let changes = self.task.await.expect("view monitor");
        let mut seen = [false; MAX_NODES];
        let mut lines = Vec::new();
        for (at, node, members) in &changes {
            if !std::mem::replace(&mut seen[*node], true) {
                continue;
            }
            let ms = if *at >= origin {
                (*at - origin).as_millis() as i64
            } else {
                -((origin - *at).as_millis() as i64)
            };
            let what = members.map_or("no answer".to_owned(), |m| format!("{m} members"));
            lines.push(format!("{ms:+} ms node-{node} {what}"));
        }
        eprintln!(
            "[{tag}] tree view changes (ms from the fault): {}",
            lines.join("; ")
        );
        changes
    }
}

/// Every full window's admissions as a share of what was due: the limit, or what was asked
/// if less. Prints them; returns the lowest.
fn full_shares(tag: &str, full: &[(u64, u64)]) -> f64 {
    let shares: Vec<f64> = full
        .iter()
        .map(|&(n, answered)| n as f64 / W_LIMIT.min(answered).max(1) as f64)
        .collect();
    let text: Vec<String> = full
        .iter()
        .zip(&shares)
        .map(|(&(n, _), s)| format!("{n} ({:.1}%)", 100.0 * s))
        .collect();
    eprintln!(
        "[{tag}] full windows admitted {} of {W_LIMIT}",
        text.join(", ")
    );
    shares.iter().copied().fold(f64::INFINITY, f64::min)
}

// ---------------------------------------------------------------------------------------------
// 1. Formation and exact windows

/// 1. Three nodes form a tree (every node has 3 members in its view and completes rounds).
///    In the next window (the one they started in is not based: claims are made before a
///    slot opens), a key's first check at each node is admitted within a second; under 2x load per window spread over every node, the
///    cluster admits at most the limit in every window and at least 90% of it in every full
///    window.
#[test]
fn formation_and_exact_windows() {
    tree_scenario("tree-formation", 3, SCENARIO_LIMIT, |mut lab| async move {
        let tag = "tree-formation";
        wait_tree_formed(tag, &lab, &[0, 1, 2], Duration::from_secs(15)).await;
        let addrs = lab.addrs();
        into_next_window(&lab, Duration::from_millis(200)).await;
        // A new key's first check at each node, one node after the other.
        let mut firsts = Vec::new();
        for (i, addr) in addrs.iter().enumerate() {
            let body = serde_json::json!({"rule": "w", "key": "first1", "cost": 1});
            let sent = Instant::now();
            let reply = request(*addr, "/v1/check", Some(&body)).await;
            let took = sent.elapsed();
            let allowed = reply
                .as_ref()
                .is_some_and(|(s, v)| *s == 200 && v["allowed"] == true);
            firsts.push((i, took, allowed, reply.map(|r| r.0)));
        }
        let text: Vec<String> = firsts
            .iter()
            .map(|(i, took, allowed, status)| {
                format!(
                    "node-{i} {} ms {} ({status:?})",
                    took.as_millis(),
                    if *allowed { "admitted" } else { "denied" }
                )
            })
            .collect();
        eprintln!(
            "[{tag}] first check of a new key at each node: {}",
            text.join(", ")
        );
        for (i, took, allowed, status) in &firsts {
            assert!(
                *allowed && *took <= Duration::from_secs(1),
                "[{tag}] node-{i}'s first check of a new key took {took:?} ({status:?}, admitted: {allowed})"
            );
        }
        let w = Load::start(&addrs, "w", "k1", w_rate(), 2);
        sleep(Duration::from_secs(10)).await;
        let mut w = w.stop().await;
        lab.assert_running();
        fix_fresh(tag, &lab.wall, &mut w);
        let full = check_windows(tag, &lab.wall, &w, W_PERIOD, W_LIMIT, 0, &[]);
        eprintln!("[{tag}] per node admitted/answered: {}", per_node(&w, 3));
        let lowest = full_shares(tag, &full);
        let stats = print_tree(tag, &lab).await;
        for (i, s) in stats.iter().enumerate() {
            let s = s.unwrap_or_else(|| panic!("[{tag}] node-{i} has no tree metrics"));
            assert_eq!(s.members, 3, "[{tag}] node-{i}'s view");
        }
        assert!(!full.is_empty(), "[{tag}] no full window measured");
        assert!(
            lowest >= 0.9,
            "[{tag}] a full window admitted less than 90% of what was due: (admitted, answered) {full:?}"
        );
        lab.finish();
    });
}

// ---------------------------------------------------------------------------------------------
// 2. kill -9 and restart

/// 2. Under load, node-2 is SIGKILLed 100 ms into a window and restarted with the same id
///    (a new generation) 1 s later, in the same window. Every window stays within the limit
///    exactly: the others freeze the open slots when the old incarnation leaves their view
///    (it handed nothing over), and the new one takes their freeze up at its first complete
///    round, so nobody is granted the room the dead one held or admitted. The restarted node says ready, and every node has all 3 members in its
///    view again, within [`REJOIN`] of the restart.
#[test]
fn kill_and_restart() {
    tree_scenario("tree-kill", 3, SCENARIO_LIMIT, |mut lab| async move {
        let tag = "tree-kill";
        wait_tree_formed(tag, &lab, &[0, 1, 2], Duration::from_secs(15)).await;
        let addrs = lab.addrs();
        let w = Load::start(&addrs, "w", "k2", w_rate(), 2);
        let monitor = ViewMonitor::start(&addrs);
        sleep(Duration::from_secs(2)).await;
        into_next_window(&lab, Duration::from_millis(100)).await;
        let victim = 2;
        let killed_at = Instant::now();
        lab.kill(victim);
        eprintln!("[{tag}] SIGKILL node-{victim}");
        sleep(Duration::from_secs(1)).await;
        let restarted_at = Instant::now();
        lab.start(victim);
        eprintln!("[{tag}] restarted node-{victim} (same id) after 1 s down");
        let ready = wait_ready(addrs[victim], REJOIN)
            .await
            .unwrap_or_else(|| panic!("[{tag}] node-{victim} not ready within {REJOIN:?}"));
        let left = REJOIN.saturating_sub(restarted_at.elapsed());
        wait_tree_formed(tag, &lab, &[0, 1, 2], left).await;
        let rejoined = restarted_at.elapsed();
        eprintln!(
            "[{tag}] node-{victim} ready {} ms after its restart; back in every view (3 members, rounds complete) after {} ms",
            ready.as_millis(),
            rejoined.as_millis()
        );
        // Two more windows with the restarted node in the tree.
        into_next_window(&lab, Duration::ZERO).await;
        sleep(W_PERIOD + Duration::from_millis(500)).await;
        let mut w = w.stop().await;
        monitor.stop(tag, killed_at).await;
        lab.assert_running();
        fix_fresh(tag, &lab.wall, &mut w);
        let full = check_windows(
            tag,
            &lab.wall,
            &w,
            W_PERIOD,
            W_LIMIT,
            0,
            &[("kill", killed_at), ("restart", restarted_at)],
        );
        eprintln!("[{tag}] per node admitted/answered: {}", per_node(&w, 3));
        full_shares(tag, &full);
        print_tree(tag, &lab).await;
        lab.finish();
    });
}

/// How soon a restarted node must be ready and in every view again (measured: see the
/// scenario's output; the bound leaves room for a loaded 2-core machine).
const REJOIN: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------------------------
// 3. SIGSTOP past failure detection

/// 3. Node-2 is stopped with SIGSTOP for 6 s (far past failure detection: the others drop it
///    from their view and freeze) from 100 ms into a window, then continued: it finds 60
///    boundaries due at once and freezes in its turn. Its HTTP port keeps accepting
///    connections, so checks queue up; the load's clients give up after 2 s. Every window
///    stays within the limit exactly, and the tree re-forms.
#[test]
fn paused_node() {
    tree_scenario("tree-pause", 3, SCENARIO_LIMIT, |mut lab| async move {
        let tag = "tree-pause";
        wait_tree_formed(tag, &lab, &[0, 1, 2], Duration::from_secs(15)).await;
        let addrs = lab.addrs();
        let w = Load::start(&addrs, "w", "k3", w_rate(), 2);
        let monitor = ViewMonitor::start(&addrs);
        sleep(Duration::from_secs(2)).await;
        into_next_window(&lab, Duration::from_millis(100)).await;
        let victim = 2;
        let before = tree_stats(&lab).await;
        let stopped = Instant::now();
        lab.pause(victim);
        eprintln!("[{tag}] SIGSTOP node-{victim}");
        sleep(Duration::from_secs(6)).await;
        let resumed = Instant::now();
        lab.resume(victim);
        eprintln!("[{tag}] SIGCONT node-{victim}");
        let formed = wait_tree_formed(tag, &lab, &[0, 1, 2], Duration::from_secs(15)).await;
        into_next_window(&lab, Duration::ZERO).await;
        sleep(W_PERIOD + Duration::from_millis(500)).await;
        let mut w = w.stop().await;
        monitor.stop(tag, stopped).await;
        lab.assert_running();
        fix_fresh(tag, &lab.wall, &mut w);
        let full = check_windows(
            tag,
            &lab.wall,
            &w,
            W_PERIOD,
            W_LIMIT,
            0,
            &[("stop", stopped), ("cont", resumed)],
        );
        eprintln!(
            "[{tag}] per node admitted/answered: {}; {} checks without answer ({} at node-{victim}); the tree re-formed {} ms after SIGCONT",
            per_node(&w, 3),
            w.unanswered.len(),
            w.unanswered.iter().filter(|(n, _)| *n == victim).count(),
            formed.as_millis()
        );
        full_shares(tag, &full);
        let after = print_tree(tag, &lab).await;
        let gaps = after[victim].map(|s| s.gaps).unwrap_or(0)
            - before[victim].map(|s| s.gaps).unwrap_or(0);
        eprintln!("[{tag}] node-{victim} counted {gaps} gap(s) on resuming");
        assert!(
            gaps >= 1,
            "[{tag}] node-{victim} was stopped for 6 s and counted no gap"
        );
        lab.finish();
    });
}

// ---------------------------------------------------------------------------------------------
// 4. Link cut and heal

/// 4. Node-2's data link goes down for 8 s from 100 ms into a window, then comes back up.
///    Once membership has declared the other side dead, each side allots the whole limit
///    (`split`): every window the cut overlaps admits at most 2 × the limit. After the heal
///    the sides merge (the tree re-forms: 3 members in every view, rounds complete); every
///    window that starts after that admits at most the limit. The settle time (heal to
///    re-formed) is measured and printed.
#[test]
fn link_cut_and_heal() {
    tree_scenario("tree-cut", 3, SCENARIO_LIMIT, |mut lab| async move {
        let tag = "tree-cut";
        wait_tree_formed(tag, &lab, &[0, 1, 2], Duration::from_secs(15)).await;
        let addrs = lab.addrs();
        let w = Load::start(&addrs, "w", "k4", w_rate(), 2);
        let monitor = ViewMonitor::start(&addrs);
        sleep(Duration::from_secs(2)).await;
        into_next_window(&lab, Duration::from_millis(100)).await;
        let victim = 2;
        let cut_at = Instant::now();
        lab.link(victim, false);
        eprintln!("[{tag}] node-{victim}'s data link down");
        sleep(Duration::from_secs(8)).await;
        let healed_at = Instant::now();
        lab.link(victim, true);
        eprintln!("[{tag}] healed");
        let settle = wait_tree_formed(tag, &lab, &[0, 1, 2], Duration::from_secs(15)).await;
        let formed_at = Instant::now();
        // Two full windows after the merge.
        into_next_window(&lab, Duration::ZERO).await;
        sleep(W_PERIOD * 2 + Duration::from_millis(300)).await;
        let mut w = w.stop().await;
        let changes = monitor.stop(tag, cut_at).await;
        lab.assert_running();
        fix_fresh(tag, &lab.wall, &mut w);
        // When each side first saw the other gone.
        let split_at = |node: usize, members: u64| {
            changes
                .iter()
                .find(|(at, n, m)| *n == node && *at >= cut_at && *m == Some(members))
                .map(|(at, _, _)| (*at - cut_at).as_millis())
        };
        eprintln!(
            "[{tag}] views shrank after the cut (ms): node-0 to 2 members {:?}, node-1 {:?}, node-{victim} to 1 {:?}; settle (heal to re-formed) {} ms",
            split_at(0, 2),
            split_at(1, 2),
            split_at(victim, 1),
            settle.as_millis()
        );
        // Every window within 2 x the limit ...
        let full = check_windows(
            tag,
            &lab.wall,
            &w,
            W_PERIOD,
            W_LIMIT,
            W_LIMIT,
            &[
                ("cut", cut_at),
                ("heal", healed_at),
                ("re-formed", formed_at),
            ],
        );
        eprintln!("[{tag}] per node admitted/answered: {}", per_node(&w, 3));
        full_shares(tag, &full);
        // ... and those that start after the merge within the limit.
        let totals = window_totals(&lab.wall, &w);
        let (first_cut, last_cut) = (
            window_of(&lab.wall, cut_at),
            window_of(&lab.wall, healed_at),
        );
        let mut lines = Vec::new();
        let mut after = Vec::new();
        for (&idx, &n) in &totals {
            let start = window_start(&lab.wall, idx);
            let what = if (first_cut..=last_cut).contains(&idx) {
                "overlaps the cut, bound 2x"
            } else if start >= formed_at {
                after.push((idx, n));
                "starts after the merge, bound 1x"
            } else if start >= healed_at {
                "starts after the heal, before the merge, bound 2x"
            } else {
                "before the cut, bound 1x"
            };
            lines.push(format!("window {idx}: {n} ({what})"));
        }
        eprintln!("[{tag}] {}", lines.join("; "));
        let before_cut: Vec<(u64, u64)> = totals
            .iter()
            .filter(|&(&idx, _)| idx < first_cut)
            .map(|(&i, &n)| (i, n))
            .collect();
        assert!(
            !after.is_empty(),
            "[{tag}] no window started after the merge"
        );
        for &(idx, n) in after.iter().chain(&before_cut) {
            assert!(
                n <= W_LIMIT,
                "[{tag}] window {idx} admitted {n} > {W_LIMIT} outside the cut"
            );
        }
        print_tree(tag, &lab).await;
        lab.finish();
    });
}

// ---------------------------------------------------------------------------------------------
// 5. UDP loss

/// 5. 30% of UDP packets (gossip and QUIC) dropped on input at node-2 (nftables `numgen random
///    mod 100 < 30`) for 10 s of load. A lost message makes a round short (no grants from
///    it), so every window stays within the limit exactly; prints what the loss costs in
///    admissions (the admitted fraction of each full window) and in short rounds.
#[test]
fn udp_loss_30_percent() {
    tree_scenario("tree-loss", 3, SCENARIO_LIMIT, |mut lab| async move {
        let tag = "tree-loss";
        wait_tree_formed(tag, &lab, &[0, 1, 2], Duration::from_secs(15)).await;
        let victim = 2;
        let table = "gossamer_loss";
        let rules = format!(
            "table inet {table} {{\n  chain input {{\n    type filter hook input priority 0; policy accept;\n    meta l4proto udp numgen random mod 100 < 30 drop\n  }}\n}}\n"
        );
        let addrs = lab.addrs();
        let monitor = ViewMonitor::start(&addrs);
        let before = tree_stats(&lab).await;
        let lossy = Instant::now();
        lab.nft(victim, table, &rules);
        let w = Load::start(&addrs, "w", "k5", w_rate(), 2);
        sleep(Duration::from_secs(10)).await;
        let mut w = w.stop().await;
        let during = tree_stats(&lab).await;
        let clean = Instant::now();
        lab.nft_delete(victim, table);
        monitor.stop(tag, lossy).await;
        lab.assert_running();
        fix_fresh(tag, &lab.wall, &mut w);
        let full = check_windows(tag, &lab.wall, &w, W_PERIOD, W_LIMIT, 0, &[("loss", lossy)]);
        eprintln!("[{tag}] per node admitted/answered: {}", per_node(&w, 3));
        let lowest = full_shares(tag, &full);
        let admitted: u64 = full.iter().map(|f| f.0).sum();
        let due: u64 = full.iter().map(|f| W_LIMIT.min(f.1)).sum();
        eprintln!(
            "[{tag}] with 30% UDP loss at node-{victim}: full windows admitted {admitted} of {due} due ({:.1}%, lowest {:.1}%); short rounds per node during the loss {:?} of ~{}",
            100.0 * admitted as f64 / due.max(1) as f64,
            100.0 * lowest,
            short_between(&before, &during),
            (clean - lossy).as_millis() / T.as_millis()
        );
        wait_tree_formed(tag, &lab, &[0, 1, 2], Duration::from_secs(15)).await;
        print_tree(tag, &lab).await;
        lab.finish();
    });
}

// ---------------------------------------------------------------------------------------------
// 6. Rolling restart of 5 nodes

/// 6. Five nodes under load; each in turn gets SIGTERM (it drains, hands its admissions to
///    the next member, and leaves the cluster), exits, is started again with the same id and
///    says ready, then the next. Every window stays within the limit exactly, and nothing
///    freezes: every leave is seen as carried by the members that stayed (node-0, restarted
///    first, sees the four after it; node-4 none), and each new incarnation is vouched for
///    by them. At the end all five are in every view.
#[test]
fn rolling_restart_5_nodes() {
    const N: usize = 5;
    tree_scenario(
        "tree-rolling",
        N,
        Duration::from_secs(90),
        |mut lab| async move {
            let tag = "tree-rolling";
            let all: Vec<usize> = (0..N).collect();
            wait_tree_formed(tag, &lab, &all, Duration::from_secs(15)).await;
            let addrs = lab.addrs();
            let w = Load::start(&addrs, "w", "k6", w_rate(), 2);
            sleep(Duration::from_secs(2)).await;
            let mut events: Vec<(String, Instant)> = Vec::new();
            for victim in 0..N {
                let asked = Instant::now();
                let exit = lab.terminate(victim, Duration::from_secs(12)).await;
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
                events.push((format!("term-{victim}"), asked));
            }
            let done = Instant::now();
            let formed = wait_tree_formed(tag, &lab, &all, Duration::from_secs(15)).await;
            into_next_window(&lab, Duration::ZERO).await;
            sleep(W_PERIOD + Duration::from_millis(300)).await;
            let mut w = w.stop().await;
            lab.assert_running();
            fix_fresh(tag, &lab.wall, &mut w);
            events.push(("restarts done".to_owned(), done));
            let events: Vec<(&str, Instant)> =
                events.iter().map(|(n, t)| (n.as_str(), *t)).collect();
            let full = check_windows(tag, &lab.wall, &w, W_PERIOD, W_LIMIT, 0, &events);
            eprintln!(
                "[{tag}] per node admitted/answered: {}; {} checks without answer; the tree was whole {} ms after the last restart",
                per_node(&w, N),
                w.unanswered.len(),
                formed.as_millis()
            );
            full_shares(tag, &full);
            let stats = print_tree(tag, &lab).await;
            let carried: Vec<Option<u64>> =
                stats.iter().map(|s| s.map(|s| s.left_carried)).collect();
            let expected: Vec<Option<u64>> = (0..N).map(|i| Some((N - 1 - i) as u64)).collect();
            assert_eq!(
                carried, expected,
                "[{tag}] every leave after a node's restart was carried, in its view"
            );
            lab.finish();
        },
    );
}
