//! State shared by every task of one server: the runtime snapshot (swapped whole on reload),
//! the agent registry, the metrics, and the tokens and trackers that drain and stop it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio_util::sync::CancellationToken;
use tokio_util::task::task_tracker::TaskTrackerToken;
use tokio_util::task::TaskTracker;

use crate::backend::Registry;
use crate::config::{Config, Frontend, FrontendAddr, Mode};
use crate::kubernetes::auth::TokenAuthenticator;
use crate::metrics::Metrics;
use crate::tls::{self, TlsError, TlsFiles, TlsPolicy};
use crate::tunnel::{FrontendLink, FrontendQueue, QueueBudget, QueueLimits};

/// Why a configuration could not become a snapshot.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    // The cause is part of the message and deliberately not a `#[source]`: printed with its
    // chain (`{:#}`), it would otherwise appear twice.
    #[error("failed to load the agent port's TLS configuration: {0}")]
    AgentTls(TlsError),
    /// `name` is the frontend's: `frontend` for the flags' one.
    #[error("failed to load the {name}'s TLS configuration: {cause}")]
    FrontendTls { name: String, cause: Box<TlsError> },
}

/// Everything that can change on a reload, swapped as a whole.
pub struct Snapshot {
    pub config: Arc<Config>,
    pub agent_tls: Arc<rustls::ServerConfig>,
    /// Each frontend's, in the order of `config.frontends` (None for a Unix socket). A reload
    /// keeps the running frontends (`Config::keep_restart_only`), so an index means the same
    /// frontend in every snapshot.
    pub frontend_tls: Vec<Option<Arc<rustls::ServerConfig>>>,
}

/// A TCP frontend's TLS configuration: its protocol's ALPN, its client CA.
fn frontend_tls(
    frontend: &Frontend,
    policy: &TlsPolicy<'_>,
) -> Result<Option<Arc<rustls::ServerConfig>>, SnapshotError> {
    let FrontendAddr::Tcp(_) = frontend.addr else {
        return Ok(None);
    };
    let (Some(cert), Some(key)) = (&frontend.cert, &frontend.key) else {
        return Err(SnapshotError::FrontendTls {
            name: frontend.name.clone(),
            cause: Box::new(TlsError::Missing(
                "a TCP frontend (--server-cert, --server-key)",
            )),
        });
    };
    let files = TlsFiles {
        cert,
        key,
        client_ca: frontend.ca_cert.as_deref(),
    };
    let alpn: &[&[u8]] = match frontend.mode {
        Mode::Grpc => &[b"h2"],
        Mode::HttpConnect => &[b"http/1.1"],
    };
    tls::server_config(&files, policy, alpn)
        .map(Some)
        .map_err(|cause| SnapshotError::FrontendTls {
            name: frontend.name.clone(),
            cause: Box::new(cause),
        })
}

impl Snapshot {
    pub fn build(config: Config) -> Result<Snapshot, SnapshotError> {
        let policy = TlsPolicy {
            cipher_suites: &config.cipher_suites,
            min_version: config.tls_min_version,
        };
        let agent_files = match (&config.cluster_cert, &config.cluster_key) {
            (Some(cert), Some(key)) => TlsFiles {
                cert,
                key,
                client_ca: config.cluster_ca_cert.as_deref(),
            },
            _ => {
                return Err(SnapshotError::AgentTls(TlsError::Missing(
                    "the agent port (--cluster-cert, --cluster-key)",
                )))
            }
        };
        let agent_tls =
            tls::server_config(&agent_files, &policy, &[b"h2"]).map_err(SnapshotError::AgentTls)?;
        let frontend_tls = config
            .frontends
            .iter()
            .map(|frontend| frontend_tls(frontend, &policy))
            .collect::<Result<_, _>>()?;
        Ok(Snapshot {
            config: Arc::new(config),
            agent_tls,
            frontend_tls,
        })
    }

    /// The limits a new tunnel's queue toward its frontend gets.
    pub fn queue_limits(&self) -> QueueLimits {
        QueueLimits {
            packets: self.config.frontend_write_channel_size,
            bytes: self.config.frontend_queue_limit_bytes,
            hard_bytes: self.config.frontend_queue_limit_bytes.saturating_mul(4),
            stall: self.config.frontend_queue_stall_timeout,
        }
    }
}

/// How long the drain waits for a frontend connection accepted before it began to send its
/// first request. Such a client raced the stop (a restart under socket activation) and did
/// nothing wrong; without the wait, a stop with no tunnel open ended at once and closed its
/// connection under the request it was sending. Clients send their request right after
/// connecting, so this bounds only a connection that never sends one.
pub const FIRST_REQUEST_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// State shared by every task of one server.
pub struct Shared {
    snapshot: ArcSwap<Snapshot>,
    pub registry: Registry,
    pub metrics: Arc<Metrics>,
    /// Every tunnel's queue toward its frontend counts against this one budget.
    pub budget: Arc<QueueBudget>,
    draining: AtomicBool,
    /// When this server started, for --startup-dial-grace.
    started: tokio::time::Instant,
    /// Cancelled when the drain is over: every stream is then closed.
    pub hard_stop: CancellationToken,
    /// Every stream's task, so shutdown can wait for them.
    pub tasks: TaskTracker,
    /// One token per tunnel that holds a dial or a connection at an agent: the drain waits on
    /// this tracker, so it ends the moment the last tunnel is released.
    tunnels: TaskTracker,
    /// One token per frontend connection from its accept until its first request ends (and
    /// one held by each frontend acceptor while it waits in accept): a connection accepted
    /// just before the drain began gets its first request served (see [`FIRST_REQUEST_WAIT`]).
    accepted: TaskTracker,
    /// Set when agents authenticate with tokens.
    pub authenticator: Option<TokenAuthenticator>,
}

impl Shared {
    pub fn new(
        snapshot: Snapshot,
        metrics: Arc<Metrics>,
        authenticator: Option<TokenAuthenticator>,
    ) -> Shared {
        metrics
            .runtime
            .server_count
            .set(snapshot.config.server_count);
        Shared {
            registry: Registry::new(&snapshot.config.proxy_strategies, metrics.clone()),
            budget: Arc::new(QueueBudget::new(
                snapshot.config.frontend_queue_budget_bytes,
            )),
            snapshot: ArcSwap::from_pointee(snapshot),
            metrics,
            draining: AtomicBool::new(false),
            started: tokio::time::Instant::now(),
            hard_stop: CancellationToken::new(),
            tasks: TaskTracker::new(),
            tunnels: TaskTracker::new(),
            accepted: TaskTracker::new(),
            authenticator,
        }
    }

    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
    }

    /// Makes a new snapshot current: new handshakes and dials use it; live streams keep theirs.
    pub fn apply(&self, snapshot: Snapshot) {
        self.registry
            .set_strategies(&snapshot.config.proxy_strategies);
        self.budget
            .set_limit(snapshot.config.frontend_queue_budget_bytes);
        self.metrics
            .runtime
            .server_count
            .set(snapshot.config.server_count);
        self.snapshot.store(Arc::new(snapshot));
    }

    /// A new tunnel's queue toward its frontend, under the current limits and the budget.
    pub fn tunnel_queue(&self) -> (Arc<FrontendLink>, FrontendQueue) {
        let limits = self.snapshot().queue_limits();
        FrontendLink::new(limits, self.budget.clone(), self.metrics.clone())
    }

    /// (agents, tunnels) right now, for status lines.
    /// systemd's STATUS line.
    pub fn status_line(&self) -> String {
        let (agents, tunnels) = self.counts();
        format!("serving: {agents} agents, {tunnels} tunnels")
    }

    pub fn counts(&self) -> (usize, i64) {
        (
            self.registry.agents().len(),
            self.metrics.tunnel.established_connections.get(),
        )
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    pub fn is_ready(&self) -> bool {
        !self.is_draining() && self.registry.ready()
    }

    /// How much of --startup-dial-grace is left (zero once it has passed).
    pub fn startup_grace_left(&self) -> std::time::Duration {
        let grace = self.snapshot().config.startup_dial_grace;
        grace.saturating_sub(self.started.elapsed())
    }

    /// Marks a tunnel live for the drain until the token drops.
    pub fn tunnel_token(&self) -> TaskTrackerToken {
        self.tunnels.token()
    }

    /// The tracker a frontend acceptor takes a token from for each connection it accepts.
    pub fn accepted_connections(&self) -> TaskTracker {
        self.accepted.clone()
    }

    /// Refuses new agents and dials from now on.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Release);
        self.tunnels.close();
        self.accepted.close();
    }

    /// Returns once no tunnel holds a dial or a connection (after [`Shared::start_draining`]),
    /// and no frontend connection accepted before the drain is still waiting to send its first
    /// request (those are waited for up to [`FIRST_REQUEST_WAIT`]).
    pub async fn tunnels_released(&self) {
        // A first request that dials takes its tunnel token before it lets go of its
        // connection's, so no tunnel slips between the two waits.
        let _ = tokio::time::timeout(FIRST_REQUEST_WAIT, self.accepted.wait()).await;
        self.tunnels.wait().await;
    }
}
