//! konnectivity-server: a drop-in replacement for the Kubernetes Konnectivity proxy-server.
//!
//! kube-apiserver (the frontend) opens tunnels through this server; konnectivity-agents (the
//! backends) hold one gRPC stream each and dial cluster destinations for it.

pub mod admin;
pub mod authority;
pub mod backend;
pub mod config;
pub mod dev;
pub mod frontend;
pub mod kubernetes;
pub mod lifecycle;
pub mod server;
pub mod tls;
pub mod tunnel;
pub mod wire;

/// The wire contract, generated from `proto/` at build time.
#[allow(clippy::all)]
pub mod proto {
    tonic::include_proto!("_");
}

pub use server::{run, spawn, Listeners, RunningServer};
