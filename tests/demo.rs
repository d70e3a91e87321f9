//! `gossamer demo` end to end: the real binary forms its 3-node loopback cluster, drives the
//! skewed load for a short run, exits 0 by itself, and the global limit held.

use std::io::Read;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_gossamer");

#[test]
fn demo_runs_a_three_node_cluster_and_admits_no_more_than_the_global_limit() {
    let mut child = Command::new(BIN)
        .args(["demo", "--duration", "2s", "--limit", "50"])
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    let mut stdout = child.stdout.take().expect("piped");
    let reader = thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the demo did not finish within 60 s");
        }
        thread::sleep(Duration::from_millis(50));
    };
    let out = reader.join().expect("reader");
    let mut stderr = String::new();
    let _ = child
        .stderr
        .take()
        .expect("piped")
        .read_to_string(&mut stderr);
    assert!(status.success(), "exit {status}\n{out}\n{stderr}");

    // The live view: one block per second, a line per node seeing both peers.
    for node in ["demo-a", "demo-b", "demo-c"] {
        let lines = out
            .lines()
            .filter(|l| l.contains(node) && l.trim_end().ends_with("2/2"))
            .count();
        assert_eq!(lines, 2, "{node} once a second:\n{out}");
    }
    // global admitted: N over W windows of 1 s; ideal: 50 x W = I (...)
    let summary = out
        .lines()
        .find(|l| l.starts_with("global admitted: "))
        .unwrap_or_else(|| panic!("no summary:\n{out}"));
    let numbers: Vec<u64> = summary
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    let (admitted, windows, ideal) = (numbers[0], numbers[1], numbers[5]);
    assert!((2..=3).contains(&windows), "{summary}");
    assert_eq!(ideal, 50 * windows, "{summary}");
    assert!(admitted <= ideal, "over the global limit: {summary}\n{out}");
    assert!(
        admitted * 2 >= ideal,
        "under half the limit: {summary}\n{out}"
    );
}
