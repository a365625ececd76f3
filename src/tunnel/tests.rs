//! Unit tests of the tunnel queue and the queue budget.

use super::*;
use crate::wire::close_response;

fn unlimited() -> Arc<QueueBudget> {
    Arc::new(QueueBudget::new(usize::MAX))
}

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
    let (link, mut queue) = FrontendLink::new(limits, unlimited(), metrics.clone());
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
    assert_eq!(metrics.frontend.blocked_write_channels.get(), 0);
    let _queue = reader.await.unwrap();
}

#[tokio::test]
async fn a_stopped_frontend_does_not_hold_the_agent() {
    let metrics = Arc::new(Metrics::new());
    let mut limits = limits(0, 100, Duration::from_secs(60));
    limits.hard_bytes = 1000;
    let (link, _queue) = FrontendLink::new(limits, unlimited(), metrics.clone());
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
    assert_eq!(metrics.frontend.blocked_write_channels.get(), 0);
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
    let (link, _queue) = FrontendLink::new(
        limits(3, 10, Duration::from_secs(60)),
        unlimited(),
        metrics.clone(),
    );
    for _ in 0..3 {
        assert_eq!(
            link.deliver(data(100)),
            Delivery::Queued,
            "bytes only count once full"
        );
    }
    assert_eq!(metrics.frontend.full_write_queues.get(), 0);
}

#[test]
fn a_full_queue_overflows_past_its_byte_limit_and_recovers_when_drained() {
    let metrics = Arc::new(Metrics::new());
    let (link, mut queue) = FrontendLink::new(
        limits(1, 250, Duration::from_secs(60)),
        unlimited(),
        metrics.clone(),
    );
    assert_eq!(link.deliver(data(100)), Delivery::Queued);
    assert_eq!(link.deliver(data(100)), Delivery::Queued);
    assert_eq!(metrics.frontend.full_write_queues.get(), 1);
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
        metrics.frontend.full_write_queues.get(),
        0,
        "drained back within its length"
    );
    drop((link, queue));
    assert_eq!(metrics.frontend.full_write_queues.get(), 0);
}

#[test]
fn a_full_queue_without_progress_is_stalled() {
    let metrics = Arc::new(Metrics::new());
    let (link, queue) = FrontendLink::new(
        limits(0, 1 << 20, Duration::ZERO),
        unlimited(),
        metrics.clone(),
    );
    assert_eq!(link.deliver(data(10)), Delivery::Queued);
    std::thread::sleep(Duration::from_millis(5));
    assert!(link.is_stalled());
    assert_eq!(link.deliver(data(10)), Delivery::Overflow);
    drop(queue);
    drop(link);
    assert_eq!(
        metrics.frontend.full_write_queues.get(),
        0,
        "the gauge returns to zero"
    );
}

#[test]
fn the_budget_counts_every_queue_and_empties_the_largest_idle_one() {
    let metrics = Arc::new(Metrics::new());
    let budget = Arc::new(QueueBudget::new(1000));
    let wide = limits(0, 1 << 20, Duration::from_secs(60));
    let (small, _q1) = FrontendLink::new(wide, budget.clone(), metrics.clone());
    let (large, _q2) = FrontendLink::new(wide, budget.clone(), metrics.clone());
    assert_eq!(small.deliver(data(300)), Delivery::Queued);
    assert_eq!(large.deliver(data(500)), Delivery::Queued);
    assert_eq!(large.deliver(data(500)), Delivery::Queued);
    assert_eq!(budget.used(), 1300);
    assert_eq!(metrics.frontend.queued_bytes.get(), 1300);
    assert!(budget.is_over());
    assert_eq!(
        budget.fair_share(),
        500,
        "split among the two queues holding bytes"
    );
    // Neither frontend has taken anything yet; wait out the progress window.
    std::thread::sleep(PROGRESS_WINDOW);
    assert_eq!(
        budget.abort_largest_idle(),
        Some(1000),
        "the larger queue is emptied"
    );
    assert_eq!(budget.used(), 300);
    assert!(!budget.is_over());
    assert_eq!(large.queued_bytes(), 0);
    assert_eq!(
        large.deliver(data(10)),
        Delivery::Overflow,
        "nothing more is queued for an aborted tunnel"
    );
    assert_eq!(
        large.deliver(close_response(1, "x")),
        Delivery::Queued,
        "control packets still pass"
    );
    assert_eq!(small.queued_bytes(), 300, "the other queue keeps its data");
}

#[test]
fn a_reading_frontend_is_never_emptied_by_the_budget() {
    let metrics = Arc::new(Metrics::new());
    let budget = Arc::new(QueueBudget::new(100));
    let wide = limits(0, 1 << 20, Duration::from_secs(60));
    let (link, mut queue) = FrontendLink::new(wide, budget.clone(), metrics.clone());
    for _ in 0..3 {
        assert_eq!(link.deliver(data(100)), Delivery::Queued);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async { queue.recv().await.unwrap() });
    // However long this thread is descheduled, the frontend counts as having just read.
    let far = link.state.now() + 3_600_000;
    link.state.last_progress.store(far, Ordering::Release);
    assert!(link.is_reading());
    assert!(budget.is_over());
    assert_eq!(budget.abort_largest_idle(), None);
    assert_eq!(link.queued_bytes(), 200);
}

#[test]
fn a_frontend_that_goes_away_gives_its_bytes_back_at_once() {
    let metrics = Arc::new(Metrics::new());
    let budget = Arc::new(QueueBudget::new(1 << 20));
    let wide = limits(0, 1 << 20, Duration::from_secs(60));
    let (link, queue) = FrontendLink::new(wide, budget.clone(), metrics.clone());
    for _ in 0..4 {
        assert_eq!(link.deliver(data(1000)), Delivery::Queued);
    }
    assert_eq!(budget.used(), 4000);
    drop(queue);
    assert_eq!(budget.used(), 0, "freed while the link is still held");
    assert_eq!(metrics.frontend.queued_bytes.get(), 0);
    assert_eq!(link.deliver(data(10)), Delivery::Gone);
    assert!(budget.holding().is_empty());
    drop(link);
    assert_eq!(budget.used(), 0);
}
