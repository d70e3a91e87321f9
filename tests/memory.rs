//! Bytes of heap per tracked key, per algorithm, measured by a counting global allocator.
//!
//! `cargo test --release --test memory -- --nocapture` prints the figures.

// A global allocator is an `unsafe impl GlobalAlloc`, and there is no other way to count every
// heap byte the store holds. The unsafe code is confined to this test binary: it forwards each
// call to `System` unchanged and only adds to and subtracts from an atomic counter.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicIsize, Ordering};

use gossamer::clock::ManualClock;
use gossamer::config::{Rule, Scope};
use gossamer::engine::Engine;
use gossamer::limiter::{Algorithm, KeyState, Limit, Nanos, SECOND};

/// `System`, counting the bytes currently allocated.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

fn bytes(n: usize) -> isize {
    isize::try_from(n).unwrap_or(isize::MAX)
}

// SAFETY: every method forwards to `System` with the caller's arguments, so `System`'s
// guarantees hold; the counter has no effect on the memory handed out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is; the caller upholds `alloc`'s contract.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(bytes(layout.size()), Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is; the caller upholds `alloc_zeroed`'s contract.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE.fetch_add(bytes(layout.size()), Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as is; the caller upholds `dealloc`'s contract.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(bytes(layout.size()), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded as is; the caller upholds `realloc`'s contract.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_add(bytes(new_size) - bytes(layout.size()), Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const KEYS: usize = 100_000;
const T0: Nanos = 1_700_000_000 * SECOND;
/// What the brief allows for a token bucket key.
const TOKEN_BUCKET_BUDGET: f64 = 256.0;

fn limit(algorithm: Algorithm, limit: u64, burst: Option<u64>) -> Limit {
    Limit::new(algorithm, limit, SECOND, burst).expect("valid limit")
}

/// Live heap bytes per key that `KEYS` idle keys, each checked (and admitted) once, add to an
/// engine serving `limits`.
fn bytes_per_key(limits: Vec<Limit>, keys: &[String]) -> f64 {
    let clock = Arc::new(ManualClock::new(T0));
    let rule = Rule {
        name: "r".into(),
        limits,
        scope: Scope::Local,
        max_wait: 0,
    };
    let engine = Engine::new(vec![rule], 10 * KEYS, clock);
    let before = LIVE.load(Ordering::SeqCst);
    for key in keys {
        let checked = engine.check("r", key, 1, 0).expect("the rule exists");
        assert!(checked.decision.allowed(), "a first check is admitted");
    }
    let after = LIVE.load(Ordering::SeqCst);
    assert_eq!(engine.rule("r").expect("rule").active_keys(), KEYS);
    let per_key = (after - before) as f64 / KEYS as f64;
    drop(engine);
    per_key
}

#[test]
fn bytes_per_tracked_key() {
    let keys: Vec<String> = (0..KEYS).map(|i| format!("user-{i:07}")).collect();
    assert!(keys.iter().all(|k| k.len() == 12));
    let cases = [
        (
            "token_bucket",
            vec![limit(Algorithm::TokenBucket, 100, None)],
        ),
        (
            "leaky_bucket",
            vec![limit(Algorithm::LeakyBucket, 100, None)],
        ),
        (
            "fixed_window",
            vec![limit(Algorithm::FixedWindow, 100, None)],
        ),
        (
            "sliding_window_log",
            vec![limit(Algorithm::SlidingWindowLog, 10, None)],
        ),
        (
            "sliding_window_counter",
            vec![limit(Algorithm::SlidingWindowCounter, 100, None)],
        ),
        (
            "token_bucket+sliding_window_log",
            vec![
                limit(Algorithm::TokenBucket, 10, Some(20)),
                limit(Algorithm::SlidingWindowLog, 10, None),
            ],
        ),
    ];
    println!(
        "{KEYS} idle keys of 12 bytes, each checked once; size_of::<KeyState>() = {} bytes",
        size_of::<KeyState>()
    );
    println!("| algorithm | heap bytes per tracked key |");
    println!("|---|---:|");
    let mut token_bucket = None;
    for (name, limits) in cases {
        let per_key = bytes_per_key(limits, &keys);
        println!("| {name} | {per_key:.1} |");
        if name == "token_bucket" {
            token_bucket = Some(per_key);
        }
    }
    let token_bucket = token_bucket.expect("token_bucket was measured");
    assert!(
        token_bucket <= TOKEN_BUCKET_BUDGET,
        "token_bucket holds {token_bucket:.1} bytes per key, over the {TOKEN_BUCKET_BUDGET} budget"
    );
}

/// Heap bytes per key that `keys`, each checked once at node 0, add to a simulated cluster of
/// `nodes` (all nodes together, divided by nodes), measured `after` the checks.
fn cluster_bytes_per_key(limits: Vec<Limit>, keys: &[String], nodes: usize, after: Nanos) -> f64 {
    use gossamer::cluster::global::Params;
    use gossamer::cluster::sim::Sim;
    let mut sim = Sim::new(nodes, vec![("r".to_owned(), limits)], Params::default(), 1);
    sim.track = false;
    sim.advance(2 * SECOND);
    let before = LIVE.load(Ordering::SeqCst);
    for (i, key) in keys.iter().enumerate() {
        sim.check(i % nodes, "r", key, 1);
        if i % 1000 == 999 {
            sim.advance(1_000_000);
        }
    }
    sim.advance(after);
    let now = LIVE.load(Ordering::SeqCst);
    (now - before) as f64 / keys.len() as f64 / nodes as f64
}

#[test]
fn bytes_per_global_key() {
    let keys: Vec<String> = (0..KEYS / 10).map(|i| format!("user-{i:07}")).collect();
    for nodes in [1, 3] {
        for (name, l) in [
            ("token_bucket", limit(Algorithm::TokenBucket, 100, None)),
            ("fixed_window", limit(Algorithm::FixedWindow, 100, None)),
            (
                "sliding_window_log",
                limit(Algorithm::SlidingWindowLog, 10, None),
            ),
        ] {
            let l = Limit::new(l.algorithm(), l.limit(), 3600 * SECOND, None).unwrap();
            for after in [0, 300_000_000, 3 * SECOND] {
                let b = cluster_bytes_per_key(vec![l], &keys, nodes, after);
                println!("nodes {nodes} {name} after {after}: {b:.0}");
            }
        }
    }
}
