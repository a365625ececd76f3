//! Walks a new connection's first packet through a family's table, as netfilter would, and
//! says where it goes: every endpoint a DNAT may pick (all of a random pick's choices),
//! whether it is masqueraded on the way, or that it is dropped or rejected, and the rules
//! it matched. The table is either one the proxy rendered (tests) or one read from the
//! kernel (`kube-proxy trace`), so both answer the same question the same way.
//!
//! The hooks, in netfilter's order: a packet that arrives (from a pod or from outside) goes
//! through `filter-prerouting-pre-dnat` and `nat-prerouting`, then `filter-input` when its
//! (translated) destination is this node, else `filter-forward` and `nat-postrouting`. A
//! packet the node itself sends goes through `filter-output-pre-dnat`, `nat-output`,
//! `filter-output` and `nat-postrouting`.

use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;

use crate::kube_proxy::model::Protocol;
use crate::kube_proxy::nft::objects::{Key, Verdict};
use crate::kube_proxy::nft::rule::{AddrField, AddrValue, Rule, Stmt, VmapKey};
use crate::kube_proxy::nft::table::Table;
use crate::kube_proxy::ruleset::skeleton::{
    FILTER_FORWARD, FILTER_INPUT, FILTER_OUTPUT, FILTER_OUTPUT_PRE_DNAT,
    FILTER_PREROUTING_PRE_DNAT, NAT_OUTPUT, NAT_POSTROUTING, NAT_PREROUTING,
};

/// The first packet of a new connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packet {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub protocol: Protocol,
    pub port: u16,
    /// The interface it arrived on (for interface-based local-traffic detection).
    pub iif: Option<String>,
}

/// The node's own addresses: `fib ... type local`, and who sends from the host.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeAddrs {
    pub local: BTreeSet<IpAddr>,
}

impl NodeAddrs {
    pub fn new(addrs: impl IntoIterator<Item = IpAddr>) -> NodeAddrs {
        NodeAddrs {
            local: addrs.into_iter().collect(),
        }
    }

    fn is_local(&self, ip: &IpAddr) -> bool {
        ip.is_loopback() || self.local.contains(ip)
    }
}

/// How a traced packet ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    Accepted,
    Dropped,
    Rejected,
}

/// One way the packet may go (a random pick among endpoints gives several).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Branch {
    /// The translated destination, if a DNAT rule matched.
    pub endpoint: Option<(IpAddr, u16)>,
    pub masquerade: bool,
    pub fate: Fate,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    pub branches: Vec<Branch>,
    /// The rules matched, as `chain: rule`, in order.
    pub path: Vec<String>,
    /// Statements the tracer does not know (read from a kernel); rules holding them were
    /// treated as not matching.
    pub unknown: Vec<String>,
}

impl Outcome {
    /// Upstream's tracer's summary: the endpoints (`10.0.0.1:80, 10.0.0.2:80`), or
    /// `ACCEPT`, `DROP` or `REJECT`.
    pub fn summary(&self) -> String {
        let endpoints: Vec<String> = self
            .branches
            .iter()
            .filter(|b| b.fate == Fate::Accepted)
            .filter_map(|b| b.endpoint)
            .map(|(ip, port)| match ip {
                IpAddr::V4(ip) => format!("{ip}:{port}"),
                IpAddr::V6(ip) => format!("[{ip}]:{port}"),
            })
            .collect();
        if !endpoints.is_empty() {
            return endpoints.join(", ");
        }
        match self.branches.first().map(|b| b.fate) {
            Some(Fate::Dropped) => "DROP".into(),
            Some(Fate::Rejected) => "REJECT".into(),
            _ => "ACCEPT".into(),
        }
    }

    /// Whether the packet is masqueraded (on the first way it may go, as upstream's tracer).
    pub fn masquerade(&self) -> bool {
        self.branches.first().is_some_and(|b| b.masquerade)
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for step in &self.path {
            writeln!(f, "  {step}")?;
        }
        for branch in &self.branches {
            match (branch.fate, branch.endpoint) {
                (Fate::Accepted, Some((ip, port))) => {
                    let to = match ip {
                        IpAddr::V4(ip) => format!("{ip}:{port}"),
                        IpAddr::V6(ip) => format!("[{ip}]:{port}"),
                    };
                    writeln!(
                        f,
                        "-> {to}{}",
                        if branch.masquerade {
                            " (masqueraded: the endpoint sees the node's address)"
                        } else {
                            " (source kept)"
                        }
                    )?;
                }
                (Fate::Accepted, None) => writeln!(
                    f,
                    "-> accepted, not translated: no Service rule matched{}",
                    if branch.masquerade {
                        " (masqueraded)"
                    } else {
                        ""
                    }
                )?,
                (Fate::Dropped, _) => writeln!(f, "-> DROP")?,
                (Fate::Rejected, _) => writeln!(
                    f,
                    "-> REJECT (the client sees connection refused or port unreachable)"
                )?,
            }
        }
        for unknown in &self.unknown {
            writeln!(f, "  (not understood, treated as not matching: {unknown})")?;
        }
        Ok(())
    }
}

/// Where a chain walk ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flow {
    /// Fell off the end, or returned.
    Continue,
    Accept,
    Drop,
    Reject,
}

#[derive(Clone)]
struct State {
    dst: IpAddr,
    port: u16,
    mark: u32,
    dnat: bool,
    masquerade: bool,
    targets: Vec<(IpAddr, u16)>,
}

struct Tracer<'a> {
    table: &'a Table,
    node: &'a NodeAddrs,
    packet: &'a Packet,
    path: Vec<String>,
    unknown: Vec<String>,
}

/// Traces `packet` through `table`.
pub fn trace(table: &Table, node: &NodeAddrs, packet: &Packet) -> Outcome {
    let mut tracer = Tracer {
        table,
        node,
        packet,
        path: Vec::new(),
        unknown: Vec::new(),
    };
    let from_host = packet.src.is_loopback() || node.local.contains(&packet.src);
    let (pre_dnat, nat) = if from_host {
        (FILTER_OUTPUT_PRE_DNAT, NAT_OUTPUT)
    } else {
        (FILTER_PREROUTING_PRE_DNAT, NAT_PREROUTING)
    };
    let mut state = State {
        dst: packet.dst,
        port: packet.port,
        mark: 0,
        dnat: false,
        masquerade: false,
        targets: Vec::new(),
    };
    let mut branches = Vec::new();
    match tracer.base(pre_dnat, &mut state) {
        Flow::Drop => branches.push(ended(Fate::Dropped)),
        Flow::Reject => branches.push(ended(Fate::Rejected)),
        Flow::Continue | Flow::Accept => {
            let _ = tracer.base(nat, &mut state);
            let targets = std::mem::take(&mut state.targets);
            let ways: Vec<Option<(IpAddr, u16)>> = if targets.is_empty() {
                vec![None]
            } else {
                targets.into_iter().map(Some).collect()
            };
            for way in ways {
                let mut s = state.clone();
                if let Some((ip, port)) = way {
                    s.dst = ip;
                    s.port = port;
                    s.dnat = true;
                }
                branches.push(tracer.after_nat(from_host, way, s));
            }
        }
    }
    Outcome {
        branches,
        path: tracer.path,
        unknown: tracer.unknown,
    }
}

fn ended(fate: Fate) -> Branch {
    Branch {
        endpoint: None,
        masquerade: false,
        fate,
    }
}

impl Tracer<'_> {
    fn after_nat(&mut self, from_host: bool, way: Option<(IpAddr, u16)>, mut s: State) -> Branch {
        let local = self.node.is_local(&s.dst);
        // The node's own packets leave through output and postrouting; one for a local
        // address comes back in through loopback, to input. Others are routed: to input
        // when for this node, else forwarded and through postrouting.
        let steps: &[&str] = match (from_host, local) {
            (true, true) => &[FILTER_OUTPUT, NAT_POSTROUTING, FILTER_INPUT],
            (true, false) => &[FILTER_OUTPUT, NAT_POSTROUTING],
            (false, true) => &[FILTER_INPUT],
            (false, false) => &[FILTER_FORWARD, NAT_POSTROUTING],
        };
        for chain in steps {
            let fate = match self.base(chain, &mut s) {
                Flow::Drop => Fate::Dropped,
                Flow::Reject => Fate::Rejected,
                Flow::Continue | Flow::Accept => continue,
            };
            return Branch {
                endpoint: way,
                masquerade: false,
                fate,
            };
        }
        Branch {
            endpoint: way,
            masquerade: s.masquerade,
            fate: Fate::Accepted,
        }
    }

    /// Runs a base chain (absent: nothing happens).
    fn base(&mut self, chain: &str, s: &mut State) -> Flow {
        if !self.table.chains.contains_key(chain) {
            return Flow::Continue;
        }
        self.run(chain, s, 0)
    }

    fn run(&mut self, chain: &str, s: &mut State, depth: usize) -> Flow {
        let Some(rules) = self.table.chains.get(chain).map(|c| &c.rules) else {
            self.unknown
                .push(format!("a jump to the missing chain {chain}"));
            return Flow::Continue;
        };
        if depth > 32 {
            self.unknown
                .push(format!("chains nested too deep at {chain}"));
            return Flow::Continue;
        }
        for rule in rules {
            match self.rule(chain, rule, s, depth) {
                RuleFlow::NoMatch | RuleFlow::Next => {}
                RuleFlow::Return => return Flow::Continue,
                RuleFlow::End(flow) => return flow,
            }
        }
        Flow::Continue
    }

    fn rule(&mut self, chain: &str, rule: &Rule, s: &mut State, depth: usize) -> RuleFlow {
        for stmt in &rule.stmts {
            let matched = match stmt {
                Stmt::CtStateNew => true,
                Stmt::CtStatusDnat => s.dnat,
                Stmt::Addr {
                    field,
                    negate,
                    value,
                } => {
                    let addr = self.addr(*field, s);
                    match self.addr_in(&addr, value) {
                        Some(hit) => hit != *negate,
                        None => return self.not_understood(chain, rule),
                    }
                }
                Stmt::FibLocal(field) => {
                    let addr = self.addr(*field, s);
                    match field {
                        AddrField::Saddr => self.node.local.contains(&addr),
                        AddrField::Daddr => self.node.is_local(&addr),
                    }
                }
                Stmt::Iifname { negate, name } => {
                    let iif = self.packet.iif.as_deref().unwrap_or("");
                    let hit = match name.strip_suffix('*') {
                        Some(prefix) => iif.starts_with(prefix),
                        None => iif == name,
                    };
                    hit != *negate
                }
                Stmt::MarkAnyOf(mask) => s.mark & mask != 0,
                Stmt::L4Proto(proto) => *proto == self.packet.protocol,
                Stmt::HairpinLookup(set) => {
                    let key = Key::Hairpin(self.packet.src, s.dst, self.packet.protocol, s.port);
                    match self.table.sets.get(set) {
                        Some(set) => set.elements.contains_key(&key),
                        None => return self.not_understood(chain, rule),
                    }
                }
                Stmt::MarkSetOr(bits) => {
                    s.mark |= bits;
                    true
                }
                Stmt::MarkSetXor(bits) => {
                    s.mark ^= bits;
                    true
                }
                Stmt::UpdateSaddr(_) | Stmt::NamedCounter(_) => true,
                Stmt::Other(text) => {
                    self.unknown.push(format!("{chain}: {text}"));
                    return RuleFlow::NoMatch;
                }
                terminal => {
                    self.step(chain, rule);
                    return self.terminal(chain, rule, terminal, s, depth);
                }
            };
            if !matched {
                return RuleFlow::NoMatch;
            }
        }
        self.step(chain, rule);
        RuleFlow::Next
    }

    fn terminal(
        &mut self,
        chain: &str,
        rule: &Rule,
        stmt: &Stmt,
        s: &mut State,
        depth: usize,
    ) -> RuleFlow {
        match stmt {
            Stmt::Masquerade => {
                s.masquerade = true;
                RuleFlow::End(Flow::Accept)
            }
            Stmt::Vmap { key, map } => {
                let key = match key {
                    VmapKey::DaddrProtoPort => Key::AddrPort(s.dst, self.packet.protocol, s.port),
                    VmapKey::ProtoPort => Key::Port(self.packet.protocol, s.port),
                };
                let Some(set) = self.table.sets.get(map) else {
                    return self.not_understood(chain, rule);
                };
                match set.elements.get(&key).and_then(|e| e.value.clone()) {
                    None => RuleFlow::NoMatch,
                    Some(verdict) => {
                        self.path.push(format!("  @{map} {key} : {verdict}"));
                        self.verdict(&verdict, s, depth)
                    }
                }
            }
            Stmt::PickVmap { chains, .. } => {
                // Every endpoint a random pick may choose.
                let base = s.clone();
                let mut targets = Vec::new();
                for target in chains {
                    let mut branch = base.clone();
                    let _ = self.run(target, &mut branch, depth + 1);
                    targets.extend(branch.targets);
                    s.mark |= branch.mark;
                }
                s.targets.extend(targets);
                RuleFlow::End(Flow::Accept)
            }
            Stmt::Dnat { addr, port } => {
                s.targets.push((*addr, *port));
                RuleFlow::End(Flow::Accept)
            }
            Stmt::PickDnat { targets, .. } => {
                s.targets.extend(targets.iter().copied());
                RuleFlow::End(Flow::Accept)
            }
            Stmt::Jump(target) => match self.run(target, s, depth + 1) {
                Flow::Continue => RuleFlow::Next,
                flow => RuleFlow::End(flow),
            },
            Stmt::Goto(target) => match self.run(target, s, depth + 1) {
                Flow::Continue => RuleFlow::Return,
                flow => RuleFlow::End(flow),
            },
            Stmt::Accept => RuleFlow::End(Flow::Accept),
            Stmt::Drop => RuleFlow::End(Flow::Drop),
            Stmt::Reject => RuleFlow::End(Flow::Reject),
            Stmt::Return => RuleFlow::Return,
            _ => RuleFlow::Next,
        }
    }

    fn verdict(&mut self, verdict: &Verdict, s: &mut State, depth: usize) -> RuleFlow {
        match verdict {
            Verdict::Goto(target) => match self.run(target, s, depth + 1) {
                Flow::Continue => RuleFlow::Return,
                flow => RuleFlow::End(flow),
            },
            Verdict::Jump(target) => match self.run(target, s, depth + 1) {
                Flow::Continue => RuleFlow::Next,
                flow => RuleFlow::End(flow),
            },
            Verdict::Drop => RuleFlow::End(Flow::Drop),
            Verdict::Accept => RuleFlow::End(Flow::Accept),
        }
    }

    fn addr(&self, field: AddrField, s: &State) -> IpAddr {
        match field {
            AddrField::Saddr => self.packet.src,
            AddrField::Daddr => s.dst,
        }
    }

    /// Whether `addr` is in `value`; `None` when a named set is missing.
    fn addr_in(&self, addr: &IpAddr, value: &AddrValue) -> Option<bool> {
        Some(match value {
            AddrValue::Net(net) => net.contains(addr),
            AddrValue::Anonymous(nets) => nets.iter().any(|n| n.contains(addr)),
            AddrValue::Named(set) => self
                .table
                .sets
                .get(set)?
                .elements
                .contains_key(&Key::Addr(*addr)),
        })
    }

    fn step(&mut self, chain: &str, rule: &Rule) {
        let mut text = rule.text(self.table.family);
        if let Some(comment) = &rule.comment {
            text.push_str(&format!(" comment {comment:?}"));
        }
        self.path.push(format!("{chain}: {text}"));
    }

    fn not_understood(&mut self, chain: &str, rule: &Rule) -> RuleFlow {
        self.unknown
            .push(format!("{chain}: {}", rule.text(self.table.family)));
        RuleFlow::NoMatch
    }
}

enum RuleFlow {
    NoMatch,
    /// The rule matched and did not end the chain.
    Next,
    /// Back to the calling chain (a `goto` target fell off its end, or `return`).
    Return,
    End(Flow),
}

// TESTS-PENDING
