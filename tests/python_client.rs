//! The Python client (`clients/python`) against this build of the binary: runs its unittest
//! suite, which starts its own nodes (`clients/python/tests/node.py`) from
//! `GOSSAMER_BIN`. Skipped, saying so, only when there is no `python3`.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_gossamer");

/// The suite takes about 2 s; this bounds a hung run.
const LIMIT: Duration = Duration::from_secs(300);

#[test]
fn python_client_suite_passes_against_the_binary() {
    let python = match Command::new("python3").arg("--version").output() {
        Ok(out) if out.status.success() => "python3",
        _ => {
            eprintln!("SKIPPED: no python3 on PATH, so the Python client was not tested");
            return;
        }
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let client = root.join("clients/python");
    let mut child = Command::new(python)
        .args(["-m", "unittest", "discover", "-v", "-s"])
        .arg(client.join("tests"))
        .env("PYTHONPATH", client.join("src"))
        .env("GOSSAMER_BIN", BIN)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .current_dir(root)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 starts");
    let mut stdout = child.stdout.take().expect("stdout is piped");
    let mut stderr = child.stderr.take().expect("stderr is piped");
    let out = thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err = thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the Python client suite did not finish within {LIMIT:?}");
        }
        thread::sleep(Duration::from_millis(50));
    };
    let out = out.join().expect("stdout reader");
    let err = err.join().expect("stderr reader");
    // unittest reports on stderr; show it either way (cargo test hides it unless it fails
    // or runs with --nocapture).
    eprintln!("{out}{err}");
    assert!(status.success(), "the Python client suite failed: {status}");
    assert!(
        err.lines()
            .any(|l| l.starts_with("Ran ") && !l.starts_with("Ran 0 ")),
        "the Python client suite ran no test"
    );
}
