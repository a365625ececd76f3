//! The command line: every flag of upstream's proxy-server, with its name, type and default,
//! parsed the way Go's pflag parses them (`--flag value`, `--flag=value`, bare bools, last
//! repeat wins, list flags accumulate).

use std::path::PathBuf;

use clap::{ArgAction, Parser};
use serde::{Deserialize, Serialize};

use super::duration::GoDuration;
use super::goflag::{any_path, go_bool, go_float32, go_int, go_level, go_uint, level};
use super::values::LogFormat;

/// A drop-in replacement for the Konnectivity proxy-server.
///
/// Every upstream flag is accepted with the same name and default. klog's logging flags are
/// accepted too; `-v` maps onto the log level (0-4 info, 5 debug, 6+ trace) and RUST_LOG, when
/// set, takes precedence.
#[derive(Parser, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[command(
    name = "konnectivity-server",
    version,
    args_override_self = true,
    disable_version_flag = true
)]
pub struct Options {
    /// Print the version and exit.
    #[arg(long, action = ArgAction::Version)]
    #[serde(skip)]
    pub version: Option<bool>,

    /// TOML configuration file. Default: /etc/konnectivity/server.toml when it exists; an
    /// empty value reads no file. Settings: built-in defaults < file < environment
    /// (KONNECTIVITY_SERVER_<KEY>, PROXY_SERVER_ID) < command line.
    #[arg(long, value_name = "PATH", value_parser = any_path)]
    #[serde(skip)]
    pub config: Option<PathBuf>,

    /// Validate the configuration (including that certificates and keys load and match),
    /// print one line, and exit 0 or 1.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    #[serde(skip)]
    pub check_config: bool,

    /// Write the effective configuration as TOML to PATH ('-' for stdout) and exit.
    #[arg(long, value_name = "PATH")]
    #[serde(skip)]
    pub write_config_to: Option<PathBuf>,

    /// Problems found while loading that do not stop the start (logged once logging is up).
    #[arg(skip)]
    #[serde(skip)]
    pub load_warnings: Vec<String>,

    /// Arguments that are not flags. Upstream's command ignores them, so they are ignored here
    /// too, and named in a warning (`--enable-profiling false` leaves `false` behind).
    #[arg(value_name = "IGNORED", hide = true)]
    #[serde(skip)]
    pub ignored_args: Vec<String>,

    /// Start on an embedded development setup: a gRPC frontend on a Unix socket in the runtime
    /// directory and a development CA, server and agent certificates generated on first start
    /// under the state directory. Explicit flags still override.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    #[serde(skip)]
    pub dev: bool,

    /// With --dev: where the development CA and certificates are kept
    /// (default $XDG_STATE_HOME/konnectivity-server or ~/.local/state/konnectivity-server).
    #[arg(long, value_name = "DIR")]
    #[serde(skip)]
    pub dev_state_dir: Option<PathBuf>,

    // --- frontend ---
    /// Frontend protocol: 'grpc' or 'http-connect'.
    #[arg(long, default_value = "grpc")]
    pub mode: String,
    /// Unix socket path for the frontend; empty means TCP with mTLS.
    #[arg(long, default_value = "")]
    pub uds_name: String,
    /// Remove an existing file at --uds-name before listening.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub delete_existing_uds_file: bool,
    /// Frontend TCP port. Must be 0 with --uds-name.
    #[arg(long, default_value_t = 8090, allow_negative_numbers = true, value_parser = go_int)]
    pub server_port: i64,
    /// Frontend bind address. Empty means all interfaces.
    #[arg(long, default_value = "")]
    pub server_bind_address: String,
    /// Frontend TLS certificate (TCP mode).
    #[arg(long, default_value = "")]
    pub server_cert: String,
    /// Frontend TLS key (TCP mode).
    #[arg(long, default_value = "")]
    pub server_key: String,
    /// CA that verifies frontend (kube-apiserver) client certificates; required in TCP mode.
    #[arg(long, default_value = "")]
    pub server_ca_cert: String,
    /// gRPC frontend keepalive ping interval.
    #[arg(long, default_value = "1h0m0s")]
    pub frontend_keepalive_time: GoDuration,
    /// Packets queued per tunnel toward its frontend. 0 writes without a queue.
    #[arg(long, default_value_t = 10, allow_negative_numbers = true, value_parser = go_int)]
    pub frontend_write_channel_size: i64,
    /// Beyond upstream: past this many bytes queued toward a frontend, the agent waits for a
    /// frontend that is still reading; one that stopped is closed alone at 4x this.
    #[arg(long, default_value_t = 16 << 20, allow_negative_numbers = true, value_parser = go_int)]
    pub frontend_queue_limit_bytes: i64,
    /// Beyond upstream: how long a tunnel's full queue may go without its frontend taking
    /// anything before the tunnel is closed.
    #[arg(long, default_value = "30s", allow_hyphen_values = true)]
    pub frontend_queue_stall_timeout: GoDuration,
    /// Beyond upstream: bytes queued toward all frontends together. Past it, the tunnels whose
    /// frontends are not reading are closed, most bytes first; readers are held to a fair share.
    #[arg(long, default_value_t = 256 << 20, allow_negative_numbers = true)]
    pub frontend_queue_budget_bytes: i64,

    // --- agents ---
    /// Agent port (always TLS).
    #[arg(long, default_value_t = 8091, allow_negative_numbers = true, value_parser = go_int)]
    pub agent_port: i64,
    /// Agent bind address. Empty means all interfaces.
    #[arg(long, default_value = "")]
    pub agent_bind_address: String,
    /// Agent-port TLS certificate.
    #[arg(long, default_value = "")]
    pub cluster_cert: String,
    /// Agent-port TLS key.
    #[arg(long, default_value = "")]
    pub cluster_key: String,
    /// CA that verifies agent client certificates. When set, agents must present one.
    #[arg(long, default_value = "")]
    pub cluster_ca_cert: String,
    /// Agent gRPC keepalive ping interval.
    #[arg(long, default_value = "1h0m0s")]
    pub keepalive_time: GoDuration,
    /// Timeout for sending DIAL_REQ to an agent and for its DIAL_RSP. 0 disables it.
    #[arg(long, default_value = "0s", allow_hyphen_values = true)]
    pub backend_dial_timeout: GoDuration,
    /// Beyond upstream: how often each agent connection is sent an HTTP/2 PING to learn that
    /// the agent still answers, whatever --keepalive-time says. 0 turns the check off.
    #[arg(long, default_value = "5s", allow_hyphen_values = true)]
    pub agent_ping_interval: GoDuration,
    /// Beyond upstream: a DIAL_REQ unanswered this long sends its agent a PING at once.
    #[arg(long, default_value = "500ms", allow_hyphen_values = true)]
    pub agent_ping_dial_wait: GoDuration,
    /// Beyond upstream: an agent whose PING is unanswered this long gets no new dials while
    /// another agent can take them, and its pending dials are retried once on another agent.
    #[arg(long, default_value = "1.5s", allow_hyphen_values = true)]
    pub agent_suspect_timeout: GoDuration,
    /// Beyond upstream: an agent whose PING is unanswered this long is retired: its
    /// connection closed, its pending dials answered with an error, its tunnels closed.
    #[arg(long, default_value = "10s", allow_hyphen_values = true)]
    pub agent_retire_timeout: GoDuration,
    /// Strategies that pick an agent, in order: default, destHost, defaultRoute.
    #[arg(long, default_value = "default")]
    pub proxy_strategies: String,
    /// Per-stream queue size for packets in transit.
    #[arg(long, default_value_t = 10, allow_negative_numbers = true, value_parser = go_int)]
    pub xfr_channel_size: i64,
    /// Deprecated: has no effect.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool, action = ArgAction::Set, hide = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warn_on_channel_limit: Option<bool>,

    // --- destination policy ---
    /// Beyond upstream: the only destinations tunnels may reach: address ranges (10.0.0.0/8),
    /// addresses, or host names (*.svc.cluster.local matches any name under it), each with an
    /// optional :port or :low-high ([fd00::/8]:443 for IPv6). Comma separated, repeatable.
    /// Empty allows every destination the deny list does not name. A name is matched against
    /// name rules only: the server does not resolve it (the agent does).
    #[arg(long, value_delimiter = ',', action = ArgAction::Append)]
    #[serde(deserialize_with = "super::goflag::comma_list")]
    pub allow_destinations: Vec<String>,
    /// Beyond upstream: destinations no tunnel may reach, in the syntax of
    /// --allow-destinations; a match here wins over the allow list. A refused dial gets a
    /// DIAL_RSP error (gRPC) or 403 (HTTP CONNECT).
    #[arg(long, value_delimiter = ',', action = ArgAction::Append)]
    #[serde(deserialize_with = "super::goflag::comma_list")]
    pub deny_destinations: Vec<String>,

    // --- TLS policy (agent and TCP frontend) ---
    /// Allowed TLS 1.2 cipher suites, by Go name; comma separated, repeatable.
    #[arg(long, value_delimiter = ',', action = ArgAction::Append)]
    #[serde(deserialize_with = "super::goflag::comma_list")]
    pub cipher_suites: Vec<String>,
    /// Minimum TLS version: VersionTLS10, VersionTLS11, VersionTLS12, VersionTLS13. Empty means TLS 1.2.
    #[arg(long, default_value = "")]
    pub tls_min_version: String,

    // --- identity and HA ---
    /// This server's unique id, sent to agents. Also from PROXY_SERVER_ID; default a fresh UUID.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_id: Option<String>,
    /// Number of proxy-server instances agents should connect to.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = go_int)]
    pub server_count: i64,
    /// Publish and garbage-collect proxy-server leases.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub enable_lease_controller: bool,
    /// Namespace of the lease objects.
    #[arg(long, default_value = "kube-system")]
    pub lease_namespace: String,
    /// Labels of the lease objects.
    #[arg(long, default_value = "k8s-app=konnectivity-server")]
    pub lease_label: String,

    // --- agent authentication ---
    /// Expected agent namespace (token authentication).
    #[arg(long, default_value = "")]
    pub agent_namespace: String,
    /// Expected agent service account (token authentication).
    #[arg(long, default_value = "")]
    pub agent_service_account: String,
    /// Expected token audience (token authentication).
    #[arg(long, default_value = "")]
    pub authentication_audience: String,
    /// Absolute path to a kubeconfig; empty means in-cluster configuration.
    #[arg(long, default_value = "")]
    pub kubeconfig: String,
    /// Beyond upstream: how long a successful TokenReview may be reused for the same token
    /// (never past the token's expiry); 0 disables the cache.
    #[arg(long, default_value = "1m0s", allow_hyphen_values = true)]
    pub agent_token_cache_ttl: GoDuration,
    /// Kubernetes client QPS; 0 means the client default.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true, value_parser = go_float32)]
    pub kubeconfig_qps: f32,
    /// Kubernetes client burst; 0 means the client default.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = go_int)]
    pub kubeconfig_burst: i64,
    /// Content type of requests to the API server.
    #[arg(long, default_value = "application/vnd.kubernetes.protobuf")]
    pub kube_api_content_type: String,

    // --- health and admin ---
    /// Health port (/healthz, /readyz, /metrics).
    #[arg(long, default_value_t = 8092, allow_negative_numbers = true, value_parser = go_int)]
    pub health_port: i64,
    /// Health bind address. Empty means all interfaces.
    #[arg(long, default_value = "")]
    pub health_bind_address: String,
    /// Admin port (/metrics, profiling).
    #[arg(long, default_value_t = 8095, allow_negative_numbers = true, value_parser = go_int)]
    pub admin_port: i64,
    /// Admin bind address. Empty means ALL interfaces (as upstream does, whatever its help says).
    #[arg(long, default_value = "127.0.0.1")]
    pub admin_bind_address: String,
    /// Serve profiling endpoints on the admin port.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub enable_profiling: bool,
    /// Contention profiling; requires --enable-profiling.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub enable_contention_profiling: bool,
    /// Beyond upstream: let the admin port close one tunnel (POST /tunnels/ID/close); without
    /// it such a request is refused with 403. Reloadable.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub enable_tunnel_close: bool,

    // --- lifecycle ---
    /// How long live tunnels may run after SIGTERM before they are closed. 0 closes at once.
    #[arg(long, default_value = "0s", allow_hyphen_values = true)]
    pub graceful_shutdown_timeout: GoDuration,
    /// Beyond upstream: for this long after start, a dial that finds no agent waits for one
    /// to connect (within --backend-dial-timeout) instead of failing at once. 0 disables it.
    #[arg(long, default_value = "0s", allow_hyphen_values = true)]
    pub startup_dial_grace: GoDuration,

    // --- beyond upstream ---
    /// Reload when the config file or a certificate, key or CA file changes.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub watch_files: bool,
    /// Where logs go: auto (journald when run by systemd, else stderr), journald, stderr.
    #[arg(long, default_value = "auto")]
    pub log_format: LogFormat,

    // --- klog flags: accepted for drop-in compatibility ---
    /// Log verbosity (klog levels: 0-4 info, 5 debug, 6+ trace).
    /// Negative levels are accepted, as klog does, and log like 0.
    #[arg(short = 'v', long = "v", default_value_t = 4, value_name = "Level", value_parser = go_level, allow_negative_numbers = true)]
    #[serde(deserialize_with = "level")]
    pub v: u32,
    /// Per-file verbosity, pattern=N,...: glob patterns on source file names without `.rs`, as klog.
    #[arg(long, default_value = "")]
    pub vmodule: String,
    /// Log to stderr (or journald under systemd); false uses --log-file or --log-dir.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub logtostderr: bool,
    /// With a log file: also log to stderr.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub alsologtostderr: bool,
    /// Accepted for compatibility; no effect.
    #[arg(long, default_value = "", value_name = "severity")]
    pub alsologtostderrthreshold: String,
    /// Accepted for compatibility; no effect.
    #[arg(long, default_value = "2", value_name = "severity")]
    pub stderrthreshold: String,
    /// Accepted for compatibility; no effect.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub legacy_stderr_threshold_behavior: bool,
    /// Accepted for compatibility; no effect.
    #[arg(long, default_value = ":0", value_name = "traceLocation")]
    pub log_backtrace_at: String,
    /// With --logtostderr=false: write logs to <dir>/konnectivity-server.log.
    #[arg(long, default_value = "")]
    pub log_dir: String,
    /// With --logtostderr=false: write logs to this file.
    #[arg(long, default_value = "")]
    pub log_file: String,
    /// The log file starts over at this many MB; 0 is unlimited.
    #[arg(long, default_value_t = 1800, value_parser = go_uint)]
    pub log_file_max_size: u64,
    /// Accepted for compatibility; no effect.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub add_dir_header: bool,
    /// Accepted for compatibility; no effect.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub skip_headers: bool,
    /// Accepted for compatibility; no effect.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub skip_log_headers: bool,
    /// Accepted for compatibility; no effect.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub one_output: bool,

    // --- beyond upstream: more frontends (config file only) ---
    /// `[[frontend]]` tables: frontends served besides the one the flags describe (which is
    /// always the first). Last, so TOML writes these tables after every plain key.
    #[arg(skip)]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub frontend: Vec<super::frontends::FrontendOptions>,
}

impl Default for Options {
    /// The built-in defaults: exactly what an empty command line gives.
    fn default() -> Self {
        Options::try_parse_from(["konnectivity-server"]).expect("defaults parse")
    }
}

impl super::layered::Layered for Options {
    const PROGRAM: &'static str = "konnectivity-server";
    const ENV_PREFIX: &'static str = "KONNECTIVITY_SERVER_";
    const DEFAULT_CONFIG_PATH: &'static str = "/etc/konnectivity/server.toml";
    const ID_VARIABLE: (&'static str, &'static str) = ("PROXY_SERVER_ID", "server_id");
    const OPTIONAL_KEYS: &'static [(&'static str, bool)] =
        &[("server_id", false), ("warn_on_channel_limit", true)];

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

    fn after_load(&self, warnings: &mut Vec<String>) {
        use super::TlsVersion;
        if let Ok(version @ (TlsVersion::Tls10 | TlsVersion::Tls11)) =
            super::parse_tls_version(&self.tls_min_version)
        {
            let name = if version == TlsVersion::Tls10 {
                "1.0"
            } else {
                "1.1"
            };
            warnings.push(format!(
                "--tls-min-version={} asks for TLS {name}, which is insecure (RFC 8996) and not \
                 implemented here: TLS 1.2 is the lowest version served",
                self.tls_min_version
            ));
        }
    }
}

impl Options {
    /// Parses a command line (the first item is the program name).
    pub fn parse_from_args<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        Options::try_parse_from(args)
    }
}
