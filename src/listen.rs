//! Listening sockets and the accept loops that feed the servers: binding (or taking the
//! sockets systemd passed, for socket activation), socket options, TLS handshakes (bounded in
//! time and in number; the accept loop itself is `accept`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream, UnixListener};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::task_tracker::TaskTrackerToken;
use tokio_util::task::TaskTracker;

use crate::accept::Acceptor;
use crate::config::{Config, Frontend, FrontendAddr};
use crate::state::{Shared, Snapshot};
use crate::unix_conn::UnixConn;

/// How long a TLS handshake may take before the connection is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// TLS handshakes in progress per listener. Past this the listener stops accepting, and new
/// connections wait in the kernel's backlog, so a flood of silent clients costs a bounded
/// amount of memory and cannot starve the handshakes of real agents of CPU for long.
const MAX_CONCURRENT_HANDSHAKES: usize = 256;

#[derive(Debug, thiserror::Error)]
// The cause is in the message and not a `#[source]`, so `{:#}` does not print it twice.
#[error("failed to listen on {what} {addr}: {reason}")]
pub struct BindError {
    what: String,
    addr: String,
    reason: std::io::Error,
}

/// The frontend's listening socket.
pub enum FrontendListener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

/// Sockets the server serves on. Tests bind their own (any port) and pass them in.
pub struct Listeners {
    /// The first frontend's (`Config::frontends[0]`, the flags' one).
    pub frontend: FrontendListener,
    /// The other frontends', in the order of `Config::frontends[1..]`.
    pub more_frontends: Vec<FrontendListener>,
    pub agent: TcpListener,
    pub health: TcpListener,
    pub admin: TcpListener,
    /// Socket files this process created, removed when the server stops (upstream removes
    /// its socket too). Not a socket systemd passed: systemd owns that file.
    pub owned_uds: Vec<PathBuf>,
}

/// Listening sockets systemd passed to this process (socket activation: `LISTEN_FDS`, named by
/// `LISTEN_FDNAMES`). Each is matched to a configured listener by its name (`frontend` for the
/// first frontend and each other frontend's own name, `agent`, `health`, `admin`: the socket
/// unit's `FileDescriptorName=`) or by its address.
pub struct Inherited {
    sockets: Vec<(socket2::Socket, String)>,
}

impl Inherited {
    /// No inherited sockets: every listener is bound by the server itself.
    pub fn none() -> Inherited {
        Inherited {
            sockets: Vec::new(),
        }
    }

    /// Takes the sockets systemd passed to this process, if any.
    #[allow(unsafe_code)] // a documented site: see the SAFETY note
    pub fn from_systemd() -> Result<Inherited, BindError> {
        let passed = sd_notify::listen_fds_with_names().map_err(|reason| BindError {
            what: "the sockets passed by systemd".into(),
            addr: "(LISTEN_FDS)".into(),
            reason,
        })?;
        let sockets = passed
            .map(|(fd, name)| {
                use std::os::fd::FromRawFd;
                // SAFETY: systemd passes these descriptors to this process (LISTEN_PID is
                // checked by sd_notify), open, starting at fd 3; nothing else in the process
                // owns them, and `listen_fds_with_names` yields each once.
                let owned = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
                (socket2::Socket::from(owned), name)
            })
            .collect();
        Ok(Inherited { sockets })
    }

    /// The passed socket named `name`, or else the one whose address `matches`.
    fn take(
        &mut self,
        name: &str,
        matches: impl Fn(&socket2::SockAddr) -> bool,
    ) -> Option<socket2::Socket> {
        let index = self
            .sockets
            .iter()
            .position(|(_, n)| n == name)
            .or_else(|| {
                self.sockets
                    .iter()
                    .position(|(s, _)| s.local_addr().is_ok_and(|addr| matches(&addr)))
            })?;
        Some(self.sockets.remove(index).0)
    }

    fn take_tcp(&mut self, name: &str, want: SocketAddr) -> Option<std::net::TcpListener> {
        let socket = self.take(name, |addr| {
            addr.as_socket().is_some_and(|got| {
                got == want || (want.ip().is_unspecified() && got.port() == want.port())
            })
        })?;
        tracing::info!(listener = name, addr = ?socket.local_addr().ok().and_then(|a| a.as_socket()), "using the socket passed by systemd");
        Some(socket.into())
    }

    fn take_unix(&mut self, name: &str, path: &Path) -> Option<std::os::unix::net::UnixListener> {
        let socket = self.take(name, |addr| addr.as_pathname() == Some(path))?;
        tracing::info!(listener = name, path = %path.display(), "using the socket passed by systemd");
        Some(socket.into())
    }

    /// Passed sockets that match no listener are closed, with a warning naming them.
    fn warn_unused(self) {
        for (socket, name) in self.sockets {
            let addr = socket.local_addr().ok();
            let addr = addr
                .as_ref()
                .and_then(|a| a.as_socket().map(|s| s.to_string()))
                .or_else(|| {
                    addr.as_ref()
                        .and_then(|a| a.as_pathname().map(|p| p.display().to_string()))
                })
                .unwrap_or_default();
            tracing::warn!(
                name,
                addr,
                "systemd passed a socket that matches no listener; closing it"
            );
        }
    }
}

fn tokio_tcp(
    what: &str,
    addr: SocketAddr,
    std: std::net::TcpListener,
) -> Result<TcpListener, BindError> {
    std.set_nonblocking(true)
        .and_then(|()| TcpListener::from_std(std))
        .map_err(|reason| BindError {
            what: what.to_string(),
            addr: addr.to_string(),
            reason,
        })
}

async fn bind_tcp(what: &str, addr: SocketAddr) -> Result<TcpListener, BindError> {
    TcpListener::bind(addr).await.map_err(|reason| BindError {
        what: what.to_string(),
        addr: addr.to_string(),
        reason,
    })
}

/// Binds a Unix socket with mode 0770 (upstream's umask 0007), removing a stale file first
/// when asked to.
pub fn bind_uds(path: &Path, delete_existing: bool) -> Result<UnixListener, BindError> {
    bind_named_uds("the frontend socket", path, delete_existing)
}

fn bind_named_uds(
    what: &str,
    path: &Path,
    delete_existing: bool,
) -> Result<UnixListener, BindError> {
    use std::os::unix::fs::PermissionsExt;
    let bind_error = |reason| BindError {
        what: what.to_string(),
        addr: path.display().to_string(),
        reason,
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
    pub async fn bind(config: &Config) -> Result<Listeners, BindError> {
        Listeners::bind_or_take(config, Inherited::none()).await
    }

    /// Takes each listener from the sockets systemd passed when one matches, and binds the
    /// others: the same binary runs with and without a socket unit.
    pub async fn bind_or_take(
        config: &Config,
        mut inherited: Inherited,
    ) -> Result<Listeners, BindError> {
        let mut owned_uds = Vec::new();
        let mut frontends = Vec::with_capacity(config.frontends.len());
        for frontend in &config.frontends {
            let (listener, owned) = bind_frontend(frontend, &mut inherited).await?;
            frontends.push(listener);
            owned_uds.extend(owned);
        }
        let mut frontends = frontends.into_iter();
        let Some(frontend) = frontends.next() else {
            return Err(BindError {
                what: "a frontend".into(),
                addr: String::new(),
                reason: std::io::Error::other("the configuration names none"),
            });
        };
        let mut tcp = |name: &'static str, what: &'static str, addr: SocketAddr| {
            inherited
                .take_tcp(name, addr)
                .map(|std| tokio_tcp(what, addr, std))
        };
        let agent = tcp("agent", "the agent port", config.agent_addr);
        let health = tcp("health", "the health port", config.health_addr);
        let admin = tcp("admin", "the admin port", config.admin_addr);
        inherited.warn_unused();
        let agent = match agent {
            Some(l) => l?,
            None => bind_tcp("the agent port", config.agent_addr).await?,
        };
        let health = match health {
            Some(l) => l?,
            None => bind_tcp("the health port", config.health_addr).await?,
        };
        let admin = match admin {
            Some(l) => l?,
            None => bind_tcp("the admin port", config.admin_addr).await?,
        };
        Ok(Listeners {
            frontend,
            more_frontends: frontends.collect(),
            agent,
            health,
            admin,
            owned_uds,
        })
    }
}

/// One frontend's listener: the socket systemd passed under its name (or at its address), or
/// bound here; and the socket file to remove at stop when bound here.
async fn bind_frontend(
    frontend: &Frontend,
    inherited: &mut Inherited,
) -> Result<(FrontendListener, Option<PathBuf>), BindError> {
    let what = frontend.what();
    Ok(match &frontend.addr {
        FrontendAddr::Uds {
            path,
            delete_existing,
        } => match inherited.take_unix(&frontend.name, path) {
            Some(std) => {
                let listener = std
                    .set_nonblocking(true)
                    .and_then(|()| UnixListener::from_std(std))
                    .map_err(|reason| BindError {
                        what,
                        addr: path.display().to_string(),
                        reason,
                    })?;
                (FrontendListener::Unix(listener), None)
            }
            None => {
                let listener = bind_named_uds(&what, path, *delete_existing)?;
                (FrontendListener::Unix(listener), Some(path.clone()))
            }
        },
        FrontendAddr::Tcp(addr) => {
            let listener = match inherited.take_tcp(&frontend.name, *addr) {
                Some(std) => tokio_tcp(&what, *addr, std)?,
                None => bind_tcp(&what, *addr).await?,
            };
            (FrontendListener::Tcp(listener), None)
        }
    })
}

/// An accepted connection and, on a frontend, its token in [`Shared::accepted_connections`]:
/// the drain waits for it until the connection's first request is done.
pub struct Accepted<IO> {
    pub io: IO,
    pub hold: Option<TaskTrackerToken>,
    /// Who connected, for log lines: an address, or a Unix socket client's process.
    pub peer: Arc<str>,
}

/// What an acceptor does with each connection it accepted (over TCP, once its TLS handshake
/// is done): typically, spawn the task that serves it. Called on the acceptor's own task, so
/// a connection needs no hand-over to another task before it is served.
pub type OnAccept<IO> = Arc<dyn Fn(Accepted<IO>) + Send + Sync>;

/// Accepts TCP connections and runs each TLS handshake in its own task with a timeout, so a
/// silent client cannot hold up the next one. Each handshake uses the TLS configuration
/// current at accept time; established sessions keep theirs. `holds`: see [`Accepted`].
pub fn spawn_tls_acceptor(
    shared: &Arc<Shared>,
    what: impl Into<Arc<str>>,
    listener: TcpListener,
    current_tls: impl Fn(&Snapshot) -> Option<Arc<rustls::ServerConfig>> + Send + 'static,
    holds: Option<TaskTracker>,
    stop: CancellationToken,
    on_accept: OnAccept<tokio_rustls::server::TlsStream<TcpStream>>,
) {
    let shared = shared.clone();
    let what = what.into();
    tokio::spawn(async move {
        let mut acceptor = Acceptor::new(listener, what, Some(MAX_CONCURRENT_HANDSHAKES));
        loop {
            // Taken before the accept, so no connection is ever accepted without one; it is
            // let go when the stop comes first.
            let hold = holds.as_ref().map(TaskTracker::token);
            let Some(accepted) = acceptor.next(&stop).await else {
                break;
            };
            let Some(config) = current_tls(&shared.snapshot()) else {
                continue;
            };
            let on_accept = on_accept.clone();
            tokio::spawn(async move {
                let acceptor = TlsAcceptor::from(config);
                let handshake =
                    tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(accepted.io));
                let result = handshake.await;
                // The handshake's slot: an established connection no longer needs one.
                drop(accepted.slot);
                let peer = accepted.peer;
                match result {
                    Ok(Ok(tls)) => {
                        let peer = Arc::from(peer.to_string());
                        on_accept(Accepted {
                            io: tls,
                            hold,
                            peer,
                        });
                    }
                    Ok(Err(e)) => tracing::info!(%peer, error = %e, "TLS handshake failed"),
                    Err(_) => tracing::info!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
}

/// The peer of a Unix-socket connection whose client process is not asked for.
static UNNAMED_UNIX_PEER: std::sync::LazyLock<Arc<str>> =
    std::sync::LazyLock::new(|| Arc::from("unix socket"));

/// Accepts Unix-socket connections until `stop`, each with a token from `holds` (see
/// [`Accepted`]).
pub fn spawn_uds_acceptor(
    shared: &Arc<Shared>,
    what: impl Into<Arc<str>>,
    listener: UnixListener,
    holds: TaskTracker,
    stop: CancellationToken,
    on_accept: OnAccept<UnixConn>,
) {
    let shared = shared.clone();
    let what = what.into();
    tokio::spawn(async move {
        let mut acceptor = Acceptor::new(listener, what, None);
        loop {
            // Taken before the accept: see spawn_tls_acceptor.
            let hold = Some(holds.token());
            let Some(accepted) = acceptor.next(&stop).await else {
                break;
            };
            // The client's process is named only in the destination policy's log lines, so
            // it is asked for (a system call per connection) only while a policy is set.
            let peer = if shared.snapshot().config.destinations.is_empty() {
                UNNAMED_UNIX_PEER.clone()
            } else {
                Arc::from(match accepted.io.peer_cred() {
                    Ok(cred) => match cred.pid() {
                        Some(pid) => format!("unix socket pid={pid} uid={}", cred.uid()),
                        None => format!("unix socket uid={}", cred.uid()),
                    },
                    Err(_) => "unix socket".to_string(),
                })
            };
            on_accept(Accepted {
                io: UnixConn::new(accepted.io),
                hold,
                peer,
            });
        }
    });
}

/// One accepted gRPC connection, as each of its requests sees it: how many streams it has
/// opened so far. The first stream of a connection accepted before the drain began is served
/// during the drain (its client raced the drain and did nothing wrong); later ones are not.
#[derive(Clone, Debug, Default)]
pub struct ConnStreams(Arc<ConnState>);

#[derive(Debug, Default)]
struct ConnState {
    /// The connection's own PINGs (agent connections).
    ping: Option<crate::h2_ping::PingHandle>,
    opened: std::sync::atomic::AtomicU64,
    /// The connection's drain token (see [`Accepted`]) until its first stream takes it.
    hold: std::sync::Mutex<Option<TaskTrackerToken>>,
    peer: Arc<str>,
}

impl ConnStreams {
    fn new(
        hold: Option<TaskTrackerToken>,
        ping: Option<crate::h2_ping::PingHandle>,
        peer: Arc<str>,
    ) -> ConnStreams {
        ConnStreams(Arc::new(ConnState {
            ping,
            opened: Default::default(),
            hold: std::sync::Mutex::new(hold),
            peer,
        }))
    }

    /// Who connected (see [`Accepted::peer`]).
    pub fn peer(&self) -> &Arc<str> {
        &self.0.peer
    }

    /// Counts a new stream; returns whether it is the connection's first.
    pub fn open_first(&self) -> bool {
        self.0
            .opened
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel)
            == 0
    }

    /// The handle that PINGs this connection, where it has one.
    pub fn ping(&self) -> Option<&crate::h2_ping::PingHandle> {
        self.0.ping.as_ref()
    }

    /// The connection's drain token, for its first stream to hold while it runs.
    pub fn take_hold(&self) -> Option<TaskTrackerToken> {
        self.0
            .hold
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }
}

/// An accepted connection whose requests are each handed its [`ConnStreams`].
pub struct Tracked<IO> {
    io: IO,
    streams: ConnStreams,
}

impl<IO> Tracked<IO> {
    pub fn new(accepted: Accepted<IO>, ping: Option<crate::h2_ping::PingHandle>) -> Tracked<IO> {
        Tracked {
            io: accepted.io,
            streams: ConnStreams::new(accepted.hold, ping, accepted.peer),
        }
    }
}

impl<IO: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Tracked<IO> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Tracked<IO> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl<IO> Tracked<IO> {
    /// What each of the connection's requests is given.
    pub fn streams(&self) -> &ConnStreams {
        &self.streams
    }
}
