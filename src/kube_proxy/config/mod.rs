//! kube-proxy's configuration: the KubeProxyConfiguration file format (`file`, `v1alpha1`),
//! upstream's completion, defaults and validation in its order and words (`internal`,
//! `validate`, `feature_gates`), and the typed, immutable [`ProxyConfig`] the program runs on
//! (`typed`). The flags are `kube_proxy::options`; `load` ties the layers together.

pub mod feature_gates;
pub mod file;
mod internal;
pub mod load;
pub mod print_flags;
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use clap::Parser;

    use super::*;

    fn config(args: &[&str]) -> Result<ProxyConfig, ValidationError> {
        let mut all = vec!["kube-proxy"];
        all.extend_from_slice(args);
        ProxyConfig::from_options(&KubeProxyOptions::try_parse_from(all).unwrap())
    }

    #[test]
    fn defaults_are_upstreams_typed() {
        let c = config(&[]).unwrap();
        assert_eq!(c.mode, ProxyMode::Iptables);
        assert!(c.mode_defaulted);
        assert_eq!(c.node_port_addresses, [NodePortAddress::All]);
        assert_eq!(c.healthz_addr, Some("0.0.0.0:10256".parse().unwrap()));
        assert_eq!(c.metrics_addr, Some("127.0.0.1:10249".parse().unwrap()));
        assert_eq!(c.sync_period, Duration::from_secs(30));
        assert_eq!(c.min_sync_period, Duration::from_secs(1));
        assert_eq!(c.config_sync_period, Duration::from_secs(900));
        assert_eq!(c.masquerade_bit, 14);
        assert_eq!(c.oom_score_adj, -999);
        assert_eq!(c.conntrack.max_per_core, 32768);
        assert_eq!(
            c.conntrack.tcp_established_timeout,
            Duration::from_secs(86400)
        );
        assert_eq!(c.detect_local, DetectLocal::ClusterCidr(vec![]));
        assert_eq!(c.client.content_type, "application/vnd.kubernetes.protobuf");
        assert_eq!(c.client.kubeconfig, None);
        assert_eq!((c.client.qps, c.client.burst), (5.0, 10));
        assert_eq!(c.logging.format, LoggingFormat::Text);
        assert_eq!(c.node_name_override, None);
        assert!(c.feature_gates.enabled("KubeProxyIPVS"));
        assert_eq!(c.v1alpha1_json()["kind"], "KubeProxyConfiguration");
        assert_eq!(c.v1alpha1_json()["mode"], "iptables");
    }

    #[test]
    fn nftables_mode_defaults_node_ports_to_primary() {
        let c = config(&["--proxy-mode=nftables"]).unwrap();
        assert_eq!(c.mode, ProxyMode::Nftables);
        assert_eq!(c.node_port_addresses, [NodePortAddress::Primary]);
        let c = config(&[
            "--proxy-mode=nftables",
            "--nodeport-addresses=localhost,10.0.0.0/8",
        ])
        .unwrap();
        assert_eq!(
            c.node_port_addresses,
            [
                NodePortAddress::Localhost,
                NodePortAddress::Cidr("10.0.0.0/8".parse().unwrap())
            ]
        );
    }

    #[test]
    fn the_reference_command_line_types_its_values() {
        let c = config(&[
            "--bind-address=10.12.51.171",
            "--hostname-override=10.12.51.171",
            "--cluster-cidr=10.254.0.0/16",
            "--kubeconfig=/etc/kubernetes/kube-proxy.kubeconfig",
            "--logtostderr=true",
            "--v=2",
            "--ipvs-scheduler=wrr",
            "--ipvs-min-sync-period=5s",
            "--ipvs-sync-period=5s",
            "--proxy-mode=ipvs",
        ])
        .unwrap();
        assert_eq!(c.mode, ProxyMode::Ipvs);
        assert_eq!(c.bind_address, "10.12.51.171".parse::<IpAddr>().unwrap());
        assert_eq!(c.node_name_override.as_deref(), Some("10.12.51.171"));
        assert_eq!(
            c.detect_local,
            DetectLocal::ClusterCidr(vec!["10.254.0.0/16".parse().unwrap()])
        );
        assert_eq!(c.ipvs.scheduler, IpvsScheduler::WeightedRoundRobin);
        assert_eq!(c.sync_period, Duration::from_secs(5));
        assert_eq!(c.min_sync_period, Duration::from_secs(5));
        assert_eq!(c.logging.verbosity, 2);
        assert!(c.logging.logtostderr);
        assert_eq!(
            c.client.kubeconfig.as_deref(),
            Some(std::path::Path::new(
                "/etc/kubernetes/kube-proxy.kubeconfig"
            ))
        );
        assert_eq!(c.node_port_addresses, [NodePortAddress::All]);
    }

    #[test]
    fn deprecated_ports_disable_or_complete_the_addresses() {
        let c = config(&["--healthz-port=0"]).unwrap();
        assert_eq!(c.healthz_addr, None);
        let c = config(&["--healthz-bind-address=10.0.0.1", "--healthz-port=8080"]).unwrap();
        assert_eq!(c.healthz_addr, Some("10.0.0.1:8080".parse().unwrap()));
    }

    #[test]
    fn other_settings_are_typed() {
        let c = config(&[
            "--detect-local-mode=InterfaceNamePrefix",
            "--pod-interface-name-prefix=veth",
            "--hostname-override= Node-A ",
            "--master=https://10.0.0.1:6443",
            "--conntrack-max-per-core=0",
            "--conntrack-udp-timeout=30s",
            "--feature-gates=KubeProxyNFTablesLocalhostNodePorts=true",
            "--logging-format=json",
            "--cleanup",
        ])
        .unwrap();
        assert_eq!(
            c.detect_local,
            DetectLocal::InterfaceNamePrefix("veth".into())
        );
        assert_eq!(c.node_name_override.as_deref(), Some("node-a"));
        assert_eq!(c.client.master.as_deref(), Some("https://10.0.0.1:6443"));
        assert_eq!(c.conntrack.max_per_core, 0);
        assert_eq!(c.conntrack.udp_timeout, Duration::from_secs(30));
        assert!(c
            .feature_gates
            .enabled("KubeProxyNFTablesLocalhostNodePorts"));
        assert_eq!(c.logging.format, LoggingFormat::Json);
        assert!(c.cleanup && !c.init_only);
    }

    #[test]
    fn validation_failures_carry_upstreams_step() {
        assert!(matches!(
            config(&["--feature-gates=Nope=true"]),
            Err(ValidationError::Complete(_))
        ));
        assert!(matches!(
            config(&["--logging-format=xml"]),
            Err(ValidationError::Logging(_))
        ));
        assert_eq!(
            config(&["--proxy-mode=userspace"]).unwrap_err().to_string(),
            "failed validate: KubeProxyConfiguration.Mode.ProxyMode: Invalid value: \"userspace\": must be iptables, ipvs, nftables or blank (blank means the best-available proxy [currently iptables])"
        );
        assert!(matches!(
            config(&["--proxy-mode=ipvs", "--ipvs-scheduler=dh"]),
            Err(ValidationError::Unsupported(_))
        ));
    }
}
