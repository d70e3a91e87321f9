//! A mutual-TLS cluster of the real binary on loopback, joined over gossip by a node whose
//! certificate comes from another CA. Gossip is unauthenticated, so the stranger shows up as
//! a member; it must never take part in the rounds (it would be charged as an unreachable
//! peer and hold every global limit), and its handshakes must be refused and counted.
//!
//! Every process is killed by a guard, every wait is bounded in count and time.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gossamer_client::raw::Client;

const BIN: &str = env!("CARGO_BIN_EXE_gossamer");

#[path = "support/loopback.rs"]
mod loopback;
use loopback::{Nodes, free_tcp, free_udp, serve};

fn certs(dir: &Path, out: &str, nodes: &str) {
    let status = Command::new(BIN)
        .args(["certs", "--out"])
        .arg(dir.join(out))
        .args(["--nodes", nodes])
        .stdout(Stdio::null())
        .status()
        .expect("gossamer certs runs");
    assert!(status.success());
}

fn config(dir: &Path, node: &str, certs: &str) -> PathBuf {
    let path = dir.join(format!("{node}.toml"));
    let text = format!(
        "[[rule]]\nname = \"api\"\nalgorithm = \"fixed_window\"\nlimit = 100\nperiod = \"30s\"\n\n\
         [cluster]\nquic = \"127.0.0.1:0\"\nready_timeout = \"2s\"\n\n\
         [cluster.tls]\nca = \"{certs}/ca.pem\"\ncert = \"{certs}/{node}.pem\"\nkey = \"{certs}/{node}-key.pem\"\n"
    );
    std::fs::write(&path, text).expect("write config");
    path
}

async fn get_json(addr: SocketAddr, path: &str) -> Option<serde_json::Value> {
    let mut c = Client::connect_addr(addr).await.ok()?;
    Some(c.get(path).await.ok()?.json())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_from_another_ca_never_holds_the_cluster_limit() {
    let outcome = tokio::time::timeout(Duration::from_secs(60), async {
        let dir = std::env::temp_dir().join(format!("gossamer-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let mut nodes = Nodes(Vec::new(), dir.clone());
        certs(&dir, "certs", "node-1,node-2");
        certs(&dir, "rogue", "node-3");
        let gossip: Vec<u16> = (0..3).map(|_| free_udp()).collect();
        let http: Vec<SocketAddr> = (0..3)
            .map(|_| SocketAddr::from((Ipv4Addr::LOCALHOST, free_tcp())))
            .collect();
        for (i, ca) in ["certs", "certs", "rogue"].iter().enumerate() {
            let node = format!("node-{}", i + 1);
            let cfg = config(&dir, &node, ca);
            let child = serve(BIN, &dir, &cfg, &node, http[i], gossip[i], gossip[0]);
            nodes.0.push(child);
        }
        // Gossip makes all three members of node-1's view (bounded wait).
        let started = Instant::now();
        let mut seen = 0;
        for _ in 0..200 {
            if let Some(v) = get_json(http[0], "/v1/cluster").await {
                assert_eq!(v["secure"], serde_json::json!(true));
                seen = v["members"]
                    .as_array()
                    .map_or(0, |m| m.iter().filter(|m| m["alive"] == true).count());
                if seen == 3 {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(seen, 3, "node-1 sees every member over gossip");
        // Wait for node-1 and node-2 to be ready (they pull from each other).
        for addr in &http[..2] {
            for _ in 0..200 {
                let ready = get_json(*addr, "/v1/cluster")
                    .await
                    .is_some_and(|v| v["ready"] == true);
                if ready {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        // Checks spread over two seconds: the stranger must not hold the limit.
        let mut admitted = 0;
        let mut clients = Vec::new();
        for addr in &http[..2] {
            clients.push(Client::connect_addr(*addr).await.expect("connect"));
        }
        for i in 0..80 {
            let c = &mut clients[i % 2];
            let reply = c
                .post(
                    "/v1/check",
                    &serde_json::json!({"rule": "api", "key": "tls-key"}),
                )
                .await
                .expect("check answered");
            if reply.json()["allowed"] == true {
                admitted += 1;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        eprintln!(
            "admitted {admitted} of 80 checks (limit 100 per 30 s) with a stranger in gossip, {:?} after start",
            started.elapsed()
        );
        assert!(admitted >= 72, "admitted only {admitted} of 80");
        let metrics = Client::connect_addr(http[0])
            .await
            .expect("connect")
            .get("/metrics")
            .await
            .expect("metrics");
        let text = String::from_utf8_lossy(&metrics.body).to_string();
        let refused: u64 = text
            .lines()
            .find(|l| l.starts_with("gossamer_cluster_transport{what=\"handshakes_refused\"}"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        assert!(refused > 0, "the stranger's handshakes are refused and counted");
        // One clock on loopback: node-1 reads node-2's offset from its frames' arrivals as
        // the least delay, well under a ms (the test allows δ); the stranger sends no frame
        // node-1 accepts, so it has no estimate.
        let cluster = get_json(http[0], "/v1/cluster").await.expect("cluster view");
        let offset_of = |node: &str| {
            cluster["members"]
                .as_array()
                .and_then(|m| m.iter().find(|m| m["node_id"] == node))
                .map(|m| m["clock_offset_ms"].clone())
        };
        let offset = offset_of("node-2").and_then(|v| v.as_f64());
        assert!(
            offset.is_some_and(|ms| ms.abs() < 25.0),
            "node-2's clock offset as node-1 reads it: {offset:?}"
        );
        assert_eq!(offset_of("node-3"), Some(serde_json::Value::Null));
        assert!(
            text.contains("gossamer_cluster_peer_clock_offset_seconds{peer=\"node-2\"}"),
            "the offset is exported"
        );
        // One clock: no peer's counts fall out of range, so the per-peer family is empty;
        // the rounds visited keys (the checks above listed theirs).
        assert!(text.contains("# TYPE gossamer_cluster_peer_dots_out_of_range_total counter"));
        assert!(!text.contains("gossamer_cluster_peer_dots_out_of_range_total{"));
        // Per global rule, each labelled with its name.
        let visits: Vec<(&str, u64)> = text
            .lines()
            .filter_map(|l| l.strip_prefix("gossamer_cluster_key_visits_total{rule=\""))
            .filter_map(|l| l.split_once("\"} "))
            .filter_map(|(rule, v)| Some((rule, v.parse::<u64>().ok()?)))
            .collect();
        assert!(
            visits.iter().any(|&(rule, v)| rule == "api" && v > 0),
            "key visits: {visits:?}"
        );
        // What was sent, by kind: a mesh sends round frames and digests (every 10th round),
        // and no hello (only the tree greets) and no tree message.
        let sent = |family: &str, kind: &str| -> u64 {
            let prefix = format!("{family}{{kind=\"{kind}\"}} ");
            text.lines()
                .find_map(|l| l.strip_prefix(prefix.as_str()))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {prefix} in {text}"))
        };
        for kind in ["round", "digest"] {
            assert!(sent("gossamer_cluster_sent_messages_total", kind) > 0, "{kind}");
            assert!(sent("gossamer_cluster_sent_bytes_total", kind) > 0, "{kind}");
        }
        for kind in ["hello", "tree_up", "tree_down", "tree_handoff", "tree_carried"] {
            assert_eq!(sent("gossamer_cluster_sent_bytes_total", kind), 0, "{kind}");
        }
        // The stranger never authenticated, so it takes no part: nothing is held for it.
        assert!(text.contains("\ngossamer_cluster_suspected_peers 0\n"), "{text}");
        assert!(text.contains("\ngossamer_cluster_held_share 0.000000\n"), "{text}");
        eprintln!("node-1 reads node-2's clock offset as {offset:?} ms");
    })
    .await;
    assert!(outcome.is_ok(), "the test finished within 60 s");
}
