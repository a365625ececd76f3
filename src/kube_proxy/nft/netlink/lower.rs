//! A rule's statements lowered to the kernel's expressions as nft lowers the same text:
//! the same loads into the same registers, the same masks and comparisons (a byte-aligned
//! prefix compares fewer bytes, another is masked first), a one-element `{ }` written as a
//! plain comparison, the same anonymous sets and maps, the same verdicts. Each statement
//! starts again from the first register, as nft's linearizer does.

use ipnet::IpNet;

use super::consts::*;
use super::expr::{Data, Expr, Reg, SetRef};
use super::sets::{self, addr_bytes, AnonSet, FamilyInfo};
use super::Unsupported;
use crate::kube_proxy::nft::rule::{AddrField, AddrValue, Pick, Rule, Stmt, VmapKey};

/// Interface names are at most 15 bytes and a NUL (`IFNAMSIZ`).
const IFNAMSIZ: usize = 16;

/// Where set ids come from: nft numbers every set of a batch, and a lookup names its set by
/// name and by that number.
pub trait SetIds {
    /// The id of the named set `name` (the one its latest `add` in this batch got).
    fn named(&mut self, name: &str) -> u32;
    /// A new id, for an anonymous set.
    fn fresh(&mut self) -> u32;
}

/// A rule's expressions and the anonymous sets they need declared before the rule.
#[derive(Debug, Default)]
pub struct Lowered {
    pub exprs: Vec<Expr>,
    pub anonymous: Vec<AnonSet>,
}

pub fn rule(family: FamilyInfo, rule: &Rule, ids: &mut dyn SetIds) -> Result<Lowered, Unsupported> {
    let mut out = Lowered::default();
    for stmt in &rule.stmts {
        statement(family, stmt, ids, &mut out)?;
    }
    Ok(out)
}

fn cmp_op(negate: bool) -> u32 {
    if negate {
        NFT_CMP_NEQ
    } else {
        NFT_CMP_EQ
    }
}

fn addr_offset(family: FamilyInfo, field: AddrField) -> u32 {
    match field {
        AddrField::Saddr => family.saddr_offset,
        AddrField::Daddr => family.daddr_offset,
    }
}

fn len32(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

fn load_addr(family: FamilyInfo, field: AddrField, dreg: Reg, len: usize) -> Expr {
    Expr::Payload {
        dreg,
        base: NFT_PAYLOAD_NETWORK_HEADER,
        offset: addr_offset(family, field),
        len: len32(len),
    }
}

fn load_dport(dreg: Reg) -> Expr {
    Expr::Payload {
        dreg,
        base: NFT_PAYLOAD_TRANSPORT_HEADER,
        offset: 2,
        len: 2,
    }
}

/// The index `0..n` a [`Pick`] chooses, into `dreg`: `numgen random|inc mod n`, or
/// `jhash <family> saddr mod n seed 0x0`.
fn pick_index(exprs: &mut Vec<Expr>, family: FamilyInfo, pick: Pick, dreg: Reg, n: usize) {
    let kind = match pick {
        Pick::Random => NFT_NG_RANDOM,
        Pick::RoundRobin => NFT_NG_INCREMENTAL,
        Pick::SourceHash => {
            // nft loads the address into the next whole register, as here.
            let sreg = dreg.after(16);
            exprs.push(load_addr(family, AddrField::Saddr, sreg, family.addr_len));
            exprs.push(Expr::Jhash {
                sreg,
                dreg,
                len: len32(family.addr_len),
                modulus: len32(n),
            });
            return;
        }
    };
    exprs.push(Expr::Numgen {
        dreg,
        modulus: len32(n),
        kind,
    });
}

fn verdict(code: i32, chain: Option<&str>) -> Expr {
    Expr::Immediate {
        dreg: Reg::VERDICT,
        data: Data::Verdict {
            code,
            chain: chain.map(str::to_owned),
        },
    }
}

/// `ip saddr [!=] prefix`: nft compares only the prefix's bytes when it ends on a byte,
/// and masks the whole address first otherwise (a /0 included).
fn compare_prefix(family: FamilyInfo, field: AddrField, negate: bool, net: &IpNet) -> Vec<Expr> {
    let r = Reg::FIRST;
    let prefix = usize::from(net.prefix_len());
    let addr = addr_bytes(&net.network());
    if prefix == usize::from(net.max_prefix_len()) {
        return vec![
            load_addr(family, field, r, family.addr_len),
            Expr::Cmp {
                sreg: r,
                op: cmp_op(negate),
                data: addr,
            },
        ];
    }
    if prefix.is_multiple_of(8) && prefix > 0 {
        let len = prefix / 8;
        return vec![
            load_addr(family, field, r, len),
            Expr::Cmp {
                sreg: r,
                op: cmp_op(negate),
                data: addr[..len].to_vec(),
            },
        ];
    }
    let mask = addr_bytes(&net.netmask());
    vec![
        load_addr(family, field, r, family.addr_len),
        Expr::Bitwise {
            sreg: r,
            dreg: r,
            xor: vec![0; mask.len()],
            mask,
            with_op: false,
        },
        Expr::Cmp {
            sreg: r,
            op: cmp_op(negate),
            data: addr,
        },
    ]
}

/// A flag test as nft writes `ct state new` (no operation attribute on the mask).
fn flag_test(load: Expr, bit: u32) -> [Expr; 3] {
    let r = Reg::FIRST;
    [
        load,
        Expr::Bitwise {
            sreg: r,
            dreg: r,
            mask: bit.to_ne_bytes().to_vec(),
            xor: vec![0; 4],
            with_op: false,
        },
        Expr::Cmp {
            sreg: r,
            op: NFT_CMP_NEQ,
            data: vec![0; 4],
        },
    ]
}

/// `mark set mark <op> ...`: the mark through `(mark & mask) ^ xor`.
fn set_mark(mask: u32, xor: u32) -> [Expr; 3] {
    let r = Reg::FIRST;
    [
        Expr::Meta {
            key: NFT_META_MARK,
            dreg: r,
        },
        Expr::Bitwise {
            sreg: r,
            dreg: r,
            mask: mask.to_ne_bytes().to_vec(),
            xor: xor.to_ne_bytes().to_vec(),
            with_op: true,
        },
        Expr::MetaSet {
            key: NFT_META_MARK,
            sreg: r,
        },
    ]
}

fn statement(
    family: FamilyInfo,
    stmt: &Stmt,
    ids: &mut dyn SetIds,
    out: &mut Lowered,
) -> Result<(), Unsupported> {
    let r = Reg::FIRST;
    let exprs = &mut out.exprs;
    match stmt {
        Stmt::CtStateNew => exprs.extend(flag_test(
            Expr::Ct {
                key: NFT_CT_STATE,
                dreg: r,
            },
            NF_CT_STATE_NEW_BIT,
        )),
        Stmt::CtStatusDnat => exprs.extend(flag_test(
            Expr::Ct {
                key: NFT_CT_STATUS,
                dreg: r,
            },
            IPS_DST_NAT,
        )),
        Stmt::Addr {
            field,
            negate,
            value,
        } => match value {
            AddrValue::Net(net) => exprs.extend(compare_prefix(family, *field, *negate, net)),
            // nft writes a set of one as that one value.
            AddrValue::Anonymous(nets) if nets.len() == 1 => {
                exprs.extend(compare_prefix(family, *field, *negate, &nets[0]));
            }
            AddrValue::Anonymous(nets) => {
                if nets.is_empty() {
                    return Err(Unsupported::EmptySet);
                }
                let template = match field {
                    AddrField::Saddr => family.saddr_template,
                    AddrField::Daddr => family.daddr_template,
                };
                let set = sets::anonymous_addresses(family, template, ids.fresh(), nets);
                exprs.push(load_addr(family, *field, r, family.addr_len));
                exprs.push(Expr::Lookup {
                    sreg: r,
                    dreg: None,
                    set: SetRef {
                        name: set.decl.name.clone(),
                        id: set.decl.id,
                    },
                    invert: *negate,
                });
                out.anonymous.push(set);
            }
            AddrValue::Named(name) => {
                exprs.push(load_addr(family, *field, r, family.addr_len));
                exprs.push(Expr::Lookup {
                    sreg: r,
                    dreg: None,
                    set: SetRef {
                        name: name.clone(),
                        id: ids.named(name),
                    },
                    invert: *negate,
                });
            }
        },
        Stmt::FibLocal(field) => {
            let flags = match field {
                AddrField::Saddr => NFTA_FIB_F_SADDR,
                AddrField::Daddr => NFTA_FIB_F_DADDR,
            };
            exprs.push(Expr::Fib {
                flags,
                result: NFT_FIB_RESULT_ADDRTYPE,
                dreg: r,
            });
            exprs.push(Expr::Cmp {
                sreg: r,
                op: NFT_CMP_EQ,
                data: RTN_LOCAL.to_ne_bytes().to_vec(),
            });
        }
        Stmt::Iifname { negate, name } => {
            // A trailing `*` makes a prefix: only its bytes are compared. A whole name is
            // compared with its NUL padding to IFNAMSIZ.
            let bytes = name.strip_suffix('*').unwrap_or(name).as_bytes();
            if bytes.is_empty() || bytes.len() >= IFNAMSIZ {
                return Err(Unsupported::InterfaceName(name.clone()));
            }
            let mut data = bytes.to_vec();
            if !name.ends_with('*') {
                data.resize(IFNAMSIZ, 0);
            }
            exprs.push(Expr::Meta {
                key: NFT_META_IIFNAME,
                dreg: r,
            });
            exprs.push(Expr::Cmp {
                sreg: r,
                op: cmp_op(*negate),
                data,
            });
        }
        Stmt::MarkAnyOf(mask) => {
            exprs.push(Expr::Meta {
                key: NFT_META_MARK,
                dreg: r,
            });
            // `mark and M != 0` is an `and` of the rule: nft writes its operation.
            exprs.push(Expr::Bitwise {
                sreg: r,
                dreg: r,
                mask: mask.to_ne_bytes().to_vec(),
                xor: vec![0; 4],
                with_op: true,
            });
            exprs.push(Expr::Cmp {
                sreg: r,
                op: NFT_CMP_NEQ,
                data: vec![0; 4],
            });
        }
        Stmt::L4Proto(proto) => {
            exprs.push(Expr::Meta {
                key: NFT_META_L4PROTO,
                dreg: r,
            });
            exprs.push(Expr::Cmp {
                sreg: r,
                op: NFT_CMP_EQ,
                data: vec![proto.number()],
            });
        }
        Stmt::HairpinLookup(set) => {
            let daddr = r.after(family.addr_len);
            let proto = daddr.after(family.addr_len);
            let port = proto.after(1);
            exprs.push(load_addr(family, AddrField::Saddr, r, family.addr_len));
            exprs.push(load_addr(family, AddrField::Daddr, daddr, family.addr_len));
            exprs.push(Expr::Meta {
                key: NFT_META_L4PROTO,
                dreg: proto,
            });
            exprs.push(load_dport(port));
            exprs.push(Expr::Lookup {
                sreg: r,
                dreg: None,
                set: SetRef {
                    name: set.clone(),
                    id: ids.named(set),
                },
                invert: false,
            });
        }
        Stmt::MarkSetOr(bits) => exprs.extend(set_mark(!bits, *bits)),
        Stmt::MarkSetXor(bits) => exprs.extend(set_mark(u32::MAX, *bits)),
        Stmt::Masquerade => exprs.push(Expr::Masq {
            flags: NF_NAT_RANGE_PROTO_RANDOM_FULLY,
        }),
        Stmt::UpdateSaddr(set) => {
            exprs.push(load_addr(family, AddrField::Saddr, r, family.addr_len));
            exprs.push(Expr::Dynset {
                op: NFT_DYNSET_OP_UPDATE,
                sreg_key: r,
                set: SetRef {
                    name: set.clone(),
                    id: ids.named(set),
                },
            });
        }
        Stmt::NamedCounter(name) => exprs.push(Expr::Objref {
            kind: NFT_OBJECT_COUNTER,
            name: name.clone(),
        }),
        Stmt::Vmap { key, map } => {
            match key {
                VmapKey::DaddrProtoPort => {
                    let proto = r.after(family.addr_len);
                    exprs.push(load_addr(family, AddrField::Daddr, r, family.addr_len));
                    exprs.push(Expr::Meta {
                        key: NFT_META_L4PROTO,
                        dreg: proto,
                    });
                    exprs.push(load_dport(proto.after(1)));
                }
                VmapKey::ProtoPort => {
                    exprs.push(Expr::Meta {
                        key: NFT_META_L4PROTO,
                        dreg: r,
                    });
                    exprs.push(load_dport(r.after(1)));
                }
            }
            exprs.push(Expr::Lookup {
                sreg: r,
                dreg: Some(Reg::VERDICT),
                set: SetRef {
                    name: map.clone(),
                    id: ids.named(map),
                },
                invert: false,
            });
        }
        Stmt::PickVmap { pick, chains } => {
            if chains.is_empty() {
                return Err(Unsupported::EmptySet);
            }
            let map = sets::numgen_vmap(ids.fresh(), chains);
            pick_index(exprs, family, *pick, r, chains.len());
            exprs.push(Expr::Lookup {
                sreg: r,
                dreg: Some(Reg::VERDICT),
                set: SetRef {
                    name: map.decl.name.clone(),
                    id: map.decl.id,
                },
                invert: false,
            });
            out.anonymous.push(map);
        }
        Stmt::Dnat { addr, port } => {
            // Each immediate gets a register of its own (a whole 128-bit one).
            let port_reg = r.after(16);
            exprs.push(Expr::Immediate {
                dreg: r,
                data: Data::Value(addr_bytes(addr)),
            });
            exprs.push(Expr::Immediate {
                dreg: port_reg,
                data: Data::Value(port.to_be_bytes().to_vec()),
            });
            exprs.push(Expr::Nat {
                kind: NFT_NAT_DNAT,
                family: u32::from(family.nfproto),
                addr_min: r,
                proto_min: port_reg,
                flags: Some(NF_NAT_RANGE_PROTO_SPECIFIED),
            });
        }
        Stmt::PickDnat { pick, targets } => {
            if targets.is_empty() {
                return Err(Unsupported::EmptySet);
            }
            let map = sets::numgen_dnat(family, ids.fresh(), targets);
            pick_index(exprs, family, *pick, r, targets.len());
            exprs.push(Expr::Lookup {
                sreg: r,
                dreg: Some(r),
                set: SetRef {
                    name: map.decl.name.clone(),
                    id: map.decl.id,
                },
                invert: false,
            });
            // The map's value is `addr . port`: the port follows the address's registers.
            exprs.push(Expr::Nat {
                kind: NFT_NAT_DNAT,
                family: u32::from(family.nfproto),
                addr_min: r,
                proto_min: r.after(family.addr_len),
                flags: None,
            });
            out.anonymous.push(map);
        }
        Stmt::Jump(chain) => exprs.push(verdict(NFT_JUMP, Some(chain))),
        Stmt::Goto(chain) => exprs.push(verdict(NFT_GOTO, Some(chain))),
        Stmt::Accept => exprs.push(verdict(NF_ACCEPT, None)),
        Stmt::Drop => exprs.push(verdict(NF_DROP, None)),
        Stmt::Return => exprs.push(verdict(NFT_RETURN, None)),
        Stmt::Reject => exprs.push(Expr::Reject {
            kind: NFT_REJECT_ICMP_UNREACH,
            code: family.reject_code,
        }),
        Stmt::Other(text) => return Err(Unsupported::ReadOnlyStatement(text.clone())),
    }
    Ok(())
}
