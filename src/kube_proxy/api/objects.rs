//! What the proxy keeps of a Service and of an EndpointSlice: only the fields it reads,
//! typed once here. Whatever the API (or a buggy or hostile client that wrote the object)
//! put in them is checked here, so no later stage can write a rule the kernel refuses: an
//! object that cannot be used at all is refused with the reason (counted and logged by the
//! caller); a bad entry in an otherwise good object is dropped and named in `problems`.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::SystemTime;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::kube_proxy::model::{
    parse_cidr_sloppy, parse_ip_sloppy, Endpoint, Hints, IpFamily, Protocol, ServiceName,
    ServicePort, ServicePortName,
};

/// The label that names an EndpointSlice's Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// The annotation with the time the change that made the slice happened.
pub const TRIGGER_TIME_ANNOTATION: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// Why an object is not used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("no name or namespace")]
    Unnamed,
    #[error("name {0:?} holds characters a Kubernetes name cannot")]
    BadName(String),
    #[error("no {SERVICE_NAME_LABEL} label")]
    NoServiceLabel,
    #[error("address type {0:?} is neither IPv4 nor IPv6")]
    AddressType(String),
}

impl Refused {
    /// A short label for the `kubeproxy_bad_objects_total{reason}` counter.
    pub fn reason(&self) -> &'static str {
        match self {
            Refused::Unnamed => "unnamed",
            Refused::BadName(_) => "bad_name",
            Refused::NoServiceLabel => "no_service_label",
            Refused::AddressType(_) => "address_type",
        }
    }
}

/// A name the ruleset may carry in chain names and comments: what the API allows in
/// namespaces, Service and port names (DNS labels and subdomains), nothing that could
/// change the meaning of an nft command.
fn check_name(name: &str) -> Result<(), Refused> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(Refused::BadName(name.chars().take(80).collect()))
    }
}

fn check_port_name(name: &str) -> Result<(), Refused> {
    if name.is_empty() {
        Ok(())
    } else {
        check_name(name)
    }
}

/// One port of a Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortSpec {
    pub name: String,
    pub protocol: Protocol,
    pub port: u16,
    pub node_port: u16,
}

/// What the proxy keeps of a Service (both families).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceObj {
    pub name: ServiceName,
    /// The ClusterIP of each family, as upstream picks them (by `ipFamilies`, or by the
    /// address's own family when that is empty).
    pub cluster_ip_v4: Option<IpAddr>,
    pub cluster_ip_v6: Option<IpAddr>,
    pub ports: Vec<PortSpec>,
    pub external_ips: Vec<IpAddr>,
    pub source_ranges: Vec<IpNet>,
    pub lb_vips: Vec<IpAddr>,
    pub external_policy_local: bool,
    pub internal_policy_local: bool,
    pub affinity_timeout: Option<u32>,
    pub health_check_node_port: u16,
}

/// A Service, read: the object (or `None`: the proxy skips it, as ExternalName and headless
/// Services are skipped), and the entries dropped from it.
pub struct ReadService {
    pub service: Option<ServiceObj>,
    pub problems: Vec<String>,
}

pub fn read_service(svc: &Service) -> Result<ReadService, Refused> {
    let meta = &svc.metadata;
    let (Some(namespace), Some(name)) = (meta.namespace.as_deref(), meta.name.as_deref()) else {
        return Err(Refused::Unnamed);
    };
    check_name(namespace)?;
    check_name(name)?;
    let mut problems = Vec::new();
    let spec = svc.spec.clone().unwrap_or_default();
    let kind = spec.type_.as_deref().unwrap_or("ClusterIP");
    let cluster_ip = spec.cluster_ip.as_deref().unwrap_or("");
    if cluster_ip.is_empty() || cluster_ip == "None" || kind == "ExternalName" {
        return Ok(ReadService {
            service: None,
            problems,
        });
    }
    let name = ServiceName::new(namespace, name);

    // The ClusterIP of each family.
    let families = spec.ip_families.clone().unwrap_or_default();
    let cluster_ips = spec.cluster_ips.clone().unwrap_or_default();
    let pick = |family: IpFamily| -> Option<String> {
        if families.is_empty() {
            let is_v6 = cluster_ip.contains(':');
            return ((family == IpFamily::V6) == is_v6).then(|| cluster_ip.to_string());
        }
        let index = families.iter().position(|f| f == family.api())?;
        cluster_ips.get(index).cloned()
    };
    let cluster_ip_of = |family: IpFamily, problems: &mut Vec<String>| {
        let text = pick(family)?;
        match parse_ip_sloppy(&text) {
            Some(ip) if IpFamily::of(&ip) == family => Some(ip),
            _ => {
                problems.push(format!("clusterIP {text:?} is not an {family} address"));
                None
            }
        }
    };
    let cluster_ip_v4 = cluster_ip_of(IpFamily::V4, &mut problems);
    let cluster_ip_v6 = cluster_ip_of(IpFamily::V6, &mut problems);

    let mut ports = Vec::new();
    let mut seen = BTreeSet::new();
    for port in spec.ports.as_deref().unwrap_or_default() {
        let port_name = port.name.clone().unwrap_or_default();
        if let Err(e) = check_port_name(&port_name) {
            problems.push(format!("port: {e}"));
            continue;
        }
        let proto_text = port.protocol.as_deref().unwrap_or("TCP");
        let Some(protocol) = Protocol::parse(proto_text) else {
            problems.push(format!(
                "port {port_name:?}: protocol {proto_text:?} is not TCP, UDP or SCTP"
            ));
            continue;
        };
        let Ok(number) = u16::try_from(port.port) else {
            problems.push(format!("port {port_name:?}: {} is not a port", port.port));
            continue;
        };
        if number == 0 {
            problems.push(format!("port {port_name:?}: 0 is not a port"));
            continue;
        }
        let node_port = match port.node_port.map(u16::try_from) {
            None => 0,
            Some(Ok(p)) => p,
            Some(Err(_)) => {
                problems.push(format!("port {port_name:?}: nodePort is not a port"));
                0
            }
        };
        if !seen.insert((port_name.clone(), protocol)) {
            problems.push(format!(
                "port {port_name:?}/{protocol} appears twice; the first is used"
            ));
            continue;
        }
        ports.push(PortSpec {
            name: port_name,
            protocol,
            port: number,
            node_port,
        });
    }

    let mut external_ips = Vec::new();
    for text in spec.external_ips.as_deref().unwrap_or_default() {
        match parse_ip_sloppy(text) {
            Some(ip) => external_ips.push(ip),
            None if text.trim().is_empty() => {}
            None => problems.push(format!("externalIP {text:?} is not an IP address")),
        }
    }
    let mut source_ranges = Vec::new();
    for text in spec
        .load_balancer_source_ranges
        .as_deref()
        .unwrap_or_default()
    {
        let text = text.trim();
        match parse_cidr_sloppy(text) {
            Some(net) => source_ranges.push(net),
            None if text.is_empty() => {}
            None => problems.push(format!("loadBalancerSourceRange {text:?} is not a CIDR")),
        }
    }
    let mut lb_vips = Vec::new();
    let ingress = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_deref())
        .unwrap_or_default();
    for entry in ingress {
        let Some(text) = entry.ip.as_deref().filter(|t| !t.is_empty()) else {
            continue;
        };
        if entry.ip_mode.as_deref().is_some_and(|m| m != "VIP") {
            continue;
        }
        match parse_ip_sloppy(text) {
            Some(ip) => lb_vips.push(ip),
            None => problems.push(format!(
                "load-balancer ingress IP {text:?} is not an IP address"
            )),
        }
    }

    let externally_accessible = kind == "LoadBalancer"
        || kind == "NodePort"
        || (kind == "ClusterIP" && !spec.external_ips.as_deref().unwrap_or_default().is_empty());
    let external_policy_local =
        externally_accessible && spec.external_traffic_policy.as_deref() == Some("Local");
    let internal_policy_local = spec.internal_traffic_policy.as_deref() == Some("Local");
    let affinity_timeout = (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
        spec.session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds)
            .and_then(|t| u32::try_from(t).ok())
            .filter(|t| *t > 0)
            // The apiserver's default, for objects that reached us without it.
            .unwrap_or(10800)
    });
    let health_check_node_port = if kind == "LoadBalancer" && external_policy_local {
        match spec.health_check_node_port.map(u16::try_from) {
            Some(Ok(p)) if p != 0 => p,
            _ => {
                problems.push("the Service needs a healthCheckNodePort and has none".into());
                0
            }
        }
    } else {
        0
    };
    Ok(ReadService {
        service: Some(ServiceObj {
            name,
            cluster_ip_v4,
            cluster_ip_v6,
            ports,
            external_ips,
            source_ranges,
            lb_vips,
            external_policy_local,
            internal_policy_local,
            affinity_timeout,
            health_check_node_port,
        }),
        problems,
    })
}

impl ServiceObj {
    /// The Service's ports as the proxier of `family` sees them (none when the Service has
    /// no ClusterIP of that family).
    pub fn ports_for(&self, family: IpFamily) -> Vec<ServicePort> {
        let cluster_ip = match family {
            IpFamily::V4 => self.cluster_ip_v4,
            IpFamily::V6 => self.cluster_ip_v6,
        };
        let Some(cluster_ip) = cluster_ip else {
            return Vec::new();
        };
        let of_family = |ip: &&IpAddr| IpFamily::of(ip) == family;
        let external_ips: Vec<IpAddr> = self
            .external_ips
            .iter()
            .filter(of_family)
            .copied()
            .collect();
        let lb_vips: Vec<IpAddr> = self.lb_vips.iter().filter(of_family).copied().collect();
        let mut source_ranges: Vec<IpNet> = self
            .source_ranges
            .iter()
            .filter(|n| IpFamily::of_net(n) == family)
            .copied()
            .collect();
        // A zero-length prefix admits everyone: the same as no ranges.
        if source_ranges.iter().any(|n| n.prefix_len() == 0) {
            source_ranges.clear();
        }
        self.ports
            .iter()
            .map(|p| ServicePort {
                name: ServicePortName::new(self.name.clone(), p.name.clone(), p.protocol),
                cluster_ip,
                port: p.port,
                node_port: p.node_port,
                affinity_timeout: self.affinity_timeout,
                external_policy_local: self.external_policy_local,
                internal_policy_local: self.internal_policy_local,
                external_ips: external_ips.clone(),
                source_ranges: source_ranges.clone(),
                lb_vips: lb_vips.clone(),
                health_check_node_port: self.health_check_node_port,
            })
            .collect()
    }
}

/// One port of an EndpointSlice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlicePort {
    pub name: String,
    pub protocol: Protocol,
    pub port: u16,
}

/// One endpoint of an EndpointSlice (its first address).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SliceEndpoint {
    pub ip: IpAddr,
    pub is_local: bool,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    pub hints: Option<Box<Hints>>,
}

/// What the proxy keeps of an EndpointSlice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SliceObj {
    pub service: ServiceName,
    pub name: String,
    pub family: IpFamily,
    pub ports: Vec<SlicePort>,
    pub endpoints: Vec<SliceEndpoint>,
    /// When the change that made this version of the slice happened (for the network
    /// programming latency); not part of the slice's identity.
    pub trigger_time: Option<SystemTime>,
}

impl SliceObj {
    /// Whether two versions of a slice differ in what the proxy uses.
    pub fn same_content(&self, other: &SliceObj) -> bool {
        self.service == other.service
            && self.name == other.name
            && self.family == other.family
            && self.ports == other.ports
            && self.endpoints == other.endpoints
    }

    /// The endpoints this slice gives each of its ports.
    pub fn endpoints_of(&self, port: &SlicePort) -> impl Iterator<Item = Endpoint> + '_ {
        let number = port.port;
        self.endpoints.iter().map(move |ep| Endpoint {
            ip: ep.ip,
            port: number,
            is_local: ep.is_local,
            ready: ep.ready,
            serving: ep.serving,
            terminating: ep.terminating,
            hints: ep.hints.clone(),
        })
    }
}

pub struct ReadSlice {
    pub slice: SliceObj,
    pub problems: Vec<String>,
}

/// Reads an EndpointSlice; `node_name` decides which endpoints are local.
pub fn read_slice(slice: &EndpointSlice, node_name: &str) -> Result<ReadSlice, Refused> {
    let meta = &slice.metadata;
    let (Some(namespace), Some(name)) = (meta.namespace.as_deref(), meta.name.as_deref()) else {
        return Err(Refused::Unnamed);
    };
    check_name(namespace)?;
    check_name(name)?;
    let service = meta
        .labels
        .as_ref()
        .and_then(|l| l.get(SERVICE_NAME_LABEL))
        .filter(|s| !s.is_empty())
        .ok_or(Refused::NoServiceLabel)?;
    check_name(service)?;
    let family = match slice.address_type.as_str() {
        "IPv4" => IpFamily::V4,
        "IPv6" => IpFamily::V6,
        other => return Err(Refused::AddressType(other.chars().take(40).collect())),
    };
    let mut problems = Vec::new();
    let mut ports = Vec::new();
    for port in slice.ports.as_deref().unwrap_or_default() {
        // Upstream ignores a port without a name field or without a number.
        let Some(port_name) = port.name.clone() else {
            continue;
        };
        let Some(number) = port.port.filter(|p| *p != 0) else {
            continue;
        };
        if let Err(e) = check_port_name(&port_name) {
            problems.push(format!("port: {e}"));
            continue;
        }
        let Ok(number) = u16::try_from(number) else {
            problems.push(format!("port {port_name:?}: {number} is not a port"));
            continue;
        };
        let proto_text = port.protocol.as_deref().unwrap_or("TCP");
        let Some(protocol) = Protocol::parse(proto_text) else {
            problems.push(format!(
                "port {port_name:?}: protocol {proto_text:?} is not TCP, UDP or SCTP"
            ));
            continue;
        };
        ports.push(SlicePort {
            name: port_name,
            protocol,
            port: number,
        });
    }
    let mut endpoints = Vec::new();
    for ep in &slice.endpoints {
        let Some(address) = ep.addresses.first() else {
            continue;
        };
        let ip = match parse_ip_sloppy(address) {
            Some(ip) if IpFamily::of(&ip) == family => ip,
            Some(_) => {
                problems.push(format!(
                    "address {address:?} is not of the slice's type {}",
                    family
                ));
                continue;
            }
            None => {
                problems.push(format!("address {address:?} is not an IP address"));
                continue;
            }
        };
        let conditions = ep.conditions.clone().unwrap_or_default();
        let hints = ep.hints.as_ref().and_then(|h| {
            let zones: Option<BTreeSet<String>> = h
                .for_zones
                .as_ref()
                .filter(|z| !z.is_empty())
                .map(|z| z.iter().map(|z| z.name.clone()).collect());
            let nodes: Option<BTreeSet<String>> = h
                .for_nodes
                .as_ref()
                .filter(|n| !n.is_empty())
                .map(|n| n.iter().map(|n| n.name.clone()).collect());
            (zones.is_some() || nodes.is_some()).then(|| Box::new(Hints { zones, nodes }))
        });
        endpoints.push(SliceEndpoint {
            ip,
            is_local: !node_name.is_empty() && ep.node_name.as_deref() == Some(node_name),
            ready: conditions.ready.unwrap_or(true),
            serving: conditions.serving.unwrap_or(true),
            terminating: conditions.terminating.unwrap_or(false),
            hints,
        });
    }
    let trigger_time = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(TRIGGER_TIME_ANNOTATION))
        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
        .map(SystemTime::from);
    Ok(ReadSlice {
        slice: SliceObj {
            service: ServiceName::new(namespace, service.as_str()),
            name: name.to_owned(),
            family,
            ports,
            endpoints,
            trigger_time,
        },
        problems,
    })
}

#[cfg(test)]
mod tests;
