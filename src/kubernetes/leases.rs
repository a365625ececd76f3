//! The lease controller (`--enable-lease-controller`): publishes this server's Lease so agents
//! with `--count-server-leases` know how many servers there are, and deletes expired ones.
//!
//! Upstream's constants: a 30 s lease renewed every 15 s, expired leases collected every 15 s,
//! the own lease deleted on shutdown.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, DeleteParams, ListParams, PostParams, Preconditions};
use tokio_util::sync::CancellationToken;

use super::{error_status, Kube};
use crate::metrics::{LeaseCall, Metrics};

pub const LEASE_DURATION: Duration = Duration::from_secs(30);
pub const RENEW_INTERVAL: Duration = Duration::from_secs(15);
pub const GC_INTERVAL: Duration = Duration::from_secs(15);
const UPDATE_RETRIES: usize = 5;

pub fn lease_name(server_id: &str) -> String {
    format!("konnectivity-proxy-server-{server_id}")
}

/// Valid while (renewTime, else acquireTime) + leaseDurationSeconds is in the future; a lease
/// with neither time is invalid.
pub fn is_valid(lease: &Lease, now: jiff::Timestamp) -> bool {
    let Some(spec) = &lease.spec else {
        return false;
    };
    let Some(MicroTime(at)) = spec.renew_time.as_ref().or(spec.acquire_time.as_ref()) else {
        return false;
    };
    let seconds = i64::from(spec.lease_duration_seconds.unwrap_or(0));
    at.checked_add(jiff::SignedDuration::from_secs(seconds))
        .is_ok_and(|end| end > now)
}

/// Formats labels as a selector, `k=v,k2=v2`.
fn selector(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

pub struct LeaseController {
    pub kube: Arc<Kube>,
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
    pub server_id: String,
    pub metrics: Arc<Metrics>,
}

impl LeaseController {
    async fn api(&self) -> Result<Api<Lease>, String> {
        Ok(Api::namespaced(self.kube.client().await?, &self.namespace))
    }

    fn desired(&self, existing: Option<Lease>) -> Lease {
        let now = MicroTime(jiff::Timestamp::now());
        let mut lease = existing.unwrap_or_else(|| Lease {
            metadata: ObjectMeta {
                name: Some(lease_name(&self.server_id)),
                namespace: Some(self.namespace.clone()),
                ..Default::default()
            },
            ..Default::default()
        });
        lease.metadata.labels = Some(self.labels.clone());
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        spec.holder_identity = Some(self.server_id.clone());
        spec.lease_duration_seconds = Some(LEASE_DURATION.as_secs() as i32);
        if spec.acquire_time.is_none() {
            spec.acquire_time = Some(now.clone());
        }
        spec.renew_time = Some(now);
        lease
    }

    /// Creates or renews this server's lease.
    pub async fn renew(&self) -> Result<(), String> {
        let api = self.api().await?;
        let name = lease_name(&self.server_id);
        for _ in 0..UPDATE_RETRIES {
            self.kube.throttle().await;
            let result = match api.get_opt(&name).await.map_err(|e| e.to_string())? {
                None => {
                    api.create(&PostParams::default(), &self.desired(None))
                        .await
                }
                Some(existing) => {
                    api.replace(&name, &PostParams::default(), &self.desired(Some(existing)))
                        .await
                }
            };
            match result {
                Ok(_) => return Ok(()),
                // A conflict means someone updated it meanwhile: read it again.
                Err(kube::Error::Api(status)) if status.code == 409 => continue,
                Err(e) => return Err(e.to_string()),
            }
        }
        Err(format!("lease {name}: too many conflicting updates"))
    }

    /// Deletes every expired lease carrying our labels.
    pub async fn collect_expired(&self) -> Result<usize, String> {
        let api = self.api().await?;
        self.kube.throttle().await;
        let started = Instant::now();
        let listed = api
            .list(&ListParams::default().labels(&selector(&self.labels)))
            .await;
        let (code, reason) = match &listed {
            Ok(_) => ("200".to_string(), String::new()),
            Err(e) => error_status(e),
        };
        self.metrics
            .kubernetes
            .lease_call(LeaseCall::List, &code, &reason, started.elapsed());
        let leases = listed.map_err(|e| e.to_string())?;
        let now = jiff::Timestamp::now();
        let mut culled = 0;
        for lease in leases.items.into_iter().filter(|l| !is_valid(l, now)) {
            let Some(name) = lease.metadata.name.clone() else {
                continue;
            };
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    resource_version: lease.metadata.resource_version.clone(),
                    uid: None,
                }),
                ..Default::default()
            };
            self.kube.throttle().await;
            let started = Instant::now();
            let deleted = api.delete(&name, &params).await;
            let (code, reason) = match &deleted {
                Ok(_) => ("200".to_string(), String::new()),
                Err(e) => error_status(e),
            };
            self.metrics.kubernetes.lease_call(
                LeaseCall::Delete,
                &code,
                &reason,
                started.elapsed(),
            );
            match deleted {
                Ok(_) => {
                    culled += 1;
                    self.metrics.kubernetes.culled_leases_count.inc();
                }
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(e) => {
                    tracing::warn!(lease = %name, error = %e, "could not delete an expired lease")
                }
            }
        }
        Ok(culled)
    }

    async fn delete_own(&self) {
        let name = lease_name(&self.server_id);
        let deleted = match self.api().await {
            Ok(api) => api
                .delete(&name, &DeleteParams::default())
                .await
                .map(|_| ())
                .map_err(|e| e.to_string()),
            Err(e) => Err(e),
        };
        match deleted {
            Ok(()) => tracing::info!(lease = %name, "deleted this server's lease"),
            Err(e) => {
                tracing::warn!(lease = %name, error = %e, "could not delete this server's lease")
            }
        }
    }

    /// Renews and collects until `stop`, then deletes the own lease.
    pub async fn run(self, stop: CancellationToken) {
        let mut renew = tokio::time::interval(RENEW_INTERVAL);
        let mut collect = tokio::time::interval(GC_INTERVAL);
        renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        collect.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = renew.tick() => {
                    if let Err(e) = self.renew().await {
                        tracing::warn!(error = %e, "could not renew this server's lease");
                    }
                    // Upstream's jitter (4%), so replicas do not renew in lockstep.
                    let jitter = RENEW_INTERVAL.mul_f64(fastrand::f64() * 0.04);
                    renew.reset_after(RENEW_INTERVAL + jitter);
                }
                _ = collect.tick() => {
                    if let Err(e) = self.collect_expired().await {
                        tracing::warn!(error = %e, "could not collect expired leases");
                    }
                }
            }
        }
        self.delete_own().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(renew_secs_ago: Option<i64>, duration: i32) -> Lease {
        let now = jiff::Timestamp::now();
        Lease {
            spec: Some(LeaseSpec {
                renew_time: renew_secs_ago
                    .map(|s| MicroTime(now - jiff::SignedDuration::from_secs(s))),
                lease_duration_seconds: Some(duration),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn validity_follows_renew_time_plus_duration() {
        let now = jiff::Timestamp::now();
        assert!(is_valid(&lease(Some(10), 30), now));
        assert!(!is_valid(&lease(Some(40), 30), now));
        assert!(!is_valid(&lease(None, 30), now), "no time: invalid");
        assert!(!is_valid(&Lease::default(), now));
    }

    #[test]
    fn names_and_selectors() {
        assert_eq!(lease_name("s1"), "konnectivity-proxy-server-s1");
        let labels = BTreeMap::from([("k8s-app".to_string(), "konnectivity-server".to_string())]);
        assert_eq!(selector(&labels), "k8s-app=konnectivity-server");
    }
}
