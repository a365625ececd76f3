//! The kube-proxy under test, upstream's or ours, started inside a node namespace.

use std::path::{Path, PathBuf};

use super::procs::Proc;
use super::NODE_NAME;

/// Which program a side runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Impl {
    /// Upstream kube-proxy v1.37.2, built by tests/kube/build.sh.
    Upstream,
    /// This crate's `kube-proxy` binary.
    Ours,
}

impl Impl {
    pub fn binary(self, upstream_dir: &Path) -> PathBuf {
        match self {
            Impl::Upstream => upstream_dir.join("kube-proxy"),
            // option_env!: the binary target is being added while this harness is written; a
            // build without it still compiles, and selecting it then fails with this message.
            Impl::Ours => {
                PathBuf::from(option_env!("CARGO_BIN_EXE_kube-proxy").unwrap_or_else(|| {
                    panic!("this build has no kube-proxy binary target (CARGO_BIN_EXE_kube-proxy)")
                }))
            }
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Impl::Upstream => "upstream v1.37.2",
            Impl::Ours => "ours",
        }
    }
}

/// The flags both programs get, the same on both sides. Dual-stack values where upstream
/// reads one per family: IPv4 first (the Node's first InternalIP is IPv4, so IPv4 is the
/// primary family).
pub fn args(kubeconfig: &Path) -> Vec<String> {
    vec![
        "--proxy-mode=nftables".into(),
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--hostname-override={NODE_NAME}"),
        // nf_conntrack_max and the hash size are not writable inside a network namespace.
        "--conntrack-max-per-core=0".into(),
        "--cluster-cidr=10.244.0.0/16,fd00:10:244::/48".into(),
        "--nodeport-addresses=10.0.0.1/32,fd00:10::1/128".into(),
        "--v=2".into(),
        // Each side has its own namespace, so both use the defaults' ports.
        "--healthz-bind-address=0.0.0.0:10256".into(),
        "--metrics-bind-address=127.0.0.1:10249".into(),
    ]
}

/// A side's command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Args {
    /// [`args`], changed: each `--name=value` of `set` replaces the flag of that name or is
    /// added; each `--name` of `unset` is left out.
    Defaults {
        set: Vec<String>,
        unset: Vec<String>,
    },
    /// Exactly this command line (one an operator runs), after `{kubeconfig}` (the node's
    /// kubeconfig) and `{dir}` (the side's own directory in the run's) are replaced in each
    /// argument.
    Exact(Vec<String>),
}

impl Default for Args {
    fn default() -> Args {
        Args::Defaults {
            set: Vec::new(),
            unset: Vec::new(),
        }
    }
}

/// `{kubeconfig}` and `{dir}` replaced in `text`.
pub fn fill(text: &str, kubeconfig: &Path, dir: &Path) -> String {
    text.replace("{kubeconfig}", &kubeconfig.display().to_string())
        .replace("{dir}", &dir.display().to_string())
}

/// The arguments (without the program) that `spec` stands for.
pub fn argv(spec: &Args, kubeconfig: &Path, dir: &Path) -> Vec<String> {
    let name = |flag: &str| flag.split_once('=').map_or(flag, |(n, _)| n).to_string();
    match spec {
        Args::Exact(list) => list.iter().map(|a| fill(a, kubeconfig, dir)).collect(),
        Args::Defaults { set, unset } => {
            let mut out: Vec<String> = args(kubeconfig)
                .into_iter()
                .filter(|a| !unset.contains(&name(a)))
                .collect();
            for flag in set {
                let flag = fill(flag, kubeconfig, dir);
                match out.iter_mut().find(|a| name(a) == name(&flag)) {
                    Some(held) => *held = flag,
                    None => out.push(flag),
                }
            }
            out
        }
    }
}

pub fn start(which: Impl, upstream_dir: &Path, ns: &str, kubeconfig: &Path, log: &Path) -> Proc {
    start_with(which, upstream_dir, ns, &args(kubeconfig), &[], log)
}

/// Starts `which` in namespace `ns` with these arguments.
pub fn start_argv(which: Impl, upstream_dir: &Path, ns: &str, args: &[String], log: &Path) -> Proc {
    start_with(which, upstream_dir, ns, args, &[], log)
}

/// The program with the given flags (instead of [`args`]) and extra environment.
pub fn start_with(
    which: Impl,
    upstream_dir: &Path,
    ns: &str,
    args: &[String],
    env: &[(&str, &str)],
    log: &Path,
) -> Proc {
    let name = format!("kube-proxy ({}, {ns})", which.label());
    start_bin(&name, &which.binary(upstream_dir), ns, args, env, log)
}

/// [`start_with`] for the program at `bin` (the benchmarks: the binaries they were given).
pub fn start_bin(
    name: &str,
    bin: &Path,
    ns: &str,
    args: &[String],
    env: &[(&str, &str)],
    log: &Path,
) -> Proc {
    let bin = bin.to_str().expect("utf-8 path");
    let mut argv = vec![bin];
    argv.extend(args.iter().map(String::as_str));
    Proc::start(name, Some(ns), &argv, env, log)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_side_changes_the_default_flags_by_name() {
        let (kc, dir) = (Path::new("/k"), Path::new("/d"));
        let spec = Args::Defaults {
            set: vec![
                "--proxy-mode=iptables".into(),
                "--v=4".into(),
                "--x={dir}/c".into(),
            ],
            unset: vec!["--nodeport-addresses".into()],
        };
        let got = argv(&spec, kc, dir);
        assert!(got.contains(&"--proxy-mode=iptables".to_string()));
        assert!(!got
            .iter()
            .any(|a| a == "--proxy-mode=nftables" || a == "--v=2"));
        assert!(!got.iter().any(|a| a.starts_with("--nodeport-addresses")));
        assert_eq!(got.last().map(String::as_str), Some("--x=/d/c"));
        assert_eq!(argv(&Args::default(), kc, dir), args(kc));
        let exact = Args::Exact(vec!["--kubeconfig={kubeconfig}".into()]);
        assert_eq!(argv(&exact, kc, dir), ["--kubeconfig=/k"]);
    }
}
