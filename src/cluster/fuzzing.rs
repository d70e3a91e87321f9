//! One untrusted frame through a node, as the inbound task would handle it: the body of the
//! `cargo fuzz` target (`fuzz/fuzz_targets/frame.rs`) and of a property test, so both check
//! the same thing. Not part of the supported API.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use super::global::{Global, MemberInfo, Params};
use crate::counter::Actor;
use crate::limiter::{Algorithm, Limit, MILLISECOND, SECOND};
use crate::wire;

/// The round the fuzzed node is in.
pub const NOW: u64 = 1_700_000_000 * SECOND + 10 * MILLISECOND;

/// A node `a` with peer `b`, rules `w` (fixed window 100/s), `c` (sliding counter 100/s),
/// `l` (sliding log 160 per 1.6 s) and `t` (token bucket 100/s).
pub fn node() -> Global {
    let limit = |a, n, p| Limit::new(a, n, p, None).expect("valid limit");
    let g = Global::new(
        Actor::new("a", 1),
        Params::default(),
        vec![
            ("w".into(), vec![limit(Algorithm::FixedWindow, 100, SECOND)]),
            (
                "c".into(),
                vec![limit(Algorithm::SlidingWindowCounter, 100, SECOND)],
            ),
            (
                "l".into(),
                vec![limit(Algorithm::SlidingWindowLog, 160, 1600 * MILLISECOND)],
            ),
            ("t".into(), vec![limit(Algorithm::TokenBucket, 100, SECOND)]),
        ],
        Arc::new(AtomicUsize::new(0)),
        10_000,
    )
    .expect("valid rules");
    g.set_members(
        &[MemberInfo {
            actor: Actor::new("b", 5),
            alive: true,
            left: false,
            published_through: None,
            numbers: None,
        }],
        NOW,
    );
    g
}

/// Decodes `bytes` and, if it is a message, hands it to a fresh [`node`] as if peer `b` sent
/// it, then runs the round's boundary and instant and a check of every rule. Panics only if
/// the node breaks an invariant: its own count raised by a peer, or a window count above what
/// two nodes could ever admit.
pub fn frame(bytes: &[u8]) {
    let Ok(message) = wire::decode(bytes) else {
        return;
    };
    let g = node();
    let _ = g.receive("b", message, NOW);
    g.tick(NOW);
    g.tick(NOW + 30 * MILLISECOND);
    for (rule, index) in [("w", 0), ("c", 1), ("l", 2), ("t", 3)] {
        let r = g.rule_index(rule).expect("rule exists");
        assert_eq!(r, index);
        let _ = g.check(r, "k", 1, 0, NOW + 31 * MILLISECOND);
        let _ = g.status(r, "k", NOW + 31 * MILLISECOND);
    }
    let slot = NOW / SECOND;
    for key in ["k", ""] {
        assert!(g.known_total("w", 0, key, slot) <= 200);
        assert!(g.known_total("c", 0, key, slot) <= 200);
    }
}
