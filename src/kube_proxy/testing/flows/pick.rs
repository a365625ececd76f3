//! ipvs mode's schedulers, served by the same rules with another way of picking: round robin
//! (`numgen inc`) and source hashing (`jhash`). Every endpoint stays reachable, affinity too.

use super::{node_addrs, Cases, Expect, Suite};
use crate::kube_proxy::model::Protocol::{Tcp, Udp};
use crate::kube_proxy::nft::rule::Pick;
use crate::kube_proxy::testing::scenario::{Net, Scenario, READY, READY_LOCAL};

pub fn suites(net: &Net) -> Vec<Suite> {
    [
        (Pick::RoundRobin, "round robin"),
        (Pick::SourceHash, "source hashing"),
    ]
    .into_iter()
    .map(|(pick, name)| {
        let mut s = Scenario::default();
        let (a, b) = (net.pod(0, 1), net.pod(1, 1));
        s.service("ns1", "rr", net.svc(41))
            .port("p80", Tcp, 80, 3001)
            .port("dns", Udp, 53, 0)
            .endpoint("p80", a, 80, READY_LOCAL)
            .endpoint("p80", b, 80, READY)
            .endpoint("dns", a, 53, READY_LOCAL)
            .done();
        s.service("ns2", "sticky", net.svc(42))
            .port("p80", Tcp, 80, 0)
            .affinity(60)
            .endpoint("p80", a, 80, READY_LOCAL)
            .endpoint("p80", b, 80, READY)
            .done();
        let mut settings = net.settings();
        settings.pick = pick;
        let both = |masq| Expect::To(vec![(a, 80), (b, 80)], masq);
        let mut c = Cases::new(net);
        c.add(
            &format!("{name}: pod to ClusterIP"),
            net.local_pod,
            Tcp,
            net.svc(41),
            80,
            both(false),
        )
        .add(
            &format!("{name}: external to NodePort"),
            net.external_client,
            Tcp,
            net.node_ip,
            3001,
            both(true),
        )
        .add(
            &format!("{name}: one endpoint"),
            net.local_pod,
            Udp,
            net.svc(41),
            53,
            Expect::To(vec![(a, 53)], false),
        )
        .add(
            &format!("{name}: with affinity"),
            net.local_pod,
            Tcp,
            net.svc(42),
            80,
            both(false),
        );
        Suite {
            name: format!("ipvs mode, {name}"),
            settings,
            scenario: s,
            node: node_addrs(net),
            cases: c.done(),
        }
    })
    .collect()
}
