//! From the wanted state to one transaction, without asking the kernel what it holds: the
//! table's contents are kept here (`KernelView`), updated only once the kernel has taken a
//! transaction (`Plan::commit`).
//!
//! - A **full** sync replaces the table in one transaction (`add table; delete table`, then
//!   everything): atomic for packets, and whatever a previous process or a hand left in it
//!   is gone.
//! - A **refresh** (the hourly resync) writes the fixed objects and every Service's chains
//!   again and refills every set and map from the wanted state (a flush and the adds, in one
//!   transaction), without deleting the table, so ClientIP affinity is kept.
//! - A **partial** sync touches only the Services that changed: their chains (added, flushed,
//!   written), their affinity sets, and the map and set elements whose wanted value differs
//!   from what the kernel holds. Chains no longer wanted are flushed now and deleted by a
//!   later transaction (a kernel before 6.2 refuses to delete a chain a map element pointed at
//!   a moment ago).
//!
//! Elements are claimed by Services. Two Services may want the same key (an external IP
//! shared by mistake, a pod behind two Services): the key takes the value of the claim of the
//! Service that sorts first, and the kernel never sees an `add` that would clash.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use super::port::{render_port, PortRules, WantedElement};
use super::settings::Settings;
use super::skeleton::{self, ELEMENT_CONTAINERS};
use crate::kube_proxy::model::{Endpoint, ServiceName, ServicePort, ServicePortName};
use crate::kube_proxy::nft::objects::{Key, Object, SetKind, SetSpec, Transaction, Verdict};
use chain_names::ChainNames;

mod chain_names;

/// How long a flushed chain waits before it is deleted.
pub const STALE_CHAIN_DELAY: Duration = Duration::from_secs(1);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncKind {
    Full,
    Refresh,
    Partial,
}

impl SyncKind {
    pub fn is_full(self) -> bool {
        self != SyncKind::Partial
    }
}

/// The Services a sync renders, and their endpoints, by port.
pub struct Wanted<'a> {
    pub services: &'a BTreeMap<ServiceName, Vec<ServicePort>>,
    pub endpoints: &'a HashMap<ServicePortName, Vec<Endpoint>>,
    pub zone: Option<&'a str>,
}

/// What a Service has in the table. Boxed slices, not vectors: the view keeps one per Service
/// for the life of the process, and a vector grown by pushes keeps room for four or more.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Owned {
    chains: ChainNames,
    affinity_sets: Box<[String]>,
    keys: Box<[(&'static str, Key)]>,
    no_local_internal: usize,
    no_local_external: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Claim {
    owner: ServiceName,
    value: Option<Verdict>,
    comment: Option<String>,
}

/// An element as the kernel holds it: its value and comment.
type Held = (Option<Verdict>, Option<String>);

/// One key of one set or map: what the kernel holds, and which Services want it. The held
/// value is boxed: a full sync's plan holds a slot for every key, none of them with one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Slot {
    kernel: Option<Box<Held>>,
    claims: Vec<Claim>,
}

impl Slot {
    fn effective(&self) -> Option<&Claim> {
        effective(&self.claims)
    }
}

fn effective(claims: &[Claim]) -> Option<&Claim> {
    claims.iter().min_by(|a, b| a.owner.cmp(&b.owner))
}

/// A slot as the view keeps it between syncs. What the kernel holds is nearly always what the
/// effective claim wants, so that case is a mark, not a second copy of the verdict's chain
/// name and the comment: at 10,000 Services the view holds tens of thousands of slots.
#[derive(Clone, Debug, PartialEq, Eq)]
struct KeptSlot {
    kernel: KernelHeld,
    /// Nearly always one claim: a vector would keep room for four.
    claims: Box<[Claim]>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum KernelHeld {
    Absent,
    /// The effective claim's value and comment.
    Effective,
    Other(Box<Held>),
}

impl KeptSlot {
    fn keep(slot: Slot) -> KeptSlot {
        let Slot { kernel, claims } = slot;
        let kernel = match kernel {
            None => KernelHeld::Absent,
            Some(held) => {
                let same =
                    effective(&claims).is_some_and(|c| c.value == held.0 && c.comment == held.1);
                if same {
                    KernelHeld::Effective
                } else {
                    KernelHeld::Other(held)
                }
            }
        };
        KeptSlot {
            kernel,
            claims: claims.into_boxed_slice(),
        }
    }

    /// The slot a plan works on.
    fn working(&self) -> Slot {
        let kernel = match &self.kernel {
            KernelHeld::Absent => None,
            KernelHeld::Effective => {
                effective(&self.claims).map(|c| Box::new((c.value.clone(), c.comment.clone())))
            }
            KernelHeld::Other(held) => Some(held.clone()),
        };
        Slot {
            kernel,
            claims: self.claims.to_vec(),
        }
    }
}

/// What the kernel's table holds, as far as this process wrote it.
#[derive(Clone, Debug, Default)]
pub struct KernelView {
    /// Whether a full sync has gone in since the process started (or since a failure).
    built: bool,
    slots: HashMap<(&'static str, Key), KeptSlot>,
    services: HashMap<ServiceName, Owned>,
    stale_chains: HashMap<String, Instant>,
    no_local_internal: usize,
    no_local_external: usize,
}

/// A planned transaction and the view it leaves once the kernel took it.
pub struct Plan {
    pub kind: SyncKind,
    pub tx: Transaction,
    commit: Commit,
}

struct Commit {
    reset: bool,
    services: Vec<(ServiceName, Option<Owned>)>,
    slots: Vec<((&'static str, Key), Slot)>,
    stale_added: Vec<String>,
    stale_revived: Vec<String>,
}

impl Plan {
    /// This plan's view, reached by `tx` instead of its own transaction: the kernel's table
    /// already holds the rest (`adopt`). `stale` names chains `tx` leaves empty, to be
    /// deleted by a later transaction as a partial sync's are.
    pub fn reached_by(mut self, tx: Transaction, stale: Vec<String>) -> Plan {
        self.tx = tx;
        self.commit.stale_added = stale;
        self
    }
}

impl KernelView {
    pub fn new() -> KernelView {
        KernelView::default()
    }

    /// Whether the next sync has to be a full one.
    pub fn needs_full(&self) -> bool {
        !self.built
    }

    /// Forgets what the kernel holds, so the next sync is a full one (after a refused
    /// transaction: what the kernel holds is no longer certain).
    pub fn invalidate(&mut self) {
        *self = KernelView::default();
    }

    /// Ports whose Local-policy traffic has no local endpoint: (internal, external).
    pub fn no_local_endpoints(&self) -> (usize, usize) {
        (self.no_local_internal, self.no_local_external)
    }

    /// When the next stale chain may be deleted, if any waits.
    pub fn next_stale_deadline(&self) -> Option<Instant> {
        self.stale_chains
            .values()
            .min()
            .map(|flushed| *flushed + STALE_CHAIN_DELAY)
    }

    /// The transaction that deletes the chains flushed at least a second before `now`, and
    /// their names (forgotten only once the kernel took it: `stale_deleted`).
    pub fn stale_cleanup(
        &self,
        settings: &Settings,
        now: Instant,
    ) -> Option<(Transaction, Vec<String>)> {
        let due: Vec<String> = self
            .stale_chains
            .iter()
            .filter(|(_, flushed)| now.duration_since(**flushed) >= STALE_CHAIN_DELAY)
            .map(|(name, _)| name.clone())
            .collect();
        if due.is_empty() {
            return None;
        }
        let mut tx = Transaction::new(settings.family);
        for name in &due {
            tx.delete(Object::chain(name.clone()));
        }
        Some((tx, due))
    }

    pub fn stale_deleted(&mut self, names: &[String]) {
        for name in names {
            self.stale_chains.remove(name);
        }
    }

    /// Plans a sync. `changed` names the Services whose ports or endpoints changed since
    /// the last sync the kernel took (ignored by full syncs and refreshes).
    pub fn plan(
        &self,
        settings: &Settings,
        kind: SyncKind,
        wanted: &Wanted<'_>,
        changed: &HashSet<ServiceName>,
    ) -> Plan {
        let kind = if self.built { kind } else { SyncKind::Full };
        let mut tx = Transaction::new(settings.family);
        let mut commit = Commit {
            reset: kind == SyncKind::Full,
            services: Vec::new(),
            slots: Vec::new(),
            stale_added: Vec::new(),
            stale_revived: Vec::new(),
        };
        if kind == SyncKind::Full {
            // The table exists after the add, so the delete never fails.
            tx.add(Object::Table { comment: None });
            tx.delete(Object::Table { comment: None });
        }
        if kind.is_full() {
            skeleton::write(settings, false, &mut tx);
        }
        if kind == SyncKind::Refresh {
            for (set, kind) in ELEMENT_CONTAINERS {
                tx.flush(Object::set_named(kind, set));
            }
        }

        // The Services to render, and the elements they touch.
        let names: Vec<&ServiceName> = match kind {
            SyncKind::Partial => {
                let mut names: Vec<&ServiceName> = changed.iter().collect();
                names.sort();
                names
            }
            _ => wanted
                .services
                .keys()
                .chain(self.services.keys())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect(),
        };
        let mut touched: HashMap<(&'static str, Key), Slot> = HashMap::new();
        let mut element_ops: Vec<(&'static str, Key)> = Vec::new();
        let mut stale_flush: Vec<String> = Vec::new();
        let mut stale_sets: Vec<String> = Vec::new();
        for name in names {
            let old = match kind {
                SyncKind::Full => None,
                _ => self.services.get(name),
            };
            let rendered = wanted.services.get(name).map(|ports| {
                ports
                    .iter()
                    .map(|port| {
                        let eps = wanted
                            .endpoints
                            .get(&port.name)
                            .map(Vec::as_slice)
                            .unwrap_or_default();
                        render_port(settings, port, eps, wanted.zone)
                    })
                    .collect::<Vec<PortRules>>()
            });
            let mut owned = Owned::default();
            let mut owned_keys: HashSet<(&'static str, Key)> = HashSet::new();
            let mut owned_chains: HashSet<String> = HashSet::new();
            let mut chain_order: Vec<String> = Vec::new();
            let mut keys = Vec::new();
            let mut affinity_sets: Vec<String> = Vec::new();
            let mut chain_rules = Vec::new();
            if let Some(ports) = rendered {
                for port in ports {
                    owned.no_local_internal += usize::from(port.no_local_internal);
                    owned.no_local_external += usize::from(port.no_local_external);
                    for chain in &port.chains {
                        if owned_chains.insert(chain.name.clone()) {
                            chain_order.push(chain.name.clone());
                            tx.add(Object::chain(chain.name.clone()));
                            tx.flush(Object::chain(chain.name.clone()));
                        }
                    }
                    for element in port.elements {
                        let WantedElement {
                            set,
                            key,
                            value,
                            comment,
                        } = element;
                        let slot_key = (set, key);
                        let slot = touched.entry(slot_key.clone()).or_insert_with(|| {
                            element_ops.push(slot_key.clone());
                            let mut slot = match kind {
                                SyncKind::Full => Slot::default(),
                                _ => self.slot(&slot_key),
                            };
                            if kind == SyncKind::Refresh {
                                slot.kernel = None;
                            }
                            slot
                        });
                        if owned_keys.insert(slot_key.clone()) {
                            // A Service claims a key once, with its first value.
                            slot.claims.retain(|c| &c.owner != name);
                            keys.push(slot_key.clone());
                            // Room for this claim only: nearly every key has one, and a
                            // first push would make room for four.
                            slot.claims.reserve_exact(1);
                            slot.claims.push(Claim {
                                owner: name.clone(),
                                value,
                                comment,
                            });
                        }
                    }
                    for (set, timeout) in port.affinity_sets {
                        if !affinity_sets.contains(&set) {
                            tx.add(affinity_set(settings, &set, timeout));
                            affinity_sets.push(set);
                        }
                    }
                    chain_rules.extend(port.chains);
                }
            }
            owned.chains = ChainNames::new(chain_order.iter().map(String::as_str));
            owned.keys = keys.into_boxed_slice();
            owned.affinity_sets = affinity_sets.into_boxed_slice();
            // The keys this Service no longer claims.
            if let Some(old) = old {
                for slot_key in &old.keys {
                    if owned_keys.contains(slot_key) {
                        continue;
                    }
                    let slot = touched.entry(slot_key.clone()).or_insert_with(|| {
                        element_ops.push(slot_key.clone());
                        let mut slot = self.slot(slot_key);
                        if kind == SyncKind::Refresh {
                            slot.kernel = None;
                        }
                        slot
                    });
                    slot.claims.retain(|c| &c.owner != name);
                }
                for chain in old.chains.iter() {
                    if !owned_chains.contains(chain) {
                        stale_flush.push(chain.to_owned());
                    }
                }
                for set in &old.affinity_sets {
                    if !owned.affinity_sets.contains(set) {
                        stale_sets.push(set.clone());
                    }
                }
            }
            for chain in owned.chains.iter() {
                if self.stale_chains.contains_key(chain) && kind != SyncKind::Full {
                    commit.stale_revived.push(chain.to_owned());
                }
            }
            for chain in chain_rules {
                for rule in chain.rules {
                    tx.add_rule(&chain.name, rule);
                }
            }
            let keep = !owned.chains.is_empty()
                || !owned.keys.is_empty()
                || !owned.affinity_sets.is_empty();
            commit.services.push((name.clone(), keep.then_some(owned)));
        }

        // The touched slots in the order they were first met, in a vector of their size that
        // becomes the commit's: the map and the order are gone before the transaction grows,
        // since at a full sync the end of this plan is the moment it holds the most.
        let mut ordered = Vec::with_capacity(element_ops.len());
        for slot_key in element_ops {
            if let Some(slot) = touched.remove(&slot_key) {
                ordered.push((slot_key, slot));
            }
        }
        drop(touched);

        // Elements: adds (and delete + add for a changed value) first, leftovers last. The
        // room for them is made once, to size: at a full sync they are most of the
        // transaction, and growing by doubling would hold the old buffer beside one twice as
        // large.
        tx.ops
            .reserve_exact(ordered.len() + stale_flush.len() + stale_sets.len());
        let mut deletes = Vec::new();
        for (slot_key, slot) in &mut ordered {
            let (set, key) = &*slot_key;
            let wanted: Option<Held> = slot
                .effective()
                .map(|c| (c.value.clone(), c.comment.clone()));
            match (slot.kernel.as_deref(), wanted) {
                (Some(have), Some(want)) if *have == want => {}
                (Some(_), Some(want)) => {
                    // A changed value (or, where two Services claim the key, comment).
                    tx.delete(element(set, key, None, None));
                    tx.add(element(set, key, want.0.clone(), want.1.clone()));
                    slot.kernel = Some(Box::new(want));
                }
                (None, Some(want)) => {
                    tx.add(element(set, key, want.0.clone(), want.1.clone()));
                    slot.kernel = Some(Box::new(want));
                }
                (Some(_), None) => {
                    deletes.push(element(set, key, None, None));
                    slot.kernel = None;
                }
                (None, None) => {}
            }
        }
        commit.slots = ordered;
        for chain in &stale_flush {
            tx.flush(Object::chain(chain.clone()));
        }
        commit.stale_added = stale_flush;
        for set in stale_sets {
            tx.delete(Object::set_named(SetKind::Set, set));
        }
        for delete in deletes {
            tx.delete(delete);
        }
        Plan { kind, tx, commit }
    }

    /// Records what a transaction the kernel took has changed.
    pub fn commit(&mut self, plan: Plan, now: Instant) {
        let commit = plan.commit;
        if commit.reset {
            *self = KernelView::default();
        }
        self.built = true;
        // Grown once to its size rather than by doubling: at a full sync every Service and
        // key is inserted, and each doubling would hold the old table beside the new.
        self.services.reserve(commit.services.len());
        self.slots.reserve(commit.slots.len());
        for (name, owned) in commit.services {
            if let Some(old) = self.services.remove(&name) {
                self.no_local_internal -= old.no_local_internal;
                self.no_local_external -= old.no_local_external;
            }
            if let Some(owned) = owned {
                self.no_local_internal += owned.no_local_internal;
                self.no_local_external += owned.no_local_external;
                self.services.insert(name, owned);
            }
        }
        for (key, slot) in commit.slots {
            if slot.kernel.is_none() && slot.claims.is_empty() {
                self.slots.remove(&key);
            } else {
                let slot = KeptSlot::keep(slot);
                match self.slots.entry(key) {
                    Entry::Occupied(mut e) => *e.get_mut() = slot,
                    Entry::Vacant(e) => {
                        e.insert(slot);
                    }
                }
            }
        }
        for chain in commit.stale_revived {
            self.stale_chains.remove(&chain);
        }
        for chain in commit.stale_added {
            self.stale_chains.insert(chain, now);
        }
    }

    /// A key's slot as a plan starts from it.
    fn slot(&self, key: &(&'static str, Key)) -> Slot {
        self.slots
            .get(key)
            .map(KeptSlot::working)
            .unwrap_or_default()
    }

    /// Services and chains in the view (for tests and status).
    pub fn counts(&self) -> (usize, usize) {
        (
            self.services.len(),
            self.services.values().map(|o| o.chains.len()).sum(),
        )
    }
}

fn element(set: &str, key: &Key, value: Option<Verdict>, comment: Option<String>) -> Object {
    Object::Element {
        set: set.to_owned(),
        key: key.clone(),
        value,
        comment,
    }
}

fn affinity_set(settings: &Settings, name: &str, timeout: u32) -> Object {
    Object::Set {
        name: name.to_owned(),
        spec: SetSpec {
            kind: SetKind::Set,
            key_type: settings.family.nft_addr_type().into(),
            flags: vec!["dynamic".into(), "timeout".into()],
            timeout_secs: Some(timeout),
            comment: None,
        },
    }
}

#[cfg(test)]
mod tests;
