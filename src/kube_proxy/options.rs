//! kube-proxy's command line: every flag of upstream kube-proxy v1.37.2 with its name, type,
//! default and help text, parsed as pflag parses them; the flags upstream removed that unit
//! files still carry (klog's, `--cleanup-ipvs`, `--proxy-port-range`, `--udp-timeout`), and
//! ours (`--check-config`, `--log-format`). The same layers as the other programs
//! (`config::layers`): defaults < TOML file or KubeProxyConfiguration < environment
//! (`KUBE_PROXY_<KEY>`) < flags. A few keys exist only in files (`nftables_masquerade_bit`,
//! `accept_content_types`): upstream has no flag for them.

use std::path::{Path, PathBuf};

use clap::{ArgAction, Parser};
use serde::{Deserialize, Serialize};

use super::config::{feature_gates, file};
use crate::config::goflag::{any_path, comma_list, go_bool, go_float32, go_uint};
use crate::config::pflag::{
    bool_maps, go_int32, go_verbosity, go_vmodule, ip_flag, ipport_flag, BoolMap,
};
use crate::config::{ConfigError, FileLayer, GoDuration, LogFormat, Quantity};

/// The Kubernetes network proxy runs on each node. This
/// reflects services as defined in the Kubernetes API on each node and can do simple
/// TCP, UDP, and SCTP stream forwarding or round robin TCP, UDP, and SCTP forwarding across a set of backends.
/// Service cluster IPs and ports are currently found through Docker-links-compatible
/// environment variables specifying ports opened by the service proxy. There is an optional
/// addon that provides cluster DNS for these cluster IPs. The user must create a service
/// with the apiserver API to configure the proxy.
#[derive(Parser, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[command(
    name = "kube-proxy",
    args_override_self = true,
    disable_version_flag = true,
    verbatim_doc_comment
)]
pub struct KubeProxyOptions {
    // --- about this invocation ---
    /// --version, --version=raw prints version information and quits; --version=vX.Y.Z... sets the reported version
    #[arg(verbatim_doc_comment, long, value_name = "version[=true]", num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = version_flag, action = ArgAction::Set)]
    #[serde(skip)]
    pub version: String,
    /// The path to the configuration file.
    #[arg(verbatim_doc_comment, long, value_name = "string", value_parser = any_path)]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// If set, write the default configuration values to this file and exit.
    #[arg(verbatim_doc_comment, long, value_name = "string", default_value = "")]
    #[serde(skip)]
    pub write_config_to: String,
    /// If true cleanup iptables and ipvs rules and exit.
    #[arg(verbatim_doc_comment, long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    #[serde(skip)]
    pub cleanup: bool,
    /// If true, perform any initialization steps that must be done with full root privileges, and then exit. After doing this, you can run kube-proxy again with only the CAP_NET_ADMIN capability.
    #[arg(verbatim_doc_comment, long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    #[serde(skip)]
    pub init_only: bool,
    /// Beyond upstream: validate the configuration, print one line, and exit 0 or 1.
    #[arg(verbatim_doc_comment, long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    #[serde(skip)]
    pub check_config: bool,
    /// The flags the command line gave, by name (for the warnings about removed flags and
    /// about flags upstream ignores with `--config`).
    #[arg(skip)]
    #[serde(skip)]
    pub given_flags: Vec<String>,
    /// Whether `--config` named a KubeProxyConfiguration (rather than our TOML).
    #[arg(skip)]
    #[serde(skip)]
    pub kube_config_file: bool,
    /// Problems found while loading that do not stop the start.
    #[arg(skip)]
    #[serde(skip)]
    pub load_warnings: Vec<String>,
    /// Arguments that are not flags: upstream refuses them.
    #[arg(value_name = "ARGS", hide = true)]
    #[serde(skip)]
    pub args: Vec<String>,

    // --- the API server ---
    /// A set of key=value pairs that describe feature gates for alpha/experimental features.
    #[arg(verbatim_doc_comment, long, value_name = "mapStringBool", help = feature_gates::flag_help(), value_parser = BoolMap::parse, action = ArgAction::Append)]
    #[serde(with = "bool_maps")]
    pub feature_gates: Vec<BoolMap>,
    /// Path to kubeconfig file with authorization information (the master location can be overridden by the master flag).
    #[arg(verbatim_doc_comment, long, value_name = "string", default_value = "")]
    pub kubeconfig: String,
    /// The address of the Kubernetes API server (overrides any value in kubeconfig)
    #[arg(verbatim_doc_comment, long, value_name = "string", default_value = "")]
    pub master: String,
    /// Content type of requests sent to apiserver.
    #[arg(
        verbatim_doc_comment,
        long,
        value_name = "string",
        default_value = "application/vnd.kubernetes.protobuf"
    )]
    pub kube_api_content_type: String,
    /// File only (clientConnection.acceptContentTypes): the Accept header of requests to the
    /// apiserver; empty means the content type's default.
    #[arg(skip)]
    pub accept_content_types: String,
    /// Burst to use while talking with kubernetes apiserver
    #[arg(verbatim_doc_comment, long, value_name = "int32", default_value_t = 10, allow_negative_numbers = true, value_parser = go_int32)]
    pub kube_api_burst: i32,
    /// QPS to use while talking with kubernetes apiserver
    #[arg(verbatim_doc_comment, long, value_name = "float32", default_value = "5", allow_negative_numbers = true, value_parser = go_float32)]
    pub kube_api_qps: f32,
    /// How often configuration from the apiserver is refreshed.  Must be greater than 0.
    #[arg(
        verbatim_doc_comment,
        long,
        value_name = "duration",
        default_value = "15m0s",
        allow_hyphen_values = true
    )]
    pub config_sync_period: GoDuration,

    // --- the node ---
    /// If non-empty, will be used as the name of the Node that kube-proxy is running on. If unset, the node name is assumed to be the same as the node's hostname.
    #[arg(verbatim_doc_comment, long, value_name = "string", default_value = "")]
    pub hostname_override: String,
    /// Overrides kube-proxy's idea of what its node's primary IP is. Note that the name is a historical artifact, and kube-proxy does not actually bind any sockets to this IP. This parameter is ignored if a config file is specified by --config.
    #[arg(verbatim_doc_comment, long, value_name = "ip", default_value = "0.0.0.0", value_parser = ip_flag)]
    pub bind_address: String,
    /// The IP address and port for the health check server to serve on, defaulting to "0.0.0.0:10256". This parameter is ignored if a config file is specified by --config.
    #[arg(verbatim_doc_comment, long, value_name = "ipport", default_value = "0.0.0.0:10256", value_parser = ipport_flag)]
    pub healthz_bind_address: String,
    /// The IP address and port for the metrics server to serve on, defaulting to "127.0.0.1:10249". (Set to "0.0.0.0:10249" / "[::]:10249" to bind on all interfaces.) This parameter is ignored if a config file is specified by --config.
    #[arg(verbatim_doc_comment, long, value_name = "ipport", default_value = "127.0.0.1:10249", value_parser = ipport_flag)]
    pub metrics_bind_address: String,
    /// The port to bind the health check server. Use 0 to disable.
    #[arg(verbatim_doc_comment, long, value_name = "int32", default_value_t = 10256, hide = true, allow_negative_numbers = true, value_parser = go_int32)]
    #[serde(skip)]
    pub healthz_port: i32,
    /// The port to bind the metrics server. Use 0 to disable.
    #[arg(verbatim_doc_comment, long, value_name = "int32", default_value_t = 10249, hide = true, allow_negative_numbers = true, value_parser = go_int32)]
    #[serde(skip)]
    pub metrics_port: i32,
    /// If true kube-proxy will treat failure to bind to a port as fatal and exit
    #[arg(verbatim_doc_comment, long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub bind_address_hard_fail: bool,
    /// If true enables profiling via web interface on /debug/pprof handler. This parameter is ignored if a config file is specified by --config.
    #[arg(verbatim_doc_comment, long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub profiling: bool,
    /// The previous version for which you want to show hidden metrics. Only the previous minor version is meaningful, other values will not be allowed. The format is <major>.<minor>, e.g.: '1.16'. The purpose of this format is make sure you have the opportunity to notice if the next release hides additional metrics, rather than being surprised when they are permanently removed in the release after that. This parameter is ignored if a config file is specified by --config.
    #[arg(verbatim_doc_comment, long, value_name = "string", default_value = "")]
    pub show_hidden_metrics_for_version: String,
    /// The oom-score-adj value for kube-proxy process. Values must be within the range [-1000, 1000]. This parameter is ignored if a config file is specified by --config.
    #[arg(verbatim_doc_comment, long, value_name = "int32", default_value_t = -999, allow_negative_numbers = true, value_parser = go_int32)]
    pub oom_score_adj: i32,

    // --- the proxy mode and its sections ---
    /// Which proxy mode to use: on Linux this can be 'iptables' (default), 'ipvs', or 'nftables'. On Windows the only supported value is 'kernelspace'. This parameter is ignored if a config file is specified by --config.
    #[arg(
        verbatim_doc_comment,
        long,
        value_name = "ProxyMode",
        default_value = ""
    )]
    pub proxy_mode: String,
    /// If using the iptables or ipvs proxy mode, the bit of the fwmark space to mark packets requiring SNAT with.  Must be within the range [0, 31].
    #[arg(verbatim_doc_comment, long, value_name = "int32", default_value_t = 14, allow_negative_numbers = true, value_parser = go_int32)]
    pub iptables_masquerade_bit: i32,
    /// File only (nftables.masqueradeBit): the fwmark bit of nftables mode.
    #[arg(skip = 14)]
    pub nftables_masquerade_bit: i32,
    /// SNAT all traffic sent via Service cluster IPs. This may be required with some CNI plugins. Only supported on Linux.
    #[arg(verbatim_doc_comment, long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub masquerade_all: bool,
    /// If false, kube-proxy will disable the legacy behavior of allowing NodePort services to be accessed via localhost. (Applies only to iptables mode and IPv4; localhost NodePorts are never allowed with other proxy modes or with IPv6.)
    #[arg(verbatim_doc_comment, long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub iptables_localhost_nodeports: bool,
    /// An interval (e.g. '5s', '1m', '2h22m') indicating how frequently various re-synchronizing and cleanup operations are performed. Must be greater than 0.
    #[arg(
        verbatim_doc_comment,
        long,
        value_name = "duration",
        default_value = "30s",
        allow_hyphen_values = true
    )]
    pub iptables_sync_period: GoDuration,
    /// The minimum period between iptables rule resyncs (e.g. '5s', '1m', '2h22m'). A value of 0 means every Service or EndpointSlice change will result in an immediate iptables resync.
    #[arg(
        verbatim_doc_comment,
        long,
        value_name = "duration",
        default_value = "1s",
        allow_hyphen_values = true
    )]
    pub iptables_min_sync_period: GoDuration,
    /// An interval (e.g. '5s', '1m', '2h22m') indicating how frequently various re-synchronizing and cleanup operations are performed. Must be greater than 0.
    #[arg(
        verbatim_doc_comment,
        long,
        value_name = "duration",
        default_value = "30s",
        allow_hyphen_values = true
    )]
    pub ipvs_sync_period: GoDuration,
    /// The minimum period between IPVS rule resyncs (e.g. '5s', '1m', '2h22m'). A value of 0 means every Service or EndpointSlice change will result in an immediate IPVS resync.
    #[arg(
        verbatim_doc_comment,
        long,
        value_name = "duration",
        default_value = "1s",
        allow_hyphen_values = true
    )]
    pub ipvs_min_sync_period: GoDuration,
    /// The ipvs scheduler type when proxy mode is ipvs
    #[arg(verbatim_doc_comment, long, value_name = "string", default_value = "")]
    pub ipvs_scheduler: String,
    /// A comma-separated list of CIDRs which the ipvs proxier should not touch when cleaning up IPVS rules.
    #[arg(verbatim_doc_comment, long, value_name = "strings", value_delimiter = ',', action = ArgAction::Append)]
    #[serde(deserialize_with = "comma_list")]
    pub ipvs_exclude_cidrs: Vec<String>,
    /// Enable strict ARP by setting arp_ignore to 1 and arp_announce to 2
    #[arg(verbatim_doc_comment, long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub ipvs_strict_arp: bool,
    /// The timeout for idle IPVS TCP connections, 0 to leave as-is. (e.g. '5s', '1m', '2h22m').
    #[arg(
        verbatim_doc_comment,
        long,
        value_name = "duration",
        default_value = "0s",
        allow_hyphen_values = true
    )]
    pub ipvs_tcp_timeout: GoDuration,
    /// The timeout for IPVS TCP connections after receiving a FIN packet, 0 to leave as-is. (e.g. '5s', '1m', '2h22m').
    #[arg(
        verbatim_doc_comment,
        long,
        value_name = "duration",
        default_value = "0s",
        allow_hyphen_values = true
    )]
    pub ipvs_tcpfin_timeout: GoDuration,
    /// The timeout for IPVS UDP packets, 0 to leave as-is. (e.g. '5s', '1m', '2h22m').
    #[arg(
        verbatim_doc_comment,
        long,
        value_name = "duration",
        default_value = "0s",
        allow_hyphen_values = true
    )]
    pub ipvs_udp_timeout: GoDuration,

    // --- local traffic and node ports ---
    /// Mode to use to detect local traffic. This parameter is ignored if a config file is specified by --config.
    #[arg(
        verbatim_doc_comment,
        long,
        value_name = "LocalMode",
        default_value = ""
    )]
    pub detect_local_mode: String,
    /// A bridge interface name. When --detect-local-mode is set to BridgeInterface, kube-proxy will consider traffic to be local if it originates from this bridge.
    #[arg(verbatim_doc_comment, long, value_name = "string", default_value = "")]
    pub pod_bridge_interface: String,
    /// An interface name prefix. When --detect-local-mode is set to InterfaceNamePrefix, kube-proxy will consider traffic to be local if it originates from any interface whose name begins with this prefix.
    #[arg(verbatim_doc_comment, long, value_name = "string", default_value = "")]
    pub pod_interface_name_prefix: String,
    /// The CIDR range of the pods in the cluster. (For dual-stack clusters, this can be a comma-separated dual-stack pair of CIDR ranges.). When --detect-local-mode is set to ClusterCIDR, kube-proxy will consider traffic to be local if its source IP is in this range. (Otherwise it is not used.) This parameter is ignored if a config file is specified by --config.
    #[arg(verbatim_doc_comment, long, value_name = "string", default_value = "")]
    pub cluster_cidr: String,
    /// A list of CIDR ranges and/or keywords that expand to CIDR ranges. NodePort services are only accessible on node IPs covered by the list. Supported keywords: 'primary' (the Node object's primary IPv4 and/or IPv6 addresses), 'localhost' (127.0.0.0/8 and ::1/128), and 'all' (0.0.0.0/0 and ::/0). Any combination of valid keywords and CIDRS may be included in the list. Serving NodePorts on loopback IPs is only supported in iptables mode (IPv4 only, see --iptables-localhost-nodeports), and, only for TCP, in nftables mode when the KubeProxyNFTablesLocalhostNodePorts feature gate is enabled and the list explicitly includes loopback (e.g. 'localhost'). If unset, this defaults to 'all' in iptables and ipvs mode, and to 'primary' in nftables mode. This parameter is ignored if a config file is specified by --config.
    #[arg(verbatim_doc_comment, long, value_name = "strings", value_delimiter = ',', action = ArgAction::Append)]
    #[serde(deserialize_with = "comma_list")]
    pub nodeport_addresses: Vec<String>,

    // --- conntrack ---
    /// Maximum number of NAT connections to track per CPU core (0 to leave the limit as-is and ignore conntrack-min).
    #[arg(verbatim_doc_comment, long, value_name = "int32", default_value_t = 32768, allow_negative_numbers = true, value_parser = go_int32)]
    pub conntrack_max_per_core: i32,
    /// Minimum number of conntrack entries to allocate, regardless of conntrack-max-per-core (set conntrack-max-per-core=0 to leave the limit as-is).
    #[arg(verbatim_doc_comment, long, value_name = "int32", default_value_t = 131072, allow_negative_numbers = true, value_parser = go_int32)]
    pub conntrack_min: i32,
    /// Idle timeout for established TCP connections (0 to leave as-is)
    #[arg(
        verbatim_doc_comment,
        long,
        value_name = "duration",
        default_value = "24h0m0s",
        allow_hyphen_values = true
    )]
    pub conntrack_tcp_timeout_established: GoDuration,
    /// NAT timeout for TCP connections in the CLOSE_WAIT state
    #[arg(
        verbatim_doc_comment,
        long,
        value_name = "duration",
        default_value = "1h0m0s",
        allow_hyphen_values = true
    )]
    pub conntrack_tcp_timeout_close_wait: GoDuration,
    /// Enable liberal mode for tracking TCP packets by setting nf_conntrack_tcp_be_liberal to 1
    #[arg(verbatim_doc_comment, long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub conntrack_tcp_be_liberal: bool,
    /// Idle timeout for UNREPLIED UDP connections (0 to leave as-is)
    #[arg(
        verbatim_doc_comment,
        long,
        value_name = "duration",
        default_value = "0s",
        allow_hyphen_values = true
    )]
    pub conntrack_udp_timeout: GoDuration,
    /// Idle timeout for ASSURED UDP connections (0 to leave as-is)
    #[arg(
        verbatim_doc_comment,
        long,
        value_name = "duration",
        default_value = "0s",
        allow_hyphen_values = true
    )]
    pub conntrack_udp_timeout_stream: GoDuration,

    // --- logging (component-base) ---
    /// number for the log level verbosity
    #[arg(verbatim_doc_comment, short = 'v', long = "v", value_name = "Level", default_value_t = 0, value_parser = go_verbosity)]
    pub v: u32,
    /// comma-separated list of pattern=N settings for file-filtered logging (only works for text log format)
    #[arg(verbatim_doc_comment, long, value_name = "pattern=N,...", value_parser = go_vmodule, action = ArgAction::Append)]
    #[serde(deserialize_with = "comma_list")]
    pub vmodule: Vec<String>,
    /// Sets the log format. Permitted formats: "json" (gated by LoggingBetaOptions), "text".
    #[arg(
        verbatim_doc_comment,
        long,
        value_name = "string",
        default_value = "text"
    )]
    pub logging_format: String,
    /// Maximum number of seconds between log flushes
    #[arg(
        verbatim_doc_comment,
        long,
        value_name = "duration",
        default_value = "5s",
        allow_hyphen_values = true
    )]
    pub log_flush_frequency: GoDuration,
    /// [Alpha] In text format, write error messages to stderr and info messages to stdout. The default is to write a single stream to stdout. Enable the LoggingAlphaOptions feature gate to use this.
    #[arg(verbatim_doc_comment, long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub log_text_split_stream: bool,
    /// [Alpha] In text format with split output streams, the info messages can be buffered for a while to increase performance. The default value of zero bytes disables buffering. The size can be specified as number of bytes (512), multiples of 1000 (1K), multiples of 1024 (2Ki), or powers of those (3M, 4G, 5Mi, 6Gi). Enable the LoggingAlphaOptions feature gate to use this.
    #[arg(
        verbatim_doc_comment,
        long,
        value_name = "quantity",
        default_value = "0",
        allow_hyphen_values = true
    )]
    pub log_text_info_buffer_size: Quantity,
    /// [Alpha] In JSON format, write error messages to stderr and info messages to stdout. The default is to write a single stream to stdout. Enable the LoggingAlphaOptions feature gate to use this.
    #[arg(verbatim_doc_comment, long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub log_json_split_stream: bool,
    /// [Alpha] In JSON format with split output streams, the info messages can be buffered for a while to increase performance. The default value of zero bytes disables buffering. The size can be specified as number of bytes (512), multiples of 1000 (1K), multiples of 1024 (2Ki), or powers of those (3M, 4G, 5Mi, 6Gi). Enable the LoggingAlphaOptions feature gate to use this.
    #[arg(
        verbatim_doc_comment,
        long,
        value_name = "quantity",
        default_value = "0",
        allow_hyphen_values = true
    )]
    pub log_json_info_buffer_size: Quantity,
    /// Beyond upstream: where logs go: auto (journald when run by systemd, else stderr), journald, stderr.
    #[arg(verbatim_doc_comment, long, default_value = "auto")]
    pub log_format: LogFormat,

    // --- removed upstream, accepted because unit files still pass them (config/load.rs warns) ---
    /// Removed in v1.26 (klog): false writes the log to --log-file or --log-dir.
    #[arg(verbatim_doc_comment, long, hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub logtostderr: bool,
    /// Removed in v1.26 (klog): with a log file, also log to stderr.
    #[arg(verbatim_doc_comment, long, hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub alsologtostderr: bool,
    /// Removed in v1.26 (klog): with --logtostderr=false, log to <dir>/kube-proxy.log.
    #[arg(verbatim_doc_comment, long, hide = true, default_value = "")]
    pub log_dir: String,
    /// Removed in v1.26 (klog): with --logtostderr=false, log to this file.
    #[arg(verbatim_doc_comment, long, hide = true, default_value = "")]
    pub log_file: String,
    /// Removed in v1.26 (klog): the log file's size limit in megabytes (0: none).
    #[arg(verbatim_doc_comment, long, hide = true, default_value_t = 1800, value_parser = go_uint)]
    pub log_file_max_size: u64,
    /// Removed in v1.26 (klog): accepted, no effect.
    #[arg(
        verbatim_doc_comment,
        long,
        hide = true,
        default_value = ":0",
        value_name = "traceLocation"
    )]
    pub log_backtrace_at: String,
    /// Removed in v1.26 (klog): accepted, no effect.
    #[arg(
        verbatim_doc_comment,
        long,
        hide = true,
        default_value = "2",
        value_name = "severity"
    )]
    pub stderrthreshold: String,
    /// Removed in v1.26 (klog): accepted, no effect.
    #[arg(
        verbatim_doc_comment,
        long,
        hide = true,
        default_value = "",
        value_name = "severity"
    )]
    pub alsologtostderrthreshold: String,
    /// Removed in v1.26 (klog): accepted, no effect.
    #[arg(verbatim_doc_comment, long, hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub legacy_stderr_threshold_behavior: bool,
    /// Removed in v1.26 (klog): accepted, no effect.
    #[arg(verbatim_doc_comment, long, hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub add_dir_header: bool,
    /// Removed in v1.26 (klog): accepted, no effect.
    #[arg(verbatim_doc_comment, long, hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub skip_headers: bool,
    /// Removed in v1.26 (klog): accepted, no effect.
    #[arg(verbatim_doc_comment, long, hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub skip_log_headers: bool,
    /// Removed in v1.26 (klog): accepted, no effect.
    #[arg(verbatim_doc_comment, long, hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub one_output: bool,
    /// Removed: --cleanup always removes ipvs rules too.
    #[arg(verbatim_doc_comment, long, hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    #[serde(skip)]
    pub cleanup_ipvs: bool,
    /// Removed in v1.26 with the userspace proxy (portRange in a file): no effect.
    #[arg(verbatim_doc_comment, long, hide = true, default_value = "")]
    pub proxy_port_range: String,
    /// Removed in v1.26 with the userspace proxy: no effect.
    #[arg(
        verbatim_doc_comment,
        long,
        hide = true,
        default_value = "250ms",
        allow_hyphen_values = true
    )]
    #[serde(skip)]
    pub udp_timeout: GoDuration,
}

/// The upstream release whose flags, defaults and messages these are.
pub const UPSTREAM_VERSION: &str = "v1.37.2";

/// `--version`'s value: true, false, raw, or a version to report (`v1.37.2-custom`), which
/// must keep upstream's major, minor and patch.
fn version_flag(text: &str) -> Result<String, String> {
    if text == "raw" {
        return Ok(text.into());
    }
    if let Some(rest) = text.strip_prefix('v') {
        let core = rest.split(['-', '+']).next().unwrap_or_default();
        let numbers: Vec<&str> = core.split('.').collect();
        let numeric = numbers.len() == 3
            && numbers
                .iter()
                .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if !numeric {
            return Err(format!("could not parse {text:?} as version"));
        }
        if core != UPSTREAM_VERSION.trim_start_matches('v') {
            return Err(format!(
                "version {text:?} must match major/minor/patch of default version {UPSTREAM_VERSION:?}"
            ));
        }
        return Ok(text.into());
    }
    go_bool(text).map(|on| on.to_string())
}

impl Default for KubeProxyOptions {
    /// The built-in defaults: exactly what an empty command line gives.
    fn default() -> Self {
        KubeProxyOptions::try_parse_from(["kube-proxy"]).expect("defaults parse")
    }
}

impl KubeProxyOptions {
    /// `--vmodule`'s values as one list.
    pub fn vmodule_text(&self) -> String {
        self.vmodule.join(",")
    }

    /// `--feature-gates`, its repeats merged.
    pub fn feature_gate_map(&self) -> std::collections::BTreeMap<String, bool> {
        BoolMap::merged(&self.feature_gates)
    }
}

impl crate::config::Layered for KubeProxyOptions {
    const PROGRAM: &'static str = "kube-proxy";
    const ENV_PREFIX: &'static str = "KUBE_PROXY_";
    const DEFAULT_CONFIG_PATH: &'static str = "/etc/kubernetes/kube-proxy.toml";
    const ID_VARIABLE: (&'static str, &'static str) = ("", "");
    const OPTIONAL_KEYS: &'static [(&'static str, bool)] = &[];
    /// Upstream's own switch for its kernel version check, and how transactions reach the
    /// kernel (`KUBE_PROXY_NFT_APPLIER`, read by the applier): not settings.
    const ENV_IGNORED: &'static [&'static str] =
        &["nftables_skip_kernel_version_check", "nft_applier"];

    fn file_layer(path: &Path, text: &str) -> Option<Result<FileLayer, ConfigError>> {
        file::is_kube_proxy_configuration(path, text).then(|| file::read(path, text))
    }

    fn config_flag(&self) -> Option<&PathBuf> {
        self.config.as_ref()
    }

    fn take_invocation(&mut self, cli: &Self, config: Option<PathBuf>) {
        self.version = cli.version.clone();
        self.kube_config_file = config.as_deref().is_some_and(|path| {
            std::fs::read_to_string(path)
                .is_ok_and(|text| file::is_kube_proxy_configuration(path, &text))
        });
        self.config = config;
        self.write_config_to = cli.write_config_to.clone();
        self.cleanup = cli.cleanup;
        self.init_only = cli.init_only;
        self.check_config = cli.check_config;
        self.args = cli.args.clone();
        self.given_flags = cli.given_flags.clone();
        self.healthz_port = cli.healthz_port;
        self.metrics_port = cli.metrics_port;
        self.cleanup_ipvs = cli.cleanup_ipvs;
        self.udp_timeout = cli.udp_timeout;
    }

    fn load_warnings_mut(&mut self) -> &mut Vec<String> {
        &mut self.load_warnings
    }

    /// None: upstream refuses arguments (`load::load` says so) rather than ignoring them.
    fn ignored_args(&self) -> &[String] {
        &[]
    }
}
