//! gRPC paths and limits: upstream's literal paths, the 4 MiB message limit, and many
//! streams on one connection.

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_paths_are_the_literal_upstream_paths() {
    use http::uri::PathAndQuery;
    use tokio_stream::wrappers::ReceiverStream;
    use tonic::client::Grpc;
    use tonic_prost::ProstCodec;

    let h = Harness::start().await;

    // /AgentService/Connect, by its literal path.
    let mut agent_grpc = Grpc::new(h.agent_channel().await);
    within("ready", agent_grpc.ready()).await.unwrap();
    let (agent_tx, agent_rx) = tokio::sync::mpsc::channel::<Packet>(4);
    let mut request = tonic::Request::new(ReceiverStream::new(agent_rx));
    request
        .metadata_mut()
        .insert("agentid", "raw-agent".parse().unwrap());
    let response = within(
        "Connect",
        agent_grpc.streaming(
            request,
            PathAndQuery::from_static("/AgentService/Connect"),
            ProstCodec::<Packet, Packet>::default(),
        ),
    )
    .await
    .expect("/AgentService/Connect is served");
    assert_eq!(response.metadata().get("serverid").unwrap(), &h.server_id);
    let mut agent_rx = response.into_inner();

    // /ProxyService/Proxy, by its literal path, dialing through that agent.
    let fe = h.frontend().await;
    let mut proxy_grpc = Grpc::new(fe.channel.clone());
    within("ready", proxy_grpc.ready()).await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel::<Packet>(4);
    // Sent first, as konnectivity-client does: the response headers come with the DIAL_RSP.
    tx.send(dial_req(ADDRESS, 201)).await.unwrap();
    let call = tokio::spawn(async move {
        proxy_grpc
            .streaming(
                tonic::Request::new(ReceiverStream::new(rx)),
                PathAndQuery::from_static("/ProxyService/Proxy"),
                ProstCodec::<Packet, Packet>::default(),
            )
            .await
    });
    let got = within("DIAL_REQ", agent_rx.message()).await.unwrap();
    assert_eq!(got, Some(dial_req(ADDRESS, 201)));
    agent_tx.send(dial_rsp(201, 1, "")).await.unwrap();
    let response = within("Proxy", call)
        .await
        .unwrap()
        .expect("/ProxyService/Proxy is served");
    let mut proxy_rx = response.into_inner();
    let got = within("DIAL_RSP", proxy_rx.message()).await.unwrap();
    assert_eq!(got, Some(dial_rsp(201, 1, "")));
    drop((tx, proxy_rx));
    let got = within("CLOSE_REQ", agent_rx.message()).await.unwrap();
    assert_eq!(got, Some(close_req(1)));

    // A package-qualified path is not served: the contract has no proto package.
    for (channel, path) in [
        (fe.channel.clone(), "/proto.ProxyService/Proxy"),
        (h.agent_channel().await, "/agent.AgentService/Connect"),
    ] {
        let mut grpc = Grpc::new(channel);
        within("ready", grpc.ready()).await.unwrap();
        let (_tx, rx) = tokio::sync::mpsc::channel::<Packet>(1);
        let result = within(
            path,
            grpc.streaming(
                tonic::Request::new(ReceiverStream::new(rx)),
                PathAndQuery::from_static(path),
                ProstCodec::<Packet, Packet>::default(),
            ),
        )
        .await;
        let status = result
            .err()
            .unwrap_or_else(|| panic!("{path} must not be served"));
        assert_eq!(status.code(), tonic::Code::Unimplemented, "{path}");
    }
    drop((agent_tx, agent_rx, agent_grpc, fe));
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_data_just_under_4_mib_passes_both_ways() {
    let h = Harness::start().await;
    let mut agent = h.agent("agent-1").await;
    let fe = h.frontend().await;
    let mut t = h.establish(&fe, &mut agent, 211, 1).await;
    // The encoded Packet adds 14 bytes to the payload; stay just under 4 MiB in total.
    let size = (4 << 20) - 64;
    let payload = bytes::Bytes::from((0..size).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
    let packet = data(1, payload.clone());
    assert!(prost::Message::encoded_len(&packet) < 4 << 20);
    t.send(packet.clone()).await;
    assert_eq!(agent.recv().await, packet, "frontend to agent");
    agent.send(packet.clone()).await;
    assert_eq!(t.recv().await, packet, "agent to frontend");
    drop(t);
    assert_eq!(agent.recv().await, close_req(1));
    drop((fe, agent));
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_data_over_4_mib_ends_only_that_tunnel() {
    let h = Harness::start().await;
    let mut agent = h.agent("agent-1").await;
    let fe = h.frontend().await;
    let healthy = h.establish(&fe, &mut agent, 221, 1).await;
    let mut t = h.establish(&fe, &mut agent, 222, 2).await;
    let packet = data(2, vec![7u8; 4 << 20]);
    t.send(packet).await;
    // The server refuses the message, which ends this stream: the agent is told to close.
    assert_eq!(agent.recv().await, close_req(2));
    let end = t.recv_end().await;
    assert!(
        matches!(&end, Ok(v) if v.is_empty()) || end.is_err(),
        "{end:?}"
    );
    healthy.send(data(1, &b"fine"[..])).await;
    assert_eq!(agent.recv().await, data(1, &b"fine"[..]));
    h.wait_gauges((0, 1)).await;
    drop((t, healthy));
    assert_eq!(agent.recv().await, close_req(1));
    drop((fe, agent));
    h.finish().await;
}

/// Opens 250 Proxy streams on one channel (one HTTP/2 connection), all open at once, dials on
/// each through one agent, checks every DIAL_RSP, then closes them all.
///
/// `burst`: the DIAL_REQs (and later the CLOSE_REQs) go out on all streams at once. Otherwise
/// they go out in batches of 25, each once the agent has seen the previous batch, so the
/// server never has more than 25 small DATA frames unread on the connection (see
/// `grpc_burst_of_250_dials_on_one_connection`).
async fn many_streams_on_one_connection(burst: bool) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    const STREAMS: i64 = 250;
    let h = Harness::start().await;
    let mut agent = h.agent("agent-1").await;
    let fe = h.frontend().await;

    // The agent answers every dial with connect id = dial id, and every close.
    let dials_seen = Arc::new(AtomicUsize::new(0));
    let closes_seen = Arc::new(AtomicUsize::new(0));
    let (seen, closes) = (dials_seen.clone(), closes_seen.clone());
    let responder = tokio::spawn(async move {
        let mut closed = 0;
        while closed < STREAMS {
            let packet = agent.recv().await;
            match packet.payload {
                Some(Payload::DialRequest(req)) => {
                    seen.fetch_add(1, Ordering::SeqCst);
                    agent.send(dial_rsp(req.random, req.random, "")).await
                }
                Some(Payload::CloseRequest(req)) => {
                    closed += 1;
                    closes.fetch_add(1, Ordering::SeqCst);
                    agent.send(close_rsp(req.connect_id, "")).await
                }
                other => panic!("unexpected packet at the agent: {other:?}"),
            }
        }
        agent
    });
    let mut tunnels = futures_util::future::join_all((1..=STREAMS).map(|random| {
        let fe = fe.clone();
        async move { (random, fe.open().await) }
    }))
    .await;
    // Every stream is open at once before any dial: more than hyper's default limit of 200
    // concurrent streams.
    eventually(
        "250 Proxy streams open at the server",
        || {
            h.metrics()
                .frontend
                .grpc_connections
                .with_label_values(&["Proxy"])
                .get()
                == STREAMS
        },
        || "fewer".into(),
    )
    .await;
    send_all(&tunnels, |id| dial_req(ADDRESS, id), &dials_seen, burst).await;
    for (random, t) in &mut tunnels {
        assert_eq!(t.recv().await, dial_rsp(*random, *random, ""));
    }
    assert_eq!(
        fe.connections(),
        1,
        "every stream shares one HTTP/2 connection"
    );
    h.wait_gauges((0, STREAMS)).await;
    assert_eq!(
        h.metrics()
            .frontend
            .grpc_connections
            .with_label_values(&["Proxy"])
            .get(),
        STREAMS
    );

    // Closing them all reaches the agent, which answers each.
    send_all(&tunnels, close_req, &closes_seen, burst).await;
    for (id, t) in &mut tunnels {
        assert_eq!(t.recv().await, close_rsp(*id, ""));
    }
    let agent = within("the responder", responder).await.expect("responder");
    h.wait_gauges((0, 0)).await;
    drop((tunnels, fe, agent));
    h.finish().await;
}

/// Sends one packet on every tunnel: all at once in a burst, else in batches of 25, each once
/// the agent has seen (`at_agent`) the previous one.
async fn send_all(
    tunnels: &[(i64, Tunnel)],
    packet: fn(i64) -> Packet,
    at_agent: &std::sync::atomic::AtomicUsize,
    burst: bool,
) {
    use std::sync::atomic::Ordering;
    let batch = if burst { tunnels.len() } else { 25 };
    for (n, chunk) in tunnels.chunks(batch).enumerate() {
        for (id, t) in chunk {
            t.send(packet(*id)).await;
        }
        let expected = n * batch + chunk.len();
        eventually(
            &format!("the agent to see {expected} packets"),
            || at_agent.load(Ordering::SeqCst) >= expected,
            || format!("{} seen", at_agent.load(Ordering::SeqCst)),
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_more_than_200_concurrent_proxy_streams_on_one_connection() {
    many_streams_on_one_connection(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_burst_of_250_dials_on_one_connection() {
    many_streams_on_one_connection(true).await;
}
