//! The allowance for log lines about peers that break the protocol. A peer can send a hundred
//! thousand bad packets a second; the journal must not take a line for each, but the first
//! ones, and how many went unlogged, must be seen.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};

/// One line a second, in bursts of ten.
fn quota() -> governor::Quota {
    const BURST: NonZeroU32 = match NonZeroU32::new(10) {
        Some(n) => n,
        None => panic!("a positive burst"),
    };
    governor::Quota::per_second(NonZeroU32::MIN).allow_burst(BURST)
}

/// One program-wide allowance, and the count of lines it withheld.
pub(crate) struct ViolationLog {
    limiter: governor::DefaultDirectRateLimiter,
    unlogged: AtomicU64,
    logged: AtomicU64,
}

impl ViolationLog {
    pub(crate) fn new() -> ViolationLog {
        ViolationLog {
            limiter: governor::RateLimiter::direct(quota()),
            unlogged: AtomicU64::new(0),
            logged: AtomicU64::new(0),
        }
    }

    /// `Some(n)` when a line may be written now, `n` being how many were withheld since the
    /// last one; `None` when it must not be.
    pub(crate) fn allow(&self) -> Option<u64> {
        if self.limiter.check().is_ok() {
            self.logged.fetch_add(1, Ordering::AcqRel);
            Some(self.unlogged.swap(0, Ordering::AcqRel))
        } else {
            self.unlogged.fetch_add(1, Ordering::AcqRel);
            None
        }
    }

    /// How many lines were allowed so far.
    pub(crate) fn lines(&self) -> u64 {
        self.logged.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_logged_then_the_rest_counted() {
        let log = ViolationLog::new();
        for _ in 0..10 {
            assert_eq!(log.allow(), Some(0));
        }
        assert_eq!(log.allow(), None);
        assert_eq!(log.allow(), None);
        assert_eq!(log.lines(), 10);
    }
}
