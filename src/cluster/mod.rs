//! The cluster: global admission across nodes.
//!
//! - [`global`]: the round protocol and global admission, sans-IO (docs/design.md).
//! - [`membership`]: who is in the cluster, over chitchat (UDP gossip).

pub mod global;
pub mod membership;
