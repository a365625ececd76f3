//! The memory allocator's statistics for the metrics. The allocator itself is jemalloc, with a
//! background thread that hands freed pages back to the kernel within about a second
//! (configured in `.cargo/config.toml`); each binary installs it (`#[global_allocator]` in
//! `src/main.rs` and `src/bin/konnectivity-agent.rs`), not the library, so that a test binary
//! can install an allocator of its own (`tests/memory_guard.rs` counts the bytes it hands out).
//!
//! Why jemalloc rather than glibc's malloc: a burst of queued tunnel data is allocated on
//! whichever worker thread decoded it, and glibc keeps what is freed in per-thread arenas
//! that it trims only at the top of the main heap, so after a burst RSS stayed at its peak;
//! jemalloc's decay returns it while the server idles. The closing notes of the memory issue
//! give the measurements.

// The library's own unit tests are a binary too, and check the statistics against real use.
#[cfg(all(test, feature = "jemalloc"))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// What the allocator holds, in bytes.
#[derive(Clone, Copy, Debug, Default)]
pub struct AllocatorStats {
    /// Bytes handed out to the program.
    pub allocated: u64,
    /// Bytes in pages that hold at least one allocation.
    pub active: u64,
    /// Bytes resident in memory (RSS attributable to the allocator).
    pub resident: u64,
}

/// A fresh reading; `None` if the allocator does not answer.
#[cfg(not(feature = "jemalloc"))]
pub fn stats() -> Option<AllocatorStats> {
    None
}

/// A fresh reading; `None` if the allocator does not answer. In a process whose global
/// allocator is not jemalloc (a test binary), the figures are those of an idle jemalloc.
#[cfg(feature = "jemalloc")]
pub fn stats() -> Option<AllocatorStats> {
    use tikv_jemalloc_ctl::{epoch, stats};
    // The statistics are a snapshot taken at the last epoch: advance it first.
    epoch::advance().ok()?;
    Some(AllocatorStats {
        allocated: stats::allocated::read().ok()? as u64,
        active: stats::active::read().ok()? as u64,
        resident: stats::resident::read().ok()? as u64,
    })
}

#[cfg(all(test, feature = "jemalloc"))]
mod tests {
    #[test]
    fn stats_follow_a_large_allocation() {
        let before = super::stats().expect("jemalloc answers");
        let block = vec![1u8; 64 << 20];
        let during = super::stats().expect("jemalloc answers");
        // Other tests allocate and free in parallel: only what this block guarantees.
        assert!(before.active >= before.allocated);
        assert!(during.allocated >= 64 << 20);
        assert!(during.active >= during.allocated);
        drop(block);
    }
}
