//! kube-proxy as a service: systemd readiness once every family's rules are in the kernel,
//! reload on SIGHUP and when the configuration file changes (where upstream exits), the
//! watchdog while syncs are healthy, and a stop that leaves the rules in place.

use std::time::Duration;

use futures_util::StreamExt;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook_tokio::Signals;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::config::load;
use super::config::ProxyConfig;
use super::options::KubeProxyOptions;
use super::run::{self, RunError, RunningProxy};
use crate::config::CommandLine;
use crate::lifecycle::startup_pages::{self, StartupMappings};
use crate::lifecycle::{systemd, watch};
use crate::logging;

/// Settings a reload cannot change in a running proxy (they name the node, the cluster or
/// the mode): the running values are kept, with a warning.
fn keep_restart_only(new: &mut ProxyConfig, running: &ProxyConfig) -> Vec<&'static str> {
    let mut kept = Vec::new();
    if new.mode != running.mode {
        new.mode = running.mode;
        new.mode_defaulted = running.mode_defaulted;
        kept.push("mode");
    }
    if new.node_name_override != running.node_name_override {
        new.node_name_override
            .clone_from(&running.node_name_override);
        kept.push("hostnameOverride");
    }
    if new.client != running.client {
        new.client = running.client.clone();
        kept.push("clientConnection");
    }
    if new.bind_address != running.bind_address {
        new.bind_address = running.bind_address;
        kept.push("bindAddress");
    }
    if new.feature_gates != running.feature_gates {
        new.feature_gates = running.feature_gates.clone();
        kept.push("featureGates");
    }
    kept
}

fn rebuild(
    cli: &CommandLine<KubeProxyOptions>,
    running: &ProxyConfig,
) -> Result<(ProxyConfig, Vec<&'static str>), String> {
    let options = load::load(cli).map_err(|e| e.to_string())?;
    let mut config = ProxyConfig::from_options(&options).map_err(|e| e.to_string())?;
    let kept = keep_restart_only(&mut config, running);
    Ok((config, kept))
}

async fn reload(
    cli: &CommandLine<KubeProxyOptions>,
    proxy: &RunningProxy,
    generation: &mut u64,
    trigger: &str,
) {
    systemd::reloading();
    let running = proxy.shared.config();
    match rebuild(cli, &running) {
        Ok((config, kept)) => {
            *generation += 1;
            logging::set_verbosity(config.logging.verbosity, &config.logging.vmodule);
            for setting in kept {
                tracing::warn!(
                    reload_generation = *generation,
                    setting,
                    "this setting changed but needs a restart; keeping the running value"
                );
            }
            proxy.apply(config).await;
            tracing::info!(
                reload_generation = *generation,
                trigger,
                "configuration reloaded"
            );
            systemd::ready(&proxy.shared.status_line());
        }
        Err(cause) => {
            tracing::error!(trigger, cause = %cause, "RELOAD FAILED: keeping the running configuration");
            systemd::reload_failed(&cause);
        }
    }
}

/// The pause between READY and giving back start-up's pages: the first partial syncs and
/// health checks after the first sync run in it and would only map their pages again.
const SETTLE_BEFORE_RELEASE: Duration = Duration::from_secs(2);

/// Runs until SIGTERM or SIGINT (exit 0; the rules stay), or until the node changes in a way
/// that needs a new process (an error, exit 1, as upstream).
/// `config_file` is the file the configuration was read from (watched for changes).
pub async fn run_service(
    cli: CommandLine<KubeProxyOptions>,
    config_file: Option<std::path::PathBuf>,
    config: ProxyConfig,
    startup: Option<StartupMappings>,
) -> Result<(), RunError> {
    let mut signals = Signals::new([SIGHUP, SIGTERM, SIGINT])
        .map_err(|e| RunError::Fatal(format!("signals: {e}")))?;
    let files: Vec<std::path::PathBuf> = config_file.into_iter().collect();
    let proxy = run::start(config).await?;
    let shared = proxy.shared.clone();
    let stop = CancellationToken::new();

    // READY once every family's first sync is in the kernel: `systemctl start` returns when
    // Services work.
    {
        let shared = shared.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            while !shared.programmed() {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                }
            }
            tracing::info!(status = %shared.status_line(), "rules programmed; ready");
            systemd::ready(&shared.status_line());
            // Start-up's code (flags, config, the first lists and the full sync's render)
            // does not run again until a reload; its pages are most of an idle proxy's RSS.
            if let Some(startup) = startup {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(SETTLE_BEFORE_RELEASE) => {}
                }
                startup_pages::release(startup);
            }
        });
    }
    // The watchdog is pinged only while the syncs are healthy.
    {
        let (for_status, for_health) = (shared.clone(), shared.clone());
        systemd::spawn_heartbeat_when(
            move || for_status.status_line(),
            move || for_health.health.healthy(),
            stop.clone(),
        );
    }
    let (changed_tx, mut changed_rx) = mpsc::channel::<()>(1);
    let _watcher = if files.is_empty() {
        None
    } else {
        match watch::watch(files, changed_tx) {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch the configuration file; reload with SIGHUP");
                None
            }
        }
    };
    let mut generation = 0u64;
    let result = loop {
        tokio::select! {
            signal = signals.next() => match signal {
                Some(SIGHUP) => reload(&cli, &proxy, &mut generation, "SIGHUP").await,
                Some(_) | None => break Ok(()),
            },
            Some(()) = changed_rx.recv() => reload(&cli, &proxy, &mut generation, "file change").await,
            reason = proxy.failed() => break Err(RunError::Fatal(reason)),
        }
    };
    systemd::stopping("stopping; the rules stay in the kernel");
    stop.cancel();
    proxy.shutdown().await;
    result
}
