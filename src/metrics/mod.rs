//! The server's Prometheus metrics, with upstream's names, labels, buckets and HELP text, so
//! existing dashboards and alerts keep working. Registered in a registry of our own (not the
//! process-global one) so tests can run many servers in one process.
//!
//! The families are grouped by the part of the server that updates them, one module each;
//! every family is created and registered in one place ([`family::Families`]). They live
//! here rather than beside their owners because every owner reaches them through the one
//! [`Metrics`] the shared state holds: a group inside `frontend/` would have this module
//! import the frontend, which imports this module.

mod backend;
mod dial;
pub(crate) mod exposition;
pub(crate) mod family;
mod frontend;
pub(crate) mod grpc_status;
mod kubernetes;
pub(crate) mod log_limit;
pub(crate) mod process;
mod runtime;
mod tunnel;

use prometheus::Registry;

pub use backend::BackendMetrics;
pub use dial::{DialFailure, DialMetrics};
pub use frontend::FrontendMetrics;
pub use grpc_status::stream_error_code;
pub use kubernetes::{KubernetesMetrics, LeaseCall};
pub use runtime::RuntimeMetrics;
pub use tunnel::{Peer, Segment, TunnelMetrics};

const SUBSYSTEM: &str = "server";
/// Upstream's buckets for the dial and frontend-write latencies.
const LATENCY_BUCKETS: &[f64] = &[1e-6, 1e-5, 1e-4, 0.005, 0.025, 0.1, 0.5, 2.5, 12.5];

pub struct Metrics {
    registry: Registry,
    pub frontend: FrontendMetrics,
    pub dial: DialMetrics,
    pub backend: BackendMetrics,
    pub tunnel: TunnelMetrics,
    pub kubernetes: KubernetesMetrics,
    pub runtime: RuntimeMetrics,
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let f = family::Families::new(&registry, SUBSYSTEM);
        let metrics = Metrics {
            frontend: FrontendMetrics::new(&f),
            dial: DialMetrics::new(&f),
            backend: BackendMetrics::new(&f),
            tunnel: TunnelMetrics::new(&f),
            kubernetes: KubernetesMetrics::new(&f),
            runtime: RuntimeMetrics::new(&f),
            registry: registry.clone(),
        };
        for collector in process::collectors() {
            f.collector(collector);
        }
        metrics
    }

    /// The classic Prometheus text exposition of every family.
    pub fn render(&self) -> String {
        self.runtime.read_allocator();
        exposition::render(&self.registry)
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_le_labels_are_spelled_as_go_spells_them() {
        let m = Metrics::new();
        m.dial.dial_duration.observe(0.003);
        let text = m.render();
        for le in [
            "1e-06", "1e-05", "0.0001", "0.005", "0.025", "0.1", "0.5", "2.5", "12.5", "+Inf",
        ] {
            let line = format!(
                "konnectivity_network_proxy_server_dial_duration_seconds_bucket{{le=\"{le}\"}} "
            );
            assert!(text.contains(&line), "{line} in {text}");
        }
        assert!(!text.contains("0.000001"), "{text}");
        assert!(
            text.contains("konnectivity_network_proxy_server_dial_duration_seconds_sum 0.003\n")
        );
        assert!(text.contains("konnectivity_network_proxy_server_connection_duration_seconds_bucket{le=\"86400\"} 0\n"));
    }

    #[test]
    fn process_families_match_gos_collector() {
        let text = Metrics::new().render();
        for (name, help) in [
            (
                "process_network_receive_bytes_total",
                "Number of bytes received by the process over the network.",
            ),
            (
                "process_network_transmit_bytes_total",
                "Number of bytes sent by the process over the network.",
            ),
            (
                "process_virtual_memory_max_bytes",
                "Maximum amount of virtual memory available in bytes.",
            ),
        ] {
            assert!(
                text.contains(&format!("# HELP {name} {help}\n")),
                "{name}: {text}"
            );
        }
    }
}
