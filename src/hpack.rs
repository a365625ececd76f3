//! Just enough HPACK (RFC 7541) decoding for `authority`: follows a connection's request
//! header blocks, keeping the dynamic table's names and sizes in step with the client's
//! encoder, and yields each field's name and, for `:authority` only, its value.
//!
//! Values of other fields are decoded only as far as their length, which the table's size
//! accounting needs. The Huffman decoder walks the canonical code length by length, with no
//! allocation and no hashing. What this accepts loosely (padding, oversized updates) reaches
//! h2 unchanged, which rejects it.

use std::collections::VecDeque;
use std::sync::OnceLock;

/// The decoder's table limit: h2 advertises SETTINGS_HEADER_TABLE_SIZE 4096 (the default).
const MAX_TABLE_SIZE: usize = 4096;
/// RFC 7541 section 4.1: an entry's size is its name and value lengths plus 32.
const ENTRY_OVERHEAD: usize = 32;

/// The static table's names (RFC 7541 Appendix A), index 1 first.
const STATIC_NAMES: [&[u8]; 61] = [
    b":authority",
    b":method",
    b":method",
    b":path",
    b":path",
    b":scheme",
    b":scheme",
    b":status",
    b":status",
    b":status",
    b":status",
    b":status",
    b":status",
    b":status",
    b"accept-charset",
    b"accept-encoding",
    b"accept-language",
    b"accept-ranges",
    b"accept",
    b"access-control-allow-origin",
    b"age",
    b"allow",
    b"authorization",
    b"cache-control",
    b"content-disposition",
    b"content-encoding",
    b"content-language",
    b"content-length",
    b"content-location",
    b"content-range",
    b"content-type",
    b"cookie",
    b"date",
    b"etag",
    b"expect",
    b"expires",
    b"from",
    b"host",
    b"if-match",
    b"if-modified-since",
    b"if-none-match",
    b"if-range",
    b"if-unmodified-since",
    b"last-modified",
    b"link",
    b"location",
    b"max-forwards",
    b"proxy-authenticate",
    b"proxy-authorization",
    b"range",
    b"referer",
    b"refresh",
    b"retry-after",
    b"server",
    b"set-cookie",
    b"strict-transport-security",
    b"transfer-encoding",
    b"user-agent",
    b"vary",
    b"via",
    b"www-authenticate",
];

/// RFC 7541 Appendix B: (code, bit length) of every symbol, 256 = EOS.
const HUFFMAN_CODES: [(u32, u8); 257] = [
    (0x1ff8, 13),
    (0x7fffd8, 23),
    (0xfffffe2, 28),
    (0xfffffe3, 28),
    (0xfffffe4, 28),
    (0xfffffe5, 28),
    (0xfffffe6, 28),
    (0xfffffe7, 28),
    (0xfffffe8, 28),
    (0xffffea, 24),
    (0x3ffffffc, 30),
    (0xfffffe9, 28),
    (0xfffffea, 28),
    (0x3ffffffd, 30),
    (0xfffffeb, 28),
    (0xfffffec, 28),
    (0xfffffed, 28),
    (0xfffffee, 28),
    (0xfffffef, 28),
    (0xffffff0, 28),
    (0xffffff1, 28),
    (0xffffff2, 28),
    (0x3ffffffe, 30),
    (0xffffff3, 28),
    (0xffffff4, 28),
    (0xffffff5, 28),
    (0xffffff6, 28),
    (0xffffff7, 28),
    (0xffffff8, 28),
    (0xffffff9, 28),
    (0xffffffa, 28),
    (0xffffffb, 28),
    (0x14, 6),
    (0x3f8, 10),
    (0x3f9, 10),
    (0xffa, 12),
    (0x1ff9, 13),
    (0x15, 6),
    (0xf8, 8),
    (0x7fa, 11),
    (0x3fa, 10),
    (0x3fb, 10),
    (0xf9, 8),
    (0x7fb, 11),
    (0xfa, 8),
    (0x16, 6),
    (0x17, 6),
    (0x18, 6),
    (0x0, 5),
    (0x1, 5),
    (0x2, 5),
    (0x19, 6),
    (0x1a, 6),
    (0x1b, 6),
    (0x1c, 6),
    (0x1d, 6),
    (0x1e, 6),
    (0x1f, 6),
    (0x5c, 7),
    (0xfb, 8),
    (0x7ffc, 15),
    (0x20, 6),
    (0xffb, 12),
    (0x3fc, 10),
    (0x1ffa, 13),
    (0x21, 6),
    (0x5d, 7),
    (0x5e, 7),
    (0x5f, 7),
    (0x60, 7),
    (0x61, 7),
    (0x62, 7),
    (0x63, 7),
    (0x64, 7),
    (0x65, 7),
    (0x66, 7),
    (0x67, 7),
    (0x68, 7),
    (0x69, 7),
    (0x6a, 7),
    (0x6b, 7),
    (0x6c, 7),
    (0x6d, 7),
    (0x6e, 7),
    (0x6f, 7),
    (0x70, 7),
    (0x71, 7),
    (0x72, 7),
    (0xfc, 8),
    (0x73, 7),
    (0xfd, 8),
    (0x1ffb, 13),
    (0x7fff0, 19),
    (0x1ffc, 13),
    (0x3ffc, 14),
    (0x22, 6),
    (0x7ffd, 15),
    (0x3, 5),
    (0x23, 6),
    (0x4, 5),
    (0x24, 6),
    (0x5, 5),
    (0x25, 6),
    (0x26, 6),
    (0x27, 6),
    (0x6, 5),
    (0x74, 7),
    (0x75, 7),
    (0x28, 6),
    (0x29, 6),
    (0x2a, 6),
    (0x7, 5),
    (0x2b, 6),
    (0x76, 7),
    (0x2c, 6),
    (0x8, 5),
    (0x9, 5),
    (0x2d, 6),
    (0x77, 7),
    (0x78, 7),
    (0x79, 7),
    (0x7a, 7),
    (0x7b, 7),
    (0x7ffe, 15),
    (0x7fc, 11),
    (0x3ffd, 14),
    (0x1ffd, 13),
    (0xffffffc, 28),
    (0xfffe6, 20),
    (0x3fffd2, 22),
    (0xfffe7, 20),
    (0xfffe8, 20),
    (0x3fffd3, 22),
    (0x3fffd4, 22),
    (0x3fffd5, 22),
    (0x7fffd9, 23),
    (0x3fffd6, 22),
    (0x7fffda, 23),
    (0x7fffdb, 23),
    (0x7fffdc, 23),
    (0x7fffdd, 23),
    (0x7fffde, 23),
    (0xffffeb, 24),
    (0x7fffdf, 23),
    (0xffffec, 24),
    (0xffffed, 24),
    (0x3fffd7, 22),
    (0x7fffe0, 23),
    (0xffffee, 24),
    (0x7fffe1, 23),
    (0x7fffe2, 23),
    (0x7fffe3, 23),
    (0x7fffe4, 23),
    (0x1fffdc, 21),
    (0x3fffd8, 22),
    (0x7fffe5, 23),
    (0x3fffd9, 22),
    (0x7fffe6, 23),
    (0x7fffe7, 23),
    (0xffffef, 24),
    (0x3fffda, 22),
    (0x1fffdd, 21),
    (0xfffe9, 20),
    (0x3fffdb, 22),
    (0x3fffdc, 22),
    (0x7fffe8, 23),
    (0x7fffe9, 23),
    (0x1fffde, 21),
    (0x7fffea, 23),
    (0x3fffdd, 22),
    (0x3fffde, 22),
    (0xfffff0, 24),
    (0x1fffdf, 21),
    (0x3fffdf, 22),
    (0x7fffeb, 23),
    (0x7fffec, 23),
    (0x1fffe0, 21),
    (0x1fffe1, 21),
    (0x3fffe0, 22),
    (0x1fffe2, 21),
    (0x7fffed, 23),
    (0x3fffe1, 22),
    (0x7fffee, 23),
    (0x7fffef, 23),
    (0xfffea, 20),
    (0x3fffe2, 22),
    (0x3fffe3, 22),
    (0x3fffe4, 22),
    (0x7ffff0, 23),
    (0x3fffe5, 22),
    (0x3fffe6, 22),
    (0x7ffff1, 23),
    (0x3ffffe0, 26),
    (0x3ffffe1, 26),
    (0xfffeb, 20),
    (0x7fff1, 19),
    (0x3fffe7, 22),
    (0x7ffff2, 23),
    (0x3fffe8, 22),
    (0x1ffffec, 25),
    (0x3ffffe2, 26),
    (0x3ffffe3, 26),
    (0x3ffffe4, 26),
    (0x7ffffde, 27),
    (0x7ffffdf, 27),
    (0x3ffffe5, 26),
    (0xfffff1, 24),
    (0x1ffffed, 25),
    (0x7fff2, 19),
    (0x1fffe3, 21),
    (0x3ffffe6, 26),
    (0x7ffffe0, 27),
    (0x7ffffe1, 27),
    (0x3ffffe7, 26),
    (0x7ffffe2, 27),
    (0xfffff2, 24),
    (0x1fffe4, 21),
    (0x1fffe5, 21),
    (0x3ffffe8, 26),
    (0x3ffffe9, 26),
    (0xffffffd, 28),
    (0x7ffffe3, 27),
    (0x7ffffe4, 27),
    (0x7ffffe5, 27),
    (0xfffec, 20),
    (0xfffff3, 24),
    (0xfffed, 20),
    (0x1fffe6, 21),
    (0x3fffe9, 22),
    (0x1fffe7, 21),
    (0x1fffe8, 21),
    (0x7ffff3, 23),
    (0x3fffea, 22),
    (0x3fffeb, 22),
    (0x1ffffee, 25),
    (0x1ffffef, 25),
    (0xfffff4, 24),
    (0xfffff5, 24),
    (0x3ffffea, 26),
    (0x7ffff4, 23),
    (0x3ffffeb, 26),
    (0x7ffffe6, 27),
    (0x3ffffec, 26),
    (0x3ffffed, 26),
    (0x7ffffe7, 27),
    (0x7ffffe8, 27),
    (0x7ffffe9, 27),
    (0x7ffffea, 27),
    (0x7ffffeb, 27),
    (0xffffffe, 28),
    (0x7ffffec, 27),
    (0x7ffffed, 27),
    (0x7ffffee, 27),
    (0x7ffffef, 27),
    (0x7fffff0, 27),
    (0x3ffffee, 26),
    (0x3fffffff, 30),
];

/// One field of a block: whether its name is `:authority`, and then its decoded value.
#[derive(Debug, PartialEq, Eq)]
pub struct Field {
    pub authority: bool,
    /// Set for `:authority` fields given as a literal value (empty otherwise).
    pub value: Vec<u8>,
}

#[derive(Debug)]
pub struct DecodeError(pub &'static str);

/// The canonical Huffman code as first code, count and first symbol slot per bit length.
struct Canonical {
    first: [u32; 31],
    count: [u32; 31],
    offset: [u16; 31],
    symbols: [u16; 257],
}

fn canonical() -> &'static Canonical {
    static TABLE: OnceLock<Canonical> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut c = Canonical {
            first: [0; 31],
            count: [0; 31],
            offset: [0; 31],
            symbols: [0; 257],
        };
        let mut slot = 0usize;
        for len in 1..=30u8 {
            let mut at: Vec<(u32, u16)> = HUFFMAN_CODES
                .iter()
                .enumerate()
                .filter(|(_, (_, l))| *l == len)
                .map(|(sym, (code, _))| (*code, sym as u16))
                .collect();
            at.sort_unstable();
            c.offset[len as usize] = slot as u16;
            c.count[len as usize] = at.len() as u32;
            c.first[len as usize] = at.first().map_or(0, |x| x.0);
            for (i, (code, sym)) in at.into_iter().enumerate() {
                // RFC 7541's code is canonical: the codes of one length are consecutive.
                debug_assert_eq!(code, c.first[len as usize] + i as u32);
                c.symbols[slot] = sym;
                slot += 1;
            }
        }
        c
    })
}

/// Decodes a Huffman-coded string into `out`.
pub fn huffman_decode(data: &[u8], out: &mut Vec<u8>) -> Result<(), DecodeError> {
    let c = canonical();
    let (mut code, mut len) = (0u32, 0usize);
    for byte in data {
        for shift in (0..8).rev() {
            code = (code << 1) | u32::from((byte >> shift) & 1);
            len += 1;
            if len > 30 {
                return Err(DecodeError("invalid Huffman code"));
            }
            let index = code.wrapping_sub(c.first[len]);
            if index < c.count[len] {
                let symbol = c.symbols[c.offset[len] as usize + index as usize];
                if symbol == 256 {
                    return Err(DecodeError("EOS in a Huffman string"));
                }
                out.push(symbol as u8);
                code = 0;
                len = 0;
            }
        }
    }
    // The padding: at most 7 bits, all ones (the EOS code's prefix).
    if len > 7 || code != (1 << len) - 1 {
        return Err(DecodeError("invalid Huffman padding"));
    }
    Ok(())
}

/// An HPACK integer (RFC 7541 section 5.1) with a `prefix_bits`-bit prefix: (value, next pos).
pub fn decode_int(buf: &[u8], pos: usize, prefix_bits: u8) -> Option<(usize, usize)> {
    let mask = (1usize << prefix_bits) - 1;
    let mut value = (*buf.get(pos)? as usize) & mask;
    let mut pos = pos + 1;
    if value < mask {
        return Some((value, pos));
    }
    let mut shift = 0u32;
    loop {
        let byte = *buf.get(pos)?;
        pos += 1;
        value = value.checked_add(((byte & 0x7f) as usize).checked_shl(shift)?)?;
        if byte & 0x80 == 0 {
            return Some((value, pos));
        }
        shift += 7;
        if shift > 28 {
            return None;
        }
    }
}

/// A string literal at `pos` decoded into `out` (cleared first); returns the next position.
fn decode_string(buf: &[u8], pos: usize, out: &mut Vec<u8>) -> Result<usize, DecodeError> {
    let malformed = DecodeError("malformed string literal");
    let huffman = buf.get(pos).ok_or(DecodeError("truncated block"))? & 0x80 != 0;
    let (len, start) = decode_int(buf, pos, 7).ok_or(DecodeError("bad string length"))?;
    let end = start
        .checked_add(len)
        .filter(|e| *e <= buf.len())
        .ok_or(malformed)?;
    out.clear();
    if huffman {
        huffman_decode(&buf[start..end], out)?;
    } else {
        out.extend_from_slice(&buf[start..end]);
    }
    Ok(end)
}

/// One direction's HPACK decoding state: the dynamic table's names and entry sizes.
#[derive(Default)]
pub struct HpackDecoder {
    /// Newest first: (name, entry size).
    table: VecDeque<(Box<[u8]>, usize)>,
    size: usize,
    max_size: Option<usize>,
}

impl HpackDecoder {
    fn max(&self) -> usize {
        self.max_size.unwrap_or(MAX_TABLE_SIZE)
    }

    fn evict_to(&mut self, limit: usize) {
        while self.size > limit {
            match self.table.pop_back() {
                Some((_, s)) => self.size -= s,
                None => break,
            }
        }
    }

    fn insert(&mut self, name: &[u8], value_len: usize) {
        let size = name.len() + value_len + ENTRY_OVERHEAD;
        if size > self.max() {
            self.table.clear();
            self.size = 0;
            return;
        }
        self.evict_to(self.max() - size);
        self.table.push_front((name.into(), size));
        self.size += size;
    }

    fn name(&self, index: usize) -> Result<&[u8], DecodeError> {
        match index {
            0 => Err(DecodeError("index 0")),
            1..=61 => Ok(STATIC_NAMES[index - 1]),
            _ => self
                .table
                .get(index - 62)
                .map(|(n, _)| &**n)
                .ok_or(DecodeError("index past the dynamic table")),
        }
    }

    /// Decodes one header block: a field per representation, in order (a table size update
    /// yields none).
    pub fn decode(&mut self, block: &[u8]) -> Result<Vec<Field>, DecodeError> {
        let bad_int = || DecodeError("bad integer");
        let mut fields = Vec::new();
        let mut name_buf = Vec::new();
        let mut value_buf = Vec::new();
        let mut pos = 0;
        while pos < block.len() {
            let first = block[pos];
            if first & 0x80 != 0 {
                let (index, end) = decode_int(block, pos, 7).ok_or_else(bad_int)?;
                let authority = self.name(index)? == b":authority";
                fields.push(Field {
                    authority,
                    value: Vec::new(),
                });
                pos = end;
                continue;
            }
            if first & 0xe0 == 0x20 {
                let (size, end) = decode_int(block, pos, 5).ok_or_else(bad_int)?;
                if size > MAX_TABLE_SIZE {
                    return Err(DecodeError("table size update past the limit"));
                }
                self.max_size = Some(size);
                self.evict_to(size);
                pos = end;
                continue;
            }
            let indexing = first & 0xc0 == 0x40;
            let prefix_bits = if indexing { 6 } else { 4 };
            let (name_index, after) = decode_int(block, pos, prefix_bits).ok_or_else(bad_int)?;
            let value_start = if name_index == 0 {
                decode_string(block, after, &mut name_buf)?
            } else {
                name_buf.clear();
                name_buf.extend_from_slice(self.name(name_index)?);
                after
            };
            pos = decode_string(block, value_start, &mut value_buf)?;
            let authority = name_buf.as_slice() == b":authority";
            if indexing {
                self.insert(&name_buf, value_buf.len());
            }
            fields.push(Field {
                authority,
                value: if authority {
                    std::mem::take(&mut value_buf)
                } else {
                    Vec::new()
                },
            });
        }
        Ok(fields)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn rfc7541_huffman_examples() {
        let mut out = Vec::new();
        huffman_decode(&hex("f1e3 c2e5 f23a 6ba0 ab90 f4ff"), &mut out).unwrap();
        assert_eq!(out, b"www.example.com");
        out.clear();
        huffman_decode(&hex("a8eb 1064 9cbf"), &mut out).unwrap();
        assert_eq!(out, b"no-cache");
        out.clear();
        huffman_decode(&hex("25a8 49e9 5ba9 7d7f"), &mut out).unwrap();
        assert_eq!(out, b"custom-key");
    }

    #[test]
    fn rfc7541_c4_request_sequence_with_huffman() {
        let mut d = HpackDecoder::default();
        let f = d
            .decode(&hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff"))
            .unwrap();
        assert_eq!(f.len(), 4);
        assert!(f[3].authority);
        assert_eq!(f[3].value, b"www.example.com");
        assert_eq!(d.size, 57);
        // C.4.2: :authority by index 62 (the dynamic entry), cache-control inserted.
        let f = d.decode(&hex("8286 84be 5886 a8eb 1064 9cbf")).unwrap();
        assert_eq!(f.len(), 5);
        assert!(f[3].authority && f[3].value.is_empty());
        assert_eq!(d.size, 110);
        let f = d
            .decode(&hex(
                "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
            ))
            .unwrap();
        assert_eq!(f.len(), 5);
        assert!(f[3].authority);
        assert_eq!(d.size, 164);
        assert_eq!(&*d.table[0].0, b"custom-key");
    }

    #[test]
    fn follows_loona_hpack_through_evictions() {
        let mut encoder = loona_hpack::Encoder::new();
        let mut reference = loona_hpack::Decoder::new();
        let mut ours = HpackDecoder::default();
        for i in 0..300usize {
            let authority = format!("host-{}.example:{}", i % 7, 8000 + i % 3);
            let custom = "x".repeat(i * 37 % 900);
            let list: Vec<(Vec<u8>, Vec<u8>)> = vec![
                (b":method".to_vec(), b"POST".to_vec()),
                (b":authority".to_vec(), authority.into_bytes()),
                (
                    format!("x-key-{}", i % 11).into_bytes(),
                    custom.into_bytes(),
                ),
                (
                    b"user-agent".to_vec(),
                    format!("client/{}", i % 5).into_bytes(),
                ),
            ];
            let block = encoder.encode(list.iter().map(|(n, v)| (&n[..], &v[..])));
            let want = reference.decode(&block).unwrap();
            let got = ours.decode(&block).unwrap();
            assert_eq!(got.len(), want.len(), "block {i}");
            for (g, (name, value)) in got.iter().zip(&want) {
                assert_eq!(g.authority, name.as_slice() == b":authority", "block {i}");
                if !g.value.is_empty() {
                    assert_eq!(&g.value, value, "block {i}");
                }
            }
            assert!(ours.size <= MAX_TABLE_SIZE);
        }
    }

    #[test]
    fn bad_blocks_are_errors() {
        let mut d = HpackDecoder::default();
        assert!(d.decode(&[0xff]).is_err()); // truncated integer
        assert!(d.decode(&[0x80 | 70]).is_err()); // past the table
        assert!(d.decode(&hex("41 8c f1e3")).is_err()); // truncated string
    }
}
