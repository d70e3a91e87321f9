//! The gRPC listener: `envoy.service.ratelimit.v3.RateLimitService` and `grpc.health.v1.Health`
//! on one port (tonic).
//!
//! Status codes, for Envoy's `failure_mode_deny` to act on:
//! - a malformed request is `INVALID_ARGUMENT`, and nothing is counted;
//! - a node that cannot decide answers `UNAVAILABLE`: while it starts (pulling the cluster's
//!   counts), while it drains, and when more than `max_concurrent` requests are being
//!   decided (overloaded). Envoy treats any error as a failed call: it lets the request
//!   through unless its filter sets `failure_mode_deny: true`, then it answers 500.
//!
//! Health: `Check` answers SERVING exactly when `ShouldRateLimit` would decide (not starting,
//! not draining), for the empty service name and for the RLS's; another name is NOT_FOUND.

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tonic::{Request, Response, Status};

use super::proto::health::health_check_response::ServingStatus;
use super::proto::health::health_server::{Health, HealthServer};
use super::proto::health::{HealthCheckRequest, HealthCheckResponse};
use super::proto::rate_limit_service_server::{RateLimitService, RateLimitServiceServer};
use super::proto::{RateLimitRequest, RateLimitResponse};
use super::service::{Answer, Refused, Rls};
use crate::api::App;

/// The RLS's full service name (what health checks may ask for).
pub const SERVICE_NAME: &str = "envoy.service.ratelimit.v3.RateLimitService";

/// The largest request accepted (tonic's default is 4 MiB): room for [`super::service`]'s
/// bounds to refuse oversized descriptors with INVALID_ARGUMENT and a message.
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// Why the node cannot decide now, if it cannot.
fn unready(app: &App) -> Option<&'static str> {
    if !app.ready.load(std::sync::atomic::Ordering::Relaxed) {
        return Some("the node is draining");
    }
    if app.cluster.get().is_some_and(|c| !c.ready()) {
        return Some("the node is starting: pulling the cluster's counts");
    }
    None
}

/// The tonic service: decides on the engine in force.
#[derive(Debug, Clone)]
pub struct RlsService {
    app: Arc<App>,
    rls: Arc<Rls>,
    permits: Arc<Semaphore>,
}

impl RlsService {
    /// The service deciding with `rls` on `app`'s engine, at most `max_concurrent` at once.
    pub fn new(app: Arc<App>, rls: Arc<Rls>, max_concurrent: usize) -> RlsService {
        RlsService {
            app,
            rls,
            permits: Arc::new(Semaphore::new(max_concurrent)),
        }
    }

    /// Decides one request: what `ShouldRateLimit` answers.
    pub async fn should_rate_limit(
        &self,
        request: &RateLimitRequest,
    ) -> Result<RateLimitResponse, Status> {
        let unavailable = |why: String| {
            self.rls
                .metrics
                .unavailable
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Status::unavailable(why)
        };
        if let Some(why) = unready(&self.app) {
            return Err(unavailable(why.to_owned()));
        }
        let Ok(_permit) = self.permits.try_acquire() else {
            return Err(unavailable(
                "overloaded: too many requests being decided".to_owned(),
            ));
        };
        let refused = |e: Refused| match e {
            Refused::Invalid(m) => {
                self.rls
                    .metrics
                    .invalid
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Status::invalid_argument(m)
            }
            Refused::Unavailable(m) => unavailable(m),
        };
        // The engine is loaded for the decision only, never held across an await.
        let first = {
            let served = self.app.served();
            self.rls.decide(&served.engine, request, true)
        };
        match first.map_err(refused)? {
            Answer::Response(r) => Ok(r),
            Answer::Pause(pause, mark) => {
                // A clustered key new at this node gets its lease at the round's instant.
                let clock = self.app.served().engine.shared_clock();
                let done = || self.app.served().engine.lease_in(mark);
                let held = crate::engine::hold_for_lease(&*clock, done, pause).await;
                self.app.metrics.lease_waited(held);
                let served = self.app.served();
                match self
                    .rls
                    .decide(&served.engine, request, false)
                    .map_err(refused)?
                {
                    Answer::Response(r) => Ok(r),
                    Answer::Pause(..) => Err(unavailable("could not decide".to_owned())),
                }
            }
        }
    }
}

#[tonic::async_trait]
impl RateLimitService for RlsService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        RlsService::should_rate_limit(self, request.get_ref())
            .await
            .map(Response::new)
    }
}

/// `grpc.health.v1.Health`.
#[derive(Debug, Clone)]
pub struct HealthService {
    app: Arc<App>,
}

#[tonic::async_trait]
impl Health for HealthService {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        let service = request.get_ref().service.as_str();
        if !service.is_empty() && service != SERVICE_NAME {
            return Err(Status::not_found(format!("unknown service \"{service}\"")));
        }
        let status = match unready(&self.app) {
            None => ServingStatus::Serving,
            Some(_) => ServingStatus::NotServing,
        };
        Ok(Response::new(HealthCheckResponse {
            status: status as i32,
        }))
    }
}

/// Serves the RLS and health on `listener` until `shutdown` completes; in-flight calls
/// finish first.
pub async fn serve(
    listener: TcpListener,
    app: Arc<App>,
    rls: Arc<Rls>,
    max_concurrent: usize,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let service = RlsService::new(app.clone(), rls, max_concurrent);
    tonic::transport::Server::builder()
        .add_service(
            RateLimitServiceServer::new(service).max_decoding_message_size(MAX_MESSAGE_BYTES),
        )
        .add_service(HealthServer::new(HealthService { app }))
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            shutdown,
        )
        .await
}
