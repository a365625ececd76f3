//! The agent's set of server streams and the sync loop that fills it, as upstream's agent
//! does: one attempt at a time through `--proxy-server-host` (often a load balancer), until
//! it holds a stream to as many distinct servers as the servers say there are (or the
//! leases count), backing off on errors, and no new streams once draining.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::config::CountSource;
use super::connect::connect_once;
use super::leases::LeaseCounter;
use super::state::AgentState;
use super::stream::ServerStream;

/// What one sync tick did.
#[derive(Debug, PartialEq, Eq)]
enum Tick {
    /// Connected to a new server, or nothing to do: the next tick comes at the interval.
    Steady,
    /// The attempt failed: back off.
    Failed,
}

/// apimachinery's `wait.Backoff` as upstream's agent uses it: factor 1.5, jitter 0.1, capped.
struct Backoff {
    next: Duration,
}

impl Backoff {
    fn step(&mut self, initial: Duration, cap: Duration) -> Duration {
        let base = self.next.max(initial).min(cap);
        self.next = base.mul_f64(1.5).min(cap);
        jitter(base)
    }

    fn reset(&mut self) {
        self.next = Duration::ZERO;
    }
}

/// `wait.Jitter(d, 0.1)`: `d` plus up to a tenth of it.
fn jitter(d: Duration) -> Duration {
    d + d.mul_f64(fastrand::f64() * 0.1)
}

pub struct ClientSet {
    state: Arc<AgentState>,
    servers: Mutex<HashMap<String, Arc<ServerStream>>>,
    /// The count the last new server announced (upstream's `lastReceivedServerCount`).
    announced: AtomicI64,
    leases: Option<Arc<LeaseCounter>>,
}

impl ClientSet {
    pub fn new(state: Arc<AgentState>, leases: Option<Arc<LeaseCounter>>) -> Arc<ClientSet> {
        Arc::new(ClientSet {
            state,
            servers: Mutex::new(HashMap::new()),
            announced: AtomicI64::new(0),
            leases,
        })
    }

    fn servers(&self) -> MutexGuard<'_, HashMap<String, Arc<ServerStream>>> {
        // Single inserts and removes: a poisoned lock is still consistent.
        self.servers.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn state(&self) -> &Arc<AgentState> {
        &self.state
    }

    /// Server streams open now.
    pub fn connected(&self) -> usize {
        self.servers().len()
    }

    /// Tunnels open now, over every stream.
    pub fn tunnels(&self) -> usize {
        self.servers().values().map(|s| s.tunnel_count()).sum()
    }

    /// The ids of the servers connected now.
    pub fn server_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.servers().keys().cloned().collect();
        ids.sort();
        ids
    }

    /// systemd's STATUS line.
    pub fn status_line(&self) -> String {
        let connected = self.connected();
        let tunnels = self.tunnels();
        if connected == 0 {
            let config = &self.state.snapshot().config;
            format!(
                "connecting to {}:{}: no server connected yet, {tunnels} tunnels",
                config.server_host, config.server_port
            )
        } else {
            format!("connected to {connected} servers, {tunnels} tunnels")
        }
    }

    /// Tells systemd at once when a server connects or goes away (the heartbeat refreshes
    /// the tunnel count).
    fn status_changed(&self) {
        crate::lifecycle::systemd::status(&self.status_line());
    }

    /// Sends DRAIN on every stream (and on streams opened later, which there are none of:
    /// the sync loop stops connecting).
    pub fn drain(&self) {
        let streams: Vec<Arc<ServerStream>> = self.servers().values().cloned().collect();
        for stream in streams {
            stream.drain();
        }
    }

    /// The number of servers to hold a stream to, as upstream's server counter computes it.
    fn server_count(&self) -> i64 {
        let announced = match self.announced.load(Ordering::Acquire) {
            0 => 1,
            n => n,
        };
        let config = &self.state.snapshot().config;
        let (count, source) = match &self.leases {
            None => (announced, "KNP server response headers"),
            Some(leases) => {
                let leased = leases.count();
                match config.count_source {
                    CountSource::Default => (leased, "KNP lease count"),
                    CountSource::Max if announced > leased => {
                        (announced, "KNP server response headers")
                    }
                    CountSource::Max => (leased, "KNP lease count"),
                }
            }
        };
        let (count, source) = if count == 0 {
            (1, "fallback to 1")
        } else {
            (count, source)
        };
        tracing::info!(
            v = 4,
            serverCount = count,
            source,
            "Determined server count"
        );
        count
    }

    /// Runs the sync loop until the agent stops.
    pub async fn run(self: Arc<Self>) {
        let mut backoff = Backoff {
            next: Duration::ZERO,
        };
        loop {
            let tick = self.sync_once().await;
            let config = &self.state.snapshot().config;
            let pause = match tick {
                Tick::Failed => backoff.step(config.sync_interval, config.sync_interval_cap),
                Tick::Steady => {
                    backoff.reset();
                    jitter(config.sync_interval)
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = self.state.stop.cancelled() => return,
            }
        }
    }

    async fn sync_once(self: &Arc<Self>) -> Tick {
        if self.state.draining.is_cancelled() {
            tracing::info!(v = 2, "Skipping connectOnce - agent is draining");
            return Tick::Steady;
        }
        let count = self.server_count();
        self.state.metrics.known_server_count.set(count);
        let snapshot = self.state.snapshot();
        if !snapshot.config.sync_forever && count > 0 && self.connected() as i64 >= count {
            return Tick::Steady;
        }
        let connected = tokio::select! {
            connected = connect_once(&snapshot.config, snapshot.tls.clone()) => connected,
            _ = self.state.stop.cancelled() => return Tick::Steady,
        };
        let connected = match connected {
            Ok(connected) => connected,
            Err(e) => {
                tracing::error!(error = %e, "cannot connect once");
                return Tick::Failed;
            }
        };
        let server_id = connected.server_id.clone();
        tracing::info!(v = 2, serverID = %server_id, "Connect to server");
        let stream = {
            let mut servers = self.servers();
            if servers.contains_key(&server_id) {
                drop(servers);
                tracing::info!(v = 4, serverID = %server_id, "duplicate server connection attempt");
                return Tick::Steady;
            }
            let stream =
                ServerStream::new(server_id.clone(), self.state.clone(), connected.outbound);
            servers.insert(server_id.clone(), stream.clone());
            self.state.metrics.open_servers.set(servers.len() as i64);
            stream
        };
        self.status_changed();
        self.state.first_connection.cancel();
        self.announced
            .store(connected.server_count, Ordering::Release);
        tracing::info!(
            v = 2,
            serverID = %server_id,
            newServerCount = connected.server_count,
            "successfully connected to new proxy server"
        );
        if self.state.draining.is_cancelled() {
            stream.drain();
        }
        let set = self.clone();
        let (inbound, channel) = (connected.inbound, connected.channel);
        self.state.tunnels.spawn(async move {
            stream.clone().serve(inbound).await;
            {
                let mut servers = set.servers();
                if servers
                    .get(&stream.server_id)
                    .is_some_and(|s| Arc::ptr_eq(s, &stream))
                {
                    servers.remove(&stream.server_id);
                }
                set.state.metrics.open_servers.set(servers.len() as i64);
            }
            set.status_changed();
            drop(channel);
        });
        Tick::Steady
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_by_half_to_its_cap() {
        let mut b = Backoff {
            next: Duration::ZERO,
        };
        let (one, cap) = (Duration::from_secs(1), Duration::from_secs(10));
        let steps: Vec<f64> = (0..8).map(|_| b.step(one, cap).as_secs_f64()).collect();
        let bases = [1.0, 1.5, 2.25, 3.375, 5.0625, 7.59375, 10.0, 10.0];
        for (got, base) in steps.iter().zip(bases) {
            assert!(*got >= base && *got < base * 1.1 + 1e-9, "{got} vs {base}");
        }
        b.reset();
        assert!(b.step(one, cap) < Duration::from_millis(1101));
    }
}
