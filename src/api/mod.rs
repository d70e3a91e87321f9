//! The HTTP API: routes, request validation, rate-limit headers.
//!
//! Every refused request goes through [`App::refuse`], which counts it and renders
//! [`ApiError`] as `{"error","message"}` with a 4xx status. Validation happens before the
//! engine is called, so a bad request never changes a counter.
//!
//! The engine and the headers derived from its rules are one [`Served`] value behind an
//! `ArcSwap`: a request loads it once (no lock, no shared reference count) and a reload
//! ([`App::reload`]) swaps in the next one whole, so a request never sees new rules with old
//! headers.

mod body;
mod error;

use std::borrow::Cow;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use axum::Router;
use axum::body::Body;
use axum::extract::{RawQuery, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use http_body_util::{BodyExt, Either, Full};
use hyper::Method;
use hyper::body::Incoming;
use serde::Deserialize;
use tower::ServiceExt;

use arc_swap::ArcSwap;

use crate::clock::Clock;
use crate::config::Rule;
use crate::engine::{Checked, Engine, Outcome, ReloadError, RuleChanges};
use crate::limiter::{Decision, MILLISECOND, Nanos, SECOND, Verdict};
use crate::metrics::{HttpMetrics, ReloadMetrics};
use body::DecisionBody;

pub use error::{ApiError, ErrorCode};

/// What a check body looks like, for error messages.
const EXAMPLE_BODY: &str = r#"{"rule":"api","key":"user-42","cost":1}"#;

/// The largest request body accepted.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// The longest key accepted.
pub const MAX_KEY_BYTES: usize = 1024;

/// Everything a request handler needs.
#[derive(Debug)]
pub struct App {
    /// The rules in force: replaced whole by [`App::reload`].
    served: ArcSwap<Served>,
    /// Serializes reloads (each is computed from the engine it replaces).
    reloading: std::sync::Mutex<()>,
    /// The engine's clock, for waits that outlive one [`Served`].
    clock: Arc<dyn Clock>,
    /// Latency and error counters.
    pub metrics: HttpMetrics,
    /// Config reloads.
    pub reloads: ReloadMetrics,
    /// This node's id.
    pub node_id: String,
    /// The gossip address, once clustering is configured.
    pub gossip: Option<SocketAddr>,
    /// False once the node starts shutting down (`/readyz` then answers 503).
    pub ready: AtomicBool,
    /// The cluster, when this node is part of one.
    pub cluster: std::sync::OnceLock<Arc<crate::cluster::node::Cluster>>,
    /// Envoy's rate limit service, when configured (`[server] grpc`).
    pub rls: std::sync::OnceLock<Arc<crate::rls::Rls>>,
    /// How long a client may take to send its body.
    pub request_timeout: Duration,
}

/// The engine together with what the API derives from its rules.
#[derive(Debug)]
pub struct Served {
    /// Rules, keys and the clock.
    pub engine: Engine,
    /// Per rule, its `RateLimit-Policy` header and the policy names `RateLimit` refers to.
    policies: HashMap<String, Policies>,
}

#[derive(Debug)]
struct Policies {
    /// `RateLimit-Policy`, listing every limit.
    header: HeaderValue,
    /// Each limit's policy name, quoted.
    names: Vec<String>,
    /// Each limit's `RateLimit-Limit` value.
    limits: Vec<HeaderValue>,
}

impl Served {
    /// The engine with its rules' headers.
    pub fn new(engine: Engine) -> Served {
        let policies = engine
            .rules()
            .map(|r| {
                let rule = &r.rule;
                let names: Vec<String> = if rule.limits.len() == 1 {
                    vec![format!("\"{}\"", rule.name)]
                } else {
                    (0..rule.limits.len())
                        .map(|i| format!("\"{}#{i}\"", rule.name))
                        .collect()
                };
                let header = names
                    .iter()
                    .zip(&rule.limits)
                    .map(|(name, l)| format!("{name};q={};w={}", l.limit(), ceil_secs(l.period())))
                    .collect::<Vec<_>>()
                    .join(", ");
                let header = HeaderValue::from_str(&header).expect("rule names are header-safe");
                let limits = rule
                    .limits
                    .iter()
                    .map(|l| HeaderValue::from(l.limit()))
                    .collect();
                (
                    rule.name.clone(),
                    Policies {
                        header,
                        names,
                        limits,
                    },
                )
            })
            .collect();
        Served { engine, policies }
    }
}

impl App {
    /// Wraps an engine for serving.
    pub fn new(
        engine: Engine,
        node_id: String,
        gossip: Option<SocketAddr>,
        request_timeout: Duration,
    ) -> App {
        let clock = engine.shared_clock();
        let reloads = ReloadMetrics::default();
        reloads
            .last_success
            .store(clock.now() / SECOND, Ordering::Relaxed);
        App {
            served: ArcSwap::from_pointee(Served::new(engine)),
            reloading: std::sync::Mutex::new(()),
            clock,
            metrics: HttpMetrics::default(),
            reloads,
            node_id,
            gossip,
            ready: AtomicBool::new(true),
            cluster: std::sync::OnceLock::new(),
            rls: std::sync::OnceLock::new(),
            request_timeout,
        }
    }

    /// The rules in force now. Cheap (no lock, no shared count); hold it briefly, never
    /// across an `.await` (use [`App::served_full`] for that).
    pub fn served(&self) -> arc_swap::Guard<Arc<Served>> {
        self.served.load()
    }

    /// The rules in force now, as an `Arc` that may be held as long as needed.
    pub fn served_full(&self) -> Arc<Served> {
        self.served.load_full()
    }

    /// Replaces the rules with `rules` ([`Engine::reload`]: unchanged and relimited rules
    /// keep their counts, otherwise redefined and new ones start fresh). On an error the
    /// running rules stay.
    /// Counts the result in [`App::reloads`].
    pub fn reload(&self, rules: Vec<Rule>) -> Result<RuleChanges, ReloadError> {
        let _one_at_a_time = self.reloading.lock().unwrap_or_else(|p| p.into_inner());
        let result = self.served.load().engine.reload(rules);
        match result {
            Ok((engine, changes)) => {
                self.served.store(Arc::new(Served::new(engine)));
                self.reloads.ok.fetch_add(1, Ordering::Relaxed);
                self.reloads
                    .last_success
                    .store(self.clock.now() / SECOND, Ordering::Relaxed);
                Ok(changes)
            }
            Err(e) => {
                self.reload_failed();
                Err(e)
            }
        }
    }

    /// Counts a reload that failed before reaching the rules (an unreadable or invalid file).
    pub fn reload_failed(&self) {
        self.reloads.error.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a refused request and renders it.
    pub fn refuse(&self, error: ApiError) -> Response {
        self.metrics.errors.add(error.code() as usize, 1);
        error.into_response()
    }
}

/// The routes.
pub fn router(app: Arc<App>) -> Router {
    fn only(
        allow: &'static str,
    ) -> impl Fn(State<Arc<App>>) -> std::future::Ready<Response> + Clone {
        move |State(app): State<Arc<App>>| {
            std::future::ready(app.refuse(ApiError::MethodNotAllowed(allow)))
        }
    }
    Router::new()
        .route(
            "/v1/check",
            // HEAD would run the GET handler and charge the key: refuse it.
            get(check_get)
                .post(check_post)
                .head(only("GET, POST"))
                .fallback(only("GET, POST")),
        )
        .route(
            "/v1/check/batch",
            axum::routing::post(check_batch).fallback(only("POST")),
        )
        .route(
            "/v1/reserve",
            axum::routing::post(reserve_post).fallback(only("POST")),
        )
        .route(
            "/v1/settle",
            axum::routing::post(settle_post).fallback(only("POST")),
        )
        .route("/v1/status", get(status).fallback(only("GET")))
        .route("/v1/cluster", get(cluster).fallback(only("GET")))
        .route("/metrics", get(metrics).fallback(only("GET")))
        .route("/healthz", get(healthz).fallback(only("GET")))
        .route("/readyz", get(readyz).fallback(only("GET")))
        .fallback(|State(app): State<Arc<App>>| async move { app.refuse(ApiError::NotFound) })
        .with_state(app)
}

/// A check as posted.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckBody<'a> {
    #[serde(borrow, default)]
    rule: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    key: Option<Cow<'a, str>>,
    #[serde(default)]
    cost: Option<serde_json::Value>,
    #[serde(default)]
    wait_ms: Option<serde_json::Value>,
}

/// A batch of checks as posted: `{"checks": [{"rule", "key", "cost"}, ...]}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchBody<'a> {
    #[serde(borrow, default)]
    checks: Option<Vec<BatchItemBody<'a>>>,
}

/// One check of a batch.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchItemBody<'a> {
    #[serde(borrow, default)]
    rule: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    key: Option<Cow<'a, str>>,
    #[serde(default)]
    cost: Option<serde_json::Value>,
}

/// A settle as posted: `{"reservation": "<id>", "cost": <actual cost>}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SettleBody<'a> {
    #[serde(borrow, default)]
    reservation: Option<Cow<'a, str>>,
    #[serde(default)]
    cost: Option<serde_json::Value>,
}

/// Whether a decision is a check or a reservation (`POST /v1/reserve`: a check that, admitted,
/// is also held for a settle).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Check,
    Reserve,
}

/// The most checks one batch may hold.
pub const MAX_BATCH: usize = 64;

/// A check or status as a query string.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckQuery {
    rule: Option<String>,
    key: Option<String>,
    cost: Option<String>,
    wait_ms: Option<String>,
}

/// A validated check.
#[derive(Debug)]
struct CheckRequest<'a> {
    rule: &'a str,
    key: &'a str,
    cost: u64,
    wait: Nanos,
}

/// The hyper service a node serves. `POST /v1/check`, the hot path, is dispatched straight to
/// its handler with an unboxed body; every other request goes through the axum [`router`]
/// (which also routes `POST /v1/check`, to the same handler, for embedders). Measured under
/// load, the router and boxed bodies cost more than a token-bucket decision.
#[derive(Debug, Clone)]
pub struct Service {
    app: Arc<App>,
    router: Router,
}

/// A response body: a check's own bytes, or whatever the router made.
pub type ResponseBody = Either<Full<Bytes>, Body>;

impl Service {
    /// The service for `app`.
    pub fn new(app: Arc<App>) -> Service {
        Service {
            router: router(app.clone()),
            app,
        }
    }
}

impl hyper::service::Service<hyper::Request<Incoming>> for Service {
    type Response = Response<ResponseBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn call(&self, request: hyper::Request<Incoming>) -> Self::Future {
        if request.method() == Method::POST && request.uri().path() == "/v1/check" {
            let app = self.app.clone();
            Box::pin(async move {
                let (parts, body) = request.into_parts();
                Ok(match check_post_body(&app, &parts.headers, body).await {
                    Ok(response) => response.map(Either::Left),
                    Err(e) => app.refuse(e).map(Either::Right),
                })
            })
        } else {
            let router = self.router.clone();
            Box::pin(async move {
                let response = router.oneshot(request).await;
                Ok(response
                    .unwrap_or_else(|never| match never {})
                    .map(Either::Right))
            })
        }
    }
}

async fn check_post(State(app): State<Arc<App>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    match check_post_body(&app, &parts.headers, body).await {
        Ok(response) => response.map(Body::new),
        Err(e) => app.refuse(e),
    }
}

async fn check_post_body<B>(
    app: &App,
    headers: &HeaderMap,
    body: B,
) -> Result<Response<Full<Bytes>>, ApiError>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    decision_post_body(app, headers, body, Mode::Check).await
}

/// `POST /v1/reserve`: a check (same body, same answer) that, admitted, also carries
/// `"reservation": "<id>"` for `POST /v1/settle`.
async fn reserve_post(State(app): State<Arc<App>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    match decision_post_body(&app, &parts.headers, body, Mode::Reserve).await {
        Ok(response) => response.map(Body::new),
        Err(e) => app.refuse(e),
    }
}

/// A check's or a reservation's POST body, validated, decided and answered.
async fn decision_post_body<B>(
    app: &App,
    headers: &HeaderMap,
    body: B,
    mode: Mode,
) -> Result<Response<Full<Bytes>>, ApiError>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let body = read_body(app, headers, body).await?;
    // serde would also read a JSON array as the struct's fields in order; only objects count.
    if body.trim_ascii_start().first() != Some(&b'{') {
        return Err(ApiError::MalformedJson(format!(
            "the body must be a JSON object such as {EXAMPLE_BODY}"
        )));
    }
    let parsed: CheckBody<'_> = serde_json::from_slice(&body).map_err(json_error)?;
    let cost = match &parsed.cost {
        None => Ok(1),
        Some(v) => json_whole_number(v)
            .filter(|&n| n >= 1)
            .ok_or_else(|| ApiError::InvalidCost(v.to_string())),
    };
    let wait_ms = match &parsed.wait_ms {
        None => Ok(0),
        Some(v) => json_whole_number(v).ok_or_else(|| ApiError::InvalidWait(v.to_string())),
    };
    let request = validate(parsed.rule.as_deref(), parsed.key.as_deref(), cost, wait_ms)?;
    check(app, request, mode).await
}

/// `POST /v1/settle`: settles a reservation with its actual cost ([`Engine::settle`]). 200
/// with what was given back or charged and where the key stands; a 4xx, changing nothing,
/// for an unknown (404), settled (409) or expired (410) reservation or a bad cost (400).
async fn settle_post(State(app): State<Arc<App>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    match settle_body(&app, &parts.headers, body).await {
        Ok(response) => response,
        Err(e) => app.refuse(e),
    }
}

async fn settle_body<B>(app: &App, headers: &HeaderMap, body: B) -> Result<Response, ApiError>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    const EXAMPLE: &str = r#"{"reservation":"<id from /v1/reserve>","cost":1500}"#;
    let body = read_body(app, headers, body).await?;
    if body.trim_ascii_start().first() != Some(&b'{') {
        return Err(ApiError::MalformedJson(format!(
            "the body must be a JSON object such as {EXAMPLE}"
        )));
    }
    let parsed: SettleBody<'_> =
        serde_json::from_slice(&body).map_err(|e| match json_error(e) {
            ApiError::MalformedJson(_) => {
                ApiError::MalformedJson(format!("the body must be a JSON object such as {EXAMPLE}"))
            }
            other => other,
        })?;
    let id = parsed
        .reservation
        .filter(|r| !r.is_empty())
        .ok_or(ApiError::MissingField("reservation"))?;
    let cost = parsed.cost.ok_or(ApiError::MissingField("cost"))?;
    let cost = json_whole_number(&cost)
        .filter(|&n| n <= crate::reserve::MAX_SETTLE_COST)
        .ok_or_else(|| ApiError::InvalidSettleCost(cost.to_string()))?;
    let served = app.served();
    let settled = served.engine.settle(&id, cost).map_err(ApiError::Settle)?;
    /// The answer, fields in this order.
    #[derive(serde::Serialize)]
    struct Answer<'a> {
        reservation: &'a str,
        rule: &'a str,
        key: &'a str,
        reserved: u64,
        cost: u64,
        refunded: u64,
        charged: u64,
        unpaid: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        limit: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        remaining: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        reset_after_ms: Option<u64>,
    }
    let standing = settled.standing.as_ref().map(|s| &s.decision);
    let answer = Answer {
        reservation: &id,
        rule: &settled.rule,
        key: &settled.key,
        reserved: settled.reserved,
        cost: settled.cost,
        refunded: settled.refunded,
        charged: settled.charged,
        unpaid: settled.unpaid,
        limit: standing.map(|d| d.limit),
        remaining: standing.map(|d| d.remaining),
        reset_after_ms: standing.map(|d| ceil_millis(d.reset_after)),
    };
    let mut headers = HeaderMap::new();
    if let (Some(standing), Some(policies)) =
        (&settled.standing, served.policies.get(&settled.rule))
    {
        rate_limit_headers(
            &mut headers,
            policies,
            standing.limit_index,
            &standing.decision,
        );
    }
    Ok((StatusCode::OK, headers, axum::Json(answer)).into_response())
}

/// `POST /v1/check/batch`: several (rule, key, cost) decided all or nothing
/// ([`crate::batch`]): 200 when every item was charged, 429 when none was; one result per
/// item, in order. A cost of 0 reports the key's standing without charging it.
async fn check_batch(State(app): State<Arc<App>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    match check_batch_body(&app, &parts.headers, body).await {
        Ok(response) => response,
        Err(e) => app.refuse(e),
    }
}

async fn check_batch_body<B>(app: &App, headers: &HeaderMap, body: B) -> Result<Response, ApiError>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    const EXAMPLE: &str = r#"{"checks":[{"rule":"api","key":"user-42","cost":1}]}"#;
    let body = read_body(app, headers, body).await?;
    if body.trim_ascii_start().first() != Some(&b'{') {
        return Err(ApiError::MalformedJson(format!(
            "the body must be a JSON object such as {EXAMPLE}"
        )));
    }
    let parsed: BatchBody<'_> = serde_json::from_slice(&body).map_err(json_error)?;
    let checks = parsed
        .checks
        .filter(|c| !c.is_empty())
        .ok_or(ApiError::MissingField("checks"))?;
    if checks.len() > MAX_BATCH {
        return Err(ApiError::MalformedJson(format!(
            "a batch holds at most {MAX_BATCH} checks, got {}",
            checks.len()
        )));
    }
    let mut wanted = Vec::with_capacity(checks.len());
    for c in &checks {
        let cost = match &c.cost {
            None => Ok(1),
            Some(v) => json_whole_number(v).ok_or_else(|| ApiError::InvalidCost(v.to_string())),
        };
        let request = validate(c.rule.as_deref(), c.key.as_deref(), cost, Ok(0))?;
        wanted.push(request);
    }
    let started = Instant::now();
    let decide = |may_pause: bool| -> Result<Result<Response, (Nanos, u64)>, ApiError> {
        let served = app.served();
        let items: Vec<crate::batch::Item<'_, '_>> = wanted
            .iter()
            .map(|w| crate::batch::Item {
                engine: &served.engine,
                rule: w.rule,
                key: w.key,
                cost: w.cost,
            })
            .collect();
        match crate::batch::check_all(&items, may_pause) {
            Err(e) => Err(ApiError::UnknownRule(e.0)),
            Ok(crate::batch::Step::Pause(pause, seen)) => Ok(Err((pause, seen))),
            Ok(crate::batch::Step::Done(allowed, results)) => {
                Ok(Ok(batch_response(allowed, &wanted, &results)))
            }
        }
    };
    let response = match decide(true)? {
        Ok(response) => response,
        Err((pause, mark)) => {
            let done = || app.served().engine.lease_in(mark);
            let held = crate::engine::hold_for_lease(&*app.clock, done, pause).await;
            app.metrics.lease_waited(held);
            match decide(false)? {
                Ok(response) => response,
                Err(_) => unreachable!("decide pauses only when asked to"),
            }
        }
    };
    app.metrics.check_latency.observe(started.elapsed());
    Ok(response)
}

fn batch_response(
    allowed: bool,
    wanted: &[CheckRequest<'_>],
    results: &[crate::batch::ItemResult<'_>],
) -> Response {
    use crate::batch::Fate;
    let items: Vec<serde_json::Value> = wanted
        .iter()
        .zip(results)
        .map(|(w, r)| {
            let d = &r.checked.decision;
            serde_json::json!({
                "rule": w.rule,
                "key": w.key,
                "cost": w.cost,
                "allowed": r.fate != Fate::Denied,
                "charged": r.fate == Fate::Charged,
                "limit": d.limit,
                "remaining": d.remaining,
                "reset_after_ms": ceil_millis(d.reset_after),
                "retry_after_ms": if r.fate == Fate::Denied { d.retry_after().map(ceil_millis) } else { None },
                "outcome": if r.fate == Fate::Denied { r.checked.outcome.name() } else { "allowed" },
            })
        })
        .collect();
    let status = if allowed {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    };
    (
        status,
        axum::Json(serde_json::json!({"allowed": allowed, "results": items})),
    )
        .into_response()
}

async fn check_get(State(app): State<Arc<App>>, RawQuery(query): RawQuery) -> Response {
    let query = match parse_query(query.as_deref()) {
        Ok(q) => q,
        Err(e) => return app.refuse(e),
    };
    let cost = match &query.cost {
        None => Ok(1),
        Some(s) => s
            .parse::<u64>()
            .ok()
            .filter(|&n| n >= 1)
            .ok_or_else(|| ApiError::InvalidCost(format!("\"{s}\""))),
    };
    let wait_ms = match &query.wait_ms {
        None => Ok(0),
        Some(s) => s
            .parse::<u64>()
            .map_err(|_| ApiError::InvalidWait(format!("\"{s}\""))),
    };
    let checked = match validate(query.rule.as_deref(), query.key.as_deref(), cost, wait_ms) {
        Ok(request) => check(&app, request, Mode::Check).await,
        Err(e) => Err(e),
    };
    match checked {
        Ok(response) => response.map(Body::new),
        Err(e) => app.refuse(e),
    }
}

async fn status(State(app): State<Arc<App>>, RawQuery(query): RawQuery) -> Response {
    let query = match parse_query(query.as_deref()) {
        Ok(q) => q,
        Err(e) => return app.refuse(e),
    };
    if query.cost.is_some() || query.wait_ms.is_some() {
        let field = if query.cost.is_some() {
            "cost"
        } else {
            "wait_ms"
        };
        return app.refuse(ApiError::UnknownField(field.into()));
    }
    let request = match validate(query.rule.as_deref(), query.key.as_deref(), Ok(1), Ok(0)) {
        Ok(r) => r,
        Err(e) => return app.refuse(e),
    };
    let served = app.served();
    match served.engine.status(request.rule, request.key) {
        Ok(checked) => decision_response(&served, StatusCode::OK, request.key, &checked, 0, None)
            .map(Body::new),
        Err(e) => app.refuse(ApiError::UnknownRule(e.0)),
    }
}

/// What [`decide`] came to.
enum Step {
    /// The response, and how long to hold it (shaping).
    Answer(Response<Full<Bytes>>, Nanos),
    /// Wait up to this long for the lease (in by this mark:
    /// [`crate::engine::Engine::lease_in`]), then decide again.
    Pause(Nanos, u64),
}

/// Runs a validated check (or reservation) and, for a shaping rule, holds the caller as long
/// as decided.
async fn check(
    app: &App,
    request: CheckRequest<'_>,
    mode: Mode,
) -> Result<Response<Full<Bytes>>, ApiError> {
    let started = Instant::now();
    // The rules are loaded for the decision only, never held across an await.
    let step = decide(&app.served(), &request, true, mode)?;
    let (response, wait) = match step {
        Step::Answer(response, wait) => (response, wait),
        Step::Pause(pause, mark) => {
            let done = || app.served().engine.lease_in(mark);
            let held = crate::engine::hold_for_lease(&*app.clock, done, pause).await;
            app.metrics.lease_waited(held);
            match decide(&app.served(), &request, false, mode)? {
                Step::Answer(response, wait) => (response, wait),
                Step::Pause(..) => unreachable!("decide pauses only when asked to"),
            }
        }
    };
    app.metrics.check_latency.observe(started.elapsed());
    if wait > 0 {
        app.clock.sleep(wait).await;
    }
    Ok(response)
}

/// Decides and counts a check (a reservation is one), unless `may_pause` and the decision is
/// a clustered key this node holds no lease for yet: that gets one within milliseconds, so
/// the caller waits for it rather than answer 429 (Retry-After would round that up to a
/// second).
fn decide(
    served: &Served,
    request: &CheckRequest<'_>,
    may_pause: bool,
    mode: Mode,
) -> Result<Step, ApiError> {
    let engine = &served.engine;
    let (rule, key, cost, wait) = (request.rule, request.key, request.cost, request.wait);
    let (checked, reservation) = match mode {
        Mode::Check => (engine.check_uncounted(rule, key, cost, wait), None),
        Mode::Reserve => match engine.reserve_uncounted(rule, key, cost, wait) {
            Ok((checked, id)) => (Ok(checked), id),
            Err(e) => (Err(e), None),
        },
    };
    let checked = checked.map_err(|e| ApiError::UnknownRule(e.0))?;
    // Only a denial pauses, and a denial holds no reservation.
    if may_pause && let Some((pause, mark)) = engine.lease_pause(&checked, key, request.cost) {
        return Ok(Step::Pause(pause, mark));
    }
    engine.count(&checked);
    let wait = match checked.decision.verdict {
        Verdict::Admit { wait } => wait,
        _ => 0,
    };
    let status = if checked.outcome == Outcome::Allowed {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    };
    let id = reservation.map(|id| id.to_string());
    let response = decision_response(served, status, request.key, &checked, wait, id.as_deref());
    Ok(Step::Answer(response, wait))
}

fn validate<'a>(
    rule: Option<&'a str>,
    key: Option<&'a str>,
    cost: Result<u64, ApiError>,
    wait_ms: Result<u64, ApiError>,
) -> Result<CheckRequest<'a>, ApiError> {
    let rule = rule
        .filter(|r| !r.is_empty())
        .ok_or(ApiError::MissingField("rule"))?;
    let key = key
        .filter(|k| !k.is_empty())
        .ok_or(ApiError::MissingField("key"))?;
    if key.len() > MAX_KEY_BYTES {
        return Err(ApiError::KeyTooLong(key.len()));
    }
    Ok(CheckRequest {
        rule,
        key,
        cost: cost?,
        wait: wait_ms?.saturating_mul(MILLISECOND),
    })
}

async fn read_body<B>(app: &App, headers: &HeaderMap, body: B) -> Result<Bytes, ApiError>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > DRAIN_BYTES as u64) {
        return Err(ApiError::BodyTooLarge);
    }
    // The whole body has usually arrived with the headers: try once before arming a timer.
    let mut collecting = std::pin::pin!(collect(body));
    let ready = std::future::poll_fn(|cx| Poll::Ready(collecting.as_mut().poll(cx))).await;
    let collected = match ready {
        Poll::Ready(result) => Ok(result),
        Poll::Pending => tokio::time::timeout(app.request_timeout, collecting).await,
    };
    match collected {
        Err(_) => Err(ApiError::Timeout),
        Ok(Ok(Some(bytes))) => Ok(bytes),
        Ok(Ok(None)) => Err(ApiError::BodyTooLarge),
        Ok(Err(e)) => Err(ApiError::MalformedJson(format!(
            "could not read the body: {e}"
        ))),
    }
}

/// How much of an oversized body is read and thrown away before answering 413. Closing a
/// socket that still holds unread data makes the kernel reset the connection, and a client
/// still sending may then lose the answer; reading the rest (up to this much) lets the 413
/// arrive. A body declared larger than this is refused without reading it.
const DRAIN_BYTES: usize = 4 * 1024 * 1024;

/// The body's bytes, or `None` if it is over [`MAX_BODY_BYTES`] (then it is read up to
/// [`DRAIN_BYTES`] and discarded). A body that arrives in one chunk (the usual case) is
/// returned as it is, without copying.
async fn collect<B>(body: B) -> Result<Option<Bytes>, B::Error>
where
    B: http_body::Body<Data = Bytes>,
{
    let mut body = std::pin::pin!(body);
    let mut first = Bytes::new();
    let mut joined: Option<Vec<u8>> = None;
    let mut total = 0usize;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue; // trailers
        };
        total = total.saturating_add(data.len());
        if total > MAX_BODY_BYTES {
            if total > DRAIN_BYTES {
                return Ok(None);
            }
            continue;
        }
        match &mut joined {
            Some(all) => all.extend_from_slice(&data),
            None if first.is_empty() => first = data,
            None => {
                let mut all = Vec::with_capacity(first.len() + data.len());
                all.extend_from_slice(&first);
                all.extend_from_slice(&data);
                joined = Some(all);
            }
        }
    }
    if total > MAX_BODY_BYTES {
        return Ok(None);
    }
    Ok(Some(joined.map_or(first, Bytes::from)))
}

fn json_error(e: serde_json::Error) -> ApiError {
    let message = e.to_string();
    if let Some(rest) = message.strip_prefix("unknown field `") {
        let field = rest.split('`').next().unwrap_or_default();
        return ApiError::UnknownField(field.to_owned());
    }
    ApiError::MalformedJson(format!(
        "the body must be a JSON object such as {EXAMPLE_BODY}: {message}"
    ))
}

/// A JSON number that is a whole number ≥ 0 (`3`, not `3.0`, `-1` or `"3"`).
fn json_whole_number(v: &serde_json::Value) -> Option<u64> {
    v.as_u64()
}

fn parse_query(query: Option<&str>) -> Result<CheckQuery, ApiError> {
    serde_urlencoded::from_str(query.unwrap_or("")).map_err(|e| {
        let message = e.to_string();
        match message.strip_prefix("unknown field `") {
            Some(rest) => {
                ApiError::UnknownField(rest.split('`').next().unwrap_or_default().to_owned())
            }
            None => ApiError::InvalidQuery(message),
        }
    })
}

fn decision_response(
    served: &Served,
    status: StatusCode,
    key: &str,
    checked: &Checked<'_>,
    wait: Nanos,
    reservation: Option<&str>,
) -> Response<Full<Bytes>> {
    let d = &checked.decision;
    let rule = &checked.rule.rule.name;
    let body = DecisionBody {
        allowed: d.allowed(),
        rule,
        key,
        limit: d.limit,
        remaining: d.remaining,
        reset_after_ms: ceil_millis(d.reset_after),
        retry_after_ms: d.retry_after().map(ceil_millis),
        outcome: checked.outcome.name(),
        waited_ms: (wait > 0).then(|| ceil_millis(wait)),
        reservation,
    };
    let mut json = Vec::with_capacity(240 + key.len());
    body.encode(&mut json);
    let mut response = Response::new(Full::new(Bytes::from(json)));
    *response.status_mut() = status;
    *response.headers_mut() = HeaderMap::with_capacity(8);
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Some(policies) = served.policies.get(rule.as_str()) {
        rate_limit_headers(headers, policies, checked.limit_index, d);
    }
    // Retry-After belongs to a 429; a status query carries the figure in its body only.
    if let (Verdict::Deny { retry_after }, StatusCode::TOO_MANY_REQUESTS) = (d.verdict, status) {
        headers.insert(header::RETRY_AFTER, number_header(ceil_secs(retry_after)));
    }
    response
}

static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
static RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("ratelimit-limit");
static RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("ratelimit-remaining");
static RATELIMIT_RESET: HeaderName = HeaderName::from_static("ratelimit-reset");

/// The IETF draft's `RateLimit-Policy` / `RateLimit` and the older `RateLimit-Limit`,
/// `-Remaining` and `-Reset` (whole seconds, rounded up).
fn rate_limit_headers(headers: &mut HeaderMap, policies: &Policies, index: usize, d: &Decision) {
    let reset = ceil_secs(d.reset_after);
    headers.insert(RATELIMIT_POLICY.clone(), policies.header.clone());
    let name = &policies.names[index];
    // `"name";r=N;t=N`, built without the formatting machinery (this runs on every check).
    let mut value = Vec::with_capacity(name.len() + 48);
    value.extend_from_slice(name.as_bytes());
    value.extend_from_slice(b";r=");
    value.extend_from_slice(itoa::Buffer::new().format(d.remaining).as_bytes());
    value.extend_from_slice(b";t=");
    value.extend_from_slice(itoa::Buffer::new().format(reset).as_bytes());
    if let Ok(v) = HeaderValue::from_maybe_shared(Bytes::from(value)) {
        headers.insert(RATELIMIT.clone(), v);
    }
    headers.insert(RATELIMIT_LIMIT.clone(), policies.limits[index].clone());
    headers.insert(RATELIMIT_REMAINING.clone(), number_header(d.remaining));
    headers.insert(RATELIMIT_RESET.clone(), number_header(reset));
}

/// Numbers below this are served from a table of static header values.
const SMALL_NUMBERS: usize = 1024;

/// A header value holding `n`. Small numbers (most remaining counts and resets) come from a
/// table built once, so they cost neither an allocation nor a shared reference count;
/// `HeaderValue::from(u64)` allocated and formatted on every call.
fn number_header(n: u64) -> HeaderValue {
    static TABLE: std::sync::OnceLock<Vec<HeaderValue>> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        (0..SMALL_NUMBERS)
            .map(|i| {
                let text: &'static str = Box::leak(i.to_string().into_boxed_str());
                HeaderValue::from_static(text)
            })
            .collect()
    });
    match usize::try_from(n) {
        Ok(i) if i < SMALL_NUMBERS => table[i].clone(),
        _ => HeaderValue::from(n),
    }
}

async fn cluster(State(app): State<Arc<App>>) -> Response {
    let Some(cluster) = app.cluster.get() else {
        return axum::Json(serde_json::json!({
            "node_id": app.node_id,
            "clustered": false,
            "secure": false,
            "members": [{
                "node_id": app.node_id,
                "gossip": app.gossip.map(|a| a.to_string()),
                "alive": true,
                "self": true,
            }],
        }))
        .into_response();
    };
    let suspected = cluster.suspected();
    let mismatched = cluster.mismatched_rules();
    let offsets: HashMap<String, i64> = cluster.clock_offsets().into_iter().collect();
    let members: Vec<serde_json::Value> = cluster
        .members()
        .into_iter()
        .map(|m| {
            serde_json::json!({
                "node_id": m.node_id,
                "generation": m.generation,
                "gossip": m.gossip_addr.to_string(),
                "quic": m.meta.as_ref().map(|meta| meta.quic_addr.to_string()),
                "version": m.meta.as_ref().map(|meta| meta.version.clone()),
                "rules_hash": m.meta.as_ref().map(|meta| meta.rules_hash.clone()),
                "limits": m.meta.as_ref().and_then(|meta| serde_json::from_str::<serde_json::Value>(&meta.limits).ok()),
                "alive": m.alive,
                "self": m.is_self,
                "last_seen_ms": m.last_seen.map(|d| d.as_millis() as u64),
                "suspected": suspected.contains(&m.node_id),
                "rules_match": !mismatched.contains(&m.node_id),
                "clock_offset_ms": offsets.get(&m.node_id).map(|&ns| ns as f64 / 1e6),
            })
        })
        .collect();
    axum::Json(serde_json::json!({
        "node_id": app.node_id,
        "clustered": true,
        "secure": cluster.secure(),
        "ready": cluster.ready(),
        "limits_in_force": cluster.limits_in_force(),
        "members": members,
    }))
    .into_response()
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    let mut text = crate::metrics::render(&app.served().engine, &app.metrics, &app.reloads);
    if let Some(cluster) = app.cluster.get() {
        cluster.render_metrics(&mut text);
    }
    if let Some(rls) = app.rls.get() {
        rls.metrics.render(&mut text);
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

async fn healthz() -> Response {
    axum::Json(serde_json::json!({"status": "ok"})).into_response()
}

async fn readyz(State(app): State<Arc<App>>) -> Response {
    if app.cluster.get().is_some_and(|c| !c.ready()) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(serde_json::json!({"status": "pulling cluster state"})),
        )
            .into_response();
    }
    if app.ready.load(Ordering::Relaxed) {
        axum::Json(serde_json::json!({"status": "ready"})).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(serde_json::json!({"status": "draining"})),
        )
            .into_response()
    }
}

fn ceil_millis(n: Nanos) -> u64 {
    n.div_ceil(MILLISECOND)
}

fn ceil_secs(n: Nanos) -> u64 {
    n.div_ceil(SECOND)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::clock::ManualClock;
    use crate::config::Config;
    use proptest::prelude::*;

    #[test]
    fn number_headers_match_their_value_inside_and_outside_the_table() {
        for n in [0, 1, 42, 1023, 1024, 99_999, u64::MAX] {
            assert_eq!(number_header(n).to_str().unwrap(), n.to_string());
        }
    }

    fn app() -> App {
        let config = Config::load(None, &Default::default()).unwrap();
        let clock = Arc::new(ManualClock::new(1_700_000_000 * SECOND));
        let engine = Engine::new(config.rules, 1_000, clock);
        App::new(engine, "n".into(), None, Duration::from_secs(1))
    }

    /// A JSON value of any shape, a few levels deep.
    fn json_value() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            any::<u64>().prop_map(serde_json::Value::from),
            any::<f64>().prop_map(serde_json::Value::from),
            ".{0,12}".prop_map(serde_json::Value::from),
            prop::sample::select(vec!["default", "api", "shaped", "nope", ""])
                .prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
                prop::collection::btree_map(
                    prop::sample::select(vec!["rule", "key", "cost", "wait_ms", "x"])
                        .prop_map(str::to_owned),
                    inner,
                    0..5
                )
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// Runs one POST body through the check handler, as the server would.
    fn post(app: &App, body: Vec<u8>) -> StatusCode {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let result = runtime.block_on(check_post_body(
            app,
            &HeaderMap::new(),
            Full::new(Bytes::from(body)),
        ));
        match result {
            Ok(response) => response.status(),
            Err(e) => e.status(),
        }
    }

    proptest! {
        /// Whatever the body, the answer is a decision (200/429) or a 4xx: never a 5xx, never
        /// a panic.
        #[test]
        fn any_json_body_gets_a_decision_or_a_client_error(value in json_value()) {
            let app = app();
            let status = post(&app, value.to_string().into_bytes());
            prop_assert!(
                status == StatusCode::OK
                    || status == StatusCode::TOO_MANY_REQUESTS
                    || status.is_client_error(),
                "{value} -> {status}"
            );
        }

        /// The same for arbitrary bytes.
        #[test]
        fn any_bytes_get_a_client_error_or_a_decision(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            let status = post(&app(), bytes);
            prop_assert!(status.is_client_error() || status == StatusCode::OK
                || status == StatusCode::TOO_MANY_REQUESTS);
        }

        /// A refused body never charges a key: the `default` key stays fresh.
        #[test]
        fn a_refused_body_charges_nothing(value in json_value()) {
            let app = app();
            let status = post(&app, value.to_string().into_bytes());
            if status.is_client_error() {
                let served = app.served();
                let rule = served.engine.rule("default").unwrap();
                prop_assert_eq!(rule.active_keys(), 0);
                let api = served.engine.rule("api").unwrap();
                prop_assert_eq!(api.active_keys(), 0);
            }
        }
    }
}
