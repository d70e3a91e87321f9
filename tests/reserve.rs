//! Reserve, then settle over HTTP: a real node per test on 127.0.0.1 port 0, on a
//! `ManualClock`, so every refund and expiry is decided at a time the test sets. Nothing
//! sleeps: time moves only when a test advances the clock.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use gossamer::clock::ManualClock;
use gossamer::config::Config;
use gossamer::limiter::{Nanos, SECOND};
use gossamer::server::Node;
use serde_json::{Value, json};
use tokio::sync::oneshot;

/// A whole minute since the epoch, so minute windows start exactly here.
const T0: Nanos = 1_699_999_980 * SECOND;

const RULES: &str = r#"
[server]
node_id = "test-node"
reservation_timeout = "30s"
max_reservations = 3

[[rule]]
name = "llm"
algorithm = "fixed_window"
limit = 10000
period = "1m"

[[rule]]
name = "tokens"
algorithm = "token_bucket"
limit = 100
period = "1s"
burst = 1000

[[rule]]
name = "log"
algorithm = "sliding_window_log"
limit = 10
period = "1m"
"#;

async fn within<F: Future>(body: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(20), body)
        .await
        .expect("test did not finish within 20 s")
}

/// A node serving on 127.0.0.1 with a manual clock; shut down on drop.
struct TestNode {
    addr: SocketAddr,
    clock: Arc<ManualClock>,
    shutdown: Option<oneshot::Sender<()>>,
}

/// An answer: status, headers and the JSON body.
struct Answer {
    status: u16,
    headers: hyper::HeaderMap,
    body: Value,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

impl TestNode {
    async fn start() -> TestNode {
        let mut config = Config::parse(RULES, "test.toml").expect("test config is valid");
        config.server.http = "127.0.0.1:0".parse().expect("address parses");
        let clock = Arc::new(ManualClock::new(T0));
        let node = Node::bind(config, clock.clone()).await.expect("node binds");
        let addr = node.local_addr().expect("bound address");
        let (tx, rx) = oneshot::channel::<()>();
        tokio::spawn(node.run(async move {
            let _ = rx.await;
        }));
        TestNode {
            addr,
            clock,
            shutdown: Some(tx),
        }
    }

    /// One request on a fresh connection.
    async fn send(&self, method: hyper::Method, path: &str, body: Option<String>) -> Answer {
        let mut client = gossamer_client::raw::Client::connect_addr(self.addr)
            .await
            .expect("the node accepts a connection");
        let reply = client
            .send(method, path, body.unwrap_or_default())
            .await
            .expect("the node answers");
        let status = reply.status.as_u16();
        let headers = reply.headers.clone();
        let text = String::from_utf8_lossy(&reply.body).into_owned();
        let body = if text.is_empty() || !text.starts_with(['{', '[']) {
            Value::String(text)
        } else {
            serde_json::from_str(&text).expect("a JSON body")
        };
        Answer {
            status,
            headers,
            body,
        }
    }

    async fn post(&self, path: &str, body: &Value) -> Answer {
        self.send(hyper::Method::POST, path, Some(body.to_string()))
            .await
    }

    async fn reserve(&self, rule: &str, key: &str, cost: u64) -> Answer {
        self.post(
            "/v1/reserve",
            &json!({"rule": rule, "key": key, "cost": cost}),
        )
        .await
    }

    /// Reserves `cost`, which must be admitted; the reservation's id.
    async fn reserved(&self, rule: &str, key: &str, cost: u64) -> String {
        let a = self.reserve(rule, key, cost).await;
        assert_eq!(a.status, 200, "{}", a.body);
        a.body["reservation"]
            .as_str()
            .expect("an admitted reservation has an id")
            .to_owned()
    }

    async fn settle(&self, id: &str, cost: u64) -> Answer {
        self.post("/v1/settle", &json!({"reservation": id, "cost": cost}))
            .await
    }

    async fn status(&self, rule: &str, key: &str) -> Value {
        let a = self
            .send(
                hyper::Method::GET,
                &format!("/v1/status?rule={rule}&key={key}"),
                None,
            )
            .await;
        assert_eq!(a.status, 200, "{}", a.body);
        a.body
    }

    async fn remaining(&self, rule: &str, key: &str) -> u64 {
        self.status(rule, key).await["remaining"]
            .as_u64()
            .expect("remaining")
    }

    async fn metrics(&self) -> String {
        let a = self.send(hyper::Method::GET, "/metrics", None).await;
        a.body.as_str().expect("metrics are text").to_owned()
    }

    fn advance(&self, by: Nanos) {
        self.clock.advance(by);
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

fn metric(text: &str, series: &str) -> u64 {
    let prefix = format!("{series} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no metric {series} in:\n{text}"))
        .trim()
        .parse()
        .expect("a whole number")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserve_answers_as_a_check_does_plus_the_reservation() {
    within(async {
        let node = TestNode::start().await;
        let check = node
            .post(
                "/v1/check",
                &json!({"rule": "llm", "key": "other", "cost": 2000}),
            )
            .await;
        let reserve = node.reserve("llm", "user-42", 2000).await;
        assert_eq!(reserve.status, 200);
        let mut body = reserve.body.clone();
        let id = body
            .as_object_mut()
            .unwrap()
            .remove("reservation")
            .expect("a reservation id");
        assert!(id.as_str().is_some_and(|id| id.len() == 32), "{id}");
        let mut expected = check.body.clone();
        expected["key"] = json!("user-42");
        assert_eq!(body, expected);
        for h in [
            "ratelimit-policy",
            "ratelimit",
            "ratelimit-limit",
            "ratelimit-remaining",
            "ratelimit-reset",
        ] {
            assert_eq!(reserve.header(h), check.header(h), "{h}");
        }
        assert_eq!(node.remaining("llm", "user-42").await, 8000);
        // Denied: a 429 like a check's, without a reservation, charging nothing.
        let denied = node.reserve("llm", "user-42", 9000).await;
        assert_eq!(denied.status, 429);
        assert_eq!(denied.body["outcome"], "denied");
        assert_eq!(denied.body.get("reservation"), None);
        assert_eq!(denied.header("retry-after"), Some("60"));
        let never = node.reserve("llm", "user-42", 10_001).await;
        assert_eq!(
            (never.status, &never.body["outcome"]),
            (429, &json!("never"))
        );
        assert_eq!(node.remaining("llm", "user-42").await, 8000);
        // Only POST.
        let get = node
            .send(hyper::Method::GET, "/v1/reserve?rule=llm&key=k", None)
            .await;
        assert_eq!(
            (get.status, &get.body["error"]),
            (405, &json!("method_not_allowed"))
        );
        assert_eq!(get.header("allow"), Some("POST"));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settle_below_the_reservation_gives_the_rest_back() {
    within(async {
        let node = TestNode::start().await;
        // The LLM call: reserve an estimate of 2,000 tokens, learn it took 500.
        let id = node.reserved("llm", "user-42", 2000).await;
        node.advance(5 * SECOND);
        let a = node.settle(&id, 500).await;
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(
            a.body,
            json!({
                "reservation": id, "rule": "llm", "key": "user-42", "reserved": 2000,
                "cost": 500, "refunded": 1500, "charged": 0, "unpaid": 0, "limit": 10000,
                "remaining": 9500, "reset_after_ms": 55000,
            })
        );
        assert_eq!(a.header("ratelimit"), Some("\"llm\";r=9500;t=55"));
        assert_eq!(a.header("content-type"), Some("application/json"));
        assert_eq!(node.remaining("llm", "user-42").await, 9500);
        // A bucket gets back what a bucket charged only the actual cost would hold: full
        // (1,000), the reservation empties it; 5 s later 500 have refilled, and a bucket
        // charged 400 would be full again. 500 of the 600 come back, and it is full.
        let id = node.reserved("tokens", "user-42", 1000).await;
        node.advance(5 * SECOND);
        let a = node.settle(&id, 400).await;
        assert_eq!(a.body["refunded"], 500);
        assert_eq!(node.remaining("tokens", "user-42").await, 1000);
        // A sliding log's entry is reduced.
        let id = node.reserved("log", "user-42", 8).await;
        assert_eq!(node.settle(&id, 3).await.body["remaining"], 7);
        let m = node.metrics().await;
        assert_eq!(metric(&m, "gossamer_reservations_total{event=\"made\"}"), 3);
        assert_eq!(
            metric(&m, "gossamer_reservations_total{event=\"settled\"}"),
            3
        );
        assert_eq!(
            metric(&m, "gossamer_reservation_units_total{kind=\"refunded\"}"),
            2005
        );
        assert_eq!(metric(&m, "gossamer_reservations_open"), 0);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settle_above_the_reservation_charges_the_rest_even_past_the_limit() {
    within(async {
        let node = TestNode::start().await;
        let id = node.reserved("llm", "user-42", 2000).await;
        node.advance(SECOND);
        let a = node.settle(&id, 12_500).await;
        assert_eq!(a.status, 200);
        assert_eq!(
            (
                &a.body["refunded"],
                &a.body["charged"],
                &a.body["unpaid"],
                &a.body["remaining"]
            ),
            (&json!(0), &json!(10_500), &json!(0), &json!(0))
        );
        // The key went past its limit: refused until the window ends.
        let check = node
            .post("/v1/check", &json!({"rule": "llm", "key": "user-42"}))
            .await;
        assert_eq!(check.status, 429);
        assert_eq!(check.body["retry_after_ms"], 59_000);
        node.advance(59 * SECOND);
        let check = node
            .post("/v1/check", &json!({"rule": "llm", "key": "user-42"}))
            .await;
        assert_eq!(check.status, 200);
        let m = node.metrics().await;
        assert_eq!(
            metric(&m, "gossamer_reservation_units_total{kind=\"charged\"}"),
            10_500
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_after_the_window_closed_gives_nothing_back() {
    within(async {
        let node = TestNode::start().await;
        node.advance(50 * SECOND);
        let id = node.reserved("llm", "user-42", 2000).await;
        node.advance(10 * SECOND);
        let a = node.settle(&id, 0).await;
        assert_eq!(a.status, 200);
        assert_eq!(a.body["refunded"], 0);
        assert_eq!(a.body["remaining"], 10_000);
    })
    .await;
}

/// What a refused settle must leave alone: both keys' remaining and every reservation and
/// check counter.
async fn standing(node: &TestNode) -> (u64, u64, Vec<String>) {
    let m = node.metrics().await;
    let lines = m
        .lines()
        .filter(|l| l.starts_with("gossamer_reservation") || l.starts_with("gossamer_checks_total"))
        .map(str::to_owned)
        .collect();
    (
        node.remaining("llm", "user-42").await,
        node.remaining("llm", "late").await,
        lines,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_settles_change_nothing() {
    within(async {
        let node = TestNode::start().await;
        let id = node.reserved("llm", "user-42", 2000).await;
        let expired = node.reserved("llm", "late", 3000).await;
        let refused = [
            (json!({"reservation": id, "cost": -1}), 400, "invalid_cost"),
            (json!({"reservation": id, "cost": 1.5}), 400, "invalid_cost"),
            (json!({"reservation": id, "cost": "3"}), 400, "invalid_cost"),
            (
                json!({"reservation": id, "cost": 1u64 << 41}),
                400,
                "invalid_cost",
            ),
            (
                json!({"reservation": id, "cost": u64::MAX}),
                400,
                "invalid_cost",
            ),
            (json!({"reservation": id}), 400, "missing_field"),
            (json!({"cost": 1}), 400, "missing_field"),
            (json!({"reservation": "", "cost": 1}), 400, "missing_field"),
            (
                json!({"reservation": id, "cost": 1, "cots": 1}),
                400,
                "unknown_field",
            ),
            (json!({"reservation": 7, "cost": 1}), 400, "malformed_json"),
            (json!([id, 1]), 400, "malformed_json"),
            (
                json!({"reservation": "nope", "cost": 1}),
                404,
                "unknown_reservation",
            ),
            (
                json!({"reservation": "0".repeat(32), "cost": 1}),
                404,
                "unknown_reservation",
            ),
        ];
        for (body, status, error) in refused {
            let before = standing(&node).await;
            let a = node.post("/v1/settle", &body).await;
            assert_eq!(
                (a.status, &a.body["error"]),
                (status, &json!(error)),
                "{body}"
            );
            assert!(a.body["message"].as_str().is_some_and(|m| !m.is_empty()));
            assert_eq!(before, standing(&node).await, "{body} changed something");
        }
        // Settled once; the second is a conflict and changes nothing.
        assert_eq!(node.settle(&id, 1000).await.status, 200);
        let before = standing(&node).await;
        let twice = node.settle(&id, 0).await;
        assert_eq!(
            (twice.status, &twice.body["error"]),
            (409, &json!("already_settled"))
        );
        assert_eq!(before, standing(&node).await);
        // Not settled within reservation_timeout (30 s): gone, and its estimate stands.
        node.advance(30 * SECOND);
        let before = standing(&node).await;
        let late = node.settle(&expired, 0).await;
        assert_eq!(
            (late.status, &late.body["error"]),
            (410, &json!("reservation_expired"))
        );
        assert_eq!(node.remaining("llm", "late").await, 7000);
        let after = standing(&node).await;
        assert_eq!((before.0, before.1), (after.0, after.1));
        let m = node.metrics().await;
        assert_eq!(
            metric(&m, "gossamer_reservations_total{event=\"expired\"}"),
            1
        );
        assert_eq!(
            metric(
                &m,
                "gossamer_http_errors_total{error=\"reservation_expired\"}"
            ),
            1
        );
        assert_eq!(
            metric(&m, "gossamer_http_errors_total{error=\"already_settled\"}"),
            1
        );
        assert_eq!(
            metric(
                &m,
                "gossamer_http_errors_total{error=\"unknown_reservation\"}"
            ),
            2
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_max_reservations_a_reserve_is_refused_like_a_full_store() {
    within(async {
        let node = TestNode::start().await;
        let ids = [
            node.reserved("llm", "a", 1).await,
            node.reserved("llm", "b", 1).await,
            node.reserved("llm", "c", 1).await,
        ];
        let full = node.reserve("llm", "d", 1).await;
        assert_eq!(full.status, 429);
        assert_eq!(full.body["outcome"], "store_full");
        assert_eq!(full.body.get("reservation"), None);
        assert_eq!(node.remaining("llm", "d").await, 10_000);
        assert_eq!(
            metric(&node.metrics().await, "gossamer_reservations_open"),
            3
        );
        node.settle(&ids[0], 1).await;
        node.reserved("llm", "d", 1).await;
    })
    .await;
}
