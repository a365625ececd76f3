//! The proxy's vocabulary: IP families, protocols, the names of Services and their ports,
//! a Service port as one family's proxier sees it, and an endpoint. Values are typed here,
//! once, when an API object is read (`api::objects`); everything after works on these.

use std::collections::BTreeSet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use ipnet::IpNet;

/// One of the two proxiers a dual-stack node runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IpFamily {
    V4,
    V6,
}

impl IpFamily {
    pub fn of(ip: &IpAddr) -> IpFamily {
        match ip {
            IpAddr::V4(_) => IpFamily::V4,
            IpAddr::V6(_) => IpFamily::V6,
        }
    }

    pub fn of_net(net: &IpNet) -> IpFamily {
        IpFamily::of(&net.addr())
    }

    /// nftables' family and address-expression word: `ip` or `ip6`.
    pub fn nft(self) -> &'static str {
        match self {
            IpFamily::V4 => "ip",
            IpFamily::V6 => "ip6",
        }
    }

    /// nftables' address type: `ipv4_addr` or `ipv6_addr`.
    pub fn nft_addr_type(self) -> &'static str {
        match self {
            IpFamily::V4 => "ipv4_addr",
            IpFamily::V6 => "ipv6_addr",
        }
    }

    /// The API's spelling (`IPv4`), used in metric labels and log lines.
    pub fn api(self) -> &'static str {
        match self {
            IpFamily::V4 => "IPv4",
            IpFamily::V6 => "IPv6",
        }
    }

    /// An EndpointSlice `addressType` this family reads.
    pub fn address_type(self) -> &'static str {
        self.api()
    }

    pub fn loopback(self) -> IpNet {
        match self {
            IpFamily::V4 => IpNet::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 0)), 8),
            IpFamily::V6 => IpNet::new(IpAddr::V6(Ipv6Addr::LOCALHOST), 128),
        }
        .expect("a valid prefix length")
    }

    pub fn all(self) -> IpNet {
        match self {
            IpFamily::V4 => IpNet::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
            IpFamily::V6 => IpNet::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0),
        }
        .expect("a valid prefix length")
    }
}

impl fmt::Display for IpFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.api())
    }
}

/// A Service port's protocol. The API's other values never reach a proxier: an object with
/// one is counted and skipped when it is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    pub fn parse(text: &str) -> Option<Protocol> {
        match text {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }

    /// The API's spelling.
    pub fn api(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        }
    }

    /// nftables' (and the chain names') spelling.
    pub fn nft(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }

    /// The IP protocol number.
    pub fn number(self) -> u8 {
        match self {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
            Protocol::Sctp => 132,
        }
    }

    pub fn from_nft(text: &str) -> Option<Protocol> {
        match text {
            "tcp" => Some(Protocol::Tcp),
            "udp" => Some(Protocol::Udp),
            "sctp" => Some(Protocol::Sctp),
            _ => None,
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.api())
    }
}

/// A Service's namespace and name. Shared (`Arc`) between the Service's ports and its
/// endpoints' keys, so a large cluster holds each name once.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceName(Arc<(String, String)>);

impl ServiceName {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> ServiceName {
        ServiceName(Arc::new((namespace.into(), name.into())))
    }

    pub fn namespace(&self) -> &str {
        &self.0 .0
    }

    pub fn name(&self) -> &str {
        &self.0 .1
    }
}

impl fmt::Display for ServiceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace(), self.name())
    }
}

impl fmt::Debug for ServiceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

/// One port of one Service: the key of every per-port object (chains, map elements,
/// endpoints).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServicePortName {
    pub service: ServiceName,
    pub port: String,
    pub protocol: Protocol,
}

impl ServicePortName {
    pub fn new(service: ServiceName, port: impl Into<String>, protocol: Protocol) -> Self {
        ServicePortName {
            service,
            port: port.into(),
            protocol,
        }
    }
}

/// `ns/svc:port` (`ns/svc` for an unnamed port), as upstream prints a port name: the
/// comments of the no-endpoint map elements and the log lines use it.
impl fmt::Display for ServicePortName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.port.is_empty() {
            write!(f, "{}", self.service)
        } else {
            write!(f, "{}:{}", self.service, self.port)
        }
    }
}

impl fmt::Debug for ServicePortName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}/{}", self.protocol)
    }
}

/// A Service port as the proxier of one IP family sees it: only that family's addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePort {
    pub name: ServicePortName,
    pub cluster_ip: IpAddr,
    pub port: u16,
    /// 0 when the port has none.
    pub node_port: u16,
    /// `ClientIP` affinity and its timeout in seconds.
    pub affinity_timeout: Option<u32>,
    pub external_policy_local: bool,
    pub internal_policy_local: bool,
    pub external_ips: Vec<IpAddr>,
    /// Empty when the Service has none, or when one of them is a zero-length prefix (which
    /// means "any source").
    pub source_ranges: Vec<IpNet>,
    /// Load-balancer ingress IPs in VIP mode.
    pub lb_vips: Vec<IpAddr>,
    /// 0 when the Service needs no health check node port.
    pub health_check_node_port: u16,
}

impl ServicePort {
    pub fn protocol(&self) -> Protocol {
        self.name.protocol
    }

    /// A NodePort, a load-balancer VIP or an external IP reaches it from outside.
    pub fn externally_accessible(&self) -> bool {
        self.node_port != 0 || !self.lb_vips.is_empty() || !self.external_ips.is_empty()
    }

    /// Whether traffic is ever sent to endpoints by the Cluster policy: internal traffic
    /// under Cluster, and any external traffic (eTP=Local needs the cluster endpoints to
    /// short-circuit pod and host traffic).
    pub fn uses_cluster_endpoints(&self) -> bool {
        !self.internal_policy_local || self.externally_accessible()
    }

    pub fn uses_local_endpoints(&self) -> bool {
        self.internal_policy_local || (self.external_policy_local && self.externally_accessible())
    }

    pub fn uses_affinity(&self) -> bool {
        self.affinity_timeout.is_some()
    }
}

/// Topology hints of an endpoint (the zones or nodes the EndpointSlice controller meant it
/// for). `None` when the endpoint has none of that kind.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Hints {
    pub zones: Option<BTreeSet<String>>,
    pub nodes: Option<BTreeSet<String>>,
}

/// One endpoint of one Service port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub ip: IpAddr,
    pub port: u16,
    pub is_local: bool,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    /// Boxed: most endpoints have none, and a cluster holds many endpoints.
    pub hints: Option<Box<Hints>>,
}

impl Endpoint {
    /// `IP:port`, or `[IP]:port` for IPv6: the endpoint's identity and sort key, as
    /// upstream's (so the order of a DNAT map's entries is upstream's).
    pub fn address(&self) -> String {
        match self.ip {
            IpAddr::V4(ip) => format!("{ip}:{}", self.port),
            IpAddr::V6(ip) => format!("[{ip}]:{}", self.port),
        }
    }

    pub fn zone_hinted(&self, zone: &str) -> bool {
        self.hints
            .as_ref()
            .and_then(|h| h.zones.as_ref())
            .is_some_and(|z| z.contains(zone))
    }

    pub fn node_hinted(&self, node: &str) -> bool {
        self.hints
            .as_ref()
            .and_then(|h| h.nodes.as_ref())
            .is_some_and(|n| n.contains(node))
    }

    pub fn has_zone_hints(&self) -> bool {
        self.hints
            .as_ref()
            .and_then(|h| h.zones.as_ref())
            .is_some_and(|z| !z.is_empty())
    }

    pub fn has_node_hints(&self) -> bool {
        self.hints
            .as_ref()
            .and_then(|h| h.nodes.as_ref())
            .is_some_and(|n| !n.is_empty())
    }
}

/// Sorts endpoints as upstream does: by `address()` as text, so `10.0.0.10:80` comes before
/// `10.0.0.2:80`.
pub fn sort_endpoints(endpoints: &mut [Endpoint]) {
    endpoints.sort_by_cached_key(Endpoint::address);
}

/// Parses an IP address as Go's `ParseIPSloppy` does: an IPv4 part may carry leading zeros
/// (`010.001.002.003` is 10.1.2.3), and an IPv4-mapped IPv6 address is IPv4.
pub fn parse_ip_sloppy(text: &str) -> Option<IpAddr> {
    let ip = match text.parse::<IpAddr>() {
        Ok(ip) => ip,
        Err(_) => parse_ipv4_leading_zeros(text).map(IpAddr::V4)?,
    };
    Some(unmap(ip))
}

/// Go's CIDR parse, sloppy as above, with the address masked to the network (`10.1.2.3/8`
/// is 10.0.0.0/8).
pub fn parse_cidr_sloppy(text: &str) -> Option<IpNet> {
    let (addr, len) = text.split_once('/')?;
    if len.is_empty() || !len.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let len: u8 = len.parse().ok()?;
    // An IPv4-mapped address keeps its IPv6 prefix length in Go only when written in IPv6
    // form; such CIDRs are rare enough in Services that they are refused here.
    let ip = match addr.parse::<IpAddr>() {
        Ok(ip) => ip,
        Err(_) => IpAddr::V4(parse_ipv4_leading_zeros(addr)?),
    };
    IpNet::new(ip, len).ok().map(|net| net.trunc())
}

fn parse_ipv4_leading_zeros(text: &str) -> Option<Ipv4Addr> {
    let mut octets = [0u8; 4];
    let mut parts = text.split('.');
    for octet in &mut octets {
        let part = parts.next()?;
        if part.is_empty() || part.len() > 3 || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *octet = part.parse().ok()?;
    }
    parts.next().is_none().then_some(Ipv4Addr::from(octets))
}

/// An IPv4-mapped IPv6 address as the IPv4 address it carries (Go treats it as IPv4).
pub fn unmap(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sloppy_addresses_parse_as_go_parses_them() {
        assert_eq!(
            parse_ip_sloppy("010.001.002.003"),
            Some("10.1.2.3".parse().unwrap())
        );
        assert_eq!(
            parse_ip_sloppy("::ffff:1.2.3.4"),
            Some("1.2.3.4".parse().unwrap())
        );
        assert_eq!(parse_ip_sloppy("fd00::1"), Some("fd00::1".parse().unwrap()));
        assert_eq!(parse_ip_sloppy("1.2.3"), None);
        assert_eq!(parse_ip_sloppy(""), None);
        assert_eq!(parse_ip_sloppy("1.2.3.4 "), None);
        assert_eq!(
            parse_cidr_sloppy("10.1.2.3/8"),
            Some("10.0.0.0/8".parse().unwrap())
        );
        assert_eq!(parse_cidr_sloppy("10.1.2.3/33"), None);
        assert_eq!(parse_cidr_sloppy("10.1.2.3"), None);
    }

    #[test]
    fn endpoints_sort_as_text() {
        let ep = |ip: &str, port| Endpoint {
            ip: ip.parse().unwrap(),
            port,
            is_local: false,
            ready: true,
            serving: true,
            terminating: false,
            hints: None,
        };
        let mut eps = vec![
            ep("10.0.0.2", 80),
            ep("10.0.0.10", 80),
            ep("10.0.0.1", 8080),
        ];
        sort_endpoints(&mut eps);
        let order: Vec<String> = eps.iter().map(Endpoint::address).collect();
        assert_eq!(order, ["10.0.0.10:80", "10.0.0.1:8080", "10.0.0.2:80"]);
        assert_eq!(ep("fd00::1", 80).address(), "[fd00::1]:80");
    }

    #[test]
    fn port_names_print_as_upstream() {
        let svc = ServiceName::new("ns1", "svc1");
        assert_eq!(
            ServicePortName::new(svc.clone(), "p80", Protocol::Tcp).to_string(),
            "ns1/svc1:p80"
        );
        assert_eq!(
            ServicePortName::new(svc, "", Protocol::Udp).to_string(),
            "ns1/svc1"
        );
    }
}
