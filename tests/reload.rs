//! Hot reload, end to end: the real binary, its config file rewritten (in place, or the way a
//! Kubernetes ConfigMap volume swaps its `..data` symlink), SIGHUP, and what the node answers
//! afterwards. Every wait polls with a deadline; every child is killed by a guard.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_gossamer");
const DEADLINE: Duration = Duration::from_secs(15);

/// A temp directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("gossamer-reload-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("temp dir");
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Replaces `path`'s content atomically (write a sibling, rename), so the poller never reads
/// half a file.
fn write_config(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write config");
    std::fs::rename(&tmp, path).expect("rename config");
}

fn free_port() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind port 0");
    listener.local_addr().expect("local addr").port()
}

/// A `gossamer serve`, killed on drop.
struct Node {
    child: Child,
    port: u16,
    /// Where its stderr (the log) goes.
    log: PathBuf,
}

impl Node {
    fn start(config: &Path, extra: &[&str]) -> Node {
        let port = free_port();
        let log = config.with_extension("log");
        let stderr = std::fs::File::create(&log).expect("log file");
        let mut command = Command::new(BIN);
        for (var, _) in std::env::vars() {
            if var.starts_with("GOSSAMER_") || var == "RUST_LOG" {
                command.env_remove(var);
            }
        }
        let child = command
            .args(["serve", "--config"])
            .arg(config)
            .args(["--http", &format!("127.0.0.1:{port}")])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("serve starts");
        let mut node = Node { child, port, log };
        node.until("the node is ready", |n| {
            n.request("GET", "/readyz", "")
                .is_some_and(|(s, _)| s == 200)
        });
        node
    }

    /// One HTTP/1.1 request; the status and body, or `None` if nothing answers.
    fn request(&self, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
        let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).ok()?;
        let status = response.split(' ').nth(1)?.parse().ok()?;
        Some((status, response.split_once("\r\n\r\n")?.1.to_owned()))
    }

    /// A check's status and body as JSON.
    fn check(&self, rule: &str, cost: u64) -> (u16, serde_json::Value) {
        let body = format!(r#"{{"rule":"{rule}","key":"k","cost":{cost}}}"#);
        let (status, body) = self.request("POST", "/v1/check", &body).expect("answers");
        (status, serde_json::from_str(&body).expect("JSON body"))
    }

    /// The value of a metric sample (the whole line up to the value), 0 when absent.
    fn metric(&self, sample: &str) -> f64 {
        let (_, text) = self.request("GET", "/metrics", "").expect("metrics");
        text.lines()
            .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0.0)
    }

    fn reloads(&self) -> (f64, f64) {
        (
            self.metric("gossamer_config_reloads_total{result=\"ok\"}"),
            self.metric("gossamer_config_reloads_total{result=\"error\"}"),
        )
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn hangup(&self) {
        let status = Command::new("sh")
            .args(["-c", "kill -HUP \"$0\"", &self.child.id().to_string()])
            .status()
            .expect("sh runs");
        assert!(status.success(), "kill -HUP failed");
    }

    /// Polls `done` until it holds, failing after [`DEADLINE`] or if the node exits.
    fn until(&mut self, what: &str, done: impl Fn(&Node) -> bool) {
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                panic!("the node exited ({status}) while waiting for: {what}");
            }
            if done(self) {
                return;
            }
            assert!(Instant::now() < deadline, "timed out waiting for: {what}");
            thread::sleep(Duration::from_millis(25));
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Token buckets refilling 1 per hour or slower: within a test, spent is spent.
fn rules(changed_limit: u64, with_added: bool) -> String {
    let mut text = format!(
        r#"
[[rule]]
name = "kept"
algorithm = "token_bucket"
limit = 2
period = "1h"

[[rule]]
name = "changed"
algorithm = "token_bucket"
limit = {changed_limit}
period = "1h"

[[rule]]
name = "removed-later"
algorithm = "token_bucket"
limit = 1
period = "1h"
"#
    );
    if with_added {
        text = text.replace("removed-later", "added");
    }
    text
}

#[test]
fn sighup_reloads_rules_keeping_unchanged_counts_and_refuses_an_invalid_file() {
    let dir = TempDir::new();
    let path = dir.0.join("gossamer.toml");
    write_config(&path, &rules(1, false));
    let mut node = Node::start(&path, &[]);
    assert_eq!(node.check("kept", 2).0, 200);
    assert_eq!(node.check("kept", 1).0, 429);
    assert_eq!(node.check("changed", 1).0, 200);
    assert_eq!(node.check("changed", 1).0, 429);

    write_config(&path, &rules(5, true));
    node.hangup();
    node.until("the new limit is served", |n| n.check("added", 1).0 == 200);
    assert!(node.reloads().0 >= 1.0);
    // Its limit (and burst) went from 1 to 5: the 1 spent carries over, 4 are left.
    let (status, body) = node.check("changed", 4);
    assert_eq!(status, 200, "a relimited rule keeps what was spent: {body}");
    assert_eq!(body["limit"], 5);
    let (status, body) = node.check("changed", 1);
    assert_eq!(status, 429, "and no more: {body}");
    let (status, body) = node.check("kept", 1);
    assert_eq!(status, 429, "an unchanged rule keeps its counts: {body}");
    assert_eq!(
        node.metric("gossamer_checks_total{rule=\"kept\",outcome=\"denied\"}"),
        2.0,
        "and its metrics"
    );
    let (status, body) = node.check("removed-later", 1);
    assert_eq!(
        (status, body["error"].as_str()),
        (404, Some("unknown_rule"))
    );

    // A bad file: refused, counted, and the running rules stay.
    let errors_before = node.reloads().1;
    write_config(&path, &rules(5, true).replace("limit = 2", "limit = 0"));
    node.hangup();
    // Counted, and logged naming the file, the rule and the field.
    let place = format!("{}: rule \"kept\", field \"limit\"", path.display());
    node.until("the refused reload is counted and logged", |n| {
        n.reloads().1 > errors_before && n.log().contains(&place)
    });
    let (status, body) = node.check("changed", 1);
    assert_eq!(status, 429, "still the old rules: {body}");
    assert_eq!(body["limit"], 5);
    assert!(node.log().contains("config reload refused"));

    // SIGHUP alone: the file made valid again and picked up by the poller first, so that
    // only the signal can reload it once more.
    let ok_before = node.reloads().0;
    write_config(&path, &rules(5, true));
    node.until("the poller loads the valid file", |n| {
        n.reloads().0 > ok_before
    });
    let ok_before = node.reloads().0;
    node.hangup();
    node.until("SIGHUP reloads an unchanged file", |n| {
        n.reloads().0 > ok_before
    });
    assert_eq!(
        node.check("kept", 1).0,
        429,
        "nothing changed, nothing reset"
    );
}

/// A ConfigMap volume: `gossamer.toml -> ..data/gossamer.toml`, `..data -> ..<version>`;
/// an update writes a new version directory and swaps `..data` atomically.
#[test]
fn a_configmap_style_symlink_swap_is_picked_up_without_a_signal() {
    use std::os::unix::fs::symlink;
    let dir = TempDir::new();
    let version = |n: u32, text: &str| {
        let v = dir.0.join(format!("..v{n}"));
        std::fs::create_dir_all(&v).expect("version dir");
        std::fs::write(v.join("gossamer.toml"), text).expect("write");
        let tmp = dir.0.join("..data_tmp");
        let _ = std::fs::remove_file(&tmp);
        symlink(format!("..v{n}"), &tmp).expect("symlink");
        std::fs::rename(&tmp, dir.0.join("..data")).expect("swap ..data");
    };
    version(1, &rules(1, false));
    let path = dir.0.join("gossamer.toml");
    symlink("..data/gossamer.toml", &path).expect("symlink");
    let mut node = Node::start(&path, &[]);
    assert_eq!(node.check("changed", 1).0, 200);
    assert_eq!(node.check("changed", 1).0, 429);

    version(2, &rules(3, true));
    node.until("the swapped file is loaded", |n| {
        n.check("added", 1).0 == 200
    });
    // 1 of the old 1 spent, 2 of the new 3 left.
    let (status, body) = node.check("changed", 2);
    assert_eq!((status, body["limit"].as_u64()), (200, Some(3)));
    assert_eq!(node.check("changed", 1).0, 429);
    assert_eq!(node.reloads(), (1.0, 0.0));
    assert!(
        node.metric("gossamer_config_last_reload_success_timestamp_seconds") > 1.6e9,
        "a Unix time"
    );
}

/// A clustered node's config: global rule `g` (`algorithm`, `global_limit` per hour) and
/// local rule `l`.
fn clustered_config(algorithm: &str, global_limit: u64, local_limit: u64) -> String {
    format!(
        r#"
[[rule]]
name = "g"
algorithm = "{algorithm}"
limit = {global_limit}
period = "1h"
scope = "global"

[[rule]]
name = "l"
algorithm = "token_bucket"
limit = {local_limit}
period = "1h"
scope = "local"
"#
    )
}

fn udp_port() -> String {
    let socket = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("udp port 0");
    format!("127.0.0.1:{}", socket.local_addr().expect("addr").port())
}

/// `GET /v1/cluster` as JSON.
fn cluster_view(n: &Node) -> Option<serde_json::Value> {
    let (_, body) = n.request("GET", "/v1/cluster", "")?;
    serde_json::from_str(&body).ok()
}

/// The numbers of global rule `g` a node has in force (`limits_in_force`), and those the member
/// `node_id` publishes, as `[limit, burst]`.
fn g_numbers(n: &Node, node_id: &str) -> (Option<serde_json::Value>, Option<serde_json::Value>) {
    let Some(v) = cluster_view(n) else {
        return (None, None);
    };
    let member = v["members"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["node_id"] == node_id))
        .map(|m| m["limits"]["g"][0].clone());
    (Some(v["limits_in_force"]["g"][0].clone()), member)
}

#[test]
fn a_clustered_node_relimits_global_rules_refuses_other_changes_and_reloads_local_ones() {
    let dir = TempDir::new();
    let path = dir.0.join("gossamer.toml");
    write_config(&path, &clustered_config("token_bucket", 2, 1));
    let gossip = udp_port();
    let mut node = Node::start(&path, &["--gossip", &gossip, "--node-id", "solo"]);
    let own_hash = |n: &Node| -> Option<String> {
        let v = cluster_view(n)?;
        let me = v["members"]
            .as_array()?
            .iter()
            .find(|m| m["self"] == true)?;
        me["rules_hash"].as_str().map(str::to_owned)
    };
    node.until("the node publishes its rules hash", |n| {
        own_hash(n).is_some()
    });
    let started_with = own_hash(&node);

    // A changed algorithm needs a restart.
    write_config(&path, &clustered_config("fixed_window", 2, 1));
    node.hangup();
    node.until("the refused reload is counted and logged", |n| {
        n.reloads().1 >= 1.0
            && n.log()
                .contains("changing global rules in a cluster needs a (rolling) restart: \"g\"")
    });
    let (_, body) = node.check("g", 1);
    assert_eq!(body["limit"], 2, "the global rule is unchanged: {body}");

    // Its numbers change in place: a cluster of one is in force at once.
    write_config(&path, &clustered_config("token_bucket", 20, 1));
    node.hangup();
    // The numbers are in force before the reload's own log line is written: wait for both.
    node.until(
        "the global rule is relimited, and the reload says so",
        |n| n.check("g", 1).1["limit"] == 20 && n.log().contains("relimited=[\"g\"]"),
    );

    write_config(&path, &clustered_config("token_bucket", 20, 4));
    node.hangup();
    node.until("the local rule is reloaded", |n| n.check("l", 4).0 == 200);
    assert_eq!(node.check("g", 1).1["limit"], 20);
    // Peers compare rules by the published hash: it follows the reload.
    node.until("the rules hash in gossip follows the reload", |n| {
        own_hash(n).is_some_and(|h| Some(&h) != started_with.as_ref())
    });
}

/// Two clustered nodes `a` and `b`, each started with its own copy of `config` (whose global
/// rule `g` has a limit of 100), once `a` sees `b`'s numbers.
fn clustered_pair(path_a: &Path, path_b: &Path, config: &str) -> (Node, Node) {
    write_config(path_a, config);
    write_config(path_b, config);
    let (gossip_a, gossip_b) = (udp_port(), udp_port());
    let mut a = Node::start(path_a, &["--gossip", &gossip_a, "--node-id", "a"]);
    let b = Node::start(
        path_b,
        &[
            "--gossip",
            &gossip_b,
            "--node-id",
            "b",
            "--seeds",
            &gossip_a,
        ],
    );
    let hundred = Some(serde_json::json!([100, 100]));
    a.until("a sees b's numbers", |n| g_numbers(n, "b").1 == hundred);
    (a, b)
}

/// Two clustered nodes, each with its own file: a raise is in force once both have it, a cut
/// as soon as either has it, and each node shows the other's numbers in `/v1/cluster`.
#[test]
fn clustered_nodes_run_the_smaller_of_their_limits() {
    let dir = TempDir::new();
    let (path_a, path_b) = (dir.0.join("a.toml"), dir.0.join("b.toml"));
    let (mut a, mut b) =
        clustered_pair(&path_a, &path_b, &clustered_config("fixed_window", 100, 1));
    let pair = |l: u64| Some(serde_json::json!([l, l]));

    write_config(&path_a, &clustered_config("fixed_window", 300, 1));
    a.hangup();
    b.until("b hears a's new numbers", |n| {
        g_numbers(n, "a").1 == pair(300)
    });
    for n in [&a, &b] {
        assert_eq!(g_numbers(n, "a").0, pair(100), "a raise at one node only");
        assert_eq!(n.check("g", 1).1["limit"], 100);
    }
    write_config(&path_b, &clustered_config("fixed_window", 300, 1));
    b.hangup();
    for n in [&mut a, &mut b] {
        n.until("the raise is in force once both have it", |n| {
            g_numbers(n, "a").0 == pair(300)
        });
        assert_eq!(n.check("g", 1).1["limit"], 300);
    }
    // A cut at one node is in force at both.
    write_config(&path_a, &clustered_config("fixed_window", 50, 1));
    a.hangup();
    for n in [&mut a, &mut b] {
        n.until("a cut at one node is in force at both", |n| {
            g_numbers(n, "a").0 == pair(50)
        });
    }
    assert_eq!(b.check("g", 1).1["limit"], 50);
    assert!(
        b.metric("gossamer_cluster_members_on_other_limits{published=\"differ\"}") == 1.0,
        "b counts a as on other limits"
    );
}

/// Two clustered nodes, each with its own file: a global rule added to one file is served by
/// that node at once and counted with the other's once it has the rule too (a fixed window
/// of 10 an hour holds 10 across both nodes, where two local counts would admit 20); removed
/// from one file, that node no longer serves it while the other still does.
#[test]
fn clustered_nodes_add_and_remove_a_global_rule_live() {
    let dir = TempDir::new();
    let (path_a, path_b) = (dir.0.join("a.toml"), dir.0.join("b.toml"));
    let base = clustered_config("fixed_window", 100, 1);
    let added = format!(
        "{base}
[[rule]]
name = \"new\"
algorithm = \"fixed_window\"
limit = 10
period = \"1h\"
scope = \"global\"
"
    );
    let (mut a, mut b) = clustered_pair(&path_a, &path_b, &base);

    let converged = |n: &Node| n.log().matches("the cluster has converged").count();
    let converged_before = (converged(&a), converged(&b));
    write_config(&path_a, &added);
    a.hangup();
    a.until("a serves the added rule and says so", |n| {
        n.check("new", 1).0 == 200 && n.log().contains("added=[\"new\"]")
    });
    assert_eq!(b.check("new", 1).0, 404, "b does not have it yet");
    let differ = "gossamer_cluster_members_on_other_limits{published=\"differ\"}";
    b.until("b counts a as on other rules", |n| n.metric(differ) == 1.0);
    assert!(
        !a.log().contains("config reload refused"),
        "adding a global rule is not refused: {}",
        a.log()
    );
    write_config(&path_b, &added);
    b.hangup();
    b.until("b serves the added rule", |n| n.check("new", 1).0 == 200);
    a.until("a logs that the nodes converged on the same rules", |n| {
        n.metric(differ) == 0.0 && converged(n) > converged_before.0
    });
    b.until("b logs that the nodes converged on the same rules", |n| {
        n.metric(differ) == 0.0 && converged(n) > converged_before.1
    });
    // Both count it: 15 more checks at each node, two rounds apart at most.
    let mut admitted = 2;
    for _ in 0..15 {
        for n in [&a, &b] {
            let (status, body) = n.check("new", 1);
            assert!(status == 200 || status == 429, "{status} {body}");
            admitted += u64::from(body["allowed"] == true);
        }
        thread::sleep(Duration::from_millis(20));
    }
    println!("admitted {admitted} of 32 checks across the two nodes");
    assert!(
        admitted <= 10,
        "{admitted} admitted across the two nodes against a global limit of 10"
    );
    let in_force = cluster_view(&a).expect("cluster view")["limits_in_force"]["new"][0].clone();
    assert_eq!(in_force, serde_json::json!([10, 10]));

    write_config(&path_a, &base);
    a.hangup();
    a.until("a no longer serves the removed rule", |n| {
        n.check("new", 1).0 == 404 && n.log().contains("removed=[\"new\"]")
    });
    assert_ne!(b.check("new", 1).0, 404, "b still serves it");
}
