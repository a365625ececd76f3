//! The families of the server's Kubernetes API calls: lease garbage collection and the
//! TokenReviews that authenticate agents.

use prometheus::{HistogramVec, IntCounter, IntCounterVec};

use super::family::Families;

/// A lease API call of the garbage collector.
#[derive(Clone, Copy, Debug)]
pub enum LeaseCall {
    List,
    Delete,
}

pub struct KubernetesMetrics {
    pub culled_leases_count: IntCounter,
    lease_delete_latency: HistogramVec,
    lease_delete_total: IntCounterVec,
    lease_list_latency: HistogramVec,
    lease_list_total: IntCounterVec,
    /// Beyond upstream: TokenReviews by result, and reviews answered from the cache.
    token_reviews: IntCounterVec,
    token_review_cache_hits: IntCounter,
}

impl KubernetesMetrics {
    pub(super) fn new(f: &Families<'_>) -> KubernetesMetrics {
        KubernetesMetrics {
            culled_leases_count: f.counter(
                "culled_leases_count",
                "Count of expired leases that the lease garbage collection controller has culled.",
            ),
            lease_delete_latency: f.histogram_vec(
                "lease_delete_latency_seconds",
                "Latency of lease deletion calls by the garbage collection controller in seconds.",
                &["http_status_code"],
                None,
            ),
            lease_delete_total: f.counter_vec(
                "lease_delete_total",
                "Count of lease delection calls by the garbage collection controller. Labeled by HTTP status code and reason.",
                &["http_status_code", "reason"],
            ),
            lease_list_latency: f.histogram_vec(
                "lease_list_latency_seconds",
                "Latency of lease list calls by the garbage collection controller in seconds.",
                &["http_status_code"],
                None,
            ),
            lease_list_total: f.counter_vec(
                "lease_list_total",
                "Count of lease deletion calls by the garbage collection controller. Labeled by HTTP status code and reason.",
                &["http_status_code", "reason"],
            ),
            token_reviews: f.counter_vec(
                "token_reviews_total",
                "TokenReviews sent to the API server for agent authentication, by result (ok, error).",
                &["result"],
            ),
            token_review_cache_hits: f.counter(
                "token_review_cache_hits_total",
                "Agent tokens accepted from the review cache without a TokenReview.",
            ),
        }
    }

    /// Records a lease API call of the garbage collector.
    pub fn lease_call(&self, call: LeaseCall, code: &str, reason: &str, took: std::time::Duration) {
        let (latency, total) = match call {
            LeaseCall::List => (&self.lease_list_latency, &self.lease_list_total),
            LeaseCall::Delete => (&self.lease_delete_latency, &self.lease_delete_total),
        };
        latency
            .with_label_values(&[code])
            .observe(took.as_secs_f64());
        total.with_label_values(&[code, reason]).inc();
    }

    pub fn token_review(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.token_reviews.with_label_values(&[result]).inc();
    }

    pub fn token_review_cache_hit(&self) {
        self.token_review_cache_hits.inc();
    }
}
