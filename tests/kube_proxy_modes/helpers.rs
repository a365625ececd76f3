//! What the scenarios share.

use super::*;

/// A ClusterIP Service and a NodePort Service, each with both pods ready on this node.
pub(crate) fn web_services(h: &mut Harness) {
    h.api()
        .create_service(&Svc::cluster_ip("web", CLUSTER_IP).port("http", Tcp, 80, 8080));
    h.api().create_service(
        &Svc::node_port("np", NODEPORT_IP).port_np("http", Tcp, 80, 8080, NODE_PORT),
    );
    for (slice, svc) in [("web-1", "web"), ("np-1", "np")] {
        h.api().create_slice(
            &Slice::v4(slice, svc)
                .port("http", Tcp, 8080)
                .ep(Ep::ready(POD1))
                .ep(Ep::ready(POD2)),
        );
    }
    h.synced();
}

/// A command in a side's node namespace that must work.
pub(crate) fn node_must(h: &Harness, label: &str, args: &[&str]) -> String {
    h.side(label)
        .node_run(args)
        .unwrap_or_else(|e| panic!("side {label}: {e}"))
}

pub(crate) fn route_localnet(h: &Harness, label: &str) -> String {
    node_must(
        h,
        label,
        &["cat", "/proc/sys/net/ipv4/conf/all/route_localnet"],
    )
    .trim()
    .to_string()
}

/// `iptables -S <chain>` (or ip6tables) in a side's node; the error's text when the chain does
/// not exist.
pub(crate) fn rules_of(h: &Harness, label: &str, iptables: &str, chain: &str) -> String {
    h.side(label)
        .node_run(&[iptables, "-w", "-S", chain])
        .unwrap_or_else(|e| e)
}

pub(crate) fn flush_conntrack(h: &Harness) {
    for s in &h.sides {
        s.node.flush_conntrack();
    }
}

/// Records `what` as a failure of the scenario unless `ok`.
pub(crate) fn check(h: &mut Harness, ok: bool, what: String) {
    if !ok {
        h.fail(what);
    }
}

/// An upstream log line's message: klog's `"message"` or `err="…"`, unquoted.
pub(crate) fn klog_message(line: &str) -> String {
    let quoted = line
        .split_once("err=\"")
        .map(|(_, rest)| rest)
        .or_else(|| line.split_once("] \"").map(|(_, rest)| rest))
        .unwrap_or(line);
    let mut out = String::new();
    let mut chars = quoted.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.extend(chars.next()),
            '"' => break,
            c => out.push(c),
        }
    }
    out
}
