//! The watches: Services (without a service-proxy-name label, not headless), EndpointSlices
//! (not of headless Services), ServiceCIDRs and this Node, with upstream's selectors. Each
//! object is read into the proxy's own values at once (`objects`) and the API's object
//! dropped. A watch that fails is resumed with back-off; a relist replaces what the store
//! held only once it is complete, so an apiserver that goes away changes nothing.

use std::collections::HashSet;
use std::sync::Arc;

use futures_util::StreamExt;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Api;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::node::NodeInfo;
use super::objects::{read_service, read_slice, Refused};
use super::store::Store;
use super::stream::Watch;
use crate::kube_proxy::metrics::ProxyMetrics;
use crate::kube_proxy::model::{parse_cidr_sloppy, ServiceName};
use crate::metrics::log_limit::ViolationLog;

const SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";
const HEADLESS: &str = "service.kubernetes.io/headless";
/// Objects per page of a relist (where the apiserver does not stream it).
const PAGE: u32 = 500;

/// Counts and logs (at a bounded rate) what could not be used.
pub struct Problems {
    metrics: Arc<ProxyMetrics>,
    log: ViolationLog,
}

impl Problems {
    pub fn new(metrics: Arc<ProxyMetrics>) -> Arc<Problems> {
        Arc::new(Problems {
            metrics,
            log: ViolationLog::new(),
        })
    }

    fn refused(&self, kind: &'static str, who: &str, why: &Refused) {
        self.metrics
            .skipped_objects
            .with_label_values(&[kind, why.reason()])
            .inc();
        if let Some(unlogged) = self.log.allow() {
            tracing::warn!(kind, object = who, reason = %why, unlogged, "Ignoring an object the proxy cannot use");
        }
    }

    fn entries(&self, kind: &'static str, who: &str, problems: &[String]) {
        for problem in problems {
            self.metrics
                .skipped_objects
                .with_label_values(&[kind, "entry"])
                .inc();
            if let Some(unlogged) = self.log.allow() {
                tracing::warn!(kind, object = who, problem = %problem, unlogged, "Ignoring part of an object");
            }
        }
    }

    fn watch_error(&self, kind: &'static str, error: &watcher::Error) {
        if let Some(unlogged) = self.log.allow() {
            tracing::error!(kind, error = %error, unlogged, "Failed to watch; retrying with back-off");
        }
    }
}

fn key(meta: &kube::api::ObjectMeta) -> String {
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    )
}

async fn next<S: futures_util::Stream + Unpin>(
    stream: &mut S,
    stop: &CancellationToken,
) -> Option<S::Item> {
    tokio::select! {
        _ = stop.cancelled() => None,
        item = stream.next() => item,
    }
}

pub async fn services(
    client: kube::Client,
    store: Arc<Store>,
    problems: Arc<Problems>,
    stop: CancellationToken,
) {
    let config = watcher::Config::default()
        .labels(&format!("!{SERVICE_PROXY_NAME}"))
        .fields("spec.clusterIP!=None")
        .page_size(PAGE);
    let mut stream = Watch::new(Api::<Service>::all(client), config, "Service");
    let mut relist: Option<HashSet<ServiceName>> = None;
    let mut synced = false;
    let apply = |svc: &Service, problems: &Problems| -> Option<ServiceName> {
        match read_service(svc) {
            Ok(read) => {
                problems.entries("Service", &key(&svc.metadata), &read.problems);
                let name = ServiceName::new(
                    svc.metadata.namespace.clone().unwrap_or_default(),
                    svc.metadata.name.clone().unwrap_or_default(),
                );
                let changed = store.set_service(name.clone(), read.service);
                if changed {
                    problems.metrics.service_changes_total.inc();
                }
                Some(name)
            }
            Err(why) => {
                problems.refused("Service", &key(&svc.metadata), &why);
                None
            }
        }
    };
    while let Some(event) = stream.next(&stop).await {
        match event {
            Ok(Event::Init) => relist = Some(HashSet::new()),
            Ok(Event::InitApply(svc)) => {
                if let (Some(name), Some(seen)) = (apply(&svc, &problems), relist.as_mut()) {
                    seen.insert(name);
                }
            }
            Ok(Event::InitDone) => {
                if let Some(seen) = relist.take() {
                    store.retain_services(&seen);
                }
                if !synced {
                    synced = true;
                    store.mark_synced(true);
                }
            }
            Ok(Event::Apply(svc)) => {
                apply(&svc, &problems);
            }
            Ok(Event::Delete(svc)) => {
                let name = ServiceName::new(
                    svc.metadata.namespace.clone().unwrap_or_default(),
                    svc.metadata.name.clone().unwrap_or_default(),
                );
                if store.set_service(name, None) {
                    problems.metrics.service_changes_total.inc();
                }
            }
            Err(e) => problems.watch_error("Service", &e),
        }
    }
}

pub async fn endpoint_slices(
    client: kube::Client,
    store: Arc<Store>,
    node_name: String,
    problems: Arc<Problems>,
    stop: CancellationToken,
) {
    let config = watcher::Config::default()
        .labels(&format!("!{HEADLESS}"))
        .page_size(PAGE);
    let mut stream = Watch::new(Api::<EndpointSlice>::all(client), config, "EndpointSlice");
    let mut relist: Option<HashSet<(String, String)>> = None;
    let mut synced = false;
    let slice_key = |s: &EndpointSlice| {
        (
            s.metadata.namespace.clone().unwrap_or_default(),
            s.metadata.name.clone().unwrap_or_default(),
        )
    };
    let apply = |slice: &EndpointSlice, problems: &Problems| {
        match read_slice(slice, &node_name) {
            Ok(read) => {
                problems.entries("EndpointSlice", &key(&slice.metadata), &read.problems);
                if store.set_slice(read.slice) {
                    problems.metrics.endpoint_changes_total.inc();
                }
            }
            Err(why) => {
                problems.refused("EndpointSlice", &key(&slice.metadata), &why);
                // A slice that became unusable no longer counts.
                let (ns, name) = slice_key(slice);
                store.remove_slice(&ns, &name);
            }
        }
    };
    while let Some(event) = stream.next(&stop).await {
        match event {
            Ok(Event::Init) => relist = Some(HashSet::new()),
            Ok(Event::InitApply(slice)) => {
                apply(&slice, &problems);
                if let Some(seen) = relist.as_mut() {
                    seen.insert(slice_key(&slice));
                }
            }
            Ok(Event::InitDone) => {
                if let Some(seen) = relist.take() {
                    store.retain_slices(&seen);
                }
                if !synced {
                    synced = true;
                    store.mark_synced(false);
                }
            }
            Ok(Event::Apply(slice)) => apply(&slice, &problems),
            Ok(Event::Delete(slice)) => {
                let (ns, name) = slice_key(&slice);
                if store.remove_slice(&ns, &name) {
                    problems.metrics.endpoint_changes_total.inc();
                }
            }
            Err(e) => problems.watch_error("EndpointSlice", &e),
        }
    }
}

/// Every ServiceCIDR's prefixes (all families), sent whole on each change. `listed` turns
/// true once the first list is in `sink`, or once it failed (an apiserver without the
/// resource, RBAC without it, an apiserver away): whoever waits for it then goes on.
pub async fn service_cidrs(
    client: kube::Client,
    sink: watch::Sender<Vec<IpNet>>,
    listed: watch::Sender<bool>,
    problems: Arc<Problems>,
    stop: CancellationToken,
) {
    let mut stream = watcher::watcher(Api::<ServiceCIDR>::all(client), watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut all: std::collections::BTreeMap<String, Vec<IpNet>> = Default::default();
    let mut relist: Option<std::collections::BTreeMap<String, Vec<IpNet>>> = None;
    let read = |c: &ServiceCIDR| -> Vec<IpNet> {
        c.spec
            .as_ref()
            .and_then(|s| s.cidrs.as_deref())
            .unwrap_or_default()
            .iter()
            .filter_map(|t| parse_cidr_sloppy(t))
            .collect()
    };
    while let Some(event) = next(&mut stream, &stop).await {
        match event {
            Ok(Event::Init) => relist = Some(Default::default()),
            Ok(Event::InitApply(c)) => {
                if let Some(r) = relist.as_mut() {
                    r.insert(c.metadata.name.clone().unwrap_or_default(), read(&c));
                }
            }
            Ok(Event::InitDone) => all = relist.take().unwrap_or_default(),
            Ok(Event::Apply(c)) => {
                all.insert(c.metadata.name.clone().unwrap_or_default(), read(&c));
            }
            Ok(Event::Delete(c)) => {
                all.remove(c.metadata.name.as_deref().unwrap_or_default());
            }
            Err(e) => {
                problems.watch_error("ServiceCIDR", &e);
                listed.send_replace(true);
                continue;
            }
        }
        if relist.is_none() {
            let mut cidrs: Vec<IpNet> = all.values().flatten().copied().collect();
            cidrs.sort();
            cidrs.dedup();
            sink.send_if_modified(|held| {
                let changed = *held != cidrs;
                *held = cidrs;
                changed
            });
            listed.send_replace(true);
        }
    }
}

/// This Node (`None` until it is seen, and after it is deleted).
pub async fn node(
    client: kube::Client,
    name: String,
    sink: watch::Sender<Option<NodeInfo>>,
    problems: Arc<Problems>,
    stop: CancellationToken,
) {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut stream = watcher::watcher(Api::<Node>::all(client), config)
        .default_backoff()
        .boxed();
    let mut seen_in_relist = false;
    while let Some(event) = next(&mut stream, &stop).await {
        let info = match event {
            Ok(Event::Init) => {
                seen_in_relist = false;
                continue;
            }
            Ok(Event::InitApply(n)) => {
                seen_in_relist = true;
                Some(NodeInfo::read(&n))
            }
            Ok(Event::InitDone) => {
                if seen_in_relist {
                    continue;
                }
                None
            }
            Ok(Event::Apply(n)) => Some(NodeInfo::read(&n)),
            Ok(Event::Delete(_)) => None,
            Err(e) => {
                problems.watch_error("Node", &e);
                continue;
            }
        };
        sink.send_if_modified(|held| {
            let changed = *held != info;
            *held = info;
            changed
        });
    }
}
