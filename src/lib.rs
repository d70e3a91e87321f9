//! gossamer: a cluster-native rate limiter.
//!
//! An application asks its node-local gossamer "may key K spend cost C under rule R?" over
//! HTTP and gets an answer from local state in microseconds.
//!
//! # Layout
//! - [`limiter`]: the five algorithms, pure functions of (state, now, cost); composite rules.
//! - [`store`]: the sharded, bounded keyed store that owns concurrency and eviction.
//! - [`engine`]: rules + store + clock; the only reader of the time.
//! - [`reserve`]: reserve-then-settle bookkeeping: open reservations, credit on clustered keys.
//! - [`clock`]: the [`Clock`](clock::Clock) trait, the system clock and a manual clock.
//! - [`cluster`]: global limits across nodes: the round protocol (sans-IO), membership by
//!   gossip (chitchat), frames over QUIC with mutual TLS, and the shell that runs them.
//! - [`counter`]: cluster-wide counts of global rules as CRDT counters with dot deltas; pure.
//! - [`wire`]: the one versioned codec for every message between nodes.
//! - [`config`]: TOML + environment + flags, validated into one [`Config`](config::Config).
//! - [`api`]: HTTP routes, rate-limit headers, the one mapping from errors to responses.
//! - [`metrics`]: Prometheus counters and the check-latency histogram.
//! - [`server`]: binds, serves with bounded connections and timeouts, drains on shutdown.
//! - [`demo`]: `gossamer demo`, a 3-node cluster on loopback under a skewed load.
//!
//! Dependencies point one way: `server -> api -> engine -> {limiter, store, clock}`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod api;
pub mod batch;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod counter;
pub mod demo;
pub mod engine;
pub mod limiter;
pub mod metrics;
pub mod reserve;
pub mod rls;
pub mod server;
pub mod store;
pub mod wire;
