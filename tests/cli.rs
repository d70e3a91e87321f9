//! Black-box tests of the `gossamer` binary: flags, `config check`, `serve` and `check`, exit
//! codes, and shutdown on SIGTERM. Every child process is bounded in time and killed by a
//! guard if a test fails, so no test leaves a process behind.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_gossamer");

#[path = "support/env.rs"]
mod env;
use env::GOSSAMER_ENV;

fn gossamer() -> Command {
    let mut command = Command::new(BIN);
    for var in GOSSAMER_ENV {
        command.env_remove(var);
    }
    command
}

/// Runs `command` to completion, killing it (and failing) if it takes longer than `limit`.
fn run_bounded(mut command: Command, limit: Duration) -> Output {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    let mut stdout = child.stdout.take().expect("stdout is piped");
    let mut stderr = child.stderr.take().expect("stderr is piped");
    let out = thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stdout.read_to_end(&mut buf);
        buf
    });
    let err = thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stderr.read_to_end(&mut buf);
        buf
    });
    let status = wait_bounded(&mut child, limit).unwrap_or_else(|| {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{command:?} did not finish within {limit:?}");
    });
    Output {
        status,
        stdout: out.join().expect("stdout reader"),
        stderr: err.join().expect("stderr reader"),
    }
}

/// Polls `child` until it exits or `limit` passes.
fn wait_bounded(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

fn run(args: &[&str]) -> Output {
    let mut command = gossamer();
    command.args(args);
    run_bounded(command, Duration::from_secs(10))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A file under the temp dir with a unique name, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(contents: &str) -> TempFile {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("gossamer-cli-test-{}-{n}.toml", std::process::id()));
        std::fs::write(&path, contents).expect("temp file is written");
        TempFile(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }

    fn arg(&self) -> &str {
        self.0.to_str().expect("temp path is UTF-8")
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

const GOOD_CONFIG: &str = r#"
[[rule]]
name = "login"
algorithm = "fixed_window"
limit = 5
period = "1m"

[[rule]]
name = "api"
[[rule.limits]]
algorithm = "token_bucket"
limit = 10
period = "1s"
burst = 20
[[rule.limits]]
algorithm = "sliding_window_log"
limit = 300
period = "1m"
"#;

const BAD_LIMIT: &str = r#"
[[rule]]
name = "login"
algorithm = "fixed_window"
limit = 5
period = "1m"

[[rule]]
name = "api"
algorithm = "token_bucket"
limit = 0
period = "1s"
"#;

/// A port nothing listens on (bound to port 0, read, released).
fn free_port() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind port 0");
    listener.local_addr().expect("local addr").port()
}

/// A minimal HTTP/1.1 GET; the status code and body, or `None` if nothing answers.
fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split(' ').nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n")?.1.to_owned();
    Some((status, body))
}

/// A running `gossamer serve`, killed on drop unless it already exited.
struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn start(mut command: Command, port: u16) -> Server {
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("serve starts");
        let mut server = Server { child, port };
        server.wait_healthy();
        server
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn wait_healthy(&mut self) {
        for _ in 0..100 {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                panic!("serve exited early with {status}");
            }
            if let Some((200, _)) = http_get(self.port, "/healthz") {
                return;
            }
            thread::sleep(Duration::from_millis(50));
        }
        panic!("serve never answered /healthz on port {}", self.port);
    }

    /// Sends SIGTERM and waits (bounded) for the exit status.
    fn terminate(&mut self) -> ExitStatus {
        // The shell's built-in kill: /bin/kill (procps) is not on every minimal image.
        let status = Command::new("sh")
            .args(["-c", "kill -TERM \"$0\"", &self.child.id().to_string()])
            .status()
            .expect("sh runs");
        assert!(status.success(), "kill -TERM failed");
        wait_bounded(&mut self.child, Duration::from_secs(15))
            .expect("serve exits within 15 s of SIGTERM")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn check(url: &str, rule: &str, key: &str, cost: u64) -> Output {
    run(&[
        "check",
        "--rule",
        rule,
        "--key",
        key,
        "--cost",
        &cost.to_string(),
        "--url",
        url,
    ])
}

fn json(bytes: &[u8]) -> serde_json::Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", text(bytes)))
}

#[test]
fn version_flag_prints_the_version_and_exits_0() {
    let out = run(&["--version"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        text(&out.stdout).trim(),
        format!("gossamer {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn help_flag_lists_the_subcommands_and_exits_0() {
    let out = run(&["--help"]);
    assert_eq!(out.status.code(), Some(0));
    let help = text(&out.stdout);
    for word in ["serve", "check", "config", "certs", "Usage"] {
        assert!(help.contains(word), "{word} missing from:\n{help}");
    }
}

/// `gossamer sim --tree` replays a seed of the aggregation tree's simulation and measures a
/// scaling point; the tree has no report of its own (the chaos report has its section).
#[test]
fn sim_tree_replays_a_seed_and_measures_a_point() {
    let mut replay = gossamer();
    replay.args(["sim", "--tree", "--seed", "3"]);
    let out = run_bounded(replay, Duration::from_secs(120));
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(stdout.starts_with("seed 3: "), "{stdout}");
    assert!(stdout.contains("faults stop"), "{stdout}");
    assert!(
        stdout.contains("tree: 1 seeds, 0 broke an invariant"),
        "{stdout}"
    );

    let mut point = gossamer();
    point.args(["sim", "--tree", "--scale", "4,3"]);
    let out = run_bounded(point, Duration::from_secs(120));
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.lines().any(|l| l.starts_with("| 4 | 3 | ")),
        "{stdout}"
    );

    let out = run(&["sim", "--tree", "--report", "/nonexistent/report.md"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
}

#[test]
fn unknown_subcommand_exits_2() {
    let out = run(&["frobnicate"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("frobnicate"));
}

#[test]
fn config_check_accepts_a_valid_file_and_lists_its_rules() {
    let file = TempFile::new(GOOD_CONFIG);
    let out = run(&["config", "check", file.arg()]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    assert_eq!(
        lines[0],
        format!("{}: ok, 2 rule(s)", file.path().display())
    );
    // One line per rule, in file order, with each of its limits.
    assert!(lines[1].starts_with("  login"), "{stdout}");
    assert!(lines[1].contains("fixed_window 5/1m"), "{stdout}");
    assert!(lines[2].starts_with("  api"), "{stdout}");
    assert!(lines[2].contains("token_bucket 10/1s burst 20"), "{stdout}");
    assert!(lines[2].contains("sliding_window_log 300/1m"), "{stdout}");
}

#[test]
fn config_check_rejects_a_bad_file_naming_the_file_rule_and_field() {
    let cases = [
        (BAD_LIMIT, "rule \"api\", field \"limit\""),
        (
            r#"
            [[rule]]
            name = "api"
            [[rule.limits]]
            algorithm = "token_bucket"
            limit = 10
            period = "1s"
            [[rule.limits]]
            algorithm = "sliding_window_log"
            limit = 300
            period = "soon"
            "#,
            "rule \"api\", field \"limits[1].period\"",
        ),
        (
            r#"
            [[rule]]
            name = "burst"
            algorithm = "fixed_window"
            limit = 10
            burst = 20
            period = "1s"
            "#,
            "rule \"burst\", field \"burst\"",
        ),
        (
            r#"
            [server]
            http = "nowhere"
            [[rule]]
            name = "a"
            algorithm = "token_bucket"
            limit = 1
            period = "1s"
            "#,
            "[server], field \"http\"",
        ),
    ];
    for (contents, place) in cases {
        let file = TempFile::new(contents);
        let out = run(&["config", "check", file.arg()]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{place}: {stderr}");
        assert!(stderr.contains(file.arg()), "file not named: {stderr}");
        assert!(stderr.contains(place), "{place} not named: {stderr}");
        assert!(out.stdout.is_empty(), "stdout: {}", text(&out.stdout));
    }
}

#[test]
fn config_check_rejects_invalid_toml_naming_the_file() {
    let file = TempFile::new("[[rule]\nname = ");
    let out = run(&["config", "check", file.arg()]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(file.arg()), "{stderr}");
    assert!(stderr.contains("not valid TOML"), "{stderr}");
}

#[test]
fn config_check_of_a_missing_file_exits_2() {
    let path = std::env::temp_dir().join(format!(
        "gossamer-cli-test-{}-does-not-exist.toml",
        std::process::id()
    ));
    let path = path.to_str().expect("UTF-8 path");
    let out = run(&["config", "check", path]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(path), "{stderr}");
    assert!(stderr.contains("cannot read"), "{stderr}");
}

/// `gossamer serve --config FILE` on a free port, for configs that must stop it at start.
fn serve_once(file: &TempFile) -> Output {
    let http = format!("127.0.0.1:{}", free_port());
    run(&["serve", "--config", file.arg(), "--http", &http])
}

#[test]
fn serve_with_a_bad_config_exits_2_naming_the_file_rule_and_field() {
    let file = TempFile::new(BAD_LIMIT);
    let out = serve_once(&file);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(file.arg()), "{stderr}");
    assert!(stderr.contains("rule \"api\", field \"limit\""), "{stderr}");
}

/// `exchange = "tree"` runs global rules of one fixed window of at most a minute only: a
/// clustered node with a global token bucket, `on_partition = "hold"`, or a day-long global
/// window, exits 2 at start naming the file, the rule or table, and the field.
#[test]
fn serve_over_the_tree_with_rules_it_cannot_run_exits_2_naming_them() {
    let cases = [
        (
            "[cluster]\nexchange = \"tree\"\n[[rule]]\nname = \"api\"\nalgorithm = \"token_bucket\"\nlimit = 10\nperiod = \"1s\"\n",
            "rule \"api\", field \"algorithm\"",
        ),
        (
            "[cluster]\nexchange = \"tree\"\non_partition = \"hold\"\n[[rule]]\nname = \"w\"\nalgorithm = \"fixed_window\"\nlimit = 10\nperiod = \"1s\"\n",
            "[cluster], field \"on_partition\"",
        ),
        (
            "[cluster]\nexchange = \"tree\"\n[[rule]]\nname = \"daily\"\nalgorithm = \"fixed_window\"\nlimit = 1000\nperiod = \"1d\"\n",
            "rule \"daily\", field \"period\"",
        ),
    ];
    for (contents, place) in cases {
        let file = TempFile::new(contents);
        let http = format!("127.0.0.1:{}", free_port());
        let gossip = format!("127.0.0.1:{}", free_port());
        let out = run(&[
            "serve",
            "--config",
            file.arg(),
            "--http",
            &http,
            "--gossip",
            &gossip,
        ]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{place}: {stderr}");
        assert!(stderr.contains(file.arg()), "file not named: {stderr}");
        assert!(stderr.contains(place), "{place} not named: {stderr}");
    }
}

#[test]
fn serve_with_a_missing_cluster_tls_file_exits_2_saying_so() {
    let gossip = free_port();
    let config = format!(
        "[cluster]\ngossip = \"127.0.0.1:{gossip}\"\n\
         [cluster.tls]\nca = \"/nonexistent/ca.pem\"\ncert = \"/nonexistent/n.pem\"\n\
         key = \"/nonexistent/n-key.pem\"\n\
         [[rule]]\nname = \"api\"\nscope = \"global\"\n\
         limits = [{{ algorithm = \"fixed_window\", limit = 10, period = \"1s\" }}]\n"
    );
    let file = TempFile::new(&config);
    let out = serve_once(&file);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    // The cluster's own error, not the HTTP listener's.
    assert!(stderr.contains("cannot start the cluster"), "{stderr}");
    assert!(stderr.contains("/nonexistent/ca.pem"), "{stderr}");
    assert!(!stderr.contains("cannot listen"), "{stderr}");
}

#[test]
fn serve_answers_checks_with_exit_codes_and_exits_0_on_sigterm() {
    let port = free_port();
    let mut command = gossamer();
    command.args(["serve", "--http", &format!("127.0.0.1:{port}")]);
    let mut server = Server::start(command, port);
    let url = server.url();

    let out = check(&url, "default", "k", 1);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let v = json(&out.stdout);
    assert_eq!(v["allowed"], true);
    assert_eq!(v["rule"], "default");
    assert_eq!(v["key"], "k");
    assert_eq!(v["outcome"], "allowed");
    assert_eq!(v["limit"], 100);

    // The built-in default rule has a burst of 100: a cost of 1000 can never pass.
    let out = check(&url, "default", "k", 1000);
    assert_eq!(out.status.code(), Some(1), "stderr: {}", text(&out.stderr));
    let v = json(&out.stdout);
    assert_eq!(v["allowed"], false);
    assert_eq!(v["outcome"], "never");

    let out = check(&url, "nope", "k", 1);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(json(&out.stdout)["error"], "unknown_rule");

    // Still serving after all that.
    assert_eq!(http_get(port, "/readyz").map(|r| r.0), Some(200));
    let status = server.terminate();
    assert_eq!(status.code(), Some(0), "serve exited with {status}");
    assert_eq!(
        http_get(port, "/healthz"),
        None,
        "still listening after exit"
    );
}

#[test]
fn check_against_a_closed_port_exits_2() {
    let url = format!("http://127.0.0.1:{}", free_port());
    let out = check(&url, "default", "k", 1);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("cannot connect"), "{stderr}");
    assert!(out.stdout.is_empty());
}

#[test]
fn check_with_a_url_that_is_not_http_exits_2() {
    let out = check("ftp://127.0.0.1:1", "default", "k", 1);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("invalid URL"), "{stderr}");
}

#[test]
fn serve_listens_where_gossamer_http_says_and_check_reads_gossamer_url() {
    let port = free_port();
    let mut command = gossamer();
    command
        .arg("serve")
        .env("GOSSAMER_HTTP", format!("127.0.0.1:{port}"))
        .env("GOSSAMER_NODE_ID", "env-node");
    let mut server = Server::start(command, port);
    let (status, body) = http_get(port, "/v1/cluster").expect("the node answers");
    assert_eq!(status, 200);
    assert_eq!(json(body.as_bytes())["node_id"], "env-node");

    let mut command = gossamer();
    command
        .args(["check", "--rule", "login", "--key", "env"])
        .env("GOSSAMER_URL", server.url());
    let out = run_bounded(command, Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    assert_eq!(json(&out.stdout)["rule"], "login");

    let status = server.terminate();
    assert_eq!(status.code(), Some(0), "serve exited with {status}");
}

/// A directory path under the temp dir with a unique name, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("gossamer-cli-certs-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        TempDir(path)
    }

    fn arg(&self) -> &str {
        self.0.to_str().expect("temp path is UTF-8")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn certs_writes_a_ca_and_node_certs_and_refuses_to_overwrite() {
    let dir = TempDir::new();
    let out = run(&[
        "certs",
        "--out",
        dir.arg(),
        "--node",
        "node-a",
        "--nodes",
        "node-b,node-c",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    for file in [
        "ca.pem",
        "ca-key.pem",
        "node-a.pem",
        "node-b-key.pem",
        "node-c.pem",
    ] {
        assert!(dir.0.join(file).is_file(), "{file} missing");
        assert!(stdout.contains(file), "{file} not listed in:\n{stdout}");
    }

    let again = run(&["certs", "--out", dir.arg(), "--node", "node-a"]);
    assert_eq!(again.status.code(), Some(2));
    let stderr = text(&again.stderr);
    assert!(
        stderr.contains("ca.pem") && stderr.contains("--force"),
        "{stderr}"
    );

    let forced = run(&["certs", "--out", dir.arg(), "--node", "node-a", "--force"]);
    assert_eq!(forced.status.code(), Some(0), "{}", text(&forced.stderr));
}

#[test]
fn certs_with_a_bad_or_no_node_id_exits_2() {
    let dir = TempDir::new();
    let bad = run(&["certs", "--out", dir.arg(), "--node", "Node_A"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        text(&bad.stderr).contains("Node_A"),
        "{}",
        text(&bad.stderr)
    );
    let none = run(&["certs", "--out", dir.arg()]);
    assert_eq!(none.status.code(), Some(2));
    assert!(!dir.0.exists(), "nothing written");
}

/// A thread's name and what the kernel says of its scheduling in `/proc/PID/task/TID/sched`:
/// `prio` (120 + nice for a normal thread) and `se.slice` in ns (EEVDF, Linux 6.6+).
#[derive(Debug)]
struct Sched {
    name: String,
    prio: i64,
    slice: Option<i64>,
}

fn field(sched: &str, name: &str) -> Option<i64> {
    sched.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key.trim() == name).then(|| value.trim().parse().ok())?
    })
}

fn threads(pid: u32) -> Vec<Sched> {
    let mut threads = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).expect("task dir") {
        let dir = task.expect("task").path();
        let (Ok(name), Ok(sched)) = (
            std::fs::read_to_string(dir.join("comm")),
            std::fs::read_to_string(dir.join("sched")),
        ) else {
            continue; // exited meanwhile
        };
        threads.push(Sched {
            name: name.trim().to_owned(),
            prio: field(&sched, "prio").expect("prio"),
            slice: field(&sched, "se.slice"),
        });
    }
    threads
}

/// The kernel's release as (major, minor).
fn kernel() -> (u32, u32) {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("osrelease");
    let mut parts = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// Starts a clustered node with `server` as its `[server]` table and `cluster` added to its
/// `[cluster]` table, and returns its threads once its cluster runtime has its worker and a
/// blocking thread for the rounds (5 s at most).
fn clustered_node_threads(server: &str, cluster: &str) -> (Vec<Sched>, i64) {
    let (http, gossip) = (free_port(), free_port());
    let file = TempFile::new(&format!(
        "[server]\n{server}\n[cluster]\ngossip = \"127.0.0.1:{gossip}\"\n{cluster}\n{GOOD_CONFIG}"
    ));
    let mut command = gossamer();
    command.args([
        "serve",
        "--config",
        file.arg(),
        "--http",
        &format!("127.0.0.1:{http}"),
    ]);
    let server = Server::start(command, http);
    let pid = server.child.id();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let threads = threads(pid);
        let cluster = threads
            .iter()
            .filter(|t| t.name.starts_with("gossamer-clust"))
            .count();
        if cluster >= 2 {
            let main = threads
                .iter()
                .find(|t| t.name == "gossamer")
                .expect("main thread")
                .prio;
            return (threads, main);
        }
        assert!(Instant::now() < deadline, "no cluster threads: {threads:?}");
        thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(target_os = "linux")]
#[test]
fn check_threads_get_the_short_slice_and_cluster_threads_the_kernels_at_their_nice() {
    // What a fresh thread of this process gets: the kernel's slice.
    let default_slice = thread::spawn(|| {
        field(
            &std::fs::read_to_string("/proc/thread-self/sched").expect("sched"),
            "se.slice",
        )
    })
    .join()
    .expect("thread");
    // By default the cluster's threads run at the checks' nice value.
    let (threads, main) = clustered_node_threads("", "");
    assert!(threads.iter().all(|t| t.prio == main), "{threads:?}");
    let (threads, main) = clustered_node_threads("", "round_nice = 10");
    let slices = kernel() >= (6, 12) && default_slice.is_some();
    for t in &threads {
        if t.name.starts_with("gossamer-clust") {
            assert_eq!(
                t.prio,
                (main + 10).min(139),
                "nice 10 above main: {threads:?}"
            );
            assert_eq!(t.slice, default_slice, "kernel's slice: {threads:?}");
        } else {
            assert_eq!(t.prio, main, "{threads:?}");
            if slices {
                assert_eq!(t.slice, Some(100_000), "check_slice 100us: {threads:?}");
            }
        }
    }
    // "0ms" leaves every thread the kernel's slice.
    let (threads, _) = clustered_node_threads("check_slice = \"0ms\"", "");
    assert!(
        threads.iter().all(|t| t.slice == default_slice),
        "{threads:?}"
    );
}
