//! HTTP/2 frames written and read by hand on a raw connection, for tests that must see the
//! exact bytes (no client library in between).

use tokio::io::{AsyncRead, AsyncReadExt};

use super::within;

pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const WINDOW_UPDATE: u8 = 0x8;
pub const END_HEADERS: u8 = 0x4;
pub const ACK: u8 = 0x1;
pub const FRAME_HEADER: usize = 9;
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// One frame as bytes on the wire.
pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// One frame as read.
pub struct Frame {
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

/// The length, type, flags and stream of the frame header `header` (9 bytes).
fn parse_header(header: &[u8]) -> (usize, u8, u8, u32) {
    let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
    let stream = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
    (len, header[3], header[4], stream)
}

/// Splits `bytes` into whole frames; panics on a partial one.
pub fn frames(mut bytes: &[u8]) -> Vec<Frame> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        assert!(bytes.len() >= FRAME_HEADER, "a partial frame header");
        let (len, kind, flags, stream) = parse_header(bytes);
        assert!(bytes.len() >= FRAME_HEADER + len, "a partial frame");
        out.push(Frame {
            kind,
            flags,
            stream,
            payload: bytes[FRAME_HEADER..FRAME_HEADER + len].to_vec(),
        });
        bytes = &bytes[FRAME_HEADER + len..];
    }
    out
}

/// The next frame from `conn`.
pub async fn read_frame<R: AsyncRead + Unpin>(conn: &mut R) -> Frame {
    let mut header = [0u8; FRAME_HEADER];
    within("a frame header", conn.read_exact(&mut header))
        .await
        .unwrap();
    let (len, kind, flags, stream) = parse_header(&header);
    let mut payload = vec![0u8; len];
    within("a frame's payload", conn.read_exact(&mut payload))
        .await
        .unwrap();
    Frame {
        kind,
        flags,
        stream,
        payload,
    }
}
