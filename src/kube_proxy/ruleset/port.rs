//! One Service port's share of the ruleset: its chains with their rules, its affinity sets
//! and the map and set elements that lead to them, computed from the port, its endpoints
//! and the node's settings alone. No I/O: the sync turns these into operations.

use std::net::IpAddr;

use super::settings::Settings;
use super::skeleton::{
    CLUSTER_IPS, FIREWALL_IPS, HAIRPIN, NO_ENDPOINT_NODEPORTS, NO_ENDPOINT_SERVICES, REJECT_CHAIN,
    SERVICE_IPS, SERVICE_NODEPORTS,
};
use crate::kube_proxy::model::{Endpoint, ServicePort};
use crate::kube_proxy::nft::names::{endpoint_chain_and_set, truncate_comment, PortChains};
use crate::kube_proxy::nft::objects::{Key, Verdict};
use crate::kube_proxy::nft::rule::{AddrField, AddrValue, Pick, Rule, Stmt};
use crate::kube_proxy::topology::{categorize, Categorized};

/// One element a port wants in one of the table's sets or maps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WantedElement {
    pub set: &'static str,
    pub key: Key,
    pub value: Option<Verdict>,
    pub comment: Option<String>,
}

/// A chain a port owns, with its rules (written after an add and a flush).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WantedChain {
    pub name: String,
    pub rules: Vec<Rule>,
}

/// What one Service port puts into the table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortRules {
    pub chains: Vec<WantedChain>,
    /// Affinity sets and their timeout in seconds.
    pub affinity_sets: Vec<(String, u32)>,
    pub elements: Vec<WantedElement>,
    /// Internal traffic policy Local with no local endpoint (so ClusterIP traffic drops).
    pub no_local_internal: bool,
    /// External traffic policy Local with no local endpoint.
    pub no_local_external: bool,
}

impl PortRules {
    fn element(
        &mut self,
        set: &'static str,
        key: Key,
        value: Option<Verdict>,
        comment: Option<&str>,
    ) {
        self.elements.push(WantedElement {
            set,
            key,
            value,
            comment: comment.map(str::to_owned),
        });
    }

    fn chain(&mut self, name: &str) -> usize {
        if let Some(i) = self.chains.iter().position(|c| c.name == name) {
            return i;
        }
        self.chains.push(WantedChain {
            name: name.to_owned(),
            rules: Vec::new(),
        });
        self.chains.len() - 1
    }

    fn rule(&mut self, chain: &str, rule: Rule) {
        let i = self.chain(chain);
        self.chains[i].rules.push(rule);
    }
}

/// Renders one port. `endpoints` are the port's endpoints in upstream's order (`sort_endpoints`).
pub fn render_port(
    settings: &Settings,
    port: &ServicePort,
    endpoints: &[Endpoint],
    zone: Option<&str>,
) -> PortRules {
    let mut out = PortRules::default();
    let proto = port.protocol();
    let names = PortChains::new(&port.name);
    let comment = truncate_comment(&port.name.to_string());
    let Categorized {
        cluster,
        local,
        all_reachable,
        has_any,
    } = categorize(endpoints, port, &settings.node_name, zone);
    let affinity = port.affinity_timeout;

    // Endpoint chains (for affinity) and the hairpin set, for every endpoint this node may
    // send the port's traffic to.
    let mut endpoint_chains = Vec::new();
    for ep in &all_reachable {
        if let Some(timeout) = affinity {
            let (chain, set) = endpoint_chain_and_set(&port.name, ep);
            out.chain(&chain);
            out.affinity_sets.push((set.clone(), timeout));
            endpoint_chains.push((chain, set, *ep));
        }
        if ep.is_local {
            out.element(
                HAIRPIN,
                Key::Hairpin(ep.ip, ep.ip, proto, ep.port),
                None,
                None,
            );
        }
    }

    let uses_cluster_chain = !cluster.is_empty() && port.uses_cluster_endpoints();
    if uses_cluster_chain {
        out.chain(&names.cluster);
    }
    let uses_local_chain = !local.is_empty() && port.uses_local_endpoints();
    if uses_local_chain {
        out.chain(&names.local);
    }

    let (internal_chain, has_internal) = if port.internal_policy_local {
        (&names.local, has_any && !local.is_empty())
    } else {
        (&names.cluster, has_any)
    };
    let (external_policy_chain, has_external) = if port.external_policy_local {
        (&names.local, has_any && !local.is_empty())
    } else {
        (&names.cluster, has_any)
    };
    let uses_external_chain = has_any && port.externally_accessible();
    if uses_external_chain {
        out.chain(&names.external);
    }

    let reject = Verdict::Goto(REJECT_CHAIN.into());
    let (internal_verdict, external_verdict) = if !has_any {
        (reject.clone(), reject)
    } else {
        out.no_local_internal = !has_internal;
        out.no_local_external = !has_external;
        (Verdict::Drop, Verdict::Drop)
    };

    // The ClusterIP.
    out.element(CLUSTER_IPS, Key::Addr(port.cluster_ip), None, None);
    let vip_key = |ip: IpAddr| Key::AddrPort(ip, proto, port.port);
    if has_internal {
        out.element(
            SERVICE_IPS,
            vip_key(port.cluster_ip),
            Some(Verdict::Goto(internal_chain.clone())),
            None,
        );
    } else {
        out.element(
            NO_ENDPOINT_SERVICES,
            vip_key(port.cluster_ip),
            Some(internal_verdict),
            Some(&comment),
        );
    }

    // External IPs.
    for ip in &port.external_ips {
        if has_any {
            out.element(
                SERVICE_IPS,
                vip_key(*ip),
                Some(Verdict::Goto(names.external.clone())),
                None,
            );
        }
        if !has_external {
            out.element(
                NO_ENDPOINT_SERVICES,
                vip_key(*ip),
                Some(external_verdict.clone()),
                Some(&comment),
            );
        }
    }

    // Load-balancer VIPs, and their source ranges.
    let uses_firewall = !port.lb_vips.is_empty() && !port.source_ranges.is_empty();
    if uses_firewall {
        out.chain(&names.firewall);
    }
    for ip in &port.lb_vips {
        if has_any {
            out.element(
                SERVICE_IPS,
                vip_key(*ip),
                Some(Verdict::Goto(names.external.clone())),
                None,
            );
        }
        if uses_firewall {
            out.element(
                FIREWALL_IPS,
                vip_key(*ip),
                Some(Verdict::Goto(names.firewall.clone())),
                None,
            );
        }
    }
    if !has_external {
        for ip in &port.lb_vips {
            out.element(
                NO_ENDPOINT_SERVICES,
                vip_key(*ip),
                Some(external_verdict.clone()),
                Some(&comment),
            );
        }
    }

    // The NodePort (never subject to source ranges, as upstream).
    if port.node_port != 0 {
        let key = Key::Port(proto, port.node_port);
        if has_any {
            out.element(
                SERVICE_NODEPORTS,
                key.clone(),
                Some(Verdict::Goto(names.external.clone())),
                None,
            );
        }
        if !has_external {
            out.element(
                NO_ENDPOINT_NODEPORTS,
                key,
                Some(external_verdict),
                Some(&comment),
            );
        }
    }

    // The external chain: masquerade, or keep the source and short-circuit pod and host
    // traffic to the cluster endpoints.
    if uses_external_chain {
        let ext = names.external.as_str();
        if !port.external_policy_local {
            out.rule(
                ext,
                Rule::with_comment(vec![Stmt::MarkSetOr(settings.mark)], "masquerade"),
            );
        } else {
            if let Some(local) = settings.local_detector.matcher(false) {
                out.rule(
                    ext,
                    Rule::with_comment(
                        vec![local, Stmt::Goto(names.cluster.clone())],
                        "short-circuit pod traffic",
                    ),
                );
            }
            out.rule(
                ext,
                Rule::with_comment(
                    vec![
                        Stmt::FibLocal(AddrField::Saddr),
                        Stmt::MarkSetOr(settings.mark),
                    ],
                    "masquerade local traffic",
                ),
            );
            out.rule(
                ext,
                Rule::with_comment(
                    vec![
                        Stmt::FibLocal(AddrField::Saddr),
                        Stmt::Goto(names.cluster.clone()),
                    ],
                    "short-circuit local traffic",
                ),
            );
        }
        if has_external {
            out.rule(
                ext,
                Rule::new(vec![Stmt::Goto(external_policy_chain.clone())]),
            );
        }
    }

    if uses_firewall {
        let mut sources = port.source_ranges.clone();
        let allow_from_node = settings
            .node_ip
            .is_some_and(|ip| port.source_ranges.iter().any(|r| r.contains(&ip)));
        if allow_from_node {
            sources.extend(port.lb_vips.iter().map(|ip| ipnet::IpNet::from(*ip)));
        }
        out.rule(
            &names.firewall,
            Rule::new(vec![
                Stmt::Addr {
                    field: AddrField::Saddr,
                    negate: true,
                    value: AddrValue::Anonymous(sources),
                },
                Stmt::Drop,
            ]),
        );
    }

    // The endpoint rules.
    match affinity {
        None => {
            if uses_cluster_chain {
                let rule = dnat_rule(port, &cluster, settings.pick);
                out.rule(&names.cluster, rule);
            }
            if uses_local_chain {
                let rule = dnat_rule(port, &local, settings.pick);
                out.rule(&names.local, rule);
            }
        }
        Some(_) => {
            if uses_cluster_chain {
                affinity_jumps(&mut out, port, &names.cluster, &cluster, settings.pick);
            }
            if uses_local_chain {
                affinity_jumps(&mut out, port, &names.local, &local, settings.pick);
            }
            for (chain, set, ep) in endpoint_chains {
                out.rule(&chain, Rule::new(vec![Stmt::UpdateSaddr(set)]));
                out.rule(
                    &chain,
                    Rule::new(vec![
                        Stmt::L4Proto(proto),
                        Stmt::Dnat {
                            addr: ep.ip,
                            port: ep.port,
                        },
                    ]),
                );
            }
        }
    }
    out
}

/// `meta l4proto P dnat to IP:port` for one endpoint, a random pick among several.
fn dnat_rule(port: &ServicePort, endpoints: &[&Endpoint], pick: Pick) -> Rule {
    let proto = Stmt::L4Proto(port.protocol());
    match endpoints {
        [one] => Rule::new(vec![
            proto,
            Stmt::Dnat {
                addr: one.ip,
                port: one.port,
            },
        ]),
        many => Rule::new(vec![
            proto,
            Stmt::PickDnat {
                pick,
                targets: many.iter().map(|ep| (ep.ip, ep.port)).collect(),
            },
        ]),
    }
}

/// With ClientIP affinity: a source seen before goes to its endpoint again; any other picks
/// one at random.
fn affinity_jumps(
    out: &mut PortRules,
    port: &ServicePort,
    chain: &str,
    endpoints: &[&Endpoint],
    pick: Pick,
) {
    let mut targets = Vec::with_capacity(endpoints.len());
    for ep in endpoints {
        let (ep_chain, set) = endpoint_chain_and_set(&port.name, ep);
        out.rule(
            chain,
            Rule::new(vec![
                Stmt::Addr {
                    field: AddrField::Saddr,
                    negate: false,
                    value: AddrValue::Named(set),
                },
                Stmt::Goto(ep_chain.clone()),
            ]),
        );
        targets.push(ep_chain);
    }
    out.rule(
        chain,
        Rule::new(vec![Stmt::PickVmap {
            pick,
            chains: targets,
        }]),
    );
}
