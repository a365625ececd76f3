//! One family's proxier: takes what changed from the change trackers, keeps what the node
//! wants (`wanted`), plans the sync against what the kernel holds (`ruleset::sync`), hands
//! the transaction to the kernel, and does what upstream does after a sync that went in
//! (metrics, health, stale UDP conntrack entries). The first sync of the process reads the
//! table a previous run left and sends only what differs (`ruleset::adopt`).

pub mod wanted;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::gofmt::GoDuration;
use crate::kube_proxy::api::store::{QueueListener, Store};
use crate::kube_proxy::healthz::ProxyHealth;
use crate::kube_proxy::metrics::ProxyMetrics;
use crate::kube_proxy::model::{IpFamily, ServiceName};
use crate::kube_proxy::nft::exec::{Applier, NftError};
use crate::kube_proxy::nft::netlink::Netlink;
use crate::kube_proxy::nft::objects::Transaction;
use crate::kube_proxy::nft::stages::{stages, ANONYMOUS_SETS_PER_STAGE};
use crate::kube_proxy::ruleset::adopt::{adopt, Adoption};
use crate::kube_proxy::ruleset::settings::Settings;
use crate::kube_proxy::ruleset::sync::{KernelView, Plan, SyncKind, Wanted};
use wanted::NodeWants;

/// Upstream's full resync period.
pub const FULL_SYNC_PERIOD: Duration = Duration::from_secs(3600);

/// Lines of a refused transaction logged with the error.
const FAILED_TX_LINES: usize = 20;

/// What the last sync did, for the status line and the tests.
#[derive(Clone, Debug, Default)]
pub struct SyncStatus {
    pub syncs: u64,
    pub failures: u64,
    pub services: usize,
    pub endpoints: usize,
    pub last_duration: Option<Duration>,
    pub last_operations: usize,
    pub last_kind: Option<&'static str>,
    /// Whether a sync has gone in since the start (READY waits for it).
    pub programmed: bool,
}

/// What the runner needs to know after a sync.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncOutcome {
    pub ok: bool,
    /// A later moment the proxier wants to run again (stale chains to delete).
    pub wake_at: Option<Instant>,
}

/// Work after a sync that went in, done outside the proxier's state.
pub trait AfterSync: Send {
    /// Stale UDP conntrack entries of this family, given what the node now wants.
    fn clean_conntrack(&mut self, family: IpFamily, wants: &NodeWants);
    /// Health-check node ports and their local endpoint counts.
    fn sync_health_checks(&mut self, family: IpFamily, wants: &NodeWants);
}

pub struct Proxier {
    pub family: IpFamily,
    settings: Settings,
    refresh: bool,
    wants: NodeWants,
    view: KernelView,
    /// Whether the next full sync may adopt the kernel's table: the first of the process
    /// only (after a refused transaction, the table is replaced).
    may_adopt: bool,
    nft: Applier,
    store: Arc<Store>,
    metrics: Arc<ProxyMetrics>,
    health: Arc<ProxyHealth>,
    after: Box<dyn AfterSync>,
    /// Services changed since the last sync the kernel took.
    pending: HashSet<ServiceName>,
    pending_conntrack: bool,
    pending_triggers: Vec<SystemTime>,
    last_full: Option<Instant>,
    started: SystemTime,
    last_failure_log: Option<Instant>,
    status: Arc<Mutex<SyncStatus>>,
}

impl Proxier {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        settings: Settings,
        nft: Applier,
        store: Arc<Store>,
        metrics: Arc<ProxyMetrics>,
        health: Arc<ProxyHealth>,
        after: Box<dyn AfterSync>,
        status: Arc<Mutex<SyncStatus>>,
    ) -> Proxier {
        Proxier {
            family: settings.family,
            settings,
            refresh: false,
            wants: NodeWants::new(),
            view: KernelView::new(),
            may_adopt: true,
            nft,
            store,
            metrics,
            health,
            after,
            pending: HashSet::new(),
            pending_conntrack: false,
            pending_triggers: Vec::new(),
            last_full: None,
            started: SystemTime::now(),
            last_failure_log: None,
            status,
        }
    }

    pub fn status(&self) -> Arc<Mutex<SyncStatus>> {
        self.status.clone()
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// New settings (a reload, a Service CIDR change): the next sync writes everything again.
    pub fn set_settings(&mut self, settings: Settings) {
        if settings != self.settings {
            self.settings = settings;
            self.refresh = true;
        }
    }

    /// One sync: nothing happens before both lists arrived from the API.
    pub async fn sync(&mut self) -> SyncOutcome {
        let family = self.family.api();
        if !self.store.synced() {
            tracing::info!(
                v = 2,
                ipFamily = family,
                "Not syncing nftables until Services and Endpoints have been received from master"
            );
            return SyncOutcome {
                ok: true,
                wake_at: None,
            };
        }
        let start = Instant::now();
        let checkout = self.store.checkout(self.family);
        let applied = self.wants.apply(self.family, checkout);
        self.pending.extend(applied.changed);
        self.pending_conntrack |= applied.udp_endpoints_changed;
        let started = self.started;
        self.pending_triggers
            .extend(applied.trigger_times.into_iter().filter(|t| *t > started));
        self.metrics.service_changes_pending.set(0);
        self.metrics.endpoint_changes_pending.set(0);

        // Chains flushed a second ago or more can be deleted now.
        if let Some((tx, names)) = self.view.stale_cleanup(&self.settings, start) {
            tracing::info!(
                ipFamily = family,
                numChains = names.len(),
                "Deleting stale nftables chains"
            );
            match self.nft.run(&tx).await {
                Ok(_) => self.view.stale_deleted(&names),
                Err(e) => {
                    tracing::error!(ipFamily = family, error = %e, "Unable to delete stale chains; will retry later");
                    self.metrics
                        .nftables_cleanup_failures
                        .with_label_values(&[family])
                        .inc();
                    self.view.invalidate();
                }
            }
        }

        let full_due = self
            .last_full
            .is_none_or(|at| start.duration_since(at) >= FULL_SYNC_PERIOD);
        let kind = if self.view.needs_full() {
            SyncKind::Full
        } else if self.refresh || full_due {
            SyncKind::Refresh
        } else {
            SyncKind::Partial
        };
        tracing::info!(
            v = 2,
            ipFamily = family,
            fullSync = kind.is_full(),
            "Syncing nftables rules"
        );
        let wanted = Wanted {
            services: &self.wants.services,
            endpoints: &self.wants.endpoints,
            zone: self.settings.zone.as_deref(),
        };
        let mut plan = self.view.plan(&self.settings, kind, &wanted, &self.pending);
        let mut no_table = false;
        if plan.kind == SyncKind::Full && std::mem::take(&mut self.may_adopt) {
            // nft's applier is left as it was: the table is replaced.
            if let Applier::Netlink(netlink) = &self.nft {
                (plan, no_table) = adopt_table(netlink.clone(), self.family, plan).await;
            }
        }
        let kind = plan.kind;
        let (num_services, num_endpoints) = (self.wants.port_count(), self.wants.endpoint_count());
        tracing::info!(
            v = 2,
            ipFamily = family,
            numServices = num_services,
            numEndpoints = num_endpoints,
            "Reloading service nftables data"
        );
        if tracing::enabled!(tracing::Level::TRACE) {
            tracing::trace!(ipFamily = family, transaction = %plan.tx.text(), "Running nftables transaction");
        }
        let operations = plan.tx.len();
        // A table that does not exist yet is written in stages (the kernel's cost of one
        // transaction grows with the square of its size); any other full sync replaces the
        // table in one, atomic for packets.
        let tx = std::mem::replace(&mut plan.tx, Transaction::new(self.family));
        let parts: Box<dyn Iterator<Item = Transaction> + Send> = if no_table {
            tracing::info!(
                v = 2,
                ipFamily = family,
                operations,
                anonymousSetsPerStage = ANONYMOUS_SETS_PER_STAGE,
                "Writing the new nftables table in stages"
            );
            Box::new(stages(tx, ANONYMOUS_SETS_PER_STAGE))
        } else {
            Box::new(std::iter::once(tx))
        };
        let mut failed = None;
        // Each stage is dropped once the kernel has it, before the next is cut.
        for part in parts.filter(|p| !p.is_empty()) {
            if let Err(e) = self.nft.run(&part).await {
                failed = Some((e, part));
                break;
            }
        }
        let elapsed = start.elapsed();
        let ok = match failed {
            None => {
                self.view.commit(plan, Instant::now());
                self.after_success(kind, start, elapsed, operations);
                true
            }
            Some((e, part)) => {
                self.after_failure(&e, &part);
                false
            }
        };
        self.observe(kind, elapsed, ok, num_services, num_endpoints, operations);
        tracing::info!(
            v = 2,
            ipFamily = family,
            elapsed = %GoDuration(elapsed),
            "SyncProxyRules complete"
        );
        SyncOutcome {
            ok,
            wake_at: self.view.next_stale_deadline(),
        }
    }

    fn after_success(
        &mut self,
        kind: SyncKind,
        start: Instant,
        _elapsed: Duration,
        operations: usize,
    ) {
        let family = self.family.api();
        self.pending.clear();
        if kind.is_full() {
            self.last_full = Some(start);
            self.refresh = false;
        }
        for t in self.pending_triggers.drain(..) {
            if let Ok(latency) = SystemTime::now().duration_since(t) {
                self.metrics
                    .network_programming
                    .with_label_values(&[family])
                    .observe(latency.as_secs_f64());
            }
        }
        let (internal, external) = self.view.no_local_endpoints();
        self.metrics
            .no_local_endpoints
            .with_label_values(&["internal", family])
            .set(i64::try_from(internal).unwrap_or(i64::MAX));
        self.metrics
            .no_local_endpoints
            .with_label_values(&["external", family])
            .set(i64::try_from(external).unwrap_or(i64::MAX));
        self.metrics
            .last_operations
            .with_label_values(&[family])
            .set(i64::try_from(operations).unwrap_or(i64::MAX));
        self.health.updated(self.family);
        self.metrics
            .last_sync
            .with_label_values(&[family])
            .set(unix_seconds(SystemTime::now()));
        self.after.sync_health_checks(self.family, &self.wants);
        if std::mem::take(&mut self.pending_conntrack) || kind == SyncKind::Full {
            self.after.clean_conntrack(self.family, &self.wants);
        }
    }

    fn after_failure(&mut self, error: &NftError, tx: &Transaction) {
        let family = self.family.api();
        self.metrics
            .nftables_sync_failures
            .with_label_values(&[family])
            .inc();
        // What the kernel holds is no longer certain: the next sync replaces the table.
        self.view.invalidate();
        let now = Instant::now();
        let log_tx = self
            .last_failure_log
            .is_none_or(|at| now.duration_since(at) >= Duration::from_secs(60));
        if log_tx {
            self.last_failure_log = Some(now);
            tracing::error!(
                ipFamily = family,
                error = %error,
                operations = tx.len(),
                transaction = %tx.head(FAILED_TX_LINES),
                "nftables sync failed"
            );
        } else {
            tracing::error!(ipFamily = family, error = %error, "nftables sync failed");
        }
        tracing::info!(
            ipFamily = family,
            retryingTime = "syncPeriod",
            "Sync failed"
        );
    }

    fn observe(
        &self,
        kind: SyncKind,
        elapsed: Duration,
        ok: bool,
        services: usize,
        endpoints: usize,
        operations: usize,
    ) {
        let family = self.family.api();
        let secs = elapsed.as_secs_f64();
        self.metrics
            .sync_duration
            .with_label_values(&[family])
            .observe(secs);
        let by_kind = if kind.is_full() {
            &self.metrics.sync_full_duration
        } else {
            &self.metrics.sync_partial_duration
        };
        by_kind.with_label_values(&[family]).observe(secs);
        let mut status = self.status.lock().unwrap_or_else(|p| p.into_inner());
        status.syncs += 1;
        status.services = services;
        status.endpoints = endpoints;
        status.last_duration = Some(elapsed);
        status.last_operations = operations;
        status.last_kind = Some(match kind {
            SyncKind::Full => "full",
            SyncKind::Refresh => "refresh",
            SyncKind::Partial => "partial",
        });
        if ok {
            status.programmed = true;
        } else {
            status.failures += 1;
        }
    }

    /// What the node wants (for the health checks and tests).
    pub fn wants(&self) -> &NodeWants {
        &self.wants
    }
}

/// The full sync's plan, or what adopts the table a previous run left instead: read
/// back, compared, and repaired. No table, a failed read or a table that only replacing
/// can fix: the full sync as planned.
/// Also says whether the kernel has no table at all.
async fn adopt_table(netlink: Netlink, ip_family: IpFamily, mut plan: Plan) -> (Plan, bool) {
    let family = ip_family.api();
    let start = Instant::now();
    // The planned transaction goes along so that the maps it would write need not be read.
    let wanted = Arc::new(std::mem::replace(&mut plan.tx, Transaction::new(ip_family)));
    let read = netlink.read_table_wanting(ip_family, wanted.clone()).await;
    plan.tx = Arc::try_unwrap(wanted).unwrap_or_else(|shared| (*shared).clone());
    let listing = match read {
        Ok(Some(listing)) => listing,
        Ok(None) => {
            tracing::info!(ipFamily = family, "No nftables table to adopt; writing it");
            return (plan, true);
        }
        Err(e) => {
            tracing::warn!(ipFamily = family, error = %e, "Unable to read the nftables table back; replacing it");
            return (plan, false);
        }
    };
    let read = GoDuration(start.elapsed());
    let (plan, adoption) = adopt(plan, &listing.table, &listing.unsupported);
    let stats = listing.stats;
    let total = GoDuration(start.elapsed());
    match adoption {
        Adoption::Adopted { chains } => tracing::info!(
            ipFamily = family,
            chains,
            knownMaps = stats.known_maps,
            read = %read,
            elapsed = %total,
            "Adopted the nftables table a previous run left ({chains} chains): it is the one wanted"
        ),
        Adoption::Repaired { operations } => tracing::info!(
            ipFamily = family,
            operations,
            chains = stats.chains,
            read = %read,
            elapsed = %total,
            "Adopted the nftables table a previous run left, repaired with {operations} operations"
        ),
        Adoption::Replaced { reason } => tracing::info!(
            ipFamily = family,
            reason = %reason,
            read = %read,
            "Replacing the nftables table a previous run left: {reason}"
        ),
    }
    (plan, false)
}

pub fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Marks each change as queued when it arrives: the healthz clock and the queued-time and
/// pending-changes gauges.
pub struct QueueMarks {
    pub health: Arc<ProxyHealth>,
    pub metrics: Arc<ProxyMetrics>,
}

impl QueueListener for QueueMarks {
    fn queued(&self, store: &Store, family: IpFamily) {
        self.health.queued(family);
        self.metrics
            .last_queued
            .with_label_values(&[family.api()])
            .set(unix_seconds(SystemTime::now()));
        let (services, endpoints) = store.pending(family);
        self.metrics
            .service_changes_pending
            .set(i64::try_from(services).unwrap_or(i64::MAX));
        self.metrics
            .endpoint_changes_pending
            .set(i64::try_from(endpoints).unwrap_or(i64::MAX));
    }
}
