//! envoyproxy/ratelimit's YAML configuration, read as it is, into plain values; and their
//! translation into gossamer rules. Pure: [`parse`] takes text, [`load`] only reads files.
//!
//! A file holds one `domain` and its nested `descriptors`; a directory holds such files
//! (`*.yaml`, `*.yml`, read in name order; a domain may appear in one file only). Every
//! field of envoyproxy/ratelimit's format is read: `key`, `value` (with `*` wildcards),
//! `rate_limit` {`unit`, `requests_per_unit`, `unlimited`, `name`, `replaces`},
//! `shadow_mode`, `detailed_metric`, `value_to_metric`, `share_threshold`, plus one
//! extension, `rate_limit.algorithm`, which picks any gossamer algorithm (default
//! `fixed_window`, as there). `quota_mode` and `metadata` are refused: gossamer does not
//! implement them, and a limit that silently behaved differently would be worse.
//!
//! Each distinct (algorithm, requests_per_unit, unit) becomes one global [`Rule`], named
//! `rls.<algorithm>.<requests_per_unit>.<unit>`; a descriptor's counter is a key of that rule
//! made of the domain and the request's entries ([`super::matcher`]). Two descriptors that
//! share a limit therefore share a rule but never a key.

use std::fmt;
use std::path::{Path, PathBuf};

use yaml_rust2::Yaml;

use crate::config::{Rule, Scope};
use crate::limiter::{Algorithm, Limit, Nanos, SECOND};

/// The unit of a limit, with envoyproxy/ratelimit's lengths (a month is 30 days, a year 365).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    /// 1 s.
    Second,
    /// 60 s.
    Minute,
    /// 3,600 s.
    Hour,
    /// 86,400 s.
    Day,
    /// 7 days.
    Week,
    /// 30 days.
    Month,
    /// 365 days.
    Year,
}

impl Unit {
    /// Every unit.
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    /// The name in config files and rule names.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// Parses a config name, in any case (as envoyproxy/ratelimit does).
    pub fn from_name(name: &str) -> Option<Unit> {
        Unit::ALL
            .into_iter()
            .find(|u| u.name().eq_ignore_ascii_case(name))
    }

    /// The unit's length.
    pub fn period(self) -> Nanos {
        let seconds = match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        };
        seconds * SECOND
    }

    /// The value in Envoy's `RateLimitUnit` and `RateLimitResponse.RateLimit.Unit` enums
    /// (both number the units alike).
    pub fn proto(self) -> i32 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 2,
            Unit::Hour => 3,
            Unit::Day => 4,
            Unit::Month => 5,
            Unit::Year => 6,
            Unit::Week => 7,
        }
    }

    /// The unit of an enum value; `None` for UNKNOWN (0) and values this version does not
    /// know.
    pub fn from_proto(value: i32) -> Option<Unit> {
        Unit::ALL.into_iter().find(|u| u.proto() == value)
    }
}

/// A descriptor's `rate_limit` block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimit {
    /// `name`: what `replaces` refers to, and `current_limit.name` in responses.
    pub name: Option<String>,
    /// `replaces[].name`: limits of a request that this one drops when both match.
    pub replaces: Vec<String>,
    /// The limit itself, or `None` for `unlimited: true`.
    pub limit: Option<Quota>,
}

/// A limited `rate_limit`: so many requests per unit, under an algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    /// `requests_per_unit`; 0 refuses every request.
    pub requests_per_unit: u32,
    /// `unit`.
    pub unit: Unit,
    /// `algorithm` (gossamer's extension; default `fixed_window`).
    pub algorithm: Algorithm,
}

impl Quota {
    /// The gossamer rule counting this quota (`None` for 0, which needs no counting).
    pub fn rule_name(&self) -> Option<String> {
        (self.requests_per_unit > 0).then(|| {
            format!(
                "rls.{}.{}.{}",
                self.algorithm.name(),
                self.requests_per_unit,
                self.unit.name()
            )
        })
    }

    /// The gossamer limit (`None` for 0, or for a limit the algorithm cannot hold).
    pub fn limit(&self) -> Result<Limit, crate::limiter::LimitError> {
        Limit::new(
            self.algorithm,
            u64::from(self.requests_per_unit),
            self.unit.period(),
            None,
        )
    }
}

/// One descriptor of a domain, with its nested descriptors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    /// `key`, never empty.
    pub key: String,
    /// `value`: exact, or a pattern where each `*` matches any run of characters.
    pub value: Option<String>,
    /// `rate_limit`.
    pub rate_limit: Option<RateLimit>,
    /// `shadow_mode`: decisions are made and counted, the answer is OK.
    pub shadow_mode: bool,
    /// `detailed_metric`: the metric label carries the request's values.
    pub detailed_metric: bool,
    /// `value_to_metric`: the metric label carries this entry's request value.
    pub value_to_metric: bool,
    /// `share_threshold`: every value matching this wildcard shares one counter.
    pub share_threshold: bool,
    /// `descriptors`.
    pub descriptors: Vec<Descriptor>,
}

/// One domain: a file's `domain` and `descriptors`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Domain {
    /// `domain`, never empty.
    pub name: String,
    /// The file it was read from (for messages).
    pub file: String,
    /// `descriptors`.
    pub descriptors: Vec<Descriptor>,
}

/// A config that cannot be used: names the file, the domain, the descriptor and the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {place}{message}")]
pub struct RlsConfigError {
    /// The file (or directory, when it cannot be listed).
    pub file: String,
    /// Where: `domain "d", descriptor "a=b > c", field "unit": `, or empty.
    pub place: String,
    /// What is wrong.
    pub message: String,
}

/// Where in a file a problem is, for [`RlsConfigError::place`].
#[derive(Debug, Clone, Default)]
struct At {
    domain: Option<String>,
    /// Each level's `key` or `key=value`.
    path: Vec<String>,
}

impl At {
    fn place(&self, field: Option<&str>) -> String {
        let mut out = String::new();
        if let Some(d) = &self.domain {
            out.push_str(&format!("domain \"{d}\", "));
        }
        if !self.path.is_empty() {
            out.push_str(&format!("descriptor \"{}\", ", self.path.join(" > ")));
        }
        if let Some(f) = field {
            out.push_str(&format!("field \"{f}\": "));
        } else if !out.is_empty() {
            out.truncate(out.len() - 2);
            out.push_str(": ");
        }
        out
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The YAML files at `path`: the file itself, or a directory's `*.yaml` and `*.yml` in name
/// order (not recursive; hidden files, such as a ConfigMap volume's `..data`, are skipped).
pub fn files(path: &Path) -> Result<Vec<PathBuf>, RlsConfigError> {
    let err = |e: std::io::Error| RlsConfigError {
        file: path.display().to_string(),
        place: String::new(),
        message: format!("cannot read: {e}"),
    };
    let meta = std::fs::metadata(path).map_err(err)?;
    if !meta.is_dir() {
        return Ok(vec![path.to_owned()]);
    }
    let mut found = Vec::new();
    for entry in std::fs::read_dir(path).map_err(err)? {
        let p = entry.map_err(err)?.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let yaml = name.ends_with(".yaml") || name.ends_with(".yml");
        if yaml && !name.starts_with('.') && p.is_file() {
            found.push(p);
        }
    }
    found.sort();
    if found.is_empty() {
        return Err(RlsConfigError {
            file: path.display().to_string(),
            place: String::new(),
            message: "the directory holds no *.yaml or *.yml file".into(),
        });
    }
    Ok(found)
}

/// Reads and validates every domain at `path` (a file or a directory, see [`files`]).
pub fn load(path: &Path) -> Result<Vec<Domain>, RlsConfigError> {
    let mut domains: Vec<Domain> = Vec::new();
    for file in files(path)? {
        let name = file.display().to_string();
        let text = std::fs::read_to_string(&file).map_err(|e| RlsConfigError {
            file: name.clone(),
            place: String::new(),
            message: format!("cannot read: {e}"),
        })?;
        let domain = parse(&text, &name)?;
        if let Some(other) = domains.iter().find(|d| d.name == domain.name) {
            return Err(RlsConfigError {
                file: name,
                place: format!("domain \"{}\": ", domain.name),
                message: format!("defined twice (also in {})", other.file),
            });
        }
        domains.push(domain);
    }
    Ok(domains)
}

/// Parses one file's text; `file` names it in errors.
pub fn parse(text: &str, file: &str) -> Result<Domain, RlsConfigError> {
    let fail = |at: &At, field: Option<&str>, message: String| RlsConfigError {
        file: file.to_owned(),
        place: at.place(field),
        message,
    };
    let docs = yaml_rust2::YamlLoader::load_from_str(text)
        .map_err(|e| fail(&At::default(), None, format!("not valid YAML: {e}")))?;
    let root = match docs.as_slice() {
        [root] => root,
        [] => return Err(fail(&At::default(), None, "the file is empty".into())),
        _ => {
            return Err(fail(
                &At::default(),
                None,
                "holds several YAML documents; write one domain per file".into(),
            ));
        }
    };
    let Yaml::Hash(map) = root else {
        return Err(fail(
            &At::default(),
            None,
            "must be a mapping with \"domain\" and \"descriptors\"".into(),
        ));
    };
    let mut at = At::default();
    let fields = Fields::new(map, &["domain", "descriptors"]);
    fields.check(&at, file)?;
    let name = match fields.get("domain") {
        Some(v) => match scalar(v) {
            Some(s) if !s.is_empty() => s,
            _ => {
                return Err(fail(
                    &at,
                    Some("domain"),
                    "must be a non-empty string".into(),
                ));
            }
        },
        None => return Err(fail(&at, Some("domain"), "is required".into())),
    };
    at.domain = Some(name.clone());
    let descriptors = match fields.get("descriptors") {
        None | Some(Yaml::Null) => Vec::new(),
        Some(v) => descriptors(v, &mut at, file)?,
    };
    Ok(Domain {
        name,
        file: file.to_owned(),
        descriptors,
    })
}

/// The fields envoyproxy/ratelimit knows, of a descriptor and of a `rate_limit` block.
const DESCRIPTOR_FIELDS: [&str; 9] = [
    "key",
    "value",
    "rate_limit",
    "descriptors",
    "shadow_mode",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "algorithm",
];
const RATE_LIMIT_FIELDS: [&str; 6] = [
    "unit",
    "requests_per_unit",
    "unlimited",
    "name",
    "replaces",
    "algorithm",
];
/// Fields of envoyproxy/ratelimit that gossamer refuses, with why.
const REFUSED: [(&str, &str); 2] = [
    (
        "quota_mode",
        "quota_mode is not supported by gossamer (remove it, or keep envoyproxy/ratelimit for this domain)",
    ),
    (
        "metadata",
        "metadata (response dynamic metadata) is not supported by gossamer",
    ),
];

/// A mapping's fields, checked against the known ones before any is read.
struct Fields<'y> {
    map: &'y yaml_rust2::yaml::Hash,
    known: &'static [&'static str],
}

impl<'y> Fields<'y> {
    fn new(map: &'y yaml_rust2::yaml::Hash, known: &'static [&'static str]) -> Fields<'y> {
        Fields { map, known }
    }

    /// Every key must be a known field's name.
    fn check(&self, at: &At, file: &str) -> Result<(), RlsConfigError> {
        for k in self.map.keys() {
            let fail = |field: &str, message: String| RlsConfigError {
                file: file.to_owned(),
                place: at.place(Some(field)),
                message,
            };
            let Yaml::String(k) = k else {
                let shown = scalar(k).unwrap_or_else(|| "<not a scalar>".into());
                return Err(fail(&shown, "field names must be strings".into()));
            };
            if let Some((_, why)) = REFUSED.iter().find(|(f, _)| f == k) {
                return Err(fail(k, (*why).to_owned()));
            }
            if !self.known.contains(&k.as_str()) {
                return Err(fail(
                    k,
                    format!("unknown field (expected one of {})", self.known.join(", ")),
                ));
            }
        }
        Ok(())
    }

    fn get(&self, field: &str) -> Option<&'y Yaml> {
        self.map.get(&Yaml::String(field.to_owned()))
    }
}

/// A scalar as text (YAML reads `value: 500` as a number; envoyproxy/ratelimit as a string).
fn scalar(v: &Yaml) -> Option<String> {
    match v {
        Yaml::String(s) | Yaml::Real(s) => Some(s.clone()),
        Yaml::Integer(n) => Some(n.to_string()),
        Yaml::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}

fn boolean(v: Option<&Yaml>) -> Result<bool, String> {
    match v {
        None | Some(Yaml::Null) => Ok(false),
        Some(Yaml::Boolean(b)) => Ok(*b),
        Some(_) => Err("must be true or false".into()),
    }
}

fn descriptors(v: &Yaml, at: &mut At, file: &str) -> Result<Vec<Descriptor>, RlsConfigError> {
    let Yaml::Array(items) = v else {
        return Err(RlsConfigError {
            file: file.to_owned(),
            place: at.place(Some("descriptors")),
            message: "must be a list of descriptors".into(),
        });
    };
    let mut out: Vec<Descriptor> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let d = descriptor(item, i, at, file)?;
        if out.iter().any(|o| o.key == d.key && o.value == d.value) {
            at.path.push(label(&d.key, d.value.as_deref()));
            let e = RlsConfigError {
                file: file.to_owned(),
                place: at.place(None),
                message: "defined twice at this level (same key and value)".into(),
            };
            at.path.pop();
            return Err(e);
        }
        out.push(d);
    }
    Ok(out)
}

fn label(key: &str, value: Option<&str>) -> String {
    match value {
        Some(v) => format!("{key}={v}"),
        None => key.to_owned(),
    }
}

fn descriptor(
    v: &Yaml,
    index: usize,
    at: &mut At,
    file: &str,
) -> Result<Descriptor, RlsConfigError> {
    let fail = |at: &At, field: Option<&str>, message: String| RlsConfigError {
        file: file.to_owned(),
        place: at.place(field),
        message,
    };
    let Yaml::Hash(map) = v else {
        at.path.push(format!("#{}", index + 1));
        let e = fail(
            at,
            None,
            "each descriptor must be a mapping with a \"key\"".into(),
        );
        at.path.pop();
        return Err(e);
    };
    let fields = Fields::new(map, &DESCRIPTOR_FIELDS);
    // Until the key is read, the descriptor is named by its position.
    at.path.push(format!("#{}", index + 1));
    let key = match fields.get("key").and_then(scalar) {
        Some(k) if !k.is_empty() => k,
        Some(_) => return Err(fail(at, Some("key"), "must not be empty".into())),
        None if fields.get("key").is_some() => {
            return Err(fail(at, Some("key"), "must be a string".into()));
        }
        None => return Err(fail(at, Some("key"), "is required".into())),
    };
    let value = match fields.get("value") {
        None | Some(Yaml::Null) => None,
        Some(v) => match scalar(v) {
            // envoyproxy/ratelimit reads an empty value as no value.
            Some(s) if s.is_empty() => None,
            Some(s) => Some(s),
            None => return Err(fail(at, Some("value"), "must be a string".into())),
        },
    };
    at.path.pop();
    at.path.push(label(&key, value.as_deref()));
    fields.check(at, file)?;
    let flag = |field: &str| boolean(fields.get(field)).map_err(|m| fail(at, Some(field), m));
    let shadow_mode = flag("shadow_mode")?;
    let detailed_metric = flag("detailed_metric")?;
    let value_to_metric = flag("value_to_metric")?;
    let share_threshold = flag("share_threshold")?;
    if share_threshold && !value.as_deref().is_some_and(|v| v.contains('*')) {
        return Err(fail(
            at,
            Some("share_threshold"),
            "applies only to a value with a '*' wildcard".into(),
        ));
    }
    if fields.get("algorithm").is_some() {
        return Err(fail(
            at,
            Some("algorithm"),
            "belongs in the rate_limit block (rate_limit.algorithm)".into(),
        ));
    }
    let rate_limit = match fields.get("rate_limit") {
        None | Some(Yaml::Null) => None,
        Some(Yaml::Hash(map)) => Some(rate_limit(map, at, file)?),
        Some(_) => {
            return Err(fail(
                at,
                Some("rate_limit"),
                "must be a mapping with unit and requests_per_unit".into(),
            ));
        }
    };
    let descriptors = match fields.get("descriptors") {
        None | Some(Yaml::Null) => Vec::new(),
        Some(v) => descriptors(v, at, file)?,
    };
    at.path.pop();
    Ok(Descriptor {
        key,
        value,
        rate_limit,
        shadow_mode,
        detailed_metric,
        value_to_metric,
        share_threshold,
        descriptors,
    })
}

fn rate_limit(
    map: &yaml_rust2::yaml::Hash,
    at: &At,
    file: &str,
) -> Result<RateLimit, RlsConfigError> {
    let fail = |field: &str, message: String| RlsConfigError {
        file: file.to_owned(),
        place: at.place(Some(&format!("rate_limit.{field}"))),
        message,
    };
    let fields = Fields::new(map, &RATE_LIMIT_FIELDS);
    for k in map.keys() {
        if let Yaml::String(k) = k
            && !RATE_LIMIT_FIELDS.contains(&k.as_str())
        {
            return Err(fail(
                k,
                format!(
                    "unknown field (expected one of {})",
                    RATE_LIMIT_FIELDS.join(", ")
                ),
            ));
        }
    }
    fields.check(at, file)?;
    let unlimited = boolean(fields.get("unlimited")).map_err(|m| fail("unlimited", m))?;
    let name = match fields.get("name") {
        None | Some(Yaml::Null) => None,
        Some(v) => match scalar(v) {
            Some(s) if s.is_empty() => None,
            Some(s) => Some(s),
            None => return Err(fail("name", "must be a string".into())),
        },
    };
    let mut replaces = Vec::new();
    match fields.get("replaces") {
        None | Some(Yaml::Null) => {}
        Some(Yaml::Array(items)) => {
            for item in items {
                let replaced = match item {
                    Yaml::Hash(m) => {
                        if m.len() != 1 {
                            return Err(fail(
                                "replaces",
                                "each entry must be a mapping with only a \"name\"".into(),
                            ));
                        }
                        m.get(&Yaml::String("name".into())).and_then(scalar)
                    }
                    _ => None,
                };
                match replaced {
                    Some(n) if n.is_empty() => {
                        return Err(fail("replaces", "an entry has an empty name".into()));
                    }
                    Some(n) if Some(&n) == name.as_ref() => {
                        return Err(fail(
                            "replaces",
                            format!("\"{n}\" is this limit's own name"),
                        ));
                    }
                    Some(n) => replaces.push(n),
                    None => {
                        return Err(fail(
                            "replaces",
                            "each entry must be a mapping with a \"name\"".into(),
                        ));
                    }
                }
            }
        }
        Some(_) => {
            return Err(fail(
                "replaces",
                "must be a list of mappings with a \"name\"".into(),
            ));
        }
    }
    let unit = fields.get("unit");
    let rpu = fields.get("requests_per_unit");
    let algorithm = fields.get("algorithm");
    let units = || Unit::ALL.map(Unit::name).join(", ");
    if unlimited {
        for (field, given) in [
            ("unit", unit),
            ("requests_per_unit", rpu),
            ("algorithm", algorithm),
        ] {
            if given.is_some() {
                return Err(fail(field, "must not be set when unlimited is true".into()));
            }
        }
        return Ok(RateLimit {
            name,
            replaces,
            limit: None,
        });
    }
    let unit = match unit {
        None => return Err(fail("unit", format!("is required: one of {}", units()))),
        Some(v) => scalar(v).and_then(|s| Unit::from_name(&s)).ok_or_else(|| {
            fail(
                "unit",
                format!(
                    "{} is not a unit: expected one of {}",
                    scalar(v).map_or("this".into(), |s| format!("\"{s}\"")),
                    units()
                ),
            )
        })?,
    };
    let requests_per_unit = match rpu {
        None => {
            return Err(fail(
                "requests_per_unit",
                "is required (0 refuses every request)".into(),
            ));
        }
        Some(Yaml::Integer(n)) => u32::try_from(*n).map_err(|_| {
            fail(
                "requests_per_unit",
                format!("must be a whole number from 0 to {}, got {n}", u32::MAX),
            )
        })?,
        Some(_) => {
            return Err(fail(
                "requests_per_unit",
                format!("must be a whole number from 0 to {}", u32::MAX),
            ));
        }
    };
    let names = || Algorithm::ALL.map(Algorithm::name).join(", ");
    let algorithm = match algorithm {
        None => Algorithm::FixedWindow,
        Some(v) => scalar(v)
            .and_then(|s| Algorithm::from_name(&s))
            .ok_or_else(|| fail("algorithm", format!("must be one of {}", names())))?,
    };
    let quota = Quota {
        requests_per_unit,
        unit,
        algorithm,
    };
    if requests_per_unit > 0 {
        quota
            .limit()
            .map_err(|e| fail("requests_per_unit", e.to_string()))?;
    }
    Ok(RateLimit {
        name,
        replaces,
        limit: Some(quota),
    })
}

/// Every limit of `domains`, with where it is configured (domain and descriptor path), in
/// config order.
pub fn quotas(domains: &[Domain]) -> Vec<(Quota, String, String, String)> {
    fn walk(
        ds: &[Descriptor],
        domain: &Domain,
        path: &mut Vec<String>,
        out: &mut Vec<(Quota, String, String, String)>,
    ) {
        for d in ds {
            path.push(label(&d.key, d.value.as_deref()));
            if let Some(q) = d.rate_limit.as_ref().and_then(|r| r.limit) {
                out.push((
                    q,
                    domain.file.clone(),
                    domain.name.clone(),
                    path.join(" > "),
                ));
            }
            walk(&d.descriptors, domain, path, out);
            path.pop();
        }
    }
    let mut out = Vec::new();
    for d in domains {
        walk(&d.descriptors, d, &mut Vec::new(), &mut out);
    }
    out
}

/// The global rules that count `domains`' limits: one per distinct quota, in config order.
pub fn rules(domains: &[Domain]) -> Vec<Rule> {
    let mut out: Vec<Rule> = Vec::new();
    for (quota, ..) in quotas(domains) {
        let (Some(name), Ok(limit)) = (quota.rule_name(), quota.limit()) else {
            continue;
        };
        if out.iter().any(|r| r.name == name) {
            continue;
        }
        out.push(Rule {
            name,
            limits: vec![limit],
            scope: Scope::Global,
            max_wait: 0,
        });
    }
    out
}

/// An error about a quota's place, for checks made after parsing (a cluster's limits).
pub fn quota_error(
    file: &str,
    domain: &str,
    path: &str,
    field: &str,
    message: String,
) -> RlsConfigError {
    RlsConfigError {
        file: file.to_owned(),
        place: format!("domain \"{domain}\", descriptor \"{path}\", field \"{field}\": "),
        message,
    }
}

#[cfg(test)]
mod tests;
