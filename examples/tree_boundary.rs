//! How long a round's boundary takes in the aggregation tree, by keys tracked.
//!
//!     cargo run --release --example tree_boundary
//!
//! One `Tree` (a member of a view of 3, fan-out 8; the others never answer, so it sends up
//! at its deadline) tracks N keys of a fixed window, each checked once a round; the time of
//! `Tree::tick` at each of 10 boundaries is printed (median and max). It holds the tree's
//! lock (the rounds' own), and a key's shard lock for 16 keys at a time: a check waits for
//! at most that (design.md §11.1).

use gossamer::cluster::tree::{Tree, TreeParams};
use gossamer::counter::Actor;
use gossamer::limiter::{Algorithm, Limit, SECOND};

fn main() {
    let t0 = 1_700_000_000 * SECOND;
    let limit = Limit::new(Algorithm::FixedWindow, 1 << 40, SECOND, None).expect("valid");
    let me = Actor::new("n0", 1);
    let mut tree = Tree::new(me, vec![("w".to_owned(), limit)], TreeParams::default(), t0)
        .expect("valid rules");
    let view: Vec<Actor> = (0..3).map(|i| Actor::new(format!("n{i}"), 1)).collect();
    tree.set_members(&view, t0);
    let checks = tree.keys();
    let round = TreeParams::default().round;
    let mut now = t0;
    let mut tick = |tree: &mut Tree| {
        now += round;
        let started = std::time::Instant::now();
        std::hint::black_box(tree.tick(now));
        (now, started.elapsed().as_secs_f64() * 1e3)
    };
    for _ in 0..100 {
        tick(&mut tree);
    }
    for n in [1_000usize, 10_000, 100_000] {
        let keys: Vec<String> = (0..n).map(|i| format!("user-{i:08}")).collect();
        let (mut at, _) = tick(&mut tree);
        let mut times = Vec::new();
        for _ in 0..10 {
            for k in &keys {
                checks.decide("w", k, 1, at);
            }
            let (next, ms) = tick(&mut tree);
            at = next;
            times.push(ms);
        }
        times.sort_by(f64::total_cmp);
        println!(
            "{n} keys: boundary median {:.2} ms, max {:.2} ms ({:.2} us a key)",
            times[5],
            times[9],
            times[5] * 1e3 / n as f64
        );
    }
}
