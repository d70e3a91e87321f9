//! The configuration examples of envoyproxy/ratelimit's README (examples 1 to 11), loaded as
//! they are written there and checked rule by rule against what the README says they do, on
//! the engine with a manual clock (no network: `Rls::decide` is what the gRPC handler calls).

#![allow(clippy::unwrap_used)] // helpers of tests: a failure should panic where it happens

use std::sync::Arc;

use gossamer::clock::ManualClock;
use gossamer::engine::Engine;
use gossamer::limiter::{Nanos, SECOND};
use gossamer::rls::config::{self, parse};
use gossamer::rls::proto::rate_limit_descriptor::Entry;
use gossamer::rls::proto::rate_limit_response::Code;
use gossamer::rls::proto::{RateLimitDescriptor, RateLimitRequest, RateLimitResponse};
use gossamer::rls::service::Answer;
use gossamer::rls::{Rls, RlsSettings};

/// A whole day since the epoch, so every window from a second to a day starts here.
const T0: Nanos = 19_675 * 86_400 * SECOND;
const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

struct Service {
    rls: Rls,
    engine: Engine,
    clock: Arc<ManualClock>,
}

impl Service {
    fn new(yaml: &[&str]) -> Service {
        let domains: Vec<_> = yaml
            .iter()
            .enumerate()
            .map(|(i, y)| parse(y, &format!("example-{i}.yaml")).unwrap())
            .collect();
        let clock = Arc::new(ManualClock::new(T0));
        let engine = Engine::new(config::rules(&domains), 100_000, clock.clone());
        let settings = RlsSettings {
            domains,
            ..RlsSettings::default()
        };
        let rls = Rls::new(&settings, clock.clone(), 100_000);
        Service { rls, engine, clock }
    }

    fn ask(&self, domain: &str, descriptors: &[&[(&str, &str)]]) -> RateLimitResponse {
        let request = RateLimitRequest {
            domain: domain.into(),
            descriptors: descriptors
                .iter()
                .map(|entries| RateLimitDescriptor {
                    entries: entries
                        .iter()
                        .map(|(k, v)| Entry {
                            key: (*k).into(),
                            value: (*v).into(),
                        })
                        .collect(),
                    limit: None,
                    hits_addend: None,
                })
                .collect(),
            hits_addend: 0,
        };
        match self.rls.decide(&self.engine, &request, false).unwrap() {
            Answer::Response(r) => r,
            Answer::Pause(..) => panic!("a single node never pauses"),
        }
    }

    /// How many of `n` requests of `descriptors` are admitted.
    fn admitted(&self, n: usize, domain: &str, descriptors: &[&[(&str, &str)]]) -> usize {
        (0..n)
            .filter(|_| self.ask(domain, descriptors).overall_code == OK)
            .count()
    }

    /// The limit applied to one descriptor: (requests_per_unit, unit), `None` if none.
    fn limit(&self, domain: &str, entries: &[(&str, &str)]) -> Option<(u32, i32)> {
        let r = self.ask(domain, &[entries]);
        r.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| (l.requests_per_unit, l.unit))
    }

    fn metrics(&self) -> String {
        let mut out = String::new();
        self.rls.metrics.render(&mut out);
        out
    }
}

const SECOND_U: i32 = 1;
const MINUTE_U: i32 = 2;
const HOUR_U: i32 = 3;
const DAY_U: i32 = 4;

#[test]
fn example_1_two_values_of_one_key_each_get_500_per_second() {
    let s = Service::new(&[r#"
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500

  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
"#]);
    assert_eq!(
        s.admitted(501, "mongo_cps", &[&[("database", "users")]]),
        500
    );
    assert_eq!(
        s.admitted(501, "mongo_cps", &[&[("database", "default")]]),
        500
    );
    assert_eq!(s.limit("mongo_cps", &[("database", "other")]), None);
    s.clock.advance(SECOND);
    assert_eq!(s.admitted(1, "mongo_cps", &[&[("database", "users")]]), 1);
}

#[test]
fn example_2_marketing_messages_and_messages_per_number() {
    let s = Service::new(&[r#"
domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5

  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
"#]);
    let one = [("message_type", "marketing"), ("to_number", "2061111111")];
    let two = [("message_type", "marketing"), ("to_number", "2062222222")];
    assert_eq!(s.limit("messaging", &one), Some((5, DAY_U)));
    assert_eq!(
        s.admitted(10, "messaging", &[&one]),
        4,
        "5 including the one above"
    );
    assert_eq!(
        s.admitted(10, "messaging", &[&two]),
        5,
        "each number its own"
    );
    assert_eq!(
        s.limit("messaging", &[("to_number", "1")]),
        Some((100, DAY_U))
    );
    assert_eq!(s.admitted(200, "messaging", &[&[("to_number", "2")]]), 100);
    // The placeholder alone is not limited.
    assert_eq!(s.limit("messaging", &[("message_type", "marketing")]), None);
}

#[test]
fn example_3_the_most_specific_match_wins() {
    let s = Service::new(&[r#"
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10

  # Black list IP
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
"#]);
    let d = "edge_proxy_per_ip";
    assert_eq!(s.admitted(20, d, &[&[("remote_address", "50.0.0.1")]]), 10);
    assert_eq!(s.admitted(20, d, &[&[("remote_address", "50.0.0.2")]]), 10);
    assert_eq!(s.admitted(5, d, &[&[("remote_address", "50.0.0.5")]]), 0);
    let r = s.ask(d, &[&[("remote_address", "50.0.0.5")]]);
    assert_eq!((r.overall_code, r.statuses[0].code), (OVER, OVER));
    assert_eq!(
        s.limit(d, &[("remote_address", "50.0.0.5")]),
        Some((0, SECOND_U))
    );
}

#[test]
fn example_4_a_request_matches_only_at_the_configs_depth() {
    let flat = Service::new(&[r#"
domain: example4
descriptors:
  - key: key
    value: value
    rate_limit:
      requests_per_unit: 300
      unit: second
"#]);
    let request = [("key", "value"), ("subkey", "subvalue")];
    assert_eq!(flat.limit("example4", &request), None);
    let nested = Service::new(&[r#"
domain: example4
descriptors:
  - key: key
    value: value
    descriptors:
      - key: subkey
        rate_limit:
          requests_per_unit: 300
          unit: second
"#]);
    assert_eq!(nested.limit("example4", &request), Some((300, SECOND_U)));
    assert_eq!(nested.admitted(400, "example4", &[&request]), 299);
}

#[test]
fn example_5_unlimited_descriptors_answer_ok_with_max_remaining() {
    let s = Service::new(&[r#"
domain: internal
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true

  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 100
"#]);
    let r = s.ask("internal", &[&[("ldap", "x")]]);
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
    assert_eq!(s.admitted(1_000, "internal", &[&[("ldap", "x")]]), 1_000);
    assert_eq!(
        s.limit("internal", &[("azure", "x")]),
        Some((100, MINUTE_U))
    );
}

#[test]
fn example_6_shadow_mode_never_limits_but_counts() {
    let s = Service::new(&[r#"
domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit:
          requests_per_unit: 10
          unit: second
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit:
          requests_per_unit: 20
          unit: second
"#]);
    let a = [("service", "auth-service"), ("user", "user-a")];
    let b = [("service", "auth-service"), ("user", "user-b")];
    assert_eq!(s.admitted(30, "example6", &[&a]), 30);
    assert_eq!(s.admitted(30, "example6", &[&b]), 20);
    let metrics = s.metrics();
    let line = "gossamer_rls_descriptors_total{domain=\"example6\",descriptor=\"example6.service.user_user-a\",result=\"over_limit\",shadow=\"true\"} 20";
    assert!(metrics.contains(line), "{metrics}");
}

#[test]
fn example_7_replaces_drops_the_named_limit_when_both_match() {
    let s = Service::new(&[r#"
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
"#]);
    let one = [("key_1", "value_1"), ("user", "bkthomps")];
    let two = [("key_2", "value_2"), ("user", "bkthomps")];
    // Both: 10 / sec, and the 5 / sec limit is not affected.
    assert_eq!(s.admitted(20, "example7", &[&one, &two]), 10);
    assert_eq!(s.admitted(20, "example7", &[&one]), 5);
    s.clock.advance(SECOND);
    assert_eq!(s.admitted(20, "example7", &[&two]), 10);
}

#[test]
fn example_8_detailed_metric_labels_unspecified_values() {
    let s = Service::new(&[r#"
domain: example8
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: key1
    value: value1
    rate_limit:
      unit: minute
      requests_per_unit: 20
"#]);
    assert_eq!(
        s.admitted(15, "example8", &[&[("key1", "unspecified_value")]]),
        10
    );
    assert_eq!(
        s.admitted(15, "example8", &[&[("key1", "unspecified_value2")]]),
        10
    );
    assert_eq!(s.admitted(25, "example8", &[&[("key1", "value1")]]), 20);
    let metrics = s.metrics();
    for label in [
        "example8.key1_unspecified_value\"",
        "example8.key1_unspecified_value2\"",
        "example8.key1_value1\"",
    ] {
        assert!(metrics.contains(label), "{label}\n{metrics}");
    }
}

#[test]
fn example_9_wildcards_trailing_middle_and_multiple() {
    let s = Service::new(&[r#"
domain: example9
descriptors:
  - key: key1
    value: value*
    rate_limit:
      unit: minute
      requests_per_unit: 20
"#]);
    for v in ["value1", "value2", "valueXYZ"] {
        assert_eq!(
            s.limit("example9", &[("key1", v)]),
            Some((20, MINUTE_U)),
            "{v}"
        );
    }
    assert_eq!(s.limit("example9", &[("key1", "valu")]), None);
    // Each matching value has its own threshold (no share_threshold).
    assert_eq!(s.admitted(30, "example9", &[&[("key1", "valueA")]]), 20);
    assert_eq!(s.admitted(1, "example9", &[&[("key1", "valueB")]]), 1);
    let s = Service::new(&[r#"
domain: example9
descriptors:
  - key: path
    value: /api/*/action
    rate_limit:
      unit: minute
      requests_per_unit: 20
"#]);
    for (v, limited) in [
        ("/api/123/action", true),
        ("/api/user-id/action", true),
        ("/api/123/other", false),
    ] {
        assert_eq!(
            s.limit("example9", &[("path", v)]).is_some(),
            limited,
            "{v}"
        );
    }
    let s = Service::new(&[r#"
domain: example9
descriptors:
  - key: route
    value: /api/*/resource/*/action
    rate_limit:
      unit: minute
      requests_per_unit: 20
"#]);
    for (v, limited) in [
        ("/api/v1/resource/123/action", true),
        ("/api/v2/resource/456/action", true),
        ("/api/v1/other/123/action", false),
    ] {
        assert_eq!(
            s.limit("example9", &[("route", v)]).is_some(),
            limited,
            "{v}"
        );
    }
}

#[test]
fn example_10_value_to_metric_puts_request_values_in_metric_keys() {
    let s = Service::new(&[
        r#"
domain: example10
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit:
              unit: minute
              requests_per_unit: 60
"#,
        r#"
domain: example10_wildcard
descriptors:
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit:
              unit: minute
              requests_per_unit: 100
"#,
    ]);
    let get = [
        ("route", "api"),
        ("http_method", "GET"),
        ("subject_id", "123"),
    ];
    let post = [
        ("route", "web"),
        ("http_method", "POST"),
        ("subject_id", "456"),
    ];
    let wild = [
        ("user", "alice"),
        ("action", "readfile"),
        ("resource", "documents"),
    ];
    assert_eq!(s.limit("example10", &get), Some((60, MINUTE_U)));
    assert_eq!(s.limit("example10", &post), Some((60, MINUTE_U)));
    assert_eq!(s.limit("example10_wildcard", &wild), Some((100, MINUTE_U)));
    let metrics = s.metrics();
    for label in [
        "descriptor=\"example10.route_api.http_method_GET.subject_id\"",
        "descriptor=\"example10.route_web.http_method_POST.subject_id\"",
        "descriptor=\"example10_wildcard.user_alice.action_readfile.resource\"",
    ] {
        assert!(metrics.contains(label), "{label}\n{metrics}");
    }
}

#[test]
fn example_11_share_threshold_makes_wildcard_matches_share_one_counter() {
    let s = Service::new(&[r#"
domain: example11
descriptors:
  # With share_threshold: true, all files/* matches share the same threshold
  - key: files
    value: files/*
    share_threshold: true
    rate_limit:
      unit: hour
      requests_per_unit: 10

  # Without share_threshold, each files_no_share/* match has its own isolated threshold
  - key: files_no_share
    value: files_no_share/*
    share_threshold: false
    rate_limit:
      unit: hour
      requests_per_unit: 10
"#]);
    let d = "example11";
    assert_eq!(s.admitted(5, d, &[&[("files", "files/a.pdf")]]), 5);
    assert_eq!(s.admitted(5, d, &[&[("files", "files/b.csv")]]), 5);
    assert_eq!(
        s.admitted(1, d, &[&[("files", "files/c.txt")]]),
        0,
        "shared 10 spent"
    );
    assert_eq!(
        s.admitted(10, d, &[&[("files_no_share", "files_no_share/a.pdf")]]),
        10
    );
    assert_eq!(
        s.admitted(10, d, &[&[("files_no_share", "files_no_share/b.csv")]]),
        10
    );
    assert_eq!(s.limit(d, &[("files", "files/z")]), Some((10, HOUR_U)));
}
