//! Upstream kube-proxy v1.37.2 and ours, side by side: each runs in a node of its own made of
//! network namespaces (tests/kube_proxy/node.rs), both as Node `node-a` of one real
//! kube-apiserver, so both read the same objects. Each scenario creates Services and
//! hand-written EndpointSlices, waits until both proxies have synced, requires their nftables
//! rulesets to be equal (normalised), and connects from the client, the node and a pod to the
//! Service's addresses on both nodes: who answered, which source address the pod saw, refusals
//! and timeouts must be the same on both sides and what the scenario expects.
//!
//! The "rs" side runs ours ([`RS_SIDE`]); the expectations below are upstream's observed
//! behaviour, checked on both sides.
//!
//! Knobs (environment): `KP_SCENARIOS=a,b` runs only those scenarios; `KP_SIDES=up` runs the
//! upstream side alone; `KP_RS=ours|upstream` overrides [`RS_SIDE`]; `KP_KEEP=1` keeps the
//! run's directory (logs, apiserver data) and prints its path. The report, and after a failure
//! the logs and both sides' listings of a differing table, are in
//! `target/tmp/kube-proxy-side-by-side/`.
//!
//! Needs root, iproute2, nftables, conntrack, socat, python3 and Go (tests/kube/build.sh);
//! skipped without them, except under CI=true, where that fails.
#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod kube_proxy;

use kube_proxy::api::{Ep, Proto::*, Slice, Svc};
use kube_proxy::harness::{all, one_of, p, Harness, KnownDiff, SideSpec};
use kube_proxy::proxy::Impl;

/// What the "rs" side runs (`KP_RS=upstream` runs upstream on both, to check the harness).
const RS_SIDE: Impl = Impl::Ours;

/// Ruleset lines allowed to differ between the sides, each with its reason. Empty: the two
/// proxies' tables are equal in every scenario. Add an entry only for a difference that
/// cannot change what a packet meets.
const KNOWN_DIFFERENCES: &[KnownDiff] = &[];

const POD1: &str = "10.244.1.2";
const POD2: &str = "10.244.1.3";
const POD1_V6: &str = "fd00:10:244:1::2";
const POD2_V6: &str = "fd00:10:244:1::3";
const NODE: &str = "10.0.0.1";
const NODE_V6: &str = "fd00:10::1";

type Scenario = (&'static str, fn(&mut Harness));

const SCENARIOS: &[Scenario] = &[
    ("clusterip-one-endpoint", clusterip_one_endpoint),
    ("clusterip-two-endpoints", clusterip_two_endpoints),
    ("multi-port", multi_port),
    ("udp", udp),
    ("sctp-rules-only", sctp_rules_only),
    ("wrong-port-unallocated-ip", wrong_port_unallocated_ip),
    ("no-endpoints", no_endpoints),
    ("nodeport", nodeport),
    ("nodeport-no-endpoints", nodeport_no_endpoints),
    ("external-ip", external_ip),
    ("loadbalancer", loadbalancer),
    ("lb-source-ranges-allow", lb_source_ranges_allow),
    ("lb-source-ranges-deny", lb_source_ranges_deny),
    ("etp-local-local-endpoint", etp_local_local_endpoint),
    ("etp-local-no-local-endpoint", etp_local_no_local_endpoint),
    ("itp-local", itp_local),
    ("terminating-fallback", terminating_fallback),
    ("endpoint-not-ready", endpoint_not_ready),
    ("client-ip-affinity", client_ip_affinity),
    ("hairpin", hairpin),
    ("service-update", service_update),
    ("service-delete", service_delete),
    ("slice-without-service", slice_without_service),
    ("headless-externalname", headless_externalname),
    ("ignored-labels", ignored_labels),
    ("dual-stack", dual_stack),
];

fn sides() -> Vec<SideSpec> {
    let rs = match std::env::var("KP_RS").as_deref() {
        Ok("ours") => Impl::Ours,
        Ok("upstream") => Impl::Upstream,
        Ok(other) => panic!("KP_RS={other}: expected ours or upstream"),
        Err(_) => RS_SIDE,
    };
    let all = [
        SideSpec {
            label: "up",
            which: Impl::Upstream,
        },
        SideSpec {
            label: "rs",
            which: rs,
        },
    ];
    match std::env::var("KP_SIDES") {
        Ok(list) => all
            .into_iter()
            .filter(|s| list.split(',').any(|l| l == s.label))
            .collect(),
        Err(_) => all.to_vec(),
    }
}

#[test]
fn side_by_side_scenarios() {
    if !kube_proxy::preflight() {
        return;
    }
    let only: Option<Vec<String>> = std::env::var("KP_SCENARIOS")
        .ok()
        .map(|s| s.split(',').map(str::to_string).collect());
    let sides = sides();
    assert!(!sides.is_empty(), "KP_SIDES selects no side");
    let t0 = std::time::Instant::now();
    let mut h = Harness::start(&sides, KNOWN_DIFFERENCES);
    for (name, f) in SCENARIOS {
        if only.as_ref().is_some_and(|o| !o.iter().any(|n| n == name)) {
            continue;
        }
        h.scenario(name, f);
    }
    let sides_text: Vec<String> = h
        .sides
        .iter()
        .map(|s| format!("{} = {}", s.label, s.which.label()))
        .collect();
    h.finish(&format!("sides: {}", sides_text.join(", ")), t0);
}

// ---------------------------------------------------------------------------- scenarios
//
// Tokens: `pod1<-masq` is pod1 answering on 8080 and seeing the node's masquerade address
// (10.244.1.1); `pod2:8081<-client` is pod2 answering on 8081 and seeing the client's own
// address; `pod2<-pod1` a pod-to-pod connection left unmasqueraded.

/// Both pods, masqueraded: what the client and the node see through a cluster-policy VIP.
const BOTH_MASQ: &[&str] = &["pod1<-masq", "pod2<-masq"];
/// What pod1 sees through a ClusterIP with both pods: itself by hairpin (masqueraded), pod2
/// directly.
const BOTH_FROM_POD1: &[&str] = &["pod1<-masq", "pod2<-pod1"];

/// A Service's one slice with the given pods ready on this node, port `http` 8080.
fn slice_http(name: &str, svc: &str, eps: &[&str]) -> Slice {
    eps.iter()
        .fold(Slice::v4(name, svc).port("http", Tcp, 8080), |s, ep| {
            s.ep(Ep::ready(ep))
        })
}

fn clusterip_one_endpoint(h: &mut Harness) {
    h.api()
        .create_service(&Svc::cluster_ip("one", "10.96.1.1").port("http", Tcp, 80, 8080));
    h.api().create_slice(&slice_http("one-1", "one", &[POD2]));
    h.synced();
    h.probe(&[
        p("client", "tcp", "10.96.1.1", 80, all(&["pod2<-masq"])),
        p("node", "tcp", "10.96.1.1", 80, all(&["pod2<-masq"])),
        p("pod1", "tcp", "10.96.1.1", 80, all(&["pod2<-pod1"])),
    ]);
}

fn clusterip_two_endpoints(h: &mut Harness) {
    h.api()
        .create_service(&Svc::cluster_ip("two", "10.96.2.1").port("http", Tcp, 80, 8080));
    h.api()
        .create_slice(&slice_http("two-1", "two", &[POD1, POD2]));
    h.synced();
    h.probe(&[
        p("client", "tcp", "10.96.2.1", 80, all(BOTH_MASQ)),
        p("node", "tcp", "10.96.2.1", 80, all(BOTH_MASQ)),
        p("pod1", "tcp", "10.96.2.1", 80, all(BOTH_FROM_POD1)),
    ]);
}

fn multi_port(h: &mut Harness) {
    h.api().create_service(
        &Svc::cluster_ip("multi", "10.96.3.1")
            .port("http", Tcp, 80, 8080)
            .port("alt", Tcp, 81, 8081)
            .port("dns", Udp, 53, 8082),
    );
    h.api().create_slice(
        &Slice::v4("multi-1", "multi")
            .port("http", Tcp, 8080)
            .port("alt", Tcp, 8081)
            .port("dns", Udp, 8082)
            .ep(Ep::ready(POD1))
            .ep(Ep::ready(POD2)),
    );
    h.synced();
    h.probe(&[
        p("client", "tcp", "10.96.3.1", 80, all(BOTH_MASQ)),
        p(
            "client",
            "tcp",
            "10.96.3.1",
            81,
            all(&["pod1:8081<-masq", "pod2:8081<-masq"]),
        ),
        p(
            "client",
            "udp",
            "10.96.3.1",
            53,
            all(&["pod1:8082<-masq", "pod2:8082<-masq"]),
        ),
        p(
            "node",
            "tcp",
            "10.96.3.1",
            81,
            all(&["pod1:8081<-masq", "pod2:8081<-masq"]),
        ),
        p(
            "pod1",
            "tcp",
            "10.96.3.1",
            81,
            all(&["pod1:8081<-masq", "pod2:8081<-pod1"]),
        ),
        p(
            "pod1",
            "udp",
            "10.96.3.1",
            53,
            all(&["pod1:8082<-masq", "pod2:8082<-pod1"]),
        ),
    ]);
}

fn udp(h: &mut Harness) {
    h.api()
        .create_service(&Svc::cluster_ip("udp", "10.96.4.1").port("dns", Udp, 53, 8080));
    h.api().create_slice(
        &Slice::v4("udp-1", "udp")
            .port("dns", Udp, 8080)
            .ep(Ep::ready(POD1))
            .ep(Ep::ready(POD2)),
    );
    h.synced();
    h.probe(&[
        p("client", "udp", "10.96.4.1", 53, all(BOTH_MASQ)),
        p("node", "udp", "10.96.4.1", 53, all(BOTH_MASQ)),
        p("pod1", "udp", "10.96.4.1", 53, all(BOTH_FROM_POD1)),
        // Another port, and the same port over TCP: not a port of this ClusterIP, rejected.
        p("client", "udp", "10.96.4.1", 54, all(&["REFUSED"])),
        p("client", "tcp", "10.96.4.1", 53, all(&["REFUSED"])),
    ]);
}

/// This kernel has no SCTP sockets (CONFIG_IP_SCTP is off), so SCTP is checked in the rules
/// only (nftables and conntrack handle SCTP without it).
fn sctp_rules_only(h: &mut Harness) {
    h.api()
        .create_service(&Svc::node_port("sctp", "10.96.5.1").port_np("s", Sctp, 9999, 8080, 30500));
    h.api().create_slice(
        &Slice::v4("sctp-1", "sctp")
            .port("s", Sctp, 8080)
            .ep(Ep::ready(POD1))
            .ep(Ep::ready(POD2)),
    );
    h.synced();
    for side in 0..h.sides.len() {
        let t = h.sides[side].tables.get("ip").cloned().flatten();
        let ports = t
            .map(|t| t.service_ports("10.96.5.1", "sctp"))
            .unwrap_or_default();
        if ports != [9999] {
            let label = h.sides[side].label;
            h.fail(format!(
                "side {label}: no sctp service-ips entry for 10.96.5.1:9999 ({ports:?})"
            ));
        }
    }
    h.probe(&[p("client", "tcp", "10.96.5.1", 9999, all(&["REFUSED"]))]);
}

fn wrong_port_unallocated_ip(h: &mut Harness) {
    h.api()
        .create_service(&Svc::cluster_ip("wrongport", "10.96.6.1").port("http", Tcp, 80, 8080));
    h.api()
        .create_slice(&slice_http("wrongport-1", "wrongport", &[POD1]));
    h.synced();
    h.probe(&[
        p("client", "tcp", "10.96.6.1", 80, all(&["pod1<-masq"])),
        p("client", "tcp", "10.96.6.1", 81, all(&["REFUSED"])),
        p("node", "tcp", "10.96.6.1", 81, all(&["REFUSED"])),
        p("pod1", "tcp", "10.96.6.1", 81, all(&["REFUSED"])),
        // An address of the Service CIDR that no Service has: dropped.
        p("client", "tcp", "10.96.6.200", 80, all(&["TIMEOUT"])),
        p("pod1", "tcp", "10.96.6.200", 80, all(&["TIMEOUT"])),
    ]);
}

fn no_endpoints(h: &mut Harness) {
    h.api()
        .create_service(&Svc::cluster_ip("empty", "10.96.7.1").port("http", Tcp, 80, 8080));
    h.api()
        .create_service(&Svc::cluster_ip("emptyslice", "10.96.7.2").port("http", Tcp, 80, 8080));
    h.api()
        .create_slice(&slice_http("emptyslice-1", "emptyslice", &[]));
    h.api()
        .create_service(&Svc::cluster_ip("emptyudp", "10.96.7.3").port("dns", Udp, 53, 8080));
    h.synced();
    h.probe(&[
        p("client", "tcp", "10.96.7.1", 80, all(&["REFUSED"])),
        p("node", "tcp", "10.96.7.1", 80, all(&["REFUSED"])),
        p("pod1", "tcp", "10.96.7.1", 80, all(&["REFUSED"])),
        p("client", "tcp", "10.96.7.2", 80, all(&["REFUSED"])),
        p("client", "udp", "10.96.7.3", 53, all(&["REFUSED"])),
        p("pod1", "udp", "10.96.7.3", 53, all(&["REFUSED"])),
    ]);
}

fn nodeport(h: &mut Harness) {
    h.api().create_service(
        &Svc::node_port("np", "10.96.8.1")
            .port_np("http", Tcp, 80, 8080, 30080)
            .port_np("dns", Udp, 53, 8082, 30053),
    );
    h.api().create_slice(
        &Slice::v4("np-1", "np")
            .port("http", Tcp, 8080)
            .port("dns", Udp, 8082)
            .ep(Ep::ready(POD1))
            .ep(Ep::ready(POD2)),
    );
    h.synced();
    h.probe(&[
        p("client", "tcp", NODE, 30080, all(BOTH_MASQ)),
        p("node", "tcp", NODE, 30080, all(BOTH_MASQ)),
        // eTP=Cluster: external traffic is masqueraded, a pod's too.
        p("pod1", "tcp", NODE, 30080, all(BOTH_MASQ)),
        p(
            "client",
            "udp",
            NODE,
            30053,
            all(&["pod1:8082<-masq", "pod2:8082<-masq"]),
        ),
        p("client", "tcp", "10.96.8.1", 80, all(BOTH_MASQ)),
        // No Service has this NodePort: nothing matches, the node's own stack answers RST.
        p("client", "tcp", NODE, 30081, all(&["REFUSED"])),
    ]);
}

fn nodeport_no_endpoints(h: &mut Harness) {
    h.api().create_service(
        &Svc::node_port("npempty", "10.96.9.1").port_np("http", Tcp, 80, 8080, 30090),
    );
    h.synced();
    h.probe(&[
        p("client", "tcp", NODE, 30090, all(&["REFUSED"])),
        p("node", "tcp", NODE, 30090, all(&["REFUSED"])),
        p("pod1", "tcp", NODE, 30090, all(&["REFUSED"])),
        p("client", "tcp", "10.96.9.1", 80, all(&["REFUSED"])),
    ]);
}

fn external_ip(h: &mut Harness) {
    h.api().create_service(
        &Svc::cluster_ip("ext", "10.96.10.1")
            .port("http", Tcp, 80, 8080)
            .external_ips(&["192.168.200.10"]),
    );
    h.api()
        .create_slice(&slice_http("ext-1", "ext", &[POD1, POD2]));
    h.synced();
    h.probe(&[
        p("client", "tcp", "192.168.200.10", 80, all(BOTH_MASQ)),
        p("node", "tcp", "192.168.200.10", 80, all(BOTH_MASQ)),
        p("pod1", "tcp", "192.168.200.10", 80, all(BOTH_MASQ)),
        p("client", "tcp", "10.96.10.1", 80, all(BOTH_MASQ)),
    ]);
}

/// A LoadBalancer with its ingress IP written to the status, as a cloud controller would.
fn lb(h: &mut Harness, svc: Svc, ingress: &str, eps: &[Ep]) {
    let name = svc.name();
    h.api().create_service(&svc);
    h.api().set_lb_ingress(&name, &[ingress]);
    let slice = eps.iter().fold(
        Slice::v4(&format!("{name}-1"), &name).port("http", Tcp, 8080),
        |s, e| s.ep(e.clone()),
    );
    h.api().create_slice(&slice);
}

fn loadbalancer(h: &mut Harness) {
    lb(
        h,
        Svc::load_balancer("lb", "10.96.11.1").port_np("http", Tcp, 80, 8080, 30110),
        "192.168.100.11",
        &[Ep::ready(POD1), Ep::ready(POD2)],
    );
    // A second ingress IP with ipMode Proxy: the load balancer proxies, the node must not
    // take that IP over.
    h.api().set_lb_ingress_json(
        "lb",
        vec![
            serde_json::json!({"ip": "192.168.100.11"}),
            serde_json::json!({"ip": "192.168.100.111", "ipMode": "Proxy"}),
        ],
    );
    h.synced();
    if h.any_mentions("ip", "192.168.100.111") {
        h.fail("an ingress IP with ipMode Proxy is in a ruleset".into());
    }
    h.probe(&[
        p("client", "tcp", "192.168.100.111", 80, all(&["TIMEOUT"])),
        p("client", "tcp", "192.168.100.11", 80, all(BOTH_MASQ)),
        p("node", "tcp", "192.168.100.11", 80, all(BOTH_MASQ)),
        p("pod1", "tcp", "192.168.100.11", 80, all(BOTH_MASQ)),
        p("client", "tcp", NODE, 30110, all(BOTH_MASQ)),
        p("client", "tcp", "10.96.11.1", 80, all(BOTH_MASQ)),
    ]);
}

fn lb_source_ranges_allow(h: &mut Harness) {
    lb(
        h,
        Svc::load_balancer("lbsr", "10.96.12.1")
            .port_np("http", Tcp, 80, 8080, 30120)
            .source_ranges(&["10.0.0.0/24"]),
        "192.168.100.12",
        &[Ep::ready(POD1), Ep::ready(POD2)],
    );
    h.synced();
    h.probe(&[
        p("client", "tcp", "192.168.100.12", 80, all(BOTH_MASQ)),
        // The node's own address (10.0.0.1) is in the range.
        p("node", "tcp", "192.168.100.12", 80, all(BOTH_MASQ)),
        // A pod's address is not: dropped before DNAT.
        p("pod1", "tcp", "192.168.100.12", 80, all(&["TIMEOUT"])),
    ]);
}

fn lb_source_ranges_deny(h: &mut Harness) {
    lb(
        h,
        Svc::load_balancer("lbdeny", "10.96.13.1")
            .port_np("http", Tcp, 80, 8080, 30130)
            .source_ranges(&["203.0.113.0/24"]),
        "192.168.100.13",
        &[Ep::ready(POD1), Ep::ready(POD2)],
    );
    h.synced();
    h.probe(&[
        p("client", "tcp", "192.168.100.13", 80, all(&["TIMEOUT"])),
        p("node", "tcp", "192.168.100.13", 80, all(&["TIMEOUT"])),
        // Source ranges apply to the LB IP only, not to the NodePort or the ClusterIP.
        p("client", "tcp", NODE, 30130, all(BOTH_MASQ)),
        p("client", "tcp", "10.96.13.1", 80, all(BOTH_MASQ)),
    ]);
}

fn etp_local_local_endpoint(h: &mut Harness) {
    lb(
        h,
        Svc::load_balancer("etpl", "10.96.14.1")
            .port_np("http", Tcp, 80, 8080, 30140)
            .etp_local(),
        "192.168.100.14",
        // pod2 is declared on another node: not local, though reachable.
        &[Ep::ready(POD1), Ep::ready(POD2).on("node-b")],
    );
    h.synced();
    h.probe(&[
        // External traffic: the local endpoint only, the client's address kept.
        p("client", "tcp", NODE, 30140, all(&["pod1<-client"])),
        p(
            "client",
            "tcp",
            "192.168.100.14",
            80,
            all(&["pod1<-client"]),
        ),
        // The ClusterIP keeps the cluster policy.
        p("client", "tcp", "10.96.14.1", 80, all(BOTH_MASQ)),
        // From the node and from a pod, traffic short-circuits to the cluster-wide endpoints.
        p("node", "tcp", NODE, 30140, all(BOTH_MASQ)),
        p("pod1", "tcp", NODE, 30140, all(BOTH_FROM_POD1)),
    ]);
}

fn etp_local_no_local_endpoint(h: &mut Harness) {
    lb(
        h,
        Svc::load_balancer("etpl0", "10.96.15.1")
            .port_np("http", Tcp, 80, 8080, 30150)
            .etp_local(),
        "192.168.100.15",
        &[Ep::ready(POD2).on("node-b")],
    );
    h.synced();
    h.probe(&[
        p("client", "tcp", NODE, 30150, all(&["TIMEOUT"])),
        p("client", "tcp", "192.168.100.15", 80, all(&["TIMEOUT"])),
        p("client", "tcp", "10.96.15.1", 80, all(&["pod2<-masq"])),
        p("node", "tcp", NODE, 30150, all(&["pod2<-masq"])),
        p("pod1", "tcp", NODE, 30150, all(&["pod2<-pod1"])),
    ]);
}

fn itp_local(h: &mut Harness) {
    h.api().create_service(
        &Svc::cluster_ip("itpl", "10.96.16.1")
            .port("http", Tcp, 80, 8080)
            .itp_local(),
    );
    h.api().create_slice(
        &Slice::v4("itpl-1", "itpl")
            .port("http", Tcp, 8080)
            .ep(Ep::ready(POD1))
            .ep(Ep::ready(POD2).on("node-b")),
    );
    h.api().create_service(
        &Svc::cluster_ip("itpl0", "10.96.16.2")
            .port("http", Tcp, 80, 8080)
            .itp_local(),
    );
    h.api().create_slice(
        &Slice::v4("itpl0-1", "itpl0")
            .port("http", Tcp, 8080)
            .ep(Ep::ready(POD2).on("node-b")),
    );
    h.synced();
    h.probe(&[
        p("client", "tcp", "10.96.16.1", 80, all(&["pod1<-masq"])),
        p("node", "tcp", "10.96.16.1", 80, all(&["pod1<-masq"])),
        p("pod1", "tcp", "10.96.16.1", 80, all(&["pod1<-masq"])),
        // No local endpoint: dropped, not rejected.
        p("client", "tcp", "10.96.16.2", 80, all(&["TIMEOUT"])),
        p("pod1", "tcp", "10.96.16.2", 80, all(&["TIMEOUT"])),
    ]);
}

fn terminating_fallback(h: &mut Harness) {
    h.api()
        .create_service(&Svc::cluster_ip("term", "10.96.17.1").port("http", Tcp, 80, 8080));
    h.api().create_slice(
        &Slice::v4("term-1", "term")
            .port("http", Tcp, 8080)
            .ep(Ep::ready(POD1).terminating_serving())
            .ep(Ep::ready(POD2).terminating_serving()),
    );
    h.api()
        .create_service(&Svc::cluster_ip("term2", "10.96.17.2").port("http", Tcp, 80, 8080));
    h.api().create_slice(
        &Slice::v4("term2-1", "term2")
            .port("http", Tcp, 8080)
            .ep(Ep::ready(POD1))
            .ep(Ep::ready(POD2).terminating_serving()),
    );
    h.synced();
    h.probe(&[
        // No ready endpoint: the serving, terminating ones take the traffic.
        p("client", "tcp", "10.96.17.1", 80, all(BOTH_MASQ)),
        // A ready one exists: the terminating one gets nothing new.
        p("client", "tcp", "10.96.17.2", 80, all(&["pod1<-masq"])),
    ]);
}

fn endpoint_not_ready(h: &mut Harness) {
    h.api()
        .create_service(&Svc::cluster_ip("notready", "10.96.18.1").port("http", Tcp, 80, 8080));
    h.api().create_slice(
        &Slice::v4("notready-1", "notready")
            .port("http", Tcp, 8080)
            .ep(Ep::ready(POD1))
            .ep(Ep::ready(POD2).not_ready()),
    );
    h.api()
        .create_service(&Svc::cluster_ip("allnotready", "10.96.18.2").port("http", Tcp, 80, 8080));
    h.api().create_slice(
        &Slice::v4("allnotready-1", "allnotready")
            .port("http", Tcp, 8080)
            .ep(Ep::ready(POD1).not_ready())
            .ep(Ep::ready(POD2).not_ready()),
    );
    h.synced();
    h.probe(&[
        p("client", "tcp", "10.96.18.1", 80, all(&["pod1<-masq"])),
        p("pod1", "tcp", "10.96.18.1", 80, all(&["pod1<-masq"])),
        // Nothing ready or serving: as if there were no endpoints.
        p("client", "tcp", "10.96.18.2", 80, all(&["REFUSED"])),
    ]);
}

fn client_ip_affinity(h: &mut Harness) {
    h.api().create_service(
        &Svc::node_port("aff", "10.96.19.1")
            .port_np("http", Tcp, 80, 8080, 30190)
            .affinity(600),
    );
    h.api()
        .create_slice(&slice_http("aff-1", "aff", &[POD1, POD2]));
    h.synced();
    // Each source sticks to one pod (netagent's first attempt runs alone, so the affinity
    // entry exists before the others).
    h.probe(&[
        p("client", "tcp", "10.96.19.1", 80, one_of(BOTH_MASQ)),
        p("node", "tcp", "10.96.19.1", 80, one_of(BOTH_MASQ)),
        p("pod1", "tcp", "10.96.19.1", 80, one_of(BOTH_FROM_POD1)),
    ]);
    h.probe(&[p("client", "tcp", NODE, 30190, one_of(BOTH_MASQ))]);
}

fn hairpin(h: &mut Harness) {
    h.api().create_service(
        &Svc::node_port("hairpin", "10.96.20.1").port_np("http", Tcp, 80, 8080, 30200),
    );
    h.api()
        .create_slice(&slice_http("hairpin-1", "hairpin", &[POD1]));
    h.synced();
    h.probe(&[
        // pod1 reaching itself through the VIP: masqueraded, or its reply would bypass the NAT.
        p("pod1", "tcp", "10.96.20.1", 80, all(&["pod1<-masq"])),
        p("pod1", "tcp", NODE, 30200, all(&["pod1<-masq"])),
        // Another pod: not masqueraded.
        p("pod2", "tcp", "10.96.20.1", 80, all(&["pod1<-pod2"])),
    ]);
}

fn service_update(h: &mut Harness) {
    h.api()
        .create_service(&Svc::cluster_ip("upd", "10.96.21.1").port("http", Tcp, 80, 8080));
    h.api().create_slice(&slice_http("upd-1", "upd", &[POD1]));
    h.synced();
    h.probe(&[p("client", "tcp", "10.96.21.1", 80, all(&["pod1<-masq"]))]);

    // The port changes and an endpoint is added.
    h.api().patch_service(
        "upd",
        serde_json::json!({"spec": {"ports": [
            {"name": "http", "protocol": "TCP", "port": 8000, "targetPort": 8080}]}}),
    );
    h.api().create_slice(&slice_http("upd-2", "upd", &[POD2]));
    h.synced();
    h.probe(&[
        p("client", "tcp", "10.96.21.1", 8000, all(BOTH_MASQ)),
        p("client", "tcp", "10.96.21.1", 80, all(&["REFUSED"])),
    ]);

    // An endpoint is removed.
    h.api().delete_slice("upd-1");
    h.synced();
    h.probe(&[p("client", "tcp", "10.96.21.1", 8000, all(&["pod2<-masq"]))]);

    // The target port changes.
    h.api().patch_service(
        "upd",
        serde_json::json!({"spec": {"ports": [
            {"name": "http", "protocol": "TCP", "port": 8000, "targetPort": 8081}]}}),
    );
    h.api().patch_slice(
        "upd-2",
        serde_json::json!({"ports": [{"name": "http", "protocol": "TCP", "port": 8081}]}),
    );
    h.synced();
    h.probe(&[p(
        "client",
        "tcp",
        "10.96.21.1",
        8000,
        all(&["pod2:8081<-masq"]),
    )]);
}

fn service_delete(h: &mut Harness) {
    h.api()
        .create_service(&Svc::node_port("del", "10.96.22.1").port_np("http", Tcp, 80, 8080, 30220));
    h.api()
        .create_slice(&slice_http("del-1", "del", &[POD1, POD2]));
    h.synced();
    h.probe(&[p("client", "tcp", NODE, 30220, all(BOTH_MASQ))]);
    h.api().delete_service("del");
    h.api().delete_slice("del-1");
    h.synced();
    h.expect_baseline();
    for needle in ["10.96.22.1", "kp/del/", "30220"] {
        if h.any_mentions("ip", needle) {
            h.fail(format!(
                "the deleted Service's {needle} is still in a ruleset"
            ));
        }
    }
    h.probe(&[
        // Now an unallocated address of the Service CIDR: dropped.
        p("client", "tcp", "10.96.22.1", 80, all(&["TIMEOUT"])),
        p("client", "tcp", NODE, 30220, all(&["REFUSED"])),
    ]);
}

fn slice_without_service(h: &mut Harness) {
    h.api()
        .create_slice(&slice_http("ghost-1", "ghost", &[POD1]));
    h.synced();
    h.expect_baseline();
    // Its Service arrives later: the slice that was there first is used.
    h.api()
        .create_service(&Svc::cluster_ip("ghost", "10.96.23.1").port("http", Tcp, 80, 8080));
    h.synced();
    h.probe(&[p("client", "tcp", "10.96.23.1", 80, all(&["pod1<-masq"]))]);
}

fn headless_externalname(h: &mut Harness) {
    h.api()
        .create_service(&Svc::headless("headless").port("http", Tcp, 80, 8080));
    h.api()
        .create_slice(&slice_http("headless-1", "headless", &[POD1]));
    h.api()
        .create_service(&Svc::external_name("extname", "example.com"));
    h.synced();
    h.expect_baseline();
}

/// What the informers' label selectors leave out: Services labelled with another proxy's
/// name, and EndpointSlices labelled headless. The same labels elsewhere do nothing.
fn ignored_labels(h: &mut Harness) {
    h.api().create_service(
        &Svc::cluster_ip("other", "10.96.25.1")
            .port("http", Tcp, 80, 8080)
            .label("service.kubernetes.io/service-proxy-name", "other-proxy"),
    );
    h.api()
        .create_slice(&slice_http("other-1", "other", &[POD1]));
    h.synced();
    h.expect_baseline();
    h.probe(&[p("client", "tcp", "10.96.25.1", 80, all(&["TIMEOUT"]))]);

    // A slice labelled headless is never seen: its Service has no endpoints.
    h.api()
        .create_service(&Svc::cluster_ip("slicehl", "10.96.25.2").port("http", Tcp, 80, 8080));
    h.api().create_slice(
        &slice_http("slicehl-1", "slicehl", &[POD1]).label("service.kubernetes.io/headless", ""),
    );
    // The proxy-name label on a slice, and the headless label on a Service, select nothing.
    h.api().create_service(
        &Svc::cluster_ip("svchl", "10.96.25.3")
            .port("http", Tcp, 80, 8080)
            .label("service.kubernetes.io/headless", ""),
    );
    h.api()
        .create_slice(&slice_http("svchl-1", "svchl", &[POD1]));
    h.api()
        .create_service(&Svc::cluster_ip("sliceproxy", "10.96.25.4").port("http", Tcp, 80, 8080));
    h.api().create_slice(
        &slice_http("sliceproxy-1", "sliceproxy", &[POD1])
            .label("service.kubernetes.io/service-proxy-name", "other-proxy"),
    );
    h.synced();
    h.probe(&[
        p("client", "tcp", "10.96.25.1", 80, all(&["TIMEOUT"])),
        p("client", "tcp", "10.96.25.2", 80, all(&["REFUSED"])),
        p("client", "tcp", "10.96.25.3", 80, all(&["pod1<-masq"])),
        p("client", "tcp", "10.96.25.4", 80, all(&["pod1<-masq"])),
    ]);
}

fn dual_stack(h: &mut Harness) {
    const V6: &str = "fd00:10:96::1a01";
    h.api().create_service(
        &Svc::node_port("dual", "10.96.26.1")
            .dual_stack(V6)
            .port_np("http", Tcp, 80, 8080, 30260),
    );
    h.api()
        .create_slice(&slice_http("dual-v4", "dual", &[POD1, POD2]));
    h.api().create_slice(
        &Slice::new("dual-v6", "dual", "IPv6")
            .port("http", Tcp, 8080)
            .ep(Ep::ready(POD1_V6))
            .ep(Ep::ready(POD2_V6)),
    );
    h.synced();
    h.probe(&[
        p("client", "tcp", V6, 80, all(BOTH_MASQ)),
        p("node", "tcp", V6, 80, all(BOTH_MASQ)),
        p("pod1", "tcp", V6, 80, all(BOTH_FROM_POD1)),
        p("client", "tcp", NODE_V6, 30260, all(BOTH_MASQ)),
        p("client", "tcp", V6, 81, all(&["REFUSED"])),
        p("client", "tcp", "10.96.26.1", 80, all(BOTH_MASQ)),
        p("client", "tcp", NODE, 30260, all(BOTH_MASQ)),
    ]);
}
