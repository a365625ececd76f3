//! A family's ruleset settings from the configuration and what the node is: its addresses
//! (the Node object's, or `--bind-address`), its pod CIDRs and zone, the Service CIDRs, the
//! node's interface addresses (for `--nodeport-addresses` prefixes), as upstream derives them.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub use super::interfaces::interface_addresses;

use ipnet::IpNet;

use super::api::node::NodeInfo;
use super::config::{DetectLocal, IpvsScheduler, NodePortAddress, ProxyConfig, ProxyMode};
use super::model::IpFamily;
use super::nft::rule::Pick;
use super::ruleset::settings::{LocalDetector, NodePorts, Settings};

/// The node's addresses of each family, as upstream picks them: `--bind-address` when it is
/// not unspecified overrides the Node object's primary address; without either, loopback.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeIps {
    pub primary: IpFamily,
    pub v4: IpAddr,
    pub v6: IpAddr,
}

impl NodeIps {
    pub fn detect(node: Option<&NodeInfo>, bind_address: IpAddr) -> NodeIps {
        let mut ips = NodeIps {
            primary: IpFamily::V4,
            v4: IpAddr::V4(Ipv4Addr::LOCALHOST),
            v6: IpAddr::V6(Ipv6Addr::LOCALHOST),
        };
        if let Some(first) = node.and_then(|n| n.ips.first()) {
            ips.primary = IpFamily::of(first);
            for ip in node.map(|n| n.ips.as_slice()).unwrap_or_default() {
                ips.set(*ip);
            }
        }
        if !bind_address.is_unspecified() {
            ips.primary = IpFamily::of(&bind_address);
            ips.set(bind_address);
        }
        ips
    }

    fn set(&mut self, ip: IpAddr) {
        match IpFamily::of(&ip) {
            IpFamily::V4 => self.v4 = ip,
            IpFamily::V6 => self.v6 = ip,
        }
    }

    pub fn of(&self, family: IpFamily) -> IpAddr {
        match family {
            IpFamily::V4 => self.v4,
            IpFamily::V6 => self.v6,
        }
    }

    pub fn primary_ip(&self) -> IpAddr {
        self.of(self.primary)
    }
}

/// `--nodeport-addresses` for one family: the keywords expanded (`primary` to the node's
/// address unless that is loopback, `localhost` to 127.0.0.0/8 and ::1/128, `all` to the
/// zero prefixes), then the family's prefixes; none of this family, or a zero prefix, means
/// every address. Otherwise the node's interface addresses those prefixes hold.
pub fn node_ports(
    entries: &[NodePortAddress],
    family: IpFamily,
    node: &NodeIps,
    local: &[IpAddr],
) -> NodePorts {
    let mut prefixes: Vec<IpNet> = Vec::new();
    for entry in entries {
        match entry {
            NodePortAddress::Primary => {
                for ip in [node.v4, node.v6] {
                    if !ip.is_loopback() {
                        prefixes.push(IpNet::from(ip));
                    }
                }
            }
            NodePortAddress::Localhost => {
                prefixes.push(IpFamily::V4.loopback());
                prefixes.push(IpFamily::V6.loopback());
            }
            NodePortAddress::All => {
                prefixes.push(IpFamily::V4.all());
                prefixes.push(IpFamily::V6.all());
            }
            NodePortAddress::Cidr(net) => prefixes.push(*net),
        }
    }
    let mine: Vec<IpNet> = prefixes
        .into_iter()
        .filter(|p| IpFamily::of_net(p) == family)
        .collect();
    if mine.is_empty() || mine.iter().any(|p| p.prefix_len() == 0) {
        return NodePorts::All;
    }
    let mut ips: Vec<IpAddr> = local
        .iter()
        .filter(|ip| IpFamily::of(ip) == family && mine.iter().any(|p| p.contains(*ip)))
        .copied()
        .collect();
    ips.sort();
    ips.dedup();
    NodePorts::Addresses(ips)
}

/// How this family recognises traffic from local pods.
pub fn local_detector(
    detect: &DetectLocal,
    family: IpFamily,
    node: Option<&NodeInfo>,
) -> LocalDetector {
    let of_family = |nets: &[IpNet]| {
        nets.iter()
            .find(|n| IpFamily::of_net(n) == family)
            .map_or(LocalDetector::None, |n| LocalDetector::Cidr(*n))
    };
    match detect {
        DetectLocal::ClusterCidr(cidrs) => of_family(cidrs),
        DetectLocal::NodeCidr => {
            of_family(node.map(|n| n.pod_cidrs.as_slice()).unwrap_or_default())
        }
        DetectLocal::BridgeInterface(name) => LocalDetector::Interface(name.clone()),
        DetectLocal::InterfaceNamePrefix(prefix) => LocalDetector::InterfacePrefix(prefix.clone()),
    }
}

/// Everything one family's ruleset depends on besides Services.
pub fn settings(
    config: &ProxyConfig,
    family: IpFamily,
    node_name: &str,
    node: Option<&NodeInfo>,
    service_cidrs: &[IpNet],
    local: &[IpAddr],
) -> Settings {
    let ips = NodeIps::detect(node, config.bind_address);
    let node_ip = ips.of(family);
    let node_ports = node_ports(&config.node_port_addresses, family, &ips, local);
    Settings {
        family,
        node_name: node_name.to_owned(),
        node_ip: (!node_ip.is_loopback()).then_some(node_ip),
        mark: 1u32 << config.masquerade_bit.min(31),
        masquerade_all: config.masquerade_all,
        local_detector: local_detector(&config.detect_local, family, node),
        localhost_node_ports: localhost_node_ports(config, family, &node_ports),
        mark_hairpin_for_forward: matches!(config.mode, ProxyMode::Iptables | ProxyMode::Ipvs),
        node_ports,
        service_cidrs: service_cidrs
            .iter()
            .filter(|c| IpFamily::of_net(c) == family)
            .copied()
            .collect(),
        zone: node.and_then(|n| n.zone.clone()),
        pick: pick(config),
    }
}

/// iptables mode answers NodePorts on 127.0.0.1 (IPv4 only, with route_localnet) unless
/// `--iptables-localhost-nodeports=false` or the NodePort addresses leave loopback out.
pub fn localhost_node_ports(
    config: &ProxyConfig,
    family: IpFamily,
    node_ports: &NodePorts,
) -> bool {
    let covers_loopback = match node_ports {
        NodePorts::All => true,
        NodePorts::Addresses(ips) => ips.iter().any(IpAddr::is_loopback),
    };
    config.mode == ProxyMode::Iptables
        && config.iptables_localhost_node_ports
        && family == IpFamily::V4
        && covers_loopback
}

/// How a port picks among several endpoints: at random, as upstream's nftables and iptables
/// modes do; in ipvs mode as its scheduler would (every weight is 1 in kube-proxy, so rr and
/// wrr are round robin; sh and mh hash the client's address).
pub fn pick(config: &ProxyConfig) -> Pick {
    match (config.mode, config.ipvs.scheduler) {
        (ProxyMode::Ipvs, IpvsScheduler::RoundRobin | IpvsScheduler::WeightedRoundRobin) => {
            Pick::RoundRobin
        }
        (ProxyMode::Ipvs, IpvsScheduler::SourceHashing | IpvsScheduler::MaglevHashing) => {
            Pick::SourceHash
        }
        _ => Pick::Random,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(ips: &[&str]) -> NodeInfo {
        NodeInfo {
            ips: ips.iter().map(|i| i.parse().unwrap()).collect(),
            ..NodeInfo::default()
        }
    }

    #[test]
    fn node_ips_follow_upstreams_precedence() {
        let any = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
        let ips = NodeIps::detect(Some(&node(&["fd00::1", "10.0.0.1"])), any);
        assert_eq!(ips.primary, IpFamily::V6);
        assert_eq!(ips.v4, "10.0.0.1".parse::<IpAddr>().unwrap());
        let ips = NodeIps::detect(Some(&node(&["10.0.0.1"])), "10.9.9.9".parse().unwrap());
        assert_eq!(ips.primary_ip(), "10.9.9.9".parse::<IpAddr>().unwrap());
        let ips = NodeIps::detect(None, any);
        assert!(ips.v4.is_loopback() && ips.v6.is_loopback());
    }

    #[test]
    fn nodeport_addresses_expand_as_upstreams() {
        let ips = NodeIps::detect(
            Some(&node(&["10.0.0.1", "fd00::1"])),
            IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        );
        let local: Vec<IpAddr> = ["10.0.0.1", "10.1.0.1", "127.0.0.1", "fd00::1", "::1"]
            .iter()
            .map(|i| i.parse().unwrap())
            .collect();
        let addrs =
            |v: &[&str]| NodePorts::Addresses(v.iter().map(|i| i.parse().unwrap()).collect());
        assert_eq!(
            node_ports(&[NodePortAddress::Primary], IpFamily::V4, &ips, &local),
            addrs(&["10.0.0.1"])
        );
        assert_eq!(
            node_ports(&[NodePortAddress::Primary], IpFamily::V6, &ips, &local),
            addrs(&["fd00::1"])
        );
        assert_eq!(
            node_ports(&[NodePortAddress::All], IpFamily::V4, &ips, &local),
            NodePorts::All
        );
        assert_eq!(node_ports(&[], IpFamily::V4, &ips, &local), NodePorts::All);
        let cidr = |s: &str| NodePortAddress::Cidr(s.parse().unwrap());
        assert_eq!(
            node_ports(&[cidr("10.0.0.0/8")], IpFamily::V4, &ips, &local),
            addrs(&["10.0.0.1", "10.1.0.1"])
        );
        // No prefix of this family: every address of it.
        assert_eq!(
            node_ports(&[cidr("10.0.0.0/8")], IpFamily::V6, &ips, &local),
            NodePorts::All
        );
        assert_eq!(
            node_ports(&[NodePortAddress::Localhost], IpFamily::V4, &ips, &local),
            addrs(&["127.0.0.1"])
        );
    }
}
