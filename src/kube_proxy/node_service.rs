//! The node's one-time steps around the proxy: what `--init-only` does (the privileged set-up:
//! the conntrack sysctls, the OOM score, the nftables applier's readiness), the removal of other
//! modes' leftovers at start, and `--cleanup`.

use super::cleanup;
use super::config::{ProxyConfig, ProxyMode};
use super::forward_accept;
use super::model::IpFamily;
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
    // Leftovers of upstream's iptables and ipvs modes (best effort, as upstream): their
    // rules would translate the same packets as ours.
    if !cleanup::iptables_leftovers().await {
        tracing::info!("some iptables leftovers could not be removed");
    }
    cleanup::ipvs_leftovers(&config.ipvs.exclude_cidrs).await;
    if config.mode != ProxyMode::Nftables {
        // What those modes do for the node beyond their rules.
        let mark = 1u32 << config.masquerade_bit.min(31);
        forward_accept::ensure(mark, config.conntrack.tcp_be_liberal).await;
        let nodes = super::node_settings::NodeIps::detect(None, config.bind_address);
        let ports = super::node_settings::node_ports(
            &config.node_port_addresses,
            IpFamily::V4,
            &nodes,
            &super::interfaces::interface_addresses(),
        );
        if super::node_settings::localhost_node_ports(config, IpFamily::V4, &ports) {
            tracing::info!("Setting route_localnet=1 to allow node-ports on localhost; to change this either disable iptables.localhostNodePorts (--iptables-localhost-nodeports) or set nodePortAddresses (--nodeport-addresses) to filter loopback addresses");
            if let Err(e) = std::fs::write("/proc/sys/net/ipv4/conf/all/route_localnet", "1") {
                return Err(RunError::Fatal(format!("setting route_localnet: {e}")));
            }
        }
    }
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
