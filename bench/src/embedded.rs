//! gossamer's library decision path (`Engine::check`) against governor's keyed GCRA
//! (`RateLimiter::keyed`, a `DashMap` store), in this process, on the same rule: 100 per
//! second per key with a burst of 100.
//!
//! Keys are 12-byte `String`s (`user-0000042`), built before timing. "Hot" is one key (after
//! the first 100, nearly every decision is a denial on both sides); "many" cycles through
//! `keys` pre-populated keys (each checked a few times a second: admissions). Two threads
//! walk the keys half the set apart. Decisions per second are aggregate (both threads).
//!
//! Clocks: "real" is what each library uses by default (gossamer `SystemClock`, i.e.
//! `clock_gettime(CLOCK_REALTIME)`; governor's `QuantaClock`, the TSC); "fake" is a clock
//! that never moves (gossamer `ManualClock`, governor `FakeRelativeClock`), isolating the
//! decision from the clock read.
//!
//! Bytes per key: a child process (`gossamer-bench mem ...`) reads its resident memory,
//! populates `keys` keys, and reads it again: the difference includes the allocator's
//! rounding and the tables' spare capacity, i.e. what a deployment pays.

use std::num::NonZeroU32;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use gossamer::clock::{Clock, ManualClock, SystemClock};
use gossamer::config::{Rule, Scope};
use gossamer::engine::Engine;
use gossamer::limiter::{Algorithm, Limit, SECOND};
use governor::clock::FakeRelativeClock;
use governor::{Quota, RateLimiter};

use crate::machine::rss_bytes;
use crate::targets::LIMIT;

/// Which side and clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Gossamer,
    Governor,
}

/// One figure: decisions per second, median of `reps` timed runs.
#[derive(Debug, Clone)]
pub struct Figure {
    pub side: Side,
    pub clock: &'static str,
    pub keys: &'static str,
    pub threads: usize,
    pub per_sec: Vec<f64>,
}

impl Figure {
    pub fn median(&self) -> f64 {
        crate::report::median(&self.per_sec)
    }

    pub fn ns_per_decision(&self) -> f64 {
        1e9 / self.median()
    }
}

fn engine(clock: Arc<dyn Clock>, max_keys: usize) -> Engine {
    let rule = Rule {
        name: "r".into(),
        limits: vec![
            Limit::new(Algorithm::TokenBucket, LIMIT, SECOND, Some(LIMIT)).expect("valid limit"),
        ],
        scope: Scope::Local,
        max_wait: 0,
    };
    Engine::new(vec![rule], max_keys, clock)
}

fn quota() -> Quota {
    Quota::per_second(NonZeroU32::new(LIMIT as u32).expect("non-zero"))
}

fn key_names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("user-{i:07}")).collect()
}

/// Aggregate decisions per second of `threads` threads calling `decide(thread, n)` for
/// `duration` (time is read every 1,024 decisions).
fn timed<F: Fn(usize, usize) -> bool + Sync>(threads: usize, duration: Duration, decide: F) -> f64 {
    let barrier = Barrier::new(threads + 1);
    let counts: Vec<u64> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (barrier, decide) = (&barrier, &decide);
                s.spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    let mut n = 0usize;
                    let mut admitted = 0u64;
                    while start.elapsed() < duration {
                        for _ in 0..1024 {
                            admitted += u64::from(std::hint::black_box(decide(t, n)));
                            n += 1;
                        }
                    }
                    std::hint::black_box(admitted);
                    (n as u64, start.elapsed())
                })
            })
            .collect();
        barrier.wait();
        handles
            .into_iter()
            .map(|h| {
                let (n, el) = h.join().expect("worker");
                (n as f64 / el.as_secs_f64()) as u64
            })
            .collect()
    });
    counts.iter().sum::<u64>() as f64
}

/// Every decision figure, each the median of `reps` runs of `duration`.
pub fn decisions(keys: usize, duration: Duration, reps: usize) -> Vec<Figure> {
    let names = key_names(keys);
    let hot = names[42.min(keys - 1)].clone();
    let mut out = Vec::new();
    for clock in ["real", "fake"] {
        // gossamer
        let g_clock: Arc<dyn Clock> = if clock == "real" {
            Arc::new(SystemClock)
        } else {
            Arc::new(ManualClock::new(1_700_000_000 * SECOND))
        };
        let e = engine(g_clock, 2 * keys);
        let g = |k: &str| e.check("r", k, 1, 0).expect("rule").decision.allowed();
        for k in &names {
            g(k);
        }
        for threads in [1, 2] {
            out.push(Figure {
                side: Side::Gossamer,
                clock,
                keys: "hot",
                threads,
                per_sec: (0..reps)
                    .map(|_| timed(threads, duration, |_, _| g(&hot)))
                    .collect(),
            });
            out.push(Figure {
                side: Side::Gossamer,
                clock,
                keys: "many",
                threads,
                per_sec: (0..reps)
                    .map(|_| {
                        timed(threads, duration, |t, n| {
                            g(&names[(t * keys / 2 + n) % keys])
                        })
                    })
                    .collect(),
            });
        }
        drop(e);
        // governor
        let real;
        let fake;
        let v: &(dyn Fn(&String) -> bool + Sync) = if clock == "real" {
            real = RateLimiter::keyed(quota());
            &|k| real.check_key(k).is_ok()
        } else {
            fake = RateLimiter::dashmap_with_clock(quota(), FakeRelativeClock::default());
            &|k| fake.check_key(k).is_ok()
        };
        for k in &names {
            v(k);
        }
        for threads in [1, 2] {
            out.push(Figure {
                side: Side::Governor,
                clock,
                keys: "hot",
                threads,
                per_sec: (0..reps)
                    .map(|_| timed(threads, duration, |_, _| v(&hot)))
                    .collect(),
            });
            out.push(Figure {
                side: Side::Governor,
                clock,
                keys: "many",
                threads,
                per_sec: (0..reps)
                    .map(|_| {
                        timed(threads, duration, |t, n| {
                            v(&names[(t * keys / 2 + n) % keys])
                        })
                    })
                    .collect(),
            });
        }
    }
    out
}

/// `gossamer-bench mem SIDE KEYS`: prints `bytes_per_key=X` for `KEYS` keys held by `SIDE`.
pub fn bytes_per_key_child(side: &str, keys: usize) -> Result<(), String> {
    let names = key_names(keys);
    let before = rss_bytes();
    let after = match side {
        "gossamer" => {
            let e = engine(Arc::new(SystemClock), 2 * keys);
            for k in &names {
                e.check("r", k, 1, 0).map_err(|e| e.to_string())?;
            }
            let r = rss_bytes();
            drop(std::hint::black_box(e));
            r
        }
        "governor" => {
            let g = RateLimiter::keyed(quota());
            for k in &names {
                let _ = g.check_key(k);
            }
            let r = rss_bytes();
            drop(std::hint::black_box(g));
            r
        }
        other => return Err(format!("unknown side {other}")),
    };
    println!(
        "bytes_per_key={:.1}",
        after.saturating_sub(before) as f64 / keys as f64
    );
    Ok(())
}

/// Bytes per key of `side`, measured in a fresh child process (so neither side inherits the
/// other's freed memory).
pub fn bytes_per_key(side: Side, keys: usize) -> Result<f64, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let name = match side {
        Side::Gossamer => "gossamer",
        Side::Governor => "governor",
    };
    let out = std::process::Command::new(exe)
        .args(["mem", name, &keys.to_string()])
        .output()
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim()
        .strip_prefix("bytes_per_key=")
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| {
            format!(
                "mem {name}: {text} {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
}

/// `gossamer-bench spin gossamer|governor hot|many SECS`: one thread deciding for `SECS`
/// seconds on the real clock, nothing else — a target for `perf record`.
pub fn spin(side: &str, keys: &str, secs: u64) -> Result<(), String> {
    let n = if keys == "hot" { 1 } else { 1_000_000 };
    let names = key_names(n);
    let d = Duration::from_secs(secs);
    let rate = match side {
        "gossamer" => {
            let e = engine(Arc::new(SystemClock), 2 * n);
            let g = |k: &str| e.check("r", k, 1, 0).expect("rule").decision.allowed();
            names.iter().for_each(|k| {
                g(k);
            });
            timed(1, d, |_, i| g(&names[i % n]))
        }
        "governor" => {
            let g = RateLimiter::keyed(quota());
            names.iter().for_each(|k| drop(g.check_key(k)));
            timed(1, d, |_, i| g.check_key(&names[i % n]).is_ok())
        }
        other => return Err(format!("unknown side {other}")),
    };
    println!("{side} {keys}: {rate:.0} decisions/s");
    Ok(())
}
