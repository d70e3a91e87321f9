//! Black-box tests of Envoy's rate limit service: a real node per test on 127.0.0.1 port 0
//! (HTTP and gRPC), an envoyproxy/ratelimit YAML config, and a tonic client generated from the
//! same protos (the Python client of `tests/rls_python.rs` is the independent one). The node
//! runs on a `ManualClock`, so windows only move when a test says so.

#![allow(clippy::unwrap_used)] // helpers of tests: a failure should panic where it happens

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use gossamer::api::App;
use gossamer::clock::ManualClock;
use gossamer::config::{Config, Overrides};
use gossamer::limiter::{Nanos, SECOND};
use gossamer::rls::proto::health::HealthCheckRequest;
use gossamer::rls::proto::health::health_client::HealthClient;
use gossamer::rls::proto::rate_limit_descriptor::{Entry, RateLimitOverride};
use gossamer::rls::proto::rate_limit_response::Code;
use gossamer::rls::proto::rate_limit_service_client::RateLimitServiceClient;
use gossamer::rls::proto::{RateLimitDescriptor, RateLimitRequest, RateLimitResponse};
use gossamer::server::{ConfigSource, Node};
use gossamer_client::raw::Client;
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

/// A whole day since the epoch, so every window (second to day) starts exactly here.
const T0: Nanos = 19_675 * 86_400 * SECOND;
/// The longest any step of a test may take.
const STEP: Duration = Duration::from_secs(10);

/// envoyproxy/ratelimit's README examples 2 (messaging) and 6 (shadow mode), and a domain of
/// our own for the all-or-nothing, unlimited, blocked and replaces cases.
const YAML: &str = r#"
domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
"#;

const YAML_MORE: &str = r#"
domain: edge
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: ip
    value: 50.0.0.5
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: ldap
    rate_limit: {unlimited: true}
  - key: canary
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: k1
    descriptors:
      - key: user
        rate_limit: {name: specific, unit: second, requests_per_unit: 5}
  - key: k2
    descriptors:
      - key: user
        rate_limit:
          unit: second
          requests_per_unit: 10
          replaces: [{name: specific}]
"#;

struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "gossamer-rls-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Running {
    http: SocketAddr,
    grpc: SocketAddr,
    app: Arc<App>,
    clock: Arc<ManualClock>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
    _dir: TempDir,
}

impl Running {
    /// A node with `[rls]` settings `rls` (TOML lines) serving `files` in a config directory.
    async fn start(rls: &str, files: &[(&str, &str)]) -> Running {
        Running::start_edited(rls, files, |_| ()).await
    }

    /// As [`Running::start`], with `edit` run on the directory after the config is loaded and
    /// before the node starts watching it.
    async fn start_edited(rls: &str, files: &[(&str, &str)], edit: impl FnOnce(&Path)) -> Running {
        let dir = TempDir::new();
        std::fs::create_dir_all(dir.0.join("rls")).unwrap();
        for (name, text) in files {
            std::fs::write(dir.0.join("rls").join(name), text).unwrap();
        }
        let toml = format!(
            "[server]\nnode_id = \"rls-test\"\nhttp = \"127.0.0.1:0\"\ngrpc = \"127.0.0.1:0\"\n\n[rls]\nconfig = \"rls\"\n{rls}\n"
        );
        let path = dir.0.join("gossamer.toml");
        std::fs::write(&path, toml).unwrap();
        let config = Config::load(Some(&path), &Overrides::default()).unwrap();
        edit(&dir.0);
        let clock = Arc::new(ManualClock::new(T0));
        let node = Node::bind(config, clock.clone())
            .await
            .unwrap()
            .reload_from(ConfigSource {
                path: Some(path),
                overrides: Overrides::default(),
            });
        let http = node.local_addr().unwrap();
        let grpc = node.grpc_addr().expect("grpc is configured");
        let app = node.app();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            node.run(async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
        });
        Running {
            http,
            grpc,
            app,
            clock,
            stop: Some(stop),
            task: Some(task),
            _dir: dir,
        }
    }

    async fn client(&self) -> RateLimitServiceClient<Channel> {
        tokio::time::timeout(
            STEP,
            RateLimitServiceClient::connect(format!("http://{}", self.grpc)),
        )
        .await
        .expect("connects in time")
        .expect("connects")
    }

    async fn metrics(&self) -> String {
        let scrape = async {
            let mut c = Client::connect(&format!("http://{}", self.http))
                .await
                .unwrap();
            c.get("/metrics").await.unwrap()
        };
        let reply = tokio::time::timeout(STEP, scrape)
            .await
            .expect("scraped in time");
        String::from_utf8(reply.body.to_vec()).unwrap()
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(STEP, self.task.take().unwrap())
            .await
            .expect("stops in time")
            .unwrap();
    }
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect(),
        limit: None,
        hits_addend: None,
    }
}

fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend: 0,
    }
}

async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    request: RateLimitRequest,
) -> Result<RateLimitResponse, tonic::Status> {
    tokio::time::timeout(STEP, client.should_rate_limit(request))
        .await
        .expect("answers in time")
        .map(tonic::Response::into_inner)
}

fn codes(r: &RateLimitResponse) -> (i32, Vec<i32>) {
    (r.overall_code, r.statuses.iter().map(|s| s.code).collect())
}

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

/// What is left of each descriptor, read with a check-only request (per-descriptor
/// hits_addend 0), which changes no counter.
/// Polls [`remaining`] until it is `want` (a reload took effect), for at most [`STEP`].
async fn until_remaining(
    client: &mut RateLimitServiceClient<Channel>,
    domain: &str,
    entries: &[&[(&str, &str)]],
    want: &[u32],
) {
    let deadline = std::time::Instant::now() + STEP;
    loop {
        let r = remaining(client, domain, entries).await;
        if r == want {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "not reloaded: {r:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn remaining(
    client: &mut RateLimitServiceClient<Channel>,
    domain: &str,
    entries: &[&[(&str, &str)]],
) -> Vec<u32> {
    let descriptors = entries
        .iter()
        .map(|e| RateLimitDescriptor {
            hits_addend: Some(0),
            ..descriptor(e)
        })
        .collect();
    let r = ask(client, request(domain, descriptors)).await.unwrap();
    assert_eq!(r.overall_code, OK, "a check-only request never denies");
    r.statuses.iter().map(|s| s.limit_remaining).collect()
}

#[tokio::test]
async fn readme_example_2_counts_each_number_and_denies_all_or_nothing() {
    let node = Running::start("", &[("messaging.yaml", YAML)]).await;
    let mut c = node.client().await;
    let marketing = [("message_type", "marketing"), ("to_number", "2061111111")];
    let number = [("to_number", "2061111111")];
    for i in 0..5 {
        let r = ask(
            &mut c,
            request(
                "messaging",
                vec![descriptor(&marketing), descriptor(&number)],
            ),
        )
        .await
        .unwrap();
        assert_eq!(codes(&r), (OK, vec![OK, OK]), "message {i}");
        let limits: Vec<(u32, i32)> = r
            .statuses
            .iter()
            .map(|s| {
                let l = s.current_limit.as_ref().unwrap();
                (l.requests_per_unit, l.unit)
            })
            .collect();
        assert_eq!(limits, [(5, 4), (100, 4)], "DAY is 4");
        assert_eq!(r.statuses[0].limit_remaining, 4 - i);
        assert_eq!(r.statuses[1].limit_remaining, 99 - i);
        let reset = r.statuses[0].duration_until_reset.unwrap();
        assert_eq!(reset.seconds, 86_400, "the day's window just began");
    }
    // The sixth marketing message is over its limit: the request is OVER_LIMIT and the
    // per-number counter is not charged (envoyproxy/ratelimit would charge it).
    let r = ask(
        &mut c,
        request(
            "messaging",
            vec![descriptor(&marketing), descriptor(&number)],
        ),
    )
    .await
    .unwrap();
    assert_eq!(codes(&r), (OVER, vec![OVER, OK]));
    assert_eq!(r.statuses[0].limit_remaining, 0);
    assert_eq!(
        r.statuses[1].limit_remaining, 95,
        "standing reported, not charged"
    );
    assert_eq!(
        remaining(&mut c, "messaging", &[&marketing, &number]).await,
        [0, 95]
    );
    // Another number has its own counters; a descriptor deeper than the config is not limited.
    let other = [("message_type", "marketing"), ("to_number", "2062222222")];
    let r = ask(&mut c, request("messaging", vec![descriptor(&other)]))
        .await
        .unwrap();
    assert_eq!(codes(&r), (OK, vec![OK]));
    let r = ask(
        &mut c,
        request(
            "messaging",
            vec![descriptor(&[("to_number", "1"), ("x", "y")])],
        ),
    )
    .await
    .unwrap();
    assert_eq!(codes(&r), (OK, vec![OK]));
    assert!(r.statuses[0].current_limit.is_none());
    // The next day starts afresh.
    node.clock.advance(86_400 * SECOND);
    assert_eq!(
        remaining(&mut c, "messaging", &[&marketing, &number]).await,
        [5, 100]
    );
    node.stop().await;
}

#[tokio::test]
async fn hits_addend_zero_means_one_for_the_request_and_check_only_for_a_descriptor() {
    let node = Running::start("", &[("edge.yaml", YAML_MORE)]).await;
    let mut c = node.client().await;
    let user = [("user", "a")];
    // Request hits_addend 0 is 1.
    ask(&mut c, request("edge", vec![descriptor(&user)]))
        .await
        .unwrap();
    assert_eq!(remaining(&mut c, "edge", &[&user]).await, [2]);
    // Request hits_addend 2 charges 2; a descriptor's own hits_addend wins over it.
    let mut r = request("edge", vec![descriptor(&user)]);
    r.hits_addend = 2;
    let answer = ask(&mut c, r.clone()).await.unwrap();
    assert_eq!(codes(&answer), (OK, vec![OK]));
    assert_eq!(remaining(&mut c, "edge", &[&user]).await, [0]);
    let answer = ask(&mut c, r.clone()).await.unwrap();
    assert_eq!(codes(&answer), (OVER, vec![OVER]));
    // Check only: OK even when spent, and never charged.
    r.descriptors[0].hits_addend = Some(0);
    let answer = ask(&mut c, r).await.unwrap();
    assert_eq!(codes(&answer), (OK, vec![OK]));
    assert_eq!(answer.statuses[0].limit_remaining, 0);
    node.stop().await;
}

#[tokio::test]
async fn unlimited_blocked_replaced_and_unknown_descriptors() {
    let node = Running::start("", &[("edge.yaml", YAML_MORE)]).await;
    let mut c = node.client().await;
    let r = ask(&mut c, request("edge", vec![descriptor(&[("ldap", "x")])]))
        .await
        .unwrap();
    assert_eq!(codes(&r), (OK, vec![OK]));
    assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
    // requests_per_unit 0 refuses every request and charges nothing else.
    let tenant = [("tenant", "t")];
    let r = ask(
        &mut c,
        request(
            "edge",
            vec![descriptor(&tenant), descriptor(&[("ip", "50.0.0.5")])],
        ),
    )
    .await
    .unwrap();
    assert_eq!(codes(&r), (OVER, vec![OK, OVER]));
    assert_eq!(remaining(&mut c, "edge", &[&tenant]).await, [10]);
    // An unknown domain or key is not limited.
    let r = ask(&mut c, request("nope", vec![descriptor(&[("a", "b")])]))
        .await
        .unwrap();
    assert_eq!(codes(&r), (OK, vec![OK]));
    // replaces: with both matched, the named 5/s limit is not applied (nor charged).
    let specific = [("k1", "x"), ("user", "u")];
    let replacing = [("k2", "y"), ("user", "u")];
    for _ in 0..7 {
        let r = ask(
            &mut c,
            request("edge", vec![descriptor(&specific), descriptor(&replacing)]),
        )
        .await
        .unwrap();
        assert_eq!(codes(&r), (OK, vec![OK, OK]));
        assert!(r.statuses[0].current_limit.is_none(), "replaced");
    }
    assert_eq!(remaining(&mut c, "edge", &[&specific]).await, [5]);
    node.stop().await;
}

#[tokio::test]
async fn a_limit_override_counts_its_own_limit_per_descriptor() {
    let node = Running::start("", &[("edge.yaml", YAML_MORE)]).await;
    let mut c = node.client().await;
    let dynamic = |entries: &[(&str, &str)], rpu: u32, unit: i32| RateLimitDescriptor {
        limit: Some(RateLimitOverride {
            requests_per_unit: rpu,
            unit,
        }),
        ..descriptor(entries)
    };
    // An override of 2 per hour (HOUR = 3), on a descriptor the config does not know.
    for expected in [OK, OK, OVER] {
        let r = ask(
            &mut c,
            request("edge", vec![dynamic(&[("path", "/a")], 2, 3)]),
        )
        .await
        .unwrap();
        assert_eq!(r.overall_code, expected);
        assert_eq!(
            r.statuses[0]
                .current_limit
                .as_ref()
                .unwrap()
                .requests_per_unit,
            2
        );
    }
    // Another value has its own count; an override of the config's own limit (3 per minute)
    // is counted by that limit's rule, still under the descriptor's own key.
    let r = ask(
        &mut c,
        request("edge", vec![dynamic(&[("path", "/b")], 2, 3)]),
    )
    .await
    .unwrap();
    assert_eq!(r.overall_code, OK);
    for expected in [OK, OK, OK, OVER] {
        let r = ask(
            &mut c,
            request("edge", vec![dynamic(&[("user", "z")], 3, 2)]),
        )
        .await
        .unwrap();
        assert_eq!(r.overall_code, expected);
    }
    node.stop().await;
}

#[tokio::test]
async fn malformed_requests_are_invalid_argument_and_change_no_counter() {
    let node = Running::start("", &[("edge.yaml", YAML_MORE)]).await;
    let mut c = node.client().await;
    let user = [("user", "a")];
    let spent = |r: &mut RateLimitRequest| r.descriptors.push(descriptor(&user));
    let mut cases: Vec<(&str, RateLimitRequest)> = Vec::new();
    let mut r = request("", vec![]);
    spent(&mut r);
    cases.push(("empty domain", r));
    cases.push(("no descriptors", request("edge", vec![])));
    let mut r = request("edge", vec![descriptor(&[("", "v")])]);
    spent(&mut r);
    cases.push(("empty entry key", r));
    let mut r = request(
        "edge",
        vec![RateLimitDescriptor {
            entries: vec![],
            limit: None,
            hits_addend: None,
        }],
    );
    spent(&mut r);
    cases.push(("no entries", r));
    let mut r = request("edge", vec![]);
    spent(&mut r);
    r.descriptors[0].hits_addend = Some(u64::MAX);
    cases.push(("huge hits_addend", r));
    let big = "v".repeat(1 << 20);
    let mut r = request("edge", vec![]);
    spent(&mut r);
    r.descriptors.push(descriptor(&[("user", big.as_str())]));
    cases.push(("1 MiB value", r));
    for unit in [0, 8, -1, 1000] {
        let mut r = request("edge", vec![]);
        spent(&mut r);
        r.descriptors[0].limit = Some(RateLimitOverride {
            requests_per_unit: 1,
            unit,
        });
        cases.push(("unknown unit", r));
    }
    let mut r = request("edge", vec![]);
    for _ in 0..65 {
        spent(&mut r);
    }
    cases.push(("too many descriptors", r));
    let refused = cases.len();
    for (what, r) in cases {
        let e = ask(&mut c, r).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{what}: {e:?}");
        assert!(!e.message().is_empty(), "{what}");
    }
    // Nothing was charged, and the node still answers.
    assert_eq!(remaining(&mut c, "edge", &[&user]).await, [3]);
    let metrics = node.metrics().await;
    let line = format!("gossamer_rls_errors_total{{status=\"invalid_argument\"}} {refused}");
    assert!(metrics.contains(&line), "{metrics}");
    node.stop().await;
}

#[tokio::test]
async fn a_shadow_descriptor_is_counted_but_answers_ok() {
    let node = Running::start("", &[("edge.yaml", YAML_MORE)]).await;
    let mut c = node.client().await;
    let canary = [("canary", "c")];
    let user = [("user", "s")];
    for _ in 0..3 {
        let r = ask(
            &mut c,
            request("edge", vec![descriptor(&canary), descriptor(&user)]),
        )
        .await
        .unwrap();
        assert_eq!(codes(&r), (OK, vec![OK, OK]));
    }
    // The user limit (3) is enforced; the canary (1) was over twice, answered OK.
    let r = ask(
        &mut c,
        request("edge", vec![descriptor(&canary), descriptor(&user)]),
    )
    .await
    .unwrap();
    assert_eq!(codes(&r), (OVER, vec![OK, OVER]));
    let metrics = node.metrics().await;
    for line in [
        "gossamer_rls_descriptors_total{domain=\"edge\",descriptor=\"edge.canary\",result=\"over_limit\",shadow=\"true\"} 2",
        "gossamer_rls_descriptors_total{domain=\"edge\",descriptor=\"edge.canary\",result=\"within_limit\",shadow=\"true\"} 2",
        "gossamer_rls_descriptors_total{domain=\"edge\",descriptor=\"edge.user\",result=\"over_limit\",shadow=\"false\"} 1",
        "gossamer_rls_requests_total{domain=\"edge\",code=\"shadow_over_limit\"} 2",
        "gossamer_rls_requests_total{domain=\"edge\",code=\"over_limit\"} 1",
    ] {
        assert!(metrics.contains(line), "{line}\n{metrics}");
    }
    node.stop().await;
}

#[tokio::test]
async fn node_wide_shadow_mode_decides_as_enforced_and_answers_ok() {
    let node = Running::start("shadow_mode = true", &[("edge.yaml", YAML_MORE)]).await;
    let mut c = node.client().await;
    let user = [("user", "w")];
    for _ in 0..5 {
        let r = ask(&mut c, request("edge", vec![descriptor(&user)]))
            .await
            .unwrap();
        assert_eq!(codes(&r), (OK, vec![OK]));
    }
    // Counted as if enforced: 3 admitted, 2 denied.
    assert_eq!(remaining(&mut c, "edge", &[&user]).await, [0]);
    let metrics = node.metrics().await;
    assert!(
        metrics
            .contains("gossamer_rls_requests_total{domain=\"edge\",code=\"shadow_over_limit\"} 2"),
        "{metrics}"
    );
    node.stop().await;
}

#[tokio::test]
async fn response_headers_name_the_closest_limit_with_configured_names() {
    let rls = "response_headers = true\nheader_limit = \"X-RateLimit-Limit\"\nheader_remaining = \"X-RateLimit-Remaining\"\nheader_reset = \"X-RateLimit-Reset\"";
    let node = Running::start(rls, &[("edge.yaml", YAML_MORE)]).await;
    let mut c = node.client().await;
    node.clock.advance(15 * SECOND);
    let r = ask(
        &mut c,
        request(
            "edge",
            vec![descriptor(&[("tenant", "t")]), descriptor(&[("user", "h")])],
        ),
    )
    .await
    .unwrap();
    let headers: Vec<(String, String)> = r
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect();
    assert_eq!(
        headers,
        [
            ("X-RateLimit-Limit".into(), "3, 3;w=60".into()),
            ("X-RateLimit-Remaining".into(), "2".into()),
            ("X-RateLimit-Reset".into(), "45".into()),
        ]
    );
    node.stop().await;
}

#[tokio::test]
async fn health_and_unavailable_follow_readiness() {
    let node = Running::start("", &[("edge.yaml", YAML_MORE)]).await;
    let mut c = node.client().await;
    let mut health =
        tokio::time::timeout(STEP, HealthClient::connect(format!("http://{}", node.grpc)))
            .await
            .expect("connects in time")
            .unwrap();
    let check = |service: &str| HealthCheckRequest {
        service: service.into(),
    };
    let serving = |r: Result<tonic::Response<_>, tonic::Status>| {
        let r: gossamer::rls::proto::health::HealthCheckResponse = r.unwrap().into_inner();
        r.status
    };
    assert_eq!(serving(health.check(check("")).await), 1);
    assert_eq!(
        serving(health.check(check(gossamer::rls::grpc::SERVICE_NAME)).await),
        1
    );
    let e = health.check(check("other")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    // Not ready (as while draining): NOT_SERVING, and checks are UNAVAILABLE, not decided.
    node.app
        .ready
        .store(false, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(serving(health.check(check("")).await), 2);
    let e = ask(&mut c, request("edge", vec![descriptor(&[("user", "u")])]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable);
    node.app
        .ready
        .store(true, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        remaining(&mut c, "edge", &[&[("user", "u")]]).await,
        [3],
        "an unavailable answer charged nothing"
    );
    node.stop().await;
}

#[tokio::test]
async fn a_changed_yaml_file_is_reloaded() {
    let node = Running::start("", &[("edge.yaml", YAML_MORE)]).await;
    let mut c = node.client().await;
    let user = [("user", "r")];
    ask(&mut c, request("edge", vec![descriptor(&user)]))
        .await
        .unwrap();
    assert_eq!(remaining(&mut c, "edge", &[&user]).await, [2]);
    // A new domain file appears, and the edge file sets a new user limit.
    let dir = node._dir.0.join("rls");
    std::fs::write(
        dir.join("edge.yaml"),
        YAML_MORE.replace("requests_per_unit: 3}", "requests_per_unit: 7}"),
    )
    .unwrap();
    std::fs::write(
        dir.join("new.yaml"),
        "domain: new\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
    )
    .unwrap();
    until_remaining(&mut c, "edge", &[&user], &[7]).await;
    let r = ask(&mut c, request("new", vec![descriptor(&[("a", "1")])]))
        .await
        .unwrap();
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        1
    );
    // An invalid file is refused and the running config stays.
    std::fs::write(dir.join("new.yaml"), "domain: new\nbogus: 1\n").unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let r = ask(&mut c, request("new", vec![descriptor(&[("a", "2")])]))
        .await
        .unwrap();
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        1
    );
    node.stop().await;
}

#[tokio::test]
async fn a_file_edited_between_load_and_watch_is_reloaded() {
    let node = Running::start_edited("", &[("edge.yaml", YAML_MORE)], |dir| {
        std::fs::write(
            dir.join("rls").join("edge.yaml"),
            YAML_MORE.replace("requests_per_unit: 3}", "requests_per_unit: 7}"),
        )
        .unwrap();
    })
    .await;
    let mut c = node.client().await;
    let user = [("user", "r")];
    until_remaining(&mut c, "edge", &[&user], &[7]).await;
    node.stop().await;
}

#[tokio::test]
async fn the_http_batch_check_is_all_or_nothing_with_one_answer_per_item() {
    let node = Running::start("", &[("edge.yaml", YAML_MORE)]).await;
    let mut http = Client::connect(&format!("http://{}", node.http))
        .await
        .unwrap();
    let body = json!({"checks": [
        {"rule": "rls.fixed_window.10.minute", "key": "a", "cost": 4},
        {"rule": "rls.fixed_window.3.minute", "key": "a", "cost": 2},
    ]});
    let reply = http.post("/v1/check/batch", &body).await.unwrap();
    assert_eq!(reply.status.as_u16(), 200);
    let v: Value = serde_json::from_slice(&reply.body).unwrap();
    assert_eq!(v["allowed"], true);
    assert_eq!(v["results"][0]["remaining"], 6);
    assert_eq!(v["results"][1]["remaining"], 1);
    // The second item cannot take 2 more: 429, and the first is not charged.
    let reply = http.post("/v1/check/batch", &body).await.unwrap();
    assert_eq!(reply.status.as_u16(), 429);
    let v: Value = serde_json::from_slice(&reply.body).unwrap();
    assert_eq!(v["allowed"], false);
    assert_eq!(v["results"][0]["charged"], false);
    assert_eq!(v["results"][0]["allowed"], true);
    assert_eq!(v["results"][1]["allowed"], false);
    assert_eq!(v["results"][1]["outcome"], "denied");
    let status = json!({"checks": [{"rule": "rls.fixed_window.10.minute", "key": "a", "cost": 0}]});
    let reply = http.post("/v1/check/batch", &status).await.unwrap();
    let v: Value = serde_json::from_slice(&reply.body).unwrap();
    assert_eq!(v["results"][0]["remaining"], 6);
    // Bad items refuse the whole batch before anything is charged.
    for (bad, code) in [
        (json!({"checks": []}), "missing_field"),
        (
            json!({"checks": [{"rule": "nope", "key": "a"}]}),
            "unknown_rule",
        ),
        (
            json!({"checks": [{"rule": "rls.fixed_window.10.minute", "key": ""}]}),
            "missing_field",
        ),
        (
            json!({"checks": [{"rule": "rls.fixed_window.10.minute", "key": "a", "cost": -1}]}),
            "invalid_cost",
        ),
        (
            json!({"checks": [{"rule": "rls.fixed_window.10.minute", "key": "a", "x": 1}]}),
            "unknown_field",
        ),
        (
            json!({"checks": [{"rule": "rls.fixed_window.10.minute", "key": "a"}], "y": 1}),
            "unknown_field",
        ),
    ] {
        let reply = http.post("/v1/check/batch", &bad).await.unwrap();
        let v: Value = serde_json::from_slice(&reply.body).unwrap();
        assert!(reply.status.is_client_error(), "{bad}");
        assert_eq!(v["error"], code, "{bad}: {v}");
    }
    let reply = http.post("/v1/check/batch", &status).await.unwrap();
    let v: Value = serde_json::from_slice(&reply.body).unwrap();
    assert_eq!(v["results"][0]["remaining"], 6);
    node.stop().await;
}

#[test]
fn a_bad_yaml_file_exits_2_naming_file_domain_descriptor_and_field() {
    let dir = TempDir::new();
    let yaml = dir.0.join("bad.yaml");
    std::fs::write(
        &yaml,
        "domain: shop\ndescriptors:\n  - key: tenant\n    value: acme\n    descriptors:\n      - key: user\n        rate_limit: {unit: fortnight, requests_per_unit: 5}\n",
    )
    .unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_gossamer"))
        .args([
            "serve",
            "--http",
            "127.0.0.1:0",
            "--grpc",
            "127.0.0.1:0",
            "--rls-config",
        ])
        .arg(&yaml)
        .env_remove("GOSSAMER_CONFIG")
        .env_remove("GOSSAMER_NODE_ID")
        .env_remove("GOSSAMER_GOSSIP")
        .env_remove("GOSSAMER_SEEDS")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + STEP;
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("a node with a bad RLS config kept running");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    let expected = format!(
        "{}: domain \"shop\", descriptor \"tenant=acme > user\", field \"rate_limit.unit\": \"fortnight\" is not a unit",
        yaml.display()
    );
    assert!(stderr.contains(&expected), "{stderr}");
}
