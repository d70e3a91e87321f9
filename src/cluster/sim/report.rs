//! `gossamer sim --report FILE`: the chaos report. Named fault scenarios, a sweep of
//! random seeds, and the scaling figures, written as markdown with an SVG plot beside it.
//! Every figure in it comes from the run that writes it.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use super::{
    DETECT, Fault, LIMIT, MS, Outcome, ScalePoint, Setup, Summary, explore, on_threads, run, scale,
};
use crate::cluster::global::OnPartition;
use crate::limiter::{Nanos, SECOND};

/// Seeds the report sweeps (the long run is `gossamer sim --seeds 1..10001`).
const REPORT_SEEDS: u64 = 1000;

/// A named scenario: a fixed schedule on a fixed setup.
struct Scenario {
    name: &'static str,
    faults: &'static str,
    setup: Setup,
}

fn scenario(
    name: &'static str,
    faults: &'static str,
    nodes: usize,
    mode: OnPartition,
    skew: bool,
    plan: Vec<(Nanos, Fault)>,
) -> Scenario {
    Scenario {
        name,
        faults,
        setup: Setup {
            seed: 42,
            nodes,
            duration: 8 * SECOND,
            faults_until: 5 * SECOND,
            on_partition: mode,
            skew,
            schedule: Some(plan),
            relimit: false,
            add_rule: None,
        },
    }
}

fn scenarios() -> Vec<Scenario> {
    use Fault::*;
    use OnPartition::{Hold, Split};
    let s = SECOND;
    let mut out = Vec::new();
    for nodes in [3, 5] {
        out.extend([
            scenario("no faults", "none", nodes, Hold, false, vec![]),
            scenario(
                "20% loss",
                "20% of messages lost, 1–5 s",
                nodes,
                Hold,
                false,
                vec![(s, Loss(200))],
            ),
            scenario(
                "30% loss",
                "30% of messages lost, 1–5 s",
                nodes,
                Hold,
                false,
                vec![(s, Loss(300))],
            ),
            scenario(
                "delay and reordering",
                "5–45 ms per message (δ = 25 ms), 1–5 s",
                nodes,
                Hold,
                false,
                vec![(
                    s,
                    Delay {
                        delay: 5 * MS,
                        jitter: 40 * MS,
                    },
                )],
            ),
            scenario(
                "duplication",
                "20% of messages twice, 1–5 s",
                nodes,
                Hold,
                false,
                vec![(s, Duplicate(200))],
            ),
            scenario(
                "partition (hold)",
                "node 0 cut off both ways 1.5–3.5 s",
                nodes,
                Hold,
                false,
                vec![(1500 * MS, Partition(vec![0])), (3500 * MS, Heal)],
            ),
            scenario(
                "partition (split)",
                "node 0 cut off both ways 1.5–3.5 s",
                nodes,
                Split,
                false,
                vec![(1500 * MS, Partition(vec![0])), (3500 * MS, Heal)],
            ),
            scenario(
                "one-way partition",
                "node 0 hears nothing 1.5–3.5 s",
                nodes,
                Hold,
                false,
                vec![(1500 * MS, Deaf(0)), (3500 * MS, Heal)],
            ),
            scenario(
                "flapping link",
                "link 0–1 cut and healed every 300 ms, 1.5–3.9 s",
                nodes,
                Hold,
                false,
                (0..8)
                    .map(|k| {
                        let at = 1500 * MS + k * 300 * MS;
                        (at, if k % 2 == 0 { Cut(0, 1) } else { Heal })
                    })
                    .collect(),
            ),
            scenario(
                "crash and restart",
                "node 1 killed at 1.55 s, restarted at 2.55 s",
                nodes,
                Hold,
                false,
                vec![(1550 * MS, Crash(1)), (2550 * MS, Restart(1))],
            ),
            scenario(
                "pause",
                "node 1 stopped 1.5 s from 1.5 s (SIGSTOP past failure detection)",
                nodes,
                Hold,
                false,
                vec![(1500 * MS, Pause(1, 1500 * MS))],
            ),
            scenario(
                "clock skew",
                "every clock off by up to ±5 ms, no other fault",
                nodes,
                Hold,
                true,
                vec![],
            ),
        ]);
    }
    out
}

/// Writes the report to `path` (and its plot beside it), using `threads` for the seeds.
/// Returns a one-line summary.
/// With `large`, the scale table also has 1,000 nodes and 100,000 keys (about half an hour
/// more on two cores).
pub fn write(path: &Path, threads: usize, large: bool) -> std::io::Result<String> {
    let started = Instant::now();
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# Chaos report\n\n\
         Generated by `gossamer sim --report {}{}` (release build). Every figure comes from that \
         run: the production round protocol (`src/cluster/global.rs`) on virtual time, over the \
         simulated network of `src/cluster/sim.rs`, every message through the wire codec. \
         Membership is simulated (a node holds a peer alive while it heard from it in the last \
         {} ms), as are the clocks. The real-network suites are `tests/netns.rs` and \
         `tests/chaos.rs`.\n",
        path.display(),
        if large { " --large" } else { "" },
        DETECT / MS
    );
    let _ = writeln!(
        md,
        "Load: two keys of a fixed-window rule, {LIMIT} per second, one key of a token \
         bucket, {LIMIT} per second with a burst of {LIMIT}, one key of a sliding log, {LIMIT} \
         per 1.6 s, and one of a sliding counter, {LIMIT} per second, each offered 150 per \
         second (1.5× the per-second limits, 2.4× the log's), spread unevenly over the nodes. Faults from 1 s to 5 s, then the network heals, \
         crashed nodes restart, and the load goes on fault-free to 8 s; then the load stops.\n\n\
         Columns: *admitted* is the share of the ideal (per window, the smaller of the load \
         offered and the limit); *worst window* is the most any fixed window, sliding-log \
         period or sliding-counter aligned window admitted (by the admitting nodes' clocks), \
         against the limit and the allowance the design gives the faults in that window (none under \
         `hold`; under `split`, a whole limit per extra side, design.md §5); *bucket* is the most any \
         interval τ admitted on the token bucket beyond `burst + rate·τ` (under `split`, \
         times the sides where a splitting fault overlaps), against the `N − 1` units of \
         capacity floor design.md §3.5 allows (negative: always below); *agreed* is the \
         time from the load's end until every node holds the same count of every actor, equal \
         to the true count for every live one; *lost* is admissions no node counts at the end; \
         *false denials* (fixed window / bucket / log / counter) is, of the checks made while the cluster was whole \
         (every node up and joined, no link cut or lossy, nobody suspected) that design.md \
         §3.3.3's invariant says must be admitted at once, the share denied (reported, not yet \
         an invariant).\n"
    );
    let _ = writeln!(
        md,
        "## Scenarios\n\n\
         | scenario | nodes | faults | admitted | worst window (limit + allowance) | bucket (allowed) | agreed | lost | false denials | invariants |\n\
         |---|---|---|---|---|---|---|---|---|---|"
    );
    let mut broken = 0;
    for sc in scenarios() {
        let o = run(&sc.setup);
        let (worst, allowance) = worst_window(&o);
        if !o.violations.is_empty() {
            broken += 1;
        }
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.1}% | {} ({} + {}) | {:+} ({}) | {} | {} | {} | {} |",
            sc.name,
            sc.setup.nodes,
            sc.faults,
            100.0 * o.admitted as f64 / o.ideal.max(1) as f64,
            worst,
            LIMIT,
            allowance,
            o.bucket_excess,
            o.bucket_allowance,
            o.converged_after
                .map_or("never".to_owned(), |t| format!("{} ms", t / MS)),
            o.lost,
            false_denials(&o.must_admit, &o.false_denials),
            if o.violations.is_empty() {
                "held".to_owned()
            } else {
                format!("**{} broken**: {}", o.violations.len(), o.violations[0])
            }
        );
    }
    let seeds_started = Instant::now();
    let summary = explore(1..REPORT_SEEDS + 1, threads, |_| {});
    let split = explore(1..REPORT_SEEDS / 4 + 1, threads, |s| {
        s.on_partition = OnPartition::Split;
    });
    let _ = writeln!(
        md,
        "\n## Random schedules\n\n\
         Each seed draws 3–5 nodes, clock offsets of up to ±5 ms, and a fault every 0.1–0.8 s \
         from 1 s to 5 s: loss (0–30%), duplication (0–20%), delay (1–10 ms plus 0–40 ms \
         jitter), a partition of up to half the nodes, a deaf node, a cut link (repeated: \
         flapping), heal, crash, restart, pause (0.2–2 s). `gossamer sim --seed N` replays \
         one and prints its schedule. *False denials* (fixed window / bucket / log / counter): of the checks made \
         while the cluster was whole (every node up and joined, no link cut or lossy, nobody \
         suspected) that design.md §3.3.3's invariant says must be admitted at once, the share \
         denied; reported, not yet an invariant a seed breaks.\n\n\
         | mode | seeds | broke an invariant | admitted | worst window over the limit | bucket | lost | agreed (median / p99 / max) | false denials |\n\
         |---|---|---|---|---|---|---|---|---|"
    );
    for (mode, s) in [("hold", &summary), ("split", &split)] {
        let _ = writeln!(md, "{}", seeds_row(mode, s));
    }
    for failure in summary.failures.iter().chain(&split.failures).take(5) {
        let _ = writeln!(md, "\n```\n{failure}```");
    }
    let seeds_took = seeds_started.elapsed();
    let _ = writeln!(
        md,
        "\n{} seeds took {:.0} s on {threads} threads.",
        summary.runs + split.runs,
        seeds_took.as_secs_f64()
    );
    // Scaling.
    let mut by_nodes = vec![(10, 10), (30, 10), (100, 10), (300, 10)];
    let mut by_keys = vec![(10, 1000), (10, 10_000)];
    if large {
        by_nodes.push((1000, 10));
        by_keys.push((10, 100_000));
    }
    let mut all = scale_points(&[by_nodes.as_slice(), by_keys.as_slice()].concat(), threads);
    let wide = all.split_off(by_nodes.len());
    let points = all;
    let _ = writeln!(
        md,
        "\n## Scale\n\n\
         Each point: the cluster forms, then for 1 s every key is checked once a round at a \
         random node (so every key is in every round's frames); *bytes/node/s* is what each \
         node sent then (frames, digests, repairs, encoded). Then a burst of 5 on a fresh key \
         at one node: *converge* is the time until every node counts it. Then 2 s of 1.5× \
         load on one key limited to 1,000/s, spread evenly with random arrivals: *admitted* in the two whole windows. \
         Exchange is full mesh: every node sends its frame to every other node each round.\n\n\
         {SCALE_HEADER}"
    );
    for p in points.iter().chain(&wide) {
        let _ = writeln!(md, "{}", scale_row(p));
    }
    let first = &points[0];
    let last = &points[points.len() - 1];
    let _ = writeln!(
        md,
        "\nFrom {} to {} nodes (×{}), bytes per node grow ×{:.0}: linearly, since each \
         node sends each round to every other. Convergence stays at about one round plus δ, \
         for the same reason. Per-node traffic does **not** grow only logarithmically over the \
         full mesh; over the aggregation tree (below) it does not grow with the cluster. A simulated round costs every node work in \
         proportion to keys × nodes, so the whole cluster keys × nodes² (last column: the \
         points ran two at a time on two cores).{}\n\n![scaling](chaos-scaling.svg)\n",
        first.nodes,
        last.nodes,
        last.nodes / first.nodes,
        last.bytes_per_node_second / first.bytes_per_node_second.max(1.0),
        if large {
            " 1,000 nodes with 100,000 keys were not simulated together: every node would hold \
             every key, 10⁸ key states in one process."
        } else {
            " Without `--large`, 1,000 nodes and 100,000 keys are left out (they take about \
             half an hour more)."
        }
    );
    if let Some(thin) = points.iter().find(|p| p.admitted * 100 < p.ideal * 95) {
        let _ = writeln!(
            md,
            "At {} nodes the 1,000/s limit is {:.1} units per node per round, and the cluster \
             admitted {:.0}% of it: targets are whole units, so a limit spread thinner than \
             about one unit per node per round under-admits (design.md §7, \
             \"many nodes sharing a small limit\").\n",
            thin.nodes,
            1000.0 / thin.nodes as f64 / 10.0,
            100.0 * thin.admitted as f64 / thin.ideal as f64
        );
    }
    let (tree, tree_points) = tree_section(threads, large);
    md.push_str(&tree);
    let _ = writeln!(
        md,
        "\nWhole report generated in {:.0} s.",
        started.elapsed().as_secs_f64()
    );
    std::fs::write(path, md)?;
    let svg = path.with_file_name("chaos-scaling.svg");
    std::fs::write(svg, plot(&points))?;
    std::fs::write(path.with_file_name("tree-scaling.svg"), plot(&tree_points))?;
    Ok(format!(
        "wrote {}: {} scenarios broke an invariant; {} and {}",
        path.display(),
        broken,
        summary.line(seeds_took),
        split.line(seeds_took)
    ))
}

/// Measures `specs` (nodes, keys) on up to `threads` threads, the costliest first; results
/// in the order of `specs`.
fn scale_points(specs: &[(usize, usize)], threads: usize) -> Vec<ScalePoint> {
    let mut order: Vec<usize> = (0..specs.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(specs[i].0 * specs[i].0 * specs[i].1));
    let done: std::sync::Mutex<Vec<Option<ScalePoint>>> =
        std::sync::Mutex::new(vec![None; specs.len()]);
    on_threads(order.len(), threads, |k| {
        let i = order[k];
        let (nodes, keys) = specs[i];
        let p = scale(nodes, keys, 7);
        done.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(p);
    });
    done.into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .flatten()
        .collect()
}

/// The scaling table's header (two lines of Markdown).
pub const SCALE_HEADER: &str = "| nodes | keys per round | bytes/node/s | converge | admitted (of 2,000) | worst window (limit 1,000) | simulated in |\n|---|---|---|---|---|---|---|";

/// One row of the scaling table.
pub fn scale_row(p: &ScalePoint) -> String {
    format!(
        "| {} | {} | {} | {} | {:.1}% | {} | {:.1} s |",
        p.nodes,
        p.keys,
        human_bytes(p.bytes_per_node_second),
        p.converge
            .map_or("> 3 s".to_owned(), |t| format!("{} ms", t / MS)),
        100.0 * p.admitted as f64 / p.ideal as f64,
        p.worst_window,
        p.took.as_secs_f64()
    )
}

/// The header of the aggregation tree's scaling table.
pub const TREE_SCALE_HEADER: &str = "| nodes | keys per round | bytes/node/s (mean) | bytes/node/s (most) | messages/node/s | converge | admitted (of 2,000) | worst window (limit 1,000) | complete rounds | simulated in |\n|---|---|---|---|---|---|---|---|---|---|";

/// One row of the aggregation tree's scaling table.
pub fn tree_scale_row(p: &crate::cluster::tree::sim::TreeScalePoint) -> String {
    format!(
        "| {} | {} | {} | {} | {:.1} | {} | {:.1}% | {} | {:.1}% | {:.1} s |",
        p.nodes,
        p.keys,
        human_bytes(p.bytes_per_node_second),
        human_bytes(p.max_bytes_per_node_second),
        p.messages_per_node_second,
        p.converge
            .map_or("> 3 s".to_owned(), |t| format!("{} ms", t / MS)),
        100.0 * p.admitted as f64 / 2000.0,
        p.worst_window,
        100.0 * p.complete,
        p.took.as_secs_f64()
    )
}

/// What a scaling point's bytes were (`gossamer sim --scale` prints it under the row).
pub fn scale_traffic(p: &ScalePoint) -> String {
    let t = p.traffic;
    let all = (t.empty_frames + t.frames + t.other).max(1) as f64;
    format!(
        "of those bytes: {:.1}% round frames reporting no key, {:.1}% frames reporting keys, \
         {:.1}% digests and repairs\n\
         a round frame reported {:.2} keys on average ({} key reports in {} frames)",
        100.0 * t.empty_frames as f64 / all,
        100.0 * t.frames as f64 / all,
        100.0 * t.other as f64 / all,
        t.key_reports as f64 / t.round_frames.max(1) as f64,
        t.key_reports,
        t.round_frames
    )
}

/// The most any fixed window, log period or counter window admitted, with its allowance.
fn worst_window(o: &Outcome) -> (u64, u64) {
    o.windows
        .iter()
        .map(|&(_, n, allow, _)| (n, allow))
        .chain(o.sliding)
        .max_by_key(|&(n, allow)| (n, std::cmp::Reverse(allow)))
        .unwrap_or((0, 0))
}

fn seeds_row(mode: &str, s: &Summary) -> String {
    let pct = |q| s.converged_ms(q);
    format!(
        "| {mode} | {} | {} | {:.1}% | {} | {:+} | {} | {} / {} / {} ms | {} |",
        s.runs,
        s.failures.len(),
        100.0 * s.admitted as f64 / s.ideal.max(1) as f64,
        s.worst_over,
        s.bucket_excess.unwrap_or(0),
        s.lost,
        pct(50),
        pct(99),
        pct(100),
        false_denials(&s.must_admit, &s.false_denials)
    )
}

/// The false-denial shares, fixed window / bucket / log / counter.
fn false_denials(must: &[u64; 4], denied: &[u64; 4]) -> String {
    let pct: Vec<String> = (0..must.len())
        .map(|i| format!("{:.1}%", 100.0 * denied[i] as f64 / must[i].max(1) as f64))
        .collect();
    pct.join(" / ")
}

fn human_bytes(b: f64) -> String {
    if b >= 1e6 {
        format!("{:.1} MB", b / 1e6)
    } else if b >= 1e3 {
        format!("{:.1} kB", b / 1e3)
    } else {
        format!("{b:.0} B")
    }
}

/// Two panels against node count (log scale): bytes per node per second (log scale) and
/// convergence time.
fn plot(points: &[ScalePoint]) -> String {
    let (w, h, pad) = (360.0, 240.0, 50.0);
    let xs: Vec<f64> = points.iter().map(|p| (p.nodes as f64).log10()).collect();
    let (x0, x1) = (xs[0].floor(), xs[xs.len() - 1].ceil());
    let x = |v: f64, left: f64| left + pad + (v - x0) / (x1 - x0).max(1e-9) * (w - 2.0 * pad);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"11\">\n",
        2.0 * w
    );
    let panels: [(&str, Vec<f64>, bool); 2] = [
        (
            "bytes sent per node per second",
            points.iter().map(|p| p.bytes_per_node_second).collect(),
            true,
        ),
        (
            "convergence after a burst (ms)",
            points
                .iter()
                .map(|p| p.converge.unwrap_or(0) as f64 / MS as f64)
                .collect(),
            false,
        ),
    ];
    for (k, (title, ys, log)) in panels.iter().enumerate() {
        let left = k as f64 * w;
        let vals: Vec<f64> = ys
            .iter()
            .map(|&v| if *log { v.max(1.0).log10() } else { v })
            .collect();
        let (y0, y1) = if *log {
            (
                vals.iter().copied().fold(f64::MAX, f64::min).floor(),
                vals.iter().copied().fold(f64::MIN, f64::max).ceil(),
            )
        } else {
            (0.0, vals.iter().copied().fold(1.0, f64::max) * 1.2)
        };
        let y = |v: f64| h - pad - (v - y0) / (y1 - y0).max(1e-9) * (h - 2.0 * pad);
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"20\" text-anchor=\"middle\">{title}</text>",
            left + w / 2.0
        );
        let _ = writeln!(
            svg,
            "<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"black\"/><line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{3}\" stroke=\"black\"/>",
            left + pad,
            h - pad,
            left + w - pad,
            pad
        );
        for p in points {
            let v = (p.nodes as f64).log10();
            let _ = writeln!(
                svg,
                "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                x(v, left),
                h - pad + 15.0,
                p.nodes
            );
        }
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">nodes</text>",
            left + w / 2.0,
            h - 12.0
        );
        let ticks: Vec<f64> = if *log {
            (y0 as i64..=y1 as i64).map(|e| e as f64).collect()
        } else {
            (0..=4).map(|i| y0 + (y1 - y0) * i as f64 / 4.0).collect()
        };
        for t in ticks {
            let label = if *log {
                human_bytes(10f64.powf(t))
            } else {
                format!("{t:.0}")
            };
            let _ = writeln!(
                svg,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{label}</text>",
                left + pad - 4.0,
                y(t) + 4.0
            );
        }
        let path: Vec<String> = xs
            .iter()
            .zip(&vals)
            .map(|(&a, &b)| format!("{:.1},{:.1}", x(a, left), y(b)))
            .collect();
        let _ = writeln!(
            svg,
            "<polyline fill=\"none\" stroke=\"steelblue\" stroke-width=\"2\" points=\"{}\"/>",
            path.join(" ")
        );
        for pt in &path {
            let (a, b) = pt.split_once(',').unwrap_or(("0", "0"));
            let _ = writeln!(
                svg,
                "<circle cx=\"{a}\" cy=\"{b}\" r=\"3\" fill=\"steelblue\"/>"
            );
        }
    }
    svg.push_str("</svg>\n");
    svg
}

/// Seeds the report sweeps over the tree (the long run is `gossamer sim --tree --seeds
/// 1..10001`).
const TREE_REPORT_SEEDS: u64 = 1000;

/// The chaos report's section on the aggregation tree (`cluster::tree`): its seeds and its
/// scaling table, and the points for its plot.
fn tree_section(threads: usize, large: bool) -> (String, Vec<ScalePoint>) {
    use crate::cluster::tree::sim::{AGREE_WITHIN, TreeScalePoint, explore as tree_explore};
    let mut md = String::new();
    let _ = writeln!(
        md,
        "## The aggregation tree\n\n\
         `src/cluster/tree.rs` runs global fixed windows over an aggregation tree instead of \
         the full mesh (design.md §11.1): each round a node sends its subtree's sums to its \
         parent and gets the totals back, so it sends one message up and at most the fan-out \
         down, whatever the cluster's size. It has its own simulation \
         (`src/cluster/tree/sim.rs`, every message through the wire codec); a node runs it \
         with `[cluster] exchange = \"tree\"`. `gossamer sim --tree --seed N` replays a seed, `--tree --seeds` \
         explores, `--tree --scale NODES,KEYS` measures one point.\n"
    );
    let seeds_started = Instant::now();
    let summary = tree_explore(1..TREE_REPORT_SEEDS + 1, threads);
    let _ = writeln!(
        md,
        "### Random schedules\n\n\
         Each seed draws 3–20 nodes, a fan-out of 2–4, a limit of 50–300 per second (and three \
         times it per 3 s), clock offsets of up to ±5 ms, and a fault every 0.1–0.8 s from \
         1 s to 5 s: loss (0–30%), duplication (0–20%), delay (1–10 ms plus 0–30 ms jitter), \
         a partition into two sides, heal, crash (restart 0.3–1.5 s later as a new \
         generation), a leave on purpose (the node hands its admissions to its carrier; \
         restart 0.3–1.5 s later), every node crashing at once, pause (0.2–2 s). Each node's view follows who is up 0.2–0.6 s after a \
         change. Load: three keys of each rule at twice their limits. Checked every \
         millisecond: no slot admits more than its limit times the sides of a partition \
         around it (`split`'s bound; the tree has no `hold`); no node's totals count more than \
         was admitted; after the faults, every running node applies a complete round of one \
         view within {} ms. *Admitted* is over the whole windows after that.\n\n{}\n",
        AGREE_WITHIN / MS,
        summary.line(seeds_started.elapsed())
    );
    for f in summary.failures.iter().take(5) {
        let _ = writeln!(md, "- {f}");
    }
    let mut specs: Vec<(usize, usize)> = vec![
        (10, 10),
        (30, 10),
        (100, 10),
        (300, 10),
        (1000, 10),
        (10, 1000),
        (100, 1000),
        (1000, 1000),
    ];
    if large {
        specs.push((100, 100_000));
        specs.push((1000, 100_000));
    }
    let mut order: Vec<usize> = (0..specs.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(specs[i].0 * specs[i].1));
    let done: std::sync::Mutex<Vec<Option<TreeScalePoint>>> =
        std::sync::Mutex::new(vec![None; specs.len()]);
    on_threads(order.len(), threads, |k| {
        let i = order[k];
        let p = crate::cluster::tree::sim::scale(specs[i].0, specs[i].1, 7);
        done.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(p);
    });
    let points: Vec<TreeScalePoint> = done
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .flatten()
        .collect();
    let _ = writeln!(
        md,
        "### Scale\n\n\
         The same load as the full mesh's table above: the cluster forms (and runs past the \
         slots open at its start, which no member is based in), then for 1 s every key is checked once a round at a \
         random node; *bytes/node/s* is what each node sent then, the mean over nodes and the \
         most any one node sent (the root moves each round, so the most is an inner node's). \
         Then a burst of 5 on a fresh key at one node: *converge* is the time until the totals \
         that node receives count all of it (a node receives the totals of the keys it \
         reports). Then 2 s of 1.5× load on one key limited to 1,000/s, spread evenly with \
         random arrivals: *admitted* in the two whole windows; *complete rounds* is the share \
         of rounds each node applied then. Fan-out {}.\n\n{TREE_SCALE_HEADER}",
        crate::cluster::tree::DEFAULT_FANOUT
    );
    for p in &points {
        let _ = writeln!(md, "{}", tree_scale_row(p));
    }
    let ten: Vec<&TreeScalePoint> = points.iter().filter(|p| p.keys == 10).collect();
    if let (Some(a), Some(b)) = (ten.first(), ten.last()) {
        let _ = writeln!(
            md,
            "\nFrom {} to {} nodes (×{}), with 10 keys a round, the mean bytes per node went \
             ×{:.2} and the most any node sent ×{:.2}, where the full mesh's grew about \
             linearly; messages per node stay at one up and about one down per round. A \
             node's traffic is set by the keys active in its subtree, not by the cluster's \
             size.\n\n![scaling over the tree](tree-scaling.svg)\n",
            a.nodes,
            b.nodes,
            b.nodes / a.nodes.max(1),
            b.bytes_per_node_second / a.bytes_per_node_second.max(1.0),
            b.max_bytes_per_node_second / a.max_bytes_per_node_second.max(1.0)
        );
    }
    let plotted = ten
        .iter()
        .map(|p| ScalePoint {
            nodes: p.nodes,
            keys: p.keys,
            bytes_per_node_second: p.bytes_per_node_second,
            converge: p.converge,
            admitted: p.admitted,
            worst_window: p.worst_window,
            ideal: 2000,
            took: p.took,
            traffic: Default::default(),
        })
        .collect();
    (md, plotted)
}
