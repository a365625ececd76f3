//! The agent's command line, configuration layers and validation, through the binary itself:
//! every upstream proxy-agent flag (tests/fixtures/upstream-agent-flags.tsv) parses with its
//! default, upstream's messages, and the TOML and environment layers.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::process::Command;

use clap::CommandFactory;
use kube_traffic::agent::AgentOptions;

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn run(args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut command = Command::new(env!("CARGO_BIN_EXE_konnectivity-agent"));
    command.args(args).env_remove("PROXY_AGENT_ID");
    for (name, _) in std::env::vars() {
        if name.starts_with("KONNECTIVITY_AGENT_") {
            command.env_remove(name);
        }
    }
    for (k, v) in env {
        command.env(k, v);
    }
    let out = command.output().expect("run konnectivity-agent");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn upstream_flags() -> Vec<(String, String, String)> {
    include_str!("fixtures/upstream-agent-flags.tsv")
        .lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with("name\t"))
        .map(|l| {
            let mut cols = l.split('\t').map(str::to_string);
            let mut next = || cols.next().unwrap_or_default();
            (next(), next(), next())
        })
        .collect()
}

#[test]
fn every_upstream_flag_exists_with_upstreams_default() {
    let flags = upstream_flags();
    assert_eq!(
        flags.len(),
        44,
        "the fixture lists every flag of proxy-agent v0.36.0"
    );
    let command = AgentOptions::command();
    for (name, kind, default) in &flags {
        if name == "help" {
            continue;
        }
        let arg = command
            .get_arguments()
            .find(|a| a.get_long() == Some(name.as_str()))
            .unwrap_or_else(|| panic!("--{name} is missing"));
        let ours: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .collect();
        let ours = ours.join(",");
        let same = match kind.as_str() {
            "bool" => {
                ours == if default.is_empty() {
                    "false"
                } else {
                    default.as_str()
                }
            }
            _ => ours == *default,
        };
        assert!(same, "--{name}: default {ours:?}, upstream's {default:?}");
    }
}

#[test]
fn the_flags_upstreams_test_framework_passes_all_parse() {
    // tests/framework/agent.go passes every flag as --name=value, empty values included.
    let args = [
        "--admin-bind-address=127.0.0.1",
        "--admin-server-port=18094",
        "--agent-cert=",
        "--agent-id=5d1a2b0c-0000-4000-8000-000000000001",
        "--agent-identifiers=",
        "--agent-key=",
        "--alpn-proto=[]",
        "--ca-cert=",
        "--count-server-leases=false",
        "--enable-contention-profiling=false",
        "--enable-profiling=false",
        "--health-server-host=127.0.0.1",
        "--health-server-port=18093",
        "--keepalive-time=1h0m0s",
        "--kube-api-content-type=application/vnd.kubernetes.protobuf",
        "--kubeconfig=",
        "--lease-label=k8s-app=konnectivity-server",
        "--lease-namespace=kube-system",
        "--probe-interval=100ms",
        "--proxy-server-host=127.0.0.1",
        "--proxy-server-port=18091",
        "--server-count-source=default",
        "--service-account-token-path=",
        "--sync-forever=false",
        "--sync-interval=100ms",
        "--sync-interval-cap=1s",
        "--warn-on-channel-limit=false",
        "--xfr-channel-size=150",
        "--config=",
        "--write-config-to=-",
    ];
    let out = run(&args, &[]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout.contains("alpn_proto = [\"[]\"]"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("sync_interval = \"100ms\""),
        "{}",
        out.stdout
    );
}

#[test]
fn bad_flags_and_values_fail_with_upstreams_words() {
    let out = run(&["--config=", "--nope"], &[]);
    assert_eq!(out.code, 1);
    assert!(
        out.stderr.starts_with("Error: unknown flag: --nope"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("Usage:\n  konnectivity-agent [flags]"),
        "{}",
        out.stderr
    );
    // klog's flags are not normalised on the agent: the underscore spelling is unknown.
    let out = run(&["--config=", "--log_dir=/tmp"], &[]);
    assert_eq!(out.code, 1);
    assert!(
        out.stderr.contains("unknown flag: --log_dir"),
        "{}",
        out.stderr
    );
    let out = run(&["--config=", "--xfr-channel-size=0"], &[]);
    assert_eq!(out.code, 1);
    assert!(
        out.stderr.contains(
            "failed to validate agent options with channel size 0 must be greater than 0"
        ),
        "{}",
        out.stderr
    );
    let out = run(&["--config=", "--sync-interval=x"], &[]);
    assert_eq!(out.code, 1);
    assert!(
        out.stderr
            .contains("invalid argument \"x\" for \"--sync-interval\" flag"),
        "{}",
        out.stderr
    );
    // An empty --ca-cert is read as the current directory, as upstream: a clear failure.
    let out = run(&["--config=", "--proxy-server-port=1"], &[]);
    assert_eq!(out.code, 1);
    assert!(out.stderr.contains("CA cert"), "{}", out.stderr);
}

#[test]
fn layers_file_environment_flags_and_upstreams_id_variable() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("agent.toml");
    std::fs::write(
        &file,
        "proxy_server_port = 9001\nsync_interval = \"2s\"\nsync_interval_cap = \"20s\"\n",
    )
    .unwrap();
    let config = format!("--config={}", file.display());
    let out = run(
        &[&config, "--write-config-to=-"],
        &[
            ("KONNECTIVITY_AGENT_PROXY_SERVER_PORT", "9002"),
            ("PROXY_AGENT_ID", "node-7"),
        ],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout.contains("proxy_server_port = 9002\n"),
        "environment beats file: {}",
        out.stdout
    );
    assert!(
        out.stdout.contains("sync_interval = \"2s\"\n"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("agent_id = \"node-7\"\n"),
        "{}",
        out.stdout
    );
    let out = run(
        &[
            &config,
            "--write-config-to=-",
            "--proxy-server-port=9003",
            "--agent-id=flag",
        ],
        &[
            ("KONNECTIVITY_AGENT_PROXY_SERVER_PORT", "9002"),
            ("PROXY_AGENT_ID", "node-7"),
        ],
    );
    assert!(
        out.stdout.contains("proxy_server_port = 9003\n"),
        "flags beat everything: {}",
        out.stdout
    );
    assert!(
        out.stdout.contains("agent_id = \"flag\"\n"),
        "{}",
        out.stdout
    );
    std::fs::write(&file, "proxy_server_port = 9001\nsync_intervall = \"2s\"\n").unwrap();
    let out = run(&[&config, "--write-config-to=-"], &[]);
    assert_eq!(out.code, 1);
    assert!(
        out.stderr.contains("sync_intervall"),
        "names the key: {}",
        out.stderr
    );
    assert!(
        out.stderr.contains("line 2"),
        "and its line: {}",
        out.stderr
    );
}

#[test]
fn the_reference_file_holds_every_key_at_its_default_and_the_template_parses() {
    let reference = concat!(env!("CARGO_MANIFEST_DIR"), "/config/agent.toml");
    let defaults = run(&["--config=", "--write-config-to=-"], &[]);
    let from_file = run(
        &[&format!("--config={reference}"), "--write-config-to=-"],
        &[],
    );
    assert_eq!(from_file.code, 0, "{}", from_file.stderr);
    assert_eq!(
        from_file.stdout, defaults.stdout,
        "config/agent.toml changes nothing"
    );
    let text = std::fs::read_to_string(reference).unwrap();
    for line in defaults.stdout.lines() {
        let key = line.split(" = ").next().unwrap();
        assert!(
            text.lines().any(|l| l.starts_with(&format!("{key} = "))),
            "config/agent.toml lacks {key}"
        );
    }
    let template = concat!(env!("CARGO_MANIFEST_DIR"), "/config/agent.toml.deploy");
    let out = run(
        &[&format!("--config={template}"), "--write-config-to=-"],
        &[],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout.contains("graceful_shutdown_timeout = \"1m0s\""),
        "{}",
        out.stdout
    );
}

#[test]
fn check_config_loads_the_certificates_and_reads_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let (pki, _) = kube_traffic::tls::DevPki::ensure(&dir.path().join("pki")).unwrap();
    let ca = format!("--ca-cert={}", pki.ca_cert.display());
    let cert = format!("--agent-cert={}", pki.agent_cert.display());
    let key = format!("--agent-key={}", pki.agent_key.display());
    let out = run(&["--config=", "--check-config", &ca, &cert, &key], &[]);
    assert_eq!(
        (out.code, out.stdout.trim()),
        (0, "configuration OK (no config file)"),
        "{}",
        out.stderr
    );
    // A key that does not match the certificate.
    let wrong = format!("--agent-key={}", pki.server_key.display());
    let out = run(&["--config=", "--check-config", &ca, &cert, &wrong], &[]);
    assert_eq!(out.code, 1);
    assert!(
        out.stdout.starts_with("configuration invalid"),
        "{}",
        out.stdout
    );
    // A token file that exists but cannot be read (a directory).
    let token = format!("--service-account-token-path={}", dir.path().display());
    let out = run(&["--config=", "--check-config", &ca, &token], &[]);
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert!(out.stdout.contains("token"), "{}", out.stdout);
}
