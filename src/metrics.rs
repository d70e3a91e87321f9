//! Prometheus metrics: checks by rule and outcome, the check-latency histogram, active keys,
//! evictions, and HTTP errors by code. Counting is a relaxed atomic add; rendering happens
//! only when `/metrics` is scraped.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::engine::{Engine, Outcome};

/// Upper bounds of the latency histogram's buckets, in nanoseconds (5 µs to 100 ms).
pub const LATENCY_BUCKETS: [u64; 12] = [
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    10_000_000,
    25_000_000,
    100_000_000,
];

/// A fixed-bucket histogram of durations.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    /// Observations above the last bucket.
    over: AtomicU64,
    sum_nanos: AtomicU64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let slot = LATENCY_BUCKETS.iter().position(|&b| nanos <= b);
        match slot {
            Some(i) => self.buckets[i].fetch_add(1, Ordering::Relaxed),
            None => self.over.fetch_add(1, Ordering::Relaxed),
        };
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str) {
        let mut cumulative = 0;
        for (bound, count) in LATENCY_BUCKETS.iter().zip(&self.buckets) {
            cumulative += count.load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{}\"}} {cumulative}",
                *bound as f64 / 1e9
            );
        }
        cumulative += self.over.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
        let sum = self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum {sum}");
        let _ = writeln!(out, "{name}_count {cumulative}");
    }
}

/// Counters kept by the HTTP layer.
#[derive(Debug, Default)]
pub struct HttpMetrics {
    /// Time spent deciding a check (request parsed to response built; shaping waits excluded).
    pub check_latency: Histogram,
    /// Error responses by code, indexed as `crate::api::ErrorCode::ALL`.
    pub errors: [AtomicU64; crate::api::ErrorCode::ALL.len()],
}

/// Renders every metric in the Prometheus text format.
pub fn render(engine: &Engine, http: &HttpMetrics) -> String {
    let mut out = String::with_capacity(4096);
    out.push_str("# HELP gossamer_checks_total Checks answered, by rule and outcome.\n");
    out.push_str("# TYPE gossamer_checks_total counter\n");
    for rule in engine.rules() {
        for outcome in Outcome::ALL {
            let _ = writeln!(
                out,
                "gossamer_checks_total{{rule=\"{}\",outcome=\"{}\"}} {}",
                rule.rule.name,
                outcome.name(),
                rule.outcome_count(outcome)
            );
        }
    }
    out.push_str("# HELP gossamer_active_keys Keys holding state, by rule.\n");
    out.push_str("# TYPE gossamer_active_keys gauge\n");
    for rule in engine.rules() {
        let _ = writeln!(
            out,
            "gossamer_active_keys{{rule=\"{}\"}} {}",
            rule.rule.name,
            rule.active_keys()
        );
    }
    out.push_str(
        "# HELP gossamer_evictions_total Keys evicted because their state was fresh again.\n",
    );
    out.push_str("# TYPE gossamer_evictions_total counter\n");
    let _ = writeln!(out, "gossamer_evictions_total {}", engine.evictions());
    out.push_str(
        "# HELP gossamer_check_duration_seconds Time to decide a check, waits excluded.\n",
    );
    out.push_str("# TYPE gossamer_check_duration_seconds histogram\n");
    http.check_latency
        .render(&mut out, "gossamer_check_duration_seconds");
    out.push_str("# HELP gossamer_http_errors_total Requests refused, by error code.\n");
    out.push_str("# TYPE gossamer_http_errors_total counter\n");
    for (code, count) in crate::api::ErrorCode::ALL.iter().zip(&http.errors) {
        let _ = writeln!(
            out,
            "gossamer_http_errors_total{{error=\"{}\"}} {}",
            code.as_str(),
            count.load(Ordering::Relaxed)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(3));
        h.observe(Duration::from_micros(7));
        h.observe(Duration::from_secs(1));
        let mut out = String::new();
        h.render(&mut out, "x");
        assert!(out.contains("x_bucket{le=\"0.000005\"} 1\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"0.00001\"} 2\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"0.1\"} 2\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"+Inf\"} 3\n"), "{out}");
        assert!(out.contains("x_count 3\n"), "{out}");
    }
}
