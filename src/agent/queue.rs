//! One tunnel's queue toward its destination, and the agent-wide budget all of them count
//! against.
//!
//! A server stream's receive loop delivers every tunnel's DATA; it must never wait on a
//! destination that has stopped reading, or every other tunnel on that stream stops with it
//! (upstream's worst bug). So each tunnel has its own queue: a destination that is still
//! reading may hold the loop briefly when its queue passes the soft limit (backpressure, as
//! upstream's per-connection channel gives), one that stopped reading never does, and its
//! tunnel is closed alone once its queue passes the hard limit, or once the agent-wide budget
//! runs out.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

// tokio's clock, so a test can pause and advance it.
use tokio::time::Instant;

use bytes::Bytes;
use tokio::sync::Notify;

use super::config::QueueLimits;
use super::metrics::{AgentMetrics, QueueClose};

/// A destination that took something this recently is still reading: the loop may wait for it.
const PROGRESS_WINDOW: Duration = Duration::from_millis(250);
/// The longest the receive loop waits for room in one reading destination's queue.
const MAX_WAIT: Duration = Duration::from_millis(100);

/// The bytes queued toward all destinations of the agent, and their ceiling.
pub struct Budget {
    limit: AtomicUsize,
    used: AtomicUsize,
    metrics: Arc<AgentMetrics>,
}

impl Budget {
    pub fn new(limit: usize, metrics: Arc<AgentMetrics>) -> Budget {
        Budget {
            limit: AtomicUsize::new(limit),
            used: AtomicUsize::new(0),
            metrics,
        }
    }

    /// A reload changes the ceiling; queues keep what they hold.
    pub fn set_limit(&self, limit: usize) {
        self.limit.store(limit, Ordering::Release);
    }

    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    fn fits(&self, more: usize) -> bool {
        self.used() + more <= self.limit.load(Ordering::Acquire)
    }

    fn add(&self, n: usize) {
        self.used.fetch_add(n, Ordering::AcqRel);
        self.metrics.queued_bytes.add(n as i64);
    }

    fn sub(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::AcqRel);
        self.metrics.queued_bytes.sub(n as i64);
    }
}

/// What became of a delivery.
#[derive(Debug, PartialEq, Eq)]
pub enum Delivery {
    Queued,
    /// The tunnel is closing; the data was dropped.
    Closed,
    /// The destination did not keep up: close the tunnel for this reason.
    Refused(QueueClose),
}

pub struct EndpointQueue {
    chunks: Mutex<VecDeque<Bytes>>,
    bytes: AtomicUsize,
    closed: AtomicBool,
    /// Wakes the writer when a chunk arrives or the queue closes.
    data: Notify,
    /// Wakes the receive loop when the writer takes a chunk.
    room: Notify,
    epoch: Instant,
    /// Milliseconds since `epoch` when the writer last took a chunk (or the queue was made).
    last_progress: AtomicU64,
    limits: QueueLimits,
    budget: Arc<Budget>,
}

impl EndpointQueue {
    pub fn new(limits: QueueLimits, budget: Arc<Budget>) -> EndpointQueue {
        EndpointQueue {
            chunks: Mutex::new(VecDeque::new()),
            bytes: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            data: Notify::new(),
            room: Notify::new(),
            epoch: Instant::now(),
            last_progress: AtomicU64::new(0),
            limits,
            budget,
        }
    }

    fn chunks(&self) -> MutexGuard<'_, VecDeque<Bytes>> {
        // Every update under this lock is one push, pop or clear: a poisoned lock is still
        // consistent.
        self.chunks.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn is_reading(&self) -> bool {
        let since = self
            .now_ms()
            .saturating_sub(self.last_progress.load(Ordering::Acquire));
        Duration::from_millis(since) < PROGRESS_WINDOW
    }

    /// Bytes waiting to be written.
    pub fn queued(&self) -> usize {
        self.bytes.load(Ordering::Acquire)
    }

    fn push(&self, data: Bytes) {
        let len = data.len();
        self.bytes.fetch_add(len, Ordering::AcqRel);
        self.budget.add(len);
        self.chunks().push_back(data);
        self.data.notify_one();
    }

    /// Queues `data` for the destination. Waits at most [`MAX_WAIT`], and only for a
    /// destination that is still reading.
    pub async fn deliver(&self, data: Bytes) -> Delivery {
        let len = data.len();
        let started = tokio::time::Instant::now();
        loop {
            if self.closed.load(Ordering::Acquire) {
                return Delivery::Closed;
            }
            let room = self.room.notified();
            let queued = self.queued();
            let fits_budget = self.budget.fits(len);
            if queued + len <= self.limits.soft_bytes && fits_budget {
                self.push(data);
                return Delivery::Queued;
            }
            if queued + len > self.limits.hard_bytes {
                return Delivery::Refused(QueueClose::Overflow);
            }
            let waited_enough = started.elapsed() >= MAX_WAIT;
            if !self.is_reading() || waited_enough {
                if !fits_budget {
                    return Delivery::Refused(QueueClose::Budget);
                }
                // A destination that stopped reading may accrue up to the hard limit (or
                // the stall timeout): the loop moves on to the other tunnels.
                self.push(data);
                return Delivery::Queued;
            }
            let _ = tokio::time::timeout(MAX_WAIT.saturating_sub(started.elapsed()), room).await;
        }
    }

    /// The next chunk for the writer, counted out at once; `None` once the queue is closed.
    #[cfg(test)]
    pub async fn next(&self) -> Option<Bytes> {
        let mut one = Vec::with_capacity(1);
        let mut taken = self.next_batch(&mut one, 0).await?;
        taken.written(taken.bytes);
        Some(one.remove(0))
    }

    /// Moves what is queued into `batch` for one write: at least one chunk, then more while
    /// the batch stays within `max_bytes`. Waits for a chunk; `None` once the queue is closed.
    /// The bytes taken still count against the queue and the budget until the writer says
    /// they are written (or drops what it took): a destination that stops reading holds
    /// them, and they are part of what its tunnel may hold.
    pub async fn next_batch(&self, batch: &mut Vec<Bytes>, max_bytes: usize) -> Option<Taken<'_>> {
        loop {
            let taken = {
                let mut chunks = self.chunks();
                let mut taken = 0;
                while let Some(chunk) = chunks.front() {
                    if !batch.is_empty() && taken + chunk.len() > max_bytes {
                        break;
                    }
                    taken += chunk.len();
                    batch.extend(chunks.pop_front());
                }
                taken
            };
            if !batch.is_empty() {
                return Some(Taken {
                    queue: self,
                    bytes: taken,
                });
            }
            if self.closed.load(Ordering::Acquire) {
                return None;
            }
            self.data.notified().await;
        }
    }

    /// Counts `bytes` of a batch out as written: progress, and room for more.
    fn give_back(&self, bytes: usize, progress: bool) {
        if bytes > 0 {
            self.bytes.fetch_sub(bytes, Ordering::AcqRel);
            self.budget.sub(bytes);
        }
        if progress {
            self.last_progress.store(self.now_ms(), Ordering::Release);
        }
        self.room.notify_one();
    }

    /// Ends the queue: what it holds is dropped and returned to the budget at once (a batch
    /// the writer took goes back when the writer drops it).
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let dropped: usize = std::mem::take(&mut *self.chunks())
            .iter()
            .map(Bytes::len)
            .sum();
        if dropped > 0 {
            self.bytes.fetch_sub(dropped, Ordering::AcqRel);
            self.budget.sub(dropped);
        }
        self.data.notify_one();
        self.room.notify_one();
    }
}

/// The bytes of a batch the writer took and has not yet written; whatever is left of them goes
/// back to the queue and the budget when this is dropped (the tunnel ended mid-write).
pub struct Taken<'a> {
    queue: &'a EndpointQueue,
    bytes: usize,
}

impl Taken<'_> {
    /// `bytes` more of the batch reached the destination.
    pub fn written(&mut self, bytes: usize) {
        let bytes = bytes.min(self.bytes);
        self.bytes -= bytes;
        self.queue.give_back(bytes, true);
    }
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.queue.give_back(self.bytes, false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(soft: usize, budget: usize) -> (EndpointQueue, Arc<Budget>) {
        let metrics = Arc::new(AgentMetrics::new());
        let budget = Arc::new(Budget::new(budget, metrics));
        let limits = QueueLimits {
            soft_bytes: soft,
            hard_bytes: soft * 4,
            stall: Duration::from_secs(30),
            budget_bytes: 0,
        };
        (EndpointQueue::new(limits, budget.clone()), budget)
    }

    #[tokio::test(start_paused = true)]
    async fn a_stopped_reader_never_holds_the_loop_and_is_refused_past_the_hard_limit() {
        let (q, budget) = queue(100, 1 << 20);
        // Nothing is taken: after the progress window the destination counts as stopped.
        tokio::time::advance(PROGRESS_WINDOW * 2).await;
        let mut queued = 0;
        loop {
            let before = tokio::time::Instant::now();
            match q.deliver(Bytes::from(vec![0u8; 30])).await {
                Delivery::Queued => queued += 30,
                Delivery::Refused(why) => {
                    assert_eq!(why, QueueClose::Overflow);
                    break;
                }
                Delivery::Closed => unreachable!(),
            }
            assert_eq!(before, tokio::time::Instant::now(), "delivery never waits");
        }
        assert_eq!(queued, 390);
        assert_eq!(budget.used(), 390);
        q.close();
        assert_eq!(budget.used(), 0, "closing returns every byte");
        assert_eq!(q.next().await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reading_destination_holds_the_loop_within_its_wait() {
        let (q, _) = queue(100, 1 << 20);
        assert_eq!(
            q.deliver(Bytes::from(vec![0u8; 90])).await,
            Delivery::Queued
        );
        let before = tokio::time::Instant::now();
        assert_eq!(
            q.deliver(Bytes::from(vec![0u8; 90])).await,
            Delivery::Queued
        );
        assert_eq!(before.elapsed(), MAX_WAIT, "waited for room, then queued");
        assert_eq!(q.next().await.map(|b| b.len()), Some(90));
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_takes_what_fits_and_at_least_one_chunk() {
        let (q, budget) = queue(1000, 1 << 20);
        for len in [40, 50, 60, 300] {
            assert_eq!(
                q.deliver(Bytes::from(vec![0u8; len])).await,
                Delivery::Queued
            );
        }
        let mut batch = Vec::new();
        let mut taken = q.next_batch(&mut batch, 100).await.expect("a batch");
        assert_eq!(batch.iter().map(Bytes::len).collect::<Vec<_>>(), [40, 50]);
        assert_eq!(budget.used(), 450, "taken is still held until written");
        taken.written(30);
        assert_eq!((budget.used(), q.queued()), (420, 420));
        taken.written(60);
        drop(taken);
        assert_eq!((budget.used(), q.queued()), (360, 360));
        batch.clear();
        let taken = q.next_batch(&mut batch, 100).await.expect("a batch");
        assert_eq!(batch.iter().map(Bytes::len).collect::<Vec<_>>(), [60]);
        // The tunnel ends mid-write: what was not written goes back all the same.
        drop(taken);
        assert_eq!(budget.used(), 300);
        batch.clear();
        // Larger than the batch on its own: taken alone.
        let mut taken = q.next_batch(&mut batch, 100).await.expect("a batch");
        assert_eq!(batch.iter().map(Bytes::len).collect::<Vec<_>>(), [300]);
        taken.written(300);
        assert_eq!(budget.used(), 0, "every byte taken is given back");
        assert_eq!(q.queued(), 0);
        drop(taken);
        q.close();
        batch.clear();
        assert!(q.next_batch(&mut batch, 100).await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn the_budget_refuses_a_stopped_reader() {
        let (q, budget) = queue(1000, 100);
        tokio::time::advance(PROGRESS_WINDOW * 2).await;
        assert_eq!(
            q.deliver(Bytes::from(vec![0u8; 80])).await,
            Delivery::Queued
        );
        assert_eq!(
            q.deliver(Bytes::from(vec![0u8; 80])).await,
            Delivery::Refused(QueueClose::Budget)
        );
        assert_eq!(budget.used(), 80);
    }
}
