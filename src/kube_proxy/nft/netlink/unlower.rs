//! A rule's expressions read back into statements: the inverse of `lower`.
//!
//! Each statement is recognised by the expressions it starts with, then checked: lowered
//! again, it must give exactly the expressions read (registers, lengths, masks, operators),
//! with only what the kernel adds or drops set aside (set ids, the numbers of anonymous sets,
//! the NAT flags it infers, the operator it always reports on a mask). So whatever `lower`
//! writes reads back as the statement it came from, and nothing else does: expressions no
//! statement lowers to become `Stmt::Other`, which equals no statement the proxy wants, and
//! the rule is written again.
//!
//! The contents of a rule's anonymous sets and maps (`{ ... }`, `numgen ... map { ... }`) are
//! read back too: an interval set as the prefixes covering its ranges, the form
//! `canon::kernel_form` gives the statements the proxy wants.

use std::collections::HashMap;
use std::net::IpAddr;

use ipnet::IpNet;

use super::consts::*;
use super::decode::{address, RawElement, RawSet};
use super::element::ElementValue;
use super::expr::{Data, Expr, Reg};
use super::lower::{self, SetIds};
use super::sets::FamilyInfo;
use super::unexpr::{canonical, Item};
use crate::kube_proxy::nft::rule::{AddrField, AddrValue, Pick, Rule, Stmt, VmapKey};

/// An anonymous set or map of the table, with its elements.
#[derive(Clone, Debug)]
pub struct Anonymous {
    pub set: RawSet,
    pub elements: Vec<RawElement>,
}

struct NoIds;

impl SetIds for NoIds {
    fn named(&mut self, _: &str) -> u32 {
        0
    }
    fn fresh(&mut self) -> u32 {
        0
    }
}

/// Whether `stmt` lowers to exactly `items`.
fn lowers_to(family: FamilyInfo, stmt: &Stmt, items: &[Item]) -> bool {
    // An anonymous set's contents do not change the expressions, only its size does: one
    // prefix is a comparison. Any two stand for the rest.
    let probe = match stmt {
        Stmt::Addr {
            field,
            negate,
            value: AddrValue::Anonymous(_),
        } => {
            let any = IpNet::from(unspecified(family));
            Stmt::Addr {
                field: *field,
                negate: *negate,
                value: AddrValue::Anonymous(vec![any, any]),
            }
        }
        other => other.clone(),
    };
    let Ok(lowered) = lower::rule(family, &Rule::new(vec![probe]), &mut NoIds) else {
        return false;
    };
    lowered.exprs.len() == items.len()
        && lowered
            .exprs
            .iter()
            .zip(items)
            .all(|(want, have)| match have {
                Item::Known(have) => canonical(want) == canonical(have),
                Item::Unknown(_) => false,
            })
}

fn unspecified(family: FamilyInfo) -> IpAddr {
    if family.addr_len == 4 {
        IpAddr::from([0u8; 4])
    } else {
        IpAddr::from([0u8; 16])
    }
}

/// The statements of a rule's expressions.
pub fn statements(
    family: FamilyInfo,
    items: &[Item],
    anonymous: &HashMap<String, Anonymous>,
) -> Vec<Stmt> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < items.len() {
        let rest = &items[at..];
        match guess(family, rest, anonymous) {
            Some((stmt, n)) if lowers_to(family, &stmt, &rest[..n]) => {
                out.push(stmt);
                at += n;
            }
            _ => {
                let n = unknown_run(rest);
                out.push(Stmt::Other(describe(&rest[..n])));
                at += n;
            }
        }
    }
    out
}

/// Expressions up to the one that ends a statement (a comparison, a lookup, an action).
fn unknown_run(items: &[Item]) -> usize {
    let ends = |item: &Item| match item {
        Item::Known(
            Expr::Payload { .. }
            | Expr::Meta { .. }
            | Expr::Ct { .. }
            | Expr::Fib { .. }
            | Expr::Numgen { .. }
            | Expr::Jhash { .. }
            | Expr::Bitwise { .. },
        ) => false,
        Item::Known(Expr::Immediate { dreg, .. }) => *dreg == Reg::VERDICT,
        _ => true,
    };
    items.iter().position(ends).map_or(items.len(), |i| i + 1)
}

fn describe(items: &[Item]) -> String {
    let parts: Vec<String> = items
        .iter()
        .map(|i| match i {
            Item::Known(e) => format!("{e:?}"),
            Item::Unknown(name) => name.clone(),
        })
        .collect();
    format!("[nft expressions: {}]", parts.join("; "))
}

fn known(items: &[Item], i: usize) -> Option<&Expr> {
    match items.get(i)? {
        Item::Known(e) => Some(e),
        Item::Unknown(_) => None,
    }
}

/// A candidate statement for the expressions at the start of `items`, and how many it
/// spans; `lowers_to` decides.
fn guess(
    family: FamilyInfo,
    items: &[Item],
    anonymous: &HashMap<String, Anonymous>,
) -> Option<(Stmt, usize)> {
    let at = |i| known(items, i);
    let field_at = |offset: u32| {
        if offset == family.saddr_offset {
            Some(AddrField::Saddr)
        } else if offset == family.daddr_offset {
            Some(AddrField::Daddr)
        } else {
            None
        }
    };
    Some(match at(0)? {
        Expr::Ct { key, .. } if *key == NFT_CT_STATE => (Stmt::CtStateNew, 3),
        Expr::Ct { key, .. } if *key == NFT_CT_STATUS => (Stmt::CtStatusDnat, 3),
        Expr::Payload {
            base: NFT_PAYLOAD_NETWORK_HEADER,
            offset,
            len,
            dreg,
        } => {
            let field = field_at(*offset)?;
            let len = *len as usize;
            match (at(1)?, at(2), at(3)) {
                (Expr::Cmp { op, data, .. }, ..) => {
                    let mut bytes = data.clone();
                    bytes.resize(family.addr_len, 0);
                    let net = IpNet::new(address(&bytes)?, u8::try_from(len * 8).ok()?).ok()?;
                    (addr(field, *op, AddrValue::Net(net)), 2)
                }
                (Expr::Bitwise { mask, .. }, Some(Expr::Cmp { op, data, .. }), _) => {
                    let ones: u32 = mask.iter().map(|b| b.count_ones()).sum();
                    let net = IpNet::new(address(data)?, u8::try_from(ones).ok()?).ok()?;
                    (addr(field, *op, AddrValue::Net(net)), 3)
                }
                (Expr::Payload { .. }, Some(Expr::Meta { .. }), Some(Expr::Payload { .. })) => {
                    match at(4)? {
                        Expr::Lookup { set, .. } => (Stmt::HairpinLookup(set.name.clone()), 5),
                        _ => return None,
                    }
                }
                (Expr::Meta { .. }, Some(Expr::Payload { .. }), Some(Expr::Lookup { set, .. })) => {
                    (
                        Stmt::Vmap {
                            key: VmapKey::DaddrProtoPort,
                            map: set.name.clone(),
                        },
                        4,
                    )
                }
                (Expr::Dynset { set, .. }, ..) => (Stmt::UpdateSaddr(set.name.clone()), 2),
                (Expr::Lookup { set, invert, .. }, ..) => {
                    let value = match anonymous.get(&set.name) {
                        Some(anon) => AddrValue::Anonymous(anon_nets(family, anon)?),
                        None => AddrValue::Named(set.name.clone()),
                    };
                    (
                        Stmt::Addr {
                            field,
                            negate: *invert,
                            value,
                        },
                        2,
                    )
                }
                (Expr::Jhash { .. }, ..) if *dreg != Reg::FIRST => {
                    let (stmt, n) = pick(family, Pick::SourceHash, &items[2..], anonymous)?;
                    (stmt, n + 2)
                }
                _ => return None,
            }
        }
        Expr::Fib { flags, .. } => {
            let field = match *flags {
                NFTA_FIB_F_SADDR => AddrField::Saddr,
                NFTA_FIB_F_DADDR => AddrField::Daddr,
                _ => return None,
            };
            (Stmt::FibLocal(field), 2)
        }
        Expr::Meta { key, .. } => match (*key, at(1)?, at(2)) {
            (NFT_META_IIFNAME, Expr::Cmp { op, data, .. }, _) => {
                let exact = data.len() == 16;
                let name = data.strip_suffix(&[0]).unwrap_or(data);
                let name = std::str::from_utf8(name.split(|b| *b == 0).next()?).ok()?;
                let name = if exact {
                    name.to_owned()
                } else {
                    format!("{name}*")
                };
                let negate = *op == NFT_CMP_NEQ;
                (Stmt::Iifname { negate, name }, 2)
            }
            (NFT_META_MARK, Expr::Bitwise { mask, xor, .. }, Some(next)) => {
                let word = |b: &[u8]| Some(u32::from_ne_bytes(b.try_into().ok()?));
                let (mask, xor) = (word(mask)?, word(xor)?);
                match next {
                    Expr::Cmp { .. } => (Stmt::MarkAnyOf(mask), 3),
                    Expr::MetaSet { .. } if mask == u32::MAX => (Stmt::MarkSetXor(xor), 3),
                    Expr::MetaSet { .. } => (Stmt::MarkSetOr(xor), 3),
                    _ => return None,
                }
            }
            (NFT_META_L4PROTO, Expr::Cmp { data, .. }, _) => {
                (Stmt::L4Proto(super::decode::protocol(*data.first()?)?), 2)
            }
            (NFT_META_L4PROTO, Expr::Payload { .. }, Some(Expr::Lookup { set, .. })) => (
                Stmt::Vmap {
                    key: VmapKey::ProtoPort,
                    map: set.name.clone(),
                },
                3,
            ),
            _ => return None,
        },
        Expr::Masq { .. } => (Stmt::Masquerade, 1),
        Expr::Objref { name, .. } => (Stmt::NamedCounter(name.clone()), 1),
        Expr::Numgen { kind, .. } => {
            let pick_kind = match *kind {
                NFT_NG_RANDOM => Pick::Random,
                NFT_NG_INCREMENTAL => Pick::RoundRobin,
                _ => return None,
            };
            pick(family, pick_kind, &items[1..], anonymous).map(|(s, n)| (s, n + 1))?
        }
        Expr::Immediate {
            data: Data::Value(a),
            ..
        } => match (at(1)?, at(2)?) {
            (
                Expr::Immediate {
                    data: Data::Value(p),
                    ..
                },
                Expr::Nat { .. },
            ) => {
                let port = u16::from_be_bytes(p.as_slice().try_into().ok()?);
                let addr = address(a)?;
                (Stmt::Dnat { addr, port }, 3)
            }
            _ => return None,
        },
        Expr::Immediate {
            data: Data::Verdict { code, chain },
            ..
        } => {
            let stmt = match (*code, chain) {
                (NFT_JUMP, Some(c)) => Stmt::Jump(c.clone()),
                (NFT_GOTO, Some(c)) => Stmt::Goto(c.clone()),
                (NF_ACCEPT, None) => Stmt::Accept,
                (NF_DROP, None) => Stmt::Drop,
                (NFT_RETURN, None) => Stmt::Return,
                _ => return None,
            };
            (stmt, 1)
        }
        Expr::Reject { .. } => (Stmt::Reject, 1),
        _ => return None,
    })
}

fn addr(field: AddrField, op: u32, value: AddrValue) -> Stmt {
    Stmt::Addr {
        field,
        negate: op == NFT_CMP_NEQ,
        value,
    }
}

/// After the index is computed: the map lookup (and, for a DNAT map, the NAT).
fn pick(
    family: FamilyInfo,
    pick: Pick,
    items: &[Item],
    anonymous: &HashMap<String, Anonymous>,
) -> Option<(Stmt, usize)> {
    let Expr::Lookup { set, dreg, .. } = known(items, 0)? else {
        return None;
    };
    let map = anonymous.get(&set.name)?;
    let mut values: Vec<(u32, &ElementValue)> = map
        .elements
        .iter()
        .map(|e| {
            let key = u32::from_ne_bytes(e.key.as_slice().try_into().ok()?);
            Some((key, e.value.as_ref()?))
        })
        .collect::<Option<_>>()?;
    values.sort_by_key(|(k, _)| *k);
    if values
        .iter()
        .enumerate()
        .any(|(i, (k, _))| *k as usize != i)
    {
        return None;
    }
    if *dreg == Some(Reg::VERDICT) {
        let chains = values
            .iter()
            .map(|(_, v)| match v {
                ElementValue::Verdict {
                    code: NFT_GOTO,
                    chain: Some(c),
                } => Some(c.clone()),
                _ => None,
            })
            .collect::<Option<Vec<String>>>()?;
        return Some((Stmt::PickVmap { pick, chains }, 1));
    }
    let targets = values
        .iter()
        .map(|(_, v)| match v {
            ElementValue::Data(bytes) if bytes.len() == family.addr_len + 4 => {
                let (ip, port) = bytes.split_at(family.addr_len);
                Some((address(ip)?, u16::from_be_bytes([port[0], port[1]])))
            }
            _ => None,
        })
        .collect::<Option<Vec<(IpAddr, u16)>>>()?;
    Some((Stmt::PickDnat { pick, targets }, 2))
}

fn value(bytes: &[u8]) -> Option<u128> {
    match address(bytes)? {
        IpAddr::V4(a) => Some(u128::from(u32::from(a))),
        IpAddr::V6(a) => Some(u128::from(a)),
    }
}

/// An anonymous address set's contents: its addresses sorted (a hash set), or the prefixes
/// that cover its ranges (an interval set, as nft merged them).
fn anon_nets(family: FamilyInfo, anon: &Anonymous) -> Option<Vec<IpNet>> {
    if anon.set.key_len as usize != family.addr_len
        || anon.set.key_type != family.addr_type
        || anon.set.data.is_some()
        || anon
            .elements
            .iter()
            .any(|e| e.value.is_some() || e.odd.is_some())
    {
        return None;
    }
    if anon.set.flags & NFT_SET_INTERVAL == 0 {
        let mut nets: Vec<IpNet> = anon
            .elements
            .iter()
            .map(|e| address(&e.key).map(IpNet::from))
            .collect::<Option<_>>()?;
        nets.sort();
        nets.dedup();
        return Some(nets);
    }
    let max = if family.addr_len == 4 {
        u128::from(u32::MAX)
    } else {
        u128::MAX
    };
    let mut bounds: Vec<(u128, bool, bool)> = anon
        .elements
        .iter()
        .map(|e| Some((value(&e.key)?, e.interval_end, e.open)))
        .collect::<Option<_>>()?;
    // An end before a start at the same address.
    bounds.sort_by_key(|(v, end, _)| (*v, !*end));
    let mut ranges = Vec::new();
    let mut start = None;
    for (v, end, open) in bounds {
        if end {
            // The leading end at 0 closes nothing.
            if let Some(s) = start.take() {
                ranges.push((s, v.checked_sub(1)?));
            }
        } else {
            if start.is_some() {
                return None;
            }
            if open {
                ranges.push((v, max));
            } else {
                start = Some(v);
            }
        }
    }
    if let Some(s) = start {
        ranges.push((s, max));
    }
    Some(super::canon::covering(family.addr_len, &ranges))
}
