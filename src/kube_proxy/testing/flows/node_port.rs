//! NodePort Services, on the primary node address only (nftables mode's default) or on
//! every local address (`all`, as iptables mode).

use super::{node_addrs, Cases, Expect, Suite};
use crate::kube_proxy::model::Protocol::{Tcp, Udp};
use crate::kube_proxy::ruleset::settings::NodePorts;
use crate::kube_proxy::testing::scenario::{Net, Scenario, READY, READY_LOCAL};

pub fn suite(net: &Net, everywhere: bool) -> Suite {
    with_localhost(net, everywhere, false)
}

/// iptables mode's NodePorts: every address, 127.0.0.1 included (IPv4).
pub fn localhost(net: &Net) -> Suite {
    with_localhost(net, true, true)
}

fn with_localhost(net: &Net, everywhere: bool, localhost: bool) -> Suite {
    let mut s = Scenario::default();
    let (ep1, ep2, ep3) = (net.pod(0, 1), net.pod(1, 1), net.pod(1, 2));
    s.service("ns1", "np1", net.svc(41))
        .port("p80", Tcp, 80, 3001)
        .endpoint("p80", ep1, 80, READY_LOCAL)
        .endpoint("p80", ep2, 80, READY)
        .done();
    s.service("ns2", "np2", net.svc(42))
        .port("dns", Udp, 53, 3002)
        .endpoint("dns", ep3, 53, READY)
        .done();
    s.service("ns3", "np3", net.svc(43))
        .port("p80", Tcp, 80, 3003)
        .done();
    let mut settings = net.settings();
    if everywhere {
        settings.node_ports = NodePorts::All;
    }
    settings.localhost_node_ports = localhost;
    let both = || Expect::To(vec![(ep1, 80), (ep2, 80)], true);
    let on_second = |e: Expect| if everywhere { e } else { Expect::Accept };
    let mut c = Cases::new(net);
    c.add(
        "external to NodePort",
        net.external_client,
        Tcp,
        net.node_ip,
        3001,
        both(),
    )
    .add(
        "external to UDP NodePort",
        net.external_client,
        Udp,
        net.node_ip,
        3002,
        Expect::To(vec![(ep3, 53)], true),
    )
    .add(
        "external to NodePort, wrong protocol",
        net.external_client,
        Udp,
        net.node_ip,
        3001,
        Expect::Accept,
    )
    .add(
        "external to NodePort with no endpoints",
        net.external_client,
        Tcp,
        net.node_ip,
        3003,
        Expect::Reject,
    )
    .add(
        "external to NodePort on the second address",
        net.external_client,
        Tcp,
        net.node_ip2,
        3001,
        on_second(both()),
    )
    .add(
        "external to empty NodePort on the second address",
        net.external_client,
        Tcp,
        net.node_ip2,
        3003,
        on_second(Expect::Reject),
    )
    .add(
        "pod to NodePort",
        net.local_pod,
        Tcp,
        net.node_ip,
        3001,
        both(),
    )
    .add(
        "pod to UDP NodePort",
        net.local_pod,
        Udp,
        net.node_ip,
        3002,
        Expect::To(vec![(ep3, 53)], true),
    )
    .add(
        "node to NodePort",
        net.node_ip,
        Tcp,
        net.node_ip,
        3001,
        both(),
    )
    .add(
        "node to NodePort on the second address",
        net.node_ip,
        Tcp,
        net.node_ip2,
        3001,
        on_second(both()),
    )
    .add(
        "node to NodePort with no endpoints",
        net.node_ip,
        Tcp,
        net.node_ip,
        3003,
        Expect::Reject,
    )
    .add(
        "external to an unused port",
        net.external_client,
        Tcp,
        net.node_ip,
        3999,
        Expect::Accept,
    )
    // As upstream's iptables mode with route_localnet: a DNATed packet to 127.0.0.1 goes on
    // (kubelet's "block incoming localnet connections" lets DNATed ones through).
    .add(
        "external to NodePort on loopback",
        net.external_client,
        Tcp,
        net.family.loopback().addr(),
        3001,
        if localhost { both() } else { Expect::Accept },
    )
    .add(
        "external to the ClusterIP of a NodePort Service",
        net.external_client,
        Tcp,
        net.svc(41),
        80,
        both(),
    )
    .add(
        "pod to the ClusterIP of a NodePort Service",
        net.local_pod,
        Tcp,
        net.svc(41),
        80,
        Expect::To(vec![(ep1, 80), (ep2, 80)], false),
    );
    Suite {
        name: match (everywhere, localhost) {
            (_, true) => "NodePort on every address and localhost (iptables mode)",
            (true, false) => "NodePort on every address",
            (false, false) => "NodePort on the primary address",
        }
        .into(),
        settings,
        scenario: s,
        node: node_addrs(net),
        cases: c.done(),
    }
}
