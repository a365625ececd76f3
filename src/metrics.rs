//! The server's Prometheus metrics, with upstream's names, labels, buckets and HELP text, so
//! existing dashboards and alerts keep working. Registered in a registry of our own (not the
//! process-global one) so tests can run many servers in one process.

use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

const NAMESPACE: &str = "konnectivity_network_proxy";
const SUBSYSTEM: &str = "server";
const LATENCY_BUCKETS: &[f64] = &[1e-6, 1e-5, 1e-4, 0.005, 0.025, 0.1, 0.5, 2.5, 12.5];
/// DIAL_REQ..DRAIN, and one slot for anything else ("Unknown").
const PACKET_KINDS: usize = 8;

const CONNECTION_DURATION_BUCKETS: &[f64] = &[
    1.0, 5.0, 15.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 14400.0, 43200.0, 86400.0,
];

/// Log lines about peers that break the protocol, server-wide: one a second, bursts of ten.
/// A peer can send a hundred thousand bad packets a second; the journal must not take each.
pub(crate) fn violation_log_quota() -> governor::Quota {
    const BURST: std::num::NonZeroU32 = match std::num::NonZeroU32::new(10) {
        Some(n) => n,
        None => panic!("a positive burst"),
    };
    governor::Quota::per_second(std::num::NonZeroU32::MIN).allow_burst(BURST)
}

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

pub struct Metrics {
    registry: Registry,
    pub dial_duration: Histogram,
    pub frontend_write_duration: Histogram,
    pub connection_duration: Histogram,
    pub grpc_connections: IntGaugeVec,
    pub http_connections: IntGauge,
    pub ready_backend_connections: IntGauge,
    pub ready_backends: IntGaugeVec,
    pub pending_backend_dials: IntGauge,
    pub established_connections: IntGauge,
    pub full_receive_channels: IntGaugeVec,
    pub full_frontend_write_queues: IntGauge,
    pub blocked_frontend_write_channels: IntGauge,
    dial_failure_count: IntCounterVec,
    stream_packets: IntCounterVec,
    stream_errors: IntCounterVec,
    /// Beyond upstream: tunnels closed because their frontend could not keep up.
    pub frontend_queue_overflows: prometheus::IntCounter,
    /// Beyond upstream: DATA bytes queued toward all frontends (the budget's use).
    pub frontend_queued_bytes: IntGauge,
    /// Beyond upstream: tunnels closed to keep the server within its queue budget.
    pub frontend_queue_budget_closes: prometheus::IntCounter,
    /// Beyond upstream: dials that waited for an agent during --startup-dial-grace, by result.
    startup_waits: IntCounterVec,
    /// Beyond upstream: dials waiting for an agent right now (--startup-dial-grace).
    pub dials_waiting_for_agent: IntGauge,
    /// Beyond upstream: agent streams whose PING is unanswered past --agent-suspect-timeout.
    pub suspect_agents: IntGauge,
    /// Beyond upstream: agent streams retired for a PING unanswered past --agent-retire-timeout.
    pub unanswered_agent_retirements: prometheus::IntCounter,
    /// Beyond upstream: dials sent once more because their agent stopped answering, by result.
    dial_retries: IntCounterVec,
    /// Beyond upstream: protocol violations by peers, whose log lines are rate limited.
    pub peer_violations: IntCounterVec,
    /// Beyond upstream: the allocator's view of memory, read at each scrape.
    allocator_bytes: [IntGauge; 3],
    /// Server-wide allowance for log lines about peer violations, and how many it withheld.
    violation_log: governor::DefaultDirectRateLimiter,
    violations_unlogged: std::sync::atomic::AtomicU64,
    violations_logged: std::sync::atomic::AtomicU64,
    /// Beyond upstream: payload bytes relayed, by direction.
    relayed_bytes: IntCounterVec,
    /// Series handles resolved once: the label lookup (a hash and a lock) is kept off the
    /// per-packet path. Created on first use, so series appear only once observed, as upstream.
    packet_series: [[std::sync::OnceLock<prometheus::IntCounter>; PACKET_KINDS]; 4],
    relayed_series: [std::sync::OnceLock<prometheus::IntCounter>; 2],
    pub culled_leases_count: prometheus::IntCounter,
    lease_delete_latency: prometheus::HistogramVec,
    lease_delete_total: IntCounterVec,
    lease_list_latency: prometheus::HistogramVec,
    lease_list_total: IntCounterVec,
    /// Beyond upstream: TokenReviews by result, and reviews answered from the cache.
    token_reviews: IntCounterVec,
    token_review_cache_hits: prometheus::IntCounter,
    /// Beyond upstream: reloads by result (success, failure).
    reloads: IntCounterVec,
    /// Beyond upstream: when the last successful reload happened.
    pub last_reload_success: Gauge,
    /// Beyond upstream: always 1, labelled with our version, so dashboards can tell builds apart.
    pub build_info: Gauge,
}

fn opts(name: &str, help: &str) -> Opts {
    Opts::new(name, help)
        .namespace(NAMESPACE)
        .subsystem(SUBSYSTEM)
}

fn histogram(name: &str, help: &str, buckets: &[f64]) -> Histogram {
    Histogram::with_opts(
        HistogramOpts::new(name, help)
            .namespace(NAMESPACE)
            .subsystem(SUBSYSTEM)
            .buckets(buckets.to_vec()),
    )
    .expect("valid histogram")
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let m = Metrics {
            dial_duration: histogram(
                "dial_duration_seconds",
                "Latency of dial to the remote endpoint in seconds",
                LATENCY_BUCKETS,
            ),
            frontend_write_duration: histogram(
                "frontend_write_duration_seconds",
                "Latency of write to the frontend in seconds",
                LATENCY_BUCKETS,
            ),
            connection_duration: histogram(
                "connection_duration_seconds",
                "Duration in seconds a proxied end-to-end connection was established (post-dial) before being closed.",
                CONNECTION_DURATION_BUCKETS,
            ),
            grpc_connections: IntGaugeVec::new(
                opts("grpc_connections", "Number of current grpc connections, partitioned by service method."),
                &["service_method"],
            ).expect("a valid metric definition"),
            http_connections: IntGauge::with_opts(opts(
                "http_connections",
                "Number of current HTTP CONNECT connections",
            )).expect("a valid metric definition"),
            ready_backend_connections: IntGauge::with_opts(opts(
                "ready_backend_connections",
                "Number of konnectivity agent connected to the proxy server. DEPRECATED, please use ready_backends",
            )).expect("a valid metric definition"),
            ready_backends: IntGaugeVec::new(
                opts("ready_backends", "Number of konnectivity agent connected to the proxy server"),
                &["proxy_strategy"],
            ).expect("a valid metric definition"),
            pending_backend_dials: IntGauge::with_opts(opts(
                "pending_backend_dials",
                "Current number of pending backend dial requests",
            )).expect("a valid metric definition"),
            established_connections: IntGauge::with_opts(opts(
                "established_connections",
                "Current number of established end-to-end connections (post-dial).",
            )).expect("a valid metric definition"),
            full_receive_channels: IntGaugeVec::new(
                opts("full_receive_channels", "Number of current connections blocked by a full receive channel, partitioned by service method."),
                &["service_method"],
            ).expect("a valid metric definition"),
            full_frontend_write_queues: IntGauge::with_opts(opts(
                "full_frontend_write_queues",
                "Number of per-connection HTTP CONNECT frontend write queues currently at capacity.",
            )).expect("a valid metric definition"),
            blocked_frontend_write_channels: IntGauge::with_opts(opts(
                "blocked_frontend_write_channels",
                "Number of backend receive loops currently blocked enqueueing to a full HTTP CONNECT frontend write channel.",
            )).expect("a valid metric definition"),
            dial_failure_count: IntCounterVec::new(
                opts("dial_failure_count", "Number of dial failures observed. Multiple failures can occur for a single dial request."),
                &["reason"],
            ).expect("a valid metric definition"),
            stream_packets: IntCounterVec::new(
                opts("stream_packets_total", "Count of packets processed, by segment and packet type (example: from_client, DIAL_REQ)"),
                &["segment", "packet_type"],
            ).expect("a valid metric definition"),
            stream_errors: IntCounterVec::new(
                opts("stream_errors_total", "Count of gRPC stream errors, by segment, grpc Code, packet type. (example: from_agent, Code.Unavailable, DIAL_RSP)"),
                &["segment", "code", "packet_type"],
            ).expect("a valid metric definition"),
            frontend_queue_overflows: prometheus::IntCounter::with_opts(opts(
                "frontend_queue_overflows_total",
                "Tunnels closed because their frontend did not drain its queue within the byte or time limit.",
            )).expect("a valid metric definition"),
            frontend_queued_bytes: IntGauge::with_opts(opts(
                "frontend_queued_bytes",
                "DATA bytes queued toward frontends, counted against --frontend-queue-budget-bytes.",
            )).expect("a valid metric definition"),
            frontend_queue_budget_closes: prometheus::IntCounter::with_opts(opts(
                "frontend_queue_budget_closes_total",
                "Tunnels whose frontend was not reading, closed because the server's frontend queue budget was exhausted.",
            )).expect("a valid metric definition"),
            peer_violations: IntCounterVec::new(
                opts("peer_violations_total", "Packets that broke the protocol, by peer side and kind; their log lines are rate limited."),
                &["peer", "kind"],
            ).expect("a valid metric definition"),
            allocator_bytes: [
                ("allocator_allocated_bytes", "Bytes the memory allocator has handed out."),
                ("allocator_active_bytes", "Bytes in the memory allocator's pages that hold allocations."),
                ("allocator_resident_bytes", "Bytes the memory allocator holds resident in memory."),
            ]
            .map(|(name, help)| IntGauge::with_opts(opts(name, help)).expect("a valid metric definition")),
            startup_waits: IntCounterVec::new(
                opts("dial_startup_waits_total", "Dials that found no agent during --startup-dial-grace and waited for one, by result (agent: one connected in time; no_agent: none did)."),
                &["result"],
            ).expect("a valid metric definition"),
            dials_waiting_for_agent: IntGauge::with_opts(opts(
                "dials_waiting_for_agent",
                "Dials that found no agent during --startup-dial-grace and are waiting for one now.",
            )).expect("a valid metric definition"),
            suspect_agents: IntGauge::with_opts(opts(
                "suspect_agents",
                "Agent streams whose PING is unanswered past --agent-suspect-timeout: they get no new dials while another agent can take them.",
            )).expect("a valid metric definition"),
            unanswered_agent_retirements: prometheus::IntCounter::with_opts(opts(
                "unanswered_agent_retirements_total",
                "Agent streams retired because their PING went unanswered for --agent-retire-timeout.",
            )).expect("a valid metric definition"),
            dial_retries: IntCounterVec::new(
                opts("dial_retries_total", "Dials whose agent stopped answering before it answered them, sent once more to another agent, by result (sent; no_other_agent: none could take it, the dial kept waiting; failed: the second send failed)."),
                &["result"],
            ).expect("a valid metric definition"),
            violation_log: governor::RateLimiter::direct(violation_log_quota()),
            violations_unlogged: std::sync::atomic::AtomicU64::new(0),
            violations_logged: std::sync::atomic::AtomicU64::new(0),
            relayed_bytes: IntCounterVec::new(
                opts("relayed_bytes_total", "Payload bytes relayed between frontends and agents, by direction."),
                &["direction"],
            ).expect("a valid metric definition"),
            culled_leases_count: prometheus::IntCounter::with_opts(opts(
                "culled_leases_count",
                "Count of expired leases that the lease garbage collection controller has culled.",
            )).expect("a valid metric definition"),
            lease_delete_latency: prometheus::HistogramVec::new(
                HistogramOpts::new("lease_delete_latency_seconds", "Latency of lease deletion calls by the garbage collection controller in seconds.")
                    .namespace(NAMESPACE).subsystem(SUBSYSTEM),
                &["http_status_code"],
            ).expect("a valid metric definition"),
            lease_delete_total: IntCounterVec::new(
                opts("lease_delete_total", "Count of lease delection calls by the garbage collection controller. Labeled by HTTP status code and reason."),
                &["http_status_code", "reason"],
            ).expect("a valid metric definition"),
            lease_list_latency: prometheus::HistogramVec::new(
                HistogramOpts::new("lease_list_latency_seconds", "Latency of lease list calls by the garbage collection controller in seconds.")
                    .namespace(NAMESPACE).subsystem(SUBSYSTEM),
                &["http_status_code"],
            ).expect("a valid metric definition"),
            lease_list_total: IntCounterVec::new(
                opts("lease_list_total", "Count of lease deletion calls by the garbage collection controller. Labeled by HTTP status code and reason."),
                &["http_status_code", "reason"],
            ).expect("a valid metric definition"),
            token_reviews: IntCounterVec::new(
                opts("token_reviews_total", "TokenReviews sent to the API server for agent authentication, by result (ok, error)."),
                &["result"],
            ).expect("a valid metric definition"),
            token_review_cache_hits: prometheus::IntCounter::with_opts(opts(
                "token_review_cache_hits_total",
                "Agent tokens accepted from the review cache without a TokenReview.",
            )).expect("a valid metric definition"),
            reloads: IntCounterVec::new(
                opts("reloads_total", "Configuration reloads, by result (success or failure)."),
                &["result"],
            ).expect("a valid metric definition"),
            last_reload_success: Gauge::with_opts(opts(
                "last_reload_success_timestamp_seconds",
                "Unix time of the last successful configuration reload.",
            )).expect("a valid metric definition"),
            packet_series: Default::default(),
            relayed_series: Default::default(),
            build_info: Gauge::with_opts(opts(
                "build_info",
                "Always 1; the version label names the running konnectivity-server build.",
            ).const_label("version", env!("CARGO_PKG_VERSION"))).expect("a valid metric definition"),
            registry,
        };
        m.register_all();
        m.ready_backend_connections.set(0);
        // Nothing here blocks on a receive channel (packets are dispatched as they are read), so
        // these stay 0; they are exposed so dashboards built on upstream find them.
        for method in ["Connect", "Proxy"] {
            m.full_receive_channels.with_label_values(&[method]).set(0);
        }
        m.build_info.set(1.0);
        m
    }

    fn register_all(&self) {
        let r = &self.registry;
        let collectors: Vec<Box<dyn prometheus::core::Collector>> = vec![
            Box::new(self.dial_duration.clone()),
            Box::new(self.frontend_write_duration.clone()),
            Box::new(self.connection_duration.clone()),
            Box::new(self.grpc_connections.clone()),
            Box::new(self.http_connections.clone()),
            Box::new(self.ready_backend_connections.clone()),
            Box::new(self.ready_backends.clone()),
            Box::new(self.pending_backend_dials.clone()),
            Box::new(self.established_connections.clone()),
            Box::new(self.full_receive_channels.clone()),
            Box::new(self.full_frontend_write_queues.clone()),
            Box::new(self.blocked_frontend_write_channels.clone()),
            Box::new(self.dial_failure_count.clone()),
            Box::new(self.stream_packets.clone()),
            Box::new(self.stream_errors.clone()),
            Box::new(self.frontend_queue_overflows.clone()),
            Box::new(self.relayed_bytes.clone()),
            Box::new(self.frontend_queued_bytes.clone()),
            Box::new(self.frontend_queue_budget_closes.clone()),
            Box::new(self.peer_violations.clone()),
            Box::new(self.startup_waits.clone()),
            Box::new(self.dials_waiting_for_agent.clone()),
            Box::new(self.suspect_agents.clone()),
            Box::new(self.unanswered_agent_retirements.clone()),
            Box::new(self.dial_retries.clone()),
            Box::new(self.allocator_bytes[0].clone()),
            Box::new(self.allocator_bytes[1].clone()),
            Box::new(self.allocator_bytes[2].clone()),
            Box::new(self.culled_leases_count.clone()),
            Box::new(self.lease_delete_latency.clone()),
            Box::new(self.lease_delete_total.clone()),
            Box::new(self.lease_list_latency.clone()),
            Box::new(self.lease_list_total.clone()),
            Box::new(self.token_reviews.clone()),
            Box::new(self.token_review_cache_hits.clone()),
            Box::new(self.reloads.clone()),
            Box::new(self.last_reload_success.clone()),
            Box::new(self.build_info.clone()),
        ];
        for c in collectors.into_iter().chain(process_collectors()) {
            r.register(c).expect("metric names are unique");
        }
    }

    /// How many peer violations were allowed a log line so far.
    pub fn peer_violation_lines(&self) -> u64 {
        self.violations_logged
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Counts a dial that waited for an agent during the start-up grace.
    pub fn startup_wait(&self, found: bool) {
        let result = if found { "agent" } else { "no_agent" };
        self.startup_waits.with_label_values(&[result]).inc();
    }

    /// Counts a dial's second try (`sent`, `no_other_agent`, `failed`).
    pub fn dial_retry(&self, result: &'static str) {
        self.dial_retries.with_label_values(&[result]).inc();
    }

    pub fn dial_retries(&self, result: &str) -> u64 {
        self.dial_retries.with_label_values(&[result]).get()
    }

    /// Dials that waited during the start-up grace with this result (`agent`, `no_agent`).
    pub fn startup_waits(&self, result: &str) -> u64 {
        self.startup_waits.with_label_values(&[result]).get()
    }

    /// Counts a protocol violation by a peer. Returns `Some(n)` when it may be logged, `n`
    /// being the violations left unlogged since the last line; `None` when it must not be.
    pub fn peer_violation(&self, peer: Peer, kind: &'static str) -> Option<u64> {
        use std::sync::atomic::Ordering;
        self.peer_violations
            .with_label_values(&[peer.label(), kind])
            .inc();
        if self.violation_log.check().is_ok() {
            self.violations_logged.fetch_add(1, Ordering::AcqRel);
            Some(self.violations_unlogged.swap(0, Ordering::AcqRel))
        } else {
            self.violations_unlogged.fetch_add(1, Ordering::AcqRel);
            None
        }
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
            .with_label_values(&[segment.label(), go_code_name(code), packet_type])
            .inc();
    }

    /// Records a lease API call (`list` or `delete`) of the garbage collector.
    pub fn lease_call(&self, call: &str, code: &str, reason: &str, took: std::time::Duration) {
        let (latency, total) = match call {
            "list" => (&self.lease_list_latency, &self.lease_list_total),
            _ => (&self.lease_delete_latency, &self.lease_delete_total),
        };
        latency
            .with_label_values(&[code])
            .observe(took.as_secs_f64());
        total.with_label_values(&[code, reason]).inc();
    }

    pub fn token_review(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.token_reviews.with_label_values(&[result]).inc();
    }

    pub fn token_review_cache_hit(&self) {
        self.token_review_cache_hits.inc();
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

    pub fn relayed(&self, to_agent: bool, bytes: usize) {
        let direction = if to_agent { "to_agent" } else { "to_frontend" };
        self.relayed_series[usize::from(to_agent)]
            .get_or_init(|| self.relayed_bytes.with_label_values(&[direction]))
            .inc_by(bytes as u64);
    }

    /// The classic Prometheus text exposition of every family.
    pub fn render(&self) -> String {
        if let Some(stats) = crate::allocator::stats() {
            let values = [stats.allocated, stats.active, stats.resident];
            for (gauge, value) in self.allocator_bytes.iter().zip(values) {
                gauge.set(value as i64);
            }
        }
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encoding cannot fail");
        go_spelling(&String::from_utf8(out).expect("text exposition is UTF-8"))
    }
}

/// A gRPC code as grpc-go's `codes.Code.String()` spells it (`Canceled`, `OK`), which is what
/// the `code` label holds upstream; tonic spells two of them differently.
pub fn go_code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "Canceled",
        Unknown => "Unknown",
        InvalidArgument => "InvalidArgument",
        DeadlineExceeded => "DeadlineExceeded",
        NotFound => "NotFound",
        AlreadyExists => "AlreadyExists",
        PermissionDenied => "PermissionDenied",
        ResourceExhausted => "ResourceExhausted",
        FailedPrecondition => "FailedPrecondition",
        Aborted => "Aborted",
        OutOfRange => "OutOfRange",
        Unimplemented => "Unimplemented",
        Internal => "Internal",
        Unavailable => "Unavailable",
        DataLoss => "DataLoss",
        Unauthenticated => "Unauthenticated",
    }
}

/// The gRPC code upstream counts for a stream that failed with `status`. A peer that goes
/// away (it cancelled the stream, or its connection ended) is `Canceled` in grpc-go, whose
/// stream context is cancelled then; tonic reports those as transport errors (Unknown).
pub fn stream_error_code(status: &tonic::Status) -> tonic::Code {
    let code = status.code();
    if code == tonic::Code::Unknown && peer_went_away(status) {
        return tonic::Code::Cancelled;
    }
    code
}

fn peer_went_away(status: &tonic::Status) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(error) = source {
        if let Some(h2) = error.downcast_ref::<h2::Error>() {
            // The connection broke or closed under the stream, or the peer reset it with CANCEL.
            return h2.is_io() || h2.is_go_away() || h2.reason() == Some(h2::Reason::CANCEL);
        }
        if error.is::<std::io::Error>() {
            return true;
        }
        source = error.source();
    }
    false
}

/// The `process_*` families Go's client_golang registers, for a registry of either program.
pub(crate) fn process_collectors() -> Vec<Box<dyn prometheus::core::Collector>> {
    vec![
        Box::new(prometheus::process_collector::ProcessCollector::for_self()),
        Box::new(ProcessExtras::new()),
    ]
}

/// The process families Go's client_golang collector has and the prometheus crate's lacks:
/// network bytes from `/proc/self/net/netstat` (`IpExt` InOctets/OutOctets, as procfs reads
/// them) and the address-space limit (RLIMIT_AS; unlimited is 2^64-1, as Go reports it).
struct ProcessExtras {
    receive: prometheus::core::Desc,
    transmit: prometheus::core::Desc,
    max_vsize: prometheus::core::Desc,
}

impl ProcessExtras {
    fn new() -> ProcessExtras {
        let desc = |name: &str, help: &str| {
            prometheus::core::Desc::new(name.into(), help.into(), vec![], Default::default())
                .expect("a valid metric definition")
        };
        ProcessExtras {
            receive: desc(
                "process_network_receive_bytes_total",
                "Number of bytes received by the process over the network.",
            ),
            transmit: desc(
                "process_network_transmit_bytes_total",
                "Number of bytes sent by the process over the network.",
            ),
            max_vsize: desc(
                "process_virtual_memory_max_bytes",
                "Maximum amount of virtual memory available in bytes.",
            ),
        }
    }
}

/// `IpExt` InOctets and OutOctets from a `/proc/<pid>/net/netstat` text.
pub fn ip_octets(netstat: &str) -> Option<(f64, f64)> {
    let mut lines = netstat.lines().filter(|l| l.starts_with("IpExt:"));
    let names = lines.next()?.split_whitespace();
    let values = lines.next()?.split_whitespace();
    let (mut rx, mut tx) = (0.0, 0.0);
    for (name, value) in names.zip(values) {
        match name {
            "InOctets" => rx = value.parse().ok()?,
            "OutOctets" => tx = value.parse().ok()?,
            _ => {}
        }
    }
    Some((rx, tx))
}

impl prometheus::core::Collector for ProcessExtras {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        vec![&self.max_vsize, &self.receive, &self.transmit]
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        use prometheus::proto::{Counter, Gauge as GaugeValue, Metric, MetricFamily, MetricType};
        let family = |desc: &prometheus::core::Desc, kind: MetricType, value: f64| {
            let mut metric = Metric::default();
            if kind == MetricType::COUNTER {
                let mut counter = Counter::default();
                counter.set_value(value);
                metric.set_counter(counter);
            } else {
                let mut gauge = GaugeValue::default();
                gauge.set_value(value);
                metric.set_gauge(gauge);
            }
            let mut family = MetricFamily::default();
            family.set_name(desc.fq_name.clone());
            family.set_help(desc.help.clone());
            family.set_field_type(kind);
            family.set_metric(vec![metric]);
            family
        };
        let mut families = Vec::new();
        if let Ok((soft, _)) = rlimit::getrlimit(rlimit::Resource::AS) {
            families.push(family(&self.max_vsize, MetricType::GAUGE, soft as f64));
        }
        if let Some((rx, tx)) = std::fs::read_to_string("/proc/self/net/netstat")
            .ok()
            .as_deref()
            .and_then(ip_octets)
        {
            families.push(family(&self.receive, MetricType::COUNTER, rx));
            families.push(family(&self.transmit, MetricType::COUNTER, tx));
        }
        families
    }
}

/// The text exposition with numbers spelled as Go's expfmt spells them (`strconv` `'g'`):
/// `le="1e-06"` rather than `le="0.000001"`, and sample values likewise.
pub fn go_spelling(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / 8);
    for line in text.lines() {
        if line.starts_with('#') {
            out.push_str(line);
            out.push('\n');
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or((line, ""));
        let series = match series.find("le=\"") {
            Some(at) => {
                let start = at + 4;
                match series[start..].find('"') {
                    Some(len) => match series[start..start + len].parse::<f64>() {
                        Ok(le) => format!(
                            "{}{}{}",
                            &series[..start],
                            crate::gofmt::go_float(le),
                            &series[start + len..]
                        ),
                        Err(_) => series.to_string(),
                    },
                    None => series.to_string(),
                }
            }
            None => series.to_string(),
        };
        out.push_str(&series);
        if !value.is_empty() {
            out.push(' ');
            match value.parse::<f64>() {
                Ok(v) => out.push_str(&crate::gofmt::go_float(v)),
                Err(_) => out.push_str(value),
            }
        }
        out.push('\n');
    }
    out
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
        m.dial_duration.observe(0.003);
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
    fn go_spelling_rewrites_numbers_only() {
        let text = "# HELP x Some help 0.000001.\n# TYPE x counter\nx{a=\"le=\"} 23509451318\ny_bucket{le=\"0.000001\"} 3\nz NaN\n";
        assert_eq!(
            go_spelling(text),
            "# HELP x Some help 0.000001.\n# TYPE x counter\nx{a=\"le=\"} 2.3509451318e+10\ny_bucket{le=\"1e-06\"} 3\nz NaN\n"
        );
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
        let netstat =
            "TcpExt: A B\nTcpExt: 1 2\nIpExt: InNoRoutes InOctets OutOctets\nIpExt: 0 1234 5678\n";
        assert_eq!(ip_octets(netstat), Some((1234.0, 5678.0)));
    }

    #[test]
    fn a_peer_that_cancels_is_canceled() {
        assert_eq!(
            stream_error_code(&tonic::Status::cancelled("x")),
            tonic::Code::Cancelled
        );
        assert_eq!(
            stream_error_code(&tonic::Status::internal("x")),
            tonic::Code::Internal
        );
        assert_eq!(go_code_name(tonic::Code::Cancelled), "Canceled");
        assert_eq!(go_code_name(tonic::Code::Ok), "OK");
    }
}
