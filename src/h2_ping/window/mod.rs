//! A receive window on an agent's stream that follows the link's bandwidth-delay product.
//!
//! h2 is configured with a large stream window ([`LinkWindow::new`]'s `h2_window`) and keeps
//! its own accounting of it. The peer is told less: the SETTINGS frame h2 writes is rewritten
//! to announce [`FIRST_TARGET`], and h2's WINDOW_UPDATEs for the paced stream become `debt`,
//! handed to the peer only as far as the current target allows. The peer therefore never
//! holds more than the target in flight (on a slow link, little queues ahead of a DIAL_RSP),
//! and never more than h2 allows (h2's view is the upper bound, so h2 never sees a flow
//! control error). The target grows as grpc-go's and hyper's BDP estimators grow theirs: a
//! PING sent when DATA arrives measures the bytes received within one round trip; when that
//! sample fills 2/3 of the target and the bandwidth it shows is clearly higher than any seen
//! before, the target becomes twice the sample (four times while each raise is used whole,
//! as in TCP's slow start). A link whose bandwidth is already used (the round trip grows with
//! the queue) does not raise it.
//!
//! Those rules stop at [`NEAR_CEILING`]. Beyond it only the link's own bandwidth-delay
//! product raises the target: the best bandwidth seen times the shortest round trip seen,
//! which leaves out whatever queued (in the network, or behind a busy server's readers). A
//! distant link's pipe is filled; a near link whose round trips are long only because of a
//! queue keeps [`NEAR_CEILING`].
//!
//! Only the first stream the peer opens is paced (an agent's `Connect` stream); any other
//! stream is given at once what the rewritten SETTINGS withheld, and is h2's alone after.

use tokio::time::Instant;

/// What the peer is allowed first; grpc-go's and HTTP/2's default window.
pub const FIRST_TARGET: u32 = 64 << 10;
/// The most the sampling rules raise the target to; beyond, only the link's measured
/// bandwidth-delay product does.
pub const NEAR_CEILING: u32 = 2 << 20;
/// The target beyond [`NEAR_CEILING`] is this many times the link's bandwidth-delay product,
/// so that jitter and the time a WINDOW_UPDATE takes to arrive do not empty the pipe...
const BDP_FACTOR: f64 = 2.0;
/// ...and twice that while every raise is used whole (the bandwidth grew with it by at least
/// `WHOLE_GAIN`), as the link's capacity is not known yet: the ramp then quadruples the
/// target per step rather than doubling it.
const RAMP_FACTOR: f64 = 4.0;
const WHOLE_GAIN: f64 = 1.5;
/// A new sample raises the target only if its bandwidth beats the best so far by this much,
/// and a raise is kept only if the next sample beats it again: on a link whose bandwidth
/// is used up, a larger window only lengthens the queue.
const GROWTH_BANDWIDTH: f64 = 1.25;
/// A WINDOW_UPDATE is sent once what the peer may send is short of the target by this
/// share of it: the peer keeps at least 7/8 of the target in flight, so that a sample over
/// one round trip fills the 2/3 that a raise asks for.
const UPDATE_SHARE: i64 = 8;
/// Samples are at least this far apart at first; the gap doubles after every few samples that
/// did not raise the target, up to `MAX_SAMPLE_GAP`.
const MIN_SAMPLE_GAP: std::time::Duration = std::time::Duration::from_millis(10);
const MAX_SAMPLE_GAP: std::time::Duration = std::time::Duration::from_secs(1);
const STABLE_SAMPLES: u32 = 4;

/// A target that the best bandwidth seen drains within this long may always be raised to:
/// what it queues ahead of a DIAL_RSP costs at most this much, and on a fast link shared by
/// many tunnels (or a busy server) the bandwidth gain a raise brings can be too small to see.
const QUEUE_BUDGET_SECS: f64 = 0.25;

/// Whether `target` bytes drain within [`QUEUE_BUDGET_SECS`] at `bandwidth` bytes/s (never
/// beyond [`NEAR_CEILING`]: past it a raise needs the link's own bandwidth-delay product).
fn within_budget(target: u32, bandwidth: f64) -> bool {
    target <= NEAR_CEILING && f64::from(target) <= bandwidth * QUEUE_BUDGET_SECS
}

/// SETTINGS_INITIAL_WINDOW_SIZE (RFC 9113, section 6.5.2).
const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// h2's first SETTINGS not rewritten yet.
    Starting,
    Pacing,
    /// Everything passes unchanged (h2's SETTINGS could not be rewritten).
    Off,
}

pub struct LinkWindow {
    mode: Mode,
    /// The stream window h2 announced and accounts with.
    h2_window: u32,
    /// The peer's first stream, once opened, and the highest stream id it opened.
    paced: Option<u32>,
    last_opened: u32,
    /// What the peer may still send on the paced stream, and what h2 granted that the peer
    /// was not told yet.
    peer_window: i64,
    debt: i64,
    target: u32,
    /// WINDOW_UPDATEs to write: (stream, increment).
    due: Vec<(u32, u32)>,
    sample: Sample,
}

#[derive(Default)]
struct Sample {
    /// When the measuring PING was asked for; `None` while none is out.
    sent_at: Option<Instant>,
    bytes: u64,
    last_at: Option<Instant>,
    gap: std::time::Duration,
    stable: u32,
    /// The best bandwidth seen (bytes per second).
    best: f64,
    /// The shortest round trip seen (seconds; 0 before the first).
    min_rtt: f64,
    /// The target before the last raise, while the sample at the raised one is awaited.
    probing: Option<u32>,
    /// The last raise brought at least `WHOLE_GAIN` more bandwidth.
    whole: bool,
    /// No sample starts before this: the raise just made reaches the peer, and what it sends
    /// with it comes back, one round trip later; a sample before would measure the old
    /// target.
    settle_until: Option<Instant>,
}

impl Sample {
    /// The link's bandwidth-delay product as measured so far, in bytes.
    fn link_bdp(&self) -> f64 {
        self.best * self.min_rtt
    }
}

impl LinkWindow {
    pub fn new() -> LinkWindow {
        LinkWindow {
            mode: Mode::Starting,
            h2_window: 0,
            paced: None,
            last_opened: 0,
            peer_window: 0,
            debt: 0,
            target: FIRST_TARGET,
            due: Vec::new(),
            sample: Sample {
                gap: MIN_SAMPLE_GAP,
                // The first raise quadruples, as slow start does: it is taken back at once on
                // a link it brings nothing.
                whole: true,
                ..Sample::default()
            },
        }
    }

    pub fn target(&self) -> u32 {
        self.target
    }

    pub fn pacing(&self) -> bool {
        self.mode == Mode::Pacing
    }

    /// Whether h2's SETTINGS and WINDOW_UPDATEs are still looked at.
    pub fn intercepting(&self) -> bool {
        self.mode != Mode::Off
    }

    /// A SETTINGS frame of h2's went out unchanged (split across writes, or one this does
    /// not rewrite): the peer may know h2's real window now.
    pub fn settings_passed(&mut self) {
        match self.mode {
            Mode::Starting => self.mode = Mode::Off,
            Mode::Pacing => self.stop(),
            Mode::Off => {}
        }
    }

    /// h2's SETTINGS frame (header included), whole. Returns the frame to write instead, or
    /// `None` to let it pass (and stop pacing: the peer then knows h2's real window).
    pub fn rewrite_settings(&mut self, frame: &[u8]) -> Option<Vec<u8>> {
        if self.mode != Mode::Starting {
            // A later SETTINGS that changes the window would undo the accounting.
            if settings_value(frame, SETTINGS_INITIAL_WINDOW_SIZE).is_some() {
                self.stop();
            }
            return None;
        }
        let Some((at, value)) = settings_value(frame, SETTINGS_INITIAL_WINDOW_SIZE) else {
            self.mode = Mode::Off;
            return None;
        };
        if value <= FIRST_TARGET {
            self.mode = Mode::Off;
            return None;
        }
        self.h2_window = value;
        self.mode = Mode::Pacing;
        let mut out = frame.to_vec();
        out[at..at + 4].copy_from_slice(&FIRST_TARGET.to_be_bytes());
        Some(out)
    }

    /// The peer opened (or continued) `stream` with a HEADERS frame.
    pub fn peer_headers(&mut self, stream: u32) {
        if self.mode != Mode::Pacing || stream == 0 || stream <= self.last_opened {
            return;
        }
        self.last_opened = stream;
        if self.paced.is_none() {
            self.paced = Some(stream);
            self.peer_window = i64::from(FIRST_TARGET);
            self.debt = i64::from(self.h2_window - FIRST_TARGET);
        } else {
            self.due.push((stream, self.h2_window - FIRST_TARGET));
        }
    }

    /// The peer sent `len` flow-controlled bytes on `stream`. Returns whether to send a
    /// measuring PING now.
    pub fn peer_data(&mut self, stream: u32, len: usize, now: Instant) -> bool {
        if self.mode != Mode::Pacing || Some(stream) != self.paced || len == 0 {
            return false;
        }
        self.peer_window -= len as i64;
        self.top_up();
        let sample = &mut self.sample;
        if sample.sent_at.is_some() {
            sample.bytes += len as u64;
            return false;
        }
        if self.target >= self.h2_window
            || sample.last_at.is_some_and(|at| now < at + sample.gap)
            || sample.settle_until.is_some_and(|at| now < at)
        {
            return false;
        }
        sample.sent_at = Some(now);
        sample.last_at = Some(now);
        sample.bytes = len as u64;
        true
    }

    /// The measuring PING was answered.
    pub fn sample_answered(&mut self, now: Instant) {
        let sample = &mut self.sample;
        let Some(sent_at) = sample.sent_at.take() else {
            return;
        };
        // The round trip of this sample, not an average: on a link whose bandwidth is used
        // up, the round trip grows with the window, and an average lagging behind would
        // show a bandwidth that is not there.
        let rtt_span = now.saturating_duration_since(sent_at);
        let rtt = rtt_span.as_secs_f64().max(1e-6);
        if sample.min_rtt == 0.0 || rtt < sample.min_rtt {
            sample.min_rtt = rtt;
        }
        let bandwidth = sample.bytes as f64 / rtt;
        let fills = sample.bytes * 3 >= u64::from(self.target) * 2;
        let best_before = sample.best;
        let best = best_before.max(bandwidth);
        sample.best = best;
        // Beyond the near ceiling, what the link itself justifies is never taken back.
        let justified =
            self.target > NEAR_CEILING && f64::from(self.target) <= BDP_FACTOR * sample.link_bdp();
        if let Some(before) = sample.probing.take() {
            sample.whole = bandwidth >= best_before * WHOLE_GAIN;
            // The sample at the larger target: if it carried no more than the one before and
            // the larger target queues more than the budget, the link was full already; go
            // back.
            if bandwidth < best_before * GROWTH_BANDWIDTH
                && !within_budget(self.target, best)
                && !justified
            {
                self.target = before;
                sample.stable = 0;
                sample.gap = (sample.gap * 2).min(MAX_SAMPLE_GAP);
                return;
            }
        }
        let factor = if sample.whole {
            RAMP_FACTOR
        } else {
            BDP_FACTOR
        };
        let h2_window = u64::from(self.h2_window);
        let near = (sample.bytes as f64 * factor) as u64;
        let near = near.min(u64::from(NEAR_CEILING)).min(h2_window) as u32;
        let raise_near = bandwidth >= best_before * GROWTH_BANDWIDTH
            || within_budget(near, best)
            || sample.stable >= STABLE_SAMPLES;
        let distant = ((factor * sample.link_bdp()) as u64).min(h2_window) as u32;
        let grown = if distant > NEAR_CEILING {
            distant
        } else if raise_near {
            near
        } else {
            0
        };
        if fills && grown > self.target {
            // Larger, on trial (a probe every few steady samples too, as the link may
            // have become faster).
            sample.probing = Some(self.target);
            self.target = grown;
            sample.gap = MIN_SAMPLE_GAP;
            sample.stable = 0;
            sample.settle_until = Some(now + rtt_span);
            self.top_up();
        } else {
            sample.whole = false;
            sample.stable += 1;
            if sample.stable >= STABLE_SAMPLES {
                sample.gap = (sample.gap * 2).min(MAX_SAMPLE_GAP);
            }
        }
    }

    /// h2 wrote a WINDOW_UPDATE. Returns whether it is withheld (kept as debt) rather than
    /// written.
    pub fn h2_update(&mut self, stream: u32, increment: u32) -> bool {
        if self.mode != Mode::Pacing || Some(stream) != self.paced {
            return false;
        }
        self.debt += i64::from(increment);
        self.top_up();
        true
    }

    /// h2's WINDOW_UPDATE for the paced stream went out unchanged (it could not be held).
    pub fn h2_update_passed(&mut self, stream: u32, increment: u32) {
        if self.mode == Mode::Pacing && Some(stream) == self.paced {
            self.peer_window += i64::from(increment);
        }
    }

    /// The WINDOW_UPDATEs to write now, appended to `out` as frames.
    pub fn take_due(&mut self, out: &mut Vec<u8>) {
        for (stream, increment) in self.due.drain(..) {
            out.extend_from_slice(&window_update(stream, increment));
        }
    }

    pub fn has_due(&self) -> bool {
        !self.due.is_empty()
    }

    /// Tells the peer more of what h2 granted, up to the target.
    fn top_up(&mut self) {
        let Some(stream) = self.paced else {
            return;
        };
        let room = i64::from(self.target) - self.peer_window;
        if self.debt <= 0 || room * UPDATE_SHARE < i64::from(self.target) {
            return;
        }
        let give = room.min(self.debt);
        self.debt -= give;
        self.peer_window += give;
        self.queue_update(stream, give);
    }

    fn queue_update(&mut self, stream: u32, amount: i64) {
        let amount = u32::try_from(amount).unwrap_or(u32::MAX >> 1);
        match self.due.iter_mut().find(|(s, _)| *s == stream) {
            Some((_, inc)) => *inc = inc.saturating_add(amount).min(u32::MAX >> 1),
            None => self.due.push((stream, amount)),
        }
    }

    /// Hands over every withheld byte and lets everything pass from now on.
    fn stop(&mut self) {
        if let (Mode::Pacing, Some(stream)) = (self.mode, self.paced) {
            if self.debt > 0 {
                self.queue_update(stream, self.debt);
            }
        }
        self.debt = 0;
        self.mode = Mode::Off;
    }
}

/// The offset of `id`'s value in a SETTINGS frame (header included) and the value.
fn settings_value(frame: &[u8], id: u16) -> Option<(usize, u32)> {
    let payload = frame.get(9..)?;
    payload.chunks_exact(6).enumerate().find_map(|(i, entry)| {
        (u16::from_be_bytes([entry[0], entry[1]]) == id).then(|| {
            (
                9 + i * 6 + 2,
                u32::from_be_bytes([entry[2], entry[3], entry[4], entry[5]]),
            )
        })
    })
}

pub fn window_update(stream: u32, increment: u32) -> [u8; 13] {
    let mut frame = [0u8; 13];
    frame[2] = 4;
    frame[3] = super::TYPE_WINDOW_UPDATE;
    frame[5..9].copy_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    frame[9..].copy_from_slice(&(increment & 0x7fff_ffff).to_be_bytes());
    frame
}

#[cfg(test)]
mod tests;
