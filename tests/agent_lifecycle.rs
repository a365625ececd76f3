//! The agent binary as a service: sd_notify readiness and status, reloads (good and bad)
//! while a tunnel runs, verbosity changing at once, and a drain that ends with exit 0.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod common;

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use kube_traffic::proto::packet::Payload;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const BIN: &str = env!("CARGO_BIN_EXE_konnectivity-agent");

struct Agent {
    child: Child,
    notify: UnixDatagram,
    log: std::path::PathBuf,
    config: std::path::PathBuf,
    health_port: u16,
}

fn free_port() -> u16 {
    loop {
        let port = fastrand::u16(1024..32768);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

impl Agent {
    fn start(h: &Harness, dir: &Path, extra: &str) -> Agent {
        let health_port = free_port();
        let config = dir.join("agent.toml");
        std::fs::write(
            &config,
            format!(
                "ca_cert = {ca:?}\nagent_cert = {cert:?}\nagent_key = {key:?}\n\
                 proxy_server_host = \"127.0.0.1\"\nproxy_server_port = {port}\n\
                 health_server_host = \"127.0.0.1\"\nhealth_server_port = {health_port}\n\
                 admin_server_port = {admin}\nsync_interval = \"100ms\"\nwatch_files = false\n{extra}\n",
                ca = h.pki.ca_cert.display().to_string(),
                cert = h.pki.agent_cert.display().to_string(),
                key = h.pki.agent_key.display().to_string(),
                port = h.agent_addr.port(),
                admin = free_port(),
            ),
        )
        .unwrap();
        let notify_path = dir.join("notify.sock");
        let notify = UnixDatagram::bind(&notify_path).unwrap();
        notify.set_read_timeout(Some(TIMEOUT)).unwrap();
        let log = dir.join("agent.log");
        let child = Command::new(BIN)
            .arg(format!("--config={}", config.display()))
            .env("NOTIFY_SOCKET", &notify_path)
            .env_remove("RUST_LOG")
            .env_remove("PROXY_AGENT_ID")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Agent {
            child,
            notify,
            log,
            config,
            health_port,
        }
    }

    /// Waits up to `within` for a message that starts with `prefix`.
    fn expect_message(&self, prefix: &str, within: Duration) -> String {
        tokio::task::block_in_place(|| {
            let deadline = std::time::Instant::now() + within;
            let mut seen = Vec::new();
            while std::time::Instant::now() < deadline {
                self.notify
                    .set_read_timeout(Some(deadline - std::time::Instant::now()))
                    .unwrap();
                let mut buf = [0u8; 4096];
                let Ok(n) = self.notify.recv(&mut buf) else {
                    break;
                };
                let message = String::from_utf8_lossy(&buf[..n]).into_owned();
                if message.starts_with(prefix) {
                    self.notify.set_read_timeout(Some(TIMEOUT)).unwrap();
                    return message;
                }
                seen.push(message);
            }
            panic!("no {prefix:?} within {within:?}; saw {seen:?}");
        })
    }

    /// The next message that is not a periodic STATUS refresh.
    fn next_state(&self) -> String {
        tokio::task::block_in_place(|| loop {
            let mut buf = [0u8; 4096];
            let n = self.notify.recv(&mut buf).expect("an sd_notify message");
            let message = String::from_utf8_lossy(&buf[..n]).into_owned();
            if !(message.starts_with("STATUS=") || message.starts_with("WATCHDOG=1")) {
                return message;
            }
        })
    }

    fn signal(&self, name: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap()
            .success();
        assert!(ok);
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn wait_exit(&mut self) -> i32 {
        let deadline = std::time::Instant::now() + TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code().unwrap_or(-1);
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the agent did not exit:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let log = self.log();
        assert!(!log.contains("panicked"), "the agent panicked:\n{log}");
    }
}

async fn echo_server() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                while let Ok(n) = conn.read(&mut buf).await {
                    if n == 0 || conn.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

async fn echo(tunnel: &mut Tunnel, connect_id: i64, text: &[u8]) {
    tunnel.send(data(connect_id, text.to_vec())).await;
    let mut got = Vec::new();
    while got.len() < text.len() {
        match tunnel.recv().await.payload {
            Some(Payload::Data(d)) => got.extend_from_slice(&d.data),
            other => panic!("expected DATA, got {other:?}"),
        }
    }
    assert_eq!(got, text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_reloads_with_a_live_tunnel_and_a_drain_that_exits_zero() {
    let h = Harness::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut agent = Agent::start(&h, dir.path(), "graceful_shutdown_timeout = \"20s\"");
    let ready = agent.next_state();
    assert!(ready.starts_with("READY=1\nSTATUS="), "{ready:?}");
    // Told at once when the server connects, not at the next heartbeat (10 s here).
    if !ready.contains("STATUS=connected") {
        agent.expect_message("STATUS=connected to 1 servers", Duration::from_secs(3));
    }
    h.wait_agents(1).await;
    eventually(
        "the agent's /readyz",
        || {
            std::net::TcpStream::connect(("127.0.0.1", agent.health_port)).is_ok()
                && agent
                    .log()
                    .contains("successfully connected to new proxy server")
        },
        || agent.log(),
    )
    .await;

    let echo_addr = echo_server().await;
    let frontend = h.frontend().await;
    let mut tunnel = frontend.open().await;
    tunnel.send(dial_req(&echo_addr.to_string(), 1)).await;
    let connect_id = match tunnel.recv().await.payload {
        Some(Payload::DialResponse(r)) if r.error.is_empty() => r.connect_id,
        other => panic!("expected a DIAL_RSP, got {other:?}"),
    };
    echo(&mut tunnel, connect_id, b"before").await;
    assert!(
        !agent.log().contains("received data from remote"),
        "a V5 line at -v=4"
    );

    // A reload to -v=5 applies at once; the tunnel carries on.
    let good = std::fs::read_to_string(&agent.config).unwrap();
    std::fs::write(&agent.config, format!("{good}v = 5\n")).unwrap();
    agent.signal("HUP");
    let reloading = agent.next_state();
    assert!(
        reloading.starts_with("RELOADING=1\nMONOTONIC_USEC="),
        "{reloading:?}"
    );
    let ready = agent.next_state();
    assert!(
        ready.starts_with("READY=1\nSTATUS=connected to 1 servers, 1 tunnels"),
        "{ready:?}"
    );
    echo(&mut tunnel, connect_id, b"after a reload").await;
    eventually(
        "a V5 line after the reload to -v=5",
        || agent.log().contains("received data from remote"),
        || agent.log(),
    )
    .await;

    // A broken file keeps the running configuration, and says why.
    std::fs::write(&agent.config, format!("{good}sync_intervall = \"1s\"\n")).unwrap();
    agent.signal("HUP");
    let _reloading = agent.next_state();
    let failed = agent.next_state();
    assert!(
        failed.contains("STATUS=reload failed: config file"),
        "{failed:?}"
    );
    assert!(
        failed.contains("sync_intervall"),
        "names the key: {failed:?}"
    );
    eventually(
        "the RELOAD FAILED line (lines are written in batches)",
        || agent.log().contains("RELOAD FAILED"),
        || agent.log(),
    )
    .await;
    echo(&mut tunnel, connect_id, b"after a failed reload").await;

    // SIGTERM: DRAIN, the tunnel carries on; the agent exits 0 once it has ended.
    agent.signal("TERM");
    let stopping = agent.next_state();
    assert!(stopping.starts_with("STOPPING=1"), "{stopping:?}");
    echo(&mut tunnel, connect_id, b"while draining").await;
    eventually(
        "the server to see the agent draining",
        || agent.log().contains("drain agent client"),
        || agent.log(),
    )
    .await;
    tunnel.send(close_req(connect_id)).await;
    assert_eq!(agent.wait_exit(), 0, "{}", agent.log());
    drop(tunnel);
    h.wait_gauges((0, 0)).await;
}
