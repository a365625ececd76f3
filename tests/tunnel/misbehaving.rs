//! Misbehaving peers: each is contained to its own stream or tunnel.

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misbehaving_frontend_data_before_dial_gets_close_rsp_backend_not_initialized() {
    let h = Harness::start().await;
    let mut agent = h.agent("agent-1").await;
    let fe = h.frontend().await;
    let mut healthy = h.establish(&fe, &mut agent, 131, 1).await;
    let mut bad = fe.open().await;
    bad.send(data(1, &b"early"[..])).await;
    assert_eq!(bad.recv().await, close_rsp(1, BACKEND_NOT_INITIALIZED));
    // The stream is stopped: a later dial on it is ignored.
    bad.send(dial_req(ADDRESS, 132)).await;
    bad.close_send();
    assert_eq!(
        bad.recv_end().await.expect("clean end"),
        Vec::<Packet>::new()
    );
    assert_eq!(agent.sync().await, Vec::<Packet>::new());
    // The healthy tunnel, which owns connect id 1, is untouched.
    healthy.send(data(1, &b"ping"[..])).await;
    assert_eq!(agent.recv().await, data(1, &b"ping"[..]));
    agent.send(data(1, &b"pong"[..])).await;
    assert_eq!(healthy.recv().await, data(1, &b"pong"[..]));
    h.wait_gauges((0, 1)).await;
    drop((healthy, bad));
    assert_eq!(agent.recv().await, close_req(1));
    drop((fe, agent));
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misbehaving_frontend_close_req_before_dial_gets_close_rsp_backend_uninitialized() {
    let h = Harness::start().await;
    let mut agent = h.agent("agent-1").await;
    let fe = h.frontend().await;
    let mut t = fe.open().await;
    t.send(close_req(5)).await;
    assert_eq!(t.recv().await, close_rsp(5, BACKEND_UNINITIALIZED));
    // Unlike DATA, the stream keeps working: a dial afterwards succeeds.
    t.send(dial_req(ADDRESS, 141)).await;
    assert_eq!(agent.recv().await, dial_req(ADDRESS, 141));
    agent.send(dial_rsp(141, 2, "")).await;
    assert_eq!(t.recv().await, dial_rsp(141, 2, ""));
    drop(t);
    assert_eq!(agent.recv().await, close_req(2));
    drop((fe, agent));
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misbehaving_frontend_mismatched_connect_ids_other_tunnel_not_closed() {
    let h = Harness::start().await;
    let mut agent = h.agent("agent-1").await;
    let fe = h.frontend().await;
    let mut t1 = h.establish(&fe, &mut agent, 151, 1).await;
    let mut t2 = h.establish(&fe, &mut agent, 152, 2).await;
    // t1 writes to t2's connection.
    t1.send(data(2, &b"hijack"[..])).await;
    assert_eq!(t1.recv().await, close_rsp(1, MISMATCHED_CONNECTION_IDS));
    assert_eq!(t1.recv().await, close_rsp(2, MISMATCHED_CONNECTION_IDS));
    // The agent is asked to close t1's own connection only; t2's data comes right after.
    t2.send(data(2, &b"mine"[..])).await;
    assert_eq!(agent.recv().await, close_req(1));
    assert_eq!(agent.recv().await, data(2, &b"mine"[..]));
    agent.send(data(2, &b"still yours"[..])).await;
    assert_eq!(t2.recv().await, data(2, &b"still yours"[..]));
    h.wait_gauges((0, 1)).await;
    // t1 is stopped; ending it sends nothing more.
    t1.send(data(1, &b"ignored"[..])).await;
    t1.close_send();
    assert_eq!(
        t1.recv_end().await.expect("clean end"),
        Vec::<Packet>::new()
    );
    assert_eq!(agent.sync().await, Vec::<Packet>::new());
    drop(t2);
    assert_eq!(agent.recv().await, close_req(2));
    drop((t1, fe, agent));
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misbehaving_unknown_ids_are_contained() {
    let h = Harness::start().await;
    let mut agent = h.agent("agent-1").await;
    let fe = h.frontend().await;
    let mut t = h.establish(&fe, &mut agent, 161, 1).await;

    // Frontend: CLOSE_REQ for a connection it does not own is refused, the tunnel goes on.
    t.send(close_req(2)).await;
    assert_eq!(t.recv().await, close_rsp(2, "unrecognized connectID"));
    // Frontend: DIAL_CLS for a dial it did not make, and a second DIAL_REQ, are ignored.
    t.send(dial_cls(999)).await;
    t.send(dial_req(ADDRESS, 162)).await;
    t.send(data(1, &b"after"[..])).await;
    assert_eq!(
        agent.recv().await,
        data(1, &b"after"[..]),
        "nothing else reached the agent"
    );

    // Agent: CLOSE_RSP and DIAL_CLS for unknown ids are dropped, DRAIN is accepted.
    agent.send(close_rsp(77, "Unknown connectID")).await;
    agent.send(dial_cls(78)).await;
    agent
        .send(pkt(
            PacketType::Drain,
            Payload::Drain(kube_traffic::proto::Drain {}),
        ))
        .await;
    assert_eq!(agent.sync().await, Vec::<Packet>::new());
    agent.send(data(1, &b"reply"[..])).await;
    assert_eq!(t.recv().await, data(1, &b"reply"[..]));
    h.wait_gauges((0, 1)).await;
    assert_eq!(h.metrics().dial.dial_failures(DialFailure::BackendClose), 0);

    drop(t);
    assert_eq!(agent.recv().await, close_req(1));
    drop((fe, agent));
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misbehaving_frontend_type_payload_mismatch_is_dropped() {
    let h = Harness::start().await;
    let mut agent = h.agent("agent-1").await;
    let fe = h.frontend().await;
    let mut t = fe.open().await;
    let rsp = Payload::DialResponse(DialResponse {
        error: String::new(),
        connect_id: 1,
        random: 171,
    });
    // DATA carrying a dialResponse; DIAL_REQ carrying data; a type with no payload at all;
    // a type that does not exist.
    t.send(pkt(PacketType::Data, rsp.clone())).await;
    t.send(Packet {
        r#type: PacketType::DialReq as i32,
        payload: data(1, &b"x"[..]).payload,
    })
    .await;
    t.send(Packet {
        r#type: PacketType::DialReq as i32,
        payload: None,
    })
    .await;
    t.send(Packet {
        r#type: 99,
        payload: dial_req(ADDRESS, 170).payload,
    })
    .await;
    // None of them was a dial or DATA: the stream still works, the first real packet wins.
    t.send(dial_req(ADDRESS, 171)).await;
    assert_eq!(agent.recv().await, dial_req(ADDRESS, 171));
    agent.send(dial_rsp(171, 1, "")).await;
    assert_eq!(t.recv().await, dial_rsp(171, 1, ""));
    t.send(data(1, &b"ok"[..])).await;
    assert_eq!(agent.recv().await, data(1, &b"ok"[..]));
    drop(t);
    assert_eq!(agent.recv().await, close_req(1));
    drop((fe, agent));
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misbehaving_agent_type_payload_mismatch_is_dropped() {
    let h = Harness::start().await;
    let mut agent = h.agent("agent-1").await;
    let fe = h.frontend().await;
    let mut healthy = h.establish(&fe, &mut agent, 181, 1).await;
    let mut t = h.pending_dial(&fe, &mut agent, ADDRESS, 182).await;
    // A DATA-typed packet with a dialResponse payload must not complete the dial.
    let rsp = Payload::DialResponse(DialResponse {
        error: String::new(),
        connect_id: 2,
        random: 182,
    });
    agent.send(pkt(PacketType::Data, rsp)).await;
    // A DIAL_RSP-typed packet with a data payload must not reach any frontend.
    agent
        .send(Packet {
            r#type: PacketType::DialRsp as i32,
            payload: data(1, &b"x"[..]).payload,
        })
        .await;
    agent
        .send(Packet {
            r#type: 42,
            payload: data(1, &b"x"[..]).payload,
        })
        .await;
    assert_eq!(agent.sync().await, Vec::<Packet>::new());
    h.wait_gauges((1, 1)).await;
    // The proper answer still establishes the dial, and it is the first thing the frontend
    // sees.
    agent.send(dial_rsp(182, 2, "")).await;
    assert_eq!(t.recv().await, dial_rsp(182, 2, ""));
    agent.send(data(1, &b"healthy"[..])).await;
    assert_eq!(healthy.recv().await, data(1, &b"healthy"[..]));
    h.wait_gauges((0, 2)).await;
    drop(t);
    assert_eq!(agent.recv().await, close_req(2));
    drop(healthy);
    assert_eq!(agent.recv().await, close_req(1));
    drop((fe, agent));
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misbehaving_agent_two_agent_ids_rejected() {
    let h = Harness::start().await;
    let status = h
        .agent_with(&[("agentid", "a"), ("agentid", "b")])
        .await
        .err()
        .expect("rejected");
    assert_eq!(status.code(), tonic::Code::Unknown);
    assert_eq!(
        status.message(),
        "expected one agent ID in the context, got [a b]"
    );
    // Not registered: the server is still not ready and dials find no agent.
    assert!(h.metrics().backend.ready_backend_connections.get() == 0);
    let (code, _) = Harness::http_get(h.health_addr, "/readyz").await;
    assert_eq!(code, 500);
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misbehaving_agent_no_agent_id_rejected() {
    let h = Harness::start().await;
    let status = h.agent_with(&[]).await.err().expect("rejected");
    assert_eq!(status.code(), tonic::Code::Unknown);
    assert_eq!(
        status.message(),
        "expected one agent ID in the context, got []"
    );
    // An empty id is one id, and is accepted (as upstream).
    let agent = h.agent("").await;
    h.wait_agents(1).await;
    drop(agent);
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misbehaving_agent_malformed_identifiers_rejected() {
    let h = Harness::start().await;
    let status = h
        .agent_with(&[("agentid", "a"), ("agentidentifiers", "host=%zz")])
        .await
        .err()
        .expect("rejected");
    assert_eq!(status.code(), tonic::Code::Unknown);
    assert!(
        status
            .message()
            .starts_with("fail to parse url encoded string: "),
        "{:?}",
        status.message()
    );
    let status = h
        .agent_with(&[
            ("agentid", "a"),
            ("agentidentifiers", "host=x"),
            ("agentidentifiers", "host=y"),
        ])
        .await
        .err()
        .expect("rejected");
    assert_eq!(
        status.message(),
        "expected at most one set of agent identifiers in the context, got [host=x host=y]"
    );
    // Well-formed identifiers (unknown keys ignored) are accepted, and a healthy agent still
    // works after the rejections.
    let mut agent = h
        .agent_with(&[
            ("agentid", "a"),
            (
                "agentidentifiers",
                "host=localhost&ipv4=10.0.0.1&default-route=true&future-key=1",
            ),
        ])
        .await
        .expect("accepted");
    let fe = h.frontend().await;
    let t = h.establish(&fe, &mut agent, 191, 1).await;
    drop(t);
    assert_eq!(agent.recv().await, close_req(1));
    drop((fe, agent));
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_response_headers_arrive_before_any_packet() {
    let h = Harness::start_with(&["--server-id=server-under-test", "--server-count=3"]).await;
    // TestAgent::connect returns only once the response headers have arrived; the server has
    // no packet to send this agent, so they came on their own.
    let mut agent = h.agent("agent-1").await;
    assert_eq!(agent.server_id, "server-under-test");
    assert_eq!(agent.server_count, "3");
    assert_eq!(agent.sync().await, Vec::<Packet>::new());
    // The default server id is a UUID, sent the same way.
    let h2 = Harness::start().await;
    let other = h2.agent("agent-2").await;
    assert_eq!(other.server_id, h2.server_id);
    assert!(uuid_like(&other.server_id), "{}", other.server_id);
    assert_eq!(other.server_count, "1");
    drop((agent, other));
    // h2 last started, first finished: its task baseline includes h's server.
    h2.finish().await;
    h.finish().await;
}

fn uuid_like(s: &str) -> bool {
    s.len() == 36 && s.chars().filter(|c| *c == '-').count() == 4
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misbehaving_frontend_duplicate_dial_id_rejected() {
    let h = Harness::start().await;
    let mut agent = h.agent("agent-1").await;
    let fe = h.frontend().await;
    let mut first = h.pending_dial(&fe, &mut agent, ADDRESS, 251).await;
    // A second frontend reuses the pending dial id: it is refused, the first is unharmed.
    let mut second = fe.open().await;
    second.send(dial_req(ADDRESS, 251)).await;
    assert_eq!(
        second.recv().await,
        dial_rsp(251, 0, "a dial with this id is already pending")
    );
    assert_eq!(agent.sync().await, Vec::<Packet>::new());
    agent.send(dial_rsp(251, 1, "")).await;
    assert_eq!(first.recv().await, dial_rsp(251, 1, ""));
    // The refused stream ending takes nothing with it.
    second.close_send();
    second.recv_end().await.expect("clean end");
    assert_eq!(agent.sync().await, Vec::<Packet>::new());
    h.wait_gauges((0, 1)).await;
    drop(first);
    assert_eq!(agent.recv().await, close_req(1));
    drop((second, fe, agent));
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misbehaving_agent_reuses_live_connect_id_fails_only_the_new_dial() {
    let h = Harness::start().await;
    let mut agent = h.agent("agent-1").await;
    let fe = h.frontend().await;
    let mut live = h.establish(&fe, &mut agent, 261, 1).await;
    let mut t = h.pending_dial(&fe, &mut agent, ADDRESS, 262).await;
    agent.send(dial_rsp(262, 1, "")).await;
    assert_eq!(
        t.recv().await,
        dial_rsp(262, 0, "agent reused a live connection id")
    );
    // No CLOSE_REQ{1}: that would close the live tunnel.
    assert_eq!(agent.sync().await, Vec::<Packet>::new());
    agent.send(data(1, &b"to the live one"[..])).await;
    assert_eq!(live.recv().await, data(1, &b"to the live one"[..]));
    h.wait_gauges((0, 1)).await;
    drop(t);
    drop(live);
    assert_eq!(agent.recv().await, close_req(1));
    drop((fe, agent));
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misbehaving_agent_same_agent_id_streams_cannot_touch_each_others_connections() {
    let h = Harness::start().await;
    let mut first = h.agent("same").await;
    let fe = h.frontend().await;
    let mut t1 = h.establish(&fe, &mut first, 271, 1).await;
    let mut second = h.agent("same").await;
    h.wait_agents(2).await;
    // The second stream writes to and closes connect id 1, which lives on the first stream.
    second.send(data(1, &b"not yours"[..])).await;
    assert_eq!(second.recv().await, close_req(1));
    second.send(close_rsp(1, "")).await;
    assert_eq!(second.sync().await, Vec::<Packet>::new());
    first.send(data(1, &b"mine"[..])).await;
    assert_eq!(
        t1.recv().await,
        data(1, &b"mine"[..]),
        "nothing from the other stream"
    );
    h.wait_gauges((0, 1)).await;
    // New dials for that agent id use the oldest stream, as upstream.
    let t2 = h.establish(&fe, &mut first, 272, 2).await;
    // When the first stream dies, the second takes over, with its own connect id 1.
    drop(first);
    assert_eq!(t1.recv().await, close_rsp(1, ""));
    h.wait_agents(1).await;
    let mut t3 = h.establish(&fe, &mut second, 273, 1).await;
    second.send(data(1, &b"second"[..])).await;
    assert_eq!(t3.recv().await, data(1, &b"second"[..]));
    drop((t1, t2, t3));
    assert_eq!(second.recv().await, close_req(1));
    drop((fe, second));
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misbehaving_frontend_stops_reading_only_its_tunnel_is_closed() {
    use kube_traffic::wire::FRONTEND_QUEUE_OVERFLOW;
    let h = Harness::start().await;
    let mut agent = h.agent("agent-1").await;
    let fe = h.frontend().await;
    let mut healthy = h.establish(&fe, &mut agent, 281, 1).await;
    let mut slow = h.establish(&fe, &mut agent, 282, 2).await;
    // 96 MiB toward a frontend that reads nothing: more than its queue's hard cap (4 x the
    // 16 MiB limit) plus every HTTP/2 window on the way. The agent is not held for it, since
    // that frontend takes nothing.
    let chunk = bytes::Bytes::from(vec![1u8; 1 << 20]);
    const CHUNKS: usize = 96;
    for _ in 0..CHUNKS {
        agent.send(data(2, chunk.clone())).await;
    }
    // The agent's loop never stalled: the healthy tunnel still gets its data at once.
    agent.send(data(1, &b"not stalled"[..])).await;
    assert_eq!(healthy.recv().await, data(1, &b"not stalled"[..]));
    // The slow tunnel was closed at the agent, once: DATA still in flight after that is
    // dropped quietly.
    let at_agent = agent.sync().await;
    assert!(
        !at_agent.is_empty(),
        "the agent was told to close the slow tunnel"
    );
    assert!(at_agent.iter().all(|p| *p == close_req(2)), "{at_agent:?}");
    assert_eq!(h.metrics().frontend.queue_overflows.get(), 1);
    h.wait_gauges((0, 1)).await;
    // When the slow frontend reads again, it finds its queued data, then the reason.
    let mut data_bytes = 0;
    loop {
        let packet = slow.recv().await;
        match packet.payload {
            Some(Payload::Data(d)) => data_bytes += d.data.len(),
            _ => {
                assert_eq!(packet, close_rsp(2, FRONTEND_QUEUE_OVERFLOW));
                break;
            }
        }
    }
    assert!(
        data_bytes < CHUNKS * chunk.len(),
        "some data was dropped, not queued"
    );
    drop((slow, healthy));
    assert_eq!(agent.recv().await, close_req(1));
    drop((fe, agent));
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misbehaving_frontends_past_the_budget_the_largest_idle_one_is_closed_first() {
    use kube_traffic::wire::FRONTEND_QUEUE_BUDGET;
    // Per-tunnel limits far above the budget, so only the budget can close anything.
    let h = Harness::start_with(&[
        "--frontend-queue-limit-bytes=33554432",
        "--frontend-queue-budget-bytes=33554432",
    ])
    .await;
    let mut agent = h.agent("agent-1").await;
    let fe = h.frontend().await;
    let mut reader = h.establish(&fe, &mut agent, 291, 1).await;
    let mut small = h.establish(&fe, &mut agent, 292, 2).await;
    let mut large = h.establish(&fe, &mut agent, 293, 3).await;
    let chunk = bytes::Bytes::from(vec![7u8; 1 << 20]);
    // 8 MiB for one idle frontend and 20 MiB for another: 28 MiB, under the budget. Part of
    // each goes into the client's HTTP/2 window (the frontend "takes" it) until that is full.
    for _ in 0..8 {
        agent.send(data(2, chunk.clone())).await;
    }
    for _ in 0..20 {
        agent.send(data(3, chunk.clone())).await;
    }
    // Every packet sent so far is queued: the server handles an agent's packets in order.
    assert_eq!(agent.sync().await, vec![], "nothing was closed yet");
    assert_eq!(h.metrics().frontend.queue_budget_closes.get(), 0);
    // A frontend counts as not reading once it took nothing for 250 ms. Both idle ones have
    // full HTTP/2 windows and take nothing more, so once the server says so, it stays so
    // (waiting a fixed time from the sends would race the delivery itself under load).
    h.wait_tunnels("", "both idle frontends to count as not reading", |t| {
        let stalled = |id: i64| {
            t.iter()
                .any(|t| t["connection_id"] == id && t["reader_stalled"] == true)
        };
        stalled(2) && stalled(3)
    })
    .await;
    // More for the larger one until the budget closes a tunnel: it closes the idle tunnel
    // holding the most, never the reader.
    let mut sent_large = 20;
    while h.metrics().frontend.queue_budget_closes.get() == 0 {
        assert!(sent_large < 96, "the budget never closed a tunnel");
        agent.send(data(3, chunk.clone())).await;
        sent_large += 1;
        // The reader keeps reading through it all, and is never the one closed.
        agent.send(data(1, &b"still here"[..])).await;
        assert_eq!(reader.recv().await, data(1, &b"still here"[..]));
    }
    let at_agent = agent.sync().await;
    assert!(
        at_agent.iter().all(|p| *p == close_req(3)) && !at_agent.is_empty(),
        "the agent was told to close the larger idle tunnel only: {at_agent:?}"
    );
    assert_eq!(h.metrics().frontend.queue_budget_closes.get(), 1);
    assert_eq!(h.metrics().frontend.queue_overflows.get(), 0);
    // Its queue was emptied at once; the smaller idle tunnel keeps its 8 MiB.
    let queued = h.metrics().frontend.queued_bytes.get();
    assert!(queued <= 8 << 20, "queued {queued} bytes after the close");
    h.wait_gauges((0, 2)).await;
    // The closed tunnel's client, reading at last, finds the reason after what the transport
    // still held.
    loop {
        let packet = large.recv().await;
        if !matches!(packet.payload, Some(Payload::Data(_))) {
            assert_eq!(packet, close_rsp(3, FRONTEND_QUEUE_BUDGET));
            break;
        }
    }
    // The smaller idle tunnel still has all its data.
    let mut got = 0;
    while got < 8 << 20 {
        match small.recv().await.payload {
            Some(Payload::Data(d)) => got += d.data.len(),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(h.metrics().frontend.queued_bytes.get(), 0);
    drop((reader, small, large));
    let mut closes = vec![agent.recv().await, agent.recv().await];
    closes.sort_by_key(|p| format!("{p:?}"));
    assert_eq!(closes, vec![close_req(1), close_req(2)]);
    drop((fe, agent));
    h.finish().await;
}
