//! The kernel's table, chains, sets, elements and counters as a dump answers them, decoded
//! into the table's model (`table::Table`): the inverse of `batch` and `sets`. What the model
//! cannot hold (a chain's drop policy, a set type or flag the proxy never declares, an element
//! with a timeout expression...) is reported beside it, as text: such a table is not one the
//! proxy wrote, and is replaced rather than adopted.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::consts::*;
use super::element::ElementValue;
use super::parse::{self, Malformed, Table as Attrs};
use super::sets::ContentDigest;
use crate::kube_proxy::model::Protocol;
use crate::kube_proxy::nft::objects::{BaseChain, ChainType, Hook, Key, SetKind, SetSpec, Verdict};
use crate::kube_proxy::nft::table::Chain;

/// A table's own properties.
pub struct RawTable {
    pub flags: u32,
    pub comment: Option<String>,
}

pub fn table(t: &Attrs<'_>) -> Result<RawTable, Malformed> {
    Ok(RawTable {
        flags: t.be32(NFTA_TABLE_FLAGS)?.unwrap_or(0),
        comment: t
            .get(NFTA_TABLE_USERDATA)
            .and_then(|u| parse::udata_comment(u, UDATA_COMMENT)),
    })
}

/// A chain without its rules, and what of it the model cannot hold.
pub struct RawChain {
    pub table: String,
    pub name: String,
    pub chain: Chain,
    pub odd: Option<String>,
}

pub fn chain(t: &Attrs<'_>) -> Result<RawChain, Malformed> {
    let name = t.need_str(NFTA_CHAIN_NAME)?.to_owned();
    let mut odd = Vec::new();
    let base = match t.nest(NFTA_CHAIN_HOOK) {
        None => None,
        Some(hook) => {
            let hook = hook.table("chain hook")?;
            let number = hook.need_be32(NFTA_HOOK_HOOKNUM)?;
            let priority = hook.need_be32(NFTA_HOOK_PRIORITY)? as i32;
            if hook.has(NFTA_HOOK_DEV) || hook.has(NFTA_HOOK_DEVS) {
                odd.push("a device".to_owned());
            }
            let kind = match t.str(NFTA_CHAIN_TYPE)? {
                Some("filter") => Some(ChainType::Filter),
                Some("nat") => Some(ChainType::Nat),
                other => {
                    odd.push(format!("type {}", other.unwrap_or("(none)")));
                    None
                }
            };
            let hook = match number {
                NF_INET_PRE_ROUTING => Some(Hook::Prerouting),
                NF_INET_LOCAL_IN => Some(Hook::Input),
                NF_INET_FORWARD => Some(Hook::Forward),
                NF_INET_LOCAL_OUT => Some(Hook::Output),
                NF_INET_POST_ROUTING => Some(Hook::Postrouting),
                other => {
                    odd.push(format!("hook {other}"));
                    None
                }
            };
            kind.zip(hook).map(|(kind, hook)| BaseChain {
                kind,
                hook,
                priority,
            })
        }
    };
    match t.be32(NFTA_CHAIN_POLICY)? {
        None => {}
        Some(p) if p == NF_ACCEPT as u32 => {}
        Some(p) => odd.push(format!("policy {p}")),
    }
    let flags = t.be32(NFTA_CHAIN_FLAGS)?.unwrap_or(0) & !NFT_CHAIN_BASE;
    if flags != 0 {
        odd.push(format!("flags {flags:#x}"));
    }
    Ok(RawChain {
        table: t.need_str(NFTA_CHAIN_TABLE)?.to_owned(),
        chain: Chain {
            base,
            comment: t
                .get(NFTA_CHAIN_USERDATA)
                .and_then(|u| parse::udata_comment(u, UDATA_COMMENT)),
            rules: Vec::new(),
        },
        odd: (!odd.is_empty()).then(|| format!("chain {name}: {}", odd.join(", "))),
        name,
    })
}

/// A set's declaration as the kernel keeps it.
#[derive(Clone, Debug)]
pub struct RawSet {
    pub name: String,
    pub flags: u32,
    pub key_type: u32,
    pub key_len: u32,
    pub data: Option<(u32, u32)>,
    pub timeout_ms: Option<u64>,
    pub comment: Option<String>,
    /// Expressions attached to the set (per-element counters and the like).
    pub expressions: bool,
    /// The digest of its elements a `numgen` map we wrote carries (`sets::content_digest`).
    pub digest: Option<ContentDigest>,
}

pub fn set(t: &Attrs<'_>) -> Result<RawSet, Malformed> {
    let flags = t.be32(NFTA_SET_FLAGS)?.unwrap_or(0);
    let data = match t.be32(NFTA_SET_DATA_TYPE)? {
        Some(kind) => Some((kind, t.be32(NFTA_SET_DATA_LEN)?.unwrap_or(0))),
        None => None,
    };
    Ok(RawSet {
        name: t.need_str(NFTA_SET_NAME)?.to_owned(),
        flags,
        key_type: t.need_be32(NFTA_SET_KEY_TYPE)?,
        key_len: t.need_be32(NFTA_SET_KEY_LEN)?,
        data,
        timeout_ms: t.be64(NFTA_SET_TIMEOUT)?,
        comment: t
            .get(NFTA_SET_USERDATA)
            .and_then(|u| parse::udata_comment(u, UDATA_SET_COMMENT)),
        expressions: t.has(NFTA_SET_EXPR)
            || t.has(NFTA_SET_EXPRESSIONS)
            || t.has(NFTA_SET_OBJ_TYPE)
            || flags & (NFT_SET_EXPR | NFT_SET_OBJECT) != 0,
        digest: t
            .get(NFTA_SET_USERDATA)
            .and_then(|u| parse::udata(u, UDATA_SET_CONTENT_DIGEST))
            .and_then(|d| d.try_into().ok()),
    })
}

/// The fields of a key type: nft's datatypes, concatenated `TYPE_BITS` apart, the first one
/// in the highest bits.
pub fn fields(key_type: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut rest = key_type;
    while rest != 0 && out.len() < 8 {
        out.push(rest & ((1 << TYPE_BITS) - 1));
        rest >>= TYPE_BITS;
    }
    out.reverse();
    out
}

fn field_word(kind: u32) -> Option<&'static str> {
    Some(match kind {
        TYPE_IPADDR => "ipv4_addr",
        TYPE_IP6ADDR => "ipv6_addr",
        TYPE_INET_PROTOCOL => "inet_proto",
        TYPE_INET_SERVICE => "inet_service",
        _ => return None,
    })
}

fn field_len(kind: u32) -> usize {
    match kind {
        TYPE_IPADDR => 4,
        TYPE_IP6ADDR => 16,
        TYPE_INET_PROTOCOL => 1,
        TYPE_INET_SERVICE => 2,
        _ => 0,
    }
}

impl RawSet {
    pub fn anonymous(&self) -> bool {
        self.flags & NFT_SET_ANONYMOUS != 0
    }

    /// The set as the model declares it, and what of it the model cannot hold.
    pub fn spec(&self) -> (SetSpec, Option<String>) {
        let mut odd = Vec::new();
        let fields = fields(self.key_type);
        let words: Vec<String> = fields
            .iter()
            .map(|f| match field_word(*f) {
                Some(w) => w.to_owned(),
                None => {
                    odd.push(format!("key type {f}"));
                    format!("type#{f}")
                }
            })
            .collect();
        let concat = fields.len() > 1;
        let want_len: usize = fields
            .iter()
            .map(|f| {
                let len = field_len(*f);
                if concat {
                    len.next_multiple_of(4)
                } else {
                    len
                }
            })
            .sum();
        if want_len as u64 != u64::from(self.key_len) {
            odd.push(format!("key length {}", self.key_len));
        }
        let mut key_type = words.join(" . ");
        let kind = if self.flags & NFT_SET_MAP != 0 {
            SetKind::Map
        } else {
            SetKind::Set
        };
        match (kind, self.data) {
            (SetKind::Map, Some((NFT_DATA_VERDICT, _))) => key_type.push_str(" : verdict"),
            (SetKind::Set, None) => {}
            (_, data) => odd.push(format!("data {data:?}")),
        }
        let mut flags = Vec::new();
        if self.flags & NFT_SET_EVAL != 0 {
            flags.push("dynamic".to_owned());
        }
        if self.flags & NFT_SET_TIMEOUT != 0 {
            flags.push("timeout".to_owned());
        }
        let other = self.flags & !(NFT_SET_EVAL | NFT_SET_TIMEOUT | NFT_SET_MAP);
        if other != 0 {
            odd.push(format!("flags {other:#x}"));
            flags.push(format!("flags#{other:#x}"));
        }
        if self.expressions {
            odd.push("expressions".to_owned());
        }
        let timeout_secs = self.timeout_ms.map(|ms| {
            if ms % 1000 != 0 {
                odd.push(format!("timeout {ms} ms"));
            }
            u32::try_from(ms / 1000).unwrap_or(u32::MAX)
        });
        let spec = SetSpec {
            kind,
            key_type,
            flags,
            timeout_secs,
            comment: self.comment.clone(),
        };
        let odd = (!odd.is_empty()).then(|| format!("set {}: {}", self.name, odd.join(", ")));
        (spec, odd)
    }
}

/// One element as the kernel keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawElement {
    pub key: Vec<u8>,
    pub value: Option<ElementValue>,
    pub interval_end: bool,
    /// An interval that runs to the top of the key's range (nft's userdata flag).
    pub open: bool,
    pub comment: Option<String>,
    /// What the model cannot hold: an element expression, an object reference, a range key.
    pub odd: Option<&'static str>,
}

/// A `NEWSETELEM` message: the set's name and its elements.
pub fn elements(t: &Attrs<'_>) -> Result<(String, Vec<RawElement>), Malformed> {
    let set = t.need_str(NFTA_SET_ELEM_LIST_SET)?.to_owned();
    let mut out = Vec::new();
    if let Some(list) = t.nest(NFTA_SET_ELEM_LIST_ELEMENTS) {
        for (_, entry) in list.each("set element list")? {
            out.push(element(&parse::Attrs::new(entry).table("set element")?)?);
        }
    }
    Ok((set, out))
}

fn element(e: &Attrs<'_>) -> Result<RawElement, Malformed> {
    let key = e
        .data_value(NFTA_SET_ELEM_KEY)?
        .ok_or(Malformed::Missing {
            what: "set element",
            kind: NFTA_SET_ELEM_KEY,
        })?
        .to_vec();
    let value = match e.nest(NFTA_SET_ELEM_DATA) {
        None => None,
        Some(nest) => Some(data(&nest.table("element data")?)?),
    };
    let flags = e.be32(NFTA_SET_ELEM_FLAGS)?.unwrap_or(0);
    let udata = e.get(NFTA_SET_ELEM_USERDATA).unwrap_or_default();
    let open = parse::udata_u32(udata, UDATA_SET_ELEM_FLAGS)
        .is_some_and(|f| f & UDATA_SET_ELEM_F_INTERVAL_OPEN != 0);
    let odd = if e.has(NFTA_SET_ELEM_EXPR) || e.has(NFTA_SET_ELEM_EXPRESSIONS) {
        Some("an element expression")
    } else if e.has(NFTA_SET_ELEM_OBJREF) {
        Some("an object reference")
    } else if e.has(NFTA_SET_ELEM_KEY_END) {
        Some("a range key")
    } else if flags & !NFT_SET_ELEM_INTERVAL_END != 0 {
        Some("element flags")
    } else {
        None
    };
    Ok(RawElement {
        key,
        value,
        interval_end: flags & NFT_SET_ELEM_INTERVAL_END != 0,
        open,
        comment: parse::udata_comment(udata, UDATA_SET_ELEM_COMMENT),
        odd,
    })
}

/// `{ NFTA_DATA_VALUE }` or `{ NFTA_DATA_VERDICT { CODE, CHAIN } }`.
pub fn data(t: &Attrs<'_>) -> Result<ElementValue, Malformed> {
    if let Some(value) = t.get(NFTA_DATA_VALUE) {
        return Ok(ElementValue::Data(value.to_vec()));
    }
    let verdict = t
        .nest(NFTA_DATA_VERDICT)
        .ok_or(Malformed::Missing {
            what: t.what(),
            kind: NFTA_DATA_VERDICT,
        })?
        .table("verdict")?;
    Ok(ElementValue::Verdict {
        code: verdict.need_be32(NFTA_VERDICT_CODE)? as i32,
        chain: verdict.str(NFTA_VERDICT_CHAIN)?.map(str::to_owned),
    })
}

/// A verdict as the model holds it (a map element's value).
pub fn verdict(value: &ElementValue) -> Option<Verdict> {
    match value {
        ElementValue::Verdict {
            code: NFT_GOTO,
            chain: Some(c),
        } => Some(Verdict::Goto(c.clone())),
        ElementValue::Verdict {
            code: NFT_JUMP,
            chain: Some(c),
        } => Some(Verdict::Jump(c.clone())),
        ElementValue::Verdict {
            code: NF_DROP,
            chain: None,
        } => Some(Verdict::Drop),
        ElementValue::Verdict {
            code: NF_ACCEPT,
            chain: None,
        } => Some(Verdict::Accept),
        _ => None,
    }
}

pub fn protocol(number: u8) -> Option<Protocol> {
    [Protocol::Tcp, Protocol::Udp, Protocol::Sctp]
        .into_iter()
        .find(|p| p.number() == number)
}

pub fn address(bytes: &[u8]) -> Option<IpAddr> {
    if let Ok(v4) = <[u8; 4]>::try_from(bytes) {
        return Some(IpAddr::V4(Ipv4Addr::from(v4)));
    }
    <[u8; 16]>::try_from(bytes)
        .ok()
        .map(|v6| IpAddr::V6(Ipv6Addr::from(v6)))
}

/// A concatenation's protocol and port fields, each padded to 4 bytes.
fn proto_port(bytes: &[u8]) -> Option<(Protocol, u16)> {
    match bytes {
        [p, 0, 0, 0, hi, lo, 0, 0] => Some((protocol(*p)?, u16::from_be_bytes([*hi, *lo]))),
        _ => None,
    }
}

/// An element's key, by the set's key fields (the shapes of `sets::key_bytes`).
pub fn key(fields: &[u32], bytes: &[u8]) -> Option<Key> {
    let addr = |kind: u32| kind == TYPE_IPADDR || kind == TYPE_IP6ADDR;
    let len = |kind: u32| field_len(kind).next_multiple_of(4);
    match fields {
        [a] if addr(*a) && bytes.len() == field_len(*a) => Some(Key::Addr(address(bytes)?)),
        [a, TYPE_INET_PROTOCOL, TYPE_INET_SERVICE] if addr(*a) && bytes.len() == len(*a) + 8 => {
            let (ip, rest) = bytes.split_at(len(*a));
            let (proto, port) = proto_port(rest)?;
            Some(Key::AddrPort(address(ip)?, proto, port))
        }
        [TYPE_INET_PROTOCOL, TYPE_INET_SERVICE] => {
            let (proto, port) = proto_port(bytes)?;
            Some(Key::Port(proto, port))
        }
        [a, b, TYPE_INET_PROTOCOL, TYPE_INET_SERVICE]
            if addr(*a) && a == b && bytes.len() == 2 * len(*a) + 8 =>
        {
            let (src, rest) = bytes.split_at(len(*a));
            let (dst, rest) = rest.split_at(len(*a));
            let (proto, port) = proto_port(rest)?;
            Some(Key::Hairpin(address(src)?, address(dst)?, proto, port))
        }
        _ => None,
    }
}

/// A named object: its name and type (`NFT_OBJECT_*`).
pub fn object(t: &Attrs<'_>) -> Result<(String, u32), Malformed> {
    Ok((
        t.need_str(NFTA_OBJ_NAME)?.to_owned(),
        t.need_be32(NFTA_OBJ_TYPE)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube_proxy::nft::netlink::sets::key_bytes;

    #[test]
    fn keys_read_back_as_they_are_written() {
        let v4 = TYPE_IPADDR;
        let v6 = TYPE_IP6ADDR;
        let (p, s) = (TYPE_INET_PROTOCOL, TYPE_INET_SERVICE);
        let a: IpAddr = "10.0.0.1".parse().expect("an address");
        let b: IpAddr = "fd00::2".parse().expect("an address");
        let cases = [
            (vec![v4], Key::Addr(a)),
            (vec![v6], Key::Addr(b)),
            (vec![v4, p, s], Key::AddrPort(a, Protocol::Sctp, 443)),
            (vec![v6, p, s], Key::AddrPort(b, Protocol::Udp, 53)),
            (vec![p, s], Key::Port(Protocol::Tcp, 30080)),
            (vec![v6, v6, p, s], Key::Hairpin(b, b, Protocol::Tcp, 80)),
        ];
        for (fields, k) in cases {
            assert_eq!(key(&fields, &key_bytes(&k)), Some(k.clone()), "{k}");
            let ty = fields.iter().fold(0, |acc, f| (acc << TYPE_BITS) | f);
            assert_eq!(super::fields(ty), fields);
        }
        // The wrong length or shape reads as nothing, never as another key.
        assert_eq!(key(&[v4], &[1, 2, 3]), None);
        assert_eq!(key(&[p, s], &[6, 0, 0, 0, 0, 80, 1, 0]), None);
        assert_eq!(key(&[p, s], &[250, 0, 0, 0, 0, 80, 0, 0]), None);
    }
}
