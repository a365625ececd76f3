//! upstream's `FLAG: --name="value"` lines (`cliflag.PrintFlags`, logged at V(1)): every flag
//! of upstream's, in name order, with the value in effect as pflag prints it.

use clap::CommandFactory;
use figment::value::Value;

use super::Internal;
use crate::kube_proxy::options::KubeProxyOptions;

/// Ours, or removed upstream: not in upstream's flag set.
const NOT_UPSTREAMS: &[&str] = &[
    "check-config",
    "log-format",
    "logtostderr",
    "alsologtostderr",
    "log-dir",
    "log-file",
    "log-file-max-size",
    "log-backtrace-at",
    "stderrthreshold",
    "alsologtostderrthreshold",
    "legacy-stderr-threshold-behavior",
    "add-dir-header",
    "skip-headers",
    "skip-log-headers",
    "one-output",
    "cleanup-ipvs",
    "proxy-port-range",
    "udp-timeout",
];

/// pflag's `String()` of a value.
fn text(value: &Value) -> String {
    match value {
        Value::String(_, s) => s.clone(),
        Value::Char(_, c) => c.to_string(),
        Value::Bool(_, b) => b.to_string(),
        Value::Num(_, n) => {
            if let Some(i) = n.to_i128() {
                i.to_string()
            } else if let Some(u) = n.to_u128() {
                u.to_string()
            } else {
                match n.to_f64() {
                    Some(x) if x.fract() == 0.0 && x.abs() < 1e15 => format!("{}", x as i64),
                    Some(x) => format!("{x}"),
                    None => String::new(),
                }
            }
        }
        Value::Empty(..) => String::new(),
        Value::Array(_, items) => {
            let items: Vec<String> = items.iter().map(text).collect();
            format!("[{}]", items.join(","))
        }
        Value::Dict(_, map) => {
            let pairs: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{k}={}", text(v)))
                .collect();
            pairs.join(",")
        }
    }
}

/// The lines, `--name="value"` (the caller prefixes `FLAG: `). The mode and local-detection
/// mode show upstream's defaults, which its completion writes into the flags' storage.
pub fn flag_lines(options: &KubeProxyOptions) -> Vec<String> {
    let completed = Internal::complete(options).ok().map(|(c, _)| c);
    let completed_or = |pick: fn(&Internal) -> &String, raw: &String| {
        completed.as_ref().map(pick).unwrap_or(raw).clone()
    };
    let values = Value::serialize(options)
        .ok()
        .and_then(|v| v.into_dict())
        .unwrap_or_default();
    let mut lines = Vec::new();
    let command = KubeProxyOptions::command();
    let mut names: Vec<&str> = command
        .get_arguments()
        .filter_map(|arg| arg.get_long())
        .filter(|name| !NOT_UPSTREAMS.contains(name))
        .chain(["help"])
        .collect();
    names.sort_unstable();
    for name in names {
        let value = match name {
            "help" => "false".to_string(),
            "version" => options.version.clone(),
            "config" => options
                .config
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            "write-config-to" => options.write_config_to.clone(),
            "cleanup" => options.cleanup.to_string(),
            "init-only" => options.init_only.to_string(),
            "healthz-port" => options.healthz_port.to_string(),
            "metrics-port" => options.metrics_port.to_string(),
            // Bound to the configuration upstream completes in place.
            "proxy-mode" => completed_or(|c| &c.mode, &options.proxy_mode),
            "detect-local-mode" => {
                completed_or(|c| &c.detect_local_mode, &options.detect_local_mode)
            }
            "vmodule" => options.vmodule_text(),
            other => values
                .get(&other.replace('-', "_"))
                .map(text)
                .unwrap_or_default(),
        };
        lines.push(format!("--{name}={value:?}"));
    }
    lines
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use clap::Parser;

    use super::*;

    #[test]
    fn lines_print_as_pflag_does() {
        let options = KubeProxyOptions::try_parse_from([
            "kube-proxy",
            "--nodeport-addresses=primary,1.2.3.0/24",
            "--vmodule=a=1",
            "--feature-gates=KubeProxyNFTablesLocalhostNodePorts=true",
        ])
        .unwrap();
        let lines = flag_lines(&options);
        for want in [
            "--bind-address=\"0.0.0.0\"",
            "--config-sync-period=\"15m0s\"",
            "--detect-local-mode=\"ClusterCIDR\"",
            "--feature-gates=\"KubeProxyNFTablesLocalhostNodePorts=true\"",
            "--help=\"false\"",
            "--ipvs-exclude-cidrs=\"[]\"",
            "--kube-api-qps=\"5\"",
            "--nodeport-addresses=\"[primary,1.2.3.0/24]\"",
            "--proxy-mode=\"iptables\"",
            "--v=\"0\"",
            "--version=\"false\"",
            "--vmodule=\"a=1\"",
        ] {
            assert!(lines.iter().any(|l| l == want), "{want} in {lines:#?}");
        }
        assert_eq!(
            lines.len(),
            57,
            "upstream's 55 flags and its two hidden ones"
        );
        assert!(!lines.iter().any(|l| l.starts_with("--logtostderr")));
    }
}
