//! What one family's ruleset depends on besides Services and endpoints: the node, the
//! masquerade mark, local-traffic detection, where NodePorts answer, the Service CIDRs.
//! Built from the configuration and the Node object; a change to any of it rewrites the
//! whole ruleset (a full sync).

use std::net::IpAddr;

use ipnet::IpNet;

use crate::kube_proxy::model::IpFamily;
use crate::kube_proxy::nft::rule::{AddrField, AddrValue, Pick, Stmt};

/// How traffic from this node's pods is recognised (`--detect-local-mode`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LocalDetector {
    /// Not configured (ClusterCIDR mode without a CIDR of this family): no such rules.
    None,
    /// ClusterCIDR or NodeCIDR: the source address is in this prefix.
    Cidr(IpNet),
    /// BridgeInterface: the packet came in on this interface.
    Interface(String),
    /// InterfaceNamePrefix: the packet came in on an interface whose name starts so.
    InterfacePrefix(String),
}

impl LocalDetector {
    /// The match for traffic from (or, negated, not from) this node's pods; `None` when
    /// detection is off.
    pub fn matcher(&self, negate: bool) -> Option<Stmt> {
        match self {
            LocalDetector::None => None,
            LocalDetector::Cidr(net) => Some(Stmt::Addr {
                field: AddrField::Saddr,
                negate,
                value: AddrValue::Net(*net),
            }),
            LocalDetector::Interface(name) => Some(Stmt::Iifname {
                negate,
                name: name.clone(),
            }),
            LocalDetector::InterfacePrefix(prefix) => Some(Stmt::Iifname {
                negate,
                name: format!("{prefix}*"),
            }),
        }
    }
}

/// Where NodePorts answer (`--nodeport-addresses`, expanded for this family).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodePorts {
    /// Every local address but loopback (`all`, or the prefixes cover 0.0.0.0/0 or ::/0).
    All,
    /// These node addresses (those of the node's interfaces that the prefixes cover,
    /// loopback left out).
    Addresses(Vec<IpAddr>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    pub family: IpFamily,
    pub node_name: String,
    /// The node's address of this family (LB source ranges that contain it also admit the
    /// LB IPs, which is where the node's own requests come from).
    pub node_ip: Option<IpAddr>,
    /// `1 << masqueradeBit`.
    pub mark: u32,
    pub masquerade_all: bool,
    pub local_detector: LocalDetector,
    pub node_ports: NodePorts,
    /// This family's Service CIDRs: traffic to an unallocated address in them is dropped.
    pub service_cidrs: Vec<IpNet>,
    /// The node's `topology.kubernetes.io/zone` label, for zone topology hints.
    pub zone: Option<String>,
    /// How a port with several endpoints picks one (random, as upstream's nftables mode;
    /// the IPVS schedulers' equivalents in ipvs mode).
    pub pick: Pick,
    /// NodePorts answer on 127.0.0.1 too (iptables mode's `--iptables-localhost-nodeports`,
    /// IPv4 only, when the NodePort addresses cover loopback).
    pub localhost_node_ports: bool,
    /// Hairpin connections (a pod to its own Service) carry the masquerade mark through the
    /// forward hook (iptables and ipvs modes): the KUBE-FORWARD chain those modes add to
    /// iptables accepts marked packets under a FORWARD policy of DROP, and upstream's
    /// iptables mode marks hairpin connections in its endpoint chains, before FORWARD, where
    /// the nftables ruleset only masquerades them at postrouting.
    pub mark_hairpin_for_forward: bool,
}

impl Settings {
    /// The settings the proxy's tests and tracer examples use.
    pub fn example(family: IpFamily) -> Settings {
        let (node_ip, cidr, svc) = match family {
            IpFamily::V4 => ("192.168.0.2", "10.0.0.0/8", "172.30.0.0/16"),
            IpFamily::V6 => ("fd00::2", "fd00:10::/64", "fd00:10:96::/112"),
        };
        let node_ip: IpAddr = node_ip.parse().expect("a literal address");
        Settings {
            family,
            node_name: "test-node".into(),
            node_ip: Some(node_ip),
            mark: 1 << 14,
            masquerade_all: false,
            local_detector: LocalDetector::Cidr(cidr.parse().expect("a literal prefix")),
            node_ports: NodePorts::Addresses(vec![node_ip]),
            service_cidrs: vec![svc.parse().expect("a literal prefix")],
            zone: None,
            pick: Pick::Random,
            localhost_node_ports: false,
            mark_hairpin_for_forward: false,
        }
    }
}
