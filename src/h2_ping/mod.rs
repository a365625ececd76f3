//! HTTP/2 PINGs of our own on a connection that hyper serves, to learn whether the peer still
//! answers.
//!
//! hyper keeps h2's one user-ping handle for its keepalive and exposes neither, so the PINGs
//! are written here, between h2 and TLS: [`PingIo`] wraps the connection, follows the frame
//! boundaries of what h2 writes, and puts a PING frame between two of h2's frames when one is
//! asked for. The peer's PING ACKs carrying our payload are taken out of what h2 reads (h2
//! would log an ACK for a PING it never sent), and their arrival is what [`PingHandle`]
//! reports. An ACK split across two reads is rare (PINGs are written alone, each in its own
//! TLS record); it then reaches h2, which ignores it with a warning, and still counts here.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use futures_util::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

const FRAME_HEADER: usize = 9;
const PING_LEN: usize = 8;
const PING_FRAME: usize = FRAME_HEADER + PING_LEN;
const TYPE_PING: u8 = 0x6;
const FLAG_ACK: u8 = 0x1;
/// The first half of our PINGs' opaque data; the second half is a sequence number.
const MARKER: [u8; 4] = *b"kLiv";
/// What a client sends before its first frame (RFC 9113, section 3.4).
const CLIENT_PREFACE_LEN: usize = 24;

/// The shared side of one connection's PINGs: ask for one, and see when the last was sent
/// and answered. Clones refer to the same connection.
#[derive(Clone)]
pub struct PingHandle(Arc<PingState>);

struct PingState {
    epoch: Instant,
    /// Sequence numbers: the last PING asked for, written, and answered.
    requested: AtomicU32,
    sent: AtomicU32,
    acked: AtomicU32,
    /// Milliseconds since `epoch` (+1, so 0 means never).
    asked_at: AtomicU64,
    acked_at: AtomicU64,
    /// Woken to make the connection's task write a PING while h2 has nothing to write.
    task: AtomicWaker,
    killed: AtomicBool,
}

impl PingHandle {
    fn new() -> PingHandle {
        PingHandle(Arc::new(PingState {
            epoch: Instant::now(),
            requested: AtomicU32::new(0),
            sent: AtomicU32::new(0),
            acked: AtomicU32::new(0),
            asked_at: AtomicU64::new(0),
            acked_at: AtomicU64::new(0),
            task: AtomicWaker::new(),
            killed: AtomicBool::new(false),
        }))
    }

    fn stamp(&self) -> u64 {
        self.0.epoch.elapsed().as_millis() as u64 + 1
    }

    fn at(&self, stamp: u64) -> Option<Instant> {
        (stamp != 0).then(|| self.0.epoch + std::time::Duration::from_millis(stamp - 1))
    }

    /// Asks for a PING, unless one is already asked for or unanswered.
    pub fn ping(&self) {
        let state = &self.0;
        let requested = state.requested.load(Ordering::Acquire);
        if requested != state.acked.load(Ordering::Acquire) {
            return;
        }
        state.asked_at.store(self.stamp(), Ordering::Release);
        if state
            .requested
            .compare_exchange(
                requested,
                requested.wrapping_add(1),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
        {
            state.task.wake();
        }
    }

    /// When the PING now unanswered was asked for (a connection that cannot even write it
    /// is as dead as one that does not answer); `None` when none is.
    pub fn unanswered_since(&self) -> Option<Instant> {
        if !self.awaiting() {
            return None;
        }
        self.at(self.0.asked_at.load(Ordering::Acquire))
    }

    /// Whether a PING was asked for and not answered yet (written or not).
    pub fn awaiting(&self) -> bool {
        let state = &self.0;
        state.requested.load(Ordering::Acquire) != state.acked.load(Ordering::Acquire)
    }

    /// When the last answer came.
    pub fn last_answer(&self) -> Option<Instant> {
        self.at(self.0.acked_at.load(Ordering::Acquire))
    }

    /// Makes every later read and write of the connection fail, so hyper closes it.
    pub fn kill(&self) {
        self.0.killed.store(true, Ordering::Release);
        self.0.task.wake();
    }

    fn killed(&self) -> bool {
        self.0.killed.load(Ordering::Acquire)
    }

    fn answered(&self, seq: u32) {
        let state = &self.0;
        // Only the PING written last counts: an answer to an older one proves less.
        if seq == state.sent.load(Ordering::Acquire) {
            state.acked_at.store(self.stamp(), Ordering::Release);
            state.acked.store(seq, Ordering::Release);
        }
    }
}

impl std::fmt::Debug for PingHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PingHandle")
            .field("unanswered_since", &self.unanswered_since())
            .field("last_answer", &self.last_answer())
            .finish()
    }
}

/// Follows frame boundaries in one direction of an HTTP/2 byte stream.
#[derive(Default)]
struct Frames {
    /// Bytes of a preface still to skip before the first frame.
    preface: usize,
    header: [u8; FRAME_HEADER],
    have: usize,
    /// Bytes of the current frame's payload not seen yet.
    body: usize,
    /// Complete frames seen.
    frames: u64,
    /// The payload so far of a PING ACK being read, and the sequence number of the last one
    /// of ours that was read whole by [`Frames::advance`].
    ping: Option<([u8; PING_LEN], usize)>,
    ack: Option<u32>,
}

impl Frames {
    fn at_boundary(&self) -> bool {
        self.preface == 0 && self.have == 0 && self.body == 0
    }

    /// How many bytes to the end of the preface, the frame header or the frame (at least 1).
    fn step(&self) -> usize {
        if self.preface > 0 {
            self.preface
        } else if self.have < FRAME_HEADER {
            FRAME_HEADER - self.have
        } else {
            self.body.max(1)
        }
    }

    /// Moves past `bytes`, which the stream carried in order.
    fn advance(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let n = if self.preface > 0 {
                let n = self.preface.min(bytes.len());
                self.preface -= n;
                n
            } else if self.have < FRAME_HEADER {
                let n = (FRAME_HEADER - self.have).min(bytes.len());
                self.header[self.have..self.have + n].copy_from_slice(&bytes[..n]);
                self.have += n;
                if self.have == FRAME_HEADER {
                    self.body = frame_len(&self.header);
                    let h = &self.header;
                    let ping_ack = h[3] == TYPE_PING && h[4] & FLAG_ACK != 0 && h[5..] == [0; 4];
                    if ping_ack && self.body == PING_LEN {
                        self.ping = Some(([0; PING_LEN], 0));
                    }
                    if self.body == 0 {
                        self.end_frame();
                    }
                }
                n
            } else {
                let n = self.body.min(bytes.len());
                if let Some((payload, have)) = &mut self.ping {
                    payload[*have..*have + n].copy_from_slice(&bytes[..n]);
                    *have += n;
                }
                self.body -= n;
                if self.body == 0 {
                    self.end_frame();
                }
                n
            };
            bytes = &bytes[n..];
        }
    }

    fn end_frame(&mut self) {
        if let Some((payload, _)) = self.ping.take() {
            if payload[..4] == MARKER {
                self.ack = Some(u32::from_be_bytes([
                    payload[4], payload[5], payload[6], payload[7],
                ]));
            }
        }
        self.have = 0;
        self.frames += 1;
    }
}

fn frame_len(header: &[u8]) -> usize {
    (usize::from(header[0]) << 16) | (usize::from(header[1]) << 8) | usize::from(header[2])
}

/// The sequence number of a whole frame at the start of `bytes` if it is an ACK of our PING.
fn our_ack(bytes: &[u8]) -> Option<u32> {
    let frame = bytes.get(..PING_FRAME)?;
    let is_ack = frame_len(frame) == PING_LEN
        && frame[3] == TYPE_PING
        && frame[4] & FLAG_ACK != 0
        && frame[5..9] == [0; 4]
        && frame[9..13] == MARKER;
    is_ack.then(|| u32::from_be_bytes([frame[13], frame[14], frame[15], frame[16]]))
}

fn ping_frame(seq: u32) -> [u8; PING_FRAME] {
    let mut frame = [0u8; PING_FRAME];
    frame[2] = PING_LEN as u8;
    frame[3] = TYPE_PING;
    frame[9..13].copy_from_slice(&MARKER);
    frame[13..].copy_from_slice(&seq.to_be_bytes());
    frame
}

/// A server-side HTTP/2 connection whose [`PingHandle`] can send PINGs on it.
pub struct PingIo<IO> {
    io: IO,
    handle: PingHandle,
    written: Frames,
    read: Frames,
    /// The PING being written and how much of it is out.
    injecting: Option<([u8; PING_FRAME], usize, u32)>,
}

impl<IO> PingIo<IO> {
    pub fn new(io: IO) -> (PingIo<IO>, PingHandle) {
        let handle = PingHandle::new();
        let io = PingIo {
            io,
            handle: handle.clone(),
            written: Frames::default(),
            read: Frames {
                preface: CLIENT_PREFACE_LEN,
                ..Frames::default()
            },
            injecting: None,
        };
        (io, handle)
    }
}

fn killed_error() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "the peer stopped answering PINGs")
}

impl<IO: AsyncWrite + Unpin> PingIo<IO> {
    /// Writes the PING asked for, if any, when h2 is between two frames (and past its
    /// SETTINGS, which must come first). Ready once nothing of ours is left half-written,
    /// with whether this call wrote any of it.
    fn poll_inject(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<bool>> {
        if self.injecting.is_none() {
            let state = &self.handle.0;
            let requested = state.requested.load(Ordering::Acquire);
            let due = requested != state.sent.load(Ordering::Acquire);
            if !due || !self.written.at_boundary() || self.written.frames == 0 {
                return Poll::Ready(Ok(false));
            }
            self.injecting = Some((ping_frame(requested), 0, requested));
        }
        while let Some((frame, done, seq)) = &mut self.injecting {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &frame[*done..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *done += n;
            if *done == PING_FRAME {
                self.handle.0.sent.store(*seq, Ordering::Release);
                self.injecting = None;
            }
        }
        Poll::Ready(Ok(true))
    }

    /// Counts what h2 wrote (of `bufs`, `n` bytes) toward the frame boundaries.
    fn wrote(&mut self, bufs: &[io::IoSlice<'_>], mut n: usize) {
        for buf in bufs {
            if n == 0 {
                break;
            }
            let take = n.min(buf.len());
            self.written.advance(&buf[..take]);
            n -= take;
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for PingIo<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.handle.0.task.register(cx.waker());
        if this.handle.killed() {
            return Poll::Ready(Err(killed_error()));
        }
        // h2 reads whenever it is idle: the moment to write a PING that was asked for. A
        // write that cannot finish now wakes this task when it can.
        if let Poll::Ready(Ok(true)) = this.poll_inject(cx) {
            let _ = Pin::new(&mut this.io).poll_flush(cx);
        }
        let start = buf.filled().len();
        ready!(Pin::new(&mut this.io).poll_read(cx, buf))?;
        let read = buf.filled().len() - start;
        let end = strip_acks(&mut this.read, &this.handle, &mut buf.filled_mut()[start..]);
        buf.set_filled(start + end);
        if read > 0 && end == 0 {
            // Everything read was ours: nothing for h2 yet, and an empty read would look
            // like the end of the stream. Read again at once.
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        Poll::Ready(Ok(()))
    }
}

/// Removes whole ACKs of our PINGs from `bytes` (just read, in order), records them and those
/// split across reads (which h2 then sees and ignores), and returns how many bytes are left
/// at the front.
fn strip_acks(frames: &mut Frames, handle: &PingHandle, bytes: &mut [u8]) -> usize {
    let mut len = bytes.len();
    let mut at = 0;
    while at < len {
        if frames.at_boundary() {
            if let Some(seq) = our_ack(&bytes[at..len]) {
                handle.answered(seq);
                bytes.copy_within(at + PING_FRAME..len, at);
                len -= PING_FRAME;
                continue;
            }
        }
        let n = frames.step().min(len - at);
        frames.advance(&bytes[at..at + n]);
        if let Some(seq) = frames.ack.take() {
            handle.answered(seq);
        }
        at += n;
    }
    len
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for PingIo<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.handle.killed() {
            return Poll::Ready(Err(killed_error()));
        }
        ready!(this.poll_inject(cx))?;
        let n = ready!(Pin::new(&mut this.io).poll_write(cx, buf))?;
        this.written.advance(&buf[..n]);
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.handle.killed() {
            return Poll::Ready(Err(killed_error()));
        }
        ready!(this.poll_inject(cx))?;
        let n = ready!(Pin::new(&mut this.io).poll_write_vectored(cx, bufs))?;
        this.wrote(bufs, n);
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.handle.killed() {
            return Poll::Ready(Err(killed_error()));
        }
        ready!(this.poll_inject(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl<IO> tonic::transport::server::Connected for PingIo<IO> {
    type ConnectInfo = PingHandle;

    fn connect_info(&self) -> PingHandle {
        self.handle.clone()
    }
}

#[cfg(test)]
mod tests;
