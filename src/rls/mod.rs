//! Envoy's global rate limit service (RLS): the `ShouldRateLimit` gRPC API, and
//! envoyproxy/ratelimit's YAML configuration, counted by the engine's global rules.
//!
//! - [`config`]: the YAML files, read and validated into plain values; their rules. Pure.
//! - [`matcher`]: which configured descriptor a request's descriptor matches; its counter key
//!   and metric label. Pure.
//! - [`service`]: a validated request decided on the engine, all or nothing; metrics.
//! - [`grpc`]: the tonic services (RLS and `grpc.health.v1`) and their listener.

pub mod config;
pub mod grpc;
pub mod matcher;
pub mod service;

pub use service::{Rls, RlsSettings};

/// Messages and services generated from `proto/` by `build.rs`, in modules that mirror the
/// protobuf packages (prost refers across packages by relative paths).
#[allow(
    missing_docs,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic
)]
pub mod proto {
    pub mod envoy {
        pub mod service {
            pub mod ratelimit {
                pub mod v3 {
                    tonic::include_proto!("envoy.service.ratelimit.v3");
                }
            }
        }
        pub mod extensions {
            pub mod common {
                pub mod ratelimit {
                    pub mod v3 {
                        tonic::include_proto!("envoy.extensions.common.ratelimit.v3");
                    }
                }
            }
        }
        pub mod r#type {
            pub mod v3 {
                tonic::include_proto!("envoy.r#type.v3");
            }
        }
        pub mod config {
            pub mod core {
                pub mod v3 {
                    tonic::include_proto!("envoy.config.core.v3");
                }
            }
        }
    }
    pub mod grpc {
        pub mod health {
            pub mod v1 {
                tonic::include_proto!("grpc.health.v1");
            }
        }
    }
    pub use envoy::config::core::v3::HeaderValue;
    pub use envoy::extensions::common::ratelimit::v3::{
        RateLimitDescriptor, rate_limit_descriptor,
    };
    pub use envoy::service::ratelimit::v3::{
        RateLimitRequest, RateLimitResponse, rate_limit_response, rate_limit_service_client,
        rate_limit_service_server,
    };
    pub use envoy::r#type::v3::RateLimitUnit;
    pub use grpc::health::v1 as health;
}
