//! The proxy's health (`/healthz` and `/livez` on the healthz port), as upstream judges it: a
//! family is unhealthy once a sync it was asked for has waited 2 x syncPeriod without one
//! succeeding; `/healthz` also needs the node to be eligible (its Node known, not being
//! deleted, not tainted for deletion by the cluster autoscaler).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use serde::Serialize;

use super::model::IpFamily;

/// The taint the cluster autoscaler puts on a node it is about to delete.
pub const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

#[derive(Default)]
struct Family {
    last_updated: Option<SystemTime>,
    oldest_pending: Option<SystemTime>,
}

/// Shared between the proxiers (which report) and the healthz port (which reads).
pub struct ProxyHealth {
    timeout: Mutex<Duration>,
    families: Mutex<BTreeMap<IpFamily, Family>>,
    node_eligible: Mutex<bool>,
}

#[derive(Serialize)]
struct FamilyStatus {
    #[serde(rename = "lastUpdated")]
    last_updated: String,
    healthy: bool,
}

/// The JSON body both endpoints return, as upstream's.
#[derive(Serialize)]
pub struct Report {
    #[serde(rename = "lastUpdated")]
    last_updated: String,
    #[serde(rename = "currentTime")]
    current_time: String,
    #[serde(rename = "nodeEligible", skip_serializing_if = "Option::is_none")]
    node_eligible: Option<bool>,
    pub healthy: bool,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    status: BTreeMap<&'static str, FamilyStatus>,
}

/// A time as Go's `time.Time` marshals it (RFC 3339 with nanoseconds, UTC here).
pub fn go_time(t: Option<SystemTime>) -> String {
    match t.and_then(|t| jiff::Timestamp::try_from(t).ok()) {
        Some(ts) => ts.to_string(),
        None => "0001-01-01T00:00:00Z".into(),
    }
}

impl ProxyHealth {
    /// `timeout` is 2 x syncPeriod.
    pub fn new(timeout: Duration) -> ProxyHealth {
        ProxyHealth {
            timeout: Mutex::new(timeout),
            families: Mutex::new(BTreeMap::new()),
            node_eligible: Mutex::new(false),
        }
    }

    pub fn set_timeout(&self, timeout: Duration) {
        *self.timeout.lock().unwrap_or_else(|p| p.into_inner()) = timeout;
    }

    /// A sync was asked for (the first request since the last success starts the clock).
    pub fn queued(&self, family: IpFamily) {
        let mut families = self.families.lock().unwrap_or_else(|p| p.into_inner());
        let f = families.entry(family).or_default();
        if f.oldest_pending.is_none() {
            f.oldest_pending = Some(SystemTime::now());
        }
    }

    /// A sync succeeded (also called once when the sync loop starts).
    pub fn updated(&self, family: IpFamily) {
        let mut families = self.families.lock().unwrap_or_else(|p| p.into_inner());
        let f = families.entry(family).or_default();
        f.oldest_pending = None;
        f.last_updated = Some(SystemTime::now());
    }

    pub fn set_node_eligible(&self, eligible: bool) {
        *self.node_eligible.lock().unwrap_or_else(|p| p.into_inner()) = eligible;
    }

    pub fn node_eligible(&self) -> bool {
        *self.node_eligible.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The state `/livez` reports (and `/healthz`, with the node's eligibility).
    pub fn report(&self, with_node: bool, now: SystemTime) -> Report {
        let timeout = *self.timeout.lock().unwrap_or_else(|p| p.into_inner());
        let families = self.families.lock().unwrap_or_else(|p| p.into_inner());
        let mut healthy = true;
        let mut last = None::<SystemTime>;
        let mut status = BTreeMap::new();
        for (family, f) in families.iter() {
            if f.last_updated.is_none() {
                continue;
            }
            last = last.max(f.last_updated);
            let stale = f
                .oldest_pending
                .is_some_and(|q| now.duration_since(q).unwrap_or_default() >= timeout);
            healthy &= !stale;
            status.insert(
                family.api(),
                FamilyStatus {
                    last_updated: go_time(f.last_updated),
                    healthy: !stale,
                },
            );
        }
        let node_eligible = with_node.then(|| self.node_eligible());
        let ok = healthy && node_eligible.unwrap_or(true);
        Report {
            // A healthy answer carries the current time, as upstream's.
            last_updated: go_time(if ok { Some(now) } else { last }),
            current_time: go_time(Some(now)),
            node_eligible,
            healthy,
            status,
        }
    }

    /// Whether every family is healthy (for the watchdog and the status line).
    pub fn healthy(&self) -> bool {
        self.report(false, SystemTime::now()).healthy
    }
}

impl Report {
    /// The status code: 200, or 503 when unhealthy or (for `/healthz`) the node is not
    /// eligible.
    pub fn code(&self) -> u16 {
        if self.healthy && self.node_eligible.unwrap_or(true) {
            200
        } else {
            503
        }
    }

    pub fn json(&self) -> String {
        serde_json::to_string(self).expect("the report serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_waiting_twice_the_sync_period_is_unhealthy() {
        let h = ProxyHealth::new(Duration::from_secs(60));
        let t0 = SystemTime::now();
        h.updated(IpFamily::V4);
        assert_eq!(h.report(false, t0).code(), 200);
        h.queued(IpFamily::V4);
        assert_eq!(h.report(false, t0 + Duration::from_secs(30)).code(), 200);
        assert_eq!(h.report(false, t0 + Duration::from_secs(61)).code(), 503);
        h.updated(IpFamily::V4);
        assert_eq!(h.report(false, SystemTime::now()).code(), 200);
        // /healthz also needs an eligible node.
        assert_eq!(h.report(true, SystemTime::now()).code(), 503);
        h.set_node_eligible(true);
        let r = h.report(true, SystemTime::now());
        assert_eq!(r.code(), 200);
        let json = r.json();
        assert!(json.contains("\"nodeEligible\":true"), "{json}");
        assert!(
            json.contains("\"status\":{\"IPv4\":{\"lastUpdated\":"),
            "{json}"
        );
    }

    #[test]
    fn times_read_as_go_writes_them() {
        assert_eq!(go_time(None), "0001-01-01T00:00:00Z");
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        assert_eq!(go_time(Some(t)), "2023-11-14T22:13:20.123Z");
    }
}
