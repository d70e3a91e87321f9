//! The Rust client (`clients/rust`, `gossamer_client`) against this build of the binary: a
//! real node on a free port, its rules from a file. Every test is bounded in time, and the
//! node is killed when the test ends, passing or not.

use std::io::Write;
use std::net::{Ipv4Addr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use gossamer_client::{Client, Error, Outcome, Settlement};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep, timeout};

const BIN: &str = env!("CARGO_BIN_EXE_gossamer");

#[path = "support/env.rs"]
mod env;
use env::GOSSAMER_ENV;

/// The longest one test may take.
const LIMIT: Duration = Duration::from_secs(60);

/// - `tenth`: 10 per second, no burst: a denial waits about 100 ms.
/// - `scarce`: 2 per hour (a sliding log, so no window edge falls inside a test).
/// - `shared`: 50 per hour, for concurrent callers.
/// - `shaped`: a shaping leaky bucket that may hold a call up to 1 s.
/// - `llm`: tokens of a model's completions, 10,000 a window of a year (no window ends
///   between a reserve and its settle, so every figure is exact).
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

[[rule]]
name = "llm"
algorithm = "fixed_window"
limit = 10000
period = "366d"
"#;

/// A running `gossamer serve` with [`RULES`] (or a config of its own), killed on drop; its
/// config file is removed.
struct Node {
    child: Option<Child>,
    port: u16,
    config: PathBuf,
}

static NEXT: AtomicUsize = AtomicUsize::new(0);

impl Node {
    async fn start() -> Node {
        Node::start_with(RULES).await
    }

    async fn start_with(config_text: &str) -> Node {
        let port = free_port();
        let config = std::env::temp_dir().join(format!(
            "gossamer-rust-client-{}-{}.toml",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::File::create(&config)
            .and_then(|mut f| f.write_all(config_text.as_bytes()))
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
            if let Ok(client) = &mut probe
                && client.get("/readyz").await.is_ok_and(|r| r.status == 200)
            {
                return;
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

/// The key's `remaining` under `llm`, spending nothing.
async fn llm_remaining(client: &Client, key: &str) -> u64 {
    let d = client.status("llm", key).await.expect("a status");
    d.remaining.expect("a status has figures")
}

/// The settlement a settle that must reach the node answers.
fn settled(answer: Result<Option<Settlement>, Error>) -> Settlement {
    answer
        .expect("settled")
        .expect("the node answered the settle")
}

#[tokio::test]
async fn reserve_is_admitted_with_an_id_and_settling_lower_refunds_the_rest() {
    bounded(async {
        let node = Node::start().await;
        let client = Client::new(&node.url()).unwrap();
        let r = client.reserve("llm", "user-1", 2000).await.unwrap();
        assert!(r.allowed && !r.failed_open(), "{r:?}");
        assert_eq!(
            (r.outcome, r.status, r.remaining, r.cost),
            (Outcome::Allowed, 200, Some(8000), 2000)
        );
        let id = r.id().expect("an admitted reserve has an id");
        assert!(
            id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()),
            "{id}"
        );
        // The estimate is charged at once.
        assert_eq!(llm_remaining(&client, "user-1").await, 8000);

        let s = settled(client.settle(&r, 500).await);
        assert_eq!(
            (s.reservation.as_str(), s.rule.as_str(), s.key.as_str()),
            (id, "llm", "user-1")
        );
        assert_eq!(
            (s.reserved, s.cost, s.refunded, s.charged, s.unpaid),
            (2000, 500, 1500, 0, 0)
        );
        assert_eq!((s.limit, s.remaining), (Some(10_000), Some(9500)));
        assert!(s.reset_after_ms.is_some_and(|ms| ms > 0));
        // What was given back is there to spend again.
        assert_eq!(llm_remaining(&client, "user-1").await, 9500);
    })
    .await;
}

#[tokio::test]
async fn settling_higher_charges_the_excess_even_past_the_limit() {
    bounded(async {
        let node = Node::start().await;
        let client = Client::new(&node.url()).unwrap();
        let r = client.reserve("llm", "user-2", 2000).await.unwrap();
        // Settled by its id, as a String.
        let id: String = r.reservation.clone().expect("an id");
        let s = settled(client.settle(&id, 3000).await);
        assert_eq!(
            (s.reserved, s.cost, s.refunded, s.charged, s.unpaid),
            (2000, 3000, 0, 1000, 0)
        );
        assert_eq!(s.remaining, Some(7000));
        assert_eq!(llm_remaining(&client, "user-2").await, 7000);

        // Beyond the limit: charged whatever the room, and the key is refused afterwards.
        let r = client.reserve("llm", "user-2", 1000).await.unwrap();
        let s = settled(client.settle(r.id().expect("an id"), 9000).await);
        assert_eq!((s.charged, s.remaining), (8000, Some(0)));
        let d = client.check("llm", "user-2", 1).await.unwrap();
        assert!(!d.allowed, "{d:?}");
    })
    .await;
}

#[tokio::test]
async fn refused_settles_are_typed_errors_even_failing_open() {
    bounded(async {
        let node = Node::start().await;
        let client = Client::builder(&node.url())
            .fail_open(true)
            .build()
            .unwrap();
        let r = client.reserve("llm", "user-3", 100).await.unwrap();
        let id = r.id().expect("an id").to_owned();
        // A cost the node refuses changes nothing: the reservation can still be settled.
        match client.settle(&r, 1 << 41).await {
            Err(Error::BadRequest { status, error, .. }) => {
                assert_eq!((status, error.as_str()), (400, "invalid_cost"));
            }
            other => panic!("expected BadRequest, got {other:?}"),
        }
        assert_eq!(settled(client.settle(&r, 40).await).refunded, 60);
        match client.settle(&r, 40).await {
            Err(Error::AlreadySettled { reservation, .. }) => assert_eq!(reservation, id),
            other => panic!("expected AlreadySettled, got {other:?}"),
        }
        for unknown in ["0".repeat(32), "not-an-id".to_owned()] {
            match client.settle(&unknown, 1).await {
                Err(Error::UnknownReservation { reservation, .. }) => {
                    assert_eq!(reservation, unknown);
                }
                other => panic!("{unknown}: expected UnknownReservation, got {other:?}"),
            }
        }
        // The refused settles changed nothing: 40 of the 100 stand.
        assert_eq!(llm_remaining(&client, "user-3").await, 9960);
    })
    .await;
}

#[tokio::test]
async fn a_denied_reserve_has_no_id_and_reserved_does_not_run_its_work() {
    bounded(async {
        let node = Node::start().await;
        let client = Client::new(&node.url()).unwrap();
        assert!(client.check("scarce", "d", 2).await.unwrap().allowed);
        let r = client.reserve("scarce", "d", 1).await.unwrap();
        assert_eq!(
            (r.allowed, r.outcome, r.status, r.id()),
            (false, Outcome::Denied, 429, None)
        );
        assert!(r.retry_after_ms.is_some_and(|ms| ms > 0), "{r:?}");
        let e = client.settle(&r, 0).await.unwrap_err();
        assert!(matches!(e, Error::NothingToSettle(_)), "{e}");
        let never = client.reserve("scarce", "other", 3).await.unwrap();
        assert!(never.never() && never.id().is_none(), "{never:?}");

        let runs = AtomicUsize::new(0);
        let work = |_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>(((), 1))
        };
        let e = client.reserved("scarce", "d", 1, work).await.unwrap_err();
        assert!(matches!(e, Error::RateLimited { .. }), "{e}");
        let e = client.reserved("scarce", "d", 3, work).await.unwrap_err();
        assert!(matches!(e, Error::NeverAdmitted { .. }), "{e}");
        assert_eq!(runs.load(Ordering::SeqCst), 0);
    })
    .await;
}

/// What the work of `reserved` fails with here.
#[derive(Debug)]
enum WorkError {
    Gossamer(Error),
    /// The work failed; its reservation's id.
    Failed(String),
}

impl From<Error> for WorkError {
    fn from(e: Error) -> Self {
        WorkError::Gossamer(e)
    }
}

#[tokio::test]
async fn reserved_settles_at_the_works_cost_or_at_the_estimate_when_it_fails() {
    bounded(async {
        let node = Node::start().await;
        let client = Client::new(&node.url()).unwrap();
        let text = client
            .reserved("llm", "user-4", 2000, |r| {
                let client = client.clone();
                async move {
                    // The estimate is charged while the work runs.
                    assert_eq!(r.remaining, Some(8000));
                    assert_eq!(llm_remaining(&client, "user-4").await, 8000);
                    Ok::<_, WorkError>(("a completion", 300))
                }
            })
            .await
            .unwrap();
        assert_eq!(text, "a completion");
        assert_eq!(llm_remaining(&client, "user-4").await, 9700);

        // The work fails: its error comes back, and the estimate stands, settled.
        let e = client
            .reserved("llm", "user-4", 1000, |r| async move {
                Err::<((), u64), _>(WorkError::Failed(r.id().expect("an id").to_owned()))
            })
            .await
            .unwrap_err();
        let WorkError::Failed(id) = e else {
            panic!("expected the work's error, got {e:?}");
        };
        assert_eq!(llm_remaining(&client, "user-4").await, 8700);
        let e = client.settle(&id, 0).await.unwrap_err();
        assert!(matches!(e, Error::AlreadySettled { .. }), "{e}");

        // Not admitted: the client's error, converted into the work's error type.
        let e = client
            .reserved("llm", "user-4", 20_000, |_| async {
                Ok::<_, WorkError>(((), 1))
            })
            .await
            .unwrap_err();
        assert!(
            matches!(e, WorkError::Gossamer(Error::NeverAdmitted { .. })),
            "{e:?}"
        );
    })
    .await;
}

#[tokio::test]
async fn a_reservation_settled_after_its_timeout_has_expired() {
    bounded(async {
        let config = format!("[server]\nreservation_timeout = \"1s\"\n{RULES}");
        let node = Node::start_with(&config).await;
        let client = Client::new(&node.url()).unwrap();
        let r = client.reserve("llm", "late", 2000).await.unwrap();
        sleep(Duration::from_millis(1300)).await;
        match client.settle(&r, 0).await {
            Err(Error::ReservationExpired { reservation, .. }) => {
                assert_eq!(Some(reservation.as_str()), r.id());
            }
            other => panic!("expected ReservationExpired, got {other:?}"),
        }
        // Its estimate stood.
        assert_eq!(llm_remaining(&client, "late").await, 8000);
    })
    .await;
}

#[tokio::test]
async fn a_node_down_fails_reserve_and_settle_closed_or_open() {
    bounded(async {
        let url = format!("http://127.0.0.1:{}", free_port());
        let closed = Client::new(&url).unwrap();
        assert!(
            closed
                .reserve("llm", "k", 1)
                .await
                .unwrap_err()
                .is_unavailable()
        );
        let id = "0".repeat(32);
        assert!(closed.settle(&id, 1).await.unwrap_err().is_unavailable());

        let open = Client::builder(&url).fail_open(true).build().unwrap();
        let r = open.reserve("llm", "k", 2000).await.unwrap();
        assert!(r.allowed && r.failed_open() && r.id().is_none(), "{r:?}");
        assert_eq!(open.settle(&r, 1).await.unwrap(), None);
        // A real id the node cannot be asked about: it keeps its estimate.
        assert_eq!(open.settle(&id, 1).await.unwrap(), None);
        let out = open
            .reserved("llm", "k", 2000, |r| async move {
                Ok::<_, Error>((r.failed_open(), 10))
            })
            .await
            .unwrap();
        assert!(out);
    })
    .await;
}
