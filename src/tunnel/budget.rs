//! The server-wide ceiling on the bytes queued toward all frontends, shared by every
//! tunnel's queue.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use super::{QueueState, PROGRESS_WINDOW};

/// The bytes queued toward all frontends of one server, and their ceiling
/// (--frontend-queue-budget-bytes, reloadable). The queues count themselves in here; the agent
/// dispatch enforces the ceiling (see `backend::dispatch::enforce_budget`).
pub struct QueueBudget {
    pub(super) limit: AtomicUsize,
    pub(super) used: AtomicUsize,
    /// Queues holding at least one byte: the budget's fair share is split among them.
    pub(super) holders: AtomicUsize,
    /// The same queues by link uid, so the budget can find one whose tunnel is already closed
    /// at its agent but whose frontend never read what was queued.
    pub(super) holding: Mutex<std::collections::HashMap<u64, std::sync::Weak<QueueState>>>,
}

impl QueueBudget {
    pub fn new(limit: usize) -> QueueBudget {
        QueueBudget {
            limit: AtomicUsize::new(limit),
            used: AtomicUsize::new(0),
            holders: AtomicUsize::new(0),
            holding: Mutex::new(std::collections::HashMap::new()),
        }
    }

    pub(super) fn holding(
        &self,
    ) -> MutexGuard<'_, std::collections::HashMap<u64, std::sync::Weak<QueueState>>> {
        // Single inserts and removes only: a poisoned lock is still consistent.
        self.holding.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Empties the queue that holds the most bytes among those whose frontend is not reading
    /// (see [`FrontendLink::abort`]). Returns the bytes freed, or `None` if every queue that
    /// holds anything belongs to a reader.
    pub fn abort_largest_idle(&self) -> Option<usize> {
        let victim = self
            .holding()
            .values()
            .filter_map(std::sync::Weak::upgrade)
            .filter(|q| q.since_progress() >= PROGRESS_WINDOW)
            .max_by_key(|q| q.bytes.load(Ordering::Acquire))?;
        victim.aborted.cancel();
        Some(victim.purge_data())
    }

    /// A reload changes the ceiling; queues keep what they hold.
    pub fn set_limit(&self, limit: usize) {
        self.limit.store(limit, Ordering::Release);
    }

    pub fn limit(&self) -> usize {
        self.limit.load(Ordering::Acquire)
    }

    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    pub fn is_over(&self) -> bool {
        self.used() > self.limit()
    }

    /// What one queue may hold while the budget is exceeded: the budget split evenly among
    /// the queues that hold anything.
    pub(super) fn fair_share(&self) -> usize {
        self.limit() / self.holders.load(Ordering::Acquire).max(1)
    }
}
