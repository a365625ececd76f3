//! The process lifecycle: signals, reload, drain, systemd and logs.

pub mod startup_pages;
pub mod systemd;
pub mod watch;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures_util::StreamExt;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook_tokio::Signals;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::{layers, CommandLine, Config};
use crate::listen::Listeners;
use crate::logging;
use crate::server::{self, RunningServer};
use crate::state::{Shared, Snapshot};

/// Raises the soft open-file limit to the hard limit, as the Go runtime does at start: every
/// tunnel holds sockets.
pub fn raise_nofile_limit() {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => tracing::debug!(limit, "open-file limit"),
        Err(e) => tracing::warn!(error = %e, "could not raise the open-file limit"),
    }
}

/// What a reload did.
#[derive(Debug)]
pub enum ReloadOutcome {
    Applied {
        generation: u64,
        /// Restart-only settings whose new values were not applied.
        kept: Vec<&'static str>,
    },
    Failed(String),
}

/// Re-reads every layer (the file, the environment, the original command line) and swaps
/// in a new snapshot when it validates.
pub struct Reloader {
    cli: CommandLine,
    shared: Arc<Shared>,
    generation: AtomicU64,
}

impl Reloader {
    pub fn new(cli: CommandLine, shared: Arc<Shared>) -> Reloader {
        Reloader {
            cli,
            shared,
            generation: AtomicU64::new(0),
        }
    }

    fn build(&self) -> Result<(Snapshot, Vec<&'static str>), String> {
        let mut options = layers::load(&self.cli).map_err(|e| e.to_string())?;
        if options.dev {
            crate::dev::apply(&mut options).map_err(|e| format!("{e:#}"))?;
        }
        let running = self.shared.snapshot();
        if options.server_id.is_none() {
            // Without an explicit id the running one stays: a reload must not mint a new one.
            options.server_id = Some(running.config.server_id.clone());
        }
        let mut config =
            Config::from_options(&options).map_err(|e| format!("invalid configuration: {e}"))?;
        let kept = config.keep_restart_only(&running.config);
        let snapshot = Snapshot::build(config).map_err(|e| e.to_string())?;
        Ok((snapshot, kept))
    }

    /// Runs one reload, with its notifications, metrics and log lines.
    pub fn reload(&self, trigger: &str) -> ReloadOutcome {
        systemd::reloading();
        let outcome = match self.build() {
            Ok((snapshot, kept)) => {
                let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
                let config = snapshot.config.clone();
                self.shared.apply(snapshot);
                logging::set_verbosity(config.verbosity, &config.vmodule);
                for setting in &kept {
                    tracing::warn!(
                        reload_generation = generation,
                        setting,
                        "this setting changed but needs a restart; keeping the running value"
                    );
                }
                tracing::info!(
                    reload_generation = generation,
                    trigger,
                    "configuration reloaded"
                );
                self.shared.metrics.runtime.reload(true);
                systemd::ready(&self.shared.status_line());
                ReloadOutcome::Applied { generation, kept }
            }
            Err(cause) => {
                tracing::error!(trigger, cause = %cause, "RELOAD FAILED: keeping the running configuration");
                self.shared.metrics.runtime.reload(false);
                systemd::reload_failed(&cause);
                ReloadOutcome::Failed(cause)
            }
        };
        outcome
    }
}

fn start_watcher(
    shared: &Shared,
    changed: &mpsc::Sender<()>,
) -> Option<notify::RecommendedWatcher> {
    let config = shared.snapshot().config.clone();
    if !config.watch_files {
        return None;
    }
    match watch::watch(watch::watched_files(&config), changed.clone()) {
        Ok(watcher) => Some(watcher),
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch the configuration and certificate files; reload with SIGHUP");
            None
        }
    }
}

/// Runs the server as a service until SIGTERM or SIGINT: reloads on SIGHUP and on file
/// changes, talks to systemd, then drains. A second stop signal exits at once.
pub async fn run_service(
    cli: CommandLine,
    config: Config,
    listeners: Listeners,
) -> Result<(), server::RunError> {
    let mut signals = Signals::new([SIGHUP, SIGTERM, SIGINT]).map_err(server::RunError::Signals)?;
    let running: RunningServer = server::spawn(config, listeners)?;
    let shared = running.shared.clone();
    let reloader = Arc::new(Reloader::new(cli, shared.clone()));
    let heartbeat = CancellationToken::new();
    // Watches are in place before READY=1: a change made right after readiness is seen.
    let (changed_tx, mut changed_rx) = mpsc::channel::<()>(1);
    let mut watcher = start_watcher(&shared, &changed_tx);
    systemd::ready(&shared.status_line());
    let status = shared.clone();
    systemd::spawn_heartbeat(move || status.status_line(), heartbeat.clone());
    loop {
        let trigger = tokio::select! {
            signal = signals.next() => match signal {
                Some(SIGHUP) => "SIGHUP",
                Some(_) | None => break,
            },
            Some(()) = changed_rx.recv() => "file change",
        };
        let reloader = reloader.clone();
        let outcome = tokio::task::spawn_blocking(move || reloader.reload(trigger))
            .await
            .unwrap_or_else(|e| ReloadOutcome::Failed(e.to_string()));
        if matches!(outcome, ReloadOutcome::Applied { .. }) {
            // The set of files may have changed with the configuration.
            drop(watcher.take());
            watcher = start_watcher(&shared, &changed_tx);
        }
    }
    drop(watcher);
    systemd::stopping(&format!("draining {} tunnels", shared.counts().1));
    let drain = shared.snapshot().config.graceful_shutdown_timeout;
    tokio::select! {
        _ = running.shutdown(drain) => {}
        _ = signals.next() => {
            tracing::warn!("second stop signal: exiting now");
            logging::finish();
            std::process::exit(1);
        }
    }
    heartbeat.cancel();
    Ok(())
}
