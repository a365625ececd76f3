//! The agent's validated configuration: upstream's checks in upstream's order, with its
//! messages, then ours; every value typed once, here.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::options::AgentOptions;
use crate::config::{LogFormat, ValidationError};

/// How the counts from leases and from server responses combine (`--server-count-source`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CountSource {
    Default,
    Max,
}

/// The agent's client certificate and key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Limits on what may be queued toward destinations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueLimits {
    /// Past this, the receive loop waits briefly for a destination that is still reading.
    pub soft_bytes: usize,
    /// Past this, the tunnel is closed.
    pub hard_bytes: usize,
    /// A write that makes no progress for this long closes its tunnel.
    pub stall: Duration,
    /// All tunnels of the agent together.
    pub budget_bytes: usize,
}

/// grpc-go's floor under `--keepalive-time`.
const MIN_KEEPALIVE: Duration = Duration::from_secs(10);

/// Everything the agent runs on, immutable; a reload builds a new one.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentConfig {
    /// The TOML file this came from, if any (watched for reloads).
    pub config_file: Option<PathBuf>,
    pub ca_cert: PathBuf,
    pub identity: Option<Identity>,
    pub server_host: String,
    pub server_port: u16,
    /// Offered in this order; `h2` last when not named.
    pub alpn: Vec<Vec<u8>>,
    pub token_path: Option<PathBuf>,
    /// The HTTP/2 PING interval toward servers: --keepalive-time (floored at grpc-go's 10s)
    /// or --server-ping-interval, whichever is shorter.
    pub keepalive: Duration,
    /// A PING unanswered this long drops the server connection.
    pub keepalive_timeout: Duration,
    pub agent_id: String,
    /// Sent verbatim, as upstream does.
    pub identifiers: String,
    pub sync_interval: Duration,
    pub sync_interval_cap: Duration,
    pub sync_forever: bool,
    pub probe_interval: Duration,
    pub count_server_leases: bool,
    pub lease_namespace: String,
    pub lease_label: String,
    pub count_source: CountSource,
    pub kubeconfig: Option<PathBuf>,
    pub kube_api_content_type: String,
    pub xfr_channel_size: usize,
    pub warn_on_channel_limit: bool,
    pub queue: QueueLimits,
    pub dial_timeout: Duration,
    /// Which destinations this agent dials (empty lists: all, as upstream).
    pub destinations: crate::policy::Policy,
    /// `None`: drain until a second signal, as upstream.
    pub drain_timeout: Option<Duration>,
    pub health_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub enable_profiling: bool,
    pub watch_files: bool,
    pub log_format: LogFormat,
    pub verbosity: u32,
    pub vmodule: String,
}

fn invalid(message: impl Into<String>) -> ValidationError {
    ValidationError(message.into())
}

/// Go's `os.Stat` error text for a missing file.
fn check_exists(path: &str, what: impl FnOnce(String) -> String) -> Result<(), ValidationError> {
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(invalid(what(format!(
            "stat {path}: no such file or directory"
        )))),
        _ => Ok(()),
    }
}

/// `host:port` as Go's `net.JoinHostPort` would bind it; an empty host is every interface.
fn listen_addr(host: &str, port: i64, flag: &str) -> Result<SocketAddr, ValidationError> {
    let port =
        u16::try_from(port).map_err(|_| invalid(format!("{flag} {port} is out of range")))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Ok(SocketAddr::from(([0u8; 16], port)));
    }
    if host == "localhost" {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    host.parse::<std::net::IpAddr>()
        .map(|ip| SocketAddr::new(ip, port))
        .map_err(|_| invalid(format!("{flag}: {host:?} is not an IP address")))
}

impl AgentConfig {
    /// Validates options as upstream's `Validate()` does, in its order and with its messages.
    pub fn from_options(o: &AgentOptions) -> Result<AgentConfig, ValidationError> {
        if !o.agent_key.is_empty() {
            check_exists(&o.agent_key, |e| {
                format!("error checking agent key {}, got {e}", o.agent_key)
            })?;
            if o.agent_cert.is_empty() {
                return Err(invalid(format!(
                    "cannot have agent cert empty when agent key is set to {:?}",
                    o.agent_key
                )));
            }
        }
        if !o.agent_cert.is_empty() {
            check_exists(&o.agent_cert, |e| {
                format!("error checking agent cert {}, got {e}", o.agent_cert)
            })?;
            if o.agent_key.is_empty() {
                return Err(invalid(format!(
                    "cannot have agent key empty when agent cert is set to {:?}",
                    o.agent_cert
                )));
            }
        }
        if !o.ca_cert.is_empty() {
            check_exists(&o.ca_cert, |e| {
                format!("error checking agent CA cert {}, got {e}", o.ca_cert)
            })?;
        }
        if o.proxy_server_port <= 0 {
            return Err(invalid(format!(
                "proxy server port {} must be greater than 0",
                o.proxy_server_port
            )));
        }
        if o.health_server_port <= 0 {
            return Err(invalid(format!(
                "health server port {} must be greater than 0",
                o.health_server_port
            )));
        }
        if o.admin_server_port <= 0 {
            return Err(invalid(format!(
                "admin server port {} must be greater than 0",
                o.admin_server_port
            )));
        }
        if o.xfr_channel_size <= 0 {
            return Err(invalid(format!(
                "channel size {} must be greater than 0",
                o.xfr_channel_size
            )));
        }
        if o.enable_contention_profiling && !o.enable_profiling {
            return Err(invalid(
                "if --enable-contention-profiling is set, --enable-profiling must also be set",
            ));
        }
        if o.sync_interval.0 > o.sync_interval_cap.0 {
            return Err(invalid(format!(
                "sync interval {} must be less than sync interval cap {}",
                o.sync_interval, o.sync_interval_cap
            )));
        }
        if !o.service_account_token_path.is_empty() {
            check_exists(&o.service_account_token_path, |e| {
                format!(
                    "error checking service account token path {}, got {e}",
                    o.service_account_token_path
                )
            })?;
        }
        crate::identifiers::validate(&o.agent_identifiers)
            .map_err(|e| invalid(format!("agent address is invalid: {e}")))?;
        if !o.kubeconfig.is_empty() {
            check_exists(&o.kubeconfig, |e| {
                format!("error checking KubeconfigPath {:?}, got {e}", o.kubeconfig)
            })?;
        }
        if o.count_server_leases {
            check_labels(&o.lease_label)?;
        }
        let count_source = match o.server_count_source.as_str() {
            "" | "default" => CountSource::Default,
            "max" => CountSource::Max,
            other => {
                return Err(invalid(format!(
                    "--server-count-source must be one of '', 'default', 'max', got {other}"
                )))
            }
        };
        // Beyond upstream.
        let positive = |value: i64, flag: &str| {
            usize::try_from(value)
                .ok()
                .filter(|v| *v > 0)
                .ok_or_else(|| invalid(format!("{flag} {value} must be greater than 0")))
        };
        let soft_bytes = positive(o.endpoint_queue_limit_bytes, "--endpoint-queue-limit-bytes")?;
        let budget_bytes = positive(
            o.endpoint_queue_budget_bytes,
            "--endpoint-queue-budget-bytes",
        )?;
        if o.endpoint_queue_stall_timeout.is_negative() || o.endpoint_queue_stall_timeout.0 == 0 {
            return Err(invalid(format!(
                "--endpoint-queue-stall-timeout {} must be greater than 0",
                o.endpoint_queue_stall_timeout
            )));
        }
        if o.graceful_shutdown_timeout.is_negative() {
            return Err(invalid(format!(
                "--graceful-shutdown-timeout {} must not be negative",
                o.graceful_shutdown_timeout
            )));
        }
        if o.server_ping_interval.is_negative() {
            return Err(invalid(format!(
                "--server-ping-interval {} must not be negative",
                o.server_ping_interval
            )));
        }
        if o.server_ping_timeout.0 <= 0 {
            return Err(invalid(format!(
                "--server-ping-timeout {} must be greater than 0",
                o.server_ping_timeout
            )));
        }
        if o.endpoint_dial_timeout.is_negative() || o.endpoint_dial_timeout.0 == 0 {
            return Err(invalid(format!(
                "--endpoint-dial-timeout {} must be greater than 0",
                o.endpoint_dial_timeout
            )));
        }
        let log_format = o.log_format;
        let server_port = u16::try_from(o.proxy_server_port).map_err(|_| {
            invalid(format!(
                "proxy server port {} is out of range",
                o.proxy_server_port
            ))
        })?;
        let mut alpn: Vec<Vec<u8>> = o
            .alpn_proto
            .iter()
            .filter(|p| !p.is_empty())
            .map(|p| p.as_bytes().to_vec())
            .collect();
        if !alpn.iter().any(|p| p == b"h2") {
            alpn.push(b"h2".to_vec());
        }
        let path = |p: &str| (!p.is_empty()).then(|| PathBuf::from(p));
        let destinations =
            crate::policy::Policy::from_lists(&o.allow_destinations, &o.deny_destinations)
                .map_err(invalid)?;
        Ok(AgentConfig {
            destinations,
            config_file: o.config.clone(),
            // Upstream reads an empty --ca-cert as the current directory, and fails on it.
            ca_cert: if o.ca_cert.is_empty() {
                PathBuf::from(".")
            } else {
                PathBuf::from(&o.ca_cert)
            },
            identity: (!o.agent_cert.is_empty()).then(|| Identity {
                cert: PathBuf::from(&o.agent_cert),
                key: PathBuf::from(&o.agent_key),
            }),
            server_host: o.proxy_server_host.clone(),
            server_port,
            alpn,
            token_path: path(&o.service_account_token_path),
            keepalive: match o.server_ping_interval.to_std() {
                d if d.is_zero() => o.keepalive_time.to_std().max(MIN_KEEPALIVE),
                d => d.min(o.keepalive_time.to_std().max(MIN_KEEPALIVE)),
            },
            keepalive_timeout: o.server_ping_timeout.to_std(),
            agent_id: o
                .agent_id
                .clone()
                .unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
            identifiers: o.agent_identifiers.clone(),
            sync_interval: o.sync_interval.to_std(),
            sync_interval_cap: o.sync_interval_cap.to_std(),
            sync_forever: o.sync_forever,
            probe_interval: o.probe_interval.to_std(),
            count_server_leases: o.count_server_leases,
            lease_namespace: o.lease_namespace.clone(),
            lease_label: o.lease_label.clone(),
            count_source,
            kubeconfig: path(&o.kubeconfig),
            kube_api_content_type: o.kube_api_content_type.clone(),
            xfr_channel_size: o.xfr_channel_size as usize,
            warn_on_channel_limit: o.warn_on_channel_limit,
            queue: QueueLimits {
                soft_bytes,
                hard_bytes: soft_bytes.saturating_mul(4),
                stall: o.endpoint_queue_stall_timeout.to_std(),
                budget_bytes,
            },
            dial_timeout: o.endpoint_dial_timeout.to_std(),
            drain_timeout: (o.graceful_shutdown_timeout.0 > 0)
                .then(|| o.graceful_shutdown_timeout.to_std()),
            health_addr: listen_addr(
                &o.health_server_host,
                o.health_server_port,
                "--health-server-port",
            )?,
            admin_addr: listen_addr(
                &o.admin_bind_address,
                o.admin_server_port,
                "--admin-server-port",
            )?,
            enable_profiling: o.enable_profiling,
            watch_files: o.watch_files,
            log_format,
            verbosity: o.v,
            vmodule: o.vmodule.clone(),
        })
    }

    /// The files a reload re-reads: certificates, key, CA, token.
    pub fn watched_files(&self) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = self.config_file.iter().cloned().collect();
        files.push(self.ca_cert.clone());
        if let Some(identity) = &self.identity {
            files.push(identity.cert.clone());
            files.push(identity.key.clone());
        }
        files.extend(self.token_path.clone());
        files
    }

    pub fn token_path(&self) -> Option<&Path> {
        self.token_path.as_deref()
    }
}

impl AgentConfig {
    /// Keeps the running value of every setting a reload cannot change, and names each that
    /// differed. The id stays unless one is given: a reload must not mint a new one.
    pub fn keep_restart_only(
        &mut self,
        running: &AgentConfig,
        id_given: bool,
    ) -> Vec<&'static str> {
        let mut kept = Vec::new();
        macro_rules! keep {
            ($($field:ident),*) => {$(
                if self.$field != running.$field {
                    kept.push(stringify!($field));
                    self.$field = running.$field.clone();
                }
            )*};
        }
        if !id_given {
            self.agent_id = running.agent_id.clone();
        }
        keep!(
            agent_id,
            health_addr,
            admin_addr,
            enable_profiling,
            log_format,
            count_server_leases,
            lease_namespace,
            lease_label,
            kubeconfig,
            kube_api_content_type
        );
        kept
    }
}

/// Upstream's `ParseLabels`: `k=v` pairs separated by commas.
fn check_labels(text: &str) -> Result<(), ValidationError> {
    if text.is_empty() {
        return Err(invalid("empty string provided"));
    }
    for pair in text.split(',') {
        if pair.split('=').count() != 2 {
            return Err(invalid(format!("invalid label format: {pair}")));
        }
    }
    Ok(())
}

/// The selector `--lease-label` names: (key, value) pairs that must all match.
pub fn lease_selector(text: &str) -> Vec<(String, String)> {
    text.split(',')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn validate(args: &[&str]) -> Result<AgentConfig, ValidationError> {
        let mut all = vec!["konnectivity-agent"];
        all.extend_from_slice(args);
        AgentConfig::from_options(&AgentOptions::try_parse_from(all).unwrap())
    }

    #[test]
    fn upstream_messages_in_upstream_order() {
        let err = validate(&["--agent-key=/nonexistent/k"]).unwrap_err();
        assert_eq!(
            err.0,
            "error checking agent key /nonexistent/k, got stat /nonexistent/k: no such file or directory"
        );
        let err = validate(&["--proxy-server-port=0"]).unwrap_err();
        assert_eq!(err.0, "proxy server port 0 must be greater than 0");
        let err = validate(&["--xfr-channel-size=0"]).unwrap_err();
        assert_eq!(err.0, "channel size 0 must be greater than 0");
        let err = validate(&["--sync-interval=11s"]).unwrap_err();
        assert_eq!(
            err.0,
            "sync interval 11s must be less than sync interval cap 10s"
        );
        let err = validate(&["--agent-identifiers=uid=1"]).unwrap_err();
        assert_eq!(err.0, "agent address is invalid: unknown address type: uid");
        let err = validate(&["--agent-identifiers=host=a;b"]).unwrap_err();
        assert_eq!(
            err.0,
            "agent address is invalid: invalid semicolon separator in query"
        );
        let err = validate(&["--server-count-source=min"]).unwrap_err();
        assert_eq!(
            err.0,
            "--server-count-source must be one of '', 'default', 'max', got min"
        );
        let err = validate(&["--count-server-leases", "--lease-label=a"]).unwrap_err();
        assert_eq!(err.0, "invalid label format: a");
        let err = validate(&["--enable-contention-profiling"]).unwrap_err();
        assert_eq!(
            err.0,
            "if --enable-contention-profiling is set, --enable-profiling must also be set"
        );
    }

    #[test]
    fn defaults_are_upstreams() {
        let config = validate(&[]).unwrap();
        assert_eq!(config.server_port, 8091);
        assert_eq!(config.health_addr.port(), 8093);
        assert_eq!(config.admin_addr, "127.0.0.1:8094".parse().unwrap());
        assert_eq!(config.alpn, vec![b"h2".to_vec()]);
        assert_eq!(config.sync_interval, Duration::from_secs(1));
        assert_eq!(config.sync_interval_cap, Duration::from_secs(10));
        assert_eq!(config.xfr_channel_size, 150);
        assert_eq!(uuid::Uuid::parse_str(&config.agent_id).map(|_| ()), Ok(()));
    }

    #[test]
    fn alpn_keeps_the_literal_brackets_upstreams_tests_pass() {
        let config = validate(&["--alpn-proto=[]"]).unwrap();
        assert_eq!(config.alpn, vec![b"[]".to_vec(), b"h2".to_vec()]);
        let config = validate(&["--alpn-proto=konnectivity,h2", "--alpn-proto=x"]).unwrap();
        assert_eq!(
            config.alpn,
            vec![b"konnectivity".to_vec(), b"h2".to_vec(), b"x".to_vec()]
        );
    }
}
