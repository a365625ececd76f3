//! A rule's expressions as the kernel reports them (`NFTA_RULE_EXPRESSIONS`), read into
//! `Expr`s of the kinds and shapes `lower` writes, for `unlower` to turn into statements.
//! Apart from `unlower` so that each file stays readable; it depends on nothing of it.

use super::consts::*;
use super::element::ElementValue;
use super::expr::{Data, Expr, Reg, SetRef};
use super::parse::{Attrs, Malformed, Table};

/// One expression of a rule: understood, or only named.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Item {
    Known(Expr),
    Unknown(String),
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
    let zero_or_absent =
        |kind: u16| -> Result<bool, Malformed> { Ok(t.be32(kind)?.unwrap_or(0) == 0) };
    Ok(match name {
        "payload" if !t.has(NFTA_PAYLOAD_SREG_ATTR) => {
            need_reg(t, NFTA_PAYLOAD_DREG)?.map(|dreg| Expr::Payload {
                dreg,
                base: t.be32(NFTA_PAYLOAD_BASE).ok().flatten().unwrap_or(u32::MAX),
                offset: t
                    .be32(NFTA_PAYLOAD_OFFSET)
                    .ok()
                    .flatten()
                    .unwrap_or(u32::MAX),
                len: t.be32(NFTA_PAYLOAD_LEN).ok().flatten().unwrap_or(0),
            })
        }
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
    Some(
        name.trim_end_matches(|c: char| c.is_ascii_digit())
            .trim_end_matches("%d"),
    )
}

/// An expression with what the kernel adds or drops set aside.
pub(super) fn canonical(e: &Expr) -> Expr {
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
