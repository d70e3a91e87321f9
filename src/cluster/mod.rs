//! The cluster: global admission across nodes.
//!
//! - [`global`]: the round protocol and global admission, sans-IO (docs/design.md).
//! - [`membership`]: who is in the cluster, over chitchat (UDP gossip).
//! - [`quic`]: frames between peers over QUIC, one frame per unidirectional stream.
//! - [`tls`]: mutual TLS under a cluster CA (or ephemeral, unauthenticated certificates).
//! - [`node`]: the shell that runs the round protocol over membership and QUIC.
//! - [`sim`]: the round protocol on virtual time under seeded faults (`gossamer sim`).
//! - [`tree`]: global fixed windows over an aggregation tree (design §11), with its own
//!   simulation; a node runs it with `[cluster] exchange = "tree"`.

#[doc(hidden)]
pub mod fuzzing;
pub mod global;
pub mod membership;
pub mod node;
pub mod quic;
pub mod sim;
pub mod tls;
pub mod tree;

use std::sync::{Arc, Mutex};

/// What counts a clustered node's global rules: the full mesh's rounds, or the aggregation
/// tree (`[cluster] exchange`).
#[derive(Clone, Debug)]
pub enum Exchange {
    /// Every node sends its frame to every other ([`global::Global`]).
    Mesh(Arc<global::Global>),
    /// Sums up and totals down a tree: the rounds ([`tree::Tree`], `&mut self`: one lock
    /// around it) and the keys they share with the checks ([`tree::TreeKeys`]).
    Tree(Arc<Mutex<tree::Tree>>, Arc<tree::TreeKeys>),
}

/// The tree, locked (a panic while it was held leaves it as it was: every method keeps its
/// invariants between statements that could panic, and none are expected to).
pub fn lock(tree: &Mutex<tree::Tree>) -> std::sync::MutexGuard<'_, tree::Tree> {
    tree.lock().unwrap_or_else(|p| p.into_inner())
}
