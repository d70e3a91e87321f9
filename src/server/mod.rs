//! The node's HTTP server: binds, serves with a bound on connections and a timeout on slow
//! clients, sweeps idle keys in the background, and drains on shutdown.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tracing::{debug, info, warn};

use crate::api::{App, Service};
use crate::clock::Clock;
use crate::cluster::Exchange;
use crate::cluster::global::Params;
use crate::cluster::node::{Cluster, generation, rules_hash};
use crate::cluster::tree::TreeParams;
use crate::config::{Config, ExchangeMode};
use crate::counter::Actor;
use crate::engine::Engine;
use crate::rls::Rls;

pub mod reload;
mod watchdog;

pub use reload::ConfigSource;

/// A bound, not yet serving, node.
#[derive(Debug)]
pub struct Node {
    listener: TcpListener,
    /// Envoy's rate limit service (gRPC), when `[server] grpc` is set.
    grpc: Option<TcpListener>,
    app: Arc<App>,
    config: Config,
    /// Where to re-read the rules from on SIGHUP or a change (none: built-in rules).
    source: Option<ConfigSource>,
}

impl Node {
    /// Builds the engine from `config` and binds the HTTP listener. With a gossip address,
    /// also joins the cluster: global rules are then counted across it.
    pub async fn bind(config: Config, clock: Arc<dyn Clock>) -> io::Result<Node> {
        let http = config.server.http;
        let listener = TcpListener::bind(http)
            .await
            .map_err(|e| io::Error::new(e.kind(), format!("cannot listen on {http}: {e}")))?;
        let grpc = match config.server.grpc {
            None => None,
            Some(addr) => Some(TcpListener::bind(addr).await.map_err(|e| {
                io::Error::new(e.kind(), format!("cannot listen for gRPC on {addr}: {e}"))
            })?),
        };
        let max_keys = config.server.max_keys;
        let (engine, cluster) = if config.cluster.gossip.is_some() {
            let round = config.cluster.gossip_interval.as_nanos() as u64;
            let me = Actor::new(config.server.node_id.clone(), generation(clock.now()));
            let (engine, exchange) = match config.cluster.exchange {
                ExchangeMode::Mesh => {
                    let params = Params {
                        round,
                        settle: round / 4,
                        on_partition: config.cluster.on_partition,
                        ..Params::default()
                    };
                    let (engine, global) = Engine::clustered(
                        config.rules.clone(),
                        max_keys,
                        clock.clone(),
                        me.clone(),
                        params,
                    )
                    .map_err(|e| io::Error::other(format!("global rules: {e}")))?;
                    (engine, Exchange::Mesh(global))
                }
                ExchangeMode::Tree => {
                    let params = TreeParams {
                        round,
                        ..TreeParams::default()
                    };
                    let (engine, tree) = Engine::clustered_tree(
                        config.rules.clone(),
                        max_keys,
                        clock.clone(),
                        me.clone(),
                        params,
                    )
                    .map_err(|e| io::Error::other(format!("global rules: {e}")))?;
                    let keys = crate::cluster::lock(&tree).keys();
                    (engine, Exchange::Tree(tree, keys))
                }
            };
            (engine, Some((exchange, me)))
        } else {
            (
                Engine::new(config.rules.clone(), max_keys, clock.clone()),
                None,
            )
        };
        let engine = engine.with_reservations(crate::reserve::ReservationParams {
            timeout: u64::try_from(config.server.reservation_timeout.as_nanos())
                .unwrap_or(u64::MAX),
            max_open: config.server.max_reservations,
        });
        let app = App::new(
            engine,
            config.server.node_id.clone(),
            config.cluster.gossip,
            config.server.request_timeout,
        );
        if grpc.is_some() {
            let rls = Rls::new(&config.rls, clock.clone(), max_keys);
            let _ = app.rls.set(Arc::new(rls));
        } else if config.rls.config.is_some() {
            warn!(
                "an RLS config is set but no gRPC address ([server] grpc, --grpc): Envoy cannot ask this node; its limits are served to the HTTP API only, as rls.* rules"
            );
        }
        if let Some((exchange, me)) = cluster {
            let cluster = Cluster::start(&config, exchange, me, clock, rules_hash(&config))
                .await
                .map_err(|e| io::Error::other(format!("cannot start the cluster: {e}")))?;
            let _ = app.cluster.set(Arc::new(cluster));
        }
        Ok(Node {
            listener,
            grpc,
            app: Arc::new(app),
            config,
            source: None,
        })
    }

    /// Reloads the rules from `source` on SIGHUP and when the file changes (see [`reload`]).
    pub fn reload_from(mut self, source: ConfigSource) -> Node {
        self.source = Some(source);
        self
    }

    /// Where the HTTP API listens (useful after binding port 0).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Where Envoy's rate limit service listens, when configured (useful after binding port 0).
    pub fn grpc_addr(&self) -> Option<SocketAddr> {
        self.grpc.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// The shared application state (engine, metrics).
    pub fn app(&self) -> Arc<App> {
        self.app.clone()
    }

    /// Serves until `shutdown` completes, then stops accepting, lets in-flight requests
    /// finish for up to the configured grace period, and returns.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> io::Result<()> {
        let Node {
            listener,
            grpc,
            app,
            config,
            source,
        } = self;
        let server = &config.server;
        info!(http = %listener.local_addr()?, node_id = %server.node_id, rules = config.rules.len(), "serving");
        let (stop_grpc, grpc_stopped) = tokio::sync::watch::channel(false);
        let grpc_task = match (grpc, app.rls.get()) {
            (Some(grpc), Some(rls)) => {
                info!(grpc = %grpc.local_addr()?, domains = config.rls.domains.len(), shadow_mode = config.rls.shadow_mode, "serving Envoy's rate limit service");
                let mut stopped = grpc_stopped.clone();
                Some(tokio::spawn(crate::rls::grpc::serve(
                    grpc,
                    app.clone(),
                    rls.clone(),
                    config.rls.max_concurrent,
                    async move {
                        let _ = stopped.wait_for(|stop| *stop).await;
                    },
                )))
            }
            _ => None,
        };
        let service = Service::new(app.clone());
        let permits = Arc::new(Semaphore::new(server.max_connections));
        let graceful = GracefulShutdown::new();
        // Slow and idle clients are cut off by a watchdog per connection (see `watchdog`),
        // not by hyper's header-read timer, which costs a timer per request.
        let mut builder = http1::Builder::new();
        builder.header_read_timeout(None).keep_alive(true);
        let longest_wait = config.rules.iter().map(|r| r.max_wait).max().unwrap_or(0);
        let limits = watchdog::Limits {
            request: server.request_timeout + Duration::from_nanos(longest_wait),
            idle: server.request_timeout,
        };
        let sweeper = tokio::spawn(sweep(app.clone(), server.sweep_interval));
        let reloader = tokio::spawn(reload::watch(
            app.clone(),
            source,
            config.clone(),
            reload::POLL_INTERVAL,
        ));
        tokio::pin!(shutdown);
        loop {
            let permit = tokio::select! {
                () = &mut shutdown => break,
                permit = permits.clone().acquire_owned() => permit.expect("semaphore is never closed"),
            };
            let (stream, peer) = tokio::select! {
                () = &mut shutdown => break,
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let _ = stream.set_nodelay(true);
            let activity = watchdog::Activity::new();
            let io = TokioIo::new(watchdog::Watched::new(stream, activity.clone()));
            let connection = graceful.watch(builder.serve_connection(io, service.clone()));
            tokio::spawn(async move {
                tokio::select! {
                    result = connection => if let Err(e) = result {
                        debug!(%peer, error = %e, "connection ended with an error");
                    },
                    () = watchdog::watch(activity, limits) => {
                        debug!(%peer, "closed a stalled connection");
                    }
                }
                drop(permit);
            });
        }
        app.ready.store(false, Ordering::Relaxed);
        drop(listener);
        let _ = stop_grpc.send(true);
        sweeper.abort();
        reloader.abort();
        info!(grace = ?server.shutdown_grace, "shutting down: draining in-flight requests");
        let drained = async {
            graceful.shutdown().await;
            if let Some(task) = grpc_task {
                match task.await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => warn!(error = %e, "the gRPC server ended with an error"),
                    Err(e) => warn!(error = %e, "the gRPC server task failed"),
                }
            }
        };
        match tokio::time::timeout(server.shutdown_grace, drained).await {
            Ok(()) => info!("all connections closed"),
            Err(_) => warn!("grace period over; closing remaining connections"),
        }
        if let Some(cluster) = app.cluster.get() {
            // Only now, when nothing more is admitted: publish the last round, then leave.
            cluster.shutdown().await;
        }
        Ok(())
    }
}

/// Evicts fresh keys every `interval`.
async fn sweep(app: Arc<App>, interval: Duration) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        // A sweep of a million keys takes milliseconds: keep it off the async workers.
        let served = app.served_full();
        let rls = app.rls.get().cloned();
        let swept = move || served.engine.sweep() + rls.map_or(0, |r| r.sweep());
        match tokio::task::spawn_blocking(swept).await {
            Ok(evicted) if evicted > 0 => debug!(evicted, "swept fresh keys"),
            Ok(_) => {}
            Err(e) => warn!(error = %e, "sweep failed"),
        }
    }
}
