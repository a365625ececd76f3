//! Just enough HPACK (RFC 7541) decoding for `authority`: follows a connection's request
//! header blocks, keeping the dynamic table's names and sizes in step with the client's
//! encoder, and yields each field's name and, for `:authority` only, its value.
//!
//! Values of other fields are decoded only as far as their length, which the table's size
//! accounting needs. The Huffman decoder walks the canonical code length by length, with no
//! allocation and no hashing. What this accepts loosely (padding, oversized updates) reaches
//! h2 unchanged, which rejects it.

mod huffman;

use std::collections::VecDeque;

pub use huffman::decode as huffman_decode;
#[cfg(test)]
pub use huffman::encode as huffman_encode;

/// The decoder's table limit, which must be the one h2 decodes with: h2 announces
/// SETTINGS_HEADER_TABLE_SIZE 4096 (the default) and the client's encoder stays within it.
/// `authority::settings` checks it on every connection, in the SETTINGS frame h2 writes.
pub const MAX_TABLE_SIZE: usize = 4096;
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

/// One field of a block: whether its name is `:authority`, and then its decoded value.
#[derive(Debug, PartialEq, Eq)]
pub struct Field {
    pub authority: bool,
    /// Set for `:authority` fields given as a literal value (empty otherwise).
    pub value: Vec<u8>,
}

#[derive(Debug)]
pub struct DecodeError(pub &'static str);

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
