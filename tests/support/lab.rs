//! The namespace lab shared by `tests/netns.rs` and `tests/chaos.rs` (each includes it with
//! `#[path = "support/lab.rs"] mod lab;`; every integration test file is its own crate, so an
//! item one of them does not use is not an error).
//!
//! Every node is the real `gossamer` binary in its own network namespace, and the network
//! between them is Linux's (veths on a bridge, links cut with `ip link`, one-way cuts and
//! packet loss made with nftables inside the namespaces).
//!
//! Layout of one lab (one test): two bridges in the root namespace, each with an address so
//! this process reaches the nodes directly.
//!
//! - the *data* bridge, `10.213.<x>.0/24`: gossip (UDP) and QUIC between the nodes. Faults are
//!   made here only.
//! - the *management* bridge, `10.214.<x>.0/24`: the HTTP API, which the test drives. It
//!   stays up during a fault, so a cut-off node keeps receiving load and has to hold its
//!   share, as a real node would.
//!
//! Node i has the addresses `.10 + i` on both (up to [`MAX_NODES`]). `<x>` comes from the
//! test's pid and a counter, and is skipped if a route for it exists. Names are
//! `gs<kind><pid in base 36>x<n>...` (at most 15 characters). A [`Lab`] can leave nodes
//! unstarted (a node that joins later), stop and continue them (SIGSTOP, SIGCONT), stop them
//! gracefully (SIGTERM) or kill them (SIGKILL), and load nftables tables into their
//! namespaces. Its `Drop` kills every process it started (SIGKILL, which also ends a stopped
//! one) and anything else left in its namespaces, then deletes its nftables tables, its
//! namespaces, veths and bridges, even when the test panics or times out.
//!
//! Needs root, `ip` (iproute2) and `nft` (nftables); without them each test says why and
//! passes. The scenarios run one at a time (a process-wide lock), so their figures are not
//! disturbed by each other on a small machine.
//!
//! Window totals are counted by the window each node reported (`reset_after_ms` added to the
//! answer time, rounded to a window edge): the nodes share this machine's clock, so there is
//! no skew to allow for.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::future::Future;
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use gossamer_client::raw::Client;
use serde_json::Value;
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout};

pub const BIN: &str = env!("CARGO_BIN_EXE_gossamer");

/// The binary the nodes run: [`BIN`] (the test build), or `LAB_BIN` to run the scenarios on
/// another build (`LAB_BIN=target/release/gossamer`, to see what a release node does).
pub fn binary() -> String {
    std::env::var("LAB_BIN").unwrap_or_else(|_| BIN.to_owned())
}
pub const HTTP_PORT: u16 = 7070;
pub const GOSSIP_PORT: u16 = 7946;
/// Nodes one lab can hold: addresses `.10` to `.10 + MAX_NODES - 1`, and names within the
/// 15 characters of an interface name.
pub const MAX_NODES: usize = 10;
/// One scenario at a time.
pub static SERIAL: Mutex<()> = Mutex::new(());
/// Makes names unique within this process.
pub static NEXT_LAB: AtomicU32 = AtomicU32::new(0);

use crate::env::GOSSAMER_ENV;

/// The rules every lab serves (unless made with [`Lab::with_config`]). `w` is the windowed
/// rule whose per-window total is measured, `long` a tracer whose window outlives the test (its
/// `remaining` is compared across nodes), `bucket` a token bucket of 100/s, burst 100.
pub const RULES: &str = r#"
[[rule]]
name = "w"
algorithm = "fixed_window"
limit = 300
period = "3s"

[[rule]]
name = "long"
algorithm = "fixed_window"
limit = 1000000
period = "1d"

[[rule]]
name = "bucket"
algorithm = "token_bucket"
limit = 100
period = "1s"
burst = 100
"#;
pub const W_LIMIT: u64 = 300;
pub const W_PERIOD: Duration = Duration::from_secs(3);
pub const LONG_LIMIT: u64 = 1_000_000;
pub const LONG_PERIOD: Duration = Duration::from_secs(86_400);
pub const BUCKET_RATE: f64 = 100.0;
pub const BUCKET_BURST: f64 = 100.0;

// ---------------------------------------------------------------------------------------------
// Environment

/// Why these tests cannot run here, if they cannot.
pub fn unavailable() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let euid = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2));
    if euid != Some("0") {
        return Some(format!(
            "not root (effective uid {})",
            euid.unwrap_or("unknown")
        ));
    }
    for (cmd, arg) in [("ip", "-V"), ("nft", "--version")] {
        let ok = Command::new(cmd)
            .arg(arg)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            return Some(format!(
                "`{cmd}` is missing (install iproute2 and nftables)"
            ));
        }
    }
    None
}

/// Runs a command that must succeed; panics with its output if it does not.
pub fn sh(args: &[&str]) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// Runs a command whose failure does not matter (cleanup); returns its stdout.
pub fn sh_quiet(args: &[&str]) -> String {
    Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// Wall-clock milliseconds for an `Instant`, from one reading of the system clock. The nodes
/// run on this machine's kernel and read the same clock, so their window edges are these.
#[derive(Debug, Clone, Copy)]
pub struct Wall {
    pub at: Instant,
    pub unix_ms: f64,
}

impl Wall {
    #[allow(clippy::disallowed_methods)] // the test's one reading of the wall clock
    pub fn now() -> Wall {
        let at = Instant::now();
        let unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("the clock is after 1970");
        Wall {
            at,
            unix_ms: unix.as_secs_f64() * 1e3,
        }
    }

    pub fn ms(&self, t: Instant) -> f64 {
        if t >= self.at {
            self.unix_ms + (t - self.at).as_secs_f64() * 1e3
        } else {
            self.unix_ms - (self.at - t).as_secs_f64() * 1e3
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The lab: namespaces, bridges, nodes

#[derive(Debug)]
pub struct NodeProc {
    pub id: String,
    pub ns: String,
    pub data_veth: String,
    pub data_ip: Ipv4Addr,
    pub mgmt_ip: Ipv4Addr,
    pub log: PathBuf,
    /// Its own copy of the lab's config file, which [`Lab::set_config`] rewrites.
    pub config: PathBuf,
    pub child: Option<Child>,
}

impl NodeProc {
    pub fn http(&self) -> SocketAddr {
        (self.mgmt_ip, HTTP_PORT).into()
    }

    pub fn gossip(&self) -> SocketAddr {
        (self.data_ip, GOSSIP_PORT).into()
    }
}

/// Everything one test created; `Drop` removes it all.
#[derive(Debug)]
pub struct Lab {
    pub name: String,
    pub dir: PathBuf,
    pub config: PathBuf,
    pub bridges: Vec<String>,
    pub namespaces: Vec<String>,
    pub host_links: Vec<String>,
    pub nft_tables: Vec<String>,
    pub nodes: Vec<NodeProc>,
    pub wall: Wall,
    pub done: bool,
}

/// A free third octet for 10.213.x.0/24 and 10.214.x.0/24: derived from the pid and `n`,
/// skipping any already routed on this machine.
pub fn subnet(n: u32) -> u8 {
    let routes = sh_quiet(&["ip", "-4", "route", "show"]);
    let start = (std::process::id().wrapping_mul(7) + n * 13) % 250;
    for i in 0..250 {
        let x = (start + i) % 250 + 2;
        let used =
            routes.contains(&format!("10.213.{x}.")) || routes.contains(&format!("10.214.{x}."));
        if !used {
            return x as u8;
        }
    }
    panic!("no free 10.213.x.0/24 subnet");
}

/// `n` in base 36: a pid (≤ 4,194,304) in at most 5 characters.
pub fn base36(mut n: u32) -> String {
    let digits = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(digits[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).expect("ASCII")
}

impl Lab {
    /// Builds the network for `n` nodes and starts them, each seeded with all the others.
    pub fn new(name: &str, n: usize) -> Lab {
        Lab::with_started(name, n, n)
    }

    /// Builds the network for `n` nodes and starts the first `started` of them, each seeded
    /// with all the others (started or not, as a DaemonSet's nodes list every address); the
    /// rest can be started later with [`Lab::start`].
    pub fn with_started(name: &str, n: usize, started: usize) -> Lab {
        Lab::with_config(name, n, started, RULES)
    }

    /// As [`Lab::with_started`], serving the configuration `config` (a whole `gossamer.toml`:
    /// rules, and a `[cluster]` table if wanted; the addresses and seeds come from the
    /// command line as for [`RULES`]) instead of [`RULES`].
    pub fn with_config(name: &str, n: usize, started: usize, config: &str) -> Lab {
        assert!(
            (1..=MAX_NODES).contains(&n) && started <= n,
            "a lab has 1 to {MAX_NODES} nodes (asked: {n}, {started} started)"
        );
        let k = NEXT_LAB.fetch_add(1, Ordering::Relaxed);
        let tag = format!("{}x{k}", base36(std::process::id()));
        let dir = std::env::temp_dir().join(format!("gossamer-netns-{tag}"));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let config_path = dir.join("gossamer.toml");
        std::fs::write(&config_path, config).expect("config is written");
        let mut lab = Lab {
            name: name.to_owned(),
            dir,
            config: config_path,
            bridges: Vec::new(),
            namespaces: Vec::new(),
            host_links: Vec::new(),
            nft_tables: Vec::new(),
            nodes: Vec::new(),
            wall: Wall::now(),
            done: false,
        };
        let x = subnet(k);
        let name_of = |kind: &str, rest: &str| {
            let s = format!("gs{kind}{tag}{rest}");
            assert!(s.len() <= 15, "interface name {s} is too long");
            s
        };
        let data_br = name_of("d", "");
        let mgmt_br = name_of("m", "");
        for (br, net) in [(&data_br, 213), (&mgmt_br, 214)] {
            sh(&["ip", "link", "add", br, "type", "bridge"]);
            lab.bridges.push(br.clone());
            sh(&[
                "ip",
                "addr",
                "add",
                &format!("10.{net}.{x}.1/24"),
                "dev",
                br,
            ]);
            sh(&["ip", "link", "set", br, "up"]);
        }
        for i in 0..n {
            let ns = format!("gsn{tag}n{i}");
            sh(&["ip", "netns", "add", &ns]);
            lab.namespaces.push(ns.clone());
            sh(&["ip", "-n", &ns, "link", "set", "lo", "up"]);
            let data_ip = Ipv4Addr::new(10, 213, x, 10 + i as u8);
            let mgmt_ip = Ipv4Addr::new(10, 214, x, 10 + i as u8);
            let mut data_veth = String::new();
            for (kind, br, ip, inner) in [
                ("d", &data_br, data_ip, "data0"),
                ("m", &mgmt_br, mgmt_ip, "mgmt0"),
            ] {
                let host = name_of(kind, &format!("n{i}"));
                let peer = name_of(&format!("p{kind}"), &format!("n{i}"));
                sh(&[
                    "ip", "link", "add", &host, "type", "veth", "peer", "name", &peer,
                ]);
                lab.host_links.push(host.clone());
                sh(&["ip", "link", "set", &peer, "netns", &ns]);
                sh(&["ip", "-n", &ns, "link", "set", &peer, "name", inner]);
                sh(&["ip", "link", "set", &host, "master", br]);
                sh(&["ip", "link", "set", &host, "up"]);
                sh(&[
                    "ip",
                    "-n",
                    &ns,
                    "addr",
                    "add",
                    &format!("{ip}/24"),
                    "dev",
                    inner,
                ]);
                sh(&["ip", "-n", &ns, "link", "set", inner, "up"]);
                if kind == "d" {
                    data_veth = host;
                }
            }
            lab.nodes.push(NodeProc {
                id: format!("node-{i}"),
                ns,
                data_veth,
                data_ip,
                mgmt_ip,
                log: lab.dir.join(format!("node-{i}.log")),
                config: {
                    let path = lab.dir.join(format!("node-{i}.toml"));
                    std::fs::write(&path, config).expect("a node's config is written");
                    path
                },
                child: None,
            });
        }
        for i in 0..started {
            lab.start(i);
        }
        eprintln!(
            "[{name}] lab {tag}: {n} nodes ({started} started) on 10.213.{x}.0/24 (data) and 10.214.{x}.0/24 (HTTP), logs in {}",
            lab.dir.display()
        );
        lab
    }

    /// Starts (or restarts) node `i` with the same id, seeded with every other node.
    pub fn start(&mut self, i: usize) {
        let seeds: Vec<String> = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, n)| n.gossip().to_string())
            .collect();
        let node = &self.nodes[i];
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log)
            .expect("log file");
        writeln!(log, "===== start {} =====", node.id).expect("log write");
        let err = log.try_clone().expect("log clone");
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &node.ns, &binary(), "serve", "--config"])
            .arg(&node.config)
            .args(["--node-id", &node.id])
            .args(["--http", &node.http().to_string()])
            .args(["--gossip", &node.gossip().to_string()])
            .args(["--seeds", &seeds.join(",")]);
        // A lab's nodes keep the runner's RUST_LOG, to debug a scenario.
        for var in GOSSAMER_ENV.into_iter().filter(|v| *v != "RUST_LOG") {
            command.env_remove(var);
        }
        let log_filter = std::env::var("RUST_LOG").unwrap_or_else(|_| "info".to_owned());
        command
            .env("RUST_LOG", log_filter)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err);
        // `ip netns exec` execs the binary, so this child is the node itself.
        let child = command.spawn().expect("ip netns exec starts");
        self.nodes[i].child = Some(child);
    }

    /// Replaces node `i`'s config file with `text` (written beside it, then renamed over it, so
    /// the node never reads half a file); the node reloads it within a second, or at once on
    /// SIGHUP ([`Lab::signal`]).
    pub fn set_config(&self, i: usize, text: &str) {
        let path = &self.nodes[i].config;
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).expect("config is written");
        std::fs::rename(&tmp, path).expect("config is renamed into place");
    }

    /// SIGKILL for node `i`.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends `signal` (a name `kill -s` takes: `STOP`, `CONT`, `TERM`) to node `i`'s process.
    pub fn signal(&self, i: usize, signal: &str) {
        let child = self.nodes[i]
            .child
            .as_ref()
            .unwrap_or_else(|| panic!("node-{i} is not running"));
        sh(&["kill", "-s", signal, &child.id().to_string()]);
    }

    /// SIGSTOP for node `i`: the process stays, its sockets keep receiving (into their
    /// buffers), and it does nothing until [`Lab::resume`].
    pub fn pause(&self, i: usize) {
        self.signal(i, "STOP");
    }

    /// SIGCONT for node `i`.
    pub fn resume(&self, i: usize) {
        self.signal(i, "CONT");
    }

    /// SIGTERM for node `i` (it leaves the cluster, then drains its connections), and waits
    /// for it to exit, at most `within`; after that, SIGKILL. Returns how long the exit took,
    /// or `None` if it had to be killed.
    pub async fn terminate(&mut self, i: usize, within: Duration) -> Option<Duration> {
        let asked = Instant::now();
        self.signal(i, "TERM");
        let step = Duration::from_millis(10);
        let mut child = self.nodes[i]
            .child
            .take()
            .expect("running: checked by signal");
        for _ in 0..(within.as_millis() / step.as_millis()).max(1) {
            match child.try_wait() {
                Ok(Some(_)) => return Some(asked.elapsed()),
                Ok(None) => sleep(step).await,
                Err(_) => break,
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    /// Whether node `i` has a process (started and not killed or terminated since).
    pub fn running(&self, i: usize) -> bool {
        self.nodes[i].child.is_some()
    }

    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.nodes.iter().map(NodeProc::http).collect()
    }

    pub fn ids(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.id.clone()).collect()
    }

    /// Loads an nftables ruleset into node `i`'s namespace (a table of its own, named in
    /// `table`, so cleanup can delete it).
    pub fn nft(&mut self, i: usize, table: &str, ruleset: &str) {
        let file = self.dir.join(format!("{table}-{i}.nft"));
        std::fs::write(&file, ruleset).expect("nft file");
        let ns = self.nodes[i].ns.clone();
        sh(&[
            "ip",
            "netns",
            "exec",
            &ns,
            "nft",
            "-f",
            file.to_str().expect("utf-8"),
        ]);
        self.nft_tables.push(format!("{ns} {table}"));
    }

    pub fn nft_delete(&mut self, i: usize, table: &str) {
        let ns = self.nodes[i].ns.clone();
        sh(&[
            "ip", "netns", "exec", &ns, "nft", "delete", "table", "inet", table,
        ]);
        self.nft_tables.retain(|t| *t != format!("{ns} {table}"));
    }

    pub fn link(&self, i: usize, up: bool) {
        let state = if up { "up" } else { "down" };
        sh(&["ip", "link", "set", &self.nodes[i].data_veth, state]);
    }

    /// Panics if a node's process exited (a crash, or a signal from outside the test).
    pub fn assert_running(&mut self) {
        for node in &mut self.nodes {
            if let Some(child) = &mut node.child
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!("{} exited on its own with {status}", node.id);
            }
        }
    }

    /// Marks the scenario complete: `Drop` then keeps quiet and removes the logs.
    pub fn finish(mut self) {
        self.assert_running();
        self.done = true;
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        // Anything else still running inside our namespaces (only those).
        for ns in &self.namespaces {
            for pid in sh_quiet(&["ip", "netns", "pids", ns]).split_whitespace() {
                let _ = sh_quiet(&["kill", "-9", pid]);
            }
        }
        for entry in &self.nft_tables {
            if let Some((ns, table)) = entry.split_once(' ') {
                let _ = sh_quiet(&[
                    "ip", "netns", "exec", ns, "nft", "delete", "table", "inet", table,
                ]);
            }
        }
        for ns in &self.namespaces {
            let _ = sh_quiet(&["ip", "netns", "del", ns]);
        }
        for link in self.host_links.iter().chain(&self.bridges) {
            let _ = sh_quiet(&["ip", "link", "del", link]);
        }
        if self.done && std::env::var_os("LAB_KEEP_LOGS").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else if self.done {
            eprintln!(
                "[{}] node logs kept in {} (LAB_KEEP_LOGS)",
                self.name,
                self.dir.display()
            );
        } else {
            eprintln!(
                "[{}] FAILED or timed out; node logs kept in {}",
                self.name,
                self.dir.display()
            );
            for node in &self.nodes {
                eprintln!("----- last lines of {} -----", node.log.display());
                eprintln!("{}", tail(&node.log, 40));
            }
        }
    }
}

pub fn tail(path: &Path, lines: usize) -> String {
    let mut text = String::new();
    if let Ok(mut f) = File::open(path) {
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = f.seek(SeekFrom::Start(len.saturating_sub(16_000)));
        let _ = f.read_to_string(&mut text);
    }
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Runs one scenario: skips without root/ip/nft, one at a time, bounded by `limit` overall.
/// The lab is owned by the scenario's future, so a timeout drops (and cleans) it.
pub fn scenario<F, Fut>(name: &str, nodes: usize, limit: Duration, body: F)
where
    F: FnOnce(Lab) -> Fut,
    Fut: Future<Output = ()>,
{
    scenario_started(name, nodes, nodes, limit, body);
}

/// As [`scenario`], with only the first `running` of the `nodes` started at the start.
pub fn scenario_started<F, Fut>(name: &str, nodes: usize, running: usize, limit: Duration, body: F)
where
    F: FnOnce(Lab) -> Fut,
    Fut: Future<Output = ()>,
{
    scenario_config(name, nodes, running, RULES, limit, body);
}

/// As [`scenario_started`], the nodes serving `config` (see [`Lab::with_config`]).
pub fn scenario_config<F, Fut>(
    name: &str,
    nodes: usize,
    running: usize,
    config: &str,
    limit: Duration,
    body: F,
) where
    F: FnOnce(Lab) -> Fut,
    Fut: Future<Output = ()>,
{
    if let Some(why) = unavailable() {
        eprintln!("[{name}] skipped: {why}");
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let started = Instant::now();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let lab = Lab::with_config(name, nodes, running, config);
    runtime.block_on(async {
        if timeout(limit, body(lab)).await.is_err() {
            panic!("[{name}] did not finish within {limit:?}");
        }
    });
    drop(runtime);
    eprintln!(
        "[{name}] passed in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

// ---------------------------------------------------------------------------------------------
// HTTP

/// One request on a fresh connection, bounded by 2 s. `None`: no answer.
pub async fn request(addr: SocketAddr, path: &str, body: Option<&Value>) -> Option<(u16, Value)> {
    let go = async {
        let mut client = Client::connect_addr(addr).await.ok()?;
        let reply = match body {
            Some(b) => client.post(path, b).await.ok()?,
            None => client.get(path).await.ok()?,
        };
        Some((reply.status.as_u16(), reply.json()))
    };
    timeout(Duration::from_secs(2), go).await.ok().flatten()
}

pub async fn metrics(addr: SocketAddr) -> String {
    let go = async {
        let mut client = Client::connect_addr(addr).await.ok()?;
        let reply = client.get("/metrics").await.ok()?;
        Some(String::from_utf8_lossy(&reply.body).into_owned())
    };
    timeout(Duration::from_secs(2), go)
        .await
        .ok()
        .flatten()
        .unwrap_or_default()
}

pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l[name.len()..].trim().parse().ok())
}

/// Prints every node's consistent/degraded round counts; returns the degraded ones.
pub async fn print_rounds(tag: &str, lab: &Lab) -> Vec<u64> {
    let mut degraded = Vec::new();
    let mut parts = Vec::new();
    for (i, addr) in lab.addrs().into_iter().enumerate() {
        let text = metrics(addr).await;
        let c =
            metric(&text, "gossamer_cluster_rounds_total{state=\"consistent\"}").unwrap_or(-1.0);
        let d = metric(&text, "gossamer_cluster_rounds_total{state=\"degraded\"}").unwrap_or(-1.0);
        degraded.push(d.max(0.0) as u64);
        parts.push(format!("node-{i} {c}/{d}"));
    }
    eprintln!("[{tag}] rounds consistent/degraded: {}", parts.join(", "));
    degraded
}

/// What keeps `view` (a `/v1/cluster` body) from showing the newest incarnation of every id
/// alive and unsuspected; empty when nothing does.
pub fn view_problems(view: &Value, ids: &[String]) -> Vec<String> {
    let members = view["members"].as_array().cloned().unwrap_or_default();
    let mut out = Vec::new();
    for id in ids {
        let newest = members
            .iter()
            .filter(|m| m["node_id"] == id.as_str())
            .max_by_key(|m| m["generation"].as_u64().unwrap_or(0));
        match newest {
            None => out.push(format!("{id} unknown")),
            Some(m) if m["alive"] != true => out.push(format!("{id} not alive")),
            Some(m) if m["suspected"] != false => out.push(format!("{id} suspected")),
            Some(_) => {}
        }
    }
    out
}

/// Polls until every node sees every member alive and unsuspected and says `/readyz` 200;
/// returns how long it took. Prints what it waited on when that was more than a second.
pub async fn wait_formed(tag: &str, lab: &Lab, within: Duration) -> Duration {
    let all: Vec<usize> = (0..lab.nodes.len()).collect();
    wait_formed_among(tag, lab, &all, within).await
}

/// As [`wait_formed`], for the nodes `members` only (each must see the others; the rest of
/// the lab's nodes are not looked at).
pub async fn wait_formed_among(
    tag: &str,
    lab: &Lab,
    members: &[usize],
    within: Duration,
) -> Duration {
    let start = Instant::now();
    let step = Duration::from_millis(50);
    let ids: Vec<String> = members.iter().map(|&i| lab.nodes[i].id.clone()).collect();
    let mut waited_on: BTreeMap<String, Duration> = BTreeMap::new();
    let mut last = Vec::new();
    for _ in 0..(within.as_millis() / step.as_millis()) {
        last.clear();
        for &i in members {
            let addr = lab.nodes[i].http();
            let problems = match request(addr, "/v1/cluster", None).await {
                Some((200, v)) => view_problems(&v, &ids),
                other => vec![format!("no /v1/cluster ({other:?})")],
            };
            last.extend(problems.into_iter().map(|p| format!("node-{i} sees {p}")));
            let ready = request(addr, "/readyz", None).await;
            if ready.is_none_or(|(s, _)| s != 200) {
                last.push(format!("node-{i} not ready"));
            }
        }
        for p in &last {
            waited_on.insert(p.clone(), start.elapsed());
        }
        if last.is_empty() {
            let took = start.elapsed();
            eprintln!(
                "[{tag}] cluster formed: every node sees {} members alive and is ready after {} ms",
                ids.len(),
                took.as_millis()
            );
            if took > Duration::from_secs(1) {
                let until: Vec<String> = waited_on
                    .iter()
                    .map(|(p, t)| format!("{p} (until {} ms)", t.as_millis()))
                    .collect();
                eprintln!("[{tag}]   waited on: {}", until.join("; "));
            }
            return took;
        }
        sleep(step).await;
    }
    panic!("[{tag}] cluster did not form within {within:?}: {last:?}");
}

/// Reads `remaining` for (rule, key) on every node; `None` for a node that does not answer.
pub async fn remaining_everywhere(lab: &Lab, rule: &str, key: &str) -> Vec<Option<u64>> {
    let mut out = Vec::new();
    for addr in lab.addrs() {
        let path = format!("/v1/status?rule={rule}&key={key}");
        out.push(
            request(addr, &path, None)
                .await
                .filter(|(s, _)| *s == 200)
                .and_then(|(_, v)| v["remaining"].as_u64()),
        );
    }
    out
}

/// Polls until every node has reported the same, unchanged `remaining` for (rule, key) for
/// [`AGREE_STABLE`]; returns when that run of agreement began (from the call) and the value.
///
/// A shorter run is not enough: while suspicions clear after a heal, each side may still
/// miss the other's latest counts, and with symmetric load the stale sums can come out equal
/// (seen once: 633 on every node, 724 admitted, until the next anti-entropy round).
pub async fn wait_agree(
    tag: &str,
    lab: &Lab,
    rule: &str,
    key: &str,
    within: Duration,
) -> (Duration, u64) {
    let start = Instant::now();
    let step = Duration::from_millis(50);
    let mut run: Option<(Duration, Vec<Option<u64>>)> = None;
    let mut last = Vec::new();
    for _ in 0..((within + AGREE_STABLE).as_millis() / step.as_millis()) {
        let now = remaining_everywhere(lab, rule, key).await;
        let equal = now.iter().all(|r| r.is_some() && *r == now[0]);
        if !equal {
            run = None;
        } else if run.as_ref().is_none_or(|(_, seen)| *seen != now) {
            run = Some((start.elapsed(), now.clone()));
        } else if let Some((at, _)) = &run
            && start.elapsed() - *at >= AGREE_STABLE
        {
            let value = now[0].expect("checked");
            eprintln!(
                "[{tag}] all nodes agree on remaining = {value} for {rule}/{key} after {} ms",
                at.as_millis()
            );
            return (*at, value);
        }
        last = now;
        sleep(step).await;
    }
    panic!("[{tag}] nodes did not agree on {rule}/{key} within {within:?}: last {last:?}");
}

/// How long [`wait_agree`] wants every node to report the same value: longer than an
/// anti-entropy period (10 rounds of 100 ms), which repairs any count a frame missed.
pub const AGREE_STABLE: Duration = Duration::from_millis(1200);

// ---------------------------------------------------------------------------------------------
// Load

/// One answered check.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub node: usize,
    pub sent: Instant,
    pub answered: Instant,
    pub allowed: bool,
    pub reset_after_ms: u64,
}

/// Tasks checking one (rule, key) at a fixed rate until stopped.
pub struct Load {
    rule: String,
    stop: Arc<AtomicBool>,
    started: Instant,
    tasks: Vec<JoinHandle<LoadTask>>,
}

/// What one load task returns: its samples, its failures, its unanswered requests.
type LoadTask = (Vec<Sample>, u64, Vec<(usize, Instant)>);

/// What a load did.
pub struct Loaded {
    pub samples: Vec<Sample>,
    /// Requests without an answer (node down, timeout), and connections refused.
    pub failures: u64,
    /// Of those, the requests that were sent and got no answer: (node, when sent). The node
    /// may have admitted them (one stopped with SIGSTOP answers them when it resumes, after
    /// the client gave up), so the cluster may count them though the test never saw them.
    pub unanswered: Vec<(usize, Instant)>,
    pub started: Instant,
    pub stopped: Instant,
}

impl Loaded {
    pub fn admitted(&self) -> u64 {
        self.samples.iter().filter(|s| s.allowed).count() as u64
    }
}

impl Load {
    /// `rate` checks per second in total, spread over `per_node` tasks for each of `nodes`.
    pub fn start(addrs: &[SocketAddr], rule: &str, key: &str, rate: f64, per_node: usize) -> Load {
        Load::start_phased(addrs, rule, key, rate, per_node, true)
    }

    /// As [`Load::start`]; with `spread` false every task ticks at the same moments.
    pub fn start_phased(
        addrs: &[SocketAddr],
        rule: &str,
        key: &str,
        rate: f64,
        per_node: usize,
        spread: bool,
    ) -> Load {
        let nodes: Vec<(usize, SocketAddr)> = addrs.iter().copied().enumerate().collect();
        Load::start_on(&nodes, rule, key, rate, per_node, spread)
    }

    /// As [`Load::start_phased`], on the given (node index, address) pairs: the samples name
    /// those indices (a load on a subset of a lab's nodes keeps their numbers).
    pub fn start_on(
        nodes: &[(usize, SocketAddr)],
        rule: &str,
        key: &str,
        rate: f64,
        per_node: usize,
        spread: bool,
    ) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let count = nodes.len() * per_node;
        let period = Duration::from_secs_f64(count as f64 / rate);
        let mut tasks = Vec::new();
        for (t, addr) in (0..per_node)
            .flat_map(|_| nodes.iter().copied())
            .enumerate()
        {
            let stop = stop.clone();
            let body = serde_json::json!({"rule": rule, "key": key, "cost": 1});
            // Spread the tasks' ticks evenly over one period.
            let offset = if spread {
                period.mul_f64(t as f64 / count as f64)
            } else {
                Duration::ZERO
            };
            tasks.push(tokio::spawn(async move {
                let (node, addr) = addr;
                let mut samples = Vec::new();
                let mut failures = 0;
                let mut unanswered = Vec::new();
                let mut client: Option<Client> = None;
                sleep(offset).await;
                let mut tick = tokio::time::interval(period);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    if client.is_none() {
                        client = timeout(Duration::from_millis(500), Client::connect_addr(addr))
                            .await
                            .ok()
                            .and_then(Result::ok);
                        if client.is_none() {
                            failures += 1;
                            continue;
                        }
                    }
                    let c = client.as_mut().expect("connected");
                    let sent = Instant::now();
                    match timeout(Duration::from_secs(2), c.post("/v1/check", &body)).await {
                        Ok(Ok(reply)) => {
                            let json = reply.json();
                            samples.push(Sample {
                                node,
                                sent,
                                answered: Instant::now(),
                                allowed: reply.status.as_u16() == 200 && json["allowed"] == true,
                                reset_after_ms: json["reset_after_ms"].as_u64().unwrap_or(0),
                            });
                        }
                        _ => {
                            failures += 1;
                            unanswered.push((node, sent));
                            client = None;
                        }
                    }
                }
                (samples, failures, unanswered)
            }));
        }
        Load {
            rule: rule.to_owned(),
            stop,
            started: Instant::now(),
            tasks,
        }
    }

    pub async fn stop(self) -> Loaded {
        self.stop.store(true, Ordering::Relaxed);
        let stopped = Instant::now();
        let mut samples = Vec::new();
        let mut failures = 0;
        let mut unanswered = Vec::new();
        for t in self.tasks {
            let (s, f, u) = t.await.expect("load task");
            samples.extend(s);
            failures += f;
            unanswered.extend(u);
        }
        samples.sort_by_key(|s| s.answered);
        let _ = &self.rule;
        Loaded {
            samples,
            failures,
            unanswered,
            started: self.started,
            stopped,
        }
    }
}

/// Samples every node's `/v1/cluster` every 100 ms and keeps when its list of suspected
/// peers changed.
pub struct Monitor {
    stop: Arc<AtomicBool>,
    task: JoinHandle<Vec<(Instant, usize, Vec<String>)>>,
}

/// What a [`Monitor`] saw: (when, node, suspected peers from then on).
pub struct Seen(pub Vec<(Instant, usize, Vec<String>)>);

impl Monitor {
    pub fn start(addrs: &[SocketAddr]) -> Monitor {
        let stop = Arc::new(AtomicBool::new(false));
        let addrs = addrs.to_vec();
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut last: Vec<Option<Vec<String>>> = vec![None; addrs.len()];
            let mut changes = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                for (i, addr) in addrs.iter().enumerate() {
                    let Some((200, view)) = request(*addr, "/v1/cluster", None).await else {
                        continue;
                    };
                    let mut suspected: Vec<String> = view["members"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter(|m| m["suspected"] == true)
                        .filter_map(|m| m["node_id"].as_str().map(str::to_owned))
                        .collect();
                    suspected.sort();
                    if last[i].as_ref() != Some(&suspected) {
                        changes.push((Instant::now(), i, suspected.clone()));
                        last[i] = Some(suspected);
                    }
                }
                sleep(Duration::from_millis(100)).await;
            }
            changes
        });
        Monitor { stop, task }
    }

    pub async fn stop(self) -> Seen {
        self.stop.store(true, Ordering::Relaxed);
        Seen(self.task.await.expect("monitor task"))
    }
}

impl Seen {
    /// Prints every change after the first reading, in ms relative to `origin`.
    pub fn report(&self, tag: &str, origin: Instant) {
        let mut seen = [false; 16];
        let mut lines = Vec::new();
        for (at, node, suspected) in &self.0 {
            if !std::mem::replace(&mut seen[*node % 16], true) && suspected.is_empty() {
                continue;
            }
            let ms = if *at >= origin {
                (*at - origin).as_millis() as i64
            } else {
                -((origin - *at).as_millis() as i64)
            };
            lines.push(format!("{ms:+} ms node-{node} suspects {suspected:?}"));
        }
        eprintln!(
            "[{tag}] suspicion changes (relative to the cut): {}",
            lines.join("; ")
        );
    }
}

/// Admissions per fixed window of `period` (as the node reported it: the window ending at
/// the answer time + `reset_after_ms`, rounded to the nearest window edge, which is
/// unambiguous while a request takes far less than half a window). Prints every window with
/// its admissions per node and the `events` that fell in it, and asserts none exceeds
/// `limit + slack`. Returns (admitted, answered) for the windows that lie wholly inside the
/// load.
pub fn check_windows(
    tag: &str,
    wall: &Wall,
    loaded: &Loaded,
    period: Duration,
    limit: u64,
    slack: u64,
    events: &[(&str, Instant)],
) -> Vec<(u64, u64)> {
    let w = period.as_millis() as f64;
    let window = |ms: f64| (ms / w).floor() as u64;
    let mut per: BTreeMap<u64, BTreeMap<usize, u64>> = BTreeMap::new();
    let mut answered_in: BTreeMap<u64, u64> = BTreeMap::new();
    for s in &loaded.samples {
        let end = wall.ms(s.answered) + s.reset_after_ms as f64;
        let idx = (end / w).round() as u64 - 1;
        *answered_in.entry(idx).or_default() += 1;
        let nodes = per.entry(idx).or_default();
        if s.allowed {
            *nodes.entry(s.node).or_default() += 1;
        }
    }
    let load_start = wall.ms(loaded.started);
    let load_end = wall.ms(loaded.stopped);
    let mut full = Vec::new();
    let mut lines = Vec::new();
    let mut over = Vec::new();
    for (&idx, nodes) in &per {
        let n: u64 = nodes.values().sum();
        let is_full = idx as f64 * w >= load_start && (idx + 1) as f64 * w <= load_end;
        let split: Vec<String> = nodes.values().map(u64::to_string).collect();
        let answered = answered_in.get(&idx).copied().unwrap_or(0);
        let mut text = format!(
            "{n}{} ({}) of {answered} answered",
            if is_full { "" } else { " partial" },
            split.join("+")
        );
        for (name, at) in events {
            let ms = wall.ms(*at);
            if window(ms) == idx {
                text.push_str(&format!(" [{name} at +{:.0} ms]", ms - idx as f64 * w));
            }
        }
        if is_full {
            full.push((n, answered));
        }
        if n > limit {
            over.push(format!("{n} in window {idx}"));
            text.push_str(" OVER THE LIMIT");
        }
        lines.push(text);
    }
    let answered = loaded.samples.len();
    let elapsed = (loaded.stopped - loaded.started).as_secs_f64();
    eprintln!(
        "[{tag}] {answered} checks answered in {elapsed:.1} s ({:.0}/s, {} without answer); admitted per {} s window (limit {limit}), by node:",
        answered as f64 / elapsed,
        loaded.failures,
        period.as_secs(),
    );
    for line in &lines {
        eprintln!("[{tag}]   {line}");
    }
    if !over.is_empty() {
        eprintln!(
            "[{tag}] over the limit of {limit}: {} (tolerated here: {slack})",
            over.join(", ")
        );
    }
    for (&idx, nodes) in &per {
        let n: u64 = nodes.values().sum();
        assert!(
            n <= limit + slack,
            "[{tag}] window {idx} admitted {n}, over the limit of {limit} (tolerated here: {slack}): {}",
            over.join(", ")
        );
    }
    full
}

/// With `NETNS_TIMELINE` set: per node, admissions per 100 ms from 1 s before `origin` to 4 s
/// after it (a debugging aid).
pub fn timeline(tag: &str, loaded: &Loaded, nodes: usize, origin: Instant) {
    if std::env::var_os("NETNS_TIMELINE").is_none() {
        return;
    }
    let from = origin - Duration::from_secs(1);
    for i in 0..nodes {
        let mut per = [0u32; 50];
        for s in loaded.samples.iter().filter(|s| s.node == i && s.allowed) {
            if s.answered < from {
                continue;
            }
            let b = ((s.answered - from).as_millis() / 100) as usize;
            if let Some(slot) = per.get_mut(b) {
                *slot += 1;
            }
        }
        let line: Vec<String> = per.iter().map(u32::to_string).collect();
        eprintln!(
            "[{tag}] node-{i} admitted per 100 ms from -1 s: {}",
            line.join(" ")
        );
    }
}

/// Admissions per node, as text.
pub fn per_node(loaded: &Loaded, nodes: usize) -> String {
    (0..nodes)
        .map(|i| {
            let a = loaded
                .samples
                .iter()
                .filter(|s| s.node == i && s.allowed)
                .count();
            let t = loaded.samples.iter().filter(|s| s.node == i).count();
            format!("node-{i} {a}/{t}")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// How long until `offset` past the start of the next window of `period`.
pub fn until_window_offset(wall: &Wall, period: Duration, offset: Duration) -> Duration {
    let w = period.as_millis() as f64;
    let now = wall.ms(Instant::now());
    let next = (now / w).floor() * w + w + offset.as_millis() as f64;
    Duration::from_millis((next - now) as u64)
}

/// Makes sure the tracer's day-long window will not end during the test (it ends at 00:00
/// UTC): if it would within `margin`, waits for the next one.
pub async fn away_from_day_edge(lab: &Lab, margin: Duration) {
    let day = LONG_PERIOD.as_millis() as f64;
    let left = day - lab.wall.ms(Instant::now()) % day;
    if left < margin.as_millis() as f64 {
        eprintln!(
            "[{}] waiting {left:.0} ms for the tracer's day window to start",
            lab.name
        );
        sleep(Duration::from_millis(left as u64 + 200)).await;
    }
}

/// Polls `/readyz` on `addr` until it says 200; returns how long that took.
pub async fn wait_ready(addr: SocketAddr, within: Duration) -> Option<Duration> {
    let start = Instant::now();
    let step = Duration::from_millis(20);
    for _ in 0..(within.as_millis() / step.as_millis()) {
        if request(addr, "/readyz", None)
            .await
            .is_some_and(|(s, _)| s == 200)
        {
            return Some(start.elapsed());
        }
        sleep(step).await;
    }
    None
}

/// `remaining` for (rule, key) on one node.
pub async fn remaining_on(addr: SocketAddr, rule: &str, key: &str) -> Option<u64> {
    request(addr, &format!("/v1/status?rule={rule}&key={key}"), None)
        .await
        .filter(|(s, _)| *s == 200)
        .and_then(|(_, v)| v["remaining"].as_u64())
}
