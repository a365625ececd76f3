//! ClusterIP Services: several ports and protocols, wrong ports and protocols, unallocated
//! addresses, no endpoints, hairpin, ClientIP affinity.

use super::{node_addrs, Cases, Expect, Suite};
use crate::kube_proxy::model::Protocol::{Sctp, Tcp, Udp};
use crate::kube_proxy::testing::scenario::{Net, Scenario, NOT_SERVING, READY, READY_LOCAL};

pub fn suite(net: &Net) -> Suite {
    let mut s = Scenario::default();
    let (svc1, svc2, svc3, svc5) = (net.svc(41), net.svc(42), net.svc(43), net.svc(45));
    let (ep1, ep2, ep3) = (net.pod(0, 1), net.pod(1, 1), net.pod(0, 2));
    s.service("ns1", "svc1", svc1)
        .port("p80", Tcp, 80, 0)
        .endpoint("p80", ep1, 80, READY_LOCAL)
        .endpoint("p80", ep2, 80, READY)
        .done();
    s.service("ns2", "svc2", svc2)
        .port("p80", Tcp, 80, 0)
        .port("p53", Udp, 53, 0)
        .port("p53t", Tcp, 53, 0)
        .port("psctp", Sctp, 7777, 0)
        .endpoint("p80", ep3, 8080, READY_LOCAL)
        .endpoint("p53", ep3, 5353, READY_LOCAL)
        .endpoint("p53t", ep3, 5354, READY_LOCAL)
        .endpoint("psctp", ep3, 7777, READY_LOCAL)
        .done();
    s.service("ns3", "svc3", svc3)
        .port("p80", Tcp, 80, 0)
        .done();
    s.service("ns5", "svc5", svc5)
        .port("p80", Tcp, 80, 0)
        .endpoint("p80", net.pod(1, 5), 80, NOT_SERVING)
        .done();

    let both = || Expect::To(vec![(ep1, 80), (ep2, 80)], false);
    let both_masq = || Expect::To(vec![(ep1, 80), (ep2, 80)], true);
    let mut c = Cases::new(net);
    c.add("pod to ClusterIP", net.local_pod, Tcp, svc1, 80, both())
        .add(
            "pod on another node to ClusterIP",
            net.remote_pod,
            Tcp,
            svc1,
            80,
            both(),
        )
        .add(
            "external to ClusterIP",
            net.external_client,
            Tcp,
            svc1,
            80,
            both_masq(),
        )
        .add("node to ClusterIP", net.node_ip, Tcp, svc1, 80, both_masq())
        .add(
            "second node address to ClusterIP",
            net.node_ip2,
            Tcp,
            svc1,
            80,
            both_masq(),
        )
        .add(
            "pod to ClusterIP, wrong port",
            net.local_pod,
            Tcp,
            svc1,
            81,
            Expect::Reject,
        )
        .add(
            "pod to ClusterIP, wrong protocol",
            net.local_pod,
            Udp,
            svc1,
            80,
            Expect::Reject,
        )
        .add(
            "external to ClusterIP, wrong port",
            net.external_client,
            Tcp,
            svc1,
            8080,
            Expect::Reject,
        )
        .add(
            "node to ClusterIP, wrong port",
            net.node_ip,
            Tcp,
            svc1,
            81,
            Expect::Reject,
        )
        .add(
            "pod to unallocated ClusterIP",
            net.local_pod,
            Tcp,
            net.svc(99),
            80,
            Expect::Drop,
        )
        .add(
            "external to unallocated ClusterIP",
            net.external_client,
            Tcp,
            net.svc(99),
            80,
            Expect::Drop,
        )
        .add(
            "node to unallocated ClusterIP",
            net.node_ip,
            Udp,
            net.svc(98),
            53,
            Expect::Drop,
        )
        .add(
            "pod to multi-port ClusterIP, TCP port",
            net.local_pod,
            Tcp,
            svc2,
            80,
            Expect::To(vec![(ep3, 8080)], false),
        )
        .add(
            "pod to multi-port ClusterIP, UDP port",
            net.local_pod,
            Udp,
            svc2,
            53,
            Expect::To(vec![(ep3, 5353)], false),
        )
        .add(
            "pod to multi-port ClusterIP, TCP on the UDP port's number",
            net.local_pod,
            Tcp,
            svc2,
            53,
            Expect::To(vec![(ep3, 5354)], false),
        )
        .add(
            "pod to multi-port ClusterIP, SCTP port",
            net.local_pod,
            Sctp,
            svc2,
            7777,
            Expect::To(vec![(ep3, 7777)], false),
        )
        .add(
            "pod to multi-port ClusterIP, TCP on the SCTP port",
            net.local_pod,
            Tcp,
            svc2,
            7777,
            Expect::Reject,
        )
        .add(
            "pod to multi-port ClusterIP, UDP on the TCP port",
            net.local_pod,
            Udp,
            svc2,
            80,
            Expect::Reject,
        )
        .add(
            "external to multi-port ClusterIP, UDP port",
            net.external_client,
            Udp,
            svc2,
            53,
            Expect::To(vec![(ep3, 5353)], true),
        )
        .add(
            "pod to ClusterIP with no endpoints",
            net.local_pod,
            Tcp,
            svc3,
            80,
            Expect::Reject,
        )
        .add(
            "external to ClusterIP with no endpoints",
            net.external_client,
            Tcp,
            svc3,
            80,
            Expect::Reject,
        )
        .add(
            "node to ClusterIP with no endpoints",
            net.node_ip,
            Tcp,
            svc3,
            80,
            Expect::Reject,
        )
        .add(
            "pod to ClusterIP whose endpoint does not serve",
            net.local_pod,
            Tcp,
            svc5,
            80,
            Expect::Reject,
        )
        .add(
            "pod to an address outside the Service CIDR",
            net.local_pod,
            Tcp,
            net.ext(200),
            80,
            Expect::Accept,
        )
        .add(
            "external to an address outside the Service CIDR",
            net.external_client,
            Udp,
            net.ext(200),
            53,
            Expect::Accept,
        );
    Suite {
        name: "ClusterIP".into(),
        settings: net.settings(),
        scenario: s,
        node: node_addrs(net),
        cases: c.done(),
    }
}

pub fn hairpin_and_affinity(net: &Net) -> Suite {
    let mut s = Scenario::default();
    let (svc4, svc6, svc7) = (net.svc(44), net.svc(46), net.svc(47));
    let (me, other, remote) = (net.pod(0, 3), net.pod(0, 4), net.pod(1, 3));
    s.service("ns4", "svc4", svc4)
        .port("p80", Tcp, 80, 0)
        .endpoint("p80", me, 80, READY_LOCAL)
        .done();
    s.service("ns6", "svc6", svc6)
        .port("p80", Tcp, 80, 0)
        .endpoint("p80", me, 8080, READY_LOCAL)
        .endpoint("p80", remote, 8080, READY)
        .done();
    s.service("ns7", "svc7", svc7)
        .port("p80", Tcp, 80, 3007)
        .affinity(10800)
        .endpoint("p80", me, 80, READY_LOCAL)
        .endpoint("p80", remote, 80, READY)
        .done();
    let mut c = Cases::new(net);
    c.add(
        "pod to itself through a ClusterIP (hairpin)",
        me,
        Tcp,
        svc4,
        80,
        Expect::To(vec![(me, 80)], true),
    )
    .add(
        "another pod to the same ClusterIP",
        other,
        Tcp,
        svc4,
        80,
        Expect::To(vec![(me, 80)], false),
    )
    .add(
        "external to a ClusterIP with a local endpoint",
        net.external_client,
        Tcp,
        svc4,
        80,
        Expect::To(vec![(me, 80)], true),
    )
    .add(
        "pod to itself among two endpoints (hairpin when it picks itself)",
        me,
        Tcp,
        svc6,
        80,
        Expect::ToEach(vec![(me, 8080, true), (remote, 8080, false)]),
    )
    .add(
        "another pod among two endpoints",
        other,
        Tcp,
        svc6,
        80,
        Expect::To(vec![(me, 8080), (remote, 8080)], false),
    )
    .add(
        "pod to a ClientIP-affinity ClusterIP",
        other,
        Tcp,
        svc7,
        80,
        Expect::To(vec![(me, 80), (remote, 80)], false),
    )
    .add(
        "node to a ClientIP-affinity ClusterIP",
        net.node_ip,
        Tcp,
        svc7,
        80,
        Expect::To(vec![(me, 80), (remote, 80)], true),
    )
    .add(
        "external to a ClientIP-affinity NodePort",
        net.external_client,
        Tcp,
        net.node_ip,
        3007,
        Expect::To(vec![(me, 80), (remote, 80)], true),
    )
    .add(
        "pod to itself through an affinity ClusterIP (hairpin)",
        me,
        Tcp,
        svc7,
        80,
        Expect::ToEach(vec![(me, 80, true), (remote, 80, false)]),
    )
    .add(
        "pod to an affinity ClusterIP, wrong port",
        other,
        Tcp,
        svc7,
        8080,
        Expect::Reject,
    );
    Suite {
        name: "hairpin and affinity".into(),
        settings: net.settings(),
        scenario: s,
        node: node_addrs(net),
        cases: c.done(),
    }
}
