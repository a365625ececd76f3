//! Wiring: the shared state, the runtime snapshot, the listeners, and `run`.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use futures_util::StreamExt;
use tokio::net::{TcpListener, TcpStream, UnixListener};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admin::metrics::Metrics;
use crate::authority::AuthorityScrub;
use crate::backend::connect::AgentServer;
use crate::backend::Registry;
use crate::config::{Config, FrontendAddr, Mode};
use crate::frontend::grpc::ProxyFrontend;
use crate::proto::agent_service_server::AgentServiceServer;
use crate::proto::proxy_service_server::ProxyServiceServer;
use crate::tls::{self, TlsError, TlsFiles, TlsPolicy};

/// grpc-go's default maximum received message size.
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;
/// HTTP/2 flow-control windows on every gRPC port.
const STREAM_WINDOW: u32 = 2 << 20;
const CONNECTION_WINDOW: u32 = 32 << 20;
/// How long a TLS handshake may take before the connection is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Go's default TCP keepalive on accepted sockets.
const TCP_KEEPALIVE: Duration = Duration::from_secs(15);
/// After the drain, how long stopping the servers may take.
const STOP_GRACE: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("failed to load the agent port's TLS configuration: {0}")]
    AgentTls(#[source] TlsError),
    #[error("failed to load the frontend's TLS configuration: {0}")]
    FrontendTls(#[source] TlsError),
    #[error("failed to listen on {what} {addr}: {source}")]
    Bind {
        what: &'static str,
        addr: String,
        source: std::io::Error,
    },
}

/// Everything that can change on a reload, swapped as a whole.
pub struct Snapshot {
    pub config: Arc<Config>,
    pub agent_tls: Arc<rustls::ServerConfig>,
    pub frontend_tls: Option<Arc<rustls::ServerConfig>>,
}

impl Snapshot {
    pub fn build(config: Config) -> Result<Snapshot, RunError> {
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
                return Err(RunError::AgentTls(TlsError::Missing(
                    "the agent port (--cluster-cert, --cluster-key)",
                )))
            }
        };
        let agent_tls =
            tls::server_config(&agent_files, &policy, &[b"h2"]).map_err(RunError::AgentTls)?;
        let frontend_tls = match (
            &config.frontend_addr,
            &config.server_cert,
            &config.server_key,
        ) {
            (FrontendAddr::Tcp(_), Some(cert), Some(key)) => {
                let files = TlsFiles {
                    cert,
                    key,
                    client_ca: config.server_ca_cert.as_deref(),
                };
                let alpn: &[&[u8]] = match config.mode {
                    Mode::Grpc => &[b"h2"],
                    Mode::HttpConnect => &[b"http/1.1"],
                };
                Some(tls::server_config(&files, &policy, alpn).map_err(RunError::FrontendTls)?)
            }
            (FrontendAddr::Tcp(_), _, _) => {
                return Err(RunError::FrontendTls(TlsError::Missing(
                    "a TCP frontend (--server-cert, --server-key)",
                )))
            }
            _ => None,
        };
        Ok(Snapshot {
            config: Arc::new(config),
            agent_tls,
            frontend_tls,
        })
    }

    /// The limits a new tunnel's queue toward its frontend gets.
    pub fn queue_limits(&self) -> crate::tunnel::QueueLimits {
        crate::tunnel::QueueLimits {
            packets: self.config.frontend_write_channel_size,
            bytes: self.config.frontend_queue_limit_bytes,
            hard_bytes: self.config.frontend_queue_limit_bytes.saturating_mul(4),
            stall: self.config.frontend_queue_stall_timeout,
        }
    }
}

/// State shared by every task of one server.
pub struct Shared {
    snapshot: ArcSwap<Snapshot>,
    pub registry: Registry,
    pub metrics: Arc<Metrics>,
    draining: AtomicBool,
    /// Cancelled when the drain is over: every stream is then closed.
    pub hard_stop: CancellationToken,
    /// Every stream's task, so shutdown can wait for them.
    pub tasks: TaskTracker,
    /// Set when agents authenticate with tokens.
    pub authenticator: Option<crate::kubernetes::auth::TokenAuthenticator>,
}

impl Shared {
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
    }

    /// Makes a new snapshot current: new handshakes and dials use it; live streams keep theirs.
    pub fn apply(&self, snapshot: Snapshot) {
        self.registry
            .set_strategies(&snapshot.config.proxy_strategies);
        self.snapshot.store(Arc::new(snapshot));
    }

    /// (agents, tunnels) right now, for status lines.
    pub fn counts(&self) -> (usize, i64) {
        (
            self.registry.agents().len(),
            self.metrics.established_connections.get(),
        )
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    pub fn is_ready(&self) -> bool {
        !self.is_draining() && self.registry.ready()
    }
}

/// The frontend's listening socket.
pub enum FrontendListener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

/// Sockets the server serves on. Tests bind their own (any port) and pass them in.
pub struct Listeners {
    pub frontend: FrontendListener,
    pub agent: TcpListener,
    pub health: TcpListener,
    pub admin: TcpListener,
}

async fn bind_tcp(what: &'static str, addr: SocketAddr) -> Result<TcpListener, RunError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| RunError::Bind {
            what,
            addr: addr.to_string(),
            source,
        })
}

/// Binds a Unix socket with mode 0770 (upstream's umask 0007), removing a stale file first
/// when asked to.
pub fn bind_uds(path: &Path, delete_existing: bool) -> Result<UnixListener, RunError> {
    use std::os::unix::fs::PermissionsExt;
    let bind_error = |source| RunError::Bind {
        what: "the frontend socket",
        addr: path.display().to_string(),
        source,
    };
    if delete_existing {
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "could not remove the existing socket file")
            }
        }
    }
    let listener = UnixListener::bind(path).map_err(bind_error)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o770)).map_err(bind_error)?;
    Ok(listener)
}

impl Listeners {
    /// Binds every listener the configuration names.
    pub async fn bind(config: &Config) -> Result<Listeners, RunError> {
        let frontend = match &config.frontend_addr {
            FrontendAddr::Uds {
                path,
                delete_existing,
            } => FrontendListener::Unix(bind_uds(path, *delete_existing)?),
            FrontendAddr::Tcp(addr) => {
                FrontendListener::Tcp(bind_tcp("the frontend port", *addr).await?)
            }
        };
        Ok(Listeners {
            frontend,
            agent: bind_tcp("the agent port", config.agent_addr).await?,
            health: bind_tcp("the health port", config.health_addr).await?,
            admin: bind_tcp("the admin port", config.admin_addr).await?,
        })
    }
}

/// Socket options Go sets on every accepted connection: no Nagle delay (small packets such as
/// dial requests and responses would otherwise wait for the peer's delayed ACK), and TCP
/// keepalive, so a vanished peer is noticed.
fn tune_accepted(stream: &TcpStream) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(error = %e, "could not set TCP_NODELAY");
    }
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(TCP_KEEPALIVE)
        .with_interval(TCP_KEEPALIVE);
    if let Err(e) = socket2::SockRef::from(stream).set_tcp_keepalive(&keepalive) {
        tracing::debug!(error = %e, "could not enable TCP keepalive");
    }
}

/// Accepts TCP connections and runs each TLS handshake in its own task with a timeout, so a
/// silent client cannot hold up the next one. Each handshake uses the TLS configuration
/// current at accept time; established sessions keep theirs.
fn spawn_tls_acceptor(
    shared: &Arc<Shared>,
    listener: TcpListener,
    current_tls: fn(&Snapshot) -> Option<Arc<rustls::ServerConfig>>,
    stop: CancellationToken,
) -> ReceiverStream<tokio_rustls::server::TlsStream<TcpStream>> {
    let (tx, rx) = mpsc::channel(64);
    let shared = shared.clone();
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = stop.cancelled() => break,
                accepted = listener.accept() => accepted,
            };
            let (stream, peer) = match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    // Usually EMFILE: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            tune_accepted(&stream);
            let Some(config) = current_tls(&shared.snapshot()) else {
                continue;
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                let acceptor = TlsAcceptor::from(config);
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                    Ok(Ok(tls)) => {
                        let _ = tx.send(tls).await;
                    }
                    Ok(Err(e)) => tracing::info!(%peer, error = %e, "TLS handshake failed"),
                    Err(_) => tracing::info!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

/// Accepts Unix-socket connections until `stop`.
fn spawn_uds_acceptor(
    listener: UnixListener,
    stop: CancellationToken,
) -> ReceiverStream<tokio::net::UnixStream> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = stop.cancelled() => break,
                accepted = listener.accept() => accepted,
            };
            match accepted {
                Ok((stream, _)) => {
                    if tx.send(stream).await.is_err() {
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed on the frontend socket");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    });
    ReceiverStream::new(rx)
}

/// Keeps a server's incoming stream open after its acceptor stops, so that stopping to accept
/// does not also begin closing the connections already open; those end at hard stop.
fn hold_open<S: futures_util::Stream + Send + 'static>(
    stream: S,
) -> impl futures_util::Stream<Item = Result<S::Item, std::io::Error>> {
    stream.map(Ok).chain(futures_util::stream::pending())
}

fn grpc_server(keepalive: Duration) -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(keepalive))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        // grpc-go sets no stream limit; hyper's default of 200 would starve clients that open
        // one stream per dial on a shared connection.
        .max_concurrent_streams(Some(u32::MAX))
        // Fixed, generous windows rather than the adaptive (BDP) window: the adaptive one
        // starts at 64 KiB, and h2 then answers a burst of small frames (many dials at once on
        // one connection) with GOAWAY ENHANCE_YOUR_CALM, killing every tunnel on it.
        .initial_stream_window_size(Some(STREAM_WINDOW))
        .initial_connection_window_size(Some(CONNECTION_WINDOW))
}

/// A running server. Dropping it does not stop it; call [`RunningServer::shutdown`].
pub struct RunningServer {
    pub shared: Arc<Shared>,
    accept_stop: CancellationToken,
    servers: TaskTracker,
}

impl RunningServer {
    pub fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    /// Stops accepting, lets live tunnels run for up to `drain` (returning early when none
    /// are left), then closes everything.
    pub async fn shutdown(self, drain: Duration) {
        let shared = &self.shared;
        shared.draining.store(true, Ordering::Release);
        self.accept_stop.cancel();
        tracing::info!(drain = ?drain, "shutting down: no new agents or dials are accepted");
        let deadline = tokio::time::Instant::now() + drain;
        while !drain.is_zero() && tokio::time::Instant::now() < deadline {
            if shared.metrics.established_connections.get() == 0
                && shared.metrics.pending_backend_dials.get() == 0
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        shared.hard_stop.cancel();
        shared.tasks.close();
        self.servers.close();
        let stopped = async {
            shared.tasks.wait().await;
            self.servers.wait().await;
        };
        if tokio::time::timeout(STOP_GRACE, stopped).await.is_err() {
            tracing::warn!("some connections did not close in time; exiting anyway");
        }
        tracing::info!("stopped");
    }
}

/// Says loudly what an operator may not have meant.
fn warn_about_exposure(config: &Config) {
    if config.cluster_ca_cert.is_none() && !config.token_auth {
        tracing::warn!(
            "the agent port verifies no client certificate (--cluster-ca-cert) and no token \
             (--agent-namespace): any host that can reach it can register as an agent"
        );
    }
    if config.tls_min_version < crate::config::TlsVersion::Tls12 {
        tracing::warn!(
            "--tls-min-version below VersionTLS12 is accepted for compatibility, but TLS 1.2 \
             is the floor: older versions are insecure (RFC 8996) and not offered"
        );
    }
}

/// Starts serving on `listeners` and returns at once.
pub fn spawn(config: Config, listeners: Listeners) -> Result<RunningServer, RunError> {
    warn_about_exposure(&config);
    let snapshot = Snapshot::build(config)?;
    let config = snapshot.config.clone();
    let metrics = Arc::new(Metrics::new());
    let kube = (config.token_auth || config.enable_lease_controller).then(|| {
        Arc::new(crate::kubernetes::Kube::new(
            config.kubeconfig.clone(),
            config.kubeconfig_qps,
            config.kubeconfig_burst,
        ))
    });
    let authenticator = match (&kube, config.token_auth) {
        (Some(kube), true) => Some(crate::kubernetes::auth::TokenAuthenticator::new(
            kube.clone(),
            config.agent_token_cache_ttl,
        )),
        _ => None,
    };
    let shared = Arc::new(Shared {
        authenticator,
        registry: Registry::new(&config.proxy_strategies, metrics.clone()),
        snapshot: ArcSwap::from_pointee(snapshot),
        metrics,
        draining: AtomicBool::new(false),
        hard_stop: CancellationToken::new(),
        tasks: TaskTracker::new(),
    });
    let accept_stop = CancellationToken::new();
    let servers = TaskTracker::new();

    let agents = spawn_tls_acceptor(
        &shared,
        listeners.agent,
        |s| Some(s.agent_tls.clone()),
        accept_stop.clone(),
    );
    let agent_service = AgentServiceServer::new(AgentServer {
        shared: shared.clone(),
    })
    .max_decoding_message_size(MAX_MESSAGE_BYTES);
    serve_grpc(
        &servers,
        grpc_server(config.keepalive_time).add_service(agent_service),
        agents,
        shared.hard_stop.clone(),
        "agent",
    );

    match config.mode {
        Mode::Grpc => {
            spawn_grpc_frontend(&shared, &servers, listeners.frontend, &accept_stop, &config)
        }
        Mode::HttpConnect => {
            spawn_http_connect_frontend(&shared, &servers, listeners.frontend, &accept_stop)
        }
    }
    if let (Some(kube), true) = (&kube, config.enable_lease_controller) {
        let controller = crate::kubernetes::leases::LeaseController {
            kube: kube.clone(),
            namespace: config.lease_namespace.clone(),
            labels: config.lease_labels.clone(),
            server_id: config.server_id.clone(),
            metrics: shared.metrics.clone(),
        };
        servers.spawn(controller.run(shared.hard_stop.clone()));
    }
    let sweeper = shared.clone();
    servers.spawn(async move {
        let stop = sweeper.hard_stop.clone();
        crate::tunnel::sweep_stalled_tunnels(&sweeper.registry, &sweeper.metrics, stop).await
    });
    crate::admin::spawn_http(
        &servers,
        listeners.health,
        crate::admin::Port::Health,
        shared.clone(),
    );
    crate::admin::spawn_http(
        &servers,
        listeners.admin,
        crate::admin::Port::Admin,
        shared.clone(),
    );
    tracing::info!(server_id = %config.server_id, mode = ?config.mode, "konnectivity-server is serving");
    Ok(RunningServer {
        shared,
        accept_stop,
        servers,
    })
}

/// Serves HTTP-CONNECT on the frontend listener: one task per connection, tracked for drain.
fn spawn_http_connect_frontend(
    shared: &Arc<Shared>,
    servers: &TaskTracker,
    listener: FrontendListener,
    accept_stop: &CancellationToken,
) {
    fn serve_all<S>(shared: Arc<Shared>, servers: &TaskTracker, mut incoming: ReceiverStream<S>)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        servers.spawn(async move {
            while let Some(stream) = incoming.next().await {
                shared
                    .tasks
                    .spawn(crate::frontend::http_connect::serve(shared.clone(), stream));
            }
        });
    }
    match listener {
        FrontendListener::Unix(listener) => serve_all(
            shared.clone(),
            servers,
            spawn_uds_acceptor(listener, accept_stop.clone()),
        ),
        FrontendListener::Tcp(listener) => serve_all(
            shared.clone(),
            servers,
            spawn_tls_acceptor(
                shared,
                listener,
                |s| s.frontend_tls.clone(),
                accept_stop.clone(),
            ),
        ),
    }
}

/// Serves `/ProxyService/Proxy` on the frontend listener.
fn spawn_grpc_frontend(
    shared: &Arc<Shared>,
    servers: &TaskTracker,
    listener: FrontendListener,
    accept_stop: &CancellationToken,
    config: &Config,
) {
    let proxy_service = ProxyServiceServer::new(ProxyFrontend {
        shared: shared.clone(),
    })
    .max_decoding_message_size(MAX_MESSAGE_BYTES);
    let frontend_server = grpc_server(config.frontend_keepalive_time).add_service(proxy_service);
    let stop = shared.hard_stop.clone();
    match listener {
        // Invalid :authority values are mended before h2 sees them (see authority.rs).
        FrontendListener::Unix(listener) => {
            let incoming = spawn_uds_acceptor(listener, accept_stop.clone());
            serve_grpc(servers, frontend_server, incoming, stop, "frontend");
        }
        FrontendListener::Tcp(listener) => {
            let incoming = spawn_tls_acceptor(
                shared,
                listener,
                |s| s.frontend_tls.clone(),
                accept_stop.clone(),
            );
            serve_grpc(servers, frontend_server, incoming, stop, "frontend");
        }
    }
}

/// Runs a gRPC router on `incoming` until `stop`. Every connection reads through
/// [`AuthorityScrub`], so clients that send an invalid `:authority` are served.
fn serve_grpc<IO, S>(
    servers: &TaskTracker,
    router: tonic::transport::server::Router,
    incoming: S,
    stop: CancellationToken,
    what: &'static str,
) where
    S: futures_util::Stream<Item = IO> + Send + 'static,
    IO: tokio::io::AsyncRead
        + tokio::io::AsyncWrite
        + tonic::transport::server::Connected
        + Unpin
        + Send
        + 'static,
    IO::ConnectInfo: Clone + Send + Sync + 'static,
{
    servers.spawn(async move {
        if let Err(e) = router
            .serve_with_incoming_shutdown(
                hold_open(incoming.map(AuthorityScrub::new)),
                stop.cancelled_owned(),
            )
            .await
        {
            tracing::error!(error = %e, server = what, "gRPC server failed");
        }
    });
}

/// Serves until `shutdown` is cancelled, then drains for --graceful-shutdown-timeout.
pub async fn run(
    config: Config,
    listeners: Listeners,
    shutdown: CancellationToken,
) -> Result<(), RunError> {
    let drain = config.graceful_shutdown_timeout;
    let server = spawn(config, listeners)?;
    shutdown.cancelled().await;
    server.shutdown(drain).await;
    Ok(())
}
