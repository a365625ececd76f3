//! Command lines: every mode value, the reference unit's flags.

use super::*;

/// The unit's and kubeadm's command lines start the proxy, which programs the node and
/// answers: through ipvs mode (unit) and iptables mode (kubeadm's empty mode, and an unset
/// `--proxy-mode`), as upstream running kubeadm's configuration answers.
pub(crate) fn command_lines(h: &mut Harness) {
    web_services(h);
    h.probe(&[
        p("client", "tcp", CLUSTER_IP, 80, all(BOTH_MASQ)),
        p("client", "tcp", NODE, NODE_PORT, all(BOTH_MASQ)),
        p("client", "tcp", NODE_OTHER, NODE_PORT, all(BOTH_MASQ)),
    ]);
    h.probe_on(
        &["upadm", "adm", "unset"],
        &[p("node", "tcp", "127.0.0.1", NODE_PORT, all(BOTH_MASQ))],
    );
    for (label, localnet) in [("upadm", "1"), ("adm", "1"), ("unset", "1"), ("unit", "0")] {
        let got = route_localnet(h, label);
        check(
            h,
            got == localnet,
            format!("side {label}: route_localnet is {got}, wanted {localnet}"),
        );
    }
    for label in ["adm", "unit", "unset"] {
        let forward = rules_of(h, label, "iptables", "FORWARD");
        check(
            h,
            forward.lines().any(|l| l == FORWARD_JUMP),
            format!("side {label}: no KUBE-FORWARD jump:\n{forward}"),
        );
        let table = h.side(label).tables.get("ip").cloned().flatten();
        check(
            h,
            table.is_some(),
            format!("side {label}: no table ip kube-proxy"),
        );
    }
    // The unit's wrr: every endpoint's weight is 1, so round robin.
    let text = node_must(h, "unit", &["nft", "list", "table", "ip", "kube-proxy"]);
    check(
        h,
        text.contains("numgen inc mod 2"),
        "side unit: wrr is not served by numgen inc".into(),
    );
    // --logtostderr, which upstream v1.37 no longer has, is accepted with one warning.
    let log = std::fs::read_to_string(&h.side("unit").proxy.log).unwrap_or_default();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("logtostderr") && (l.starts_with('W') || l.contains("WARN")))
        .collect();
    check(
        h,
        warnings.len() == 1,
        format!("side unit: wanted one warning about --logtostderr, got {warnings:#?}"),
    );
    eprintln!("[unit] {warnings:?}");
}

/// An empty mode (kubeadm's file) or no `--proxy-mode` at all: ours logs the line upstream
/// logs (an error, as upstream's), then serves iptables mode (checked above).
pub(crate) fn defaulted_mode(h: &mut Harness) {
    let upstream_log = std::fs::read_to_string(&h.side("upadm").proxy.log).unwrap_or_default();
    let Some(line) = upstream_log
        .lines()
        .find(|l| l.contains(DEFAULTED_MODE_START))
    else {
        panic!("upstream logged no defaulted-mode line:\n{upstream_log}");
    };
    let message = klog_message(line);
    eprintln!("upstream: {line}");
    for label in ["adm", "unset"] {
        let log = std::fs::read_to_string(&h.side(label).proxy.log).unwrap_or_default();
        let ours = log.lines().find(|l| l.contains(DEFAULTED_MODE_START));
        eprintln!("[{label}] {ours:?}");
        // klog's severity letter leads the line: an error, as upstream's.
        check(
            h,
            ours.is_some_and(|l| l.starts_with('E') && l.contains(&message)),
            format!("side {label}: no error line {message:?}"),
        );
    }
    // Upstream calls for a KubeProxyDefaultMode Event too, but records it before its Event
    // broadcaster starts, so it never reaches the API (its "Starting" Event, posted later,
    // does). Ours posts none either; what the API holds is only reported.
    let reasons: Vec<String> = h
        .kube
        .node_events()
        .iter()
        .map(|e| format!("{} {}", e["reportingInstance"], e["reason"]))
        .collect();
    eprintln!("Events about the Node: {reasons:#?}");
}
