//! Closed-loop load: `concurrency` workers, each with its own connection, each sending its
//! next check as soon as the previous one is answered. Keys are drawn from a Zipf
//! distribution (s = 1) over 1,000 keys, each worker from its own seeded generator.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::machine::{cpu_seconds, self_cpu_seconds, wall_us};
use crate::targets::{Conn, Key, Target};

/// Keys of the load matrix.
pub const KEYS: usize = 1_000;
/// The Zipf exponent.
pub const ZIPF_S: f64 = 1.0;

/// xorshift64*: small, fast, seeded.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_f64(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        (x >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The cumulative Zipf distribution over `n` ranks; `sample` is a binary search.
#[derive(Debug, Clone)]
pub struct Zipf(Vec<f64>);

impl Zipf {
    pub fn new(n: usize, s: f64) -> Zipf {
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = (1..=n)
            .map(|k| {
                acc += 1.0 / (k as f64).powf(s);
                acc
            })
            .collect();
        for c in &mut cdf {
            *c /= acc;
        }
        Zipf(cdf)
    }

    pub fn sample(&self, rng: &mut Rng) -> usize {
        let u = rng.next_f64();
        self.0.partition_point(|&c| c < u).min(self.0.len() - 1)
    }

    /// Share of draws that fall on the most frequent key.
    pub fn top_share(&self) -> f64 {
        self.0[0]
    }
}

/// The measured outcome of one load point.
#[derive(Debug, Clone)]
pub struct Point {
    pub checks: u64,
    pub admitted: u64,
    pub errors: u64,
    pub secs: f64,
    /// Latency of every measured check, in nanoseconds.
    pub hist: Histogram<u64>,
    pub client_cpu: f64,
    pub server_cpu: f64,
}

impl Point {
    pub fn rate(&self) -> f64 {
        self.checks as f64 / self.secs
    }

    pub fn quantile_us(&self, q: f64) -> f64 {
        self.hist.value_at_quantile(q) as f64 / 1e3
    }

    /// CPU seconds (server + client) per 100,000 checks.
    pub fn cpu_per_100k(&self) -> f64 {
        if self.checks == 0 {
            return f64::NAN;
        }
        (self.client_cpu + self.server_cpu) / self.checks as f64 * 1e5
    }

    pub fn server_cpu_per_100k(&self) -> f64 {
        self.server_cpu / self.checks.max(1) as f64 * 1e5
    }

    pub fn client_cpu_per_100k(&self) -> f64 {
        self.client_cpu / self.checks.max(1) as f64 * 1e5
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1_000, 60_000_000_000, 3).expect("valid histogram bounds")
}

/// Keys `"{prefix}user-0000000"`.. for one load point.
pub fn keys(prefix: &str, n: usize) -> Arc<Vec<Key>> {
    Arc::new(
        (0..n)
            .map(|i| Key::new(format!("{prefix}user-{i:07}")))
            .collect(),
    )
}

/// Runs `concurrency` workers against `target` for `warmup` + `duration` (the third argument); measures the
/// checks that start within `duration`, and the CPU of this process and `server_pid` over it.
pub async fn point(
    target: &Target,
    concurrency: usize,
    (warmup, duration): (Duration, Duration),
    keys: Arc<Vec<Key>>,
    zipf: Arc<Zipf>,
    seed: u64,
    server_pid: u32,
) -> Result<Point, String> {
    let mut conns = Vec::with_capacity(concurrency);
    for i in 0..concurrency {
        conns.push(Conn::open(target, seed * 1_000 + i as u64).await?);
    }
    let start = Instant::now();
    let measure_from = start + warmup;
    let stop = measure_from + duration;
    let mut workers = Vec::new();
    for (i, mut conn) in conns.into_iter().enumerate() {
        let (keys, zipf) = (keys.clone(), zipf.clone());
        let mut rng = Rng::new(seed.wrapping_mul(7919) + i as u64 + 1);
        workers.push(tokio::spawn(async move {
            let mut hist = histogram();
            let (mut checks, mut admitted, mut errors) = (0u64, 0u64, 0u64);
            loop {
                let key = &keys[zipf.sample(&mut rng)];
                let t0 = Instant::now();
                if t0 >= stop {
                    break;
                }
                let r = conn.check(key).await;
                if t0 >= measure_from {
                    let ns = t0.elapsed().as_nanos() as u64;
                    let _ = hist.record(ns.max(1_000));
                    checks += 1;
                    match r {
                        Ok(true) => admitted += 1,
                        Ok(false) => {}
                        Err(_) => errors += 1,
                    }
                }
                if errors > 100 {
                    return Err(r.err().unwrap_or_default());
                }
            }
            Ok((hist, checks, admitted, errors))
        }));
    }
    tokio::time::sleep_until(measure_from.into()).await;
    let (c0, s0, t0) = (self_cpu_seconds(), cpu_seconds(server_pid), Instant::now());
    tokio::time::sleep_until(stop.into()).await;
    let (c1, s1, secs) = (
        self_cpu_seconds(),
        cpu_seconds(server_pid),
        t0.elapsed().as_secs_f64(),
    );
    let mut p = Point {
        checks: 0,
        admitted: 0,
        errors: 0,
        secs,
        hist: histogram(),
        client_cpu: c1 - c0,
        server_cpu: match (s0, s1) {
            (Some(a), Some(b)) => b - a,
            _ => return Err(format!("server pid {server_pid} is gone")),
        },
    };
    for w in workers {
        let (hist, checks, admitted, errors) = w.await.map_err(|e| e.to_string())??;
        p.hist.add(&hist).map_err(|e| e.to_string())?;
        p.checks += checks;
        p.admitted += admitted;
        p.errors += errors;
    }
    Ok(p)
}

/// What the hammer saw: admissions per 1 s window (by the client's clock at sending).
#[derive(Debug, Clone)]
pub struct Hammer {
    pub attempts: u64,
    pub admitted: u64,
    pub per_window: Vec<u64>,
    pub errors: u64,
}

/// `concurrency` workers check one key as fast as they can, from 20 ms after a whole second
/// until 20 ms before the whole second `secs` later (the margins keep every check inside the
/// windows counted, whichever side's clock decides).
pub async fn hammer(
    target: &Target,
    concurrency: usize,
    key: Key,
    secs: u64,
) -> Result<Hammer, String> {
    let mut conns = Vec::with_capacity(concurrency);
    for i in 0..concurrency {
        conns.push(Conn::open(target, 9_000 + i as u64).await?);
    }
    let now = wall_us();
    let first = now / 1_000_000 + 2;
    let begin_us = first * 1_000_000 + 20_000;
    let end_us = (first + secs) * 1_000_000 - 20_000;
    tokio::time::sleep(Duration::from_micros(begin_us - now)).await;
    let key = Arc::new(key);
    let mut workers = Vec::new();
    for mut conn in conns {
        let key = key.clone();
        workers.push(tokio::spawn(async move {
            let mut per = vec![0u64; secs as usize];
            let (mut attempts, mut errors) = (0u64, 0u64);
            loop {
                let t = wall_us();
                if t >= end_us {
                    break;
                }
                attempts += 1;
                match conn.check(&key).await {
                    Ok(true) => per[((t / 1_000_000) - first) as usize] += 1,
                    Ok(false) => {}
                    Err(_) => errors += 1,
                }
            }
            (per, attempts, errors)
        }));
    }
    let mut h = Hammer {
        attempts: 0,
        admitted: 0,
        per_window: vec![0; secs as usize],
        errors: 0,
    };
    for w in workers {
        let (per, attempts, errors) = w.await.map_err(|e| e.to_string())?;
        for (a, b) in h.per_window.iter_mut().zip(per) {
            *a += b;
        }
        h.attempts += attempts;
        h.errors += errors;
    }
    h.admitted = h.per_window.iter().sum();
    Ok(h)
}
