//! Hairpin connections under FORWARD DROP.

use super::*;

/// Under a FORWARD policy of DROP, a pod's connection to a Service whose one endpoint is the
/// pod itself (hairpin): upstream's iptables mode marks it for masquerade in the endpoint's
/// chain (`KUBE-SEP-* -s <endpoint> -j KUBE-MARK-MASQ`), so KUBE-FORWARD accepts it and the
/// pod answers itself. Ours, in iptables and ipvs modes, marks it in a forward-hook chain
/// that runs before the filter table's FORWARD (the nftables ruleset itself masquerades
/// hairpin at postrouting, too late for KUBE-FORWARD).
#[test]
pub(crate) fn hairpin_under_forward_drop_answers_as_upstreams_iptables_mode() {
    if !kube_proxy::preflight() || !iptables_preflight() {
        return;
    }
    let dir = artefacts().with_file_name("kube-proxy-modes-hairpin");
    let sides = forward_drop_sides(["hp-up", "hp-ipt", "hp-rr"]);
    let mut h = Harness::start_with(&dir, &sides, &[]);
    h.scenario("hairpin-forward-drop", |h| {
        h.api()
            .create_service(&Svc::cluster_ip("self", CLUSTER_IP).port("http", Tcp, 80, 8080));
        h.api().create_slice(
            &Slice::v4("self-1", "self")
                .port("http", Tcp, 8080)
                .ep(Ep::ready(POD1)),
        );
        h.synced();
        h.probe(&[
            p("pod1", "tcp", CLUSTER_IP, 80, all(&["pod1<-masq"])),
            // Not forwarded: the same Service from the node answers everywhere.
            p("node", "tcp", CLUSTER_IP, 80, all(&["pod1<-masq"])),
        ]);
    });
    eprintln!("{}", h.report_table());
    let failures = std::mem::take(&mut h.failures);
    drop(h);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
