//! The nftables mode beside the others.

use super::*;

/// nftables mode, ours and upstream's: the same tables (the harness compares them), NodePorts
/// on the primary address only, no localhost NodePorts and no route_localnet, nothing in
/// iptables.
pub(crate) fn nftables_mode(h: &mut Harness) {
    web_services(h);
    h.probe_on(
        &["upnft", "nft"],
        &[
            p("client", "tcp", CLUSTER_IP, 80, all(BOTH_MASQ)),
            p("client", "tcp", NODE, NODE_PORT, all(BOTH_MASQ)),
            // Not the primary address: nothing matches, the node's own stack refuses.
            p("client", "tcp", NODE_OTHER, NODE_PORT, all(&["REFUSED"])),
            p("node", "tcp", "127.0.0.1", NODE_PORT, all(&["REFUSED"])),
        ],
    );
    for label in ["upnft", "nft"] {
        let got = route_localnet(h, label);
        check(
            h,
            got == "0",
            format!("side {label}: route_localnet is {got} in nftables mode"),
        );
        let saved = node_must(h, label, &["iptables-save"]);
        check(
            h,
            !saved.contains("KUBE-"),
            format!("side {label}: nftables mode wrote to iptables:\n{saved}"),
        );
    }
}

/// ipvs mode with sh: every connection from one client address goes to one endpoint, and
/// client addresses spread over both.
pub(crate) fn ipvs_sh_by_client(h: &mut Harness) {
    web_services(h);
    let clients = ["10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5"];
    for extra in &clients[1..] {
        h.side("sh").node.add_client_address(extra);
    }
    let target = probe::target("tcp", CLUSTER_IP, 80);
    let mut picked = BTreeSet::new();
    for source in clients {
        let s = h.side("sh");
        let seq = probe::sequence("sh", &s.node.client, &h.agent, &target, 6, Some(source));
        eprintln!("[sh] from {source}: {seq:?}");
        h.report.push(kube_proxy::harness::Row {
            scenario: "ipvs-sh-by-client".into(),
            step: 0,
            from: source.into(),
            target: target.clone(),
            side: "sh",
            summary: format!("in order: {}", seq.join(" ")),
        });
        let distinct: BTreeSet<&String> = seq.iter().collect();
        let pod = seq
            .first()
            .map(|t| t.split('<').next().unwrap_or("").to_string());
        check(
            h,
            distinct.len() == 1
                && seq.len() == 6
                && pod.as_deref().is_some_and(|p| p.starts_with("pod")),
            format!("ipvs sh: client {source} did not keep one endpoint: {seq:?}"),
        );
        picked.extend(pod);
    }
    check(
        h,
        picked.len() == 2,
        format!(
            "ipvs sh: client addresses {clients:?} did not spread over both endpoints: {picked:?}"
        ),
    );
}

/// nftables mode adds nothing to iptables, so a FORWARD policy of DROP stops forwarded
/// Service traffic, on both sides: upstream documents that a host firewall must allow it.
pub(crate) fn nftables_forward_drop(h: &mut Harness) {
    web_services(h);
    for label in ["upnft", "nft"] {
        node_must(h, label, FORWARD_DROP);
    }
    flush_conntrack(h);
    h.probe_on(
        &["upnft", "nft"],
        &[
            p("client", "tcp", CLUSTER_IP, 80, all(&["TIMEOUT"])),
            p("client", "tcp", NODE, NODE_PORT, all(&["TIMEOUT"])),
            p("node", "tcp", CLUSTER_IP, 80, all(BOTH_MASQ)),
        ],
    );
}
