//! The dials' families: how long they took, why they failed, and those waiting for an agent.

use prometheus::{Histogram, IntCounterVec, IntGauge};

use super::family::Families;
use super::LATENCY_BUCKETS;

/// Why a dial failed: the `reason` label of `dial_failure_count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DialFailure {
    NoAgent,
    ErrorResponse,
    UnrecognizedResponse,
    SendRsp,
    BackendClose,
    BackendDialTimeout,
    FrontendClose,
}

impl DialFailure {
    fn label(self) -> &'static str {
        match self {
            DialFailure::NoAgent => "no_agent",
            DialFailure::ErrorResponse => "error_response",
            DialFailure::UnrecognizedResponse => "unrecognized_response",
            DialFailure::SendRsp => "send_rsp",
            DialFailure::BackendClose => "backend_close",
            DialFailure::BackendDialTimeout => "backend_dial_timeout",
            DialFailure::FrontendClose => "frontend_close",
        }
    }
}

pub struct DialMetrics {
    pub dial_duration: Histogram,
    pub pending_backend_dials: IntGauge,
    dial_failure_count: IntCounterVec,
    /// Beyond upstream: dials that waited for an agent during --startup-dial-grace, by result.
    startup_waits: IntCounterVec,
    /// Beyond upstream: dials waiting for an agent right now (--startup-dial-grace).
    pub dials_waiting_for_agent: IntGauge,
    /// Beyond upstream: dials sent once more because their agent stopped answering, by result.
    dial_retries: IntCounterVec,
    /// Beyond upstream: dials refused by the destination policy, by the rule that refused.
    destinations_refused: IntCounterVec,
    /// The log allowance for refused dials: a frontend can send thousands a second.
    refusal_log: super::log_limit::ViolationLog,
}

impl DialMetrics {
    pub(super) fn new(f: &Families<'_>) -> DialMetrics {
        DialMetrics {
            dial_duration: f.histogram(
                "dial_duration_seconds",
                "Latency of dial to the remote endpoint in seconds",
                LATENCY_BUCKETS,
            ),
            pending_backend_dials: f.gauge(
                "pending_backend_dials",
                "Current number of pending backend dial requests",
            ),
            dial_failure_count: f.counter_vec(
                "dial_failure_count",
                "Number of dial failures observed. Multiple failures can occur for a single dial request.",
                &["reason"],
            ),
            startup_waits: f.counter_vec(
                "dial_startup_waits_total",
                "Dials that found no agent during --startup-dial-grace and waited for one, by result (agent: one connected in time; no_agent: none did).",
                &["result"],
            ),
            dials_waiting_for_agent: f.gauge(
                "dials_waiting_for_agent",
                "Dials that found no agent during --startup-dial-grace and are waiting for one now.",
            ),
            dial_retries: f.counter_vec(
                "dial_retries_total",
                "Dials whose agent stopped answering before it answered them, sent once more to another agent, by result (sent; no_other_agent: none could take it, the dial kept waiting; failed: the second send failed).",
                &["result"],
            ),
            destinations_refused: f.counter_vec(
                "destinations_refused_total",
                "Dials refused by the destination policy, by the rule that refused them (a --deny-destinations rule as written, or allow-list when no --allow-destinations rule matched).",
                &["rule"],
            ),
            refusal_log: super::log_limit::ViolationLog::new(),
        }
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

    pub fn dial_failure(&self, reason: DialFailure) {
        self.dial_failure_count
            .with_label_values(&[reason.label()])
            .inc();
    }

    pub fn dial_failures(&self, reason: DialFailure) -> u64 {
        self.dial_failure_count
            .with_label_values(&[reason.label()])
            .get()
    }

    /// Counts a dial that waited for an agent during the start-up grace.
    pub fn startup_wait(&self, found: bool) {
        let result = if found { "agent" } else { "no_agent" };
        self.startup_waits.with_label_values(&[result]).inc();
    }

    /// Dials that waited during the start-up grace with this result (`agent`, `no_agent`).
    pub fn startup_waits(&self, result: &str) -> u64 {
        self.startup_waits.with_label_values(&[result]).get()
    }

    /// Counts a dial's second try (`sent`, `no_other_agent`, `failed`).
    pub fn dial_retry(&self, result: &'static str) {
        self.dial_retries.with_label_values(&[result]).inc();
    }

    pub fn dial_retries(&self, result: &str) -> u64 {
        self.dial_retries.with_label_values(&[result]).get()
    }
}
