//! The transactions whose batches nft recorded (`fixtures/NAME.nft` is each one's text,
//! `fixtures/NAME.hex` what `nft -f` sent for it): every kind of object and operation, and
//! every statement the renderer writes with its edge cases, in both families; and a real
//! full and partial sync of a flow suite.

use std::collections::HashSet;
use std::net::IpAddr;

use crate::kube_proxy::model::{IpFamily, Protocol, ServiceName};
use crate::kube_proxy::nft::objects::{
    BaseChain, ChainType, Hook, Key, Object, SetKind, SetSpec, Transaction, Verdict,
};
use crate::kube_proxy::nft::rule::{AddrField, AddrValue, Pick, Rule, Stmt, VmapKey};
use crate::kube_proxy::ruleset::sync::{KernelView, SyncKind};
use crate::kube_proxy::testing::flows::suites;
use crate::kube_proxy::testing::scenario::Net;

/// A fixture: its name, the transaction nft ran for it, and the transaction applied
/// before it (with plain `nft -f`), if any.
pub struct Fixture {
    pub name: String,
    pub tx: Transaction,
    pub setup: Option<Transaction>,
}

fn ip(text: &str) -> IpAddr {
    text.parse().expect("a literal address")
}

fn net(text: &str) -> ipnet::IpNet {
    text.parse().expect("a literal prefix")
}

fn host(ip: IpAddr) -> ipnet::IpNet {
    ipnet::IpNet::from(ip)
}

fn set(
    kind: SetKind,
    key_type: &str,
    flags: &[&str],
    timeout: Option<u32>,
    comment: Option<&str>,
) -> SetSpec {
    SetSpec {
        kind,
        key_type: key_type.into(),
        flags: flags.iter().map(|f| (*f).to_owned()).collect(),
        timeout_secs: timeout,
        comment: comment.map(str::to_owned),
    }
}

fn element(set: &str, key: Key, value: Option<Verdict>, comment: Option<&str>) -> Object {
    Object::Element {
        set: set.into(),
        key,
        value,
        comment: comment.map(str::to_owned),
    }
}

struct Addrs {
    a: IpAddr,
    b: IpAddr,
    /// Prefixes: byte-aligned, not, the whole space, a host, and the family's loopback.
    aligned: &'static str,
    unaligned: &'static str,
    everything: &'static str,
    range: &'static str,
    inside: &'static str,
    adjacent: &'static str,
    top: &'static str,
}

fn addrs(family: IpFamily) -> Addrs {
    match family {
        IpFamily::V4 => Addrs {
            a: ip("10.180.0.1"),
            b: ip("10.180.0.2"),
            aligned: "10.0.0.0/8",
            unaligned: "203.0.113.0/25",
            everything: "0.0.0.0/0",
            range: "10.0.0.0/8",
            inside: "10.1.0.0/16",
            adjacent: "11.0.0.0/8",
            top: "128.0.0.0/1",
        },
        IpFamily::V6 => Addrs {
            a: ip("fd00:10::1"),
            b: ip("fd00:10::2"),
            aligned: "fd00:10::/64",
            unaligned: "2001:db8::/57",
            everything: "::/0",
            range: "fd00::/16",
            inside: "fd00:10::/32",
            adjacent: "fd01::/16",
            top: "8000::/1",
        },
    }
}

/// Every kind of object, and every operation on each.
fn objects(family: IpFamily) -> Transaction {
    let a = addrs(family);
    let addr = family.nft_addr_type();
    let mut tx = Transaction::new(family);
    tx.add(Object::Table { comment: None });
    tx.delete(Object::Table { comment: None });
    tx.add(Object::Table {
        comment: Some("rules for kube-proxy".into()),
    });
    let bases = [
        (
            "filter-prerouting-pre-dnat",
            ChainType::Filter,
            Hook::Prerouting,
            -110,
        ),
        ("filter-input", ChainType::Filter, Hook::Input, 0),
        ("filter-forward", ChainType::Filter, Hook::Forward, 0),
        ("filter-output", ChainType::Filter, Hook::Output, 0),
        ("nat-postrouting", ChainType::Nat, Hook::Postrouting, 100),
    ];
    for (name, kind, hook, priority) in bases {
        tx.add(Object::chain(name));
        tx.delete(Object::chain(name));
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
    tx.add(Object::Chain {
        name: "nat-output".into(),
        base: Some(BaseChain {
            kind: ChainType::Nat,
            hook: Hook::Output,
            priority: -100,
        }),
        comment: Some("a base chain's comment".into()),
    });
    tx.add(Object::chain("services"));
    tx.add(Object::Chain {
        name: "reject-chain".into(),
        base: None,
        comment: Some("helper for @no-endpoint-services / @no-endpoint-nodeports".into()),
    });
    tx.add(Object::chain("stale"));
    tx.add(Object::Set {
        name: "cluster-ips".into(),
        spec: set(SetKind::Set, addr, &[], None, Some("Active ClusterIPs")),
    });
    tx.add(Object::Set {
        name: "affinity-x".into(),
        spec: set(
            SetKind::Set,
            addr,
            &["dynamic", "timeout"],
            Some(10800),
            None,
        ),
    });
    tx.add(Object::Set {
        name: "hairpin-connections".into(),
        spec: set(
            SetKind::Set,
            &format!("{addr} . {addr} . inet_proto . inet_service"),
            &[],
            None,
            Some("service hairpin connections"),
        ),
    });
    tx.add(Object::Set {
        name: "service-ips".into(),
        spec: set(
            SetKind::Map,
            &format!("{addr} . inet_proto . inet_service : verdict"),
            &[],
            None,
            Some("ClusterIP, ExternalIP and LoadBalancer IP traffic"),
        ),
    });
    tx.add(Object::Set {
        name: "service-nodeports".into(),
        spec: set(
            SetKind::Map,
            "inet_proto . inet_service : verdict",
            &[],
            None,
            Some("NodePort traffic"),
        ),
    });
    tx.add(Object::Counter {
        name: "localhost-nodeport-rejected-tcp".into(),
    });
    tx.add(element("cluster-ips", Key::Addr(a.a), None, None));
    tx.add(element(
        "service-ips",
        Key::AddrPort(a.a, Protocol::Tcp, 80),
        Some(Verdict::Goto("services".into())),
        None,
    ));
    tx.add(element(
        "service-ips",
        Key::AddrPort(a.b, Protocol::Udp, 53),
        Some(Verdict::Jump("reject-chain".into())),
        Some("ns2/svc2:p80"),
    ));
    tx.add(element(
        "service-nodeports",
        Key::Port(Protocol::Tcp, 30001),
        Some(Verdict::Drop),
        Some("ns/svc:dns"),
    ));
    tx.add(element(
        "service-nodeports",
        Key::Port(Protocol::Sctp, 30002),
        Some(Verdict::Accept),
        None,
    ));
    tx.add(element(
        "hairpin-connections",
        Key::Hairpin(a.a, a.a, Protocol::Tcp, 8080),
        None,
        None,
    ));
    tx.flush(Object::chain("services"));
    tx.flush(Object::set_named(SetKind::Set, "cluster-ips"));
    tx.flush(Object::set_named(SetKind::Map, "service-nodeports"));
    tx.delete(element(
        "service-ips",
        Key::AddrPort(a.a, Protocol::Tcp, 80),
        None,
        None,
    ));
    tx.delete(element(
        "hairpin-connections",
        Key::Hairpin(a.a, a.a, Protocol::Tcp, 8080),
        None,
        None,
    ));
    tx.delete(Object::Counter {
        name: "localhost-nodeport-rejected-tcp".into(),
    });
    tx.delete(Object::set_named(SetKind::Set, "affinity-x"));
    tx.delete(Object::set_named(SetKind::Map, "service-nodeports"));
    tx.delete(Object::chain("stale"));
    tx.flush(Object::Table { comment: None });
    tx
}

/// One rule for every statement and its variants.
fn statements(family: IpFamily) -> Transaction {
    let a = addrs(family);
    let addr = family.nft_addr_type();
    let mut tx = Transaction::new(family);
    tx.add(Object::Table { comment: None });
    tx.add(Object::chain("c"));
    tx.add(Object::chain("target"));
    tx.add(Object::Chain {
        name: "nat".into(),
        base: Some(BaseChain {
            kind: ChainType::Nat,
            hook: Hook::Prerouting,
            priority: -100,
        }),
        comment: None,
    });
    tx.add(Object::Set {
        name: "cluster-ips".into(),
        spec: set(SetKind::Set, addr, &[], None, None),
    });
    tx.add(Object::Set {
        name: "affinity".into(),
        spec: set(SetKind::Set, addr, &["dynamic", "timeout"], Some(300), None),
    });
    tx.add(Object::Set {
        name: "hairpin".into(),
        spec: set(
            SetKind::Set,
            &format!("{addr} . {addr} . inet_proto . inet_service"),
            &[],
            None,
            None,
        ),
    });
    tx.add(Object::Set {
        name: "vips".into(),
        spec: set(
            SetKind::Map,
            &format!("{addr} . inet_proto . inet_service : verdict"),
            &[],
            None,
            None,
        ),
    });
    tx.add(Object::Set {
        name: "ports".into(),
        spec: set(
            SetKind::Map,
            "inet_proto . inet_service : verdict",
            &[],
            None,
            None,
        ),
    });
    tx.add(Object::Counter {
        name: "hits".into(),
    });
    let addr_stmt = |field, negate, value| Stmt::Addr {
        field,
        negate,
        value,
    };
    let rules: Vec<Vec<Stmt>> = vec![
        vec![Stmt::CtStateNew, Stmt::Jump("target".into())],
        vec![Stmt::CtStatusDnat, Stmt::Goto("target".into())],
        vec![
            addr_stmt(AddrField::Saddr, false, AddrValue::Net(net(a.aligned))),
            Stmt::Accept,
        ],
        vec![
            addr_stmt(AddrField::Saddr, true, AddrValue::Net(net(a.unaligned))),
            Stmt::Drop,
        ],
        vec![
            addr_stmt(AddrField::Daddr, false, AddrValue::Net(host(a.a))),
            Stmt::Return,
        ],
        vec![
            addr_stmt(AddrField::Daddr, true, AddrValue::Net(family.loopback())),
            Stmt::Reject,
        ],
        vec![
            addr_stmt(AddrField::Saddr, false, AddrValue::Net(net(a.everything))),
            Stmt::Accept,
        ],
        vec![
            addr_stmt(
                AddrField::Daddr,
                false,
                AddrValue::Named("cluster-ips".into()),
            ),
            Stmt::Reject,
        ],
        vec![
            addr_stmt(
                AddrField::Saddr,
                true,
                AddrValue::Named("cluster-ips".into()),
            ),
            Stmt::Accept,
        ],
        vec![
            addr_stmt(
                AddrField::Saddr,
                false,
                AddrValue::Anonymous(vec![host(a.b), host(a.a)]),
            ),
            Stmt::Accept,
        ],
        vec![
            addr_stmt(
                AddrField::Saddr,
                true,
                AddrValue::Anonymous(vec![net(a.unaligned), host(a.b)]),
            ),
            Stmt::Drop,
        ],
        vec![
            addr_stmt(
                AddrField::Daddr,
                false,
                AddrValue::Anonymous(vec![
                    net(a.range),
                    net(a.inside),
                    net(a.adjacent),
                    net(a.top),
                ]),
            ),
            Stmt::Drop,
        ],
        vec![
            addr_stmt(
                AddrField::Daddr,
                false,
                AddrValue::Anonymous(vec![net(a.aligned)]),
            ),
            Stmt::Drop,
        ],
        vec![Stmt::FibLocal(AddrField::Saddr), Stmt::Accept],
        vec![Stmt::FibLocal(AddrField::Daddr), Stmt::Accept],
        vec![
            Stmt::Iifname {
                negate: false,
                name: "cbr0".into(),
            },
            Stmt::Accept,
        ],
        vec![
            Stmt::Iifname {
                negate: true,
                name: "cbr0".into(),
            },
            Stmt::MarkSetOr(1 << 14),
        ],
        vec![
            Stmt::Iifname {
                negate: true,
                name: "veth*".into(),
            },
            Stmt::MarkSetOr(1 << 14),
        ],
        vec![
            Stmt::MarkAnyOf(1 << 14),
            Stmt::MarkSetXor(1 << 14),
            Stmt::Masquerade,
        ],
        vec![Stmt::L4Proto(Protocol::Tcp), Stmt::Accept],
        vec![Stmt::L4Proto(Protocol::Udp), Stmt::Accept],
        vec![Stmt::L4Proto(Protocol::Sctp), Stmt::Accept],
        vec![
            Stmt::CtStatusDnat,
            Stmt::HairpinLookup("hairpin".into()),
            Stmt::Masquerade,
        ],
        vec![Stmt::UpdateSaddr("affinity".into())],
        vec![Stmt::NamedCounter("hits".into())],
        vec![Stmt::Vmap {
            key: VmapKey::DaddrProtoPort,
            map: "vips".into(),
        }],
        vec![
            Stmt::FibLocal(AddrField::Daddr),
            Stmt::Vmap {
                key: VmapKey::ProtoPort,
                map: "ports".into(),
            },
        ],
        vec![Stmt::PickVmap {
            pick: Pick::Random,
            chains: vec!["target".into()],
        }],
        vec![Stmt::PickVmap {
            pick: Pick::Random,
            chains: vec!["target".into(), "c".into(), "target".into()],
        }],
        vec![Stmt::PickVmap {
            pick: Pick::RoundRobin,
            chains: vec!["target".into(), "c".into()],
        }],
        vec![Stmt::PickVmap {
            pick: Pick::SourceHash,
            chains: vec!["target".into(), "c".into(), "target".into()],
        }],
    ];
    for stmts in rules {
        tx.add_rule("c", Rule::new(stmts));
    }
    tx.add_rule(
        "c",
        Rule::with_comment(
            vec![Stmt::Reject],
            "Reject traffic to invalid ports of ClusterIPs",
        ),
    );
    tx.add_rule(
        "nat",
        Rule::new(vec![
            Stmt::L4Proto(Protocol::Udp),
            Stmt::Dnat {
                addr: a.a,
                port: 53,
            },
        ]),
    );
    tx.add_rule(
        "nat",
        Rule::with_comment(
            vec![
                Stmt::L4Proto(Protocol::Tcp),
                Stmt::PickDnat {
                    pick: Pick::Random,
                    targets: vec![(a.a, 80), (a.b, 8080)],
                },
            ],
            "two endpoints",
        ),
    );
    for pick in [Pick::RoundRobin, Pick::SourceHash] {
        tx.add_rule(
            "nat",
            Rule::new(vec![
                Stmt::L4Proto(Protocol::Tcp),
                Stmt::PickDnat {
                    pick,
                    targets: vec![(a.a, 80), (a.b, 8080)],
                },
            ]),
        );
    }
    tx
}

/// A flow suite's full sync, and a partial sync after it (a changed Service, another
/// removed, so chains are flushed and elements deleted and added).
fn syncs(family: IpFamily) -> (Transaction, Transaction) {
    let suite = suites(family)
        .into_iter()
        .find(|s| s.name.contains("hairpin"))
        .or_else(|| suites(family).into_iter().next())
        .expect("a suite");
    let mut view = KernelView::new();
    let full = suite
        .scenario
        .plan(&view, &suite.settings, SyncKind::Full, &HashSet::new());
    let full_tx = full.tx.clone();
    view.commit(full, std::time::Instant::now());
    let mut scenario = suite.scenario;
    // The first two Services, in order: the first changes, the second goes.
    let names: Vec<ServiceName> = scenario.services.keys().take(2).cloned().collect();
    let changed: HashSet<ServiceName> = names.iter().cloned().collect();
    let net = Net::of(family);
    let mut names = names.iter();
    if let Some(first) = names.next() {
        if let Some(ports) = scenario.services.get_mut(first) {
            for port in ports.iter_mut() {
                port.external_ips.push(net.ext(7));
            }
        }
    }
    if let Some(second) = names.next() {
        scenario.services.remove(second);
    }
    let partial = scenario.plan(&view, &suite.settings, SyncKind::Partial, &changed);
    (full_tx, partial.tx)
}

pub fn all() -> Vec<Fixture> {
    let mut out = Vec::new();
    for (family, tag) in [(IpFamily::V4, "v4"), (IpFamily::V6, "v6")] {
        out.push(Fixture {
            name: format!("objects-{tag}"),
            tx: objects(family),
            setup: None,
        });
        out.push(Fixture {
            name: format!("statements-{tag}"),
            tx: statements(family),
            setup: None,
        });
        let (full, partial) = syncs(family);
        out.push(Fixture {
            name: format!("partial-sync-{tag}"),
            tx: partial,
            setup: Some(full.clone()),
        });
        out.push(Fixture {
            name: format!("full-sync-{tag}"),
            tx: full,
            setup: None,
        });
    }
    out
}
