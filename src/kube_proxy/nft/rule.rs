//! A rule as the proxy writes it: an ordered list of statements (matches, actions, one
//! verdict), typed so that the same value is written into a transaction (`render`, in
//! upstream's spelling), read back from the kernel (`json`), and walked by the tracer.
//! Only the statements a kube-proxy ruleset holds exist here; anything else read from a
//! kernel is kept as `Stmt::Other` with its text, which the tracer reports rather than
//! guesses.

use std::fmt::Write as _;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::kube_proxy::model::{IpFamily, Protocol};

/// `saddr` or `daddr` of the family's IP header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AddrField {
    Saddr,
    Daddr,
}

impl AddrField {
    fn word(self) -> &'static str {
        match self {
            AddrField::Saddr => "saddr",
            AddrField::Daddr => "daddr",
        }
    }
}

/// What an address is compared with.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum AddrValue {
    /// One address (`::1`) or prefix (`127.0.0.0/8`); a host prefix is written as an address.
    Net(IpNet),
    /// An anonymous set: `{ 10.0.0.0/8 , 1.2.3.4 }`.
    Anonymous(Vec<IpNet>),
    /// A named set: `@cluster-ips`.
    Named(String),
}

/// The key of a verdict-map lookup.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum VmapKey {
    /// `ip daddr . meta l4proto . th dport`
    DaddrProtoPort,
    /// `meta l4proto . th dport`
    ProtoPort,
}

/// How a rule picks one of several endpoints for a new connection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Pick {
    /// `numgen random`: uniformly at random (upstream's nftables and iptables modes).
    #[default]
    Random,
    /// `numgen inc`: the next one each time (IPVS's rr and wrr, all weights being 1).
    RoundRobin,
    /// `jhash ip saddr ... seed 0x0`: by the client's address (IPVS's sh and mh).
    SourceHash,
}

impl Pick {
    fn render(self, family: IpFamily, n: usize, out: &mut String) {
        let _ = match self {
            Pick::Random => write!(out, "numgen random mod {n}"),
            Pick::RoundRobin => write!(out, "numgen inc mod {n}"),
            Pick::SourceHash => write!(out, "jhash {} saddr mod {n} seed 0x0", family.nft()),
        };
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Stmt {
    /// `ct state new`
    CtStateNew,
    /// `ct status dnat`
    CtStatusDnat,
    /// `ip saddr [!=] <value>`
    Addr {
        field: AddrField,
        negate: bool,
        value: AddrValue,
    },
    /// `fib saddr|daddr type local`
    FibLocal(AddrField),
    /// `iifname [!=] <name>`; a name ending in `*` is a prefix.
    Iifname {
        negate: bool,
        name: String,
    },
    /// `mark and <mask> != 0`
    MarkAnyOf(u32),
    /// `meta l4proto <protocol>`
    L4Proto(Protocol),
    /// `ip saddr . ip daddr . meta l4proto . th dport @<set>`
    HairpinLookup(String),
    /// `mark set mark or <bits>`
    MarkSetOr(u32),
    /// `mark set mark xor <bits>`
    MarkSetXor(u32),
    /// `masquerade fully-random`
    Masquerade,
    /// `update @<set> { ip saddr }`
    UpdateSaddr(String),
    /// `counter name "<name>"`
    NamedCounter(String),
    /// `<key> vmap @<map>`
    Vmap {
        key: VmapKey,
        map: String,
    },
    /// `numgen random mod N vmap { 0 : goto <chain> , ... }` (or another `Pick`)
    PickVmap {
        pick: Pick,
        chains: Vec<String>,
    },
    /// `dnat to <ip>:<port>`
    Dnat {
        addr: IpAddr,
        port: u16,
    },
    /// `dnat ip addr . port to numgen random mod N map { 0 : <ip> . <port> , ... }` (or
    /// another `Pick`)
    PickDnat {
        pick: Pick,
        targets: Vec<(IpAddr, u16)>,
    },
    Jump(String),
    Goto(String),
    Accept,
    Drop,
    Reject,
    Return,
    /// A statement read from a kernel that no kube-proxy writes, with nft's JSON of it.
    Other(String),
}

impl Stmt {
    /// Whether the statement ends the rule's evaluation (a verdict, or a NAT statement, which
    /// accepts the packet in its hook).
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            Stmt::Vmap { .. }
                | Stmt::PickVmap { .. }
                | Stmt::Dnat { .. }
                | Stmt::PickDnat { .. }
                | Stmt::Jump(_)
                | Stmt::Goto(_)
                | Stmt::Accept
                | Stmt::Drop
                | Stmt::Reject
                | Stmt::Return
                | Stmt::Masquerade
        )
    }
}

/// One rule: its statements in order, and its comment.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Rule {
    pub stmts: Vec<Stmt>,
    pub comment: Option<String>,
}

impl Rule {
    pub fn new(stmts: Vec<Stmt>) -> Rule {
        Rule {
            stmts,
            comment: None,
        }
    }

    pub fn with_comment(stmts: Vec<Stmt>, comment: &str) -> Rule {
        Rule {
            stmts,
            comment: Some(comment.to_owned()),
        }
    }

    /// The rule's text in a transaction (without its comment), as upstream writes it.
    pub fn render(&self, family: IpFamily, out: &mut String) {
        for (i, stmt) in self.stmts.iter().enumerate() {
            if i > 0 {
                out.push(' ');
            }
            render_stmt(stmt, family, out);
        }
    }

    pub fn text(&self, family: IpFamily) -> String {
        let mut out = String::new();
        self.render(family, &mut out);
        out
    }

    /// How many anonymous sets and maps the kernel creates for this rule (its inline
    /// `{ ... }`: a numgen map, a set of several prefixes).
    pub fn anonymous_sets(&self) -> usize {
        self.stmts
            .iter()
            .filter(|stmt| match stmt {
                Stmt::PickVmap { .. } | Stmt::PickDnat { .. } => true,
                Stmt::Addr {
                    value: AddrValue::Anonymous(nets),
                    ..
                } => nets.len() > 1,
                _ => false,
            })
            .count()
    }
}

/// A mark as upstream formats it: Go's `%#08x`, so `0x00004000` for bit 14.
pub fn mark_text(mark: u32) -> String {
    format!("{mark:#010x}")
}

/// A prefix, or the address alone for a host prefix (upstream writes `::1` for IPv6
/// loopback; the kernel stores a /32 and a bare address alike).
fn net_text(net: &IpNet, out: &mut String) {
    if net.prefix_len() == net.max_prefix_len() {
        let _ = write!(out, "{}", net.addr());
    } else {
        let _ = write!(out, "{}/{}", net.addr(), net.prefix_len());
    }
}

fn render_stmt(stmt: &Stmt, family: IpFamily, out: &mut String) {
    let ip = family.nft();
    match stmt {
        Stmt::CtStateNew => out.push_str("ct state new"),
        Stmt::CtStatusDnat => out.push_str("ct status dnat"),
        Stmt::Addr {
            field,
            negate,
            value,
        } => {
            let _ = write!(out, "{ip} {}", field.word());
            if *negate {
                out.push_str(" !=");
            }
            match value {
                AddrValue::Net(net) => {
                    out.push(' ');
                    net_text(net, out);
                }
                AddrValue::Anonymous(nets) => {
                    out.push_str(" {");
                    for (i, net) in nets.iter().enumerate() {
                        out.push_str(if i == 0 { " " } else { " , " });
                        net_text(net, out);
                    }
                    out.push_str(" }");
                }
                AddrValue::Named(set) => {
                    let _ = write!(out, " @{set}");
                }
            }
        }
        Stmt::FibLocal(field) => {
            let _ = write!(out, "fib {} type local", field.word());
        }
        Stmt::Iifname { negate, name } => {
            out.push_str("iifname ");
            if *negate {
                out.push_str("!= ");
            }
            out.push_str(name);
        }
        Stmt::MarkAnyOf(mask) => {
            let _ = write!(out, "mark and {} != 0", mark_text(*mask));
        }
        Stmt::L4Proto(proto) => {
            let _ = write!(out, "meta l4proto {}", proto.nft());
        }
        Stmt::HairpinLookup(set) => {
            let _ = write!(
                out,
                "{ip} saddr . {ip} daddr . meta l4proto . th dport @{set}"
            );
        }
        Stmt::MarkSetOr(bits) => {
            let _ = write!(out, "mark set mark or {}", mark_text(*bits));
        }
        Stmt::MarkSetXor(bits) => {
            let _ = write!(out, "mark set mark xor {}", mark_text(*bits));
        }
        Stmt::Masquerade => out.push_str("masquerade fully-random"),
        Stmt::UpdateSaddr(set) => {
            let _ = write!(out, "update @{set} {{ {ip} saddr }}");
        }
        Stmt::NamedCounter(name) => {
            let _ = write!(out, "counter name {name:?}");
        }
        Stmt::Vmap { key, map } => {
            match key {
                VmapKey::DaddrProtoPort => {
                    let _ = write!(out, "{ip} daddr . meta l4proto . th dport");
                }
                VmapKey::ProtoPort => out.push_str("meta l4proto . th dport"),
            }
            let _ = write!(out, " vmap @{map}");
        }
        Stmt::PickVmap { pick, chains } => {
            pick.render(family, chains.len(), out);
            out.push_str(" vmap {");
            for (i, chain) in chains.iter().enumerate() {
                if i > 0 {
                    out.push_str(" ,");
                }
                let _ = write!(out, " {i} : goto {chain}");
            }
            out.push_str(" }");
        }
        Stmt::Dnat { addr, port } => match addr {
            IpAddr::V4(a) => {
                let _ = write!(out, "dnat to {a}:{port}");
            }
            IpAddr::V6(a) => {
                let _ = write!(out, "dnat to [{a}]:{port}");
            }
        },
        Stmt::PickDnat { pick, targets } => {
            let _ = write!(out, "dnat {ip} addr . port to ");
            pick.render(family, targets.len(), out);
            out.push_str(" map {");
            for (i, (addr, port)) in targets.iter().enumerate() {
                if i > 0 {
                    out.push_str(" ,");
                }
                let _ = write!(out, " {i} : {addr} . {port}");
            }
            out.push_str(" }");
        }
        Stmt::Jump(chain) => {
            let _ = write!(out, "jump {chain}");
        }
        Stmt::Goto(chain) => {
            let _ = write!(out, "goto {chain}");
        }
        Stmt::Accept => out.push_str("accept"),
        Stmt::Drop => out.push_str("drop"),
        Stmt::Reject => out.push_str("reject"),
        Stmt::Return => out.push_str("return"),
        Stmt::Other(text) => out.push_str(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(stmts: Vec<Stmt>, family: IpFamily) -> String {
        Rule::new(stmts).text(family)
    }

    #[test]
    fn rules_read_as_upstream_writes_them() {
        let m = 1 << 14;
        assert_eq!(mark_text(m), "0x00004000");
        assert_eq!(
            text(
                vec![Stmt::MarkAnyOf(m), Stmt::MarkSetXor(m), Stmt::Masquerade],
                IpFamily::V4
            ),
            "mark and 0x00004000 != 0 mark set mark xor 0x00004000 masquerade fully-random"
        );
        assert_eq!(
            text(
                vec![
                    Stmt::CtStatusDnat,
                    Stmt::HairpinLookup("hairpin-connections".into()),
                    Stmt::Masquerade
                ],
                IpFamily::V6
            ),
            "ct status dnat ip6 saddr . ip6 daddr . meta l4proto . th dport @hairpin-connections masquerade fully-random"
        );
        assert_eq!(
            text(
                vec![
                    Stmt::FibLocal(AddrField::Daddr),
                    Stmt::Addr {
                        field: AddrField::Daddr,
                        negate: true,
                        value: AddrValue::Net(IpFamily::V6.loopback())
                    },
                    Stmt::Vmap {
                        key: VmapKey::ProtoPort,
                        map: "service-nodeports".into()
                    }
                ],
                IpFamily::V6
            ),
            "fib daddr type local ip6 daddr != ::1 meta l4proto . th dport vmap @service-nodeports"
        );
        assert_eq!(
            text(
                vec![
                    Stmt::L4Proto(Protocol::Tcp),
                    Stmt::PickDnat {
                        pick: Pick::Random,
                        targets: vec![
                            ("10.180.0.1".parse().unwrap(), 80),
                            ("10.180.0.2".parse().unwrap(), 80)
                        ]
                    }
                ],
                IpFamily::V4
            ),
            "meta l4proto tcp dnat ip addr . port to numgen random mod 2 map { 0 : 10.180.0.1 . 80 , 1 : 10.180.0.2 . 80 }"
        );
        assert_eq!(
            text(
                vec![
                    Stmt::L4Proto(Protocol::Udp),
                    Stmt::Dnat {
                        addr: "fd00::1".parse().unwrap(),
                        port: 53
                    }
                ],
                IpFamily::V6
            ),
            "meta l4proto udp dnat to [fd00::1]:53"
        );
        assert_eq!(
            text(
                vec![Stmt::PickVmap {
                    pick: Pick::Random,
                    chains: vec!["endpoint-a".into(), "endpoint-b".into()]
                }],
                IpFamily::V4
            ),
            "numgen random mod 2 vmap { 0 : goto endpoint-a , 1 : goto endpoint-b }"
        );
        assert_eq!(
            text(
                vec![Stmt::PickVmap {
                    pick: Pick::SourceHash,
                    chains: vec!["a".into(), "b".into()]
                }],
                IpFamily::V6
            ),
            "jhash ip6 saddr mod 2 seed 0x0 vmap { 0 : goto a , 1 : goto b }"
        );
        assert_eq!(
            text(
                vec![Stmt::PickDnat {
                    pick: Pick::RoundRobin,
                    targets: vec![
                        ("10.0.0.1".parse().unwrap(), 80),
                        ("10.0.0.2".parse().unwrap(), 80)
                    ]
                }],
                IpFamily::V4
            ),
            "dnat ip addr . port to numgen inc mod 2 map { 0 : 10.0.0.1 . 80 , 1 : 10.0.0.2 . 80 }"
        );
        assert_eq!(
            text(
                vec![
                    Stmt::Addr {
                        field: AddrField::Saddr,
                        negate: true,
                        value: AddrValue::Anonymous(vec![
                            "203.0.113.0/25".parse().unwrap(),
                            "5.6.7.8/32".parse().unwrap()
                        ])
                    },
                    Stmt::Drop
                ],
                IpFamily::V4
            ),
            "ip saddr != { 203.0.113.0/25 , 5.6.7.8 } drop"
        );
        assert_eq!(
            text(
                vec![
                    Stmt::Iifname {
                        negate: true,
                        name: "veth*".into()
                    },
                    Stmt::MarkSetOr(m)
                ],
                IpFamily::V4
            ),
            "iifname != veth* mark set mark or 0x00004000"
        );
        assert_eq!(
            text(vec![Stmt::UpdateSaddr("affinity-x".into())], IpFamily::V4),
            "update @affinity-x { ip saddr }"
        );
    }
}
