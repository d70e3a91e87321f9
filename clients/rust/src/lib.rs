//! A client for gossamer, the cluster-native rate limiter that runs beside your app: it asks
//! the node on this machine whether a key may spend a cost under a rule.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! # async fn run() -> Result<(), gossamer_client::Error> {
//! let client = gossamer_client::Client::builder("http://127.0.0.1:7070")
//!     .fail_open(true)
//!     .build()?;
//!
//! let decision = client.check("api", "user-42", 1).await?; // admitted or not: a Decision
//! if !decision.allowed {
//!     println!("retry in {:?}", decision.retry_after()); // milliseconds, not whole seconds
//! }
//! // Waits the node's retry_after_ms (plus jitter), or fails with Error::RateLimited.
//! client.acquire("api", "user-42", 1, Duration::from_secs(2)).await?;
//! // Runs the closure's future only once admitted.
//! let answer = client
//!     .rate_limited("free", "tenant-42", 1, Duration::ZERO, || async { 42 })
//!     .await?;
//! // Reserves an estimate, runs the closure's future only once admitted, and settles with
//! // the actual cost it reports (here 350 of the 2000 tokens reserved).
//! let reply = client
//!     .reserved("llm", "user-42", 2000, |_reservation| async {
//!         Ok::<_, gossamer_client::Error>(("reply", 350))
//!     })
//!     .await?;
//! # let _ = (answer, reply);
//! # Ok(())
//! # }
//! ```
//!
//! The calls and their behaviour are those of the Python client (`clients/python`): the same
//! names, defaults, waits, errors and fail-open policy.
//!
//! # Layout
//! - [`Client`] / [`ClientBuilder`] (`client.rs`): `check`, `acquire`, `status`,
//!   `rate_limited`, `reserve`, `settle`, `reserved`; the fail-open policy; the wait loop.
//! - [`Reservation`], [`Settlement`] and [`SettleTarget`] (`reserve.rs`): the answers of a
//!   reserve and a settle, and reading them.
//! - [`Decision`] and [`Outcome`] (`decision.rs`): the node's answer, and reading one.
//! - [`Error`] (`error.rs`): every way a call fails.
//! - `pool.rs`: keep-alive HTTP/1.1 connections (hyper), reused across calls and callers.
//! - `wait.rs`: how long to sleep after a denial (pure), and the jitter's generator.
//! - `endpoint.rs`: the node's URL, and the paths and query strings sent to it.
//! - [`raw`]: one bare HTTP/1.1 connection to a node, for tools and tests that want the
//!   whole answer (status, headers, body) rather than a decision.
//!
//! No global state: two clients share nothing. A [`Client`] is cheap to clone, and clones
//! share its connections.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod client;
mod decision;
mod endpoint;
mod error;
#[cfg(test)]
mod fake;
mod pool;
pub mod raw;
mod reserve;
mod wait;

pub use client::{
    Client, ClientBuilder, DEFAULT_CONNECT_TIMEOUT, DEFAULT_JITTER, DEFAULT_MAX_IDLE,
    DEFAULT_TIMEOUT, DEFAULT_URL,
};
pub use decision::{Decision, Outcome};
pub use error::Error;
pub use reserve::{Reservation, SettleTarget, Settlement};
