//! The agent's Prometheus metrics, with upstream's names, types, labels, buckets and HELP
//! text, plus a few of our own (queue closes, queued bytes, peer violations). Each family is
//! created and registered in one step, by `crate::metrics::family::Families`.

use prometheus::{HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Registry};

use crate::metrics::family::Families;
use crate::metrics::log_limit::ViolationLog;

const SUBSYSTEM: &str = "agent";
/// The label values of a family without labels.
const NO_LABELS: &[&str] = &[];
const DIAL_BUCKETS: &[f64] = &[0.005, 0.025, 0.1, 0.5, 2.5, 10.0, 30.0];

/// Why a destination dial failed: the `reason` label of `endpoint_dial_failure_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DialFailureReason {
    Timeout,
    Unknown,
}

/// Why we closed a tunnel whose destination did not keep up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueClose {
    /// Its queue passed 4x --endpoint-queue-limit-bytes.
    Overflow,
    /// A write made no progress for --endpoint-queue-stall-timeout.
    Stall,
    /// The agent-wide budget was exhausted and this destination was not reading.
    Budget,
}

impl QueueClose {
    pub fn label(self) -> &'static str {
        match self {
            QueueClose::Overflow => "overflow",
            QueueClose::Stall => "stall",
            QueueClose::Budget => "budget",
        }
    }
}

pub struct AgentMetrics {
    registry: Registry,
    dial_duration: HistogramVec,
    dial_failures: IntCounterVec,
    open_endpoints: IntGaugeVec,
    pub open_servers: IntGauge,
    pub known_server_count: IntGauge,
    connection_failures: IntCounterVec,
    packets: IntCounterVec,
    stream_errors: IntCounterVec,
    pub lease_lists: IntCounterVec,
    pub lease_list_latency: HistogramVec,
    queue_closes: IntCounterVec,
    pub queued_bytes: IntGauge,
    violations: IntCounterVec,
    violation_log: ViolationLog,
    destinations_refused: IntCounterVec,
    refusal_log: ViolationLog,
}

impl AgentMetrics {
    pub fn new() -> AgentMetrics {
        let r = Registry::new();
        let f = Families::new(&r, SUBSYSTEM);
        let counter = |name: &str, help: &str, labels: &[&str]| f.counter_vec(name, help, labels);
        let histogram = |name: &str, help: &str, labels: &[&str]| {
            f.histogram_vec(name, help, labels, Some(DIAL_BUCKETS))
        };
        let gauge = |name: &str, help: &str| f.gauge(name, help);
        let metrics = AgentMetrics {
            dial_duration: histogram(
                "dial_duration_seconds",
                "Latency of dial to the remote endpoint in seconds",
                &[],
            ),
            dial_failures: counter(
                "endpoint_dial_failure_total",
                "Number of failures dialing the remote endpoint, by reason (example: timeout).",
                &["reason"],
            ),
            open_endpoints: f.gauge_vec(
                "open_endpoint_connections",
                "Current number of open endpoint connections.",
                &[],
            ),
            open_servers: gauge(
                "open_server_connections",
                "Current number of open server connections.",
            ),
            known_server_count: gauge(
                "known_server_count",
                "Current number of servers agent is trying to connect to.",
            ),
            connection_failures: counter(
                "server_connection_failure_count",
                "Count of failures to send to or receive from the proxy server, labeled by the direction (from_server or to_server). DEPRECATED, please use stream_events_error_total",
                &["direction"],
            ),
            packets: counter(
                "stream_packets_total",
                "Count of packets processed, by segment and packet type (example: from_client, DIAL_REQ)",
                &["segment", "packet_type"],
            ),
            stream_errors: counter(
                "stream_errors_total",
                "Count of gRPC stream errors, by segment, grpc Code, packet type. (example: from_agent, Code.Unavailable, DIAL_RSP)",
                &["segment", "code", "packet_type"],
            ),
            lease_lists: counter(
                "lease_lists_total",
                "Count of server lease list calls made by the agent to the k8s apiserver, labeled by HTTP response code and reason",
                &["http_response_code", "reason"],
            ),
            lease_list_latency: histogram(
                "lease_list_latency_seconds",
                "Latency of server lease listing in seconds",
                &["http_response_code"],
            ),
            queue_closes: counter(
                "endpoint_queue_closes_total",
                "Tunnels closed because their destination did not keep up with the data sent to it, by reason (overflow, stall, budget).",
                &["reason"],
            ),
            queued_bytes: gauge(
                "endpoint_queued_bytes",
                "Bytes queued toward all destinations, waiting to be written.",
            ),
            violations: counter(
                "peer_violations_total",
                "Packets from a server that broke the protocol, by kind; their log lines are rate limited.",
                &["kind"],
            ),
            violation_log: ViolationLog::new(),
            destinations_refused: counter(
                "destinations_refused_total",
                "Dials refused by the destination policy, by the rule that refused them (a --deny-destinations rule as written, or allow-list when no --allow-destinations rule matched).",
                &["rule"],
            ),
            refusal_log: ViolationLog::new(),
            registry: r.clone(),
        };
        for collector in crate::metrics::process::collectors() {
            f.collector(collector);
        }
        // Upstream creates this gauge at the first connection; a scraper that reads it
        // before then (upstream's own test framework does) must find 0, not nothing.
        metrics.open_endpoints.with_label_values(NO_LABELS).set(0);
        metrics
    }

    /// Counts a dial the destination policy refused. Returns `Some(n)` when it may be
    /// logged, `n` being the refusals left unlogged since the last line.
    pub fn destination_refused(&self, rule: &str) -> Option<u64> {
        self.destinations_refused.with_label_values(&[rule]).inc();
        self.refusal_log.allow()
    }

    pub fn destinations_refused(&self, rule: &str) -> u64 {
        self.destinations_refused.with_label_values(&[rule]).get()
    }

    pub fn dial_succeeded(&self, seconds: f64) {
        self.dial_duration
            .with_label_values(NO_LABELS)
            .observe(seconds);
    }

    pub fn dial_failed(&self, reason: DialFailureReason) {
        let label = match reason {
            DialFailureReason::Timeout => "timeout",
            DialFailureReason::Unknown => "unknown",
        };
        self.dial_failures.with_label_values(&[label]).inc();
    }

    pub fn dial_failures(&self, reason: &str) -> u64 {
        self.dial_failures.with_label_values(&[reason]).get()
    }

    pub fn endpoint_opened(&self) {
        self.open_endpoints.with_label_values(NO_LABELS).inc();
    }

    pub fn endpoint_closed(&self) {
        self.open_endpoints.with_label_values(NO_LABELS).dec();
    }

    pub fn open_endpoints(&self) -> i64 {
        self.open_endpoints.with_label_values(NO_LABELS).get()
    }

    /// A packet sent to a server (`from_agent`) or received from one (`to_agent`).
    pub fn packet(&self, segment: &'static str, kind: i32) {
        self.packets
            .with_label_values(&[segment, crate::wire::packet_type_name(kind)])
            .inc();
    }

    /// A stream that failed to send (`from_agent`, with the packet's type) or to receive.
    pub fn stream_error(&self, segment: &'static str, status: &tonic::Status, kind: &str) {
        use crate::metrics::grpc_status::{go_code_name, stream_error_code};
        let code = go_code_name(stream_error_code(status));
        self.stream_errors
            .with_label_values(&[segment, code, kind])
            .inc();
        let direction = if segment == "from_agent" {
            "to_server"
        } else {
            "from_server"
        };
        self.connection_failures
            .with_label_values(&[direction])
            .inc();
    }

    pub fn queue_closed(&self, why: QueueClose) {
        self.queue_closes.with_label_values(&[why.label()]).inc();
    }

    pub fn queue_closes(&self, why: QueueClose) -> u64 {
        self.queue_closes.with_label_values(&[why.label()]).get()
    }

    /// Counts a protocol violation by a server. Returns `Some(n)` when it may be logged, `n`
    /// being how many earlier ones were not.
    pub fn peer_violation(&self, kind: &'static str) -> Option<u64> {
        self.violations.with_label_values(&[kind]).inc();
        self.violation_log.allow()
    }

    pub fn peer_violations(&self, kind: &str) -> u64 {
        self.violations.with_label_values(&[kind]).get()
    }

    /// The classic Prometheus text exposition, numbers spelled as Go's expfmt spells them.
    pub fn render(&self) -> String {
        crate::metrics::exposition::render(&self.registry)
    }
}

impl Default for AgentMetrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_families_and_lazy_children() {
        let m = AgentMetrics::new();
        let text = m.render();
        assert!(text.contains("# HELP konnectivity_network_proxy_agent_open_server_connections Current number of open server connections.\n# TYPE konnectivity_network_proxy_agent_open_server_connections gauge\nkonnectivity_network_proxy_agent_open_server_connections 0\n"), "{text}");
        assert!(text.contains("konnectivity_network_proxy_agent_open_endpoint_connections 0\n"));
        assert!(text.contains("konnectivity_network_proxy_agent_known_server_count 0\n"));
        // No reason child before the first failure: upstream's tests compare exact samples.
        assert!(!text.contains("endpoint_dial_failure_total{"), "{text}");
        assert!(!text.contains("dial_duration_seconds_bucket"), "{text}");
        m.dial_failed(DialFailureReason::Unknown);
        m.dial_succeeded(0.01);
        let text = m.render();
        assert!(text.contains(
            "konnectivity_network_proxy_agent_endpoint_dial_failure_total{reason=\"unknown\"} 1\n"
        ));
        assert!(!text.contains("reason=\"timeout\""));
        assert!(text.contains(
            "konnectivity_network_proxy_agent_dial_duration_seconds_bucket{le=\"0.025\"} 1\n"
        ));
    }
}
