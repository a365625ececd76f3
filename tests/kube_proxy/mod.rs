//! The side-by-side harness for kube-proxy: upstream kube-proxy v1.37.2 and ours, each in a
//! node made of network namespaces, against one real kube-apiserver; their nftables rulesets
//! compared, and real connections driven through both nodes.
//!
//! Pieces: [`api`] (the apiserver fixture, its relay into the namespaces, an admin client and
//! object builders), [`node`] (namespaces, echo pods), [`proxy`] (the program under test),
//! [`ruleset`] (normalised `nft -j` listings and their diff), [`probe`] (connections and their
//! answers), [`harness`] (all of it together, the waits, the report).
//!
//! Needs root, `ip` (iproute2), `nft`, `conntrack`, `socat`, `setpriv` and python3; Go for the
//! first build of the upstream binaries (tests/kube/build.sh).

#![allow(dead_code)] // each test binary uses its own subset

pub mod api;
pub mod harness;
pub mod node;
pub mod nsock;
pub mod probe;
pub mod procs;
pub mod proxy;
pub mod ruleset;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A file of this repository. The harness is built into the tests, whose package is the
/// repository's root, and into the benchmark tool, whose package is `benches/konn_bench`.
pub fn repo_file(relative: &str) -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = if env!("CARGO_PKG_NAME") == "konn-bench" {
        manifest.join("../..")
    } else {
        manifest.to_path_buf()
    };
    root.join(relative)
}

/// The Node both proxies run as (`--hostname-override`).
pub const NODE_NAME: &str = "node-a";

/// Whether this machine can run the harness. Not root, or a tool missing: false with a
/// SKIPPED line, except under CI=true, where that is a failure.
pub fn preflight() -> bool {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let mut missing = Vec::new();
    let uid = procs::run("id", &["-u"]).unwrap_or_default();
    if uid.trim() != "0" {
        missing.push("root (network namespaces and nftables)".to_string());
    }
    for (tool, args) in [
        ("ip", &["-V"][..]),
        ("nft", &["--version"]),
        ("conntrack", &["--version"]),
        ("socat", &["-V"]),
        ("setpriv", &["--version"]),
        // The modules netagent.py imports (json is not in python3-minimal).
        (
            node::python(),
            &["-c", "import json, selectors, socket, threading"],
        ),
        // tests/kube/build.sh keys its cache on the Go version, even on a cache hit.
        ("go", &["version"]),
    ] {
        let ok = Command::new(tool)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            missing.push(format!("`{tool}`"));
        }
    }
    if missing.is_empty() {
        return true;
    }
    let msg = format!(
        "the kube-proxy side-by-side harness needs {}",
        missing.join(", ")
    );
    assert!(!ci, "CI=true: {msg}");
    eprintln!("SKIPPED: {msg} (CI=true makes this a failure)");
    false
}
