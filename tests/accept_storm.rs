//! Descriptor exhaustion on every listening port of both programs: each port logs one line
//! when its accepts start failing and one when they work again, however many retries fail
//! in between, and then serves the connections that waited.
//!
//! A test binary of its own, since it lowers the process's descriptor limit. The exhaustion
//! is real: clients' sockets are created first, the rest of the descriptor table is filled,
//! and then the clients connect (which needs no descriptor), so each connection waits in its
//! port's backlog while every accept fails with EMFILE.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use clap::Parser;
use common::*;
use kube_traffic::agent::{self, AgentConfig, AgentListeners, AgentOptions, Snapshot};
use socket2::{Domain, SockAddr, Socket, Type};
use tokio::net::TcpListener;

/// Everything the process logs, as text.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// Lines with `message` that name `port`.
    fn count(&self, message: &str, port: &str) -> usize {
        let text = String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned();
        text.lines()
            .filter(|l| l.contains(message) && l.contains(&format!("listener=\"{port}\"")))
            .count()
    }
}

const FAILED: &str = "accept failed; backing off";
const AGAIN: &str = "accept failed again";
const RECOVERED: &str = "accepting again after failures";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emfile_storm_is_logged_once_per_episode_on_every_port() {
    let logs = Captured::default();
    let writer = logs.clone();
    tracing_subscriber::fmt()
        .with_env_filter("warn,kube_traffic::accept=debug")
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .init();

    let h = Harness::start().await;
    let bind = || TcpListener::bind("127.0.0.1:0");
    let (agent_health, agent_admin) = (bind().await.unwrap(), bind().await.unwrap());
    let agent_ports = (
        agent_health.local_addr().unwrap(),
        agent_admin.local_addr().unwrap(),
    );
    let args = h.agent_args("storm");
    let config = AgentConfig::from_options(&AgentOptions::try_parse_from(args).unwrap()).unwrap();
    let running = agent::spawn(
        Snapshot::build(config).unwrap(),
        AgentListeners {
            health: agent_health,
            admin: agent_admin,
        },
    );
    h.wait_agents(1).await;

    // (port name in the logs, where it listens, a client socket made before the exhaustion).
    let tcp = |addr: std::net::SocketAddr| {
        (
            Socket::new(Domain::IPV4, Type::STREAM, None).unwrap(),
            SockAddr::from(addr),
        )
    };
    let mut ports = vec![
        ("the agent port", tcp(h.agent_addr)),
        ("the health port", tcp(h.health_addr)),
        ("the admin port", tcp(h.admin_addr)),
        ("the health port", tcp(agent_ports.0)),
        ("the admin port", tcp(agent_ports.1)),
    ];
    ports.push((
        "the frontend socket",
        (
            Socket::new(Domain::UNIX, Type::STREAM, None).unwrap(),
            SockAddr::unix(&h.uds).unwrap(),
        ),
    ));

    // Fill the descriptor table, under a limit a little above what is open now.
    let (soft, hard) = rlimit::Resource::NOFILE.get().unwrap();
    rlimit::Resource::NOFILE
        .set(open_fds() as u64 + 32, hard)
        .unwrap();
    let mut filler = Vec::new();
    loop {
        match std::fs::File::open("/dev/null") {
            Ok(f) => filler.push(f),
            Err(e) if e.raw_os_error() == Some(libc::EMFILE) => break,
            Err(e) => panic!("filling the descriptor table: {e}"),
        }
    }
    for (_, (socket, addr)) in &ports {
        socket.connect(addr).unwrap();
    }

    // Two ports of each name (the server's and the agent's health and admin ports) each log
    // their own episode; every port retries several times meanwhile.
    let expected = |port: &str| {
        if port.contains("health") || port.contains("admin") {
            2
        } else {
            1
        }
    };
    for (port, _) in &ports {
        eventually(
            &format!("{port} to retry its accepts several times"),
            || logs.count(AGAIN, port) >= 3 * expected(port),
            || format!("{} retries logged", logs.count(AGAIN, port)),
        )
        .await;
    }
    for (port, _) in &ports {
        assert_eq!(
            logs.count(FAILED, port),
            expected(port),
            "{port}: one warning per port per episode"
        );
    }

    // Descriptors again: every port accepts and says so once, and serves.
    drop(filler);
    rlimit::Resource::NOFILE.set(soft, hard).unwrap();
    for (port, _) in &ports {
        eventually(
            &format!("{port} to accept again"),
            || logs.count(RECOVERED, port) == expected(port),
            || format!("{} recoveries logged", logs.count(RECOVERED, port)),
        )
        .await;
        assert_eq!(logs.count(FAILED, port), expected(port), "{port}");
    }
    let (status, _) = Harness::http_get(h.health_addr, "/healthz").await;
    assert_eq!(status, 200);
    let (status, _) = Harness::http_get(agent_ports.0, "/healthz").await;
    assert_eq!(status, 200);
    let frontend = h.frontend().await;
    drop(frontend);

    drop(ports);
    running.stop().await;
    h.finish().await;
}
