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

    /// The next chunk for the writer; `None` once the queue is closed.
    pub async fn next(&self) -> Option<Bytes> {
        loop {
            let chunk = self.chunks().pop_front();
            if let Some(chunk) = chunk {
                let len = chunk.len();
                self.bytes.fetch_sub(len, Ordering::AcqRel);
                self.budget.sub(len);
                self.last_progress.store(self.now_ms(), Ordering::Release);
                self.room.notify_one();
                return Some(chunk);
            }
            if self.closed.load(Ordering::Acquire) {
                return None;
            }
            self.data.notified().await;
        }
    }

    /// Ends the queue: what it holds is dropped and returned to the budget at once.
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
