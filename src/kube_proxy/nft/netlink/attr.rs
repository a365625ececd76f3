//! Netlink messages and attributes written straight into one buffer: a whole batch (tens of
//! thousands of messages, megabytes) is built without an allocation per message or per
//! attribute. Lengths are patched in when a message or a nest closes, as libmnl does, so
//! the bytes are exactly what nft (through libmnl and libnftnl) writes: 4-byte alignment
//! with zeroed padding, nests flagged `NLA_F_NESTED`, integers in network byte order where
//! the ABI says so.

use netlink_packet_core::{NLA_ALIGNTO, NLA_F_NESTED, NLA_HEADER_SIZE, NLMSG_ALIGNTO};

use super::consts::NFNETLINK_V0;

/// A buffer of netlink messages.
#[derive(Debug, Default)]
pub struct Writer {
    buf: Vec<u8>,
}

/// An open message: where its header starts.
#[must_use]
pub struct Message(usize);

/// An open nest: where its attribute header starts.
#[must_use]
pub struct Nest(usize);

fn align(len: usize, to: usize) -> usize {
    len.next_multiple_of(to)
}

impl Writer {
    pub fn with_capacity(capacity: usize) -> Writer {
        Writer {
            buf: Vec::with_capacity(capacity),
        }
    }

    #[cfg(test)]
    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }

    /// Starts a message: its netlink header (length patched by `end`) and its nfgenmsg
    /// (`res_id` is big-endian on the wire).
    pub fn begin(
        &mut self,
        message_type: u16,
        flags: u16,
        sequence: u32,
        family: u8,
        res_id: u16,
    ) -> Message {
        let start = self.buf.len();
        self.buf.extend_from_slice(&0u32.to_ne_bytes());
        self.buf.extend_from_slice(&message_type.to_ne_bytes());
        self.buf.extend_from_slice(&flags.to_ne_bytes());
        self.buf.extend_from_slice(&sequence.to_ne_bytes());
        // The port id: 0, the kernel fills in the sender's.
        self.buf.extend_from_slice(&0u32.to_ne_bytes());
        self.buf.push(family);
        self.buf.push(NFNETLINK_V0);
        self.buf.extend_from_slice(&res_id.to_be_bytes());
        Message(start)
    }

    pub fn end(&mut self, message: Message) {
        let len = self.buf.len() - message.0;
        let len = u32::try_from(len).unwrap_or(u32::MAX);
        self.buf[message.0..message.0 + 4].copy_from_slice(&len.to_ne_bytes());
        self.pad(usize::from(NLMSG_ALIGNTO));
    }

    fn pad(&mut self, to: usize) {
        let padded = align(self.buf.len(), to);
        self.buf.resize(padded, 0);
    }

    /// An attribute of raw bytes. The header's length excludes the padding.
    pub fn put(&mut self, kind: u16, value: &[u8]) {
        let len = u16::try_from(NLA_HEADER_SIZE + value.len()).unwrap_or(u16::MAX);
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(value);
        self.pad(NLA_ALIGNTO);
    }

    /// A string attribute, NUL-terminated (`mnl_attr_put_strz`).
    pub fn put_strz(&mut self, kind: u16, value: &str) {
        let len = u16::try_from(NLA_HEADER_SIZE + value.len() + 1).unwrap_or(u16::MAX);
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(value.as_bytes());
        self.buf.push(0);
        self.pad(NLA_ALIGNTO);
    }

    /// A 32-bit number in network byte order (`mnl_attr_put_u32(htonl(...))`).
    pub fn put_be32(&mut self, kind: u16, value: u32) {
        self.put(kind, &value.to_be_bytes());
    }

    pub fn put_be64(&mut self, kind: u16, value: u64) {
        self.put(kind, &value.to_be_bytes());
    }

    pub fn put_u8(&mut self, kind: u16, value: u8) {
        self.put(kind, &[value]);
    }

    pub fn nest(&mut self, kind: u16) -> Nest {
        let start = self.buf.len();
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf
            .extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
        Nest(start)
    }

    pub fn end_nest(&mut self, nest: Nest) {
        let len = self.buf.len() - nest.0;
        let len = u16::try_from(len).unwrap_or(u16::MAX);
        self.buf[nest.0..nest.0 + 2].copy_from_slice(&len.to_ne_bytes());
    }

    /// A nested `NFTA_DATA_VALUE` holding `value` (nft's `nft_data` for a constant).
    pub fn put_data_value(&mut self, kind: u16, value: &[u8]) {
        let nest = self.nest(kind);
        self.put(super::consts::NFTA_DATA_VALUE, value);
        self.end_nest(nest);
    }
}

/// libnftnl's userdata: a sequence of TLVs of a one-byte type and a one-byte length.
#[derive(Debug, Default)]
pub struct Udata {
    buf: Vec<u8>,
}

/// An open userdata nest.
#[must_use]
pub struct UdataNest(usize);

impl Udata {
    pub fn new() -> Udata {
        Udata::default()
    }

    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }

    pub fn put(&mut self, kind: u8, value: &[u8]) {
        self.buf.push(kind);
        self.buf.push(u8::try_from(value.len()).unwrap_or(u8::MAX));
        self.buf.extend_from_slice(value);
    }

    /// A NUL-terminated string (`nftnl_udata_put_strz`).
    pub fn put_strz(&mut self, kind: u8, value: &str) {
        self.buf.push(kind);
        self.buf
            .push(u8::try_from(value.len() + 1).unwrap_or(u8::MAX));
        self.buf.extend_from_slice(value.as_bytes());
        self.buf.push(0);
    }

    /// A 32-bit number in host byte order (`nftnl_udata_put_u32`).
    pub fn put_u32(&mut self, kind: u8, value: u32) {
        self.put(kind, &value.to_ne_bytes());
    }

    pub fn nest(&mut self, kind: u8) -> UdataNest {
        let start = self.buf.len();
        self.buf.push(kind);
        self.buf.push(0);
        UdataNest(start)
    }

    pub fn end_nest(&mut self, nest: UdataNest) {
        let len = self.buf.len() - nest.0 - 2;
        self.buf[nest.0 + 1] = u8::try_from(len).unwrap_or(u8::MAX);
    }
}

/// The userdata of a table, chain, rule or element with a comment: one comment TLV.
pub fn comment_udata(comment: &str) -> Udata {
    let mut udata = Udata::new();
    udata.put_strz(super::consts::UDATA_COMMENT, comment);
    udata
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_are_aligned_and_nests_carry_their_length() {
        let mut w = Writer::default();
        let m = w.begin(0x0a06, 0x0c01, 7, 2, 0);
        w.put_strz(1, "kube-proxy");
        let n = w.nest(4);
        w.put_be32(1, 0xffff_ff9c);
        w.put_u8(2, 3);
        w.end_nest(n);
        w.end(m);
        let b = w.bytes();
        assert_eq!(b.len() % 4, 0);
        assert_eq!(
            u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as usize,
            b.len(),
            "the header holds the message's length"
        );
        // "kube-proxy\0" is 11 bytes: a 15-byte attribute padded to 16.
        assert_eq!(&b[20..24], &[15, 0, 1, 0]);
        assert_eq!(&b[24..35], b"kube-proxy\0");
        assert_eq!(b[35], 0);
        // The nest: 4 + 8 + 8 (5 padded) = 20 bytes, flagged nested.
        assert_eq!(&b[36..40], &[20, 0, 4, 0x80]);
        assert_eq!(&b[40..48], &[8, 0, 1, 0, 0xff, 0xff, 0xff, 0x9c]);
        assert_eq!(&b[48..56], &[5, 0, 2, 0, 3, 0, 0, 0]);
    }

    #[test]
    fn userdata_is_type_length_value_with_nests() {
        let mut u = Udata::new();
        u.put_u32(0, 2);
        let n = u.nest(3);
        u.put_u32(0, 13);
        let inner = u.nest(1);
        u.end_nest(inner);
        u.end_nest(n);
        u.put_strz(7, "x");
        assert_eq!(
            u.bytes(),
            &[0, 4, 2, 0, 0, 0, 3, 8, 0, 4, 13, 0, 0, 0, 1, 0, 7, 2, b'x', 0]
        );
    }
}
