//! Three nodes on loopback (gossip and QUIC, in this process) answer Envoy's rate limit
//! service for one domain: under twice the limit spread over all three, the cluster admits at
//! most the limit in every window and at least 90% of it in every full window, the figures
//! `tests/netns.rs` holds the HTTP API to; and a clustered node reloads its YAML as it does its
//! TOML rules.

#![allow(clippy::unwrap_used)] // helpers of tests: a failure should panic where it happens

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::Duration;

use gossamer::api::App;
use gossamer::clock::{Clock, SystemClock};
use gossamer::config::{Config, Overrides};
use gossamer::limiter::SECOND;
use gossamer::rls::proto::rate_limit_descriptor::Entry;
use gossamer::rls::proto::rate_limit_response::Code;
use gossamer::rls::proto::rate_limit_service_client::RateLimitServiceClient;
use gossamer::rls::proto::{RateLimitDescriptor, RateLimitRequest};
use gossamer::server::Node;
use tokio::sync::watch;

/// Admissions per second for one user, cluster-wide.
const LIMIT: u64 = 60;
const YAML: &str = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 60}\n";
/// How long the load runs.
const LOAD: Duration = Duration::from_secs(6);

fn free_udp() -> SocketAddr {
    UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap()
}

fn peers(app: &App) -> usize {
    app.cluster.get().map_or(0, |c| {
        c.members().iter().filter(|m| m.alive && !m.is_self).count()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_hold_one_domains_limit_over_rls() {
    let dir = std::env::temp_dir().join(format!("gossamer-rls-cluster-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let yaml = dir.join("api.yaml");
    std::fs::write(&yaml, YAML).unwrap();
    let gossip: Vec<SocketAddr> = (0..3).map(|_| free_udp()).collect();
    let seeds = gossip
        .iter()
        .map(|a| format!("\"{a}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let (stop, stopped) = watch::channel(false);
    let mut apps = Vec::new();
    let mut grpc = Vec::new();
    let mut servers = Vec::new();
    for (i, g) in gossip.iter().enumerate() {
        let toml = dir.join(format!("node-{i}.toml"));
        std::fs::write(
            &toml,
            format!(
                "[server]\nhttp = \"127.0.0.1:0\"\ngrpc = \"127.0.0.1:0\"\nnode_id = \"rls-{i}\"\n[cluster]\ngossip = \"{g}\"\nquic = \"127.0.0.1:0\"\nseeds = [{seeds}]\ncluster_id = \"rls-test-{}\"\n",
                std::process::id()
            ),
        )
        .unwrap();
        let overrides = Overrides {
            rls_config: Some(yaml.clone()),
            ..Overrides::default()
        };
        let config = Config::load(Some(&toml), &overrides).unwrap();
        let node = Node::bind(config, clock.clone()).await.unwrap();
        grpc.push(node.grpc_addr().unwrap());
        apps.push(node.app());
        let mut stopped = stopped.clone();
        servers.push(tokio::spawn(node.run(async move {
            let _ = stopped.wait_for(|s| *s).await;
        })));
    }
    // Formed: every node sees the two others and is ready.
    let formed = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let ready = apps
                .iter()
                .all(|a| peers(a) == 2 && a.cluster.get().is_some_and(|c| c.ready()));
            if ready {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(formed.is_ok(), "the cluster did not form within 20 s");

    // Twice the limit, spread evenly over the three nodes.
    let per_node = 2.0 * LIMIT as f64 / 3.0;
    let interval = Duration::from_secs_f64(1.0 / per_node);
    let mut loads = Vec::new();
    for addr in &grpc {
        let addr = *addr;
        let clock = clock.clone();
        loads.push(tokio::spawn(async move {
            let connect = RateLimitServiceClient::connect(format!("http://{addr}"));
            let mut client = tokio::time::timeout(Duration::from_secs(10), connect)
                .await
                .expect("connects in time")
                .unwrap();
            let request = RateLimitRequest {
                domain: "api".into(),
                descriptors: vec![RateLimitDescriptor {
                    entries: vec![Entry {
                        key: "user".into(),
                        value: "u1".into(),
                    }],
                    limit: None,
                    hits_addend: None,
                }],
                hits_addend: 1,
            };
            // Per window end (whole seconds): (admitted, answered).
            let mut windows: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
            let mut tick = tokio::time::interval(interval);
            let end = tokio::time::Instant::now() + LOAD;
            while tokio::time::Instant::now() < end {
                tick.tick().await;
                let r = tokio::time::timeout(
                    Duration::from_secs(5),
                    client.should_rate_limit(request.clone()),
                )
                .await
                .expect("answered in time")
                .unwrap()
                .into_inner();
                let reset = r.statuses[0].duration_until_reset.unwrap();
                let reset = reset.seconds as u64 * SECOND + reset.nanos as u64;
                let window = (clock.now() + reset + SECOND / 2) / SECOND;
                let w = windows.entry(window).or_default();
                w.1 += 1;
                if r.overall_code == Code::Ok as i32 {
                    w.0 += 1;
                }
            }
            windows
        }));
    }
    let mut total: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for load in loads {
        for (w, (a, n)) in load.await.unwrap() {
            let t = total.entry(w).or_default();
            t.0 += a;
            t.1 += n;
        }
    }
    let _ = stop.send(true);
    for server in servers {
        let _ = tokio::time::timeout(Duration::from_secs(15), server).await;
    }
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("per window (end second): (admitted, answered) {total:?}");
    for (w, (admitted, _)) in &total {
        assert!(
            *admitted <= LIMIT,
            "window {w} admitted {admitted} > {LIMIT}: {total:?}"
        );
    }
    // Full windows: all but the first and last.
    let full: Vec<(u64, u64)> = total
        .values()
        .copied()
        .skip(1)
        .take(total.len().saturating_sub(2))
        .collect();
    assert!(full.len() >= 3, "too few full windows: {total:?}");
    for (admitted, answered) in &full {
        let due = LIMIT.min(*answered);
        assert!(
            admitted * 10 >= due * 9,
            "a full window admitted {admitted} < 90% of {due}: {total:?}"
        );
    }
}

/// On a clustered node a YAML change that keeps the same set of limits (here a new descriptor
/// value under an existing limit) reloads at once, and so does one that adds a limit: its
/// global rule is added live (design §3.8, "Adding and removing a global rule").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clustered_node_reloads_descriptors_and_new_limits() {
    use gossamer::server::ConfigSource;
    let dir = std::env::temp_dir().join(format!("gossamer-rls-reload-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let yaml = dir.join("api.yaml");
    std::fs::write(&yaml, YAML).unwrap();
    let toml = dir.join("node.toml");
    std::fs::write(
        &toml,
        format!(
            "[server]\nhttp = \"127.0.0.1:0\"\ngrpc = \"127.0.0.1:0\"\nnode_id = \"solo\"\n[cluster]\ngossip = \"{}\"\nquic = \"127.0.0.1:0\"\ncluster_id = \"rls-reload-{}\"\n[rls]\nconfig = \"api.yaml\"\n",
            free_udp(),
            std::process::id()
        ),
    )
    .unwrap();
    let config = Config::load(Some(&toml), &Overrides::default()).unwrap();
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let node = Node::bind(config, clock)
        .await
        .unwrap()
        .reload_from(ConfigSource {
            path: Some(toml.clone()),
            overrides: Overrides::default(),
        });
    let grpc = node.grpc_addr().unwrap();
    let app = node.app();
    let (stop, stopped) = watch::channel(false);
    let server = tokio::spawn(node.run(async move {
        let mut stopped = stopped;
        let _ = stopped.wait_for(|s| *s).await;
    }));
    let connect = RateLimitServiceClient::connect(format!("http://{grpc}"));
    let mut client = tokio::time::timeout(Duration::from_secs(10), connect)
        .await
        .expect("connects in time")
        .unwrap();
    let ask = |key: &str, value: &str| RateLimitRequest {
        domain: "api".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: key.into(),
                value: value.into(),
            }],
            limit: None,
            hits_addend: Some(0),
        }],
        hits_addend: 0,
    };
    // Limit of a descriptor, polling until `want` or 10 s.
    let mut limit_of = async |key: &str, value: &str, want: Option<u32>| {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let r = tokio::time::timeout(
                Duration::from_secs(5),
                client.should_rate_limit(ask(key, value)),
            )
            .await
            .expect("answered in time");
            let got = r.ok().and_then(|r| {
                r.into_inner().statuses[0]
                    .current_limit
                    .as_ref()
                    .map(|l| l.requests_per_unit)
            });
            if got == want || tokio::time::Instant::now() > deadline {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    assert_eq!(limit_of("user", "u", Some(60)).await, Some(60));
    assert_eq!(limit_of("team", "t", None).await, None);
    // Same limit (60/s), a new descriptor: applied.
    std::fs::write(
        &yaml,
        format!("{YAML}  - key: team\n    rate_limit: {{unit: second, requests_per_unit: 60}}\n"),
    )
    .unwrap();
    assert_eq!(limit_of("team", "t", Some(60)).await, Some(60));
    let refused_before = app.reloads.error.load(std::sync::atomic::Ordering::Relaxed);
    // A new limit (7/s): a new global rule, added live (design §3.8); the old quota's rule is
    // removed once no descriptor uses it.
    std::fs::write(
        &yaml,
        format!("{YAML}  - key: team\n    rate_limit: {{unit: second, requests_per_unit: 7}}\n"),
    )
    .unwrap();
    assert_eq!(limit_of("team", "t", Some(7)).await, Some(7));
    assert_eq!(limit_of("user", "u", Some(60)).await, Some(60));
    assert_eq!(
        app.reloads.error.load(std::sync::atomic::Ordering::Relaxed),
        refused_before,
        "no reload was refused"
    );
    let _ = stop.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(15), server).await;
    let _ = std::fs::remove_dir_all(&dir);
}
