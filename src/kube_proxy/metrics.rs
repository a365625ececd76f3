//! kube-proxy's Prometheus families, with upstream's names, types, labels, buckets and HELP
//! text (component-base prefixes an ALPHA family's HELP with `[ALPHA] `), so dashboards and
//! alerts built for upstream keep working. A few of ours follow, named as such in their HELP.

use prometheus::{
    GaugeVec, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry,
};

use crate::metrics::family::Families;
use crate::metrics::{exposition, process};

/// `ExponentialBuckets(0.001, 2, 15)`.
fn sync_buckets() -> Vec<f64> {
    (0..15).map(|i| 0.001 * f64::from(1u32 << i)).collect()
}

/// 0.25, 0.5, then 1..59 s, 60..115 s by 5, 120..300 s by 30.
fn programming_buckets() -> Vec<f64> {
    let mut b = vec![0.25, 0.5];
    b.extend((1..=59).map(f64::from));
    b.extend((0..12).map(|i| 60.0 + 5.0 * f64::from(i)));
    b.extend((0..7).map(|i| 120.0 + 30.0 * f64::from(i)));
    b
}

pub struct ProxyMetrics {
    registry: Registry,
    pub sync_duration: HistogramVec,
    pub sync_full_duration: HistogramVec,
    pub sync_partial_duration: HistogramVec,
    pub last_sync: GaugeVec,
    pub last_queued: GaugeVec,
    pub network_programming: HistogramVec,
    pub endpoint_changes_pending: IntGauge,
    pub endpoint_changes_total: IntCounter,
    pub service_changes_pending: IntGauge,
    pub service_changes_total: IntCounter,
    pub nftables_sync_failures: IntCounterVec,
    pub nftables_cleanup_failures: IntCounterVec,
    pub healthz_total: IntCounterVec,
    pub livez_total: IntCounterVec,
    pub no_local_endpoints: IntGaugeVec,
    /// Ours: API objects (or entries in them) the proxy could not use.
    pub skipped_objects: IntCounterVec,
    /// Ours: the operations of the last transaction the kernel took.
    pub last_operations: IntGaugeVec,
}

impl ProxyMetrics {
    pub fn new() -> ProxyMetrics {
        let registry = Registry::new();
        let f = Families::with_namespace(&registry, "", "kubeproxy");
        let family = &["ip_family"];
        let sync = sync_buckets();
        let m = ProxyMetrics {
            sync_duration: f.histogram_vec(
                "sync_proxy_rules_duration_seconds",
                "[ALPHA] SyncProxyRules latency in seconds",
                family,
                Some(&sync),
            ),
            sync_full_duration: f.histogram_vec(
                "sync_full_proxy_rules_duration_seconds",
                "[ALPHA] SyncProxyRules latency in seconds for full resyncs",
                family,
                Some(&sync),
            ),
            sync_partial_duration: f.histogram_vec(
                "sync_partial_proxy_rules_duration_seconds",
                "[ALPHA] SyncProxyRules latency in seconds for partial resyncs",
                family,
                Some(&sync),
            ),
            last_sync: f.float_gauge_vec(
                "sync_proxy_rules_last_timestamp_seconds",
                "[ALPHA] The last time proxy rules were successfully synced",
                family,
            ),
            last_queued: f.float_gauge_vec(
                "sync_proxy_rules_last_queued_timestamp_seconds",
                "[ALPHA] The last time a sync of proxy rules was queued",
                family,
            ),
            network_programming: f.histogram_vec(
                "network_programming_duration_seconds",
                "[ALPHA] In Cluster Network Programming Latency in seconds",
                family,
                Some(&programming_buckets()),
            ),
            endpoint_changes_pending: f.gauge(
                "sync_proxy_rules_endpoint_changes_pending",
                "[ALPHA] Pending proxy rules Endpoint changes",
            ),
            endpoint_changes_total: f.counter(
                "sync_proxy_rules_endpoint_changes_total",
                "[ALPHA] Cumulative proxy rules Endpoint changes",
            ),
            service_changes_pending: f.gauge(
                "sync_proxy_rules_service_changes_pending",
                "[ALPHA] Pending proxy rules Service changes",
            ),
            service_changes_total: f.counter(
                "sync_proxy_rules_service_changes_total",
                "[ALPHA] Cumulative proxy rules Service changes",
            ),
            nftables_sync_failures: f.counter_vec(
                "sync_proxy_rules_nftables_sync_failures_total",
                "[ALPHA] Cumulative proxy nftables sync failures",
                family,
            ),
            nftables_cleanup_failures: f.counter_vec(
                "sync_proxy_rules_nftables_cleanup_failures_total",
                "[ALPHA] Cumulative proxy nftables cleanup failures",
                family,
            ),
            healthz_total: f.counter_vec(
                "proxy_healthz_total",
                "[ALPHA] Cumulative proxy healthz HTTP status",
                &["code"],
            ),
            livez_total: f.counter_vec(
                "proxy_livez_total",
                "[ALPHA] Cumulative proxy livez HTTP status",
                &["code"],
            ),
            no_local_endpoints: f.gauge_vec(
                "sync_proxy_rules_no_local_endpoints_total",
                "[ALPHA] Number of services with a Local traffic policy and no endpoints",
                &["traffic_policy", "ip_family"],
            ),
            skipped_objects: f.counter_vec(
                "api_objects_skipped_total",
                "API objects, or entries in them, this proxy could not use (not upstream's)",
                &["kind", "reason"],
            ),
            last_operations: f.gauge_vec(
                "sync_proxy_rules_last_operations",
                "Operations in the last nftables transaction the kernel took (not upstream's)",
                family,
            ),
            registry: registry.clone(),
        };
        for collector in process::collectors() {
            f.collector(collector);
        }
        m
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn render(&self) -> String {
        exposition::render(&self.registry)
    }
}

impl Default for ProxyMetrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_and_names_are_upstreams() {
        let b = sync_buckets();
        assert_eq!(b.len(), 15);
        assert!((b[14] - 16.384).abs() < 1e-9);
        let p = programming_buckets();
        assert_eq!(p.len(), 2 + 59 + 12 + 7);
        assert_eq!(p.last().copied(), Some(300.0));
        let m = ProxyMetrics::new();
        m.sync_duration.with_label_values(&["IPv4"]).observe(0.002);
        m.no_local_endpoints
            .with_label_values(&["internal", "IPv4"])
            .set(1);
        let text = m.render();
        assert!(text.contains("# HELP kubeproxy_sync_proxy_rules_duration_seconds [ALPHA] SyncProxyRules latency in seconds"));
        assert!(text.contains(
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family=\"IPv4\",le=\"0.002\"} 1"
        ));
        assert!(text.contains("kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family=\"IPv4\",traffic_policy=\"internal\"} 1"));
        assert!(text.contains("process_resident_memory_bytes"));
    }
}
