//! What the proxy's parts share: the configuration in force (swapped whole on reload), the
//! metrics, the health state, the change trackers, and each family's sync status.

use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use super::api::store::Store;
use super::config::ProxyConfig;
use super::healthz::ProxyHealth;
use super::metrics::ProxyMetrics;
use super::model::IpFamily;
use super::proxier::SyncStatus;

pub struct ProxyShared {
    config: ArcSwap<ProxyConfig>,
    pub metrics: Arc<ProxyMetrics>,
    pub health: Arc<ProxyHealth>,
    pub store: Arc<Store>,
    pub node_name: String,
    pub families: Vec<(IpFamily, Arc<Mutex<SyncStatus>>)>,
}

impl ProxyShared {
    pub fn new(
        config: ProxyConfig,
        metrics: Arc<ProxyMetrics>,
        health: Arc<ProxyHealth>,
        store: Arc<Store>,
        node_name: String,
        families: Vec<(IpFamily, Arc<Mutex<SyncStatus>>)>,
    ) -> ProxyShared {
        ProxyShared {
            config: ArcSwap::from_pointee(config),
            metrics,
            health,
            store,
            node_name,
            families,
        }
    }

    pub fn config(&self) -> Arc<ProxyConfig> {
        self.config.load_full()
    }

    pub fn swap_config(&self, config: ProxyConfig) {
        self.config.store(Arc::new(config));
    }

    /// Whether every family has put its rules into the kernel once.
    pub fn programmed(&self) -> bool {
        !self.families.is_empty()
            && self
                .families
                .iter()
                .all(|(_, s)| s.lock().unwrap_or_else(|p| p.into_inner()).programmed)
    }

    /// `STATUS=` for systemd: Services, endpoints, the last sync.
    pub fn status_line(&self) -> String {
        let mut parts = Vec::new();
        for (family, status) in &self.families {
            let s = status.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let last = s
                .last_duration
                .map(|d| format!("{:.1} ms", d.as_secs_f64() * 1000.0))
                .unwrap_or_else(|| "none yet".into());
            parts.push(format!(
                "{family}: {} service ports, {} endpoints, last sync {last} ({}), {} failed",
                s.services,
                s.endpoints,
                s.last_kind.unwrap_or("-"),
                s.failures
            ));
        }
        if !self.health.healthy() {
            parts.push("UNHEALTHY: a sync has waited over 2 x syncPeriod".into());
        }
        parts.join("; ")
    }
}
