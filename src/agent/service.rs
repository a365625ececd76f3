//! The agent as a service: signals, reload (SIGHUP and watched files), systemd notify and
//! watchdog, and the drain.
//!
//! READY=1 is sent once the ports listen, not once a server is connected, with a STATUS that
//! says whether any server is: a node that boots while its control plane is unreachable
//! would otherwise fail its start and be restarted in a loop by systemd, while the agent's
//! own retries (and `/readyz`) already say what an operator needs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook_tokio::Signals;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{AgentConfig, AgentListeners, AgentOptions, RunningAgent, Snapshot};
use crate::config::{layers, CommandLine};
use crate::lifecycle::startup_pages::{self, StartupMappings};
use crate::lifecycle::{systemd, watch};
use crate::logging;

/// Re-reads every layer and builds a snapshot, keeping what needs a restart.
fn rebuild(
    cli: &CommandLine<AgentOptions>,
    running: &AgentConfig,
) -> Result<(Snapshot, Vec<&'static str>), String> {
    let mut options = layers::load(cli).map_err(|e| e.to_string())?;
    if options.dev {
        super::dev::apply(&mut options).map_err(|e| e.to_string())?;
    }
    let id_given = options.agent_id.is_some();
    let mut config =
        AgentConfig::from_options(&options).map_err(|e| format!("invalid configuration: {e}"))?;
    let kept = config.keep_restart_only(running, id_given);
    let snapshot = Snapshot::build(config).map_err(|e| e.to_string())?;
    Ok((snapshot, kept))
}

fn reload(
    cli: &CommandLine<AgentOptions>,
    agent: &RunningAgent,
    generation: &AtomicU64,
    trigger: &str,
) -> bool {
    systemd::reloading();
    match rebuild(cli, &agent.config()) {
        Ok((snapshot, kept)) => {
            let generation = generation.fetch_add(1, Ordering::Relaxed) + 1;
            let config = snapshot.config.clone();
            agent.apply(snapshot);
            logging::set_verbosity(config.verbosity, &config.vmodule);
            for setting in kept {
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
            systemd::ready(&agent.status_line());
            true
        }
        Err(cause) => {
            tracing::error!(trigger, cause = %cause, "RELOAD FAILED: keeping the running configuration");
            systemd::reload_failed(&cause);
            false
        }
    }
}

fn start_watcher(
    config: &AgentConfig,
    changed: &mpsc::Sender<()>,
) -> Option<notify::RecommendedWatcher> {
    if !config.watch_files {
        return None;
    }
    match watch::watch(config.watched_files(), changed.clone()) {
        Ok(watcher) => Some(watcher),
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch the configuration, certificate and token files; reload with SIGHUP");
            None
        }
    }
}

/// How long after the first server connection the start-up pages are released: that
/// connection's own set-up (its HTTP/2 settings and window updates, the stream's first
/// turns, each worker thread's first log line) runs in this time and would only map its
/// pages again.
const SETTLE_BEFORE_RELEASE: Duration = Duration::from_secs(1);

fn signal_name(signal: i32) -> &'static str {
    match signal {
        SIGTERM => "terminated",
        SIGINT => "interrupt",
        _ => "signal",
    }
}

/// Runs the agent until it is told to stop: the first SIGTERM or SIGINT drains (and, with
/// --graceful-shutdown-timeout, exits once the tunnels have ended or the time is up); a
/// second exits at once. `startup`, captured by `main` before other threads started, is
/// released once the first server connection is up: start-up code is not needed again.
pub async fn run_service(
    cli: CommandLine<AgentOptions>,
    snapshot: Snapshot,
    listeners: AgentListeners,
    startup: Option<StartupMappings>,
) -> std::io::Result<()> {
    let mut signals = Signals::new([SIGHUP, SIGTERM, SIGINT])?;
    let cli = Arc::new(cli);
    let agent = Arc::new(super::spawn(snapshot, listeners));
    let generation = Arc::new(AtomicU64::new(0));
    let heartbeat = CancellationToken::new();
    let (changed_tx, mut changed_rx) = mpsc::channel::<()>(1);
    let mut watcher = start_watcher(&agent.config(), &changed_tx);
    systemd::ready(&agent.status_line());
    if let Some(startup) = startup {
        let agent = agent.clone();
        tokio::spawn(async move {
            agent.first_connection().await;
            tokio::time::sleep(SETTLE_BEFORE_RELEASE).await;
            startup_pages::release(startup);
        });
    }
    let status = agent.clone();
    systemd::spawn_heartbeat(move || status.status_line(), heartbeat.clone());
    let drain_done = CancellationToken::new();
    loop {
        let trigger = tokio::select! {
            signal = signals.next() => match signal {
                Some(SIGHUP) => "SIGHUP",
                Some(signal) if !agent.is_draining() => {
                    tracing::info!(v = 2, signal = signal_name(signal), "Received first signal");
                    agent.drain();
                    systemd::stopping(&format!("draining: {}", agent.status_line()));
                    if let Some(timeout) = agent.config().drain_timeout {
                        let (agent, done) = (agent.clone(), drain_done.clone());
                        tokio::spawn(async move {
                            agent.tunnels_ended(timeout).await;
                            done.cancel();
                        });
                    }
                    continue;
                }
                Some(signal) => {
                    tracing::info!(v = 2, signal = signal_name(signal), "Received second signal");
                    break;
                }
                None => break,
            },
            Some(()) = changed_rx.recv() => "file change",
            _ = drain_done.cancelled() => break,
        };
        let (cli, agent_ref, generation) = (cli.clone(), agent.clone(), generation.clone());
        let applied =
            tokio::task::spawn_blocking(move || reload(&cli, &agent_ref, &generation, trigger))
                .await
                .unwrap_or(false);
        if applied {
            drop(watcher.take());
            watcher = start_watcher(&agent.config(), &changed_tx);
        }
    }
    drop(watcher);
    tracing::info!(v = 1, "Shutting down agent.");
    heartbeat.cancel();
    agent.stop().await;
    Ok(())
}
