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
use super::expr::{Data, Expr, Reg, SetRef};
use super::lower::{self, SetIds};
use super::parse::{Attrs, Malformed, Table};
use super::sets::{ElementValue, FamilyInfo};
use crate::kube_proxy::nft::rule::{AddrField, AddrValue, Pick, Rule, Stmt, VmapKey};

/// One expression of a rule: understood, or only named.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Item {
    Known(Expr),
    Unknown(String),
}

/// An anonymous set or map of the table, with its elements.
#[derive(Clone, Debug)]
pub struct Anonymous {
    pub set: RawSet,
    pub elements: Vec<RawElement>,
}

/// `NFTA_RULE_EXPRESSIONS`: each `{ NAME, DATA }`.
pub fn expressions(list: Attrs<'_>) -> Result<Vec<Item>, Malformed> {
    let mut out = Vec::new();
    for (_, elem) in list.each("rule expressions")? {
        let t = Attrs::new(elem).table("expression")?;
        let name = t.need_str(NFTA_EXPR_NAME)?;
        let data = match t.nest(NFTA_EXPR_DATA) {
            Some(d) => d.table("expression data")?,
            None => Attrs::new(&[]).table("expression data")?,
        };
        out.push(match expr(name, &data)? {
            Some(e) => Item::Known(e),
            None => Item::Unknown(name.to_owned()),
        });
    }
    Ok(out)
}

/// A register number as the kernel reports it, in nft's 32-bit units.
fn reg(wire: u32) -> Option<Reg> {
    match wire {
        NFT_REG_VERDICT => Some(Reg::VERDICT),
        1..=4 => Some(Reg(1 + 4 * (wire - 1))),
        8..=23 => Some(Reg(wire - 8 + 1)),
        _ => None,
    }
}

fn need_reg(t: &Table<'_>, kind: u16) -> Result<Option<Reg>, Malformed> {
    Ok(t.be32(kind)?.and_then(reg))
}

/// One expression, when it is of a kind and shape `lower` writes; None otherwise.
fn expr(name: &str, t: &Table<'_>) -> Result<Option<Expr>, Malformed> {
    let zero_or_absent = |kind: u16| -> Result<bool, Malformed> {
        Ok(t.be32(kind)?.unwrap_or(0) == 0)
    };
    Ok(match name {
        "payload" if !t.has(NFTA_PAYLOAD_SREG_ATTR) => need_reg(t, NFTA_PAYLOAD_DREG)?.map(|dreg| {
            Expr::Payload {
                dreg,
                base: t.be32(NFTA_PAYLOAD_BASE).ok().flatten().unwrap_or(u32::MAX),
                offset: t.be32(NFTA_PAYLOAD_OFFSET).ok().flatten().unwrap_or(u32::MAX),
                len: t.be32(NFTA_PAYLOAD_LEN).ok().flatten().unwrap_or(0),
            }
        }),
        "meta" => {
            let key = t.need_be32(NFTA_META_KEY)?;
            match (need_reg(t, NFTA_META_DREG)?, need_reg(t, NFTA_META_SREG)?) {
                (Some(dreg), None) => Some(Expr::Meta { key, dreg }),
                (None, Some(sreg)) => Some(Expr::MetaSet { key, sreg }),
                _ => None,
            }
        }
        "ct" if !t.has(NFTA_CT_DIRECTION) => need_reg(t, NFTA_CT_DREG)?.map(|dreg| Expr::Ct {
            key: t.need_be32(NFTA_CT_KEY).unwrap_or(u32::MAX),
            dreg,
        }),
        "cmp" => match (need_reg(t, NFTA_CMP_SREG)?, t.data_value(NFTA_CMP_DATA)?) {
            (Some(sreg), Some(data)) => Some(Expr::Cmp {
                sreg,
                op: t.need_be32(NFTA_CMP_OP)?,
                data: data.to_vec(),
            }),
            _ => None,
        },
        "bitwise" if zero_or_absent(NFTA_BITWISE_OP)? => {
            let regs = (
                need_reg(t, NFTA_BITWISE_SREG)?,
                need_reg(t, NFTA_BITWISE_DREG)?,
            );
            let data = (
                t.data_value(NFTA_BITWISE_MASK)?,
                t.data_value(NFTA_BITWISE_XOR)?,
            );
            match (regs, data) {
                ((Some(sreg), Some(dreg)), (Some(mask), Some(xor)))
                    if t.be32(NFTA_BITWISE_LEN)? == Some(mask.len() as u32) =>
                {
                    Some(Expr::Bitwise {
                        sreg,
                        dreg,
                        mask: mask.to_vec(),
                        xor: xor.to_vec(),
                        with_op: true,
                    })
                }
                _ => None,
            }
        }
        "lookup" => {
            let flags = t.be32(NFTA_LOOKUP_FLAGS)?.unwrap_or(0);
            match (need_reg(t, NFTA_LOOKUP_SREG)?, t.str(NFTA_LOOKUP_SET)?) {
                (Some(sreg), Some(set)) if flags & !NFT_LOOKUP_F_INV == 0 => Some(Expr::Lookup {
                    sreg,
                    dreg: need_reg(t, NFTA_LOOKUP_DREG)?,
                    set: set_ref(set),
                    invert: flags & NFT_LOOKUP_F_INV != 0,
                }),
                _ => None,
            }
        }
        "immediate" => {
            let data = match t.nest(NFTA_IMMEDIATE_DATA) {
                Some(d) => Some(super::decode::data(&d.table("immediate data")?)?),
                None => None,
            };
            match (need_reg(t, NFTA_IMMEDIATE_DREG)?, data) {
                (Some(dreg), Some(ElementValue::Data(bytes))) => Some(Expr::Immediate {
                    dreg,
                    data: Data::Value(bytes),
                }),
                (Some(dreg), Some(ElementValue::Verdict { code, chain })) => {
                    Some(Expr::Immediate {
                        dreg,
                        data: Data::Verdict { code, chain },
                    })
                }
                _ => None,
            }
        }
        "fib" => need_reg(t, NFTA_FIB_DREG)?.map(|dreg| Expr::Fib {
            flags: t.be32(NFTA_FIB_FLAGS).ok().flatten().unwrap_or(0),
            result: t.be32(NFTA_FIB_RESULT).ok().flatten().unwrap_or(0),
            dreg,
        }),
        "nat" => {
            let (addr_min, proto_min) = (
                need_reg(t, NFTA_NAT_REG_ADDR_MIN)?,
                need_reg(t, NFTA_NAT_REG_PROTO_MIN)?,
            );
            // The kernel reports a range's end as its start when none was given.
            let same = |max: u16, min: Option<Reg>| -> Result<bool, Malformed> {
                Ok(need_reg(t, max)?.is_none_or(|m| Some(m) == min))
            };
            match (addr_min, proto_min) {
                (Some(addr_min), Some(proto_min))
                    if same(NFTA_NAT_REG_ADDR_MAX, Some(addr_min))?
                        && same(NFTA_NAT_REG_PROTO_MAX, Some(proto_min))? =>
                {
                    Some(Expr::Nat {
                        kind: t.need_be32(NFTA_NAT_TYPE)?,
                        family: t.be32(NFTA_NAT_FAMILY)?.unwrap_or(0),
                        addr_min,
                        proto_min,
                        flags: t.be32(NFTA_NAT_FLAGS)?,
                    })
                }
                _ => None,
            }
        }
        "masq" if !t.has(NFTA_MASQ_REG_PROTO_MIN) => Some(Expr::Masq {
            flags: t.be32(NFTA_MASQ_FLAGS)?.unwrap_or(0),
        }),
        "numgen" if zero_or_absent(NFTA_NUMGEN_OFFSET)? => {
            need_reg(t, NFTA_NUMGEN_DREG)?.map(|dreg| Expr::Numgen {
                dreg,
                modulus: t.be32(NFTA_NUMGEN_MODULUS).ok().flatten().unwrap_or(0),
                kind: t.be32(NFTA_NUMGEN_TYPE).ok().flatten().unwrap_or(u32::MAX),
            })
        }
        // A seed of 0 given, not one the kernel chose (it reports no seed then).
        "hash"
            if t.be32(NFTA_HASH_SEED)? == Some(0)
                && zero_or_absent(NFTA_HASH_OFFSET)?
                && zero_or_absent(NFTA_HASH_TYPE)?
                && !t.has(NFTA_HASH_SET_NAME_ATTR) =>
        {
            match (need_reg(t, NFTA_HASH_SREG)?, need_reg(t, NFTA_HASH_DREG)?) {
                (Some(sreg), Some(dreg)) => Some(Expr::Jhash {
                    sreg,
                    dreg,
                    len: t.be32(NFTA_HASH_LEN)?.unwrap_or(0),
                    modulus: t.be32(NFTA_HASH_MODULUS)?.unwrap_or(0),
                }),
                _ => None,
            }
        }
        "dynset"
            if zero_or_absent(NFTA_DYNSET_FLAGS)?
                && t.be64(NFTA_DYNSET_TIMEOUT)?.unwrap_or(0) == 0
                && !t.has(NFTA_DYNSET_SREG_DATA)
                && !t.has(NFTA_DYNSET_EXPR_ATTR)
                && !t.has(NFTA_DYNSET_EXPRESSIONS_ATTR) =>
        {
            match (
                need_reg(t, NFTA_DYNSET_SREG_KEY)?,
                t.str(NFTA_DYNSET_SET_NAME)?,
            ) {
                (Some(sreg_key), Some(set)) => Some(Expr::Dynset {
                    op: t.need_be32(NFTA_DYNSET_OP)?,
                    sreg_key,
                    set: set_ref(set),
                }),
                _ => None,
            }
        }
        "objref" => match t.str(NFTA_OBJREF_IMM_NAME)? {
            Some(name) => Some(Expr::Objref {
                kind: t.need_be32(NFTA_OBJREF_IMM_TYPE)?,
                name: name.to_owned(),
            }),
            None => None,
        },
        "reject" => Some(Expr::Reject {
            kind: t.need_be32(NFTA_REJECT_TYPE)?,
            code: t.u8(NFTA_REJECT_ICMP_CODE)?.unwrap_or(0),
        }),
        _ => None,
    })
}

// Attributes only their presence matters of (`enum nft_payload_attributes` and others).
const NFTA_PAYLOAD_SREG_ATTR: u16 = 5;
const NFTA_HASH_SET_NAME_ATTR: u16 = 8;
const NFTA_DYNSET_EXPR_ATTR: u16 = 7;
const NFTA_DYNSET_EXPRESSIONS_ATTR: u16 = 10;

fn set_ref(name: &str) -> SetRef {
    SetRef {
        name: name.to_owned(),
        id: 0,
    }
}

/// The kernel names an anonymous set `__set<n>` (nft asks for `__set%d`); `lower` writes the
/// request. Both read as the prefix.
fn anonymous_name(name: &str) -> Option<&str> {
    if !name.starts_with("__") {
        return None;
    }
    Some(name.trim_end_matches(|c: char| c.is_ascii_digit()).trim_end_matches("%d"))
}

/// An expression with what the kernel adds or drops set aside.
fn canonical(e: &Expr) -> Expr {
    let mut e = e.clone();
    match &mut e {
        Expr::Bitwise { with_op, .. } => *with_op = true,
        Expr::Lookup { set, .. } | Expr::Dynset { set, .. } => {
            set.id = 0;
            if let Some(prefix) = anonymous_name(&set.name) {
                set.name = prefix.to_owned();
            }
        }
        Expr::Nat { flags, .. } => {
            let inferred = NF_NAT_RANGE_MAP_IPS | NF_NAT_RANGE_PROTO_SPECIFIED;
            *flags = flags.map(|f| f & !inferred).filter(|f| *f != 0);
        }
        _ => {}
    }
    e
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
        && lowered.exprs.iter().zip(items).all(|(want, have)| match have {
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
                (Expr::Meta { .. }, Some(Expr::Payload { .. }), Some(Expr::Lookup { set, .. })) => (
                    Stmt::Vmap {
                        key: VmapKey::DaddrProtoPort,
                        map: set.name.clone(),
                    },
                    4,
                ),
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
    if values.iter().enumerate().any(|(i, (k, _))| *k as usize != i) {
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
        || anon.elements.iter().any(|e| e.value.is_some() || e.odd.is_some())
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
