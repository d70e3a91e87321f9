//! The cluster: global admission across nodes.
//!
//! - [`global`]: the round protocol and global admission, sans-IO (docs/design.md).
//! - [`membership`]: who is in the cluster, over chitchat (UDP gossip).
//! - [`quic`]: frames between peers over QUIC, one frame per unidirectional stream.
//! - [`tls`]: mutual TLS under a cluster CA (or ephemeral, unauthenticated certificates).
//! - [`node`]: the shell that runs the round protocol over membership and QUIC.
//! - [`sim`]: the round protocol on virtual time under seeded faults (`gossamer sim`).
//! - [`tree`]: global fixed windows over an aggregation tree (design §11), with its own
//!   simulation; not wired into the node yet.

#[doc(hidden)]
pub mod fuzzing;
pub mod global;
pub mod membership;
pub mod node;
pub mod quic;
pub mod sim;
pub mod tls;
pub mod tree;
