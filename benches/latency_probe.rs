//! An open-loop latency probe: check latency at a fixed offered rate, without coordinated
//! omission.
//!
//! wrk is closed-loop: each connection sends its next request only when the previous answer
//! is in, so the offered load is whatever the machine can carry. On the 2-core machine wrk
//! and the servers then saturate the CPU, and wrk's latency figures mostly measure each
//! process's share of it; and a server that stalls is simply sent fewer requests during the
//! stall, so the stall shows up in one sample instead of in every request that should have
//! been sent meanwhile (coordinated omission).
//!
//! This probe offers a constant rate instead. Request `i` is scheduled at `t0 + i / rate` and
//! goes to connection `i % connections`; each connection sends its requests in order, one at
//! a time (HTTP/1.1 keep-alive, no pipelining), as soon as the request is due and the previous
//! answer is read. Latency runs from the *scheduled* time to the last byte of the answer's
//! body, so time a request spends queued behind a slow answer counts against the server. At a
//! rate well below saturation the figures are the round trip of a check on a machine with
//! spare CPU, which is what a client sees in normal operation.
//!
//! The request is `POST <url>/v1/check` with the body of `benches/check.lua`:
//! `{"rule":"default","key":"user-%07d","cost":1}`, keys rotating over `--keys`. Answers of
//! any status are timed (as wrk does); the non-2xx ones are also counted. Requests scheduled
//! during the first `--warmup` seconds are sent but not recorded.
//!
//! Timing: tokio's timer has millisecond ticks, far too coarse to schedule sends when the
//! answers take a few hundred microseconds (every latency would carry 0-1 ms of timer
//! rounding). The schedule is kept by a pacer thread instead, which sleeps until just before
//! each request is due (`thread::sleep` wakes 50-80 µs late for a normal thread here, timer
//! slack included; the pacer learns the average and wakes that much early), spins the last
//! ~10 µs, and hands the request to its connection's task on a current-thread tokio runtime.
//! The probe is thus two threads that take turns (the script pins both to one CPU and runs
//! them SCHED_FIFO). The pacer's lag, and the runtime's delay in picking the request up, are
//! part of every latency; `lag_*` reports them (time from scheduled to the start of the send,
//! over requests whose connection was idle when they were due). `probe_cpu_pct` is the CPU
//! both threads used over the run, in percent of one CPU (from `/proc/thread-self/schedstat`;
//! `NA` if unreadable): about 12% at 1,000 checks/s and 35% at 4,000/s on this machine.
//!
//! Output, one line on stdout:
//!
//! ```text
//! RESULT requests=N rate=R achieved_rps=A p50_us=.. p90_us=.. p99_us=.. p999_us=.. max_us=..
//!        non2xx=.. errors=.. late=.. probe_late=.. lag_p50_us=.. lag_p99_us=.. probe_cpu_pct=..
//! ```
//!
//! `requests` counts answers recorded (after warm-up); `achieved_rps` is that over the time
//! from the first recorded request's scheduled time to the last answer. Percentiles are
//! nearest-rank, in microseconds. `late` counts recorded requests sent more than 1 ms after
//! their scheduled time, for any reason; `probe_late` those of them whose connection was idle
//! when they were due, i.e. the probe itself fell behind. If `probe_late` is more than 1% of
//! the requests the figures are suspect, and the probe says so on stderr. A failed exchange
//! (connect, I/O, or no answer within `--timeout-ms` of the scheduled time) counts as an
//! error and is not retried; its connection reconnects. After 100 errors the probe gives up
//! with exit code 1.
//!
//! Usage: `cargo run --release --example latency_probe -- --url http://127.0.0.1:7070
//! --rate 2000 --duration 10`

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper::header::{CONTENT_TYPE, HOST, HeaderValue};
use hyper::{Method, Request, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// A request sent later than this after its scheduled time is `late`.
const LATE: Duration = Duration::from_millis(1);
/// The run gives up after this many failed exchanges.
const MAX_ERRORS: u64 = 100;
/// The pacer's first guess at how late `thread::sleep` wakes (timer slack, 50 µs by default
/// for a normal thread, none for a real-time one, plus the wake-up itself).
const OVERSHOOT_GUESS: Duration = Duration::from_micros(60);
/// Overshoots are clamped to this before they enter the average (a preemption is not slack).
const OVERSHOOT_CAP: Duration = Duration::from_micros(300);
/// Woken this much earlier than the average overshoot, the pacer spins the rest.
const SPIN_MARGIN: Duration = Duration::from_micros(10);
/// Failed exchanges described on stderr (the rest are only counted).
const ERRORS_SHOWN: u64 = 5;

/// Open-loop constant-rate load on `POST <url>/v1/check`; prints one RESULT line.
#[derive(Debug, Parser)]
#[command(name = "latency_probe")]
struct Args {
    /// The node, e.g. http://127.0.0.1:7070; checks go to <url>/v1/check.
    #[arg(long)]
    url: String,
    /// Checks offered per second.
    #[arg(long, default_value_t = 2000.0)]
    rate: f64,
    /// Seconds recorded, after the warm-up.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Seconds sent at the same rate first, not recorded.
    #[arg(long, default_value_t = 2.0)]
    warmup: f64,
    /// Keep-alive connections; request i goes to connection i % connections.
    #[arg(long, default_value_t = 16)]
    connections: usize,
    /// Keys user-0000000 .. user-<keys - 1>, in rotation.
    #[arg(long, default_value_t = 10_000)]
    keys: u64,
    /// The rule checked.
    #[arg(long, default_value = "default")]
    rule: String,
    /// A request without its full answer this long after its scheduled time is an error.
    #[arg(long, default_value_t = 5_000)]
    timeout_ms: u64,
}

/// What every connection task shares.
#[derive(Debug)]
struct Plan {
    /// `host:port` to connect to.
    addr: String,
    /// The Host header.
    host: HeaderValue,
    /// The request target, `/v1/check` under the URL's path.
    path: String,
    /// The rule's name as a JSON string (quoted, escaped).
    rule_json: String,
    keys: u64,
    connections: usize,
    rate: f64,
    t0: Instant,
    /// Requests `0..warmup_n` are not recorded.
    warmup_n: u64,
    /// Requests `0..total` are sent.
    total: u64,
    timeout: Duration,
    errors: AtomicU64,
    abort: AtomicBool,
}

impl Plan {
    fn scheduled(&self, i: u64) -> Instant {
        self.t0 + Duration::from_secs_f64(i as f64 / self.rate)
    }

    fn request(&self, i: u64) -> Request<Full<Bytes>> {
        let body = format!(
            r#"{{"rule":{},"key":"user-{:07}","cost":1}}"#,
            self.rule_json,
            i % self.keys
        );
        let mut request = Request::new(Full::new(Bytes::from(body)));
        *request.method_mut() = Method::POST;
        // The path was checked to parse as a URI when the plan was made.
        if let Ok(uri) = self.path.parse::<Uri>() {
            *request.uri_mut() = uri;
        }
        let headers = request.headers_mut();
        headers.insert(HOST, self.host.clone());
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        request
    }

    /// Counts a failed exchange; at `MAX_ERRORS` tells everyone to give up.
    fn error(&self, i: u64, what: &str) {
        let n = self.errors.fetch_add(1, Ordering::Relaxed) + 1;
        if n <= ERRORS_SHOWN {
            eprintln!("latency_probe: request {i}: {what}");
        }
        if n >= MAX_ERRORS {
            self.abort.store(true, Ordering::Relaxed);
        }
    }
}

/// One connection's record.
#[derive(Debug, Default)]
struct Stats {
    /// Scheduled time to full answer, µs, recorded requests answered.
    latencies: Vec<u32>,
    /// Scheduled time to start of the send, µs, recorded requests whose connection was idle.
    lags: Vec<u32>,
    non2xx: u64,
    errors: u64,
    warmup_errors: u64,
    late: u64,
    probe_late: u64,
    last_done: Option<Instant>,
}

type Sender = http1::SendRequest<Full<Bytes>>;

async fn connect(plan: &Plan) -> Result<Sender, String> {
    let stream = TcpStream::connect(&plan.addr)
        .await
        .map_err(|e| format!("connect to {}: {e}", plan.addr))?;
    stream
        .set_nodelay(true)
        .map_err(|e| format!("set TCP_NODELAY: {e}"))?;
    let (sender, connection) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(async move {
        // Ends when the sender is dropped or the server closes; errors surface on the sender.
        let _ = connection.await;
    });
    Ok(sender)
}

/// Sends request `i` on `sender` (connecting first if there is none) and reads the whole
/// answer; returns its status.
async fn exchange(plan: &Plan, sender: &mut Option<Sender>, i: u64) -> Result<u16, String> {
    let mut current = match sender.take() {
        Some(s) if !s.is_closed() => s,
        _ => connect(plan).await?,
    };
    current
        .ready()
        .await
        .map_err(|e| format!("connection not ready: {e}"))?;
    let response = current
        .send_request(plan.request(i))
        .await
        .map_err(|e| format!("send: {e}"))?;
    let status = response.status().as_u16();
    response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("read body: {e}"))?;
    *sender = Some(current);
    Ok(status)
}

fn micros(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

/// One connection: sends the requests the pacer hands it, in order, one at a time.
async fn connection(
    plan: Arc<Plan>,
    mut queue: mpsc::UnboundedReceiver<u64>,
    mut sender: Option<Sender>,
) -> Stats {
    let recorded = (plan.total - plan.warmup_n) as usize / plan.connections + 1;
    let mut stats = Stats {
        latencies: Vec::with_capacity(recorded),
        lags: Vec::with_capacity(recorded),
        ..Stats::default()
    };
    // When the previous exchange on this connection ended.
    let mut free_since = Instant::now();
    while let Some(i) = queue.recv().await {
        if plan.abort.load(Ordering::Relaxed) {
            break;
        }
        let due = plan.scheduled(i);
        if Instant::now() < due {
            // The pacer hands requests over when due; this only guards against an early one.
            tokio::time::sleep_until(due.into()).await;
        }
        let start = Instant::now();
        let record = i >= plan.warmup_n;
        let lag = start.saturating_duration_since(due);
        if record {
            let idle = free_since <= due;
            if idle {
                stats.lags.push(micros(lag));
            }
            if lag > LATE {
                stats.late += 1;
                if idle {
                    stats.probe_late += 1;
                }
            }
        }
        let deadline = due + plan.timeout;
        let result = if start >= deadline {
            Err("not sent before its timeout (queued behind slow answers)".to_owned())
        } else {
            match tokio::time::timeout_at(deadline.into(), exchange(&plan, &mut sender, i)).await {
                Ok(result) => result,
                Err(_) => Err(format!("no answer within {:?}", plan.timeout)),
            }
        };
        let done = Instant::now();
        free_since = done;
        match result {
            Ok(status) => {
                if record {
                    stats
                        .latencies
                        .push(micros(done.saturating_duration_since(due)));
                    if !(200..300).contains(&status) {
                        stats.non2xx += 1;
                    }
                    stats.last_done = Some(done);
                }
            }
            Err(what) => {
                // The connection may be mid-answer: drop it, reconnect on the next request.
                sender = None;
                if record {
                    stats.errors += 1;
                } else {
                    stats.warmup_errors += 1;
                }
                plan.error(i, &what);
            }
        }
    }
    stats
}

/// Waits for deadlines precisely without spinning through each whole wait: sleeps until
/// the average overshoot of its sleeps (plus `SPIN_MARGIN`) before the deadline, then spins.
#[derive(Debug)]
struct Waiter {
    /// Moving average (weight 1/16) of how late `thread::sleep` wakes, in nanoseconds.
    overshoot_ns: f64,
}

impl Waiter {
    fn new() -> Self {
        Waiter {
            overshoot_ns: OVERSHOOT_GUESS.as_nanos() as f64,
        }
    }

    fn wait_until(&mut self, deadline: Instant) {
        let early = Duration::from_nanos(self.overshoot_ns as u64) + SPIN_MARGIN;
        let now = Instant::now();
        if deadline > now + early {
            let wake = deadline - early;
            std::thread::sleep(wake - now);
            let late = Instant::now()
                .saturating_duration_since(wake)
                .min(OVERSHOOT_CAP);
            self.overshoot_ns += (late.as_nanos() as f64 - self.overshoot_ns) / 16.0;
        }
        while Instant::now() < deadline {
            std::hint::spin_loop();
        }
    }
}

/// Nanoseconds this thread has run on a CPU (`/proc/thread-self/schedstat`), if readable.
fn thread_cpu_ns() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// Hands each request to its connection when it is due; returns the pacer thread's CPU time.
fn pace(plan: &Plan, queues: Vec<mpsc::UnboundedSender<u64>>) -> Option<u64> {
    let n = queues.len() as u64;
    let mut waiter = Waiter::new();
    for i in 0..plan.total {
        if plan.abort.load(Ordering::Relaxed) {
            break;
        }
        waiter.wait_until(plan.scheduled(i));
        if let Some(queue) = usize::try_from(i % n).ok().and_then(|c| queues.get(c)) {
            // A closed queue means its task gave up (abort); the check above ends the loop.
            let _ = queue.send(i);
        }
    }
    thread_cpu_ns()
}

/// Nearest-rank percentile of a sorted slice (0 for an empty one).
fn percentile(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn plan_from(args: &Args) -> Result<Plan, String> {
    if !(args.rate.is_finite() && args.rate > 0.0) {
        return Err(format!("--rate must be positive, not {}", args.rate));
    }
    if !(args.duration.is_finite() && args.duration > 0.0) {
        return Err(format!(
            "--duration must be positive, not {}",
            args.duration
        ));
    }
    if !(args.warmup.is_finite() && args.warmup >= 0.0) {
        return Err(format!("--warmup must be 0 or more, not {}", args.warmup));
    }
    if args.connections == 0 || args.keys == 0 {
        return Err("--connections and --keys must be at least 1".into());
    }
    let base = args.url.trim_end_matches('/');
    let uri: Uri = base
        .parse()
        .map_err(|e| format!("bad --url {:?}: {e}", args.url))?;
    if uri.scheme_str() != Some("http") {
        return Err(format!(
            "--url must be http://host:port, not {:?}",
            args.url
        ));
    }
    let authority = uri
        .authority()
        .ok_or_else(|| format!("--url {:?} has no host", args.url))?;
    let addr = match authority.port_u16() {
        Some(_) => authority.as_str().to_owned(),
        None => format!("{}:80", authority.as_str()),
    };
    let host = HeaderValue::from_str(authority.as_str())
        .map_err(|e| format!("bad host {:?}: {e}", authority.as_str()))?;
    let path = format!("{}/v1/check", uri.path().trim_end_matches('/'));
    path.parse::<Uri>()
        .map_err(|e| format!("bad path {path:?}: {e}"))?;
    let rule_json = serde_json::to_string(&args.rule).map_err(|e| format!("--rule: {e}"))?;
    let warmup_n = (args.warmup * args.rate).round() as u64;
    let total = warmup_n + ((args.duration * args.rate).round() as u64).max(1);
    Ok(Plan {
        addr,
        host,
        path,
        rule_json,
        keys: args.keys,
        connections: args.connections,
        rate: args.rate,
        t0: Instant::now(),
        warmup_n,
        total,
        timeout: Duration::from_millis(args.timeout_ms.max(1)),
        errors: AtomicU64::new(0),
        abort: AtomicBool::new(false),
    })
}

async fn run(args: Args) -> Result<(), String> {
    let mut plan = plan_from(&args)?;
    let cpu_before = thread_cpu_ns();
    let wall_start = Instant::now();

    // Every connection is open before the clock starts.
    let mut senders = Vec::with_capacity(args.connections);
    for _ in 0..args.connections {
        senders.push(connect(&plan).await?);
    }
    plan.t0 = Instant::now() + Duration::from_millis(20);
    let plan = Arc::new(plan);

    let mut queues = Vec::with_capacity(args.connections);
    let mut tasks = Vec::with_capacity(args.connections);
    for sender in senders {
        let (queue, receiver) = mpsc::unbounded_channel();
        queues.push(queue);
        tasks.push(tokio::spawn(connection(
            Arc::clone(&plan),
            receiver,
            Some(sender),
        )));
    }
    let pacer = {
        let plan = Arc::clone(&plan);
        std::thread::Builder::new()
            .name("pacer".into())
            .spawn(move || pace(&plan, queues))
            .map_err(|e| format!("cannot start the pacer thread: {e}"))?
    };

    let mut all = Stats::default();
    for task in tasks {
        let stats = task
            .await
            .map_err(|e| format!("connection task failed: {e}"))?;
        all.latencies.extend_from_slice(&stats.latencies);
        all.lags.extend_from_slice(&stats.lags);
        all.non2xx += stats.non2xx;
        all.errors += stats.errors;
        all.warmup_errors += stats.warmup_errors;
        all.late += stats.late;
        all.probe_late += stats.probe_late;
        all.last_done = all.last_done.max(stats.last_done);
    }
    // Every task has seen its queue close (or the run was aborted and the pacer stops at its
    // next request), so this returns at once.
    let pacer_cpu = pacer
        .join()
        .map_err(|_| "the pacer thread panicked".to_owned())?;
    // Both threads' CPU over the run, as a percentage of one CPU (the pinned one).
    let probe_cpu_pct = match (cpu_before, thread_cpu_ns(), pacer_cpu) {
        (Some(before), Some(after), Some(pacer)) => format!(
            "{:.1}",
            (after.saturating_sub(before) + pacer) as f64
                / 1e9
                / wall_start.elapsed().as_secs_f64()
                * 100.0
        ),
        _ => "NA".to_owned(),
    };

    let errors = plan.errors.load(Ordering::Relaxed);
    if plan.abort.load(Ordering::Relaxed) {
        return Err(format!("giving up after {errors} errors"));
    }
    if all.warmup_errors > 0 {
        eprintln!(
            "latency_probe: {} errors during the warm-up (not in the result)",
            all.warmup_errors
        );
    }

    all.latencies.sort_unstable();
    all.lags.sort_unstable();
    let n = all.latencies.len();
    let span = all
        .last_done
        .map(|done| done.saturating_duration_since(plan.scheduled(plan.warmup_n)))
        .unwrap_or_default()
        .as_secs_f64();
    let achieved = if span > 0.0 { n as f64 / span } else { 0.0 };
    let p = |q| percentile(&all.latencies, q);
    println!(
        "RESULT requests={n} rate={} achieved_rps={achieved:.1} p50_us={} p90_us={} p99_us={} \
         p999_us={} max_us={} non2xx={} errors={} late={} probe_late={} lag_p50_us={} \
         lag_p99_us={} probe_cpu_pct={probe_cpu_pct}",
        args.rate,
        p(50.0),
        p(90.0),
        p(99.0),
        p(99.9),
        all.latencies.last().copied().unwrap_or(0),
        all.non2xx,
        all.errors,
        all.late,
        all.probe_late,
        percentile(&all.lags, 50.0),
        percentile(&all.lags, 99.0),
    );
    let recorded = (plan.total - plan.warmup_n) as f64;
    if all.probe_late as f64 > 0.01 * recorded {
        eprintln!(
            "latency_probe: WARNING: the probe fell behind its schedule: {} of {} requests \
             started more than 1 ms late on an idle connection; the latencies are suspect",
            all.probe_late, recorded
        );
    }
    if all.late - all.probe_late > 0 {
        eprintln!(
            "latency_probe: {} requests waited more than 1 ms behind a slow answer on their \
             connection (counted in the latencies)",
            all.late - all.probe_late
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("latency_probe: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("latency_probe: {e}");
            ExitCode::from(1)
        }
    }
}
