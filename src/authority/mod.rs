//! Lets every gRPC client reach us, whatever `:authority` it sends.
//!
//! Some clients send an HTTP/2 `:authority` that is not a valid authority, which the `h2` crate
//! rejects by resetting the stream (hyperium/h2#487): grpc-go on a Unix socket sends the
//! percent-encoded socket path (kube-apiserver and konnectivity-client do), and the upstream
//! agent given `--proxy-server-host=::1` sends `::1:8091` without brackets. Go's HTTP/2 server
//! accepts both. Every gRPC port therefore reads through this wrapper: each request header
//! block is decoded in step with the client's HPACK encoder, and where an `:authority` is
//! invalid, only that field's value is replaced by a valid one of the same decoded length
//! (`aaa…`). The field keeps its place and its indexing mode and every other byte is kept, so
//! h2's HPACK table stays the same size as the client's and later indexed references resolve
//! to the valid value. Blocks without such a field, DATA and every other frame pass through
//! unchanged.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::hpack::{decode_int, Field, HpackDecoder};

mod settings;
use settings::FirstSettings;

#[cfg(test)]
const AUTHORITY: &[u8] = b":authority";
const PREFACE_LEN: usize = 24;
const FRAME_HEADER_LEN: usize = 9;
/// How much one read from the socket asks for when bytes must be looked at, once a read
/// filled the room it was given.
const READ_CHUNK: usize = 16 * 1024;
/// What reads ask for until one fills its room: most connections (a dial, a few small
/// packets) never read more at once, and 4 KiB is the largest buffer the allocator serves from
/// its fast path (one is taken at every burst of reads, see `release_idle_buffer`).
const FIRST_READ_CHUNK: usize = 4 * 1024;
/// The smallest payload read straight into the caller's buffer, not copied through ours.
const DIRECT_READ_MIN: usize = 4 * 1024;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The largest frame we emit: HTTP/2's default SETTINGS_MAX_FRAME_SIZE.
const MAX_FRAME: usize = 16_384;
/// A larger header block ends the connection (h2 refuses such blocks anyway).
const MAX_BLOCK: usize = 1 << 20;

/// Mends request header blocks; one per connection, since HPACK tables are per connection
/// and direction.
#[derive(Default)]
pub struct HeaderRecoder {
    decoder: HpackDecoder,
}

pub fn valid_authority(value: &[u8]) -> bool {
    http::uri::Authority::try_from(value).is_ok()
}

fn encode_int(out: &mut Vec<u8>, value: usize, prefix_bits: u8, flags: u8) {
    let mask = (1usize << prefix_bits) - 1;
    if value < mask {
        out.push(flags | value as u8);
        return;
    }
    out.push(flags | mask as u8);
    let mut rest = value - mask;
    while rest >= 0x80 {
        out.push((rest as u8 & 0x7f) | 0x80);
        rest >>= 7;
    }
    out.push(rest as u8);
}

/// The end of the string literal at `pos`.
fn string_end(buf: &[u8], pos: usize) -> Option<usize> {
    let (len, start) = decode_int(buf, pos, 7)?;
    let end = start.checked_add(len)?;
    (end <= buf.len()).then_some(end)
}

fn invalid_data(message: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.into())
}

impl HeaderRecoder {
    /// Returns the block to hand to h2: `block` itself when it needs no change.
    pub fn mend(&mut self, block: &[u8]) -> io::Result<Option<Vec<u8>>> {
        let headers = self
            .decoder
            .decode(block)
            .map_err(|e| invalid_data(format!("HPACK decoding failed: {}", e.0)))?;
        let broken = |f: &Field| f.authority && !f.value.is_empty() && !valid_authority(&f.value);
        if !headers.iter().any(broken) {
            return Ok(None);
        }
        // Walk the representations in step with the decoded fields: each representation but a
        // table size update yields exactly one field.
        let malformed = || invalid_data("malformed HPACK block");
        let mut out = Vec::with_capacity(block.len());
        let mut fields = headers.iter();
        let mut pos = 0;
        while pos < block.len() {
            let first = block[pos];
            if first & 0x80 != 0 {
                let (_, end) = decode_int(block, pos, 7).ok_or_else(malformed)?;
                fields.next().ok_or_else(malformed)?;
                out.extend_from_slice(&block[pos..end]);
                pos = end;
                continue;
            }
            if first & 0xe0 == 0x20 {
                let (_, end) = decode_int(block, pos, 5).ok_or_else(malformed)?;
                out.extend_from_slice(&block[pos..end]);
                pos = end;
                continue;
            }
            let prefix_bits = if first & 0xc0 == 0x40 { 6 } else { 4 };
            let (name_index, after_index) =
                decode_int(block, pos, prefix_bits).ok_or_else(malformed)?;
            let value_start = if name_index == 0 {
                string_end(block, after_index).ok_or_else(malformed)?
            } else {
                after_index
            };
            let value_end = string_end(block, value_start).ok_or_else(malformed)?;
            let field = fields.next().ok_or_else(malformed)?;
            out.extend_from_slice(&block[pos..value_start]);
            if broken(field) {
                // Same decoded length, so the HPACK table entry keeps its size.
                encode_int(&mut out, field.value.len(), 7, 0);
                out.resize(out.len() + field.value.len(), b'a');
            } else {
                out.extend_from_slice(&block[value_start..value_end]);
            }
            pos = value_end;
        }
        Ok(Some(out))
    }
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
    recoder: HeaderRecoder,
    /// A block could not be decoded: the connection is unusable (HPACK state is shared).
    failed: Option<io::Error>,
    eof: bool,
    /// The check of h2's table size in the first frame it writes (see `settings`).
    settings: FirstSettings,
    /// What the next read asks for: [`FIRST_READ_CHUNK`], then [`READ_CHUNK`].
    chunk: usize,
}

impl<S> AuthorityScrub<S> {
    pub fn new(inner: S) -> Self {
        AuthorityScrub {
            inner,
            state: State::Passthrough(PREFACE_LEN),
            input: BytesMut::new(),
            output: BytesMut::new(),
            open: None,
            recoder: HeaderRecoder::default(),
            failed: None,
            eof: false,
            settings: FirstSettings::default(),
            chunk: FIRST_READ_CHUNK,
        }
    }

    /// An idle connection keeps no read buffer: thousands of idle tunnels each hold one.
    fn release_idle_buffer(&mut self) {
        if self.input.is_empty() && self.input.capacity() > 0 {
            self.input = BytesMut::new();
        }
        if self.output.is_empty() && self.output.capacity() > 0 {
            self.output = BytesMut::new();
        }
    }

    /// Moves whatever complete units `input` holds into `output`.
    fn process(&mut self) {
        loop {
            match self.state {
                State::Passthrough(0) => self.state = State::FrameHeader,
                // Payload bytes go from `input` straight to the caller (see poll_read).
                State::Passthrough(_) => return,
                State::FrameHeader => {
                    if self.input.len() < FRAME_HEADER_LEN {
                        return;
                    }
                    let len = ((self.input[0] as usize) << 16)
                        | ((self.input[1] as usize) << 8)
                        | self.input[2] as usize;
                    let kind = self.input[3];
                    let is_block = kind == HEADERS || (kind == CONTINUATION && self.open.is_some());
                    if len > MAX_BLOCK && is_block {
                        self.failed = Some(io::Error::new(
                            io::ErrorKind::InvalidData,
                            "header block too large",
                        ));
                        return;
                    }
                    if !is_block {
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
                self.failed = Some(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "malformed HEADERS frame",
                ));
                return;
            };
            self.open = Some(OpenBlock {
                stream,
                flags,
                priority: payload[start..block_start].to_vec(),
                block: payload[block_start..block_end].to_vec(),
            });
        } else if let Some(open) = &mut self.open {
            open.block.extend_from_slice(payload);
            if open.block.len() > MAX_BLOCK {
                self.failed = Some(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "header block too large",
                ));
                return;
            }
        }
        if flags & END_HEADERS != 0 {
            self.finish_open_block();
        }
    }

    fn finish_open_block(&mut self) {
        let Some(open) = self.open.take() else { return };
        match self.recoder.mend(&open.block) {
            Ok(mended) => {
                let block = mended.as_deref().unwrap_or(&open.block);
                emit_headers(
                    &mut self.output,
                    open.stream,
                    open.flags,
                    &open.priority,
                    block,
                )
            }
            Err(e) => self.failed = Some(e),
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
            if this.output.is_empty() {
                if let Some(e) = this.failed.take() {
                    return Poll::Ready(Err(e));
                }
            }
            if !this.output.is_empty() {
                let take = this.output.len().min(buf.remaining());
                buf.put_slice(&this.output[..take]);
                this.output.advance(take);
                this.release_idle_buffer();
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                // Whatever is left (a truncated frame) goes to h2 as it is.
                let rest = this.input.split();
                if rest.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                this.output.extend_from_slice(&rest);
                continue;
            }
            // Payload bytes are handed over without passing through `output`: from `input`
            // when some are buffered, else read straight into the caller's buffer when
            // that is a large read. A small one (the preface, a short DATA payload) reads a
            // whole chunk into `input` instead: the frames behind it usually came in the
            // same write, and one read then takes them all.
            if let State::Passthrough(remaining) = this.state {
                if remaining > 0 && !this.input.is_empty() {
                    let take = remaining.min(this.input.len()).min(buf.remaining());
                    buf.put_slice(&this.input[..take]);
                    this.input.advance(take);
                    this.state = State::Passthrough(remaining - take);
                    this.release_idle_buffer();
                    return Poll::Ready(Ok(()));
                }
                let limit = remaining.min(buf.remaining());
                if limit >= DIRECT_READ_MIN && this.input.is_empty() {
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
            this.input.reserve(this.chunk);
            let room = this.input.capacity() - this.input.len();
            match tokio_util::io::poll_read_buf(Pin::new(&mut this.inner), cx, &mut this.input) {
                Poll::Ready(Ok(0)) => this.eof = true,
                Poll::Ready(Ok(n)) => {
                    if n >= room {
                        this.chunk = READ_CHUNK;
                    }
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {
                    // Nothing to read: an idle connection waits without a read buffer.
                    this.release_idle_buffer();
                    return Poll::Pending;
                }
            }
        }
    }
}

impl<S> AuthorityScrub<S> {
    /// Shows the check of the first frame the first `written` bytes of `bufs`.
    fn written(&mut self, bufs: &[&[u8]], mut written: usize) -> io::Result<()> {
        for buf in bufs {
            if self.settings.done() || written == 0 {
                break;
            }
            let take = written.min(buf.len());
            if let Err(e) = self.settings.observe(&buf[..take]) {
                tracing::error!(error = %e, "HTTP/2 settings do not match the :authority mending");
                return Err(e.into());
            }
            written -= take;
        }
        Ok(())
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityScrub<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let n = ready!(Pin::new(&mut self.inner).poll_write(cx, data))?;
        if !self.settings.done() {
            self.written(&[data], n)?;
        }
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let n = ready!(Pin::new(&mut self.inner).poll_write_vectored(cx, bufs))?;
        if !self.settings.done() {
            let slices: Vec<&[u8]> = bufs.iter().map(|b| &**b).collect();
            self.written(&slices, n)?;
        }
        Poll::Ready(Ok(n))
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

#[cfg(test)]
mod tests;
