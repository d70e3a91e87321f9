//! Hot reload of the rules: on SIGHUP, and when the config file's content changes.
//!
//! The file is polled (read and compared) every [`POLL_INTERVAL`] rather than watched with
//! inotify: a Kubernetes ConfigMap volume updates by swapping a `..data` symlink, which
//! reading through the path follows, and a poll needs no extra crate or platform code.
//!
//! A reload re-reads the file with the same flag and environment overrides as at start and
//! validates it completely ([`Config::load`]). Then only the rules are applied
//! ([`App::reload`]): unchanged rules keep their counts, redefined and new ones start fresh,
//! removed ones go. Everything else (`[server]`, `[cluster]`) is read at start only; a change
//! there is logged as needing a restart. A file that cannot be read or validated, or (in a
//! cluster) a change to the global rules, is refused: the running rules stay, the error is
//! logged with the file, rule and field, and counted in `gossamer_config_reloads_total`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tracing::{error, info, warn};

use crate::api::App;
use crate::cluster::node::rules_hash;
use crate::config::{Config, Overrides};

/// How often the config file is read to see whether it changed.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Where the running config came from, so it can be read again.
#[derive(Debug, Clone)]
pub struct ConfigSource {
    /// The config file.
    pub path: PathBuf,
    /// The flags and environment variables that override it (applied again on reload).
    pub overrides: Overrides,
}

/// What the watcher last saw in the file: its bytes, or why it could not be read.
#[derive(Debug, PartialEq)]
enum Seen {
    Bytes(Vec<u8>),
    Unreadable(String),
}

/// Reloads the rules from `source` on SIGHUP and whenever the file's content changes (polled
/// every `poll`). `running` is the config the node started with. Without a source, SIGHUP is
/// only logged (and does not end the process, as it would by default). Runs until dropped.
pub async fn watch(app: Arc<App>, source: Option<ConfigSource>, running: Config, poll: Duration) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hup = match signal(SignalKind::hangup()) {
        Ok(hup) => Some(hup),
        Err(e) => {
            warn!(error = %e, "cannot listen for SIGHUP; config changes are still picked up by polling");
            None
        }
    };
    let Some(source) = source else {
        loop {
            if hangup(&mut hup).await.is_none() {
                return;
            }
            info!("SIGHUP: no --config file, nothing to reload");
        }
    };
    let mut seen = read(&source).await;
    let mut tick = tokio::time::interval(poll);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let signalled = tokio::select! {
            _ = tick.tick() => false,
            received = hangup(&mut hup) => {
                if received.is_none() {
                    hup = None;
                    continue;
                }
                true
            }
        };
        let now = read(&source).await;
        if !signalled && now == seen {
            continue;
        }
        let trigger = if signalled { "SIGHUP" } else { "file changed" };
        seen = now;
        reload(&app, &source, &running, trigger).await;
    }
}

/// The next SIGHUP (`None` once the signal stream ends); never, without a handler.
async fn hangup(hup: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match hup {
        Some(hup) => hup.recv().await,
        None => std::future::pending().await,
    }
}

async fn read(source: &ConfigSource) -> Seen {
    let path = source.path.clone();
    match tokio::task::spawn_blocking(move || std::fs::read(path)).await {
        Ok(Ok(bytes)) => Seen::Bytes(bytes),
        Ok(Err(e)) => Seen::Unreadable(e.to_string()),
        Err(e) => Seen::Unreadable(e.to_string()),
    }
}

/// Reads, validates and applies the config once; logs and counts the result.
pub async fn reload(app: &App, source: &ConfigSource, running: &Config, trigger: &str) {
    let file = source.path.display().to_string();
    let config = match Config::load(Some(&source.path), &source.overrides) {
        Ok(config) => config,
        Err(e) => {
            error!(%trigger, "config reload refused, the running rules stay in force: {e}");
            app.reload_failed();
            return;
        }
    };
    if config.server != running.server {
        warn!(%trigger, %file, "[server] settings changed: they take effect only after a restart");
    }
    if config.cluster != running.cluster {
        warn!(%trigger, %file, "[cluster] settings changed: they take effect only after a restart");
    }
    let longest = |c: &Config| c.rules.iter().map(|r| r.max_wait).max().unwrap_or(0);
    if longest(&config) > longest(running) {
        warn!(
            %trigger, %file,
            "a rule's max_wait is longer than any at start: connections are still cut after request_timeout plus the longest max_wait at start, until a restart"
        );
    }
    let hash = rules_hash(&config);
    match app.reload(config.rules) {
        Ok(changes) => {
            info!(
                %trigger, %file,
                kept = ?changes.kept,
                changed = ?changes.changed,
                added = ?changes.added,
                removed = ?changes.removed,
                "config reloaded (changed rules start with fresh counts)"
            );
            // Peers compare rules by this hash: publish the one now in force.
            if let Some(cluster) = app.cluster.get() {
                cluster.publish_rules_hash(&hash).await;
            }
        }
        Err(e) => error!(%trigger, %file, "config reload refused: {e}"),
    }
}
