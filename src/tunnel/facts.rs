//! What the admin port's `/tunnels` shows of one tunnel beyond its queue: which frontend asked
//! for it and when, and the bytes it sent toward its agent.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// Who asked for a tunnel's dial.
pub struct Origin {
    /// "grpc" or "http-connect".
    pub frontend: &'static str,
    /// The frontend's address, or the Unix socket (see `listen::Accepted::peer`).
    pub peer: Arc<str>,
    /// The frontend's random dial id.
    pub dial_id: i64,
}

/// Facts about one tunnel that its frontend task records and anyone may read.
pub struct TunnelFacts {
    origin: OnceLock<Origin>,
    opened: Instant,
    /// DATA bytes sent to the agent: one relaxed add per packet, no lock.
    to_agent: AtomicU64,
}

impl TunnelFacts {
    pub fn new() -> TunnelFacts {
        TunnelFacts {
            origin: OnceLock::new(),
            opened: Instant::now(),
            to_agent: AtomicU64::new(0),
        }
    }

    /// Records who dialed (once: a second try on another agent keeps the first).
    pub fn set_origin(&self, origin: Origin) {
        let _ = self.origin.set(origin);
    }

    pub fn origin(&self) -> Option<&Origin> {
        self.origin.get()
    }

    /// When the frontend opened the tunnel.
    pub fn opened(&self) -> Instant {
        self.opened
    }

    pub fn add_to_agent(&self, bytes: u64) {
        self.to_agent.fetch_add(bytes, Ordering::Relaxed);
    }

    /// DATA bytes the frontend sent toward the agent so far.
    pub fn to_agent(&self) -> u64 {
        self.to_agent.load(Ordering::Relaxed)
    }
}

impl Default for TunnelFacts {
    fn default() -> Self {
        TunnelFacts::new()
    }
}
