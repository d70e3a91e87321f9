//! `gossamer demo`: a 3-node cluster on loopback, in this process, under a skewed load on one
//! global rule, with a live view per node and, at the end, the cluster's admitted total
//! against the ideal.
//!
//! Each node is a real [`Node`] (HTTP API, chitchat gossip over UDP, counts over QUIC) bound
//! to 127.0.0.1; the load reaches them over HTTP like any app's checks. The rule is a global
//! fixed window of `limit` per second on one key; the nodes are offered 60%, 30% and 10% of
//! three times the limit, so no node alone could tell that the cluster is over it. The load
//! starts on a window edge and stops just before one, so the ideal is `limit` × the windows
//! the checks were decided in.

use std::io::{self, Write};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::api::App;
use crate::clock::{Clock, SystemClock};
use crate::config::Config;
use crate::limiter::{MILLISECOND, Nanos, SECOND};
use crate::server::Node;
use gossamer_client::raw::Client;

/// The demo's node ids.
pub const NODES: [&str; 3] = ["demo-a", "demo-b", "demo-c"];
/// Each node's part of the offered load, in percent.
pub const SKEW: [u64; 3] = [60, 30, 10];
/// The offered load, as a multiple of the limit.
pub const OVERLOAD: u64 = 3;
/// The rule and key the load spends.
pub const RULE: &str = "demo";
/// The key every node's load spends.
pub const KEY: &str = "tenant-42";
/// Connections per node the load is spread over.
const CONNECTIONS: u64 = 2;
/// How long the cluster may take to form before the demo gives up.
const FORM_TIMEOUT: Duration = Duration::from_secs(20);

/// What to run.
#[derive(Debug, Clone, Copy)]
pub struct DemoOptions {
    /// How long to drive the load (rounded up to whole seconds).
    pub duration: Duration,
    /// The global limit, per second.
    pub limit: u64,
}

/// Why the demo could not run.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// A node could not start.
    #[error("cannot start node {node}: {message}")]
    Start {
        /// The node.
        node: &'static str,
        /// Why.
        message: String,
    },
    /// The nodes did not all see each other in time.
    #[error("the cluster did not form within {0:?}")]
    NotFormed(Duration),
    /// Writing the view failed.
    #[error("cannot write the view: {0}")]
    Output(#[from] io::Error),
}

/// What the demo measured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DemoReport {
    /// Per node (in [`NODES`] order): checks admitted.
    pub admitted: [u64; 3],
    /// Per node: checks denied.
    pub denied: [u64; 3],
    /// Checks that failed (no answer, or not 200/429).
    pub errors: u64,
    /// Fixed windows the checks were decided in.
    pub windows: u64,
    /// The most the cluster may admit in those windows: `limit` × `windows`.
    pub ideal: u64,
}

impl DemoReport {
    /// Checks the cluster admitted.
    pub fn total_admitted(&self) -> u64 {
        self.admitted.iter().sum()
    }
}

/// Per node, what its load saw.
#[derive(Debug, Default)]
struct Tally {
    admitted: AtomicU64,
    denied: AtomicU64,
    errors: AtomicU64,
    /// Send time of the first check and arrival time of the last answer (wall-clock ns).
    first_sent: AtomicU64,
    last_answered: AtomicU64,
}

/// Runs the demo, writing the view to `out`.
pub async fn run(
    options: DemoOptions,
    out: &mut (dyn Write + Send),
) -> Result<DemoReport, DemoError> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let seconds = options.duration.as_secs() + u64::from(options.duration.subsec_nanos() > 0);
    let seconds = seconds.max(1);
    let limit = options.limit.max(1);

    let gossip: Vec<SocketAddr> = NODES
        .iter()
        .map(|node| free_udp_port().map_err(|e| start_error(node, e)))
        .collect::<Result<_, _>>()?;
    let seeds = gossip
        .iter()
        .map(|a| format!("\"{a}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let (stop, stopped) = watch::channel(false);
    let mut apps = Vec::new();
    let mut http = Vec::new();
    let mut servers: Vec<JoinHandle<io::Result<()>>> = Vec::new();
    for (i, node) in NODES.iter().enumerate() {
        let text = format!(
            r#"
[server]
http = "127.0.0.1:0"
node_id = "{node}"
[cluster]
gossip = "{gossip}"
quic = "127.0.0.1:0"
seeds = [{seeds}]
cluster_id = "gossamer-demo"
[[rule]]
name = "{RULE}"
algorithm = "fixed_window"
limit = {limit}
period = "1s"
scope = "global"
"#,
            gossip = gossip[i],
        );
        let config =
            Config::parse(&text, "<demo>").map_err(|e| start_error(node, e.to_string()))?;
        config
            .check_cluster("<demo>")
            .map_err(|e| start_error(node, e.to_string()))?;
        let bound = Node::bind(config, clock.clone())
            .await
            .map_err(|e| start_error(node, e.to_string()))?;
        http.push(
            bound
                .local_addr()
                .map_err(|e| start_error(node, e.to_string()))?,
        );
        apps.push(bound.app());
        let mut stopped = stopped.clone();
        servers.push(tokio::spawn(bound.run(async move {
            let _ = stopped.wait_for(|s| *s).await;
        })));
    }

    let result = drive(&apps, &http, clock.as_ref(), seconds, limit, out).await;

    let _ = stop.send(true);
    for server in servers {
        let _ = tokio::time::timeout(Duration::from_secs(15), server).await;
    }
    result
}

fn start_error(node: &'static str, message: impl ToString) -> DemoError {
    DemoError::Start {
        node,
        message: message.to_string(),
    }
}

/// A UDP port free on loopback now (bound, read and released).
fn free_udp_port() -> io::Result<SocketAddr> {
    UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))?.local_addr()
}

/// Peers `app` sees alive (itself excluded).
fn peers(app: &App) -> usize {
    app.cluster.get().map_or(0, |c| {
        c.members().iter().filter(|m| m.alive && !m.is_self).count()
    })
}

async fn drive(
    apps: &[Arc<App>],
    http: &[SocketAddr],
    clock: &dyn Clock,
    seconds: u64,
    limit: u64,
    out: &mut (dyn Write + Send),
) -> Result<DemoReport, DemoError> {
    writeln!(
        out,
        "gossamer demo: 3 nodes on loopback ({}), one global rule \"{RULE}\": fixed window, {limit} per second, key \"{KEY}\"",
        http.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    )?;
    // Formed: every node sees both peers and has pulled their counts.
    let formed = tokio::time::timeout(FORM_TIMEOUT, async {
        loop {
            if apps
                .iter()
                .all(|a| peers(a) == NODES.len() - 1 && a.cluster.get().is_some_and(|c| c.ready()))
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    if formed.is_err() {
        return Err(DemoError::NotFormed(FORM_TIMEOUT));
    }
    let offered: Vec<u64> = SKEW.iter().map(|p| limit * OVERLOAD * p / 100).collect();
    writeln!(
        out,
        "cluster formed; offering {} checks/s for {seconds} s: {} ({}% / {}% / {}%)",
        offered.iter().sum::<u64>(),
        NODES
            .iter()
            .zip(&offered)
            .map(|(n, r)| format!("{n} {r}/s"))
            .collect::<Vec<_>>()
            .join(", "),
        SKEW[0],
        SKEW[1],
        SKEW[2]
    )?;

    // Start on a window edge, stop a little before the last one ends.
    let start = (clock.now() / SECOND + 1) * SECOND;
    let end = start + seconds * SECOND - 30 * MILLISECOND;
    let tallies: Vec<Arc<Tally>> = NODES.iter().map(|_| Arc::new(Tally::default())).collect();
    let mut load = Vec::new();
    for ((addr, rate), tally) in http.iter().zip(&offered).zip(&tallies) {
        for c in 0..CONNECTIONS {
            let rate = *rate / CONNECTIONS + u64::from(c < *rate % CONNECTIONS);
            if rate == 0 {
                continue;
            }
            let phase = c * (SECOND / rate) / CONNECTIONS;
            load.push(tokio::spawn(spend(
                *addr,
                rate,
                start + phase,
                end,
                tally.clone(),
            )));
        }
    }

    writeln!(
        out,
        "\n{:>4}  {:<8} {:>9} {:>8} {:>6} {:>6}",
        "sec", "node", "admitted", "denied", "share", "peers"
    )?;
    let mut last = vec![(0u64, 0u64); NODES.len()];
    for second in 1..=seconds {
        let at = start + second * SECOND;
        let now = clock.now();
        if at > now {
            clock.sleep(at - now).await;
        }
        let now_counts: Vec<(u64, u64)> = tallies
            .iter()
            .map(|t| {
                (
                    t.admitted.load(Ordering::Relaxed),
                    t.denied.load(Ordering::Relaxed),
                )
            })
            .collect();
        let deltas: Vec<(u64, u64)> = now_counts
            .iter()
            .zip(&last)
            .map(|(n, l)| (n.0 - l.0, n.1 - l.1))
            .collect();
        let admitted: u64 = deltas.iter().map(|d| d.0).sum();
        for (i, node) in NODES.iter().enumerate() {
            let share = match admitted {
                0 => "-".to_owned(),
                total => format!("{}%", (deltas[i].0 * 100 + total / 2) / total),
            };
            writeln!(
                out,
                "{:>4}  {:<8} {:>9} {:>8} {:>6} {:>4}/{}",
                if i == 0 {
                    second.to_string()
                } else {
                    String::new()
                },
                node,
                deltas[i].0,
                deltas[i].1,
                share,
                peers(&apps[i]),
                NODES.len() - 1
            )?;
        }
        writeln!(
            out,
            "{:>4}  {:<8} {:>9} {:>8}   (limit {limit} per second)",
            "",
            "cluster",
            admitted,
            deltas.iter().map(|d| d.1).sum::<u64>()
        )?;
        out.flush()?;
        last = now_counts;
    }
    for task in load {
        let _ = task.await;
    }

    let first = tallies
        .iter()
        .map(|t| t.first_sent.load(Ordering::Relaxed))
        .filter(|&t| t > 0)
        .min()
        .unwrap_or(start);
    let last_answer = tallies
        .iter()
        .map(|t| t.last_answered.load(Ordering::Relaxed))
        .max()
        .unwrap_or(end);
    let windows = (last_answer / SECOND).saturating_sub(first / SECOND) + 1;
    let report = DemoReport {
        admitted: std::array::from_fn(|i| tallies[i].admitted.load(Ordering::Relaxed)),
        denied: std::array::from_fn(|i| tallies[i].denied.load(Ordering::Relaxed)),
        errors: tallies
            .iter()
            .map(|t| t.errors.load(Ordering::Relaxed))
            .sum(),
        windows,
        ideal: limit * windows,
    };
    let total = report.total_admitted();
    writeln!(out)?;
    for (i, node) in NODES.iter().enumerate() {
        writeln!(
            out,
            "{node}: offered {}/s, admitted {}, denied {}",
            offered[i], report.admitted[i], report.denied[i]
        )?;
    }
    writeln!(
        out,
        "global admitted: {total} over {windows} windows of 1 s; ideal: {limit} x {windows} = {} ({:.1}% of ideal{})",
        report.ideal,
        total as f64 * 100.0 / report.ideal as f64,
        match report.errors {
            0 => String::new(),
            n => format!(", {n} checks failed"),
        }
    )?;
    let alone = offered.iter().map(|r| r.min(&limit) * windows).sum::<u64>();
    writeln!(
        out,
        "(three nodes each enforcing the limit alone would have admitted up to {alone})"
    )?;
    out.flush()?;
    Ok(report)
}

/// Sends checks to `addr` at `rate` per second, evenly spaced, from `start` until `end`
/// (wall-clock ns), counting the answers in `tally`.
async fn spend(addr: SocketAddr, rate: u64, start: Nanos, end: Nanos, tally: Arc<Tally>) {
    let clock = SystemClock;
    let Ok(mut client) = Client::connect_addr(addr).await else {
        tally.errors.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let body = serde_json::json!({"rule": RULE, "key": KEY});
    let gap = SECOND / rate;
    let mut next = start;
    while next < end {
        let now = clock.now();
        if next > now {
            clock.sleep(next - now).await;
        }
        let sent = clock.now();
        let _ = tally
            .first_sent
            .compare_exchange(0, sent, Ordering::Relaxed, Ordering::Relaxed);
        let _ = tally.first_sent.fetch_min(sent, Ordering::Relaxed);
        match client
            .post("/v1/check", &body)
            .await
            .map(|r| r.status.as_u16())
        {
            Ok(200) => tally.admitted.fetch_add(1, Ordering::Relaxed),
            Ok(429) => tally.denied.fetch_add(1, Ordering::Relaxed),
            _ => tally.errors.fetch_add(1, Ordering::Relaxed),
        };
        tally
            .last_answered
            .fetch_max(clock.now(), Ordering::Relaxed);
        next += gap;
    }
}
