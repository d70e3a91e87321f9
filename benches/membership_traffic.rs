//! What membership gossip (chitchat) sends per node as the cluster grows: the simulation's
//! bytes (`gossamer sim --scale`) count only the round exchange, and membership is simulated
//! there.
//!
//!   cargo run --release --example membership_traffic              # 10, 20, 40, 80 nodes
//!   cargo run --release --example membership_traffic -- 10 100    # any sizes
//!
//! Each size: N real `Membership`s (chitchat 0.13 with our config: 100 ms gossip interval,
//! node ids `node-0001`...) on chitchat's in-memory `ChannelTransport`, which serializes every
//! message as UDP would and counts its bytes, on paused tokio time. Once every node sees all N
//! alive, the bytes sent by all nodes over 10 s of virtual time, per node per second. Nothing
//! else runs: no keys, no rounds.

use std::net::SocketAddr;
use std::time::Duration;

use gossamer::cluster::membership::{ChannelTransport, Membership, MembershipConfig, NodeMeta};

const MEASURE: Duration = Duration::from_secs(10);

fn addr(i: usize) -> SocketAddr {
    let port = 20_000 + i as u16;
    ([10, 0, (i / 250) as u8, (i % 250) as u8 + 1], port).into()
}

async fn measure(n: usize) -> (f64, Duration) {
    let transport = ChannelTransport::with_mtu(65_507);
    let mut nodes = Vec::with_capacity(n);
    for i in 0..n {
        let mut cfg = MembershipConfig::new(format!("node-{i:04}"), 1, addr(i), addr(i), "traffic");
        cfg.seeds = vec![addr(0).to_string()];
        let meta = NodeMeta {
            quic_addr: SocketAddr::new(addr(i).ip(), addr(i).port() + 1),
            version: env!("CARGO_PKG_VERSION").into(),
            rules_hash: "0123456789abcdef".into(),
            // What a node with four global rules publishes (the README's tiers).
            limits: r#"{"bucket":[[60,60]],"fixed":[[60,60]],"hybrid":[[10,20],[300,300]],"log":[[60,60]]}"#.into(),
        };
        let node = Membership::start_with_transport(cfg, meta, &transport)
            .await
            .expect("membership starts");
        nodes.push(node);
    }
    let started = tokio::time::Instant::now();
    // Every node sees every node alive (bounded: 60 s of virtual time).
    loop {
        let all = nodes
            .iter()
            .all(|m| m.members().iter().filter(|x| x.alive).count() == n);
        if all {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{n} nodes did not converge"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let converged = started.elapsed();
    let before = transport.statistics().num_bytes_total;
    tokio::time::sleep(MEASURE).await;
    let sent = transport.statistics().num_bytes_total - before;
    for node in nodes {
        let _ = node.shutdown().await;
    }
    (sent as f64 / n as f64 / MEASURE.as_secs_f64(), converged)
}

fn main() {
    let parsed: Result<Vec<usize>, _> = std::env::args().skip(1).map(|a| a.parse()).collect();
    let sizes = match parsed {
        Ok(sizes) if !sizes.is_empty() => sizes,
        Ok(_) => vec![10, 20, 40, 80],
        Err(e) => {
            eprintln!("membership_traffic: sizes must be numbers: {e}");
            std::process::exit(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime");
    println!("| nodes | membership bytes/node/s | all alive after (virtual) |");
    println!("|---:|---:|---:|");
    for n in sizes {
        let (bytes, converged) = runtime.block_on(measure(n));
        println!(
            "| {n} | {:.1} kB | {} ms |",
            bytes / 1e3,
            converged.as_millis()
        );
    }
}
