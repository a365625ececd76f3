//! upstream's validation of the completed configuration, rule by rule in upstream's order
//! and in its words (`KubeProxyConfiguration.SyncPeriod: Invalid value: "0s": must be greater
//! than 0`): the logging checks that run first (`initialize logging: ...`), then `Validate`
//! (`failed validate: ...`). Several failures read as upstream aggregates them: `[a, b]`.

use std::net::IpAddr;

use ipnet::IpNet;

use super::internal::Internal;
use crate::config::pflag::{parse_ip_sloppy, split_host_port};
use crate::config::GoDuration;

/// The version whose previous minor `--show-hidden-metrics-for-version` may name.
const MINOR: u32 = 37;

const ROOT: &str = "KubeProxyConfiguration";

/// One field error, formatted as apimachinery's `field.Error`.
fn invalid(path: &str, value: impl std::fmt::Display, detail: &str) -> String {
    format!("{path}: Invalid value: {value}: {detail}")
}

fn quoted(text: &str) -> String {
    format!("{text:?}")
}

/// A duration as Go's JSON of `metav1.Duration`.
fn dur(d: GoDuration) -> String {
    format!("\"{d}\"")
}

/// Go's `net.ParseCIDR` as Kubernetes calls it.
pub fn parse_cidr(text: &str) -> Option<IpNet> {
    let (ip, bits) = text.split_once('/')?;
    let ip = parse_ip_sloppy(ip)?;
    if bits.is_empty() || bits.len() > 3 || !bits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    IpNet::new(ip, bits.parse().ok()?).ok()
}

/// apimachinery's aggregate of several errors: one as it is, more as `[a, b]`, repeats once.
pub fn aggregate(errors: Vec<String>) -> Option<String> {
    let mut unique: Vec<String> = Vec::new();
    for error in errors {
        if !unique.contains(&error) {
            unique.push(error);
        }
    }
    match unique.len() {
        0 => None,
        1 => unique.pop(),
        _ => Some(format!("[{}]", unique.join(", "))),
    }
}

/// component-base's `ValidateAndApplyAsField(logging, gates, "logging")`.
pub fn logging(config: &Internal) -> Vec<String> {
    let mut errors = Vec::new();
    let gates = &config.feature_gates;
    if config.flush_frequency.0 <= 0 {
        errors.push(invalid(
            "logging.flushFrequency",
            dur(config.flush_frequency),
            "Must be greater than zero",
        ));
    }
    match config.logging_format.as_str() {
        "text" | "" => {}
        "json" if !gates.enabled("LoggingBetaOptions") => errors.push(
            "logging.format: Forbidden: Log format json is disabled, see LoggingBetaOptions feature"
                .to_string(),
        ),
        "json" => {}
        other => errors.push(invalid(
            "logging.format",
            quoted(other),
            "Unsupported log format",
        )),
    }
    if config.verbosity > i32::MAX as u32 {
        errors.push(invalid(
            "logging.verbosity",
            config.verbosity,
            "Must be <= 2147483647",
        ));
    }
    if !config.vmodule.is_empty() && !matches!(config.logging_format.as_str(), "" | "text") {
        errors.push("logging.vmodule: Forbidden: Only supported for text log format".to_string());
    }
    for (i, (pattern, level)) in config.vmodule.iter().enumerate() {
        if pattern.is_empty() {
            errors.push(format!(
                "logging.vmodule[{i}]: Required value: File pattern must not be empty"
            ));
        }
        if pattern.contains(['=', ',']) {
            errors.push(invalid(
                &format!("logging.vmodule[{i}]"),
                quoted(pattern),
                "File pattern must not contain equal sign or comma",
            ));
        }
        if *level > i32::MAX as u32 {
            errors.push(invalid(
                &format!("logging.vmodule[{i}]"),
                level,
                "Must be <= 2147483647",
            ));
        }
    }
    let alpha = gates.enabled("LoggingAlphaOptions");
    for (name, split, size) in [
        (
            "text",
            config.text_split_stream,
            &config.text_info_buffer_size,
        ),
        (
            "json",
            config.json_split_stream,
            &config.json_info_buffer_size,
        ),
    ] {
        if split && !alpha {
            errors.push(format!(
                "logging.options.{name}.splitStream: Forbidden: Feature LoggingAlphaOptions is disabled"
            ));
        }
        if size.value() != 0 && !alpha {
            errors.push(format!(
                "logging.options.{name}.infoBufferSize: Forbidden: Feature LoggingAlphaOptions is disabled"
            ));
        }
    }
    errors
}

/// upstream's `validateHostPort`.
fn host_port(input: &str, path: &str, errors: &mut Vec<String>) {
    let Ok((host, port)) = split_host_port(input) else {
        errors.push(invalid(path, quoted(input), "must be IP:port"));
        return;
    };
    if parse_ip_sloppy(host).is_none() {
        errors.push(invalid(path, quoted(host), "must be a valid IP"));
    }
    // strconv.Atoi: an optional sign and decimal digits.
    let digits = port.strip_prefix(['+', '-']).unwrap_or(port);
    let valid = !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && port.parse::<i64>().is_ok_and(|p| (1..=65535).contains(&p));
    if !valid {
        errors.push(invalid(path, quoted(port), "must be a valid port"));
    }
}

/// upstream's `Validate`, in its order.
pub fn validate(config: &Internal) -> Vec<String> {
    let mut errors = Vec::new();
    let path = |child: &str| format!("{ROOT}.{child}");
    let range = "must be within the range [0, 31]";
    let non_negative = "must be greater than or equal to 0";

    if !(0..=31).contains(&config.iptables_masquerade_bit) {
        errors.push(invalid(
            &path("KubeProxyIPTablesConfiguration.MasqueradeBit"),
            config.iptables_masquerade_bit,
            range,
        ));
    }
    match config.mode.as_str() {
        "ipvs" => {
            let ipvs = path("KubeProxyIPVSConfiguration");
            for (name, value) in [
                ("TCPTimeout", config.ipvs_tcp_timeout),
                ("TCPFinTimeout", config.ipvs_tcp_fin_timeout),
                ("UDPTimeout", config.ipvs_udp_timeout),
            ] {
                if value.is_negative() {
                    errors.push(invalid(&format!("{ipvs}.{name}"), dur(value), non_negative));
                }
            }
            for (i, cidr) in config.ipvs_exclude_cidrs.iter().enumerate() {
                if parse_cidr(cidr).is_none() {
                    errors.push(invalid(
                        &format!("{ipvs}.ExcludeCidrs[{i}]"),
                        quoted(cidr),
                        "must be a valid CIDR",
                    ));
                }
            }
        }
        "nftables" if !(0..=31).contains(&config.nftables_masquerade_bit) => {
            errors.push(invalid(
                &path("KubeProxyNFTablesConfiguration.MasqueradeBit"),
                config.nftables_masquerade_bit,
                range,
            ));
        }
        _ => {}
    }

    let conntrack = path("KubeProxyLinuxConfiguration.KubeProxyConntrackConfiguration");
    for (name, value) in [
        ("MaxPerCore", config.conntrack_max_per_core),
        ("Min", config.conntrack_min),
    ] {
        if value < 0 {
            errors.push(invalid(&format!("{conntrack}.{name}"), value, non_negative));
        }
    }
    for (name, value) in [
        (
            "TCPEstablishedTimeout",
            config.conntrack_tcp_established_timeout,
        ),
        (
            "TCPCloseWaitTimeout",
            config.conntrack_tcp_close_wait_timeout,
        ),
        ("UDPTimeout", config.conntrack_udp_timeout),
        ("UDPStreamTimeout", config.conntrack_udp_stream_timeout),
    ] {
        if value.is_negative() {
            errors.push(invalid(
                &format!("{conntrack}.{name}"),
                dur(value),
                non_negative,
            ));
        }
    }
    if !(-1000..=1000).contains(&config.oom_score_adj) {
        errors.push(invalid(
            &path("KubeProxyLinuxConfiguration.OOMScoreAdj"),
            config.oom_score_adj,
            "must be within the range [-1000, 1000]",
        ));
    }

    let mut modes = vec!["iptables", "nftables"];
    if config.feature_gates.enabled("KubeProxyIPVS") {
        modes.insert(1, "ipvs");
    }
    if !config.mode.is_empty() && !modes.contains(&config.mode.as_str()) {
        errors.push(invalid(
            &path("Mode.ProxyMode"),
            quoted(&config.mode),
            &format!(
                "must be {} or blank (blank means the best-available proxy [currently iptables])",
                modes.join(", ")
            ),
        ));
    }
    if config.burst < 0 {
        errors.push(invalid(
            &path("ClientConnection.Burst"),
            config.burst,
            non_negative,
        ));
    }

    if config.config_sync_period.0 <= 0 {
        errors.push(invalid(
            &path("ConfigSyncPeriod"),
            dur(config.config_sync_period),
            "must be greater than 0",
        ));
    }
    if config.sync_period.0 <= 0 {
        errors.push(invalid(
            &path("SyncPeriod"),
            dur(config.sync_period),
            "must be greater than 0",
        ));
    }
    if config.min_sync_period.is_negative() {
        errors.push(invalid(
            &path("MinSyncPeriod"),
            dur(config.min_sync_period),
            non_negative,
        ));
    }
    if config.min_sync_period > config.sync_period {
        errors.push(invalid(
            &path("SyncPeriod"),
            dur(config.min_sync_period),
            &format!("must be greater than or equal to {}", path("MinSyncPeriod")),
        ));
    }

    if parse_ip_sloppy(&config.bind_address).is_none() {
        errors.push(invalid(
            &path("BindAddress"),
            quoted(&config.bind_address),
            "not a valid textual representation of an IP address",
        ));
    }
    if !config.healthz_bind_address.is_empty() {
        host_port(
            &config.healthz_bind_address,
            &path("HealthzBindAddress"),
            &mut errors,
        );
    }
    host_port(
        &config.metrics_bind_address,
        &path("MetricsBindAddress"),
        &mut errors,
    );

    let mut seen = Vec::new();
    for (i, entry) in config.node_port_addresses.iter().enumerate() {
        let at = path(&format!("NodePortAddresses[{i}]"));
        if matches!(entry.as_str(), "primary" | "localhost" | "all") {
            if seen.contains(entry) {
                errors.push(format!("{at}: Duplicate value: {}", quoted(entry)));
            }
            seen.push(entry.clone());
            continue;
        }
        if parse_cidr(entry).is_none() {
            errors.push(invalid(
                &at,
                quoted(entry),
                "must be a valid CIDR or one of the keywords 'primary', 'localhost', 'all'",
            ));
        }
    }

    let hidden = &config.show_hidden_metrics_for_version;
    let previous = format!("1.{}", MINOR - 1);
    if !hidden.is_empty() && *hidden != previous {
        let inner = invalid(
            "showHiddenMetricsForVersion",
            quoted(hidden),
            &format!(
                "must be omitted or have the value '{previous}'; only the previous minor version is allowed"
            ),
        );
        errors.push(invalid(
            &path("ShowHiddenMetricsForVersion"),
            quoted(hidden),
            &format!("invalid showHiddenMetricsForVersion: {inner}"),
        ));
    }

    const LOCAL_MODES: [&str; 5] = [
        "ClusterCIDR",
        "NodeCIDR",
        "BridgeInterface",
        "InterfaceNamePrefix",
        "",
    ];
    if !LOCAL_MODES.contains(&config.detect_local_mode.as_str()) {
        errors.push(format!(
            "{}: Unsupported value: {}: supported values: {}",
            path("DetectLocalMode"),
            quoted(&config.detect_local_mode),
            LOCAL_MODES.map(quoted).join(", ")
        ));
    }
    let detect = path("DetectLocalConfiguration");
    match config.detect_local_mode.as_str() {
        "BridgeInterface" if config.bridge_interface.is_empty() => errors.push(invalid(
            &format!("{detect}.InterfaceName"),
            "\"\"",
            "must not be empty",
        )),
        "InterfaceNamePrefix" if config.interface_name_prefix.is_empty() => errors.push(invalid(
            &format!("{detect}.InterfacePrefix"),
            "\"\"",
            "must not be empty",
        )),
        "ClusterCIDR" if !config.cluster_cidrs.is_empty() => cluster_cidrs(
            &config.cluster_cidrs,
            &format!("{detect}.ClusterCIDRs"),
            &mut errors,
        ),
        _ => {}
    }
    errors
}

/// upstream's `validateDualStackCIDRStrings`.
fn cluster_cidrs(cidrs: &[String], path: &str, errors: &mut Vec<String>) {
    let pair = "must be a either a single CIDR or dual-stack pair of CIDRs (e.g. [10.100.0.0/16, fde4:8dba:82e1::/48]";
    let json = || serde_json::to_string(cidrs).unwrap_or_default();
    if cidrs.len() > 2 {
        errors.push(invalid(path, json(), pair));
        return;
    }
    let parsed: Vec<Option<IpNet>> = cidrs.iter().map(|c| parse_cidr(c)).collect();
    for (i, (text, net)) in cidrs.iter().zip(&parsed).enumerate() {
        if net.is_none() {
            errors.push(invalid(
                &format!("{path}[{i}]"),
                quoted(text),
                "must be a valid CIDR block (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)",
            ));
        }
    }
    if let [Some(a), Some(b)] = parsed.as_slice() {
        let v4 = |n: &IpNet| matches!(n.addr(), IpAddr::V4(_));
        if v4(a) == v4(b) {
            errors.push(invalid(path, json(), pair));
        }
    }
}
