//! kube-proxy's command line, configuration files, layers and validation, through the binary:
//! every flag of upstream's `--help` (tests/fixtures/kube-proxy-help.txt, upstream v1.37.2's
//! own output) with its type, default and help text; the configuration upstream writes for
//! the same inputs (tests/fixtures/kube-proxy/upstream-written-*.yaml, written by upstream
//! v1.37.2's `--write-config-to`); upstream's validation messages; our TOML and environment.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

#[path = "kube_proxy_config/harness.rs"]
mod harness;
#[path = "kube_proxy_config/messages.rs"]
mod messages;

use clap::CommandFactory;
use harness::{fixture, read_fixture, run, temp_file, written};
use kube_traffic::kube_proxy::options::KubeProxyOptions;

/// One flag of upstream's help: name, type (empty for a bool), default (None when the help
/// shows none, that is the type's zero value) and help text.
struct Flag {
    name: String,
    kind: String,
    default: Option<String>,
    help: String,
}

/// The flags of upstream's `--help`: `      --name type   text (default x)`, the text from
/// column 53 and continued on the lines below it.
fn upstream_flags() -> Vec<Flag> {
    let help = include_str!("fixtures/kube-proxy-help.txt");
    let mut flags: Vec<Flag> = Vec::new();
    for line in help.lines().skip_while(|l| *l != "Flags:").skip(1) {
        let (head, text) = line.split_at(line.len().min(53));
        let head = head.trim();
        if head.is_empty() {
            let last = flags.last_mut().unwrap();
            last.help.push('\n');
            last.help.push_str(text);
            continue;
        }
        // A shorthand first: `-v, --v Level`.
        let head = match head.split_once(", ") {
            Some((short, long)) if short.len() == 2 && short.starts_with('-') => long,
            _ => head,
        };
        let mut words = head.trim_start_matches("--").split_whitespace();
        let name = words.next().unwrap().to_string();
        let kind = words.next().unwrap_or_default().to_string();
        flags.push(Flag {
            name,
            kind,
            default: None,
            help: text.to_string(),
        });
    }
    for flag in &mut flags {
        if let Some(at) = flag.help.rfind(" (default ") {
            let value = flag.help[at + 10..].trim_end_matches(')').to_string();
            flag.default = Some(value.trim_matches('"').to_string());
            flag.help.truncate(at);
        }
    }
    flags
}

#[test]
fn every_upstream_flag_exists_with_upstreams_type_default_and_help() {
    let flags = upstream_flags();
    assert_eq!(
        flags.len(),
        55,
        "the fixture lists kube-proxy v1.37.2's flags"
    );
    let command = KubeProxyOptions::command();
    for flag in &flags {
        if flag.name == "help" {
            continue;
        }
        let arg = command
            .get_arguments()
            .find(|a| a.get_long() == Some(flag.name.as_str()))
            .unwrap_or_else(|| panic!("--{} is missing", flag.name));
        assert!(!arg.is_hide_set(), "--{} is hidden", flag.name);
        let ours: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .collect();
        let ours = ours.join(",");
        let zero = match flag.kind.as_str() {
            "" => "false",
            "duration" => "0s",
            "int32" | "float32" | "Level" | "quantity" => "0",
            "version[=true]" => "false",
            _ => "",
        };
        let want = flag.default.clone().unwrap_or_else(|| zero.to_string());
        assert_eq!(ours, want, "--{}: default", flag.name);
        if !flag.kind.is_empty() {
            let names: Vec<String> = arg
                .get_value_names()
                .unwrap_or_default()
                .iter()
                .map(|n| n.to_string())
                .collect();
            assert_eq!(names, [flag.kind.as_str()], "--{}: type", flag.name);
        }
        let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
        assert_eq!(help, flag.help, "--{}: help text", flag.name);
    }
}

#[test]
fn every_upstream_flag_accepts_its_default_as_a_value() {
    // Each flag given its default explicitly changes nothing in what is written.
    let mut args: Vec<String> = Vec::new();
    for flag in upstream_flags() {
        let Some(default) = flag.default else {
            continue;
        };
        if ["help", "version", "write-config-to"].contains(&flag.name.as_str()) {
            continue;
        }
        args.push(format!("--{}={default}", flag.name));
    }
    assert_eq!(
        args.len(),
        20,
        "the flags whose help shows a default: {args:?}"
    );
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_eq!(
        written(&refs, &[], "x.yaml"),
        read_fixture("upstream-written-defaults.yaml")
    );
}

#[test]
fn the_reference_command_line_parses_and_validates() {
    let args = [
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
    ];
    let result = run(&[&args[..], &["--check-config"]].concat(), &[]);
    assert_eq!(result.code, 0, "{}", result.stderr);
    assert_eq!(result.stdout, "configuration OK (no config file)\n");
    assert_eq!(
        result.stderr.matches("--logtostderr was removed").count(),
        1,
        "one warning naming the removed flag: {}",
        result.stderr
    );
    // The same command line without the flag upstream no longer has: upstream's own output.
    assert_eq!(
        written(&args, &[], "x.yaml"),
        read_fixture("upstream-written-reference-flags.yaml")
    );
}

#[test]
fn written_configuration_is_upstreams_for_the_same_input() {
    assert_eq!(
        written(&[], &[], "x.yaml"),
        read_fixture("upstream-written-defaults.yaml")
    );
    assert_eq!(
        written(&["--proxy-mode=nftables"], &[], "x.yaml"),
        read_fixture("upstream-written-nftables-flags.yaml")
    );
    for (input, expected) in [
        (
            "kubeadm-config.conf",
            "upstream-written-kubeadm-config.yaml",
        ),
        (
            "nftables-sections.yaml",
            "upstream-written-nftables-sections.yaml",
        ),
        ("ipvs.json", "upstream-written-ipvs.yaml"),
    ] {
        let config = format!("--config={}", fixture(input).display());
        assert_eq!(
            written(&[&config], &[], "x.yaml"),
            read_fixture(expected),
            "{input}"
        );
    }
}

#[test]
fn sync_periods_and_masquerade_all_come_from_the_modes_section() {
    let config = format!("--config={}", fixture("nftables-sections.yaml").display());
    let yaml = written(&[&config], &[], "x.yaml");
    // mode nftables: the iptables section's 10s, 5s and masqueradeAll are not read.
    assert!(
        yaml.contains("nftables:\n  masqueradeAll: false\n  masqueradeBit: 3\n  minSyncPeriod: 2s\n  syncPeriod: 30s\n"),
        "{yaml}"
    );
    assert!(yaml.contains("iptables:\n  localhostNodePorts: true\n  masqueradeAll: false\n  masqueradeBit: 14\n  minSyncPeriod: 0s\n  syncPeriod: 0s\n"));
    // On the command line, --iptables-* applies in every mode but ipvs.
    let yaml = written(
        &[
            "--proxy-mode=nftables",
            "--iptables-sync-period=10s",
            "--masquerade-all",
        ],
        &[],
        "x.yaml",
    );
    assert!(yaml.contains("nftables:\n  masqueradeAll: true\n  masqueradeBit: 14\n  minSyncPeriod: 1s\n  syncPeriod: 10s\n"), "{yaml}");
    let yaml = written(
        &[
            "--proxy-mode=ipvs",
            "--iptables-sync-period=10s",
            "--ipvs-min-sync-period=2s",
        ],
        &[],
        "x.yaml",
    );
    assert!(
        yaml.contains(
            "  minSyncPeriod: 2s\n  scheduler: \"\"\n  strictARP: false\n  syncPeriod: 30s\n"
        ),
        "{yaml}"
    );
}

#[test]
fn an_unknown_key_is_named_with_its_line_and_a_wrong_type_stops_the_start() {
    let (_dir, path) = temp_file(
        "config.yaml",
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: nftables\nnftables:\n  syncPerod: 10s\n",
    );
    let config = format!("--config={}", path.display());
    let result = run(&[&config, "--check-config"], &[]);
    assert_eq!(result.code, 0, "{}", result.stderr);
    assert!(
        result.stderr.contains("using lenient decoding as strict decoding failed: strict decoding error: unknown field \\\"nftables.syncPerod\\\" (line 5)"),
        "{}",
        result.stderr
    );

    let (_dir, path) = temp_file(
        "config.yaml",
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nconntrack:\n  maxPerCore: many\n",
    );
    let result = run(&[&format!("--config={}", path.display())], &[]);
    assert_eq!(result.code, 1);
    assert!(
        result
            .stderr
            .contains("Error: failed complete: config file ")
            && result
                .stderr
                .contains("failed to decode: line 4: conntrack.maxPerCore: "),
        "{}",
        result.stderr
    );

    // Our TOML: an unknown key is an error naming it and its line, as the other programs'.
    let (_dir, path) = temp_file(
        "kube-proxy.toml",
        "proxy_mode = \"nftables\"\nproxy_mod = 1\n",
    );
    let result = run(&[&format!("--config={}", path.display())], &[]);
    assert_eq!(result.code, 1);
    assert!(
        result.stderr.contains("proxy_mod") && result.stderr.contains("line 2"),
        "{}",
        result.stderr
    );
}

#[test]
fn removed_and_deprecated_flags_are_accepted_with_one_warning_each() {
    let result = run(
        &[
            "--alsologtostderr=false",
            "--log_dir=/tmp",
            "--log-backtrace-at=",
            "--stderrthreshold=2",
            "--cleanup-ipvs=true",
            "--proxy-port-range=30000-32767",
            "--udp-timeout=250ms",
            "--healthz-port=10256",
            "--skip-headers=false",
            "--log-file-max-size=1800",
            "--check-config",
        ],
        &[],
    );
    assert_eq!(result.code, 0, "{}", result.stderr);
    for flag in [
        "alsologtostderr",
        "log-dir",
        "log-backtrace-at",
        "stderrthreshold",
        "cleanup-ipvs",
        "proxy-port-range",
        "udp-timeout",
        "skip-headers",
        "log-file-max-size",
    ] {
        let warning = format!("--{flag} was removed from upstream kube-proxy; accepted: ");
        assert_eq!(
            result.stderr.matches(&warning).count(),
            1,
            "{flag}: {}",
            result.stderr
        );
    }
    assert!(result.stderr.contains("Flag --healthz-port has been deprecated, This flag is deprecated and will be removed in a future release. Please use --healthz-bind-address instead."));
}

#[test]
fn flags_given_with_a_kube_proxy_configuration_are_applied_with_a_warning() {
    let config = format!("--config={}", fixture("kubeadm-config.conf").display());
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.yaml");
    let target = format!("--write-config-to={}", out.display());
    let result = run(
        &[
            &config,
            "--proxy-mode=nftables",
            "--v=3",
            "--hostname-override=Node-A",
            &target,
        ],
        &[],
    );
    assert_eq!(result.code, 0, "{}", result.stderr);
    assert!(
        result.stderr.contains(
            "upstream kube-proxy ignores --proxy-mode when --config is set; applying them"
        ),
        "{}",
        result.stderr
    );
    let yaml = std::fs::read_to_string(out).unwrap();
    assert!(yaml.contains("\nmode: nftables\n"));
    assert!(yaml.contains("\n  verbosity: 3\n"));
    assert!(yaml.contains("\nhostnameOverride: node-a\n"));
    let result = run(&[&config, "--metrics-port=0", "--check-config"], &[]);
    assert_eq!(
        result.code, 0,
        "upstream ignores the port with --config: {}",
        result.stderr
    );
    assert!(result
        .stderr
        .contains("--metrics-port is ignored with a KubeProxyConfiguration"));
    assert!(
        yaml.contains("\n  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf\n"),
        "the file's values stay"
    );
}

#[test]
fn the_environment_layers_between_the_file_and_the_flags() {
    let (_dir, path) = temp_file(
        "kube-proxy.toml",
        "proxy_mode = \"ipvs\"\nconntrack_max_per_core = 0\nipvs_scheduler = \"sh\"\n",
    );
    let config = format!("--config={}", path.display());
    let env = [
        ("KUBE_PROXY_PROXY_MODE", "nftables"),
        ("KUBE_PROXY_NODEPORT_ADDRESSES", "10.0.0.0/8,primary"),
        (
            "KUBE_PROXY_FEATURE_GATES",
            "KubeProxyNFTablesLocalhostNodePorts=true",
        ),
        ("KUBE_PROXY_NFTABLES_SKIP_KERNEL_VERSION_CHECK", "1"),
    ];
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.yaml");
    let target = format!("--write-config-to={}", out.display());
    let result = run(&[&config, "--oom-score-adj=-500", &target], &env);
    assert_eq!(result.code, 0, "{}", result.stderr);
    assert!(
        !result.stderr.contains("NFTABLES_SKIP"),
        "upstream's own variable is not a setting: {}",
        result.stderr
    );
    let yaml = std::fs::read_to_string(out).unwrap();
    assert!(
        yaml.contains("\nmode: nftables\n"),
        "env beats file: {yaml}"
    );
    assert!(
        yaml.contains("\n  maxPerCore: 0\n"),
        "the file's value stays"
    );
    assert!(yaml.contains("\nnodePortAddresses:\n- 10.0.0.0/8\n- primary\n"));
    assert!(yaml.contains("\nfeatureGates:\n  KubeProxyNFTablesLocalhostNodePorts: true\n"));
    assert!(yaml.contains("\noomScoreAdj: -500\n"));
    let yaml = written(&[&config, "--proxy-mode=iptables"], &env, "x.yaml");
    assert!(yaml.contains("\nmode: iptables\n"), "flag beats env");

    let result = run(&[], &[("KUBE_PROXY_CONNTRACK_MIN", "lots")]);
    assert_eq!(result.code, 1);
    assert!(
        result.stderr.contains("KUBE_PROXY_CONNTRACK_MIN"),
        "{}",
        result.stderr
    );
}

#[test]
fn written_configuration_loads_back_to_the_same_in_both_formats() {
    let args = [
        "--proxy-mode=nftables",
        "--cluster-cidr=10.244.0.0/16,fd00::/56",
        "--nodeport-addresses=primary,10.0.0.0/8",
        "--feature-gates=KubeProxyNFTablesLocalhostNodePorts=true",
        "--iptables-min-sync-period=2s",
        "--conntrack-max-per-core=0",
        "--vmodule=proxier=4",
        "--healthz-bind-address=[::]:10256",
        "--masquerade-all",
    ];
    let yaml = written(&args, &[], "x.yaml");
    let (_dir, path) = temp_file("written.yaml", &yaml);
    let again = written(&[&format!("--config={}", path.display())], &[], "y.yaml");
    assert_eq!(again, yaml, "YAML round trip");

    let toml = written(&args, &[], "x.toml");
    assert!(toml.contains("proxy_mode = \"nftables\""), "{toml}");
    let (_dir, path) = temp_file("written.toml", &toml);
    let config = format!("--config={}", path.display());
    assert_eq!(written(&[&config], &[], "y.toml"), toml, "TOML round trip");
    assert_eq!(
        written(&[&config], &[], "y.yaml"),
        yaml,
        "the same configuration"
    );
}

#[test]
fn check_config_version_help_and_underscores() {
    let result = run(&["--check-config"], &[]);
    assert_eq!(result.code, 0);
    assert_eq!(result.stdout, "configuration OK (no config file)\n");
    let result = run(&["--check-config", "--proxy-mode=userspace"], &[]);
    assert_eq!(result.code, 1);
    assert!(result.stdout.starts_with("configuration invalid (no config file): failed validate: KubeProxyConfiguration.Mode.ProxyMode"));

    let result = run(&["--version"], &[]);
    assert_eq!(result.code, 0);
    assert_eq!(
        result.stdout,
        format!(
            "Kubernetes v1.37.2+kube-traffic.{}\n",
            env!("CARGO_PKG_VERSION")
        )
    );
    let result = run(&["--version=raw"], &[]);
    assert!(
        result
            .stdout
            .starts_with("version.Info{Major:\"1\", Minor:\"37\", "),
        "{}",
        result.stdout
    );
    assert_eq!(
        run(&["--version=v1.37.2-custom", "--check-config"], &[]).stdout,
        "configuration OK (no config file)\n"
    );

    let result = run(&["--help"], &[]);
    assert_eq!(result.code, 0);
    assert!(result.stdout.contains("--iptables-localhost-nodeports"));
    assert!(
        !result.stdout.contains("--logtostderr"),
        "removed flags are hidden"
    );

    // An empty ip or ipport flag keeps the default, as upstream's.
    let yaml = written(
        &["--bind-address=", "--healthz-bind-address="],
        &[],
        "x.yaml",
    );
    assert_eq!(yaml, read_fixture("upstream-written-defaults.yaml"));
    // cobra reads `_` in a flag name as `-`.
    let result = run(&["--log_flush_frequency=0"], &[]);
    assert!(
        result.stderr.contains("logging.flushFrequency"),
        "{}",
        result.stderr
    );
    // --cleanup programs the network namespace it runs in: run's own, never the machine's.
    let cleanup = run(&["--cleanup", "--init-only"], &[]);
    assert_eq!(cleanup.code, 0, "{}", cleanup.stderr);
}

#[test]
fn the_reference_toml_holds_every_key_at_its_default() {
    let reference = concat!(env!("CARGO_MANIFEST_DIR"), "/config/kube-proxy.toml");
    let defaults = written(&["--config="], &[], "x.toml");
    let from_file = written(&[&format!("--config={reference}")], &[], "x.toml");
    assert_eq!(
        from_file, defaults,
        "config/kube-proxy.toml changes nothing"
    );
    let text = std::fs::read_to_string(reference).unwrap();
    for line in defaults.lines().filter(|l| l.contains(" = ")) {
        let key = line.split(" = ").next().unwrap();
        assert!(
            text.lines().any(|l| l.starts_with(&format!("{key} = "))),
            "config/kube-proxy.toml lacks {key}"
        );
    }
    assert!(text.contains("\n[feature_gates]\n"));
}

/// The packaged /etc/kubernetes/kube-proxy.toml (config/kube-proxy.toml.deploy) loads and says
/// what the package promises: the kubeconfig whose presence the unit waits for, nftables mode.
#[test]
fn the_packaged_template_loads_and_names_the_units_kubeconfig() {
    let template = concat!(env!("CARGO_MANIFEST_DIR"), "/config/kube-proxy.toml.deploy");
    let toml = written(&[&format!("--config={template}")], &[], "x.toml");
    let kubeconfig = "/etc/kubernetes/kube-proxy.kubeconfig";
    assert!(
        toml.contains(&format!("kubeconfig = \"{kubeconfig}\"")),
        "{toml}"
    );
    assert!(toml.contains("proxy_mode = \"nftables\""), "{toml}");
    let unit = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/systemd/kube-proxy.service"
    ))
    .unwrap();
    assert!(
        unit.lines()
            .any(|l| l == format!("ConditionPathExists={kubeconfig}")),
        "the unit waits for another kubeconfig"
    );
}
