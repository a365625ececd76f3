//! The proxy, wired: the API client and watches, the change trackers, one proxier and runner
//! per family, the health-check node ports, conntrack, the healthz and metrics ports. Upstream's
//! start-up order, after the privileged set-up (`node_service::prepare`): the node's addresses
//! (waiting up to 30 s for the Node), the ports, the watches; no sync before Services and
//! EndpointSlices have both been listed.
//!
//! Stopping leaves every rule in the kernel: traffic keeps flowing while the proxy is away.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ipnet::IpNet;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::api::node::NodeInfo;
use super::api::store::Store;
use super::api::watch::{self as watches, Problems};
use super::config::{DetectLocal, ProxyConfig};
use super::conntrack::{self, sysctls, ConntrackMetrics};
use super::healthz::ProxyHealth;
use super::metrics::ProxyMetrics;
use super::model::IpFamily;
use super::nft::exec::{Applier, NftError};
use super::node_settings::{self, NodeIps};
use super::proxier::wanted::NodeWants;
use super::proxier::{AfterSync, Proxier, QueueMarks, SyncStatus, FULL_SYNC_PERIOD};
use super::ruleset::settings::Settings;
use super::runner::{self, Intervals};
use super::servers::{self, BindError, Port};
use super::service_health::ServiceHealth;
use super::shared::ProxyShared;
use crate::kube_client::{self, ClientError};

/// How long the start waits for the Node object to show its addresses.
const NODE_WAIT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{0}")]
    Client(#[from] ClientError),
    #[error("{0}")]
    Nft(#[from] NftError),
    #[error("{0}")]
    Sysctl(#[from] sysctls::SysctlError),
    #[error("{0}")]
    Bind(#[from] BindError),
    #[error("cannot determine the node name: {0}")]
    NodeName(String),
    #[error("{0}")]
    Fatal(String),
}

/// The node's name: `--hostname-override`, else the OS hostname (lower-cased).
pub fn node_name(config: &ProxyConfig) -> Result<String, RunError> {
    if let Some(name) = &config.node_name_override {
        return Ok(name.clone());
    }
    let host = hostname::get().map_err(|e| RunError::NodeName(e.to_string()))?;
    Ok(host.to_string_lossy().trim().to_lowercase())
}

/// The families this node runs: IPv4, and IPv6 unless the kernel has it off.
pub fn families() -> Vec<IpFamily> {
    let v6 = std::path::Path::new("/proc/net/if_inet6").exists()
        && std::fs::read_to_string("/proc/sys/net/ipv6/conf/all/disable_ipv6")
            .map(|t| t.trim() != "1")
            .unwrap_or(true);
    if v6 {
        vec![IpFamily::V4, IpFamily::V6]
    } else {
        vec![IpFamily::V4]
    }
}

/// The conntrack sysctls the configuration asks for.
pub fn conntrack_settings(config: &ProxyConfig) -> sysctls::ConntrackSettings {
    let c = &config.conntrack;
    sysctls::ConntrackSettings {
        max_per_core: i32::try_from(c.max_per_core).unwrap_or(i32::MAX),
        min: i32::try_from(c.min).unwrap_or(i32::MAX),
        tcp_established: c.tcp_established_timeout,
        tcp_close_wait: c.tcp_close_wait_timeout,
        tcp_be_liberal: c.tcp_be_liberal,
        udp_timeout: c.udp_timeout,
        udp_stream_timeout: c.udp_stream_timeout,
    }
}

/// After a sync: health-check node ports and stale UDP conntrack entries.
struct NodeAfterSync {
    health_checks: ServiceHealth,
    conntrack: Arc<ConntrackMetrics>,
}

impl AfterSync for NodeAfterSync {
    fn clean_conntrack(&mut self, family: IpFamily, wants: &NodeWants) {
        let run =
            || conntrack::clean_stale(family, &wants.services, &wants.endpoints, &self.conntrack);
        // A netlink dump: off the runtime's scheduling (the other tasks keep running).
        let result = match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
            Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(run),
            _ => run(),
        };
        if let Ok(cleaned) = result {
            tracing::info!(
                v = 4,
                ipFamily = family.api(),
                deleted = cleaned.deleted,
                "Finished reconciling conntrack entries"
            );
        }
    }

    fn sync_health_checks(&mut self, _family: IpFamily, wants: &NodeWants) {
        self.health_checks.sync(&wants.health_checks());
    }
}

/// One family's proxier as its runner runs it: new settings first, then the sync.
struct FamilyRun {
    proxier: Proxier,
    settings: watch::Receiver<Settings>,
}

impl runner::SyncTarget for FamilyRun {
    fn sync(
        &mut self,
    ) -> impl std::future::Future<Output = super::proxier::SyncOutcome> + Send + '_ {
        if self.settings.has_changed().unwrap_or(false) {
            let s = self.settings.borrow_and_update().clone();
            self.proxier.set_settings(s);
        }
        self.proxier.sync()
    }
}

/// What the settings of each family are made from, and where they go.
struct SettingsInputs {
    config: Arc<ProxyConfig>,
    node_name: String,
    node: Option<NodeInfo>,
    cidrs: Vec<IpNet>,
    local: Vec<IpAddr>,
}

impl SettingsInputs {
    fn settings(&self, family: IpFamily) -> Settings {
        node_settings::settings(
            &self.config,
            family,
            &self.node_name,
            self.node.as_ref(),
            &self.cidrs,
            &self.local,
        )
    }
}

/// The healthz and metrics ports as they are served now (each stops with its token).
struct Ports {
    healthz: Option<(std::net::SocketAddr, CancellationToken)>,
    metrics: Option<(std::net::SocketAddr, CancellationToken)>,
}

async fn serve_port(
    port: Port,
    addr: Option<std::net::SocketAddr>,
    shared: &Arc<ProxyShared>,
    tasks: &TaskTracker,
    stop: &CancellationToken,
    hard_fail: bool,
) -> Result<Option<(std::net::SocketAddr, CancellationToken)>, BindError> {
    let Some(addr) = addr else {
        return Ok(None);
    };
    let token = stop.child_token();
    servers::serve(port, addr, shared.clone(), tasks, token.clone(), hard_fail).await?;
    Ok(Some((addr, token)))
}

/// A running proxy.
pub struct RunningProxy {
    pub shared: Arc<ProxyShared>,
    tasks: TaskTracker,
    stop: CancellationToken,
    fatal: Arc<Mutex<Option<String>>>,
    config_tx: watch::Sender<Arc<ProxyConfig>>,
    ports: tokio::sync::Mutex<Ports>,
}

impl RunningProxy {
    /// Applies a new configuration (a reload): the settings it changes are rewritten into
    /// the kernel by the next sync (one transaction); the sync periods apply from the next
    /// wait; the conntrack sysctls are set again; a port whose address changed is served on
    /// the new one. Established connections are not touched.
    pub async fn apply(&self, config: ProxyConfig) {
        let old = self.shared.config();
        if config.conntrack != old.conntrack {
            if let Err(e) = sysctls::set_sysctls(
                &conntrack_settings(&config),
                &sysctls::KernelRoots::default(),
            ) {
                tracing::error!(error = %e, "Failed to set the conntrack sysctls");
            }
        }
        self.shared.health.set_timeout(config.sync_period * 2);
        let (healthz, metrics) = (config.healthz_addr, config.metrics_addr);
        self.shared.swap_config(config);
        let _ = self.config_tx.send(self.shared.config());
        let mut ports = self.ports.lock().await;
        let Ports {
            healthz: held_healthz,
            metrics: held_metrics,
        } = &mut *ports;
        for (port, want, held) in [
            (Port::Healthz, healthz, held_healthz),
            (Port::Metrics, metrics, held_metrics),
        ] {
            if held.as_ref().map(|(a, _)| *a) == want {
                continue;
            }
            if let Some((addr, token)) = held.take() {
                tracing::info!(address = %addr, "Closing a port whose address changed");
                token.cancel();
            }
            // A port that cannot be bound now is retried in the background.
            match serve_port(port, want, &self.shared, &self.tasks, &self.stop, false).await {
                Ok(served) => *held = served,
                Err(e) => tracing::error!(error = %e, "Failed to serve a port after a reload"),
            }
        }
    }

    /// Stops every task; the rules stay in the kernel.
    pub async fn shutdown(self) {
        self.stop.cancel();
        self.tasks.close();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.tasks.wait()).await;
    }

    /// Resolves when a part of the proxy stopped it (the node's addresses changed, the Node
    /// was deleted), with the reason.
    pub async fn failed(&self) -> String {
        self.stop.cancelled().await;
        self.fatal
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or_else(|| "stopped".into())
    }
}

/// Starts the proxy. Returns once the ports listen and the watches run; the first sync
/// follows when the API's lists are in (`ProxyShared::programmed`).
pub async fn start(config: ProxyConfig) -> Result<RunningProxy, RunError> {
    let node_name = node_name(&config)?;
    let families = families();
    let nft = Applier::from_env().await?;
    let kube_config = kube_client::config(
        config.client.kubeconfig.as_deref(),
        config.client.master.as_deref().unwrap_or(""),
    )
    .await?;
    let client = kube_client::client(
        kube_config,
        config.client.qps,
        i64::from(config.client.burst),
    )?;

    // Fire and forget: an apiserver that is away must not hold the start.
    {
        let (client, node_name, config) = (client.clone(), node_name.clone(), config.clone());
        tokio::spawn(async move { announce(&client, &node_name, &config).await });
    }
    let metrics = Arc::new(ProxyMetrics::new());
    let conntrack_metrics = Arc::new(
        ConntrackMetrics::register(metrics.registry())
            .map_err(|e| RunError::Fatal(format!("registering the conntrack metrics: {e}")))?,
    );
    let health = Arc::new(ProxyHealth::new(config.sync_period * 2));
    let store = Store::new(&families);
    store.set_listener(Arc::new(QueueMarks {
        health: health.clone(),
        metrics: metrics.clone(),
    }));
    let statuses: Vec<(IpFamily, Arc<Mutex<SyncStatus>>)> = families
        .iter()
        .map(|f| (*f, Arc::new(Mutex::new(SyncStatus::default()))))
        .collect();
    let shared = Arc::new(ProxyShared::new(
        config.clone(),
        metrics.clone(),
        health.clone(),
        store.clone(),
        node_name.clone(),
        statuses.clone(),
    ));
    let tasks = TaskTracker::new();
    let stop = CancellationToken::new();
    let fatal = Arc::new(Mutex::new(None::<String>));
    let problems = Problems::new(metrics.clone());

    // The Node: its addresses decide the node IPs; wait for them as upstream does.
    let (node_tx, mut node_rx) = watch::channel(None::<NodeInfo>);
    tasks.spawn(watches::node(
        client.clone(),
        node_name.clone(),
        node_tx,
        problems.clone(),
        stop.clone(),
    ));
    let node = wait_for_node(&mut node_rx).await;
    if node.as_ref().is_none_or(|n| n.ips.is_empty()) {
        tracing::error!(node = %node_name, "Can't get Node's IPs, proxying on loopback; if this is incorrect, check the Node object or set --bind-address");
    }
    let ips = NodeIps::detect(node.as_ref(), config.bind_address);
    tracing::info!(ipFamily = ips.primary.api(), nodeIP = %ips.primary_ip(), "Detected node IP");
    if families.len() == 2 {
        tracing::info!(
            "kube-proxy running in dual-stack mode primary ipFamily={}",
            ips.primary.api()
        );
    }
    if let DetectLocal::NodeCidr = config.detect_local {
        if node.as_ref().is_none_or(|n| n.pod_cidrs.is_empty()) {
            return Err(RunError::Fatal(
                "timeout waiting for PodCIDR allocation to configure detect-local-mode NodeCIDR"
                    .into(),
            ));
        }
    }
    health.set_node_eligible(node.as_ref().is_some_and(|n| !n.leaving));

    // The ports.
    let hard = config.bind_address_hard_fail;
    let ports = Ports {
        healthz: serve_port(
            Port::Healthz,
            config.healthz_addr,
            &shared,
            &tasks,
            &stop,
            hard,
        )
        .await?,
        metrics: serve_port(
            Port::Metrics,
            config.metrics_addr,
            &shared,
            &tasks,
            &stop,
            hard,
        )
        .await?,
    };

    // The watches.
    let (cidr_tx, cidr_rx) = watch::channel(Vec::<IpNet>::new());
    let (listed_tx, mut listed_rx) = watch::channel(false);
    tasks.spawn(watches::service_cidrs(
        client.clone(),
        cidr_tx,
        listed_tx,
        problems.clone(),
        stop.clone(),
    ));
    tasks.spawn(watches::services(
        client.clone(),
        store.clone(),
        problems.clone(),
        stop.clone(),
    ));
    tasks.spawn(watches::endpoint_slices(
        client.clone(),
        store.clone(),
        node_name.clone(),
        problems.clone(),
        stop.clone(),
    ));

    // The first sync's settings include the Service CIDRs, so that its transaction already
    // drops traffic to unallocated ClusterIPs instead of a second one adding the rule. The
    // wait ends with the first list or its first failure (the sender dropped ends it too).
    let _ = listed_rx.wait_for(|listed| *listed).await;

    // One proxier and runner per family, and the settings they are fed.
    let (config_tx, config_rx) = watch::channel(Arc::new(config.clone()));
    let inputs = SettingsInputs {
        config: Arc::new(config.clone()),
        node_name: node_name.clone(),
        node: node.clone(),
        cidrs: cidr_rx.borrow().clone(),
        local: node_settings::interface_addresses(),
    };
    let mut settings_txs = Vec::new();
    for (family, status) in statuses {
        let settings = inputs.settings(family);
        let after = NodeAfterSync {
            health_checks: ServiceHealth::new(
                family,
                &settings.node_ports,
                health.clone(),
                tasks.clone(),
            ),
            conntrack: conntrack_metrics.clone(),
        };
        let (settings_tx, settings_rx) = watch::channel(settings.clone());
        settings_txs.push((family, settings_tx));
        let proxier = Proxier::new(
            settings,
            nft.clone(),
            store.clone(),
            metrics.clone(),
            health.clone(),
            Box::new(after),
            status,
        );
        let waker = store
            .waker(family)
            .ok_or_else(|| RunError::Fatal(format!("no waker for {family}")))?;
        let shared_for_intervals = shared.clone();
        let intervals = move || {
            let c = shared_for_intervals.config();
            Intervals {
                min: c.min_sync_period,
                retry: c.sync_period,
                max: FULL_SYNC_PERIOD,
            }
        };
        health.updated(family);
        let stop_runner = stop.clone();
        let mut target = FamilyRun {
            proxier,
            settings: settings_rx,
        };
        tasks.spawn(async move { runner::run(waker, intervals, stop_runner, &mut target).await });
    }

    // Settings follow the Node, the Service CIDRs and reloads.
    {
        let stop = stop.clone();
        let fatal = fatal.clone();
        let health = health.clone();
        let store = store.clone();
        let mut cidr_rx = cidr_rx;
        let mut config_rx = config_rx;
        let mut inputs = inputs;
        let first_ips = node.as_ref().map(|n| n.ips.clone());
        let first_pod_cidrs = node.as_ref().map(|n| n.pod_cidrs.clone());
        tasks.spawn(async move {
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    r = node_rx.changed() => {
                        if r.is_err() { return; }
                        let now = node_rx.borrow_and_update().clone();
                        health.set_node_eligible(now.as_ref().is_some_and(|n| !n.leaving));
                        if let Some(reason) = node_fatal(first_ips.as_deref(), first_pod_cidrs.as_deref(), now.as_ref(), &inputs.config) {
                            tracing::error!(reason = %reason, "The node changed; exiting so the proxy restarts with it");
                            *fatal.lock().unwrap_or_else(|p| p.into_inner()) = Some(reason);
                            stop.cancel();
                            return;
                        }
                        inputs.node = now;
                    }
                    r = cidr_rx.changed() => {
                        if r.is_err() { return; }
                        inputs.cidrs = cidr_rx.borrow_and_update().clone();
                    }
                    r = config_rx.changed() => {
                        if r.is_err() { return; }
                        inputs.config = config_rx.borrow_and_update().clone();
                        inputs.local = node_settings::interface_addresses();
                    }
                }
                for (family, tx) in &settings_txs {
                    let next = inputs.settings(*family);
                    let changed = tx.send_if_modified(|held| {
                        let changed = *held != next;
                        *held = next;
                        changed
                    });
                    if changed {
                        if let Some(w) = store.waker(*family) {
                            w.notify_one();
                        }
                    }
                }
            }
        });
    }

    Ok(RunningProxy {
        shared,
        tasks,
        stop,
        fatal,
        config_tx,
        ports: tokio::sync::Mutex::new(ports),
    })
}

/// What upstream logs, as an error, when no mode was given (`server_linux.go`).
const DEFAULTED_MODE: &str = "No kube-proxy mode specified: defaulting to 'iptables'. Note that in Kubernetes 1.40 the default mode will switch to 'nftables'. If you wish to continue using 'iptables' mode, you must explicitly specify 'mode: iptables' in the kube-proxy config file, or '--proxy-mode iptables' on the kube-proxy command line.";

/// The Events upstream posts at start, and one saying what serves the mode asked for.
async fn announce(client: &kube::Client, node_name: &str, config: &ProxyConfig) {
    use super::events::{post, Note};
    // Upstream's line for a defaulted mode, which operators grep for before 1.40 changes the
    // default. Upstream also records a KubeProxyDefaultMode Event, but before its Event
    // broadcaster starts, so the Event never reaches the API; none is posted here either.
    if config.mode_defaulted {
        tracing::error!("{DEFAULTED_MODE}");
    }
    post(
        client,
        node_name,
        Note {
            warning: false,
            reason: "Starting",
            action: "StartKubeProxy",
            note: "",
        },
    )
    .await;
    let mode = config.mode.name();
    let note = match config.mode {
        super::config::ProxyMode::Nftables => return,
        super::config::ProxyMode::Iptables => format!(
            "the {mode} mode is served by nftables rules (table ip kube-proxy and ip6 kube-proxy): `iptables -t nat -L` shows no Service rules; use `nft list table ip kube-proxy` or `kube-proxy trace`"
        ),
        super::config::ProxyMode::Ipvs => format!(
            "the {mode} mode is served by nftables rules (scheduler {} as {:?}): `ipvsadm -Ln` shows no virtual servers; use `nft list table ip kube-proxy` or `kube-proxy trace`",
            config.ipvs.scheduler.name(),
            super::node_settings::pick(config)
        ),
    };
    tracing::warn!("{note}");
    post(
        client,
        node_name,
        Note {
            warning: true,
            reason: "ProxyModeServedByNftables",
            action: "StartKubeProxy",
            note: &note,
        },
    )
    .await;
}

async fn wait_for_node(rx: &mut watch::Receiver<Option<NodeInfo>>) -> Option<NodeInfo> {
    let deadline = tokio::time::Instant::now() + NODE_WAIT;
    loop {
        let now = rx.borrow().clone();
        if now.as_ref().is_some_and(|n| !n.ips.is_empty()) {
            return now;
        }
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => return rx.borrow().clone(),
            r = rx.changed() => if r.is_err() { return rx.borrow().clone(); },
        }
    }
}

/// Upstream exits when the node's IPs change, when its pod CIDRs change (NodeCIDR mode), or
/// when the Node is deleted.
fn node_fatal(
    first_ips: Option<&[IpAddr]>,
    first_pod_cidrs: Option<&[IpNet]>,
    now: Option<&NodeInfo>,
    config: &ProxyConfig,
) -> Option<String> {
    let first = first_ips?;
    let Some(now) = now else {
        return Some("the Node was deleted".into());
    };
    if !first.is_empty() && now.ips != first {
        return Some(format!(
            "the Node's IPs changed from {first:?} to {:?}",
            now.ips
        ));
    }
    if matches!(config.detect_local, DetectLocal::NodeCidr)
        && Some(now.pod_cidrs.as_slice()) != first_pod_cidrs
    {
        return Some("the Node's pod CIDRs changed".into());
    }
    None
}
