//! Which endpoints a Service port sends traffic to from this node: a pure function of the
//! endpoints, the port's traffic policies, the node's name and zone, as upstream chooses.
//!
//! - Cluster policy: the ready endpoints (filtered by topology hints when every ready
//!   endpoint carries them and one names this node, or else this node's zone); with none,
//!   every endpoint that is serving and terminating.
//! - Local policy: this node's ready endpoints; with none, its serving and terminating ones.

use std::collections::BTreeMap;

use super::model::{Endpoint, ServicePort};

/// What `categorize` chose, by index into the endpoints it was given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Categorized<'a> {
    /// The endpoints for Cluster-policy traffic (empty when the port never uses them).
    pub cluster: Vec<&'a Endpoint>,
    /// The endpoints for Local-policy traffic (empty when the port never uses them).
    pub local: Vec<&'a Endpoint>,
    /// Every endpoint either set may send traffic to: the hairpin set and the affinity
    /// chains are made for these.
    pub all_reachable: Vec<&'a Endpoint>,
    /// Any endpoint anywhere is ready, or serving and terminating.
    pub has_any: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum TopologyMode {
    None,
    SameNode,
    SameZone,
}

pub fn categorize<'a>(
    endpoints: &'a [Endpoint],
    port: &ServicePort,
    node_name: &str,
    zone: Option<&str>,
) -> Categorized<'a> {
    let mut out = Categorized::default();
    if endpoints.is_empty() {
        return out;
    }
    let mut mode = TopologyMode::None;
    let mut serving_terminating_local = false;
    if port.uses_cluster_endpoints() {
        mode = topology_mode(endpoints, node_name, zone);
        out.cluster = endpoints
            .iter()
            .filter(|ep| ep.ready && available(ep, mode, node_name, zone))
            .collect();
        if out.cluster.is_empty() {
            out.cluster = endpoints
                .iter()
                .filter(|ep| ep.serving && ep.terminating)
                .collect();
        }
        out.has_any = !out.cluster.is_empty();
    }
    if !port.uses_local_endpoints() {
        out.all_reachable = out.cluster.clone();
        return out;
    }
    let mut local_ready = false;
    let mut local_serving_terminating = false;
    for ep in endpoints {
        if ep.ready {
            out.has_any = true;
            local_ready |= ep.is_local;
        } else if ep.serving && ep.terminating {
            out.has_any = true;
            local_serving_terminating |= ep.is_local;
        }
    }
    if local_ready {
        out.local = endpoints
            .iter()
            .filter(|ep| ep.is_local && ep.ready)
            .collect();
    } else if local_serving_terminating {
        serving_terminating_local = true;
        out.local = endpoints
            .iter()
            .filter(|ep| ep.is_local && ep.serving && ep.terminating)
            .collect();
    }
    if !port.uses_cluster_endpoints() {
        out.all_reachable = out.local.clone();
        return out;
    }
    if mode == TopologyMode::None && !serving_terminating_local {
        // The local endpoints are then a subset of the cluster ones.
        out.all_reachable = out.cluster.clone();
        return out;
    }
    let mut union: BTreeMap<String, &'a Endpoint> = BTreeMap::new();
    for ep in out.cluster.iter().chain(out.local.iter()) {
        union.insert(ep.address(), ep);
    }
    out.all_reachable = union.into_values().collect();
    out
}

fn topology_mode(endpoints: &[Endpoint], node_name: &str, zone: Option<&str>) -> TopologyMode {
    let mut any_ready = false;
    let mut all_node_hints = true;
    let mut for_node = false;
    let mut all_zone_hints = true;
    let mut for_zone = false;
    for ep in endpoints.iter().filter(|ep| ep.ready) {
        any_ready = true;
        if !ep.has_node_hints() {
            all_node_hints = false;
        } else if ep.node_hinted(node_name) {
            for_node = true;
        }
        if !ep.has_zone_hints() {
            all_zone_hints = false;
        } else if ep.zone_hinted(zone.unwrap_or_default()) {
            for_zone = true;
        }
    }
    if !any_ready {
        return TopologyMode::None;
    }
    if all_node_hints && for_node {
        return TopologyMode::SameNode;
    }
    if all_zone_hints && for_zone {
        return TopologyMode::SameZone;
    }
    TopologyMode::None
}

fn available(ep: &Endpoint, mode: TopologyMode, node_name: &str, zone: Option<&str>) -> bool {
    match mode {
        TopologyMode::None => true,
        TopologyMode::SameNode => ep.node_hinted(node_name),
        TopologyMode::SameZone => ep.zone_hinted(zone.unwrap_or_default()),
    }
}

#[cfg(test)]
mod tests;
