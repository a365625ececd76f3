//! Which UDP conntrack entries of one IP family are stale: the decision upstream's
//! `CleanStaleEntries` makes, without I/O.
//!
//! A UDP "connection" has no end: every packet of a client that keeps sending (DNS, statsd)
//! refreshes its entry, so the entry keeps sending it to the endpoint chosen at its first
//! packet even after that endpoint stopped serving. The nftables rules cannot help, because
//! established flows never reach them. So an entry is deleted when it was addressed to a
//! Service and answered by (DNATed to) anything but one of that Service port's serving
//! endpoints; the next packet then creates a new entry through the current rules.
//!
//! TCP is never touched: an established TCP connection keeps its endpoint, which is how a
//! terminating endpoint drains.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;

use super::flow::Flow;
use crate::kube_proxy::model::{Endpoint, Protocol, ServiceName, ServicePort, ServicePortName};

/// An endpoint's address and port, as the reply direction of an entry shows it.
type Backend = (IpAddr, u16);

/// The entries of `flows` to delete, in their order. `services` and `endpoints` are one
/// family's proxier state; `flows` are that family's entries.
///
/// For each UDP Service port, its targets are ClusterIP:port, every load-balancer VIP:port
/// and every external IP:port, and, when the port has at least one serving endpoint, its
/// NodePort on any address. An entry is stale when its original destination is a target and
/// its reply source is not among the port's serving endpoints. Serving is all that counts:
/// traffic policies, topology and termination do not, so that a UDP flow is treated as a TCP
/// connection would be, kept while its endpoint still serves.
///
/// The NodePort needs a serving endpoint because it is matched on the port alone: with no
/// endpoint to keep, every UDP flow to that port number on any host would go, kube-proxy's or
/// not.
///
/// Where two ports claim the same target (an external IP that is another Service's
/// ClusterIP), an entry is kept when either port's endpoints serve it; upstream lets one of
/// the two win at random.
pub fn stale_flows<'f>(
    services: &BTreeMap<ServiceName, Vec<ServicePort>>,
    endpoints: &HashMap<ServicePortName, Vec<Endpoint>>,
    flows: &'f [Flow],
) -> Vec<&'f Flow> {
    let targets = Targets::of(services, endpoints);
    flows.iter().filter(|flow| targets.is_stale(flow)).collect()
}

/// Every UDP Service port's targets, with the endpoints each may be answered by.
#[derive(Default)]
struct Targets {
    /// ClusterIP, load-balancer VIPs and external IPs, with the port.
    addresses: HashMap<(IpAddr, u16), HashSet<Backend>>,
    node_ports: HashMap<u16, HashSet<Backend>>,
}

impl Targets {
    fn of(
        services: &BTreeMap<ServiceName, Vec<ServicePort>>,
        endpoints: &HashMap<ServicePortName, Vec<Endpoint>>,
    ) -> Targets {
        let mut targets = Targets::default();
        let udp_ports = services
            .values()
            .flatten()
            .filter(|port| port.protocol() == Protocol::Udp);
        for port in udp_ports {
            let serving: HashSet<Backend> = endpoints
                .get(&port.name)
                .into_iter()
                .flatten()
                .filter(|endpoint| endpoint.serving)
                .map(|endpoint| (endpoint.ip, endpoint.port))
                .collect();
            let addresses = std::iter::once(&port.cluster_ip)
                .chain(&port.lb_vips)
                .chain(&port.external_ips);
            for address in addresses {
                targets
                    .addresses
                    .entry((*address, port.port))
                    .or_default()
                    .extend(serving.iter().copied());
            }
            if port.node_port != 0 && !serving.is_empty() {
                targets
                    .node_ports
                    .entry(port.node_port)
                    .or_default()
                    .extend(serving);
            }
        }
        targets
    }

    fn is_stale(&self, flow: &Flow) -> bool {
        if flow.original.protocol != Protocol::Udp.number() {
            return false;
        }
        let backend = (flow.reply.src, flow.reply.src_port);
        let unserved = |serving: &HashSet<Backend>| !serving.contains(&backend);
        // Both checks run, as upstream's: an entry to a Service address whose endpoint still
        // serves is still stale when its port is another Service's NodePort that this
        // endpoint does not serve.
        self.addresses
            .get(&(flow.original.dst, flow.original.dst_port))
            .is_some_and(unserved)
            || self
                .node_ports
                .get(&flow.original.dst_port)
                .is_some_and(unserved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube_proxy::conntrack::flow::Tuple;

    const UDP: u8 = 17;
    const TCP: u8 = 6;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn port(
        service: &ServiceName,
        name: &str,
        protocol: Protocol,
        vip: &str,
        port: u16,
    ) -> ServicePort {
        ServicePort {
            name: ServicePortName::new(service.clone(), name, protocol),
            cluster_ip: ip(vip),
            port,
            node_port: 0,
            affinity_timeout: None,
            external_policy_local: false,
            internal_policy_local: false,
            external_ips: Vec::new(),
            source_ranges: Vec::new(),
            lb_vips: Vec::new(),
            health_check_node_port: 0,
        }
    }

    #[derive(Clone, Copy)]
    enum State {
        Ready,
        /// Terminating, still serving (graceful termination).
        Draining,
        /// Terminating and no longer serving.
        Gone,
    }

    fn endpoint(address: &str, port: u16, state: State) -> Endpoint {
        let (ready, serving, terminating) = match state {
            State::Ready => (true, true, false),
            State::Draining => (false, true, true),
            State::Gone => (false, false, true),
        };
        Endpoint {
            ip: ip(address),
            port,
            is_local: false,
            ready,
            serving,
            terminating,
            hints: None,
        }
    }

    /// A flow from a client to `dst`, answered by `backend`.
    fn flow(protocol: u8, dst: &str, dst_port: u16, backend: &str, backend_port: u16) -> Flow {
        let original = Tuple {
            protocol,
            src: ip("10.0.0.1"),
            dst: ip(dst),
            src_port: 40000,
            dst_port,
        };
        let reply = Tuple {
            src: ip(backend),
            src_port: backend_port,
            ..original.inverse()
        };
        Flow {
            original,
            reply,
            zone: None,
            id: None,
        }
    }

    /// One family's state with every kind of target:
    /// - ns/dns, UDP 53: ClusterIP 10.96.0.10, NodePort 30053, external IP 192.0.2.10,
    ///   LB VIP 198.51.100.10; endpoints .5 ready, .6 draining (still serving), .7 gone (not
    ///   serving), .8 deleted (not listed). Its internal policy is Local and no endpoint is
    ///   local: serving is all that counts.
    /// - ns/empty, UDP 1234: ClusterIP 10.96.0.30, NodePort 31234, only a gone endpoint.
    /// - ns/multi, UDP 5000 and 6000 on ClusterIP 10.96.0.40, one pod serving both.
    /// - ns/web, TCP 80: ClusterIP 10.96.0.20, no endpoint.
    fn state_v4() -> (
        BTreeMap<ServiceName, Vec<ServicePort>>,
        HashMap<ServicePortName, Vec<Endpoint>>,
    ) {
        let mut services = BTreeMap::new();
        let mut endpoints = HashMap::new();

        let dns = ServiceName::new("ns", "dns");
        let mut dns_port = port(&dns, "dns", Protocol::Udp, "10.96.0.10", 53);
        dns_port.node_port = 30053;
        dns_port.external_ips = vec![ip("192.0.2.10")];
        dns_port.lb_vips = vec![ip("198.51.100.10")];
        dns_port.internal_policy_local = true;
        dns_port.external_policy_local = true;
        endpoints.insert(
            dns_port.name.clone(),
            vec![
                endpoint("10.244.1.5", 5353, State::Ready),
                endpoint("10.244.1.6", 5353, State::Draining),
                endpoint("10.244.1.7", 5353, State::Gone),
            ],
        );
        services.insert(dns, vec![dns_port]);

        let empty = ServiceName::new("ns", "empty");
        let mut empty_port = port(&empty, "", Protocol::Udp, "10.96.0.30", 1234);
        empty_port.node_port = 31234;
        endpoints.insert(
            empty_port.name.clone(),
            vec![endpoint("10.244.4.5", 1234, State::Gone)],
        );
        services.insert(empty, vec![empty_port]);

        let multi = ServiceName::new("ns", "multi");
        let a = port(&multi, "a", Protocol::Udp, "10.96.0.40", 5000);
        let b = port(&multi, "b", Protocol::Udp, "10.96.0.40", 6000);
        endpoints.insert(
            a.name.clone(),
            vec![endpoint("10.244.3.5", 5000, State::Ready)],
        );
        endpoints.insert(
            b.name.clone(),
            vec![endpoint("10.244.3.5", 6000, State::Ready)],
        );
        services.insert(multi, vec![a, b]);

        let web = ServiceName::new("ns", "web");
        services.insert(
            web.clone(),
            vec![port(&web, "http", Protocol::Tcp, "10.96.0.20", 80)],
        );

        (services, endpoints)
    }

    #[test]
    fn stale_entries_are_those_to_a_udp_target_answered_by_no_serving_endpoint() {
        let (services, endpoints) = state_v4();
        #[rustfmt::skip]
        let cases: &[(&str, Flow, bool)] = &[
            ("ClusterIP, ready endpoint", flow(UDP, "10.96.0.10", 53, "10.244.1.5", 5353), false),
            ("ClusterIP, terminating endpoint still serving", flow(UDP, "10.96.0.10", 53, "10.244.1.6", 5353), false),
            ("ClusterIP, endpoint no longer serving", flow(UDP, "10.96.0.10", 53, "10.244.1.7", 5353), true),
            ("ClusterIP, endpoint deleted", flow(UDP, "10.96.0.10", 53, "10.244.1.8", 5353), true),
            ("ClusterIP, serving address on another port", flow(UDP, "10.96.0.10", 53, "10.244.1.5", 53), true),
            ("ClusterIP, not DNATed (answered by the ClusterIP)", flow(UDP, "10.96.0.10", 53, "10.96.0.10", 53), true),
            ("external IP, ready endpoint", flow(UDP, "192.0.2.10", 53, "10.244.1.5", 5353), false),
            ("external IP, endpoint deleted", flow(UDP, "192.0.2.10", 53, "10.244.1.8", 5353), true),
            ("LB VIP, draining endpoint", flow(UDP, "198.51.100.10", 53, "10.244.1.6", 5353), false),
            ("LB VIP, endpoint no longer serving", flow(UDP, "198.51.100.10", 53, "10.244.1.7", 5353), true),
            ("NodePort, ready endpoint", flow(UDP, "10.0.0.2", 30053, "10.244.1.5", 5353), false),
            ("NodePort, endpoint deleted", flow(UDP, "10.0.0.2", 30053, "10.244.1.8", 5353), true),
            ("NodePort on any address", flow(UDP, "127.0.0.1", 30053, "10.244.1.7", 5353), true),
            ("ClusterIP of a port with no serving endpoint", flow(UDP, "10.96.0.30", 1234, "10.244.4.5", 1234), true),
            ("NodePort of a port with no serving endpoint", flow(UDP, "10.0.0.2", 31234, "10.244.4.5", 1234), false),
            ("second port of a Service, its endpoint", flow(UDP, "10.96.0.40", 6000, "10.244.3.5", 6000), false),
            ("second port of a Service, the first port's endpoint", flow(UDP, "10.96.0.40", 6000, "10.244.3.5", 5000), true),
            ("ClusterIP, a port the Service does not have", flow(UDP, "10.96.0.10", 54, "10.244.9.9", 54), false),
            ("not a Service", flow(UDP, "10.0.0.9", 53, "10.0.0.9", 53), false),
            ("TCP to a UDP Service's ClusterIP and port", flow(TCP, "10.96.0.10", 53, "10.244.1.8", 5353), false),
            ("TCP to a UDP Service's NodePort", flow(TCP, "10.0.0.2", 30053, "10.244.1.8", 5353), false),
            ("TCP Service, no endpoint", flow(TCP, "10.96.0.20", 80, "10.244.2.5", 8080), false),
            ("UDP to a TCP Service's ClusterIP and port", flow(UDP, "10.96.0.20", 80, "10.244.2.5", 8080), false),
        ];
        let flows: Vec<Flow> = cases.iter().map(|(_, flow, _)| flow.clone()).collect();
        let stale = stale_flows(&services, &endpoints, &flows);
        for (name, flow, expected) in cases {
            assert_eq!(stale.contains(&flow), *expected, "{name}: {flow}");
        }
        // In the dump's order, each once.
        let expected: Vec<&Flow> = cases.iter().filter(|c| c.2).map(|c| &c.1).collect();
        assert_eq!(stale, expected);
    }

    #[test]
    fn ipv6_entries_are_decided_alike() {
        let svc = ServiceName::new("ns", "dns6");
        let mut dns = port(&svc, "dns", Protocol::Udp, "fd00:96::10", 53);
        dns.node_port = 30053;
        dns.external_ips = vec![ip("2001:db8::10")];
        let endpoints = HashMap::from([(
            dns.name.clone(),
            vec![
                endpoint("fd00:244::5", 5353, State::Ready),
                endpoint("fd00:244::6", 5353, State::Gone),
            ],
        )]);
        let services = BTreeMap::from([(svc, vec![dns])]);
        #[rustfmt::skip]
        let cases: &[(Flow, bool)] = &[
            (flow(UDP, "fd00:96::10", 53, "fd00:244::5", 5353), false),
            (flow(UDP, "fd00:96::10", 53, "fd00:244::6", 5353), true),
            (flow(UDP, "2001:db8::10", 53, "fd00:244::7", 5353), true),
            (flow(UDP, "fd00::2", 30053, "fd00:244::6", 5353), true),
            (flow(UDP, "fd00::2", 30053, "fd00:244::5", 5353), false),
            (flow(TCP, "fd00:96::10", 53, "fd00:244::6", 5353), false),
        ];
        let flows: Vec<Flow> = cases.iter().map(|(flow, _)| flow.clone()).collect();
        let stale = stale_flows(&services, &endpoints, &flows);
        for (flow, expected) in cases {
            assert_eq!(stale.contains(&flow), *expected, "{flow}");
        }
    }

    #[test]
    fn an_address_target_and_a_node_port_are_both_checked() {
        // 10.96.0.50:30053 is ns/other's ClusterIP and port, and 30053 is ns/dns's NodePort:
        // an entry answered by ns/other's endpoint still goes, as upstream's would.
        let (mut services, mut endpoints) = state_v4();
        let other = ServiceName::new("ns", "other");
        let other_port = port(&other, "p", Protocol::Udp, "10.96.0.50", 30053);
        endpoints.insert(
            other_port.name.clone(),
            vec![endpoint("10.244.5.5", 30053, State::Ready)],
        );
        services.insert(other, vec![other_port]);
        let flows = [flow(UDP, "10.96.0.50", 30053, "10.244.5.5", 30053)];
        assert_eq!(stale_flows(&services, &endpoints, &flows).len(), 1);
    }

    #[test]
    fn a_target_two_ports_claim_keeps_what_either_serves() {
        // ns/a's external IP is ns/b's ClusterIP, same port.
        let a = ServiceName::new("ns", "a");
        let b = ServiceName::new("ns", "b");
        let mut a_port = port(&a, "", Protocol::Udp, "10.96.0.60", 53);
        a_port.external_ips = vec![ip("10.96.0.61")];
        let b_port = port(&b, "", Protocol::Udp, "10.96.0.61", 53);
        let endpoints = HashMap::from([
            (
                a_port.name.clone(),
                vec![endpoint("10.244.6.1", 53, State::Ready)],
            ),
            (
                b_port.name.clone(),
                vec![endpoint("10.244.6.2", 53, State::Ready)],
            ),
        ]);
        let services = BTreeMap::from([(a, vec![a_port]), (b, vec![b_port])]);
        let flows = [
            flow(UDP, "10.96.0.61", 53, "10.244.6.1", 53),
            flow(UDP, "10.96.0.61", 53, "10.244.6.2", 53),
            flow(UDP, "10.96.0.61", 53, "10.244.6.3", 53),
        ];
        let stale = stale_flows(&services, &endpoints, &flows);
        assert_eq!(stale, vec![&flows[2]]);
    }

    #[test]
    fn nothing_is_stale_without_udp_service_ports() {
        let (mut services, endpoints) = state_v4();
        services.retain(|name, _| name.name() == "web");
        let flows = [
            flow(UDP, "10.96.0.10", 53, "10.244.1.8", 5353),
            flow(UDP, "10.0.0.2", 30053, "10.244.1.8", 5353),
            flow(TCP, "10.96.0.20", 80, "10.244.2.9", 8080),
        ];
        assert!(stale_flows(&services, &endpoints, &flows).is_empty());
        assert!(stale_flows(&BTreeMap::new(), &HashMap::new(), &flows).is_empty());
    }

    #[test]
    fn a_port_without_node_port_claims_no_port_alone() {
        // node_port 0 means none: an entry to port 0 of any address is not a NodePort's.
        let (services, endpoints) = state_v4();
        let flows = [flow(UDP, "10.0.0.2", 0, "10.244.1.8", 0)];
        assert!(stale_flows(&services, &endpoints, &flows).is_empty());
    }
}
