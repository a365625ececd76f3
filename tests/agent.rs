//! The agent in-process, against our server in-process: real sockets, real TLS, real
//! destinations. The upstream server and agents run against it in tests/interop.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod common;

use std::time::Duration;

use clap::Parser;
use common::*;
use kube_traffic::agent::{
    self, AgentConfig, AgentListeners, AgentOptions, RunningAgent, Snapshot,
};
use kube_traffic::proto::packet::Payload;
use kube_traffic::proto::Packet;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Starts our agent against `h`'s agent port; `extra` are more flags.
async fn start_agent(h: &Harness, id: &str, extra: &[&str]) -> RunningAgent {
    let mut args = h.agent_args(id);
    args.extend([
        "--sync-interval=100ms".into(),
        "--sync-interval-cap=1s".into(),
    ]);
    args.extend(extra.iter().map(|s| s.to_string()));
    let options = AgentOptions::try_parse_from(&args).expect("agent flags parse");
    let config = AgentConfig::from_options(&options).expect("agent flags validate");
    let snapshot = Snapshot::build(config).expect("agent TLS loads");
    let bind = || TcpListener::bind("127.0.0.1:0");
    let listeners = AgentListeners {
        health: bind().await.unwrap(),
        admin: bind().await.unwrap(),
    };
    let running = agent::spawn(snapshot, listeners);
    eventually(
        "the agent to connect",
        || running.connected_servers() == 1,
        || format!("{} servers", running.connected_servers()),
    )
    .await;
    h.wait_agents(1).await;
    running
}

/// A destination that echoes every byte back.
async fn echo_server() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if conn.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    addr
}

/// A destination that accepts and never reads, with a small receive buffer.
async fn sink_that_never_reads() -> (
    std::net::SocketAddr,
    tokio::sync::mpsc::Receiver<tokio::net::TcpStream>,
) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = socket.local_addr().unwrap();
    let listener = socket.listen(16).unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            // Held, never read.
            if tx.send(conn).await.is_err() {
                return;
            }
        }
    });
    (addr, rx)
}

fn dial_rsp_of(packet: &Packet) -> (i64, i64, String) {
    match &packet.payload {
        Some(Payload::DialResponse(r)) => (r.random, r.connect_id, r.error.clone()),
        other => panic!("expected DIAL_RSP, got {other:?}"),
    }
}

/// Dials `address` through the server and the agent; returns the tunnel and its connect id.
async fn dial(frontend: &Frontend, address: &str, random: i64) -> (Tunnel, i64) {
    let mut tunnel = frontend.open().await;
    tunnel.send(dial_req(address, random)).await;
    let (got_random, connect_id, error) = dial_rsp_of(&tunnel.recv().await);
    assert_eq!(got_random, random);
    assert_eq!(error, "", "the dial to {address} succeeds");
    assert!(connect_id > 0);
    (tunnel, connect_id)
}

async fn echo_once(tunnel: &mut Tunnel, connect_id: i64, payload: &[u8]) {
    tunnel.send(data(connect_id, payload.to_vec())).await;
    let mut got = Vec::new();
    while got.len() < payload.len() {
        match tunnel.recv().await.payload {
            Some(Payload::Data(d)) => got.extend_from_slice(&d.data),
            other => panic!("expected DATA, got {other:?}"),
        }
    }
    assert_eq!(got, payload);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_through_our_agent_carries_data_and_closes_cleanly() {
    let h = Harness::start().await;
    let agent = start_agent(&h, "rust-agent", &[]).await;
    let echo = echo_server().await;
    let frontend = h.frontend().await;
    let (mut tunnel, connect_id) = dial(&frontend, &echo.to_string(), 11).await;
    assert_eq!(
        connect_id, 1,
        "connection ids start at 1 per stream, as upstream"
    );
    for size in [1usize, 1000, 100_000] {
        let payload: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        echo_once(&mut tunnel, connect_id, &payload).await;
    }
    assert_eq!(agent.tunnels(), 1);
    tunnel.send(close_req(connect_id)).await;
    let packet = tunnel.recv().await;
    assert!(
        matches!(&packet.payload, Some(Payload::CloseResponse(c)) if c.connect_id == connect_id && c.error.is_empty()),
        "{packet:?}"
    );
    h.wait_gauges((0, 0)).await;
    eventually(
        "the agent's tunnel table to empty",
        || agent.tunnels() == 0 && agent.metrics().open_endpoints() == 0,
        || {
            format!(
                "{} tunnels, gauge {}",
                agent.tunnels(),
                agent.metrics().open_endpoints()
            )
        },
    )
    .await;
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_dial_answers_with_gos_error_text_and_counts_it() {
    let h = Harness::start().await;
    let agent = start_agent(&h, "rust-agent", &[]).await;
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let frontend = h.frontend().await;
    let mut tunnel = frontend.open().await;
    tunnel.send(dial_req(&closed.to_string(), 5)).await;
    let (random, connect_id, error) = dial_rsp_of(&tunnel.recv().await);
    assert_eq!((random, connect_id), (5, 0));
    assert_eq!(
        error,
        format!("dial tcp {closed}: connect: connection refused")
    );
    assert_eq!(agent.metrics().dial_failures("unknown"), 1);
    assert_eq!(agent.metrics().dial_failures("timeout"), 0);
    h.wait_gauges((0, 0)).await;
    agent.stop().await;
}

/// Upstream's worst bug: one destination that stops reading stops every tunnel on the agent.
/// Here it is closed alone, and its neighbour never notices.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destination_that_never_reads_is_closed_alone() {
    let h = Harness::start().await;
    let agent = start_agent(&h, "rust-agent", &["--endpoint-queue-limit-bytes=262144"]).await;
    let echo = echo_server().await;
    let (sink, _held) = sink_that_never_reads().await;
    let frontend = h.frontend().await;
    let (mut neighbour, neighbour_id) = dial(&frontend, &echo.to_string(), 1).await;
    let (mut stalled, stalled_id) = dial(&frontend, &sink.to_string(), 2).await;
    // Far more than the kernel's buffers and the queue's hard limit (1 MiB) together.
    let chunk = vec![7u8; 32 * 1024];
    let mut closed_with = None;
    for i in 0..512 {
        if !stalled.try_send(data(stalled_id, chunk.clone())).await {
            break;
        }
        // The neighbour's echo goes through the same agent stream all along.
        if i % 16 == 0 {
            echo_once(&mut neighbour, neighbour_id, b"ping").await;
        }
        if let Ok(packet) = tokio::time::timeout(Duration::from_millis(1), stalled.recv()).await {
            closed_with = Some(packet);
            break;
        }
    }
    let packet = match closed_with {
        Some(packet) => packet,
        None => stalled.recv().await,
    };
    match &packet.payload {
        Some(Payload::CloseResponse(c)) => {
            assert_eq!(c.connect_id, stalled_id);
            assert_eq!(c.error, wire::ENDPOINT_QUEUE_OVERFLOW);
        }
        other => panic!("expected CLOSE_RSP, got {other:?}"),
    }
    assert_eq!(
        agent
            .metrics()
            .queue_closes(agent::metrics::QueueClose::Overflow),
        1
    );
    // The neighbour carries on, and a fresh dial works.
    echo_once(&mut neighbour, neighbour_id, b"still here").await;
    let (mut fresh, fresh_id) = dial(&frontend, &echo.to_string(), 3).await;
    echo_once(&mut fresh, fresh_id, b"fresh").await;
    eventually(
        "the closed tunnel's queued bytes to be returned",
        || agent.queued_bytes() == 0,
        || format!("{} bytes queued", agent.queued_bytes()),
    )
    .await;
    drop((neighbour, fresh, stalled));
    h.wait_gauges((0, 0)).await;
    eventually(
        "every agent gauge back to 0",
        || {
            agent.tunnels() == 0
                && agent.metrics().open_endpoints() == 0
                && agent.queued_bytes() == 0
        },
        || {
            format!(
                "{} tunnels, {} queued",
                agent.tunnels(),
                agent.queued_bytes()
            )
        },
    )
    .await;
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_reconnects_when_its_server_restarts_and_serves_health() {
    let h = Harness::start().await;
    let agent = start_agent(&h, "rust-agent", &[]).await;
    let (status, body) = Harness::http_get(agent.health_addr, "/readyz").await;
    assert_eq!((status, body.as_str()), (200, "ok"));
    let (status, body) = Harness::http_get(agent.health_addr, "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        body.contains("konnectivity_network_proxy_agent_open_server_connections 1\n"),
        "{body}"
    );
    assert!(
        body.contains("konnectivity_network_proxy_agent_known_server_count 1\n"),
        "{body}"
    );
    let (status, _) = Harness::http_get(agent.admin_addr, "/metrics").await;
    assert_eq!(
        status, 301,
        "the admin port sends /metrics to the health port, as upstream"
    );
    assert_eq!(agent.server_ids(), vec![h.server_id.clone()]);
    let stopped = h.shutdown().await;
    eventually(
        "the agent to notice its server is gone",
        || agent.connected_servers() == 0,
        || format!("{} servers", agent.connected_servers()),
    )
    .await;
    let (status, body) = Harness::http_get(agent.health_addr, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    agent.stop().await;
    drop(stopped);
}

// ---------------------------------------------------------------------------------------------
// A server that misbehaves: the agent counts, logs at a bounded rate, and carries on.

mod fake {
    use std::sync::Arc;

    use kube_traffic::proto::agent_service_server::{AgentService, AgentServiceServer};
    use kube_traffic::proto::Packet;
    use kube_traffic::tls::{server_config, DevPki, TlsFiles, TlsPolicy};
    use tokio::net::TcpListener;
    use tokio::sync::mpsc;
    use tokio_stream::wrappers::ReceiverStream;
    use tonic::{Request, Response, Status, Streaming};

    /// One agent stream as the fake server sees it.
    pub struct Connection {
        pub to_agent: mpsc::Sender<Result<Packet, Status>>,
        pub from_agent: Streaming<Packet>,
    }

    struct Fake {
        connections: mpsc::Sender<Connection>,
    }

    #[tonic::async_trait]
    impl AgentService for Fake {
        type ConnectStream = ReceiverStream<Result<Packet, Status>>;

        async fn connect(
            &self,
            request: Request<Streaming<Packet>>,
        ) -> Result<Response<Self::ConnectStream>, Status> {
            let (to_agent, rx) = mpsc::channel(1024);
            let _ = self
                .connections
                .send(Connection {
                    to_agent,
                    from_agent: request.into_inner(),
                })
                .await;
            let mut response = Response::new(ReceiverStream::new(rx));
            response
                .metadata_mut()
                .insert("serverid", "fake-server".parse().unwrap());
            response
                .metadata_mut()
                .insert("servercount", "1".parse().unwrap());
            Ok(response)
        }
    }

    /// Serves `/AgentService/Connect` over TLS on `listener`; hands each stream to the test.
    pub fn serve(pki: &DevPki, listener: TcpListener) -> mpsc::Receiver<Connection> {
        let files = TlsFiles {
            cert: &pki.server_cert,
            key: &pki.server_key,
            client_ca: Some(&pki.ca_cert),
        };
        let policy = TlsPolicy {
            cipher_suites: &[],
            min_version: kube_traffic::config::TlsVersion::Tls12,
        };
        let tls =
            tokio_rustls::TlsAcceptor::from(server_config(&files, &policy, &[b"h2"]).unwrap());
        let (tx, rx) = mpsc::channel(8);
        let incoming = async_stream_of(listener, tls);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(AgentServiceServer::new(Fake { connections: tx }))
                .serve_with_incoming(incoming),
        );
        rx
    }

    fn async_stream_of(
        listener: TcpListener,
        tls: tokio_rustls::TlsAcceptor,
    ) -> ReceiverStream<std::io::Result<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>>
    {
        let (tx, rx) = mpsc::channel(8);
        let tls = Arc::new(tls);
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (tls, tx) = (tls.clone(), tx.clone());
                tokio::spawn(async move {
                    if let Ok(stream) = tls.accept(tcp).await {
                        let _ = tx.send(Ok(stream)).await;
                    }
                });
            }
        });
        ReceiverStream::new(rx)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_misbehaving_server_is_answered_counted_and_contained() {
    use kube_traffic::proto::{packet::Payload, Data, PacketType};
    let dir = tempfile::tempdir().unwrap();
    let (pki, _) = kube_traffic::tls::DevPki::ensure(&dir.path().join("pki")).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut connections = fake::serve(&pki, listener);
    let args = [
        "konnectivity-agent".to_string(),
        format!("--ca-cert={}", pki.ca_cert.display()),
        format!("--agent-cert={}", pki.agent_cert.display()),
        format!("--agent-key={}", pki.agent_key.display()),
        "--proxy-server-host=127.0.0.1".into(),
        format!("--proxy-server-port={port}"),
        "--sync-interval=100ms".into(),
    ];
    let config = AgentConfig::from_options(&AgentOptions::try_parse_from(&args).unwrap()).unwrap();
    let bind = || TcpListener::bind("127.0.0.1:0");
    let running = agent::spawn(
        Snapshot::build(config).unwrap(),
        AgentListeners {
            health: bind().await.unwrap(),
            admin: bind().await.unwrap(),
        },
    );
    let mut server = within("the agent's stream", connections.recv())
        .await
        .unwrap();
    let send = |p: Packet| {
        let tx = server.to_agent.clone();
        async move { tx.send(Ok(p)).await.unwrap() }
    };
    // DATA and CLOSE_REQ for connections the agent never had.
    send(data(77, b"x".to_vec())).await;
    send(close_req(78)).await;
    let mut replies = Vec::new();
    while replies.len() < 2 {
        let packet = within("a reply", server.from_agent.message())
            .await
            .unwrap()
            .unwrap();
        if let Some(Payload::CloseResponse(c)) = packet.payload {
            replies.push((c.connect_id, c.error));
        }
    }
    assert_eq!(
        replies,
        vec![
            (77, wire::UNRECOGNIZED_CONNECT_ID.to_string()),
            (78, wire::UNKNOWN_CONNECT_ID.to_string())
        ],
        "upstream's replies, word for word"
    );
    // Malformed packets, and a flood of DATA for unknown connections.
    send(Packet {
        r#type: 42,
        payload: None,
    })
    .await;
    send(Packet {
        r#type: PacketType::DialReq as i32,
        payload: Some(Payload::Data(Data::default())),
    })
    .await;
    send(data(0, b"no id".to_vec())).await;
    for id in 0..5000 {
        send(data(1000 + id, b"flood".to_vec())).await;
    }
    // The agent still serves: a real dial through the same stream works.
    let echo = echo_server().await;
    send(dial_req(&echo.to_string(), 9)).await;
    let connect_id = loop {
        let packet = within("the DIAL_RSP", server.from_agent.message())
            .await
            .unwrap()
            .unwrap();
        if let Some(Payload::DialResponse(r)) = packet.payload {
            assert_eq!((r.random, r.error.as_str()), (9, ""));
            break r.connect_id;
        }
    };
    send(data(connect_id, b"hello".to_vec())).await;
    loop {
        let packet = within("the echo", server.from_agent.message())
            .await
            .unwrap()
            .unwrap();
        if let Some(Payload::Data(d)) = packet.payload {
            if d.connect_id == connect_id {
                assert_eq!(&d.data[..], b"hello");
                break;
            }
        }
    }
    let m = running.metrics();
    assert_eq!(m.peer_violations("unknown_packet_type"), 1);
    assert_eq!(m.peer_violations("payload_mismatch"), 1);
    assert_eq!(m.peer_violations("data_without_connect_id"), 1);
    assert_eq!(
        m.peer_violations("data_unknown_connection"),
        5001,
        "every DATA for an unknown connection is counted"
    );
    // This server reads nothing while it floods: the replies that found the stream toward it
    // full were dropped (and counted) instead of stopping the agent's receive loop.
    assert!(m.peer_violations("reply_dropped") > 0);
    // The closed connection's id is gone for good; the tunnel closes and the table empties.
    send(close_req(connect_id)).await;
    eventually(
        "the tunnel to close",
        || running.tunnels() == 0 && running.metrics().open_endpoints() == 0,
        || format!("{} tunnels", running.tunnels()),
    )
    .await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn profiling_pages_on_both_admin_ports_only_when_enabled() {
    let h = Harness::start_with(&["--enable-profiling"]).await;
    let (status, body) = Harness::http_get(h.admin_addr, "/debug/pprof/").await;
    assert_eq!(status, 200);
    assert!(body.starts_with("konnectivity-server profiles"), "{body}");
    let agent = start_agent(&h, "profiled", &["--enable-profiling"]).await;
    let (status, body) = Harness::http_get(agent.admin_addr, "/debug/pprof/").await;
    assert_eq!(status, 200);
    assert!(body.starts_with("konnectivity-agent profiles"), "{body}");
    let (status, body) = Harness::http_get(agent.admin_addr, "/debug/pprof/heap").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        Harness::http_get(agent.admin_addr, "/debug/pprof").await.0,
        301
    );
    assert_eq!(
        Harness::http_get(agent.admin_addr, "/debug/pprof/nope")
            .await
            .0,
        404
    );
    // Off by default, as upstream. One agent at a time (start_agent waits for one).
    agent.stop().await;
    h.wait_agents(0).await;
    let plain = start_agent(&h, "plain", &[]).await;
    assert_eq!(
        Harness::http_get(plain.admin_addr, "/debug/pprof/").await.0,
        404
    );
    plain.stop().await;
}

/// The agent checks the address a name resolves to: `localhost` is no address rule's business
/// at the server, but the agent resolves it into the denied loopback range and refuses it, as
/// it refuses the address itself; another port, not denied, is dialled as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_agent_refuses_a_name_that_resolves_into_a_denied_range() {
    // Before the harness, whose end checks that no task it did not find is left.
    let (denied, open) = (echo_server().await, echo_server().await);
    let h = Harness::start().await;
    let rule = format!(
        "--deny-destinations=127.0.0.0/8:{port},[::1]:{port}",
        port = denied.port()
    );
    let agent = start_agent(&h, "policy", &[&rule]).await;
    let frontend = h.frontend().await;
    for (random, address) in [
        (1, format!("localhost:{}", denied.port())),
        (2, format!("127.0.0.1:{}", denied.port())),
    ] {
        let mut tunnel = frontend.open().await;
        tunnel.send(dial_req(&address, random)).await;
        let (got, _, error) = dial_rsp_of(&tunnel.recv().await);
        assert_eq!(
            (got, error.as_str()),
            (random, "destination not allowed by policy"),
            "{address}"
        );
    }
    assert_eq!(
        agent
            .metrics()
            .destinations_refused(&format!("127.0.0.0/8:{}", denied.port())),
        2
    );
    let (mut tunnel, connect_id) = dial(&frontend, &format!("localhost:{}", open.port()), 3).await;
    echo_once(&mut tunnel, connect_id, b"allowed").await;
    drop(tunnel);
    h.wait_gauges((0, 0)).await;
    drop(frontend);
    agent.stop().await;
    h.finish().await;
}
