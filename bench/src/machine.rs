//! The machine a run is on, and the CPU time processes spend, from `/proc`.

use std::time::{Duration, Instant};

/// What the report says about the machine.
#[derive(Debug, Clone)]
pub struct Machine {
    /// `model name` of the first CPU in /proc/cpuinfo.
    pub cpu: String,
    /// Online CPUs.
    pub cores: usize,
    /// `uname -r`.
    pub kernel: String,
    /// The 1/5/15-minute load averages when this was taken.
    pub load: [f64; 3],
}

impl Machine {
    pub fn now() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map_or("unknown".into(), |(_, v)| v.trim().to_string());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map_or("unknown".into(), |s| s.trim().to_string());
        Machine {
            cpu,
            cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
            kernel,
            load: load_average(),
        }
    }
}

/// The 1/5/15-minute load averages.
pub fn load_average() -> [f64; 3] {
    let s = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut it = s.split_whitespace().map(|v| v.parse().unwrap_or(f64::NAN));
    [
        it.next().unwrap_or(f64::NAN),
        it.next().unwrap_or(f64::NAN),
        it.next().unwrap_or(f64::NAN),
    ]
}

/// Waits (up to `within`) until the 1-minute load average is below `max`; returns it.
pub fn wait_for_quiet(max: f64, within: Duration) -> f64 {
    let start = Instant::now();
    loop {
        let l = load_average()[0];
        if max <= 0.0 || l < max || start.elapsed() >= within {
            return l;
        }
        eprintln!(
            "load average {l:.2} >= {max}: waiting ({:.0} s so far, at most {:.0} s)",
            start.elapsed().as_secs_f64(),
            within.as_secs_f64()
        );
        std::thread::sleep(Duration::from_secs(15));
    }
}

/// Clock ticks per second of /proc/PID/stat's times.
fn clk_tck() -> f64 {
    // SAFETY: sysconf reads a constant of the system; it has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// User + system CPU seconds a process (all its threads) has used: fields 14 and 15 of
/// /proc/PID/stat, counted after the parenthesised command name. `None` if it is gone.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): utime is field 14, stime 15.
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) / clk_tck())
}

/// This process's user + system CPU seconds.
pub fn self_cpu_seconds() -> f64 {
    cpu_seconds(std::process::id()).unwrap_or(0.0)
}

/// Resident memory of this process, in bytes (/proc/self/statm).
pub fn rss_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = s
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    // SAFETY: as above.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * u64::try_from(page).unwrap_or(4096)
}

/// Microseconds since the Unix epoch, as an application reads the time to key a window.
#[allow(clippy::disallowed_methods)] // the load generator plays the application, not gossamer
pub fn wall_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// The (short) commit of the repository at `root`, with `+dirty` if it has changes.
pub fn commit(root: &std::path::Path) -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(root)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let head = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty = git(&[
        "status",
        "--porcelain",
        "--",
        "src",
        "Cargo.toml",
        "Cargo.lock",
    ])
    .is_some_and(|s| !s.is_empty());
    if dirty { format!("{head}+dirty") } else { head }
}
