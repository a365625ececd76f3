//! The service lifecycle through the real binary: sd_notify messages, reload by signal and by
//! file change, certificate rotation, and stop.
#![allow(clippy::unwrap_used)] // tests and benchmarks fail loudly by design

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube_traffic::tls::DevPki;

const BIN: &str = env!("CARGO_BIN_EXE_konnectivity-server");
const WAIT: Duration = Duration::from_secs(15);

/// A free port in [1024, 32767]: upstream refuses ports above 49151, and the kernel hands out
/// ephemeral ports from 32768, so ports below that do not collide with outgoing connections.
fn free_port() -> u16 {
    loop {
        let port = fastrand::u16(1024..32768);
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

struct Server {
    child: Child,
    /// The server's stderr (its log), checked for panics when the test ends. Kept out of
    /// `dir`: that directory is watched, and a log written there on every refused handshake
    /// keeps the watcher's debounce from settling.
    log: PathBuf,
    _log_dir: tempfile::TempDir,
    notify: UnixDatagram,
    dir: tempfile::TempDir,
    pki: DevPki,
    config: PathBuf,
    agent_port: u16,
    health_port: u16,
    exit_expected: bool,
}

fn config_text(
    dir: &Path,
    pki: &DevPki,
    agent: u16,
    health: u16,
    admin: u16,
    extra: &str,
) -> String {
    format!(
        "uds_name = \"{uds}\"\nserver_port = 0\nagent_bind_address = \"127.0.0.1\"\nagent_port = {agent}\n\
         health_bind_address = \"127.0.0.1\"\nhealth_port = {health}\nadmin_port = {admin}\n\
         cluster_cert = \"{cert}\"\ncluster_key = \"{key}\"\ncluster_ca_cert = \"{ca}\"\n{extra}\n",
        uds = dir.join("konn.sock").display(),
        cert = dir.join("cluster.crt").display(),
        key = dir.join("cluster.key").display(),
        ca = pki.ca_cert.display(),
    )
}

impl Server {
    fn start(extra_config: &str, extra_env: &[(&str, &str)]) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let (pki, _) = DevPki::ensure(&dir.path().join("pki")).unwrap();
        std::fs::copy(&pki.server_cert, dir.path().join("cluster.crt")).unwrap();
        std::fs::copy(&pki.server_key, dir.path().join("cluster.key")).unwrap();
        let (agent_port, health_port, admin_port) = (free_port(), free_port(), free_port());
        let config = dir.path().join("server.toml");
        std::fs::write(
            &config,
            config_text(
                dir.path(),
                &pki,
                agent_port,
                health_port,
                admin_port,
                extra_config,
            ),
        )
        .unwrap();
        let log_dir = tempfile::tempdir().unwrap();
        let log = log_dir.path().join("server.log");
        let notify_path = dir.path().join("notify.sock");
        let notify = UnixDatagram::bind(&notify_path).unwrap();
        notify.set_read_timeout(Some(WAIT)).unwrap();
        let mut cmd = Command::new(BIN);
        cmd.arg(format!("--config={}", config.display()))
            .env("NOTIFY_SOCKET", &notify_path)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().unwrap();
        Server {
            child,
            log,
            _log_dir: log_dir,
            notify,
            dir,
            pki,
            config,
            agent_port,
            health_port,
            exit_expected: false,
        }
    }

    fn next_message(&self) -> String {
        let mut buf = [0u8; 4096];
        let n = self
            .notify
            .recv(&mut buf)
            .expect("an sd_notify message within the deadline");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    /// The next message that is not a periodic STATUS/WATCHDOG refresh.
    fn next_state(&self) -> String {
        loop {
            let message = self.next_message();
            if !(message.starts_with("STATUS=") || message.starts_with("WATCHDOG=1")) {
                return message;
            }
        }
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }

    fn wait_exit(&mut self) -> i32 {
        self.exit_expected = true;
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code().unwrap_or(-1);
            }
            assert!(Instant::now() < deadline, "server did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn metrics(&self) -> String {
        http_get(self.health_port, "/metrics").1
    }

    /// The leaf certificate the agent port presents to a fresh handshake.
    fn presented_certificate(&self, trusted: &[&Path]) -> Vec<u8> {
        let mut roots = rustls::RootCertStore::empty();
        for ca in trusted {
            for cert in kube_traffic::tls::load_certs(ca).unwrap() {
                roots.add(cert).unwrap();
            }
        }
        let (cert, key) = (self.pki.agent_cert.clone(), self.pki.agent_key.clone());
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_client_auth_cert(
                kube_traffic::tls::load_certs(&cert).unwrap(),
                kube_traffic::tls::load_key(&key).unwrap(),
            )
            .unwrap();
        let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
        let mut conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
        let mut sock = TcpStream::connect(("127.0.0.1", self.agent_port)).unwrap();
        sock.set_read_timeout(Some(WAIT)).unwrap();
        while conn.is_handshaking() {
            conn.complete_io(&mut sock).unwrap();
        }
        conn.peer_certificates().unwrap()[0].to_vec()
    }

    /// Connects to the agent port as an agent does (ALPN h2, trusting `trusted` for the
    /// server), with `identity` as the client certificate and key (None: no certificate),
    /// sends the HTTP/2 preface and an empty SETTINGS frame, and returns Ok once the server
    /// answers with bytes (its SETTINGS). A refusal is a handshake error, an alert or EOF;
    /// under TLS 1.3 the client's handshake completes before the server has checked the
    /// client certificate, so the refusal often shows only on the read.
    fn agent_port_outcome(
        &self,
        identity: Option<&(PathBuf, PathBuf)>,
        trusted: &[&Path],
    ) -> Result<(), String> {
        use kube_traffic::tls::{load_certs, load_key};
        let mut roots = rustls::RootCertStore::empty();
        for ca in trusted {
            for cert in load_certs(ca).unwrap() {
                roots.add(cert).unwrap();
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let mut config = match identity {
            Some((cert, key)) => builder
                .with_client_auth_cert(load_certs(cert).unwrap(), load_key(key).unwrap())
                .unwrap(),
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
        let mut conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
        let mut sock = TcpStream::connect(("127.0.0.1", self.agent_port)).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut tls = rustls::Stream::new(&mut conn, &mut sock);
        tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
            .map_err(|e| format!("write: {e}"))?;
        let mut buf = [0u8; 64];
        match tls.read(&mut buf) {
            Ok(0) => Err("EOF".into()),
            Ok(_) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                panic!("the agent port neither answered nor refused within 5 s")
            }
            Err(e) => Err(format!("read: {e}")),
        }
    }
}

impl Drop for Server {
    /// Stops the server. A test that passed still fails if the server's log shows a panic (a
    /// panicking task does not end the process) or the server died before the test ended it;
    /// a failing test gets the log printed.
    fn drop(&mut self) {
        let died = self.child.try_wait().ok().flatten();
        let _ = self.child.kill();
        let _ = self.child.wait();
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        if std::thread::panicking() {
            eprintln!("---- server log ({}) ----\n{log}", self.log.display());
            return;
        }
        assert!(!log.contains("panicked at"), "the server panicked:\n{log}");
        if let Some(status) = died {
            assert!(
                self.exit_expected,
                "the server exited ({status}) before the test ended it:\n{log}"
            );
        }
    }
}

fn http_get(port: u16, path: &str) -> (u16, String) {
    let mut sock = TcpStream::connect(("127.0.0.1", port)).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
    write!(
        sock,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    sock.read_to_string(&mut text).unwrap();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

/// The value of one series (`name{labels}` exactly as exposed); fails when it is absent, so a
/// renamed or missing metric cannot pass as 0.
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("series {series} is missing from /metrics:\n{text}"))
        .parse()
        .unwrap_or_else(|e| panic!("series {series}: {e}"))
}

fn der_of(path: &Path) -> Vec<u8> {
    kube_traffic::tls::load_certs(path).unwrap()[0].to_vec()
}

fn assert_reload_pair(server: &Server) -> String {
    let reloading = server.next_state();
    assert!(
        reloading.starts_with("RELOADING=1\nMONOTONIC_USEC="),
        "{reloading:?}"
    );
    let ready = server.next_state();
    assert!(ready.starts_with("READY=1\nSTATUS="), "{ready:?}");
    ready
}

#[test]
fn notify_sequence_for_start_reload_failed_reload_and_stop() {
    let mut server = Server::start("watch_files = false", &[]);
    let ready = server.next_state();
    assert_eq!(ready, "READY=1\nSTATUS=serving: 0 agents, 0 tunnels\n");

    server.signal("HUP");
    let ready = assert_reload_pair(&server);
    assert!(ready.contains("STATUS=serving"), "{ready:?}");

    // The announced server count follows the configuration (1 by default, then 3).
    let count = |server: &Server| {
        metric(
            &server.metrics(),
            "konnectivity_network_proxy_server_announced_servers",
        )
    };
    assert_eq!(count(&server), 1.0);
    let good = std::fs::read_to_string(&server.config).unwrap();
    std::fs::write(&server.config, format!("{good}\nserver_count = 3\n")).unwrap();
    server.signal("HUP");
    assert!(assert_reload_pair(&server).contains("STATUS=serving"));
    assert_eq!(count(&server), 3.0);
    let good = std::fs::read_to_string(&server.config).unwrap();
    std::fs::write(&server.config, format!("{good}\nagnet_port = 1\n")).unwrap();
    server.signal("HUP");
    let failed = assert_reload_pair(&server);
    assert!(
        failed.contains("STATUS=reload failed: config file"),
        "{failed:?}"
    );
    assert!(
        failed.contains("agnet_port"),
        "the cause names the key: {failed:?}"
    );
    // Still serving, and the next valid reload applies.
    assert_eq!(http_get(server.health_port, "/healthz"), (200, "ok".into()));
    std::fs::write(&server.config, &good).unwrap();
    server.signal("HUP");
    assert!(assert_reload_pair(&server).contains("STATUS=serving"));
    let metrics = server.metrics();
    assert!(
        metrics.contains("konnectivity_network_proxy_server_reloads_total{result=\"success\"} 3"),
        "{metrics}"
    );
    assert!(
        metrics.contains("konnectivity_network_proxy_server_reloads_total{result=\"failure\"} 1"),
        "{metrics}"
    );

    server.signal("TERM");
    let stopping = server.next_state();
    assert!(stopping.starts_with("STOPPING=1"), "{stopping:?}");
    assert_eq!(server.wait_exit(), 0);
    // Log lines are written by a thread in batches: what it held at exit was written too, up
    // to the last line the server logs.
    let log = std::fs::read_to_string(&server.log).unwrap();
    let last = log.lines().last().unwrap_or_default();
    assert!(
        last.ends_with("] \"stopped\""),
        "the last line is the server's last: {last:?}"
    );
}

#[test]
fn watchdog_pings_at_half_the_interval() {
    // WatchdogSec=1s: pings every 500 ms. Each gap must stay under the watchdog interval
    // itself (systemd would kill the service otherwise), and not come much faster than half.
    let interval = Duration::from_secs(1);
    let server = Server::start("watch_files = false", &[("WATCHDOG_USEC", "1000000")]);
    assert!(server.next_state().starts_with("READY=1"));
    let deadline = Instant::now() + 5 * interval;
    let mut last = Instant::now();
    let mut gaps = Vec::new();
    while gaps.len() < 4 {
        assert!(
            Instant::now() < deadline,
            "only {} WATCHDOG=1 pings in {:?} (gaps {gaps:?})",
            gaps.len(),
            5 * interval
        );
        // Bounded by the socket's read timeout: a server that sends nothing fails here.
        let message = server.next_message();
        if message.contains("WATCHDOG=1") {
            let now = Instant::now();
            gaps.push(now - last);
            last = now;
        }
    }
    // The first gap runs from READY=1, which need not be a ping time.
    for gap in &gaps[1..] {
        assert!(
            *gap >= interval * 3 / 10 && *gap < interval,
            "WATCHDOG=1 gaps {gaps:?}: each must be about half of {interval:?} and below it"
        );
    }
}

#[test]
fn certificate_renamed_into_place_is_served_without_a_signal() {
    let server = Server::start("", &[]);
    assert!(server.next_state().starts_with("READY=1"));
    let old_ca = server.pki.ca_cert.clone();
    assert_eq!(
        server.presented_certificate(&[&old_ca]),
        der_of(&server.dir.path().join("cluster.crt"))
    );

    // A new certificate and key, written beside and renamed into place.
    let (next, _) = DevPki::ensure(&server.dir.path().join("next")).unwrap();
    let dir = server.dir.path();
    std::fs::copy(&next.server_cert, dir.join("cluster.crt.new")).unwrap();
    std::fs::copy(&next.server_key, dir.join("cluster.key.new")).unwrap();
    std::fs::rename(dir.join("cluster.key.new"), dir.join("cluster.key")).unwrap();
    std::fs::rename(dir.join("cluster.crt.new"), dir.join("cluster.crt")).unwrap();

    let expected = der_of(&next.server_cert);
    let deadline = Instant::now() + WAIT;
    loop {
        let presented = server.presented_certificate(&[&old_ca, &next.ca_cert]);
        if presented == expected {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new certificate was never presented"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // A read of the files must not trigger reloads (inotify access events): the success count
    // stays put over a quiet period with reads going on.
    let count = |m: &str| {
        metric(
            m,
            "konnectivity_network_proxy_server_reloads_total{result=\"success\"}",
        )
    };
    let before = count(&server.metrics());
    assert!(before >= 1.0, "the rename above reloaded: {before}");
    for _ in 0..5 {
        let _ = std::fs::read(dir.join("cluster.crt"));
        let _ = std::fs::read(&server.config);
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(
        count(&server.metrics()),
        before,
        "reading files must not reload"
    );
}

/// Replaces `path` by a copy of `from`, written beside it and renamed into place.
fn rename_into_place(from: &Path, path: &Path) {
    let tmp = path.with_extension("new");
    std::fs::copy(from, &tmp).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn poll_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn agent_port_enforces_client_certificates_at_start_and_after_every_kind_of_reload() {
    let server = Server::start("", &[]);
    assert!(server.next_state().starts_with("READY=1"));
    let dir = server.dir.path();
    let ca = server.pki.ca_cert.clone();
    // An agent certificate from another CA (DevPki makes a fresh CA per directory).
    let (foreign, _) = DevPki::ensure(&dir.join("foreign")).unwrap();
    let own = (server.pki.agent_cert.clone(), server.pki.agent_key.clone());
    let other = (foreign.agent_cert.clone(), foreign.agent_key.clone());
    let expect = |when: &str,
                  trusted: &[&Path],
                  accepted: &(PathBuf, PathBuf),
                  refused: &(PathBuf, PathBuf)| {
        assert_eq!(
            server.agent_port_outcome(Some(accepted), trusted),
            Ok(()),
            "{when}: the cluster CA's agent certificate must be accepted"
        );
        let none = server.agent_port_outcome(None, trusted);
        assert!(
            none.is_err(),
            "{when}: a client without a certificate got HTTP/2 bytes"
        );
        let wrong = server.agent_port_outcome(Some(refused), trusted);
        assert!(
            wrong.is_err(),
            "{when}: a certificate from another CA got HTTP/2 bytes"
        );
    };
    expect("at start", &[&ca], &own, &other);

    // SIGHUP: every layer re-read, the TLS configuration rebuilt.
    server.signal("HUP");
    let mut ready = assert_reload_pair(&server);
    // (The file watcher may report a reload of its own first; skip to the SIGHUP's.)
    while !ready.contains("STATUS=serving") {
        ready = assert_reload_pair(&server);
    }
    expect("after SIGHUP", &[&ca], &own, &other);

    // File watch, certificate: a new serving certificate and key renamed into place.
    let (next, _) = DevPki::ensure(&dir.join("next")).unwrap();
    rename_into_place(&next.server_key, &dir.join("cluster.key"));
    rename_into_place(&next.server_cert, &dir.join("cluster.crt"));
    let new_cert = der_of(&next.server_cert);
    poll_until("the renamed certificate to be served", || {
        server.presented_certificate(&[&ca, &next.ca_cert]) == new_cert
    });
    expect(
        "after the file-watch reload of the certificate",
        &[&ca, &next.ca_cert],
        &own,
        &other,
    );

    // File watch, CA: the other CA becomes the cluster CA; the verifier must follow it.
    rename_into_place(&foreign.ca_cert, &ca);
    poll_until("the rotated cluster CA to accept its agent", || {
        server
            .agent_port_outcome(Some(&other), &[&ca, &next.ca_cert])
            .is_ok()
    });
    expect(
        "after the file-watch reload of the cluster CA",
        &[&next.ca_cert],
        &other,
        &own,
    );
}

#[test]
fn log_file_is_written_and_starts_over_at_its_cap() {
    let logs = tempfile::tempdir().unwrap();
    let path = logs.path().join("server.log");
    // 1 MiB (--log-file-max-size=1) less a little: the server's first lines cross the cap.
    let prefill = vec![b'x'; (1 << 20) - 64];
    std::fs::write(&path, &prefill).unwrap();
    let server = Server::start(
        &format!(
            "logtostderr = false\nlog_file = \"{}\"\nlog_file_max_size = 1\nwatch_files = false",
            path.display()
        ),
        &[],
    );
    assert!(server.next_state().starts_with("READY=1"));
    poll_until("the log file to start over", || {
        std::fs::read(&path).is_ok_and(|b| !b.is_empty() && b[0] != b'x')
    });
    let text = std::fs::read(&path).unwrap();
    assert!(
        text.len() < 1 << 20,
        "the file stays under its cap: {} bytes",
        text.len()
    );
    assert!(
        !text.windows(64).any(|w| w.iter().all(|&c| c == b'x')),
        "the prefill is gone"
    );
    let text = String::from_utf8_lossy(&text);
    assert!(
        text.contains("konnectivity-server is serving"),
        "the server's own start line is in the file:\n{text}"
    );
}

/// Socket activation with systemd's own tool: `systemd-socket-activate` binds the frontend
/// socket, launches the server on the first connection and passes the socket as `frontend`.
/// The server must serve that connection (it waited in the backlog), say it took the passed
/// socket, bind its other ports itself, and leave the socket file to its owner at exit.
#[test]
fn socket_activation_serves_the_passed_socket_and_leaves_it_to_its_owner() {
    use std::os::unix::net::UnixStream;
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
    let sock = dir.path().join("konn.sock");
    let log = dir.path().join("server.log");
    let health = free_port();
    let args = [
        "--config=".to_string(),
        "--mode=http-connect".into(),
        format!("--uds-name={}", sock.display()),
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
    ];
    struct Kill(Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = Kill(
        Command::new(tool)
            .arg(format!("--listen={}", sock.display()))
            .arg("--fdname=frontend")
            .arg(BIN)
            .args(&args)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    poll_until("the socket bound by systemd-socket-activate", || {
        sock.exists()
    });
    // The first connection launches the server; it waits in the backlog until served.
    let mut conn = UnixStream::connect(&sock).unwrap();
    conn.set_read_timeout(Some(WAIT)).unwrap();
    conn.write_all(b"CONNECT 127.0.0.1:9 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 500") && answer.ends_with("No agent available"),
        "{answer}"
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("using the socket passed by systemd"),
        "{text}"
    );
    assert_eq!(
        http_get(health, "/healthz").0,
        200,
        "the health port is bound by the server"
    );
    // systemd-socket-activate execs the server in its own process.
    let status = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + WAIT;
    let code = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status.code();
        }
        assert!(Instant::now() < deadline, "the server did not stop");
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(code, Some(0), "{text}");
    assert!(!text.contains("panicked at"), "{text}");
    assert!(
        sock.exists(),
        "a socket passed by systemd stays: its owner removes it"
    );
}
