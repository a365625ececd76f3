//! When to sync, as upstream's bounded-frequency runner decides: a request runs a sync at
//! once unless one ended less than `min_interval` ago (then requests in between become one
//! sync at the end of it); with no request, a sync runs every `max_interval`, or
//! `retry_interval` after a failed one. Beyond upstream, the proxier may ask to run again at
//! a moment of its own (a flushed chain that may now be deleted).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::proxier::SyncOutcome;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Intervals {
    /// `--iptables-min-sync-period` (or the mode's): at most one sync per this.
    pub min: Duration,
    /// `--iptables-sync-period`: the retry after a failure.
    pub retry: Duration,
    /// The full resync period (1 h).
    pub max: Duration,
}

/// What the runner runs.
pub trait SyncTarget {
    fn sync(&mut self) -> impl Future<Output = SyncOutcome> + Send + '_;
}

/// Runs `target`'s sync whenever `requests` is notified (and on the timers) until `stop`.
/// `intervals` is read before each wait, so a reload changes them in place.
pub async fn run<T: SyncTarget>(
    requests: Arc<Notify>,
    intervals: impl Fn() -> Intervals,
    stop: CancellationToken,
    target: &mut T,
) {
    let mut next_run = Instant::now() + intervals().max;
    let mut wake_at: Option<Instant> = None;
    loop {
        let deadline = wake_at.map_or(next_run, |w| w.min(next_run));
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = requests.notified() => {}
            _ = tokio::time::sleep_until(deadline) => {}
        }
        let outcome = target.sync().await;
        let now = Instant::now();
        let i = intervals();
        next_run = now
            + if outcome.ok {
                i.max
            } else {
                i.retry.min(i.max)
            };
        wake_at = outcome.wake_at.map(|w| Instant::from_std(w).max(now));
        // Nothing runs again before `min` has passed; requests meanwhile are kept (Notify
        // holds one permit), so they become one sync.
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(i.min) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Counts its runs and answers from a script.
    struct Script {
        runs: Arc<AtomicUsize>,
        answer: fn(usize) -> SyncOutcome,
    }

    impl SyncTarget for Script {
        fn sync(&mut self) -> impl Future<Output = SyncOutcome> + Send + '_ {
            let n = self.runs.fetch_add(1, Ordering::SeqCst);
            let answer = (self.answer)(n);
            async move { answer }
        }
    }

    fn intervals() -> Intervals {
        Intervals {
            min: Duration::from_secs(1),
            retry: Duration::from_secs(30),
            max: Duration::from_secs(3600),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn requests_within_the_min_interval_become_one_sync() {
        let requests = Arc::new(Notify::new());
        let stop = CancellationToken::new();
        let runs = Arc::new(AtomicUsize::new(0));
        let mut script = Script {
            runs: runs.clone(),
            answer: |_| SyncOutcome {
                ok: true,
                wake_at: None,
            },
        };
        let (r, s) = (requests.clone(), stop.clone());
        let task = tokio::spawn(async move { run(r, intervals, s, &mut script).await });
        requests.notify_one();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        for _ in 0..5 {
            requests.notify_one();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1, "held by the min interval");
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 2, "the held requests ran once");
        // Nothing asked: the next run is the full resync an hour later.
        tokio::time::sleep(Duration::from_secs(3599)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 3);
        stop.cancel();
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_retries_after_the_sync_period_and_a_wake_is_honoured() {
        let requests = Arc::new(Notify::new());
        let stop = CancellationToken::new();
        let runs = Arc::new(AtomicUsize::new(0));
        let mut script = Script {
            runs: runs.clone(),
            answer: |n| match n {
                0 => SyncOutcome {
                    ok: false,
                    wake_at: None,
                },
                1 => SyncOutcome {
                    ok: true,
                    wake_at: Some(tokio::time::Instant::now().into_std() + Duration::from_secs(5)),
                },
                _ => SyncOutcome {
                    ok: true,
                    wake_at: None,
                },
            },
        };
        let (r, s) = (requests.clone(), stop.clone());
        let task = tokio::spawn(async move { run(r, intervals, s, &mut script).await });
        requests.notify_one();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        tokio::time::sleep(Duration::from_secs(29)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            runs.load(Ordering::SeqCst),
            2,
            "retried after the sync period"
        );
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 3, "woken for its own reason");
        stop.cancel();
        task.await.unwrap();
    }
}
