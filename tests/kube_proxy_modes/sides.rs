//! The sides: which proxy, mode and flags each node runs.

use super::*;

/// A side with the harness's flags but NodePort addresses left to the mode's default.
pub(crate) fn side(label: &'static str, which: Impl, mode: &str) -> SideSetup {
    SideSetup::new(label, which)
        .without("--nodeport-addresses")
        .mode(mode)
}

/// Upstream in iptables mode, ours in iptables mode and in ipvs mode with rr, each node with a
/// FORWARD policy of DROP. The labels name the namespaces, so that two tests of this binary
/// running at once use their own.
pub(crate) fn forward_drop_sides(labels: [&'static str; 3]) -> Vec<SideSetup> {
    let [up, ipt, rr] = labels;
    vec![
        side(up, Impl::Upstream, "iptables").node(FORWARD_DROP),
        side(ipt, Impl::Ours, "iptables").node(FORWARD_DROP),
        side(rr, Impl::Ours, "ipvs")
            .flag("--ipvs-scheduler=rr")
            .node(FORWARD_DROP),
    ]
}

pub(crate) fn nftables_sides() -> Vec<SideSetup> {
    vec![
        side("upnft", Impl::Upstream, "nftables"),
        side("nft", Impl::Ours, "nftables"),
        side("sh", Impl::Ours, "ipvs").flag("--ipvs-scheduler=sh"),
    ]
}

/// The reference unit's command line, unchanged but for the node's address and name, the pod
/// CIDR and the kubeconfig's path.
pub(crate) const UNIT_ARGS: &[&str] = &[
    "--bind-address=10.0.0.1",
    "--hostname-override=node-a",
    "--cluster-cidr=10.244.0.0/16",
    "--kubeconfig={kubeconfig}",
    "--logtostderr=true",
    "--v=2",
    "--ipvs-scheduler=wrr",
    "--ipvs-min-sync-period=5s",
    "--ipvs-sync-period=5s",
    "--proxy-mode=ipvs",
];

/// kubeadm's DaemonSet command line (`$(NODE_NAME)` is what the kubelet puts there), its
/// configuration file in the run's directory.
pub(crate) const KUBEADM_ARGS: &[&str] = &[
    "--config={dir}/kubeadm-config.conf",
    "--hostname-override=node-a",
];

pub(crate) fn command_line_sides() -> Vec<SideSetup> {
    let kubeadm = KUBEADM_CONFIG.replace(KUBEADM_KUBECONFIG, "{kubeconfig}");
    assert_ne!(
        kubeadm, KUBEADM_CONFIG,
        "the fixture names kubeadm's kubeconfig"
    );
    vec![
        SideSetup::new("upadm", Impl::Upstream)
            .exact(KUBEADM_ARGS)
            .file("kubeadm-config.conf", &kubeadm)
            .rules(Rules::Iptables),
        SideSetup::new("adm", Impl::Ours)
            .exact(KUBEADM_ARGS)
            .file("kubeadm-config.conf", &kubeadm),
        SideSetup::new("unit", Impl::Ours).exact(UNIT_ARGS),
        side("unset", Impl::Ours, ""),
    ]
}

/// The command lines without `--conntrack-max-per-core=0` raise nf_conntrack_max (read-only
/// in a network namespace) and the conntrack hash size (one for the whole machine) when they
/// are below what the defaults ask for. Only where both are high enough already do they
/// run here: then neither proxy writes either.
pub(crate) fn conntrack_defaults_hold() -> Result<(), String> {
    let read = |p: &str| -> Result<u64, String> {
        std::fs::read_to_string(p)
            .map_err(|e| format!("{p}: {e}"))?
            .trim()
            .parse()
            .map_err(|e| format!("{p}: {e}"))
    };
    let cpus = run("nproc", &[])?
        .trim()
        .parse::<u64>()
        .map_err(|e| e.to_string())?;
    // Upstream's defaults: 32768 per CPU, at most 1048576, at least 131072.
    let want = (32768 * cpus).clamp(131_072, 1 << 20);
    let max = read("/proc/sys/net/netfilter/nf_conntrack_max")?;
    let hash = read("/sys/module/nf_conntrack/parameters/hashsize")?;
    if max < want || hash < want / 4 {
        return Err(format!(
            "nf_conntrack_max {max} and hashsize {hash} are below the defaults' {want} and {}: \
             the unit's and kubeadm's command lines would change the machine's conntrack table",
            want / 4
        ));
    }
    Ok(())
}
