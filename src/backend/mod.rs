//! The agent side: connected agent streams and their route tables, the dispatch of what agents
//! send, and the strategies that pick an agent for a dial.

pub mod dispatch;
pub mod liveness;
pub mod session;
pub mod strategy;

use std::sync::{Arc, Mutex, MutexGuard};

use crate::config::Strategy;
use crate::identifiers::remove_port_from_host;
use crate::metrics::Metrics;
use session::AgentSession;
use strategy::Storage;

struct Agents {
    storages: Vec<Storage>,
    all: Vec<Arc<AgentSession>>,
}

/// Every connected agent stream, indexed for each configured strategy.
pub struct Registry {
    agents: Mutex<Agents>,
    metrics: Arc<Metrics>,
    /// Woken whenever an agent stream is added: dials waiting for one look again.
    added: tokio::sync::Notify,
}

impl Registry {
    pub fn new(strategies: &[Strategy], metrics: Arc<Metrics>) -> Registry {
        let registry = Registry {
            agents: Mutex::new(Agents {
                storages: strategies.iter().map(|s| Storage::new(*s)).collect(),
                all: Vec::new(),
            }),
            metrics,
            added: tokio::sync::Notify::new(),
        };
        registry.update_gauges(&registry.lock());
        registry
    }

    fn lock(&self) -> MutexGuard<'_, Agents> {
        self.agents.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn update_gauges(&self, agents: &Agents) {
        for storage in &agents.storages {
            let count = storage.len() as i64;
            self.metrics
                .backend
                .ready_backends
                .with_label_values(&[storage.strategy.name()])
                .set(count);
            // Upstream lets every storage write the deprecated gauge; the last one wins.
            self.metrics.backend.ready_backend_connections.set(count);
        }
    }

    pub fn add(&self, agent: &Arc<AgentSession>) {
        let mut agents = self.lock();
        for storage in &mut agents.storages {
            storage.add(agent);
        }
        agents.all.push(agent.clone());
        self.update_gauges(&agents);
        drop(agents);
        self.added.notify_waiters();
    }

    /// Waits up to `limit` for an agent that serves `address`.
    pub async fn pick_within(
        &self,
        address: &str,
        limit: std::time::Duration,
    ) -> Option<Arc<AgentSession>> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            // Registered before looking, so an agent added in between still wakes us.
            let added = self.added.notified();
            tokio::pin!(added);
            added.as_mut().enable();
            if let Some(agent) = self.pick(address) {
                return Some(agent);
            }
            tokio::select! {
                _ = &mut added => {}
                _ = tokio::time::sleep_until(deadline) => return self.pick(address),
            }
        }
    }

    pub fn remove(&self, agent: &Arc<AgentSession>) {
        let mut agents = self.lock();
        for storage in &mut agents.storages {
            storage.remove(agent);
        }
        agents.all.retain(|a| !Arc::ptr_eq(a, agent));
        self.update_gauges(&agents);
    }

    /// Re-indexes every connected agent for a new list of strategies (a reload).
    pub fn set_strategies(&self, strategies: &[Strategy]) {
        let mut agents = self.lock();
        let current: Vec<Strategy> = agents.storages.iter().map(|s| s.strategy).collect();
        if current == strategies {
            return;
        }
        for old in &current {
            if !strategies.contains(old) {
                self.metrics
                    .backend
                    .ready_backends
                    .with_label_values(&[old.name()])
                    .set(0);
            }
        }
        let mut storages: Vec<Storage> = strategies.iter().map(|s| Storage::new(*s)).collect();
        for agent in &agents.all {
            for storage in &mut storages {
                storage.add(agent);
            }
        }
        agents.storages = storages;
        self.update_gauges(&agents);
    }

    /// Picks an agent for `address` (host:port): the first strategy with a match wins.
    pub fn pick(&self, address: &str) -> Option<Arc<AgentSession>> {
        let agents = self.lock();
        let dest_host = remove_port_from_host(address);
        agents
            .storages
            .iter()
            .find_map(|s| s.pick(&dest_host, None))
    }

    /// Another agent than `not` for `address`, one that is neither draining nor suspect: where
    /// a dial goes once more when its agent stopped answering.
    pub fn pick_instead_of(&self, address: &str, not: &AgentSession) -> Option<Arc<AgentSession>> {
        let agents = self.lock();
        let dest_host = remove_port_from_host(address);
        agents
            .storages
            .iter()
            .find_map(|s| s.pick(&dest_host, Some(not)))
    }

    /// Ready when the first strategy's storage holds at least one agent, as upstream.
    pub fn ready(&self) -> bool {
        self.lock().storages.first().is_some_and(|s| !s.is_empty())
    }

    pub fn agents(&self) -> Vec<Arc<AgentSession>> {
        self.lock().all.clone()
    }
}
