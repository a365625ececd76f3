//! The frontends' families: connections by protocol, and the per-tunnel queues toward them.

use prometheus::{Histogram, IntCounter, IntCounterVec, IntGauge, IntGaugeVec};

use super::family::Families;
use super::LATENCY_BUCKETS;

pub struct FrontendMetrics {
    pub grpc_connections: IntGaugeVec,
    pub http_connections: IntGauge,
    pub write_duration: Histogram,
    pub full_write_queues: IntGauge,
    pub blocked_write_channels: IntGauge,
    /// Beyond upstream: tunnels closed because their frontend could not keep up.
    pub queue_overflows: IntCounter,
    /// Beyond upstream: DATA bytes queued toward all frontends (the budget's use).
    pub queued_bytes: IntGauge,
    /// Beyond upstream: tunnels closed to keep the server within its queue budget.
    pub queue_budget_closes: IntCounter,
    /// Beyond upstream: connections accepted, by frontend (its name: `frontend` for the one
    /// the flags describe, or its `[[frontend]]` name). A family of its own, so upstream's
    /// families keep their label sets.
    pub accepted_connections: IntCounterVec,
}

impl FrontendMetrics {
    pub(super) fn new(f: &Families<'_>) -> FrontendMetrics {
        let full_receive_channels = f.gauge_vec(
            "full_receive_channels",
            "Number of current connections blocked by a full receive channel, partitioned by service method.",
            &["service_method"],
        );
        // Nothing here blocks on a receive channel (packets are dispatched as they are read), so
        // these stay 0; they are exposed so dashboards built on upstream find them.
        for method in ["Connect", "Proxy"] {
            full_receive_channels.with_label_values(&[method]).set(0);
        }
        FrontendMetrics {
            grpc_connections: f.gauge_vec(
                "grpc_connections",
                "Number of current grpc connections, partitioned by service method.",
                &["service_method"],
            ),
            http_connections: f.gauge(
                "http_connections",
                "Number of current HTTP CONNECT connections",
            ),
            write_duration: f.histogram(
                "frontend_write_duration_seconds",
                "Latency of write to the frontend in seconds",
                LATENCY_BUCKETS,
            ),
            full_write_queues: f.gauge(
                "full_frontend_write_queues",
                "Number of per-connection HTTP CONNECT frontend write queues currently at capacity.",
            ),
            blocked_write_channels: f.gauge(
                "blocked_frontend_write_channels",
                "Number of backend receive loops currently blocked enqueueing to a full HTTP CONNECT frontend write channel.",
            ),
            queue_overflows: f.counter(
                "frontend_queue_overflows_total",
                "Tunnels closed because their frontend did not drain its queue within the byte or time limit.",
            ),
            queued_bytes: f.gauge(
                "frontend_queued_bytes",
                "DATA bytes queued toward frontends, counted against --frontend-queue-budget-bytes.",
            ),
            queue_budget_closes: f.counter(
                "frontend_queue_budget_closes_total",
                "Tunnels whose frontend was not reading, closed because the server's frontend queue budget was exhausted.",
            ),
            accepted_connections: f.counter_vec(
                "frontend_accepted_connections_total",
                "Frontend connections accepted (after the TLS handshake on TCP), by frontend name.",
                &["frontend"],
            ),
        }
    }
}
