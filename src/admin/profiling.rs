//! Profiling on the admin port (`--enable-profiling`): CPU profiles in pprof's protobuf format,
//! which `go tool pprof` reads, and a summary of the allocator's heap.

use std::sync::Mutex;
use std::time::Duration;

use pprof::protos::Message;

const DEFAULT_SECONDS: u64 = 30;
const MAX_SECONDS: u64 = 300;
/// Go's default profiling rate.
const SAMPLE_HZ: i32 = 100;

static PROFILE_RUNNING: Mutex<()> = Mutex::new(());

#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("Could not enable CPU profiling: a profile is already running")]
    Busy,
    #[error("profiling failed: {0}")]
    Failed(String),
}

/// Reads `seconds=N` from a query string as Go's handler does (default 30), capped.
pub fn profile_seconds(query: Option<&str>) -> Duration {
    let seconds = query
        .and_then(|q| {
            form_urlencoded::parse(q.as_bytes())
                .find(|(k, _)| k == "seconds")
                .and_then(|(_, v)| v.parse::<u64>().ok())
        })
        .filter(|s| *s > 0)
        .unwrap_or(DEFAULT_SECONDS);
    Duration::from_secs(seconds.min(MAX_SECONDS))
}

/// Samples the whole process for `duration` and returns the encoded pprof profile.
/// Blocking: run it on a blocking thread.
pub fn cpu_profile(duration: Duration) -> Result<Vec<u8>, ProfileError> {
    let _running = PROFILE_RUNNING.try_lock().map_err(|_| ProfileError::Busy)?;
    let guard = pprof::ProfilerGuardBuilder::default()
        .frequency(SAMPLE_HZ)
        .blocklist(&["libc", "libgcc", "pthread", "vdso"])
        .build()
        .map_err(|e| ProfileError::Failed(e.to_string()))?;
    std::thread::sleep(duration);
    let report = guard
        .report()
        .build()
        .map_err(|e| ProfileError::Failed(e.to_string()))?;
    let profile = report
        .pprof()
        .map_err(|e| ProfileError::Failed(e.to_string()))?;
    profile
        .write_to_bytes()
        .map_err(|e| ProfileError::Failed(e.to_string()))
}

/// A text view of the allocator's heap (jemalloc's statistics).
pub fn heap_summary() -> String {
    let stats = crate::allocator::stats().unwrap_or_default();
    format!(
        "# heap summary from the allocator (jemalloc); per-allocation heap profiles need a \
         profiling build and are not built in\n\
         in_use_bytes {}\nactive_bytes {}\nresident_bytes {}\n",
        stats.allocated, stats.active, stats.resident
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_default_and_cap() {
        assert_eq!(profile_seconds(None), Duration::from_secs(30));
        assert_eq!(profile_seconds(Some("seconds=2")), Duration::from_secs(2));
        assert_eq!(
            profile_seconds(Some("seconds=9999")),
            Duration::from_secs(300)
        );
        assert_eq!(profile_seconds(Some("seconds=x")), Duration::from_secs(30));
    }

    #[test]
    fn profile_is_a_pprof_protobuf() {
        let bytes = cpu_profile(Duration::from_millis(200)).unwrap();
        let profile = pprof::protos::Profile::parse_from_bytes(&bytes).unwrap();
        assert!(!profile.string_table.is_empty());
        assert!(heap_summary().contains("in_use_bytes"));
    }
}
