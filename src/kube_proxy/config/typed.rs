//! The typed parts of [`ProxyConfig`], each parsed once from a configuration that validation
//! already accepted, and our own checks beyond upstream's (`--ipvs-scheduler`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;

use super::internal::Internal;
use super::validate::parse_cidr;
use super::{ProxyConfig, ValidationError};
use crate::config::pflag::{parse_ip_sloppy, split_host_port};
use crate::config::LogFormat;
use crate::kube_proxy::options::KubeProxyOptions;

/// The proxy mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyMode {
    Iptables,
    Ipvs,
    Nftables,
}

impl ProxyMode {
    /// The name upstream uses (`/proxyMode`, `mode`).
    pub fn name(self) -> &'static str {
        match self {
            ProxyMode::Iptables => "iptables",
            ProxyMode::Ipvs => "ipvs",
            ProxyMode::Nftables => "nftables",
        }
    }
}

/// How local traffic is detected (`--detect-local-mode` and its companions).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DetectLocal {
    /// Source in the cluster CIDRs (one per family); none: detection is a no-op.
    ClusterCidr(Vec<IpNet>),
    /// Source in the node's podCIDRs (read from the Node object).
    NodeCidr,
    /// Coming in on this bridge interface.
    BridgeInterface(String),
    /// Coming in on an interface whose name starts with this prefix.
    InterfaceNamePrefix(String),
}

/// One `--nodeport-addresses` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodePortAddress {
    /// The node's addresses in this range.
    Cidr(IpNet),
    /// The Node object's primary IPv4 and/or IPv6 address.
    Primary,
    /// 127.0.0.0/8 and ::1/128.
    Localhost,
    /// 0.0.0.0/0 and ::/0.
    All,
}

/// The ipvs schedulers we accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IpvsScheduler {
    RoundRobin,
    WeightedRoundRobin,
    SourceHashing,
    MaglevHashing,
}

impl IpvsScheduler {
    /// The kernel's name for it.
    pub fn name(self) -> &'static str {
        match self {
            IpvsScheduler::RoundRobin => "rr",
            IpvsScheduler::WeightedRoundRobin => "wrr",
            IpvsScheduler::SourceHashing => "sh",
            IpvsScheduler::MaglevHashing => "mh",
        }
    }
}

/// The ipvs section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpvsSettings {
    /// `--ipvs-scheduler` (rr when empty).
    pub scheduler: IpvsScheduler,
    /// `--ipvs-exclude-cidrs`: virtual servers in these ranges are left alone.
    pub exclude_cidrs: Vec<IpNet>,
    /// `--ipvs-strict-arp`: arp_ignore=1, arp_announce=2.
    pub strict_arp: bool,
    /// `--ipvs-tcp-timeout` (zero: leave as is).
    pub tcp_timeout: Duration,
    /// `--ipvs-tcpfin-timeout` (zero: leave as is).
    pub tcp_fin_timeout: Duration,
    /// `--ipvs-udp-timeout` (zero: leave as is).
    pub udp_timeout: Duration,
}

/// The conntrack sysctls (zero values leave the kernel's setting alone).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConntrackSettings {
    /// Entries per CPU for nf_conntrack_max (0: leave it and ignore `min`).
    pub max_per_core: u32,
    /// The floor for nf_conntrack_max.
    pub min: u32,
    /// nf_conntrack_tcp_timeout_established.
    pub tcp_established_timeout: Duration,
    /// nf_conntrack_tcp_timeout_close_wait.
    pub tcp_close_wait_timeout: Duration,
    /// nf_conntrack_tcp_be_liberal=1.
    pub tcp_be_liberal: bool,
    /// nf_conntrack_udp_timeout.
    pub udp_timeout: Duration,
    /// nf_conntrack_udp_timeout_stream.
    pub udp_stream_timeout: Duration,
}

/// The API server connection.
#[derive(Clone, Debug, PartialEq)]
pub struct ClientSettings {
    /// `--kubeconfig`; with neither it nor `master`, the in-cluster configuration.
    pub kubeconfig: Option<PathBuf>,
    /// `--master`: overrides the kubeconfig's server.
    pub master: Option<String>,
    /// `--kube-api-content-type`.
    pub content_type: String,
    /// `clientConnection.acceptContentTypes` (empty: the content type's default).
    pub accept_content_types: String,
    /// `--kube-api-qps`.
    pub qps: f32,
    /// `--kube-api-burst`.
    pub burst: u32,
}

/// upstream's log formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoggingFormat {
    Text,
    Json,
}

/// Logging: upstream's settings and where our log goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoggingSettings {
    /// `-v`.
    pub verbosity: u32,
    /// `--vmodule`, as `pattern=N,...`.
    pub vmodule: String,
    /// `--logging-format` (json is accepted; lines are written in klog's text format).
    pub format: LoggingFormat,
    /// `--log-flush-frequency`.
    pub flush_frequency: Duration,
    /// `--log-text-split-stream` / `--log-json-split-stream` (for the format in use).
    pub split_stream: bool,
    /// `--log-text-info-buffer-size` / `--log-json-info-buffer-size` in bytes.
    pub info_buffer_size: u64,
    /// Ours: auto (journald under systemd, else stderr), journald or stderr.
    pub sink: LogFormat,
    /// klog's `--logtostderr` (removed upstream): false writes to `log_file` or `log_dir`.
    pub logtostderr: bool,
    /// klog's `--alsologtostderr`.
    pub alsologtostderr: bool,
    /// klog's `--log-file`.
    pub log_file: String,
    /// klog's `--log-dir`.
    pub log_dir: String,
    /// klog's `--log-file-max-size` in megabytes (0: unlimited).
    pub log_file_max_size: u64,
}

fn socket_addr(text: &str) -> Option<SocketAddr> {
    let (host, port) = split_host_port(text).ok()?;
    Some(SocketAddr::new(parse_ip_sloppy(host)?, port.parse().ok()?))
}

fn unsigned(value: i32) -> u32 {
    u32::try_from(value).unwrap_or(0)
}

/// Types a configuration validation accepted.
pub fn build(c: &Internal, options: &KubeProxyOptions) -> Result<ProxyConfig, ValidationError> {
    let mode = match c.mode.as_str() {
        "ipvs" => ProxyMode::Ipvs,
        "nftables" => ProxyMode::Nftables,
        _ => ProxyMode::Iptables,
    };
    let scheduler = match c.ipvs_scheduler.as_str() {
        "" | "rr" => IpvsScheduler::RoundRobin,
        "wrr" => IpvsScheduler::WeightedRoundRobin,
        "sh" => IpvsScheduler::SourceHashing,
        "mh" => IpvsScheduler::MaglevHashing,
        other if mode == ProxyMode::Ipvs => {
            return Err(ValidationError::Unsupported(format!(
                "--ipvs-scheduler (ipvs.scheduler) {other:?} is not supported: use rr, wrr, sh or mh (empty means rr)"
            )))
        }
        _ => IpvsScheduler::RoundRobin,
    };
    let cidrs = |list: &[String]| {
        list.iter()
            .filter_map(|c| parse_cidr(c))
            .collect::<Vec<_>>()
    };
    let detect_local = match c.detect_local_mode.as_str() {
        "NodeCIDR" => DetectLocal::NodeCidr,
        "BridgeInterface" => DetectLocal::BridgeInterface(c.bridge_interface.clone()),
        "InterfaceNamePrefix" => DetectLocal::InterfaceNamePrefix(c.interface_name_prefix.clone()),
        _ => DetectLocal::ClusterCidr(cidrs(&c.cluster_cidrs)),
    };
    let mut node_port_addresses: Vec<NodePortAddress> = c
        .node_port_addresses
        .iter()
        .filter_map(|entry| match entry.as_str() {
            "primary" => Some(NodePortAddress::Primary),
            "localhost" => Some(NodePortAddress::Localhost),
            "all" => Some(NodePortAddress::All),
            cidr => parse_cidr(cidr).map(NodePortAddress::Cidr),
        })
        .collect();
    if node_port_addresses.is_empty() {
        node_port_addresses.push(NodePortAddress::All);
    }
    let json = c.logging_format == "json";
    let (split_stream, buffer) = if json {
        (c.json_split_stream, &c.json_info_buffer_size)
    } else {
        (c.text_split_stream, &c.text_info_buffer_size)
    };
    let non_empty = |s: &str| (!s.is_empty()).then(|| s.to_string());
    Ok(ProxyConfig {
        mode,
        mode_defaulted: c.mode_defaulted,
        node_name_override: non_empty(&c.hostname_override),
        bind_address: parse_ip_sloppy(&c.bind_address)
            .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED.into()),
        bind_address_hard_fail: c.bind_address_hard_fail,
        healthz_addr: socket_addr(&c.healthz_bind_address),
        metrics_addr: socket_addr(&c.metrics_bind_address),
        enable_profiling: c.enable_profiling,
        show_hidden_metrics_for_version: non_empty(&c.show_hidden_metrics_for_version),
        client: ClientSettings {
            kubeconfig: non_empty(&c.kubeconfig).map(PathBuf::from),
            master: non_empty(&options.master),
            content_type: c.content_type.clone(),
            accept_content_types: c.accept_content_types.clone(),
            qps: c.qps,
            burst: unsigned(c.burst),
        },
        config_sync_period: c.config_sync_period.to_std(),
        sync_period: c.sync_period.to_std(),
        min_sync_period: c.min_sync_period.to_std(),
        masquerade_all: c.masquerade_all,
        masquerade_bit: unsigned(if mode == ProxyMode::Nftables {
            c.nftables_masquerade_bit
        } else {
            c.iptables_masquerade_bit
        }),
        iptables_localhost_node_ports: c.iptables_localhost_node_ports,
        ipvs: IpvsSettings {
            scheduler,
            exclude_cidrs: cidrs(&c.ipvs_exclude_cidrs),
            strict_arp: c.ipvs_strict_arp,
            tcp_timeout: c.ipvs_tcp_timeout.to_std(),
            tcp_fin_timeout: c.ipvs_tcp_fin_timeout.to_std(),
            udp_timeout: c.ipvs_udp_timeout.to_std(),
        },
        detect_local,
        node_port_addresses,
        oom_score_adj: c.oom_score_adj,
        conntrack: ConntrackSettings {
            max_per_core: unsigned(c.conntrack_max_per_core),
            min: unsigned(c.conntrack_min),
            tcp_established_timeout: c.conntrack_tcp_established_timeout.to_std(),
            tcp_close_wait_timeout: c.conntrack_tcp_close_wait_timeout.to_std(),
            tcp_be_liberal: c.conntrack_tcp_be_liberal,
            udp_timeout: c.conntrack_udp_timeout.to_std(),
            udp_stream_timeout: c.conntrack_udp_stream_timeout.to_std(),
        },
        feature_gates: c.feature_gates.clone(),
        logging: LoggingSettings {
            verbosity: c.verbosity,
            vmodule: options.vmodule_text(),
            format: if json {
                LoggingFormat::Json
            } else {
                LoggingFormat::Text
            },
            flush_frequency: c.flush_frequency.to_std(),
            split_stream,
            info_buffer_size: u64::try_from(buffer.value()).unwrap_or(0),
            sink: options.log_format,
            logtostderr: options.logtostderr,
            alsologtostderr: options.alsologtostderr,
            log_file: options.log_file.clone(),
            log_dir: options.log_dir.clone(),
            log_file_max_size: options.log_file_max_size,
        },
        cleanup: options.cleanup,
        init_only: options.init_only,
        v1alpha1: c.to_v1alpha1(),
    })
}
