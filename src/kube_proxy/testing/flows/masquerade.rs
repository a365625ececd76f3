//! Masquerading under each setting that changes it: --masquerade-all, no local-traffic
//! detection, detection by bridge interface and by interface-name prefix, another mark bit.

use super::{node_addrs, Cases, Expect, Suite};
use crate::kube_proxy::model::Protocol::Tcp;
use crate::kube_proxy::ruleset::settings::{LocalDetector, Settings};
use crate::kube_proxy::testing::scenario::{Net, Scenario, READY, READY_LOCAL};

fn scenario(net: &Net) -> Scenario {
    let mut s = Scenario::default();
    s.service("ns1", "m1", net.svc(41))
        .port("p80", Tcp, 80, 3001)
        .endpoint("p80", net.pod(0, 1), 80, READY_LOCAL)
        .endpoint("p80", net.pod(1, 1), 80, READY)
        .done();
    s.service("ns2", "m2", net.svc(42))
        .port("p80", Tcp, 80, 3002)
        .lb(net.ext(30))
        .external_local()
        .endpoint("p80", net.pod(0, 5), 80, READY_LOCAL)
        .endpoint("p80", net.pod(1, 5), 80, READY)
        .done();
    s
}

fn suite(net: &Net, name: &str, settings: Settings, cases: Cases<'_>) -> Suite {
    Suite {
        name: format!("masquerade: {name}"),
        settings,
        scenario: scenario(net),
        node: node_addrs(net),
        cases: cases.done(),
    }
}

pub fn suites(net: &Net) -> Vec<Suite> {
    let m1 = |masq| Expect::To(vec![(net.pod(0, 1), 80), (net.pod(1, 1), 80)], masq);
    let m2 = |masq| Expect::To(vec![(net.pod(0, 5), 80), (net.pod(1, 5), 80)], masq);
    let m2_local = || Expect::To(vec![(net.pod(0, 5), 80)], false);
    let (svc1, svc2, lb) = (net.svc(41), net.svc(42), net.ext(30));
    let mut out = Vec::new();

    let mut settings = net.settings();
    settings.masquerade_all = true;
    let mut c = Cases::new(net);
    c.add(
        "masquerade-all: pod to ClusterIP",
        net.local_pod,
        Tcp,
        svc1,
        80,
        m1(true),
    )
    .add(
        "masquerade-all: external to ClusterIP",
        net.external_client,
        Tcp,
        svc1,
        80,
        m1(true),
    )
    .add(
        "masquerade-all: pod to NodePort",
        net.local_pod,
        Tcp,
        net.node_ip,
        3001,
        m1(true),
    )
    .add(
        "masquerade-all: pod to ClusterIP of eTP=Local",
        net.local_pod,
        Tcp,
        svc2,
        80,
        m2(true),
    )
    .add(
        "masquerade-all: external to eTP=Local LB keeps the source",
        net.external_client,
        Tcp,
        lb,
        80,
        m2_local(),
    );
    out.push(suite(net, "all", settings, c));

    let mut settings = net.settings();
    settings.local_detector = LocalDetector::None;
    let mut c = Cases::new(net);
    c.add(
        "no detection: pod to ClusterIP",
        net.local_pod,
        Tcp,
        svc1,
        80,
        m1(false),
    )
    .add(
        "no detection: external to ClusterIP is not masqueraded",
        net.external_client,
        Tcp,
        svc1,
        80,
        m1(false),
    )
    .add(
        "no detection: node to ClusterIP is not masqueraded",
        net.node_ip,
        Tcp,
        svc1,
        80,
        m1(false),
    )
    .add(
        "no detection: pod to NodePort",
        net.local_pod,
        Tcp,
        net.node_ip,
        3001,
        m1(true),
    )
    .add(
        "no detection: external to NodePort",
        net.external_client,
        Tcp,
        net.node_ip,
        3001,
        m1(true),
    )
    .add(
        "no detection: pod to eTP=Local LB is treated as external",
        net.local_pod,
        Tcp,
        lb,
        80,
        m2_local(),
    )
    .add(
        "no detection: node to eTP=Local LB still short-circuits",
        net.node_ip,
        Tcp,
        lb,
        80,
        m2(true),
    );
    out.push(suite(net, "no local detection", settings, c));

    let mut settings = net.settings();
    settings.local_detector = LocalDetector::Interface("cbr0".into());
    let mut c = Cases::new(net);
    c.add_iif(
        "bridge: pod to ClusterIP",
        net.local_pod,
        Tcp,
        svc1,
        80,
        Some("cbr0"),
        m1(false),
    )
    .add_iif(
        "bridge: pod address from another interface to ClusterIP",
        net.local_pod,
        Tcp,
        svc1,
        80,
        Some("eth0"),
        m1(true),
    )
    .add_iif(
        "bridge: external to ClusterIP",
        net.external_client,
        Tcp,
        svc1,
        80,
        Some("eth0"),
        m1(true),
    )
    .add_iif(
        "bridge: pod to eTP=Local LB short-circuits",
        net.local_pod,
        Tcp,
        lb,
        80,
        Some("cbr0"),
        m2(false),
    )
    .add_iif(
        "bridge: external to eTP=Local LB",
        net.external_client,
        Tcp,
        lb,
        80,
        Some("eth0"),
        m2_local(),
    )
    .add(
        "bridge: node to ClusterIP",
        net.node_ip,
        Tcp,
        svc1,
        80,
        m1(true),
    );
    out.push(suite(net, "bridge interface", settings, c));

    let mut settings = net.settings();
    settings.local_detector = LocalDetector::InterfacePrefix("veth".into());
    let mut c = Cases::new(net);
    c.add_iif(
        "prefix: pod to ClusterIP",
        net.local_pod,
        Tcp,
        svc1,
        80,
        Some("veth1234"),
        m1(false),
    )
    .add_iif(
        "prefix: external to ClusterIP",
        net.external_client,
        Tcp,
        svc1,
        80,
        Some("eth0"),
        m1(true),
    )
    .add_iif(
        "prefix: pod to eTP=Local LB short-circuits",
        net.local_pod,
        Tcp,
        lb,
        80,
        Some("vethabcd"),
        m2(false),
    )
    .add_iif(
        "prefix: external to eTP=Local NodePort",
        net.external_client,
        Tcp,
        net.node_ip,
        3002,
        Some("eth0"),
        m2_local(),
    );
    out.push(suite(net, "interface prefix", settings, c));

    let mut settings = net.settings();
    settings.mark = 1 << 5;
    let mut c = Cases::new(net);
    c.add(
        "mark bit 5: external to ClusterIP",
        net.external_client,
        Tcp,
        svc1,
        80,
        m1(true),
    )
    .add(
        "mark bit 5: pod to ClusterIP",
        net.local_pod,
        Tcp,
        svc1,
        80,
        m1(false),
    )
    .add(
        "mark bit 5: external to NodePort",
        net.external_client,
        Tcp,
        net.node_ip,
        3001,
        m1(true),
    );
    out.push(suite(net, "mark bit", settings, c));
    out
}
