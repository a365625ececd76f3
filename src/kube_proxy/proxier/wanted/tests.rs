use std::sync::Arc;

use super::*;
use crate::kube_proxy::api::objects::{ServiceObj, SliceEndpoint, SlicePort};

fn ep(ip: &str, ready: bool, terminating: bool, local: bool) -> SliceEndpoint {
    SliceEndpoint {
        ip: ip.parse().unwrap(),
        is_local: local,
        ready,
        serving: ready || terminating,
        terminating,
        hints: None,
    }
}

fn slice(
    name: &str,
    family: IpFamily,
    ports: &[(&str, Protocol, u16)],
    eps: Vec<SliceEndpoint>,
) -> Arc<SliceObj> {
    Arc::new(SliceObj {
        service: ServiceName::new("ns", "svc"),
        name: name.into(),
        family,
        ports: ports
            .iter()
            .map(|(n, p, port)| SlicePort {
                name: (*n).into(),
                protocol: *p,
                port: *port,
            })
            .collect(),
        endpoints: eps,
        trigger_time: None,
    })
}

fn svc() -> Arc<ServiceObj> {
    Arc::new(ServiceObj {
        name: ServiceName::new("ns", "svc"),
        cluster_ip_v4: Some("10.96.0.10".parse().unwrap()),
        cluster_ip_v6: None,
        ports: vec![crate::kube_proxy::api::objects::PortSpec {
            name: "dns".into(),
            protocol: Protocol::Udp,
            port: 53,
            node_port: 0,
        }],
        external_ips: vec![],
        source_ranges: vec![],
        lb_vips: vec![],
        external_policy_local: false,
        internal_policy_local: false,
        affinity_timeout: None,
        health_check_node_port: 0,
    })
}

fn checkout(service: Option<Arc<ServiceObj>>, slices: Vec<Arc<SliceObj>>) -> Checkout {
    let name = ServiceName::new("ns", "svc");
    let mut c = Checkout::default();
    c.services.insert(name.clone(), service);
    c.endpoints.insert(name, slices);
    c
}

fn port(name: &str, protocol: Protocol) -> ServicePortName {
    ServicePortName::new(ServiceName::new("ns", "svc"), name, protocol)
}

#[test]
fn slices_merge_as_upstreams_cache_merges_them() {
    let mut wants = NodeWants::new();
    let dns = [("dns", Protocol::Udp, 5353)];
    let applied = wants.apply(
        IpFamily::V4,
        checkout(
            Some(svc()),
            vec![
                slice(
                    "a",
                    IpFamily::V4,
                    &dns,
                    vec![
                        ep("10.0.0.2", true, false, false),
                        ep("10.0.0.10", true, false, true),
                    ],
                ),
                // The same address terminating in another slice: the ready copy wins.
                slice(
                    "b",
                    IpFamily::V4,
                    &dns,
                    vec![ep("10.0.0.2", false, true, false)],
                ),
                // Another family's slice is not this proxier's.
                slice(
                    "c",
                    IpFamily::V6,
                    &dns,
                    vec![ep("fd00::1", true, false, false)],
                ),
            ],
        ),
    );
    assert!(applied.changed.contains(&ServiceName::new("ns", "svc")));
    assert!(applied.udp_endpoints_changed);
    let eps = &wants.endpoints[&port("dns", Protocol::Udp)];
    let addrs: Vec<String> = eps.iter().map(Endpoint::address).collect();
    assert_eq!(addrs, ["10.0.0.10:5353", "10.0.0.2:5353"], "sorted as text");
    assert!(eps[1].ready && !eps[1].terminating);
    assert_eq!(wants.endpoint_count(), 2);
    // The same again changes nothing.
    let again = wants.apply(
        IpFamily::V4,
        checkout(
            Some(svc()),
            vec![slice(
                "a",
                IpFamily::V4,
                &dns,
                vec![
                    ep("10.0.0.2", true, false, false),
                    ep("10.0.0.10", true, false, true),
                ],
            )],
        ),
    );
    assert!(again.changed.is_empty(), "{again:?}");
}

#[test]
fn a_service_gone_and_its_slices_gone_leave_nothing() {
    let mut wants = NodeWants::new();
    let dns = [("dns", Protocol::Udp, 5353)];
    wants.apply(
        IpFamily::V4,
        checkout(
            Some(svc()),
            vec![slice(
                "a",
                IpFamily::V4,
                &dns,
                vec![ep("10.0.0.2", true, false, false)],
            )],
        ),
    );
    let applied = wants.apply(IpFamily::V4, checkout(None, vec![]));
    assert_eq!(applied.changed.len(), 1);
    assert!(wants.services.is_empty() && wants.endpoints.is_empty());
    // A Service without a ClusterIP of this family is not this proxier's.
    let applied = wants.apply(IpFamily::V6, checkout(Some(svc()), vec![]));
    assert!(applied.changed.is_empty());
}

#[test]
fn health_checks_count_ready_local_addresses() {
    let mut wants = NodeWants::new();
    let mut s = (*svc()).clone();
    s.health_check_node_port = 30100;
    s.ports.push(crate::kube_proxy::api::objects::PortSpec {
        name: "dnstcp".into(),
        protocol: Protocol::Tcp,
        port: 53,
        node_port: 0,
    });
    let ports = [("dns", Protocol::Udp, 53), ("dnstcp", Protocol::Tcp, 53)];
    wants.apply(
        IpFamily::V4,
        checkout(
            Some(Arc::new(s)),
            vec![slice(
                "a",
                IpFamily::V4,
                &ports,
                vec![
                    ep("10.0.0.2", true, false, true),
                    ep("10.0.0.3", false, true, true),
                    ep("10.0.0.4", true, false, false),
                ],
            )],
        ),
    );
    let checks = wants.health_checks();
    assert_eq!(checks[&ServiceName::new("ns", "svc")], (30100, 1));
}
