//! `kubeproxy.config.k8s.io/v1alpha1` `KubeProxyConfiguration` as a file gives it: every field
//! optional (absent, `null` and Go's zero value all mean "the default"), defaulted as upstream
//! defaults it, then read into the options' keys the way upstream converts it to its internal
//! form: one sync period, min sync period and masqueradeAll, from the section of the mode.

use std::collections::BTreeMap;

use figment::value::{Dict, Value};
use serde::Deserialize;

use crate::config::pflag::{join_host_port, parse_ip_sloppy, split_host_port};
use crate::config::{GoDuration, Quantity};

pub const API_VERSION: &str = "kubeproxy.config.k8s.io/v1alpha1";
pub const KIND: &str = "KubeProxyConfiguration";

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct KubeProxyConfiguration {
    pub api_version: Option<String>,
    pub kind: Option<String>,
    pub feature_gates: Option<BTreeMap<String, bool>>,
    pub client_connection: Option<ClientConnection>,
    pub logging: Option<Logging>,
    pub hostname_override: Option<String>,
    pub bind_address: Option<String>,
    pub healthz_bind_address: Option<String>,
    pub metrics_bind_address: Option<String>,
    pub bind_address_hard_fail: Option<bool>,
    pub enable_profiling: Option<bool>,
    pub show_hidden_metrics_for_version: Option<String>,
    pub mode: Option<String>,
    pub iptables: Option<IpTables>,
    pub ipvs: Option<Ipvs>,
    pub nftables: Option<NfTables>,
    pub winkernel: Option<Winkernel>,
    pub detect_local_mode: Option<String>,
    pub detect_local: Option<DetectLocal>,
    #[serde(rename = "clusterCIDR")]
    pub cluster_cidr: Option<String>,
    pub node_port_addresses: Option<Vec<String>>,
    pub oom_score_adj: Option<i32>,
    pub conntrack: Option<Conntrack>,
    pub config_sync_period: Option<GoDuration>,
    pub port_range: Option<String>,
    pub windows_run_as_service: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ClientConnection {
    pub kubeconfig: Option<String>,
    pub accept_content_types: Option<String>,
    pub content_type: Option<String>,
    pub qps: Option<f32>,
    pub burst: Option<i32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Logging {
    pub format: Option<String>,
    pub flush_frequency: Option<FlushFrequency>,
    pub verbosity: Option<u32>,
    pub vmodule: Option<Vec<VModuleItem>>,
    pub options: Option<FormatOptions>,
}

/// `logging.flushFrequency`: a Go duration string, or a number of nanoseconds.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum FlushFrequency {
    Nanos(i64),
    Text(GoDuration),
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct VModuleItem {
    pub file_pattern: String,
    pub verbosity: u32,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct FormatOptions {
    pub text: Option<OutputRouting>,
    pub json: Option<OutputRouting>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct OutputRouting {
    pub split_stream: Option<bool>,
    pub info_buffer_size: Option<Quantity>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct IpTables {
    pub masquerade_bit: Option<i32>,
    pub masquerade_all: Option<bool>,
    pub localhost_node_ports: Option<bool>,
    pub sync_period: Option<GoDuration>,
    pub min_sync_period: Option<GoDuration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Ipvs {
    pub sync_period: Option<GoDuration>,
    pub min_sync_period: Option<GoDuration>,
    pub scheduler: Option<String>,
    #[serde(rename = "excludeCIDRs")]
    pub exclude_cidrs: Option<Vec<String>>,
    #[serde(rename = "strictARP")]
    pub strict_arp: Option<bool>,
    pub tcp_timeout: Option<GoDuration>,
    pub tcp_fin_timeout: Option<GoDuration>,
    pub udp_timeout: Option<GoDuration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct NfTables {
    pub masquerade_bit: Option<i32>,
    pub masquerade_all: Option<bool>,
    pub sync_period: Option<GoDuration>,
    pub min_sync_period: Option<GoDuration>,
}

#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct Winkernel {
    pub network_name: Option<String>,
    pub source_vip: Option<String>,
    #[serde(rename = "enableDSR")]
    pub enable_dsr: Option<bool>,
    pub root_hns_endpoint_name: Option<String>,
    pub forward_health_check_vip: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct DetectLocal {
    pub bridge_interface: Option<String>,
    pub interface_name_prefix: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Conntrack {
    pub max_per_core: Option<i32>,
    pub min: Option<i32>,
    pub tcp_established_timeout: Option<GoDuration>,
    pub tcp_close_wait_timeout: Option<GoDuration>,
    pub tcp_be_liberal: Option<bool>,
    pub udp_timeout: Option<GoDuration>,
    pub udp_stream_timeout: Option<GoDuration>,
}

/// Go's zero value counts as unset, as upstream's defaulting reads it.
fn text(value: &Option<String>) -> Option<&str> {
    value.as_deref().filter(|s| !s.is_empty())
}

fn duration(value: Option<GoDuration>) -> Option<GoDuration> {
    value.filter(|d| d.0 != 0)
}

fn go(value: GoDuration) -> Value {
    Value::from(value.to_string())
}

/// upstream's `AppendPortIfNeeded`: a bare IP gets the default port.
fn with_port(address: &str, port: u16) -> String {
    if split_host_port(address).is_ok() || parse_ip_sloppy(address).is_none() {
        return address.to_string();
    }
    join_host_port(address, port)
}

impl KubeProxyConfiguration {
    /// Upstream's defaults and its conversion to the internal form, written as the options'
    /// keys (a layer: env and flags go on top). Also returns warnings for settings that have
    /// no effect here.
    pub fn to_keys(&self) -> (Dict, Vec<String>) {
        let mut keys = Dict::new();
        let mut warnings = Vec::new();
        let mut put = |key: &str, value: Value| {
            keys.insert(key.to_string(), value);
        };

        let gates: BTreeMap<String, Value> = self
            .feature_gates
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), Value::from(*v)))
            .collect();
        put("feature_gates", Value::from(gates));

        let client = self.client_connection.as_ref();
        let field = |f: fn(&ClientConnection) -> &Option<String>| {
            client
                .and_then(|c| text(f(c)))
                .unwrap_or_default()
                .to_string()
        };
        put("kubeconfig", Value::from(field(|c| &c.kubeconfig)));
        put(
            "accept_content_types",
            Value::from(field(|c| &c.accept_content_types)),
        );
        let content_type = field(|c| &c.content_type);
        put(
            "kube_api_content_type",
            Value::from(if content_type.is_empty() {
                "application/vnd.kubernetes.protobuf".to_string()
            } else {
                content_type
            }),
        );
        let qps = client
            .and_then(|c| c.qps)
            .filter(|q| *q != 0.0)
            .unwrap_or(5.0);
        put("kube_api_qps", Value::from(f64::from(qps)));
        let burst = client
            .and_then(|c| c.burst)
            .filter(|b| *b != 0)
            .unwrap_or(10);
        put("kube_api_burst", Value::from(burst));

        let logging = self.logging.as_ref();
        put(
            "logging_format",
            Value::from(logging.and_then(|l| text(&l.format)).unwrap_or("text")),
        );
        let flush = match logging.and_then(|l| l.flush_frequency.as_ref()) {
            Some(FlushFrequency::Nanos(n)) => GoDuration(*n),
            Some(FlushFrequency::Text(d)) => *d,
            None => GoDuration(0),
        };
        put(
            "log_flush_frequency",
            go(duration(Some(flush)).unwrap_or(GoDuration::from_secs(5))),
        );
        put(
            "v",
            Value::from(logging.and_then(|l| l.verbosity).unwrap_or(0)),
        );
        let vmodule: Vec<String> = logging
            .and_then(|l| l.vmodule.as_ref())
            .into_iter()
            .flatten()
            .map(|item| format!("{}={}", item.file_pattern, item.verbosity))
            .collect();
        put("vmodule", Value::from(vmodule));
        let options = logging.and_then(|l| l.options.as_ref());
        for (name, routing) in [
            ("text", options.and_then(|o| o.text.as_ref())),
            ("json", options.and_then(|o| o.json.as_ref())),
        ] {
            put(
                &format!("log_{name}_split_stream"),
                Value::from(routing.and_then(|r| r.split_stream).unwrap_or(false)),
            );
            let size = routing
                .and_then(|r| r.info_buffer_size.clone())
                .unwrap_or_default();
            put(
                &format!("log_{name}_info_buffer_size"),
                Value::from(size.to_string()),
            );
        }

        put(
            "hostname_override",
            Value::from(text(&self.hostname_override).unwrap_or_default()),
        );
        let bind = text(&self.bind_address).unwrap_or("0.0.0.0");
        put("bind_address", Value::from(bind));
        let ipv4 = parse_ip_sloppy(bind).is_some_and(|ip| match ip {
            std::net::IpAddr::V4(_) => true,
            std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().is_some(),
        });
        let (healthz_host, metrics_host) = if ipv4 {
            ("0.0.0.0", "127.0.0.1")
        } else {
            ("[::]", "[::1]")
        };
        put(
            "healthz_bind_address",
            Value::from(match text(&self.healthz_bind_address) {
                Some(address) => with_port(address, 10256),
                None => format!("{healthz_host}:10256"),
            }),
        );
        put(
            "metrics_bind_address",
            Value::from(match text(&self.metrics_bind_address) {
                Some(address) => with_port(address, 10249),
                None => format!("{metrics_host}:10249"),
            }),
        );
        put(
            "bind_address_hard_fail",
            Value::from(self.bind_address_hard_fail.unwrap_or(false)),
        );
        put(
            "profiling",
            Value::from(self.enable_profiling.unwrap_or(false)),
        );
        put(
            "show_hidden_metrics_for_version",
            Value::from(text(&self.show_hidden_metrics_for_version).unwrap_or_default()),
        );

        let mode = text(&self.mode).unwrap_or_default();
        put("proxy_mode", Value::from(mode));
        let default = IpTables::default();
        let iptables = self.iptables.as_ref().unwrap_or(&default);
        let default_nft = NfTables::default();
        let nftables = self.nftables.as_ref().unwrap_or(&default_nft);
        let default_ipvs = Ipvs::default();
        let ipvs = self.ipvs.as_ref().unwrap_or(&default_ipvs);
        put(
            "iptables_masquerade_bit",
            Value::from(iptables.masquerade_bit.unwrap_or(14)),
        );
        put(
            "nftables_masquerade_bit",
            Value::from(nftables.masquerade_bit.unwrap_or(14)),
        );
        put(
            "iptables_localhost_nodeports",
            Value::from(iptables.localhost_node_ports.unwrap_or(true)),
        );
        let masquerade_all = if mode == "nftables" {
            nftables.masquerade_all
        } else {
            iptables.masquerade_all
        };
        put(
            "masquerade_all",
            Value::from(masquerade_all.unwrap_or(false)),
        );
        // The flags' keys: --ipvs-* in ipvs mode, --iptables-* in every other mode. In
        // nftables mode the nftables section is what upstream reads, so it takes the iptables
        // keys; the iptables section is then unused, as upstream.
        let (sync, min_sync) = if mode == "nftables" {
            (nftables.sync_period, nftables.min_sync_period)
        } else {
            (iptables.sync_period, iptables.min_sync_period)
        };
        let second = GoDuration::from_secs(1);
        let thirty = GoDuration::from_secs(30);
        put("iptables_sync_period", go(duration(sync).unwrap_or(thirty)));
        put(
            "iptables_min_sync_period",
            go(duration(min_sync).unwrap_or(second)),
        );
        put(
            "ipvs_sync_period",
            go(duration(ipvs.sync_period).unwrap_or(thirty)),
        );
        // Upstream defaults no ipvs.minSyncPeriod: 0 in a file.
        put(
            "ipvs_min_sync_period",
            go(ipvs.min_sync_period.unwrap_or_default()),
        );
        put(
            "ipvs_scheduler",
            Value::from(text(&ipvs.scheduler).unwrap_or_default()),
        );
        put(
            "ipvs_exclude_cidrs",
            Value::from(ipvs.exclude_cidrs.clone().unwrap_or_default()),
        );
        put(
            "ipvs_strict_arp",
            Value::from(ipvs.strict_arp.unwrap_or(false)),
        );
        put("ipvs_tcp_timeout", go(ipvs.tcp_timeout.unwrap_or_default()));
        put(
            "ipvs_tcpfin_timeout",
            go(ipvs.tcp_fin_timeout.unwrap_or_default()),
        );
        put("ipvs_udp_timeout", go(ipvs.udp_timeout.unwrap_or_default()));

        if self
            .winkernel
            .as_ref()
            .is_some_and(|w| *w != Winkernel::default() && !w.is_zero())
            || self.windows_run_as_service == Some(true)
        {
            warnings.push(
                "the file's winkernel and windowsRunAsService settings are for Windows; ignoring them"
                    .to_string(),
            );
        }

        put(
            "detect_local_mode",
            Value::from(text(&self.detect_local_mode).unwrap_or_default()),
        );
        let detect = self.detect_local.as_ref();
        put(
            "pod_bridge_interface",
            Value::from(
                detect
                    .and_then(|d| text(&d.bridge_interface))
                    .unwrap_or_default(),
            ),
        );
        put(
            "pod_interface_name_prefix",
            Value::from(
                detect
                    .and_then(|d| text(&d.interface_name_prefix))
                    .unwrap_or_default(),
            ),
        );
        put(
            "cluster_cidr",
            Value::from(text(&self.cluster_cidr).unwrap_or_default()),
        );
        put(
            "nodeport_addresses",
            Value::from(self.node_port_addresses.clone().unwrap_or_default()),
        );
        put(
            "oom_score_adj",
            Value::from(self.oom_score_adj.unwrap_or(-999)),
        );

        let default_conntrack = Conntrack::default();
        let conntrack = self.conntrack.as_ref().unwrap_or(&default_conntrack);
        put(
            "conntrack_max_per_core",
            Value::from(conntrack.max_per_core.unwrap_or(32 * 1024)),
        );
        put(
            "conntrack_min",
            Value::from(conntrack.min.unwrap_or(128 * 1024)),
        );
        put(
            "conntrack_tcp_timeout_established",
            go(conntrack
                .tcp_established_timeout
                .unwrap_or(GoDuration::from_secs(24 * 3600))),
        );
        put(
            "conntrack_tcp_timeout_close_wait",
            go(conntrack
                .tcp_close_wait_timeout
                .unwrap_or(GoDuration::from_secs(3600))),
        );
        put(
            "conntrack_tcp_be_liberal",
            Value::from(conntrack.tcp_be_liberal.unwrap_or(false)),
        );
        put(
            "conntrack_udp_timeout",
            go(conntrack.udp_timeout.unwrap_or_default()),
        );
        put(
            "conntrack_udp_timeout_stream",
            go(conntrack.udp_stream_timeout.unwrap_or_default()),
        );
        put(
            "config_sync_period",
            go(duration(self.config_sync_period).unwrap_or(GoDuration::from_secs(15 * 60))),
        );
        put(
            "proxy_port_range",
            Value::from(text(&self.port_range).unwrap_or_default()),
        );
        (keys, warnings)
    }
}

impl Winkernel {
    /// Every field at Go's zero value (kubeadm writes them so).
    fn is_zero(&self) -> bool {
        text(&self.network_name).is_none()
            && text(&self.source_vip).is_none()
            && text(&self.root_hns_endpoint_name).is_none()
            && !self.enable_dsr.unwrap_or(false)
            && !self.forward_health_check_vip.unwrap_or(false)
    }
}
