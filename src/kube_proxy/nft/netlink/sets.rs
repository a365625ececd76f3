//! Set and map declarations as nft sends them: a named set's type text (`ipv4_addr .
//! inet_proto . inet_service : verdict`) becomes the kernel's key and data types and
//! lengths, and the userdata nft keeps beside them (byte order, `typeof`, comment) so that
//! `nft list` prints the set the same whichever program wrote it. Anonymous sets (the
//! `{ ... }` of a rule) are declared here too, with their elements, as nft declares them.

use std::net::IpAddr;

use ipnet::IpNet;

use super::attr::{Udata, Writer};
use super::consts::*;
use super::element::{Element, ElementValue};
use super::Unsupported;
use crate::kube_proxy::model::{IpFamily, Protocol};
use crate::kube_proxy::nft::objects::{Key, SetKind, SetSpec, Verdict};

/// One field of a key or a value: its nft type, its length in bytes, its byte order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Field {
    kind: u32,
    len: usize,
}

fn field(word: &str) -> Option<Field> {
    Some(match word {
        "ipv4_addr" => Field {
            kind: TYPE_IPADDR,
            len: 4,
        },
        "ipv6_addr" => Field {
            kind: TYPE_IP6ADDR,
            len: 16,
        },
        "inet_proto" => Field {
            kind: TYPE_INET_PROTOCOL,
            len: 1,
        },
        "inet_service" => Field {
            kind: TYPE_INET_SERVICE,
            len: 2,
        },
        _ => return None,
    })
}

/// A set's declaration as the kernel takes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetDecl {
    pub name: String,
    pub id: u32,
    pub flags: u32,
    pub key_type: u32,
    pub key_len: u32,
    /// A map's data type and length.
    pub data: Option<(u32, u32)>,
    pub timeout_ms: Option<u64>,
    /// `NFTA_SET_DESC_SIZE`: what nft tells the kernel of a constant set's size.
    pub desc_size: Option<u32>,
    pub udata: Vec<u8>,
}

impl SetDecl {
    /// `NFT_MSG_NEWSET`'s attributes, in libnftnl's order.
    pub fn write(&self, w: &mut Writer, table: &str) {
        w.put_strz(NFTA_SET_TABLE, table);
        w.put_strz(NFTA_SET_NAME, &self.name);
        w.put_be32(NFTA_SET_FLAGS, self.flags);
        w.put_be32(NFTA_SET_KEY_TYPE, self.key_type);
        w.put_be32(NFTA_SET_KEY_LEN, self.key_len);
        if let Some((kind, len)) = self.data {
            w.put_be32(NFTA_SET_DATA_TYPE, kind);
            w.put_be32(NFTA_SET_DATA_LEN, len);
        }
        w.put_be32(NFTA_SET_ID, self.id);
        if let Some(size) = self.desc_size {
            let desc = w.nest(NFTA_SET_DESC);
            w.put_be32(NFTA_SET_DESC_SIZE, size);
            w.end_nest(desc);
        }
        if let Some(ms) = self.timeout_ms {
            w.put_be64(NFTA_SET_TIMEOUT, ms);
        }
        w.put(NFTA_SET_USERDATA, &self.udata);
    }
}

/// A named set or map as the proxy declares it (`add set` / `add map`).
pub fn named(name: &str, id: u32, spec: &SetSpec) -> Result<SetDecl, Unsupported> {
    let (key_text, data_text) = match spec.key_type.split_once(" : ") {
        Some((key, data)) => (key, Some(data.trim())),
        None => (spec.key_type.as_str(), None),
    };
    let fields = key_text
        .split(" . ")
        .map(|w| field(w.trim()).ok_or_else(|| Unsupported::KeyType(spec.key_type.clone())))
        .collect::<Result<Vec<Field>, Unsupported>>()?;
    let mut flags = 0;
    for flag in &spec.flags {
        flags |= match flag.as_str() {
            "dynamic" => NFT_SET_EVAL,
            "timeout" => NFT_SET_TIMEOUT,
            // Interval sets, constant sets and the rest need element encodings the proxy
            // never writes into a named set.
            other => return Err(Unsupported::SetFlag(other.to_owned())),
        };
    }
    let data = match (spec.kind, data_text) {
        (SetKind::Map, Some("verdict")) => {
            flags |= NFT_SET_MAP;
            Some((NFT_DATA_VERDICT, 0))
        }
        (SetKind::Set, None) => None,
        _ => return Err(Unsupported::KeyType(spec.key_type.clone())),
    };
    let key_type = fields.iter().fold(0, |acc, f| (acc << TYPE_BITS) | f.kind);
    // A concatenation's fields are each padded to a 32-bit register.
    let concat = fields.len() > 1;
    let key_len: usize = if concat {
        fields.iter().map(|f| f.len.next_multiple_of(4)).sum()
    } else {
        fields.iter().map(|f| f.len).sum()
    };

    let mut udata = Udata::new();
    // A concatenation has no byte order of its own.
    udata.put_u32(
        UDATA_SET_KEYBYTEORDER,
        if concat {
            BYTEORDER_INVALID
        } else {
            BYTEORDER_BIG_ENDIAN
        },
    );
    if data.is_some() {
        udata.put_u32(UDATA_SET_DATABYTEORDER, BYTEORDER_INVALID);
    }
    if concat {
        // nft records a concatenated key's expression kind, with no data for a key
        // declared by `type` (its fields are plain types).
        let typeof_nest = udata.nest(UDATA_SET_KEY_TYPEOF);
        udata.put_u32(UDATA_SET_TYPEOF_EXPR, EXPR_CONCAT);
        let inner = udata.nest(UDATA_SET_TYPEOF_DATA);
        udata.end_nest(inner);
        udata.end_nest(typeof_nest);
    }
    if data.is_some() {
        udata.put_u32(UDATA_SET_DATA_INTERVAL, 0);
    }
    if let Some(comment) = &spec.comment {
        check_comment(comment)?;
        udata.put_strz(UDATA_SET_COMMENT, comment);
    }
    Ok(SetDecl {
        name: name.to_owned(),
        id,
        flags,
        key_type,
        key_len: u32::try_from(key_len).unwrap_or(u32::MAX),
        data,
        timeout_ms: spec.timeout_secs.map(|s| u64::from(s) * 1000),
        desc_size: None,
        udata: udata.bytes().to_vec(),
    })
}

/// nft refuses a comment longer than this (`NFTNL_UDATA_COMMENT_MAXLEN`).
pub const COMMENT_MAX: usize = 128;

pub fn check_comment(comment: &str) -> Result<(), Unsupported> {
    if comment.len() > COMMENT_MAX {
        return Err(Unsupported::CommentTooLong(comment.len()));
    }
    Ok(())
}

pub fn addr_bytes(ip: &IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(ip) => ip.octets().to_vec(),
        IpAddr::V6(ip) => ip.octets().to_vec(),
    }
}

/// A protocol and a port as concatenation fields: each padded to 4 bytes.
fn push_proto_port(out: &mut Vec<u8>, proto: Protocol, port: u16) {
    out.extend_from_slice(&[proto.number(), 0, 0, 0]);
    out.extend_from_slice(&port.to_be_bytes());
    out.extend_from_slice(&[0, 0]);
}

/// An element's key as the kernel stores it (concatenation fields padded to 4 bytes).
pub fn key_bytes(key: &Key) -> Vec<u8> {
    let mut out = Vec::with_capacity(40);
    match key {
        Key::Addr(ip) => out.extend_from_slice(&addr_bytes(ip)),
        Key::AddrPort(ip, proto, port) => {
            out.extend_from_slice(&addr_bytes(ip));
            push_proto_port(&mut out, *proto, *port);
        }
        Key::Port(proto, port) => push_proto_port(&mut out, *proto, *port),
        Key::Hairpin(src, dst, proto, port) => {
            out.extend_from_slice(&addr_bytes(src));
            out.extend_from_slice(&addr_bytes(dst));
            push_proto_port(&mut out, *proto, *port);
        }
    }
    out
}

pub fn verdict_value(verdict: &Verdict) -> ElementValue {
    match verdict {
        Verdict::Goto(chain) => ElementValue::Verdict {
            code: NFT_GOTO,
            chain: Some(chain.clone()),
        },
        Verdict::Jump(chain) => ElementValue::Verdict {
            code: NFT_JUMP,
            chain: Some(chain.clone()),
        },
        Verdict::Drop => ElementValue::Verdict {
            code: NF_DROP,
            chain: None,
        },
        Verdict::Accept => ElementValue::Verdict {
            code: NF_ACCEPT,
            chain: None,
        },
    }
}

/// An anonymous set or map of a rule, with its elements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AnonSet {
    pub decl: SetDecl,
    pub elements: Vec<Element>,
}

/// What the family's IP header looks like to nft.
#[derive(Clone, Copy, Debug)]
pub struct FamilyInfo {
    pub nfproto: u8,
    pub addr_len: usize,
    pub addr_type: u32,
    pub saddr_offset: u32,
    pub daddr_offset: u32,
    /// nft's `PROTO_DESC_IP` / `PROTO_DESC_IP6` and its templates' indexes for the source
    /// and destination address, as set userdata records a `typeof` key.
    pub payload_desc: u32,
    pub saddr_template: u32,
    pub daddr_template: u32,
    pub reject_code: u8,
}

impl FamilyInfo {
    pub fn of(family: IpFamily) -> FamilyInfo {
        match family {
            IpFamily::V4 => FamilyInfo {
                nfproto: NFPROTO_IPV4,
                addr_len: 4,
                addr_type: TYPE_IPADDR,
                saddr_offset: 12,
                daddr_offset: 16,
                payload_desc: 12,
                saddr_template: 11,
                daddr_template: 12,
                reject_code: ICMP_PORT_UNREACH,
            },
            IpFamily::V6 => FamilyInfo {
                nfproto: NFPROTO_IPV6,
                addr_len: 16,
                addr_type: TYPE_IP6ADDR,
                saddr_offset: 8,
                daddr_offset: 24,
                payload_desc: 13,
                saddr_template: 8,
                daddr_template: 9,
                reject_code: ICMPV6_PORT_UNREACH,
            },
        }
    }
}

/// `{ a , b/n , ... }` compared with a packet's address (`template` is the address's
/// header field): a hash set of addresses, or, when a prefix is among them, an interval
/// set, merged and split into start and end elements as nft does it.
pub fn anonymous_addresses(family: FamilyInfo, template: u32, id: u32, nets: &[IpNet]) -> AnonSet {
    let hosts_only = nets.iter().all(|n| n.prefix_len() == n.max_prefix_len());
    let mut udata = Udata::new();
    udata.put_u32(UDATA_SET_KEYBYTEORDER, BYTEORDER_BIG_ENDIAN);
    if !hosts_only {
        udata.put_u32(UDATA_SET_MERGE_ELEMENTS, 1);
    }
    // The key is `typeof ip saddr` (or daddr): a payload expression, which nft records
    // with its protocol and field.
    let typeof_nest = udata.nest(UDATA_SET_KEY_TYPEOF);
    udata.put_u32(UDATA_SET_TYPEOF_EXPR, EXPR_PAYLOAD);
    let inner = udata.nest(UDATA_SET_TYPEOF_DATA);
    udata.put_u32(0, family.payload_desc);
    udata.put_u32(1, template);
    udata.end_nest(inner);
    udata.end_nest(typeof_nest);

    let (flags, elements, size) = if hosts_only {
        let elements: Vec<Element> = nets
            .iter()
            .map(|n| Element {
                key: addr_bytes(&n.addr()),
                interval_end: false,
                value: None,
                udata: None,
            })
            .collect();
        let size = elements.len();
        (NFT_SET_ANONYMOUS | NFT_SET_CONSTANT, elements, size)
    } else {
        let (elements, size) = super::intervals::elements(family.addr_len, nets);
        (
            NFT_SET_ANONYMOUS | NFT_SET_CONSTANT | NFT_SET_INTERVAL,
            elements,
            size,
        )
    };
    AnonSet {
        decl: SetDecl {
            name: "__set%d".into(),
            id,
            flags,
            key_type: family.addr_type,
            key_len: u32::try_from(family.addr_len).unwrap_or(u32::MAX),
            data: None,
            timeout_ms: None,
            desc_size: Some(u32::try_from(size).unwrap_or(u32::MAX)),
            udata: udata.bytes().to_vec(),
        },
        elements,
    }
}

/// nft's `EXPR_PAYLOAD`, `EXPR_VERDICT`.
const EXPR_PAYLOAD: u32 = 7;
const EXPR_VERDICT: u32 = 1;

/// The map of `numgen random mod N map { 0 : v0 , ... }`: integer keys in host byte order,
/// and verdicts (`vmap`) or `addr . port` values (`dnat ... to numgen ... map`).
fn numgen_map(id: u32, data: (u32, u32), values: Vec<ElementValue>, verdicts: bool) -> AnonSet {
    let mut udata = Udata::new();
    udata.put_u32(UDATA_SET_KEYBYTEORDER, BYTEORDER_HOST_ENDIAN);
    udata.put_u32(UDATA_SET_DATABYTEORDER, BYTEORDER_INVALID);
    if verdicts {
        let typeof_nest = udata.nest(UDATA_SET_DATA_TYPEOF);
        udata.put_u32(UDATA_SET_TYPEOF_EXPR, EXPR_VERDICT);
        let inner = udata.nest(UDATA_SET_TYPEOF_DATA);
        udata.end_nest(inner);
        udata.end_nest(typeof_nest);
    }
    udata.put_u32(UDATA_SET_DATA_INTERVAL, 0);
    let elements: Vec<Element> = values
        .into_iter()
        .enumerate()
        .map(|(i, value)| Element {
            key: u32::try_from(i).unwrap_or(u32::MAX).to_ne_bytes().to_vec(),
            interval_end: false,
            value: Some(value),
            udata: None,
        })
        .collect();
    udata.put(UDATA_SET_CONTENT_DIGEST, &content_digest(&elements));
    AnonSet {
        decl: SetDecl {
            name: "__map%d".into(),
            id,
            flags: NFT_SET_ANONYMOUS | NFT_SET_CONSTANT | NFT_SET_MAP,
            key_type: TYPE_INTEGER,
            key_len: 4,
            data: Some(data),
            timeout_ms: None,
            desc_size: Some(u32::try_from(elements.len()).unwrap_or(u32::MAX)),
            udata: udata.bytes().to_vec(),
        },
        elements,
    }
}

/// The digest a map's userdata carries of its elements (`UDATA_SET_CONTENT_DIGEST`): of
/// every element's key, flag, value and userdata, each field preceded by its length, so
/// that no two lists of elements write the same bytes.
pub fn content_digest(elements: &[Element]) -> ContentDigest {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    let mut field = |bytes: &[u8]| {
        h.update(u32::try_from(bytes.len()).unwrap_or(u32::MAX).to_le_bytes());
        h.update(bytes);
    };
    for e in elements {
        field(&e.key);
        field(&[u8::from(e.interval_end)]);
        match &e.value {
            None => field(&[0]),
            Some(ElementValue::Verdict { code, chain }) => {
                field(&[1]);
                field(&code.to_le_bytes());
                field(chain.as_deref().unwrap_or("").as_bytes());
            }
            Some(ElementValue::Data(bytes)) => {
                field(&[2]);
                field(bytes);
            }
        }
        field(e.udata.as_deref().unwrap_or(&[]));
    }
    let full = h.finalize();
    let mut out = [0u8; 16];
    out.copy_from_slice(&full[..16]);
    out
}

/// The first half of a SHA-256: collisions need 2^64 work, and only the node's root can
/// write a table anyway.
pub type ContentDigest = [u8; 16];

/// `numgen random mod N vmap { 0 : goto c0 , ... }`.
pub fn numgen_vmap(id: u32, chains: &[String]) -> AnonSet {
    let values = chains
        .iter()
        .map(|c| ElementValue::Verdict {
            code: NFT_GOTO,
            chain: Some(c.clone()),
        })
        .collect();
    numgen_map(id, (NFT_DATA_VERDICT, 0), values, true)
}

/// `dnat ip addr . port to numgen random mod N map { 0 : a0 . p0 , ... }`.
pub fn numgen_dnat(family: FamilyInfo, id: u32, targets: &[(IpAddr, u16)]) -> AnonSet {
    let values = targets
        .iter()
        .map(|(addr, port)| {
            let mut value = addr_bytes(addr);
            value.extend_from_slice(&port.to_be_bytes());
            value.extend_from_slice(&[0, 0]);
            ElementValue::Data(value)
        })
        .collect();
    let data_type = (family.addr_type << TYPE_BITS) | TYPE_INET_SERVICE;
    let data_len = u32::try_from(family.addr_len + 4).unwrap_or(u32::MAX);
    numgen_map(id, (data_type, data_len), values, false)
}
