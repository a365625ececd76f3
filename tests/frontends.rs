//! Several frontends in one server process: gRPC on a Unix socket (the flags' frontend) and
//! HTTP CONNECT over TCP+mTLS (a `[[frontend]]` table), both carrying a request at once from
//! upstream's proxy-test-client, through upstream's proxy-agent, to upstream's
//! http-test-server. The Go binaries are the interop harness's (tests/interop/build.sh, cached
//! outside the work tree); without Go the test is skipped, except under CI=true.
#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod upstream_bins;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kube_traffic::tls::DevPki;

const BIN: &str = env!("CARGO_BIN_EXE_konnectivity-server");
const WAIT: Duration = Duration::from_secs(30);
const SUCCESS_PAGE: &str = "The success test page!";

/// A free port in [1024, 32767]: below the kernel's ephemeral range, which upstream's agent
/// refuses for its own ports and our validation for a frontend's.
fn free_port() -> u16 {
    loop {
        let port = fastrand::u16(1024..32768);
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// A child process killed when the test ends, its output in a file.
struct Proc {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn start(name: &'static str, dir: &Path, cmd: &mut Command) -> Proc {
        let log = dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("{name} starts: {e}"));
        Proc { name, child, log }
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn alive(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!("{} exited ({status}):\n{}", self.name, self.output());
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `check` until it holds; fails with `what` and `describe()` after [`WAIT`].
fn eventually(what: &str, mut check: impl FnMut() -> bool, describe: impl Fn() -> String) {
    let deadline = Instant::now() + WAIT;
    while !check() {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}:\n{}",
            describe()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A plain HTTP GET on loopback: the status code and body, or None when nothing answers.
fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut reply = String::new();
    conn.read_to_string(&mut reply).ok()?;
    let status = reply.split(' ').nth(1)?.parse().ok()?;
    let body = reply.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((status, body))
}

#[test]
fn grpc_on_a_unix_socket_and_http_connect_over_mtls_in_one_process() {
    let Some(bins) = upstream_bins::dir("the upstream agent and client") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (pki, _) = DevPki::ensure(&dir.path().join("pki")).unwrap();
    let sock = dir.path().join("konn.sock");
    let [agent_port, health_port, admin_port, connect_port] = [(); 4].map(|()| free_port());
    let config = dir.path().join("server.toml");
    std::fs::write(
        &config,
        format!(
            "mode = \"grpc\"\nuds_name = \"{sock}\"\nserver_port = 0\n\
             agent_bind_address = \"127.0.0.1\"\nagent_port = {agent_port}\n\
             health_bind_address = \"127.0.0.1\"\nhealth_port = {health_port}\n\
             admin_port = {admin_port}\n\
             cluster_cert = \"{cert}\"\ncluster_key = \"{key}\"\ncluster_ca_cert = \"{ca}\"\n\n\
             [[frontend]]\nname = \"mtls\"\nmode = \"http-connect\"\n\
             bind_address = \"127.0.0.1\"\nport = {connect_port}\n\
             cert = \"{cert}\"\nkey = \"{key}\"\nca_cert = \"{ca}\"\n",
            sock = sock.display(),
            cert = pki.server_cert.display(),
            key = pki.server_key.display(),
            ca = pki.ca_cert.display(),
        ),
    )
    .unwrap();
    let mut server = Proc::start(
        "konnectivity-server",
        dir.path(),
        Command::new(BIN)
            .arg(format!("--config={}", config.display()))
            .arg("-v=2")
            .env_remove("RUST_LOG")
            .env_remove("NOTIFY_SOCKET"),
    );
    let mut agent = Proc::start(
        "proxy-agent",
        dir.path(),
        Command::new(bins.join("proxy-agent")).args([
            format!("--ca-cert={}", pki.ca_cert.display()),
            format!("--agent-cert={}", pki.agent_cert.display()),
            format!("--agent-key={}", pki.agent_key.display()),
            "--proxy-server-host=127.0.0.1".into(),
            format!("--proxy-server-port={agent_port}"),
            "--agent-id=frontends-agent".into(),
            "--agent-identifiers=host=localhost&ipv4=127.0.0.1".into(),
            "--health-server-host=127.0.0.1".into(),
            format!("--health-server-port={}", free_port()),
            "--admin-bind-address=127.0.0.1".into(),
            format!("--admin-server-port={}", free_port()),
        ]),
    );
    let server_log = server.log.clone();
    let web_port = free_port();
    let mut web = Proc::start(
        "http-test-server",
        dir.path(),
        Command::new(bins.join("http-test-server")).arg(format!("--server-port={web_port}")),
    );
    eventually(
        "the agent to connect (/readyz 200) and the test server to listen",
        || {
            server.alive();
            agent.alive();
            web.alive();
            http_get(health_port, "/readyz").is_some_and(|(status, _)| status == 200)
                && TcpStream::connect(("127.0.0.1", web_port)).is_ok()
        },
        || std::fs::read_to_string(&server_log).unwrap_or_default(),
    );

    // Both clients at once, one through each frontend.
    let request = [
        "--request-host=127.0.0.1".to_string(),
        format!("--request-port={web_port}"),
        "--request-path=success".into(),
    ];
    let client = |name: &'static str, args: Vec<String>| {
        Proc::start(
            name,
            dir.path(),
            upstream_bins::test_client(&bins).args(args).args(&request),
        )
    };
    let mut grpc = client(
        "client-grpc-uds",
        vec![
            "--mode=grpc".into(),
            format!("--proxy-uds={}", sock.display()),
            "--proxy-host=".into(),
            "--proxy-port=0".into(),
        ],
    );
    let mut connect = client(
        "client-http-connect-mtls",
        vec![
            "--mode=http-connect".into(),
            "--proxy-host=127.0.0.1".into(),
            format!("--proxy-port={connect_port}"),
            format!("--ca-cert={}", pki.ca_cert.display()),
            format!("--client-cert={}", pki.agent_cert.display()),
            format!("--client-key={}", pki.agent_key.display()),
        ],
    );
    for client in [&mut grpc, &mut connect] {
        let deadline = Instant::now() + WAIT;
        let status = loop {
            if let Some(status) = client.child.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "{} did not finish", client.name);
            std::thread::sleep(Duration::from_millis(50));
        };
        let out = client.output();
        assert!(
            status.success() && out.contains(SUCCESS_PAGE),
            "{} ({status}) did not get the success page:\n{out}\n--- server ---\n{}",
            client.name,
            server.output()
        );
    }

    // Each frontend counted its own connection and named itself in its tunnel's access line.
    let metrics = || {
        http_get(admin_port, "/metrics")
            .map(|(_, body)| body)
            .unwrap_or_default()
    };
    let family = "konnectivity_network_proxy_server_frontend_accepted_connections_total";
    for name in ["frontend", "mtls"] {
        let series = format!("{family}{{frontend=\"{name}\"}} 1");
        assert!(metrics().contains(&series), "{series} in\n{}", metrics());
    }
    for (name, kind) in [("frontend", "grpc"), ("mtls", "http-connect")] {
        let line = format!("frontend=\"{kind}\" frontendName=\"{name}\"");
        eventually(
            &format!("the access line with {line}"),
            || {
                server
                    .output()
                    .lines()
                    .any(|l| l.contains("\"Tunnel closed\"") && l.contains(&line))
            },
            || server.output(),
        );
    }
}

/// The flags of a server with a UDS frontend and its other ports on loopback, its config file
/// `file` (TOML) written to `dir`.
fn server_args(dir: &Path, pki: &DevPki, file: &str) -> (Vec<String>, u16) {
    let config = dir.join("server.toml");
    std::fs::write(&config, file).unwrap();
    let health = free_port();
    let args = vec![
        format!("--config={}", config.display()),
        "--mode=http-connect".into(),
        format!("--uds-name={}", dir.join("konn.sock").display()),
        "--server-port=0".into(),
        format!("--cluster-cert={}", pki.server_cert.display()),
        format!("--cluster-key={}", pki.server_key.display()),
        format!("--cluster-ca-cert={}", pki.ca_cert.display()),
        "--agent-bind-address=127.0.0.1".into(),
        format!("--agent-port={}", free_port()),
        "--health-bind-address=127.0.0.1".into(),
        format!("--health-port={health}"),
        "--admin-bind-address=127.0.0.1".into(),
        format!("--admin-port={}", free_port()),
        "--watch-files=false".into(),
    ];
    (args, health)
}

/// A CONNECT on the Unix socket `path`, answered (no agent) and closed by the server.
fn connect_answer(path: &Path) -> String {
    let mut conn = std::os::unix::net::UnixStream::connect(path).unwrap();
    conn.set_read_timeout(Some(WAIT)).unwrap();
    conn.write_all(b"CONNECT 127.0.0.1:9 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).unwrap();
    answer
}

const NO_AGENT: &str = "No agent available";

#[test]
fn each_frontend_takes_the_socket_systemd_passed_under_its_name() {
    let tool = "systemd-socket-activate";
    if Command::new(tool).arg("--version").output().is_err() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{tool} is missing (Debian package systemd); CI must have it"
        );
        eprintln!("SKIPPED: {tool} is not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (pki, _) = DevPki::ensure(&dir.path().join("pki")).unwrap();
    let first = dir.path().join("konn.sock");
    let tools = dir.path().join("tools.sock");
    let (args, health) = server_args(
        dir.path(),
        &pki,
        &format!(
            "[[frontend]]\nname = \"tools\"\nmode = \"http-connect\"\nuds_name = \"{}\"\n",
            tools.display()
        ),
    );
    // Passed in the other order than configured: each is found by its name.
    let mut server = Proc::start(
        "konnectivity-server",
        dir.path(),
        Command::new(tool)
            .arg(format!("--listen={}", tools.display()))
            .arg(format!("--listen={}", first.display()))
            .arg("--fdname=tools:frontend")
            .arg(BIN)
            .args(&args),
    );
    eventually(
        "both sockets bound by systemd-socket-activate",
        || first.exists() && tools.exists(),
        || server.output(),
    );
    for path in [&first, &tools] {
        let answer = connect_answer(path);
        assert!(answer.ends_with(NO_AGENT), "{}: {answer}", path.display());
    }
    server.alive();
    assert_eq!(http_get(health, "/healthz").map(|r| r.0), Some(200));
    // The log is written by a background thread: wait for its lines rather than race it.
    for name in ["frontend", "tools"] {
        eventually(
            &format!("the log line for the {name} socket"),
            || {
                server.output().lines().any(|l| {
                    l.contains("using the socket passed by systemd")
                        && l.contains(&format!("listener=\"{name}\""))
                })
            },
            || server.output(),
        );
    }
    // A passed socket that matched no listener is warned of before the server says it serves.
    eventually(
        "the serving line",
        || server.output().contains("konnectivity-server is serving"),
        || server.output(),
    );
    let log = server.output();
    assert!(!log.contains("matches no listener"), "{log}");
}

#[test]
fn a_reload_that_changes_the_frontends_keeps_the_running_ones_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let (pki, _) = DevPki::ensure(&dir.path().join("pki")).unwrap();
    let second = dir.path().join("second.sock");
    let (args, health) = server_args(dir.path(), &pki, "");
    let mut server = Proc::start(
        "konnectivity-server",
        dir.path(),
        Command::new(BIN).args(&args).env_remove("RUST_LOG"),
    );
    let server_log = server.log.clone();
    eventually(
        "the health port",
        || {
            server.alive();
            http_get(health, "/healthz").is_some()
        },
        || std::fs::read_to_string(&server_log).unwrap_or_default(),
    );
    std::fs::write(
        dir.path().join("server.toml"),
        format!(
            "[[frontend]]\nmode = \"grpc\"\nuds_name = \"{}\"\n",
            second.display()
        ),
    )
    .unwrap();
    let status = Command::new("kill")
        .args(["-HUP", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    eventually(
        "the reload",
        || server.output().contains("\"configuration reloaded\""),
        || server.output(),
    );
    let log = server.output();
    assert!(
        log.lines()
            .any(|l| l.contains("needs a restart; keeping the running value")
                && l.contains("setting=\"frontends\"")),
        "{log}"
    );
    assert!(!second.exists(), "a reload binds no new frontend");
    let answer = connect_answer(&dir.path().join("konn.sock"));
    assert!(
        answer.ends_with(NO_AGENT),
        "the first still serves: {answer}"
    );
}
