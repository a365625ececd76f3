//! The conntrack reconciler's two families, with upstream's names, HELP text (component-base
//! prefixes the stability level), label and buckets (`pkg/proxy/metrics/metrics.go`).

use std::time::Duration;

use prometheus::{exponential_buckets, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

use crate::kube_proxy::model::IpFamily;

const SUBSYSTEM: &str = "kubeproxy";
const LABEL: &str = "ip_family";

#[derive(Clone)]
pub struct ConntrackMetrics {
    sync_duration: HistogramVec,
    deleted_entries: IntCounterVec,
}

impl ConntrackMetrics {
    /// Creates both families and registers them into `registry`; fails when they are already
    /// there.
    pub fn register(registry: &Registry) -> Result<ConntrackMetrics, prometheus::Error> {
        let sync_duration = HistogramVec::new(
            HistogramOpts::new(
                "conntrack_reconciler_sync_duration_seconds",
                "[ALPHA] ReconcileConntrackFlowsLatency latency in seconds",
            )
            .subsystem(SUBSYSTEM)
            .buckets(exponential_buckets(0.001, 2.0, 15)?),
            &[LABEL],
        )?;
        let deleted_entries = IntCounterVec::new(
            Opts::new(
                "conntrack_reconciler_deleted_entries_total",
                "[ALPHA] Cumulative conntrack flows deleted by conntrack reconciler",
            )
            .subsystem(SUBSYSTEM),
            &[LABEL],
        )?;
        registry.register(Box::new(sync_duration.clone()))?;
        registry.register(Box::new(deleted_entries.clone()))?;
        Ok(ConntrackMetrics {
            sync_duration,
            deleted_entries,
        })
    }

    /// One reconciliation of `family` that read the table.
    pub(super) fn observe(&self, family: IpFamily, took: Duration, deleted: usize) {
        self.sync_duration
            .with_label_values(&[family.api()])
            .observe(took.as_secs_f64());
        self.deleted_entries
            .with_label_values(&[family.api()])
            .inc_by(deleted as u64);
    }

    /// Reconciliations of `family` observed so far.
    pub fn syncs(&self, family: IpFamily) -> u64 {
        self.sync_duration
            .with_label_values(&[family.api()])
            .get_sample_count()
    }

    pub fn deleted_entries(&self, family: IpFamily) -> u64 {
        self.deleted_entries
            .with_label_values(&[family.api()])
            .get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_have_upstreams_names_labels_and_buckets() {
        let registry = Registry::new();
        let metrics = ConntrackMetrics::register(&registry).unwrap();
        metrics.observe(IpFamily::V6, Duration::from_millis(3), 2);
        metrics.observe(IpFamily::V6, Duration::from_millis(1), 1);
        assert_eq!(metrics.syncs(IpFamily::V6), 2);
        assert_eq!(metrics.deleted_entries(IpFamily::V6), 3);
        assert_eq!(metrics.deleted_entries(IpFamily::V4), 0);

        let families = registry.gather();
        let names: Vec<&str> = families.iter().map(|f| f.name()).collect();
        assert_eq!(
            names,
            [
                "kubeproxy_conntrack_reconciler_deleted_entries_total",
                "kubeproxy_conntrack_reconciler_sync_duration_seconds"
            ]
        );
        let histogram = families[1].get_metric()[0].get_histogram();
        let bounds: Vec<f64> = histogram
            .get_bucket()
            .iter()
            .map(|b| b.upper_bound())
            .collect();
        assert_eq!(bounds.len(), 15);
        assert_eq!(bounds[0], 0.001);
        assert_eq!(bounds[14], 16.384);
        let label = &families[1].get_metric()[0].get_label()[0];
        assert_eq!((label.name(), label.value()), ("ip_family", "IPv6"));

        assert!(
            ConntrackMetrics::register(&registry).is_err(),
            "a second registration is refused"
        );
    }
}
