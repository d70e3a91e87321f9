//! The cluster: global admission across nodes.
//!
//! - [`global`]: the round protocol and global admission, sans-IO (docs/design.md).

pub mod global;
