use std::collections::BTreeSet;

use super::*;
use crate::kube_proxy::model::{Hints, Protocol, ServiceName, ServicePortName};

fn port(internal_local: bool, external_local: bool, node_port: u16) -> ServicePort {
    ServicePort {
        name: ServicePortName::new(ServiceName::new("ns", "svc"), "p", Protocol::Tcp),
        cluster_ip: "172.30.0.1".parse().unwrap(),
        port: 80,
        node_port,
        affinity_timeout: None,
        external_policy_local: external_local,
        internal_policy_local: internal_local,
        external_ips: vec![],
        source_ranges: vec![],
        lb_vips: vec![],
        health_check_node_port: 0,
    }
}

/// `spec`: r ready, s serving, t terminating, l local; zones after `z=`, nodes after `n=`.
fn ep(ip: &str, spec: &str) -> Endpoint {
    let mut zones = None;
    let mut nodes = None;
    for part in spec.split(' ') {
        if let Some(z) = part.strip_prefix("z=") {
            zones = Some(z.split(',').map(String::from).collect::<BTreeSet<_>>());
        }
        if let Some(n) = part.strip_prefix("n=") {
            nodes = Some(n.split(',').map(String::from).collect::<BTreeSet<_>>());
        }
    }
    let flags = spec.split(' ').next().unwrap_or_default();
    Endpoint {
        ip: ip.parse().unwrap(),
        port: 80,
        is_local: flags.contains('l'),
        ready: flags.contains('r'),
        serving: flags.contains('s'),
        terminating: flags.contains('t'),
        hints: (zones.is_some() || nodes.is_some()).then(|| Box::new(Hints { zones, nodes })),
    }
}

fn ips(eps: &[&Endpoint]) -> Vec<String> {
    let mut out: Vec<String> = eps.iter().map(|e| e.ip.to_string()).collect();
    out.sort();
    out
}

#[test]
fn cluster_policy_takes_ready_endpoints() {
    let eps = [
        ep("10.0.0.1", "rs"),
        ep("10.0.0.2", "st"),
        ep("10.0.0.3", ""),
    ];
    let c = categorize(&eps, &port(false, false, 0), "node", None);
    assert_eq!(ips(&c.cluster), ["10.0.0.1"]);
    assert!(c.local.is_empty());
    assert_eq!(ips(&c.all_reachable), ["10.0.0.1"]);
    assert!(c.has_any);
}

#[test]
fn cluster_policy_falls_back_to_serving_terminating() {
    let eps = [
        ep("10.0.0.1", "t"),
        ep("10.0.0.2", "st"),
        ep("10.0.0.3", "s"),
    ];
    let c = categorize(&eps, &port(false, false, 0), "node", None);
    assert_eq!(ips(&c.cluster), ["10.0.0.2"]);
    assert!(c.has_any);
}

#[test]
fn nothing_usable_means_no_endpoints() {
    let eps = [ep("10.0.0.1", "t"), ep("10.0.0.3", "s")];
    let c = categorize(&eps, &port(false, false, 0), "node", None);
    assert!(c.cluster.is_empty());
    assert!(!c.has_any);
    let c = categorize(&[], &port(false, false, 0), "node", None);
    assert_eq!(c, Categorized::default());
}

#[test]
fn internal_local_takes_local_ready_then_local_terminating() {
    let eps = [
        ep("10.0.0.1", "rsl"),
        ep("10.0.0.2", "rs"),
        ep("10.0.0.3", "stl"),
    ];
    let c = categorize(&eps, &port(true, false, 0), "node", None);
    assert!(
        c.cluster.is_empty(),
        "not externally accessible: no cluster set"
    );
    assert_eq!(ips(&c.local), ["10.0.0.1"]);
    assert_eq!(ips(&c.all_reachable), ["10.0.0.1"]);

    let eps = [ep("10.0.0.2", "rs"), ep("10.0.0.3", "stl")];
    let c = categorize(&eps, &port(true, false, 0), "node", None);
    assert_eq!(ips(&c.local), ["10.0.0.3"]);
    assert!(c.has_any);

    let eps = [ep("10.0.0.2", "rs")];
    let c = categorize(&eps, &port(true, false, 0), "node", None);
    assert!(c.local.is_empty());
    assert!(c.has_any, "a ready endpoint elsewhere still counts");
}

#[test]
fn external_local_uses_both_sets() {
    let eps = [ep("10.0.0.1", "rsl"), ep("10.0.0.2", "rs")];
    let c = categorize(&eps, &port(false, true, 30000), "node", None);
    assert_eq!(ips(&c.cluster), ["10.0.0.1", "10.0.0.2"]);
    assert_eq!(ips(&c.local), ["10.0.0.1"]);
    assert_eq!(ips(&c.all_reachable), ["10.0.0.1", "10.0.0.2"]);
}

#[test]
fn external_local_without_external_access_is_cluster_only() {
    let eps = [ep("10.0.0.1", "rsl"), ep("10.0.0.2", "rs")];
    let c = categorize(&eps, &port(false, true, 0), "node", None);
    assert_eq!(ips(&c.cluster), ["10.0.0.1", "10.0.0.2"]);
    assert!(c.local.is_empty());
}

#[test]
fn local_terminating_fallback_joins_the_reachable_set() {
    let eps = [ep("10.0.0.1", "stl"), ep("10.0.0.2", "rs")];
    let c = categorize(&eps, &port(false, true, 30000), "node", None);
    assert_eq!(ips(&c.cluster), ["10.0.0.2"]);
    assert_eq!(ips(&c.local), ["10.0.0.1"]);
    assert_eq!(ips(&c.all_reachable), ["10.0.0.1", "10.0.0.2"]);
}

#[test]
fn zone_hints_filter_when_every_ready_endpoint_has_one() {
    let eps = [
        ep("10.0.0.1", "rs z=zone-a"),
        ep("10.0.0.2", "rs z=zone-b"),
        ep("10.0.0.3", "rs z=zone-a,zone-c"),
    ];
    let c = categorize(&eps, &port(false, false, 0), "node", Some("zone-a"));
    assert_eq!(ips(&c.cluster), ["10.0.0.1", "10.0.0.3"]);
    // No hint for this zone: no filtering.
    let c = categorize(&eps, &port(false, false, 0), "node", Some("zone-x"));
    assert_eq!(c.cluster.len(), 3);
    // The node has no zone label: no filtering.
    let c = categorize(&eps, &port(false, false, 0), "node", None);
    assert_eq!(c.cluster.len(), 3);
    // One ready endpoint without hints: no filtering.
    let mixed = [ep("10.0.0.1", "rs z=zone-a"), ep("10.0.0.2", "rs")];
    let c = categorize(&mixed, &port(false, false, 0), "node", Some("zone-a"));
    assert_eq!(c.cluster.len(), 2);
    // An endpoint that is not ready does not need hints.
    let unready = [ep("10.0.0.1", "rs z=zone-a"), ep("10.0.0.2", "")];
    let c = categorize(&unready, &port(false, false, 0), "node", Some("zone-a"));
    assert_eq!(ips(&c.cluster), ["10.0.0.1"]);
}

#[test]
fn node_hints_win_over_zone_hints() {
    let eps = [
        ep("10.0.0.1", "rs z=zone-a n=node-1"),
        ep("10.0.0.2", "rs z=zone-a n=node-2"),
    ];
    let c = categorize(&eps, &port(false, false, 0), "node-2", Some("zone-a"));
    assert_eq!(ips(&c.cluster), ["10.0.0.2"]);
    // No node hint for this node: zone hints apply.
    let c = categorize(&eps, &port(false, false, 0), "node-3", Some("zone-a"));
    assert_eq!(ips(&c.cluster), ["10.0.0.1", "10.0.0.2"]);
}

#[test]
fn topology_filtered_cluster_and_local_are_unioned() {
    let eps = [
        ep("10.0.0.1", "rsl z=zone-b"),
        ep("10.0.0.2", "rs z=zone-a"),
    ];
    let c = categorize(&eps, &port(false, true, 30000), "node", Some("zone-a"));
    assert_eq!(ips(&c.cluster), ["10.0.0.2"]);
    assert_eq!(ips(&c.local), ["10.0.0.1"]);
    assert_eq!(ips(&c.all_reachable), ["10.0.0.1", "10.0.0.2"]);
}

#[test]
fn hints_do_not_apply_to_terminating_fallback() {
    let eps = [ep("10.0.0.1", "st z=zone-b"), ep("10.0.0.2", "st z=zone-a")];
    let c = categorize(&eps, &port(false, false, 0), "node", Some("zone-a"));
    assert_eq!(ips(&c.cluster), ["10.0.0.1", "10.0.0.2"]);
}
