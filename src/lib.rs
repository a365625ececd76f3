//! konnectivity-server: a drop-in replacement for the Kubernetes Konnectivity proxy-server.
//!
//! kube-apiserver (the frontend) opens tunnels through this server; konnectivity-agents (the
//! backends) hold one gRPC stream each and dial cluster destinations for it. The binary is the
//! product: this library exists so the binary stays thin and the integration tests can run
//! servers in-process on listeners they bound themselves. ARCHITECTURE.md maps the modules.

// Bottom of the stack: the allocator, the wire contract and the vocabulary built on it,
// metrics, config.
mod allocator;
mod codec;
pub mod config;
pub mod gofmt;
mod hpack;
mod http_port;
mod identifiers;
pub mod kube_client;
pub mod logging;
mod metrics;
pub mod policy;
pub mod proto;
pub mod wire;

// Building blocks.
mod accept;
mod authority;
mod h2_ping;
mod kubernetes;
pub mod tls;
mod tunnel;
mod unix_conn;

// The agent side, shared state, the services on each port.
mod admin;
mod agent_service;
mod backend;
mod frontend;
mod state;

// The agent: a second program over the same vocabulary, TLS, config layers and lifecycle.
pub mod agent;

// kube-proxy: a third program, the node's Service proxy, over the same flag syntax, klog
// logging, config layers, systemd lifecycle and metrics exposition.
pub mod kube_proxy;

// Wiring and process lifecycle.
pub mod cli;
pub mod dev;
pub mod lifecycle;
mod listen;
mod server;
pub mod tunnels_cli;

pub use listen::{BindError, FrontendListener, Inherited, Listeners};
pub use server::{run, spawn, RunError, RunningServer};
pub use state::{Snapshot, SnapshotError};

/// Internals the integration tests and benchmarks observe. Not a stable interface.
#[doc(hidden)]
pub mod testing {
    pub use crate::listen::bind_uds;
    pub use crate::metrics::{DialFailure, Metrics};
    pub use crate::state::Shared;
}

#[cfg(test)]
mod build_tests {
    use std::collections::BTreeMap;
    use std::path::Path;

    /// The patched crates, from `vendor/patches/<crate>-<version>.patch` (the names that
    /// `vendor/rebuild.sh` reads too).
    fn vendored() -> BTreeMap<String, String> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("vendor/patches");
        let mut found = BTreeMap::new();
        for entry in std::fs::read_dir(&dir).expect("vendor/patches") {
            let file = entry.expect("a directory entry").file_name();
            let file = file.to_str().expect("a UTF-8 file name");
            let Some(stem) = file.strip_suffix(".patch") else {
                continue;
            };
            // The version starts at the first "-<digit>", as in vendor/rebuild.sh.
            let at = stem
                .match_indices('-')
                .map(|(i, _)| i)
                .find(|&i| stem[i + 1..].starts_with(|c: char| c.is_ascii_digit()))
                .unwrap_or_else(|| panic!("{file} is not <crate>-<version>.patch"));
            let previous = found.insert(stem[..at].to_owned(), stem[at + 1..].to_owned());
            assert!(previous.is_none(), "two patches for {}", &stem[..at]);
        }
        found
    }

    /// The idle-connection memory figures in `benches/RESULTS.md` depend on the patched crates
    /// in `vendor/`. If one is updated in `Cargo.lock` without moving its patch along, cargo
    /// only warns that the patch went unused and builds the registry's copy: fail here instead.
    fn assert_vendored(name: &str, version: &str) {
        let lock = include_str!("../Cargo.lock");
        let entry = lock
            .split("[[package]]")
            .find(|p| p.contains(&format!("\nname = \"{name}\"\n")))
            .unwrap_or_else(|| panic!("{name} is not in Cargo.lock"));
        assert!(
            !entry.contains("source = "),
            "{name} comes from a registry, not from vendor/{name} (see vendor/README.md):\n{entry}"
        );
        let line = format!("\nversion = \"{version}\"\n");
        assert!(
            entry.contains(&line),
            "Cargo.lock builds {name} at another version than vendor/patches/{name}-{version}.patch:\n{entry}"
        );
        let manifest =
            Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("vendor/{name}/Cargo.toml"));
        let manifest = std::fs::read_to_string(&manifest).expect("the vendored manifest");
        assert!(
            manifest.contains(&line),
            "vendor/{name} is not {name} {version}"
        );
    }

    #[test]
    fn the_patched_h2_and_rustls_are_the_ones_built() {
        let vendored = vendored();
        for name in ["h2", "rustls"] {
            assert!(
                vendored.contains_key(name),
                "no vendor/patches/{name}-<version>.patch"
            );
        }
        for (name, version) in &vendored {
            assert_vendored(name, version);
        }
    }
}
