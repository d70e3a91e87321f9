//! Which configured descriptor a request's descriptor matches, and the counter key and metric
//! label it gets. Pure: built once per config ([`Table::new`]), then read by every request.
//!
//! Matching follows envoyproxy/ratelimit. The request's entries are walked level by level:
//! at each level an entry matches the descriptor with the same key and value, else the first
//! (in config order) whose value pattern matches (each `*` matches any run of characters),
//! else the one with the same key and no value. The walk stops where nothing matches or the
//! matched descriptor has no children. A limit applies only if the descriptor that matched
//! the *last* entry has one: a request with more entries than the config has levels, or fewer,
//! is not limited.

use std::collections::HashMap;

use super::config::{Descriptor, Domain, Quota, RateLimit};

/// The compiled config: domains by name.
#[derive(Debug, Default)]
pub struct Table {
    domains: HashMap<String, Level>,
}

/// One level of descriptors.
#[derive(Debug, Default)]
struct Level {
    /// key -> value -> node.
    exact: HashMap<String, HashMap<String, usize>>,
    /// (key, the value split at each `*`, node), in config order.
    wildcards: Vec<(String, Vec<String>, usize)>,
    /// key (no value) -> node.
    any: HashMap<String, usize>,
    nodes: Vec<Node>,
}

/// A configured descriptor.
#[derive(Debug)]
pub struct Node {
    /// `key`.
    pub key: String,
    /// `value` as written (a pattern if it holds `*`).
    pub value: Option<String>,
    /// `rate_limit`.
    pub rate_limit: Option<RateLimit>,
    /// `shadow_mode`.
    pub shadow_mode: bool,
    detailed_metric: bool,
    value_to_metric: bool,
    share_threshold: bool,
    children: Level,
}

impl Node {
    /// The quota, if limited (`None` when unlimited or without a `rate_limit`).
    pub fn quota(&self) -> Option<Quota> {
        self.rate_limit.as_ref().and_then(|r| r.limit)
    }
}

/// A request descriptor's match.
#[derive(Debug)]
pub struct Matched<'t> {
    /// The configured descriptor whose `rate_limit` applies.
    pub node: &'t Node,
    /// The counter's key under the quota's rule (see [`counter_key`]).
    pub key: String,
    /// The metric label, as envoyproxy/ratelimit names its stats (`domain.key_value.key`).
    pub metric: String,
}

impl Table {
    /// Compiles `domains`.
    pub fn new(domains: &[Domain]) -> Table {
        Table {
            domains: domains
                .iter()
                .map(|d| (d.name.clone(), Level::new(&d.descriptors)))
                .collect(),
        }
    }

    /// Whether `domain` is configured.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// The configured descriptor with a `rate_limit` that `entries` (key, value pairs) match
    /// in `domain`; `None` if it is not limited (unknown domain, no match, a match without a
    /// `rate_limit`, or a depth mismatch).
    pub fn find<'t>(&'t self, domain: &str, entries: &[(&str, &str)]) -> Option<Matched<'t>> {
        let mut level = self.domains.get(domain)?;
        // Per entry: the shared pattern a share_threshold wildcard puts in the key.
        let mut shared: Vec<Option<&str>> = Vec::with_capacity(entries.len());
        let mut metric = String::from(domain);
        let mut detailed = String::from(domain);
        for (i, &(key, value)) in entries.iter().enumerate() {
            let (node, how) = level.lookup(key, value)?;
            shared.push(match how {
                How::Wildcard if node.share_threshold => node.value.as_deref(),
                _ => None,
            });
            metric.push('.');
            metric.push_str(key);
            let shown = match how {
                How::Exact => Some(value),
                // Values sharing a threshold share a label: the pattern, as
                // envoyproxy/ratelimit's code (not its README) names it.
                How::Wildcard if node.share_threshold => node.value.as_deref(),
                How::Wildcard if node.value_to_metric => Some(value),
                How::Wildcard => node.value.as_deref(),
                How::Any if node.value_to_metric => Some(value),
                How::Any => None,
            };
            if let Some(v) = shown.filter(|v| !v.is_empty()) {
                metric.push('_');
                metric.push_str(v);
            }
            detailed.push('.');
            detailed.push_str(key);
            detailed.push('_');
            detailed.push_str(value);
            let last = i + 1 == entries.len();
            if last {
                node.rate_limit.as_ref()?;
                let metric = if node.detailed_metric {
                    detailed
                } else {
                    metric
                };
                return Some(Matched {
                    node,
                    key: counter_key(domain, entries, &shared),
                    metric,
                });
            }
            if node.children.nodes.is_empty() {
                return None;
            }
            level = &node.children;
        }
        None
    }
}

/// How an entry matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum How {
    Exact,
    Wildcard,
    Any,
}

impl Level {
    fn new(descriptors: &[Descriptor]) -> Level {
        let mut level = Level::default();
        for d in descriptors {
            let i = level.nodes.len();
            match &d.value {
                Some(v) if v.contains('*') => {
                    let parts = v.split('*').map(str::to_owned).collect();
                    level.wildcards.push((d.key.clone(), parts, i));
                }
                Some(v) => {
                    level
                        .exact
                        .entry(d.key.clone())
                        .or_default()
                        .insert(v.clone(), i);
                }
                None => {
                    level.any.insert(d.key.clone(), i);
                }
            }
            level.nodes.push(Node {
                key: d.key.clone(),
                value: d.value.clone(),
                rate_limit: d.rate_limit.clone(),
                shadow_mode: d.shadow_mode,
                detailed_metric: d.detailed_metric,
                value_to_metric: d.value_to_metric,
                share_threshold: d.share_threshold,
                children: Level::new(&d.descriptors),
            });
        }
        level
    }

    fn lookup(&self, key: &str, value: &str) -> Option<(&Node, How)> {
        if let Some(&i) = self.exact.get(key).and_then(|values| values.get(value)) {
            return Some((&self.nodes[i], How::Exact));
        }
        if let Some((_, _, i)) = self
            .wildcards
            .iter()
            .find(|(k, parts, _)| k == key && wildcard_match(parts, value))
        {
            return Some((&self.nodes[*i], How::Wildcard));
        }
        self.any.get(key).map(|&i| (&self.nodes[i], How::Any))
    }
}

/// Whether `value` matches a pattern split at its `*`s: it starts with the first part, ends
/// with the last, and holds the middle ones in order, without overlaps.
pub fn wildcard_match(parts: &[String], value: &str) -> bool {
    let [first, middle @ .., last] = parts else {
        return parts.first().is_some_and(|p| p == value);
    };
    if value.len() < first.len() + last.len()
        || !value.starts_with(first.as_str())
        || !value.ends_with(last.as_str())
    {
        return false;
    }
    let mut rest = &value[first.len()..value.len() - last.len()];
    for part in middle {
        match rest.find(part.as_str()) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

/// The counter key of a request descriptor: the domain and each entry's key and value (or, for
/// an entry matched by a `share_threshold` wildcard, the pattern), each part prefixed by its
/// length so that no two descriptors share a key.
pub fn counter_key(domain: &str, entries: &[(&str, &str)], shared: &[Option<&str>]) -> String {
    let mut key = String::with_capacity(
        domain.len()
            + entries
                .iter()
                .map(|(k, v)| k.len() + v.len() + 8)
                .sum::<usize>()
            + 4,
    );
    let mut part = |s: &str| {
        key.push_str(itoa::Buffer::new().format(s.len()));
        key.push(':');
        key.push_str(s);
    };
    part(domain);
    for (i, (k, v)) in entries.iter().enumerate() {
        part(k);
        part(shared.get(i).copied().flatten().unwrap_or(v));
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rls::config::parse;

    fn table(yaml: &str) -> Table {
        Table::new(&[parse(yaml, "t.yaml").unwrap()])
    }

    fn limit_of(t: &Table, domain: &str, entries: &[(&str, &str)]) -> Option<u32> {
        t.find(domain, entries)
            .and_then(|m| m.node.quota())
            .map(|q| q.requests_per_unit)
    }

    #[test]
    fn wildcards_match_prefix_suffix_and_middle_parts_in_order() {
        let parts = |p: &str| p.split('*').map(str::to_owned).collect::<Vec<_>>();
        assert!(wildcard_match(&parts("value*"), "value"));
        assert!(wildcard_match(&parts("value*"), "valueXYZ"));
        assert!(!wildcard_match(&parts("value*"), "valu"));
        assert!(wildcard_match(&parts("/api/*/action"), "/api/1/action"));
        assert!(!wildcard_match(&parts("/api/*/action"), "/api/1/other"));
        assert!(wildcard_match(&parts("/a/*/r/*/x"), "/a/v1/r/2/x"));
        assert!(!wildcard_match(&parts("/a/*/r/*/x"), "/a/v1/x"));
        // The prefix and suffix must not overlap.
        assert!(!wildcard_match(&parts("ab*ba"), "aba"));
        assert!(wildcard_match(&parts("exact"), "exact"));
        assert!(!wildcard_match(&parts("exact"), "exactly"));
    }

    #[test]
    fn the_most_specific_match_wins_and_depth_must_match() {
        let t = table(
            "domain: d
descriptors:
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: ip
    value: 50.0.0.5
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: ip
    value: '10.*'
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: k
    value: v
    descriptors:
      - key: sub
        rate_limit: {unit: minute, requests_per_unit: 300}
  - key: open
",
        );
        assert_eq!(limit_of(&t, "d", &[("ip", "1.2.3.4")]), Some(10));
        assert_eq!(limit_of(&t, "d", &[("ip", "50.0.0.5")]), Some(0));
        assert_eq!(limit_of(&t, "d", &[("ip", "10.1.1.1")]), Some(5));
        assert_eq!(limit_of(&t, "d", &[("k", "v"), ("sub", "x")]), Some(300));
        // Too shallow, too deep, no match, no limit, unknown domain: not limited.
        assert_eq!(limit_of(&t, "d", &[("k", "v")]), None);
        assert_eq!(limit_of(&t, "d", &[("ip", "1.2.3.4"), ("sub", "x")]), None);
        assert_eq!(limit_of(&t, "d", &[("k", "w"), ("sub", "x")]), None);
        assert_eq!(limit_of(&t, "d", &[("open", "x")]), None);
        assert_eq!(limit_of(&t, "nope", &[("ip", "1.2.3.4")]), None);
    }

    #[test]
    fn keys_separate_values_unless_a_wildcard_shares_its_threshold() {
        let t = table(
            "domain: d
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: other
    value: other/*
    rate_limit: {unit: hour, requests_per_unit: 10}
",
        );
        let key = |e: &[(&str, &str)]| t.find("d", e).unwrap().key;
        assert_eq!(key(&[("files", "files/a")]), key(&[("files", "files/b")]));
        assert_ne!(key(&[("other", "other/a")]), key(&[("other", "other/b")]));
        assert_eq!(key(&[("files", "files/a")]), "1:d5:files7:files/*");
        // Length prefixes keep "a" + "bc" apart from "ab" + "c".
        assert_ne!(
            counter_key("d", &[("a", "bc")], &[]),
            counter_key("d", &[("ab", "c")], &[])
        );
    }

    #[test]
    fn metric_labels_follow_envoyproxy_ratelimit() {
        let t = table(
            "domain: m
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: key1
    value: value1
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: route
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: {unit: minute, requests_per_unit: 60}
  - key: plain
    descriptors:
      - key: method
        rate_limit: {unit: minute, requests_per_unit: 60}
",
        );
        let metric = |e: &[(&str, &str)]| t.find("m", e).unwrap().metric;
        assert_eq!(metric(&[("key1", "x")]), "m.key1_x");
        assert_eq!(metric(&[("key1", "value1")]), "m.key1_value1");
        assert_eq!(
            metric(&[("route", "api"), ("method", "GET")]),
            "m.route_api.method"
        );
        assert_eq!(
            metric(&[("plain", "api"), ("method", "GET")]),
            "m.plain.method"
        );
    }
}
