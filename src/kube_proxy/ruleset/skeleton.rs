//! The fixed part of the table: base chains hooked into netfilter, the dispatch chains and
//! the sets and maps every Service port writes into. Written whole on each full sync, as
//! upstream writes it (the names, types, comments and rules are upstream's, so an operator's
//! `nft list table ip kube-proxy` reads the same).

use super::settings::{NodePorts, Settings};
use crate::kube_proxy::nft::objects::{
    BaseChain, ChainType, Hook, Object, SetKind, SetSpec, Transaction,
};
use crate::kube_proxy::nft::rule::{AddrField, AddrValue, Rule, Stmt, VmapKey};

pub const FILTER_PREROUTING_PRE_DNAT: &str = "filter-prerouting-pre-dnat";
pub const FILTER_OUTPUT_PRE_DNAT: &str = "filter-output-pre-dnat";
pub const FILTER_INPUT: &str = "filter-input";
pub const FILTER_FORWARD: &str = "filter-forward";
pub const FILTER_OUTPUT: &str = "filter-output";
pub const NAT_PREROUTING: &str = "nat-prerouting";
pub const NAT_OUTPUT: &str = "nat-output";
pub const NAT_POSTROUTING: &str = "nat-postrouting";

pub const SERVICES_CHAIN: &str = "services";
pub const SERVICE_IPS: &str = "service-ips";
pub const SERVICE_NODEPORTS: &str = "service-nodeports";
pub const NODEPORT_IPS: &str = "nodeport-ips";
pub const CLUSTER_IPS: &str = "cluster-ips";
pub const SERVICE_ENDPOINTS_CHECK: &str = "service-endpoints-check";
pub const NODEPORT_ENDPOINTS_CHECK: &str = "nodeport-endpoints-check";
pub const NO_ENDPOINT_SERVICES: &str = "no-endpoint-services";
pub const NO_ENDPOINT_NODEPORTS: &str = "no-endpoint-nodeports";
pub const REJECT_CHAIN: &str = "reject-chain";
pub const CLUSTER_IPS_CHECK: &str = "cluster-ips-check";
pub const FIREWALL_IPS: &str = "firewall-ips";
pub const FIREWALL_CHECK: &str = "firewall-check";
pub const MASQUERADING: &str = "masquerading";
pub const HAIRPIN: &str = "hairpin-connections";
/// iptables and ipvs modes only: marks hairpin connections for iptables' KUBE-FORWARD,
/// before the filter table's FORWARD chain (priority 0) sees them.
pub const HAIRPIN_MARK: &str = "filter-forward-hairpin-mark";
const HAIRPIN_MARK_PRIORITY: i32 = -10;
/// Created and deleted at once by upstream's full sync when its localhost-NodePort alpha
/// feature is off; kept for the same operation count and the same end state.
pub const LOCALHOST_NODEPORT_REJECT: &str = "localhost-nodeport-reject-ports";

/// The sets and maps whose elements the Service ports own, with their kind.
pub const ELEMENT_CONTAINERS: [(&str, SetKind); 7] = [
    (CLUSTER_IPS, SetKind::Set),
    (SERVICE_IPS, SetKind::Map),
    (FIREWALL_IPS, SetKind::Map),
    (NO_ENDPOINT_SERVICES, SetKind::Map),
    (NO_ENDPOINT_NODEPORTS, SetKind::Map),
    (SERVICE_NODEPORTS, SetKind::Map),
    (HAIRPIN, SetKind::Set),
];

pub const BASE_CHAINS: [(&str, ChainType, Hook, i32); 8] = [
    (
        FILTER_PREROUTING_PRE_DNAT,
        ChainType::Filter,
        Hook::Prerouting,
        -110,
    ),
    (
        FILTER_OUTPUT_PRE_DNAT,
        ChainType::Filter,
        Hook::Output,
        -110,
    ),
    (FILTER_INPUT, ChainType::Filter, Hook::Input, 0),
    (FILTER_FORWARD, ChainType::Filter, Hook::Forward, 0),
    (FILTER_OUTPUT, ChainType::Filter, Hook::Output, 0),
    (NAT_PREROUTING, ChainType::Nat, Hook::Prerouting, -100),
    (NAT_OUTPUT, ChainType::Nat, Hook::Output, -100),
    (NAT_POSTROUTING, ChainType::Nat, Hook::Postrouting, 100),
];

/// (target, from, only new connections)
const JUMPS: [(&str, &str, bool); 11] = [
    (NODEPORT_ENDPOINTS_CHECK, FILTER_INPUT, true),
    (SERVICE_ENDPOINTS_CHECK, FILTER_INPUT, true),
    (SERVICE_ENDPOINTS_CHECK, FILTER_FORWARD, true),
    (SERVICE_ENDPOINTS_CHECK, FILTER_OUTPUT, true),
    (FIREWALL_CHECK, FILTER_PREROUTING_PRE_DNAT, true),
    (FIREWALL_CHECK, FILTER_OUTPUT_PRE_DNAT, true),
    (SERVICES_CHAIN, NAT_OUTPUT, false),
    (SERVICES_CHAIN, NAT_PREROUTING, false),
    (MASQUERADING, NAT_POSTROUTING, false),
    (CLUSTER_IPS_CHECK, FILTER_FORWARD, true),
    (CLUSTER_IPS_CHECK, FILTER_OUTPUT, true),
];

fn set(name: &str, kind: SetKind, key_type: String, comment: &str) -> Object {
    Object::Set {
        name: name.into(),
        spec: SetSpec {
            kind,
            key_type,
            flags: Vec::new(),
            timeout_secs: None,
            comment: Some(comment.into()),
        },
    }
}

fn daddr(value: AddrValue) -> Stmt {
    Stmt::Addr {
        field: AddrField::Daddr,
        negate: false,
        value,
    }
}

fn daddr_set(name: &str) -> Stmt {
    daddr(AddrValue::Named(name.into()))
}

fn not_loopback(settings: &Settings) -> Stmt {
    Stmt::Addr {
        field: AddrField::Daddr,
        negate: true,
        value: AddrValue::Net(settings.family.loopback()),
    }
}

/// Adds the fixed objects to a full sync's transaction. `first` (the process's first full
/// sync) also adds and deletes every base chain first, so a base chain another version left
/// with other properties is made anew rather than refusing the transaction.
pub fn write(settings: &Settings, first: bool, tx: &mut Transaction) {
    let family = settings.family;
    let addr = family.nft_addr_type();
    tx.add(Object::Table {
        comment: Some("rules for kube-proxy".into()),
    });
    if first {
        for (name, ..) in BASE_CHAINS {
            tx.add(Object::chain(name));
            tx.delete(Object::chain(name));
        }
        if settings.mark_hairpin_for_forward {
            tx.add(Object::chain(HAIRPIN_MARK));
            tx.delete(Object::chain(HAIRPIN_MARK));
        }
    }
    for (name, kind, hook, priority) in BASE_CHAINS {
        tx.add(Object::Chain {
            name: name.into(),
            base: Some(BaseChain {
                kind,
                hook,
                priority,
            }),
            comment: None,
        });
        tx.flush(Object::chain(name));
    }

    let mut created: Vec<&str> = Vec::new();
    let mut ensure = |tx: &mut Transaction, name: &'static str| {
        if !created.contains(&name) {
            created.push(name);
            tx.add(Object::chain(name));
            tx.flush(Object::chain(name));
        }
    };
    for (target, from, new_only) in JUMPS {
        ensure(tx, target);
        let mut stmts = Vec::new();
        if new_only {
            stmts.push(Stmt::CtStateNew);
        }
        stmts.push(Stmt::Jump(target.into()));
        tx.add_rule(from, Rule::new(stmts));
    }
    for name in [SERVICES_CHAIN, CLUSTER_IPS_CHECK, MASQUERADING] {
        ensure(tx, name);
    }

    tx.add(set(
        HAIRPIN,
        SetKind::Set,
        format!("{addr} . {addr} . inet_proto . inet_service"),
        "service hairpin connections",
    ));
    tx.add_rule(
        MASQUERADING,
        Rule::new(vec![
            Stmt::MarkAnyOf(settings.mark),
            Stmt::MarkSetXor(settings.mark),
            Stmt::Masquerade,
        ]),
    );
    tx.add_rule(
        MASQUERADING,
        Rule::new(vec![
            Stmt::CtStatusDnat,
            Stmt::HairpinLookup(HAIRPIN.into()),
            Stmt::Masquerade,
        ]),
    );

    if settings.mark_hairpin_for_forward {
        tx.add(Object::Chain {
            name: HAIRPIN_MARK.into(),
            base: Some(BaseChain {
                kind: ChainType::Filter,
                hook: Hook::Forward,
                priority: HAIRPIN_MARK_PRIORITY,
            }),
            comment: None,
        });
        tx.flush(Object::chain(HAIRPIN_MARK));
        tx.add_rule(
            HAIRPIN_MARK,
            Rule::with_comment(
                vec![
                    Stmt::CtStatusDnat,
                    Stmt::HairpinLookup(HAIRPIN.into()),
                    Stmt::MarkSetOr(settings.mark),
                ],
                "mark hairpin connections for iptables' KUBE-FORWARD",
            ),
        );
    }

    tx.add(set(
        CLUSTER_IPS,
        SetKind::Set,
        addr.into(),
        "Active ClusterIPs",
    ));
    tx.add_rule(
        CLUSTER_IPS_CHECK,
        Rule::with_comment(
            vec![daddr_set(CLUSTER_IPS), Stmt::Reject],
            "Reject traffic to invalid ports of ClusterIPs",
        ),
    );
    if !settings.service_cidrs.is_empty() {
        tx.add_rule(
            CLUSTER_IPS_CHECK,
            Rule::with_comment(
                vec![
                    daddr(AddrValue::Anonymous(settings.service_cidrs.clone())),
                    Stmt::Drop,
                ],
                "Drop traffic to unallocated ClusterIPs",
            ),
        );
    }

    // The NodePort addresses: the set exists only when NodePorts do not answer everywhere.
    tx.add(set(
        NODEPORT_IPS,
        SetKind::Set,
        addr.into(),
        "IPs that accept NodePort traffic",
    ));
    match &settings.node_ports {
        NodePorts::All => tx.delete(Object::set_named(SetKind::Set, NODEPORT_IPS)),
        NodePorts::Addresses(ips) => {
            tx.flush(Object::set_named(SetKind::Set, NODEPORT_IPS));
            let localhost = settings.localhost_node_ports;
            for ip in ips.iter().filter(|ip| localhost || !ip.is_loopback()) {
                tx.add(Object::Element {
                    set: NODEPORT_IPS.into(),
                    key: crate::kube_proxy::nft::objects::Key::Addr(*ip),
                    value: None,
                    comment: None,
                });
            }
        }
    }

    tx.add(set(
        NO_ENDPOINT_SERVICES,
        SetKind::Map,
        format!("{addr} . inet_proto . inet_service : verdict"),
        "vmap to drop or reject packets to services with no endpoints",
    ));
    tx.add(set(
        NO_ENDPOINT_NODEPORTS,
        SetKind::Map,
        "inet_proto . inet_service : verdict".into(),
        "vmap to drop or reject packets to service nodeports with no endpoints",
    ));
    tx.add(Object::Chain {
        name: REJECT_CHAIN.into(),
        base: None,
        comment: Some("helper for @no-endpoint-services / @no-endpoint-nodeports".into()),
    });
    tx.flush(Object::chain(REJECT_CHAIN));
    tx.add_rule(REJECT_CHAIN, Rule::new(vec![Stmt::Reject]));
    tx.add_rule(
        SERVICE_ENDPOINTS_CHECK,
        Rule::new(vec![Stmt::Vmap {
            key: VmapKey::DaddrProtoPort,
            map: NO_ENDPOINT_SERVICES.into(),
        }]),
    );
    let mut check = match settings.node_ports {
        NodePorts::All if settings.localhost_node_ports => vec![],
        NodePorts::All => vec![not_loopback(settings)],
        NodePorts::Addresses(_) => vec![daddr_set(NODEPORT_IPS)],
    };
    check.push(Stmt::Vmap {
        key: VmapKey::ProtoPort,
        map: NO_ENDPOINT_NODEPORTS.into(),
    });
    tx.add_rule(NODEPORT_ENDPOINTS_CHECK, Rule::new(check));

    // Localhost NodePorts are an alpha feature upstream, off by default: its map and
    // per-protocol chains and counters are made and removed in the same transaction.
    tx.add(set(
        LOCALHOST_NODEPORT_REJECT,
        SetKind::Map,
        "inet_proto . inet_service : verdict".into(),
        "localhost NodePorts rejected by kube-proxy",
    ));
    tx.delete(Object::set_named(SetKind::Map, LOCALHOST_NODEPORT_REJECT));
    for proto in ["tcp", "udp", "sctp"] {
        let chain = format!("localhost-nodeport-reject-{proto}");
        tx.add(Object::chain(chain.clone()));
        tx.delete(Object::chain(chain));
        let counter = format!("localhost-nodeport-rejected-{proto}");
        tx.add(Object::Counter {
            name: counter.clone(),
        });
        tx.delete(Object::Counter { name: counter });
    }

    tx.add(set(
        FIREWALL_IPS,
        SetKind::Map,
        format!("{addr} . inet_proto . inet_service : verdict"),
        "destinations that are subject to LoadBalancerSourceRanges",
    ));
    ensure(tx, FIREWALL_CHECK);
    tx.add_rule(
        FIREWALL_CHECK,
        Rule::new(vec![Stmt::Vmap {
            key: VmapKey::DaddrProtoPort,
            map: FIREWALL_IPS.into(),
        }]),
    );

    tx.add(set(
        SERVICE_IPS,
        SetKind::Map,
        format!("{addr} . inet_proto . inet_service : verdict"),
        "ClusterIP, ExternalIP and LoadBalancer IP traffic",
    ));
    tx.add(set(
        SERVICE_NODEPORTS,
        SetKind::Map,
        "inet_proto . inet_service : verdict".into(),
        "NodePort traffic",
    ));
    if settings.masquerade_all {
        tx.add_rule(
            SERVICES_CHAIN,
            Rule::with_comment(
                vec![daddr_set(CLUSTER_IPS), Stmt::MarkSetOr(settings.mark)],
                "masquerade all clusterIP traffic",
            ),
        );
    } else if let Some(not_local) = settings.local_detector.matcher(true) {
        tx.add_rule(
            SERVICES_CHAIN,
            Rule::with_comment(
                vec![
                    daddr_set(CLUSTER_IPS),
                    not_local,
                    Stmt::MarkSetOr(settings.mark),
                ],
                "masquerade clusterIP traffic from outside cluster",
            ),
        );
    }
    tx.add_rule(
        SERVICES_CHAIN,
        Rule::new(vec![Stmt::Vmap {
            key: VmapKey::DaddrProtoPort,
            map: SERVICE_IPS.into(),
        }]),
    );
    let mut dispatch = match settings.node_ports {
        // iptables mode's localhost NodePorts: 127.0.0.1 is a local address too.
        NodePorts::All if settings.localhost_node_ports => vec![Stmt::FibLocal(AddrField::Daddr)],
        NodePorts::All => vec![Stmt::FibLocal(AddrField::Daddr), not_loopback(settings)],
        NodePorts::Addresses(_) => vec![daddr_set(NODEPORT_IPS)],
    };
    dispatch.push(Stmt::Vmap {
        key: VmapKey::ProtoPort,
        map: SERVICE_NODEPORTS.into(),
    });
    tx.add_rule(SERVICES_CHAIN, Rule::new(dispatch));
}
