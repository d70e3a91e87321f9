//! End to end with an independent client: `tests/rls_client.py` speaks to a real node through
//! Envoy's published protos as the `xds-protos` package generates them (grpcio), so a field
//! number or enum value gossamer got wrong fails here even if gossamer's own client agrees
//! with its server.
//!
//! The client runs in a venv at `target/rls-venv` with grpcio, xds-protos and
//! grpcio-health-checking; `.ci/run` installs it, and this test creates it if it is missing
//! (pip needs PyPI). Only without `python3` does the test skip, saying so.

#![allow(clippy::unwrap_used)] // helpers of tests: a failure should panic where it happens

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use gossamer::clock::ManualClock;
use gossamer::config::{Config, Overrides};
use gossamer::limiter::SECOND;
use gossamer::server::Node;

/// The packages the client needs, pinned (the same line as `.ci/run`).
const PACKAGES: [&str; 3] = [
    "grpcio==1.85.1",
    "xds-protos==1.85.0",
    "grpcio-health-checking==1.85.1",
];

const MESSAGING: &str = r#"
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
"#;

const EDGE: &str = r#"
domain: edge
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: ip
    value: 50.0.0.5
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: ldap
    rate_limit: {unlimited: true}
"#;

fn venv() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target/rls-venv")
}

/// The venv's python with the packages importable, creating the venv if needed.
fn python() -> Option<PathBuf> {
    if Command::new("python3").arg("--version").output().is_err() {
        return None;
    }
    let python = venv().join("bin/python");
    let ready = |python: &Path| {
        Command::new(python)
            .args([
                "-c",
                "import grpc, grpc_health.v1.health_pb2, envoy.service.ratelimit.v3.rls_pb2",
            ])
            .status()
            .is_ok_and(|s| s.success())
    };
    if ready(&python) {
        return Some(python);
    }
    let status = Command::new("python3")
        .args(["-m", "venv"])
        .arg(venv())
        .status()
        .unwrap();
    assert!(
        status.success(),
        "python3 -m venv failed (Debian: apt-get install python3-venv)"
    );
    let status = Command::new(venv().join("bin/pip"))
        .args(["install", "-q", "--disable-pip-version-check"])
        .args(PACKAGES)
        .status()
        .unwrap();
    assert!(status.success(), "pip install {PACKAGES:?} failed");
    assert!(ready(&python), "the venv cannot import grpc and xds-protos");
    Some(python)
}

/// Runs the client, killing it after a minute.
fn run(python: &Path, script: &Path, address: &str) -> std::process::Output {
    use std::process::Stdio;
    let mut child = Command::new(python)
        .arg(script)
        .arg(address)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the client did not finish within a minute");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_independent_grpcio_client_gets_envoys_answers() {
    let Some(python) = tokio::task::spawn_blocking(python).await.unwrap() else {
        eprintln!("SKIPPED: python3 is not installed; the grpcio client cannot run");
        return;
    };
    let dir = std::env::temp_dir().join(format!("gossamer-rls-python-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("messaging.yaml"), MESSAGING).unwrap();
    std::fs::write(dir.join("edge.yaml"), EDGE).unwrap();
    let overrides = Overrides {
        http: Some("127.0.0.1:0".parse().unwrap()),
        grpc: Some("127.0.0.1:0".parse().unwrap()),
        rls_config: Some(dir.clone()),
        ..Overrides::default()
    };
    let config = Config::load(None, &overrides).unwrap();
    // A whole day since the epoch: every window starts here and the clock never moves.
    let clock = Arc::new(ManualClock::new(19_675 * 86_400 * SECOND));
    let node = Node::bind(config, clock).await.unwrap();
    let grpc = node.grpc_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(node.run(async {
        let _ = stopped.await;
    }));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/rls_client.py");
    let output = tokio::task::spawn_blocking(move || run(&python, &script, &grpc.to_string()))
        .await
        .unwrap();
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(15), task)
        .await
        .expect("the node stops")
        .unwrap()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "client failed\n{stdout}\n{stderr}");
    for line in [
        "health: SERVING",
        "messaging: 5 admitted",
        "hits_addend: request 0 -> 1",
        "unlimited, blocked and limit override",
        "malformed requests: INVALID_ARGUMENT",
    ] {
        assert!(stdout.contains(line), "missing {line:?} in\n{stdout}");
    }
}
