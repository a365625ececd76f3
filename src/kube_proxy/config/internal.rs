//! Upstream's internal `KubeProxyConfiguration`, completed from the merged options as
//! upstream's `Options.Complete` does (deprecated ports, the mode's sync periods, platform
//! defaults, the hostname override, feature gates), still in upstream's spellings so that
//! validation can quote values as upstream does; and its v1alpha1 form, which
//! `--write-config-to` and `/configz` show.

use serde_json::{json, Map, Value};

use super::feature_gates::FeatureGates;
use super::v1alpha1::{API_VERSION, KIND};
use crate::config::pflag::{join_host_port, parse_ip_sloppy, split_host_port};
use crate::config::{GoDuration, Quantity};
use crate::kube_proxy::options::KubeProxyOptions;

/// upstream's internal configuration (`pkg/proxy/apis/config`), Linux fields only.
#[derive(Clone, Debug, PartialEq)]
pub struct Internal {
    pub feature_gates: FeatureGates,
    pub kubeconfig: String,
    pub accept_content_types: String,
    pub content_type: String,
    pub qps: f32,
    pub burst: i32,
    pub logging_format: String,
    pub flush_frequency: GoDuration,
    pub verbosity: u32,
    /// `pattern=N` items, in order.
    pub vmodule: Vec<(String, u32)>,
    pub text_split_stream: bool,
    pub text_info_buffer_size: Quantity,
    pub json_split_stream: bool,
    pub json_info_buffer_size: Quantity,
    pub hostname_override: String,
    pub bind_address: String,
    pub healthz_bind_address: String,
    pub metrics_bind_address: String,
    pub bind_address_hard_fail: bool,
    pub enable_profiling: bool,
    pub show_hidden_metrics_for_version: String,
    pub mode: String,
    /// The mode was not given (upstream logs an error and emits an event about it).
    pub mode_defaulted: bool,
    pub iptables_masquerade_bit: i32,
    pub iptables_localhost_node_ports: bool,
    pub nftables_masquerade_bit: i32,
    pub ipvs_scheduler: String,
    pub ipvs_exclude_cidrs: Vec<String>,
    pub ipvs_strict_arp: bool,
    pub ipvs_tcp_timeout: GoDuration,
    pub ipvs_tcp_fin_timeout: GoDuration,
    pub ipvs_udp_timeout: GoDuration,
    pub detect_local_mode: String,
    pub bridge_interface: String,
    pub interface_name_prefix: String,
    pub cluster_cidrs: Vec<String>,
    pub node_port_addresses: Vec<String>,
    pub sync_period: GoDuration,
    pub min_sync_period: GoDuration,
    pub config_sync_period: GoDuration,
    pub masquerade_all: bool,
    pub oom_score_adj: i32,
    pub conntrack_max_per_core: i32,
    pub conntrack_min: i32,
    pub conntrack_tcp_established_timeout: GoDuration,
    pub conntrack_tcp_close_wait_timeout: GoDuration,
    pub conntrack_tcp_be_liberal: bool,
    pub conntrack_udp_timeout: GoDuration,
    pub conntrack_udp_stream_timeout: GoDuration,
    pub port_range: String,
}

/// upstream's `addressFromDeprecatedFlags`: port 0 disables the server, another port
/// completes a bare IP.
fn address_from_port(address: &str, port: i32) -> String {
    if port == 0 {
        return String::new();
    }
    if split_host_port(address).is_ok() || parse_ip_sloppy(address).is_none() {
        return address.to_string();
    }
    join_host_port(address, port)
}

impl Internal {
    /// upstream's `Complete`, on options already merged from every layer. Returns the
    /// configuration and the warnings upstream logs on the way; an error reads as upstream's
    /// (the caller prefixes `failed complete: `).
    pub fn complete(options: &KubeProxyOptions) -> Result<(Internal, Vec<String>), String> {
        let mut warnings = Vec::new();
        // An empty ip or ipport flag leaves upstream's setting as it was: the default.
        let or_default =
            |value: &str, default: &str| if value.is_empty() { default } else { value }.to_string();
        let mut healthz = or_default(&options.healthz_bind_address, "0.0.0.0:10256");
        let mut metrics = or_default(&options.metrics_bind_address, "127.0.0.1:10249");
        // The deprecated ports apply when upstream would apply them: neither a
        // KubeProxyConfiguration file nor --write-config-to.
        if !options.kube_config_file && options.write_config_to.is_empty() {
            healthz = address_from_port(&healthz, options.healthz_port);
            metrics = address_from_port(&metrics, options.metrics_port);
        }
        let ipvs = options.proxy_mode == "ipvs";
        let (sync_period, min_sync_period) = if ipvs {
            (options.ipvs_sync_period, options.ipvs_min_sync_period)
        } else {
            (
                options.iptables_sync_period,
                options.iptables_min_sync_period,
            )
        };
        // The flag given, even empty, is split as upstream splits it (`--cluster-cidr=` is
        // one empty CIDR, which validation refuses).
        let given = options.given_flags.iter().any(|f| f == "cluster-cidr");
        let cluster_cidrs = if options.cluster_cidr.is_empty() && !given {
            Vec::new()
        } else {
            options.cluster_cidr.split(',').map(String::from).collect()
        };
        let vmodule = options
            .vmodule
            .iter()
            .flat_map(|v| v.split(','))
            .filter_map(|item| {
                // The pattern ends at the last '=' (a file's may hold one; validation refuses it).
                let (pattern, level) = item.rsplit_once('=')?;
                Some((pattern.to_string(), level.parse().ok()?))
            })
            .collect();

        // platformApplyDefaults.
        let mode_defaulted = options.proxy_mode.is_empty();
        let mode = if mode_defaulted {
            "iptables".to_string()
        } else {
            options.proxy_mode.clone()
        };
        let mut node_port_addresses = options.nodeport_addresses.clone();
        if mode == "nftables" && node_port_addresses.is_empty() {
            node_port_addresses.push("primary".into());
        }
        let detect_local_mode = if options.detect_local_mode.is_empty() {
            "ClusterCIDR".to_string()
        } else {
            options.detect_local_mode.clone()
        };

        // processHostnameOverrideFlag.
        let mut hostname_override = options.hostname_override.clone();
        if !hostname_override.is_empty() {
            let trimmed = hostname_override.trim();
            if trimmed.is_empty() {
                return Err("empty hostname-override is invalid".into());
            }
            hostname_override = trimmed.to_lowercase();
        }

        let (feature_gates, gate_warnings) = FeatureGates::from_map(&options.feature_gate_map())?;
        warnings.extend(gate_warnings);

        let internal = Internal {
            feature_gates,
            kubeconfig: options.kubeconfig.clone(),
            accept_content_types: options.accept_content_types.clone(),
            content_type: options.kube_api_content_type.clone(),
            qps: options.kube_api_qps,
            burst: options.kube_api_burst,
            logging_format: options.logging_format.clone(),
            flush_frequency: options.log_flush_frequency,
            verbosity: options.v,
            vmodule,
            text_split_stream: options.log_text_split_stream,
            text_info_buffer_size: options.log_text_info_buffer_size.clone(),
            json_split_stream: options.log_json_split_stream,
            json_info_buffer_size: options.log_json_info_buffer_size.clone(),
            hostname_override,
            bind_address: or_default(&options.bind_address, "0.0.0.0"),
            healthz_bind_address: healthz,
            metrics_bind_address: metrics,
            bind_address_hard_fail: options.bind_address_hard_fail,
            enable_profiling: options.profiling,
            show_hidden_metrics_for_version: options.show_hidden_metrics_for_version.clone(),
            mode,
            mode_defaulted,
            iptables_masquerade_bit: options.iptables_masquerade_bit,
            iptables_localhost_node_ports: options.iptables_localhost_nodeports,
            nftables_masquerade_bit: options.nftables_masquerade_bit,
            ipvs_scheduler: options.ipvs_scheduler.clone(),
            ipvs_exclude_cidrs: options.ipvs_exclude_cidrs.clone(),
            ipvs_strict_arp: options.ipvs_strict_arp,
            ipvs_tcp_timeout: options.ipvs_tcp_timeout,
            ipvs_tcp_fin_timeout: options.ipvs_tcpfin_timeout,
            ipvs_udp_timeout: options.ipvs_udp_timeout,
            detect_local_mode,
            bridge_interface: options.pod_bridge_interface.clone(),
            interface_name_prefix: options.pod_interface_name_prefix.clone(),
            cluster_cidrs,
            node_port_addresses,
            sync_period,
            min_sync_period,
            config_sync_period: options.config_sync_period,
            masquerade_all: options.masquerade_all,
            oom_score_adj: options.oom_score_adj,
            conntrack_max_per_core: options.conntrack_max_per_core,
            conntrack_min: options.conntrack_min,
            conntrack_tcp_established_timeout: options.conntrack_tcp_timeout_established,
            conntrack_tcp_close_wait_timeout: options.conntrack_tcp_timeout_close_wait,
            conntrack_tcp_be_liberal: options.conntrack_tcp_be_liberal,
            conntrack_udp_timeout: options.conntrack_udp_timeout,
            conntrack_udp_stream_timeout: options.conntrack_udp_timeout_stream,
            port_range: options.proxy_port_range.clone(),
        };
        Ok((internal, warnings))
    }

    /// The v1alpha1 form, as upstream converts and encodes it: the sync periods and
    /// masqueradeAll go back only into the mode's section (the others keep Go's zero values),
    /// `null` for empty lists, `featureGates` and `logging.vmodule` only when set.
    pub fn to_v1alpha1(&self) -> Value {
        let d = |d: GoDuration| Value::from(d.to_string());
        let zero = GoDuration(0);
        let section = |name: &str| self.mode == name;
        let (nft, ipvs) = (section("nftables"), section("ipvs"));
        let iptables = !nft && !ipvs;
        let list = |items: &[String]| {
            if items.is_empty() {
                Value::Null
            } else {
                json!(items)
            }
        };
        let mut logging = Map::new();
        if !self.logging_format.is_empty() {
            logging.insert("format".into(), json!(self.logging_format));
        }
        logging.insert("flushFrequency".into(), d(self.flush_frequency));
        logging.insert("verbosity".into(), json!(self.verbosity));
        if !self.vmodule.is_empty() {
            let items: Vec<Value> = self
                .vmodule
                .iter()
                .map(|(p, v)| json!({"filePattern": p, "verbosity": v}))
                .collect();
            logging.insert("vmodule".into(), Value::Array(items));
        }
        let routing = |split: bool, size: &Quantity| {
            let mut map = Map::new();
            if split {
                map.insert("splitStream".into(), json!(true));
            }
            map.insert("infoBufferSize".into(), json!(size.to_string()));
            Value::Object(map)
        };
        logging.insert(
            "options".into(),
            json!({
                "json": routing(self.json_split_stream, &self.json_info_buffer_size),
                "text": routing(self.text_split_stream, &self.text_info_buffer_size),
            }),
        );
        // Go writes a float32 that holds a whole number without a fraction.
        let qps = if self.qps.fract() == 0.0 && self.qps.abs() < 1e15 {
            json!(self.qps as i64)
        } else {
            json!(f64::from(self.qps))
        };
        let mut out = json!({
            "apiVersion": API_VERSION,
            "kind": KIND,
            "bindAddress": self.bind_address,
            "bindAddressHardFail": self.bind_address_hard_fail,
            "clientConnection": {
                "acceptContentTypes": self.accept_content_types,
                "burst": self.burst,
                "contentType": self.content_type,
                "kubeconfig": self.kubeconfig,
                "qps": qps,
            },
            "clusterCIDR": self.cluster_cidrs.join(","),
            "configSyncPeriod": d(self.config_sync_period),
            "conntrack": {
                "maxPerCore": self.conntrack_max_per_core,
                "min": self.conntrack_min,
                "tcpBeLiberal": self.conntrack_tcp_be_liberal,
                "tcpCloseWaitTimeout": d(self.conntrack_tcp_close_wait_timeout),
                "tcpEstablishedTimeout": d(self.conntrack_tcp_established_timeout),
                "udpStreamTimeout": d(self.conntrack_udp_stream_timeout),
                "udpTimeout": d(self.conntrack_udp_timeout),
            },
            "detectLocal": {
                "bridgeInterface": self.bridge_interface,
                "interfaceNamePrefix": self.interface_name_prefix,
            },
            "detectLocalMode": self.detect_local_mode,
            "enableProfiling": self.enable_profiling,
            "healthzBindAddress": self.healthz_bind_address,
            "hostnameOverride": self.hostname_override,
            "iptables": {
                "localhostNodePorts": self.iptables_localhost_node_ports,
                "masqueradeAll": !nft && self.masquerade_all,
                "masqueradeBit": self.iptables_masquerade_bit,
                "minSyncPeriod": d(if iptables { self.min_sync_period } else { zero }),
                "syncPeriod": d(if iptables { self.sync_period } else { zero }),
            },
            "ipvs": {
                "excludeCIDRs": list(&self.ipvs_exclude_cidrs),
                "minSyncPeriod": d(if ipvs { self.min_sync_period } else { zero }),
                "scheduler": self.ipvs_scheduler,
                "strictARP": self.ipvs_strict_arp,
                "syncPeriod": d(if ipvs { self.sync_period } else { zero }),
                "tcpFinTimeout": d(self.ipvs_tcp_fin_timeout),
                "tcpTimeout": d(self.ipvs_tcp_timeout),
                "udpTimeout": d(self.ipvs_udp_timeout),
            },
            "logging": Value::Object(logging),
            "metricsBindAddress": self.metrics_bind_address,
            "mode": self.mode,
            "nftables": {
                "masqueradeAll": nft && self.masquerade_all,
                "masqueradeBit": self.nftables_masquerade_bit,
                "minSyncPeriod": d(if nft { self.min_sync_period } else { zero }),
                "syncPeriod": d(if nft { self.sync_period } else { zero }),
            },
            "nodePortAddresses": list(&self.node_port_addresses),
            "oomScoreAdj": self.oom_score_adj,
            "portRange": self.port_range,
            "showHiddenMetricsForVersion": self.show_hidden_metrics_for_version,
            "winkernel": {
                "enableDSR": false,
                "forwardHealthCheckVip": false,
                "networkName": "",
                "rootHnsEndpointName": "",
                "sourceVip": "",
            },
        });
        if !self.feature_gates.given().is_empty() {
            if let Value::Object(map) = &mut out {
                map.insert("featureGates".into(), json!(self.feature_gates.given()));
            }
        }
        out
    }
}
