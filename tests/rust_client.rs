//! The Rust client (`clients/rust`, `gossamer_client`) against this build of the binary: a
//! real node on a free port, its rules from a file. Every test is bounded in time, and the
//! node is killed when the test ends, passing or not.

use std::io::Write;
use std::net::{Ipv4Addr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use gossamer_client::{Client, Error, Outcome};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep, timeout};

const BIN: &str = env!("CARGO_BIN_EXE_gossamer");

/// Variables the binary reads; cleared so the test runner's environment cannot leak in.
const GOSSAMER_ENV: [&str; 12] = [
    "GOSSAMER_CONFIG",
    "GOSSAMER_GRPC",
    "GOSSAMER_RLS_CONFIG",
    "GOSSAMER_HTTP",
    "GOSSAMER_NODE_ID",
    "GOSSAMER_GOSSIP",
    "GOSSAMER_ADVERTISE",
    "GOSSAMER_SEEDS",
    "GOSSAMER_CLUSTER_ID",
    "GOSSAMER_LOG_FORMAT",
    "GOSSAMER_URL",
    "RUST_LOG",
];

/// The longest one test may take.
const LIMIT: Duration = Duration::from_secs(60);

/// - `tenth`: 10 per second, no burst: a denial waits about 100 ms.
/// - `scarce`: 2 per hour (a sliding log, so no window edge falls inside a test).
/// - `shared`: 50 per hour, for concurrent callers.
/// - `shaped`: a shaping leaky bucket that may hold a call up to 1 s.
const RULES: &str = r#"
[[rule]]
name = "tenth"
algorithm = "token_bucket"
limit = 10
period = "1s"
burst = 1

[[rule]]
name = "scarce"
algorithm = "sliding_window_log"
limit = 2
period = "1h"

[[rule]]
name = "shared"
algorithm = "sliding_window_log"
limit = 50
period = "1h"

[[rule]]
name = "shaped"
algorithm = "leaky_bucket"
limit = 10
period = "1s"
burst = 1
max_wait = "1s"
"#;

/// A running `gossamer serve` with [`RULES`], killed on drop; its config file is removed.
struct Node {
    child: Option<Child>,
    port: u16,
    config: PathBuf,
}

static NEXT: AtomicUsize = AtomicUsize::new(0);

impl Node {
    async fn start() -> Node {
        let port = free_port();
        let config = std::env::temp_dir().join(format!(
            "gossamer-rust-client-{}-{}.toml",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::File::create(&config)
            .and_then(|mut f| f.write_all(RULES.as_bytes()))
            .expect("write the config");
        let mut node = Node {
            child: None,
            port,
            config,
        };
        node.spawn().await;
        node
    }

    /// Starts the binary (again) on the node's port and waits until it answers.
    async fn spawn(&mut self) {
        let mut command = Command::new(BIN);
        for var in GOSSAMER_ENV {
            command.env_remove(var);
        }
        let child = command
            .arg("serve")
            .arg("--config")
            .arg(&self.config)
            .args(["--http", &format!("127.0.0.1:{}", self.port)])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the binary starts");
        self.child = Some(child);
        let mut probe = gossamer_client::raw::Client::connect(&self.url()).await;
        for _ in 0..200 {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("serve exited early with {status}");
            }
            if let Ok(client) = &mut probe {
                if client.get("/readyz").await.is_ok_and(|r| r.status == 200) {
                    return;
                }
            }
            sleep(Duration::from_millis(25)).await;
            probe = gossamer_client::raw::Client::connect(&self.url()).await;
        }
        panic!("serve never answered /readyz on port {}", self.port);
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// SIGKILL, and waits for the exit.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_file(&self.config);
    }
}

/// A port nothing listens on (bound to port 0, read, released).
fn free_port() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind port 0");
    listener.local_addr().expect("local addr").port()
}

/// Runs a test's body within [`LIMIT`].
async fn bounded<F: std::future::Future<Output = ()>>(body: F) {
    timeout(LIMIT, body)
        .await
        .expect("the test finished in time");
}

#[tokio::test]
async fn check_reads_an_admission_then_a_429_as_a_denial_in_milliseconds() {
    bounded(async {
        let node = Node::start().await;
        let client = Client::new(&node.url()).unwrap();
        for remaining in [1, 0] {
            let d = client.check("scarce", "user-1", 1).await.unwrap();
            assert!(d.allowed, "{d:?}");
            assert_eq!(d.outcome, Outcome::Allowed);
            assert_eq!(
                (d.status, d.limit, d.remaining),
                (200, Some(2), Some(remaining))
            );
            assert_eq!(d.retry_after_ms, Some(0));
        }
        let d = client.check("scarce", "user-1", 1).await.unwrap();
        assert!(!d.allowed, "{d:?}");
        assert_eq!(
            (d.status, d.outcome, d.remaining),
            (429, Outcome::Denied, Some(0))
        );
        let wait = d.retry_after_ms.expect("a denial says when to retry");
        assert!((3_500_000..=3_600_000).contains(&wait), "{wait}");
        assert!(d.reset_after_ms.is_some_and(|ms| ms > 0));

        // A cost above the limit can never be admitted: a decision, not an error.
        let d = client.check("scarce", "user-2", 3).await.unwrap();
        assert!(
            d.never() && !d.allowed && d.retry_after_ms.is_none(),
            "{d:?}"
        );
    })
    .await;
}

#[tokio::test]
async fn status_spends_nothing_and_keys_need_no_escaping_by_the_caller() {
    bounded(async {
        let node = Node::start().await;
        let client = Client::new(&node.url()).unwrap();
        let key = "tenant 42/é&rule=x?";
        for _ in 0..3 {
            let d = client.status("scarce", key).await.unwrap();
            assert!(d.allowed, "{d:?}");
            assert_eq!((d.key.as_str(), d.remaining), (key, Some(2)));
        }
        assert!(client.check("scarce", key, 2).await.unwrap().allowed);
        let d = client.status("scarce", key).await.unwrap();
        assert_eq!((d.allowed, d.remaining, d.status), (false, Some(0), 200));
        assert!(d.retry_after_ms.is_some_and(|ms| ms > 0));
    })
    .await;
}

#[tokio::test]
async fn acquire_waits_the_nodes_milliseconds_and_is_admitted() {
    bounded(async {
        let node = Node::start().await;
        let client = Client::new(&node.url()).unwrap();
        assert!(client.check("tenth", "k", 1).await.unwrap().allowed);
        let denial = client.check("tenth", "k", 1).await.unwrap();
        let wait = denial.retry_after_ms.expect("a wait");
        assert!(!denial.allowed && (1..=100).contains(&wait), "{denial:?}");

        let started = Instant::now();
        let d = client
            .acquire("tenth", "k", 1, Duration::from_secs(5))
            .await
            .unwrap();
        let waited = started.elapsed();
        assert!(d.allowed && d.outcome == Outcome::Allowed, "{d:?}");
        // About the node's 100 ms (plus at most 10% jitter, and a retry if a wait fell just
        // short on this busy machine), not the whole second of Retry-After.
        assert!(
            waited >= Duration::from_millis(wait.saturating_sub(5))
                && waited < Duration::from_millis(600),
            "waited {waited:?} for a {wait} ms wait"
        );
    })
    .await;
}

#[tokio::test]
async fn acquire_fails_rate_limited_when_the_wait_would_pass_its_timeout() {
    bounded(async {
        let node = Node::start().await;
        let client = Client::new(&node.url()).unwrap();
        assert!(client.check("scarce", "k", 2).await.unwrap().allowed);
        let started = Instant::now();
        let e = client
            .acquire("scarce", "k", 1, Duration::from_secs(2))
            .await
            .unwrap_err();
        // The node's wait is most of an hour: no point sleeping 2 s first.
        assert!(started.elapsed() < Duration::from_millis(500));
        match &e {
            Error::RateLimited { decision } => {
                assert_eq!((decision.rule.as_str(), decision.status), ("scarce", 429));
                assert!(
                    e.retry_after()
                        .is_some_and(|w| w > Duration::from_secs(3000))
                );
            }
            other => panic!("expected RateLimited, got {other}"),
        }

        // With the timeout past the 100 ms wait but not the second: waits, then succeeds;
        // with a timeout under it: fails at once.
        assert!(client.check("tenth", "t", 1).await.unwrap().allowed);
        let e = client
            .acquire("tenth", "t", 1, Duration::from_millis(20))
            .await
            .unwrap_err();
        assert!(matches!(e, Error::RateLimited { .. }), "{e}");
        assert!(
            e.retry_after()
                .is_some_and(|w| w > Duration::from_millis(20))
        );

        // A cost that can never fit fails at once, whatever the timeout.
        let started = Instant::now();
        let e = client
            .acquire("scarce", "other", 5, Duration::from_secs(30))
            .await
            .unwrap_err();
        assert!(matches!(e, Error::NeverAdmitted { .. }), "{e}");
        assert!(started.elapsed() < Duration::from_millis(500));
    })
    .await;
}

#[tokio::test]
async fn rate_limited_runs_the_work_only_when_admitted() {
    bounded(async {
        let node = Node::start().await;
        let client = Client::new(&node.url()).unwrap();
        let runs = AtomicUsize::new(0);
        let work = || async {
            runs.fetch_add(1, Ordering::SeqCst);
            "done"
        };
        for _ in 0..2 {
            let out = client
                .rate_limited("scarce", "w", 1, Duration::ZERO, work)
                .await
                .unwrap();
            assert_eq!(out, "done");
        }
        let e = client
            .rate_limited("scarce", "w", 1, Duration::ZERO, work)
            .await
            .unwrap_err();
        assert!(matches!(e, Error::RateLimited { .. }), "{e}");
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    })
    .await;
}

#[tokio::test]
async fn what_the_node_refuses_is_a_bad_request_even_failing_open() {
    bounded(async {
        let node = Node::start().await;
        let client = Client::builder(&node.url())
            .fail_open(true)
            .build()
            .unwrap();
        match client.check("nope", "k", 1).await {
            Err(Error::BadRequest { status, error, .. }) => {
                assert_eq!((status, error.as_str()), (404, "unknown_rule"));
            }
            other => panic!("expected BadRequest, got {other:?}"),
        }
        match client.check("scarce", "k", 0).await {
            Err(Error::BadRequest { status, error, .. }) => {
                assert_eq!((status, error.as_str()), (400, "invalid_cost"));
            }
            other => panic!("expected BadRequest, got {other:?}"),
        }
        // Nothing was counted.
        let d = client.status("scarce", "k").await.unwrap();
        assert_eq!(d.remaining, Some(2));
    })
    .await;
}

#[tokio::test]
async fn a_shaping_rule_holds_a_check_with_wait_instead_of_denying_it() {
    bounded(async {
        let node = Node::start().await;
        let client = Client::new(&node.url()).unwrap();
        assert!(client.check("shaped", "s", 1).await.unwrap().allowed);
        assert!(!client.check("shaped", "s", 1).await.unwrap().allowed);
        let d = client
            .check_with_wait("shaped", "s", 1, Duration::from_millis(500))
            .await
            .unwrap();
        assert!(d.allowed, "{d:?}");
        assert!(d.waited_ms.is_some_and(|ms| ms > 0 && ms <= 100), "{d:?}");
    })
    .await;
}

#[tokio::test]
async fn a_node_down_fails_closed_or_open_and_the_client_reconnects_when_it_is_back() {
    bounded(async {
        let mut node = Node::start().await;
        let closed = Client::builder(&node.url())
            .connect_timeout(Duration::from_millis(200))
            .timeout(Duration::from_millis(500))
            .build()
            .unwrap();
        let open = Client::builder(&node.url())
            .fail_open(true)
            .build()
            .unwrap();
        // Both hold a keep-alive connection to the node that is about to die.
        assert!(closed.check("shared", "a", 1).await.unwrap().allowed);
        assert!(!open.check("shared", "a", 1).await.unwrap().failed_open());

        node.kill();
        let started = Instant::now();
        let e = closed.check("shared", "a", 1).await.unwrap_err();
        assert!(e.is_unavailable(), "{e}");
        let e = closed
            .acquire("shared", "a", 1, Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(e.is_unavailable(), "{e}");
        let d = open.check("shared", "a", 1).await.unwrap();
        assert!(
            d.allowed && d.failed_open() && d.outcome == Outcome::FailOpen,
            "{d:?}"
        );
        let d = open
            .acquire("shared", "a", 1, Duration::ZERO)
            .await
            .unwrap();
        assert!(d.failed_open());
        let ran = open
            .rate_limited("shared", "a", 1, Duration::ZERO, || async { true })
            .await
            .unwrap();
        assert!(ran);
        // Status admits nothing, so it never fails open.
        assert!(
            open.status("shared", "a")
                .await
                .unwrap_err()
                .is_unavailable()
        );
        assert!(started.elapsed() < Duration::from_secs(5));

        // The same clients reach the node again once it is back (a fresh incarnation).
        node.spawn().await;
        let d = closed.check("shared", "a", 1).await.unwrap();
        assert!(d.allowed && !d.failed_open(), "{d:?}");
        assert!(!open.check("shared", "a", 1).await.unwrap().failed_open());
    })
    .await;
}

#[tokio::test]
async fn concurrent_callers_share_one_client_and_the_limit_holds() {
    bounded(async {
        let node = Node::start().await;
        let client = Client::new(&node.url()).unwrap();
        let mut tasks = JoinSet::new();
        for _ in 0..20 {
            let client = client.clone();
            tasks.spawn(async move {
                let mut admitted = 0;
                for _ in 0..5 {
                    let d = client.check("shared", "hot", 1).await.unwrap();
                    if d.allowed {
                        admitted += 1;
                    } else {
                        assert_eq!(d.outcome, Outcome::Denied, "{d:?}");
                    }
                }
                admitted
            });
        }
        let mut admitted = 0;
        while let Some(n) = tasks.join_next().await {
            admitted += n.expect("a caller panicked");
        }
        assert_eq!(admitted, 50);

        // acquire from many callers at once: each waits its own ~100 ms turns of a 10/s
        // bucket; 5 callers over at most ~0.5 s of waits, all within their 5 s.
        let started = Instant::now();
        let mut tasks = JoinSet::new();
        for _ in 0..5 {
            let client = client.clone();
            tasks.spawn(async move {
                client
                    .acquire("tenth", "hot", 1, Duration::from_secs(5))
                    .await
            });
        }
        while let Some(result) = tasks.join_next().await {
            assert!(result.expect("a caller panicked").unwrap().allowed);
        }
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(350) && took < Duration::from_secs(3),
            "{took:?}"
        );
    })
    .await;
}
