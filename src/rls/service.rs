//! A rate limit request decided on the engine: validation, matching, all-or-nothing
//! charging, shadow mode, response headers, metrics. No I/O: [`Rls::decide`] is called by the
//! gRPC handler ([`super::grpc`]) with the engine in force, and by tests directly.
//!
//! A request's descriptors are decided together ([`crate::batch`]): if any enforced
//! descriptor is over its limit the answer is OVER_LIMIT and none is charged. Descriptors in
//! shadow mode are decided after the enforced ones, on their own, and only when the request is
//! admitted (a refused request never reaches the upstream, so it is not counted against a
//! shadow limit); their denials are counted and answered OK. Node-wide shadow mode decides
//! every descriptor as if enforced and answers OK.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;
use std::sync::Arc;

use super::config::{Domain, Quota, Unit};
use super::matcher::{Matched, Table, counter_key};
use super::proto::rate_limit_response::{self, Code, DescriptorStatus};
use super::proto::{HeaderValue, RateLimitRequest, RateLimitResponse};
use crate::batch::{self, Fate, Item};
use crate::clock::Clock;
use crate::config::{Rule, Scope};
use crate::engine::Engine;
use crate::limiter::{Algorithm, Nanos, SECOND};

/// The most descriptors one request may carry.
pub const MAX_DESCRIPTORS: usize = 64;
/// The most entries one descriptor may carry.
pub const MAX_ENTRIES: usize = 32;
/// The most bytes of a descriptor's domain, keys and values together (its counter key).
pub const MAX_DESCRIPTOR_BYTES: usize = 4096;
/// The largest hits_addend: requests_per_unit is a `uint32`, so more never fits.
pub const MAX_HITS: u64 = u32::MAX as u64;
/// The most distinct dynamic limits (request `limit` overrides) a node counts at once.
pub const MAX_DYNAMIC_LIMITS: usize = 1024;
/// The most metric series the RLS keeps; past it, new series are counted as dropped.
pub const MAX_SERIES: usize = 10_000;
/// The most requests decided at once before the node answers UNAVAILABLE (overloaded).
pub const DEFAULT_MAX_CONCURRENT: usize = 4096;

/// `[rls]` and `[server] grpc`: the RLS's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct RlsSettings {
    /// Where the gRPC listener binds (`[server] grpc`, `--grpc`); off when `None`.
    pub grpc: Option<std::net::SocketAddr>,
    /// The YAML file or directory (`[rls] config`, `--rls-config`).
    pub config: Option<PathBuf>,
    /// The domains read from it.
    pub domains: Vec<Domain>,
    /// `[rls] shadow_mode`: every answer is OK; decisions are still made and counted.
    pub shadow_mode: bool,
    /// `[rls] response_headers`: add the rate-limit headers to every response.
    pub response_headers: bool,
    /// `[rls] header_limit`, `header_remaining`, `header_reset`: their names.
    pub header_names: [String; 3],
    /// `[rls] max_concurrent`: requests decided at once before answering UNAVAILABLE.
    pub max_concurrent: usize,
}

impl Default for RlsSettings {
    fn default() -> RlsSettings {
        RlsSettings {
            grpc: None,
            config: None,
            domains: Vec::new(),
            shadow_mode: false,
            response_headers: false,
            header_names: DEFAULT_HEADER_NAMES.map(str::to_owned),
            max_concurrent: DEFAULT_MAX_CONCURRENT,
        }
    }
}

/// envoyproxy/ratelimit's default header names (`X-RateLimit-*` is the other common choice).
pub const DEFAULT_HEADER_NAMES: [&str; 3] =
    ["RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"];

/// What the RLS holds between requests: the compiled config, settings that reload, the
/// dynamic limits and the metrics.
#[derive(Debug)]
pub struct Rls {
    /// The config in force (replaced whole on reload).
    view: ArcSwap<View>,
    /// Request `limit` overrides without a configured twin, counted on this node.
    dynamic: Dynamic,
    /// Counters, rendered into `/metrics`.
    pub metrics: RlsMetrics,
}

/// The config in force.
#[derive(Debug, Default)]
struct View {
    table: Table,
    shadow_mode: bool,
    response_headers: bool,
    header_names: [String; 3],
}

/// A request that is not decided; nothing is counted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Malformed: answered INVALID_ARGUMENT.
    #[error("{0}")]
    Invalid(String),
    /// The node cannot decide it now: answered UNAVAILABLE.
    #[error("{0}")]
    Unavailable(String),
}

fn invalid<T>(message: String) -> Result<T, Refused> {
    Err(Refused::Invalid(message))
}

/// What [`Rls::decide`] came to.
#[derive(Debug)]
pub enum Answer {
    /// The response.
    Response(RateLimitResponse),
    /// Wait this long for a clustered key's first lease (in by this mark:
    /// [`crate::engine::Engine::lease_in`]), then decide again (without pausing).
    Pause(Nanos, u64),
}

impl Rls {
    /// An RLS serving `settings`' domains.
    pub fn new(settings: &RlsSettings, clock: Arc<dyn Clock>, max_keys: usize) -> Rls {
        Rls {
            view: ArcSwap::from_pointee(View::new(settings)),
            dynamic: Dynamic::new(clock, max_keys),
            metrics: RlsMetrics::default(),
        }
    }

    /// Serves `settings`' domains and flags from now on (a reload). The engine's rules must
    /// already hold the domains' rules.
    pub fn reload(&self, settings: &RlsSettings) {
        self.view.store(Arc::new(View::new(settings)));
    }

    /// Evicts the dynamic limits' fresh keys.
    pub fn sweep(&self) -> usize {
        self.dynamic.engine.load().sweep()
    }

    /// Decides `request` on `engine` (the rules in force). With `may_pause`, a clustered key
    /// new at this node may ask for a pause ([`Answer::Pause`]) instead of being denied.
    pub fn decide(
        &self,
        engine: &Engine,
        request: &RateLimitRequest,
        may_pause: bool,
    ) -> Result<Answer, Refused> {
        let view = self.view.load();
        let wanted = validate(request)?;
        let domain = request.domain.as_str();
        // What each descriptor is.
        let mut targets: Vec<Target> = Vec::with_capacity(wanted.len());
        let mut replaced: Vec<&str> = Vec::new();
        for w in &wanted {
            let target = match w.limit {
                Some(quota) => Target::Quota {
                    quota,
                    name: None,
                    key: counter_key(domain, &w.entries, &[]),
                    metric: None,
                    shadow: false,
                },
                None => match view.table.find(domain, &w.entries) {
                    None => Target::NotLimited,
                    Some(m) => {
                        if let Some(rl) = &m.node.rate_limit {
                            replaced.extend(rl.replaces.iter().map(String::as_str));
                        }
                        Target::matched(m)
                    }
                },
            };
            targets.push(target);
        }
        // `replaces`: a named limit that another matched limit replaces is dropped.
        for t in &mut targets {
            if let Target::Quota {
                name: Some(n),
                metric,
                ..
            } = t
                && replaced.contains(&n.as_str())
            {
                *t = Target::Replaced(metric.take());
            }
        }
        let node_shadow = view.shadow_mode;
        let shadowed = |t: &Target| node_shadow || matches!(t, Target::Quota { shadow: true, .. });
        // A quota whose rule the config holds is counted by the engine (across the cluster);
        // any other (a request's own limit) by this node's dynamic engine.
        let rules: Vec<Option<String>> = targets
            .iter()
            .map(|t| match t {
                Target::Quota { quota, .. } => quota.rule_name(),
                _ => None,
            })
            .collect();
        let dynamic: Vec<Quota> = targets
            .iter()
            .zip(&rules)
            .filter_map(|(t, r)| match (t, r) {
                (Target::Quota { quota, .. }, Some(rule)) if engine.rule(rule).is_err() => {
                    Some(*quota)
                }
                _ => None,
            })
            .collect();
        let dynamic_engine = match dynamic.is_empty() {
            true => None,
            false => Some(self.dynamic.with(&dynamic)?),
        };
        let engine_of = |rule: &str| -> &Engine {
            match &dynamic_engine {
                Some(d) if engine.rule(rule).is_err() => d,
                _ => engine,
            }
        };
        let n = targets.len();
        let mut results: Vec<Option<batch::ItemResult<'_>>> = vec![None; n];
        let mut denied = vec![false; n];
        // The enforced group (every quota, under node-wide shadow mode), all or nothing. A
        // quota of 0 refuses any charge and counts nothing.
        let enforced =
            |t: &Target| matches!(t, Target::Quota { shadow, .. } if !*shadow || node_shadow);
        let mut blocked = false;
        for i in 0..n {
            if enforced(&targets[i]) && rules[i].is_none() && wanted[i].cost > 0 {
                blocked = true;
                denied[i] = true;
            }
        }
        let mut group: Vec<(usize, Item<'_, '_>)> = Vec::new();
        for i in 0..n {
            if let (true, Some(rule)) = (enforced(&targets[i]), &rules[i]) {
                let item = Item {
                    engine: engine_of(rule),
                    rule,
                    key: targets[i].key(),
                    // Blocked: report the others' standing, charge nothing.
                    cost: if blocked { 0 } else { wanted[i].cost },
                };
                group.push((i, item));
            }
        }
        let items: Vec<Item<'_, '_>> = group.iter().map(|(_, item)| *item).collect();
        let admitted = match run(&items, may_pause)? {
            Ran::Pause(p, mark) => return Ok(Answer::Pause(p, mark)),
            Ran::Done(ok, decided) => {
                for ((i, _), r) in group.iter().zip(decided) {
                    denied[*i] |= r.fate == Fate::Denied;
                    results[*i] = Some(r);
                }
                ok && !blocked
            }
        };
        // Shadow descriptors, each on its own; charged only if the request is admitted.
        for i in 0..n {
            if !matches!(targets[i], Target::Quota { .. }) || enforced(&targets[i]) {
                continue;
            }
            let cost = if admitted { wanted[i].cost } else { 0 };
            let Some(rule) = &rules[i] else {
                denied[i] = cost > 0;
                continue;
            };
            let item = Item {
                engine: engine_of(rule),
                rule,
                key: targets[i].key(),
                cost,
            };
            match run(&[item], may_pause)? {
                Ran::Pause(p, mark) => return Ok(Answer::Pause(p, mark)),
                Ran::Done(_, mut r) => {
                    let r = r.remove(0);
                    denied[i] = r.fate == Fate::Denied;
                    results[i] = Some(r);
                }
            }
        }
        // The response.
        let mut statuses = Vec::with_capacity(n);
        let mut tally: Vec<(String, &'static str, bool)> = Vec::new();
        for (i, t) in targets.iter().enumerate() {
            let shadow = shadowed(t);
            let status = match t {
                Target::NotLimited => ok_status(0),
                Target::Replaced(metric) => {
                    if let Some(m) = metric {
                        tally.push((m.clone(), "replaced", shadow));
                    }
                    ok_status(0)
                }
                Target::Unlimited(metric) => {
                    if let Some(m) = metric {
                        tally.push((m.clone(), "unlimited", shadow));
                    }
                    ok_status(u32::MAX)
                }
                Target::Quota {
                    quota,
                    name,
                    metric,
                    ..
                } => {
                    let (remaining, reset) = match &results[i] {
                        Some(r) if !denied[i] => (
                            u32::try_from(r.checked.decision.remaining).unwrap_or(u32::MAX),
                            r.checked.decision.reset_after,
                        ),
                        Some(r) => (0, r.checked.decision.reset_after),
                        // A quota of 0: nothing remains until... never; report its unit.
                        None => (0, quota.unit.period()),
                    };
                    let label = if denied[i] {
                        "over_limit"
                    } else {
                        "within_limit"
                    };
                    let metric = metric
                        .clone()
                        .unwrap_or_else(|| format!("{domain}.limit_override"));
                    tally.push((metric, label, shadow));
                    let code = if denied[i] && !shadow {
                        Code::OverLimit
                    } else {
                        Code::Ok
                    };
                    DescriptorStatus {
                        code: code as i32,
                        current_limit: Some(current_limit(quota, name.as_deref())),
                        limit_remaining: remaining,
                        duration_until_reset: Some(duration(reset)),
                    }
                }
            };
            statuses.push(status);
        }
        // Shadow descriptors never deny; node-wide shadow mode never does either.
        let would_deny = !admitted
            || targets
                .iter()
                .enumerate()
                .any(|(i, t)| denied[i] && !shadowed(t));
        let overall = if would_deny && !node_shadow {
            Code::OverLimit
        } else {
            Code::Ok
        };
        let headers = if view.response_headers {
            headers(&view.header_names, &statuses)
        } else {
            Vec::new()
        };
        let shadow_denied = (would_deny && node_shadow)
            || targets
                .iter()
                .enumerate()
                .any(|(i, t)| denied[i] && shadowed(t));
        self.metrics.count(
            domain,
            overall,
            shadow_denied && overall == Code::Ok,
            &tally,
        );
        Ok(Answer::Response(RateLimitResponse {
            overall_code: overall as i32,
            statuses,
            response_headers_to_add: headers,
            request_headers_to_add: Vec::new(),
            raw_body: Vec::new(),
        }))
    }
}

enum Ran<'e> {
    Done(bool, Vec<batch::ItemResult<'e>>),
    Pause(Nanos, u64),
}

fn run<'e>(items: &[Item<'e, '_>], may_pause: bool) -> Result<Ran<'e>, Refused> {
    if items.is_empty() {
        return Ok(Ran::Done(true, Vec::new()));
    }
    match batch::check_all(items, may_pause) {
        Ok(batch::Step::Done(ok, r)) => Ok(Ran::Done(ok, r)),
        Ok(batch::Step::Pause(p, mark)) => Ok(Ran::Pause(p, mark)),
        // The rules and the table are swapped apart on reload: a rule may be gone for an
        // instant. The caller answers UNAVAILABLE, which Envoy treats as any failure.
        Err(e) => Err(Refused::Unavailable(format!(
            "the configuration is being reloaded ({e}); retry"
        ))),
    }
}

/// What a request descriptor is under the config.
#[derive(Debug)]
enum Target {
    /// No configured limit applies: OK.
    NotLimited,
    /// `unlimited: true`: OK, remaining u32::MAX (its metric label).
    Unlimited(Option<String>),
    /// Its limit is replaced by another matched limit: OK, not charged (its metric label).
    Replaced(Option<String>),
    /// Counted under `quota`, at `key`.
    Quota {
        quota: Quota,
        /// `rate_limit.name`.
        name: Option<String>,
        key: String,
        /// The metric label (`None`: a request's own limit).
        metric: Option<String>,
        /// `shadow_mode` of the matched descriptor.
        shadow: bool,
    },
}

impl Target {
    fn matched(m: Matched<'_>) -> Target {
        let rl = m
            .node
            .rate_limit
            .as_ref()
            .expect("find returns limited nodes");
        match rl.limit {
            None => Target::Unlimited(Some(m.metric)),
            Some(quota) => Target::Quota {
                quota,
                name: rl.name.clone(),
                key: m.key,
                metric: Some(m.metric),
                shadow: m.node.shadow_mode,
            },
        }
    }

    fn key(&self) -> &str {
        match self {
            Target::Quota { key, .. } => key,
            _ => "",
        }
    }
}

/// A descriptor as validated: its entries, cost and own limit.
struct Wanted<'r> {
    entries: Vec<(&'r str, &'r str)>,
    cost: u64,
    limit: Option<Quota>,
}

/// Checks every field before anything is looked up or counted.
fn validate(request: &RateLimitRequest) -> Result<Vec<Wanted<'_>>, Refused> {
    let bad = invalid;
    if request.domain.is_empty() {
        return bad("domain must not be empty".into());
    }
    if request.domain.len() > MAX_DESCRIPTOR_BYTES {
        return bad(format!(
            "domain is longer than {MAX_DESCRIPTOR_BYTES} bytes"
        ));
    }
    if request.descriptors.is_empty() {
        return bad("descriptors must not be empty".into());
    }
    if request.descriptors.len() > MAX_DESCRIPTORS {
        return bad(format!(
            "{} descriptors; the most is {MAX_DESCRIPTORS}",
            request.descriptors.len()
        ));
    }
    // hits_addend 0 means 1.
    let default_cost = u64::from(request.hits_addend.max(1));
    let mut out = Vec::with_capacity(request.descriptors.len());
    for (i, d) in request.descriptors.iter().enumerate() {
        let at = format!("descriptors[{i}]");
        if d.entries.is_empty() {
            return bad(format!("{at}: entries must not be empty"));
        }
        if d.entries.len() > MAX_ENTRIES {
            return bad(format!(
                "{at}: {} entries; the most is {MAX_ENTRIES}",
                d.entries.len()
            ));
        }
        let mut bytes = request.domain.len();
        let mut entries = Vec::with_capacity(d.entries.len());
        for (j, e) in d.entries.iter().enumerate() {
            if e.key.is_empty() {
                return bad(format!("{at}.entries[{j}]: key must not be empty"));
            }
            bytes += e.key.len() + e.value.len();
            entries.push((e.key.as_str(), e.value.as_str()));
        }
        if bytes > MAX_DESCRIPTOR_BYTES {
            return bad(format!(
                "{at}: domain, keys and values are {bytes} bytes; the most is {MAX_DESCRIPTOR_BYTES}"
            ));
        }
        let cost = match &d.hits_addend {
            None => default_cost,
            Some(h) if *h > MAX_HITS => {
                return bad(format!(
                    "{at}: hits_addend {} is more than any limit can hold ({MAX_HITS})",
                    h
                ));
            }
            // 0: check only.
            Some(h) => *h,
        };
        let limit = match &d.limit {
            None => None,
            Some(l) => match Unit::from_proto(l.unit) {
                Some(unit) => Some(Quota {
                    requests_per_unit: l.requests_per_unit,
                    unit,
                    algorithm: Algorithm::FixedWindow,
                }),
                None => {
                    return bad(format!(
                        "{at}: limit.unit {} is not a known unit (SECOND=1 .. YEAR=6, WEEK=7)",
                        l.unit
                    ));
                }
            },
        };
        out.push(Wanted {
            entries,
            cost,
            limit,
        });
    }
    Ok(out)
}

fn current_limit(quota: &Quota, name: Option<&str>) -> rate_limit_response::RateLimit {
    rate_limit_response::RateLimit {
        name: name.unwrap_or_default().to_owned(),
        requests_per_unit: quota.requests_per_unit,
        unit: quota.unit.proto(),
    }
}

/// An OK status without a limit (not limited, unlimited, replaced).
fn ok_status(remaining: u32) -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok as i32,
        current_limit: None,
        limit_remaining: remaining,
        duration_until_reset: None,
    }
}

fn duration(n: Nanos) -> prost_types::Duration {
    prost_types::Duration {
        seconds: (n / SECOND) as i64,
        nanos: (n % SECOND) as i32,
    }
}

/// The limit, remaining and reset headers of the descriptor closest to its limit (an
/// over-limit one first), as envoyproxy/ratelimit adds them.
fn headers(names: &[String; 3], statuses: &[DescriptorStatus]) -> Vec<HeaderValue> {
    let Some(s) = statuses
        .iter()
        .filter(|s| s.current_limit.is_some())
        .min_by_key(|s| (s.code != Code::OverLimit as i32, s.limit_remaining))
    else {
        return Vec::new();
    };
    let limit = s.current_limit.as_ref().expect("filtered");
    let window = Unit::from_proto(limit.unit).map_or(0, |u| u.period() / SECOND);
    let reset = s
        .duration_until_reset
        .as_ref()
        .map_or(0, |d| d.seconds + i64::from(d.nanos > 0));
    let header = |key: &str, value: String| HeaderValue {
        key: key.to_owned(),
        value,
        raw_value: Vec::new(),
    };
    vec![
        header(
            &names[0],
            format!(
                "{}, {};w={window}",
                limit.requests_per_unit, limit.requests_per_unit
            ),
        ),
        header(&names[1], s.limit_remaining.to_string()),
        header(&names[2], reset.to_string()),
    ]
}

impl View {
    fn new(settings: &RlsSettings) -> View {
        View {
            table: Table::new(&settings.domains),
            shadow_mode: settings.shadow_mode,
            response_headers: settings.response_headers,
            header_names: settings.header_names.clone(),
        }
    }
}

/// The engine of request `limit` overrides that no configured limit matches: node-local
/// fixed windows, one rule per distinct limit, added as requests bring them.
#[derive(Debug)]
struct Dynamic {
    engine: ArcSwap<Engine>,
    adding: Mutex<()>,
}

impl Dynamic {
    fn new(clock: Arc<dyn Clock>, max_keys: usize) -> Dynamic {
        Dynamic {
            engine: ArcSwap::from_pointee(Engine::new(Vec::new(), max_keys, clock)),
            adding: Mutex::new(()),
        }
    }

    /// The engine, with a rule for each of `quotas`.
    fn with(&self, quotas: &[Quota]) -> Result<Arc<Engine>, Refused> {
        let current = self.engine.load_full();
        let missing = |e: &Engine| {
            quotas
                .iter()
                .filter(|q| q.rule_name().is_some_and(|n| e.rule(&n).is_err()))
                .count()
        };
        if missing(&current) == 0 {
            return Ok(current);
        }
        let _one = self.adding.lock().unwrap_or_else(|p| p.into_inner());
        let current = self.engine.load_full();
        if missing(&current) == 0 {
            return Ok(current);
        }
        let mut rules: Vec<Rule> = current.rules().map(|r| r.rule.clone()).collect();
        for q in quotas {
            let Some(name) = q.rule_name() else { continue };
            if rules.iter().any(|r| r.name == name) {
                continue;
            }
            if rules.len() >= MAX_DYNAMIC_LIMITS {
                return Err(Refused::Unavailable(format!(
                    "this node already counts {MAX_DYNAMIC_LIMITS} distinct limit overrides"
                )));
            }
            let limit = q
                .limit()
                .map_err(|e| Refused::Invalid(format!("limit override: {e}")))?;
            rules.push(Rule {
                name,
                limits: vec![limit],
                scope: Scope::Local,
                max_wait: 0,
            });
        }
        let (next, _) = current
            .reload(rules)
            .expect("a local engine reloads any rules");
        let next = Arc::new(next);
        self.engine.store(next.clone());
        Ok(next)
    }
}

/// Request codes, as [`RlsMetrics`] counts them.
const CODES: [&str; 3] = ["ok", "over_limit", "shadow_over_limit"];
/// Descriptor results, as [`RlsMetrics`] counts them (each with shadow false, then true).
const RESULTS: [&str; 4] = ["within_limit", "over_limit", "unlimited", "replaced"];

/// The RLS's counters. Series are created on first use (up to [`MAX_SERIES`] of each kind)
/// and looked up by reference after, so counting allocates nothing for a known series.
#[derive(Debug, Default)]
pub struct RlsMetrics {
    /// domain -> requests by [`CODES`].
    requests: Mutex<HashMap<String, [u64; 3]>>,
    /// domain -> descriptor label -> descriptors by [`RESULTS`] x shadow.
    descriptors: Mutex<HashMap<String, HashMap<String, [u64; 8]>>>,
    /// Descriptor series held (for the bound).
    series: AtomicU64,
    /// Requests refused as malformed (INVALID_ARGUMENT).
    pub invalid: AtomicU64,
    /// Requests refused because the node could not decide (UNAVAILABLE).
    pub unavailable: AtomicU64,
    /// Counts not kept past [`MAX_SERIES`].
    pub dropped: AtomicU64,
}

impl RlsMetrics {
    fn count(
        &self,
        domain: &str,
        overall: Code,
        shadowed: bool,
        descriptors: &[(String, &'static str, bool)],
    ) {
        let code = match (overall, shadowed) {
            (Code::OverLimit, _) => 1,
            (_, true) => 2,
            _ => 0,
        };
        {
            let mut requests = self.requests.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(n) = requests.get_mut(domain) {
                n[code] += 1;
            } else if requests.len() < MAX_SERIES {
                let mut n = [0; 3];
                n[code] = 1;
                requests.insert(domain.to_owned(), n);
            } else {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
        if descriptors.is_empty() {
            return;
        }
        let mut map = self.descriptors.lock().unwrap_or_else(|p| p.into_inner());
        for (label, result, shadow) in descriptors {
            let i =
                RESULTS.iter().position(|r| r == result).unwrap_or(0) * 2 + usize::from(*shadow);
            if let Some(n) = map.get_mut(domain).and_then(|m| m.get_mut(label.as_str())) {
                n[i] += 1;
                continue;
            }
            if self.series.load(Ordering::Relaxed) >= MAX_SERIES as u64 {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            self.series.fetch_add(1, Ordering::Relaxed);
            let mut n = [0; 8];
            n[i] = 1;
            map.entry(domain.to_owned())
                .or_default()
                .insert(label.clone(), n);
        }
    }

    /// Appends the counters in Prometheus text format.
    pub fn render(&self, out: &mut String) {
        use std::fmt::Write;
        let esc = |s: &str| {
            s.replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n")
        };
        out.push_str("# HELP gossamer_rls_requests_total RLS requests answered, by domain and code (shadow_over_limit: OVER_LIMIT answered OK in shadow mode).\n# TYPE gossamer_rls_requests_total counter\n");
        let mut requests: Vec<(String, [u64; 3])> = self
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        requests.sort();
        for (domain, counts) in requests {
            for (code, n) in CODES.iter().zip(counts) {
                if n > 0 {
                    let _ = writeln!(
                        out,
                        "gossamer_rls_requests_total{{domain=\"{}\",code=\"{code}\"}} {n}",
                        esc(&domain)
                    );
                }
            }
        }
        out.push_str("# HELP gossamer_rls_descriptors_total RLS descriptors decided, by domain, descriptor (envoyproxy/ratelimit's stat key), result and shadow mode.\n# TYPE gossamer_rls_descriptors_total counter\n");
        let mut rows: Vec<(String, String, [u64; 8])> = Vec::new();
        for (domain, labels) in self
            .descriptors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            for (label, counts) in labels {
                rows.push((domain.clone(), label.clone(), *counts));
            }
        }
        rows.sort();
        for (domain, label, counts) in rows {
            for (i, n) in counts.iter().enumerate() {
                if *n > 0 {
                    let _ = writeln!(
                        out,
                        "gossamer_rls_descriptors_total{{domain=\"{}\",descriptor=\"{}\",result=\"{}\",shadow=\"{}\"}} {n}",
                        esc(&domain),
                        esc(&label),
                        RESULTS[i / 2],
                        i % 2 == 1
                    );
                }
            }
        }
        let _ = writeln!(
            out,
            "# HELP gossamer_rls_errors_total RLS requests refused, by gRPC status.\n# TYPE gossamer_rls_errors_total counter\ngossamer_rls_errors_total{{status=\"invalid_argument\"}} {}\ngossamer_rls_errors_total{{status=\"unavailable\"}} {}",
            self.invalid.load(Ordering::Relaxed),
            self.unavailable.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP gossamer_rls_metric_series_dropped_total RLS counts not kept: the series limit ({MAX_SERIES}) was reached.\n# TYPE gossamer_rls_metric_series_dropped_total counter\ngossamer_rls_metric_series_dropped_total {}",
            self.dropped.load(Ordering::Relaxed)
        );
    }
}
