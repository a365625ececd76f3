//! The families about the running program itself: its build, its reloads, and its allocator.

use prometheus::{Gauge, IntCounterVec, IntGauge};

use super::family::Families;

pub struct RuntimeMetrics {
    /// Beyond upstream: reloads by result (success, failure).
    reloads: IntCounterVec,
    /// Beyond upstream: when the last successful reload happened.
    pub last_reload_success: Gauge,
    /// Beyond upstream: always 1, labelled with our version, so dashboards can tell builds apart.
    pub build_info: Gauge,
    /// Beyond upstream: the allocator's view of memory, read at each scrape.
    allocator_bytes: [IntGauge; 3],
    /// Beyond upstream: the server count this server announces to agents now.
    pub server_count: IntGauge,
}

impl RuntimeMetrics {
    pub(super) fn new(f: &Families<'_>) -> RuntimeMetrics {
        let metrics = RuntimeMetrics {
            reloads: f.counter_vec(
                "reloads_total",
                "Configuration reloads, by result (success or failure).",
                &["result"],
            ),
            last_reload_success: f.float_gauge(
                "last_reload_success_timestamp_seconds",
                "Unix time of the last successful configuration reload.",
                &[],
            ),
            build_info: f.float_gauge(
                "build_info",
                "Always 1; the version label names the running konnectivity-server build.",
                &[("version", env!("CARGO_PKG_VERSION"))],
            ),
            allocator_bytes: [
                (
                    "allocator_allocated_bytes",
                    "Bytes the memory allocator has handed out.",
                ),
                (
                    "allocator_active_bytes",
                    "Bytes in the memory allocator's pages that hold allocations.",
                ),
                (
                    "allocator_resident_bytes",
                    "Bytes the memory allocator holds resident in memory.",
                ),
            ]
            .map(|(name, help)| f.gauge(name, help)),
            server_count: f.gauge(
                // Not `server_count`: a `_count` suffix is reserved for histograms and
                // summaries (promtool's lint, which dashboards' tooling applies).
                "announced_servers",
                "The number of proxy servers this server tells connecting agents there are (--server-count; a reload changes it).",
            ),
        };
        metrics.build_info.set(1.0);
        metrics
    }

    pub fn reload(&self, success: bool) {
        let result = if success { "success" } else { "failure" };
        self.reloads.with_label_values(&[result]).inc();
        if success {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0);
            self.last_reload_success.set(now);
        }
    }

    pub fn reloads(&self, success: bool) -> u64 {
        let result = if success { "success" } else { "failure" };
        self.reloads.with_label_values(&[result]).get()
    }

    /// Reads the allocator's figures into their gauges (at each scrape).
    pub(super) fn read_allocator(&self) {
        if let Some(stats) = crate::allocator::stats() {
            let values = [stats.allocated, stats.active, stats.resident];
            for (gauge, value) in self.allocator_bytes.iter().zip(values) {
                gauge.set(value as i64);
            }
        }
    }
}
