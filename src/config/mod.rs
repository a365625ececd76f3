//! Configuration: the command line (every upstream flag), upstream's validation rules in
//! upstream's order, and the typed, immutable [`Config`] the server runs on.

mod duration;
mod flags;
pub mod goflag;
mod layered;
pub mod layers;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use duration::{GoDuration, ParseDurationError};
pub use flags::Options;
pub use layered::Layered;
pub use layers::{CommandLine, ConfigError};

/// The frontend protocol (`--mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Grpc,
    HttpConnect,
}

/// How an agent is picked for a dial (`--proxy-strategies`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Strategy {
    Default,
    DestHost,
    DefaultRoute,
}

impl Strategy {
    /// The name used on the command line and in the `proxy_strategy` metric label.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Default => "default",
            Strategy::DestHost => "destHost",
            Strategy::DefaultRoute => "defaultRoute",
        }
    }
}

/// A validation failure, worded exactly as upstream words it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct ValidationError(pub String);

/// Parses `--proxy-strategies` as upstream: comma separated, empty items skipped, names
/// case-sensitive, duplicates kept.
pub fn parse_proxy_strategies(text: &str) -> Result<Vec<Strategy>, String> {
    let mut strategies = Vec::new();
    for item in text.split(',').filter(|item| !item.is_empty()) {
        strategies.push(match item {
            "default" => Strategy::Default,
            "destHost" => Strategy::DestHost,
            "defaultRoute" => Strategy::DefaultRoute,
            other => return Err(format!("unknown proxy strategy: {other}")),
        });
    }
    if strategies.is_empty() {
        return Err("proxy strategies cannot be empty".to_string());
    }
    Ok(strategies)
}

/// The TLS versions `--tls-min-version` accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum TlsVersion {
    Tls10,
    Tls11,
    Tls12,
    Tls13,
}

pub fn parse_tls_version(text: &str) -> Result<TlsVersion, String> {
    Ok(match text {
        "VersionTLS10" => TlsVersion::Tls10,
        "VersionTLS11" => TlsVersion::Tls11,
        "VersionTLS12" | "" => TlsVersion::Tls12,
        "VersionTLS13" => TlsVersion::Tls13,
        other => return Err(format!(
            "unsupported TLS version {other:?}, supported values are: VersionTLS10, VersionTLS11, VersionTLS12, VersionTLS13"
        )),
    })
}

/// The smallest per-tunnel queue limit: one maximum-size gRPC message must fit.
pub const MIN_FRONTEND_QUEUE_BYTES: i64 = 4 << 20;

/// Cipher suite names Go's `tls.CipherSuites()` lists (the ones upstream accepts). Since Go
/// 1.26, which upstream builds with, the `TLS_RSA_*` suites are in `InsecureCipherSuites()`
/// instead, so upstream refuses them at validation.
pub const GO_ACCEPTED_CIPHER_SUITES: &[&str] = &[
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
];

fn check_exists(path: &str, what: &str) -> Result<(), ValidationError> {
    match std::fs::metadata(path) {
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Err(ValidationError(format!(
            "error checking {what} {path}, got stat {path}: no such file or directory"
        ))),
        _ => Ok(()),
    }
}

fn check_pair(key: &str, cert: &str, prefix: &str) -> Result<(), ValidationError> {
    if !key.is_empty() {
        check_exists(key, &format!("{prefix} key"))?;
        if cert.is_empty() {
            return Err(ValidationError(format!(
                "cannot have {prefix} cert empty when {prefix} key is set to {key:?}"
            )));
        }
    }
    if !cert.is_empty() {
        check_exists(cert, &format!("{prefix} cert"))?;
        if key.is_empty() {
            return Err(ValidationError(format!(
                "cannot have {prefix} key empty when {prefix} cert is set to {cert:?}"
            )));
        }
    }
    Ok(())
}

fn check_port(port: i64, what: &str, reserved_allowed: bool) -> Result<(), ValidationError> {
    if port > 49151 {
        return Err(ValidationError(format!(
            "please do not try to use ephemeral port {port} for the {what} port"
        )));
    }
    if port < 1024 && !reserved_allowed {
        return Err(ValidationError(format!(
            "please do not try to use reserved port {port} for the {what} port"
        )));
    }
    Ok(())
}

impl Options {
    /// Upstream's `Validate()`: the same rules, messages and order; the first failure wins.
    pub fn validate(&self) -> Result<(), ValidationError> {
        let fail = |msg: String| Err(ValidationError(msg));
        check_pair(&self.server_key, &self.server_cert, "server")?;
        if !self.server_ca_cert.is_empty() {
            check_exists(&self.server_ca_cert, "server CA cert")?;
        }
        check_pair(&self.cluster_key, &self.cluster_cert, "cluster")?;
        if !self.cluster_ca_cert.is_empty() {
            check_exists(&self.cluster_ca_cert, "cluster CA cert")?;
        }
        if self.mode != "grpc" && self.mode != "http-connect" {
            return fail(format!(
                "mode must be set to either 'grpc' or 'http-connect' not {:?}",
                self.mode
            ));
        }
        let uds = !self.uds_name.is_empty();
        if uds {
            if self.server_port != 0 {
                return fail(format!(
                    "server port should be set to 0 not {} for UDS",
                    self.server_port
                ));
            }
            for (value, name) in [
                (&self.server_key, "server key"),
                (&self.server_cert, "server cert"),
                (&self.server_ca_cert, "server ca cert"),
            ] {
                if !value.is_empty() {
                    return fail(format!("{name} should not be set for UDS"));
                }
            }
        } else if self.server_ca_cert.is_empty() {
            return fail("server ca cert must be set when in TCP mode (uds-name is empty)".into());
        }
        for (port, name) in [
            (self.server_port, "server"),
            (self.agent_port, "agent"),
            (self.admin_port, "admin"),
            (self.health_port, "health"),
        ] {
            check_port(port, name, false).or_else(|e| {
                // The frontend port may be "reserved" (0) when it is not used: UDS mode.
                if name == "server" && uds && port <= 49151 {
                    Ok(())
                } else {
                    Err(e)
                }
            })?;
        }
        if self.enable_contention_profiling && !self.enable_profiling {
            return fail(
                "if --enable-contention-profiling is set, --enable-profiling must also be set"
                    .into(),
            );
        }
        let token_auth = !self.agent_namespace.is_empty()
            || !self.agent_service_account.is_empty()
            || !self.authentication_audience.is_empty();
        if token_auth {
            if !self.cluster_ca_cert.is_empty() {
                return fail(
                    "--cluster-ca-cert can not be used when agent authentication is enabled".into(),
                );
            }
            for (value, flag) in [
                (&self.agent_namespace, "--agent-namespace"),
                (&self.agent_service_account, "--agent-service-account"),
                (&self.authentication_audience, "--authentication-audience"),
            ] {
                if value.is_empty() {
                    return fail(format!(
                        "{flag} cannot be empty when agent authentication is enabled"
                    ));
                }
            }
        }
        if !self.kubeconfig.is_empty() && !Path::new(&self.kubeconfig).exists() {
            return fail(format!(
                "checking KubeconfigPath {:?}, got stat {}: no such file or directory",
                self.kubeconfig, self.kubeconfig
            ));
        }
        if self.proxy_strategies.is_empty() {
            return fail("ProxyStrategies cannot be empty".into());
        }
        if let Err(err) = parse_proxy_strategies(&self.proxy_strategies) {
            return fail(format!("invalid proxy strategies: {err}"));
        }
        if self.xfr_channel_size <= 0 {
            return fail(format!(
                "channel size {} must be greater than 0",
                self.xfr_channel_size
            ));
        }
        // The help text of the release we replace documents 0 as "no queue", so only
        // negative values are refused here.
        if self.frontend_write_channel_size < 0 {
            return fail(format!(
                "frontend write channel size {} must be greater than or equal to 0",
                self.frontend_write_channel_size
            ));
        }
        if self.frontend_queue_limit_bytes < MIN_FRONTEND_QUEUE_BYTES {
            return fail(format!(
                "frontend-queue-limit-bytes {} must be at least {MIN_FRONTEND_QUEUE_BYTES} (one 4 MiB message)",
                self.frontend_queue_limit_bytes
            ));
        }
        if self.frontend_queue_budget_bytes < self.frontend_queue_limit_bytes {
            return fail(format!(
                "frontend-queue-budget-bytes {} must be at least frontend-queue-limit-bytes ({})",
                self.frontend_queue_budget_bytes, self.frontend_queue_limit_bytes
            ));
        }
        if self.frontend_queue_stall_timeout.0 <= 0 {
            return fail(format!(
                "frontend-queue-stall-timeout must be > 0, got {}",
                self.frontend_queue_stall_timeout
            ));
        }
        parse_tls_version(&self.tls_min_version).map_err(ValidationError)?;
        // `--cipher-suites=` is pflag's empty list (clap reads it as one empty item).
        for suite in self.cipher_suites.iter().filter(|s| !s.is_empty()) {
            if !GO_ACCEPTED_CIPHER_SUITES.contains(&suite.as_str()) {
                return fail(format!(
                    "cipher suite {suite} not supported, doesn't exist or considered as insecure"
                ));
            }
        }
        if self.enable_lease_controller {
            parse_labels(&self.lease_label).map_err(ValidationError)?;
        }
        if !matches!(self.log_format.as_str(), "auto" | "journald" | "stderr") {
            return fail(format!(
                "log-format must be one of auto, journald, stderr, not {:?}",
                self.log_format
            ));
        }
        if self.graceful_shutdown_timeout.is_negative() {
            return fail(format!(
                "graceful-shutdown-timeout must be >= 0, got {}",
                self.graceful_shutdown_timeout
            ));
        }
        if self.startup_dial_grace.is_negative() {
            return fail(format!(
                "startup-dial-grace must be >= 0, got {}",
                self.startup_dial_grace
            ));
        }
        for (name, value) in [
            ("agent-ping-interval", self.agent_ping_interval),
            ("agent-ping-dial-wait", self.agent_ping_dial_wait),
            ("agent-suspect-timeout", self.agent_suspect_timeout),
            ("agent-retire-timeout", self.agent_retire_timeout),
        ] {
            if value.is_negative() {
                return fail(format!("{name} must be >= 0, got {value}"));
            }
        }
        if self.agent_ping_interval.0 > 0
            && (self.agent_suspect_timeout.0 <= 0
                || self.agent_retire_timeout.0 <= self.agent_suspect_timeout.0)
        {
            return fail(format!(
                "agent-retire-timeout ({}) must be longer than agent-suspect-timeout ({}), which must be > 0",
                self.agent_retire_timeout, self.agent_suspect_timeout
            ));
        }
        if self.backend_dial_timeout.is_negative() {
            return fail(format!(
                "backend-dial-timeout must be >= 0, got {}",
                self.backend_dial_timeout
            ));
        }
        // Upstream parses the lease labels on every start, lease controller or not, and
        // refuses to run when they do not parse (`--lease-label=` gives "empty string
        // provided"); it does so after validation, so this comes last.
        if !self.enable_lease_controller {
            parse_labels(&self.lease_label).map_err(ValidationError)?;
        }
        Ok(())
    }
}

/// Parses `k=v,k2=v2` lease labels as upstream: pairs trimmed of whitespace.
pub fn parse_labels(text: &str) -> Result<BTreeMap<String, String>, String> {
    if text.trim().is_empty() {
        return Err("empty string provided".into());
    }
    text.split(',')
        .map(|pair| match pair.trim().split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => {
                Ok((k.trim().to_string(), v.trim().to_string()))
            }
            _ => Err(format!("invalid label format: {pair}")),
        })
        .collect()
}

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

/// Where the frontend listens.
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
    pub mode: Mode,
    pub frontend_addr: FrontendAddr,
    pub agent_addr: SocketAddr,
    pub health_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub server_cert: Option<PathBuf>,
    pub server_key: Option<PathBuf>,
    pub server_ca_cert: Option<PathBuf>,
    pub cluster_cert: Option<PathBuf>,
    pub cluster_key: Option<PathBuf>,
    pub cluster_ca_cert: Option<PathBuf>,
    pub cipher_suites: Vec<String>,
    pub tls_min_version: TlsVersion,
    pub server_id: String,
    pub server_count: i64,
    pub proxy_strategies: Vec<Strategy>,
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

/// Where logs go (`--log-format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// journald when systemd connected our output to the journal, else stderr.
    Auto,
    Journald,
    Stderr,
}

/// The one place that says which settings a reload may change. Everything listed here keeps
/// its running value on reload (with a warning naming it); every other field of [`Config`]
/// applies on reload: certificates, keys and CAs, cipher suites, the TLS minimum version,
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
    mode,
    frontend_addr,
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
        options.validate()?;
        let mode = if options.mode == "grpc" {
            Mode::Grpc
        } else {
            Mode::HttpConnect
        };
        let frontend_addr = if options.uds_name.is_empty() {
            FrontendAddr::Tcp(bind_addr(
                &options.server_bind_address,
                options.server_port,
            )?)
        } else {
            FrontendAddr::Uds {
                path: PathBuf::from(&options.uds_name),
                delete_existing: options.delete_existing_uds_file,
            }
        };
        let nonzero = |d: GoDuration| (d.0 > 0).then(|| d.to_std());
        Ok(Config {
            mode,
            frontend_addr,
            agent_addr: bind_addr(&options.agent_bind_address, options.agent_port)?,
            health_addr: bind_addr(&options.health_bind_address, options.health_port)?,
            admin_addr: bind_addr(&options.admin_bind_address, options.admin_port)?,
            server_cert: non_empty(&options.server_cert),
            server_key: non_empty(&options.server_key),
            server_ca_cert: non_empty(&options.server_ca_cert),
            cluster_cert: non_empty(&options.cluster_cert),
            cluster_key: non_empty(&options.cluster_key),
            cluster_ca_cert: non_empty(&options.cluster_ca_cert),
            cipher_suites: options
                .cipher_suites
                .iter()
                .filter(|s| !s.is_empty())
                .cloned()
                .collect(),
            tls_min_version: parse_tls_version(&options.tls_min_version)
                .map_err(ValidationError)?,
            server_id: options
                .server_id
                .clone()
                .filter(|id| !id.is_empty())
                .unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
            server_count: options.server_count,
            proxy_strategies: parse_proxy_strategies(&options.proxy_strategies)
                .map_err(ValidationError)?,
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
            lease_labels: if options.enable_lease_controller {
                parse_labels(&options.lease_label).map_err(ValidationError)?
            } else {
                BTreeMap::new()
            },
            verbosity: options.v,
            vmodule: options.vmodule.clone(),
            log_format: match options.log_format.as_str() {
                "journald" => LogFormat::Journald,
                "stderr" => LogFormat::Stderr,
                _ => LogFormat::Auto,
            },
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
