//! konnectivity-agent: the node half of the tunnel, a drop-in for upstream's `proxy-agent`.
//!
//! The agent holds one gRPC stream to each server (`clientset`, `connect`), and dials
//! destinations for them (`stream`, `dialer`). Each tunnel (`endpoint`) has its own queue
//! toward its destination (`queue`), so a destination that stops reading never stalls the
//! stream's other tunnels. Health, readiness and metrics are upstream's (`health`,
//! `metrics`); configuration is layered as the server's (`options`, `config`).
//! ARCHITECTURE.md shows where this sits and the path of one DIAL_REQ through it.

mod clientset;
pub mod config;
mod connect;
pub mod dev;
mod dialer;
mod endpoint;
mod health;
mod leases;
pub mod metrics;
pub mod options;
mod queue;
pub mod service;
mod state;
mod stream;
mod uplink;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::task::TaskTracker;

pub use config::AgentConfig;
pub use options::AgentOptions;
pub use state::Snapshot;

use clientset::ClientSet;
use state::AgentState;

/// The agent's listening sockets. Tests bind their own (any port) and pass them in.
pub struct AgentListeners {
    pub health: TcpListener,
    pub admin: TcpListener,
}

#[derive(Debug, thiserror::Error)]
// The cause is in the message and not a `#[source]`, so `{:#}` does not print it twice.
#[error("failed to listen on the {what} port {addr}: {reason}")]
pub struct BindError {
    what: &'static str,
    addr: SocketAddr,
    reason: std::io::Error,
}

impl AgentListeners {
    /// Binds the health and admin ports. Upstream only logs a failure here and runs on
    /// without health checks; an agent that cannot be probed should not look healthy, so
    /// this is an error.
    pub async fn bind(config: &AgentConfig) -> Result<AgentListeners, BindError> {
        let bind = |what, addr| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|reason| BindError { what, addr, reason })
        };
        Ok(AgentListeners {
            health: bind("health", config.health_addr).await?,
            admin: bind("admin", config.admin_addr).await?,
        })
    }
}

/// A running agent: its streams, tunnels and ports.
pub struct RunningAgent {
    state: Arc<AgentState>,
    servers: Arc<ClientSet>,
    tasks: TaskTracker,
    pub health_addr: SocketAddr,
    pub admin_addr: SocketAddr,
}

/// Starts an agent on `listeners`: the sync loop connects to the servers at once.
pub fn spawn(snapshot: Snapshot, listeners: AgentListeners) -> RunningAgent {
    let config = snapshot.config.clone();
    let state = AgentState::new(snapshot);
    let tasks = TaskTracker::new();
    let leases = config.count_server_leases.then(|| {
        let selector = config::lease_selector(&config.lease_label)
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        leases::LeaseCounter::new(
            config.kubeconfig.clone(),
            config.lease_namespace.clone(),
            selector,
            state.metrics.clone(),
        )
    });
    let servers = ClientSet::new(state.clone(), leases.clone());
    let health_addr = listeners.health.local_addr().unwrap_or(config.health_addr);
    let admin_addr = listeners.admin.local_addr().unwrap_or(config.admin_addr);
    health::spawn(
        &tasks,
        listeners.health,
        health::Port::Health,
        servers.clone(),
        health_addr.port(),
    );
    health::spawn(
        &tasks,
        listeners.admin,
        health::Port::Admin,
        servers.clone(),
        health_addr.port(),
    );
    let sync = servers.clone();
    let stop = state.stop.clone();
    tasks.spawn(async move {
        if let Some(leases) = leases {
            leases.prime().await;
            tokio::spawn(leases.run(stop));
        }
        sync.run().await;
    });
    RunningAgent {
        state,
        servers,
        tasks,
        health_addr,
        admin_addr,
    }
}

impl RunningAgent {
    /// Server streams open now.
    pub fn connected_servers(&self) -> usize {
        self.servers.connected()
    }

    /// The ids of the servers connected now.
    pub fn server_ids(&self) -> Vec<String> {
        self.servers.server_ids()
    }

    /// Tunnels open now.
    pub fn tunnels(&self) -> usize {
        self.servers.tunnels()
    }

    pub fn metrics(&self) -> &metrics::AgentMetrics {
        &self.state.metrics
    }

    /// Bytes queued toward destinations, agent-wide.
    pub fn queued_bytes(&self) -> usize {
        self.state.budget.used()
    }

    pub fn agent_id(&self) -> &str {
        &self.state.agent_id
    }

    pub fn config(&self) -> AgentConfig {
        self.state.snapshot().config.clone()
    }

    /// systemd's STATUS line.
    pub fn status_line(&self) -> String {
        self.servers.status_line()
    }

    /// A reloaded snapshot: new server connections and dials use it.
    pub fn apply(&self, snapshot: Snapshot) {
        self.state.apply(snapshot);
    }

    /// The first stop signal: no new server connections, DRAIN to every server (which then
    /// picks other agents for new dials), tunnels carry on.
    pub fn drain(&self) {
        self.state.draining.cancel();
        self.servers.drain();
    }

    pub fn is_draining(&self) -> bool {
        self.state.draining.is_cancelled()
    }

    /// Returns once the agent has held a stream to a server (at once if it has).
    pub async fn first_connection(&self) {
        self.state.first_connection.cancelled().await;
    }

    /// Waits until no tunnel is open, or `timeout` has passed.
    pub async fn tunnels_ended(&self, timeout: Duration) {
        let deadline = tokio::time::Instant::now() + timeout;
        while self.tunnels() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops everything: streams end, tunnels close, the ports close.
    pub async fn stop(&self) {
        self.state.stop.cancel();
        self.tasks.close();
        self.state.tunnels.close();
        self.tasks.wait().await;
        self.state.tunnels.wait().await;
    }
}
