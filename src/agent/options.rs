//! The agent's command line: every flag of upstream's proxy-agent, with its name, type and
//! default, parsed as pflag parses them; plus the settings beyond upstream (a TOML file, the
//! queue limits toward destinations, the log sink). The same layers as the server's
//! (`config::layers`): defaults < `/etc/konnectivity/agent.toml` < environment < flags.

use std::path::PathBuf;

use clap::{ArgAction, Parser};
use serde::{Deserialize, Serialize};

use crate::config::goflag::{any_path, go_bool, go_int, go_level, go_uint, level};
use crate::config::{GoDuration, LogFormat};

/// A drop-in replacement for the Konnectivity proxy-agent.
///
/// Every upstream flag is accepted with the same name and default. Settings: built-in
/// defaults < TOML file < environment (KONNECTIVITY_AGENT_<KEY>, PROXY_AGENT_ID) < flags.
#[derive(Parser, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[command(
    name = "konnectivity-agent",
    version,
    args_override_self = true,
    disable_version_flag = true
)]
pub struct AgentOptions {
    /// Print the version and exit.
    #[arg(long, action = ArgAction::Version)]
    #[serde(skip)]
    pub version: Option<bool>,

    /// TOML configuration file. Default: /etc/konnectivity/agent.toml when it exists; an
    /// empty value reads no file.
    #[arg(long, value_name = "PATH", value_parser = any_path)]
    #[serde(skip)]
    pub config: Option<PathBuf>,

    /// Validate the configuration (certificates load and match, the token file is
    /// readable), print one line, and exit 0 or 1.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    #[serde(skip)]
    pub check_config: bool,

    /// Write the effective configuration as TOML to PATH ('-' for stdout) and exit.
    #[arg(long, value_name = "PATH")]
    #[serde(skip)]
    pub write_config_to: Option<PathBuf>,

    /// Connect to a `konnectivity-server --dev` on this machine, with the development CA and
    /// agent certificate it generated. Explicit flags still override.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    #[serde(skip)]
    pub dev: bool,

    /// With --dev: where the server keeps its development CA and certificates
    /// (default $XDG_STATE_HOME/konnectivity-server or ~/.local/state/konnectivity-server).
    #[arg(long, value_name = "DIR")]
    #[serde(skip)]
    pub dev_state_dir: Option<PathBuf>,

    /// Problems found while loading that do not stop the start.
    #[arg(skip)]
    #[serde(skip)]
    pub load_warnings: Vec<String>,

    /// Arguments that are not flags: ignored, as upstream, and named in a warning.
    #[arg(value_name = "IGNORED", hide = true)]
    #[serde(skip)]
    pub ignored_args: Vec<String>,

    // --- the server connection ---
    /// If non-empty secure communication with this cert.
    #[arg(long, default_value = "")]
    pub agent_cert: String,
    /// If non-empty secure communication with this key.
    #[arg(long, default_value = "")]
    pub agent_key: String,
    /// If non-empty the CAs we use to validate clients.
    #[arg(long, default_value = "")]
    pub ca_cert: String,
    /// The hostname to use to connect to the proxy-server.
    #[arg(long, default_value = "127.0.0.1")]
    pub proxy_server_host: String,
    /// The port the proxy server is listening on.
    #[arg(long, default_value_t = 8091, allow_negative_numbers = true, value_parser = go_int)]
    pub proxy_server_port: i64,
    /// Additional ALPN protocols to be presented when connecting to the server. Useful to
    /// distinguish between network proxy and apiserver connections that share the same
    /// destination address.
    #[arg(long, value_delimiter = ',', action = ArgAction::Append)]
    #[serde(deserialize_with = "crate::config::goflag::comma_list")]
    pub alpn_proto: Vec<String>,
    /// If non-empty proxy agent uses this token to prove its identity to the proxy server.
    #[arg(long, default_value = "")]
    pub service_account_token_path: String,
    /// Time for gRPC agent server keepalive.
    #[arg(long, default_value = "1h0m0s", allow_hyphen_values = true)]
    pub keepalive_time: GoDuration,

    // --- identity ---
    /// The unique ID of this agent. Can also be set by the 'PROXY_AGENT_ID' environment
    /// variable. Default to a generated uuid if not set.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    /// Identifiers of the agent that will be used by the server when choosing agent. N.B. the
    /// list of identifiers must be in URL encoded format. e.g.,host=localhost&host=node1.mydomain.com&cidr=127.0.0.1/16&ipv4=1.2.3.4&ipv4=5.6.7.8&ipv6=:::::&default-route=true
    #[arg(long, default_value = "")]
    pub agent_identifiers: String,

    // --- server count and sync ---
    /// The initial interval by which the agent periodically checks if it has connections to
    /// all instances of the proxy server.
    #[arg(long, default_value = "1s", allow_hyphen_values = true)]
    pub sync_interval: GoDuration,
    /// The maximum interval for the SyncInterval to back off to when unable to connect to
    /// the proxy server
    #[arg(long, default_value = "10s", allow_hyphen_values = true)]
    pub sync_interval_cap: GoDuration,
    /// If true, the agent continues syncing, in order to support server count changes.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub sync_forever: bool,
    /// The interval by which the agent periodically checks if its connections to the proxy
    /// server are ready.
    #[arg(long, default_value = "1s", allow_hyphen_values = true)]
    pub probe_interval: GoDuration,
    /// Enables lease counting system to determine the number of proxy servers to connect to.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub count_server_leases: bool,
    /// Namespace where lease objects are managed.
    #[arg(long, default_value = "kube-system")]
    pub lease_namespace: String,
    /// The labels on which the lease objects are managed.
    #[arg(long, default_value = "k8s-app=konnectivity-server")]
    pub lease_label: String,
    /// Defines how the server counts from lease and from server responses are combined.
    /// Possible values: 'default' to use only one source (server or leases depending on
    /// other flags), 'max' to take the larger value.
    #[arg(long, default_value = "default")]
    pub server_count_source: String,
    /// Path to the kubeconfig file
    #[arg(long, default_value = "")]
    pub kubeconfig: String,
    /// Content type of requests sent to apiserver.
    #[arg(long, default_value = "application/vnd.kubernetes.protobuf")]
    pub kube_api_content_type: String,

    // --- tunnels ---
    /// Set the size of the channel for transferring data between the agent and the proxy
    /// server.
    #[arg(long, default_value_t = 150, allow_negative_numbers = true, value_parser = go_int)]
    pub xfr_channel_size: i64,
    /// Turns on a warning if the system is going to push to a full channel.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub warn_on_channel_limit: bool,
    /// Beyond upstream: past this many bytes queued toward a destination, the stream's
    /// receive loop waits briefly for a destination that is still reading; one that stopped
    /// is closed alone at 4x this.
    #[arg(long, default_value_t = 1 << 20, allow_negative_numbers = true, value_parser = go_int)]
    pub endpoint_queue_limit_bytes: i64,
    /// Beyond upstream: how long a write to a destination may make no progress before its
    /// tunnel is closed.
    #[arg(long, default_value = "30s", allow_hyphen_values = true)]
    pub endpoint_queue_stall_timeout: GoDuration,
    /// Beyond upstream: bytes queued toward all destinations together. Past it, a tunnel
    /// whose destination is not reading is closed instead of queueing more.
    #[arg(long, default_value_t = 64 << 20, allow_negative_numbers = true, value_parser = go_int)]
    pub endpoint_queue_budget_bytes: i64,
    /// Beyond upstream: how long a dial to a destination may take (DNS and connect).
    #[arg(long, default_value = "5s", allow_hyphen_values = true)]
    pub endpoint_dial_timeout: GoDuration,

    /// Beyond upstream: a server connection that has read nothing this long gets an HTTP/2
    /// PING, whatever --keepalive-time says (the shorter of the two applies). 0 leaves only
    /// --keepalive-time. Upstream's server sends GOAWAY to clients that ping more often than
    /// every 30s.
    #[arg(long, default_value = "30s", allow_hyphen_values = true)]
    pub server_ping_interval: GoDuration,
    /// Beyond upstream: a server that leaves a PING unanswered this long is dropped and
    /// connected to again.
    #[arg(long, default_value = "10s", allow_hyphen_values = true)]
    pub server_ping_timeout: GoDuration,

    /// Beyond upstream: after the first SIGTERM, how long live tunnels may run before the
    /// agent exits; it exits as soon as none is open. 0 keeps upstream's behaviour: the agent
    /// drains and serves on until a second signal.
    #[arg(long, default_value = "0s", allow_hyphen_values = true)]
    pub graceful_shutdown_timeout: GoDuration,

    // --- health and admin ---
    /// The host address to listen on, without port.
    #[arg(long, default_value = "")]
    pub health_server_host: String,
    /// The port the health server is listening on.
    #[arg(long, default_value_t = 8093, allow_negative_numbers = true, value_parser = go_int)]
    pub health_server_port: i64,
    /// Bind address for admin connections. If empty, we will bind to all interfaces.
    #[arg(long, default_value = "127.0.0.1")]
    pub admin_bind_address: String,
    /// The port the admin server is listening on.
    #[arg(long, default_value_t = 8094, allow_negative_numbers = true, value_parser = go_int)]
    pub admin_server_port: i64,
    /// enable pprof at host:admin-port/debug/pprof
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub enable_profiling: bool,
    /// enable contention profiling at host:admin-port/debug/pprof/block. "--enable-profiling"
    /// must also be set.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub enable_contention_profiling: bool,

    // --- beyond upstream ---
    /// The only destinations this agent dials: address ranges, addresses or host names
    /// (*.name matches any name under it), each with an optional :port or :low-high; comma
    /// separated, repeatable. Checked after the name is resolved: a name matches name rules
    /// and the address it resolves to matches address rules. Empty allows every destination
    /// the deny list does not name.
    #[arg(long, value_delimiter = ',', action = ArgAction::Append)]
    #[serde(deserialize_with = "crate::config::goflag::comma_list")]
    pub allow_destinations: Vec<String>,
    /// Destinations this agent never dials, in the syntax of --allow-destinations (a match
    /// wins over the allow list), checked against the name and against every address it
    /// resolves to; a refused dial gets a DIAL_RSP error.
    #[arg(long, value_delimiter = ',', action = ArgAction::Append)]
    #[serde(deserialize_with = "crate::config::goflag::comma_list")]
    pub deny_destinations: Vec<String>,
    /// Reload when the config file, a certificate, key, CA or token file changes.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub watch_files: bool,
    /// Where logs go: auto (journald when run by systemd, else stderr), journald, stderr.
    #[arg(long, default_value = "auto")]
    pub log_format: LogFormat,

    // --- klog flags ---
    /// number for the log level verbosity
    #[arg(short = 'v', long = "v", default_value_t = 4, value_name = "Level", value_parser = go_level, allow_negative_numbers = true)]
    #[serde(deserialize_with = "level")]
    pub v: u32,
    /// comma-separated list of pattern=N settings for file-filtered logging
    #[arg(long, default_value = "", value_name = "moduleSpec")]
    pub vmodule: String,
    /// log to standard error instead of files
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub logtostderr: bool,
    /// log to standard error as well as files (no effect when -logtostderr=true)
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub alsologtostderr: bool,
    /// logs at or above this threshold go to stderr when -alsologtostderr=true (no effect
    /// when -logtostderr=true)
    #[arg(long, default_value = "", value_name = "severity")]
    pub alsologtostderrthreshold: String,
    /// logs at or above this threshold go to stderr when writing to files and stderr
    #[arg(long, default_value = "2", value_name = "severity")]
    pub stderrthreshold: String,
    /// If true, stderrthreshold is ignored when logtostderr=true (legacy behavior).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub legacy_stderr_threshold_behavior: bool,
    /// when logging hits line file:N, emit a stack trace
    #[arg(long, default_value = ":0", value_name = "traceLocation")]
    pub log_backtrace_at: String,
    /// If non-empty, write log files in this directory (no effect when -logtostderr=true)
    #[arg(long, default_value = "")]
    pub log_dir: String,
    /// If non-empty, use this log file (no effect when -logtostderr=true)
    #[arg(long, default_value = "")]
    pub log_file: String,
    /// Defines the maximum size a log file can grow to (no effect when -logtostderr=true).
    /// Unit is megabytes. If the value is 0, the maximum file size is unlimited.
    #[arg(long, default_value_t = 1800, value_parser = go_uint)]
    pub log_file_max_size: u64,
    /// If true, adds the file directory to the header of the log messages
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub add_dir_header: bool,
    /// If true, avoid header prefixes in the log messages
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub skip_headers: bool,
    /// If true, avoid headers when opening log files (no effect when -logtostderr=true)
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub skip_log_headers: bool,
    /// If true, only write logs to their native severity level (vs also writing to each lower
    /// severity level; no effect when -logtostderr=true)
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub one_output: bool,
}

impl Default for AgentOptions {
    /// The built-in defaults: exactly what an empty command line gives.
    fn default() -> Self {
        AgentOptions::try_parse_from(["konnectivity-agent"]).expect("defaults parse")
    }
}

impl crate::config::Layered for AgentOptions {
    const PROGRAM: &'static str = "konnectivity-agent";
    const ENV_PREFIX: &'static str = "KONNECTIVITY_AGENT_";
    const DEFAULT_CONFIG_PATH: &'static str = "/etc/konnectivity/agent.toml";
    const ID_VARIABLE: (&'static str, &'static str) = ("PROXY_AGENT_ID", "agent_id");
    const OPTIONAL_KEYS: &'static [(&'static str, bool)] = &[("agent_id", false)];

    fn config_flag(&self) -> Option<&PathBuf> {
        self.config.as_ref()
    }

    fn take_invocation(&mut self, cli: &Self, config: Option<PathBuf>) {
        self.version = cli.version;
        self.config = config;
        self.check_config = cli.check_config;
        self.write_config_to = cli.write_config_to.clone();
        self.dev = cli.dev;
        self.dev_state_dir = cli.dev_state_dir.clone();
        self.ignored_args = cli.ignored_args.clone();
    }

    fn load_warnings_mut(&mut self) -> &mut Vec<String> {
        &mut self.load_warnings
    }

    fn ignored_args(&self) -> &[String] {
        &self.ignored_args
    }
}
