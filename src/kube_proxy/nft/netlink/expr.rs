//! The kernel's rule expressions (`payload`, `cmp`, `lookup`, ...) that the proxy's
//! statements lower to, and their encoding: each writes its attributes in the order
//! libnftnl writes them, so a rule's bytes are nft's.

use super::attr::Writer;
use super::consts::*;

/// A register in nft's own numbering: 32-bit units counted from 1 (`NFT_REG_1`), the way
/// its linearizer allocates them; 0 is the verdict register. Written to the kernel as a
/// 128-bit register number where one starts there (1..4), a 32-bit one (8..23) elsewhere,
/// as nft does for compatibility with old kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reg(pub u32);

impl Reg {
    pub const VERDICT: Reg = Reg(NFT_REG_VERDICT);
    /// The first data register, where every statement's first value goes.
    pub const FIRST: Reg = Reg(1);

    /// The register after a value of `len` bytes in this one.
    pub fn after(self, len: usize) -> Reg {
        let units = u32::try_from(len.div_ceil(4)).unwrap_or(u32::MAX);
        Reg(self.0 + units)
    }

    /// The number the kernel reads (nft's `netlink_put_register`).
    pub fn wire(self) -> u32 {
        if self == Reg::VERDICT {
            return NFT_REG_VERDICT;
        }
        let unit = self.0 - 1;
        if unit.is_multiple_of(4) {
            1 + unit / 4
        } else {
            // NFT_REG32_00 is 8.
            8 + unit
        }
    }
}

/// A set a `lookup` or `dynset` names: by name, and by the batch-local id nft gives every
/// set (the kernel finds a set added earlier in the same batch, or an anonymous one whose
/// name it has yet to choose, by the id).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetRef {
    pub name: String,
    pub id: u32,
}

/// An immediate's or a comparison's constant, or a verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Data {
    Value(Vec<u8>),
    Verdict { code: i32, chain: Option<String> },
}

impl Data {
    /// `NFTA_DATA_VALUE` or `NFTA_DATA_VERDICT { CODE, CHAIN }` inside the attribute `kind`.
    pub fn write(&self, w: &mut Writer, kind: u16) {
        match self {
            Data::Value(bytes) => w.put_data_value(kind, bytes),
            Data::Verdict { code, chain } => {
                let outer = w.nest(kind);
                write_verdict(w, *code, chain.as_deref());
                w.end_nest(outer);
            }
        }
    }
}

/// `NFTA_DATA_VERDICT { CODE, [CHAIN] }`.
pub fn write_verdict(w: &mut Writer, code: i32, chain: Option<&str>) {
    let verdict = w.nest(NFTA_DATA_VERDICT);
    w.put(NFTA_VERDICT_CODE, &code.to_be_bytes());
    if let Some(chain) = chain {
        w.put_strz(NFTA_VERDICT_CHAIN, chain);
    }
    w.end_nest(verdict);
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expr {
    /// Loads `len` bytes at `offset` of a header.
    Payload {
        dreg: Reg,
        base: u32,
        offset: u32,
        len: u32,
    },
    Meta {
        key: u32,
        dreg: Reg,
    },
    MetaSet {
        key: u32,
        sreg: Reg,
    },
    Ct {
        key: u32,
        dreg: Reg,
    },
    Cmp {
        sreg: Reg,
        op: u32,
        data: Vec<u8>,
    },
    /// `dreg = (sreg & mask) ^ xor`. nft writes the operation (boolean) only for the
    /// bitwise it builds from `and`/`or`/`xor` in a rule, not for the masks it builds for
    /// a prefix or a flag test.
    Bitwise {
        sreg: Reg,
        dreg: Reg,
        mask: Vec<u8>,
        xor: Vec<u8>,
        with_op: bool,
    },
    Lookup {
        sreg: Reg,
        /// The data register of a map lookup (the verdict register for a vmap).
        dreg: Option<Reg>,
        set: SetRef,
        invert: bool,
    },
    Immediate {
        dreg: Reg,
        data: Data,
    },
    Fib {
        flags: u32,
        result: u32,
        dreg: Reg,
    },
    Nat {
        kind: u32,
        family: u32,
        addr_min: Reg,
        proto_min: Reg,
        flags: Option<u32>,
    },
    Masq {
        flags: u32,
    },
    Numgen {
        dreg: Reg,
        modulus: u32,
        kind: u32,
    },
    /// `jhash <sreg, len> mod N seed 0`: the Jenkins hash of a loaded value.
    Jhash {
        sreg: Reg,
        dreg: Reg,
        len: u32,
        modulus: u32,
    },
    Dynset {
        op: u32,
        sreg_key: Reg,
        set: SetRef,
    },
    Objref {
        kind: u32,
        name: String,
    },
    Reject {
        kind: u32,
        code: u8,
    },
}

impl Expr {
    fn name(&self) -> &'static str {
        match self {
            Expr::Payload { .. } => "payload",
            Expr::Meta { .. } | Expr::MetaSet { .. } => "meta",
            Expr::Ct { .. } => "ct",
            Expr::Cmp { .. } => "cmp",
            Expr::Bitwise { .. } => "bitwise",
            Expr::Lookup { .. } => "lookup",
            Expr::Immediate { .. } => "immediate",
            Expr::Fib { .. } => "fib",
            Expr::Nat { .. } => "nat",
            Expr::Masq { .. } => "masq",
            Expr::Numgen { .. } => "numgen",
            Expr::Jhash { .. } => "hash",
            Expr::Dynset { .. } => "dynset",
            Expr::Objref { .. } => "objref",
            Expr::Reject { .. } => "reject",
        }
    }

    /// `NFTA_LIST_ELEM { NFTA_EXPR_NAME, NFTA_EXPR_DATA { ... } }`.
    pub fn write(&self, w: &mut Writer) {
        let elem = w.nest(NFTA_LIST_ELEM);
        w.put_strz(NFTA_EXPR_NAME, self.name());
        let data = w.nest(NFTA_EXPR_DATA);
        self.write_attributes(w);
        w.end_nest(data);
        w.end_nest(elem);
    }

    fn write_attributes(&self, w: &mut Writer) {
        match self {
            Expr::Payload {
                dreg,
                base,
                offset,
                len,
            } => {
                w.put_be32(NFTA_PAYLOAD_DREG, dreg.wire());
                w.put_be32(NFTA_PAYLOAD_BASE, *base);
                w.put_be32(NFTA_PAYLOAD_OFFSET, *offset);
                w.put_be32(NFTA_PAYLOAD_LEN, *len);
            }
            Expr::Meta { key, dreg } => {
                w.put_be32(NFTA_META_KEY, *key);
                w.put_be32(NFTA_META_DREG, dreg.wire());
            }
            Expr::MetaSet { key, sreg } => {
                w.put_be32(NFTA_META_KEY, *key);
                w.put_be32(NFTA_META_SREG, sreg.wire());
            }
            Expr::Ct { key, dreg } => {
                w.put_be32(NFTA_CT_KEY, *key);
                w.put_be32(NFTA_CT_DREG, dreg.wire());
            }
            Expr::Cmp { sreg, op, data } => {
                w.put_be32(NFTA_CMP_SREG, sreg.wire());
                w.put_be32(NFTA_CMP_OP, *op);
                w.put_data_value(NFTA_CMP_DATA, data);
            }
            Expr::Bitwise {
                sreg,
                dreg,
                mask,
                xor,
                with_op,
            } => {
                w.put_be32(NFTA_BITWISE_SREG, sreg.wire());
                w.put_be32(NFTA_BITWISE_DREG, dreg.wire());
                if *with_op {
                    w.put_be32(NFTA_BITWISE_OP, NFT_BITWISE_BOOL);
                }
                let len = u32::try_from(mask.len()).unwrap_or(u32::MAX);
                w.put_be32(NFTA_BITWISE_LEN, len);
                w.put_data_value(NFTA_BITWISE_MASK, mask);
                w.put_data_value(NFTA_BITWISE_XOR, xor);
            }
            Expr::Lookup {
                sreg,
                dreg,
                set,
                invert,
            } => {
                w.put_be32(NFTA_LOOKUP_SREG, sreg.wire());
                if let Some(dreg) = dreg {
                    w.put_be32(NFTA_LOOKUP_DREG, dreg.wire());
                }
                w.put_strz(NFTA_LOOKUP_SET, &set.name);
                w.put_be32(NFTA_LOOKUP_SET_ID, set.id);
                if *invert {
                    w.put_be32(NFTA_LOOKUP_FLAGS, NFT_LOOKUP_F_INV);
                }
            }
            Expr::Immediate { dreg, data } => {
                w.put_be32(NFTA_IMMEDIATE_DREG, dreg.wire());
                data.write(w, NFTA_IMMEDIATE_DATA);
            }
            Expr::Fib {
                flags,
                result,
                dreg,
            } => {
                w.put_be32(NFTA_FIB_FLAGS, *flags);
                w.put_be32(NFTA_FIB_RESULT, *result);
                w.put_be32(NFTA_FIB_DREG, dreg.wire());
            }
            Expr::Nat {
                kind,
                family,
                addr_min,
                proto_min,
                flags,
            } => {
                w.put_be32(NFTA_NAT_TYPE, *kind);
                w.put_be32(NFTA_NAT_FAMILY, *family);
                w.put_be32(NFTA_NAT_REG_ADDR_MIN, addr_min.wire());
                w.put_be32(NFTA_NAT_REG_PROTO_MIN, proto_min.wire());
                if let Some(flags) = flags {
                    w.put_be32(NFTA_NAT_FLAGS, *flags);
                }
            }
            Expr::Masq { flags } => w.put_be32(NFTA_MASQ_FLAGS, *flags),
            Expr::Numgen {
                dreg,
                modulus,
                kind,
            } => {
                w.put_be32(NFTA_NUMGEN_DREG, dreg.wire());
                w.put_be32(NFTA_NUMGEN_MODULUS, *modulus);
                w.put_be32(NFTA_NUMGEN_TYPE, *kind);
                w.put_be32(NFTA_NUMGEN_OFFSET, 0);
            }
            Expr::Jhash {
                sreg,
                dreg,
                len,
                modulus,
            } => {
                w.put_be32(NFTA_HASH_SREG, sreg.wire());
                w.put_be32(NFTA_HASH_DREG, dreg.wire());
                w.put_be32(NFTA_HASH_LEN, *len);
                w.put_be32(NFTA_HASH_MODULUS, *modulus);
                w.put_be32(NFTA_HASH_SEED, 0);
                w.put_be32(NFTA_HASH_OFFSET, 0);
                w.put_be32(NFTA_HASH_TYPE, NFT_HASH_JENKINS);
            }
            Expr::Dynset { op, sreg_key, set } => {
                w.put_be32(NFTA_DYNSET_SREG_KEY, sreg_key.wire());
                w.put_be32(NFTA_DYNSET_OP, *op);
                w.put_strz(NFTA_DYNSET_SET_NAME, &set.name);
                w.put_be32(NFTA_DYNSET_SET_ID, set.id);
            }
            Expr::Objref { kind, name } => {
                w.put_be32(NFTA_OBJREF_IMM_TYPE, *kind);
                // libnftnl writes this one name without its NUL (`mnl_attr_put_str`).
                w.put(NFTA_OBJREF_IMM_NAME, name.as_bytes());
            }
            Expr::Reject { kind, code } => {
                w.put_be32(NFTA_REJECT_TYPE, *kind);
                w.put_u8(NFTA_REJECT_ICMP_CODE, *code);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registers_are_written_as_nft_numbers_them() {
        // A 16-byte value then 4-byte ones, as in `ip6 saddr . ip6 daddr . meta l4proto .
        // th dport`: nft's debug output reads reg 1, 2, 3, 17.
        let r1 = Reg::FIRST;
        let r2 = r1.after(16);
        let r3 = r2.after(16);
        let r4 = r3.after(4);
        assert_eq!([r1.wire(), r2.wire(), r3.wire(), r4.wire()], [1, 2, 3, 17]);
        // IPv4: reg 1, 9, 10, 11.
        let r2 = r1.after(4);
        assert_eq!([r2.wire(), r2.after(4).wire()], [9, 10]);
        assert_eq!(Reg::VERDICT.wire(), 0);
    }
}
