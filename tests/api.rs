//! Black-box tests of the HTTP API: a real node per test on 127.0.0.1 port 0, driven over
//! TCP with `gossamer_client::raw::Client`, on a `ManualClock` so that every time-dependent
//! answer is exact. Time only moves when a test advances the clock; the only real-time waits
//! are the slow-client timeouts (which are real-time by design) and short settles that give
//! a request a chance to (wrongly) complete.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use gossamer::clock::ManualClock;
use gossamer::config::Config;
use gossamer::limiter::{MILLISECOND, Nanos, SECOND};
use gossamer::server::Node;
use gossamer_client::raw::{Client, Reply};
use hyper::Method;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A whole minute since the epoch, so minute (and second) windows start exactly here.
const T0: Nanos = 1_699_999_980 * SECOND;

/// Rules used by most tests.
const RULES: &str = r#"
[server]
node_id = "test-node"

[[rule]]
name = "tb"
algorithm = "token_bucket"
limit = 10
period = "1s"
burst = 20

[[rule]]
name = "leaky"
algorithm = "leaky_bucket"
limit = 10
period = "1s"
burst = 1

[[rule]]
name = "shaped"
algorithm = "leaky_bucket"
limit = 10
period = "1s"
burst = 1
max_wait = "250ms"

[[rule]]
name = "fixed"
algorithm = "fixed_window"
limit = 5
period = "1m"

[[rule]]
name = "log"
algorithm = "sliding_window_log"
limit = 5
period = "1m"

[[rule]]
name = "counter"
algorithm = "sliding_window_counter"
limit = 10
period = "1m"

[[rule]]
name = "combo"
[[rule.limits]]
algorithm = "token_bucket"
limit = 1
period = "1s"
burst = 20
[[rule.limits]]
algorithm = "sliding_window_log"
limit = 25
period = "1m"
"#;

/// Every test body runs under this bound, so no test can hang.
async fn within<F: Future>(body: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(20), body)
        .await
        .expect("test did not finish within 20 s")
}

/// A node serving on 127.0.0.1 (port 0) with a manual clock; shut down on drop.
struct TestNode {
    addr: SocketAddr,
    clock: Arc<ManualClock>,
    shutdown: Option<oneshot::Sender<()>>,
    run: Option<JoinHandle<std::io::Result<()>>>,
}

impl TestNode {
    async fn start(toml: &str) -> TestNode {
        let mut config = Config::parse(toml, "test.toml").expect("test config is valid");
        config.server.http = "127.0.0.1:0".parse().expect("address parses");
        let clock = Arc::new(ManualClock::new(T0));
        let node = Node::bind(config, clock.clone()).await.expect("node binds");
        let addr = node.local_addr().expect("bound address");
        let (tx, rx) = oneshot::channel::<()>();
        let run = tokio::spawn(node.run(async move {
            let _ = rx.await;
        }));
        TestNode {
            addr,
            clock,
            shutdown: Some(tx),
            run: Some(run),
        }
    }

    async fn client(&self) -> Client {
        Client::connect_addr(self.addr)
            .await
            .expect("connects to the node")
    }

    fn advance(&self, by: Nanos) {
        self.clock.advance(by);
    }

    fn trigger_shutdown(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }

    fn run_handle(&mut self) -> JoinHandle<std::io::Result<()>> {
        self.run.take().expect("run handle taken once")
    }

    async fn metrics(&self) -> String {
        let reply = self.client().await.get("/metrics").await.expect("metrics");
        assert_eq!(reply.status, 200);
        String::from_utf8(reply.body.to_vec()).expect("metrics are UTF-8")
    }

    async fn status(&self, rule: &str, key: &str) -> Value {
        let reply = self
            .client()
            .await
            .get(&format!("/v1/status?rule={rule}&key={key}"))
            .await
            .expect("status");
        assert_eq!(reply.status, 200, "status body: {:?}", reply.body);
        reply.json()
    }

    /// Everything a refused request must leave alone: the watched key's status and every
    /// check counter and key gauge.
    async fn counters(&self, rule: &str, key: &str) -> (Value, Vec<String>) {
        let status = self.status(rule, key).await;
        let lines = self
            .metrics()
            .await
            .lines()
            .filter(|l| {
                l.starts_with("gossamer_checks_total{")
                    || l.starts_with("gossamer_active_keys{")
                    || l.starts_with("gossamer_check_duration_seconds_count")
            })
            .map(str::to_owned)
            .collect();
        (status, lines)
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        self.trigger_shutdown();
    }
}

fn check_body(rule: &str, key: &str, cost: u64) -> Value {
    json!({"rule": rule, "key": key, "cost": cost})
}

async fn post(client: &mut Client, body: &Value) -> Reply {
    client
        .post("/v1/check", body)
        .await
        .expect("POST /v1/check")
}

async fn get(client: &mut Client, path: &str) -> Reply {
    client.get(path).await.expect("GET")
}

/// The value of the metric line `series` (name and labels exactly), which must exist.
fn metric(text: &str, series: &str) -> u64 {
    let prefix = format!("{series} ");
    let line = text
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no metric line {series:?} in:\n{text}"));
    line[prefix.len()..]
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("metric line {line:?} is not a whole number"))
}

fn sorted_keys(v: &Value) -> Vec<String> {
    let mut keys: Vec<String> = v
        .as_object()
        .unwrap_or_else(|| panic!("not a JSON object: {v}"))
        .keys()
        .cloned()
        .collect();
    keys.sort();
    keys
}

const DECISION_FIELDS: [&str; 8] = [
    "allowed",
    "key",
    "limit",
    "outcome",
    "remaining",
    "reset_after_ms",
    "retry_after_ms",
    "rule",
];

fn assert_decision_fields(v: &Value, waited: bool) {
    let mut expected: Vec<String> = DECISION_FIELDS.iter().map(|s| (*s).to_owned()).collect();
    if waited {
        expected.push("waited_ms".to_owned());
        expected.sort();
    }
    assert_eq!(sorted_keys(v), expected, "decision body {v}");
}

/// The decision body as (allowed, outcome, remaining, retry_after_ms, reset_after_ms).
fn summary(reply: &Reply) -> (u16, bool, String, u64, Value, u64) {
    let v = reply.json();
    (
        reply.status.as_u16(),
        v["allowed"].as_bool().expect("allowed is a bool"),
        v["outcome"]
            .as_str()
            .expect("outcome is a string")
            .to_owned(),
        v["remaining"].as_u64().expect("remaining is a number"),
        v["retry_after_ms"].clone(),
        v["reset_after_ms"]
            .as_u64()
            .expect("reset_after_ms is a number"),
    )
}

/// Sends a request on a fresh connection and asserts it is refused with `status` and the
/// error `code`, that it moved no counter for `rule`/`key` and no check counter at all, and
/// that the refusal itself was counted once. Returns the reply.
#[allow(clippy::too_many_arguments)]
async fn assert_refused(
    node: &TestNode,
    watch: (&str, &str),
    method: Method,
    path: &str,
    body: impl Into<Bytes>,
    status: u16,
    code: &str,
) -> Reply {
    let before = node.counters(watch.0, watch.1).await;
    let errors_series = format!("gossamer_http_errors_total{{error=\"{code}\"}}");
    let errors_before = metric(&node.metrics().await, &errors_series);
    let reply = node
        .client()
        .await
        .send(method.clone(), path, body)
        .await
        .unwrap_or_else(|e| panic!("{method} {path}: no reply: {e}"));
    let v = reply.json();
    assert_eq!(
        reply.status.as_u16(),
        status,
        "{method} {path}: body {:?}",
        reply.body
    );
    assert_eq!(v["error"], code, "{method} {path}: body {v}");
    assert!(
        v["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{method} {path}: message missing in {v}"
    );
    assert_eq!(
        sorted_keys(&v),
        ["error", "message"],
        "{method} {path}: {v}"
    );
    assert_eq!(reply.header("content-type"), Some("application/json"));
    assert_eq!(reply.header("retry-after"), None);
    assert_eq!(reply.header("ratelimit"), None);
    let after = node.counters(watch.0, watch.1).await;
    assert_eq!(before, after, "{method} {path} moved a counter");
    assert_eq!(
        metric(&node.metrics().await, &errors_series),
        errors_before + 1,
        "{method} {path}: refusal not counted under {code}"
    );
    reply
}

/// Polls `/metrics` until `series` reads `value` (the server has handled a request that a
/// test cannot observe directly, e.g. one being held).
async fn wait_for_metric(node: &TestNode, series: &str, value: u64) {
    for _ in 0..400 {
        if metric(&node.metrics().await, series) == value {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("{series} never reached {value}");
}

/// Gives a request that should stay pending a fair chance to (wrongly) complete.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
}

fn spawn_post(node: &TestNode, body: Value) -> JoinHandle<Reply> {
    let addr = node.addr;
    tokio::spawn(async move {
        let mut client = Client::connect_addr(addr).await.expect("connect");
        client.post("/v1/check", &body).await.expect("held check")
    })
}

async fn join(handle: JoinHandle<Reply>) -> Reply {
    tokio::time::timeout(Duration::from_secs(5), handle)
        .await
        .expect("request completes")
        .expect("request task did not panic")
}

// ---------------------------------------------------------------------------------------
// The check endpoint: bodies and headers
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_admitted_returns_200_with_exact_body_and_ratelimit_headers() {
    within(async {
        let node = TestNode::start(RULES).await;
        let mut c = node.client().await;
        let reply = post(&mut c, &check_body("tb", "user-1", 1)).await;
        assert_eq!(reply.status, 200);
        let v = reply.json();
        assert_decision_fields(&v, false);
        assert_eq!(
            v,
            json!({
                "allowed": true, "rule": "tb", "key": "user-1", "limit": 10, "remaining": 19,
                "reset_after_ms": 100, "retry_after_ms": 0, "outcome": "allowed",
            })
        );
        assert_eq!(reply.header("content-type"), Some("application/json"));
        assert_eq!(reply.header("ratelimit-policy"), Some("\"tb\";q=10;w=1"));
        assert_eq!(reply.header("ratelimit"), Some("\"tb\";r=19;t=1"));
        assert_eq!(reply.header("ratelimit-limit"), Some("10"));
        assert_eq!(reply.header("ratelimit-remaining"), Some("19"));
        assert_eq!(reply.header("ratelimit-reset"), Some("1"));
        assert_eq!(reply.header("retry-after"), None);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_denied_returns_429_with_retry_after_and_ratelimit_headers() {
    within(async {
        let node = TestNode::start(RULES).await;
        let mut c = node.client().await;
        let reply = post(&mut c, &check_body("tb", "k", 20)).await;
        assert_eq!(reply.status, 200);
        let reply = post(&mut c, &check_body("tb", "k", 1)).await;
        assert_eq!(reply.status, 429);
        let v = reply.json();
        assert_decision_fields(&v, false);
        assert_eq!(
            v,
            json!({
                "allowed": false, "rule": "tb", "key": "k", "limit": 10, "remaining": 0,
                "reset_after_ms": 2000, "retry_after_ms": 100, "outcome": "denied",
            })
        );
        assert_eq!(reply.header("content-type"), Some("application/json"));
        assert_eq!(reply.header("ratelimit-policy"), Some("\"tb\";q=10;w=1"));
        assert_eq!(reply.header("ratelimit"), Some("\"tb\";r=0;t=2"));
        assert_eq!(reply.header("ratelimit-limit"), Some("10"));
        assert_eq!(reply.header("ratelimit-remaining"), Some("0"));
        assert_eq!(reply.header("ratelimit-reset"), Some("2"));
        assert_eq!(reply.header("retry-after"), Some("1"));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_denied_has_retry_after_rounded_up_to_whole_seconds() {
    within(async {
        let node = TestNode::start(RULES).await;
        let mut c = node.client().await;
        // 1001 ms before the minute's edge: Retry-After must say 2, not 1.
        node.advance(58_999 * MILLISECOND);
        assert_eq!(post(&mut c, &check_body("fixed", "a", 5)).await.status, 200);
        let reply = post(&mut c, &check_body("fixed", "a", 1)).await;
        assert_eq!(reply.status, 429);
        assert_eq!(reply.json()["retry_after_ms"], 1001);
        assert_eq!(reply.header("retry-after"), Some("2"));
        assert_eq!(reply.header("ratelimit-reset"), Some("2"));
        // Exactly one second before the edge: 1, not 2.
        node.advance(MILLISECOND);
        let reply = post(&mut c, &check_body("fixed", "a", 1)).await;
        assert_eq!(reply.status, 429);
        assert_eq!(reply.json()["retry_after_ms"], 1000);
        assert_eq!(reply.header("retry-after"), Some("1"));
        // A nanosecond of waiting left still rounds up to a whole millisecond and second.
        node.advance(SECOND - 1);
        let reply = post(&mut c, &check_body("fixed", "a", 1)).await;
        assert_eq!(reply.status, 429);
        assert_eq!(reply.json()["retry_after_ms"], 1);
        assert_eq!(reply.header("retry-after"), Some("1"));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_cost_above_burst_is_never_with_null_retry_and_no_retry_after() {
    within(async {
        let node = TestNode::start(RULES).await;
        let mut c = node.client().await;
        let reply = post(&mut c, &check_body("tb", "k", 21)).await;
        assert_eq!(reply.status, 429);
        let v = reply.json();
        assert_decision_fields(&v, false);
        assert_eq!(v["allowed"], false);
        assert_eq!(v["outcome"], "never");
        assert_eq!(v["retry_after_ms"], Value::Null);
        assert_eq!(v["remaining"], 20);
        assert_eq!(reply.header("retry-after"), None);
        assert_eq!(reply.header("ratelimit-policy"), Some("\"tb\";q=10;w=1"));
        assert_eq!(reply.header("ratelimit"), Some("\"tb\";r=20;t=0"));
        assert_eq!(reply.header("ratelimit-limit"), Some("10"));
        assert_eq!(reply.header("ratelimit-remaining"), Some("20"));
        assert_eq!(reply.header("ratelimit-reset"), Some("0"));
        // Nothing was charged: the whole burst is still there.
        assert_eq!(post(&mut c, &check_body("tb", "k", 20)).await.status, 200);
        // Windowed algorithms: a cost above the limit is never, too.
        let reply = post(&mut c, &check_body("fixed", "k", 6)).await;
        assert_eq!(
            (reply.status.as_u16(), reply.json()["outcome"].clone()),
            (429, json!("never"))
        );
        assert_eq!(reply.header("retry-after"), None);
        let m = node.metrics().await;
        assert_eq!(
            metric(&m, r#"gossamer_checks_total{rule="tb",outcome="never"}"#),
            1
        );
        assert_eq!(
            metric(&m, r#"gossamer_checks_total{rule="fixed",outcome="never"}"#),
            1
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_get_query_form_matches_post_for_admit_deny_and_never() {
    within(async {
        let node = TestNode::start(RULES).await;
        let mut c = node.client().await;
        let reply = get(&mut c, "/v1/check?rule=tb&key=q&cost=2").await;
        assert_eq!(reply.status, 200);
        let v = reply.json();
        assert_decision_fields(&v, false);
        assert_eq!(
            (v["remaining"].clone(), v["key"].clone()),
            (json!(18), json!("q"))
        );
        assert_eq!(reply.header("ratelimit"), Some("\"tb\";r=18;t=1"));
        // Without cost the cost is 1.
        let reply = get(&mut c, "/v1/check?rule=tb&key=q").await;
        assert_eq!(reply.json()["remaining"], 17);
        // Percent-encoded keys are decoded, and are the same key as in a POST.
        let reply = get(&mut c, "/v1/check?rule=tb&key=a%20b&cost=17").await;
        assert_eq!(
            (reply.status.as_u16(), reply.json()["key"].clone()),
            (200, json!("a b"))
        );
        let reply = post(&mut c, &check_body("tb", "a b", 4)).await;
        assert_eq!(reply.status, 429);
        assert_eq!(reply.json()["remaining"], 3);
        let reply = get(&mut c, "/v1/check?rule=tb&key=q&cost=18").await;
        assert_eq!(reply.status, 429);
        assert_eq!(reply.json()["outcome"], "denied");
        assert_eq!(reply.json()["retry_after_ms"], 100);
        assert_eq!(reply.header("retry-after"), Some("1"));
        let reply = get(&mut c, "/v1/check?rule=tb&key=q&cost=21").await;
        assert_eq!(reply.status, 429);
        assert_eq!(reply.json()["outcome"], "never");
        assert_eq!(reply.json()["retry_after_ms"], Value::Null);
        assert_eq!(reply.header("retry-after"), None);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_key_of_exactly_1024_bytes_is_accepted() {
    within(async {
        let node = TestNode::start(RULES).await;
        let mut c = node.client().await;
        let key = "k".repeat(1024);
        let reply = post(&mut c, &check_body("tb", &key, 1)).await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.json()["key"], key.as_str());
        let reply = get(&mut c, &format!("/v1/check?rule=tb&key={key}")).await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.json()["remaining"], 18);
        // Bytes, not characters: 512 two-byte characters are 1024 bytes.
        let wide = "é".repeat(512);
        let reply = post(&mut c, &check_body("tb", &wide, 1)).await;
        assert_eq!(reply.status, 200);
    })
    .await;
}

// ---------------------------------------------------------------------------------------
// Algorithms over HTTP, on the manual clock
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_bucket_admits_burst_then_refills_at_rate_with_exact_retry_after() {
    within(async {
        let node = TestNode::start(RULES).await;
        let mut c = node.client().await;
        for i in 0..20 {
            let reply = post(&mut c, &check_body("tb", "k", 1)).await;
            assert_eq!(reply.status, 200, "check {i}");
            assert_eq!(reply.json()["remaining"], 19 - i);
        }
        let reply = post(&mut c, &check_body("tb", "k", 1)).await;
        assert_eq!(
            summary(&reply),
            (429, false, "denied".into(), 0, json!(100), 2000)
        );
        node.advance(99 * MILLISECOND);
        let reply = post(&mut c, &check_body("tb", "k", 1)).await;
        assert_eq!(
            summary(&reply),
            (429, false, "denied".into(), 0, json!(1), 1901)
        );
        node.advance(MILLISECOND);
        let reply = post(&mut c, &check_body("tb", "k", 1)).await;
        assert_eq!(
            summary(&reply),
            (200, true, "allowed".into(), 0, json!(0), 2000)
        );
        // One token per 100 ms: a cost of 3 needs 300 ms.
        let reply = post(&mut c, &check_body("tb", "k", 3)).await;
        assert_eq!(reply.json()["retry_after_ms"], 300);
        node.advance(300 * MILLISECOND);
        assert_eq!(post(&mut c, &check_body("tb", "k", 3)).await.status, 200);
        // Refill stops at the burst.
        node.advance(60 * SECOND);
        assert_eq!(post(&mut c, &check_body("tb", "k", 20)).await.status, 200);
        assert_eq!(post(&mut c, &check_body("tb", "k", 1)).await.status, 429);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaky_bucket_polices_to_one_per_interval_without_holding() {
    within(async {
        let node = TestNode::start(RULES).await;
        let mut c = node.client().await;
        let reply = post(&mut c, &check_body("leaky", "k", 1)).await;
        assert_eq!(
            summary(&reply),
            (200, true, "allowed".into(), 0, json!(0), 100)
        );
        assert_decision_fields(&reply.json(), false);
        // A rule without max_wait never holds a caller, whatever it asks for.
        let reply = post(
            &mut c,
            &json!({"rule": "leaky", "key": "k", "wait_ms": 10_000}),
        )
        .await;
        assert_eq!(
            summary(&reply),
            (429, false, "denied".into(), 0, json!(100), 100)
        );
        assert_eq!(reply.header("retry-after"), Some("1"));
        node.advance(50 * MILLISECOND);
        let reply = post(&mut c, &check_body("leaky", "k", 1)).await;
        assert_eq!(reply.json()["retry_after_ms"], 50);
        node.advance(50 * MILLISECOND);
        // Then exactly one every 100 ms.
        for step in 0..5 {
            let reply = post(&mut c, &check_body("leaky", "k", 1)).await;
            assert_eq!(reply.status, 200, "step {step}");
            let reply = post(&mut c, &check_body("leaky", "k", 1)).await;
            assert_eq!(reply.status, 429, "step {step}");
            assert_eq!(reply.json()["retry_after_ms"], 100, "step {step}");
            node.advance(100 * MILLISECOND);
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leaky_bucket_shaping_holds_request_until_clock_passes_the_wait() {
    within(async {
        let node = TestNode::start(RULES).await;
        let allowed = r#"gossamer_checks_total{rule="shaped",outcome="allowed"}"#;
        let mut c = node.client().await;
        let body = json!({"rule": "shaped", "key": "k", "wait_ms": 1000});
        // The first place is free: answered at once, and no waited_ms.
        let first = post(&mut c, &body).await;
        assert_eq!(
            summary(&first),
            (200, true, "allowed".into(), 0, json!(0), 100)
        );
        assert_decision_fields(&first.json(), false);

        let second = spawn_post(&node, body.clone());
        wait_for_metric(&node, allowed, 2).await;
        let third = spawn_post(&node, body.clone());
        wait_for_metric(&node, allowed, 3).await;
        settle().await;
        assert!(
            !second.is_finished(),
            "held request answered before the clock moved"
        );
        assert!(
            !third.is_finished(),
            "held request answered before the clock moved"
        );

        node.advance(99 * MILLISECOND);
        settle().await;
        assert!(!second.is_finished(), "held request answered 1 ms early");

        node.advance(MILLISECOND);
        let second = join(second).await;
        assert_eq!(
            summary(&second),
            (200, true, "allowed".into(), 0, json!(0), 200)
        );
        assert_eq!(second.json()["waited_ms"], 100);
        assert_decision_fields(&second.json(), true);
        assert_eq!(second.header("retry-after"), None);
        assert_eq!(
            second.header("ratelimit-policy"),
            Some("\"shaped\";q=10;w=1")
        );
        settle().await;
        assert!(!third.is_finished(), "third request must wait 200 ms");

        node.advance(100 * MILLISECOND);
        let third = join(third).await;
        assert_eq!(third.status, 200);
        assert_eq!(third.json()["waited_ms"], 200);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leaky_bucket_shaping_wait_is_capped_by_request_wait_ms_and_rule_max_wait() {
    within(async {
        let node = TestNode::start(RULES).await;
        let allowed = r#"gossamer_checks_total{rule="shaped",outcome="allowed"}"#;
        let mut c = node.client().await;
        assert_eq!(
            post(&mut c, &check_body("shaped", "k", 1)).await.status,
            200
        );
        // The next place is 100 ms away: a caller willing to wait 99 ms is denied at once.
        let reply = post(
            &mut c,
            &json!({"rule": "shaped", "key": "k", "wait_ms": 99}),
        )
        .await;
        assert_eq!(
            summary(&reply),
            (429, false, "denied".into(), 0, json!(100), 100)
        );
        assert_eq!(reply.header("retry-after"), Some("1"));
        // Without wait_ms a caller is never held.
        let reply = post(&mut c, &check_body("shaped", "k", 1)).await;
        assert_eq!(reply.status, 429);
        // wait_ms = 100 is just enough.
        let held_100 = spawn_post(&node, json!({"rule": "shaped", "key": "k", "wait_ms": 100}));
        wait_for_metric(&node, allowed, 2).await;
        // 200 ms fits under the rule's 250 ms even though the caller offers 10 s.
        let held_200 = spawn_post(
            &node,
            json!({"rule": "shaped", "key": "k", "wait_ms": 10_000}),
        );
        wait_for_metric(&node, allowed, 3).await;
        // 300 ms does not: the rule caps the caller's 10 s, and the answer is immediate.
        let reply = post(
            &mut c,
            &json!({"rule": "shaped", "key": "k", "wait_ms": 10_000}),
        )
        .await;
        assert_eq!(
            summary(&reply),
            (429, false, "denied".into(), 0, json!(300), 300)
        );
        assert_eq!(reply.json().get("waited_ms"), None);
        settle().await;
        assert!(!held_100.is_finished() && !held_200.is_finished());
        node.advance(300 * MILLISECOND);
        let held_100 = join(held_100).await;
        let held_200 = join(held_200).await;
        assert_eq!(
            (
                held_100.status.as_u16(),
                held_100.json()["waited_ms"].clone()
            ),
            (200, json!(100))
        );
        assert_eq!(
            (
                held_200.status.as_u16(),
                held_200.json()["waited_ms"].clone()
            ),
            (200, json!(200))
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_window_denies_until_next_multiple_of_period() {
    within(async {
        let node = TestNode::start(RULES).await;
        let mut c = node.client().await;
        // Start half-way into the minute: the window still ends on the minute.
        node.advance(30 * SECOND);
        for i in 0..5 {
            let reply = post(&mut c, &check_body("fixed", "k", 1)).await;
            assert_eq!(
                summary(&reply),
                (200, true, "allowed".into(), 4 - i, json!(0), 30_000)
            );
        }
        assert_eq!(
            post(&mut c, &check_body("fixed", "k", 1))
                .await
                .header("ratelimit"),
            Some("\"fixed\";r=0;t=30")
        );
        let reply = post(&mut c, &check_body("fixed", "k", 1)).await;
        assert_eq!(
            summary(&reply),
            (429, false, "denied".into(), 0, json!(30_000), 30_000)
        );
        assert_eq!(reply.header("retry-after"), Some("30"));
        assert_eq!(reply.header("ratelimit-policy"), Some("\"fixed\";q=5;w=60"));
        node.advance(30 * SECOND - 1);
        let reply = post(&mut c, &check_body("fixed", "k", 1)).await;
        assert_eq!(
            summary(&reply),
            (429, false, "denied".into(), 0, json!(1), 1)
        );
        node.advance(1);
        // A new window: the full limit again, ending a whole period later.
        let reply = post(&mut c, &check_body("fixed", "k", 5)).await;
        assert_eq!(
            summary(&reply),
            (200, true, "allowed".into(), 0, json!(0), 60_000)
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_window_log_allows_no_double_burst_across_window_edge() {
    within(async {
        let node = TestNode::start(RULES).await;
        let mut c = node.client().await;
        node.advance(50 * SECOND);
        for i in 0..5 {
            let reply = post(&mut c, &check_body("log", "k", 1)).await;
            assert_eq!(
                summary(&reply),
                (200, true, "allowed".into(), 4 - i, json!(0), 60_000)
            );
        }
        // On the minute a fixed window would admit 5 more; the log admits none.
        node.advance(10 * SECOND);
        let reply = post(&mut c, &check_body("log", "k", 1)).await;
        assert_eq!(
            summary(&reply),
            (429, false, "denied".into(), 0, json!(50_000), 50_000)
        );
        assert_eq!(reply.header("retry-after"), Some("50"));
        node.advance(50 * SECOND - 1);
        let reply = post(&mut c, &check_body("log", "k", 1)).await;
        assert_eq!(
            summary(&reply),
            (429, false, "denied".into(), 0, json!(1), 1)
        );
        node.advance(1);
        let reply = post(&mut c, &check_body("log", "k", 5)).await;
        assert_eq!(
            summary(&reply),
            (200, true, "allowed".into(), 0, json!(0), 60_000)
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_window_counter_weights_previous_window_by_overlap() {
    within(async {
        let node = TestNode::start(RULES).await;
        let mut c = node.client().await;
        node.advance(30 * SECOND);
        let reply = post(&mut c, &check_body("counter", "k", 10)).await;
        assert_eq!(reply.status, 200);
        // 15 s into the next minute the previous 10 count for 45/60: 7.5 used.
        node.advance(45 * SECOND);
        let reply = post(&mut c, &check_body("counter", "k", 1)).await;
        assert_eq!(
            summary(&reply),
            (200, true, "allowed".into(), 1, json!(0), 105_000)
        );
        let reply = post(&mut c, &check_body("counter", "k", 1)).await;
        assert_eq!(
            summary(&reply),
            (200, true, "allowed".into(), 0, json!(0), 105_000)
        );
        // 9.5 used: one more does not fit until the weight has fallen to 7 (18 s in).
        let reply = post(&mut c, &check_body("counter", "k", 1)).await;
        assert_eq!(
            summary(&reply),
            (429, false, "denied".into(), 0, json!(3_000), 105_000)
        );
        assert_eq!(reply.header("retry-after"), Some("3"));
        node.advance(3 * SECOND - 1);
        assert_eq!(
            post(&mut c, &check_body("counter", "k", 1)).await.status,
            429
        );
        node.advance(1);
        let reply = post(&mut c, &check_body("counter", "k", 1)).await;
        assert_eq!(
            summary(&reply),
            (200, true, "allowed".into(), 0, json!(0), 102_000)
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn composite_rule_denial_by_one_limit_charges_neither_and_reports_binding_limit() {
    within(async {
        let node = TestNode::start(RULES).await;
        let mut c = node.client().await;
        let policy = "\"combo#0\";q=1;w=1, \"combo#1\";q=25;w=60";

        // Key a: the bucket (1/s, burst 20) denies; the log (25/min) must not count it.
        let reply = post(&mut c, &check_body("combo", "a", 20)).await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.header("ratelimit-policy"), Some(policy));
        assert_eq!(reply.header("ratelimit"), Some("\"combo#0\";r=0;t=20"));
        assert_eq!(reply.json()["limit"], 1);
        let reply = post(&mut c, &check_body("combo", "a", 1)).await;
        assert_eq!(
            summary(&reply),
            (429, false, "denied".into(), 0, json!(1_000), 20_000)
        );
        assert_eq!(reply.json()["limit"], 1);
        assert_eq!(reply.header("ratelimit-policy"), Some(policy));
        assert_eq!(reply.header("ratelimit"), Some("\"combo#0\";r=0;t=20"));
        assert_eq!(reply.header("ratelimit-limit"), Some("1"));
        assert_eq!(reply.header("retry-after"), Some("1"));

        // Key b: fill the log to 20 now.
        assert_eq!(
            post(&mut c, &check_body("combo", "b", 20)).await.status,
            200
        );

        // 5 s on, key a's bucket holds 5 and its log has room for exactly 5 (had the denial
        // been logged, only 4).
        node.advance(5 * SECOND);
        let reply = post(&mut c, &check_body("combo", "a", 5)).await;
        assert_eq!(
            reply.status, 200,
            "the bucket's denial was charged to the log"
        );

        // Key b at 59 s: the bucket is full (20), the log holds 20 that leave at 60 s.
        node.advance(54 * SECOND);
        let reply = post(&mut c, &check_body("combo", "b", 5)).await;
        assert_eq!(reply.status, 200);
        // Admitted: reported against the limit with the fewest left (the log).
        assert_eq!(reply.header("ratelimit"), Some("\"combo#1\";r=0;t=60"));
        assert_eq!(reply.json()["limit"], 25);
        // The log is full: it denies 10 although the bucket (15) has room.
        let reply = post(&mut c, &check_body("combo", "b", 10)).await;
        assert_eq!(
            summary(&reply),
            (429, false, "denied".into(), 0, json!(1_000), 60_000)
        );
        assert_eq!(reply.json()["limit"], 25);
        assert_eq!(reply.header("ratelimit"), Some("\"combo#1\";r=0;t=60"));
        assert_eq!(reply.header("ratelimit-limit"), Some("25"));
        assert_eq!(reply.header("ratelimit-policy"), Some(policy));
        // At 60 s the log's 20 have left; the bucket holds 15 + 1 = 16 only if the denied 10
        // were not taken from it.
        node.advance(SECOND);
        let reply = post(&mut c, &check_body("combo", "b", 16)).await;
        assert_eq!(
            reply.status, 200,
            "the log's denial was charged to the bucket"
        );
        assert_eq!(post(&mut c, &check_body("combo", "b", 1)).await.status, 429);
    })
    .await;
}

// ---------------------------------------------------------------------------------------
// Status, cluster, health, metrics
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_consumes_nothing_and_reports_whether_one_more_would_be_denied() {
    within(async {
        let node = TestNode::start(RULES).await;
        let mut c = node.client().await;
        // An unknown key: full limit, repeatedly, and nothing stored.
        for _ in 0..3 {
            let reply = get(&mut c, "/v1/status?rule=fixed&key=s").await;
            assert_eq!(reply.status, 200);
            let v = reply.json();
            assert_decision_fields(&v, false);
            assert_eq!(
                v,
                json!({
                    "allowed": true, "rule": "fixed", "key": "s", "limit": 5, "remaining": 5,
                    "reset_after_ms": 0, "retry_after_ms": 0, "outcome": "allowed",
                })
            );
            assert_eq!(reply.header("ratelimit"), Some("\"fixed\";r=5;t=0"));
            assert_eq!(reply.header("ratelimit-policy"), Some("\"fixed\";q=5;w=60"));
        }
        let m = node.metrics().await;
        assert_eq!(metric(&m, r#"gossamer_active_keys{rule="fixed"}"#), 0);
        assert_eq!(
            metric(
                &m,
                r#"gossamer_checks_total{rule="fixed",outcome="allowed"}"#
            ),
            0
        );
        assert_eq!(metric(&m, "gossamer_check_duration_seconds_count"), 0);

        assert_eq!(post(&mut c, &check_body("fixed", "s", 3)).await.status, 200);
        for _ in 0..3 {
            let v = get(&mut c, "/v1/status?rule=fixed&key=s").await.json();
            assert_eq!(
                (v["allowed"].clone(), v["remaining"].clone()),
                (json!(true), json!(2))
            );
        }
        assert_eq!(post(&mut c, &check_body("fixed", "s", 2)).await.status, 200);
        for _ in 0..3 {
            let reply = get(&mut c, "/v1/status?rule=fixed&key=s").await;
            assert_eq!(reply.status, 200, "status is 200 even when exhausted");
            assert_eq!(
                summary(&reply),
                (200, false, "denied".into(), 0, json!(60_000), 60_000)
            );
            assert_eq!(reply.header("ratelimit-remaining"), Some("0"));
            assert_eq!(
                reply.header("retry-after"),
                None,
                "Retry-After only on a 429"
            );
        }
        let m = node.metrics().await;
        assert_eq!(
            metric(
                &m,
                r#"gossamer_checks_total{rule="fixed",outcome="allowed"}"#
            ),
            2
        );
        assert_eq!(
            metric(
                &m,
                r#"gossamer_checks_total{rule="fixed",outcome="denied"}"#
            ),
            0
        );
        assert_eq!(metric(&m, "gossamer_check_duration_seconds_count"), 2);
        // Status never spends: one more real check is still denied for the same reason.
        let reply = post(&mut c, &check_body("fixed", "s", 1)).await;
        assert_eq!(reply.status, 429);
        assert_eq!(reply.json()["retry_after_ms"], 60_000);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_of_partly_spent_token_bucket_reports_remaining_and_reset() {
    within(async {
        let node = TestNode::start(RULES).await;
        let mut c = node.client().await;
        assert_eq!(post(&mut c, &check_body("tb", "s", 19)).await.status, 200);
        let v = node.status("tb", "s").await;
        assert_eq!(
            v,
            json!({
                "allowed": true, "rule": "tb", "key": "s", "limit": 10, "remaining": 1,
                "reset_after_ms": 1900, "retry_after_ms": 0, "outcome": "allowed",
            })
        );
        assert_eq!(node.status("tb", "s").await, v);
        assert_eq!(post(&mut c, &check_body("tb", "s", 1)).await.status, 200);
        let v = node.status("tb", "s").await;
        assert_eq!(
            (v["allowed"].clone(), v["retry_after_ms"].clone()),
            (json!(false), json!(100))
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_of_one_lists_this_node_and_says_it_is_not_secure() {
    within(async {
        let gossip = std::net::UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let with_gossip =
            format!("{RULES}\n[cluster]\ngossip = \"{gossip}\"\nquic = \"127.0.0.1:0\"\n");
        let node = TestNode::start(&with_gossip).await;
        let reply = get(&mut node.client().await, "/v1/cluster").await;
        assert_eq!(reply.status, 200);
        let v = reply.json();
        assert_eq!(v["clustered"], json!(true));
        assert_eq!(v["secure"], json!(false));
        assert_eq!(v["ready"], json!(true));
        let members = v["members"].as_array().unwrap();
        assert_eq!(members.len(), 1);
        assert_eq!(members[0]["node_id"], json!("test-node"));
        assert_eq!(members[0]["gossip"], json!(gossip.to_string()));
        assert_eq!(members[0]["alive"], json!(true));
        assert_eq!(members[0]["self"], json!(true));
        assert!(members[0]["generation"].as_u64().unwrap() > 0);
        let plain = TestNode::start(RULES).await;
        let reply = get(&mut plain.client().await, "/v1/cluster").await;
        assert_eq!(
            reply.json(),
            json!({
                "node_id": "test-node",
                "clustered": false,
                "secure": false,
                "members": [{"node_id": "test-node", "gossip": null, "alive": true, "self": true}],
            })
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_and_readyz_answer_200() {
    within(async {
        let node = TestNode::start(RULES).await;
        let mut c = node.client().await;
        let reply = get(&mut c, "/healthz").await;
        assert_eq!(
            (reply.status.as_u16(), reply.json()),
            (200, json!({"status": "ok"}))
        );
        let reply = get(&mut c, "/readyz").await;
        assert_eq!(
            (reply.status.as_u16(), reply.json()),
            (200, json!({"status": "ready"}))
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_checks_by_rule_and_outcome_and_errors_by_code() {
    within(async {
        let node = TestNode::start(RULES).await;
        let mut c = node.client().await;
        let before = node.metrics().await;
        assert_eq!(
            metric(
                &before,
                r#"gossamer_checks_total{rule="tb",outcome="allowed"}"#
            ),
            0
        );
        assert_eq!(
            metric(
                &before,
                r#"gossamer_check_duration_seconds_bucket{le="+Inf"}"#
            ),
            0
        );

        for _ in 0..3 {
            assert_eq!(post(&mut c, &check_body("tb", "m", 6)).await.status, 200);
        }
        assert_eq!(post(&mut c, &check_body("tb", "m", 6)).await.status, 429);
        assert_eq!(post(&mut c, &check_body("tb", "m", 99)).await.status, 429);
        assert_eq!(post(&mut c, &check_body("fixed", "m", 1)).await.status, 200);
        let reply = c
            .send(Method::POST, "/v1/check", "{not json")
            .await
            .expect("reply");
        assert_eq!(reply.status, 400);
        assert_eq!(get(&mut c, "/v1/check?rule=nope&key=m").await.status, 404);

        let m = node.metrics().await;
        for (series, n) in [
            (r#"gossamer_checks_total{rule="tb",outcome="allowed"}"#, 3),
            (r#"gossamer_checks_total{rule="tb",outcome="denied"}"#, 1),
            (r#"gossamer_checks_total{rule="tb",outcome="never"}"#, 1),
            (
                r#"gossamer_checks_total{rule="tb",outcome="store_full"}"#,
                0,
            ),
            (
                r#"gossamer_checks_total{rule="fixed",outcome="allowed"}"#,
                1,
            ),
            (r#"gossamer_checks_total{rule="log",outcome="allowed"}"#, 0),
            (r#"gossamer_check_duration_seconds_bucket{le="+Inf"}"#, 6),
            ("gossamer_check_duration_seconds_count", 6),
            (r#"gossamer_active_keys{rule="tb"}"#, 1),
            (r#"gossamer_active_keys{rule="fixed"}"#, 1),
            (r#"gossamer_active_keys{rule="log"}"#, 0),
            ("gossamer_evictions_total", 0),
            (r#"gossamer_http_errors_total{error="malformed_json"}"#, 1),
            (r#"gossamer_http_errors_total{error="unknown_rule"}"#, 1),
            (r#"gossamer_http_errors_total{error="invalid_cost"}"#, 0),
        ] {
            assert_eq!(metric(&m, series), n, "{series}");
        }
        assert!(m.contains("# TYPE gossamer_checks_total counter\n"));
        assert!(m.contains("# TYPE gossamer_check_duration_seconds histogram\n"));
        assert!(m.contains(r#"gossamer_check_duration_seconds_bucket{le="0.000005"} "#));
        assert!(m.contains("gossamer_check_duration_seconds_sum "));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_evictions_of_keys_whose_state_is_fresh_again() {
    within(async {
        let config = RULES.replace(
            "node_id = \"test-node\"",
            "node_id = \"test-node\"\nsweep_interval = \"10ms\"",
        );
        let node = TestNode::start(&config).await;
        let mut c = node.client().await;
        assert_eq!(post(&mut c, &check_body("tb", "e", 1)).await.status, 200);
        assert_eq!(post(&mut c, &check_body("tb", "f", 1)).await.status, 200);
        // Let a few sweeps run: the keys are not fresh, so nothing may go.
        settle().await;
        let m = node.metrics().await;
        assert_eq!(metric(&m, r#"gossamer_active_keys{rule="tb"}"#), 2);
        assert_eq!(metric(&m, "gossamer_evictions_total"), 0);
        // 100 ms refills one token: both keys are fresh again, and the sweeper drops them.
        node.advance(100 * MILLISECOND);
        wait_for_metric(&node, "gossamer_evictions_total", 2).await;
        assert_eq!(
            metric(&node.metrics().await, r#"gossamer_active_keys{rule="tb"}"#),
            0
        );
    })
    .await;
}

// ---------------------------------------------------------------------------------------
// Bad input: a 4xx with {"error","message"}, and no counter moves
// ---------------------------------------------------------------------------------------

/// A node where ("tb", "victim") has been charged once (remaining 19).
async fn node_with_victim() -> TestNode {
    let node = TestNode::start(RULES).await;
    let reply = post(&mut node.client().await, &check_body("tb", "victim", 1)).await;
    assert_eq!(reply.status, 200);
    assert_eq!(node.status("tb", "victim").await["remaining"], 19);
    node
}

const VICTIM: (&str, &str) = ("tb", "victim");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_json_is_400_malformed_json() {
    within(async {
        let node = node_with_victim().await;
        for body in [
            r#"{"rule":"tb","key":"victim""#,
            r#"{"rule":"tb","key":"victim"} trailing"#,
            r#"{rule:"tb"}"#,
            "",
        ] {
            assert_refused(
                &node,
                VICTIM,
                Method::POST,
                "/v1/check",
                body,
                400,
                "malformed_json",
            )
            .await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_that_is_not_an_object_is_400() {
    within(async {
        let node = node_with_victim().await;
        for body in ["null", "42", "\"tb\"", "true"] {
            assert_refused(
                &node,
                VICTIM,
                Method::POST,
                "/v1/check",
                body,
                400,
                "malformed_json",
            )
            .await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]

async fn json_array_body_is_400_malformed_json_and_charges_nothing() {
    within(async {
        let node = node_with_victim().await;
        for body in [r#"["tb","victim"]"#, r#"["tb","victim",1]"#, "[]"] {
            assert_refused(
                &node,
                VICTIM,
                Method::POST,
                "/v1/check",
                body,
                400,
                "malformed_json",
            )
            .await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_or_empty_rule_or_key_is_400_missing_field() {
    within(async {
        let node = node_with_victim().await;
        for (body, field) in [
            (r#"{"key":"victim"}"#, "rule"),
            (r#"{"rule":"","key":"victim"}"#, "rule"),
            (r#"{"rule":"tb"}"#, "key"),
            (r#"{"rule":"tb","key":""}"#, "key"),
            (r#"{}"#, "rule"),
        ] {
            let reply = assert_refused(
                &node,
                VICTIM,
                Method::POST,
                "/v1/check",
                body,
                400,
                "missing_field",
            )
            .await;
            let message = reply.json()["message"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            assert!(message.contains(field), "{body}: {message}");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cost_that_is_not_a_whole_number_of_at_least_one_is_400_invalid_cost() {
    within(async {
        let node = node_with_victim().await;
        for cost in [
            "0",
            "-1",
            "1.5",
            "\"2\"",
            "1.0",
            "1e3",
            "[1]",
            "99999999999999999999999",
        ] {
            let body = format!(r#"{{"rule":"tb","key":"victim","cost":{cost}}}"#);
            let reply = assert_refused(
                &node,
                VICTIM,
                Method::POST,
                "/v1/check",
                body,
                400,
                "invalid_cost",
            )
            .await;
            assert!(
                reply.json()["message"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("cost")
            );
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_wait_ms_is_400_invalid_wait() {
    within(async {
        let node = node_with_victim().await;
        for wait in ["-1", "1.5", "\"100\"", "{}", "true"] {
            let body = format!(r#"{{"rule":"tb","key":"victim","wait_ms":{wait}}}"#);
            assert_refused(
                &node,
                VICTIM,
                Method::POST,
                "/v1/check",
                body,
                400,
                "invalid_wait",
            )
            .await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_field_is_400_unknown_field_naming_it() {
    within(async {
        let node = node_with_victim().await;
        let reply = assert_refused(
            &node,
            VICTIM,
            Method::POST,
            "/v1/check",
            r#"{"rule":"tb","key":"victim","cots":1}"#,
            400,
            "unknown_field",
        )
        .await;
        assert!(
            reply.json()["message"]
                .as_str()
                .unwrap_or_default()
                .contains("cots")
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_rule_is_404_unknown_rule() {
    within(async {
        let node = node_with_victim().await;
        let reply = assert_refused(
            &node,
            VICTIM,
            Method::POST,
            "/v1/check",
            r#"{"rule":"nope","key":"victim"}"#,
            404,
            "unknown_rule",
        )
        .await;
        assert!(
            reply.json()["message"]
                .as_str()
                .unwrap_or_default()
                .contains("nope")
        );
        assert_refused(
            &node,
            VICTIM,
            Method::GET,
            "/v1/status?rule=nope&key=victim",
            "",
            404,
            "unknown_rule",
        )
        .await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_over_64_kib_is_413_and_64_kib_exactly_is_accepted() {
    within(async {
        let node = node_with_victim().await;
        let json = r#"{"rule":"tb","key":"victim"}"#;
        let mut over = json.to_owned();
        over.push_str(&" ".repeat(64 * 1024 + 1 - json.len()));
        assert_eq!(over.len(), 64 * 1024 + 1);
        assert_refused(
            &node,
            VICTIM,
            Method::POST,
            "/v1/check",
            over,
            413,
            "body_too_large",
        )
        .await;
        // The boundary itself is fine (and is a real check).
        let mut exact = json.to_owned();
        exact.push_str(&" ".repeat(64 * 1024 - json.len()));
        let reply = node
            .client()
            .await
            .send(Method::POST, "/v1/check", exact)
            .await
            .expect("reply");
        assert_eq!(reply.status, 200);
        assert_eq!(reply.json()["remaining"], 18);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_method_is_405_with_allow_header() {
    within(async {
        let node = node_with_victim().await;
        let body = r#"{"rule":"tb","key":"victim"}"#;
        for (method, path, allow) in [
            (Method::PUT, "/v1/check", "GET, POST"),
            (Method::DELETE, "/v1/check", "GET, POST"),
            (Method::PATCH, "/v1/check?rule=tb&key=victim", "GET, POST"),
            (Method::POST, "/v1/status?rule=tb&key=victim", "GET"),
            (Method::DELETE, "/metrics", "GET"),
            (Method::POST, "/healthz", "GET"),
        ] {
            let reply = assert_refused(
                &node,
                VICTIM,
                method.clone(),
                path,
                body,
                405,
                "method_not_allowed",
            )
            .await;
            assert_eq!(reply.header("allow"), Some(allow), "{method} {path}");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_on_check_is_405_and_charges_nothing() {
    within(async {
        let node = TestNode::start(RULES).await;
        let mut c = node.client().await;
        for _ in 0..3 {
            let reply = c
                .send(Method::HEAD, "/v1/check?rule=fixed&key=h", Bytes::new())
                .await
                .unwrap();
            assert_eq!(reply.status, 405);
            assert_eq!(reply.header("allow"), Some("GET, POST"));
        }
        let v = get(&mut c, "/v1/status?rule=fixed&key=h").await.json();
        assert_eq!(v["remaining"], 5);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_path_is_404_not_found() {
    within(async {
        let node = node_with_victim().await;
        for path in [
            "/",
            "/v1",
            "/v1/check/extra",
            "/v2/check?rule=tb&key=victim",
        ] {
            assert_refused(&node, VICTIM, Method::GET, path, "", 404, "not_found").await;
        }
        assert_refused(
            &node,
            VICTIM,
            Method::POST,
            "/v1/chek",
            r#"{"rule":"tb","key":"victim"}"#,
            404,
            "not_found",
        )
        .await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_over_1024_bytes_is_400_key_too_long() {
    within(async {
        let node = node_with_victim().await;
        let long = "k".repeat(1025);
        let body = check_body("tb", &long, 1).to_string();
        let reply = assert_refused(
            &node,
            VICTIM,
            Method::POST,
            "/v1/check",
            body,
            400,
            "key_too_long",
        )
        .await;
        assert!(
            reply.json()["message"]
                .as_str()
                .unwrap_or_default()
                .contains("1025")
        );
        let path = format!("/v1/check?rule=tb&key={long}");
        assert_refused(&node, VICTIM, Method::GET, &path, "", 400, "key_too_long").await;
        let path = format!("/v1/status?rule=tb&key={long}");
        assert_refused(&node, VICTIM, Method::GET, &path, "", 400, "key_too_long").await;
        // 513 two-byte characters: 1026 bytes.
        let wide = check_body("tb", &"é".repeat(513), 1).to_string();
        assert_refused(
            &node,
            VICTIM,
            Method::POST,
            "/v1/check",
            wide,
            400,
            "key_too_long",
        )
        .await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_query_on_get_check_and_status_is_refused_like_a_bad_body() {
    within(async {
        let node = node_with_victim().await;
        for (path, status, code) in [
            ("/v1/check?rule=tb&key=victim&cost=0", 400, "invalid_cost"),
            ("/v1/check?rule=tb&key=victim&cost=-1", 400, "invalid_cost"),
            ("/v1/check?rule=tb&key=victim&cost=1.5", 400, "invalid_cost"),
            ("/v1/check?rule=tb&key=victim&cost=two", 400, "invalid_cost"),
            ("/v1/check?rule=tb&key=victim&cost=", 400, "invalid_cost"),
            (
                "/v1/check?rule=tb&key=victim&cost=99999999999999999999999",
                400,
                "invalid_cost",
            ),
            (
                "/v1/check?rule=tb&key=victim&wait_ms=-5",
                400,
                "invalid_wait",
            ),
            (
                "/v1/check?rule=tb&key=victim&wait_ms=soon",
                400,
                "invalid_wait",
            ),
            ("/v1/check?rule=tb", 400, "missing_field"),
            ("/v1/check?rule=tb&key=", 400, "missing_field"),
            ("/v1/check?key=victim", 400, "missing_field"),
            ("/v1/check", 400, "missing_field"),
            ("/v1/check?rule=tb&key=victim&cots=1", 400, "unknown_field"),
            ("/v1/check?rule=nope&key=victim", 404, "unknown_rule"),
            ("/v1/check?rule=tb&rule=tb&key=victim", 400, "invalid_query"),
            ("/v1/status?rule=tb", 400, "missing_field"),
            ("/v1/status?key=victim", 400, "missing_field"),
            ("/v1/status?rule=tb&key=victim&cost=1", 400, "unknown_field"),
            (
                "/v1/status?rule=tb&key=victim&wait_ms=1",
                400,
                "unknown_field",
            ),
            (
                "/v1/status?rule=tb&key=victim&bogus=1",
                400,
                "unknown_field",
            ),
        ] {
            assert_refused(&node, VICTIM, Method::GET, path, "", status, code).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_inputs_never_produce_5xx_and_node_keeps_answering() {
    within(async {
        let node = node_with_victim().await;
        let deep_array = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        let deep_object = format!("{}1{}", r#"{"a":"#.repeat(10_000), "}".repeat(10_000));
        let deep_open = "[".repeat(10_000);
        let huge_key = check_body("tb", &"k".repeat(2 * 1024 * 1024), 1).to_string();
        let nul_in_string = b"{\"rule\":\"tb\",\"key\":\"a\0b\"}".to_vec();
        let invalid_utf8_key = b"{\"rule\":\"tb\",\"key\":\"\xff\xfe\"}".to_vec();
        let bodies: Vec<(&str, Vec<u8>)> = vec![
            ("empty", b"".to_vec()),
            ("null", b"null".to_vec()),
            ("empty array", b"[]".to_vec()),
            ("empty object", b"{}".to_vec()),
            ("string", b"\"tb\"".to_vec()),
            ("number", b"42".to_vec()),
            ("deep array", deep_array.into_bytes()),
            ("deep object", deep_object.into_bytes()),
            ("unclosed deep array", deep_open.into_bytes()),
            (
                "cost 1e400",
                br#"{"rule":"tb","key":"k","cost":1e400}"#.to_vec(),
            ),
            (
                "cost 1e30",
                br#"{"rule":"tb","key":"k","cost":1e30}"#.to_vec(),
            ),
            (
                "cost 2^64",
                br#"{"rule":"tb","key":"k","cost":18446744073709551616}"#.to_vec(),
            ),
            (
                "cost u64::MAX",
                br#"{"rule":"tb","key":"victim","cost":18446744073709551615}"#.to_vec(),
            ),
            (
                "cost -2^63-1",
                br#"{"rule":"tb","key":"k","cost":-9223372036854775809}"#.to_vec(),
            ),
            (
                "wait 1e400",
                br#"{"rule":"tb","key":"k","wait_ms":1e400}"#.to_vec(),
            ),
            (
                "wait -1e30",
                br#"{"rule":"tb","key":"k","wait_ms":-1e30}"#.to_vec(),
            ),
            ("invalid UTF-8", b"\xff\xfe\xfd\xfc".to_vec()),
            ("invalid UTF-8 in key", invalid_utf8_key),
            ("NUL bytes", b"\0\0\0\0".to_vec()),
            ("NUL in key", nul_in_string),
            (
                "lone surrogate",
                br#"{"rule":"tb","key":"\ud800"}"#.to_vec(),
            ),
            (
                "BOM",
                b"\xef\xbb\xbf{\"rule\":\"tb\",\"key\":\"k\"}".to_vec(),
            ),
            ("key of 2 MB", huge_key.into_bytes()),
            ("64 KiB of spaces and more", vec![b' '; 64 * 1024 + 10]),
            ("rule is a list", br#"{"rule":["tb"],"key":"k"}"#.to_vec()),
            (
                "key is an object",
                br#"{"rule":"tb","key":{"a":1}}"#.to_vec(),
            ),
            ("rule is null", br#"{"rule":null,"key":"k"}"#.to_vec()),
            (
                "duplicate field",
                br#"{"rule":"tb","rule":"tb","key":"k"}"#.to_vec(),
            ),
            (
                "path-like rule",
                br#"{"rule":"../../etc/passwd","key":"k"}"#.to_vec(),
            ),
            (
                "unknown nested field",
                br#"{"rule":"tb","key":"k","x":{"y":[1,2,{}]}}"#.to_vec(),
            ),
            (
                "cost as list",
                br#"{"rule":"tb","key":"k","cost":[1]}"#.to_vec(),
            ),
        ];
        for (name, body) in bodies {
            let reply = node
                .client()
                .await
                .send(Method::POST, "/v1/check", body)
                .await
                .unwrap_or_else(|e| panic!("{name}: no reply: {e}"));
            assert!(
                reply.status.is_client_error(),
                "{name}: status {} body {:?}",
                reply.status,
                String::from_utf8_lossy(&reply.body[..reply.body.len().min(200)])
            );
        }
        for path in [
            "/v1/check?%%%",
            "/v1/check?rule=%ff%fe&key=%00",
            "/v1/check?&&&==&",
            "/v1/check?rule=tb&key=k&cost=18446744073709551616",
            "/v1/status?rule=tb&key=k&key=k",
            "/v1/%2e%2e/metrics",
        ] {
            let reply = node
                .client()
                .await
                .get(path)
                .await
                .unwrap_or_else(|e| panic!("{path}: {e}"));
            assert!(reply.status.is_client_error(), "{path}: {}", reply.status);
        }
        let reply = get(&mut node.client().await, "/healthz").await;
        assert_eq!(reply.status, 200);
        // And it still decides correctly: the victim was only charged once.
        assert_eq!(node.status("tb", "victim").await["remaining"], 19);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]

async fn huge_cost_on_a_used_fixed_window_key_is_never_not_a_dropped_connection() {
    within(async {
        let node = TestNode::start(RULES).await;
        let mut c = node.client().await;
        assert_eq!(post(&mut c, &check_body("fixed", "k", 1)).await.status, 200);
        let reply = node
            .client()
            .await
            .post("/v1/check", &check_body("fixed", "k", u64::MAX))
            .await
            .expect("a reply, not a dropped connection");
        assert_eq!(reply.status, 429);
        assert_eq!(reply.json()["outcome"], "never");
        let reply = node
            .client()
            .await
            .get(&format!("/v1/check?rule=fixed&key=k&cost={}", u64::MAX))
            .await
            .expect("a reply, not a dropped connection");
        assert_eq!(reply.status, 429);
        assert_eq!(reply.json()["outcome"], "never");
    })
    .await;
}

// ---------------------------------------------------------------------------------------
// Concurrency, the key bound, slow clients, shutdown
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_clients_on_one_key_admit_exactly_the_limit() {
    within(async {
        let config = r#"
            [[rule]]
            name = "hot"
            algorithm = "fixed_window"
            limit = 1000
            period = "1m"
        "#;
        let node = TestNode::start(config).await;
        let clients: Vec<JoinHandle<(usize, usize)>> = (0..32)
            .map(|_| {
                let addr = node.addr;
                tokio::spawn(async move {
                    let mut client = Client::connect_addr(addr).await.expect("connect");
                    let (mut ok, mut denied) = (0, 0);
                    for _ in 0..50 {
                        let reply = client
                            .post("/v1/check", &check_body("hot", "k", 1))
                            .await
                            .expect("check");
                        match reply.status.as_u16() {
                            200 => ok += 1,
                            429 => denied += 1,
                            s => panic!("unexpected status {s}"),
                        }
                    }
                    (ok, denied)
                })
            })
            .collect();
        let mut admitted = 0;
        let mut denied = 0;
        for c in clients {
            let (ok, no) = c.await.expect("client task");
            admitted += ok;
            denied += no;
        }
        assert_eq!(admitted, 1000);
        assert_eq!(denied, 600);
        let m = node.metrics().await;
        assert_eq!(
            metric(&m, r#"gossamer_checks_total{rule="hot",outcome="allowed"}"#),
            1000
        );
        assert_eq!(
            metric(&m, r#"gossamer_checks_total{rule="hot",outcome="denied"}"#),
            600
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_key_beyond_max_keys_is_429_store_full_while_known_keys_are_served() {
    within(async {
        let config = RULES.replace(
            "node_id = \"test-node\"",
            "node_id = \"test-node\"\nmax_keys = 3",
        );
        let node = TestNode::start(&config).await;
        let mut c = node.client().await;
        for key in ["k1", "k2", "k3"] {
            assert_eq!(
                post(&mut c, &check_body("tb", key, 1)).await.status,
                200,
                "{key}"
            );
        }
        let reply = post(&mut c, &check_body("tb", "k4", 1)).await;
        assert_eq!(
            summary(&reply),
            (429, false, "store_full".into(), 0, json!(1_000), 1_000)
        );
        assert_decision_fields(&reply.json(), false);
        assert_eq!(reply.header("retry-after"), Some("1"));
        assert_eq!(reply.header("ratelimit"), Some("\"tb\";r=0;t=1"));
        // The bound is across rules.
        let reply = post(&mut c, &check_body("fixed", "k5", 1)).await;
        assert_eq!(reply.json()["outcome"], "store_full");
        // Known keys are still served and charged.
        let reply = post(&mut c, &check_body("tb", "k1", 1)).await;
        assert_eq!(
            summary(&reply),
            (200, true, "allowed".into(), 18, json!(0), 200)
        );
        let m = node.metrics().await;
        assert_eq!(
            metric(
                &m,
                r#"gossamer_checks_total{rule="tb",outcome="store_full"}"#
            ),
            1
        );
        assert_eq!(
            metric(
                &m,
                r#"gossamer_checks_total{rule="fixed",outcome="store_full"}"#
            ),
            1
        );
        assert_eq!(metric(&m, r#"gossamer_active_keys{rule="tb"}"#), 3);
        // Once a key is fresh again it gives up its place to a new one.
        node.advance(SECOND);
        assert_eq!(post(&mut c, &check_body("tb", "k4", 1)).await.status, 200);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]

async fn evictions_made_for_a_new_key_at_max_keys_are_counted() {
    within(async {
        let config = RULES.replace(
            "node_id = \"test-node\"",
            "node_id = \"test-node\"\nmax_keys = 1\nsweep_interval = \"1d\"",
        );
        let node = TestNode::start(&config).await;
        let mut c = node.client().await;
        assert_eq!(post(&mut c, &check_body("tb", "old", 1)).await.status, 200);
        node.advance(SECOND);
        // "old" is fresh again; "new" takes its place.
        assert_eq!(post(&mut c, &check_body("tb", "new", 1)).await.status, 200);
        let m = node.metrics().await;
        assert_eq!(metric(&m, r#"gossamer_active_keys{rule="tb"}"#), 1);
        assert_eq!(metric(&m, "gossamer_evictions_total"), 1);
    })
    .await;
}

const SLOW: &str = r#"
[server]
request_timeout = "200ms"

[[rule]]
name = "tb"
algorithm = "token_bucket"
limit = 10
period = "1s"
"#;

/// Reads until the peer closes (or resets) the connection; what was read.
async fn read_until_closed(stream: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_client_sending_half_the_headers_is_disconnected() {
    within(async {
        let node = TestNode::start(SLOW).await;
        let mut stream = TcpStream::connect(node.addr).await.expect("connect");
        stream
            .write_all(b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Le")
            .await
            .expect("write");
        let started = Instant::now();
        let got = tokio::time::timeout(Duration::from_secs(5), read_until_closed(&mut stream))
            .await
            .expect("the node closes a connection whose headers never finish");
        let elapsed = started.elapsed();
        assert!(
            elapsed >= Duration::from_millis(150),
            "closed after {elapsed:?}: not the timeout"
        );
        let text = String::from_utf8_lossy(&got);
        assert!(
            got.is_empty() || text.starts_with("HTTP/1.1 408"),
            "unexpected answer: {text}"
        );
        // A well-behaved client is still served.
        assert_eq!(
            post(&mut node.client().await, &check_body("tb", "k", 1))
                .await
                .status,
            200
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_client_sending_a_partial_body_gets_408_or_is_disconnected() {
    within(async {
        let node = TestNode::start(SLOW).await;
        let mut stream = TcpStream::connect(node.addr).await.expect("connect");
        stream
            .write_all(
                b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
                  Content-Length: 100\r\n\r\n{\"rule\":\"tb\",",
            )
            .await
            .expect("write");
        let started = Instant::now();
        let got = tokio::time::timeout(Duration::from_secs(5), read_until_closed(&mut stream))
            .await
            .expect("the node gives up on a body that never finishes");
        assert!(started.elapsed() >= Duration::from_millis(150));
        let text = String::from_utf8_lossy(&got);
        if !got.is_empty() {
            assert!(
                text.starts_with("HTTP/1.1 408"),
                "unexpected answer: {text}"
            );
            assert!(text.contains("\"error\":\"request_timeout\""), "{text}");
            assert!(
                text.to_ascii_lowercase().contains("connection: close"),
                "{text}"
            );
        }
        let m = node.metrics().await;
        assert_eq!(
            metric(&m, r#"gossamer_checks_total{rule="tb",outcome="allowed"}"#),
            0
        );
        if !got.is_empty() {
            assert_eq!(
                metric(&m, r#"gossamer_http_errors_total{error="request_timeout"}"#),
                1
            );
        }
        // A well-behaved client is still served.
        assert_eq!(
            post(&mut node.client().await, &check_body("tb", "k", 1))
                .await
                .status,
            200
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn graceful_shutdown_lets_held_shaping_request_finish_then_run_returns() {
    within(async {
        let mut node = TestNode::start(RULES).await;
        let allowed = r#"gossamer_checks_total{rule="shaped",outcome="allowed"}"#;
        let body = json!({"rule": "shaped", "key": "k", "wait_ms": 1000});
        assert_eq!(post(&mut node.client().await, &body).await.status, 200);
        let held = spawn_post(&node, body);
        wait_for_metric(&node, allowed, 2).await;

        let run = node.run_handle();
        node.trigger_shutdown();
        // Once the listener is gone the node is draining.
        let mut closed = false;
        for _ in 0..200 {
            if TcpStream::connect(node.addr).await.is_err() {
                closed = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(closed, "the node kept accepting connections after shutdown");
        settle().await;
        assert!(!held.is_finished(), "the held request was cut short");
        assert!(!run.is_finished(), "run returned with a request in flight");

        node.advance(100 * MILLISECOND);
        let held = join(held).await;
        assert_eq!(held.status, 200);
        assert_eq!(held.json()["waited_ms"], 100);
        tokio::time::timeout(Duration::from_secs(5), run)
            .await
            .expect("run returns once drained")
            .expect("run did not panic")
            .expect("run succeeded");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_body_in_several_pieces_is_joined_and_checked() {
    within(async {
        let node = TestNode::start(RULES).await;
        let mut stream = TcpStream::connect(node.addr).await.expect("connect");
        let body = br#"{"rule":"tb","key":"chunky","cost":3}"#;
        let mut request = b"POST /v1/check HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\
              Connection: close\r\n\r\n"
            .to_vec();
        for piece in body.chunks(7) {
            request.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
            request.extend_from_slice(piece);
            request.extend_from_slice(b"\r\n");
        }
        request.extend_from_slice(b"0\r\n\r\n");
        stream.write_all(&request).await.expect("write");
        let got = read_until_closed(&mut stream).await;
        let text = String::from_utf8_lossy(&got);
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        assert!(text.contains(r#""key":"chunky""#), "{text}");
        assert!(text.contains(r#""remaining":17"#), "{text}");
    })
    .await;
}

/// One keep-alive `POST /v1/check` on a raw stream; returns the response head and body.
async fn raw_check(stream: &mut TcpStream, key: &str) -> String {
    let body = format!(r#"{{"rule":"tb","key":"{key}"}}"#);
    let request = format!(
        "POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    // The answer is small and ends with the JSON object's closing brace.
    while !got.ends_with(b"}") {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keep_alive_connection_is_closed_after_request_timeout() {
    within(async {
        let node = TestNode::start(SLOW).await;
        let mut stream = TcpStream::connect(node.addr).await.expect("connect");
        assert!(
            raw_check(&mut stream, "idle")
                .await
                .starts_with("HTTP/1.1 200")
        );
        // Then nothing: the node closes the idle connection (request_timeout is 200 ms).
        let started = Instant::now();
        let rest = tokio::time::timeout(Duration::from_secs(5), read_until_closed(&mut stream))
            .await
            .expect("the node closes an idle keep-alive connection");
        assert!(rest.is_empty());
        assert!(started.elapsed() >= Duration::from_millis(150));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_max_connections_wait_for_a_free_slot() {
    within(async {
        let config = SLOW.replace(
            "request_timeout = \"200ms\"",
            "request_timeout = \"10s\"\nmax_connections = 2",
        );
        let node = TestNode::start(&config).await;
        let mut first = TcpStream::connect(node.addr).await.expect("connect");
        let mut second = TcpStream::connect(node.addr).await.expect("connect");
        assert!(raw_check(&mut first, "a").await.starts_with("HTTP/1.1 200"));
        assert!(
            raw_check(&mut second, "b")
                .await
                .starts_with("HTTP/1.1 200")
        );
        // A third connection is accepted by the kernel but not served while two are open.
        let mut third = TcpStream::connect(node.addr).await.expect("connect");
        let waiting = tokio::time::timeout(Duration::from_millis(300), raw_check(&mut third, "c"));
        assert!(waiting.await.is_err(), "a third connection was served");
        // Closing one frees a slot: the waiting request is then answered.
        drop(first);
        let answer = tokio::time::timeout(Duration::from_secs(5), async {
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while !got.ends_with(b"}") {
                match third.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            String::from_utf8_lossy(&got).into_owned()
        })
        .await
        .expect("served once a slot is free");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    })
    .await;
}
