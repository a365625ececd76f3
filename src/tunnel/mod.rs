//! One tunnel's queue toward its frontend: the [`FrontendLink`] an agent session delivers
//! into and the [`FrontendQueue`] the frontend drains, and the server-wide [`QueueBudget`]
//! that all of them share.
//!
//! The agent's receive loop never waits on a frontend that has stopped reading: each frontend
//! has its own queue, capped in bytes, and a tunnel whose frontend stops draining is closed
//! instead of stalling every other tunnel on the agent. Closing such a tunnel also empties its
//! queue at once ([`FrontendLink::abort`]): a client that never reads again must not keep what
//! was queued for it alive.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_util::task::AtomicWaker;

use crate::metrics::{Metrics, Segment};
use crate::proto::Packet;
use crate::wire::data_len;
pub use budget::QueueBudget;
pub use facts::{Origin, TunnelFacts};

static NEXT_LINK_UID: AtomicU64 = AtomicU64::new(1);

/// The outcome of queueing a packet toward a frontend.
#[derive(Debug, PartialEq, Eq)]
pub enum Delivery {
    Queued,
    /// The frontend is gone.
    Gone,
    /// The frontend's queue is over its byte limit; the packet was not queued.
    Overflow,
}

/// How much a tunnel may have queued toward its frontend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueLimits {
    /// Packets held without limit (upstream's --frontend-write-channel-size); beyond this the
    /// queue is full.
    pub packets: usize,
    /// Past this many bytes the agent's receive loop waits for a frontend that is still
    /// reading (backpressure, as upstream), but not for one that has stopped.
    pub bytes: usize,
    /// A tunnel whose queue passes this many bytes is closed.
    pub hard_bytes: usize,
    /// How long a full queue may go without the frontend taking anything.
    pub stall: Duration,
}

/// The queued packets themselves, and who is still there at either end.
#[derive(Default)]
struct Slots {
    packets: VecDeque<Packet>,
    /// The frontend dropped its end: nothing more is queued.
    receiver_gone: bool,
    /// Every sender dropped: the queue ends once drained.
    senders_gone: bool,
}

/// Queue accounting shared by a link and its queue.
struct QueueState {
    /// The link's uid.
    uid: u64,
    slots: Mutex<Slots>,
    /// Cancelled when the tunnel is closed from our side (overflow, stall, budget), so a
    /// frontend writer blocked on a client that does not read can give up too.
    aborted: tokio_util::sync::CancellationToken,
    /// Wakes the frontend when a packet arrives or the queue ends.
    waker: AtomicWaker,
    packets: AtomicUsize,
    bytes: AtomicUsize,
    /// Milliseconds since `epoch` (plus one) when the queue last became full or last made
    /// progress while full; 0 while not full.
    full_since: AtomicU64,
    /// Milliseconds since `epoch` (plus one) when the frontend last took a packet.
    last_progress: AtomicU64,
    /// Woken whenever the frontend takes a packet.
    room: tokio::sync::Notify,
    epoch: Instant,
    limits: QueueLimits,
    budget: Arc<QueueBudget>,
    metrics: Arc<Metrics>,
    /// DATA bytes the frontend took (the access log's bytes toward the client).
    taken_bytes: AtomicU64,
    /// Whether packets the frontend takes count as `to_client` packets: gRPC frontends only,
    /// as upstream counts them.
    client_segment: AtomicBool,
    /// Why the tunnel ended, as first noted by whichever side ended it (the access log).
    end: Mutex<Option<String>>,
    /// The dial address, for log lines written on the agent side.
    destination: std::sync::OnceLock<String>,
}

/// A frontend that took something this recently is still reading: the agent may wait for it.
const PROGRESS_WINDOW: Duration = Duration::from_millis(250);

impl QueueState {
    fn slots(&self) -> MutexGuard<'_, Slots> {
        // Every update under this lock is a single push, pop or clear: a panic elsewhere
        // cannot leave it half-done, so a poisoned lock is still consistent.
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn since_progress(&self) -> Duration {
        Duration::from_millis(
            self.now()
                .saturating_sub(self.last_progress.load(Ordering::Acquire)),
        )
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    fn mark_full(&self) -> u64 {
        let now = self.now();
        match self
            .full_since
            .compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => {
                self.metrics.frontend.full_write_queues.inc();
                now
            }
            Err(since) => since,
        }
    }

    fn clear_full(&self) {
        if self.full_since.swap(0, Ordering::AcqRel) != 0 {
            self.metrics.frontend.full_write_queues.dec();
        }
    }

    fn stalled_for(&self) -> Option<Duration> {
        match self.full_since.load(Ordering::Acquire) {
            0 => None,
            since => Some(Duration::from_millis(self.now().saturating_sub(since))),
        }
    }

    /// Counts `bytes` in (a packet queued): this queue's, the budget's and the gauge.
    fn add_bytes(self: &Arc<Self>, bytes: usize) -> usize {
        let before = self.bytes.fetch_add(bytes, Ordering::AcqRel);
        if bytes > 0 {
            if before == 0 {
                self.budget.holders.fetch_add(1, Ordering::AcqRel);
                self.budget.holding().insert(self.uid, Arc::downgrade(self));
            }
            self.budget.used.fetch_add(bytes, Ordering::AcqRel);
            self.metrics.frontend.queued_bytes.add(bytes as i64);
        }
        before + bytes
    }

    /// Counts `bytes` out (a packet taken, dropped or purged).
    fn sub_bytes(&self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        let before = self.bytes.fetch_sub(bytes, Ordering::AcqRel);
        if before == bytes {
            self.budget.holders.fetch_sub(1, Ordering::AcqRel);
            self.budget.holding().remove(&self.uid);
        }
        self.budget.used.fetch_sub(bytes, Ordering::AcqRel);
        self.metrics.frontend.queued_bytes.sub(bytes as i64);
    }

    /// The frontend took a packet: a queue back within its length is no longer full, and a
    /// full one has made progress, which restarts its stall clock.
    fn took(&self, bytes: usize) {
        let left = self.packets.fetch_sub(1, Ordering::AcqRel) - 1;
        self.sub_bytes(bytes);
        self.last_progress.store(self.now(), Ordering::Release);
        self.room.notify_waiters();
        if left <= self.limits.packets {
            self.clear_full();
        } else {
            let now = self.now();
            let _ = self
                .full_since
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                    (v != 0).then_some(now)
                });
        }
    }

    /// Drops every queued DATA packet (keeping control packets, so a close still reaches the
    /// frontend) and gives their bytes back. Returns the bytes dropped.
    fn purge_data(&self) -> usize {
        let dropped: Vec<Packet> = {
            let mut slots = self.slots();
            let (data, control): (VecDeque<Packet>, VecDeque<Packet>) =
                std::mem::take(&mut slots.packets)
                    .into_iter()
                    .partition(|p| data_len(p) > 0);
            slots.packets = control;
            data.into_iter().collect()
        };
        let bytes: usize = dropped.iter().map(data_len).sum();
        self.packets.fetch_sub(dropped.len(), Ordering::AcqRel);
        self.sub_bytes(bytes);
        if self.packets.load(Ordering::Acquire) <= self.limits.packets {
            self.clear_full();
        }
        self.room.notify_waiters();
        bytes
    }
}

impl Drop for QueueState {
    fn drop(&mut self) {
        let left: usize = self.slots().packets.iter().map(data_len).sum();
        self.sub_bytes(left);
        if *self.full_since.get_mut() != 0 {
            self.metrics.frontend.full_write_queues.dec();
        }
    }
}

/// The sending side of one frontend stream (one tunnel).
pub struct FrontendLink {
    pub uid: u64,
    state: Arc<QueueState>,
    /// The agent's connect id once established; 0 before. Written under the owning agent
    /// session's route lock, so cleanup and establishment agree on it.
    connect_id: AtomicI64,
    /// A CLOSE_RSP was queued toward the frontend (see [`FrontendLink::close_was_sent`]).
    close_sent: AtomicBool,
    /// Who opened it, when, and its bytes toward the agent (the admin port's `/tunnels`).
    pub facts: TunnelFacts,
}

impl FrontendLink {
    pub fn new(
        limits: QueueLimits,
        budget: Arc<QueueBudget>,
        metrics: Arc<Metrics>,
    ) -> (Arc<FrontendLink>, FrontendQueue) {
        let uid = NEXT_LINK_UID.fetch_add(1, Ordering::Relaxed);
        let state = Arc::new(QueueState {
            uid,
            slots: Mutex::new(Slots::default()),
            aborted: tokio_util::sync::CancellationToken::new(),
            waker: AtomicWaker::new(),
            packets: AtomicUsize::new(0),
            bytes: AtomicUsize::new(0),
            full_since: AtomicU64::new(0),
            last_progress: AtomicU64::new(1),
            room: tokio::sync::Notify::new(),
            epoch: Instant::now(),
            limits,
            budget,
            metrics,
            taken_bytes: AtomicU64::new(0),
            client_segment: AtomicBool::new(true),
            end: Mutex::new(None),
            destination: std::sync::OnceLock::new(),
        });
        let link = Arc::new(FrontendLink {
            uid,
            state: state.clone(),
            connect_id: AtomicI64::new(0),
            close_sent: AtomicBool::new(false),
            facts: TunnelFacts::new(),
        });
        let queue = FrontendQueue { state };
        (link, queue)
    }

    pub fn connect_id(&self) -> i64 {
        self.connect_id.load(Ordering::Acquire)
    }

    pub(crate) fn set_connect_id(&self, connect_id: i64) {
        self.connect_id.store(connect_id, Ordering::Release);
    }

    /// Whether a CLOSE_RSP was queued toward the frontend. konnectivity-client registers a
    /// connection only after its dialing goroutine took the DIAL_RSP from the stream reader,
    /// which may already have read (and dropped as unknown) a CLOSE_RSP right behind it: a
    /// client that then sends DATA is told again.
    pub fn close_was_sent(&self) -> bool {
        self.close_sent.load(Ordering::Acquire)
    }

    /// Notes why the tunnel ends, unless a reason was noted already: the first one stands.
    pub fn note_end(&self, reason: impl FnOnce() -> String) {
        let mut end = self.state.end.lock().unwrap_or_else(|p| p.into_inner());
        if end.is_none() {
            *end = Some(reason());
        }
    }

    /// The reason noted first, if any.
    pub fn end_reason(&self) -> Option<String> {
        self.state
            .end
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Records the address this tunnel dials (once).
    pub fn set_destination(&self, address: &str) {
        let _ = self.state.destination.set(address.to_string());
    }

    /// The address this tunnel dials; empty before the frontend asked.
    pub fn destination(&self) -> &str {
        self.state.destination.get().map_or("", String::as_str)
    }

    /// DATA bytes the frontend has taken from the queue so far.
    pub fn taken_bytes(&self) -> u64 {
        self.state.taken_bytes.load(Ordering::Relaxed)
    }

    /// Stops counting taken packets as `to_client` packets (HTTP-CONNECT: upstream counts only
    /// the agent segments there).
    pub fn without_client_segment(&self) {
        self.state.client_segment.store(false, Ordering::Relaxed);
    }

    /// The server-wide budget this queue counts against.
    pub fn budget(&self) -> &QueueBudget {
        &self.state.budget
    }

    /// Bytes of DATA queued toward the frontend right now.
    pub fn queued_bytes(&self) -> usize {
        self.state.bytes.load(Ordering::Acquire)
    }

    /// Whether the frontend took anything within the last moment: a reader, slow or fast.
    pub fn is_reading(&self) -> bool {
        self.state.since_progress() < PROGRESS_WINDOW
    }

    /// Whether this tunnel's full queue has gone longer than its stall limit without progress.
    pub fn is_stalled(&self) -> bool {
        self.state
            .stalled_for()
            .is_some_and(|d| d > self.state.limits.stall)
    }

    /// The bytes past which the agent waits for this (reading) frontend: its own limit, or
    /// its fair share of the server's budget while the budget is exceeded.
    fn hold_threshold(&self) -> usize {
        let state = &self.state;
        if state.budget.is_over() {
            state.limits.bytes.min(state.budget.fair_share())
        } else {
            state.limits.bytes
        }
    }

    /// Waits while this tunnel's queue is past its threshold and its frontend is still
    /// reading, so a slow but live reader slows its agent down instead of losing its tunnel (a
    /// `kubectl cp` to a slow client). A frontend that took nothing for a moment is not waited
    /// for: its tunnel alone queues on, up to the hard cap, the stall timeout or the budget.
    pub async fn make_room(&self) {
        if self.state.bytes.load(Ordering::Acquire) <= self.hold_threshold() {
            return;
        }
        // Boxed: the wait (a notification and a timer) is the slow path, and inline it would
        // be part of every agent stream's future, and so of its memory.
        Box::pin(self.wait_for_room()).await
    }

    async fn wait_for_room(&self) {
        let state = &self.state;
        state.metrics.frontend.blocked_write_channels.inc();
        loop {
            let notified = state.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let since = state.since_progress();
            if state.bytes.load(Ordering::Acquire) <= self.hold_threshold()
                || since >= PROGRESS_WINDOW
                || self.is_closed()
            {
                break;
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep(PROGRESS_WINDOW - since) => {}
            }
        }
        state.metrics.frontend.blocked_write_channels.dec();
    }

    /// Queues a packet without waiting. DATA counts against the limits; control packets
    /// always pass, so a close can still reach a frontend whose queue is full.
    pub fn deliver(&self, packet: Packet) -> Delivery {
        let started = Instant::now();
        let bytes = data_len(&packet);
        let state = &self.state;
        let mut slots = state.slots();
        if slots.receiver_gone {
            return Delivery::Gone;
        }
        if bytes > 0 && state.aborted.is_cancelled() {
            // Closed from our side: nothing more is queued for this frontend.
            return Delivery::Overflow;
        }
        let packets = state.packets.fetch_add(1, Ordering::AcqRel) + 1;
        let queued = state.bytes.load(Ordering::Acquire) + bytes;
        if bytes > 0 && packets > state.limits.packets {
            state.mark_full();
            if queued > state.limits.hard_bytes || self.is_stalled() {
                state.packets.fetch_sub(1, Ordering::AcqRel);
                return Delivery::Overflow;
            }
        }
        note_terminal(self, &packet);
        state.add_bytes(bytes);
        slots.packets.push_back(packet);
        drop(slots);
        state.waker.wake();
        state
            .metrics
            .frontend
            .write_duration
            .observe(started.elapsed().as_secs_f64());
        if bytes > 0 {
            state.metrics.tunnel.relayed(false, bytes);
        }
        Delivery::Queued
    }

    /// Closes the tunnel from our side: every queued DATA packet is dropped at once (the
    /// frontend may never read again), control packets stay, and a writer waiting on the
    /// frontend is told. Returns the bytes dropped.
    pub fn abort(&self) -> usize {
        self.note_end(|| "frontend not reading".into());
        self.state.aborted.cancel();
        self.state.purge_data()
    }

    /// Resolves once the tunnel was closed from our side ([`FrontendLink::abort`], or the
    /// budget's [`QueueBudget::abort_largest_idle`]).
    pub async fn aborted(&self) {
        self.state.aborted.cancelled().await
    }

    /// The frontend dropped its end of the queue.
    pub fn is_closed(&self) -> bool {
        self.state.slots().receiver_gone
    }
}

/// Notes the end of the tunnel that a control packet toward the frontend means.
fn note_terminal(link: &FrontendLink, packet: &Packet) {
    use crate::proto::packet::Payload;
    if let Some(Payload::CloseResponse(rsp)) = &packet.payload {
        // Its own connection's: a refusal for another id (a CLOSE_REQ it does not own)
        // leaves the tunnel open.
        if rsp.connect_id != 0 && rsp.connect_id == link.connect_id() {
            link.close_sent.store(true, Ordering::Release);
        }
    }
    match &packet.payload {
        Some(Payload::CloseResponse(rsp)) if rsp.error.is_empty() => {
            link.note_end(|| "agent closed".into())
        }
        Some(Payload::CloseResponse(rsp)) => {
            link.note_end(|| format!("agent closed: {}", rsp.error))
        }
        Some(Payload::DialResponse(rsp)) if !rsp.error.is_empty() => {
            link.note_end(|| format!("dial failed: {}", rsp.error))
        }
        Some(Payload::CloseDial(_)) => link.note_end(|| "dial closed by agent".into()),
        _ => {}
    }
}

impl Drop for FrontendLink {
    fn drop(&mut self) {
        // Only the last sender ends the queue; the route tables and the frontend task each
        // hold the link through one `Arc`, so this runs once.
        self.state.slots().senders_gone = true;
        self.state.waker.wake();
    }
}

/// The receiving side of a frontend's queue: the gRPC response stream, or the writer of an
/// HTTP-CONNECT socket.
pub struct FrontendQueue {
    state: Arc<QueueState>,
}

impl FrontendQueue {
    fn account(&self, packet: &Packet) {
        let bytes = data_len(packet);
        self.state.took(bytes);
        self.state
            .taken_bytes
            .fetch_add(bytes as u64, Ordering::Relaxed);
        if self.state.client_segment.load(Ordering::Relaxed) {
            self.state
                .metrics
                .tunnel
                .packet(Segment::ToClient, packet.r#type);
        }
    }

    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Packet>> {
        // Register first, then look: a packet queued in between still wakes us.
        self.state.waker.register(cx.waker());
        let mut slots = self.state.slots();
        match slots.packets.pop_front() {
            Some(packet) => {
                drop(slots);
                self.account(&packet);
                Poll::Ready(Some(packet))
            }
            None if slots.senders_gone => Poll::Ready(None),
            None => Poll::Pending,
        }
    }

    pub async fn recv(&mut self) -> Option<Packet> {
        std::future::poll_fn(|cx| self.poll_recv(cx)).await
    }

    /// Waits until a packet is queued or the tunnel has ended, taking nothing.
    pub async fn ready(&self) {
        std::future::poll_fn(|cx| {
            self.state.waker.register(cx.waker());
            let slots = self.state.slots();
            if slots.packets.is_empty() && !slots.senders_gone {
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        })
        .await
    }
}

impl Drop for FrontendQueue {
    fn drop(&mut self) {
        // The frontend is gone: free what was queued for it now, not when the last sender
        // (a route-table entry) lets go.
        self.state.slots().receiver_gone = true;
        self.state.purge_data();
    }
}

impl futures_util::Stream for FrontendQueue {
    type Item = Result<Packet, tonic::Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.poll_recv(cx).map(|p| p.map(Ok))
    }
}

mod budget;
mod facts;
#[cfg(test)]
mod tests;
