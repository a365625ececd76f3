//! Packet-flow cases: for each group of Services, the packets a node sees (from a pod,
//! from the node itself, from outside) and where each must go. The groups cover upstream's
//! case families: ClusterIP (several ports and protocols, a wrong port, an unallocated
//! address), NodePort, LoadBalancer with source ranges, external IPs, internal and external
//! traffic policy Local, terminating endpoints, every masquerade case, no endpoints, hairpin
//! and affinity, in IPv4 and IPv6.

mod cluster_ip;
mod external;
mod local_policy;
mod masquerade;
mod node_port;
mod pick;

use std::net::IpAddr;

use super::scenario::{Net, Scenario};
use crate::kube_proxy::model::{IpFamily, Protocol};
use crate::kube_proxy::ruleset::settings::Settings;
use crate::kube_proxy::trace::{NodeAddrs, Packet};

/// One packet and where it must go: `expect` is the tracer's summary (the endpoints a
/// random pick may choose, in the DNAT map's order, or `ACCEPT`, `DROP`, `REJECT`).
#[derive(Clone, Debug)]
pub struct Case {
    pub name: String,
    pub packet: Packet,
    pub expect: String,
    pub masquerade: bool,
    /// For a case whose endpoints are masqueraded differently (a pod reaching itself among
    /// others): each endpoint's, in the DNAT map's order.
    pub each_masquerade: Option<Vec<bool>>,
}

/// Services, the settings they are rendered with, the node's addresses, and the cases.
pub struct Suite {
    pub name: String,
    pub settings: Settings,
    pub scenario: Scenario,
    pub node: NodeAddrs,
    pub cases: Vec<Case>,
}

/// Every suite, for one family.
pub fn suites(family: IpFamily) -> Vec<Suite> {
    let net = Net::of(family);
    let mut all = vec![
        cluster_ip::suite(&net),
        cluster_ip::hairpin_and_affinity(&net),
    ];
    all.push(node_port::suite(&net, false));
    all.push(node_port::suite(&net, true));
    if family == IpFamily::V4 {
        all.push(node_port::localhost(&net));
    }
    all.push(external::load_balancer(&net));
    all.push(external::external_ips(&net));
    all.push(local_policy::external_local(&net));
    all.push(local_policy::internal_local(&net));
    all.push(local_policy::terminating(&net));
    all.extend(masquerade::suites(&net));
    all.extend(pick::suites(&net));
    all
}

/// Builds the cases of a suite.
pub struct Cases<'a> {
    net: &'a Net,
    cases: Vec<Case>,
}

impl<'a> Cases<'a> {
    pub fn new(net: &'a Net) -> Cases<'a> {
        Cases {
            net,
            cases: Vec::new(),
        }
    }

    /// A case; `expect` lists endpoints as (address, port), or is empty for `verdict`.
    pub fn add(
        &mut self,
        name: &str,
        src: IpAddr,
        protocol: Protocol,
        dst: IpAddr,
        port: u16,
        expect: Expect,
    ) -> &mut Self {
        self.add_iif(name, src, protocol, dst, port, None, expect)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn add_iif(
        &mut self,
        name: &str,
        src: IpAddr,
        protocol: Protocol,
        dst: IpAddr,
        port: u16,
        iif: Option<&str>,
        expect: Expect,
    ) -> &mut Self {
        let mut each_masquerade = None;
        let (expect, masquerade) = match expect {
            Expect::ToEach(endpoints) => {
                let mut texts: Vec<(String, bool)> = endpoints
                    .iter()
                    .map(|(ip, port, masq)| (endpoint_text(*ip, *port), *masq))
                    .collect();
                texts.sort();
                each_masquerade = Some(texts.iter().map(|t| t.1).collect());
                let first = texts.first().is_some_and(|t| t.1);
                let texts: Vec<String> = texts.into_iter().map(|t| t.0).collect();
                (texts.join(", "), first)
            }
            Expect::To(endpoints, masq) => {
                // Listed in the DNAT map's order: upstream's sort, by the text of each.
                let mut texts: Vec<String> = endpoints
                    .iter()
                    .map(|(ip, port)| endpoint_text(*ip, *port))
                    .collect();
                texts.sort();
                (texts.join(", "), masq)
            }
            Expect::Accept => ("ACCEPT".into(), false),
            Expect::Drop => ("DROP".into(), false),
            Expect::Reject => ("REJECT".into(), false),
        };
        self.cases.push(Case {
            name: format!("{} ({})", name, self.net.family),
            packet: Packet {
                src,
                dst,
                protocol,
                port,
                iif: iif.map(str::to_owned),
            },
            expect,
            masquerade,
            each_masquerade,
        });
        self
    }

    pub fn done(self) -> Vec<Case> {
        self.cases
    }
}

/// Where a case's packet must go.
pub enum Expect {
    /// DNAT to these endpoints (in any order: they are compared in the DNAT map's order),
    /// masqueraded or not.
    To(Vec<(IpAddr, u16)>, bool),
    /// DNAT to these endpoints, each masqueraded or not.
    ToEach(Vec<(IpAddr, u16, bool)>),
    /// Not translated and not refused.
    Accept,
    Drop,
    Reject,
}

fn endpoint_text(ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(ip) => format!("{ip}:{port}"),
        IpAddr::V6(ip) => format!("[{ip}]:{port}"),
    }
}

pub fn node_addrs(net: &Net) -> NodeAddrs {
    NodeAddrs::new([net.node_ip, net.node_ip2])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube_proxy::trace::trace;

    fn run(family: IpFamily) -> usize {
        let mut failures = Vec::new();
        let mut count = 0;
        for suite in suites(family) {
            let table = suite.scenario.table(&suite.settings);
            for case in &suite.cases {
                count += 1;
                let outcome = trace(&table, &suite.node, &case.packet);
                let each: Vec<bool> = outcome.branches.iter().map(|b| b.masquerade).collect();
                let each_ok = case
                    .each_masquerade
                    .as_ref()
                    .is_none_or(|want| *want == each);
                if outcome.summary() != case.expect
                    || outcome.masquerade() != case.masquerade
                    || !each_ok
                {
                    failures.push(format!(
                        "{} / {}: expected {} (masquerade {}), got {} (masquerade {})\n{outcome}",
                        suite.name,
                        case.name,
                        case.expect,
                        case.masquerade,
                        outcome.summary(),
                        outcome.masquerade()
                    ));
                }
                assert!(
                    outcome.unknown.is_empty(),
                    "{}: {:?}",
                    case.name,
                    outcome.unknown
                );
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n\n"));
        count
    }

    #[test]
    fn packets_go_where_upstreams_rules_send_them_ipv4() {
        assert!(run(IpFamily::V4) >= 75);
    }

    #[test]
    fn packets_go_where_upstreams_rules_send_them_ipv6() {
        assert!(run(IpFamily::V6) >= 75);
    }
}
