//! Traffic policy Local (external and internal) and terminating endpoints.

use super::{node_addrs, Cases, Expect, Suite};
use crate::kube_proxy::model::Protocol::Tcp;
use crate::kube_proxy::testing::scenario::{
    Net, Scenario, NOT_SERVING, NOT_SERVING_LOCAL, READY, READY_LOCAL, TERMINATING,
    TERMINATING_LOCAL,
};

pub fn external_local(net: &Net) -> Suite {
    let mut s = Scenario::default();
    let (l1, l2, l3, l4) = (net.ext(20), net.ext(21), net.ext(22), net.ext(23));
    let (local, remote) = (net.pod(0, 1), net.pod(1, 1));
    s.service("ns1", "l1", net.svc(41))
        .port("p80", Tcp, 80, 3001)
        .lb(l1)
        .external_local()
        .health_check(30001)
        .endpoint("p80", local, 80, READY_LOCAL)
        .endpoint("p80", remote, 80, READY)
        .done();
    s.service("ns2", "l2", net.svc(42))
        .port("p80", Tcp, 80, 3002)
        .lb(l2)
        .external_local()
        .endpoint("p80", net.pod(1, 2), 80, READY)
        .done();
    s.service("ns3", "l3", net.svc(43))
        .port("p80", Tcp, 80, 3003)
        .lb(l3)
        .external_local()
        .endpoint("p80", net.pod(0, 3), 80, TERMINATING_LOCAL)
        .endpoint("p80", net.pod(1, 3), 80, READY)
        .done();
    s.service("ns4", "l4", net.svc(44))
        .port("p80", Tcp, 80, 3004)
        .lb(l4)
        .external_local()
        .done();
    let both = |masq| Expect::To(vec![(local, 80), (remote, 80)], masq);
    let only_local = || Expect::To(vec![(local, 80)], false);
    let p2 = |masq| Expect::To(vec![(net.pod(1, 2), 80)], masq);
    let mut c = Cases::new(net);
    c.add(
        "external to eTP=Local LB: local endpoint, source kept",
        net.external_client,
        Tcp,
        l1,
        80,
        only_local(),
    )
    .add(
        "external to eTP=Local NodePort: local endpoint, source kept",
        net.external_client,
        Tcp,
        net.node_ip,
        3001,
        only_local(),
    )
    .add(
        "pod to eTP=Local LB short-circuits to every endpoint",
        net.local_pod,
        Tcp,
        l1,
        80,
        both(false),
    )
    .add(
        "pod to eTP=Local NodePort short-circuits",
        net.local_pod,
        Tcp,
        net.node_ip,
        3001,
        both(false),
    )
    .add(
        "node to eTP=Local LB is masqueraded and short-circuits",
        net.node_ip,
        Tcp,
        l1,
        80,
        both(true),
    )
    .add(
        "node to eTP=Local NodePort is masqueraded and short-circuits",
        net.node_ip,
        Tcp,
        net.node_ip,
        3001,
        both(true),
    )
    .add(
        "pod to the ClusterIP of an eTP=Local Service",
        net.local_pod,
        Tcp,
        net.svc(41),
        80,
        both(false),
    )
    .add(
        "external to the ClusterIP of an eTP=Local Service",
        net.external_client,
        Tcp,
        net.svc(41),
        80,
        both(true),
    )
    .add(
        "external to eTP=Local LB without local endpoints",
        net.external_client,
        Tcp,
        l2,
        80,
        Expect::Drop,
    )
    .add(
        "external to eTP=Local NodePort without local endpoints",
        net.external_client,
        Tcp,
        net.node_ip,
        3002,
        Expect::Drop,
    )
    .add(
        "pod to eTP=Local LB without local endpoints",
        net.local_pod,
        Tcp,
        l2,
        80,
        p2(false),
    )
    .add(
        "node to eTP=Local NodePort without local endpoints",
        net.node_ip,
        Tcp,
        net.node_ip,
        3002,
        p2(true),
    )
    .add(
        "external to the ClusterIP of eTP=Local without local endpoints",
        net.external_client,
        Tcp,
        net.svc(42),
        80,
        p2(true),
    )
    .add(
        "external to eTP=Local LB with only a terminating local endpoint",
        net.external_client,
        Tcp,
        l3,
        80,
        Expect::To(vec![(net.pod(0, 3), 80)], false),
    )
    .add(
        "pod to eTP=Local LB with only a terminating local endpoint",
        net.local_pod,
        Tcp,
        l3,
        80,
        Expect::To(vec![(net.pod(1, 3), 80)], false),
    )
    .add(
        "external to eTP=Local LB with no endpoints",
        net.external_client,
        Tcp,
        l4,
        80,
        Expect::Reject,
    )
    .add(
        "external to eTP=Local NodePort with no endpoints",
        net.external_client,
        Tcp,
        net.node_ip,
        3004,
        Expect::Reject,
    );
    Suite {
        name: "external traffic policy Local".into(),
        settings: net.settings(),
        scenario: s,
        node: node_addrs(net),
        cases: c.done(),
    }
}

pub fn internal_local(net: &Net) -> Suite {
    let mut s = Scenario::default();
    let (local, remote) = (net.pod(0, 1), net.pod(1, 1));
    s.service("ns1", "i1", net.svc(41))
        .port("p80", Tcp, 80, 0)
        .internal_local()
        .endpoint("p80", local, 80, READY_LOCAL)
        .endpoint("p80", remote, 80, READY)
        .done();
    s.service("ns2", "i2", net.svc(42))
        .port("p80", Tcp, 80, 0)
        .internal_local()
        .endpoint("p80", net.pod(1, 2), 80, READY)
        .done();
    s.service("ns3", "i3", net.svc(43))
        .port("p80", Tcp, 80, 3003)
        .internal_local()
        .endpoint("p80", net.pod(1, 3), 80, READY)
        .done();
    s.service("ns4", "i4", net.svc(44))
        .port("p80", Tcp, 80, 0)
        .internal_local()
        .endpoint("p80", net.pod(0, 4), 80, TERMINATING_LOCAL)
        .endpoint("p80", net.pod(1, 4), 80, READY)
        .done();
    let mut c = Cases::new(net);
    c.add(
        "pod to iTP=Local ClusterIP: local endpoint only",
        net.local_pod,
        Tcp,
        net.svc(41),
        80,
        Expect::To(vec![(local, 80)], false),
    )
    .add(
        "external to iTP=Local ClusterIP: local endpoint, masqueraded",
        net.external_client,
        Tcp,
        net.svc(41),
        80,
        Expect::To(vec![(local, 80)], true),
    )
    .add(
        "node to iTP=Local ClusterIP",
        net.node_ip,
        Tcp,
        net.svc(41),
        80,
        Expect::To(vec![(local, 80)], true),
    )
    .add(
        "pod to iTP=Local ClusterIP without local endpoints",
        net.local_pod,
        Tcp,
        net.svc(42),
        80,
        Expect::Drop,
    )
    .add(
        "node to iTP=Local ClusterIP without local endpoints",
        net.node_ip,
        Tcp,
        net.svc(42),
        80,
        Expect::Drop,
    )
    .add(
        "pod to iTP=Local ClusterIP of a NodePort Service without local endpoints",
        net.local_pod,
        Tcp,
        net.svc(43),
        80,
        Expect::Drop,
    )
    .add(
        "external to the NodePort of an iTP=Local Service uses every endpoint",
        net.external_client,
        Tcp,
        net.node_ip,
        3003,
        Expect::To(vec![(net.pod(1, 3), 80)], true),
    )
    .add(
        "pod to iTP=Local ClusterIP with only a terminating local endpoint",
        net.local_pod,
        Tcp,
        net.svc(44),
        80,
        Expect::To(vec![(net.pod(0, 4), 80)], false),
    );
    Suite {
        name: "internal traffic policy Local".into(),
        settings: net.settings(),
        scenario: s,
        node: node_addrs(net),
        cases: c.done(),
    }
}

pub fn terminating(net: &Net) -> Suite {
    let mut s = Scenario::default();
    s.service("ns1", "t1", net.svc(41))
        .port("p80", Tcp, 80, 0)
        .endpoint("p80", net.pod(1, 1), 80, TERMINATING)
        .endpoint("p80", net.pod(1, 2), 80, TERMINATING)
        .endpoint("p80", net.pod(1, 3), 80, NOT_SERVING)
        .done();
    s.service("ns2", "t2", net.svc(42))
        .port("p80", Tcp, 80, 0)
        .endpoint("p80", net.pod(1, 1), 80, READY)
        .endpoint("p80", net.pod(1, 2), 80, TERMINATING)
        .done();
    s.service("ns3", "t3", net.svc(43))
        .port("p80", Tcp, 80, 3003)
        .endpoint("p80", net.pod(1, 3), 80, NOT_SERVING)
        .done();
    s.service("ns4", "t4", net.svc(44))
        .port("p80", Tcp, 80, 3004)
        .external_local()
        .endpoint("p80", net.pod(0, 4), 80, TERMINATING_LOCAL)
        .endpoint("p80", net.pod(1, 4), 80, READY)
        .done();
    s.service("ns5", "t5", net.svc(45))
        .port("p80", Tcp, 80, 3005)
        .external_local()
        .endpoint("p80", net.pod(0, 5), 80, NOT_SERVING_LOCAL)
        .endpoint("p80", net.pod(1, 5), 80, TERMINATING)
        .done();
    let mut c = Cases::new(net);
    c.add(
        "all terminating: the serving ones are used",
        net.local_pod,
        Tcp,
        net.svc(41),
        80,
        Expect::To(vec![(net.pod(1, 1), 80), (net.pod(1, 2), 80)], false),
    )
    .add(
        "ready and terminating: only the ready one",
        net.local_pod,
        Tcp,
        net.svc(42),
        80,
        Expect::To(vec![(net.pod(1, 1), 80)], false),
    )
    .add(
        "nothing serving: rejected",
        net.local_pod,
        Tcp,
        net.svc(43),
        80,
        Expect::Reject,
    )
    .add(
        "nothing serving, NodePort: rejected",
        net.external_client,
        Tcp,
        net.node_ip,
        3003,
        Expect::Reject,
    )
    .add(
        "eTP=Local, terminating local and ready remote: external gets the local one",
        net.external_client,
        Tcp,
        net.node_ip,
        3004,
        Expect::To(vec![(net.pod(0, 4), 80)], false),
    )
    .add(
        "eTP=Local, terminating local and ready remote: pods get the ready one",
        net.local_pod,
        Tcp,
        net.node_ip,
        3004,
        Expect::To(vec![(net.pod(1, 4), 80)], false),
    )
    .add(
        "eTP=Local, local not serving: external dropped",
        net.external_client,
        Tcp,
        net.node_ip,
        3005,
        Expect::Drop,
    )
    .add(
        "eTP=Local, local not serving: pods get the serving terminating one",
        net.local_pod,
        Tcp,
        net.node_ip,
        3005,
        Expect::To(vec![(net.pod(1, 5), 80)], false),
    );
    Suite {
        name: "terminating endpoints".into(),
        settings: net.settings(),
        scenario: s,
        node: node_addrs(net),
        cases: c.done(),
    }
}
