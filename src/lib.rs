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
mod metrics;
pub mod proto;
pub mod wire;

// Building blocks.
mod authority;
mod kubernetes;
pub mod tls;
mod tunnel;

// The agent side, shared state, the services on each port.
mod admin;
mod agent_service;
mod backend;
mod frontend;
mod state;

// Wiring and process lifecycle.
pub mod dev;
pub mod lifecycle;
mod listen;
mod server;

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
    /// The idle-connection memory figures in `benches/RESULTS.md` depend on the patched h2 in
    /// `vendor/h2`. If h2 is updated in `Cargo.lock` without moving the patch along, cargo
    /// only warns that the patch went unused and builds the registry's h2: fail here instead.
    #[test]
    fn the_patched_h2_is_the_one_built() {
        let lock = include_str!("../Cargo.lock");
        let h2 = lock
            .split("[[package]]")
            .find(|p| p.contains("\nname = \"h2\"\n"))
            .expect("h2 is in Cargo.lock");
        assert!(
            !h2.contains("source = "),
            "h2 comes from a registry, not from vendor/h2 (see vendor/README.md):\n{h2}"
        );
        let vendored = include_str!("../vendor/h2/Cargo.toml");
        let version = h2.lines().find(|l| l.starts_with("version = ")).expect("a version");
        assert!(vendored.contains(version), "vendor/h2 is not {version}");
    }
}
