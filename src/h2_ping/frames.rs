//! Following frame boundaries in one direction of an HTTP/2 byte stream, and the frames
//! [`super::PingIo`] looks at on the way.

use super::{
    FLAG_ACK, FRAME_HEADER, MARKER, PING_LEN, SAMPLE_MARKER, TYPE_PING, TYPE_WINDOW_UPDATE,
};

/// What [`Frames::advance`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Event {
    /// A frame header, complete.
    Header {
        kind: u8,
        flags: u8,
        stream: u32,
        len: usize,
    },
    /// A WINDOW_UPDATE, whole.
    Update { stream: u32, increment: u32 },
    /// An ACK of one of our PINGs, whole: `sample` for a measuring one, else its sequence.
    Ack { sample: bool, seq: u32 },
}

/// Follows frame boundaries in one direction of an HTTP/2 byte stream.
#[derive(Default)]
pub(super) struct Frames {
    /// Bytes of a preface still to skip before the first frame.
    pub(super) preface: usize,
    header: [u8; FRAME_HEADER],
    have: usize,
    /// Bytes of the current frame's payload not seen yet.
    body: usize,
    /// Complete frames seen.
    pub(super) frames: u64,
    /// The payload so far of a PING ACK or a WINDOW_UPDATE being read.
    capture: Option<([u8; PING_LEN], usize)>,
}

impl Frames {
    /// A stream that begins with `preface` bytes before its first frame.
    pub(super) fn with_preface(preface: usize) -> Frames {
        Frames {
            preface,
            ..Frames::default()
        }
    }

    pub(super) fn at_boundary(&self) -> bool {
        self.preface == 0 && self.have == 0 && self.body == 0
    }

    /// How many bytes to the end of the preface, the frame header or the frame (at least 1).
    pub(super) fn step(&self) -> usize {
        if self.preface > 0 {
            self.preface
        } else if self.have < FRAME_HEADER {
            FRAME_HEADER - self.have
        } else {
            self.body.max(1)
        }
    }

    /// The payload bytes of the current frame still to come, when its header is complete.
    pub(super) fn body_left(&self) -> Option<usize> {
        (self.preface == 0 && self.have == FRAME_HEADER).then_some(self.body)
    }

    /// Moves past `bytes`, which the stream carried in order, telling `on` what it saw.
    pub(super) fn advance(&mut self, mut bytes: &[u8], on: &mut impl FnMut(Event)) {
        while !bytes.is_empty() {
            let n = if self.preface > 0 {
                let n = self.preface.min(bytes.len());
                self.preface -= n;
                n
            } else if self.have < FRAME_HEADER {
                let n = (FRAME_HEADER - self.have).min(bytes.len());
                self.header[self.have..self.have + n].copy_from_slice(&bytes[..n]);
                self.have += n;
                if self.have == FRAME_HEADER {
                    let (len, kind, flags, stream) = parse_header(&self.header);
                    self.body = len;
                    on(Event::Header {
                        kind,
                        flags,
                        stream,
                        len,
                    });
                    let ping_ack = kind == TYPE_PING && flags & FLAG_ACK != 0 && stream == 0;
                    if (ping_ack && len == PING_LEN) || (kind == TYPE_WINDOW_UPDATE && len == 4) {
                        self.capture = Some(([0; PING_LEN], 0));
                    }
                    if self.body == 0 {
                        self.end_frame(on);
                    }
                }
                n
            } else {
                let n = self.body.min(bytes.len());
                if let Some((payload, have)) = &mut self.capture {
                    payload[*have..*have + n].copy_from_slice(&bytes[..n]);
                    *have += n;
                }
                self.body -= n;
                if self.body == 0 {
                    self.end_frame(on);
                }
                n
            };
            bytes = &bytes[n..];
        }
    }

    fn end_frame(&mut self, on: &mut impl FnMut(Event)) {
        if let Some((payload, _)) = self.capture.take() {
            let (_, kind, _, stream) = parse_header(&self.header);
            let word = |at: usize| {
                u32::from_be_bytes([
                    payload[at],
                    payload[at + 1],
                    payload[at + 2],
                    payload[at + 3],
                ])
            };
            if kind == TYPE_WINDOW_UPDATE {
                on(Event::Update {
                    stream,
                    increment: word(0) & 0x7fff_ffff,
                });
            } else if payload[..4] == MARKER || payload[..4] == SAMPLE_MARKER {
                on(Event::Ack {
                    sample: payload[..4] == SAMPLE_MARKER,
                    seq: word(4),
                });
            }
        }
        self.have = 0;
        self.frames += 1;
    }
}

/// (payload length, type, flags, stream id) of a frame header.
pub(super) fn parse_header(h: &[u8]) -> (usize, u8, u8, u32) {
    let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
    (frame_len(h), h[3], h[4], stream)
}

pub(super) fn frame_len(header: &[u8]) -> usize {
    (usize::from(header[0]) << 16) | (usize::from(header[1]) << 8) | usize::from(header[2])
}
