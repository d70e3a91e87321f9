//! Prometheus metrics: checks by rule and outcome, the check-latency histogram, active keys,
//! evictions, reservations, and HTTP errors by code. Counting is a relaxed atomic add; rendering happens
//! only when `/metrics` is scraped.
//!
//! Counters touched on every check are [`Striped`]: each thread adds to its own cache line,
//! so two cores answering checks do not pass one counter's line back and forth (measured: a
//! shared line cost more than the whole token-bucket decision under HTTP load).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
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

/// Stripes per [`Striped`] counter set: more than the cores we expect to share one.
const STRIPES: usize = 16;

/// `N` counters, striped by thread: adding touches only the calling thread's stripe; reading
/// sums the stripes.
#[derive(Debug)]
pub struct Striped<const N: usize> {
    stripes: Box<[Stripe<N>; STRIPES]>,
}

#[derive(Debug)]
#[repr(align(128))]
struct Stripe<const N: usize>([AtomicU64; N]);

impl<const N: usize> Default for Striped<N> {
    fn default() -> Self {
        Striped {
            stripes: Box::new(std::array::from_fn(|_| {
                Stripe(std::array::from_fn(|_| AtomicU64::new(0)))
            })),
        }
    }
}

impl<const N: usize> Striped<N> {
    /// Adds `n` to counter `i`.
    pub fn add(&self, i: usize, n: u64) {
        self.stripes[stripe()].0[i].fetch_add(n, Ordering::Relaxed);
    }

    /// Counter `i`, summed over stripes.
    pub fn get(&self, i: usize) -> u64 {
        self.stripes
            .iter()
            .map(|s| s.0[i].load(Ordering::Relaxed))
            .sum()
    }
}

/// This thread's stripe, assigned round-robin on first use.
fn stripe() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: usize = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
    }
    STRIPE.with(|s| *s)
}

/// Slots of a [`Histogram`]: one per bucket, one for overflow, one for the sum.
const HISTOGRAM_SLOTS: usize = LATENCY_BUCKETS.len() + 2;
const OVER: usize = LATENCY_BUCKETS.len();
const SUM: usize = LATENCY_BUCKETS.len() + 1;

/// A fixed-bucket histogram of durations.
#[derive(Debug, Default)]
pub struct Histogram {
    slots: Striped<HISTOGRAM_SLOTS>,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let slot = LATENCY_BUCKETS
            .iter()
            .position(|&b| nanos <= b)
            .unwrap_or(OVER);
        self.slots.add(slot, 1);
        self.slots.add(SUM, nanos);
    }

    fn render(&self, out: &mut String, name: &str) {
        let mut cumulative = 0;
        for (i, bound) in LATENCY_BUCKETS.iter().enumerate() {
            cumulative += self.slots.get(i);
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{}\"}} {cumulative}",
                *bound as f64 / 1e9
            );
        }
        cumulative += self.slots.get(OVER);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
        let sum = self.slots.get(SUM) as f64 / 1e9;
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
    pub errors: Striped<{ crate::api::ErrorCode::ALL.len() }>,
    /// Checks held for a lease ([`crate::engine::hold_for_lease`]).
    pub lease_waits: AtomicU64,
    /// How long those checks were held, in all (ns).
    pub lease_wait_nanos: AtomicU64,
}

impl HttpMetrics {
    /// Counts a check held `waited` nanoseconds for its lease.
    pub fn lease_waited(&self, waited: crate::limiter::Nanos) {
        self.lease_waits.fetch_add(1, Ordering::Relaxed);
        self.lease_wait_nanos.fetch_add(waited, Ordering::Relaxed);
    }
}

/// Config reloads (SIGHUP or a changed file), by result.
#[derive(Debug, Default)]
pub struct ReloadMetrics {
    /// Reloads applied.
    pub ok: AtomicU64,
    /// Reloads refused (unreadable or invalid file, or global rules changed in a cluster).
    pub error: AtomicU64,
    /// When the config was last loaded successfully (at start or by a reload), in Unix
    /// seconds; 0 before that.
    pub last_success: AtomicU64,
}

/// Renders every metric in the Prometheus text format.
pub fn render(engine: &Engine, http: &HttpMetrics, reloads: &ReloadMetrics) -> String {
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
    out.push_str("# HELP gossamer_check_denied_with_room_total Clustered checks denied while this node's view of the key's global remaining was at least the cost (a false 429 unless the room was held by other nodes), by rule.\n");
    out.push_str("# TYPE gossamer_check_denied_with_room_total counter\n");
    for rule in engine.rules().filter(|r| r.is_clustered()) {
        let _ = writeln!(
            out,
            "gossamer_check_denied_with_room_total{{rule=\"{}\"}} {}",
            rule.rule.name,
            rule.denied_with_room()
        );
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
    let r = &engine.reservations().metrics;
    out.push_str("# HELP gossamer_reservations_total Reservations (POST /v1/reserve) by event: made (admitted and charged), settled, expired (not settled within reservation_timeout: the estimate stood).\n");
    out.push_str("# TYPE gossamer_reservations_total counter\n");
    for (event, n) in [
        ("made", &r.made),
        ("settled", &r.settled),
        ("expired", &r.expired),
    ] {
        let _ = writeln!(
            out,
            "gossamer_reservations_total{{event=\"{event}\"}} {}",
            n.load(Ordering::Relaxed)
        );
    }
    out.push_str("# HELP gossamer_reservations_open Reservations waiting for their settle.\n");
    out.push_str("# TYPE gossamer_reservations_open gauge\n");
    let _ = writeln!(
        out,
        "gossamer_reservations_open {}",
        engine.reservations().open()
    );
    out.push_str("# HELP gossamer_reservation_units_total Units settles gave back (refunded), charged beyond the reservation (charged), or could not charge (unpaid: a clustered key whose node held no room for them).\n");
    out.push_str("# TYPE gossamer_reservation_units_total counter\n");
    for (kind, n) in [
        ("refunded", &r.refunded),
        ("charged", &r.charged),
        ("unpaid", &r.unpaid),
    ] {
        let _ = writeln!(
            out,
            "gossamer_reservation_units_total{{kind=\"{kind}\"}} {}",
            n.load(Ordering::Relaxed)
        );
    }
    out.push_str(
        "# HELP gossamer_check_duration_seconds Time to decide a check, waits excluded.\n",
    );
    out.push_str("# TYPE gossamer_check_duration_seconds histogram\n");
    http.check_latency
        .render(&mut out, "gossamer_check_duration_seconds");
    out.push_str("# HELP gossamer_check_lease_waits_total Clustered checks (HTTP, batch or RLS) held for their lease: a key new at this node in a round's gap, held until the round's instant rather than refused (design.md §3.3.1). Their time is in gossamer_check_duration_seconds.\n");
    out.push_str("# TYPE gossamer_check_lease_waits_total counter\n");
    let _ = writeln!(
        out,
        "gossamer_check_lease_waits_total {}",
        http.lease_waits.load(Ordering::Relaxed)
    );
    out.push_str("# HELP gossamer_check_lease_wait_seconds_total Time checks were held for their lease, in all.\n");
    out.push_str("# TYPE gossamer_check_lease_wait_seconds_total counter\n");
    let _ = writeln!(
        out,
        "gossamer_check_lease_wait_seconds_total {}",
        http.lease_wait_nanos.load(Ordering::Relaxed) as f64 / 1e9
    );
    out.push_str("# HELP gossamer_http_errors_total Requests refused, by error code.\n");
    out.push_str("# TYPE gossamer_http_errors_total counter\n");
    for (i, code) in crate::api::ErrorCode::ALL.iter().enumerate() {
        let _ = writeln!(
            out,
            "gossamer_http_errors_total{{error=\"{}\"}} {}",
            code.as_str(),
            http.errors.get(i)
        );
    }
    out.push_str(
        "# HELP gossamer_config_reloads_total Config reloads (SIGHUP or a changed file), by result.\n",
    );
    out.push_str("# TYPE gossamer_config_reloads_total counter\n");
    for (result, n) in [("ok", &reloads.ok), ("error", &reloads.error)] {
        let _ = writeln!(
            out,
            "gossamer_config_reloads_total{{result=\"{result}\"}} {}",
            n.load(Ordering::Relaxed)
        );
    }
    out.push_str(
        "# HELP gossamer_config_last_reload_success_timestamp_seconds When the rules in force were loaded.\n",
    );
    out.push_str("# TYPE gossamer_config_last_reload_success_timestamp_seconds gauge\n");
    let _ = writeln!(
        out,
        "gossamer_config_last_reload_success_timestamp_seconds {}",
        reloads.last_success.load(Ordering::Relaxed)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn striped_counters_sum_across_threads() {
        let c: Striped<2> = Striped::default();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..1_000 {
                        c.add(1, 2);
                    }
                });
            }
        });
        assert_eq!((c.get(0), c.get(1)), (0, 8_000));
    }

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
