//! Hot reload of the rules: on SIGHUP, and when the config file's content changes.
//!
//! The file is polled (read and compared) every [`POLL_INTERVAL`] rather than watched with
//! inotify: a Kubernetes ConfigMap volume updates by swapping a `..data` symlink, which
//! reading through the path follows, and a poll needs no extra crate or platform code. An
//! edit made while the node was starting (after the config was loaded, before the first
//! poll) is applied when the watch begins.
//!
//! A reload re-reads the file with the same flag and environment overrides as at start and
//! validates it completely ([`Config::load`]). Then only the rules are applied
//! ([`App::reload`]): unchanged rules keep their counts, and so do rules whose limits change
//! only in their numbers; otherwise redefined and new ones start fresh, removed ones go. Everything else (`[server]`, `[cluster]`) is read at start only; a change
//! there is logged as needing a restart. A file that cannot be read or validated, or (in a
//! cluster) a change to the global rules, is refused: the running rules stay, the error is
//! logged with the file, rule and field, and counted in `gossamer_config_reloads_total`.
//!
//! The RLS's YAML (`[rls] config` or `--rls-config`, a file or every `*.yaml`/`*.yml` of a
//! directory) is polled the same way and reloads the same way: its limits are rules, so in
//! a cluster a change to them is refused like any change to global rules, while a change
//! that keeps the same set of limits (descriptors, values, shadow mode, names) applies at
//! once.

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
    /// The config file (none: the RLS's YAML alone, from `--rls-config`).
    pub path: Option<PathBuf>,
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
    let mut rls = running.rls.config.clone();
    let mut seen = read(&source, rls.clone()).await;
    // `seen` is read now, not when `running` was loaded: an edit made in between would be
    // the baseline and never applied. So compare what the files now say with `running`.
    let source_now = source.clone();
    let current = tokio::task::spawn_blocking(move || {
        Config::load(source_now.path.as_deref(), &source_now.overrides)
    })
    .await;
    if matches!(current, Ok(Ok(config)) if config != running)
        && let Some(config) = reload(&app, &source, &running, "changed since start").await
    {
        rls = config.rls.config;
    }
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
        let now = read(&source, rls.clone()).await;
        if !signalled && now == seen {
            continue;
        }
        let trigger = if signalled { "SIGHUP" } else { "file changed" };
        seen = now;
        if let Some(config) = reload(&app, &source, &running, trigger).await {
            rls = config.rls.config;
        }
    }
}

/// The next SIGHUP (`None` once the signal stream ends); never, without a handler.
async fn hangup(hup: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match hup {
        Some(hup) => hup.recv().await,
        None => std::future::pending().await,
    }
}

/// The config file's bytes, then each RLS file's name and bytes.
async fn read(source: &ConfigSource, rls: Option<PathBuf>) -> Seen {
    let path = source.path.clone();
    let all = move || -> Result<Vec<u8>, String> {
        let mut bytes = match &path {
            Some(path) => std::fs::read(path).map_err(|e| e.to_string())?,
            None => Vec::new(),
        };
        if let Some(rls) = &rls {
            let files = crate::rls::config::files(rls).map_err(|e| e.to_string())?;
            for file in files {
                bytes.extend_from_slice(file.to_string_lossy().as_bytes());
                bytes.push(0);
                bytes.extend(std::fs::read(&file).map_err(|e| e.to_string())?);
            }
        }
        Ok(bytes)
    };
    match tokio::task::spawn_blocking(all).await {
        Ok(Ok(bytes)) => Seen::Bytes(bytes),
        Ok(Err(e)) => Seen::Unreadable(e),
        Err(e) => Seen::Unreadable(e.to_string()),
    }
}

/// Reads, validates and applies the config once; logs and counts the result. Returns the
/// config read, if it could be read and validated.
pub async fn reload(
    app: &App,
    source: &ConfigSource,
    running: &Config,
    trigger: &str,
) -> Option<Config> {
    let file = match (&source.path, &source.overrides.rls_config) {
        (Some(path), _) => path.display().to_string(),
        (None, Some(rls)) => rls.display().to_string(),
        (None, None) => "<built-in rules>".to_owned(),
    };
    let config = match Config::load(source.path.as_deref(), &source.overrides) {
        Ok(config) => config,
        Err(e) => {
            error!(%trigger, "config reload refused, the running rules stay in force: {e}");
            app.reload_failed();
            return None;
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
    match app.reload(config.rules.clone()) {
        Ok(changes) => {
            info!(
                %trigger, %file,
                kept = ?changes.kept,
                relimited = ?changes.relimited,
                changed = ?changes.changed,
                added = ?changes.added,
                removed = ?changes.removed,
                "config reloaded (relimited rules keep their counts, changed rules start afresh)"
            );
            // Peers compare rules by this hash: publish the one now in force.
            if let Some(cluster) = app.cluster.get() {
                cluster.publish_rules_hash(&hash).await;
            }
            if let Some(rls) = app.rls.get() {
                rls.reload(&config.rls);
                info!(%trigger, domains = config.rls.domains.len(), shadow_mode = config.rls.shadow_mode, "RLS config reloaded");
            }
        }
        Err(e) => error!(%trigger, %file, "config reload refused: {e}"),
    }
    Some(config)
}
