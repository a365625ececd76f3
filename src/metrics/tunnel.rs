//! The tunnels' families: packets and errors by hop, bytes relayed, established connections,
//! and packets that broke the protocol.

use std::sync::OnceLock;

use prometheus::{Histogram, IntCounter, IntCounterVec, IntGauge};

use super::family::Families;
use super::log_limit::ViolationLog;

/// DIAL_REQ..DRAIN, and one slot for anything else ("Unknown").
const PACKET_KINDS: usize = 8;

const CONNECTION_DURATION_BUCKETS: &[f64] = &[
    1.0, 5.0, 15.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 14400.0, 43200.0, 86400.0,
];

/// The side of a tunnel that sent something it should not have.
#[derive(Clone, Copy, Debug)]
pub enum Peer {
    Agent,
    Frontend,
}

impl Peer {
    fn label(self) -> &'static str {
        match self {
            Peer::Agent => "agent",
            Peer::Frontend => "frontend",
        }
    }
}

/// Which hop a packet crossed: the `segment` label.
#[derive(Clone, Copy, Debug)]
#[repr(usize)]
pub enum Segment {
    FromClient,
    ToClient,
    FromAgent,
    ToAgent,
}

impl Segment {
    fn label(self) -> &'static str {
        match self {
            Segment::FromClient => "from_client",
            Segment::ToClient => "to_client",
            Segment::FromAgent => "from_agent",
            Segment::ToAgent => "to_agent",
        }
    }
}

pub struct TunnelMetrics {
    pub connection_duration: Histogram,
    pub established_connections: IntGauge,
    stream_packets: IntCounterVec,
    stream_errors: IntCounterVec,
    /// Beyond upstream: payload bytes relayed, by direction.
    relayed_bytes: IntCounterVec,
    /// Beyond upstream: protocol violations by peers, whose log lines are rate limited.
    pub peer_violations: IntCounterVec,
    violation_log: ViolationLog,
    /// Series handles resolved once: the label lookup (a hash and a lock) is kept off the
    /// per-packet path. Created on first use, so series appear only once observed, as upstream.
    packet_series: [[OnceLock<IntCounter>; PACKET_KINDS]; 4],
    relayed_series: [OnceLock<IntCounter>; 2],
}

impl TunnelMetrics {
    pub(super) fn new(f: &Families<'_>) -> TunnelMetrics {
        TunnelMetrics {
            connection_duration: f.histogram(
                "connection_duration_seconds",
                "Duration in seconds a proxied end-to-end connection was established (post-dial) before being closed.",
                CONNECTION_DURATION_BUCKETS,
            ),
            established_connections: f.gauge(
                "established_connections",
                "Current number of established end-to-end connections (post-dial).",
            ),
            stream_packets: f.counter_vec(
                "stream_packets_total",
                "Count of packets processed, by segment and packet type (example: from_client, DIAL_REQ)",
                &["segment", "packet_type"],
            ),
            stream_errors: f.counter_vec(
                "stream_errors_total",
                "Count of gRPC stream errors, by segment, grpc Code, packet type. (example: from_agent, Code.Unavailable, DIAL_RSP)",
                &["segment", "code", "packet_type"],
            ),
            relayed_bytes: f.counter_vec(
                "relayed_bytes_total",
                "Payload bytes relayed between frontends and agents, by direction.",
                &["direction"],
            ),
            peer_violations: f.counter_vec(
                "peer_violations_total",
                "Packets that broke the protocol, by peer side and kind; their log lines are rate limited.",
                &["peer", "kind"],
            ),
            violation_log: ViolationLog::new(),
            packet_series: Default::default(),
            relayed_series: Default::default(),
        }
    }

    /// Counts one packet of wire type `kind` crossing `segment`.
    pub fn packet(&self, segment: Segment, kind: i32) {
        let slot = usize::try_from(kind)
            .ok()
            .filter(|k| *k < PACKET_KINDS - 1)
            .unwrap_or(PACKET_KINDS - 1);
        self.packet_series[segment as usize][slot]
            .get_or_init(|| {
                let name = crate::wire::packet_type_name(kind);
                self.stream_packets
                    .with_label_values(&[segment.label(), name])
            })
            .inc();
    }

    pub fn stream_error(&self, segment: Segment, code: tonic::Code, packet_type: &str) {
        self.stream_errors
            .with_label_values(&[
                segment.label(),
                super::grpc_status::go_code_name(code),
                packet_type,
            ])
            .inc();
    }

    pub fn relayed(&self, to_agent: bool, bytes: usize) {
        let direction = if to_agent { "to_agent" } else { "to_frontend" };
        self.relayed_series[usize::from(to_agent)]
            .get_or_init(|| self.relayed_bytes.with_label_values(&[direction]))
            .inc_by(bytes as u64);
    }

    /// Counts a protocol violation by a peer. Returns `Some(n)` when it may be logged, `n`
    /// being the violations left unlogged since the last line; `None` when it must not be.
    pub fn peer_violation(&self, peer: Peer, kind: &'static str) -> Option<u64> {
        self.peer_violations
            .with_label_values(&[peer.label(), kind])
            .inc();
        self.violation_log.allow()
    }

    /// How many peer violations were allowed a log line so far.
    pub fn peer_violation_lines(&self) -> u64 {
        self.violation_log.lines()
    }
}
