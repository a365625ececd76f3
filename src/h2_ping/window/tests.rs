use std::collections::VecDeque;
use std::time::Duration;

use super::*;

fn settings(window: u32) -> Vec<u8> {
    let mut frame = vec![0, 0, 12, 0x4, 0, 0, 0, 0, 0];
    frame.extend_from_slice(&[0, 3, 0, 0, 0, 100]);
    frame.extend_from_slice(&[0, 4]);
    frame.extend_from_slice(&window.to_be_bytes());
    frame
}

fn paced(h2_window: u32) -> LinkWindow {
    let mut w = LinkWindow::new();
    let out = w.rewrite_settings(&settings(h2_window)).unwrap();
    assert_eq!(settings_value(&out, 4), Some((17, FIRST_TARGET)));
    assert_eq!(settings_value(&out, 3), Some((11, 100)));
    w.peer_headers(1);
    w
}

fn updates(w: &mut LinkWindow) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    w.take_due(&mut out);
    out.chunks(13)
        .map(|f| {
            (
                u32::from_be_bytes([f[5], f[6], f[7], f[8]]),
                u32::from_be_bytes([f[9], f[10], f[11], f[12]]),
            )
        })
        .collect()
}

#[test]
fn the_peer_is_never_told_more_than_h2_granted_nor_more_than_the_target() {
    let mut w = paced(1 << 20);
    let now = Instant::now();
    let mut told = i64::from(FIRST_TARGET);
    let mut h2_granted = 1i64 << 20;
    let mut sent = 0i64;
    for round in 0..200 {
        // The peer sends all it may; h2 hands back what it received (the app reads).
        let may = told - sent;
        assert!(may <= i64::from(w.target()), "round {round}");
        if may > 0 {
            w.peer_data(1, may as usize, now);
            sent += may;
            w.h2_update(1, may as u32);
            h2_granted += may;
        }
        for (stream, inc) in updates(&mut w) {
            assert_eq!(stream, 1);
            told += i64::from(inc);
        }
        assert!(told <= h2_granted, "round {round}");
    }
    assert!(sent > 10 << 20, "the stream kept moving: {sent}");
}

#[test]
fn an_app_that_stops_reading_stops_the_peer_at_h2s_window() {
    let mut w = paced(256 << 10);
    let now = Instant::now();
    let mut told = i64::from(FIRST_TARGET);
    let mut sent = 0i64;
    for _ in 0..100 {
        let may = told - sent;
        if may > 0 {
            w.peer_data(1, may as usize, now);
            sent += may;
        }
        for (_, inc) in updates(&mut w) {
            told += i64::from(inc);
        }
    }
    assert_eq!(sent, 256 << 10, "h2's window, no more");
}

/// What [`transfer`] saw.
struct Transfer {
    secs: f64,
    /// The largest target, and the most bytes queued at the bottleneck at once (what a
    /// DIAL_RSP sent then would wait behind).
    max_target: u32,
    max_queued: u64,
    last_target: u32,
}

/// A link of `rate` bytes/s, `one_way` each way, carrying `total` bytes from the peer, which
/// sends whatever it may; the app reads at once. The bottleneck queues what the peer sends
/// and drains it at `rate`; a PING's ACK queues behind the data already there. Steps of
/// 100 µs.
fn transfer(rate: f64, one_way: Duration, total: u64) -> Transfer {
    enum Item {
        Data(u64),
        Ack,
    }
    let step = Duration::from_micros(100);
    let per_step = rate * step.as_secs_f64();
    let mut w = paced(8 << 20);
    let start = Instant::now();
    let mut now = start;
    let mut may = u64::from(FIRST_TARGET);
    let (mut sent, mut received) = (0u64, 0u64);
    let mut queue: VecDeque<Item> = VecDeque::new();
    let mut queued = 0u64;
    let mut drained = 0.0f64;
    // (arrival, item) toward the receiver, and (arrival, grant or PING) toward the peer.
    let mut to_receiver: VecDeque<(Instant, Item)> = VecDeque::new();
    let mut to_peer: VecDeque<(Instant, Option<u64>)> = VecDeque::new();
    let (mut max_target, mut max_queued) = (0, 0);
    while received < total {
        assert!(
            now - start < Duration::from_secs(600),
            "stuck at {received}"
        );
        // The peer: grants and PINGs that reached it, then what it may send.
        while to_peer.front().is_some_and(|(at, _)| *at <= now) {
            match to_peer.pop_front().map(|(_, what)| what) {
                Some(Some(grant)) => may += grant,
                _ => queue.push_back(Item::Ack),
            }
        }
        let send = may.min(total - sent);
        if send > 0 {
            may -= send;
            sent += send;
            queued += send;
            queue.push_back(Item::Data(send));
        }
        max_queued = max_queued.max(queued);
        // The bottleneck: `per_step` bytes a step; an ACK passes once the data before it has.
        drained += per_step;
        while let Some(item) = queue.front_mut() {
            match item {
                Item::Ack => {
                    to_receiver.push_back((now + one_way, Item::Ack));
                    queue.pop_front();
                }
                Item::Data(n) => {
                    let take = (*n as f64).min(drained.floor()) as u64;
                    if take == 0 {
                        break;
                    }
                    *n -= take;
                    drained -= take as f64;
                    queued -= take;
                    to_receiver.push_back((now + one_way, Item::Data(take)));
                    if *n == 0 {
                        queue.pop_front();
                    }
                }
            }
        }
        if queue.is_empty() {
            drained = drained.min(per_step);
        }
        // The receiver: h2 hands back what the app read; our frames go out.
        while to_receiver.front().is_some_and(|(at, _)| *at <= now) {
            match to_receiver.pop_front().map(|(_, item)| item) {
                Some(Item::Data(n)) => {
                    received += n;
                    if w.peer_data(1, n as usize, now) {
                        to_peer.push_back((now + one_way, None));
                    }
                    w.h2_update(1, n as u32);
                }
                _ => w.sample_answered(now),
            }
        }
        for (_, increment) in updates(&mut w) {
            to_peer.push_back((now + one_way, Some(u64::from(increment))));
        }
        max_target = max_target.max(w.target());
        now += step;
    }
    Transfer {
        secs: (now - start).as_secs_f64(),
        max_target,
        max_queued,
        last_target: w.target(),
    }
}

#[test]
fn a_distant_link_is_filled() {
    // 25 MB/s, 50 ms each way: the pipe holds 2.5 MB, more than the sampling rules allow.
    let t = transfer(25e6, Duration::from_millis(50), 64 << 20);
    let mbps = f64::from(64 << 20) / t.secs / 1e6;
    assert!(mbps >= 20.0, "{mbps:.1} MB/s");
    assert!(t.max_target > NEAR_CEILING, "target {}", t.max_target);
    assert!(
        t.max_target <= 8 << 20,
        "h2's window bounds it: {}",
        t.max_target
    );
}

#[test]
fn a_full_slow_link_queues_little() {
    // 256 KB/s, 2 ms each way: what queues waits 1 s per 256 KB.
    let t = transfer(256e3, Duration::from_millis(2), 4 << 20);
    assert!(t.last_target <= 128 << 10, "target {}", t.last_target);
    // A probe a step beyond, taken back when it brings nothing.
    assert!(t.max_target <= 256 << 10, "target {}", t.max_target);
    assert!(t.max_queued <= 320 << 10, "queued {}", t.max_queued);
}

#[test]
fn a_near_link_keeps_the_near_ceiling() {
    // 400 MB/s, 50 µs each way (loopback): more window brings nothing.
    let t = transfer(400e6, Duration::from_micros(50), 256 << 20);
    assert!(t.max_target <= NEAR_CEILING, "target {}", t.max_target);
}

#[test]
fn the_target_grows_while_the_bandwidth_grows_and_stops_on_a_full_link() {
    // A slow link: the round trip grows with what is in flight, the bandwidth does not.
    let t = transfer(256e3, Duration::from_micros(50), 2 << 20);
    assert!(t.last_target <= 128 << 10, "target {}", t.last_target);

    // A fast link that is full (a busy server, many tunnels): the bandwidth stays at
    // 20 MB/s whatever the window, but a window it drains in 250 ms costs little, so
    // the target still grows, to the near ceiling (its round trips are queue, not distance).
    let t = transfer(20e6, Duration::from_micros(50), 64 << 20);
    assert_eq!(t.last_target, NEAR_CEILING);
}

#[test]
fn other_streams_get_what_settings_withheld_and_are_not_paced() {
    let mut w = paced(1 << 20);
    w.peer_headers(3);
    w.peer_headers(3); // trailers
    assert_eq!(updates(&mut w), vec![(3, (1 << 20) - FIRST_TARGET)]);
    assert!(!w.h2_update(3, 1000));
    assert!(w.h2_update(1, 1000));
    assert!(!w.peer_data(3, 1000, Instant::now()));
}

#[test]
fn settings_without_a_window_or_a_small_one_turn_pacing_off() {
    let mut w = LinkWindow::new();
    assert!(w
        .rewrite_settings(&[0, 0, 6, 4, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 1])
        .is_none());
    assert!(!w.pacing());
    let mut w = LinkWindow::new();
    assert!(w.rewrite_settings(&settings(FIRST_TARGET)).is_none());
    w.peer_headers(1);
    assert!(!w.h2_update(1, 10));
}

#[test]
fn a_later_settings_with_a_window_hands_over_the_debt() {
    let mut w = paced(1 << 20);
    assert!(w.rewrite_settings(&settings(2 << 20)).is_none());
    assert_eq!(updates(&mut w), vec![(1, (1 << 20) - FIRST_TARGET)]);
    assert!(!w.h2_update(1, 10));
}
