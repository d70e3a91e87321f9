//! Everything between nodes.
//!
//! - [`tls`]: mutual TLS under a cluster CA (or ephemeral, unauthenticated), and
//!   [`write_certs`](tls::write_certs) to bootstrap the certificates.

pub mod tls;
