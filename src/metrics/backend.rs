//! The agent sessions' families: how many are connected, and those that stopped answering.

use prometheus::{IntCounter, IntGauge, IntGaugeVec};

use super::family::Families;

pub struct BackendMetrics {
    pub ready_backend_connections: IntGauge,
    pub ready_backends: IntGaugeVec,
    /// Beyond upstream: agent streams whose PING is unanswered past --agent-suspect-timeout.
    pub suspect_agents: IntGauge,
    /// Beyond upstream: agent streams retired for a PING unanswered past --agent-retire-timeout.
    pub unanswered_agent_retirements: IntCounter,
}

impl BackendMetrics {
    pub(super) fn new(f: &Families<'_>) -> BackendMetrics {
        let metrics = BackendMetrics {
            ready_backend_connections: f.gauge(
                "ready_backend_connections",
                "Number of konnectivity agent connected to the proxy server. DEPRECATED, please use ready_backends",
            ),
            ready_backends: f.gauge_vec(
                "ready_backends",
                "Number of konnectivity agent connected to the proxy server",
                &["proxy_strategy"],
            ),
            suspect_agents: f.gauge(
                "suspect_agents",
                "Agent streams whose PING is unanswered past --agent-suspect-timeout: they get no new dials while another agent can take them.",
            ),
            unanswered_agent_retirements: f.counter(
                "unanswered_agent_retirements_total",
                "Agent streams retired because their PING went unanswered for --agent-retire-timeout.",
            ),
        };
        metrics.ready_backend_connections.set(0);
        metrics
    }
}
