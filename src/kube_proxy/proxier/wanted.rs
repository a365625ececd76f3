//! What one family's node wants: the Service ports (this family's view of each Service) and
//! each port's endpoints, merged from the Service's EndpointSlices as upstream merges them
//! (a port without a name or number is skipped; an address in two slices is kept once, the
//! copy that is not terminating winning; sorted as upstream sorts them).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::SystemTime;

use crate::kube_proxy::api::objects::SliceObj;
use crate::kube_proxy::api::store::Checkout;
use crate::kube_proxy::model::{
    sort_endpoints, Endpoint, IpFamily, Protocol, ServiceName, ServicePort, ServicePortName,
};

/// The Services and endpoints one family's proxier renders.
#[derive(Default)]
pub struct NodeWants {
    pub services: BTreeMap<ServiceName, Vec<ServicePort>>,
    pub endpoints: HashMap<ServicePortName, Vec<Endpoint>>,
    /// The ports of each Service that have endpoints (to replace them when its slices change).
    endpoint_ports: HashMap<ServiceName, Vec<ServicePortName>>,
}

/// What a checkout changed.
#[derive(Default, Debug)]
pub struct Applied {
    /// Services whose ports or endpoints differ from before.
    pub changed: HashSet<ServiceName>,
    /// A changed Service had a UDP port with endpoints before or after (stale UDP conntrack
    /// entries may need removing).
    pub udp_endpoints_changed: bool,
    /// When the changes that made the changed slices happened.
    pub trigger_times: Vec<SystemTime>,
    pub service_changes: usize,
    pub endpoint_changes: usize,
}

impl NodeWants {
    pub fn new() -> NodeWants {
        NodeWants::default()
    }

    pub fn apply(&mut self, family: IpFamily, checkout: Checkout) -> Applied {
        let mut applied = Applied {
            trigger_times: checkout.trigger_times,
            service_changes: checkout.services.len(),
            endpoint_changes: checkout.endpoints.len(),
            ..Applied::default()
        };
        for (name, service) in checkout.services {
            let ports = service.map(|s| s.ports_for(family)).unwrap_or_default();
            let old = self
                .services
                .get(&name)
                .map(Vec::as_slice)
                .unwrap_or_default();
            if old != ports.as_slice() {
                applied.changed.insert(name.clone());
                if ports.is_empty() {
                    self.services.remove(&name);
                } else {
                    self.services.insert(name, ports);
                }
            }
        }
        for (name, slices) in checkout.endpoints {
            let merged = merge(&name, &slices, family);
            let old_ports = self.endpoint_ports.remove(&name).unwrap_or_default();
            let mut same = old_ports.len() == merged.len();
            if same {
                same = merged
                    .iter()
                    .all(|(port, eps)| self.endpoints.get(port) == Some(eps));
            }
            if !same {
                applied.changed.insert(name.clone());
                let udp = |p: &ServicePortName| p.protocol == Protocol::Udp;
                if old_ports.iter().any(udp) || merged.keys().any(udp) {
                    applied.udp_endpoints_changed = true;
                }
            }
            for port in &old_ports {
                self.endpoints.remove(port);
            }
            if !merged.is_empty() {
                self.endpoint_ports
                    .insert(name, merged.keys().cloned().collect());
                self.endpoints.extend(merged);
            }
        }
        applied
    }

    /// Endpoints across every Service port (for the log line and status).
    pub fn endpoint_count(&self) -> usize {
        self.services
            .values()
            .flatten()
            .map(|p| self.endpoints.get(&p.name).map_or(0, Vec::len))
            .sum()
    }

    /// Every Service port.
    pub fn port_count(&self) -> usize {
        self.services.values().map(Vec::len).sum()
    }

    /// Services with a health check node port, and their ready local endpoints.
    pub fn health_checks(&self) -> BTreeMap<ServiceName, (u16, usize)> {
        let mut out = BTreeMap::new();
        for (name, ports) in &self.services {
            let Some(port) = ports
                .iter()
                .map(|p| p.health_check_node_port)
                .find(|p| *p != 0)
            else {
                continue;
            };
            let mut local: HashSet<std::net::IpAddr> = HashSet::new();
            for p in ports {
                for ep in self.endpoints.get(&p.name).into_iter().flatten() {
                    if ep.is_local && ep.ready {
                        local.insert(ep.ip);
                    }
                }
            }
            out.insert(name.clone(), (port, local.len()));
        }
        out
    }
}

/// A Service's endpoints by port, from its slices of `family`.
fn merge(
    service: &ServiceName,
    slices: &[Arc<SliceObj>],
    family: IpFamily,
) -> HashMap<ServicePortName, Vec<Endpoint>> {
    let mut by_port: HashMap<ServicePortName, BTreeMap<String, Endpoint>> = HashMap::new();
    for slice in slices.iter().filter(|s| s.family == family) {
        for port in &slice.ports {
            let name = ServicePortName::new(service.clone(), port.name.clone(), port.protocol);
            let set = by_port.entry(name).or_default();
            for ep in slice.endpoints_of(port) {
                let key = ep.address();
                let keep_old = set.get(&key).is_some_and(|_| ep.terminating);
                if !keep_old {
                    set.insert(key, ep);
                }
            }
        }
    }
    by_port
        .into_iter()
        .filter(|(_, set)| !set.is_empty())
        .map(|(port, set)| {
            let mut eps: Vec<Endpoint> = set.into_values().collect();
            sort_endpoints(&mut eps);
            (port, eps)
        })
        .collect()
}

#[cfg(test)]
mod tests;
