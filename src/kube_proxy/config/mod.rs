//! kube-proxy's configuration: the KubeProxyConfiguration file format (`file`, `v1alpha1`),
//! upstream's completion, defaults and validation in its order and words (`internal`,
//! `validate`, `feature_gates`), and the typed, immutable [`ProxyConfig`] the program runs on
//! (`typed`). The flags are `kube_proxy::options`; `load` ties the layers together.

pub mod feature_gates;
pub mod file;
mod internal;
pub mod load;
mod typed;
pub mod v1alpha1;
mod validate;
mod yaml;

use std::time::Duration;

pub use feature_gates::FeatureGates;
pub use internal::Internal;
pub use typed::{
    ClientSettings, ConntrackSettings, DetectLocal, IpvsScheduler, IpvsSettings, LoggingFormat,
    LoggingSettings, NodePortAddress, ProxyMode,
};
pub use validate::parse_cidr;

use super::options::KubeProxyOptions;
use std::net::{IpAddr, SocketAddr};

/// Why a configuration was refused, worded as upstream words it (the prefix is upstream's
/// step: `failed complete`, `initialize logging`, `failed validate`), or by our own checks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    #[error("failed complete: {0}")]
    Complete(String),
    #[error("initialize logging: {0}")]
    Logging(String),
    #[error("failed validate: {0}")]
    Invalid(String),
    /// Beyond upstream's rules (`--ipvs-scheduler`).
    #[error("{0}")]
    Unsupported(String),
}

/// The validated configuration: every value typed once. Built by [`ProxyConfig::from_options`];
/// never changed afterwards (a new configuration means a new process, as upstream).
#[derive(Clone, Debug, PartialEq)]
pub struct ProxyConfig {
    /// The proxy mode (`--proxy-mode`, `mode`); iptables when none was given.
    pub mode: ProxyMode,
    /// No mode was given (upstream logs an error and emits the KubeProxyDefaultMode event).
    pub mode_defaulted: bool,
    /// `--hostname-override`, trimmed and lower-cased; None: the OS hostname names the node.
    pub node_name_override: Option<String>,
    /// `--bind-address`: overrides the node's primary IP when not unspecified.
    pub bind_address: IpAddr,
    /// `--bind-address-hard-fail`: a healthz or metrics bind failure is fatal.
    pub bind_address_hard_fail: bool,
    /// `--healthz-bind-address` (or `--healthz-port`); None: the health server is disabled.
    pub healthz_addr: Option<SocketAddr>,
    /// `--metrics-bind-address` (or `--metrics-port`); None: the metrics server is disabled.
    pub metrics_addr: Option<SocketAddr>,
    /// `--profiling`: pprof and `/debug/flags/v` on the metrics port.
    pub enable_profiling: bool,
    /// `--show-hidden-metrics-for-version`, when set.
    pub show_hidden_metrics_for_version: Option<String>,
    /// The API server connection: kubeconfig, master, content type, QPS and burst.
    pub client: ClientSettings,
    /// `--config-sync-period`: the informers' resync period.
    pub config_sync_period: Duration,
    /// The mode's sync period (retry interval after a failed sync, half the healthz timeout).
    pub sync_period: Duration,
    /// The mode's minimum period between two syncs.
    pub min_sync_period: Duration,
    /// The mode's masqueradeAll: SNAT all traffic to Service cluster IPs.
    pub masquerade_all: bool,
    /// The mode's fwmark bit for SNAT (`iptables.masqueradeBit`, or `nftables.masqueradeBit`).
    pub masquerade_bit: u32,
    /// `--iptables-localhost-nodeports` (iptables mode, IPv4 only).
    pub iptables_localhost_node_ports: bool,
    /// The ipvs settings (ipvs mode only).
    pub ipvs: IpvsSettings,
    /// How traffic is recognised as coming from a local pod.
    pub detect_local: DetectLocal,
    /// Where NodePorts are served; upstream's default when unset: `primary` in nftables
    /// mode, `all` in iptables and ipvs modes.
    pub node_port_addresses: Vec<NodePortAddress>,
    /// `--oom-score-adj`, written to /proc/self/oom_score_adj.
    pub oom_score_adj: i32,
    /// The conntrack sysctls to apply.
    pub conntrack: ConntrackSettings,
    /// The feature gates, upstream's defaults with `--feature-gates` over them.
    pub feature_gates: FeatureGates,
    /// Verbosity, vmodule, format and where the log goes.
    pub logging: LoggingSettings,
    /// `--cleanup`: remove the rules of every mode and exit.
    pub cleanup: bool,
    /// `--init-only`: do the privileged setup and exit.
    pub init_only: bool,
    /// The configuration in upstream's v1alpha1 form (for `/configz` and `--write-config-to`).
    v1alpha1: serde_json::Value,
}

impl ProxyConfig {
    /// Completes, validates and types the merged options, as upstream's `Complete` and
    /// `Validate` do, then our own checks.
    pub fn from_options(options: &KubeProxyOptions) -> Result<ProxyConfig, ValidationError> {
        Self::with_warnings(options, &mut Vec::new())
    }

    /// [`ProxyConfig::from_options`], adding to `warnings` what upstream logs while
    /// completing (a GA or deprecated feature gate set), whether or not it then fails.
    pub fn with_warnings(
        options: &KubeProxyOptions,
        warnings: &mut Vec<String>,
    ) -> Result<ProxyConfig, ValidationError> {
        let (internal, completed) =
            Internal::complete(options).map_err(ValidationError::Complete)?;
        warnings.extend(completed);
        if let Some(error) = validate::aggregate(validate::logging(&internal)) {
            return Err(ValidationError::Logging(error));
        }
        if let Some(error) = validate::aggregate(validate::validate(&internal)) {
            return Err(ValidationError::Invalid(error));
        }
        typed::build(&internal, options)
    }

    /// The configuration as upstream's v1alpha1 JSON object (`apiVersion`, `kind` and every
    /// field), what `/configz` serves under `kubeproxy.config.k8s.io`.
    pub fn v1alpha1_json(&self) -> &serde_json::Value {
        &self.v1alpha1
    }

    /// The configuration as upstream's `--write-config-to` writes it (v1alpha1 YAML).
    pub fn v1alpha1_yaml(&self) -> String {
        yaml::to_yaml(&self.v1alpha1)
    }
}
