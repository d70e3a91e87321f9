//! What clustering costs: 3 gossamer nodes, each in its own network namespace, under the same
//! paced check load, once clustered (rule `scope = "global"`, gossip + QUIC between them) and
//! once standalone (no `--gossip`: each node counts alone). The difference in the nodes' CPU
//! is what gossip and counter exchange add; the bytes are counted on the nodes' data links.
//!
//! Layout (as `tests/netns.rs`): two bridges in the root namespace. The *data* bridge
//! (10.231.0.0/24) carries gossip (UDP) and QUIC between the nodes, and nothing else, so its
//! veths' counters are the cluster's traffic. The *management* bridge (10.232.0.0/24) carries
//! the HTTP checks from this process. Namespaces, veths and bridges are named `gsb*` and are
//! removed on drop (and by `gossamer-bench cleanup`). Needs root and `ip`.
//!
//! The rule: `fw`, a fixed window of 1,000 per day, so every key checked during the run holds
//! state for the whole run (an active key); at the load's rate no key reaches its limit.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::machine::cpu_seconds;
use crate::procs::Proc;
use crate::targets::{Conn, Key, Target};

const NODES: usize = 3;
const HTTP_PORT: u16 = 7070;
const GOSSIP_PORT: u16 = 7946;
/// Checks per second across the cluster during measurement (a third to each node).
pub const RATE: f64 = 1_500.0;
/// Paced connections per node.
const CONNS_PER_NODE: usize = 4;

const RULES: &str = r#"[[rule]]
name = "fw"
algorithm = "fixed_window"
limit = 1000
period = "1d"
scope = "global"
"#;

/// One run's figures.
#[derive(Debug, Clone)]
pub struct Cost {
    pub keys: usize,
    pub clustered: bool,
    /// Checks per second achieved (offered: [`RATE`]).
    pub rate: f64,
    pub errors: u64,
    /// CPU cores used by the three nodes together (CPU seconds per second).
    pub cores: f64,
    /// Bytes per second each node sent on its data link (mean of the three).
    pub bytes_per_node: f64,
    /// Packets per second each node sent on its data link (mean).
    pub packets_per_node: f64,
    /// Rounds per second that were degraded (not consistent), summed over nodes.
    pub degraded_per_s: f64,
    /// Seconds the pre-fill of every key took.
    pub prefill_secs: f64,
}

fn sh(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{args:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn quiet(args: &[&str]) {
    let _ = Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Why the cluster runs cannot happen here, if they cannot.
pub fn unavailable() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let root = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2))
        == Some("0");
    if !root {
        return Some("not root (network namespaces need it)".into());
    }
    if Command::new("ip")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_or(true, |s| !s.success())
    {
        return Some("`ip` (iproute2) is missing".into());
    }
    None
}

/// Removes every namespace, veth and bridge a run makes (leftovers of a killed run too).
pub fn cleanup() {
    for i in 1..=NODES {
        quiet(&["ip", "netns", "del", &format!("gsb-n{i}")]);
        quiet(&["ip", "link", "del", &format!("gsb-d{i}")]);
        quiet(&["ip", "link", "del", &format!("gsb-m{i}")]);
    }
    quiet(&["ip", "link", "del", "gsb-data"]);
    quiet(&["ip", "link", "del", "gsb-mgmt"]);
}

/// The namespaces and links; removed on drop.
#[derive(Debug)]
pub struct Lab;

impl Lab {
    pub fn new() -> Result<Lab, String> {
        cleanup();
        let lab = Lab;
        for (br, net) in [("gsb-data", "10.231.0"), ("gsb-mgmt", "10.232.0")] {
            sh(&["ip", "link", "add", br, "type", "bridge"])?;
            sh(&["ip", "addr", "add", &format!("{net}.1/24"), "dev", br])?;
            sh(&["ip", "link", "set", br, "up"])?;
        }
        for i in 1..=NODES {
            let ns = format!("gsb-n{i}");
            sh(&["ip", "netns", "add", &ns])?;
            sh(&["ip", "-n", &ns, "link", "set", "lo", "up"])?;
            for (kind, br, net, inner) in [
                ("d", "gsb-data", "10.231.0", "data"),
                ("m", "gsb-mgmt", "10.232.0", "mgmt"),
            ] {
                let host = format!("gsb-{kind}{i}");
                let peer = format!("gsb-{kind}{i}p");
                sh(&[
                    "ip", "link", "add", &host, "type", "veth", "peer", "name", &peer,
                ])?;
                sh(&["ip", "link", "set", &peer, "netns", &ns])?;
                sh(&["ip", "-n", &ns, "link", "set", &peer, "name", inner])?;
                sh(&["ip", "link", "set", &host, "master", br])?;
                sh(&["ip", "link", "set", &host, "up"])?;
                sh(&[
                    "ip",
                    "-n",
                    &ns,
                    "addr",
                    "add",
                    &format!("{net}.{}/24", 10 + i),
                    "dev",
                    inner,
                ])?;
                sh(&["ip", "-n", &ns, "link", "set", inner, "up"])?;
            }
        }
        Ok(lab)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        cleanup();
    }
}

fn http_addr(i: usize) -> SocketAddr {
    SocketAddr::from(([10, 232, 0, 10 + i as u8], HTTP_PORT))
}

fn gossip_addr(i: usize) -> SocketAddr {
    SocketAddr::from(([10, 231, 0, 10 + i as u8], GOSSIP_PORT))
}

/// Bytes and packets node `i` has sent on its data link (the host side receives them).
fn data_sent(i: usize) -> (u64, u64) {
    let read = |what: &str| {
        std::fs::read_to_string(format!("/sys/class/net/gsb-d{i}/statistics/{what}"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    };
    (read("rx_bytes"), read("rx_packets"))
}

/// A plain HTTP/1.1 GET (Connection: close); the body.
fn get(addr: SocketAddr, path: &str) -> Result<String, String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .map_err(|e| format!("{addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| e.to_string())?;
    Ok(out
        .split_once("\r\n\r\n")
        .map_or(out.clone(), |(_, b)| b.to_string()))
}

fn degraded_rounds(addr: SocketAddr) -> f64 {
    get(addr, "/metrics")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("gossamer_cluster_rounds_total{") && !l.contains("consistent"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Starts the nodes; waits until each serves HTTP and (clustered) sees every member alive.
fn start_nodes(bin: &Path, work: &Path, clustered: bool) -> Result<Vec<Proc>, String> {
    let rules = work.join("cluster-rules.toml");
    std::fs::write(&rules, RULES).map_err(|e| e.to_string())?;
    let mut nodes = Vec::new();
    for i in 1..=NODES {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &format!("gsb-n{i}")])
            .arg(bin)
            .arg("serve")
            .arg("--config")
            .arg(&rules)
            .args(["--node-id", &format!("n{i}")])
            .args(["--http", &http_addr(i).to_string()])
            .env_remove("RUST_LOG");
        if clustered {
            cmd.args(["--gossip", &gossip_addr(i).to_string()])
                .args(["--seeds", &gossip_addr(1).to_string()]);
        }
        let log = work.join(format!(
            "node{i}-{}.log",
            if clustered { "clustered" } else { "standalone" }
        ));
        nodes.push(Proc::spawn(&format!("node n{i}"), cmd, &log)?);
    }
    for (i, n) in nodes.iter_mut().enumerate() {
        n.wait_listening(http_addr(i + 1), Duration::from_secs(20))?;
    }
    if clustered {
        let start = Instant::now();
        loop {
            let formed = (1..=NODES).all(|i| {
                get(http_addr(i), "/v1/cluster")
                    .is_ok_and(|b| b.matches("\"alive\":true").count() == NODES)
            });
            let ready = (1..=NODES).all(|i| {
                get(http_addr(i), "/readyz").is_ok_and(|b| b.contains("ready") || b.contains("ok"))
            });
            if formed && ready {
                break;
            }
            if start.elapsed() > Duration::from_secs(30) {
                return Err("the 3-node cluster did not form within 30 s".into());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    // `ip netns exec` execs the binary: these pids are the nodes (checked, as CPU is read
    // from them).
    for n in &nodes {
        let comm = std::fs::read_to_string(format!("/proc/{}/comm", n.pid())).unwrap_or_default();
        if comm.trim() != "gossamer" {
            return Err(format!("pid {} is {comm:?}, not gossamer", n.pid()));
        }
    }
    Ok(nodes)
}

/// Checks every key once, as fast as 16 connections per node go (node i takes every third).
async fn prefill(keys: &Arc<Vec<Key>>) -> Result<(), String> {
    let mut tasks = Vec::new();
    for node in 1..=NODES {
        for c in 0..16 {
            let keys = keys.clone();
            tasks.push(tokio::spawn(async move {
                let target = Target::Gossamer {
                    addr: http_addr(node),
                    rule: "fw",
                };
                let mut conn = Conn::open(&target, 0).await?;
                let mut i = (node - 1) + NODES * c;
                while i < keys.len() {
                    conn.check(&keys[i]).await?;
                    i += NODES * 16;
                }
                Ok::<(), String>(())
            }));
        }
    }
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    Ok(())
}

/// Paced load: [`RATE`] checks per second across the nodes for `secs`; each node's
/// connections walk all keys from a different offset, so every key is checked from every
/// node. Returns (checks, errors).
async fn paced(keys: &Arc<Vec<Key>>, secs: u64) -> Result<(u64, u64), String> {
    let per_conn = RATE / (NODES * CONNS_PER_NODE) as f64;
    let gap = Duration::from_secs_f64(1.0 / per_conn);
    let stop = Instant::now() + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for node in 1..=NODES {
        for c in 0..CONNS_PER_NODE {
            let keys = keys.clone();
            tasks.push(tokio::spawn(async move {
                let target = Target::Gossamer {
                    addr: http_addr(node),
                    rule: "fw",
                };
                let mut conn = Conn::open(&target, 0).await?;
                let n = keys.len();
                let mut i = ((node - 1) * n / NODES + c * n / (NODES * CONNS_PER_NODE)) % n;
                let mut next = Instant::now();
                let (mut checks, mut errors) = (0u64, 0u64);
                while next < stop {
                    tokio::time::sleep_until(next.into()).await;
                    if conn.check(&keys[i]).await.is_err() {
                        errors += 1;
                    }
                    checks += 1;
                    i = (i + 1) % n;
                    next += gap;
                }
                Ok::<(u64, u64), String>((checks, errors))
            }));
        }
    }
    let mut total = (0, 0);
    for t in tasks {
        let (c, e) = t.await.map_err(|e| e.to_string())??;
        total.0 += c;
        total.1 += e;
    }
    Ok(total)
}

/// One run: start the nodes, pre-fill `keys` keys, settle, then measure `secs` of paced load.
pub async fn run(
    bin: &Path,
    work: &Path,
    keys: usize,
    clustered: bool,
    secs: u64,
) -> Result<Cost, String> {
    let mut nodes = start_nodes(bin, work, clustered)?;
    let names = crate::load::keys(&format!("c{}-", u8::from(clustered)), keys);
    let t = Instant::now();
    prefill(&names).await?;
    let prefill_secs = t.elapsed().as_secs_f64();
    // Let the keys' changes pass through a few rounds before measuring.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let cpu0: Vec<f64> = nodes
        .iter()
        .map(|n| cpu_seconds(n.pid()).unwrap_or(0.0))
        .collect();
    let net0: Vec<(u64, u64)> = (1..=NODES).map(data_sent).collect();
    let deg0: f64 = (1..=NODES).map(|i| degraded_rounds(http_addr(i))).sum();
    let t0 = Instant::now();
    let (checks, errors) = paced(&names, secs).await?;
    let el = t0.elapsed().as_secs_f64();
    let cpu1: Vec<f64> = nodes
        .iter()
        .map(|n| cpu_seconds(n.pid()).unwrap_or(0.0))
        .collect();
    let net1: Vec<(u64, u64)> = (1..=NODES).map(data_sent).collect();
    let deg1: f64 = (1..=NODES).map(|i| degraded_rounds(http_addr(i))).sum();
    for n in &mut nodes {
        n.alive()?;
    }
    drop(nodes);
    let cpu: f64 = cpu1.iter().zip(&cpu0).map(|(a, b)| a - b).sum();
    let bytes: u64 = net1.iter().zip(&net0).map(|(a, b)| a.0 - b.0).sum();
    let packets: u64 = net1.iter().zip(&net0).map(|(a, b)| a.1 - b.1).sum();
    Ok(Cost {
        keys,
        clustered,
        rate: checks as f64 / el,
        errors,
        cores: cpu / el,
        bytes_per_node: bytes as f64 / el / NODES as f64,
        packets_per_node: packets as f64 / el / NODES as f64,
        degraded_per_s: (deg1 - deg0) / el,
        prefill_secs,
    })
}
