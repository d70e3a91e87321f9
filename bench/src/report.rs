//! The run (start what is needed, measure everything) and the report it writes:
//! `docs/benchmarks.md` and `docs/bench/*.svg`. Every number in the report comes from this
//! run; text that depends on a result is chosen by the result.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::Settings;
use crate::cluster::{self, Cost};
use crate::embedded::{self, Figure, Side};
use crate::load::{self, Hammer, KEYS, Point, ZIPF_S, Zipf};
use crate::machine::{self, Machine};
use crate::procs::Proc;
use crate::svg;
use crate::targets::{Design, Key, LIMIT, Target};

const REDIS_PORT: u16 = 17301;
const HOP_PORT: u16 = 17302;
const ZERO_PORT: u16 = 17303;
const GOSSAMER_PORT: u16 = 17304;
/// The hop: this much each way.
const HOP_US: u64 = 250;

/// gossamer's rules for the load matrix: the same limit as every Redis design.
const RULES: &str = r#"[[rule]]
name = "fw"
algorithm = "fixed_window"
limit = 100
period = "1s"

[[rule]]
name = "log"
algorithm = "sliding_window_log"
limit = 100
period = "1s"

[[rule]]
name = "tb"
algorithm = "token_bucket"
limit = 100
period = "1s"
burst = 100
"#;

/// Where a check goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Via {
    Loopback,
    Hop,
    /// Through the proxy with no delay: what the proxy itself costs.
    Proxy0,
}

/// A column of the load matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Who {
    Gossamer(&'static str),
    Redis(u8, Via),
}

impl Who {
    fn design(self) -> Option<Design> {
        match self {
            Who::Redis(d, _) => Some(Design::ALL[d as usize]),
            Who::Gossamer(_) => None,
        }
    }

    fn label(self) -> String {
        match self {
            Who::Gossamer(rule) => format!("gossamer HTTP, {}", gossamer_rule_name(rule)),
            Who::Redis(d, via) => {
                let via = match via {
                    Via::Loopback => "loopback",
                    Via::Hop => "0.25 ms hop",
                    Via::Proxy0 => "proxy, 0 delay",
                };
                format!("{} — {via}", Design::ALL[d as usize].name())
            }
        }
    }

    fn short(self) -> String {
        match self {
            Who::Gossamer(rule) => format!("gossamer {}", gossamer_rule_name(rule)),
            Who::Redis(d, via) => {
                let via = match via {
                    Via::Loopback => "",
                    Via::Hop => " +hop",
                    Via::Proxy0 => " +proxy0",
                };
                format!("{}{via}", Design::ALL[d as usize].short())
            }
        }
    }
}

fn gossamer_rule_name(rule: &str) -> &'static str {
    match rule {
        "fw" => "fixed window",
        "log" => "sliding log",
        _ => "token bucket",
    }
}

fn redis(d: Design, via: Via) -> Who {
    let i = Design::ALL.iter().position(|x| *x == d).unwrap_or(0);
    Who::Redis(i as u8, via)
}

/// The columns of the load matrix, in the order they run (rotated each repetition).
fn matrix() -> Vec<Who> {
    let mut v = vec![
        Who::Gossamer("fw"),
        Who::Gossamer("log"),
        Who::Gossamer("tb"),
    ];
    for d in Design::ALL {
        v.push(redis(d, Via::Loopback));
        v.push(redis(d, Via::Hop));
    }
    v.push(redis(Design::FixedIncrExpire, Via::Proxy0));
    v
}

pub fn median(v: &[f64]) -> f64 {
    let mut v: Vec<f64> = v.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// A number for a table: thousands separated, sensible precision.
pub fn num(x: f64) -> String {
    if !x.is_finite() {
        return "–".into();
    }
    let a = x.abs();
    if a >= 100.0 {
        let s = format!("{:.0}", x.abs());
        let mut out = String::new();
        for (i, c) in s.chars().enumerate() {
            if i > 0 && (s.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(c);
        }
        if x < 0.0 { format!("-{out}") } else { out }
    } else if a >= 10.0 {
        format!("{x:.1}")
    } else if a >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

fn ratio(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.2}")
    } else {
        "–".into()
    }
}

/// Everything one run measured.
struct Results {
    machine_before: Machine,
    load_during: Vec<f64>,
    started: String,
    commit: String,
    hop: Vec<(String, Point)>,
    /// (who, concurrency) → one point per repetition.
    points: BTreeMap<(Who, usize), Vec<Point>>,
    hammer: Vec<(Who, Hammer)>,
    embedded: Vec<Figure>,
    bytes_per_key: Vec<(Side, f64)>,
    cluster: Result<Vec<Cost>, String>,
    redis_version: String,
    elapsed: Duration,
}

fn sh_out(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// `gossamer-bench run`.
pub fn run(s: &Settings) -> Result<(), String> {
    let began = Instant::now();
    let bin = s.root.join("target/release/gossamer");
    if !bin.exists() {
        return Err(format!(
            "{} is missing: build it first (`cargo build --release`), or use bench/run.sh",
            bin.display()
        ));
    }
    let work = std::env::temp_dir().join(format!("gossamer-bench-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| e.to_string())?;
    let quiet = machine::wait_for_quiet(s.max_load, s.load_wait);
    eprintln!("load average {quiet:.2}; starting");
    let machine_before = Machine::now();
    let started = sh_out("date", &["-u", "+%Y-%m-%d %H:%M UTC"]);
    let mut load_during = vec![machine_before.load[0]];

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;

    // --- servers ------------------------------------------------------------------------
    let mut redis_srv = {
        let mut c = Command::new("redis-server");
        c.args(["--port", &REDIS_PORT.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .args(["--protected-mode", "yes", "--logfile", ""])
            .arg("--dir")
            .arg(&work);
        Proc::spawn("redis-server", c, &work.join("redis.log"))?
    };
    let redis_addr = SocketAddr::from(([127, 0, 0, 1], REDIS_PORT));
    redis_srv.wait_listening(redis_addr, Duration::from_secs(10))?;
    let redis_version = sh_out("redis-server", &["--version"]);
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let proxy = |port: u16, delay: u64| -> Result<Proc, String> {
        let mut c = Command::new(&exe);
        c.args([
            "proxy",
            &format!("127.0.0.1:{port}"),
            &redis_addr.to_string(),
            &delay.to_string(),
        ]);
        let mut p = Proc::spawn(
            &format!("proxy {delay} µs"),
            c,
            &work.join(format!("proxy{port}.log")),
        )?;
        p.wait_listening(
            SocketAddr::from(([127, 0, 0, 1], port)),
            Duration::from_secs(5),
        )?;
        Ok(p)
    };
    let hop_proxy = proxy(HOP_PORT, HOP_US)?;
    let zero_proxy = proxy(ZERO_PORT, 0)?;
    let rules = work.join("rules.toml");
    std::fs::write(&rules, RULES).map_err(|e| e.to_string())?;
    let gossamer_addr = SocketAddr::from(([127, 0, 0, 1], GOSSAMER_PORT));
    let mut gossamer = {
        let mut c = Command::new(&bin);
        c.arg("serve")
            .arg("--config")
            .arg(&rules)
            .args(["--http", &gossamer_addr.to_string()])
            .env_remove("RUST_LOG");
        Proc::spawn("gossamer", c, &work.join("gossamer.log"))?
    };
    gossamer.wait_listening(gossamer_addr, Duration::from_secs(10))?;
    let addr_of = |via: Via| {
        let port = match via {
            Via::Loopback => REDIS_PORT,
            Via::Hop => HOP_PORT,
            Via::Proxy0 => ZERO_PORT,
        };
        SocketAddr::from(([127, 0, 0, 1], port))
    };
    let target_of = |who: Who| match who {
        Who::Gossamer(rule) => Target::Gossamer {
            addr: gossamer_addr,
            rule,
        },
        Who::Redis(d, via) => Target::Redis {
            addr: addr_of(via),
            design: Design::ALL[d as usize],
        },
    };
    let (gossamer_pid, redis_pid) = (gossamer.pid(), redis_srv.pid());
    let pid_of = |who: Who| match who {
        Who::Gossamer(_) => gossamer_pid,
        Who::Redis(..) => redis_pid,
    };

    // --- the hop itself -----------------------------------------------------------------
    eprintln!("measuring the hop (Redis PING at concurrency 1)");
    let zipf = Arc::new(Zipf::new(KEYS, ZIPF_S));
    let mut hop = Vec::new();
    for (name, via) in [
        ("direct (loopback)", Via::Loopback),
        ("through the proxy, 0 delay", Via::Proxy0),
        ("through the proxy, 0.25 ms each way", Via::Hop),
    ] {
        let keys = load::keys("ping-", 1);
        let p = rt.block_on(load::point(
            &Target::Ping { addr: addr_of(via) },
            1,
            (s.warmup, s.duration),
            keys,
            Arc::new(Zipf::new(1, 1.0)),
            1,
            redis_srv.pid(),
        ))?;
        hop.push((name.to_string(), p));
    }

    // --- the load matrix ----------------------------------------------------------------
    let cols = matrix();
    let mut points: BTreeMap<(Who, usize), Vec<Point>> = BTreeMap::new();
    for rep in 0..s.reps {
        for &conc in &s.concurrency {
            // Rotate the order each repetition, so no column always runs first.
            let n = cols.len();
            for k in 0..n {
                let who = cols[(k + rep * 5) % n];
                let prefix = format!("r{rep}c{conc}{}-", who.short().replace(' ', ""));
                let keys = load::keys(&prefix, KEYS);
                let p = rt.block_on(load::point(
                    &target_of(who),
                    conc,
                    (s.warmup, s.duration),
                    keys,
                    zipf.clone(),
                    (rep * 100 + conc) as u64,
                    pid_of(who),
                ))?;
                eprintln!(
                    "rep {} c{conc:<3} {:<40} {:>8.0}/s p50 {:>7.0} µs p99 {:>7.0} µs cpu {:.3} s/100k",
                    rep + 1,
                    who.label(),
                    p.rate(),
                    p.quantile_us(0.5),
                    p.quantile_us(0.99),
                    p.cpu_per_100k()
                );
                points.entry((who, conc)).or_default().push(p);
            }
            load_during.push(machine::load_average()[0]);
        }
        redis_srv.alive()?;
        gossamer.alive()?;
    }

    // --- correctness under concurrency ----------------------------------------------------
    let mut hammer = Vec::new();
    let mut hcols = vec![
        Who::Gossamer("fw"),
        Who::Gossamer("log"),
        Who::Gossamer("tb"),
    ];
    for d in Design::ALL {
        hcols.push(redis(d, Via::Loopback));
        hcols.push(redis(d, Via::Hop));
    }
    let stamp = machine::wall_us();
    for who in hcols {
        let key = Key::new(format!("hammer-{stamp}-{}", who.short().replace(' ', "")));
        let h = rt.block_on(load::hammer(&target_of(who), 64, key, s.hammer_secs))?;
        eprintln!(
            "hammer {:<50} admitted {} of {} ({:?})",
            who.label(),
            h.admitted,
            h.attempts,
            h.per_window
        );
        hammer.push((who, h));
    }
    load_during.push(machine::load_average()[0]);
    drop(gossamer);
    drop(hop_proxy);
    drop(zero_proxy);
    drop(redis_srv);

    // --- embedded -----------------------------------------------------------------------
    eprintln!("embedded: gossamer Engine::check vs governor");
    let embedded = embedded::decisions(s.embedded_keys, s.embedded, s.reps);
    let bytes_per_key = [Side::Gossamer, Side::Governor]
        .into_iter()
        .map(|side| embedded::bytes_per_key(side, s.embedded_keys).map(|b| (side, b)))
        .collect::<Result<Vec<_>, _>>()?;
    load_during.push(machine::load_average()[0]);

    // --- cluster cost -------------------------------------------------------------------
    let cluster = if s.skip_cluster {
        Err("skipped (--skip-cluster)".to_string())
    } else if let Some(why) = cluster::unavailable() {
        Err(format!("not run: {why}"))
    } else {
        eprintln!("cluster cost: 3 nodes in network namespaces");
        let lab = cluster::Lab::new()?;
        let mut costs = Vec::new();
        let mut failed = None;
        for &n in &s.cluster_keys {
            for clustered in [true, false] {
                match rt.block_on(cluster::run(&bin, &work, n, clustered, s.cluster_secs)) {
                    Ok(c) => {
                        eprintln!("{c:?}");
                        costs.push(c);
                    }
                    Err(e) => {
                        eprintln!("cluster run failed: {e}");
                        failed = Some(format!("{n} keys, clustered {clustered}: {e}"));
                    }
                }
                load_during.push(machine::load_average()[0]);
            }
        }
        drop(lab);
        match failed {
            Some(e) if costs.is_empty() => Err(e),
            _ => Ok(costs),
        }
    };

    let results = Results {
        machine_before,
        load_during,
        started,
        commit: machine::commit(&s.root),
        hop,
        points,
        hammer,
        embedded,
        bytes_per_key,
        cluster,
        redis_version,
        elapsed: began.elapsed(),
    };
    write(s, &results)?;
    let _ = std::fs::remove_dir_all(&work);
    Ok(())
}

// -------------------------------------------------------------------------------------------
// The report

/// Medians over repetitions of one matrix cell.
struct Cell {
    rate: f64,
    p50: f64,
    p99: f64,
    p999: f64,
    cpu: f64,
    server_cpu: f64,
    client_cpu: f64,
    admitted: f64,
    errors: u64,
}

fn cell(points: &[Point]) -> Cell {
    let m = |f: &dyn Fn(&Point) -> f64| median(&points.iter().map(f).collect::<Vec<_>>());
    Cell {
        rate: m(&|p| p.rate()),
        p50: m(&|p| p.quantile_us(0.5)),
        p99: m(&|p| p.quantile_us(0.99)),
        p999: m(&|p| p.quantile_us(0.999)),
        cpu: m(&|p| p.cpu_per_100k()),
        server_cpu: m(&|p| p.server_cpu_per_100k()),
        client_cpu: m(&|p| p.client_cpu_per_100k()),
        admitted: m(&|p| p.admitted as f64 / p.checks.max(1) as f64 * 100.0),
        errors: points.iter().map(|p| p.errors).sum(),
    }
}

/// Per-repetition ratio of `f(a) / f(b)`, and their median.
fn rep_ratios(
    r: &Results,
    a: (Who, usize),
    b: (Who, usize),
    f: impl Fn(&Point) -> f64,
) -> (Vec<f64>, f64) {
    let (Some(pa), Some(pb)) = (r.points.get(&a), r.points.get(&b)) else {
        return (vec![], f64::NAN);
    };
    let v: Vec<f64> = pa.iter().zip(pb).map(|(x, y)| f(x) / f(y)).collect();
    let m = median(&v);
    (v, m)
}

fn list(v: &[f64]) -> String {
    v.iter().map(|x| ratio(*x)).collect::<Vec<_>>().join(", ")
}

/// One target's line: description, per-run ratios, median, threshold, met.
struct TargetLine {
    what: String,
    runs: Vec<f64>,
    median: f64,
    bound: f64,
}

impl TargetLine {
    fn met(&self) -> bool {
        self.median <= self.bound
    }
}

fn targets(r: &Results) -> Vec<TargetLine> {
    let c = 16;
    let mut out = Vec::new();
    let p99 = |p: &Point| p.quantile_us(0.99);
    let (runs, m) = rep_ratios(
        r,
        (Who::Gossamer("log"), c),
        (redis(Design::SlidingLog, Via::Hop), c),
        p99,
    );
    out.push(TargetLine {
        what:
            "p99 at concurrency 16: gossamer sliding log / Redis sliding log with the 0.25 ms hop"
                .into(),
        runs,
        median: m,
        bound: 1.0 / 3.0,
    });
    for d in [Design::FixedIncrExpire, Design::FixedGetIncr] {
        let (runs, m) = rep_ratios(
            r,
            (Who::Gossamer("fw"), c),
            (redis(d, Via::Loopback), c),
            p99,
        );
        out.push(TargetLine {
            what: format!(
                "p99 at concurrency 16: gossamer fixed window / {} on loopback",
                d.name()
            ),
            runs,
            median: m,
            bound: 1.0,
        });
    }
    for (via, where_) in [
        (Via::Loopback, "on loopback (Redis's best case)"),
        (Via::Hop, "with the 0.25 ms hop (as deployed)"),
    ] {
        for d in Design::ALL {
            let g = Who::Gossamer(d.gossamer_rule());
            let (runs, m) = rep_ratios(r, (g, c), (redis(d, via), c), |p| p.cpu_per_100k());
            out.push(TargetLine {
                what: format!(
                    "CPU per check (server + client) at concurrency 16: gossamer {} / {} {where_}",
                    gossamer_rule_name(d.gossamer_rule()),
                    d.name()
                ),
                runs,
                median: m,
                bound: 1.0,
            });
        }
    }
    for (keys, threads) in [("hot", 1), ("hot", 2), ("many", 1), ("many", 2)] {
        let find = |side| {
            r.embedded.iter().find(|f| {
                f.side == side && f.clock == "real" && f.keys == keys && f.threads == threads
            })
        };
        if let (Some(g), Some(v)) = (find(Side::Gossamer), find(Side::Governor)) {
            let runs: Vec<f64> = g
                .per_sec
                .iter()
                .zip(&v.per_sec)
                .map(|(a, b)| b / a)
                .collect();
            out.push(TargetLine {
                what: format!(
                    "embedded time per decision, gossamer / governor, {}, {threads} thread{}",
                    if keys == "hot" {
                        "one hot key"
                    } else {
                        "many keys"
                    },
                    if threads == 1 { "" } else { "s" }
                ),
                median: median(&runs),
                runs,
                bound: 1.5,
            });
        }
    }
    out
}

fn cdf_points(h: &Histogram<u64>) -> Vec<(f64, f64)> {
    let mut pts = Vec::new();
    let total = h.len() as f64;
    if total == 0.0 {
        return pts;
    }
    let mut acc = 0u64;
    for v in h.iter_log(1_000, 1.1) {
        acc += v.count_since_last_iteration();
        pts.push((v.value_iterated_to() as f64 / 1e3, acc as f64 / total));
    }
    pts
}

fn merged(points: &[Point]) -> Histogram<u64> {
    let mut h = points[0].hist.clone();
    for p in &points[1..] {
        let _ = h.add(&p.hist);
    }
    h
}

fn write(s: &Settings, r: &Results) -> Result<(), String> {
    let docs = s.root.join("docs");
    let plots = docs.join("bench");
    std::fs::create_dir_all(&plots).map_err(|e| e.to_string())?;
    let mut svgs: Vec<(PathBuf, String)> = Vec::new();

    // CDFs per concurrency.
    let cols = matrix();
    for &conc in &s.concurrency {
        let series: Vec<svg::Series> = cols
            .iter()
            .filter(|w| !matches!(w, Who::Redis(_, Via::Proxy0)))
            .enumerate()
            .filter_map(|(i, w)| {
                let pts = r.points.get(&(*w, conc))?;
                Some(svg::Series {
                    label: w.short(),
                    color: svg::COLORS[match w {
                        Who::Gossamer(_) => i,
                        Who::Redis(d, _) => 3 + *d as usize,
                    } % svg::COLORS.len()],
                    dashed: matches!(w, Who::Redis(_, Via::Hop)),
                    points: cdf_points(&merged(pts)),
                })
            })
            .collect();
        svgs.push((
            plots.join(format!("latency-cdf-c{conc}.svg")),
            svg::cdf(
                &format!(
                    "Check latency, concurrency {conc} (all {} runs merged; dashed: Redis via the 0.25 ms hop)",
                    s.reps
                ),
                &series,
            ),
        ));
    }
    // Throughput and CPU bars.
    let groups: Vec<String> = s
        .concurrency
        .iter()
        .map(|c| format!("concurrency {c}"))
        .collect();
    let bar_cols: Vec<Who> = cols
        .iter()
        .copied()
        .filter(|w| !matches!(w, Who::Redis(_, Via::Proxy0)))
        .collect();
    let series = |f: &dyn Fn(&Cell) -> f64| -> Vec<(String, &'static str, Vec<f64>)> {
        bar_cols
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let vals = s
                    .concurrency
                    .iter()
                    .map(|c| r.points.get(&(*w, *c)).map_or(f64::NAN, |p| f(&cell(p))))
                    .collect();
                (w.short(), svg::COLORS[i % svg::COLORS.len()], vals)
            })
            .collect()
    };
    svgs.push((
        plots.join("throughput.svg"),
        svg::bars(
            "Checks per second (median of runs)",
            "checks/s",
            &groups,
            &series(&|c| c.rate),
        ),
    ));
    svgs.push((
        plots.join("cpu.svg"),
        svg::bars(
            "CPU seconds per 100,000 checks, server + client (median)",
            "CPU s / 100k checks",
            &groups,
            &series(&|c| c.cpu),
        ),
    ));
    let emb_groups: Vec<String> = ["hot", "many"]
        .iter()
        .flat_map(|k| {
            [1, 2].map(|t| format!("{k} key{}, {t} thr", if *k == "hot" { "" } else { "s" }))
        })
        .collect();
    let emb_series: Vec<(String, &'static str, Vec<f64>)> = [Side::Gossamer, Side::Governor]
        .iter()
        .enumerate()
        .map(|(i, side)| {
            let vals = ["hot", "many"]
                .iter()
                .flat_map(|k| [1, 2].map(|t| (*k, t)))
                .map(|(k, t)| {
                    r.embedded
                        .iter()
                        .find(|f| {
                            f.side == *side && f.clock == "real" && f.keys == k && f.threads == t
                        })
                        .map_or(f64::NAN, |f| f.median() / 1e6)
                })
                .collect();
            let name = if *side == Side::Gossamer {
                "gossamer Engine::check"
            } else {
                "governor keyed"
            };
            (name.to_string(), svg::COLORS[i], vals)
        })
        .collect();
    svgs.push((
        plots.join("embedded.svg"),
        svg::bars(
            "Embedded decisions per second (millions, real clocks, median)",
            "million decisions/s",
            &emb_groups,
            &emb_series,
        ),
    ));
    for (path, body) in &svgs {
        std::fs::write(path, body).map_err(|e| format!("{}: {e}", path.display()))?;
    }

    let md = markdown(s, r);
    let path = docs.join("benchmarks.md");
    std::fs::write(&path, md).map_err(|e| format!("{}: {e}", path.display()))?;
    eprintln!("wrote {} and {} plots", path.display(), svgs.len());
    Ok(())
}

fn markdown(s: &Settings, r: &Results) -> String {
    let mut o = String::new();
    let m = &r.machine_before;
    let loads: Vec<f64> = r.load_during.clone();
    let _ = writeln!(o, "# gossamer against central Redis and governor\n");
    let _ = writeln!(
        o,
        "*Generated by `bash bench/run.sh`{} — do not edit by hand; rerun it.*\n",
        if s.quick {
            " --quick (a smoke test: short runs, one repetition — not figures to quote)"
        } else {
            ""
        }
    );
    let _ = writeln!(
        o,
        "Run on {} (commit `{}`), in {:.0} s. Machine: {}, {} CPUs (`nproc`), Linux {}. \
         Load average (1 min) when the run began: {:.2} (5 min: {:.2}); sampled during the run: {} \
         (min {:.2}, max {:.2}). {}. The load generator, the servers and the proxy share \
         these {} CPUs, and other builds may have run beside them: absolute figures drift from run \
         to run, so the comparisons below are ratios of runs made side by side, each the median \
         of {} repetition{}.\n",
        r.started,
        r.commit,
        r.elapsed.as_secs_f64(),
        m.cpu,
        m.cores,
        m.kernel,
        m.load[0],
        m.load[1],
        loads
            .iter()
            .map(|l| format!("{l:.2}"))
            .collect::<Vec<_>>()
            .join(", "),
        loads.iter().copied().fold(f64::MAX, f64::min),
        loads.iter().copied().fold(f64::MIN, f64::max),
        r.redis_version,
        m.cores,
        s.reps,
        if s.reps == 1 { "" } else { "s" }
    );

    // Headline.
    let t = targets(r);
    let _ = writeln!(o, "## Targets\n");
    let _ = writeln!(
        o,
        "Each ratio is gossamer / the alternative, from runs made side by side; lower is \
         better for gossamer. Per-repetition ratios, then their median.\n"
    );
    let _ = writeln!(
        o,
        "| target | per run | median | bound | |\n|---|---|---:|---:|---|"
    );
    for l in &t {
        let _ = writeln!(
            o,
            "| {} | {} | **{}** | ≤ {} | {} |",
            l.what,
            list(&l.runs),
            ratio(l.median),
            ratio(l.bound),
            if !l.median.is_finite() {
                "not measured"
            } else if l.met() {
                "met"
            } else {
                "**missed**"
            }
        );
    }
    let _ = writeln!(o);
    let missed: Vec<&TargetLine> = t
        .iter()
        .filter(|l| l.median.is_finite() && !l.met())
        .collect();
    if missed.is_empty() {
        let _ = writeln!(o, "Every target was met in this run.\n");
    } else {
        let _ = writeln!(
            o,
            "{} of {} targets missed in this run; see [Why](#why) for what the profile shows.\n",
            missed.len(),
            t.len()
        );
    }

    // Method.
    let _ = writeln!(o, "## How it is measured\n");
    let zipf = Zipf::new(KEYS, ZIPF_S);
    let _ = writeln!(
        o,
        "- **Rule**: {LIMIT} checks per second per key, {KEYS} keys drawn from a Zipf \
         distribution (s = {ZIPF_S}; the most frequent key gets {:.1}% of the checks, so hot keys \
         are denied and cold ones admitted — the same keys and draws for every target).\n\
         - **gossamer**: a release build of this commit serving `POST /v1/check` on loopback \
         (one node, default settings: a 2-thread tokio runtime) with three rules of that limit: \
         `fw` fixed window, `log` sliding window log, `tb` token bucket (burst {LIMIT}). \
         The client is hyper's HTTP/1.1 client, one keep-alive connection per worker.\n\
         - **Redis**: {} on loopback (`--save \"\" --appendonly no`, single-threaded as \
         shipped), driven by the `redis` crate (tokio, one multiplexed connection per worker, \
         i.e. one TCP connection each) running each design as applications write it: \
         see `bench/src/targets.rs`. Windows and the log are keyed by the client's clock, as \
         usual.\n\
         - **The hop**: Redis one network hop away (0.25 ms each way, as within one availability \
         zone) while gossamer stays on loopback (node-local, as deployed). This kernel has no \
         `netem`, so the hop is a **user-space delaying TCP proxy** in this bench \
         (`bench/src/proxy.rs`): each chunk is stamped on arrival and forwarded at arrival + \
         0.25 ms by a writer thread per direction, keeping order without serialising the \
         delays. Its own cost is measured below (the proxy with 0 delay).\n\
         - **Load**: closed loop — `c` workers, each sending its next check when the previous \
         one is answered — for {:.1} s after {:.1} s of warm-up, per point; the columns run in \
         a rotating order, and the whole matrix is repeated {} time{}. The load generator is \
         a 2-thread tokio runtime in this process.\n\
         - **CPU per check**: user + system time from `/proc/<pid>/stat` of the server process \
         (gossamer or redis-server) and of the load generator (`/proc/self`) over the \
         measured interval, divided by checks answered, in CPU seconds per 100,000 checks. \
         The proxy's own CPU is left out (it stands for the network). Clock ticks are 10 ms, \
         so a short point's CPU figure is coarse.\n",
        zipf.top_share() * 100.0,
        r.redis_version
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
        s.duration.as_secs_f64(),
        s.warmup.as_secs_f64(),
        s.reps,
        if s.reps == 1 { "" } else { "s" }
    );

    // The hop.
    let _ = writeln!(o, "## The hop\n");
    let _ = writeln!(
        o,
        "Redis `PING` at concurrency 1 (round trip alone), {:.1} s each:\n",
        s.duration.as_secs_f64()
    );
    let _ = writeln!(
        o,
        "| path | p50 µs | p99 µs | p99.9 µs | added p50 vs direct |\n|---|---:|---:|---:|---:|"
    );
    let direct = r.hop.first().map_or(f64::NAN, |(_, p)| p.quantile_us(0.5));
    for (name, p) in &r.hop {
        let _ = writeln!(
            o,
            "| {name} | {} | {} | {} | {} |",
            num(p.quantile_us(0.5)),
            num(p.quantile_us(0.99)),
            num(p.quantile_us(0.999)),
            num(p.quantile_us(0.5) - direct)
        );
    }
    let _ = writeln!(
        o,
        "\nThe nominal hop adds 500 µs per round trip; what the proxy adds beyond that is its \
         wake-up latency (thread scheduling on a shared 2-core VM), and it counts against Redis \
         in the hop rows. The row `Redis fixed window, INCR+EXPIRE — proxy, 0 delay` in the \
         tables below is the same design through the proxy with no delay.\n"
    );

    // Matrix.
    let _ = writeln!(o, "## Checks: throughput, latency, CPU\n");
    let _ = writeln!(
        o,
        "Medians over the repetitions (latency quantiles are per run, then the median). \
         CPU is CPU seconds per 100,000 checks. *admitted* is the share of checks admitted \
         (hot keys are over their limit).\n\n\
         ![throughput](bench/throughput.svg)\n\n![cpu](bench/cpu.svg)\n"
    );
    for &conc in &s.concurrency {
        let _ = writeln!(o, "### Concurrency {conc}\n");
        let _ = writeln!(
            o,
            "![latency CDF, concurrency {conc}](bench/latency-cdf-c{conc}.svg)\n"
        );
        let _ = writeln!(
            o,
            "| target | checks/s | p50 µs | p99 µs | p99.9 µs | CPU total | server | client | admitted | errors |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        for who in matrix() {
            if let Some(pts) = r.points.get(&(who, conc)) {
                let c = cell(pts);
                let _ = writeln!(
                    o,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {:.0}% | {} |",
                    who.label(),
                    num(c.rate),
                    num(c.p50),
                    num(c.p99),
                    num(c.p999),
                    num(c.cpu),
                    num(c.server_cpu),
                    num(c.client_cpu),
                    c.admitted,
                    c.errors
                );
            }
        }
        let _ = writeln!(o);
    }

    // Correctness.
    let _ = writeln!(o, "## Correctness under concurrency\n");
    let secs = s.hammer_secs;
    let _ = writeln!(
        o,
        "64 concurrent clients check one fresh key as fast as they can for {secs} whole seconds \
         (from 20 ms after a second boundary to 20 ms before the last one, by the client's \
         clock). The most any exact limiter of the rule may admit: {} for a 1 s window \
         ({LIMIT} × {secs} windows) and for the sliding log (at most {LIMIT} in any 1 s), {} for \
         the token bucket (burst {LIMIT} + {LIMIT}/s × {:.2} s). *per window* counts a Redis design's \
         admissions by the 1 s window of the client's clock, which keys its windows; gossamer \
         decides by its own clock, and a check sent just before a window edge may be decided \
         just after it, so its admissions are not binned by the client's clock (its total over \
         whole windows is exact: the margins exceed its latency).\n",
        LIMIT * secs,
        LIMIT + (LIMIT as f64 * (secs as f64 - 0.04)) as u64,
        secs as f64 - 0.04
    );
    let _ = writeln!(
        o,
        "| target | attempts | admitted | allowed at most | over | per window | errors |\n|---|---:|---:|---:|---:|---|---:|"
    );
    for (who, h) in &r.hammer {
        let bucket = matches!(who, Who::Gossamer("tb")) || who.design() == Some(Design::LuaBucket);
        let max = if bucket {
            LIMIT + (LIMIT as f64 * (secs as f64 - 0.04)) as u64
        } else {
            LIMIT * secs
        };
        let over = h.admitted as i64 - max as i64;
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} | {} |",
            who.label(),
            num(h.attempts as f64),
            num(h.admitted as f64),
            num(max as f64),
            if over > 0 {
                format!("**+{over} ({:+.0}%)**", over as f64 / max as f64 * 100.0)
            } else {
                over.to_string()
            },
            if matches!(who, Who::Gossamer(_)) {
                "– (decided by the server's clock)".to_string()
            } else {
                h.per_window
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(" / ")
            },
            h.errors
        );
    }
    let _ = writeln!(
        o,
        "\nA negative *over* is under-admission. The Redis sliding log adds every attempt to \
         the log, admitted or not (the usual `MULTI` recipe cannot make the `ZADD` conditional), \
         so under sustained contention the log stays full and a hot key is shut out for as long \
         as the contention lasts.\n"
    );

    // Embedded.
    let _ = writeln!(o, "## Embedded: gossamer's engine against governor\n");
    let _ = writeln!(
        o,
        "In-process decisions, no network: gossamer's `Engine::check` (the path every HTTP \
         check takes after parsing) against `governor`'s keyed GCRA (`RateLimiter::keyed`, \
         DashMap store), rule {LIMIT}/s burst {LIMIT} on both. \"hot\": one key (after the first \
         {LIMIT}, nearly every decision is a denial); \"many\": {} pre-populated 12-byte keys \
         cycled in order (admissions). 2 threads walk the keys half the set apart; figures are \
         aggregate decisions per second, median of {} runs of {:.1} s. \"real\": each library's \
         default clock (gossamer `SystemClock` = `clock_gettime(CLOCK_REALTIME)`; governor \
         `QuantaClock`, the TSC); \"fake\": a clock that does not move (`ManualClock`, \
         `FakeRelativeClock`).\n\n![embedded](bench/embedded.svg)\n",
        num(s.embedded_keys as f64),
        s.reps,
        s.embedded.as_secs_f64()
    );
    let _ = writeln!(
        o,
        "| keys | threads | clock | gossamer decisions/s | ns each | governor decisions/s | ns each | time gossamer / governor |\n|---|---:|---|---:|---:|---:|---:|---:|"
    );
    for clock in ["real", "fake"] {
        for keys in ["hot", "many"] {
            for threads in [1, 2] {
                let f = |side| {
                    r.embedded.iter().find(|f| {
                        f.side == side && f.clock == clock && f.keys == keys && f.threads == threads
                    })
                };
                if let (Some(g), Some(v)) = (f(Side::Gossamer), f(Side::Governor)) {
                    let _ = writeln!(
                        o,
                        "| {} | {threads} | {clock} | {} | {} | {} | {} | {} |",
                        if keys == "hot" {
                            "1 (hot)".to_string()
                        } else {
                            num(s.embedded_keys as f64)
                        },
                        num(g.median()),
                        num(g.ns_per_decision()),
                        num(v.median()),
                        num(v.ns_per_decision()),
                        ratio(v.median() / g.median())
                    );
                }
            }
        }
    }
    let _ = writeln!(
        o,
        "\nMemory, {} keys each, resident set growth of a fresh process (includes the \
         allocator's rounding and tables' spare capacity):\n\n| limiter | bytes per key |\n|---|---:|",
        num(s.embedded_keys as f64)
    );
    for (side, b) in &r.bytes_per_key {
        let _ = writeln!(
            o,
            "| {} | {} |",
            if *side == Side::Gossamer {
                "gossamer `Engine` (token bucket)"
            } else {
                "governor keyed (DashMap)"
            },
            num(*b)
        );
    }
    let _ = writeln!(
        o,
        "\ngovernor knows nothing of other replicas: with N app instances each admits the full \
         rate, i.e. N × the limit in all. gossamer's figure is the same engine a node runs, \
         with or without a cluster.\n"
    );

    // Cluster.
    let _ = writeln!(o, "## Cluster cost\n");
    match &r.cluster {
        Err(why) => {
            let _ = writeln!(o, "Not measured in this run: {why}.\n");
        }
        Ok(costs) => {
            let _ = writeln!(
                o,
                "3 release nodes, each in its own network namespace (veths on a bridge; the \
                 HTTP checks come in over a second bridge, so the data links carry only gossip \
                 and QUIC). Rule `fw`, a global fixed window of 1,000 per day, so every key \
                 checked holds state for the run. Each run starts the nodes, checks every key \
                 once (pre-fill), waits 1 s, then offers {} checks/s across the cluster for {} s, \
                 a third to each node, each node walking all keys from its own offset. The \
                 same load runs against the same 3 nodes started without `--gossip` (standalone: \
                 each counts alone); the difference is what the cluster adds. *CPU* is the three \
                 nodes' user + system time per second (cores); *bytes* are what each node sent \
                 on its data link (mean of the three, from the veth counters: UDP gossip and \
                 QUIC with headers).\n",
                num(cluster::RATE),
                s.cluster_secs
            );
            let _ = writeln!(
                o,
                "| active keys | mode | checks/s | errors | CPU (cores, 3 nodes) | extra CPU vs standalone | extra CPU per node | bytes/s sent per node | packets/s per node | degraded rounds/s | pre-fill s |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
            );
            for c in costs {
                let base = costs
                    .iter()
                    .find(|b| b.keys == c.keys && !b.clustered)
                    .map(|b| b.cores);
                let extra = if c.clustered {
                    base.map(|b| c.cores - b)
                } else {
                    None
                };
                let _ = writeln!(
                    o,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    num(c.keys as f64),
                    if c.clustered {
                        "clustered"
                    } else {
                        "standalone"
                    },
                    num(c.rate),
                    c.errors,
                    num(c.cores),
                    extra.map_or("–".into(), |e| format!("{e:+.3}")),
                    extra.map_or("–".into(), |e| format!("{:+.3}", e / 3.0)),
                    num(c.bytes_per_node),
                    num(c.packets_per_node),
                    if c.clustered {
                        num(c.degraded_per_s)
                    } else {
                        "–".into()
                    },
                    num(c.prefill_secs)
                );
            }
            let _ = writeln!(
                o,
                "\nA round (100 ms) sends each peer the keys that changed in the last 3 rounds \
                 and every key each 50th round, so the bytes grow with the keys checked per \
                 round and, every 5 s, with all active keys. If a run is listed with fewer \
                 checks/s than offered, the nodes (or the load generator) could not keep up on \
                 this machine.\n"
            );
        }
    }

    // Why.
    let _ = writeln!(o, "## Why\n");
    let analysis = s.root.join("bench/analysis.md");
    match std::fs::read_to_string(&analysis) {
        Ok(text) => {
            let _ = writeln!(
                o,
                "*Written by hand from profiles (see the notes for how they were taken); \
                 included verbatim from `bench/analysis.md`, not regenerated by the run — \
                 check it against the figures above.*\n\n{}",
                text.trim()
            );
        }
        Err(_) => {
            let _ = writeln!(o, "(no `bench/analysis.md`)");
        }
    }
    let _ = writeln!(
        o,
        "\n## Reproduce\n\n```sh\nbash bench/run.sh            # ~15 min: installs redis-server if missing, builds, runs, writes this page\nbash bench/run.sh --quick    # ~3 min smoke test\n```\n\nFlags (after `run.sh`): `--duration-ms`, `--reps`, `--hammer-secs`, `--cluster-keys 1000,10000,100000`, `--cluster-secs`, `--skip-cluster`, `--max-load` (wait for the 1-minute load average to fall below it; 0: do not wait), `--load-wait-secs`."
    );
    o
}
