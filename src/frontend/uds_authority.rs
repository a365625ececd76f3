//! Lets grpc-go clients talk to us over a Unix socket.
//!
//! grpc-go (kube-apiserver, konnectivity-client) sends the percent-encoded socket path as the
//! HTTP/2 `:authority` of every request on a UDS, e.g. `%2Fetc%2Fkubernetes%2Fkonn.socket`.
//! The `h2` crate rejects that as a malformed authority and resets the stream
//! (hyperium/h2#487 is still open). The authority means nothing on a Unix socket, so this
//! wrapper renames the `:authority` field of each request header block to an ordinary header
//! of the same length before `h2` reads it.
//!
//! Keeping the name the same length keeps both HPACK dynamic tables the same size, so later
//! indexed references still line up; the value's bytes (Huffman-coded or not) are copied as
//! they are. DATA and every other frame pass through without being buffered.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Replaces `:authority`; exactly as long (10 bytes).
pub const RENAMED_AUTHORITY: &[u8] = b"x-auth-uds";
const AUTHORITY: &[u8] = b":authority";
const PREFACE_LEN: usize = 24;
const FRAME_HEADER_LEN: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The largest frame we emit: HTTP/2's default SETTINGS_MAX_FRAME_SIZE.
const MAX_FRAME: usize = 16_384;
/// A header block larger than this is passed on unchanged (h2 refuses such blocks anyway).
const MAX_BLOCK: usize = 1 << 20;

fn decode_int(buf: &[u8], pos: usize, prefix_bits: u8) -> Option<(usize, usize)> {
    let mask = (1u16 << prefix_bits) as usize - 1;
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

/// The end of the string literal starting at `pos`, and whether it is the plain (non-Huffman)
/// string `:authority`.
fn string_end(buf: &[u8], pos: usize) -> Option<(usize, bool)> {
    let huffman = buf.get(pos)? & 0x80 != 0;
    let (len, start) = decode_int(buf, pos, 7)?;
    let end = start.checked_add(len)?;
    let text = buf.get(start..end)?;
    Some((end, !huffman && text == AUTHORITY))
}

/// Rewrites a complete header block, or returns None when it holds no `:authority` (or cannot
/// be parsed, in which case h2 will report the error itself).
pub fn rewrite_header_block(block: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(block.len() + 16);
    let mut pos = 0;
    let mut changed = false;
    while pos < block.len() {
        let first = block[pos];
        if first & 0x80 != 0 {
            // Indexed field.
            let (_, end) = decode_int(block, pos, 7)?;
            out.extend_from_slice(&block[pos..end]);
            pos = end;
            continue;
        }
        if first & 0xe0 == 0x20 {
            // Dynamic table size update.
            let (_, end) = decode_int(block, pos, 5)?;
            out.extend_from_slice(&block[pos..end]);
            pos = end;
            continue;
        }
        // A literal: with incremental indexing (01), without (0000) or never indexed (0001).
        let (prefix_bits, kind) = if first & 0xc0 == 0x40 {
            (6, 0x40)
        } else {
            (4, first & 0xf0)
        };
        let (name_index, after_index) = decode_int(block, pos, prefix_bits)?;
        let (value_start, is_authority) = if name_index == 0 {
            let (end, is_authority) = string_end(block, after_index)?;
            (end, is_authority)
        } else {
            (after_index, name_index == 1)
        };
        let (value_end, _) = string_end(block, value_start)?;
        if is_authority {
            out.push(kind);
            out.push(RENAMED_AUTHORITY.len() as u8);
            out.extend_from_slice(RENAMED_AUTHORITY);
            changed = true;
        } else {
            out.extend_from_slice(&block[pos..value_start]);
        }
        out.extend_from_slice(&block[value_start..value_end]);
        pos = value_end;
    }
    changed.then_some(out)
}

/// Appends `block` as a HEADERS frame, split into CONTINUATIONs if it is too large.
fn emit_headers(out: &mut BytesMut, stream: u32, flags: u8, priority: &[u8], block: &[u8]) {
    let mut first = true;
    let mut rest = block;
    loop {
        let room = if first {
            MAX_FRAME - priority.len()
        } else {
            MAX_FRAME
        };
        let take = rest.len().min(room);
        let last = take == rest.len();
        let (kind, mut frame_flags) = if first {
            (HEADERS, flags & !(PADDED | END_HEADERS))
        } else {
            (CONTINUATION, 0)
        };
        if last {
            frame_flags |= END_HEADERS;
        }
        let payload_len = take + if first { priority.len() } else { 0 };
        out.put_uint(payload_len as u64, 3);
        out.put_u8(kind);
        out.put_u8(frame_flags);
        out.put_u32(stream);
        if first {
            out.extend_from_slice(priority);
        }
        out.extend_from_slice(&rest[..take]);
        rest = &rest[take..];
        first = false;
        if last {
            break;
        }
    }
}

/// A header block being collected across HEADERS and CONTINUATION frames.
struct OpenBlock {
    stream: u32,
    flags: u8,
    priority: Vec<u8>,
    block: Vec<u8>,
    /// The frames as received, replayed unchanged if the block is not rewritten.
    raw: BytesMut,
}

enum State {
    /// Copy this many bytes unchanged (the preface, or a frame payload).
    Passthrough(usize),
    /// Expecting a frame header.
    FrameHeader,
}

/// Wraps the server side of a Unix-socket connection; see the module docs.
pub struct AuthorityScrub<S> {
    inner: S,
    state: State,
    input: BytesMut,
    output: BytesMut,
    open: Option<OpenBlock>,
    eof: bool,
}

impl<S> AuthorityScrub<S> {
    pub fn new(inner: S) -> Self {
        AuthorityScrub {
            inner,
            state: State::Passthrough(PREFACE_LEN),
            input: BytesMut::with_capacity(16 * 1024),
            output: BytesMut::new(),
            open: None,
            eof: false,
        }
    }

    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Moves whatever complete units `input` holds into `output`.
    fn process(&mut self) {
        loop {
            match self.state {
                State::Passthrough(0) => self.state = State::FrameHeader,
                State::Passthrough(remaining) => {
                    if self.input.is_empty() {
                        return;
                    }
                    let take = remaining.min(self.input.len());
                    self.output.extend_from_slice(&self.input.split_to(take));
                    self.state = State::Passthrough(remaining - take);
                }
                State::FrameHeader => {
                    if self.input.len() < FRAME_HEADER_LEN {
                        return;
                    }
                    let len = ((self.input[0] as usize) << 16)
                        | ((self.input[1] as usize) << 8)
                        | self.input[2] as usize;
                    let kind = self.input[3];
                    let is_block = kind == HEADERS || (kind == CONTINUATION && self.open.is_some());
                    if !is_block || len > MAX_BLOCK {
                        self.flush_open_block();
                        let header = self.input.split_to(FRAME_HEADER_LEN);
                        self.output.extend_from_slice(&header);
                        self.state = State::Passthrough(len);
                        continue;
                    }
                    if self.input.len() < FRAME_HEADER_LEN + len {
                        return;
                    }
                    let frame = self.input.split_to(FRAME_HEADER_LEN + len);
                    self.take_block_frame(frame);
                }
            }
        }
    }

    fn take_block_frame(&mut self, frame: BytesMut) {
        let kind = frame[3];
        let flags = frame[4];
        let stream = u32::from_be_bytes([frame[5], frame[6], frame[7], frame[8]]) & 0x7fff_ffff;
        let payload = &frame[FRAME_HEADER_LEN..];
        if kind == HEADERS {
            self.flush_open_block();
            let mut start = 0;
            let mut pad = 0;
            if flags & PADDED != 0 {
                pad = payload.first().copied().unwrap_or(0) as usize;
                start = 1;
            }
            let priority_len = if flags & PRIORITY != 0 { 5 } else { 0 };
            let block_start = start + priority_len;
            let Some(block_end) = payload
                .len()
                .checked_sub(pad)
                .filter(|end| *end >= block_start)
            else {
                // Malformed: let h2 see it as it is.
                self.output.extend_from_slice(&frame);
                return;
            };
            self.open = Some(OpenBlock {
                stream,
                flags,
                priority: payload[start..block_start].to_vec(),
                block: payload[block_start..block_end].to_vec(),
                raw: frame.clone(),
            });
        } else if let Some(open) = &mut self.open {
            open.block.extend_from_slice(payload);
            open.raw.extend_from_slice(&frame);
        }
        if flags & END_HEADERS != 0 {
            self.finish_open_block();
        }
    }

    fn finish_open_block(&mut self) {
        let Some(open) = self.open.take() else { return };
        match rewrite_header_block(&open.block) {
            Some(block) => emit_headers(
                &mut self.output,
                open.stream,
                open.flags,
                &open.priority,
                &block,
            ),
            None => self.output.extend_from_slice(&open.raw),
        }
    }

    /// A block interrupted by another frame is a protocol error; pass it on for h2 to report.
    fn flush_open_block(&mut self) {
        if let Some(open) = self.open.take() {
            self.output.extend_from_slice(&open.raw);
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityScrub<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if !this.output.is_empty() {
                let take = this.output.len().min(buf.remaining());
                buf.put_slice(&this.output[..take]);
                this.output.advance(take);
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                // Whatever is left (a truncated frame) goes to h2 as it is.
                let rest = this.input.split();
                if rest.is_empty() {
                    if let Some(open) = this.open.take() {
                        this.output.extend_from_slice(&open.raw);
                        continue;
                    }
                    return Poll::Ready(Ok(()));
                }
                this.output.extend_from_slice(&rest);
                continue;
            }
            // Fast path: a frame payload with nothing buffered is read straight into the
            // caller's buffer.
            if let State::Passthrough(remaining) = this.state {
                if remaining > 0 && this.input.is_empty() {
                    let limit = remaining.min(buf.remaining());
                    let mut direct = ReadBuf::new(buf.initialize_unfilled_to(limit));
                    ready!(Pin::new(&mut this.inner).poll_read(cx, &mut direct))?;
                    let n = direct.filled().len();
                    if n == 0 {
                        this.eof = true;
                        continue;
                    }
                    buf.advance(n);
                    this.state = State::Passthrough(remaining - n);
                    return Poll::Ready(Ok(()));
                }
            }
            this.process();
            if !this.output.is_empty() {
                continue;
            }
            this.input.reserve(16 * 1024);
            let mut chunk = [0u8; 16 * 1024];
            let mut read = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            if read.filled().is_empty() {
                this.eof = true;
            } else {
                this.input.extend_from_slice(read.filled());
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityScrub<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for AuthorityScrub<tokio::net::UnixStream> {
    type ConnectInfo = <tokio::net::UnixStream as tonic::transport::server::Connected>::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
        out.push(kind);
        out.push(flags);
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn renames_indexed_name_authority_keeping_the_value_bytes() {
        // :method POST (idx 3), then :authority (static name 1) with a literal value, indexed.
        let value = b"%2Ftmp%2Fkonn.sock";
        let mut block = vec![0x83, 0x41, value.len() as u8];
        block.extend_from_slice(value);
        block.push(0x87); // :scheme https
        let out = rewrite_header_block(&block).unwrap();
        let mut expected = vec![0x83, 0x40, 10];
        expected.extend_from_slice(RENAMED_AUTHORITY);
        expected.push(value.len() as u8);
        expected.extend_from_slice(value);
        expected.push(0x87);
        assert_eq!(out, expected);
    }

    #[test]
    fn keeps_huffman_values_and_other_literal_kinds() {
        // Never-indexed :authority with a Huffman value (H bit set): value copied verbatim.
        let block = vec![0x11, 0x83, 0xaa, 0xbb, 0xcc];
        let out = rewrite_header_block(&block).unwrap();
        let mut expected = vec![0x10, 10];
        expected.extend_from_slice(RENAMED_AUTHORITY);
        expected.extend_from_slice(&[0x83, 0xaa, 0xbb, 0xcc]);
        assert_eq!(out, expected);
        // Literal name ":authority" without indexing.
        let mut block = vec![0x00, 10];
        block.extend_from_slice(b":authority");
        block.extend_from_slice(&[1, b'x']);
        let out = rewrite_header_block(&block).unwrap();
        assert_eq!(&out[2..12], RENAMED_AUTHORITY);
    }

    #[test]
    fn leaves_blocks_without_authority_alone() {
        assert_eq!(rewrite_header_block(&[0x82, 0x86, 0x84]), None);
        // A multi-byte integer (index 70 = 0x3f + 7) must parse without being mistaken.
        assert_eq!(rewrite_header_block(&[0x7f, 0x07, 0x01, b'v']), None);
        // Truncated input is left to h2.
        assert_eq!(rewrite_header_block(&[0x41, 0x05, b'a']), None);
    }

    #[tokio::test]
    async fn rewrites_frames_in_a_stream_and_passes_data_through() {
        let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
        let settings = frame(0x4, 0, 0, &[]);
        let value = b"%2Fa";
        let mut block = vec![0x83, 0x41, value.len() as u8];
        block.extend_from_slice(value);
        let (first, second) = block.split_at(3);
        let headers = frame(HEADERS, 0, 1, first);
        let continuation = frame(CONTINUATION, END_HEADERS, 1, second);
        let data = frame(0x0, 0x1, 1, &[7u8; 40_000][..16_000]);
        let mut wire = Vec::new();
        for part in [&preface[..], &settings, &headers, &continuation, &data] {
            wire.extend_from_slice(part);
        }
        let (mut client, server) = tokio::io::duplex(1024);
        let writer = tokio::spawn(async move {
            for chunk in wire.chunks(7) {
                client.write_all(chunk).await.unwrap();
            }
        });
        let mut scrubbed = Vec::new();
        AuthorityScrub::new(server)
            .read_to_end(&mut scrubbed)
            .await
            .unwrap();
        writer.await.unwrap();
        let mut new_block = vec![0x83, 0x40, 10];
        new_block.extend_from_slice(RENAMED_AUTHORITY);
        new_block.push(value.len() as u8);
        new_block.extend_from_slice(value);
        let mut expected = Vec::new();
        expected.extend_from_slice(preface);
        expected.extend_from_slice(&settings);
        expected.extend_from_slice(&frame(HEADERS, END_HEADERS, 1, &new_block));
        expected.extend_from_slice(&data);
        assert_eq!(scrubbed, expected);
    }
}
