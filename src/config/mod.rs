//! Configuration: the command line (every upstream flag), upstream's validation rules in
//! upstream's order, and the typed, immutable [`Config`] the server runs on.

mod duration;
mod flags;
mod frontends;
pub mod goflag;
mod layered;
pub mod layers;
pub mod pflag;
mod quantity;
mod validate;
mod values;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use duration::{GoDuration, ParseDurationError};
pub use flags::Options;
pub use frontends::{Frontend, FrontendOptions, FIRST_FRONTEND};
pub use layered::{ConfigError, FileLayer, Layered};
pub use layers::CommandLine;
pub use quantity::Quantity;
pub use validate::{GO_ACCEPTED_CIPHER_SUITES, MIN_FRONTEND_QUEUE_BYTES};
pub use values::{
    parse_labels, parse_proxy_strategies, parse_tls_version, LogFormat, Mode, Strategy, TlsVersion,
};

/// A validation failure, worded exactly as upstream words it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct ValidationError(pub String);

fn non_empty(path: &str) -> Option<PathBuf> {
    (!path.is_empty()).then(|| PathBuf::from(path))
}

/// A bind address as upstream forms it: `host:port`, with an empty host meaning every
/// interface (dual-stack). A host name is resolved as Go's `net.Listen` resolves it: the first
/// IPv4 address, else the first address.
fn bind_addr(host: &str, port: i64) -> Result<SocketAddr, ValidationError> {
    let port = u16::try_from(port).map_err(|_| ValidationError(format!("invalid port {port}")))?;
    if host.is_empty() {
        return Ok(SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port));
    }
    let trimmed = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = trimmed.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    use std::net::ToSocketAddrs;
    let resolved: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| {
            ValidationError(format!(
                "failed to listen on {host}:{port}: lookup {host}: {e}"
            ))
        })?
        .collect();
    resolved
        .iter()
        .find(|addr| addr.is_ipv4())
        .or(resolved.first())
        .copied()
        .ok_or_else(|| {
            ValidationError(format!(
                "failed to listen on {host}:{port}: lookup {host}: no such host"
            ))
        })
}

/// Where a frontend listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FrontendAddr {
    Uds {
        path: PathBuf,
        delete_existing: bool,
    },
    Tcp(SocketAddr),
}

/// The validated, typed configuration. Plain data: certificates are referred to by path and
/// loaded into the TLS snapshot, so Debug never prints key material.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Never empty: the flags' frontend first (named [`FIRST_FRONTEND`]), then the
    /// `[[frontend]]` tables in order.
    pub frontends: Vec<Frontend>,
    pub agent_addr: SocketAddr,
    pub health_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub cluster_cert: Option<PathBuf>,
    pub cluster_key: Option<PathBuf>,
    pub cluster_ca_cert: Option<PathBuf>,
    pub cipher_suites: Vec<String>,
    pub tls_min_version: TlsVersion,
    pub server_id: String,
    pub server_count: i64,
    pub proxy_strategies: Vec<Strategy>,
    /// Which destinations tunnels may reach (empty lists: all, as upstream).
    pub destinations: crate::policy::Policy,
    pub xfr_channel_size: usize,
    pub frontend_write_channel_size: usize,
    pub frontend_queue_limit_bytes: usize,
    pub frontend_queue_stall_timeout: Duration,
    pub frontend_queue_budget_bytes: usize,
    pub keepalive_time: Duration,
    pub frontend_keepalive_time: Duration,
    /// None when disabled (0).
    pub backend_dial_timeout: Option<Duration>,
    /// None when --agent-ping-interval is 0.
    pub agent_liveness: Option<AgentLiveness>,
    pub graceful_shutdown_timeout: Duration,
    pub startup_dial_grace: Duration,
    pub enable_profiling: bool,
    /// The admin port may close a tunnel (`POST /tunnels/ID/close`); read per request.
    pub enable_tunnel_close: bool,
    /// Agents authenticate with a service-account token (--agent-namespace set).
    pub token_auth: bool,
    pub agent_namespace: String,
    pub agent_service_account: String,
    pub authentication_audience: String,
    pub agent_token_cache_ttl: Duration,
    /// None: in-cluster configuration.
    pub kubeconfig: Option<PathBuf>,
    pub kubeconfig_qps: f32,
    pub kubeconfig_burst: i64,
    pub enable_lease_controller: bool,
    pub lease_namespace: String,
    pub lease_labels: BTreeMap<String, String>,
    pub verbosity: u32,
    pub vmodule: String,
    pub log_format: LogFormat,
    pub watch_files: bool,
    /// The config file in use, watched for changes.
    pub config_file: Option<PathBuf>,
}

/// How the server learns that an agent stopped answering (`--agent-ping-*`,
/// `--agent-suspect-timeout`, `--agent-retire-timeout`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AgentLiveness {
    /// A PING this long after the last answer.
    pub interval: Duration,
    /// A PING as soon as a dial waited this long.
    pub dial_wait: Duration,
    /// Unanswered this long: no new dials, pending ones retried elsewhere.
    pub suspect_after: Duration,
    /// Unanswered this long: retired.
    pub retire_after: Duration,
}

/// The one place that says which settings a reload may change. Everything listed here keeps
/// its running value on reload (with a warning naming it), and so do the frontends' names,
/// protocols and addresses (`frontends`, whose TLS files still reload); every other field of
/// [`Config`] applies on reload: certificates, keys and CAs, cipher suites, the TLS minimum version,
/// proxy strategies, the backend dial timeout, server count, queue sizes, the drain timeout,
/// log verbosity, and file watching.
macro_rules! restart_only_settings {
    ($($field:ident),* $(,)?) => {
        /// Settings that need a restart.
        pub const RESTART_ONLY_SETTINGS: &[&str] = &[$(stringify!($field)),*];

        impl Config {
            /// Keeps `running`'s value for every restart-only setting and names those that
            /// differed, so nothing is half-applied.
            pub fn keep_restart_only(&mut self, running: &Config) -> Vec<&'static str> {
                let mut kept = Vec::new();
                if frontends::keep_running(&mut self.frontends, &running.frontends) {
                    kept.push("frontends");
                }
                $(
                    if self.$field != running.$field {
                        kept.push(stringify!($field));
                        self.$field = running.$field.clone();
                    }
                )*
                kept
            }
        }
    };
}

restart_only_settings!(
    agent_addr,
    health_addr,
    admin_addr,
    keepalive_time,
    frontend_keepalive_time,
    server_id,
    enable_profiling,
    log_format,
    token_auth,
    kubeconfig,
    kubeconfig_qps,
    kubeconfig_burst,
    enable_lease_controller,
    lease_namespace,
    lease_labels,
    agent_token_cache_ttl,
);

impl Config {
    /// Validates `options` as upstream does, then builds the typed configuration.
    pub fn from_options(options: &Options) -> Result<Config, ValidationError> {
        let checked = options.check()?;
        let agent_addr = bind_addr(&options.agent_bind_address, options.agent_port)?;
        let health_addr = bind_addr(&options.health_bind_address, options.health_port)?;
        let admin_addr = bind_addr(&options.admin_bind_address, options.admin_port)?;
        let frontends = frontends::frontends(
            options,
            checked.mode,
            &[
                ("the agent port", agent_addr),
                ("the health port", health_addr),
                ("the admin port", admin_addr),
            ],
        )?;
        let nonzero = |d: GoDuration| (d.0 > 0).then(|| d.to_std());
        Ok(Config {
            frontends,
            agent_addr,
            health_addr,
            admin_addr,
            cluster_cert: non_empty(&options.cluster_cert),
            cluster_key: non_empty(&options.cluster_key),
            cluster_ca_cert: non_empty(&options.cluster_ca_cert),
            cipher_suites: options
                .cipher_suites
                .iter()
                .filter(|s| !s.is_empty())
                .cloned()
                .collect(),
            tls_min_version: checked.tls_min_version,
            server_id: options
                .server_id
                .clone()
                .filter(|id| !id.is_empty())
                .unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
            server_count: options.server_count,
            proxy_strategies: checked.proxy_strategies,
            destinations: checked.destinations,
            xfr_channel_size: options.xfr_channel_size as usize,
            frontend_write_channel_size: options.frontend_write_channel_size as usize,
            frontend_queue_limit_bytes: options.frontend_queue_limit_bytes as usize,
            frontend_queue_stall_timeout: options.frontend_queue_stall_timeout.to_std(),
            frontend_queue_budget_bytes: options.frontend_queue_budget_bytes as usize,
            keepalive_time: options.keepalive_time.to_std(),
            frontend_keepalive_time: options.frontend_keepalive_time.to_std(),
            backend_dial_timeout: nonzero(options.backend_dial_timeout),
            agent_liveness: nonzero(options.agent_ping_interval).map(|interval| AgentLiveness {
                interval,
                dial_wait: options.agent_ping_dial_wait.to_std(),
                suspect_after: options.agent_suspect_timeout.to_std(),
                retire_after: options.agent_retire_timeout.to_std(),
            }),
            graceful_shutdown_timeout: options.graceful_shutdown_timeout.to_std(),
            startup_dial_grace: options.startup_dial_grace.to_std(),
            enable_profiling: options.enable_profiling,
            enable_tunnel_close: options.enable_tunnel_close,
            token_auth: !options.agent_namespace.is_empty(),
            agent_namespace: options.agent_namespace.clone(),
            agent_service_account: options.agent_service_account.clone(),
            authentication_audience: options.authentication_audience.clone(),
            agent_token_cache_ttl: options.agent_token_cache_ttl.to_std(),
            kubeconfig: non_empty(&options.kubeconfig),
            kubeconfig_qps: options.kubeconfig_qps,
            kubeconfig_burst: options.kubeconfig_burst,
            enable_lease_controller: options.enable_lease_controller,
            lease_namespace: options.lease_namespace.clone(),
            lease_labels: checked.lease_labels,
            verbosity: options.v,
            vmodule: options.vmodule.clone(),
            log_format: options.log_format,
            watch_files: options.watch_files,
            config_file: options.config.clone(),
        })
    }

    /// A configuration for tests and embedding: upstream defaults with a UDS frontend and the
    /// given agent TLS files.
    pub fn for_uds(uds: &Path, cert: &Path, key: &Path, ca: Option<&Path>) -> Config {
        let mut args: Vec<String> = vec![
            "konnectivity-server".into(),
            format!("--uds-name={}", uds.display()),
            "--server-port=0".into(),
            format!("--cluster-cert={}", cert.display()),
            format!("--cluster-key={}", key.display()),
        ];
        if let Some(ca) = ca {
            args.push(format!("--cluster-ca-cert={}", ca.display()));
        }
        let options = Options::parse_from_args(args).expect("built-in arguments parse");
        Config::from_options(&options).expect("built-in arguments validate")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Options {
        let mut full = vec!["konnectivity-server"];
        full.extend_from_slice(args);
        Options::parse_from_args(full).unwrap()
    }

    #[test]
    fn pflag_semantics() {
        let o = parse(&[
            "--server-count",
            "3",
            "--server-count=5",
            "--delete-existing-uds-file=false",
            "--enable-profiling",
            "--cipher-suites=A,B",
            "--cipher-suites",
            "C",
            "--backend-dial-timeout=-1s",
            "-v=7",
        ]);
        assert_eq!(o.server_count, 5, "last repeat wins");
        assert!(!o.delete_existing_uds_file);
        assert!(o.enable_profiling);
        assert_eq!(o.cipher_suites, ["A", "B", "C"], "lists accumulate");
        assert_eq!(o.backend_dial_timeout, GoDuration(-1_000_000_000));
        assert_eq!(o.v, 7);
    }

    #[test]
    fn an_empty_list_flag_is_an_empty_list_as_in_pflag() {
        // Upstream's own test framework passes every flag, `--cipher-suites=` included.
        let o = parse(&[
            "--cipher-suites=",
            "--uds-name=/tmp/k.sock",
            "--server-port=0",
        ]);
        let config = Config::from_options(&o).expect("an empty --cipher-suites validates");
        assert!(config.cipher_suites.is_empty());
    }

    #[test]
    fn unknown_flag_is_named() {
        let err = Options::parse_from_args(["k", "--no-such-flag=1"]).unwrap_err();
        assert!(err.to_string().contains("--no-such-flag"), "{err}");
    }

    #[test]
    fn strategies_parse_like_upstream() {
        assert_eq!(
            parse_proxy_strategies("destHost,,default").unwrap(),
            [Strategy::DestHost, Strategy::Default]
        );
        assert_eq!(
            parse_proxy_strategies("desthost").unwrap_err(),
            "unknown proxy strategy: desthost"
        );
        assert_eq!(
            parse_proxy_strategies(",").unwrap_err(),
            "proxy strategies cannot be empty"
        );
    }

    #[test]
    fn upstream_messages_in_order() {
        let cases: &[(&[&str], &str)] = &[
            (&["--uds-name=/x"], "server port should be set to 0 not 8090 for UDS"),
            (&["--uds-name=/x", "--server-port=0", "--mode=tcp"],
             "mode must be set to either 'grpc' or 'http-connect' not \"tcp\""),
            (&[], "server ca cert must be set when in TCP mode (uds-name is empty)"),
            (&["--uds-name=/x", "--server-port=0", "--agent-port=50000"],
             "please do not try to use ephemeral port 50000 for the agent port"),
            (&["--uds-name=/x", "--server-port=0", "--health-port=80"],
             "please do not try to use reserved port 80 for the health port"),
            (&["--uds-name=/x", "--server-port=0", "--enable-contention-profiling"],
             "if --enable-contention-profiling is set, --enable-profiling must also be set"),
            (&["--uds-name=/x", "--server-port=0", "--agent-namespace=a"],
             "--agent-service-account cannot be empty when agent authentication is enabled"),
            (&["--uds-name=/x", "--server-port=0", "--proxy-strategies=x"],
             "invalid proxy strategies: unknown proxy strategy: x"),
            (&["--uds-name=/x", "--server-port=0", "--xfr-channel-size=0"],
             "channel size 0 must be greater than 0"),
            (&["--uds-name=/x", "--server-port=0", "--tls-min-version=TLS1"],
             "unsupported TLS version \"TLS1\", supported values are: VersionTLS10, VersionTLS11, VersionTLS12, VersionTLS13"),
            (&["--uds-name=/x", "--server-port=0", "--cipher-suites=TLS_RSA_WITH_RC4_128_SHA"],
             "cipher suite TLS_RSA_WITH_RC4_128_SHA not supported, doesn't exist or considered as insecure"),
            (&["--uds-name=/x", "--server-port=0", "--graceful-shutdown-timeout=-1s"],
             "graceful-shutdown-timeout must be >= 0, got -1s"),
            (&["--uds-name=/x", "--server-port=0", "--backend-dial-timeout=-1m30s"],
             "backend-dial-timeout must be >= 0, got -1m30s"),
            (&["--cluster-key=/nonexistent/k"],
             "error checking cluster key /nonexistent/k, got stat /nonexistent/k: no such file or directory"),
            // Two errors: the TLS-file check comes before the mode check.
            (&["--mode=bad", "--server-key=/nonexistent/k"],
             "error checking server key /nonexistent/k, got stat /nonexistent/k: no such file or directory"),
        ];
        for (args, message) in cases {
            let err = parse(args).validate().unwrap_err();
            assert_eq!(err.0, *message, "args {args:?}");
        }
    }
}
