//! The `gossamer` command: flags, tracing, exit codes. Everything else is in the library.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use gossamer::clock::SystemClock;
use gossamer::config::{Config, Overrides};
use gossamer::server::{ConfigSource, Node};

/// Exit code for a denied check.
const EXIT_DENIED: u8 = 1;
/// Exit code for bad usage, a bad config, or a failed request.
const EXIT_ERROR: u8 = 2;
/// `gossamer check`'s timeouts: longer than an app's (gossamer_client's defaults), since the
/// node asked from a terminal may be across a network.
const CHECK_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const CHECK_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Parser)]
#[command(name = "gossamer", version, about = "A cluster-native rate limiter")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a node.
    Serve(ServeArgs),
    /// Ask a node whether a key may spend a cost (exit 0 admitted, 1 denied, 2 error).
    Check(CheckArgs),
    /// Work with config files.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Write a cluster CA and a certificate per node for mutual TLS ([cluster.tls]).
    Certs(CertsArgs),
    /// Run the cluster simulation: replay a seed, explore many, or write the chaos report.
    Sim(SimArgs),
    /// Run a 3-node cluster on loopback under a skewed load and show the global limit hold.
    Demo(DemoArgs),
}

#[derive(Debug, clap::Args)]
struct SimArgs {
    /// Replay this seed: print its fault schedule, windows and any invariant it broke.
    #[arg(long, conflicts_with = "seeds")]
    seed: Option<u64>,
    /// Run every seed in FROM..TO and print the ones that break an invariant.
    #[arg(long, value_parser = seed_range)]
    seeds: Option<std::ops::Range<u64>>,
    /// Partition mode of the simulated cluster.
    #[arg(long, value_enum, default_value_t = PartitionMode::Hold)]
    on_partition: PartitionMode,
    /// Write the chaos report (scenarios, seeds, scaling) as FILE and its plots beside it.
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
    /// With --report: also measure 1,000 nodes and 100,000 keys (about half an hour more).
    #[arg(long, requires = "report")]
    large: bool,
    /// Measure one scaling point, NODES,KEYS (as in the report's table), and print its row.
    #[arg(long, value_name = "NODES,KEYS", value_parser = scale_point, conflicts_with_all = ["seed", "seeds", "report"])]
    scale: Option<(usize, usize)>,
    /// Run the aggregation tree (design §11.1) instead of the full mesh: with --scale, --seed
    /// or --seeds (fixed windows; `split` across partitions). The report has both.
    #[arg(long, conflicts_with_all = ["report", "on_partition"])]
    tree: bool,
    /// With --seed or --seeds (mesh): each run also changes the fixed window's limit node by
    /// node, cut to half or raised to twice and back, reaching each node within 1.5 s of the
    /// first (design §3.8); a window is judged against the largest limit in force from two
    /// windows before it.
    #[arg(long, conflicts_with_all = ["report", "tree", "scale"])]
    relimit: bool,
    /// With --seed or --seeds (mesh): one of each run's four rules (by the seed) is at no node
    /// at the start; it is added node by node, within 1.6 s of the first node, then removed
    /// from one node and added back a second later (design §3.8, "Adding and removing a
    /// global rule"). A node checks only the rules it has.
    #[arg(long, conflicts_with_all = ["report", "tree", "scale"])]
    add_rule: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum PartitionMode {
    Hold,
    Split,
}

fn scale_point(s: &str) -> Result<(usize, usize), String> {
    let bad = || format!("\"{s}\" is not NODES,KEYS (two whole numbers, NODES at least 2)");
    let (n, k) = s.split_once(',').ok_or_else(bad)?;
    let n: usize = n.trim().parse().map_err(|_| bad())?;
    let k: usize = k.trim().parse().map_err(|_| bad())?;
    if n < 2 {
        return Err(bad());
    }
    Ok((n, k))
}

fn seed_range(s: &str) -> Result<std::ops::Range<u64>, String> {
    let (a, b) = s
        .split_once("..")
        .ok_or_else(|| format!("\"{s}\" is not FROM..TO"))?;
    let parse = |x: &str| x.parse::<u64>().map_err(|e| format!("\"{x}\": {e}"));
    let (a, b) = (parse(a)?, parse(b)?);
    if a >= b {
        return Err(format!("\"{s}\" is empty"));
    }
    Ok(a..b)
}

#[derive(Debug, clap::Args)]
struct DemoArgs {
    /// How long to drive the load (whole seconds).
    #[arg(long, default_value = "8s", value_parser = demo_duration)]
    duration: std::time::Duration,
    /// The global limit, per second.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    limit: u64,
}

fn demo_duration(s: &str) -> Result<std::time::Duration, String> {
    let nanos = gossamer::config::parse_duration(s)?;
    if !(1..=3_600).contains(&(nanos / 1_000_000_000)) {
        return Err("must be 1s to 1h".into());
    }
    Ok(std::time::Duration::from_nanos(nanos))
}

#[derive(Debug, clap::Args)]
struct CertsArgs {
    /// The directory to write into (created if missing).
    #[arg(long)]
    out: PathBuf,
    /// A node id (a lower-case DNS name such as node-a); repeat, or separate with commas.
    #[arg(
        long = "node",
        visible_alias = "nodes",
        value_delimiter = ',',
        required = true
    )]
    nodes: Vec<String>,
    /// Overwrite files that already exist.
    #[arg(long)]
    force: bool,
}

#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// The config file (TOML). Without one, built-in example rules are served. Its rules are
    /// reloaded on SIGHUP and when the file changes.
    #[arg(long, env = "GOSSAMER_CONFIG")]
    config: Option<PathBuf>,
    /// Where the HTTP API listens [default: 127.0.0.1:7070].
    #[arg(long, env = "GOSSAMER_HTTP")]
    http: Option<SocketAddr>,
    /// This node's id [default: the host name].
    #[arg(long, env = "GOSSAMER_NODE_ID")]
    node_id: Option<String>,
    /// Gossip listen address (used once nodes form a cluster).
    #[arg(long, env = "GOSSAMER_GOSSIP")]
    gossip: Option<SocketAddr>,
    /// The gossip address other nodes use to reach this one (host:port).
    #[arg(long, env = "GOSSAMER_ADVERTISE", value_parser = host_port)]
    advertise: Option<String>,
    /// Seed nodes, comma-separated host:port.
    #[arg(long, env = "GOSSAMER_SEEDS", value_delimiter = ',', value_parser = host_port)]
    seeds: Option<Vec<String>>,
    /// Nodes of other clusters are ignored.
    #[arg(long, env = "GOSSAMER_CLUSTER_ID")]
    cluster_id: Option<String>,
    /// Serve Envoy's rate limit service (gRPC) on this address, e.g. 127.0.0.1:8081
    /// (`[server] grpc`; off unless set).
    #[arg(long, env = "GOSSAMER_GRPC")]
    grpc: Option<SocketAddr>,
    /// envoyproxy/ratelimit's YAML config: a file, or a directory of *.yaml files
    /// (`[rls] config`). Reloaded like --config.
    #[arg(long, env = "GOSSAMER_RLS_CONFIG")]
    rls_config: Option<PathBuf>,
    /// Log format.
    #[arg(long, env = "GOSSAMER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Debug, clap::Args)]
struct CheckArgs {
    /// The rule.
    #[arg(long)]
    rule: String,
    /// The key (user, tenant, API key...).
    #[arg(long)]
    key: String,
    /// The cost of this call.
    #[arg(long, default_value_t = 1)]
    cost: u64,
    /// The node to ask.
    #[arg(long, env = "GOSSAMER_URL", default_value = "http://127.0.0.1:7070")]
    url: String,
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Validate a config file and print its rules.
    Check {
        /// The file.
        file: PathBuf,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn host_port(s: &str) -> Result<String, String> {
    gossamer::config::host_port(s)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve(args),
        Command::Check(args) => check(args),
        Command::Config {
            command: ConfigCommand::Check { file },
        } => config_check(&file),
        Command::Certs(args) => certs(&args),
        Command::Sim(args) => sim(&args),
        Command::Demo(args) => demo(&args),
    }
}

fn sim(args: &SimArgs) -> ExitCode {
    use gossamer::cluster::global::OnPartition;
    use gossamer::cluster::sim;
    let mode = match args.on_partition {
        PartitionMode::Hold => OnPartition::Hold,
        PartitionMode::Split => OnPartition::Split,
    };
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    if let Some(path) = &args.report {
        return match sim::report::write(path, threads, args.large) {
            Ok(summary) => {
                println!("{summary}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: writing {}: {e}", path.display());
                ExitCode::from(EXIT_ERROR)
            }
        };
    }
    if let Some((nodes, keys)) = args.scale
        && args.tree
    {
        println!("{}", sim::report::TREE_SCALE_HEADER);
        let point = gossamer::cluster::tree::sim::scale(nodes, keys, 7);
        println!("{}", sim::report::tree_scale_row(&point));
        return ExitCode::SUCCESS;
    }
    if let Some((nodes, keys)) = args.scale {
        println!("{}", sim::report::SCALE_HEADER);
        let point = sim::scale(nodes, keys, 7);
        println!("{}", sim::report::scale_row(&point));
        println!("\n{}", sim::report::scale_traffic(&point));
        return ExitCode::SUCCESS;
    }
    let seeds = match (args.seed, &args.seeds) {
        (Some(seed), _) => seed..seed + 1,
        (None, Some(range)) => range.clone(),
        (None, None) => 1..101,
    };
    let one = seeds.end - seeds.start == 1;
    let started = std::time::Instant::now();
    if args.tree {
        use gossamer::cluster::tree::sim as tree;
        let summary = tree::explore(seeds.clone(), threads);
        if one {
            let setup = tree::TreeSetup::from_seed(seeds.start);
            print!("{}", tree::run(&setup).describe(&setup));
        } else {
            for failure in &summary.failures {
                println!("{failure}");
            }
        }
        println!("{}", summary.line(started.elapsed()));
        return if summary.failures.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(EXIT_DENIED)
        };
    }
    let relimit = args.relimit;
    let add_rule = args.add_rule;
    let summary = sim::explore(seeds.clone(), threads, |s| {
        s.on_partition = mode;
        s.relimit = relimit;
        s.add_rule = add_rule.then(|| sim::Setup::added_rule(s.seed));
    });
    if one {
        let mut setup = sim::Setup::from_seed(seeds.start);
        setup.on_partition = mode;
        setup.relimit = relimit;
        setup.add_rule = add_rule.then(|| sim::Setup::added_rule(setup.seed));
        print!("{}", sim::run(&setup).describe(&setup));
    } else {
        for failure in &summary.failures {
            println!("{failure}");
        }
    }
    println!("{}", summary.line(started.elapsed()));
    if summary.failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_DENIED)
    }
}

fn demo(args: &DemoArgs) -> ExitCode {
    // The nodes' own logs would drown the view: errors only, unless RUST_LOG says otherwise.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let runtime = match runtime(Duration::ZERO) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let options = gossamer::demo::DemoOptions {
        duration: args.duration,
        limit: args.limit,
    };
    let mut out = std::io::stdout();
    match runtime.block_on(gossamer::demo::run(options, &mut out)) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gossamer: demo: {e}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}

fn certs(args: &CertsArgs) -> ExitCode {
    match gossamer::cluster::tls::write_certs(&args.out, &args.nodes, args.force) {
        Ok(written) => {
            for path in &written {
                println!("wrote {}", path.display());
            }
            println!(
                "give each node ca.pem, <node>.pem and <node>-key.pem ([cluster.tls] ca, cert, \
                 key); keep ca-key.pem off the nodes"
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("gossamer: {e}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}

fn serve(args: ServeArgs) -> ExitCode {
    init_tracing(args.log_format);
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    malloc::tune();
    let overrides = Overrides {
        http: args.http,
        node_id: args.node_id,
        gossip: args.gossip,
        advertise: args.advertise,
        seeds: args.seeds,
        cluster_id: args.cluster_id,
        grpc: args.grpc,
        rls_config: args.rls_config,
    };
    let source = (args.config.is_some() || overrides.rls_config.is_some()).then(|| ConfigSource {
        path: args.config.clone(),
        overrides: overrides.clone(),
    });
    let config = match Config::load(args.config.as_deref(), &overrides) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("gossamer: {e}");
            return ExitCode::from(EXIT_ERROR);
        }
    };
    if args.config.is_none() && overrides.rls_config.is_none() {
        tracing::info!("no --config given: serving the built-in example rules");
    }
    let runtime = match runtime(config.server.check_slice) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let result: anyhow::Result<()> = runtime.block_on(async {
        let mut node = Node::bind(config, Arc::new(SystemClock)).await?;
        if let Some(source) = source {
            node = node.reload_from(source);
        }
        node.run(shutdown_signal()).await?;
        Ok(())
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("gossamer: {e:#}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}

/// Completes on SIGTERM or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; stop with SIGKILL");
        return std::future::pending().await;
    };
    let name = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    };
    tracing::info!(signal = name, "stopping");
}

fn check(args: CheckArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("gossamer: {e}");
            return ExitCode::from(EXIT_ERROR);
        }
    };
    // Fails closed: the exit code must say when the node did not answer.
    let client = gossamer_client::Client::builder(&args.url)
        .connect_timeout(CHECK_CONNECT_TIMEOUT)
        .timeout(CHECK_TIMEOUT)
        .build();
    let answer = match client {
        Ok(client) => runtime.block_on(client.check(&args.rule, &args.key, args.cost)),
        Err(e) => Err(e),
    };
    match answer {
        // The decision serializes back to the node's body, field for field.
        Ok(decision) => {
            println!("{}", serde_json::to_string(&decision).unwrap_or_default());
            if decision.allowed {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(EXIT_DENIED)
            }
        }
        Err(gossamer_client::Error::BadRequest { error, message, .. }) => {
            println!(
                "{}",
                serde_json::json!({"error": error, "message": message})
            );
            ExitCode::from(EXIT_ERROR)
        }
        Err(e) => {
            eprintln!("gossamer: {e}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}

fn config_check(file: &std::path::Path) -> ExitCode {
    match Config::load(Some(file), &Overrides::default()) {
        Ok(config) => {
            println!("{}: ok, {} rule(s)", file.display(), config.rules.len());
            if let Some(rls) = &config.rls.config {
                let domains: Vec<&str> =
                    config.rls.domains.iter().map(|d| d.name.as_str()).collect();
                println!(
                    "  RLS config {}: {} domain(s): {}",
                    rls.display(),
                    domains.len(),
                    domains.join(", ")
                );
            }
            for rule in &config.rules {
                let limits: Vec<String> = rule
                    .limits
                    .iter()
                    .map(|l| {
                        let period = gossamer::config::format_duration(l.period());
                        let mut text = format!("{} {}/{period}", l.algorithm(), l.limit());
                        if l.algorithm().has_burst() {
                            text.push_str(&format!(" burst {}", l.burst()));
                        }
                        text
                    })
                    .collect();
                let scope = match rule.scope {
                    gossamer::config::Scope::Global => "global",
                    gossamer::config::Scope::Local => "local",
                };
                let wait = match rule.max_wait {
                    0 => String::new(),
                    w => format!(", max_wait {}", gossamer::config::format_duration(w)),
                };
                println!("  {} ({scope}{wait}): {}", rule.name, limits.join(" + "));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("gossamer: {e}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}

fn init_tracing(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only for a person at a terminal, not in files or log collectors.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// The multi-threaded tokio runtime a command runs on (exit code 2 if it cannot start). With
/// a `check_slice`, the calling thread (which runs the server's top future) and every thread
/// of the runtime ask for that scheduler slice (see [`slice`]).
fn runtime(check_slice: Duration) -> Result<tokio::runtime::Runtime, ExitCode> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    #[cfg(target_os = "linux")]
    if !check_slice.is_zero() {
        report_slice(check_slice, slice::set(check_slice));
        builder.on_thread_start(move || {
            let _ = slice::set(check_slice);
        });
    }
    #[cfg(not(target_os = "linux"))]
    let _ = check_slice;
    builder.enable_all().build().map_err(|e| {
        eprintln!("gossamer: cannot start the runtime: {e}");
        ExitCode::from(EXIT_ERROR)
    })
}

/// Logs what asking for the check threads' slice did (every thread gets the same answer).
#[cfg(target_os = "linux")]
fn report_slice(requested: Duration, outcome: std::io::Result<slice::Outcome>) {
    let requested = format!("{}us", requested.as_micros());
    match outcome {
        Ok(slice::Outcome::Set) => {
            tracing::info!(check_slice = %requested, "check threads run with a short scheduler slice");
        }
        Ok(slice::Outcome::Ignored) => tracing::info!(
            check_slice = %requested,
            "this kernel ignores per-thread slices (Linux 6.12 has them): check_slice has no effect"
        ),
        Ok(slice::Outcome::NotFair(policy)) => tracing::info!(
            policy,
            "the node runs under a real-time or idle scheduling policy: check_slice left alone"
        ),
        Err(e) => tracing::warn!(
            error = %e,
            check_slice = %requested,
            "cannot set the check threads' scheduler slice; a check may wait out another thread's slice"
        ),
    }
}

/// glibc's malloc, tuned for a node that runs for weeks (`serve` only).
///
/// By default glibc gives each thread that allocates an arena of its own (up to 8 per core),
/// and it raises its mmap threshold each time a large block is freed, so that later large
/// blocks (a round's frames, a full frame naming every key) are carved from an arena too.
/// Both keep freed memory in the process. A three-node cluster's RSS grew by 2.2–2.7 kB per
/// global key, against about 0.9 kB of live heap. With as many arenas as cores and the mmap
/// threshold held at glibc's default of 128 KiB, it grew by 1.0–1.35 kB
/// (`MODES=mesh3 bash benches/key_memory.sh`, docs/operations.md). What it may cost: after a
/// storm of 99,000 new keys on three nodes sharing two cores, the tuned builds' traffic took
/// 15–30 s to settle, against about 15 s untuned (a few runs of `benches/key_storm.sh`,
/// design.md §3.3.3). An environment that tunes
/// malloc itself (`GLIBC_TUNABLES` with a `glibc.malloc` tunable, `MALLOC_ARENA_MAX`,
/// `MALLOC_MMAP_THRESHOLD_`) is left alone. `mallopt` has no safe wrapper, hence this
/// module's `unsafe`.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
mod malloc {
    /// Blocks of at least this size are mapped, and unmapped when freed.
    const MMAP_THRESHOLD: libc::c_int = 128 * 1024;

    /// Sets the arena count and the mmap threshold, unless the environment has. Call it before
    /// any thread is started.
    pub fn tune() {
        let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
        if tunables.contains("glibc.malloc.")
            || std::env::var_os("MALLOC_ARENA_MAX").is_some()
            || std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_some()
        {
            tracing::info!("malloc is tuned by the environment: left as it is");
            return;
        }
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        let arenas = libc::c_int::try_from(cores.clamp(2, 64)).unwrap_or(2);
        // SAFETY: `mallopt` only sets malloc's parameters (it takes malloc's own lock), and
        // no other thread of this process is running yet.
        let set = unsafe {
            libc::mallopt(libc::M_ARENA_MAX, arenas) == 1
                && libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
        };
        if set {
            tracing::debug!(arenas, mmap_threshold = MMAP_THRESHOLD, "malloc tuned");
        } else {
            tracing::warn!(
                "mallopt refused the arena count or the mmap threshold; memory per key may be higher"
            );
        }
    }
}

/// The scheduler slice of the threads that answer checks (`[server] check_slice`).
///
/// Since Linux 6.12 a thread may ask for a shorter slice than the kernel's default (about
/// 0.75–3 ms), and a woken thread whose slice is shorter than the running one's preempts it
/// at once. On a core a node's checks share with the cluster's threads (or anything else), a
/// check that arrives while another thread runs would otherwise wait out that thread's slice:
/// at 3,000 checks/s about 1% of checks waited ~2 ms behind a cluster round. The thread's
/// share of the CPU (its weight, from its nice value) does not change. `sched_setattr` has
/// no safe wrapper in the crates we use, hence this module's `unsafe`; the library
/// stays `forbid(unsafe_code)`.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
mod slice {
    use std::io;
    use std::time::Duration;

    /// What became of a request for a slice.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Outcome {
        /// The kernel now reports the slice asked for.
        Set,
        /// The kernel took the call but reports another slice (before Linux 6.12 the
        /// field is ignored for normal threads).
        Ignored,
        /// The thread runs under a real-time policy or `SCHED_IDLE` (someone started the
        /// node under `chrt`): left alone.
        NotFair(u32),
    }

    fn get() -> io::Result<libc::sched_attr> {
        let mut attr = libc::sched_attr {
            size: 0,
            sched_policy: 0,
            sched_flags: 0,
            sched_nice: 0,
            sched_priority: 0,
            sched_runtime: 0,
            sched_deadline: 0,
            sched_period: 0,
        };
        let size = std::mem::size_of::<libc::sched_attr>() as libc::c_uint;
        // SAFETY: pid 0 is the calling thread; `attr` is a valid, writable sched_attr of
        // `size` bytes that outlives the call, and the kernel writes at most `size` bytes.
        let r = unsafe {
            libc::syscall(
                libc::SYS_sched_getattr,
                0,
                &mut attr as *mut libc::sched_attr,
                size,
                0,
            )
        };
        if r == 0 {
            Ok(attr)
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// Asks for `slice` for the calling thread, keeping its policy and nice value. Threads
    /// it spawns start with the kernel's default slice (`SCHED_FLAG_RESET_ON_FORK`): the
    /// cluster's runtime is started from a check thread, and its threads must not get the
    /// short slice, or a check would not preempt them.
    pub fn set(slice: Duration) -> io::Result<Outcome> {
        let mut attr = get()?;
        let fair = [libc::SCHED_OTHER, libc::SCHED_BATCH].map(|p| p as u32);
        if !fair.contains(&attr.sched_policy) {
            return Ok(Outcome::NotFair(attr.sched_policy));
        }
        let ns = u64::try_from(slice.as_nanos()).unwrap_or(u64::MAX);
        attr.size = std::mem::size_of::<libc::sched_attr>() as u32;
        attr.sched_runtime = ns;
        attr.sched_flags |= libc::SCHED_FLAG_RESET_ON_FORK as u64;
        // SAFETY: pid 0 is the calling thread; `attr` is a valid sched_attr whose `size`
        // field says its length, read by the kernel during the call only.
        let r = unsafe {
            libc::syscall(
                libc::SYS_sched_setattr,
                0,
                &attr as *const libc::sched_attr,
                0,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(match get()?.sched_runtime {
            now if now == ns => Outcome::Set,
            _ => Outcome::Ignored,
        })
    }

    /// The slice the kernel reports for the calling thread (its default, if none was set).
    #[cfg(test)]
    pub fn current() -> io::Result<(u32, i32, Duration)> {
        let attr = get()?;
        Ok((
            attr.sched_policy,
            attr.sched_nice,
            Duration::from_nanos(attr.sched_runtime),
        ))
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// The kernel's release as (major, minor), from `uname -r`'s first two numbers.
        fn kernel() -> (u32, u32) {
            let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("osrelease");
            let mut parts = release
                .trim()
                .split(|c: char| !c.is_ascii_digit())
                .map(|p| p.parse::<u32>().unwrap_or(0));
            (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
        }

        #[test]
        fn a_thread_gets_the_slice_it_asks_for_and_keeps_its_nice_value() {
            // A fresh thread, so the test runner's threads keep theirs.
            let (before, outcome, after) = std::thread::spawn(|| {
                // Three nicer than the runner (lowering it would need a privilege).
                let tid = Some(rustix::thread::gettid());
                let nice = rustix::process::getpriority_process(tid).expect("nice");
                rustix::process::setpriority_process(tid, (nice + 3).min(19)).expect("nicer");
                let before = current().expect("getattr");
                let outcome = set(Duration::from_micros(250)).expect("setattr");
                (before, outcome, current().expect("getattr"))
            })
            .join()
            .expect("thread");
            assert_eq!(after.0, before.0, "policy kept");
            assert_eq!(after.1, before.1, "nice kept");
            if kernel() >= (6, 12) {
                assert_eq!(outcome, Outcome::Set);
                assert_eq!(after.2, Duration::from_micros(250));
            } else {
                assert_eq!(outcome, Outcome::Ignored);
            }
        }

        #[test]
        fn threads_a_check_thread_spawns_get_the_kernels_slice_and_its_nice_value() {
            let (default, spawned) = std::thread::spawn(|| {
                let default = current().expect("getattr");
                set(Duration::from_micros(100)).expect("setattr");
                let spawned = std::thread::spawn(|| current().expect("getattr"))
                    .join()
                    .expect("thread");
                (default, spawned)
            })
            .join()
            .expect("thread");
            assert_eq!(spawned, default);
        }
    }
}
