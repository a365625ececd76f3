//! kube-proxy's command line and layers, on the shared path (`cli`, `config::layers`) with
//! what upstream's cobra command adds: flag names with `_` read as `-`, arguments refused,
//! `--version`, and the warnings about flags upstream removed or ignores with `--config`.

use std::ffi::OsString;
use std::process::ExitCode;

use crate::config::layers::{self, CommandLine};
use crate::config::ConfigError;
use crate::kube_proxy::options::{KubeProxyOptions, UPSTREAM_VERSION};

/// Flags upstream removed that we accept, and what each does here.
const REMOVED: &[(&str, &str)] = &[
    (
        "logtostderr",
        "false writes the log to --log-file or --log-dir (as konnectivity-server does)",
    ),
    (
        "alsologtostderr",
        "with --logtostderr=false, the log goes to stderr too",
    ),
    (
        "log-dir",
        "with --logtostderr=false, the log goes to <dir>/kube-proxy.log",
    ),
    (
        "log-file",
        "with --logtostderr=false, the log goes to this file",
    ),
    (
        "log-file-max-size",
        "the size in megabytes at which the log file starts over",
    ),
    ("log-backtrace-at", "it has no effect"),
    ("stderrthreshold", "it has no effect"),
    ("alsologtostderrthreshold", "it has no effect"),
    ("legacy-stderr-threshold-behavior", "it has no effect"),
    ("add-dir-header", "it has no effect"),
    ("skip-headers", "it has no effect"),
    ("skip-log-headers", "it has no effect"),
    ("one-output", "it has no effect"),
    (
        "cleanup-ipvs",
        "it has no effect: --cleanup removes the ipvs rules too",
    ),
    (
        "proxy-port-range",
        "it has no effect (it was for the userspace proxy)",
    ),
    (
        "udp-timeout",
        "it has no effect (it was for the userspace proxy)",
    ),
];

/// Flags upstream hides as deprecated, with pflag's notice.
const DEPRECATED: &[(&str, &str)] = &[
    ("healthz-port", "--healthz-bind-address"),
    ("metrics-port", "--metrics-bind-address"),
];

/// Flags upstream still applies when `--config` is set (the logging flags,
/// `--hostname-override`, `--master`, and those about the invocation), and ours.
const HONOURED_WITH_CONFIG: &[&str] = &[
    "v",
    "vmodule",
    "logging-format",
    "log-flush-frequency",
    "log-text-split-stream",
    "log-text-info-buffer-size",
    "log-json-split-stream",
    "log-json-info-buffer-size",
    "hostname-override",
    "master",
    "config",
    "write-config-to",
    "cleanup",
    "init-only",
    "version",
    "check-config",
    "log-format",
    "healthz-port",
    "metrics-port",
];

/// cobra's `WordSepNormalizeFunc`: `--log_dir` is `--log-dir`. Only flag names change, up
/// to a `--` that ends the flags.
pub fn normalize(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut done = false;
    args.into_iter()
        .enumerate()
        .map(|(i, arg)| {
            let Some(text) = arg.to_str() else {
                return arg;
            };
            if i == 0 || done || !text.starts_with("--") {
                return arg;
            }
            if text == "--" {
                done = true;
                return arg;
            }
            let (name, value) = match text.find('=') {
                Some(at) => text.split_at(at),
                None => (text, ""),
            };
            OsString::from(format!("--{}{value}", name[2..].replace('_', "-")))
        })
        .collect()
}

/// The flag names a command line gave (`--name`, `--name=v`, `-v`).
fn given_flags(args: &[OsString]) -> Vec<String> {
    let mut names = Vec::new();
    for arg in args.iter().skip(1).filter_map(|a| a.to_str()) {
        if arg == "--" {
            break;
        }
        let name = if let Some(long) = arg.strip_prefix("--") {
            long.split('=').next().unwrap_or_default()
        } else if arg.starts_with("-v") {
            "v"
        } else {
            continue;
        };
        if !name.is_empty() && !names.iter().any(|n| n == name) {
            names.push(name.to_string());
        }
    }
    names
}

/// Parses the process's command line as upstream's command does: errors as pflag words them
/// (exit 1), help to stdout (exit 0), and any argument that is not a flag refused.
pub fn parse() -> Result<CommandLine<KubeProxyOptions>, ExitCode> {
    parse_args(std::env::args_os())
}

pub fn parse_args(
    args: impl IntoIterator<Item = OsString>,
) -> Result<CommandLine<KubeProxyOptions>, ExitCode> {
    let args = normalize(args);
    let given = given_flags(&args);
    let mut line = match CommandLine::<KubeProxyOptions>::parse_as(args) {
        Ok(line) => line,
        Err(e) if !e.use_stderr() => {
            // --help: to stdout, exit 0.
            let _ = e.print();
            return Err(ExitCode::SUCCESS);
        }
        Err(e) => {
            // component-base's cli.Run: the usage first, then the error.
            let text = e.to_string();
            let text = text.strip_prefix("error: ").unwrap_or(&text);
            let (message, usage) = text.split_once('\n').unwrap_or((text, ""));
            eprint!("{}\n\nError: {message}\n", usage.trim_end());
            return Err(ExitCode::from(1));
        }
    };
    let extra: Vec<&String> = line.options.args.iter().filter(|a| !a.is_empty()).collect();
    if !extra.is_empty() {
        eprintln!(
            "Error: \"kube-proxy\" does not take any arguments, got {}",
            go_quoted_list(&line.options.args)
        );
        return Err(ExitCode::from(1));
    }
    line.options.given_flags = given;
    Ok(line)
}

/// Go's `%q` of a `[]string`: `["a" "b"]`.
fn go_quoted_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|i| format!("{i:?}")).collect();
    format!("[{}]", quoted.join(" "))
}

/// What `--version` prints, if it asks for a print (`true` or `raw`).
pub fn version_text(flag: &str) -> Option<String> {
    let ours = format!(
        "{UPSTREAM_VERSION}+kube-traffic.{}",
        env!("CARGO_PKG_VERSION")
    );
    match flag {
        "true" => Some(format!("Kubernetes {ours}")),
        "raw" => Some(format!(
            "version.Info{{Major:\"1\", Minor:\"37\", EmulationMajor:\"\", EmulationMinor:\"\", MinCompatibilityMajor:\"\", MinCompatibilityMinor:\"\", GitVersion:{ours:?}, GitCommit:\"\", GitTreeState:\"\", BuildDate:\"\", GoVersion:\"\", Compiler:\"rustc\", Platform:\"{}/{}\"}}",
            std::env::consts::OS,
            go_arch(),
        )),
        _ => None,
    }
}

fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        other => other,
    }
}

/// Merges the layers (defaults < file < environment < flags) and adds the warnings about the
/// command line: removed and deprecated flags, and flags upstream ignores with `--config`.
pub fn load(cli: &CommandLine<KubeProxyOptions>) -> Result<KubeProxyOptions, ConfigError> {
    let mut options = layers::load(cli)?;
    let given = &cli.options.given_flags;
    let mut warnings = Vec::new();
    for (flag, effect) in REMOVED {
        if given.iter().any(|g| g == flag) {
            warnings.push(format!(
                "--{flag} was removed from upstream kube-proxy; accepted: {effect}"
            ));
        }
    }
    for (flag, instead) in DEPRECATED {
        if given.iter().any(|g| g == flag) {
            warnings.push(format!(
                "Flag --{flag} has been deprecated, This flag is deprecated and will be removed in a future release. Please use {instead} instead."
            ));
        }
    }
    if options.kube_config_file || !options.write_config_to.is_empty() {
        for (flag, _) in DEPRECATED {
            if given.iter().any(|g| g == flag) {
                warnings.push(format!(
                    "--{flag} is ignored with a KubeProxyConfiguration --config or with --write-config-to, as upstream ignores it"
                ));
            }
        }
    }
    if options.kube_config_file {
        let ignored: Vec<String> = given
            .iter()
            .filter(|flag| {
                !HONOURED_WITH_CONFIG.contains(&flag.as_str())
                    && !REMOVED.iter().any(|(removed, _)| removed == flag)
            })
            .map(|flag| format!("--{flag}"))
            .collect();
        if !ignored.is_empty() {
            warnings.push(format!(
                "upstream kube-proxy ignores {} when --config is set; applying them",
                ignored.join(", ")
            ));
        }
    }
    if options.logging_format == "json" {
        warnings
            .push("--logging-format=json: the log is written in klog's text format".to_string());
    }
    options.load_warnings.extend(warnings);
    Ok(options)
}

/// Where `--write-config-to` writes, and in which format.
pub enum WriteFormat {
    /// upstream's v1alpha1 YAML.
    KubeProxyConfiguration,
    /// Our TOML (a path ending in `.toml`).
    Toml,
}

pub fn write_format(path: &str) -> WriteFormat {
    if path.ends_with(".toml") {
        WriteFormat::Toml
    } else {
        WriteFormat::KubeProxyConfiguration
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn underscores_in_flag_names_read_as_dashes() {
        let out = normalize(os(&[
            "kube-proxy",
            "--log_dir=/var/log/a_b",
            "--v",
            "2",
            "--",
            "--x_y",
        ]));
        assert_eq!(
            out,
            os(&[
                "kube-proxy",
                "--log-dir=/var/log/a_b",
                "--v",
                "2",
                "--",
                "--x_y"
            ])
        );
    }

    #[test]
    fn given_flags_are_named_once() {
        let given = given_flags(&os(&[
            "kube-proxy",
            "--v=2",
            "-v",
            "3",
            "--proxy-mode",
            "ipvs",
            "--cleanup",
        ]));
        assert_eq!(given, ["v", "proxy-mode", "cleanup"]);
    }

    #[test]
    fn arguments_are_listed_as_go_quotes_them() {
        assert_eq!(
            go_quoted_list(&["a".into(), "b c".into()]),
            "[\"a\" \"b c\"]"
        );
    }

    #[test]
    fn version_prints_upstreams_and_ours() {
        let text = version_text("true").unwrap();
        assert!(
            text.starts_with("Kubernetes v1.37.2+kube-traffic."),
            "{text}"
        );
        assert!(version_text("raw")
            .unwrap()
            .starts_with("version.Info{Major:\"1\", Minor:\"37\""));
        assert_eq!(version_text("false"), None);
        assert_eq!(version_text("v1.37.2-custom"), None);
    }
}
