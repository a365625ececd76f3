//! Agents that stop answering: an agent's connection runs through a relay that can be
//! blackholed (data held, no FIN or RST, as a NAT that dropped its state), and the server must
//! notice by its own PINGs, send a dial waiting on that agent to another one, and retire it.
#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

/// A TCP relay to `target` that forwards until blackholed, then holds every connection open
/// and moves nothing either way.
struct Relay {
    addr: SocketAddr,
    blackholed: watch::Sender<bool>,
    accept: tokio::task::JoinHandle<()>,
}

impl Drop for Relay {
    /// Ends every task of the relay (the pipes see the sender go), so the harness finds the
    /// runtime back at its baseline.
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl Relay {
    async fn start(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (blackholed, state) = watch::channel(false);
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(target).await else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pipe(cr, sw, state.clone()));
                tokio::spawn(pipe(sr, cw, state.clone()));
            }
        });
        Relay {
            addr,
            blackholed,
            accept,
        }
    }

    fn blackhole(&self) {
        self.blackholed.send_replace(true);
    }
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut blackholed: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 << 10];
    loop {
        if *blackholed.borrow() {
            // Hold both sockets until the relay goes.
            while blackholed.changed().await.is_ok() {}
            return;
        }
        tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if *blackholed.borrow() {
                        continue;
                    }
                    if to.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            },
            changed = blackholed.changed() => if changed.is_err() {
                return;
            },
        }
    }
}

/// An agent whose connection goes through `relay`.
async fn agent_via(h: &Harness, relay: &Relay, metadata: &[(&str, &str)]) -> TestAgent {
    let read = |p: &std::path::PathBuf| std::fs::read(p).unwrap();
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read(&h.pki.ca_cert)))
        .identity(Identity::from_pem(
            read(&h.pki.agent_cert),
            read(&h.pki.agent_key),
        ))
        .domain_name("localhost");
    let channel = Endpoint::from_shared(format!("https://{}", relay.addr))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap();
    TestAgent::connect(channel, metadata).await.unwrap()
}

async fn agents_json(h: &Harness) -> Vec<serde_json::Value> {
    let (status, body) = Harness::http_get(h.admin_addr, "/agents").await;
    assert_eq!(status, 200);
    serde_json::from_str(&body).unwrap()
}

/// Short timeouts, so the test takes seconds; the defaults are tried by the fault harness.
const FLAGS: &[&str] = &[
    "--proxy-strategies=destHost,default",
    "--agent-ping-interval=1s",
    "--agent-ping-dial-wait=200ms",
    "--agent-suspect-timeout=500ms",
    "--agent-retire-timeout=3s",
];

#[tokio::test]
async fn a_blackholed_agent_is_suspected_its_dial_sent_elsewhere_and_it_is_retired() {
    let h = Harness::start_with(FLAGS).await;
    let relay = Relay::start(h.agent_addr).await;
    // Agent "a" serves host a (destHost picks it first); "b" serves the rest.
    let mut a = agent_via(
        &h,
        &relay,
        &[("agentid", "a"), ("agentidentifiers", "host=a")],
    )
    .await;
    h.wait_agents(1).await;
    let frontend = h.frontend().await;
    let mut open_through_a = h.establish(&frontend, &mut a, 1, 100).await;
    let mut b = h.agent("b").await;
    h.wait_agents(2).await;

    relay.blackhole();
    let mut tunnel = frontend.open().await;
    tunnel.send(dial_req("a:443", 7)).await;
    // The DIAL_REQ went to "a" and was lost; "a" leaves the server's PING unanswered, is
    // suspected, and the dial comes to "b", with the frontend's own id.
    assert_eq!(b.recv().await, dial_req("a:443", 7));
    assert_eq!(h.metrics().dial.dial_retries("sent"), 1);
    b.send(dial_rsp(7, 200, "")).await;
    assert_eq!(tunnel.recv().await, dial_rsp(7, 200, ""));

    let listed = agents_json(&h).await;
    let a_entry = listed.iter().find(|e| e["agent_id"] == "a").unwrap();
    let b_entry = listed.iter().find(|e| e["agent_id"] == "b").unwrap();
    if h.metrics().backend.unanswered_agent_retirements.get() == 0 {
        assert_eq!(a_entry["suspect"], true, "{a_entry}");
        assert!(a_entry["ping_unanswered_seconds"].as_f64().unwrap() >= 0.5);
        assert_eq!(h.metrics().backend.suspect_agents.get(), 1);
    }
    assert_eq!(b_entry["suspect"], false, "{b_entry}");

    // Retired: the tunnel open through "a" is closed, its frontend told.
    assert_eq!(open_through_a.recv().await, close_rsp(100, ""));
    h.wait_agents(1).await;
    assert_eq!(h.metrics().backend.unanswered_agent_retirements.get(), 1);
    assert_eq!(h.metrics().backend.suspect_agents.get(), 0);

    // The tunnel that moved to "b" carries on.
    tunnel.send(data(200, &b"ping"[..])).await;
    assert_eq!(b.recv().await, data(200, &b"ping"[..]));
    drop(tunnel);
    assert_eq!(b.recv().await, close_req(200));
    b.send(close_rsp(200, "")).await;
    drop(open_through_a);
    drop(frontend);
    h.wait_gauges((0, 0)).await;
    drop(a);
    drop(b);
    drop(relay);
    h.finish().await;
}

#[tokio::test]
async fn an_agent_that_answers_pings_is_never_suspected_though_its_dials_are_slow() {
    let h = Harness::start_with(FLAGS).await;
    let mut a = h.agent("a").await;
    h.wait_agents(1).await;
    let frontend = h.frontend().await;
    let mut tunnel = h.pending_dial(&frontend, &mut a, "10.0.0.1:443", 9).await;
    // Well past the suspect and retire timeouts: the agent answers PINGs (its HTTP/2 layer
    // does), so the slow dial stays where it is.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(h.metrics().backend.suspect_agents.get(), 0);
    assert_eq!(h.metrics().dial.dial_retries("sent"), 0);
    assert_eq!(h.metrics().dial.dial_retries("no_other_agent"), 0);
    assert_eq!(h.metrics().backend.unanswered_agent_retirements.get(), 0);
    let listed = agents_json(&h).await;
    assert!(
        listed[0]["last_ping_answer_seconds_ago"].as_f64().is_some(),
        "{listed:?}"
    );
    a.send(dial_rsp(9, 300, "")).await;
    assert_eq!(tunnel.recv().await, dial_rsp(9, 300, ""));
    drop(tunnel);
    assert_eq!(a.recv().await, close_req(300));
    a.send(close_rsp(300, "")).await;
    drop(frontend);
    h.wait_gauges((0, 0)).await;
    drop(a);
    h.finish().await;
}

#[tokio::test]
async fn with_no_other_agent_a_dial_waits_on_a_suspect_one_until_it_is_retired() {
    let h = Harness::start_with(FLAGS).await;
    let relay = Relay::start(h.agent_addr).await;
    let a = agent_via(&h, &relay, &[("agentid", "a")]).await;
    h.wait_agents(1).await;
    relay.blackhole();
    let frontend = h.frontend().await;
    let mut tunnel = frontend.open().await;
    tunnel.send(dial_req("10.0.0.1:443", 11)).await;
    // Nowhere else to go: counted, then answered when the agent is retired.
    let answer = tunnel.recv().await;
    assert_eq!(
        answer,
        dial_rsp(11, 0, kube_traffic::wire::AGENT_DISCONNECTED_DURING_DIAL)
    );
    assert_eq!(h.metrics().dial.dial_retries("no_other_agent"), 1);
    assert_eq!(h.metrics().backend.unanswered_agent_retirements.get(), 1);
    h.wait_agents(0).await;
    drop(tunnel);
    drop(frontend);
    h.wait_gauges((0, 0)).await;
    assert_eq!(h.metrics().backend.suspect_agents.get(), 0);
    drop(a);
    drop(relay);
    h.finish().await;
}
