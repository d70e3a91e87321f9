//! Everything between nodes: transport security and the frame transport.
//!
//! - [`tls`]: mutual TLS under a cluster CA (or ephemeral, unauthenticated), and
//!   [`write_certs`](tls::write_certs) to bootstrap the certificates.
//! - [`quic`]: one frame per QUIC unidirectional stream, to and from authenticated peers.

pub mod quic;
pub mod tls;
