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

use frames::{frame_len, parse_header, Event, Frames};
use window::LinkWindow;

const FRAME_HEADER: usize = 9;
const PING_LEN: usize = 8;
const PING_FRAME: usize = FRAME_HEADER + PING_LEN;
const TYPE_DATA: u8 = 0x0;
const TYPE_HEADERS: u8 = 0x1;
const TYPE_SETTINGS: u8 = 0x4;
const TYPE_PING: u8 = 0x6;
const TYPE_WINDOW_UPDATE: u8 = 0x8;
const FLAG_ACK: u8 = 0x1;
/// The first half of our PINGs' opaque data; the second half is a sequence number.
const MARKER: [u8; 4] = *b"kLiv";
/// The same for the PINGs that measure the link for [`window::LinkWindow`].
const SAMPLE_MARKER: [u8; 4] = *b"kBdp";
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
    /// The receive window the peer is held to on its first stream; 0 when not paced.
    window: AtomicU32,
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
            window: AtomicU32::new(0),
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

    /// The receive window the peer is held to now on its first stream (what it may have in
    /// flight), when it is paced.
    pub fn receive_window(&self) -> Option<u32> {
        Some(self.0.window.load(Ordering::Relaxed)).filter(|w| *w != 0)
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

/// A whole frame at the start of `bytes` that is an ACK of one of our PINGs: (measuring,
/// sequence number).
fn our_ack(bytes: &[u8]) -> Option<(bool, u32)> {
    let frame = bytes.get(..PING_FRAME)?;
    let marker = &frame[9..13];
    let is_ack = frame_len(frame) == PING_LEN
        && frame[3] == TYPE_PING
        && frame[4] & FLAG_ACK != 0
        && frame[5..9] == [0; 4]
        && (marker == MARKER || marker == SAMPLE_MARKER);
    is_ack.then(|| {
        (
            marker == SAMPLE_MARKER,
            u32::from_be_bytes([frame[13], frame[14], frame[15], frame[16]]),
        )
    })
}

fn ping_frame(marker: [u8; 4], seq: u32) -> [u8; PING_FRAME] {
    let mut frame = [0u8; PING_FRAME];
    frame[2] = PING_LEN as u8;
    frame[3] = TYPE_PING;
    frame[9..13].copy_from_slice(&marker);
    frame[13..].copy_from_slice(&seq.to_be_bytes());
    frame
}

/// A server-side HTTP/2 connection whose [`PingHandle`] can send PINGs on it, and whose
/// first stream's receive window follows the link ([`window::LinkWindow`]).
pub struct PingIo<IO> {
    io: IO,
    handle: PingHandle,
    written: Frames,
    read: Frames,
    window: LinkWindow,
    /// Frames of ours to write between two of h2's (PINGs, WINDOW_UPDATEs, the rewritten
    /// SETTINGS), how much of them is out, and the liveness PING among them.
    out: Vec<u8>,
    out_at: usize,
    out_ping: Option<u32>,
    /// A measuring PING is to be written.
    sample_due: bool,
}

impl<IO> PingIo<IO> {
    pub fn new(io: IO) -> (PingIo<IO>, PingHandle) {
        let handle = PingHandle::new();
        let io = PingIo {
            io,
            handle: handle.clone(),
            written: Frames::default(),
            read: Frames::with_preface(CLIENT_PREFACE_LEN),
            window: LinkWindow::new(),
            out: Vec::new(),
            out_at: 0,
            out_ping: None,
            sample_due: false,
        };
        (io, handle)
    }
}

fn killed_error() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "the peer stopped answering PINGs")
}

/// A frame of h2's that [`PingIo`] may hold back or rewrite: its SETTINGS, and its
/// WINDOW_UPDATEs for a stream.
fn of_interest(kind: u8, flags: u8, stream: u32) -> bool {
    (kind == TYPE_SETTINGS && flags & FLAG_ACK == 0) || (kind == TYPE_WINDOW_UPDATE && stream != 0)
}

impl<IO: AsyncWrite + Unpin> PingIo<IO> {
    /// Writes what of ours is due, when h2 is between two frames (and past its SETTINGS,
    /// which must come first). Ready once nothing of ours is left half-written, with whether
    /// this call wrote any of it.
    fn poll_inject(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<bool>> {
        if self.out_at == self.out.len() {
            self.out.clear();
            self.out_at = 0;
            if !self.written.at_boundary() || self.written.frames == 0 {
                return Poll::Ready(Ok(false));
            }
            let state = &self.handle.0;
            let requested = state.requested.load(Ordering::Acquire);
            if requested != state.sent.load(Ordering::Acquire) {
                self.out.extend_from_slice(&ping_frame(MARKER, requested));
                self.out_ping = Some(requested);
            }
            if std::mem::take(&mut self.sample_due) {
                self.out.extend_from_slice(&ping_frame(SAMPLE_MARKER, 0));
            }
            self.window.take_due(&mut self.out);
            if self.out.is_empty() {
                return Poll::Ready(Ok(false));
            }
        }
        while self.out_at < self.out.len() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.out[self.out_at..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.out_at += n;
        }
        if let Some(seq) = self.out_ping.take() {
            self.handle.0.sent.store(seq, Ordering::Release);
        }
        Poll::Ready(Ok(true))
    }

    /// Takes a frame of interest that h2 wrote whole at the front of `buf`, when the window
    /// holds it back or rewrites it: how many bytes of h2's it took.
    fn intercept(&mut self, buf: &[u8]) -> Option<usize> {
        if !self.window.intercepting() || !self.written.at_boundary() || buf.len() < FRAME_HEADER {
            return None;
        }
        let (len, kind, flags, stream) = parse_header(buf);
        let frame = buf.get(..FRAME_HEADER + len)?;
        if !of_interest(kind, flags, stream) {
            return None;
        }
        if kind == TYPE_SETTINGS {
            let rewritten = self.window.rewrite_settings(frame)?;
            self.out.extend_from_slice(&rewritten);
        } else {
            if len != 4 {
                return None;
            }
            let increment = u32::from_be_bytes([frame[9], frame[10], frame[11], frame[12]]);
            if !self.window.h2_update(stream, increment & 0x7fff_ffff) {
                return None;
            }
        }
        self.written.advance(frame, &mut |_| {});
        Some(frame.len())
    }

    /// How much of `buf` to write before the next frame of interest, so that it starts a
    /// later write (and [`PingIo::intercept`] sees it whole).
    fn pass_limit(&self, buf: &[u8]) -> usize {
        if !self.window.intercepting() {
            return buf.len();
        }
        let mut at = if self.written.at_boundary() {
            0
        } else if let Some(left) = self.written.body_left() {
            left
        } else {
            return buf.len();
        };
        while at + FRAME_HEADER <= buf.len() {
            let (len, kind, flags, stream) = parse_header(&buf[at..]);
            if at > 0 && of_interest(kind, flags, stream) {
                return at;
            }
            at += FRAME_HEADER + len;
        }
        buf.len()
    }

    /// Counts what h2 wrote (of `bufs`, `n` bytes) toward the frame boundaries.
    fn wrote(&mut self, bufs: &[io::IoSlice<'_>], mut n: usize) {
        for buf in bufs {
            if n == 0 {
                break;
            }
            let take = n.min(buf.len());
            self.wrote_one(&buf[..take]);
            n -= take;
        }
    }

    /// The same for bytes of h2's that went out unchanged: a frame of interest among them
    /// could not be held back (split across writes) and is what the peer now knows.
    fn wrote_one(&mut self, bytes: &[u8]) {
        let window = &mut self.window;
        self.written.advance(bytes, &mut |event| match event {
            Event::Header { kind, flags, .. } if kind == TYPE_SETTINGS && flags & FLAG_ACK == 0 => {
                window.settings_passed()
            }
            Event::Update { stream, increment } if stream != 0 => {
                window.h2_update_passed(stream, increment)
            }
            _ => {}
        });
    }

    fn due(&self) -> bool {
        self.sample_due || self.window.has_due()
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
        let end = strip_acks(
            &mut this.read,
            &this.handle,
            &mut this.window,
            &mut this.sample_due,
            &mut buf.filled_mut()[start..],
        );
        buf.set_filled(start + end);
        let window = if this.window.pacing() {
            this.window.target()
        } else {
            0
        };
        this.handle.0.window.store(window, Ordering::Relaxed);
        // What the read made due (a WINDOW_UPDATE for the data, a measuring PING) goes out
        // now, not when h2 next writes.
        if this.due() {
            if let Poll::Ready(Ok(true)) = this.poll_inject(cx) {
                let _ = Pin::new(&mut this.io).poll_flush(cx);
            }
        }
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
/// split across reads (which h2 then sees and ignores), tells `window` of the peer's streams
/// and data, and returns how many bytes are left at the front.
fn strip_acks(
    frames: &mut Frames,
    handle: &PingHandle,
    window: &mut LinkWindow,
    sample_due: &mut bool,
    bytes: &mut [u8],
) -> usize {
    let now = Instant::now();
    let mut on = |event| match event {
        Event::Ack { sample: false, seq } => handle.answered(seq),
        Event::Ack { sample: true, .. } => window.sample_answered(now),
        Event::Header {
            kind: TYPE_HEADERS,
            stream,
            ..
        } => window.peer_headers(stream),
        Event::Header {
            kind: TYPE_DATA,
            stream,
            len,
            ..
        } => *sample_due |= window.peer_data(stream, len, now),
        _ => {}
    };
    let mut len = bytes.len();
    let mut at = 0;
    while at < len {
        if frames.at_boundary() {
            if let Some((sample, seq)) = our_ack(&bytes[at..len]) {
                on(Event::Ack { sample, seq });
                bytes.copy_within(at + PING_FRAME..len, at);
                len -= PING_FRAME;
                continue;
            }
        }
        let n = frames.step().min(len - at);
        frames.advance(&bytes[at..at + n], &mut on);
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
        if let Some(n) = this.intercept(buf) {
            return Poll::Ready(Ok(n));
        }
        let limit = this.pass_limit(buf);
        let n = ready!(Pin::new(&mut this.io).poll_write(cx, &buf[..limit]))?;
        this.wrote_one(&buf[..n]);
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
        // h2 encodes its control frames into the first buffer (later ones hold DATA
        // payloads), so that is where frames of interest are looked for.
        let first = bufs.iter().find(|b| !b.is_empty()).map(|b| &b[..]);
        if let Some(first) = first {
            if let Some(n) = this.intercept(first) {
                return Poll::Ready(Ok(n));
            }
            let limit = this.pass_limit(first);
            if limit < first.len() {
                let n = ready!(Pin::new(&mut this.io).poll_write(cx, &first[..limit]))?;
                this.wrote_one(&first[..n]);
                return Poll::Ready(Ok(n));
            }
        }
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

mod frames;
#[cfg(test)]
mod tests;
mod window;
