//! Throughput of Envoy's rate limit service against the HTTP check, on one node, same machine.
//!
//! Starts the `gossamer` binary given by `--bin` (a release build) with both listeners and an
//! RLS config whose one limit is also a rule the HTTP API can name, so both paths reach the
//! same engine rule (`rls.fixed_window.1000000.second`, a fixed window far above the load, so
//! every check is admitted and charged) for keys rotating over 10,000:
//!
//! - **http**: `POST /v1/check {"rule":"rls.fixed_window.1000000.second","key":"u-N"}`,
//!   HTTP/1.1 keep-alive, one connection per worker;
//! - **rls**: `ShouldRateLimit` for domain `bench`, descriptor `(user, u-N)`, one HTTP/2
//!   connection per worker;
//! - **rls-shared**: the same over one HTTP/2 connection for all workers (as an Envoy worker
//!   thread multiplexes its calls).
//!
//! Closed loop: `c` workers each send the next check when the previous answer is in, for
//! `--duration` seconds after 0.5 s of warm-up. Targets alternate, `--runs` times per
//! concurrency; the table gives medians. Server CPU per check is utime + stime of the server
//! process from `/proc/PID/stat` over the measured interval, divided by the checks answered
//! (the load generator's own CPU is not in it). The generator is a 2-thread tokio runtime in
//! this process, sharing the machine with the server.
//!
//! Usage: `cargo build --release --bin gossamer --example rls_load &&
//! target/release/examples/rls_load --bin target/release/gossamer`

use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use gossamer::rls::proto::rate_limit_descriptor::Entry;
use gossamer::rls::proto::rate_limit_service_client::RateLimitServiceClient;
use gossamer::rls::proto::{RateLimitDescriptor, RateLimitRequest};
use gossamer_client::raw::Client;
use tonic::transport::Channel;

const RULE: &str = "rls.fixed_window.1000000.second";
const KEYS: u64 = 10_000;

struct Args {
    bin: String,
    duration: f64,
    runs: usize,
    concurrency: Vec<usize>,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        bin: String::new(),
        duration: 5.0,
        runs: 3,
        concurrency: vec![1, 16, 64],
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--bin" => a.bin = value()?,
            "--duration" => a.duration = value()?.parse().map_err(|e| format!("{e}"))?,
            "--runs" => a.runs = value()?.parse().map_err(|e| format!("{e}"))?,
            "--concurrency" => {
                a.concurrency = value()?
                    .split(',')
                    .map(|c| c.parse().map_err(|e| format!("{e}")))
                    .collect::<Result<_, _>>()?;
            }
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if a.bin.is_empty() {
        return Err("--bin PATH (the gossamer binary) is required".into());
    }
    Ok(a)
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// utime + stime of `pid`, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = fields.get(11..13).map_or(0.0, |f| {
        f.iter().filter_map(|x| x.parse::<f64>().ok()).sum()
    });
    ticks / 100.0
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Target {
    Http,
    Rls,
    RlsShared,
}

impl Target {
    fn name(self) -> &'static str {
        match self {
            Target::Http => "http",
            Target::Rls => "rls",
            Target::RlsShared => "rls-shared",
        }
    }
}

struct Point {
    rate: f64,
    cpu_us: f64,
    p50_us: f64,
    p99_us: f64,
    errors: u64,
}

fn request(key: u64) -> RateLimitRequest {
    RateLimitRequest {
        domain: "bench".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: format!("u-{key}"),
            }],
            limit: None,
            hits_addend: None,
        }],
        hits_addend: 1,
    }
}

async fn run(
    target: Target,
    c: usize,
    http: SocketAddr,
    grpc: SocketAddr,
    pid: u32,
    duration: f64,
) -> Point {
    let recording = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(AtomicU64::new(0));
    let shared = match target {
        Target::RlsShared => Some(
            Channel::from_shared(format!("http://{grpc}"))
                .expect("uri")
                .connect()
                .await
                .expect("connects"),
        ),
        _ => None,
    };
    let mut workers = Vec::new();
    for w in 0..c {
        let (recording, stop, errors, shared) = (
            recording.clone(),
            stop.clone(),
            errors.clone(),
            shared.clone(),
        );
        workers.push(tokio::spawn(async move {
            let mut latencies: Vec<u32> = Vec::new();
            let mut key = w as u64 * 7919;
            let mut http_client = match target {
                Target::Http => Some(
                    Client::connect(&format!("http://{http}"))
                        .await
                        .expect("connects"),
                ),
                _ => None,
            };
            let mut rls = match (target, shared) {
                (Target::Rls, _) => Some(
                    RateLimitServiceClient::connect(format!("http://{grpc}"))
                        .await
                        .expect("connects"),
                ),
                (Target::RlsShared, Some(channel)) => Some(RateLimitServiceClient::new(channel)),
                _ => None,
            };
            while !stop.load(Ordering::Relaxed) {
                key = (key + 1) % KEYS;
                let started = Instant::now();
                let ok = match (&mut http_client, &mut rls) {
                    (Some(h), _) => {
                        let body = format!("{{\"rule\":\"{RULE}\",\"key\":\"u-{key}\"}}");
                        h.send(hyper::Method::POST, "/v1/check", body)
                            .await
                            .is_ok_and(|r| r.status.is_success())
                    }
                    (_, Some(r)) => r
                        .should_rate_limit(request(key))
                        .await
                        .is_ok_and(|r| r.get_ref().overall_code == 1),
                    _ => false,
                };
                if recording.load(Ordering::Relaxed) {
                    if ok {
                        latencies.push(started.elapsed().as_micros() as u32);
                    } else {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            latencies
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let cpu0 = cpu_seconds(pid);
    let t0 = Instant::now();
    recording.store(true, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs_f64(duration)).await;
    recording.store(false, Ordering::Relaxed);
    let elapsed = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds(pid) - cpu0;
    stop.store(true, Ordering::Relaxed);
    let mut all: Vec<u32> = Vec::new();
    for w in workers {
        all.extend(w.await.expect("worker"));
    }
    all.sort_unstable();
    let q = |p: f64| -> f64 {
        if all.is_empty() {
            return f64::NAN;
        }
        all[((all.len() as f64 * p).ceil() as usize).clamp(1, all.len()) - 1] as f64
    };
    Point {
        rate: all.len() as f64 / elapsed,
        cpu_us: cpu * 1e6 / all.len().max(1) as f64,
        p50_us: q(0.50),
        p99_us: q(0.99),
        errors: errors.load(Ordering::Relaxed),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn start(bin: &str, dir: &std::path::Path, http: SocketAddr, grpc: SocketAddr) -> Child {
    std::fs::write(
        dir.join("bench.yaml"),
        "domain: bench\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 1000000}\n",
    )
    .expect("writes the config");
    Command::new(bin)
        .args([
            "serve",
            "--http",
            &http.to_string(),
            "--grpc",
            &grpc.to_string(),
        ])
        .arg("--rls-config")
        .arg(dir.join("bench.yaml"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starts the server")
}

fn main() -> ExitCode {
    let args = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("rls_load: {e}");
            return ExitCode::from(2);
        }
    };
    let dir = std::env::temp_dir().join(format!("gossamer-rls-load-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let http: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let grpc: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let mut server = start(&args.bin, &dir, http, grpc);
    let pid = server.id();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let result = runtime.block_on(async {
        // Wait for both listeners.
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(grpc).is_err()
            || std::net::TcpStream::connect(http).is_err()
        {
            if Instant::now() > deadline {
                return Err("the server did not start".to_owned());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        println!(
            "| concurrency | target | checks/s | server CPU µs/check | p50 µs | p99 µs | errors |"
        );
        println!("|---:|---|---:|---:|---:|---:|---:|");
        let targets = [Target::Http, Target::Rls, Target::RlsShared];
        for &c in &args.concurrency {
            let mut points: Vec<Vec<Point>> = targets.iter().map(|_| Vec::new()).collect();
            for run_index in 0..args.runs {
                for i in 0..targets.len() {
                    let t = (i + run_index) % targets.len();
                    let p = run(targets[t], c, http, grpc, pid, args.duration).await;
                    points[t].push(p);
                }
            }
            for (t, ps) in targets.iter().zip(points) {
                println!(
                    "| {c} | {} | {:.0} | {:.1} | {:.0} | {:.0} | {} |",
                    t.name(),
                    median(ps.iter().map(|p| p.rate).collect()),
                    median(ps.iter().map(|p| p.cpu_us).collect()),
                    median(ps.iter().map(|p| p.p50_us).collect()),
                    median(ps.iter().map(|p| p.p99_us).collect()),
                    ps.iter().map(|p| p.errors).sum::<u64>(),
                );
            }
        }
        Ok(())
    });
    let _ = server.kill();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(&dir);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rls_load: {e}");
            ExitCode::FAILURE
        }
    }
}
