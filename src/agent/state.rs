//! What every part of a running agent shares: the current snapshot (configuration and TLS,
//! swapped whole on reload), the metrics, the queue budget, the drain and stop tokens, and
//! the tracker of tunnel tasks.

use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::config::AgentConfig;
use super::metrics::AgentMetrics;
use super::queue::Budget;
use crate::tls::TlsError;

/// Dials in progress at once, agent-wide: a server cannot make the agent hold more.
pub const MAX_PENDING_DIALS: usize = 4096;

/// A configuration with the TLS client config built from it.
pub struct Snapshot {
    pub config: AgentConfig,
    pub tls: Arc<rustls::ClientConfig>,
}

impl Snapshot {
    /// Loads the CA, certificate and key, so a bad file fails here (start-up, reload,
    /// --check-config) and never at a connection attempt.
    pub fn build(config: AgentConfig) -> Result<Snapshot, TlsError> {
        let identity = config
            .identity
            .as_ref()
            .map(|i| (i.cert.as_path(), i.key.as_path()));
        let tls = crate::tls::client_config(&config.ca_cert, identity, &config.alpn)?;
        Ok(Snapshot { config, tls })
    }
}

pub struct AgentState {
    snapshot: ArcSwap<Snapshot>,
    /// The id the agent started with: a restart-only setting.
    pub agent_id: String,
    pub metrics: Arc<AgentMetrics>,
    pub budget: Arc<Budget>,
    pub dials: Arc<Semaphore>,
    /// Cancelled on the first SIGTERM: no new server connections, DRAIN to every server.
    pub draining: CancellationToken,
    /// Cancelled when the agent first holds a stream to a server: start-up is over.
    pub first_connection: CancellationToken,
    /// Cancelled to stop: every stream and tunnel ends.
    pub stop: CancellationToken,
    /// Dials and tunnels.
    pub tunnels: TaskTracker,
}

impl AgentState {
    pub fn new(snapshot: Snapshot) -> Arc<AgentState> {
        let metrics = Arc::new(AgentMetrics::new());
        let budget = Arc::new(Budget::new(
            snapshot.config.queue.budget_bytes,
            metrics.clone(),
        ));
        Arc::new(AgentState {
            agent_id: snapshot.config.agent_id.clone(),
            snapshot: ArcSwap::from_pointee(snapshot),
            metrics,
            budget,
            dials: Arc::new(Semaphore::new(MAX_PENDING_DIALS)),
            draining: CancellationToken::new(),
            first_connection: CancellationToken::new(),
            stop: CancellationToken::new(),
            tunnels: TaskTracker::new(),
        })
    }

    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
    }

    /// Installs a reloaded snapshot: new connections and dials use it.
    pub fn apply(&self, snapshot: Snapshot) {
        self.budget.set_limit(snapshot.config.queue.budget_bytes);
        self.snapshot.store(Arc::new(snapshot));
    }
}
