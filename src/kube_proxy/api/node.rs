//! What the proxy reads of its own Node: its addresses (InternalIP first, then ExternalIP;
//! the first sets the primary family, the first of the other family the second), its zone
//! label, its pod CIDRs, and whether it is being deleted (for `/healthz`).

use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;

use crate::kube_proxy::healthz::TO_BE_DELETED_TAINT;
use crate::kube_proxy::model::{parse_cidr_sloppy, parse_ip_sloppy, IpFamily};

pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeInfo {
    /// The primary address, and the first of the other family (upstream's node IPs).
    pub ips: Vec<IpAddr>,
    pub zone: Option<String>,
    pub pod_cidrs: Vec<IpNet>,
    /// Being deleted, or tainted for deletion by the cluster autoscaler.
    pub leaving: bool,
}

impl NodeInfo {
    pub fn read(node: &Node) -> NodeInfo {
        let addresses = node
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_deref())
            .unwrap_or_default();
        let of_type = |kind: &'static str| {
            addresses
                .iter()
                .filter(move |a| a.type_ == kind)
                .filter_map(|a| parse_ip_sloppy(&a.address))
        };
        let all: Vec<IpAddr> = of_type("InternalIP").chain(of_type("ExternalIP")).collect();
        let mut ips = Vec::new();
        if let Some(first) = all.first() {
            ips.push(*first);
            if let Some(other) = all
                .iter()
                .find(|ip| IpFamily::of(ip) != IpFamily::of(first))
            {
                ips.push(*other);
            }
        }
        let spec = node.spec.as_ref();
        let pod_cidrs = spec
            .and_then(|s| s.pod_cidrs.clone())
            .unwrap_or_default()
            .iter()
            .filter_map(|c| parse_cidr_sloppy(c))
            .collect();
        let tainted = spec
            .and_then(|s| s.taints.as_deref())
            .unwrap_or_default()
            .iter()
            .any(|t| t.key == TO_BE_DELETED_TAINT);
        NodeInfo {
            ips,
            zone: node
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(ZONE_LABEL))
                .cloned(),
            pod_cidrs,
            leaving: node.metadata.deletion_timestamp.is_some() || tainted,
        }
    }

    pub fn ip_of(&self, family: IpFamily) -> Option<IpAddr> {
        self.ips
            .iter()
            .copied()
            .find(|ip| IpFamily::of(ip) == family)
    }
}
