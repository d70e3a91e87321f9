use super::*;
use crate::limiter::{MILLISECOND, SECOND};

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, "rules.toml")
}

fn error(text: &str) -> String {
    parse(text)
        .expect_err("config should be refused")
        .to_string()
}

#[test]
fn builtin_rules_parse_and_include_default() {
    let config = Config::load(None, &Overrides::default()).unwrap();
    let names: Vec<_> = config.rules.iter().map(|r| r.name.as_str()).collect();
    assert!(names.contains(&"default"));
    assert_eq!(config.server.http.to_string(), DEFAULT_HTTP);
    let api = config.rules.iter().find(|r| r.name == "api").unwrap();
    assert_eq!(api.limits.len(), 2);
}

#[test]
fn rule_fields_parse_with_defaults() {
    let c = parse(
        r#"
        [[rule]]
        name = "api"
        algorithm = "token_bucket"
        limit = 100
        period = "1s"
        "#,
    )
    .unwrap();
    let rule = &c.rules[0];
    assert_eq!(rule.scope, Scope::Global);
    assert_eq!(rule.max_wait, 0);
    assert_eq!(rule.limits[0].burst(), 100);
    assert_eq!(rule.limits[0].period(), SECOND);
}

#[test]
fn round_nice_defaults_to_zero_and_takes_a_nice_value_or_idle() {
    let rule = "[[rule]]\nname = \"a\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1s\"\n";
    assert_eq!(
        parse(rule).unwrap().cluster.round_nice,
        RoundNice::Nice(DEFAULT_ROUND_NICE)
    );
    assert_eq!(DEFAULT_ROUND_NICE, 0);
    let nicer = parse(&format!("[cluster]\nround_nice = 10\n{rule}")).unwrap();
    assert_eq!(nicer.cluster.round_nice, RoundNice::Nice(10));
    let idle = parse(&format!("[cluster]\nround_nice = \"idle\"\n{rule}")).unwrap();
    assert_eq!(idle.cluster.round_nice, RoundNice::Idle);
}

#[test]
fn reservation_bounds_default_and_parse() {
    let rule = "[[rule]]\nname = \"a\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1s\"\n";
    let c = parse(rule).unwrap();
    assert_eq!(c.server.reservation_timeout, Duration::from_secs(600));
    assert_eq!(c.server.max_reservations, 100_000);
    let c = parse(&format!(
        "[server]\nreservation_timeout = \"90s\"\nmax_reservations = 5\n{rule}"
    ))
    .unwrap();
    assert_eq!(c.server.reservation_timeout, Duration::from_secs(90));
    assert_eq!(c.server.max_reservations, 5);
    for (field, bad) in [
        ("reservation_timeout", "\"0s\""),
        ("reservation_timeout", "10"),
        ("max_reservations", "0"),
        ("max_reservations", "\"many\""),
    ] {
        assert!(
            error(&format!("[server]\n{field} = {bad}\n{rule}"))
                .contains(&format!("[server], field \"{field}\"")),
            "{field} = {bad}"
        );
    }
}

#[test]
fn check_slice_takes_microseconds_or_any_duration_within_what_linux_accepts() {
    let rule = "[[rule]]\nname = \"a\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1s\"\n";
    let slice = |v: &str| {
        parse(&format!("[server]\ncheck_slice = {v}\n{rule}")).map(|c| c.server.check_slice)
    };
    assert_eq!(parse(rule).unwrap().server.check_slice, DEFAULT_CHECK_SLICE);
    assert_eq!(DEFAULT_CHECK_SLICE, Duration::from_micros(100));
    assert_eq!(slice("\"250us\"").unwrap(), Duration::from_micros(250));
    assert_eq!(slice("\"2ms\"").unwrap(), Duration::from_millis(2));
    assert_eq!(slice("\"100ms\"").unwrap(), Duration::from_millis(100));
    assert_eq!(slice("\"0ms\"").unwrap(), Duration::ZERO);
    assert_eq!(slice("\"0us\"").unwrap(), Duration::ZERO);
    for (bad, says) in [
        ("\"99us\"", "must be from \"100us\" to \"100ms\""),
        ("\"101ms\"", "must be from \"100us\" to \"100ms\""),
        ("\"1s\"", "must be from \"100us\" to \"100ms\""),
        ("\"us\"", "is not a duration"),
        ("\"1.5us\"", "is not a whole number of microseconds"),
        ("\"-5us\"", "is not a whole number of microseconds"),
        ("100", "must be a duration string"),
    ] {
        let e = slice(bad).unwrap_err().to_string();
        assert!(
            e.contains("[server], field \"check_slice\": ") && e.contains(says),
            "check_slice = {bad}: {e}"
        );
    }
}

#[test]
fn composite_rule_parses_each_limit() {
    let c = parse(
        r#"
        [[rule]]
        name = "hybrid"
        scope = "local"
        [[rule.limits]]
        algorithm = "token_bucket"
        limit = 10
        period = "1s"
        burst = 20
        [[rule.limits]]
        algorithm = "sliding_window_log"
        limit = 300
        period = "1m"
        "#,
    )
    .unwrap();
    let rule = &c.rules[0];
    assert_eq!(rule.scope, Scope::Local);
    assert_eq!(rule.limits[0].burst(), 20);
    assert_eq!(rule.limits[1].algorithm(), Algorithm::SlidingWindowLog);
}

#[test]
fn errors_name_file_rule_and_field() {
    let e = error(
        r#"
        [[rule]]
        name = "api"
        algorithm = "token_bucket"
        limit = 0
        period = "1s"
        "#,
    );
    assert_eq!(
        e,
        "rules.toml: rule \"api\", field \"limit\": must be at least 1, got 0"
    );
}

#[test]
fn errors_for_each_bad_field() {
    let rule = |body: &str| format!("[[rule]]\nname = \"r\"\n{body}");
    let cases = [
        (
            rule("algorithm = \"gcra\"\nlimit = 1\nperiod = \"1s\""),
            "field \"algorithm\": unknown algorithm \"gcra\"",
        ),
        (
            rule("limit = 1\nperiod = \"1s\""),
            "field \"algorithm\": is required",
        ),
        (
            rule("algorithm = \"token_bucket\"\nperiod = \"1s\""),
            "field \"limit\": is required",
        ),
        (
            rule("algorithm = \"token_bucket\"\nlimit = 1.5\nperiod = \"1s\""),
            "field \"limit\": must be a whole number",
        ),
        (
            rule("algorithm = \"token_bucket\"\nlimit = 1"),
            "field \"period\": is required",
        ),
        (
            rule("algorithm = \"token_bucket\"\nlimit = 1\nperiod = \"1 sec\""),
            "field \"period\": \"1 sec\" is not a duration",
        ),
        (
            rule("algorithm = \"token_bucket\"\nlimit = 1\nperiod = \"0s\""),
            "field \"period\": period must be between",
        ),
        (
            rule("algorithm = \"token_bucket\"\nlimit = 1\nperiod = \"1s\"\nburst = 0"),
            "field \"burst\": must be at least 1",
        ),
        (
            rule("algorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1s\"\nburst = 5"),
            "field \"burst\": burst applies only",
        ),
        (
            rule("algorithm = \"sliding_window_log\"\nlimit = 1000000\nperiod = \"1s\""),
            "field \"limit\": sliding_window_log keeps one entry",
        ),
        (
            rule("algorithm = \"token_bucket\"\nlimit = 1\nperiod = \"1s\"\nscope = \"cluster\""),
            "field \"scope\": must be \"global\" or \"local\"",
        ),
        (
            rule("algorithm = \"token_bucket\"\nlimit = 1\nperiod = \"1s\"\nmax_wait = \"1s\""),
            "field \"max_wait\": only a leaky_bucket shapes",
        ),
        (
            rule("algorithm = \"token_bucket\"\nlimit = 1\nperiod = \"1s\"\nlimt = 3"),
            "field \"limt\": unknown field",
        ),
        (
            rule(
                "algorithm = \"token_bucket\"\nlimit = 1\nperiod = \"1s\"\n[[rule.limits]]\nalgorithm = \"token_bucket\"\nlimit = 1\nperiod = \"1s\"",
            ),
            "field \"algorithm\": a rule with [[rule.limits]]",
        ),
        (
            rule(
                "[[rule.limits]]\nalgorithm = \"token_bucket\"\nlimit = 1\nperiod = \"1s\"\nbrust = 2",
            ),
            "field \"limits[0].brust\": unknown field",
        ),
    ];
    for (text, expected) in cases {
        let e = error(&text);
        assert!(e.starts_with("rules.toml: rule \"r\", "), "{e}");
        assert!(e.contains(expected), "expected {expected:?} in {e:?}");
    }
}

#[test]
fn errors_outside_rules() {
    assert!(error("").contains("at least one [[rule]] is required"));
    assert!(
        error("[[rule]]\nalgorithm = \"token_bucket\"")
            .contains("rule #1 (unnamed), field \"name\": is required")
    );
    assert!(error("[[rule]]\nname = \"a b\"").contains("field \"name\": must be 1 to 64"));
    let two = "[[rule]]\nname = \"a\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1s\"\n";
    assert!(error(&format!("{two}{two}")).contains("rule \"a\", field \"name\": defined twice"));
    let ok_rule =
        "[[rule]]\nname = \"a\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1s\"\n";
    assert!(
        error(&format!("[server]\nhttp = \"localhost\"\n{ok_rule}"))
            .contains("[server], field \"http\"")
    );
    assert!(
        error(&format!("[server]\nmax_keys = 0\n{ok_rule}"))
            .contains("[server], field \"max_keys\"")
    );
    assert!(
        error(&format!("[cluster]\nseeds = [\"nohost\"]\n{ok_rule}"))
            .contains("[cluster], field \"seeds\"")
    );
    for bad in ["-1", "20", "\"low\"", "\"IDLE\"", "1.5"] {
        assert!(
            error(&format!("[cluster]\nround_nice = {bad}\n{ok_rule}"))
                .contains("[cluster], field \"round_nice\": must be an integer from 0"),
            "round_nice = {bad}"
        );
    }
    assert!(
        error(&format!("typo = 1\n{ok_rule}")).contains("field \"typo\": unknown top-level field")
    );
    assert!(error("[[rule]\nname=").starts_with("rules.toml: not valid TOML"));
}

#[test]
fn overrides_win_over_the_file() {
    let text = r#"
        [server]
        http = "127.0.0.1:1"
        node_id = "file"
        [cluster]
        seeds = ["a:1"]
        [[rule]]
        name = "a"
        algorithm = "leaky_bucket"
        limit = 1
        period = "250ms"
        max_wait = "2s"
    "#;
    let mut c = parse(text).unwrap();
    assert_eq!(c.rules[0].max_wait, 2 * SECOND);
    assert_eq!(c.rules[0].limits[0].period(), 250 * MILLISECOND);
    c.apply(&Overrides {
        http: Some("127.0.0.1:2".parse().unwrap()),
        node_id: Some("flag".into()),
        seeds: Some(vec!["b:2".into(), "c:3".into()]),
        ..Overrides::default()
    });
    assert_eq!(c.server.http.port(), 2);
    assert_eq!(c.server.node_id, "flag");
    assert_eq!(c.cluster.seeds, ["b:2", "c:3"]);
}

#[test]
fn documented_example_configs_are_valid() {
    for (name, text) in [
        ("tiers.toml", include_str!("../../docs/examples/tiers.toml")),
        (
            "hybrid.toml",
            include_str!("../../docs/examples/hybrid.toml"),
        ),
    ] {
        let config = parse(text).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(!config.rules.is_empty());
    }
    let tiers = parse(include_str!("../../docs/examples/tiers.toml")).unwrap();
    let per_minute: Vec<_> = tiers.rules[..3]
        .iter()
        .map(|r| (r.limits[0].limit(), r.limits[0].burst()))
        .collect();
    assert_eq!(per_minute, [(60, 60), (600, 600), (6000, 6000)]);
}

/// `[cluster] exchange`: the full mesh by default; the tree splits on a partition, refuses
/// `hold`, and runs only global rules of one fixed-window limit (checked with clustering
/// on, naming the rule and field).
#[test]
fn the_tree_exchange_runs_single_fixed_windows_and_splits() {
    let cluster = |extra: &str| format!("[cluster]\ngossip = \"127.0.0.1:7946\"\n{extra}\n");
    let window =
        "[[rule]]\nname = \"w\"\nalgorithm = \"fixed_window\"\nlimit = 10\nperiod = \"1s\"\n";
    let mesh = parse(&format!("{}{window}", cluster(""))).unwrap();
    assert_eq!(
        (mesh.cluster.exchange, mesh.cluster.on_partition),
        (ExchangeMode::Mesh, OnPartition::Hold)
    );
    let tree = parse(&format!("{}{window}", cluster("exchange = \"tree\""))).unwrap();
    assert_eq!(
        (tree.cluster.exchange, tree.cluster.on_partition),
        (ExchangeMode::Tree, OnPartition::Split)
    );
    tree.check_cluster("rules.toml").unwrap();
    let hold = error(&format!(
        "{}{window}",
        cluster("exchange = \"tree\"\non_partition = \"hold\"")
    ));
    assert!(
        hold.contains("[cluster], field \"on_partition\"") && hold.contains("has no \"hold\""),
        "{hold}"
    );
    let bad = error(&format!("{}{window}", cluster("exchange = \"ring\"")));
    assert!(bad.contains("must be \"mesh\" or \"tree\""), "{bad}");
    let refused = |rules: &str| {
        parse(&format!("{}{rules}", cluster("exchange = \"tree\"")))
            .unwrap()
            .check_cluster("rules.toml")
            .unwrap_err()
            .to_string()
    };
    let bucket = refused(
        "[[rule]]\nname = \"b\"\nalgorithm = \"token_bucket\"\nlimit = 10\nperiod = \"1s\"\n",
    );
    assert!(
        bucket.contains("rules.toml") && bucket.contains("rule \"b\", field \"algorithm\""),
        "{bucket}"
    );
    let composite = refused(
        "[[rule]]\nname = \"c\"\n[[rule.limits]]\nalgorithm = \"fixed_window\"\nlimit = 10\nperiod = \"1s\"\n[[rule.limits]]\nalgorithm = \"fixed_window\"\nlimit = 100\nperiod = \"1m\"\n",
    );
    assert!(
        composite.contains("rule \"c\", field \"limits\""),
        "{composite}"
    );
    let day = refused(
        "[[rule]]\nname = \"d\"\nalgorithm = \"fixed_window\"\nlimit = 10\nperiod = \"1d\"\n",
    );
    assert!(
        day.contains("rule \"d\", field \"period\"") && day.contains("at most 1m"),
        "{day}"
    );
    parse(&format!(
        "{}[[rule]]\nname = \"m\"\nalgorithm = \"fixed_window\"\nlimit = 10\nperiod = \"1m\"\n",
        cluster("exchange = \"tree\"")
    ))
    .unwrap()
    .check_cluster("rules.toml")
    .unwrap();
    // A local rule may be anything.
    let local = "[[rule]]\nname = \"l\"\nscope = \"local\"\nalgorithm = \"token_bucket\"\nlimit = 10\nperiod = \"1s\"\n";
    parse(&format!(
        "{}{window}{local}",
        cluster("exchange = \"tree\"")
    ))
    .unwrap()
    .check_cluster("rules.toml")
    .unwrap();
}
