//! The node's one-time steps around the proxy: what `--init-only` does (the privileged set-up:
//! the conntrack sysctls, the OOM score, the nftables applier's readiness), the removal of other
//! modes' leftovers at start, and `--cleanup`.

use super::cleanup;
use super::config::{ProxyConfig, ProxyMode};
use super::nft::exec::Applier;
use super::run::{conntrack_settings, RunError};
use crate::kube_proxy::conntrack::sysctls;

/// `--oom-score-adj`: written to /proc/self/oom_score_adj; a failure is only logged, as
/// upstream logs it.
fn oom_score(config: &ProxyConfig) {
    if let Err(e) = std::fs::write("/proc/self/oom_score_adj", config.oom_score_adj.to_string()) {
        tracing::info!(v = 2, error = %e, value = config.oom_score_adj, "Failed to apply OOMScore");
    }
}

/// The set-up that needs privileges, and the mode's announcement.
pub async fn prepare(config: &ProxyConfig) -> Result<(), RunError> {
    oom_score(config);
    Applier::from_env().await?;
    sysctls::set_sysctls(
        &conntrack_settings(config),
        &sysctls::KernelRoots::default(),
    )?;
    match config.mode {
        ProxyMode::Nftables => {}
        other => tracing::warn!(
            mode = other.name(),
            "this proxy serves the {} mode with its nftables dataplane (see the README's table of differences)",
            other.name()
        ),
    }
    // Leftovers of upstream's iptables and ipvs modes (best effort, as upstream).
    if !cleanup::iptables_leftovers().await {
        tracing::info!("some iptables leftovers could not be removed");
    }
    cleanup::ipvs_leftovers(&config.ipvs.exclude_cidrs).await;
    Ok(())
}

/// `--cleanup`: every mode's rules, ours included. Returns whether all went well.
pub async fn cleanup(config: &ProxyConfig) -> bool {
    let mut ok = cleanup::iptables_leftovers().await;
    ok &= cleanup::ipvs_leftovers(&config.ipvs.exclude_cidrs).await;
    match Applier::from_env().await {
        Ok(nft) => ok &= cleanup::nftables_tables(&nft).await,
        Err(e) => {
            tracing::error!(error = %e, "cannot apply nftables transactions; the nftables tables stay");
            ok = false;
        }
    }
    ok
}
