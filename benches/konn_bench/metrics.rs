//! What each workload reports: metric keys, labels, direction and targets.

pub struct MetricDef {
    pub workload: &'static str,
    pub key: &'static str,
    pub label: &'static str,
    pub higher_better: bool,
    /// Target ratio ours/Go (<= for lower-is-better, >= for higher-is-better) and its kind.
    pub target: Option<(f64, &'static str)>,
}

pub const fn m(
    workload: &'static str,
    key: &'static str,
    label: &'static str,
    higher_better: bool,
    target: Option<(f64, &'static str)>,
) -> MetricDef {
    MetricDef {
        workload,
        key,
        label,
        higher_better,
        target,
    }
}

pub const DEFS: &[MetricDef] = &[
    m(
        "bulk",
        "mbps",
        "end-to-end MB/s (down+up)",
        true,
        Some((1.2, "aim")),
    ),
    m("bulk", "down_mbps", "download MB/s", true, None),
    m("bulk", "up_mbps", "upload MB/s", true, None),
    m(
        "bulk",
        "server_cpu_s_per_gib",
        "server CPU s per GiB",
        false,
        Some((0.5, "target")),
    ),
    m(
        "bulk",
        "peak_rss_mib",
        "server peak RSS MiB (VmHWM)",
        false,
        None,
    ),
    m(
        "bulk",
        "client_cpu_s_per_gib",
        "CPU split: client s/GiB",
        false,
        None,
    ),
    m(
        "bulk",
        "agent_cpu_s_per_gib",
        "CPU split: agent s/GiB",
        false,
        None,
    ),
    m(
        "bulk",
        "sink_cpu_s_per_gib",
        "CPU split: far end s/GiB",
        false,
        None,
    ),
    m(
        "short-single",
        "tunnels_per_s",
        "tunnels/s",
        true,
        Some((1.6, "target")),
    ),
    m(
        "short-single",
        "dial_p50_ms",
        "dial latency p50 ms",
        false,
        None,
    ),
    m(
        "short-single",
        "dial_p99_ms",
        "dial latency p99 ms",
        false,
        Some((0.55, "target")),
    ),
    m(
        "short-single",
        "server_cpu_us_per_tunnel",
        "server CPU us per tunnel",
        false,
        Some((0.35, "target")),
    ),
    m(
        "short-single",
        "agent_cpu_us_per_tunnel",
        "agent CPU us per tunnel",
        false,
        None,
    ),
    m("short-single", "errors", "failed tunnels", false, None),
    m("short-reusable", "tunnels_per_s", "tunnels/s", true, None),
    m(
        "short-reusable",
        "dial_p50_ms",
        "dial latency p50 ms",
        false,
        None,
    ),
    m(
        "short-reusable",
        "dial_p99_ms",
        "dial latency p99 ms",
        false,
        None,
    ),
    m(
        "short-reusable",
        "server_cpu_us_per_tunnel",
        "server CPU us per tunnel",
        false,
        Some((0.4, "target")),
    ),
    m("short-reusable", "errors", "failed tunnels", false, None),
    m("short-connect", "tunnels_per_s", "tunnels/s", true, None),
    m(
        "short-connect",
        "dial_p50_ms",
        "dial latency p50 ms",
        false,
        None,
    ),
    m(
        "short-connect",
        "dial_p99_ms",
        "dial latency p99 ms",
        false,
        None,
    ),
    m(
        "short-connect",
        "server_cpu_us_per_tunnel",
        "server CPU us per tunnel",
        false,
        Some((0.3, "target")),
    ),
    m("short-connect", "errors", "failed tunnels", false, None),
    m(
        "idle",
        "rss_kib_per_tunnel",
        "server RSS KiB per tunnel",
        false,
        Some((0.25, "target")),
    ),
    m(
        "idle",
        "rss_mib_total",
        "server RSS MiB with all open",
        false,
        None,
    ),
    m(
        "idle",
        "idle_cpu_ms_per_s",
        "server CPU while idle, ms/s",
        false,
        None,
    ),
    m(
        "idle",
        "open_per_s",
        "tunnels opened per s (64 at a time)",
        true,
        None,
    ),
    m(
        "connect-idle",
        "rss_kib_per_tunnel",
        "server RSS KiB per tunnel",
        false,
        Some((0.25, "target")),
    ),
    m(
        "connect-idle",
        "rss_mib_total",
        "server RSS MiB with all open",
        false,
        None,
    ),
    m(
        "connect-idle",
        "idle_cpu_ms_per_s",
        "server CPU while idle, ms/s",
        false,
        None,
    ),
    m(
        "connect-idle",
        "open_per_s",
        "tunnels opened per s (64 at a time)",
        true,
        None,
    ),
    m(
        "agents",
        "rss_kib_per_agent",
        "server RSS KiB per agent",
        false,
        Some((0.25, "target")),
    ),
    m(
        "agents",
        "rss_mib_total",
        "server RSS MiB with all connected",
        false,
        None,
    ),
    m(
        "agents",
        "idle_cpu_us_per_s_per_agent",
        "server CPU while idle, us/s per agent",
        false,
        None,
    ),
    m(
        "agents",
        "connect_per_s",
        "agents connected per s (32 at a time)",
        true,
        None,
    ),
    m("hol", "share_pct", "active throughput share %", true, None),
    m(
        "hol",
        "active_mbps_alone",
        "10 active, MB/s, no stalled tunnel",
        true,
        None,
    ),
    m(
        "hol",
        "active_mbps_with_stalled",
        "10 active, MB/s, with a stalled tunnel",
        true,
        None,
    ),
    m(
        "hol",
        "blocked_with_stalled",
        "of the 10 active, blocked by the stalled tunnel",
        false,
        None,
    ),
];

pub fn defs_for(workload: &str) -> Vec<&'static MetricDef> {
    let base = if workload.starts_with("idle-") {
        "idle"
    } else if workload.starts_with("connect-idle-") {
        "connect-idle"
    } else if workload.starts_with("agents-") {
        "agents"
    } else {
        workload
    };
    DEFS.iter().filter(|d| d.workload == base).collect()
}

/// The agent comparison: our agent against upstream's behind the same server (both servers).
/// `idle` stands for `idle-N`, N = the smallest of `--idle-counts`.
pub const AGENT_DEFS: &[MetricDef] = &[
    m(
        "short-single",
        "agent_cpu_us_per_tunnel",
        "agent CPU us per single-use gRPC tunnel",
        false,
        Some((0.5, "target")),
    ),
    m(
        "short-connect",
        "agent_cpu_us_per_tunnel",
        "agent CPU us per HTTP-CONNECT tunnel",
        false,
        None,
    ),
    m(
        "bulk",
        "agent_cpu_s_per_gib",
        "agent CPU s per GiB of bulk",
        false,
        Some((0.5, "target")),
    ),
    m(
        "agent-idle-1",
        "agent_rss_mib",
        "agent RSS MiB idle, one server",
        false,
        Some((0.15, "target")),
    ),
    m(
        "agent-idle-3",
        "agent_rss_mib",
        "agent RSS MiB idle, three servers",
        false,
        None,
    ),
    m(
        "idle",
        "agent_rss_kib_per_tunnel",
        "agent RSS KiB per idle tunnel",
        false,
        Some((0.25, "target")),
    ),
    m(
        "agent-idle-1",
        "agent_idle_cpu_ms_per_s",
        "agent CPU while idle ms/s (10 ms ticks), one server",
        false,
        None,
    ),
    m(
        "agent-idle-3",
        "agent_idle_cpu_ms_per_s",
        "agent CPU while idle ms/s (10 ms ticks), three servers",
        false,
        None,
    ),
    m(
        "agent-idle-1",
        "agent_threads",
        "agent threads",
        false,
        None,
    ),
    m("bulk", "mbps", "end-to-end bulk MB/s (down+up)", true, None),
    m(
        "short-single",
        "tunnels_per_s",
        "single-use tunnels/s",
        true,
        None,
    ),
    m(
        "short-connect",
        "tunnels_per_s",
        "HTTP-CONNECT tunnels/s",
        true,
        None,
    ),
];

/// The whole path: all-Rust (our server, our agent) against all-Go.
pub const WHOLE_DEFS: &[MetricDef] = &[
    m(
        "bulk",
        "mbps",
        "bulk MB/s (down+up)",
        true,
        Some((2.0, "target")),
    ),
    m(
        "bulk",
        "path_cpu_s_per_gib",
        "bulk CPU s per GiB, server + agent",
        false,
        None,
    ),
    m(
        "short-single",
        "tunnels_per_s",
        "single-use gRPC tunnels/s",
        true,
        Some((1.5, "target")),
    ),
    m(
        "short-single",
        "dial_p99_ms",
        "single-use dial latency p99 ms",
        false,
        None,
    ),
    m(
        "short-single",
        "path_cpu_us_per_tunnel",
        "single-use CPU us per tunnel, server + agent",
        false,
        None,
    ),
    m(
        "short-connect",
        "tunnels_per_s",
        "HTTP-CONNECT tunnels/s",
        true,
        None,
    ),
    m(
        "short-connect",
        "dial_p99_ms",
        "HTTP-CONNECT dial latency p99 ms",
        false,
        None,
    ),
];
