//! The client of one node: `check`, `acquire`, `status`, `rate_limited`, `reserve`, `settle`,
//! `reserved`, and the policy for a node that cannot be reached.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::Method;
use tokio::time::Instant;

use crate::decision::{Decision, read_answer};
use crate::endpoint::Endpoint;
use crate::error::Error;
use crate::pool::{Answer, Pool};
use crate::reserve::{Reservation, SettleTarget, Settlement, read_reservation, read_settlement};
use crate::wait::{Jitter, next_wait};

/// The node a [`Client::builder`] would be pointed at on this machine by default.
pub const DEFAULT_URL: &str = "http://127.0.0.1:7070";
/// How long to wait for the node's answer once connected. A check takes microseconds at the
/// node; this is for a node that is overloaded or stopped.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long to wait for a TCP connection to the node. Short: the node is on this machine (or
/// this pod's node), so a connection that takes longer is a node that is not there.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_millis(250);
/// Extra wait, as a fraction of the node's `retry_after_ms`, drawn uniformly for each retry
/// of [`Client::acquire`] so that callers denied together do not all come back in the same
/// millisecond. Only ever added: asking before `retry_after_ms` would be denied again.
pub const DEFAULT_JITTER: f64 = 0.1;
/// Idle keep-alive connections kept per client.
pub const DEFAULT_MAX_IDLE: usize = 8;

/// A client of one gossamer node. Cheap to clone: clones share their keep-alive
/// connections, and any number of tasks may call one at once (each call in flight uses a
/// connection of its own; up to `max_idle` are kept for reuse). Two clients share nothing.
///
/// ```no_run
/// # async fn run() -> Result<(), gossamer_client::Error> {
/// let client = gossamer_client::Client::new("http://127.0.0.1:7070")?;
/// let decision = client.check("api", "user-42", 1).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    url: String,
    fail_open: bool,
    timeout: Duration,
    jitter: f64,
    draws: Jitter,
    pool: Pool,
}

/// Settings of a [`Client`]: `Client::builder(url).fail_open(true).build()?`.
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    url: String,
    fail_open: bool,
    timeout: Duration,
    connect_timeout: Duration,
    jitter: f64,
    jitter_seed: Option<u64>,
    max_idle: usize,
}

impl ClientBuilder {
    /// When the node cannot be reached, does not answer within the timeouts, or answers with
    /// a 5xx: `true` admits the call (a [`Decision`] with outcome
    /// [`FailOpen`](crate::Outcome::FailOpen), logged as a `tracing` warning; a
    /// [`settle`](Client::settle) answers `Ok(None)`), `false` (the default) fails it with
    /// [`Error::Unavailable`]. A 4xx is the caller's mistake and always fails with
    /// [`Error::BadRequest`] (or a settle's own errors).
    pub fn fail_open(mut self, fail_open: bool) -> Self {
        self.fail_open = fail_open;
        self
    }

    /// The longest to wait for an answer once connected ([`DEFAULT_TIMEOUT`]): the whole
    /// exchange of one request, writing it and reading the answer. Must not be zero.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The longest to wait for a connection ([`DEFAULT_CONNECT_TIMEOUT`]). Must not be zero.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Up to this fraction of the node's wait is added to each wait of
    /// [`Client::acquire`] ([`DEFAULT_JITTER`]); from 0 to 1.
    pub fn jitter(mut self, fraction: f64) -> Self {
        self.jitter = fraction;
        self
    }

    /// Draws the jitter from a stream that repeats for the same seed (by default each client
    /// seeds its own at random).
    pub fn jitter_seed(mut self, seed: u64) -> Self {
        self.jitter_seed = Some(seed);
        self
    }

    /// Idle keep-alive connections kept for reuse ([`DEFAULT_MAX_IDLE`]; 0 opens a
    /// connection per request).
    pub fn max_idle(mut self, connections: usize) -> Self {
        self.max_idle = connections;
        self
    }

    /// The client, or [`Error::Url`] / [`Error::Config`]. Connects to nothing yet: the first
    /// call does.
    pub fn build(self) -> Result<Client, Error> {
        let endpoint = Endpoint::parse(&self.url)?;
        if self.timeout.is_zero() || self.connect_timeout.is_zero() {
            return Err(Error::Config(
                "timeout and connect_timeout must not be zero",
            ));
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err(Error::Config("jitter must be a fraction from 0 to 1"));
        }
        let draws = self
            .jitter_seed
            .map_or_else(Jitter::from_entropy, Jitter::seeded);
        Ok(Client {
            inner: Arc::new(Inner {
                url: self.url,
                fail_open: self.fail_open,
                timeout: self.timeout,
                jitter: self.jitter,
                draws,
                pool: Pool::new(endpoint, self.connect_timeout, self.max_idle),
            }),
        })
    }
}

impl Client {
    /// A client of the node at `url` (`http://host:port`; a path prefix is kept, for a node
    /// behind a proxy) with the default settings: failing closed, [`DEFAULT_TIMEOUT`],
    /// [`DEFAULT_CONNECT_TIMEOUT`].
    pub fn new(url: &str) -> Result<Client, Error> {
        Client::builder(url).build()
    }

    /// Settings for a client of the node at `url`.
    pub fn builder(url: &str) -> ClientBuilder {
        ClientBuilder {
            url: url.to_owned(),
            fail_open: false,
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            jitter: DEFAULT_JITTER,
            jitter_seed: None,
            max_idle: DEFAULT_MAX_IDLE,
        }
    }

    /// The node's URL, as given.
    pub fn url(&self) -> &str {
        &self.inner.url
    }

    /// Whether a node that cannot be reached admits the call.
    pub fn fails_open(&self) -> bool {
        self.inner.fail_open
    }

    /// Asks whether `key` may spend `cost` under `rule` now, and spends it if so
    /// (`POST /v1/check`).
    ///
    /// Returns the node's [`Decision`], admitted or not: a denial is an answer, not an error.
    /// Fails with [`Error::BadRequest`] for what the node refuses (an unknown rule, a cost of
    /// 0), and with [`Error::Unavailable`] when the node cannot answer, unless the client
    /// fails open.
    pub async fn check(&self, rule: &str, key: &str, cost: u64) -> Result<Decision, Error> {
        self.check_with_wait(rule, key, cost, Duration::ZERO).await
    }

    /// [`check`](Client::check), letting the node hold the call up to `max_wait` (whole
    /// milliseconds) rather than deny it, on a rule with a shaping leaky bucket; the timeout
    /// grows by as much. Other rules answer at once.
    pub async fn check_with_wait(
        &self,
        rule: &str,
        key: &str,
        cost: u64,
        max_wait: Duration,
    ) -> Result<Decision, Error> {
        let path = self.inner.pool.endpoint().check_path();
        let url = &self.inner.url;
        let answer = self.decide(&path, rule, key, cost, max_wait).await;
        match answer.and_then(|a| read_answer(url, a.status, &a.body)) {
            Err(e @ Error::Unavailable { .. }) if self.inner.fail_open => {
                tracing::warn!(rule, key, error = %e, "gossamer unavailable, failing open");
                Ok(Decision::fail_open(rule, key))
            }
            answer => answer,
        }
    }

    /// Charges `cost` (the estimate) as [`check`](Client::check) does and, admitted, holds it
    /// as a reservation to [`settle`](Client::settle) with the actual cost once known: the
    /// tokens of a model's completion, the bytes of a download (`POST /v1/reserve`).
    ///
    /// Returns the node's answer, admitted or not, as a [`Reservation`]: its
    /// [`Decision`] fields, and `reservation`, the id to settle, `Some` when admitted. A denial
    /// is an answer, not an error, and holds nothing (`reservation` is `None`). Fails as
    /// `check` does; failing open, a node that cannot answer gives an admitting reservation
    /// with outcome [`FailOpen`](crate::Outcome::FailOpen) and no id (nothing was charged,
    /// and settling it does nothing).
    ///
    /// Settle at the node you reserved at (the reservation lives in its memory). One not
    /// settled within the node's `reservation_timeout` (10 minutes by default) expires, and
    /// its estimate stands.
    pub async fn reserve(&self, rule: &str, key: &str, cost: u64) -> Result<Reservation, Error> {
        self.reserve_with_wait(rule, key, cost, Duration::ZERO)
            .await
    }

    /// [`reserve`](Client::reserve), letting the node hold the call up to `max_wait` on a
    /// shaping rule, as [`check_with_wait`](Client::check_with_wait) does.
    pub async fn reserve_with_wait(
        &self,
        rule: &str,
        key: &str,
        cost: u64,
        max_wait: Duration,
    ) -> Result<Reservation, Error> {
        let path = self.inner.pool.endpoint().reserve_path();
        let url = &self.inner.url;
        let answer = self.decide(&path, rule, key, cost, max_wait).await;
        match answer.and_then(|a| read_reservation(url, a.status, &a.body, cost)) {
            Err(e @ Error::Unavailable { .. }) if self.inner.fail_open => {
                tracing::warn!(rule, key, error = %e, "gossamer unavailable, failing open");
                Ok(Reservation::fail_open(rule, key, cost))
            }
            answer => answer,
        }
    }

    /// Settles a reservation (a [`Reservation`], or its id as `&str` or `&String`) with the
    /// `cost` the work actually had (`POST /v1/settle`): below the estimate, the node gives
    /// the difference back (as far as the key's window is still open or its bucket has not
    /// refilled: [`Settlement::refunded`] says how much); above it, charges the excess
    /// ([`Settlement::charged`]), whatever the room.
    ///
    /// Returns `Ok(Some(settlement))`, the node's answer; `Ok(None)` when there is nothing
    /// the node can be asked: a fail-open reservation (no id), or, failing open, a node that
    /// cannot answer (logged as a `tracing` warning: the reservation keeps its estimate).
    ///
    /// Fails with [`Error::UnknownReservation`] (404: not this node's, or long gone),
    /// [`Error::AlreadySettled`] (409), [`Error::ReservationExpired`] (410: its estimate
    /// stood), [`Error::BadRequest`] (400 `invalid_cost`: a cost above 2^40), whether failing
    /// open or not: the node changed nothing. [`Error::NothingToSettle`] for a reservation the
    /// node denied, or an empty id, without asking the node. [`Error::Unavailable`] when the
    /// node cannot answer and the client fails closed.
    pub async fn settle<R>(&self, reservation: &R, cost: u64) -> Result<Option<Settlement>, Error>
    where
        R: SettleTarget + ?Sized,
    {
        let Some(id) = reservation.reservation_id()? else {
            return Ok(None);
        };
        let body = serde_json::json!({"reservation": id, "cost": cost});
        let body = Bytes::from(body.to_string());
        let path = self.inner.pool.endpoint().settle_path();
        let url = &self.inner.url;
        let answer = self
            .exchange(Method::POST, &path, Some(body), self.inner.timeout)
            .await;
        match answer.and_then(|a| read_settlement(url, id, a.status, &a.body)) {
            Err(e @ Error::Unavailable { .. }) if self.inner.fail_open => {
                tracing::warn!(
                    reservation = id,
                    error = %e,
                    "gossamer unavailable, the reservation keeps its estimate"
                );
                Ok(None)
            }
            answer => answer.map(Some),
        }
    }

    /// Reserves `estimate` for `key` under `rule`, runs `work` only if admitted, and settles
    /// with the cost it reports: what Python's `with client.reserve(...) as r:` does.
    ///
    /// `work` gets the [`Reservation`] and returns `Ok((output, actual_cost))`; the
    /// reservation is settled at `actual_cost` and `output` returned. When `work` returns an
    /// error, the reservation is settled at `estimate` (the estimate stands, and the node
    /// forgets it at once rather than at its timeout) and that error is returned; a failure
    /// of that settle is only logged (a `tracing` warning), not to hide the work's error.
    ///
    /// Not admitted, `work` is not called and the error is [`Error::RateLimited`] (or
    /// [`Error::NeverAdmitted`] for a cost that can never fit), at once: it does not wait as
    /// [`acquire`](Client::acquire) does. Failing open with the node unreachable, `work` runs
    /// and there is nothing to settle. Errors of the reserve, and of the settle after `work`
    /// succeeded (then `output` is lost: the work was done, but the call fails), are
    /// converted into `E`, which needs `From<Error>` (`Error` itself, `anyhow::Error`, ...).
    /// A future dropped while `work` runs settles nothing: the reservation expires at the
    /// node's `reservation_timeout`, keeping its estimate.
    ///
    /// The work's error type is rarely inferred: name it, as here with `Ok::<_, E>`.
    ///
    /// ```no_run
    /// # #[derive(Debug)] struct AppError;
    /// # impl From<gossamer_client::Error> for AppError { fn from(_: gossamer_client::Error) -> Self { AppError } }
    /// # struct Reply { text: String, tokens: u64 }
    /// # async fn complete(prompt: &str) -> Result<Reply, AppError> {
    /// #     Ok(Reply { text: prompt.to_owned(), tokens: 1 })
    /// # }
    /// # async fn run(client: gossamer_client::Client, prompt: &str) -> Result<(), AppError> {
    /// let text: String = client
    ///     .reserved("llm", "user-42", 2000, |_reservation| async move {
    ///         let reply = complete(prompt).await?;
    ///         Ok::<_, AppError>((reply.text, reply.tokens)) // settled at the tokens used
    ///     })
    ///     .await?; // Err(AppError::from(Error::RateLimited { .. })) when denied
    /// # Ok(())
    /// # }
    /// ```
    pub async fn reserved<T, E, F, Fut>(
        &self,
        rule: &str,
        key: &str,
        estimate: u64,
        work: F,
    ) -> Result<T, E>
    where
        F: FnOnce(Reservation) -> Fut,
        Fut: Future<Output = Result<(T, u64), E>>,
        E: From<Error>,
    {
        let reservation = self.reserve(rule, key, estimate).await?;
        if !reservation.allowed {
            return Err(refusal(reservation.decision).into());
        }
        match work(reservation.clone()).await {
            Ok((output, cost)) => {
                self.settle(&reservation, cost).await?;
                Ok(output)
            }
            Err(e) => {
                if let Err(settle_error) = self.settle(&reservation, estimate).await {
                    tracing::warn!(
                        reservation = reservation.id(),
                        error = %settle_error,
                        "gossamer: settling a failed work's reservation at its estimate failed"
                    );
                }
                Err(e)
            }
        }
    }

    /// Checks until admitted, sleeping between attempts for the node's `retry_after_ms`
    /// (milliseconds, plus jitter), and returns the admitting [`Decision`].
    ///
    /// Fails with [`Error::RateLimited`] as soon as the node's wait would end more than
    /// `timeout` after the call (at once for a zero timeout, or a wait longer than the
    /// timeout: it never sleeps past it), and with [`Error::NeverAdmitted`] at once when the
    /// cost can never fit. Each attempt may add up to the client's own timeout when the node
    /// is slow. Failing open, a node that cannot be reached admits at once.
    pub async fn acquire(
        &self,
        rule: &str,
        key: &str,
        cost: u64,
        timeout: Duration,
    ) -> Result<Decision, Error> {
        let inner = &self.inner;
        let check = || self.check(rule, key, cost);
        acquire_with(check, timeout, inner.jitter, &inner.draws).await
    }

    /// The key's state under `rule`, spending nothing (`GET /v1/status`): `allowed` and
    /// `retry_after_ms` say whether a check of cost 1 would pass now. Fails with
    /// [`Error::Unavailable`] when the node cannot answer, failing open or not: nothing is
    /// admitted here, so there is nothing to fail open to.
    pub async fn status(&self, rule: &str, key: &str) -> Result<Decision, Error> {
        let path = self.inner.pool.endpoint().status_path(rule, key);
        self.ask(Method::GET, &path, None, self.inner.timeout).await
    }

    /// Runs `work` once `key` is admitted to spend `cost` under `rule`, waiting as
    /// [`acquire`](Client::acquire) does up to `timeout` (zero: a denial fails at once), and
    /// returns its output. `work` is not called when the call is not admitted: the error is
    /// [`acquire`](Client::acquire)'s.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn complete(prompt: &str) -> String { prompt.to_owned() }
    /// # async fn run(client: gossamer_client::Client) -> Result<(), gossamer_client::Error> {
    /// let text = client
    ///     .rate_limited("free", "tenant-42", 1, Duration::from_secs(2), || complete("hi"))
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn rate_limited<F, Fut>(
        &self,
        rule: &str,
        key: &str,
        cost: u64,
        timeout: Duration,
        work: F,
    ) -> Result<Fut::Output, Error>
    where
        F: FnOnce() -> Fut,
        Fut: Future,
    {
        self.acquire(rule, key, cost, timeout).await?;
        Ok(work().await)
    }

    /// One request, and the decision in its answer.
    async fn ask(
        &self,
        method: Method,
        path: &str,
        body: Option<Bytes>,
        timeout: Duration,
    ) -> Result<Decision, Error> {
        let answer = self.exchange(method, path, body, timeout).await?;
        read_answer(&self.inner.url, answer.status, &answer.body)
    }

    /// A check's or a reserve's request (`{"rule","key","cost"[,"wait_ms"]}` to `path`), and
    /// its answer, unread.
    async fn decide(
        &self,
        path: &str,
        rule: &str,
        key: &str,
        cost: u64,
        max_wait: Duration,
    ) -> Result<Answer, Error> {
        let wait_ms = u64::try_from(max_wait.as_millis()).unwrap_or(u64::MAX);
        let mut body = serde_json::json!({"rule": rule, "key": key, "cost": cost});
        if wait_ms > 0 {
            body["wait_ms"] = wait_ms.into();
        }
        let timeout = self.inner.timeout.saturating_add(max_wait);
        let body = Bytes::from(body.to_string());
        self.exchange(Method::POST, path, Some(body), timeout).await
    }

    /// One request, and its whole answer; [`Error::Unavailable`] when there is none.
    async fn exchange(
        &self,
        method: Method,
        path: &str,
        body: Option<Bytes>,
        timeout: Duration,
    ) -> Result<Answer, Error> {
        self.inner
            .pool
            .request(method, path, body, timeout)
            .await
            .map_err(|reason| Error::Unavailable {
                url: self.inner.url.clone(),
                reason,
            })
    }
}

/// The error of a call that was not admitted: [`Error::NeverAdmitted`] for a cost that can
/// never fit, else [`Error::RateLimited`].
fn refusal(decision: Decision) -> Error {
    let decision = Box::new(decision);
    if decision.never() {
        Error::NeverAdmitted { decision }
    } else {
        Error::RateLimited { decision }
    }
}

/// `acquire`'s loop around `check`: checks until admitted, sleeping the node's wait plus
/// jitter between attempts, never past `timeout` from the call.
async fn acquire_with<C, Fut>(
    mut check: C,
    timeout: Duration,
    jitter: f64,
    draws: &Jitter,
) -> Result<Decision, Error>
where
    C: FnMut() -> Fut,
    Fut: Future<Output = Result<Decision, Error>>,
{
    let start = Instant::now();
    loop {
        let decision = check().await?;
        if decision.allowed {
            return Ok(decision);
        }
        if decision.never() {
            return Err(refusal(decision));
        }
        let left = timeout.saturating_sub(start.elapsed());
        match next_wait(decision.retry_after_ms, left, jitter, draws.draw()) {
            Some(wait) => tokio::time::sleep(wait).await,
            None => return Err(refusal(decision)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::collections::VecDeque;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;
    use crate::decision::Outcome;
    use crate::fake::Fake;

    const MS: Duration = Duration::from_millis(1);

    fn decision(allowed: bool, outcome: Outcome, retry_after_ms: Option<u64>) -> Decision {
        Decision {
            allowed,
            rule: "r".to_owned(),
            key: "k".to_owned(),
            limit: Some(10),
            remaining: Some(0),
            reset_after_ms: Some(1000),
            retry_after_ms,
            outcome,
            waited_ms: None,
            status: if allowed { 200 } else { 429 },
        }
    }

    fn denied(ms: u64) -> Result<Decision, Error> {
        Ok(decision(false, Outcome::Denied, Some(ms)))
    }

    fn admitted() -> Result<Decision, Error> {
        Ok(decision(true, Outcome::Allowed, Some(0)))
    }

    /// Runs `acquire`'s loop over scripted answers; its result and when each check was made,
    /// relative to the start.
    async fn acquire_scripted(
        script: Vec<Result<Decision, Error>>,
        timeout: Duration,
        jitter: f64,
    ) -> (Result<Decision, Error>, Vec<Duration>) {
        let script = RefCell::new(VecDeque::from(script));
        let times = RefCell::new(Vec::new());
        let start = Instant::now();
        let check = || {
            times.borrow_mut().push(start.elapsed());
            let next = script.borrow_mut().pop_front().expect("a scripted answer");
            async move { next }
        };
        let result = acquire_with(check, timeout, jitter, &Jitter::seeded(1)).await;
        (result, times.into_inner())
    }

    #[tokio::test(start_paused = true)]
    async fn acquire_waits_the_nodes_milliseconds_then_returns_the_admission() {
        let script = vec![denied(100), denied(13), admitted()];
        let (result, times) = acquire_scripted(script, Duration::from_secs(2), 0.0).await;
        assert!(result.unwrap().allowed);
        assert_eq!(times, vec![Duration::ZERO, 100 * MS, 113 * MS]);
    }

    #[tokio::test(start_paused = true)]
    async fn acquire_adds_at_most_the_jitter_and_spreads_the_waits() {
        let mut script: Vec<_> = (0..20).map(|_| denied(100)).collect();
        script.push(admitted());
        let (result, times) = acquire_scripted(script, Duration::from_secs(3600), 0.5).await;
        assert!(result.is_ok());
        let gaps: Vec<Duration> = times.windows(2).map(|w| w[1] - w[0]).collect();
        assert_eq!(gaps.len(), 20);
        for gap in &gaps {
            assert!(*gap >= 100 * MS && *gap < 150 * MS, "{gap:?}");
        }
        let mut distinct = gaps.clone();
        distinct.sort();
        distinct.dedup();
        assert!(distinct.len() >= 10, "waits not spread: {gaps:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn acquire_fails_rate_limited_without_sleeping_past_its_timeout() {
        let script: Vec<_> = (0..10).map(|_| denied(500)).collect();
        let timeout = 1200 * MS;
        let started = Instant::now();
        let (result, times) = acquire_scripted(script, timeout, 1.0).await;
        let e = result.unwrap_err();
        assert!(matches!(e, Error::RateLimited { .. }), "{e}");
        assert_eq!(e.retry_after(), Some(500 * MS));
        // Asked at 0, after 500-1000 ms, and maybe once more; gave up once a 500 ms wait
        // would end after 1.2 s, without sleeping that wait.
        assert!((2..=3).contains(&times.len()), "{times:?}");
        assert!(times[1] >= 500 * MS);
        assert!(started.elapsed() <= timeout, "{:?}", started.elapsed());
        assert_eq!(started.elapsed(), *times.last().unwrap());
    }

    #[tokio::test(start_paused = true)]
    async fn acquire_with_a_zero_timeout_or_a_longer_wait_fails_at_once() {
        for (wait, timeout) in [(1, Duration::ZERO), (5000, Duration::from_secs(1))] {
            let started = Instant::now();
            let (result, times) = acquire_scripted(vec![denied(wait)], timeout, 0.1).await;
            assert!(matches!(result, Err(Error::RateLimited { .. })));
            assert_eq!(times.len(), 1);
            assert_eq!(started.elapsed(), Duration::ZERO);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn acquire_of_a_cost_that_can_never_fit_fails_at_once() {
        let never = Ok(decision(false, Outcome::Never, None));
        let started = Instant::now();
        let (result, times) = acquire_scripted(vec![never], Duration::from_secs(60), 0.1).await;
        let e = result.unwrap_err();
        assert!(matches!(e, Error::NeverAdmitted { .. }), "{e}");
        assert!(e.decision().is_some_and(Decision::never));
        assert_eq!((times.len(), started.elapsed()), (1, Duration::ZERO));
    }

    #[tokio::test(start_paused = true)]
    async fn acquire_stops_at_an_error_of_its_check() {
        let down = Err(Error::Unavailable {
            url: "http://x".to_owned(),
            reason: "down".to_owned(),
        });
        let (result, times) =
            acquire_scripted(vec![denied(10), down], Duration::from_secs(1), 0.0).await;
        assert!(result.unwrap_err().is_unavailable());
        assert_eq!(times, vec![Duration::ZERO, 10 * MS]);
    }

    #[test]
    fn the_builder_refuses_bad_settings() {
        let bad = [
            Client::builder("http://a:1")
                .timeout(Duration::ZERO)
                .build(),
            Client::builder("http://a:1")
                .connect_timeout(Duration::ZERO)
                .build(),
            Client::builder("http://a:1").jitter(1.5).build(),
            Client::builder("http://a:1").jitter(-0.1).build(),
            Client::builder("http://a:1").jitter(f64::NAN).build(),
        ];
        for built in bad {
            assert!(matches!(built, Err(Error::Config(_))), "{built:?}");
        }
        assert!(matches!(Client::new("ftp://a:1"), Err(Error::Url(_))));
        let client = Client::builder("http://a:1")
            .fail_open(true)
            .build()
            .unwrap();
        assert!(client.fails_open());
        assert_eq!(client.url(), "http://a:1");
    }

    /// A URL nothing listens on.
    async fn nothing_at() -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    }

    #[tokio::test]
    async fn a_node_down_fails_closed_calls_without_running_the_work() {
        let client = Client::new(&nothing_at().await).unwrap();
        let e = client.check("r", "k", 1).await.unwrap_err();
        assert!(
            e.is_unavailable() && e.to_string().contains("cannot connect"),
            "{e}"
        );
        let e = client
            .acquire("r", "k", 1, Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(e.is_unavailable(), "{e}");
        let ran = AtomicBool::new(false);
        let e = client
            .rate_limited("r", "k", 1, Duration::ZERO, || async {
                ran.store(true, Ordering::SeqCst)
            })
            .await
            .unwrap_err();
        assert!(e.is_unavailable(), "{e}");
        assert!(!ran.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn a_node_down_fails_open_calls_but_not_status() {
        let client = Client::builder(&nothing_at().await)
            .fail_open(true)
            .build()
            .unwrap();
        let d = client.check("r", "k", 1).await.unwrap();
        assert!(d.allowed && d.failed_open());
        assert_eq!((d.rule.as_str(), d.key.as_str(), d.status), ("r", "k", 0));
        assert!(
            client
                .acquire("r", "k", 1, Duration::ZERO)
                .await
                .unwrap()
                .failed_open()
        );
        let out = client
            .rate_limited("r", "k", 1, Duration::ZERO, || async { 7 })
            .await
            .unwrap();
        assert_eq!(out, 7);
        assert!(client.status("r", "k").await.unwrap_err().is_unavailable());
    }

    #[tokio::test]
    async fn a_5xx_fails_open_but_a_4xx_is_the_callers_mistake_either_way() {
        let (url, _) = Fake::answering(503, r#"{"status":"draining"}"#)
            .start()
            .await;
        let client = Client::builder(&url).fail_open(true).build().unwrap();
        assert!(client.check("r", "k", 1).await.unwrap().failed_open());
        let closed = Client::new(&url).unwrap();
        let e = closed.check("r", "k", 1).await.unwrap_err();
        assert!(e.to_string().contains("HTTP 503"), "{e}");

        let refusal = r#"{"error":"unknown_rule","message":"no rule named \"r\""}"#;
        let (url, _) = Fake::answering(404, refusal).start().await;
        let client = Client::builder(&url).fail_open(true).build().unwrap();
        match client.check("r", "k", 1).await {
            Err(Error::BadRequest {
                status: 404, error, ..
            }) => assert_eq!(error, "unknown_rule"),
            other => panic!("expected BadRequest, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn rate_limited_runs_the_work_only_once_admitted() {
        let denial = r#"{"allowed":false,"rule":"r","key":"k","limit":1,"remaining":0,"reset_after_ms":5000,"retry_after_ms":5000,"outcome":"denied"}"#;
        let (url, _) = Fake::answering(429, denial).start().await;
        let client = Client::new(&url).unwrap();
        let ran = AtomicBool::new(false);
        let e = client
            .rate_limited("r", "k", 1, Duration::from_secs(1), || async {
                ran.store(true, Ordering::SeqCst)
            })
            .await
            .unwrap_err();
        assert!(matches!(e, Error::RateLimited { .. }), "{e}");
        assert_eq!(e.retry_after(), Some(Duration::from_secs(5)));
        assert!(!ran.load(Ordering::SeqCst));

        let admission = r#"{"allowed":true,"rule":"r","key":"k","limit":1,"remaining":0,"reset_after_ms":5000,"retry_after_ms":0,"outcome":"allowed"}"#;
        let (url, _) = Fake::answering(200, admission).start().await;
        let client = Client::new(&url).unwrap();
        let out = client
            .rate_limited("r", "k", 1, Duration::ZERO, || async { "done" })
            .await
            .unwrap();
        assert_eq!(out, "done");
    }

    const ADMITTED_RESERVE: &str = r#"{"allowed":true,"rule":"llm","key":"k","limit":10000,"remaining":8000,"reset_after_ms":5000,"retry_after_ms":0,"outcome":"allowed","reservation":"0000000000000001e44ddbb64463e3f0"}"#;

    /// What the work of `reserved` fails with in these tests.
    #[derive(Debug)]
    enum WorkError {
        Gossamer(Error),
        Failed,
    }

    impl From<Error> for WorkError {
        fn from(e: Error) -> Self {
            WorkError::Gossamer(e)
        }
    }

    #[tokio::test]
    async fn reserved_runs_the_work_only_when_admitted() {
        let denial = r#"{"allowed":false,"rule":"r","key":"k","limit":1,"remaining":0,"reset_after_ms":5000,"retry_after_ms":5000,"outcome":"denied"}"#;
        let never = r#"{"allowed":false,"rule":"r","key":"k","limit":1,"remaining":1,"reset_after_ms":0,"retry_after_ms":null,"outcome":"never"}"#;
        for (body, is_never) in [(denial, false), (never, true)] {
            let (url, _) = Fake::answering(429, body).start().await;
            let client = Client::new(&url).unwrap();
            let r = client.reserve("r", "k", 1).await.unwrap();
            assert!(!r.allowed && r.id().is_none(), "{r:?}");
            // Denied, it holds nothing: nothing is sent to settle it.
            let e = client.settle(&r, 0).await.unwrap_err();
            assert!(matches!(e, Error::NothingToSettle(_)), "{e}");
            let ran = AtomicBool::new(false);
            let e = client
                .reserved("r", "k", 1, |_| async {
                    ran.store(true, Ordering::SeqCst);
                    Ok::<_, Error>(((), 1))
                })
                .await
                .unwrap_err();
            assert_eq!(matches!(e, Error::NeverAdmitted { .. }), is_never, "{e}");
            assert_eq!(matches!(e, Error::RateLimited { .. }), !is_never, "{e}");
            assert!(!ran.load(Ordering::SeqCst));
        }
    }

    #[tokio::test]
    async fn reserved_returns_the_works_error_even_when_its_settle_fails_too() {
        // The fake answers the settle with a reserve's body: not a settlement, so the settle
        // fails (Unavailable, failing closed).
        let (url, accepted) = Fake::answering(200, ADMITTED_RESERVE).start().await;
        let client = Client::new(&url).unwrap();
        let r = client.reserve("llm", "k", 2000).await.unwrap();
        assert_eq!(r.id(), Some("0000000000000001e44ddbb64463e3f0"));
        assert_eq!((r.cost, r.remaining), (2000, Some(8000)));
        let e = client
            .reserved("llm", "k", 2000, |r| async move {
                assert!(r.allowed && r.id().is_some());
                Err::<((), u64), _>(WorkError::Failed)
            })
            .await
            .unwrap_err();
        assert!(matches!(e, WorkError::Failed), "{e:?}");
        // After work that succeeded, a settle that fails is the call's error.
        let e = client
            .reserved("llm", "k", 2000, |_| async {
                Ok::<_, WorkError>(("out", 10))
            })
            .await
            .unwrap_err();
        assert!(
            matches!(&e, WorkError::Gossamer(e) if e.is_unavailable()),
            "{e:?}"
        );
        // The reserve, then the settle, on one kept connection.
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_node_down_fails_reserve_and_settle_closed() {
        let client = Client::new(&nothing_at().await).unwrap();
        assert!(
            client
                .reserve("llm", "k", 1)
                .await
                .unwrap_err()
                .is_unavailable()
        );
        let e = client
            .settle("0000000000000001e44ddbb64463e3f0", 1)
            .await
            .unwrap_err();
        assert!(e.is_unavailable(), "{e}");
        let ran = AtomicBool::new(false);
        let e = client
            .reserved("llm", "k", 1, |_| async {
                ran.store(true, Ordering::SeqCst);
                Ok::<_, Error>(((), 1))
            })
            .await
            .unwrap_err();
        assert!(e.is_unavailable(), "{e}");
        assert!(!ran.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn a_node_down_fails_reserve_and_settle_open_with_nothing_to_settle() {
        let client = Client::builder(&nothing_at().await)
            .fail_open(true)
            .build()
            .unwrap();
        let r = client.reserve("llm", "k", 2000).await.unwrap();
        assert!(r.allowed && r.failed_open(), "{r:?}");
        assert_eq!((r.id(), r.cost, r.status), (None, 2000, 0));
        assert_eq!(client.settle(&r, 10).await.unwrap(), None);
        // A real id the node cannot be asked about: it keeps its estimate.
        let id = "0000000000000001e44ddbb64463e3f0".to_owned();
        assert_eq!(client.settle(&id, 10).await.unwrap(), None);
        let out = client
            .reserved("llm", "k", 2000, |r| async move {
                Ok::<_, Error>((r.outcome, 10))
            })
            .await
            .unwrap();
        assert_eq!(out, Outcome::FailOpen);
        // An empty id is the caller's mistake, failing open or not.
        let e = client.settle("", 1).await.unwrap_err();
        assert!(matches!(e, Error::NothingToSettle(_)), "{e}");
    }

    #[tokio::test]
    async fn a_settles_refusal_is_an_error_even_failing_open() {
        let refusal = r#"{"error":"already_settled","message":"settled already"}"#;
        let (url, _) = Fake::answering(409, refusal).start().await;
        let client = Client::builder(&url).fail_open(true).build().unwrap();
        match client.settle("ab", 1).await {
            Err(Error::AlreadySettled {
                reservation,
                message,
            }) => assert_eq!(
                (reservation.as_str(), message.as_str()),
                ("ab", "settled already")
            ),
            other => panic!("expected AlreadySettled, got {other:?}"),
        }
    }
}
