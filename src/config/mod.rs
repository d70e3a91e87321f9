//! Configuration: a TOML file, overridden by environment variables and flags, validated into
//! one [`Config`] before anything starts.
//!
//! Errors name the file, the rule and the field ([`ConfigError`]); the binary exits with
//! code 2 on any of them. Defaults are the `DEFAULT_*` constants.

mod duration;

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use toml::{Table, Value};

use crate::cluster::global::OnPartition;
use crate::limiter::{Algorithm, Limit, Nanos};
use crate::rls::RlsSettings;
use crate::rls::config::RlsConfigError;

pub use duration::{format_duration, parse_duration};

/// Where the HTTP API listens by default.
pub const DEFAULT_HTTP: &str = "127.0.0.1:7070";
/// The most keys held across all rules.
pub const DEFAULT_MAX_KEYS: usize = 1_000_000;
/// The most HTTP connections served at once; further connections wait in the backlog.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4_096;
/// How long a client may take to send a request's headers and body.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a stopping node waits for in-flight checks.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// How often fresh keys are evicted.
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(1);
/// How long a reservation waits for its settle before it expires, keeping its estimate.
pub const DEFAULT_RESERVATION_TIMEOUT: Duration =
    Duration::from_nanos(crate::reserve::DEFAULT_RESERVATION_TIMEOUT);
/// The most reservations open at once.
pub const DEFAULT_MAX_RESERVATIONS: usize = crate::reserve::DEFAULT_MAX_RESERVATIONS;
/// The scheduler slice the threads answering checks ask for (`[server] check_slice`).
pub const DEFAULT_CHECK_SLICE: Duration = Duration::from_micros(100);
/// The range of slices Linux accepts (it clamps others into it).
pub const CHECK_SLICES: std::ops::RangeInclusive<Duration> =
    Duration::from_micros(100)..=Duration::from_millis(100);
/// The cluster name nodes must share.
pub const DEFAULT_CLUSTER_ID: &str = "gossamer";
/// How often nodes gossip and exchange counts (the round length T of docs/design.md).
pub const DEFAULT_GOSSIP_INTERVAL: Duration = Duration::from_millis(100);
/// The failure detector's phi threshold (chitchat's phi accrual).
pub const DEFAULT_PHI_THRESHOLD: f64 = 8.0;
/// How long a dead member is remembered (and, under `on_partition = "hold"`, keeps its share).
pub const DEFAULT_DEAD_NODE_GRACE: Duration = Duration::from_secs(3600);
/// How long a starting node waits to pull the cluster's counts before `/readyz` says 200.
pub const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(5);
/// How much lower than the checks' the round work's CPU priority is (a nice increment). 0:
/// the same. A raised value starves the rounds on a saturated CPU (they degrade, and a key new
/// at a node is then refused until a round completes: docs/operations.md, "CPU priority"),
/// while the checks' short scheduler slice already lets a waiting check go first.
pub const DEFAULT_ROUND_NICE: i32 = 0;
/// The rules served when no config file is given.
pub const BUILTIN_RULES: &str = include_str!("builtin.toml");

/// How a cluster exchanges counts for its global rules (`[cluster] exchange`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExchangeMode {
    /// Every node sends its round frame to every other: any algorithm, `on_partition`
    /// `hold` or `split`; traffic per node grows with the cluster (design.md §11).
    #[default]
    Mesh,
    /// Sums up and totals down an aggregation tree: fixed windows of one limit only,
    /// partitions split; traffic per node does not grow with the cluster (design.md §11.1).
    Tree,
}

impl ExchangeMode {
    /// The config name.
    pub fn name(self) -> &'static str {
        match self {
            ExchangeMode::Mesh => "mesh",
            ExchangeMode::Tree => "tree",
        }
    }
}

/// The longest global window `exchange = "tree"` runs. A member leaving the tree's view (a
/// crash, a restart, a partition) freezes every open window until it ends, since the totals
/// lose that member's charge (design.md §11.1): a longer window would stop granting for the
/// rest of its period (a day-long quota for the rest of the day) after one pod restart.
pub const MAX_TREE_PERIOD: Duration = Duration::from_secs(60);

/// The CPU priority of the cluster's threads, below the checks' (`[cluster] round_nice`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoundNice {
    /// Raise the nice value by this much (0 to 19; 0: as the checks).
    Nice(i32),
    /// `SCHED_IDLE`: run only when no check wants the CPU.
    Idle,
}

impl std::fmt::Display for RoundNice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RoundNice::Nice(n) => write!(f, "{n}"),
            RoundNice::Idle => f.write_str("idle"),
        }
    }
}

/// A validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The node and its HTTP server.
    pub server: ServerConfig,
    /// Cluster settings (accepted now; used once nodes form a cluster).
    pub cluster: ClusterConfig,
    /// The rules, in file order; names are unique. With an RLS config, its rules
    /// (`rls.*`, see [`crate::rls::config::rules`]) follow the TOML file's.
    pub rules: Vec<Rule>,
    /// Envoy's rate limit service: `[rls]`, `--rls-config`, and the domains read.
    pub rls: RlsSettings,
}

/// The node and its HTTP server.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// Where the HTTP API listens.
    pub http: SocketAddr,
    /// This node's name in the cluster (default: the host name).
    pub node_id: String,
    /// The most keys held across all rules; see [`crate::store`] for what happens at the bound.
    pub max_keys: usize,
    /// The most HTTP connections served at once.
    pub max_connections: usize,
    /// How long a client may take to send a request.
    pub request_timeout: Duration,
    /// How long a stopping node waits for in-flight checks.
    pub shutdown_grace: Duration,
    /// How often fresh keys are evicted.
    pub sweep_interval: Duration,
    /// The scheduler slice the threads answering checks ask the kernel for, so that a check
    /// preempts a thread with a longer one at once (Linux 6.12+); zero: the kernel's default.
    /// Read at start only.
    pub check_slice: Duration,
    /// Where Envoy's rate limit service (gRPC) listens; off when `None` (`[server] grpc`,
    /// `--grpc`).
    pub grpc: Option<SocketAddr>,
    /// How long a reservation (`POST /v1/reserve`) waits for its settle; unsettled, it
    /// expires and keeps its estimate.
    pub reservation_timeout: Duration,
    /// The most reservations open at once; beyond it a reserve is answered like a new key
    /// at `max_keys` (429, `store_full`) and charges nothing.
    pub max_reservations: usize,
}

/// Cluster settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterConfig {
    /// The gossip (UDP) listen address.
    pub gossip: Option<SocketAddr>,
    /// The address other nodes reach this node's gossip at (`host:port`).
    pub advertise: Option<String>,
    /// Seed nodes (`host:port`, DNS names allowed).
    pub seeds: Vec<String>,
    /// Nodes with another cluster id ignore each other.
    pub cluster_id: String,
    /// Round length: gossip, count exchange and lease computation happen once per interval.
    pub gossip_interval: Duration,
    /// Where counts are exchanged over QUIC (default: the gossip address, port + 1).
    pub quic: Option<SocketAddr>,
    /// How counts are exchanged.
    pub exchange: ExchangeMode,
    /// What a partition does to global limits.
    pub on_partition: OnPartition,
    /// The failure detector's phi threshold.
    pub phi_threshold: f64,
    /// How long a dead member is remembered.
    pub dead_node_grace: Duration,
    /// How long `/readyz` waits for the pull of the cluster's counts at start.
    pub ready_timeout: Duration,
    /// How much the cluster's threads (its own runtime: gossip, QUIC, rounds) lower their
    /// CPU priority: on a core checks and the cluster share, checks go first.
    pub round_nice: RoundNice,
    /// Mutual TLS between peers; `None`: ephemeral self-signed certificates, unauthenticated.
    pub tls: Option<TlsFiles>,
}

impl Default for ClusterConfig {
    fn default() -> ClusterConfig {
        ClusterConfig {
            gossip: None,
            advertise: None,
            seeds: Vec::new(),
            cluster_id: DEFAULT_CLUSTER_ID.to_owned(),
            gossip_interval: DEFAULT_GOSSIP_INTERVAL,
            quic: None,
            exchange: ExchangeMode::Mesh,
            on_partition: OnPartition::Hold,
            phi_threshold: DEFAULT_PHI_THRESHOLD,
            dead_node_grace: DEFAULT_DEAD_NODE_GRACE,
            ready_timeout: DEFAULT_READY_TIMEOUT,
            round_nice: RoundNice::Nice(DEFAULT_ROUND_NICE),
            tls: None,
        }
    }
}

impl ClusterConfig {
    /// The QUIC address: `quic`, or the gossip address with the port + 1.
    pub fn quic_addr(&self) -> Option<SocketAddr> {
        self.quic.or_else(|| {
            self.gossip
                .map(|g| SocketAddr::new(g.ip(), g.port().wrapping_add(1)))
        })
    }
}

/// `[cluster.tls]`: PEM files for mutual TLS between peers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The cluster CA certificate every peer's certificate must chain to.
    pub ca: PathBuf,
    /// This node's certificate (naming its node id).
    pub cert: PathBuf,
    /// This node's private key.
    pub key: PathBuf,
}

/// Whether a rule's counts are this node's own or the cluster's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Each node enforces the limit on its own.
    Local,
    /// The limit holds across the cluster. On a single node this is the same as `Local`.
    Global,
}

/// A named rule: one or more limits checked together.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// The name clients pass as `rule`.
    pub name: String,
    /// At least one limit. A check must pass all of them.
    pub limits: Vec<Limit>,
    /// Local or cluster-wide counting.
    pub scope: Scope,
    /// The longest a caller may be held by a shaping leaky bucket (0: never held).
    pub max_wait: Nanos,
}

/// Values from flags and environment variables, which override the file.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--http`, `GOSSAMER_HTTP`.
    pub http: Option<SocketAddr>,
    /// `--node-id`, `GOSSAMER_NODE_ID`.
    pub node_id: Option<String>,
    /// `--gossip`, `GOSSAMER_GOSSIP`.
    pub gossip: Option<SocketAddr>,
    /// `--advertise`, `GOSSAMER_ADVERTISE`.
    pub advertise: Option<String>,
    /// `--seeds`, `GOSSAMER_SEEDS`.
    pub seeds: Option<Vec<String>>,
    /// `--cluster-id`, `GOSSAMER_CLUSTER_ID`.
    pub cluster_id: Option<String>,
    /// `--grpc`, `GOSSAMER_GRPC`.
    pub grpc: Option<SocketAddr>,
    /// `--rls-config`, `GOSSAMER_RLS_CONFIG`: envoyproxy/ratelimit YAML, a file or directory.
    pub rls_config: Option<PathBuf>,
}

/// A configuration that cannot be used. Its `Display` names the file, the rule and the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{file}: cannot read: {message}")]
    Read {
        /// The file.
        file: String,
        /// Why.
        message: String,
    },
    /// The file is not valid TOML.
    #[error("{file}: not valid TOML: {message}")]
    Syntax {
        /// The file.
        file: String,
        /// The parser's message, with line and column.
        message: String,
    },
    /// The RLS's YAML config (envoyproxy/ratelimit's format) cannot be used.
    #[error(transparent)]
    Rls(#[from] RlsConfigError),
    /// A value is missing, of the wrong type, or out of range.
    #[error("{file}: {place}: {message}")]
    Invalid {
        /// The file.
        file: String,
        /// Where: `rule "api", field "limit"`, or `[server], field "http"`.
        place: Place,
        /// What is wrong and what is expected.
        message: String,
    },
}

/// Where in a config a problem is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    /// The rule's name, or its position when it has none.
    pub rule: Option<String>,
    /// The table, for fields outside rules (`server`, `cluster`).
    pub table: Option<&'static str>,
    /// The field.
    pub field: String,
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.rule, self.table) {
            (Some(rule), _) => write!(f, "rule {rule}, field \"{}\"", self.field),
            (None, Some(table)) => write!(f, "[{table}], field \"{}\"", self.field),
            (None, None) => write!(f, "field \"{}\"", self.field),
        }
    }
}

impl Config {
    /// Reads `path` (or the built-in rules when `None`), applies `overrides`, and validates.
    ///
    /// With an RLS config (`[rls] config` or `--rls-config`) the YAML is read too and its
    /// rules are added; the TOML file may then hold no rules, and without a TOML file the
    /// built-in rules are not served.
    pub fn load(path: Option<&Path>, overrides: &Overrides) -> Result<Config, ConfigError> {
        let (name, text) = match path {
            Some(path) => {
                let name = path.display().to_string();
                let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
                    file: name.clone(),
                    message: e.to_string(),
                })?;
                (name, text)
            }
            None if overrides.rls_config.is_some() => ("<flags>".to_owned(), String::new()),
            None => ("<built-in rules>".to_owned(), BUILTIN_RULES.to_owned()),
        };
        let rls_given = overrides.rls_config.is_some();
        let mut config = Parser {
            file: &name,
            rls_given,
        }
        .config(&Config::table(&text, &name)?)?;
        config.apply(overrides);
        config.load_rls(&name)?;
        config.check_cluster(&name)?;
        Ok(config)
    }

    /// Reads the RLS's YAML (if configured), checks its limits against the cluster's
    /// constraints (naming the YAML file, domain and descriptor), and adds its rules.
    fn load_rls(&mut self, file: &str) -> Result<(), ConfigError> {
        let Some(path) = self.rls.config.clone() else {
            return Ok(());
        };
        let domains = crate::rls::config::load(&path)?;
        if self.cluster.gossip.is_some() {
            let round = self.cluster.gossip_interval.as_nanos();
            let tree = self.cluster.exchange == ExchangeMode::Tree;
            for (quota, yaml, domain, at) in crate::rls::config::quotas(&domains) {
                let period = u128::from(quota.unit.period());
                let refuse = |field: &str, message: String| {
                    crate::rls::config::quota_error(&yaml, &domain, &at, field, message)
                };
                if tree && quota.algorithm != Algorithm::FixedWindow {
                    return Err(refuse("rate_limit.algorithm", "exchange = \"tree\" counts fixed_window limits only (use exchange = \"mesh\")".into()).into());
                }
                if tree && period > MAX_TREE_PERIOD.as_nanos() {
                    return Err(refuse("rate_limit.unit", format!("exchange = \"tree\" counts windows of at most {} (a second or a minute; use exchange = \"mesh\" for longer units)", format_duration(MAX_TREE_PERIOD.as_nanos() as Nanos))).into());
                }
                if !quota.algorithm.has_burst() && period % round != 0 {
                    return Err(refuse("rate_limit.unit", format!("a global window counts in whole gossip rounds: the unit must be a multiple of gossip_interval ({})", format_duration(round as Nanos))).into());
                }
            }
        }
        let rules = crate::rls::config::rules(&domains);
        for rule in &rules {
            if self.rules.iter().any(|r| r.name == rule.name) {
                return Err(ConfigError::Invalid {
                    file: file.to_owned(),
                    place: Place {
                        rule: Some(quoted(&rule.name)),
                        table: None,
                        field: "name".to_owned(),
                    },
                    message: "names beginning with \"rls.\" belong to the RLS config's limits"
                        .into(),
                });
            }
        }
        self.rules.extend(rules);
        self.rls.domains = domains;
        if self.rules.is_empty() {
            return Err(ConfigError::Invalid {
                file: file.to_owned(),
                place: Place {
                    rule: None,
                    table: None,
                    field: "rule".to_owned(),
                },
                message: "no rules: the TOML file has no [[rule]] and the RLS config no limit"
                    .into(),
            });
        }
        Ok(())
    }

    fn table(text: &str, file: &str) -> Result<Table, ConfigError> {
        text.parse()
            .map_err(|e: toml::de::Error| ConfigError::Syntax {
                file: file.to_owned(),
                message: e.to_string().trim().replace('\n', " "),
            })
    }

    /// With clustering on, every windowed global limit must count in slots that start on
    /// round boundaries: its period must be a multiple of `gossip_interval`.
    pub fn check_cluster(&self, file: &str) -> Result<(), ConfigError> {
        if self.cluster.gossip.is_none() {
            return Ok(());
        }
        let round = self.cluster.gossip_interval.as_nanos();
        let tree = self.cluster.exchange == ExchangeMode::Tree;
        for rule in self.rules.iter().filter(|r| r.scope == Scope::Global) {
            let refuse = |field: &str, message: String| ConfigError::Invalid {
                file: file.to_owned(),
                place: Place {
                    rule: Some(quoted(&rule.name)),
                    table: None,
                    field: field.to_owned(),
                },
                message,
            };
            let unsupported =
                rule.limits.len() != 1 || rule.limits[0].algorithm() != Algorithm::FixedWindow;
            if tree && unsupported {
                let field = if rule.limits.len() != 1 {
                    "limits"
                } else {
                    "algorithm"
                };
                return Err(refuse(
                    field,
                    "exchange = \"tree\" runs global rules of one fixed_window limit only (make the rule scope = \"local\", or use exchange = \"mesh\")".to_owned(),
                ));
            }
            if tree && u128::from(rule.limits[0].period()) > MAX_TREE_PERIOD.as_nanos() {
                return Err(refuse(
                    "period",
                    format!(
                        "exchange = \"tree\" runs global windows of at most {}: after a member leaves the view (a crash, a restart) the open window grants nothing more until it ends (make the rule scope = \"local\", or use exchange = \"mesh\")",
                        format_duration(MAX_TREE_PERIOD.as_nanos() as Nanos)
                    ),
                ));
            }
            for limit in &rule.limits {
                if !limit.algorithm().has_burst() && u128::from(limit.period()) % round != 0 {
                    return Err(refuse(
                        "period",
                        format!(
                            "a global {} counts in slots of whole gossip rounds: its period must be a multiple of gossip_interval ({})",
                            limit.algorithm(),
                            format_duration(round as Nanos)
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Parses and validates config text; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<Config, ConfigError> {
        let table = Config::table(text, file)?;
        Parser {
            file,
            rls_given: false,
        }
        .config(&table)
    }

    fn apply(&mut self, o: &Overrides) {
        if let Some(http) = o.http {
            self.server.http = http;
        }
        if let Some(id) = &o.node_id {
            self.server.node_id.clone_from(id);
        }
        if let Some(gossip) = o.gossip {
            self.cluster.gossip = Some(gossip);
        }
        if let Some(advertise) = &o.advertise {
            self.cluster.advertise = Some(advertise.clone());
        }
        if let Some(seeds) = &o.seeds {
            self.cluster.seeds.clone_from(seeds);
        }
        if let Some(id) = &o.cluster_id {
            self.cluster.cluster_id.clone_from(id);
        }
        if let Some(grpc) = o.grpc {
            self.server.grpc = Some(grpc);
        }
        if let Some(path) = &o.rls_config {
            self.rls.config = Some(path.clone());
        }
    }
}

/// The host name, or "gossamer" if it cannot be read.
pub fn default_node_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "gossamer".to_owned())
}

/// Walks a parsed TOML table, producing errors that name `file`.
struct Parser<'a> {
    file: &'a str,
    /// An RLS config comes from a flag: the file may hold no rules.
    rls_given: bool,
}

/// Fields of one table, taken one by one so that leftovers can be reported as unknown.
struct Fields<'t> {
    table: &'t Table,
    taken: Vec<&'static str>,
}

impl<'t> Fields<'t> {
    fn new(table: &'t Table) -> Fields<'t> {
        Fields {
            table,
            taken: Vec::new(),
        }
    }

    fn get(&mut self, field: &'static str) -> Option<&'t Value> {
        self.taken.push(field);
        self.table.get(field)
    }

    fn unknown(&self) -> Option<&'t str> {
        self.table
            .keys()
            .find(|k| !self.taken.contains(&k.as_str()))
            .map(String::as_str)
    }
}

impl Parser<'_> {
    /// A path from the config file: relative paths are relative to the file's directory.
    fn relative(&self, s: &str) -> PathBuf {
        let path = Path::new(s);
        match Path::new(self.file).parent() {
            Some(dir) if path.is_relative() && Path::new(self.file).is_file() => dir.join(path),
            _ => path.to_owned(),
        }
    }

    fn err(
        &self,
        rule: Option<&str>,
        table: Option<&'static str>,
        field: &str,
        message: impl Into<String>,
    ) -> ConfigError {
        ConfigError::Invalid {
            file: self.file.to_owned(),
            place: Place {
                rule: rule.map(str::to_owned),
                table,
                field: field.to_owned(),
            },
            message: message.into(),
        }
    }

    fn config(&self, root: &Table) -> Result<Config, ConfigError> {
        let mut top = Fields::new(root);
        let server = match top.get("server") {
            None => self.server(&Table::new())?,
            Some(Value::Table(t)) => self.server(t)?,
            Some(_) => return Err(self.err(None, None, "server", "must be a table ([server])")),
        };
        let cluster = match top.get("cluster") {
            None => self.cluster(&Table::new())?,
            Some(Value::Table(t)) => self.cluster(t)?,
            Some(_) => return Err(self.err(None, None, "cluster", "must be a table ([cluster])")),
        };
        let rls = match top.get("rls") {
            None => RlsSettings::default(),
            Some(Value::Table(t)) => self.rls(t)?,
            Some(_) => return Err(self.err(None, None, "rls", "must be a table ([rls])")),
        };
        let rules = match top.get("rule") {
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, item)| match item {
                    Value::Table(t) => self.rule(i, t),
                    _ => Err(self.err(None, None, "rule", "each rule must be a table ([[rule]])")),
                })
                .collect::<Result<Vec<_>, _>>()?,
            Some(_) => {
                return Err(self.err(None, None, "rule", "rules are written as [[rule]] tables"));
            }
            None => Vec::new(),
        };
        if let Some(field) = top.unknown() {
            return Err(self.err(
                None,
                None,
                field,
                "unknown top-level field (expected [server], [cluster], [rls] or [[rule]])",
            ));
        }
        if rules.is_empty() && !self.rls_given && rls.config.is_none() {
            return Err(self.err(None, None, "rule", "at least one [[rule]] is required"));
        }
        for (i, rule) in rules.iter().enumerate() {
            if rules[..i].iter().any(|r| r.name == rule.name) {
                return Err(self.err(Some(&quoted(&rule.name)), None, "name", "defined twice"));
            }
        }
        Ok(Config {
            server,
            cluster,
            rules,
            rls,
        })
    }

    fn rls(&self, t: &Table) -> Result<RlsSettings, ConfigError> {
        let mut f = Fields::new(t);
        let err = |field: &str, m: String| self.err(None, Some("rls"), field, m);
        let config = match f.get("config") {
            None => None,
            Some(Value::String(s)) if !s.is_empty() => Some(self.relative(s)),
            Some(_) => {
                return Err(err(
                    "config",
                    "must be the path of a YAML file or a directory of them".into(),
                ));
            }
        };
        let mut rls = RlsSettings {
            config,
            ..RlsSettings::default()
        };
        for (field, flag) in [
            ("shadow_mode", &mut rls.shadow_mode),
            ("response_headers", &mut rls.response_headers),
        ] {
            match f.get(field) {
                None => {}
                Some(Value::Boolean(b)) => *flag = *b,
                Some(_) => return Err(err(field, "must be true or false".into())),
            }
        }
        for (i, field) in ["header_limit", "header_remaining", "header_reset"]
            .into_iter()
            .enumerate()
        {
            match f.get(field) {
                None => {}
                Some(Value::String(s))
                    if axum::http::HeaderName::from_bytes(s.as_bytes()).is_ok() =>
                {
                    rls.header_names[i] = s.clone();
                }
                Some(_) => {
                    return Err(err(
                        field,
                        "must be a header name such as \"X-RateLimit-Limit\"".into(),
                    ));
                }
            }
        }
        if let Some(v) = f.get("max_concurrent") {
            rls.max_concurrent = count(Some(v), 0).map_err(|m| err("max_concurrent", m))?;
        }
        if let Some(field) = f.unknown() {
            return Err(err(field, "unknown field".into()));
        }
        Ok(rls)
    }

    fn server(&self, t: &Table) -> Result<ServerConfig, ConfigError> {
        let mut f = Fields::new(t);
        let err = |field: &str, m: String| self.err(None, Some("server"), field, m);
        let http = match f.get("http") {
            None => DEFAULT_HTTP.parse().expect("default address parses"),
            Some(v) => socket_addr(v).map_err(|m| err("http", m))?,
        };
        let node_id = match f.get("node_id") {
            None => default_node_id(),
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            Some(_) => return Err(err("node_id", "must be a non-empty string".into())),
        };
        let max_keys =
            count(f.get("max_keys"), DEFAULT_MAX_KEYS).map_err(|m| err("max_keys", m))?;
        let max_connections = count(f.get("max_connections"), DEFAULT_MAX_CONNECTIONS)
            .map_err(|m| err("max_connections", m))?;
        let request_timeout = positive_duration(f.get("request_timeout"), DEFAULT_REQUEST_TIMEOUT)
            .map_err(|m| err("request_timeout", m))?;
        let shutdown_grace = positive_duration(f.get("shutdown_grace"), DEFAULT_SHUTDOWN_GRACE)
            .map_err(|m| err("shutdown_grace", m))?;
        let sweep_interval = positive_duration(f.get("sweep_interval"), DEFAULT_SWEEP_INTERVAL)
            .map_err(|m| err("sweep_interval", m))?;
        let check_slice = check_slice(f.get("check_slice")).map_err(|m| err("check_slice", m))?;
        let grpc = match f.get("grpc") {
            None => None,
            Some(v) => Some(socket_addr(v).map_err(|m| err("grpc", m))?),
        };
        let reservation_timeout =
            positive_duration(f.get("reservation_timeout"), DEFAULT_RESERVATION_TIMEOUT)
                .map_err(|m| err("reservation_timeout", m))?;
        let max_reservations = count(f.get("max_reservations"), DEFAULT_MAX_RESERVATIONS)
            .map_err(|m| err("max_reservations", m))?;
        if let Some(field) = f.unknown() {
            return Err(err(field, "unknown field".into()));
        }
        Ok(ServerConfig {
            http,
            node_id,
            max_keys,
            max_connections,
            request_timeout,
            shutdown_grace,
            sweep_interval,
            check_slice,
            grpc,
            reservation_timeout,
            max_reservations,
        })
    }

    fn cluster(&self, t: &Table) -> Result<ClusterConfig, ConfigError> {
        let mut f = Fields::new(t);
        let err = |field: &str, m: String| self.err(None, Some("cluster"), field, m);
        let gossip = match f.get("gossip") {
            None => None,
            Some(v) => Some(socket_addr(v).map_err(|m| err("gossip", m))?),
        };
        let advertise = match f.get("advertise") {
            None => None,
            Some(Value::String(s)) => Some(host_port(s).map_err(|m| err("advertise", m))?),
            Some(_) => return Err(err("advertise", "must be a \"host:port\" string".into())),
        };
        let seeds = match f.get("seeds") {
            None => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| match v {
                    Value::String(s) => host_port(s),
                    _ => Err("must be a list of \"host:port\" strings".to_owned()),
                })
                .collect::<Result<_, _>>()
                .map_err(|m| err("seeds", m))?,
            Some(_) => {
                return Err(err(
                    "seeds",
                    "must be a list of \"host:port\" strings".into(),
                ));
            }
        };
        let cluster_id = match f.get("cluster_id") {
            None => DEFAULT_CLUSTER_ID.to_owned(),
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            Some(_) => return Err(err("cluster_id", "must be a non-empty string".into())),
        };
        let gossip_interval = positive_duration(f.get("gossip_interval"), DEFAULT_GOSSIP_INTERVAL)
            .map_err(|m| err("gossip_interval", m))?;
        if gossip_interval < Duration::from_millis(10)
            || gossip_interval.subsec_nanos() % 1_000_000 != 0
        {
            return Err(err(
                "gossip_interval",
                "must be a whole number of milliseconds, at least 10ms".into(),
            ));
        }
        let quic = match f.get("quic") {
            None => None,
            Some(v) => Some(socket_addr(v).map_err(|m| err("quic", m))?),
        };
        let exchange = match f.get("exchange") {
            None => ExchangeMode::Mesh,
            Some(Value::String(s)) if s == "mesh" => ExchangeMode::Mesh,
            Some(Value::String(s)) if s == "tree" => ExchangeMode::Tree,
            Some(_) => return Err(err("exchange", "must be \"mesh\" or \"tree\"".into())),
        };
        let on_partition = match (f.get("on_partition"), exchange) {
            // The tree has no `hold`: each side of a partition allots the whole limit.
            (None, ExchangeMode::Tree) => OnPartition::Split,
            (None, ExchangeMode::Mesh) => OnPartition::Hold,
            (Some(Value::String(s)), ExchangeMode::Tree) if s == "hold" => {
                return Err(err(
                    "on_partition",
                    "exchange = \"tree\" has no \"hold\": each side of a partition allots the whole limit (set \"split\", or use exchange = \"mesh\")".into(),
                ));
            }
            (Some(Value::String(s)), _) if s == "hold" => OnPartition::Hold,
            (Some(Value::String(s)), _) if s == "split" => OnPartition::Split,
            (Some(_), _) => {
                return Err(err("on_partition", "must be \"hold\" or \"split\"".into()));
            }
        };
        let phi_threshold = match f.get("phi_threshold") {
            None => DEFAULT_PHI_THRESHOLD,
            Some(Value::Float(x)) if *x > 0.0 && x.is_finite() => *x,
            Some(Value::Integer(x)) if *x > 0 => *x as f64,
            Some(_) => return Err(err("phi_threshold", "must be a positive number".into())),
        };
        let dead_node_grace = positive_duration(f.get("dead_node_grace"), DEFAULT_DEAD_NODE_GRACE)
            .map_err(|m| err("dead_node_grace", m))?;
        let ready_timeout = positive_duration(f.get("ready_timeout"), DEFAULT_READY_TIMEOUT)
            .map_err(|m| err("ready_timeout", m))?;
        let round_nice = match f.get("round_nice") {
            None => RoundNice::Nice(DEFAULT_ROUND_NICE),
            Some(Value::Integer(x)) if (0..=19).contains(x) => RoundNice::Nice(*x as i32),
            Some(Value::String(s)) if s == "idle" => RoundNice::Idle,
            Some(_) => {
                return Err(err(
                    "round_nice",
                    "must be an integer from 0 (the checks' priority) to 19, or \"idle\"".into(),
                ));
            }
        };
        let tls = match f.get("tls") {
            None => None,
            Some(Value::Table(t)) => Some(self.tls(t)?),
            Some(_) => return Err(err("tls", "must be a table ([cluster.tls])".into())),
        };
        if let Some(field) = f.unknown() {
            return Err(err(field, "unknown field".into()));
        }
        Ok(ClusterConfig {
            gossip,
            advertise,
            seeds,
            cluster_id,
            gossip_interval,
            quic,
            exchange,
            on_partition,
            phi_threshold,
            dead_node_grace,
            ready_timeout,
            round_nice,
            tls,
        })
    }

    fn tls(&self, t: &Table) -> Result<TlsFiles, ConfigError> {
        let mut f = Fields::new(t);
        let err = |field: &str, m: String| self.err(None, Some("cluster.tls"), field, m);
        let mut path = |field: &'static str| match f.get(field) {
            Some(Value::String(s)) if !s.is_empty() => Ok(self.relative(s)),
            Some(_) => Err(err(field, "must be a file path".into())),
            None => Err(err(field, "is required: a PEM file".into())),
        };
        let (ca, cert, key) = (path("ca")?, path("cert")?, path("key")?);
        if let Some(field) = f.unknown() {
            return Err(err(field, "unknown field".into()));
        }
        Ok(TlsFiles { ca, cert, key })
    }

    fn rule(&self, index: usize, t: &Table) -> Result<Rule, ConfigError> {
        let mut f = Fields::new(t);
        // Until the name is known, the rule is named by its position.
        let position = format!("#{} (unnamed)", index + 1);
        let name = match f.get("name") {
            Some(Value::String(s)) if valid_name(s) => s.clone(),
            Some(Value::String(s)) => {
                return Err(self.err(
                    Some(&quoted(s)),
                    None,
                    "name",
                    "must be 1 to 64 characters of letters, digits, '_', '-', '.'",
                ));
            }
            Some(_) => return Err(self.err(Some(&position), None, "name", "must be a string")),
            None => return Err(self.err(Some(&position), None, "name", "is required")),
        };
        let rule_name = quoted(&name);
        let rn = Some(rule_name.as_str());
        let err = |field: &str, m: String| self.err(rn, None, field, m);

        let scope = match f.get("scope") {
            None => Scope::Global,
            Some(Value::String(s)) if s == "global" => Scope::Global,
            Some(Value::String(s)) if s == "local" => Scope::Local,
            Some(_) => return Err(err("scope", "must be \"global\" or \"local\"".into())),
        };
        let max_wait = match f.get("max_wait") {
            None => 0,
            Some(v) => nanos(v).map_err(|m| err("max_wait", m))?,
        };
        let limits = match f.get("limits") {
            Some(Value::Array(items)) => {
                for field in ["algorithm", "limit", "period", "burst"] {
                    if t.contains_key(field) {
                        return Err(err(
                            field,
                            "a rule with [[rule.limits]] sets algorithm, limit, period and burst in each limit, not on the rule".into(),
                        ));
                    }
                    f.taken.push(field);
                }
                if items.is_empty() {
                    return Err(err("limits", "needs at least one limit".into()));
                }
                items
                    .iter()
                    .enumerate()
                    .map(|(i, item)| match item {
                        Value::Table(t) => self.limit(rn, &format!("limits[{i}]."), t, true),
                        _ => Err(err(
                            "limits",
                            "each limit must be a table ([[rule.limits]])".into(),
                        )),
                    })
                    .collect::<Result<Vec<_>, _>>()?
            }
            Some(_) => return Err(err("limits", "must be [[rule.limits]] tables".into())),
            None => {
                f.taken.extend(["algorithm", "limit", "period", "burst"]);
                vec![self.limit(rn, "", t, false)?]
            }
        };
        if let Some(field) = f.unknown() {
            return Err(err(field, "unknown field".into()));
        }
        if max_wait > 0
            && !limits
                .iter()
                .any(|l| l.algorithm() == Algorithm::LeakyBucket)
        {
            return Err(err(
                "max_wait",
                "only a leaky_bucket shapes (holds callers); other algorithms deny at once".into(),
            ));
        }
        Ok(Rule {
            name,
            limits,
            scope,
            max_wait,
        })
    }

    /// One limit, from a `[[rule.limits]]` table or from the rule itself (then the rule's
    /// other fields are not this function's to check).
    fn limit(
        &self,
        rule: Option<&str>,
        prefix: &str,
        t: &Table,
        own_table: bool,
    ) -> Result<Limit, ConfigError> {
        let mut f = Fields::new(t);
        let err = |field: &str, m: String| self.err(rule, None, &format!("{prefix}{field}"), m);
        let algorithm = match f.get("algorithm") {
            None => {
                return Err(err(
                    "algorithm",
                    format!("is required: one of {}", algorithm_names()),
                ));
            }
            Some(Value::String(s)) => Algorithm::from_name(s).ok_or_else(|| {
                err(
                    "algorithm",
                    format!(
                        "unknown algorithm \"{s}\": expected one of {}",
                        algorithm_names()
                    ),
                )
            })?,
            Some(_) => {
                return Err(err(
                    "algorithm",
                    format!("must be a string: one of {}", algorithm_names()),
                ));
            }
        };
        let limit = match f.get("limit") {
            None => {
                return Err(err(
                    "limit",
                    "is required: units admitted per period".into(),
                ));
            }
            Some(v) => positive_integer(v).map_err(|m| err("limit", m))?,
        };
        let period = match f.get("period") {
            None => return Err(err("period", "is required, e.g. \"1s\", \"1m\"".into())),
            Some(v) => nanos(v).map_err(|m| err("period", m))?,
        };
        let burst = match f.get("burst") {
            None => None,
            Some(v) => Some(positive_integer(v).map_err(|m| err("burst", m))?),
        };
        if own_table && let Some(field) = f.unknown() {
            return Err(err(field, "unknown field".into()));
        }
        Limit::new(algorithm, limit, period, burst).map_err(|e| {
            let field = match e {
                crate::limiter::LimitError::Limit(_)
                | crate::limiter::LimitError::LogTooLarge(_) => "limit",
                crate::limiter::LimitError::Burst(_)
                | crate::limiter::LimitError::BurstNotApplicable(_) => "burst",
                crate::limiter::LimitError::Period => "period",
            };
            err(field, e.to_string())
        })
    }
}

fn quoted(name: &str) -> String {
    format!("\"{name}\"")
}

fn algorithm_names() -> String {
    Algorithm::ALL.map(Algorithm::name).join(", ")
}

/// Rule names appear in headers and metric labels, so keep them plain.
fn valid_name(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

fn positive_integer(v: &Value) -> Result<u64, String> {
    match v {
        Value::Integer(n) if *n >= 1 => Ok(*n as u64),
        Value::Integer(n) => Err(format!("must be at least 1, got {n}")),
        _ => Err("must be a whole number".into()),
    }
}

fn count(v: Option<&Value>, default: usize) -> Result<usize, String> {
    match v {
        None => Ok(default),
        Some(v) => positive_integer(v).and_then(|n| usize::try_from(n).map_err(|e| e.to_string())),
    }
}

fn nanos(v: &Value) -> Result<Nanos, String> {
    match v {
        Value::String(s) => parse_duration(s),
        _ => Err(
            "must be a duration string such as \"250ms\", \"1s\", \"1m\", \"1h\", \"1d\"".into(),
        ),
    }
}

fn positive_duration(v: Option<&Value>, default: Duration) -> Result<Duration, String> {
    match v {
        None => Ok(default),
        Some(v) => match nanos(v)? {
            0 => Err("must be longer than 0".into()),
            n => Ok(Duration::from_nanos(n)),
        },
    }
}

/// `check_slice`: `"0ms"` (the kernel's default), or from 100 µs to 100 ms, in `us` or any
/// unit of a duration.
fn check_slice(v: Option<&Value>) -> Result<Duration, String> {
    let slice = match v {
        None => return Ok(DEFAULT_CHECK_SLICE),
        Some(Value::String(s)) if s.ends_with("us") && s.len() > 2 => {
            let micros = &s[..s.len() - 2];
            // `parse` alone would take a leading `+`.
            let whole = micros.bytes().all(|b| b.is_ascii_digit());
            match micros.parse() {
                Ok(n) if whole => Duration::from_micros(n),
                _ => return Err(format!("\"{s}\" is not a whole number of microseconds")),
            }
        }
        Some(v) => Duration::from_nanos(nanos(v)?),
    };
    if slice.is_zero() || CHECK_SLICES.contains(&slice) {
        Ok(slice)
    } else {
        Err("must be from \"100us\" to \"100ms\" (what Linux accepts), or \"0ms\" for the kernel's default".into())
    }
}

fn socket_addr(v: &Value) -> Result<SocketAddr, String> {
    match v {
        Value::String(s) => s.parse().map_err(|_| {
            format!("\"{s}\" is not an IP address with a port, e.g. \"127.0.0.1:7070\"")
        }),
        _ => Err("must be an \"ip:port\" string".into()),
    }
}

/// `host:port` with a non-empty host and a valid port (the host may be a DNS name).
pub fn host_port(s: &str) -> Result<String, String> {
    let ok = s
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if ok {
        Ok(s.to_owned())
    } else {
        Err(format!("\"{s}\" is not \"host:port\""))
    }
}

#[cfg(test)]
mod tests;
