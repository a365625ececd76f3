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

use konnectivity_server::tls::DevPki;

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
    notify: UnixDatagram,
    dir: tempfile::TempDir,
    pki: DevPki,
    config: PathBuf,
    agent_port: u16,
    health_port: u16,
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
        let notify_path = dir.path().join("notify.sock");
        let notify = UnixDatagram::bind(&notify_path).unwrap();
        notify.set_read_timeout(Some(WAIT)).unwrap();
        let mut cmd = Command::new(BIN);
        cmd.arg(format!("--config={}", config.display()))
            .env("NOTIFY_SOCKET", &notify_path)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().unwrap();
        Server {
            child,
            notify,
            dir,
            pki,
            config,
            agent_port,
            health_port,
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
            for cert in konnectivity_server::tls::load_certs(ca).unwrap() {
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
                konnectivity_server::tls::load_certs(&cert).unwrap(),
                konnectivity_server::tls::load_key(&key).unwrap(),
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
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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

fn der_of(path: &Path) -> Vec<u8> {
    konnectivity_server::tls::load_certs(path).unwrap()[0].to_vec()
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
        metrics.contains("konnectivity_network_proxy_server_reloads_total{result=\"success\"} 2"),
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
}

#[test]
fn watchdog_pings_at_half_the_interval() {
    let server = Server::start("watch_files = false", &[("WATCHDOG_USEC", "200000")]);
    assert!(server.next_state().starts_with("READY=1"));
    let started = Instant::now();
    let mut pings = 0;
    while pings < 3 {
        if server.next_message().starts_with("WATCHDOG=1") {
            pings += 1;
        }
    }
    // Three pings at 100 ms take at least 200 ms; generous upper bound for a loaded machine.
    assert!(
        started.elapsed() >= Duration::from_millis(150),
        "{:?}",
        started.elapsed()
    );
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
        m.lines()
            .find(|l| {
                l.starts_with("konnectivity_network_proxy_server_reloads_total{result=\"success\"}")
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let before = count(&server.metrics());
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
