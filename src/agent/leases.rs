//! `--count-server-leases`: the number of servers, from the valid leases the servers keep
//! (`--enable-lease-controller` on the server), listed every few seconds.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ListParams};
use tokio_util::sync::CancellationToken;

use super::metrics::AgentMetrics;
use crate::kubernetes::{error_status, leases::is_valid, Kube};

/// Upstream's informer resyncs every 10 s.
const LIST_INTERVAL: Duration = Duration::from_secs(10);

pub struct LeaseCounter {
    /// The last good count; 1 until a list succeeds, as upstream.
    count: AtomicI64,
    kube: Kube,
    namespace: String,
    selector: String,
    metrics: Arc<AgentMetrics>,
}

impl LeaseCounter {
    pub fn new(
        kubeconfig: Option<std::path::PathBuf>,
        namespace: String,
        selector: String,
        metrics: Arc<AgentMetrics>,
    ) -> Arc<LeaseCounter> {
        Arc::new(LeaseCounter {
            count: AtomicI64::new(1),
            kube: Kube::new(kubeconfig, 0.0, 0),
            namespace,
            selector,
            metrics,
        })
    }

    pub fn count(&self) -> i64 {
        self.count.load(Ordering::Acquire)
    }

    async fn list_once(&self) {
        let started = Instant::now();
        let result = match self.kube.client().await {
            Ok(client) => {
                self.kube.throttle().await;
                Api::<Lease>::namespaced(client, &self.namespace)
                    .list(&ListParams::default().labels(&self.selector))
                    .await
                    .map_err(|e| {
                        let (code, reason) = error_status(&e);
                        (code, reason, e.to_string())
                    })
            }
            Err(e) => Err((String::new(), String::new(), e)),
        };
        match result {
            Ok(list) => {
                self.metrics
                    .lease_list_latency
                    .with_label_values(&["200"])
                    .observe(started.elapsed().as_secs_f64());
                self.metrics
                    .lease_lists
                    .with_label_values(&["200", ""])
                    .inc();
                let now = jiff::Timestamp::now();
                let valid = list.items.iter().filter(|l| is_valid(l, now)).count() as i64;
                if valid == 0 {
                    tracing::warn!("No valid leases found, assuming server count of 1");
                }
                self.count.store(valid.max(1), Ordering::Release);
            }
            Err((code, reason, text)) => {
                let code = if code.is_empty() {
                    "200".to_string()
                } else {
                    code
                };
                self.metrics
                    .lease_list_latency
                    .with_label_values(&[&code])
                    .observe(started.elapsed().as_secs_f64());
                self.metrics
                    .lease_lists
                    .with_label_values(&[&code, &reason])
                    .inc();
                tracing::error!(error = %text, "Could not list leases to update server count");
            }
        }
    }

    /// Lists now, then every [`LIST_INTERVAL`] until `stop`.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        loop {
            self.list_once().await;
            tokio::select! {
                _ = tokio::time::sleep(LIST_INTERVAL) => {}
                _ = stop.cancelled() => return,
            }
        }
    }

    /// The first list, before the sync loop starts (upstream waits for its cache too).
    pub async fn prime(&self) {
        self.list_once().await;
    }
}
