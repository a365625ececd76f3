//! Reading the kernel's answers: messages split off a datagram by their lengths, attributes
//! read off a message or a nest, libnftnl's userdata TLVs read off an attribute. Every length
//! is checked against what is there, so a malformed answer is an error, never a panic or a
//! read past its end. Attributes are looked up by type, whatever order the kernel wrote them
//! in (a dump's order is not nft's).

use netlink_packet_core::{NLA_F_NESTED, NLA_HEADER_SIZE, NLA_TYPE_MASK};

/// What makes an answer unreadable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    #[error("a message of {0} bytes is shorter than its headers")]
    ShortMessage(usize),
    #[error("a message claims {claimed} bytes where {left} are left")]
    MessageLength { claimed: usize, left: usize },
    #[error("an attribute of {what} claims {claimed} bytes where {left} are left")]
    AttributeLength {
        what: &'static str,
        claimed: usize,
        left: usize,
    },
    #[error("attribute {kind} of {what} is {len} bytes, not {want}")]
    Width {
        what: &'static str,
        kind: u16,
        len: usize,
        want: usize,
    },
    #[error("{what} has no attribute {kind}")]
    Missing { what: &'static str, kind: u16 },
    #[error("attribute {kind} of {what} is not a string")]
    NotText { what: &'static str, kind: u16 },
    #[error("{what}: {detail}")]
    Value { what: &'static str, detail: String },
}

/// The netlink header.
pub const NLMSG_HEADER: usize = 16;
/// `struct nfgenmsg`: family, version, resource id.
const NFGENMSG: usize = 4;

/// One message of a datagram.
#[derive(Clone, Copy, Debug)]
pub struct Message<'a> {
    pub kind: u16,
    pub flags: u16,
    pub sequence: u32,
    /// What follows the netlink header.
    pub body: &'a [u8],
}

impl<'a> Message<'a> {
    /// An nf_tables message's attributes (after its `nfgenmsg`).
    pub fn attributes(&self) -> Result<Attrs<'a>, Malformed> {
        self.body
            .get(NFGENMSG..)
            .map(Attrs::new)
            .ok_or(Malformed::ShortMessage(NLMSG_HEADER + self.body.len()))
    }
}

fn ne_u16(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}

fn ne_u32(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

/// The messages of one datagram, in order.
pub fn messages(datagram: &[u8]) -> Result<Vec<Message<'_>>, Malformed> {
    let mut out = Vec::new();
    let mut rest = datagram;
    while !rest.is_empty() {
        let (Some(len), Some(kind), Some(flags), Some(sequence)) = (
            ne_u32(rest, 0),
            ne_u16(rest, 4),
            ne_u16(rest, 6),
            ne_u32(rest, 8),
        ) else {
            return Err(Malformed::ShortMessage(rest.len()));
        };
        let len = len as usize;
        if len < NLMSG_HEADER {
            return Err(Malformed::ShortMessage(len));
        }
        let Some(whole) = rest.get(..len) else {
            return Err(Malformed::MessageLength {
                claimed: len,
                left: rest.len(),
            });
        };
        out.push(Message {
            kind,
            flags,
            sequence,
            body: &whole[NLMSG_HEADER..],
        });
        rest = rest.get(len.next_multiple_of(4)..).unwrap_or_default();
    }
    Ok(out)
}

/// The errno of an `NLMSG_ERROR` (0 for an ack) or of an `NLMSG_DONE`, as a positive number.
pub fn errno(message: &Message<'_>) -> Result<i32, Malformed> {
    let raw = message
        .body
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .map(i32::from_ne_bytes)
        .ok_or(Malformed::ShortMessage(NLMSG_HEADER + message.body.len()))?;
    Ok(raw.saturating_abs())
}

/// A run of attributes: a message's, or a nest's.
#[derive(Clone, Copy, Debug)]
pub struct Attrs<'a> {
    bytes: &'a [u8],
}

impl<'a> Attrs<'a> {
    pub fn new(bytes: &'a [u8]) -> Attrs<'a> {
        Attrs { bytes }
    }

    /// Each attribute's type (without the nested and byte-order flags) and value.
    pub fn each(&self, what: &'static str) -> Result<Vec<(u16, &'a [u8])>, Malformed> {
        let mut out = Vec::new();
        let mut rest = self.bytes;
        while rest.len() >= NLA_HEADER_SIZE {
            let len = usize::from(ne_u16(rest, 0).unwrap_or(0));
            let kind = ne_u16(rest, 2).unwrap_or(0) & NLA_TYPE_MASK & !NLA_F_NESTED;
            if len < NLA_HEADER_SIZE || len > rest.len() {
                return Err(Malformed::AttributeLength {
                    what,
                    claimed: len,
                    left: rest.len(),
                });
            }
            out.push((kind, &rest[NLA_HEADER_SIZE..len]));
            rest = rest.get(len.next_multiple_of(4)..).unwrap_or_default();
        }
        Ok(out)
    }

    /// The attributes by type (the last of a type wins; types past the table's end, which
    /// nothing read here uses, are left out).
    pub fn table(&self, what: &'static str) -> Result<Table<'a>, Malformed> {
        let mut slots = [None; SLOTS];
        for (kind, value) in self.each(what)? {
            if let Some(slot) = slots.get_mut(usize::from(kind)) {
                *slot = Some(value);
            }
        }
        Ok(Table { what, slots })
    }
}

/// More than any nf_tables object's attribute count.
const SLOTS: usize = 24;

/// One object's attributes, by type.
#[derive(Clone, Copy, Debug)]
pub struct Table<'a> {
    what: &'static str,
    slots: [Option<&'a [u8]>; SLOTS],
}

impl<'a> Table<'a> {
    pub fn what(&self) -> &'static str {
        self.what
    }

    pub fn has(&self, kind: u16) -> bool {
        self.get(kind).is_some()
    }

    pub fn get(&self, kind: u16) -> Option<&'a [u8]> {
        self.slots.get(usize::from(kind)).copied().flatten()
    }

    fn fixed<const N: usize>(&self, kind: u16) -> Result<Option<[u8; N]>, Malformed> {
        match self.get(kind) {
            None => Ok(None),
            Some(v) => v.try_into().map(Some).map_err(|_| Malformed::Width {
                what: self.what,
                kind,
                len: v.len(),
                want: N,
            }),
        }
    }

    pub fn be32(&self, kind: u16) -> Result<Option<u32>, Malformed> {
        Ok(self.fixed::<4>(kind)?.map(u32::from_be_bytes))
    }

    pub fn need_be32(&self, kind: u16) -> Result<u32, Malformed> {
        self.be32(kind)?.ok_or(Malformed::Missing {
            what: self.what,
            kind,
        })
    }

    pub fn be64(&self, kind: u16) -> Result<Option<u64>, Malformed> {
        Ok(self.fixed::<8>(kind)?.map(u64::from_be_bytes))
    }

    pub fn u8(&self, kind: u16) -> Result<Option<u8>, Malformed> {
        Ok(self.fixed::<1>(kind)?.map(|[b]| b))
    }

    /// A NUL-terminated string (the kernel's `nla_put_string`); one without its NUL is
    /// taken too.
    pub fn str(&self, kind: u16) -> Result<Option<&'a str>, Malformed> {
        let Some(value) = self.get(kind) else {
            return Ok(None);
        };
        let text = value.strip_suffix(&[0]).unwrap_or(value);
        std::str::from_utf8(text)
            .map(Some)
            .map_err(|_| Malformed::NotText {
                what: self.what,
                kind,
            })
    }

    pub fn need_str(&self, kind: u16) -> Result<&'a str, Malformed> {
        self.str(kind)?.ok_or(Malformed::Missing {
            what: self.what,
            kind,
        })
    }

    pub fn nest(&self, kind: u16) -> Option<Attrs<'a>> {
        self.get(kind).map(Attrs::new)
    }

    /// `{ NFTA_DATA_VALUE }` inside attribute `kind`: a constant's bytes.
    pub fn data_value(&self, kind: u16) -> Result<Option<&'a [u8]>, Malformed> {
        let Some(nest) = self.nest(kind) else {
            return Ok(None);
        };
        let inner = nest.table(self.what)?;
        Ok(inner.get(super::consts::NFTA_DATA_VALUE))
    }
}

/// The value of the first userdata TLV of type `kind` at the top level of `udata`; None
/// when there is none or the TLVs do not add up.
pub fn udata(udata: &[u8], kind: u8) -> Option<&[u8]> {
    let mut rest = udata;
    while let [t, len, tail @ ..] = rest {
        let len = usize::from(*len);
        let value = tail.get(..len)?;
        if *t == kind {
            return Some(value);
        }
        rest = &tail[len..];
    }
    None
}

/// A comment TLV's text (NUL-terminated in nft's userdata).
pub fn udata_comment(bytes: &[u8], kind: u8) -> Option<String> {
    let value = udata(bytes, kind)?;
    let text = value.strip_suffix(&[0]).unwrap_or(value);
    Some(String::from_utf8_lossy(text).into_owned())
}

/// A host-order 32-bit userdata number (`nftnl_udata_put_u32`).
pub fn udata_u32(bytes: &[u8], kind: u8) -> Option<u32> {
    Some(u32::from_ne_bytes(udata(bytes, kind)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_that_do_not_add_up_are_errors_not_panics() {
        // An attribute claiming more than there is.
        let bytes = [12u8, 0, 1, 0, 1, 2, 3, 4];
        assert!(matches!(
            Attrs::new(&bytes).each("x"),
            Err(Malformed::AttributeLength { claimed: 12, .. })
        ));
        // An attribute shorter than its header.
        assert!(Attrs::new(&[2, 0, 1, 0]).each("x").is_err());
        // A message claiming more than the datagram.
        let mut m = 40u32.to_ne_bytes().to_vec();
        m.extend_from_slice(&[0; 12]);
        assert!(messages(&m).is_err());
        assert!(messages(&[1, 2, 3]).is_err());
        // A number of the wrong width.
        let bytes = [6u8, 0, 2, 0, 1, 2, 0, 0];
        let table = Attrs::new(&bytes).table("x").expect("one attribute");
        assert!(table.be32(2).is_err());
        assert_eq!(table.be32(3), Ok(None));
        // Userdata TLVs past their end.
        assert_eq!(udata(&[0, 5, b'a'], 0), None);
        assert_eq!(
            udata_comment(&[1, 1, 9, 0, 3, b'h', b'i', 0], 0).as_deref(),
            Some("hi")
        );
    }

    #[test]
    fn attributes_are_found_whatever_their_order() {
        let mut w = super::super::attr::Writer::default();
        let m = w.begin(0x0a03, 0, 1, 2, 0);
        w.put_be32(5, 7);
        w.put_strz(3, "chain");
        let n = w.nest(4);
        w.put_be32(1, 2);
        w.end_nest(n);
        w.end(m);
        let bytes = w.into_bytes();
        let list = messages(&bytes).expect("one message");
        assert_eq!(list.len(), 1);
        let t = list[0]
            .attributes()
            .and_then(|a| a.table("chain"))
            .expect("attributes");
        assert_eq!(t.need_str(3), Ok("chain"));
        assert_eq!(t.be32(5), Ok(Some(7)));
        let hook = t
            .nest(4)
            .expect("a nest")
            .table("hook")
            .expect("attributes");
        assert_eq!(hook.be32(1), Ok(Some(2)));
        assert!(t.need_str(9).is_err());
    }
}
