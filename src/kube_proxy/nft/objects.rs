//! The objects of the proxy's table and one transaction of operations on them, written as
//! `nft -f` reads them (knftables' spelling: one command per line, numeric priorities).

use std::fmt::{self, Write as _};
use std::net::IpAddr;

use super::rule::Rule;
use crate::kube_proxy::model::{IpFamily, Protocol};

/// Every object the proxy owns lives in this table, one per IP family.
pub const TABLE: &str = "kube-proxy";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChainType {
    Filter,
    Nat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Hook {
    Prerouting,
    Input,
    Forward,
    Output,
    Postrouting,
}

impl Hook {
    pub fn word(self) -> &'static str {
        match self {
            Hook::Prerouting => "prerouting",
            Hook::Input => "input",
            Hook::Forward => "forward",
            Hook::Output => "output",
            Hook::Postrouting => "postrouting",
        }
    }

    pub fn parse(word: &str) -> Option<Hook> {
        Some(match word {
            "prerouting" => Hook::Prerouting,
            "input" => Hook::Input,
            "forward" => Hook::Forward,
            "output" => Hook::Output,
            "postrouting" => Hook::Postrouting,
            _ => return None,
        })
    }
}

/// What hooks a base chain into netfilter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BaseChain {
    pub kind: ChainType,
    pub hook: Hook,
    pub priority: i32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SetKind {
    Set,
    Map,
}

impl SetKind {
    fn word(self) -> &'static str {
        match self {
            SetKind::Set => "set",
            SetKind::Map => "map",
        }
    }
}

/// A named set's or map's properties.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SetSpec {
    pub kind: SetKind,
    /// `ipv4_addr . inet_proto . inet_service`, and for a map ` : verdict` after it.
    pub key_type: String,
    pub flags: Vec<String>,
    pub timeout_secs: Option<u32>,
    pub comment: Option<String>,
}

/// An element's key, typed: every set and map of the table has one of these shapes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    /// `cluster-ips`, `nodeport-ips`, affinity sets.
    Addr(IpAddr),
    /// `service-ips`, `no-endpoint-services`, `firewall-ips`.
    AddrPort(IpAddr, Protocol, u16),
    /// `service-nodeports`, `no-endpoint-nodeports`.
    Port(Protocol, u16),
    /// `hairpin-connections`: source . destination . protocol . port.
    Hairpin(IpAddr, IpAddr, Protocol, u16),
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Key::Addr(ip) => write!(f, "{ip}"),
            Key::AddrPort(ip, proto, port) => write!(f, "{ip} . {} . {port}", proto.nft()),
            Key::Port(proto, port) => write!(f, "{} . {port}", proto.nft()),
            Key::Hairpin(a, b, proto, port) => write!(f, "{a} . {b} . {} . {port}", proto.nft()),
        }
    }
}

/// The verdict a map element holds.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    Goto(String),
    Jump(String),
    Drop,
    Accept,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Goto(chain) => write!(f, "goto {chain}"),
            Verdict::Jump(chain) => write!(f, "jump {chain}"),
            Verdict::Drop => f.write_str("drop"),
            Verdict::Accept => f.write_str("accept"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Object {
    Table {
        comment: Option<String>,
    },
    Chain {
        name: String,
        base: Option<BaseChain>,
        comment: Option<String>,
    },
    /// A named set or map. Flush and delete use only its kind and name.
    Set {
        name: String,
        spec: SetSpec,
    },
    Rule {
        chain: String,
        rule: Rule,
    },
    Element {
        set: String,
        key: Key,
        value: Option<Verdict>,
        comment: Option<String>,
    },
    Counter {
        name: String,
    },
}

impl Object {
    /// A chain by name only (for flush and delete, and for adding a regular chain).
    pub fn chain(name: impl Into<String>) -> Object {
        Object::Chain {
            name: name.into(),
            base: None,
            comment: None,
        }
    }

    /// A set or map by kind and name only (for flush and delete).
    pub fn set_named(kind: SetKind, name: impl Into<String>) -> Object {
        Object::Set {
            name: name.into(),
            spec: SetSpec {
                kind,
                key_type: String::new(),
                flags: Vec::new(),
                timeout_secs: None,
                comment: None,
            },
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    Add,
    Flush,
    Delete,
}

impl Verb {
    fn word(self) -> &'static str {
        match self {
            Verb::Add => "add",
            Verb::Flush => "flush",
            Verb::Delete => "delete",
        }
    }
}

/// One atomic change to a family's table: what one `nft -f -` applies or refuses whole.
#[derive(Clone, Debug)]
pub struct Transaction {
    pub family: IpFamily,
    pub ops: Vec<(Verb, Object)>,
    /// Where set, the netlink batch names the anonymous sets itself (`__set<n>`, `__map<n>`,
    /// counting from this) instead of asking the kernel for the lowest free number, which it
    /// finds by scanning every set of the table for each one. Only for a table whose every
    /// set name the writer knows: one it creates (`stages`).
    pub anonymous_names_from: Option<u32>,
}

impl Transaction {
    pub fn new(family: IpFamily) -> Transaction {
        Transaction {
            family,
            ops: Vec::new(),
            anonymous_names_from: None,
        }
    }

    pub fn add(&mut self, object: Object) {
        self.ops.push((Verb::Add, object));
    }

    pub fn flush(&mut self, object: Object) {
        self.ops.push((Verb::Flush, object));
    }

    pub fn delete(&mut self, object: Object) {
        self.ops.push((Verb::Delete, object));
    }

    pub fn add_rule(&mut self, chain: &str, rule: Rule) {
        self.add(Object::Rule {
            chain: chain.to_owned(),
            rule,
        });
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Writes the transaction as `nft -f` input, one command per line.
    pub fn render(&self, out: &mut String) {
        for (verb, object) in &self.ops {
            render_op(self.family, *verb, object, out);
            out.push('\n');
        }
    }

    pub fn text(&self) -> String {
        let mut out = String::new();
        self.render(&mut out);
        out
    }

    /// The first `n` lines of the transaction (for a log line about a refused one).
    pub fn head(&self, n: usize) -> String {
        let mut out = String::new();
        for (verb, object) in self.ops.iter().take(n) {
            render_op(self.family, *verb, object, &mut out);
            out.push('\n');
        }
        out
    }
}

pub fn render_op(family: IpFamily, verb: Verb, object: &Object, out: &mut String) {
    let fam = family.nft();
    let v = verb.word();
    match object {
        Object::Table { comment } => {
            let _ = write!(out, "{v} table {fam} {TABLE}");
            if verb == Verb::Add {
                if let Some(comment) = comment {
                    let _ = write!(out, " {{ comment {comment:?} ; }}");
                }
            }
        }
        Object::Chain {
            name,
            base,
            comment,
        } => {
            let _ = write!(out, "{v} chain {fam} {TABLE} {name}");
            if verb == Verb::Add && (base.is_some() || comment.is_some()) {
                out.push_str(" {");
                if let Some(base) = base {
                    let kind = match base.kind {
                        ChainType::Filter => "filter",
                        ChainType::Nat => "nat",
                    };
                    let _ = write!(
                        out,
                        " type {kind} hook {} priority {} ;",
                        base.hook.word(),
                        base.priority
                    );
                }
                if let Some(comment) = comment {
                    let _ = write!(out, " comment {comment:?} ;");
                }
                out.push_str(" }");
            }
        }
        Object::Set { name, spec } => {
            let _ = write!(out, "{v} {} {fam} {TABLE} {name}", spec.kind.word());
            if verb == Verb::Add {
                let _ = write!(out, " {{ type {} ;", spec.key_type);
                if !spec.flags.is_empty() {
                    let _ = write!(out, " flags {} ;", spec.flags.join(","));
                }
                if let Some(timeout) = spec.timeout_secs {
                    let _ = write!(out, " timeout {timeout}s ;");
                }
                if let Some(comment) = &spec.comment {
                    let _ = write!(out, " comment {comment:?} ;");
                }
                out.push_str(" }");
            }
        }
        Object::Rule { chain, rule } => {
            let _ = write!(out, "{v} rule {fam} {TABLE} {chain}");
            if verb == Verb::Add {
                out.push(' ');
                rule.render(family, out);
                if let Some(comment) = &rule.comment {
                    let _ = write!(out, " comment {comment:?}");
                }
            }
        }
        Object::Element {
            set,
            key,
            value,
            comment,
        } => {
            let _ = write!(out, "{v} element {fam} {TABLE} {set} {{ {key}");
            if verb == Verb::Add {
                if let Some(comment) = comment {
                    let _ = write!(out, " comment {comment:?}");
                }
                if let Some(value) = value {
                    let _ = write!(out, " : {value}");
                }
            }
            out.push_str(" }");
        }
        Object::Counter { name } => {
            let _ = write!(out, "{v} counter {fam} {TABLE} {name}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube_proxy::nft::rule::Stmt;

    #[test]
    fn operations_read_as_knftables_writes_them() {
        let mut tx = Transaction::new(IpFamily::V4);
        tx.add(Object::Table {
            comment: Some("rules for kube-proxy".into()),
        });
        tx.add(Object::Chain {
            name: "filter-prerouting-pre-dnat".into(),
            base: Some(BaseChain {
                kind: ChainType::Filter,
                hook: Hook::Prerouting,
                priority: -110,
            }),
            comment: None,
        });
        tx.flush(Object::chain("services"));
        tx.add(Object::Set {
            name: "affinity-x".into(),
            spec: SetSpec {
                kind: SetKind::Set,
                key_type: "ipv4_addr".into(),
                flags: vec!["dynamic".into(), "timeout".into()],
                timeout_secs: Some(10800),
                comment: None,
            },
        });
        tx.add(Object::Element {
            set: "no-endpoint-services".into(),
            key: Key::AddrPort("172.30.0.42".parse().unwrap(), Protocol::Tcp, 80),
            value: Some(Verdict::Goto("reject-chain".into())),
            comment: Some("ns2/svc2:p80".into()),
        });
        tx.delete(Object::Element {
            set: "cluster-ips".into(),
            key: Key::Addr("fd00::1".parse().unwrap()),
            value: None,
            comment: None,
        });
        tx.add_rule(
            "reject-chain",
            Rule::with_comment(vec![Stmt::Reject], "say \"no\""),
        );
        tx.delete(Object::set_named(SetKind::Map, "firewall-ips"));
        assert_eq!(
            tx.text(),
            "add table ip kube-proxy { comment \"rules for kube-proxy\" ; }\n\
             add chain ip kube-proxy filter-prerouting-pre-dnat { type filter hook prerouting priority -110 ; }\n\
             flush chain ip kube-proxy services\n\
             add set ip kube-proxy affinity-x { type ipv4_addr ; flags dynamic,timeout ; timeout 10800s ; }\n\
             add element ip kube-proxy no-endpoint-services { 172.30.0.42 . tcp . 80 comment \"ns2/svc2:p80\" : goto reject-chain }\n\
             delete element ip kube-proxy cluster-ips { fd00::1 }\n\
             add rule ip kube-proxy reject-chain reject comment \"say \\\"no\\\"\"\n\
             delete map ip kube-proxy firewall-ips\n"
        );
        assert_eq!(tx.len(), 8);
        assert_eq!(tx.head(1).lines().count(), 1);
    }
}
