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
