//! Frontends: kube-apiserver's side of the tunnel.

pub mod dial;
pub mod grpc;
pub mod http_connect;

use tokio::time::Instant;

/// Sleeps until `deadline`, or forever without one.
pub(crate) async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
