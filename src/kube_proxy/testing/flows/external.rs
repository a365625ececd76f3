//! LoadBalancer Services (with and without source ranges, with no endpoints) and external
//! IPs.

use super::{node_addrs, Cases, Expect, Suite};
use crate::kube_proxy::model::IpFamily;
use crate::kube_proxy::model::Protocol::{Tcp, Udp};
use crate::kube_proxy::testing::scenario::{Net, Scenario, READY, READY_LOCAL};

pub fn load_balancer(net: &Net) -> Suite {
    let mut s = Scenario::default();
    let ep = net.pod(0, 1);
    let (lb1, lb2, lb3, lb4) = (net.ext(1), net.ext(2), net.ext(3), net.ext(4));
    let node_range = match net.family {
        IpFamily::V4 => "192.168.0.0/24",
        IpFamily::V6 => "fd00::/64",
    };
    // Source ranges that hold the node's address: the LB IPs are admitted as sources too.
    s.service("ns1", "lb1", net.svc(41))
        .port("p80", Tcp, 80, 3001)
        .lb(lb1)
        .lb(lb2)
        .source_range(node_range)
        .source_range(net.source_range)
        .endpoint("p80", ep, 80, READY_LOCAL)
        .done();
    // Source ranges without the node's address.
    s.service("ns2", "lb2", net.svc(42))
        .port("p80", Tcp, 80, 3002)
        .lb(lb3)
        .source_range(net.source_range)
        .endpoint("p80", net.pod(1, 2), 80, READY)
        .done();
    // No endpoints.
    s.service("ns3", "lb3", net.svc(43))
        .port("p80", Tcp, 80, 3003)
        .lb(lb4)
        .done();
    let to_ep = || Expect::To(vec![(ep, 80)], true);
    let mut c = Cases::new(net);
    c.add(
        "pod to the ClusterIP of a LoadBalancer",
        net.local_pod,
        Tcp,
        net.svc(41),
        80,
        Expect::To(vec![(ep, 80)], false),
    )
    .add(
        "external to NodePort",
        net.external_client,
        Tcp,
        net.node_ip,
        3001,
        to_ep(),
    )
    .add(
        "NodePort is not subject to source ranges",
        net.blocked_client,
        Tcp,
        net.node_ip,
        3001,
        to_ep(),
    )
    .add(
        "allowed external to LB1",
        net.allowed_client,
        Tcp,
        lb1,
        80,
        to_ep(),
    )
    .add(
        "allowed external to LB2",
        net.allowed_client,
        Tcp,
        lb2,
        80,
        to_ep(),
    )
    .add(
        "blocked external to LB1",
        net.blocked_client,
        Tcp,
        lb1,
        80,
        Expect::Drop,
    )
    .add(
        "blocked external to LB2",
        net.blocked_client,
        Tcp,
        lb2,
        80,
        Expect::Drop,
    )
    .add(
        "pod to LB1, blocked by the source ranges",
        net.local_pod,
        Tcp,
        lb1,
        80,
        Expect::Drop,
    )
    .add(
        "node to LB1, allowed by the source ranges",
        net.node_ip,
        Tcp,
        lb1,
        80,
        to_ep(),
    )
    .add(
        "node to LB2, allowed by the source ranges",
        net.node_ip,
        Tcp,
        lb2,
        80,
        to_ep(),
    )
    .add(
        "same node to LB1 from LB1 (implicitly allowed)",
        lb1,
        Tcp,
        lb1,
        80,
        to_ep(),
    )
    .add(
        "allowed external to LB1, wrong port",
        net.allowed_client,
        Tcp,
        lb1,
        81,
        Expect::Accept,
    )
    .add(
        "blocked external to LB1, wrong port",
        net.blocked_client,
        Tcp,
        lb1,
        81,
        Expect::Accept,
    )
    .add(
        "allowed external to LB3",
        net.allowed_client,
        Tcp,
        lb3,
        80,
        Expect::To(vec![(net.pod(1, 2), 80)], true),
    )
    .add(
        "blocked external to LB3",
        net.blocked_client,
        Tcp,
        lb3,
        80,
        Expect::Drop,
    )
    .add(
        "node to LB3, not in the source ranges",
        net.node_ip,
        Tcp,
        lb3,
        80,
        Expect::Drop,
    )
    .add(
        "external to LB with no endpoints",
        net.external_client,
        Tcp,
        lb4,
        80,
        Expect::Reject,
    )
    .add(
        "external to NodePort of LB with no endpoints",
        net.external_client,
        Tcp,
        net.node_ip,
        3003,
        Expect::Reject,
    )
    .add(
        "pod to LB with no endpoints",
        net.local_pod,
        Tcp,
        lb4,
        80,
        Expect::Reject,
    )
    .add(
        "external to LB with no endpoints, UDP",
        net.external_client,
        Udp,
        lb4,
        80,
        Expect::Accept,
    );
    Suite {
        name: "LoadBalancer".into(),
        settings: net.settings(),
        scenario: s,
        node: node_addrs(net),
        cases: c.done(),
    }
}

pub fn external_ips(net: &Net) -> Suite {
    let mut s = Scenario::default();
    let (x1, x2, x3) = (net.ext(10), net.ext(11), net.ext(12));
    let (ep1, ep2, ep3) = (net.pod(0, 1), net.pod(1, 1), net.pod(1, 3));
    s.service("ns1", "e1", net.svc(41))
        .port("p80", Tcp, 80, 0)
        .external_ip(x1)
        .endpoint("p80", ep1, 80, READY_LOCAL)
        .endpoint("p80", ep2, 80, READY)
        .done();
    s.service("ns2", "e2", net.svc(42))
        .port("p80", Tcp, 80, 0)
        .external_ip(x2)
        .done();
    s.service("ns3", "e3", net.svc(43))
        .port("p80", Tcp, 80, 0)
        .external_ip(x3)
        .external_local()
        .endpoint("p80", ep3, 80, READY)
        .done();
    let both = |masq| Expect::To(vec![(ep1, 80), (ep2, 80)], masq);
    let mut c = Cases::new(net);
    c.add(
        "external to externalIP",
        net.external_client,
        Tcp,
        x1,
        80,
        both(true),
    )
    .add("pod to externalIP", net.local_pod, Tcp, x1, 80, both(true))
    .add("node to externalIP", net.node_ip, Tcp, x1, 80, both(true))
    .add(
        "external to externalIP, wrong port",
        net.external_client,
        Tcp,
        x1,
        81,
        Expect::Accept,
    )
    .add(
        "external to externalIP with no endpoints",
        net.external_client,
        Tcp,
        x2,
        80,
        Expect::Reject,
    )
    .add(
        "pod to externalIP with no endpoints",
        net.local_pod,
        Tcp,
        x2,
        80,
        Expect::Reject,
    )
    .add(
        "external to eTP=Local externalIP with no local endpoint",
        net.external_client,
        Tcp,
        x3,
        80,
        Expect::Drop,
    )
    .add(
        "pod to eTP=Local externalIP with no local endpoint (short-circuit)",
        net.local_pod,
        Tcp,
        x3,
        80,
        Expect::To(vec![(ep3, 80)], false),
    )
    .add(
        "node to eTP=Local externalIP with no local endpoint (short-circuit)",
        net.node_ip,
        Tcp,
        x3,
        80,
        Expect::To(vec![(ep3, 80)], true),
    )
    .add(
        "external to the ClusterIP of an eTP=Local Service",
        net.external_client,
        Tcp,
        net.svc(43),
        80,
        Expect::To(vec![(ep3, 80)], true),
    );
    Suite {
        name: "external IPs".into(),
        settings: net.settings(),
        scenario: s,
        node: node_addrs(net),
        cases: c.done(),
    }
}
