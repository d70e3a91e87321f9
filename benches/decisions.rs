//! Decision cost of `Engine::check`, per algorithm, for one hot key and for 1,000,000 keys.
//!
//! Run with `cargo bench --bench decisions` (about 2 minutes on 2 cores).
//!
//! # Time
//!
//! Everything runs on a [`ManualClock`]. Two regimes, named in the benchmark ids:
//!
//! - `ticking/...`: the clock is advanced by 1 µs before every check (`ManualClock::advance`),
//!   so every check sees a new timestamp, as in production: buckets refill, windows expire,
//!   the sliding log drops one entry and appends one. Rules are sized so that every check is
//!   admitted at that rate (the normal admit path). The advance itself is measured on its own
//!   as `ticking/clock_advance_only` — subtract it to get the engine's share.
//! - `fixed/...`: the clock never moves and the rule is large enough (token bucket with a burst
//!   of 2^40) that every check is still admitted. This isolates the engine from the clock and
//!   is the only sound choice for two threads (two threads advancing one clock would measure
//!   the clock's cache line bouncing, not the engine).
//!
//! # Keys
//!
//! `hot`: the same key every check. `1M`: 1,000,000 distinct keys (`user-0000000` ..
//! `user-0999999`, 12 bytes), each checked once before measuring, then cycled in order. Keys
//! are slices of one pre-built string, so no formatting or allocation is measured.
//!
//! # Two threads
//!
//! `*/2_threads`: `iter_custom` with two std threads each doing `iters` checks; the reported
//! time is wall time / (2 × iters), i.e. the inverse of the aggregate throughput. Each thread's
//! own latency per check is twice that figure.
//!
//! # Pure
//!
//! `pure/...`: `Limit::decide` + `Limit::commit` of a token bucket (and `KeyState::check`),
//! with no store, lock, hash or clock, to separate the algorithm from the store.
//!
//! # Cluster
//!
//! `cluster/...`: the same token bucket (`fixed` regime) as a local rule and as a
//! `scope = "global"` rule of an engine built by `Engine::clustered`, whose keys live in the
//! cluster's `Global` (its state holds a share and a bucket per key; no round runs during the
//! measurement, as none touches the check path's locks except a key's shard for a moment).
//! The check path of a global rule reads local state only (design.md §3.1): this compares
//! the two decisions directly, without the HTTP path or the other nodes' CPU.
//!
//! `cluster/fixed_window/{local,tree}/...`: a fixed window of 2^40 per second as a local rule
//! and as a global rule over the aggregation tree (`Engine::clustered_tree`, one node alone
//! in its view, every key granted its room by a round before measuring): a tree check locks
//! the one `Tree` and looks its key up in a `BTreeMap`, allocating the key's strings.

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use gossamer::clock::{Clock, ManualClock};
use gossamer::cluster::global::Params;
use gossamer::cluster::tree::TreeParams;
use gossamer::config::{Rule, Scope};
use gossamer::counter::Actor;
use gossamer::engine::Engine;
use gossamer::limiter::{Algorithm, KeyState, Limit, MAX_LIMIT, MILLISECOND, Nanos, SECOND};

const T0: Nanos = 1_700_000_000 * SECOND;
/// How far the ticking clock moves per check.
const TICK: Nanos = 1_000;
const MANY: usize = 1_000_000;
const KEY_LEN: usize = 12;
const HOT: &str = "user-0000042";

/// `MANY` keys of `KEY_LEN` bytes, back to back.
struct Keys(String);

impl Keys {
    fn new() -> Keys {
        let mut s = String::with_capacity(MANY * KEY_LEN);
        for i in 0..MANY {
            s.push_str(&format!("user-{i:07}"));
        }
        assert_eq!(s.len(), MANY * KEY_LEN);
        Keys(s)
    }

    fn get(&self, i: usize) -> &str {
        &self.0[i * KEY_LEN..(i + 1) * KEY_LEN]
    }
}

fn limit(algorithm: Algorithm, limit: u64, period: Nanos, burst: Option<u64>) -> Limit {
    Limit::new(algorithm, limit, period, burst).expect("valid limit")
}

/// The rules of the ticking regime: at one check per µs on one key, every check is admitted.
fn ticking_rules() -> Vec<(&'static str, Vec<Limit>)> {
    // 10^9 per second refills 1,000 units per µs; windows count at most 10^6 per second.
    let big = |a| limit(a, 1_000_000_000, SECOND, None);
    // The log holds one entry per admission: 10,000 per 1 ms leaves room for the 1,000 a
    // hot key logs per 1 ms window at one check per µs (steady state: 1,000 entries, one
    // expired and one appended per check). With 1M keys each key's log holds one entry.
    let log = limit(Algorithm::SlidingWindowLog, 10_000, MILLISECOND, None);
    vec![
        ("token_bucket", vec![big(Algorithm::TokenBucket)]),
        ("leaky_bucket", vec![big(Algorithm::LeakyBucket)]),
        ("fixed_window", vec![big(Algorithm::FixedWindow)]),
        ("sliding_window_log", vec![log]),
        (
            "sliding_window_counter",
            vec![big(Algorithm::SlidingWindowCounter)],
        ),
        (
            "token_bucket+sliding_window_log",
            vec![big(Algorithm::TokenBucket), log],
        ),
    ]
}

/// A token bucket that a fixed clock never empties in a benchmark's lifetime (2^40 tokens).
fn fixed_rule() -> Vec<Limit> {
    vec![limit(
        Algorithm::TokenBucket,
        MAX_LIMIT,
        SECOND,
        Some(MAX_LIMIT),
    )]
}

fn engine(limits: Vec<Limit>) -> (Arc<ManualClock>, Engine) {
    let clock = Arc::new(ManualClock::new(T0));
    let rule = Rule {
        name: "r".into(),
        limits,
        scope: Scope::Local,
        max_wait: 0,
    };
    let engine = Engine::new(vec![rule], 2 * MANY, clock.clone());
    (clock, engine)
}

fn check(engine: &Engine, key: &str) -> bool {
    check_rule(engine, "r", key)
}

fn check_rule(engine: &Engine, rule: &str, key: &str) -> bool {
    engine
        .check(rule, key, 1, 0)
        .expect("the rule exists")
        .decision
        .allowed()
}

/// A benchmark group of 30 samples, 1 s of warm-up and `secs` of measurement.
fn group<'c>(
    c: &'c mut Criterion,
    name: &str,
    secs: u64,
) -> criterion::BenchmarkGroup<'c, criterion::measurement::WallTime> {
    let mut group = c.benchmark_group(name);
    group
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(secs));
    group
}

/// Checks every key once (each key then holds state), advancing the clock as in the run.
fn populate(engine: &Engine, clock: Option<&ManualClock>, keys: &Keys) {
    for i in 0..MANY {
        if let Some(clock) = clock {
            clock.advance(TICK);
        }
        assert!(check(engine, keys.get(i)), "populating must admit");
    }
    assert_eq!(engine.rule("r").expect("rule").active_keys(), MANY);
}

fn ticking(c: &mut Criterion, keys: &Keys) {
    let mut group = group(c, "ticking", 3);

    let clock = ManualClock::new(T0);
    group.bench_function("clock_advance_only", |b| {
        b.iter(|| clock.advance(black_box(TICK)));
    });

    for (name, limits) in ticking_rules() {
        // Engines are built inside the routine, on its first call, so that a filtered-out
        // benchmark costs nothing (criterion calls the routine once per sample).
        let mut hot = None;
        group.bench_function(format!("{name}/hot"), |b| {
            let (clock, e) = hot.get_or_insert_with(|| engine(limits.clone()));
            b.iter(|| {
                clock.advance(TICK);
                black_box(check(e, black_box(HOT)))
            });
        });
        if let Some((_, e)) = hot {
            assert!(check(&e, HOT), "the hot key must still be admitted");
        }

        let mut many = None;
        let mut i = 0;
        group.bench_function(format!("{name}/1M"), |b| {
            let (clock, e) = many.get_or_insert_with(|| {
                let (clock, e) = engine(limits.clone());
                populate(&e, Some(&clock), keys);
                (clock, e)
            });
            b.iter(|| {
                clock.advance(TICK);
                let admitted = check(e, keys.get(i));
                i += 1;
                if i == MANY {
                    i = 0;
                }
                black_box(admitted)
            });
        });
        if let Some((_, e)) = many {
            assert!(check(&e, keys.get(i)), "the keys must still be admitted");
        }
    }
    group.finish();
}

/// Two threads, each checking `iters` times (thread `t`'s `n`th check uses key `key(t, n)`);
/// returns wall time / 2, so criterion divides it into time per decision of both threads.
fn two_threads(
    engine: &Engine,
    iters: u64,
    key: impl Fn(usize, u64) -> usize + Sync,
    keys: &Keys,
) -> Duration {
    let start = Barrier::new(3);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..2)
            .map(|t| {
                let (start, key) = (&start, &key);
                s.spawn(move || {
                    start.wait();
                    let mut admitted = 0u64;
                    for n in 0..iters {
                        admitted += u64::from(check(engine, keys.get(key(t, n))));
                    }
                    assert_eq!(admitted, iters, "every check must be admitted");
                })
            })
            .collect();
        start.wait();
        let began = Instant::now();
        for w in workers {
            w.join().expect("worker");
        }
        began.elapsed() / 2
    })
}

fn fixed(c: &mut Criterion, keys: &Keys) {
    let mut group = group(c, "fixed", 3);

    // The clock is never advanced; it is kept only to build the engine.
    let mut hot = None;
    group.bench_function("token_bucket/hot", |b| {
        let (_, e) = hot.get_or_insert_with(|| engine(fixed_rule()));
        b.iter(|| black_box(check(e, black_box(HOT))));
    });
    // The hot key is keys.get(42).
    group.bench_function("token_bucket/hot/2_threads", |b| {
        let (_, e) = hot.get_or_insert_with(|| engine(fixed_rule()));
        b.iter_custom(|iters| two_threads(e, iters, |_, _| 42, keys));
    });
    drop(hot);

    let mut many = None;
    let populated = || {
        let (clock, e) = engine(fixed_rule());
        populate(&e, None, keys);
        (clock, e)
    };
    let mut i = 0;
    group.bench_function("token_bucket/1M", |b| {
        let (_, e) = many.get_or_insert_with(populated);
        b.iter(|| {
            let admitted = check(e, keys.get(i));
            i += 1;
            if i == MANY {
                i = 0;
            }
            black_box(admitted)
        });
    });
    // The threads walk the keys half a million apart, so they never check the same key at
    // the same time (but do share shards now and then, as real traffic would).
    group.bench_function("token_bucket/1M/2_threads", |b| {
        let (_, e) = many.get_or_insert_with(populated);
        b.iter_custom(|iters| {
            two_threads(e, iters, |t, n| (t * MANY / 2 + n as usize) % MANY, keys)
        });
    });
    group.finish();
}

fn pure(c: &mut Criterion) {
    let mut group = group(c, "pure", 2);

    let l = limit(Algorithm::TokenBucket, 1_000_000_000, SECOND, None);
    let mut state = l.fresh_state();
    let mut now = T0;
    group.bench_function("token_bucket/decide+commit", |b| {
        b.iter(|| {
            now += TICK;
            let d = l.decide(&state, black_box(now), black_box(1), 0);
            if d.allowed() {
                l.commit(&mut state, now, 1);
            }
            black_box(d)
        });
    });

    let limits = [l];
    let mut key = KeyState::fresh(&limits);
    group.bench_function("token_bucket/key_state_check", |b| {
        b.iter(|| {
            now += TICK;
            black_box(key.check(black_box(&limits), black_box(now), 1, 0))
        });
    });
    group.finish();
}

fn cluster(c: &mut Criterion, keys: &Keys) {
    let mut group = group(c, "cluster", 3);
    let clock = Arc::new(ManualClock::new(T0));
    let rule = |name: &str, scope| Rule {
        name: name.into(),
        limits: fixed_rule(),
        scope,
        max_wait: 0,
    };
    let (engine, _global) = Engine::clustered(
        vec![rule("local", Scope::Local), rule("global", Scope::Global)],
        2 * MANY,
        clock,
        Actor::new("node-1", 1),
        Params::default(),
    )
    .expect("valid rules");
    for name in ["local", "global"] {
        let check = |key: &str| check_rule(&engine, name, key);
        group.bench_function(format!("token_bucket/{name}/hot"), |b| {
            b.iter(|| black_box(check(black_box(HOT))));
        });
        // 10,000 keys, cycled (each checked once before measuring).
        let few = 10_000;
        for i in 0..few {
            assert!(check(keys.get(i)), "populating must admit");
        }
        let mut i = 0;
        group.bench_function(format!("token_bucket/{name}/10k"), |b| {
            b.iter(|| {
                let admitted = check(keys.get(i));
                i = (i + 1) % few;
                black_box(admitted)
            });
        });
    }
    group.finish();
}

fn tree(c: &mut Criterion, keys: &Keys) {
    let mut group = group(c, "cluster", 3);
    let clock = Arc::new(ManualClock::new(T0));
    let rule = |name: &str, scope| Rule {
        name: name.into(),
        limits: vec![limit(Algorithm::FixedWindow, MAX_LIMIT, SECOND, None)],
        scope,
        max_wait: 0,
    };
    let me = Actor::new("node-1", 1);
    let (engine, tree) = Engine::clustered_tree(
        vec![rule("local", Scope::Local), rule("tree", Scope::Global)],
        2 * MANY,
        clock.clone(),
        me.clone(),
        TreeParams::default(),
    )
    .expect("valid rules");
    let round = TreeParams::default().round;
    let tick = || {
        clock.advance(round);
        gossamer::cluster::lock(&tree).tick(clock.now());
    };
    gossamer::cluster::lock(&tree).set_members(std::slice::from_ref(&me), clock.now());
    // Past the start's freeze (the slots a previous incarnation could hold room in), to a
    // round early in a slot, so the measurement stays in it.
    while !clock.now().is_multiple_of(SECOND) || clock.now() < T0 + 3 * SECOND {
        tick();
    }
    let few = 10_000;
    for name in ["local", "tree"] {
        // Every key's first check asks for room; the next boundary grants it.
        for key in (0..few).map(|i| keys.get(i)).chain([HOT]) {
            check_rule(&engine, name, key);
        }
    }
    tick();
    for name in ["local", "tree"] {
        let check = |key: &str| check_rule(&engine, name, key);
        assert!(check(HOT), "the hot key was granted its room");
        group.bench_function(format!("fixed_window/{name}/hot"), |b| {
            b.iter(|| black_box(check(black_box(HOT))));
        });
        let mut i = 0;
        group.bench_function(format!("fixed_window/{name}/10k"), |b| {
            b.iter(|| {
                let admitted = check(keys.get(i));
                i = (i + 1) % few;
                black_box(admitted)
            });
        });
    }
    group.finish();
}

fn benches(c: &mut Criterion) {
    let keys = Keys::new();
    tree(c, &keys);
    cluster(c, &keys);
    pure(c);
    fixed(c, &keys);
    ticking(c, &keys);
}

criterion_group!(decisions, benches);
criterion_main!(decisions);
