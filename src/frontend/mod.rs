//! Frontends: kube-apiserver's side of the tunnel.

pub mod grpc;
pub mod uds_authority;
