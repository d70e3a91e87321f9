use super::*;

fn err(yaml: &str) -> String {
    parse(yaml, "f.yaml").unwrap_err().to_string()
}

#[test]
fn a_domain_with_nested_descriptors_parses() {
    let d = parse(
        "domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  - key: to_number
    shadow_mode: true
    rate_limit:
      unit: Day
      requests_per_unit: 100
      name: per_number
      algorithm: sliding_window_counter
  - key: ldap
    rate_limit:
      unlimited: true
      replaces:
        - name: per_number
",
        "f.yaml",
    )
    .unwrap();
    assert_eq!(d.name, "messaging");
    assert_eq!(d.descriptors.len(), 3);
    let nested = &d.descriptors[0].descriptors[0];
    assert_eq!(nested.key, "to_number");
    let q = nested.rate_limit.as_ref().unwrap().limit.unwrap();
    assert_eq!(
        (q.requests_per_unit, q.unit, q.algorithm),
        (5, Unit::Day, Algorithm::FixedWindow)
    );
    let second = &d.descriptors[1];
    assert!(second.shadow_mode);
    let rl = second.rate_limit.as_ref().unwrap();
    assert_eq!(rl.name.as_deref(), Some("per_number"));
    assert_eq!(rl.limit.unwrap().algorithm, Algorithm::SlidingWindowCounter);
    let ldap = d.descriptors[2].rate_limit.as_ref().unwrap();
    assert_eq!(ldap.limit, None);
    assert_eq!(ldap.replaces, ["per_number"]);
    let names: Vec<String> = rules(&[d]).into_iter().map(|r| r.name).collect();
    assert_eq!(
        names,
        [
            "rls.fixed_window.5.day",
            "rls.sliding_window_counter.100.day"
        ]
    );
}

#[test]
fn units_have_envoyproxy_ratelimit_lengths_and_proto_numbers() {
    assert_eq!(Unit::Week.period(), 7 * 86_400 * SECOND);
    assert_eq!(Unit::Month.period(), 30 * 86_400 * SECOND);
    assert_eq!(Unit::Year.period(), 365 * 86_400 * SECOND);
    for u in Unit::ALL {
        assert_eq!(Unit::from_proto(u.proto()), Some(u));
        assert_eq!(Unit::from_name(&u.name().to_uppercase()), Some(u));
    }
    assert_eq!(Unit::from_proto(0), None);
    assert_eq!(Unit::from_proto(8), None);
}

#[test]
fn errors_name_file_domain_descriptor_path_and_field() {
    let cases = [
        (
            "domain: d\ndescriptors:\n  - key: a\n    value: b\n    descriptors:\n      - key: c\n        rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
            "f.yaml: domain \"d\", descriptor \"a=b > c\", field \"rate_limit.unit\": \"fortnight\" is not a unit",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limt: {unit: second, requests_per_unit: 1}\n",
            "f.yaml: domain \"d\", descriptor \"a\", field \"rate_limt\": unknown field",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: -1}\n",
            "field \"rate_limit.requests_per_unit\": must be a whole number from 0 to 4294967295, got -1",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second}\n",
            "field \"rate_limit.requests_per_unit\": is required",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, unit: second}\n",
            "field \"rate_limit.unit\": must not be set when unlimited is true",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 3}\n",
            "field \"rate_limit.burst\": unknown field",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: gcra}\n",
            "field \"rate_limit.algorithm\": must be one of token_bucket",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 20000, algorithm: sliding_window_log}\n",
            "field \"rate_limit.requests_per_unit\": sliding_window_log keeps one entry",
        ),
        (
            "domain: d\ndescriptors:\n  - value: x\n",
            "f.yaml: domain \"d\", descriptor \"#1\", field \"key\": is required",
        ),
        (
            "domain: d\ndescriptors:\n  - key: ''\n",
            "descriptor \"#1\", field \"key\": must not be empty",
        ),
        ("descriptors: []\n", "f.yaml: field \"domain\": is required"),
        (
            "domain: ''\n",
            "f.yaml: field \"domain\": must be a non-empty string",
        ),
        ("domain: d\nextra: 1\n", "field \"extra\": unknown field"),
        (
            "domain: d\ndescriptors:\n  - key: a\n  - key: a\n",
            "f.yaml: domain \"d\", descriptor \"a\": defined twice",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    quota_mode: true\n",
            "field \"quota_mode\": quota_mode is not supported",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    value: x\n    share_threshold: true\n",
            "field \"share_threshold\": applies only to a value with a '*' wildcard",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {name: n, replaces: [{name: n}], unit: second, requests_per_unit: 1}\n",
            "field \"rate_limit.replaces\": \"n\" is this limit's own name",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    shadow_mode: yes please\n",
            "field \"shadow_mode\": must be true or false",
        ),
        ("domain: [d\n", "f.yaml: not valid YAML"),
        ("", "f.yaml: the file is empty"),
        ("- a\n", "f.yaml: must be a mapping"),
    ];
    for (yaml, expected) in cases {
        let message = err(yaml);
        assert!(
            message.contains(expected),
            "{yaml:?}\n  got {message}\n  expected {expected}"
        );
    }
}

#[test]
fn a_directory_is_read_in_name_order_and_a_domain_may_appear_once() {
    let dir = std::env::temp_dir().join(format!("gossamer-rls-config-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("b.yaml"), "domain: b\n").unwrap();
    std::fs::write(dir.join("a.yml"), "domain: a\n").unwrap();
    std::fs::write(dir.join("notes.txt"), "not yaml").unwrap();
    std::fs::write(dir.join(".hidden.yaml"), "domain: [broken").unwrap();
    let names: Vec<String> = load(&dir).unwrap().into_iter().map(|d| d.name).collect();
    assert_eq!(names, ["a", "b"]);
    std::fs::write(dir.join("c.yaml"), "domain: a\n").unwrap();
    let e = load(&dir).unwrap_err().to_string();
    assert!(
        e.contains("c.yaml: domain \"a\": defined twice (also in"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
    let e = load(&dir).unwrap_err().to_string();
    assert!(e.contains("cannot read"), "{e}");
}
