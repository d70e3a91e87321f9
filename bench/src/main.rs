//! `gossamer-bench`: gossamer against the central-Redis limiters users run today and against
//! the in-process `governor` crate, every figure from one run on one machine.
//!
//! `bash bench/run.sh` is the one command: it installs `redis-server` if missing, builds
//! gossamer and this crate in release, and runs `gossamer-bench run`, which writes
//! `docs/benchmarks.md` and the SVG plots under `docs/bench/`.
//!
//! # Layout
//! - [`machine`]: CPU model, cores, kernel, load; CPU time of a process from `/proc`.
//! - [`procs`]: child processes (redis-server, gossamer, the proxies) killed on drop.
//! - [`proxy`]: the delaying TCP proxy that stands in for one network hop.
//! - [`targets`]: one connection to a limiter: gossamer's HTTP check or a Redis design.
//! - [`load`]: closed-loop load at a given concurrency: throughput, latency, CPU.
//! - [`embedded`]: gossamer's `Engine::check` against governor's keyed GCRA, in process.
//! - [`cluster`]: 3 nodes in network namespaces: the CPU and bytes that clustering adds.
//! - [`report`], [`svg`]: the Markdown report and its plots.
//!
//! Subcommands: `run [--quick] [flags]` (everything), `proxy LISTEN UPSTREAM DELAY_US` (used
//! by `run`), `mem gossamer|governor KEYS` (used by `run`: bytes per key in a fresh process),
//! `cleanup` (removes leftover network namespaces of an interrupted run).

mod cluster;
mod embedded;
mod load;
mod machine;
mod procs;
mod proxy;
mod report;
mod svg;
mod targets;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// What `run` measures and for how long.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Measured time per load point.
    pub duration: Duration,
    /// Unmeasured time before each load point (connections open, keys warm).
    pub warmup: Duration,
    /// Repetitions of the load matrix; the report gives medians.
    pub reps: usize,
    /// Concurrencies of the load matrix.
    pub concurrency: Vec<usize>,
    /// How long the correctness hammer runs (whole seconds: it covers whole windows).
    pub hammer_secs: u64,
    /// Measured time per embedded decision figure.
    pub embedded: Duration,
    /// Keys of the embedded "many keys" case.
    pub embedded_keys: usize,
    /// Active global keys of the cluster-cost runs.
    pub cluster_keys: Vec<usize>,
    /// Measured time per cluster-cost run.
    pub cluster_secs: u64,
    /// Skip the cluster runs (no root, or not wanted).
    pub skip_cluster: bool,
    /// The repository root (docs/ is written there; the gossamer binary is found there).
    pub root: PathBuf,
    /// Wait for the load average to fall below this before measuring (0: do not wait).
    pub max_load: f64,
    /// The longest to wait for it.
    pub load_wait: Duration,
    /// Set by `--quick`: said in the report.
    pub quick: bool,
}

impl Settings {
    fn full(root: PathBuf) -> Settings {
        Settings {
            duration: Duration::from_secs(3),
            warmup: Duration::from_millis(500),
            reps: 3,
            concurrency: vec![1, 16, 64],
            hammer_secs: 5,
            embedded: Duration::from_millis(1000),
            embedded_keys: 1_000_000,
            cluster_keys: vec![1_000, 10_000, 100_000],
            cluster_secs: 10,
            skip_cluster: false,
            root,
            max_load: 1.5,
            load_wait: Duration::from_secs(600),
            quick: false,
        }
    }

    fn quick(root: PathBuf) -> Settings {
        Settings {
            duration: Duration::from_millis(700),
            warmup: Duration::from_millis(200),
            reps: 1,
            concurrency: vec![1, 16, 64],
            hammer_secs: 2,
            embedded: Duration::from_millis(200),
            embedded_keys: 100_000,
            cluster_keys: vec![1_000, 10_000],
            cluster_secs: 3,
            max_load: 0.0,
            quick: true,
            ..Settings::full(root)
        }
    }
}

const USAGE: &str = "usage: gossamer-bench run [--quick] [--duration-ms N] [--reps N] \
[--hammer-secs N] [--cluster-keys 1000,10000] [--cluster-secs N] [--skip-cluster] \
[--max-load X] [--load-wait-secs N] [--root DIR]
       gossamer-bench proxy LISTEN UPSTREAM DELAY_US
       gossamer-bench mem gossamer|governor KEYS
       gossamer-bench spin gossamer|governor hot|many SECS
       gossamer-bench cleanup";

fn parse_run(args: &[String]) -> Result<Settings, String> {
    let root = std::env::current_dir().map_err(|e| e.to_string())?;
    let mut s = if args.iter().any(|a| a == "--quick") {
        Settings::quick(root)
    } else {
        Settings::full(root)
    };
    let mut it = args.iter();
    let num = |v: Option<&String>, name: &str| -> Result<u64, String> {
        v.ok_or(format!("{name} needs a value"))?
            .parse()
            .map_err(|e| format!("{name}: {e}"))
    };
    while let Some(a) = it.next() {
        match a.as_str() {
            "--quick" => {}
            "--duration-ms" => s.duration = Duration::from_millis(num(it.next(), a)?),
            "--reps" => s.reps = num(it.next(), a)?.max(1) as usize,
            "--hammer-secs" => s.hammer_secs = num(it.next(), a)?.max(1),
            "--cluster-secs" => s.cluster_secs = num(it.next(), a)?.max(1),
            "--skip-cluster" => s.skip_cluster = true,
            "--load-wait-secs" => s.load_wait = Duration::from_secs(num(it.next(), a)?),
            "--max-load" => {
                s.max_load = it
                    .next()
                    .ok_or("--max-load needs a value")?
                    .parse()
                    .map_err(|e| format!("--max-load: {e}"))?
            }
            "--cluster-keys" => {
                s.cluster_keys = it
                    .next()
                    .ok_or("--cluster-keys needs a value")?
                    .split(',')
                    .map(|k| k.parse().map_err(|e| format!("--cluster-keys: {e}")))
                    .collect::<Result<_, _>>()?
            }
            "--root" => s.root = PathBuf::from(it.next().ok_or("--root needs a value")?),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(s)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("run") => parse_run(&args[1..]).and_then(|s| report::run(&s)),
        Some("proxy") if args.len() == 4 => args[3]
            .parse()
            .map_err(|e| format!("DELAY_US: {e}"))
            .and_then(|d| proxy::serve(&args[1], &args[2], Duration::from_micros(d))),
        Some("mem") if args.len() == 3 => args[2]
            .parse()
            .map_err(|e| format!("KEYS: {e}"))
            .and_then(|n| embedded::bytes_per_key_child(&args[1], n)),
        Some("spin") if args.len() == 4 => args[3]
            .parse()
            .map_err(|e| format!("SECS: {e}"))
            .and_then(|secs| embedded::spin(&args[1], &args[2], secs)),
        Some("cleanup") => {
            cluster::cleanup();
            Ok(())
        }
        _ => Err(USAGE.to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gossamer-bench: {e}");
            ExitCode::from(2)
        }
    }
}
