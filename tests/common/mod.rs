//! Helpers shared by the integration tests: a server on listeners of its own, a test agent
//! over mTLS, a test frontend over the Unix socket, packet builders, and leak checks.
//!
//! Every wait is a poll with a deadline ([`TIMEOUT`]); the deadline only matters when a test
//! fails.

#![allow(dead_code)]

pub mod raw_h2;

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use kube_traffic::config::{Config, Options};
use kube_traffic::proto::agent_service_client::AgentServiceClient;
use kube_traffic::proto::proxy_service_client::ProxyServiceClient;
use kube_traffic::proto::Packet;
use kube_traffic::testing::{bind_uds, Metrics};
use kube_traffic::tls::DevPki;
use kube_traffic::{FrontendListener, Listeners, RunningServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::{MetadataKey, MetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Request, Status, Streaming};

/// How long any single wait may take before the test fails.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// The first connect id the agent-side sync probe uses; no test allocates ids this high.
/// Each probe takes a fresh one: the server asks the agent to close an unknown connection
/// once, not once per packet.
const SYNC_CONNECT_ID_BASE: i64 = 0x5157_4e43;
static NEXT_SYNC_ID: std::sync::atomic::AtomicI64 =
    std::sync::atomic::AtomicI64::new(SYNC_CONNECT_ID_BASE);

/// Awaits `fut`, failing the test with `what` after [`TIMEOUT`].
pub async fn within<F: Future>(what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(TIMEOUT, fut).await {
        Ok(out) => out,
        Err(_) => panic!("timed out after {TIMEOUT:?} waiting for {what}"),
    }
}

/// Polls `check` every 10 ms until it is true; fails the test after [`TIMEOUT`] with
/// `describe()` (called at failure time, so it can show the current values).
pub async fn eventually(
    what: &str,
    mut check: impl FnMut() -> bool,
    describe: impl Fn() -> String,
) {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        if check() {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!(
                "timed out after {TIMEOUT:?} waiting for {what}: {}",
                describe()
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Packets: the library's wire vocabulary under the short names the tests use.

#[allow(unused_imports)] // each test binary uses its own subset
pub use kube_traffic::wire;
#[allow(unused_imports)]
pub use kube_traffic::wire::{
    close_request as close_req, close_response as close_rsp, data, dial_close as dial_cls,
    dial_request as dial_req, dial_response as dial_rsp, packet as pkt,
};

// ---------------------------------------------------------------------------------------------
// Panics in the server's own code

/// Panics whose location is in this crate's `src/`, recorded by the hook [`watch_panics`]
/// installs. A panicking server task just ends (tokio catches the unwind), so without this a
/// panic in a stream task would look like a stream that ended; every harness check fails on it.
/// Never cleared: once the server code has panicked in this test binary, every later check
/// fails too (tests run in parallel, so the panic cannot be pinned on one of them).
static SERVER_PANICS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Installs (once per test binary) a panic hook that records panics located in `src/`
/// (the file path, not the thread: server tasks run on the test's own runtime threads), then
/// runs the previous hook as usual.
pub fn watch_panics() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if let Some(location) = info.location() {
                if in_crate_src(location.file()) {
                    SERVER_PANICS
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(info.to_string());
                }
            }
            previous(info);
        }));
    });
}

/// Whether a panic location is the crate's own source (cargo passes workspace paths relative
/// to the workspace root; an absolute path is accepted too).
fn in_crate_src(file: &str) -> bool {
    file.starts_with("src/") || file.starts_with(concat!(env!("CARGO_MANIFEST_DIR"), "/src/"))
}

/// Fails the test if any code in `src/` has panicked in this test binary.
pub fn assert_no_server_panics() {
    let panics = SERVER_PANICS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    assert!(
        panics.is_empty(),
        "the server's code panicked ({} time(s)); a panicking task must fail the test:\n{}",
        panics.len(),
        panics.join("\n")
    );
}

/// Checks for server panics when dropped (unless the test is already failing), so every test
/// holding a [`Harness`] is covered, even one that never calls `finish`.
struct PanicCheck;

impl Drop for PanicCheck {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            assert_no_server_panics();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Leak accounting

/// Open file descriptors of this process.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd is readable")
        .count()
}

/// Tasks alive on the current runtime.
pub fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

// ---------------------------------------------------------------------------------------------
// The server

/// The configuration of the UDS + mTLS basics plus the command-line flags `extra`.
fn config_with(uds: &std::path::Path, pki: &DevPki, extra: &[&str]) -> Config {
    let mut args = vec![
        "konnectivity-server".to_string(),
        format!("--uds-name={}", uds.display()),
        "--server-port=0".into(),
        format!("--cluster-cert={}", pki.server_cert.display()),
        format!("--cluster-key={}", pki.server_key.display()),
        format!("--cluster-ca-cert={}", pki.ca_cert.display()),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let options = Options::parse_from_args(&args).expect("test flags parse");
    Config::from_options(&options).expect("test flags validate")
}

/// One server on listeners of its own, with a PKI generated in a temporary directory.
pub struct Harness {
    pub dir: tempfile::TempDir,
    pub pki: DevPki,
    pub uds: PathBuf,
    pub agent_addr: std::net::SocketAddr,
    pub health_addr: std::net::SocketAddr,
    pub admin_addr: std::net::SocketAddr,
    pub server_id: String,
    server: RunningServer,
    /// Tasks alive on this test's runtime before the server started.
    baseline_tasks: usize,
    _panic_check: PanicCheck,
}

impl Harness {
    pub async fn start() -> Harness {
        Harness::start_with(&[]).await
    }

    /// Starts a server; `extra` are command-line flags added to the UDS + mTLS basics.
    pub async fn start_with(extra: &[&str]) -> Harness {
        watch_panics();
        let baseline_tasks = alive_tasks();
        let dir = tempfile::tempdir().expect("tempdir");
        let (pki, _) = DevPki::ensure(&dir.path().join("pki")).expect("generate the test PKI");
        let uds = dir.path().join("konnectivity.sock");
        let config = if extra.is_empty() {
            Config::for_uds(&uds, &pki.server_cert, &pki.server_key, Some(&pki.ca_cert))
        } else {
            config_with(&uds, &pki, extra)
        };
        let server_id = config.server_id.clone();
        let frontend = FrontendListener::Unix(bind_uds(&uds, true).expect("bind the UDS"));
        let bind = || TcpListener::bind("127.0.0.1:0");
        let agent = bind().await.expect("bind the agent port");
        let health = bind().await.expect("bind the health port");
        let admin = bind().await.expect("bind the admin port");
        let agent_addr = agent.local_addr().unwrap();
        let health_addr = health.local_addr().unwrap();
        let admin_addr = admin.local_addr().unwrap();
        let server = kube_traffic::spawn(
            config,
            Listeners {
                frontend,
                more_frontends: Vec::new(),
                agent,
                health,
                admin,
                owned_uds: vec![uds.clone()],
            },
        )
        .expect("server starts");
        Harness {
            dir,
            pki,
            uds,
            agent_addr,
            health_addr,
            admin_addr,
            server_id,
            server,
            baseline_tasks,
            _panic_check: PanicCheck,
        }
    }

    pub fn metrics(&self) -> &Metrics {
        self.server.metrics()
    }

    /// Our agent's command line for connecting to this server over mTLS as `id`.
    pub fn agent_args(&self, id: &str) -> Vec<String> {
        vec![
            "konnectivity-agent".to_string(),
            format!("--ca-cert={}", self.pki.ca_cert.display()),
            format!("--agent-cert={}", self.pki.agent_cert.display()),
            format!("--agent-key={}", self.pki.agent_key.display()),
            "--proxy-server-host=127.0.0.1".into(),
            format!("--proxy-server-port={}", self.agent_addr.port()),
            format!("--agent-id={id}"),
        ]
    }

    /// Applies the configuration of `extra` (as [`Harness::start_with`] takes it), as a reload
    /// does: new dials use it, live tunnels keep going.
    pub fn reconfigure(&self, extra: &[&str]) {
        let mut config = config_with(&self.uds, &self.pki, extra);
        config.server_id = self.server_id.clone();
        let snapshot = kube_traffic::Snapshot::build(config).expect("test config loads");
        self.server.shared.apply(snapshot);
    }

    pub fn gauges(&self) -> (i64, i64) {
        let m = self.metrics();
        (
            m.dial.pending_backend_dials.get(),
            m.tunnel.established_connections.get(),
        )
    }

    /// `GET /tunnels{query}` on the admin port, as a list of tunnels.
    pub async fn tunnels(&self, query: &str) -> Vec<serde_json::Value> {
        let (status, body) = Harness::http_get(self.admin_addr, &format!("/tunnels{query}")).await;
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).expect("/tunnels is JSON")
    }

    /// Polls `/tunnels{query}` until `check` holds; returns the list it held for.
    pub async fn wait_tunnels(
        &self,
        query: &str,
        what: &str,
        check: impl Fn(&[serde_json::Value]) -> bool,
    ) -> Vec<serde_json::Value> {
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        loop {
            let now = self.tunnels(query).await;
            if check(&now) {
                return now;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}: /tunnels{query} is {now:#?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until (pending dials, established connections) equal `expected`.
    pub async fn wait_gauges(&self, expected: (i64, i64)) {
        eventually(
            &format!("(pending_backend_dials, established_connections) == {expected:?}"),
            || self.gauges() == expected,
            || format!("now {:?}", self.gauges()),
        )
        .await
    }

    fn grpc_streams(&self) -> (i64, i64) {
        let g = &self.metrics().frontend.grpc_connections;
        (
            g.with_label_values(&["Proxy"]).get(),
            g.with_label_values(&["Connect"]).get(),
        )
    }

    /// Starts the drain as SIGTERM does (new agents and later dials refused), without
    /// stopping the server.
    pub fn start_draining(&self) {
        self.server.shared.start_draining();
    }

    /// Tokens the drain waits on for frontend connections: one per accepted connection whose
    /// first request has not ended, and one for the acceptor waiting in accept.
    pub fn accept_holds(&self) -> usize {
        self.server.shared.accepted_connections().len()
    }

    /// Once the server has accepted `connections` frontend connections (none has sent a
    /// request yet), starts `RunningServer::shutdown(drain)` on its own task and waits for the
    /// drain to begin. Returns the server's shared state and the task, which ends when the
    /// shutdown does.
    #[allow(dead_code)] // not every test binary uses it
    pub async fn stop_once_accepted(
        self,
        connections: usize,
        drain: Duration,
    ) -> (
        Arc<kube_traffic::testing::Shared>,
        tokio::task::JoinHandle<()>,
    ) {
        // One hold per accepted connection and one for the acceptor waiting in accept.
        eventually(
            &format!("{connections} frontend connections to be accepted"),
            || self.accept_holds() == connections + 1,
            || format!("{} holds", self.accept_holds()),
        )
        .await;
        let shared = self.server.shared.clone();
        let Harness { server, dir, .. } = self;
        let task = tokio::spawn(async move {
            server.shutdown(drain).await;
            drop(dir);
        });
        eventually(
            "the drain to begin",
            || shared.is_draining(),
            || "not draining".into(),
        )
        .await;
        (shared, task)
    }

    /// Waits until the server has this many agents registered.
    pub async fn wait_agents(&self, n: usize) {
        eventually(
            &format!("{n} registered agents"),
            || self.server.shared.registry.agents().len() == n,
            || format!("now {}", self.server.shared.registry.agents().len()),
        )
        .await
    }

    /// The end of every test, once it has dropped its clients: every pending dial and
    /// established connection is gone, every stream task has ended, and after shutdown the
    /// runtime is back to the tasks it had before the server started.
    pub async fn finish(self) {
        assert_no_server_panics();
        self.wait_gauges((0, 0)).await;
        eventually(
            "every Proxy and Connect stream to end",
            || self.grpc_streams() == (0, 0),
            || format!("(Proxy, Connect) = {:?}", self.grpc_streams()),
        )
        .await;
        self.shutdown().await.check_clean().await;
    }

    /// Shuts the server down with `RunningServer::shutdown(Duration::ZERO)`; clients may still
    /// be connected.
    pub async fn shutdown(self) -> Stopped {
        let Harness {
            server,
            baseline_tasks,
            dir,
            uds,
            ..
        } = self;
        let shared = server.shared.clone();
        within("shutdown", server.shutdown(Duration::ZERO)).await;
        assert_no_server_panics();
        assert!(
            !uds.exists(),
            "the socket file the server created is removed when it stops"
        );
        Stopped {
            shared,
            baseline_tasks,
            _dir: dir,
        }
    }

    // --- clients ---------------------------------------------------------------------------

    /// A TLS channel to the agent port with the agent's client certificate.
    pub async fn agent_channel(&self) -> Channel {
        let read = |p: &PathBuf| std::fs::read(p).expect("read PKI file");
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(read(&self.pki.ca_cert)))
            .identity(Identity::from_pem(
                read(&self.pki.agent_cert),
                read(&self.pki.agent_key),
            ))
            .domain_name("localhost");
        let endpoint = Endpoint::from_shared(format!("https://{}", self.agent_addr))
            .unwrap()
            .tls_config(tls)
            .expect("client TLS config");
        within("the agent TLS connection", endpoint.connect())
            .await
            .expect("connect to the agent port")
    }

    /// Connects an agent with `agentid = id`.
    pub async fn agent(&self, id: &str) -> TestAgent {
        self.agent_with(&[("agentid", id)])
            .await
            .expect("agent accepted")
    }

    /// Connects an agent sending exactly the metadata `metadata` (keys may repeat).
    pub async fn agent_with(&self, metadata: &[(&str, &str)]) -> Result<TestAgent, Status> {
        let channel = self.agent_channel().await;
        TestAgent::connect(channel, metadata).await
    }

    /// A gRPC channel over the frontend Unix socket; counts the connections it makes.
    pub async fn frontend(&self) -> Frontend {
        Frontend::connect(self.uds.clone()).await
    }

    /// Opens a tunnel whose dial to `address` is pending at `agent`: the DIAL_REQ has
    /// reached the agent, which has not answered.
    pub async fn pending_dial(
        &self,
        frontend: &Frontend,
        agent: &mut TestAgent,
        address: &str,
        random: i64,
    ) -> Tunnel {
        let tunnel = frontend.open().await;
        tunnel.send(dial_req(address, random)).await;
        assert_eq!(
            agent.recv().await,
            dial_req(address, random),
            "DIAL_REQ reaches the agent"
        );
        tunnel
    }

    /// Opens a tunnel and establishes it through `agent` with the given ids.
    pub async fn establish(
        &self,
        frontend: &Frontend,
        agent: &mut TestAgent,
        random: i64,
        connect_id: i64,
    ) -> Tunnel {
        let mut tunnel = self
            .pending_dial(frontend, agent, "10.0.0.1:443", random)
            .await;
        agent.send(dial_rsp(random, connect_id, "")).await;
        assert_eq!(tunnel.recv().await, dial_rsp(random, connect_id, ""));
        tunnel
    }

    /// One HTTP/1.1 GET on `addr`; returns (status, body).
    pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
        within(&format!("GET {path}"), async {
            let mut stream = TcpStream::connect(addr).await.expect("connect");
            let request =
                format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
            stream.write_all(request.as_bytes()).await.unwrap();
            let mut response = Vec::new();
            stream.read_to_end(&mut response).await.unwrap();
            let response = String::from_utf8(response).expect("UTF-8 response");
            let (head, body) = response
                .split_once("\r\n\r\n")
                .expect("a complete response");
            let status = head
                .split(' ')
                .nth(1)
                .and_then(|s| s.parse().ok())
                .expect("a status line");
            (status, body.to_string())
        })
        .await
    }
}

/// A server that has been shut down.
pub struct Stopped {
    shared: Arc<kube_traffic::testing::Shared>,
    baseline_tasks: usize,
    _dir: tempfile::TempDir,
}

impl Stopped {
    /// Once the test's clients are dropped too: the gauges are 0 and the runtime is back to
    /// the tasks it had before the server started.
    pub async fn check_clean(self) {
        let m = &self.shared.metrics;
        eventually(
            "gauges to return to 0 after shutdown",
            || {
                m.dial.pending_backend_dials.get() == 0
                    && m.tunnel.established_connections.get() == 0
            },
            || {
                format!(
                    "pending {} established {}",
                    m.dial.pending_backend_dials.get(),
                    m.tunnel.established_connections.get()
                )
            },
        )
        .await;
        let baseline = self.baseline_tasks;
        drop(self);
        eventually(
            "the runtime's alive tasks to return to their baseline",
            || alive_tasks() <= baseline,
            || format!("{} alive, baseline {baseline}", alive_tasks()),
        )
        .await;
        // A task that panicked has "ended" too: the count above cannot tell.
        assert_no_server_panics();
    }
}

// ---------------------------------------------------------------------------------------------
// The test agent

/// One `/AgentService/Connect` stream, as a konnectivity-agent holds it.
pub struct TestAgent {
    tx: Option<mpsc::Sender<Packet>>,
    rx: Streaming<Packet>,
    /// The `serverid` response header.
    pub server_id: String,
    /// The `servercount` response header.
    pub server_count: String,
    pub channel: Channel,
}

impl TestAgent {
    pub async fn connect(channel: Channel, metadata: &[(&str, &str)]) -> Result<TestAgent, Status> {
        let (tx, rx) = mpsc::channel(64);
        let mut request = Request::new(ReceiverStream::new(rx));
        for (key, value) in metadata {
            let value: MetadataValue<_> = value.parse().expect("ASCII metadata value");
            let key = MetadataKey::from_bytes(key.as_bytes()).expect("metadata key");
            request.metadata_mut().append(key, value);
        }
        let mut client = AgentServiceClient::new(channel.clone());
        // Resolves once the response headers arrive, before any packet.
        let response = within("the Connect response headers", client.connect(request)).await?;
        let header = |name: &str| {
            let values: Vec<String> = response
                .metadata()
                .get_all(name)
                .iter()
                .map(|v| v.to_str().expect("ASCII header").to_string())
                .collect();
            assert_eq!(values.len(), 1, "exactly one {name} header: {values:?}");
            values.into_iter().next().unwrap()
        };
        let server_id = header("serverid");
        let server_count = header("servercount");
        Ok(TestAgent {
            tx: Some(tx),
            rx: response.into_inner(),
            server_id,
            server_count,
            channel,
        })
    }

    pub async fn send(&self, packet: Packet) {
        let tx = self.tx.as_ref().expect("the agent's send side is open");
        within("the agent to send", tx.send(packet))
            .await
            .expect("agent stream open");
    }

    /// The next packet from the server; fails on end of stream or error.
    pub async fn recv(&mut self) -> Packet {
        match within("a packet at the agent", self.rx.message()).await {
            Ok(Some(packet)) => packet,
            Ok(None) => panic!("the agent stream ended"),
            Err(status) => panic!("the agent stream failed: {status:?}"),
        }
    }

    /// Waits for the end of the server's side of the stream, returning any packets before it.
    pub async fn recv_end(&mut self) -> Result<Vec<Packet>, Status> {
        let mut before = Vec::new();
        loop {
            match within("the end of the agent stream", self.rx.message()).await? {
                Some(packet) => before.push(packet),
                None => return Ok(before),
            }
        }
    }

    /// Everything the server queued to this agent before now. The server handles an agent's
    /// packets in order on one loop and answers DATA for an unknown connection with CLOSE_REQ,
    /// so that CLOSE_REQ marks the point where every earlier packet has been delivered.
    pub async fn sync(&mut self) -> Vec<Packet> {
        let probe = NEXT_SYNC_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.send(data(probe, &b"sync"[..])).await;
        let mut before = Vec::new();
        loop {
            let packet = self.recv().await;
            if packet == close_req(probe) {
                return before;
            }
            before.push(packet);
        }
    }

    /// Ends the agent's send side cleanly (END_STREAM), as an agent shutting down does.
    pub fn close_send(&mut self) {
        self.tx = None;
    }
}

/// How a stream dies in a test.
#[derive(Clone, Copy, Debug)]
pub enum Death {
    /// The client half-closes its side (END_STREAM).
    Eof,
    /// The client drops the stream (RST_STREAM) and its connection.
    Reset,
}

// ---------------------------------------------------------------------------------------------
// The test frontend

/// A gRPC channel over the frontend Unix socket: one HTTP/2 connection.
#[derive(Clone)]
pub struct Frontend {
    pub client: ProxyServiceClient<Channel>,
    pub channel: Channel,
    /// Connections the channel's connector opened.
    pub connections: Arc<AtomicUsize>,
}

impl Frontend {
    /// Connects a plain tonic/h2 client over the Unix socket.
    pub async fn connect(path: PathBuf) -> Frontend {
        let connections = Arc::new(AtomicUsize::new(0));
        let counter = connections.clone();
        let connector = tower::service_fn(move |_: http::Uri| {
            let path = path.clone();
            counter.fetch_add(1, Ordering::SeqCst);
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        });
        Frontend::from_connector(connector, connections).await
    }

    async fn from_connector<C>(connector: C, connections: Arc<AtomicUsize>) -> Frontend
    where
        C: tower::Service<http::Uri, Error = std::io::Error> + Send + 'static,
        C::Response: hyper::rt::Read + hyper::rt::Write + Send + Unpin + 'static,
        C::Future: Send + 'static,
    {
        let channel = within(
            "the frontend UDS connection",
            Endpoint::from_static("http://localhost").connect_with_connector(connector),
        )
        .await
        .expect("connect to the frontend socket");
        Frontend {
            client: ProxyServiceClient::new(channel.clone()),
            channel,
            connections,
        }
    }

    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    /// Opens one `/ProxyService/Proxy` stream. As konnectivity-client, it does not wait for
    /// the response headers, which the server sends with its first packet (as upstream's
    /// does): the first `recv` waits for them.
    pub async fn open(&self) -> Tunnel {
        let (tx, rx) = mpsc::channel(16);
        let mut client = self.client.clone();
        let call =
            tokio::spawn(async move { client.proxy(Request::new(ReceiverStream::new(rx))).await });
        Tunnel {
            tx: Some(tx),
            rx: Inbound::Opening(call),
        }
    }
}

/// One `/ProxyService/Proxy` stream, as konnectivity-client opens one per dial.
pub struct Tunnel {
    tx: Option<mpsc::Sender<Packet>>,
    rx: Inbound,
}

type ProxyCall = tokio::task::JoinHandle<Result<tonic::Response<Streaming<Packet>>, Status>>;

/// The server's side of a tunnel: the call until its response headers arrive, then its stream.
enum Inbound {
    Opening(ProxyCall),
    Open(Box<Streaming<Packet>>),
}

impl Tunnel {
    /// The server's side, once its response headers have arrived.
    async fn inbound(&mut self) -> Result<&mut Streaming<Packet>, Status> {
        if let Inbound::Opening(call) = &mut self.rx {
            let response = call.await.expect("the Proxy call's task")?;
            self.rx = Inbound::Open(Box::new(response.into_inner()));
        }
        match &mut self.rx {
            Inbound::Open(stream) => Ok(stream),
            Inbound::Opening(_) => unreachable!("just opened"),
        }
    }

    async fn message(&mut self) -> Result<Option<Packet>, Status> {
        self.inbound().await?.message().await
    }

    pub async fn send(&self, packet: Packet) {
        let tx = self.tx.as_ref().expect("the tunnel's send side is open");
        within("the frontend to send", tx.send(packet))
            .await
            .expect("tunnel stream open");
    }

    pub async fn recv(&mut self) -> Packet {
        match within("a packet at the frontend", self.message()).await {
            Ok(Some(packet)) => packet,
            Ok(None) => panic!("the tunnel stream ended"),
            Err(status) => panic!("the tunnel stream failed: {status:?}"),
        }
    }

    /// Waits for the end of the server's side of the stream, returning any packets before it.
    pub async fn recv_end(&mut self) -> Result<Vec<Packet>, Status> {
        let mut before = Vec::new();
        loop {
            match within("the end of the tunnel stream", self.message()).await? {
                Some(packet) => before.push(packet),
                None => return Ok(before),
            }
        }
    }

    /// Half-closes the frontend's side (END_STREAM).
    pub fn close_send(&mut self) {
        self.tx = None;
    }

    /// Sends unless the stream is gone; whether it was sent.
    pub async fn try_send(&self, packet: Packet) -> bool {
        match &self.tx {
            Some(tx) => within("the frontend to send", tx.send(packet))
                .await
                .is_ok(),
            None => false,
        }
    }
}
