//! Cluster plumbing: who is in the cluster ([`membership`]).

pub mod membership;
