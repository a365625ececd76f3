//! Frontends: kube-apiserver's side of the tunnel.

pub mod dial;
pub mod grpc;
pub mod http_connect;
mod http_head;
pub mod relay_io;

use tokio::time::Instant;

/// Sleeps until `deadline`, or forever without one.
pub(crate) async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// One tunnel's access-log record, kept by its frontend task and written once when the tunnel
/// ends: who carried it, where it went, the bytes each way, how long it lived and why it ended.
/// Beyond upstream, which logs no such line.
pub struct TunnelRecord {
    kind: dial::FrontendKind,
    /// The frontend's name (`frontend` for the flags' one).
    name: std::sync::Arc<str>,
    started: std::time::Instant,
    /// The dial address; empty until the frontend asked for a dial (no line is written then).
    pub destination: String,
    pub agent_id: Option<String>,
}

impl TunnelRecord {
    pub fn new(kind: dial::FrontendKind, name: std::sync::Arc<str>) -> TunnelRecord {
        TunnelRecord {
            kind,
            name,
            started: std::time::Instant::now(),
            destination: String::new(),
            agent_id: None,
        }
    }

    pub fn elapsed(&self) -> std::time::Duration {
        self.started.elapsed()
    }

    /// Writes the access line; `link` knows the bytes each way, the connect id and the reason
    /// noted first (`fallback` when none was).
    pub fn log(&self, link: &crate::tunnel::FrontendLink, fallback: &str) {
        if self.destination.is_empty() {
            return;
        }
        let frontend = self.kind.as_str();
        let reason = link.end_reason().unwrap_or_else(|| fallback.to_string());
        tracing::info!(
            v = 2,
            frontend,
            frontendName = &*self.name,
            agentID = self.agent_id.as_deref().unwrap_or(""),
            dialAddress = %self.destination,
            connectionID = link.connect_id(),
            bytesToAgent = link.facts.to_agent(),
            bytesFromAgent = link.taken_bytes(),
            duration = %crate::gofmt::GoDuration(self.started.elapsed()),
            reason = %reason,
            "Tunnel closed"
        );
    }
}
