//! One tunnel's queue toward its frontend: the [`FrontendLink`] an agent session delivers
//! into and the [`FrontendQueue`] the frontend drains.
//!
//! The agent's receive loop never waits on a frontend that has stopped reading: each frontend
//! has its own queue, capped in bytes, and a tunnel whose frontend stops draining is closed
//! instead of stalling every other tunnel on the agent.

use std::pin::Pin;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::metrics::{Metrics, Segment};
use crate::proto::Packet;
use crate::wire::data_len;

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

/// Queue accounting shared by a link and its queue.
struct QueueState {
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
    metrics: Arc<Metrics>,
}

/// A frontend that took something this recently is still reading: the agent may wait for it.
const PROGRESS_WINDOW: Duration = Duration::from_millis(250);

impl QueueState {
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
                self.metrics.full_frontend_write_queues.inc();
                now
            }
            Err(since) => since,
        }
    }

    fn stalled_for(&self) -> Option<Duration> {
        match self.full_since.load(Ordering::Acquire) {
            0 => None,
            since => Some(Duration::from_millis(self.now().saturating_sub(since))),
        }
    }

    /// The frontend took a packet: a queue back within its length is no longer full, and a
    /// full one has made progress, which restarts its stall clock.
    fn took(&self, bytes: usize) {
        let left = self.packets.fetch_sub(1, Ordering::AcqRel) - 1;
        self.bytes.fetch_sub(bytes, Ordering::AcqRel);
        self.last_progress.store(self.now(), Ordering::Release);
        self.room.notify_waiters();
        if left <= self.limits.packets {
            if self.full_since.swap(0, Ordering::AcqRel) != 0 {
                self.metrics.full_frontend_write_queues.dec();
            }
        } else {
            let now = self.now();
            let _ = self
                .full_since
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                    (v != 0).then_some(now)
                });
        }
    }
}

impl Drop for QueueState {
    fn drop(&mut self) {
        if *self.full_since.get_mut() != 0 {
            self.metrics.full_frontend_write_queues.dec();
        }
    }
}

/// The sending side of one frontend stream (one tunnel).
pub struct FrontendLink {
    pub uid: u64,
    tx: mpsc::UnboundedSender<Packet>,
    state: Arc<QueueState>,
    /// The agent's connect id once established; 0 before. Written under the owning agent
    /// session's route lock, so cleanup and establishment agree on it.
    connect_id: AtomicI64,
    metrics: Arc<Metrics>,
}

impl FrontendLink {
    pub fn new(limits: QueueLimits, metrics: Arc<Metrics>) -> (Arc<FrontendLink>, FrontendQueue) {
        let (tx, rx) = mpsc::unbounded_channel();
        let state = Arc::new(QueueState {
            packets: AtomicUsize::new(0),
            bytes: AtomicUsize::new(0),
            full_since: AtomicU64::new(0),
            last_progress: AtomicU64::new(1),
            room: tokio::sync::Notify::new(),
            epoch: Instant::now(),
            limits,
            metrics: metrics.clone(),
        });
        let link = Arc::new(FrontendLink {
            uid: NEXT_LINK_UID.fetch_add(1, Ordering::Relaxed),
            tx,
            state: state.clone(),
            connect_id: AtomicI64::new(0),
            metrics: metrics.clone(),
        });
        let queue = FrontendQueue { rx, state, metrics };
        (link, queue)
    }

    pub fn connect_id(&self) -> i64 {
        self.connect_id.load(Ordering::Acquire)
    }

    pub(crate) fn set_connect_id(&self, connect_id: i64) {
        self.connect_id.store(connect_id, Ordering::Release);
    }

    /// Whether this tunnel's full queue has gone longer than its stall limit without progress.
    pub fn is_stalled(&self) -> bool {
        self.state
            .stalled_for()
            .is_some_and(|d| d > self.state.limits.stall)
    }

    /// Waits while this tunnel's queue is past its byte limit and its frontend is still
    /// reading, so a slow but live reader slows its agent down instead of losing its tunnel (a
    /// `kubectl cp` to a slow client). A frontend that took nothing for a moment is not waited
    /// for: its tunnel alone queues on, up to the hard cap or the stall timeout.
    pub async fn make_room(&self) {
        let state = &self.state;
        if state.bytes.load(Ordering::Acquire) <= state.limits.bytes {
            return;
        }
        state.metrics.blocked_frontend_write_channels.inc();
        loop {
            let notified = state.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let since = state.since_progress();
            if state.bytes.load(Ordering::Acquire) <= state.limits.bytes
                || since >= PROGRESS_WINDOW
                || self.tx.is_closed()
            {
                break;
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep(PROGRESS_WINDOW - since) => {}
            }
        }
        state.metrics.blocked_frontend_write_channels.dec();
    }

    /// Queues a packet without waiting. DATA counts against the limits; control packets
    /// always pass, so a close can still reach a frontend whose queue is full.
    pub fn deliver(&self, packet: Packet) -> Delivery {
        let started = Instant::now();
        let bytes = data_len(&packet);
        let state = &self.state;
        let packets = state.packets.fetch_add(1, Ordering::AcqRel) + 1;
        let queued = state.bytes.fetch_add(bytes, Ordering::AcqRel) + bytes;
        if bytes > 0 && packets > state.limits.packets {
            state.mark_full();
            if queued > state.limits.hard_bytes || self.is_stalled() {
                state.packets.fetch_sub(1, Ordering::AcqRel);
                state.bytes.fetch_sub(bytes, Ordering::AcqRel);
                return Delivery::Overflow;
            }
        }
        match self.tx.send(packet) {
            Ok(()) => {
                self.metrics
                    .frontend_write_duration
                    .observe(started.elapsed().as_secs_f64());
                if bytes > 0 {
                    self.metrics.relayed(false, bytes);
                }
                Delivery::Queued
            }
            Err(_) => {
                state.packets.fetch_sub(1, Ordering::AcqRel);
                state.bytes.fetch_sub(bytes, Ordering::AcqRel);
                Delivery::Gone
            }
        }
    }

    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

/// The receiving side of a frontend's queue: the gRPC response stream, or the writer of an
/// HTTP-CONNECT socket.
pub struct FrontendQueue {
    rx: mpsc::UnboundedReceiver<Packet>,
    state: Arc<QueueState>,
    metrics: Arc<Metrics>,
}

impl FrontendQueue {
    fn account(&self, packet: &Packet) {
        self.state.took(data_len(packet));
        self.metrics.packet(Segment::ToClient, packet.r#type);
    }

    pub async fn recv(&mut self) -> Option<Packet> {
        let packet = self.rx.recv().await?;
        self.account(&packet);
        Some(packet)
    }
}

impl futures_util::Stream for FrontendQueue {
    type Item = Result<Packet, tonic::Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(packet)) => {
                self.account(&packet);
                Poll::Ready(Some(Ok(packet)))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::close_response;

    fn data(len: usize) -> Packet {
        crate::wire::data(1, vec![0u8; len])
    }

    fn limits(packets: usize, bytes: usize, stall: Duration) -> QueueLimits {
        QueueLimits {
            packets,
            bytes,
            hard_bytes: bytes,
            stall,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reading_frontend_holds_the_agent_until_there_is_room() {
        let metrics = Arc::new(Metrics::new());
        let mut limits = limits(0, 100, Duration::from_secs(60));
        limits.hard_bytes = 1000;
        let (link, mut queue) = FrontendLink::new(limits, metrics.clone());
        for _ in 0..3 {
            assert_eq!(link.deliver(data(60)), Delivery::Queued);
        }
        // A reader that keeps taking, one packet at a time.
        let reader = tokio::spawn(async move {
            for _ in 0..3 {
                tokio::time::sleep(Duration::from_millis(20)).await;
                queue.recv().await.unwrap();
            }
            queue
        });
        tokio::time::timeout(Duration::from_secs(10), link.make_room())
            .await
            .expect("room is made");
        assert!(
            link.state.bytes.load(Ordering::Acquire) <= 100,
            "returned only once under the limit"
        );
        assert_eq!(metrics.blocked_frontend_write_channels.get(), 0);
        let _queue = reader.await.unwrap();
    }

    #[tokio::test]
    async fn a_stopped_frontend_does_not_hold_the_agent() {
        let metrics = Arc::new(Metrics::new());
        let mut limits = limits(0, 100, Duration::from_secs(60));
        limits.hard_bytes = 1000;
        let (link, _queue) = FrontendLink::new(limits, metrics.clone());
        for _ in 0..3 {
            assert_eq!(
                link.deliver(data(60)),
                Delivery::Queued,
                "past the limit, under the hard cap"
            );
        }
        // Nobody reads: make_room gives up once no progress was seen for the window.
        tokio::time::timeout(Duration::from_secs(10), link.make_room())
            .await
            .expect("not held");
        assert!(link.state.since_progress() >= PROGRESS_WINDOW);
        assert_eq!(metrics.blocked_frontend_write_channels.get(), 0);
        // And the hard cap still closes it.
        let mut overflowed = false;
        for _ in 0..20 {
            overflowed |= link.deliver(data(60)) == Delivery::Overflow;
        }
        assert!(overflowed);
    }

    #[test]
    fn a_queue_within_its_length_is_never_full() {
        let metrics = Arc::new(Metrics::new());
        let (link, _queue) =
            FrontendLink::new(limits(3, 10, Duration::from_secs(60)), metrics.clone());
        for _ in 0..3 {
            assert_eq!(
                link.deliver(data(100)),
                Delivery::Queued,
                "bytes only count once full"
            );
        }
        assert_eq!(metrics.full_frontend_write_queues.get(), 0);
    }

    #[test]
    fn a_full_queue_overflows_past_its_byte_limit_and_recovers_when_drained() {
        let metrics = Arc::new(Metrics::new());
        let (link, mut queue) =
            FrontendLink::new(limits(1, 250, Duration::from_secs(60)), metrics.clone());
        assert_eq!(link.deliver(data(100)), Delivery::Queued);
        assert_eq!(link.deliver(data(100)), Delivery::Queued);
        assert_eq!(metrics.full_frontend_write_queues.get(), 1);
        assert_eq!(link.deliver(data(100)), Delivery::Overflow);
        // Control packets still pass, so the close reaches the frontend.
        assert_eq!(link.deliver(close_response(1, "x")), Delivery::Queued);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            queue.recv().await.unwrap();
            queue.recv().await.unwrap();
        });
        assert_eq!(
            metrics.full_frontend_write_queues.get(),
            0,
            "drained back within its length"
        );
        drop((link, queue));
        assert_eq!(metrics.full_frontend_write_queues.get(), 0);
    }

    #[test]
    fn a_full_queue_without_progress_is_stalled() {
        let metrics = Arc::new(Metrics::new());
        let (link, queue) = FrontendLink::new(limits(0, 1 << 20, Duration::ZERO), metrics.clone());
        assert_eq!(link.deliver(data(10)), Delivery::Queued);
        std::thread::sleep(Duration::from_millis(5));
        assert!(link.is_stalled());
        assert_eq!(link.deliver(data(10)), Delivery::Overflow);
        drop(queue);
        drop(link);
        assert_eq!(
            metrics.full_frontend_write_queues.get(),
            0,
            "the gauge returns to zero"
        );
    }
}
