//! What a test clears from the environment before it starts the `gossamer` binary, so the
//! test runner's own settings cannot leak in.

/// Variables the binary reads, and `RUST_LOG`, which sets its log level.
pub const GOSSAMER_ENV: [&str; 12] = [
    "GOSSAMER_CONFIG",
    "GOSSAMER_GRPC",
    "GOSSAMER_RLS_CONFIG",
    "GOSSAMER_HTTP",
    "GOSSAMER_NODE_ID",
    "GOSSAMER_GOSSIP",
    "GOSSAMER_ADVERTISE",
    "GOSSAMER_SEEDS",
    "GOSSAMER_CLUSTER_ID",
    "GOSSAMER_LOG_FORMAT",
    "GOSSAMER_URL",
    "RUST_LOG",
];
