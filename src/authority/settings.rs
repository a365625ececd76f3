//! The one invariant the mending rests on, checked on every connection: h2 decodes request
//! headers with the HPACK table size that the follower ([`crate::hpack::HpackDecoder`]) uses.
//!
//! A mended field keeps its decoded length, so h2's table and the client's evict the same
//! entries only while both sides use the same table size. h2 announces its size in the
//! SETTINGS frame it writes first on every connection (SETTINGS_HEADER_TABLE_SIZE, absent when
//! it is the default 4096). Were that ever another value (a newer h2 or hyper default, or a
//! builder setting), indexed references would resolve to different fields in h2 than in the
//! follower, and requests would carry the wrong headers. This reads that first frame as it is
//! written and fails the connection instead.

use std::io;

use crate::hpack::MAX_TABLE_SIZE;

const FRAME_HEADER_LEN: usize = 9;
const SETTINGS: u8 = 0x4;
const SETTINGS_HEADER_TABLE_SIZE: u16 = 0x1;
/// A first SETTINGS frame larger than this is not looked into (h2 writes a few settings).
const MAX_SETTINGS_LEN: usize = 1024;

/// Follows the bytes the server writes until its first frame is complete.
#[derive(Default)]
pub struct FirstSettings {
    seen: Vec<u8>,
    done: bool,
}

#[derive(Debug, thiserror::Error)]
#[error(
    "h2 announced an HPACK table size of {announced} bytes, but the :authority mending \
     follows a table of {MAX_TABLE_SIZE}; refusing the connection rather than misreading its \
     headers"
)]
pub struct TableSizeMismatch {
    announced: u32,
}

impl FirstSettings {
    /// Whether the first frame has been checked (every later write passes unlooked at).
    pub fn done(&self) -> bool {
        self.done
    }

    /// Looks at `written`, the next bytes the server has written.
    pub fn observe(&mut self, mut written: &[u8]) -> Result<(), TableSizeMismatch> {
        while !self.done && !written.is_empty() {
            let need = match frame_len(&self.seen) {
                Some(total) => total - self.seen.len(),
                None => FRAME_HEADER_LEN - self.seen.len(),
            };
            let take = need.min(written.len());
            self.seen.extend_from_slice(&written[..take]);
            written = &written[take..];
            let Some(total) = frame_len(&self.seen) else {
                continue;
            };
            if self.seen[3] != SETTINGS || total > FRAME_HEADER_LEN + MAX_SETTINGS_LEN {
                return self.finish(Ok(()));
            }
            if self.seen.len() == total {
                let announced = self.seen[FRAME_HEADER_LEN..]
                    .chunks_exact(6)
                    .filter(|s| u16::from_be_bytes([s[0], s[1]]) == SETTINGS_HEADER_TABLE_SIZE)
                    .map(|s| u32::from_be_bytes([s[2], s[3], s[4], s[5]]))
                    .find(|value| *value as usize != MAX_TABLE_SIZE);
                return self.finish(match announced {
                    Some(announced) => Err(TableSizeMismatch { announced }),
                    None => Ok(()),
                });
            }
        }
        Ok(())
    }

    fn finish(&mut self, result: Result<(), TableSizeMismatch>) -> Result<(), TableSizeMismatch> {
        self.done = true;
        self.seen = Vec::new();
        result
    }
}

/// The length of the frame whose start `seen` holds, once its header is in.
fn frame_len(seen: &[u8]) -> Option<usize> {
    (seen.len() >= FRAME_HEADER_LEN).then(|| {
        FRAME_HEADER_LEN
            + (((seen[0] as usize) << 16) | ((seen[1] as usize) << 8) | seen[2] as usize)
    })
}

impl From<TableSizeMismatch> for io::Error {
    fn from(e: TableSizeMismatch) -> io::Error {
        io::Error::other(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(u16, u32)]) -> Vec<u8> {
        let mut frame = Vec::new();
        frame.extend_from_slice(&((pairs.len() * 6) as u32).to_be_bytes()[1..]);
        frame.extend_from_slice(&[SETTINGS, 0, 0, 0, 0, 0]);
        for (id, value) in pairs {
            frame.extend_from_slice(&id.to_be_bytes());
            frame.extend_from_slice(&value.to_be_bytes());
        }
        frame
    }

    /// Feeds `bytes` in pieces of `step`, as writes of that size would.
    fn feed(bytes: &[u8], step: usize) -> Result<(), TableSizeMismatch> {
        let mut check = FirstSettings::default();
        for piece in bytes.chunks(step) {
            check.observe(piece)?;
        }
        assert!(check.done(), "the whole first frame was seen");
        Ok(())
    }

    #[test]
    fn the_default_size_or_none_passes_and_another_size_fails_at_any_write_size() {
        let mut other_frame_after = settings(&[(0x3, 200), (0x4, 1 << 20)]);
        other_frame_after.extend_from_slice(&settings(&[(SETTINGS_HEADER_TABLE_SIZE, 1)]));
        let default = settings(&[(SETTINGS_HEADER_TABLE_SIZE, 4096), (0x3, 200)]);
        let other = settings(&[(0x3, 200), (SETTINGS_HEADER_TABLE_SIZE, 8192)]);
        for step in 1..=other.len() {
            assert!(feed(&other_frame_after, step).is_ok(), "step {step}");
            assert!(feed(&default, step).is_ok(), "step {step}");
            let err = feed(&other, step).unwrap_err();
            assert_eq!(err.announced, 8192, "step {step}");
        }
    }

    #[test]
    fn a_first_frame_that_is_not_settings_is_not_looked_into() {
        let mut ping = vec![0, 0, 8, 0x6, 0, 0, 0, 0, 0];
        ping.extend_from_slice(&[0; 8]);
        ping.extend_from_slice(&settings(&[(SETTINGS_HEADER_TABLE_SIZE, 8192)]));
        assert!(feed(&ping, 5).is_ok());
    }
}
