//! Wiring: builds the shared state from a configuration, starts every server on the given
//! listeners, and stops them (`spawn`, `run`, [`RunningServer::shutdown`]).

use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::agent_service::AgentServer;
use crate::codec::serve::Route;
use crate::config::{Config, Mode};
use crate::frontend::grpc::ProxyFrontend;
use crate::h2_ping::{PingHandle, PingIo};
use crate::listen::{
    spawn_tls_acceptor, spawn_uds_acceptor, Accepted, BindError, FrontendListener, Listeners,
    OnAccept,
};
use crate::metrics::Metrics;
use crate::state::{Shared, Snapshot, SnapshotError};

/// grpc-go's default maximum received message size.
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;
/// The HTTP/2 stream flow-control window on frontend ports, as h2 accounts it.
const STREAM_WINDOW: u32 = 2 << 20;
/// An agent's stream window as h2 accounts it: the most its agent is ever allowed in flight,
/// and so the most an agent can make h2 hold while the server's reader of its stream waits
/// (only while a tunnel's queue is above its hold threshold and still draining). What
/// the agent is told follows the link (`h2_ping::window`): from 64 KiB, up to 2 MiB where
/// the link's bandwidth grows with it, and up to this only on a link whose measured
/// bandwidth-delay product needs more (a distant one: 2 MiB per 100 ms round trip is
/// 21 MB/s at most).
const AGENT_STREAM_WINDOW: u32 = 8 << 20;
/// After the drain, how long stopping the servers may take.
const STOP_GRACE: Duration = Duration::from_secs(5);

mod serving;
use serving::Http2;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    #[error(transparent)]
    Bind(#[from] BindError),
    #[error("failed to register the signal handlers: {0}")]
    Signals(std::io::Error),
    #[error("the configuration names {configured} frontends, but {given} listeners were given")]
    FrontendListeners { configured: usize, given: usize },
}

/// A running server. Dropping it does not stop it; call [`RunningServer::shutdown`].
pub struct RunningServer {
    pub shared: Arc<Shared>,
    accept_stop: CancellationToken,
    servers: TaskTracker,
    /// The socket files to remove once stopped (see [`Listeners::owned_uds`]).
    owned_uds: Vec<std::path::PathBuf>,
}

impl RunningServer {
    pub fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    /// Stops accepting, lets live tunnels run for up to `drain` (returning as soon as the last
    /// one is released), then closes everything.
    pub async fn shutdown(self, drain: Duration) {
        let shared = &self.shared;
        shared.start_draining();
        self.accept_stop.cancel();
        tracing::info!(drain = ?drain, "shutting down: no new agents or dials are accepted");
        if tokio::time::timeout(drain, shared.tunnels_released())
            .await
            .is_err()
        {
            tracing::info!("drain timeout reached; closing the tunnels still open");
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
        // A socket file left behind would make the next start fail with "address in use"
        // unless --delete-existing-uds-file is set; upstream removes it too.
        for path in &self.owned_uds {
            if let Err(e) = std::fs::remove_file(path) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(path = %path.display(), error = %e, "could not remove the socket file");
                }
            }
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
    let given = 1 + listeners.more_frontends.len();
    let (Some(first), true) = (config.frontends.first(), config.frontends.len() == given) else {
        return Err(RunError::FrontendListeners {
            configured: config.frontends.len(),
            given,
        });
    };
    let first_mode = first.mode;
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
    let shared = Arc::new(Shared::new(snapshot, metrics, authenticator));
    let accept_stop = CancellationToken::new();
    let servers = TaskTracker::new();
    let owned_uds = listeners.owned_uds;

    let agent_service = Route::new(
        AgentServer {
            shared: shared.clone(),
        },
        MAX_MESSAGE_BYTES,
    );
    spawn_tls_acceptor(
        &shared,
        "the agent port",
        listeners.agent,
        |s| Some(s.agent_tls.clone()),
        None,
        accept_stop.clone(),
        serving::on_accept(
            &servers,
            Http2 {
                keepalive: config.keepalive_time,
                stream_window: AGENT_STREAM_WINDOW,
            },
            agent_service,
            with_pings,
            shared.hard_stop.clone(),
        ),
    );

    let listeners_of_frontends =
        std::iter::once(listeners.frontend).chain(listeners.more_frontends);
    for (index, (frontend, listener)) in config
        .frontends
        .iter()
        .zip(listeners_of_frontends)
        .enumerate()
    {
        let serving = ServedFrontend {
            index,
            name: Arc::from(frontend.name.as_str()),
            what: Arc::from(frontend.what()),
        };
        shared
            .metrics
            .frontend
            .accepted_connections
            .with_label_values(&[&frontend.name]);
        match frontend.mode {
            Mode::Grpc => {
                spawn_grpc_frontend(&shared, &servers, serving, listener, &accept_stop, &config)
            }
            Mode::HttpConnect => {
                spawn_http_connect_frontend(&shared, serving, listener, &accept_stop)
            }
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
        crate::backend::dispatch::sweep_stalled_tunnels(&sweeper.registry, &sweeper.metrics, stop)
            .await
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
    let frontends = config
        .frontends
        .iter()
        .map(|f| format!("{}={}", f.name, f.mode.name()))
        .collect::<Vec<_>>()
        .join(",");
    tracing::info!(server_id = %config.server_id, mode = ?first_mode, frontends, "konnectivity-server is serving");
    Ok(RunningServer {
        shared,
        accept_stop,
        servers,
        owned_uds,
    })
}

/// One frontend as its acceptor and its serving tasks know it.
struct ServedFrontend {
    /// Its place in `Config::frontends` and `Snapshot::frontend_tls`.
    index: usize,
    name: Arc<str>,
    /// How its listener is named in logs.
    what: Arc<str>,
}

impl ServedFrontend {
    /// Its TLS configuration in the current snapshot, for each handshake.
    fn current_tls(
        &self,
    ) -> impl Fn(&Snapshot) -> Option<Arc<rustls::ServerConfig>> + Send + 'static {
        let index = self.index;
        move |snapshot: &Snapshot| snapshot.frontend_tls.get(index).cloned().flatten()
    }

    /// Counts each connection its acceptor hands on, then hands it to `serve`.
    fn counted<IO: 'static>(&self, shared: &Shared, serve: OnAccept<IO>) -> OnAccept<IO> {
        let accepted = shared
            .metrics
            .frontend
            .accepted_connections
            .with_label_values(&[&self.name]);
        Arc::new(move |connection| {
            accepted.inc();
            serve(connection)
        })
    }
}

/// Serves HTTP-CONNECT on a frontend listener: one task per connection, tracked for drain.
fn spawn_http_connect_frontend(
    shared: &Arc<Shared>,
    frontend: ServedFrontend,
    listener: FrontendListener,
    accept_stop: &CancellationToken,
) {
    fn serve_each<S>(shared: &Arc<Shared>, name: Arc<str>) -> OnAccept<S>
    where
        S: crate::frontend::relay_io::RelayIo + 'static,
    {
        let shared = shared.clone();
        Arc::new(move |Accepted { io, hold, peer }| {
            let serve =
                crate::frontend::http_connect::serve(shared.clone(), io, peer, name.clone());
            // The connection's drain token lives as long as it is served: its one CONNECT
            // is its first request. `map`, not an async block awaiting `serve`: that would
            // hold the future twice, as a captured value and as the one awaited.
            shared.tasks.spawn(serve.map(move |()| drop(hold)));
        })
    }
    let stop = accept_stop.clone();
    let holds = shared.accepted_connections();
    let what = frontend.what.clone();
    match listener {
        FrontendListener::Unix(listener) => {
            let serve = frontend.counted(shared, serve_each(shared, frontend.name.clone()));
            spawn_uds_acceptor(shared, what, listener, holds, stop, serve)
        }
        FrontendListener::Tcp(listener) => {
            let tls = frontend.current_tls();
            let serve = frontend.counted(shared, serve_each(shared, frontend.name.clone()));
            spawn_tls_acceptor(shared, what, listener, tls, Some(holds), stop, serve)
        }
    }
}

/// Serves `/ProxyService/Proxy` on a frontend listener.
fn spawn_grpc_frontend(
    shared: &Arc<Shared>,
    servers: &TaskTracker,
    frontend: ServedFrontend,
    listener: FrontendListener,
    accept_stop: &CancellationToken,
    config: &Config,
) {
    let proxy_service = Route::new(
        ProxyFrontend {
            shared: shared.clone(),
            name: frontend.name.clone(),
        },
        MAX_MESSAGE_BYTES,
    );
    let settings = || Http2 {
        keepalive: config.frontend_keepalive_time,
        stream_window: STREAM_WINDOW,
    };
    let hard_stop = shared.hard_stop.clone();
    let stop = accept_stop.clone();
    let holds = shared.accepted_connections();
    let what = frontend.what.clone();
    match listener {
        FrontendListener::Unix(listener) => {
            let serve =
                serving::on_accept(servers, settings(), proxy_service, without_pings, hard_stop);
            let serve = frontend.counted(shared, serve);
            spawn_uds_acceptor(shared, what, listener, holds, stop, serve)
        }
        FrontendListener::Tcp(listener) => {
            let tls = frontend.current_tls();
            let serve =
                serving::on_accept(servers, settings(), proxy_service, without_pings, hard_stop);
            let serve = frontend.counted(shared, serve);
            spawn_tls_acceptor(shared, what, listener, tls, Some(holds), stop, serve)
        }
    }
}

/// The agent port's connections: each with PINGs of our own (`backend::liveness`).
fn with_pings<IO>(io: IO) -> (PingIo<IO>, Option<PingHandle>) {
    let (io, ping) = PingIo::new(io);
    (io, Some(ping))
}

fn without_pings<IO>(io: IO) -> (IO, Option<PingHandle>) {
    (io, None)
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
