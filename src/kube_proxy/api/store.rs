//! The change trackers: the Services and EndpointSlices the watches delivered (only what the
//! proxy reads of them), and, for each family's proxier, which Services changed since its
//! last checkout. A watch event that changes nothing the proxy reads (a new
//! resourceVersion, a status field) changes nothing here, so it starts no sync.
//!
//! Everything is keyed by object, so however many events arrive between two syncs the store
//! holds one entry per object and one dirty mark per Service: bounded by the cluster's size,
//! never by the event rate.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::SystemTime;

use tokio::sync::Notify;

use super::objects::{ServiceObj, SliceObj};
use crate::kube_proxy::model::{IpFamily, ServiceName};

/// What one family's proxier must look at again.
#[derive(Default)]
struct Dirty {
    services: HashSet<ServiceName>,
    endpoints: HashSet<ServiceName>,
    /// The change times of the slices that changed (for network programming latency).
    trigger_times: Vec<SystemTime>,
    /// Everything: the next checkout returns every Service (after a restart of the watches
    /// the cluster may have changed in ways no event said).
    all: bool,
}

#[derive(Default)]
struct Inner {
    services: HashMap<ServiceName, Arc<ServiceObj>>,
    /// Slices by Service, then by slice name.
    slices: HashMap<ServiceName, BTreeMap<String, Arc<SliceObj>>>,
    /// Which Service each slice (namespace, name) was filed under.
    slice_owner: HashMap<(String, String), ServiceName>,
    dirty: Vec<(IpFamily, Dirty)>,
    services_synced: bool,
    slices_synced: bool,
}

/// One Service's objects, as a checkout returns them.
pub struct ServiceObjects {
    pub service: Option<Arc<ServiceObj>>,
    pub slices: Vec<Arc<SliceObj>>,
}

/// What changed for one family since its last checkout.
#[derive(Default)]
pub struct Checkout {
    pub services: HashMap<ServiceName, Option<Arc<ServiceObj>>>,
    pub endpoints: HashMap<ServiceName, Vec<Arc<SliceObj>>>,
    pub trigger_times: Vec<SystemTime>,
}

impl Checkout {
    pub fn is_empty(&self) -> bool {
        self.services.is_empty() && self.endpoints.is_empty()
    }
}

/// Told each time a family gets a change to sync (once the first lists are in), outside the
/// store's lock: the moment a change is queued, which upstream's healthz clock and queued
/// gauges mark, not the later moment the runner starts the sync.
pub trait QueueListener: Send + Sync {
    fn queued(&self, store: &Store, family: IpFamily);
}

pub struct Store {
    inner: Mutex<Inner>,
    /// Wakes each family's runner when something changed for it.
    wake: Vec<(IpFamily, Arc<Notify>)>,
    listener: OnceLock<Arc<dyn QueueListener>>,
}

impl Store {
    pub fn new(families: &[IpFamily]) -> Arc<Store> {
        let inner = Inner {
            dirty: families.iter().map(|f| (*f, Dirty::default())).collect(),
            ..Inner::default()
        };
        Arc::new(Store {
            inner: Mutex::new(inner),
            wake: families
                .iter()
                .map(|f| (*f, Arc::new(Notify::new())))
                .collect(),
            listener: OnceLock::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The notifier a family's runner waits on.
    pub fn waker(&self, family: IpFamily) -> Option<Arc<Notify>> {
        self.wake
            .iter()
            .find(|(f, _)| *f == family)
            .map(|(_, n)| n.clone())
    }

    /// Who is told of each queued change (once; a second listener is refused).
    pub fn set_listener(&self, listener: Arc<dyn QueueListener>) -> bool {
        self.listener.set(listener).is_ok()
    }

    fn wake_all(&self) {
        for (family, n) in &self.wake {
            if let Some(listener) = self.listener.get() {
                listener.queued(self, *family);
            }
            n.notify_one();
        }
    }

    /// A Service added, changed (`Some`) or gone (`None`). Returns whether anything the
    /// proxy reads changed.
    pub fn set_service(&self, name: ServiceName, service: Option<ServiceObj>) -> bool {
        let mut inner = self.lock();
        let changed = match (&service, inner.services.get(&name)) {
            (Some(new), Some(old)) => **old != *new,
            (None, None) => false,
            _ => true,
        };
        if !changed {
            return false;
        }
        match service {
            Some(s) => inner.services.insert(name.clone(), Arc::new(s)),
            None => inner.services.remove(&name),
        };
        for (_, dirty) in &mut inner.dirty {
            dirty.services.insert(name.clone());
        }
        let synced = inner.services_synced && inner.slices_synced;
        drop(inner);
        if synced {
            self.wake_all();
        }
        true
    }

    /// An EndpointSlice added or changed. Returns whether anything the proxy reads changed.
    pub fn set_slice(&self, slice: SliceObj) -> bool {
        let key = (slice.service.namespace().to_owned(), slice.name.clone());
        let mut inner = self.lock();
        let previous_owner = inner.slice_owner.get(&key).cloned();
        let mut old_family = None;
        if let Some(owner) = &previous_owner {
            let old = inner
                .slices
                .get(owner)
                .and_then(|s| s.get(&slice.name))
                .cloned();
            if *owner == slice.service && old.as_ref().is_some_and(|o| o.same_content(&slice)) {
                return false;
            }
            old_family = old.map(|o| o.family);
            // Filed under another Service before (its label changed): take it out there.
            if *owner != slice.service {
                Self::remove_slice_locked(&mut inner, owner, &slice.name);
            }
        }
        let family = slice.family;
        let service = slice.service.clone();
        let time = slice.trigger_time;
        inner.slice_owner.insert(key, service.clone());
        inner
            .slices
            .entry(service.clone())
            .or_default()
            .insert(slice.name.clone(), Arc::new(slice));
        for (f, dirty) in &mut inner.dirty {
            if *f == family {
                dirty.endpoints.insert(service.clone());
                dirty.trigger_times.extend(time);
            }
            // The family and the Service the slice counted for before see it go.
            if let (Some(owner), Some(old)) = (&previous_owner, old_family) {
                if *f == old && (*owner != service || old != family) {
                    dirty.endpoints.insert(owner.clone());
                }
            }
        }
        let synced = inner.services_synced && inner.slices_synced;
        drop(inner);
        if synced {
            self.wake_all();
        }
        true
    }

    fn remove_slice_locked(
        inner: &mut Inner,
        owner: &ServiceName,
        name: &str,
    ) -> Option<Arc<SliceObj>> {
        let slices = inner.slices.get_mut(owner)?;
        let removed = slices.remove(name);
        if slices.is_empty() {
            inner.slices.remove(owner);
        }
        removed
    }

    /// An EndpointSlice gone.
    pub fn remove_slice(&self, namespace: &str, name: &str) -> bool {
        let mut inner = self.lock();
        let Some(owner) = inner
            .slice_owner
            .remove(&(namespace.to_owned(), name.to_owned()))
        else {
            return false;
        };
        let Some(removed) = Self::remove_slice_locked(&mut inner, &owner, name) else {
            return false;
        };
        for (f, dirty) in &mut inner.dirty {
            if *f == removed.family {
                dirty.endpoints.insert(owner.clone());
            }
        }
        let synced = inner.services_synced && inner.slices_synced;
        drop(inner);
        if synced {
            self.wake_all();
        }
        true
    }

    /// The Services a full relist still has: every other one is gone.
    pub fn retain_services(&self, keep: &HashSet<ServiceName>) {
        let gone: Vec<ServiceName> = {
            let inner = self.lock();
            inner
                .services
                .keys()
                .filter(|k| !keep.contains(*k))
                .cloned()
                .collect()
        };
        for name in gone {
            self.set_service(name, None);
        }
    }

    /// The slices a full relist still has, by (namespace, name): every other one is gone.
    pub fn retain_slices(&self, keep: &HashSet<(String, String)>) {
        let gone: Vec<(String, String)> = {
            let inner = self.lock();
            inner
                .slice_owner
                .keys()
                .filter(|k| !keep.contains(*k))
                .cloned()
                .collect()
        };
        for (ns, name) in gone {
            self.remove_slice(&ns, &name);
        }
    }

    /// The first full list of Services (`services`) or slices has been delivered. Syncs wait
    /// for both, as upstream's do, so a restart never programs a half-known cluster.
    pub fn mark_synced(&self, services: bool) {
        let mut inner = self.lock();
        if services {
            inner.services_synced = true;
        } else {
            inner.slices_synced = true;
        }
        let ready = inner.services_synced && inner.slices_synced;
        if ready {
            for (_, dirty) in &mut inner.dirty {
                dirty.all = true;
            }
        }
        drop(inner);
        if ready {
            self.wake_all();
        }
    }

    pub fn synced(&self) -> bool {
        let inner = self.lock();
        inner.services_synced && inner.slices_synced
    }

    /// Takes what changed for `family` since its last checkout.
    pub fn checkout(&self, family: IpFamily) -> Checkout {
        let mut inner = self.lock();
        let Some(index) = inner.dirty.iter().position(|(f, _)| *f == family) else {
            return Checkout::default();
        };
        let dirty = std::mem::take(&mut inner.dirty[index].1);
        let (services, endpoints): (Vec<ServiceName>, Vec<ServiceName>) = if dirty.all {
            let mut all: HashSet<ServiceName> = inner.services.keys().cloned().collect();
            all.extend(inner.slices.keys().cloned());
            all.extend(dirty.services);
            all.extend(dirty.endpoints);
            let all: Vec<ServiceName> = all.into_iter().collect();
            (all.clone(), all)
        } else {
            (
                dirty.services.into_iter().collect(),
                dirty.endpoints.into_iter().collect(),
            )
        };
        let mut out = Checkout {
            trigger_times: dirty.trigger_times,
            ..Checkout::default()
        };
        for name in services {
            let service = inner.services.get(&name).cloned();
            out.services.insert(name, service);
        }
        for name in endpoints {
            let slices = inner
                .slices
                .get(&name)
                .map(|s| s.values().filter(|s| s.family == family).cloned().collect())
                .unwrap_or_default();
            out.endpoints.insert(name, slices);
        }
        out
    }

    /// How many changes wait for `family` (the pending-changes gauges).
    pub fn pending(&self, family: IpFamily) -> (usize, usize) {
        let inner = self.lock();
        inner
            .dirty
            .iter()
            .find(|(f, _)| *f == family)
            .map(|(_, d)| (d.services.len(), d.endpoints.len()))
            .unwrap_or_default()
    }

    /// Objects held: (Services, slices).
    pub fn counts(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.services.len(), inner.slice_owner.len())
    }

    /// One Service's objects (for tests and `/debug`).
    pub fn objects(&self, name: &ServiceName) -> ServiceObjects {
        let inner = self.lock();
        ServiceObjects {
            service: inner.services.get(name).cloned(),
            slices: inner
                .slices
                .get(name)
                .map(|s| s.values().cloned().collect())
                .unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests;
