//! An idle cluster of the real binary on loopback stays idle: once its nodes have joined and
//! `ready_timeout` has passed, no node spends more than a sliver of a core with no checks
//! coming in. (Until 2026-12-04 a mesh node given seeds woke its membership task on every
//! pass once `ready_timeout` was behind it, and spun a whole core for as long as it ran.)
//!
//! CPU time is read from `/proc/<pid>/stat` (Linux; the test skips elsewhere). The bound is
//! far from both sides: a healthy idle node uses about 1% of a core here, a spinning one all
//! the core it can get (at least half a core even on a loaded two-core machine).
//!
//! Every process is killed by a guard, every wait is bounded in count and time.

use std::net::{Ipv4Addr, SocketAddr};
use std::process::Child;
use std::time::Duration;

use gossamer_client::raw::Client;

const BIN: &str = env!("CARGO_BIN_EXE_gossamer");

#[path = "support/loopback.rs"]
mod loopback;
use loopback::{Nodes, free_tcp, free_udp, serve};

/// User plus system CPU time of process `pid`, in clock ticks (`None` without `/proc`).
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces:
    // state is field 3, utime field 14, stime field 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

async fn get_json(addr: SocketAddr, path: &str) -> Option<serde_json::Value> {
    let mut c = Client::connect_addr(addr).await.ok()?;
    Some(c.get(path).await.ok()?.json())
}

/// Starts two nodes of `exchange` (the second seeded with the first, which seeds itself),
/// waits until both are ready and see each other, lets `ready_timeout` pass, and returns
/// the CPU ticks each spent over the next two seconds with no checks.
async fn idle_ticks(exchange: &str) -> Option<Vec<u64>> {
    cpu_ticks(std::process::id())?;
    let dir = std::env::temp_dir().join(format!("gossamer-idle-{exchange}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut nodes = Nodes(Vec::new(), dir.clone());
    let cfg = dir.join("rules.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[rule]]\nname = \"api\"\nalgorithm = \"fixed_window\"\nlimit = 100\nperiod = \"10s\"\n\n\
             [cluster]\nquic = \"127.0.0.1:0\"\nready_timeout = \"300ms\"\nexchange = \"{exchange}\"\n"
        ),
    )
    .expect("write config");
    let gossip: Vec<u16> = (0..2).map(|_| free_udp()).collect();
    let http: Vec<SocketAddr> = (0..2)
        .map(|_| SocketAddr::from((Ipv4Addr::LOCALHOST, free_tcp())))
        .collect();
    for i in 0..2 {
        let node = format!("node-{}", i + 1);
        let child = serve(BIN, &dir, &cfg, &node, http[i], gossip[i], gossip[0]);
        nodes.0.push(child);
    }
    for addr in &http {
        let mut formed = false;
        for _ in 0..200 {
            formed = get_json(*addr, "/v1/cluster").await.is_some_and(|v| {
                v["ready"] == true
                    && v["members"]
                        .as_array()
                        .is_some_and(|m| m.iter().filter(|m| m["alive"] == true).count() == 2)
            });
            if formed {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(formed, "{exchange}: {addr} ready with both members alive");
    }
    // Well past `ready_timeout` (300 ms from each node's start).
    tokio::time::sleep(Duration::from_millis(700)).await;
    let pids: Vec<u32> = nodes.0.iter().map(Child::id).collect();
    let before: Vec<u64> = pids.iter().map(|&p| cpu_ticks(p).expect("stat")).collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after: Vec<u64> = pids.iter().map(|&p| cpu_ticks(p).expect("stat")).collect();
    for child in &mut nodes.0 {
        assert!(
            child.try_wait().expect("wait").is_none(),
            "{exchange}: a node exited"
        );
    }
    Some(after.iter().zip(&before).map(|(a, b)| a - b).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_cluster_spends_almost_no_cpu() {
    // Clock ticks per second: 100 on Linux as built (USER_HZ).
    const HZ: u64 = 100;
    let outcome = tokio::time::timeout(Duration::from_secs(60), async {
        for exchange in ["mesh", "tree"] {
            let Some(ticks) = idle_ticks(exchange).await else {
                eprintln!("skipped: no /proc to read CPU time from");
                return;
            };
            eprintln!("{exchange}: CPU ticks over 2 s idle per node: {ticks:?} (of {HZ}/s)");
            for (i, t) in ticks.iter().enumerate() {
                // Half a second of CPU in two seconds: a quarter of a core.
                assert!(
                    *t < HZ / 2,
                    "{exchange}: node-{} spent {t} ticks ({:.2} s) of CPU in 2 s with no load",
                    i + 1,
                    *t as f64 / HZ as f64
                );
            }
        }
    })
    .await;
    assert!(outcome.is_ok(), "the test took over 60 s");
}
