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

pub fn start(which: Impl, upstream_dir: &Path, ns: &str, kubeconfig: &Path, log: &Path) -> Proc {
    let name = format!("kube-proxy ({}, {ns})", which.label());
    start_bin(&name, &which.binary(upstream_dir), ns, kubeconfig, &[], log)
}

/// Starts the program `bin` with [`args`] and then `extra` (later flags win), in `ns`: the
/// benchmarks' way, with the binaries they were given.
pub fn start_bin(
    name: &str,
    bin: &Path,
    ns: &str,
    kubeconfig: &Path,
    extra: &[String],
    log: &Path,
) -> Proc {
    let bin = bin.to_str().expect("utf-8 path");
    let args = args(kubeconfig);
    let mut argv = vec![bin];
    argv.extend(args.iter().chain(extra).map(String::as_str));
    Proc::start(name, Some(ns), &argv, &[], log)
}
