//! The health and admin ports, agents taking over from one another, and shutdown with live
//! streams.

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_endpoints_follow_agent_connections() {
    let h = Harness::start().await;
    assert_eq!(
        Harness::http_get(h.health_addr, "/healthz").await,
        (200, "ok".to_string())
    );
    for path in ["/readyz", "/ready"] {
        assert_eq!(
            Harness::http_get(h.health_addr, path).await,
            (500, "no connection to any proxy agent".to_string()),
            "{path} before any agent"
        );
    }
    let mut agent = h.agent("agent-1").await;
    for path in ["/readyz", "/ready"] {
        assert_eq!(
            Harness::http_get(h.health_addr, path).await,
            (200, "ok".to_string()),
            "{path} with an agent"
        );
    }
    // Exercise a dial, a failure and a closed connection so every series exists.
    let fe = h.frontend().await;
    let t = h.establish(&fe, &mut agent, 231, 1).await;
    drop(t);
    assert_eq!(agent.recv().await, close_req(1));
    let mut failed = h.pending_dial(&fe, &mut agent, ADDRESS, 232).await;
    agent.send(dial_rsp(232, 0, "refused")).await;
    assert_eq!(failed.recv().await, dial_rsp(232, 0, "refused"));

    let (code, metrics) = Harness::http_get(h.health_addr, "/metrics").await;
    assert_eq!(code, 200);
    for name in [
        "konnectivity_network_proxy_server_dial_duration_seconds",
        "konnectivity_network_proxy_server_frontend_write_duration_seconds",
        "konnectivity_network_proxy_server_connection_duration_seconds",
        "konnectivity_network_proxy_server_grpc_connections",
        "konnectivity_network_proxy_server_http_connections",
        "konnectivity_network_proxy_server_ready_backend_connections",
        "konnectivity_network_proxy_server_ready_backends",
        "konnectivity_network_proxy_server_pending_backend_dials",
        "konnectivity_network_proxy_server_established_connections",
        "konnectivity_network_proxy_server_dial_failure_count",
        "konnectivity_network_proxy_server_stream_packets_total",
    ] {
        assert!(
            metrics.contains(&format!("# TYPE {name} ")),
            "{name} missing from /metrics"
        );
    }
    for help in [
        "# HELP konnectivity_network_proxy_server_dial_failure_count Number of dial failures observed. Multiple failures can occur for a single dial request.",
        "# HELP konnectivity_network_proxy_server_pending_backend_dials Current number of pending backend dial requests",
        "# HELP konnectivity_network_proxy_server_ready_backend_connections Number of konnectivity agent connected to the proxy server. DEPRECATED, please use ready_backends",
        "# HELP konnectivity_network_proxy_server_ready_backends Number of konnectivity agent connected to the proxy server",
        "# HELP konnectivity_network_proxy_server_established_connections Current number of established end-to-end connections (post-dial).",
    ] {
        assert!(metrics.contains(help), "missing: {help}");
    }
    assert!(metrics.contains(
        "konnectivity_network_proxy_server_ready_backends{proxy_strategy=\"default\"} 1"
    ));
    assert!(metrics.contains(
        "konnectivity_network_proxy_server_dial_failure_count{reason=\"error_response\"} 1"
    ));
    let (code, admin_metrics) = Harness::http_get(h.admin_addr, "/metrics").await;
    assert_eq!(code, 200);
    assert!(admin_metrics.contains("konnectivity_network_proxy_server_ready_backends"));

    // The agent leaves: not ready again.
    drop((failed, agent));
    eventually(
        "/readyz to turn 500 after the agent left",
        || h.metrics().backend.ready_backend_connections.get() == 0,
        || "agent still registered".into(),
    )
    .await;
    assert_eq!(
        Harness::http_get(h.health_addr, "/readyz").await,
        (500, "no connection to any proxy agent".to_string())
    );
    drop(fe);
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_agent_takes_over_when_the_first_leaves() {
    // Two agents: dials land on either; when one dies only its tunnels are closed.
    let h = Harness::start().await;
    let a = h.agent("agent-a").await;
    let b = h.agent("agent-b").await;
    h.wait_agents(2).await;
    let fe = h.frontend().await;
    let mut agents = [a, b];
    let mut tunnels = Vec::new();
    for random in 1..=20i64 {
        let mut t = fe.open().await;
        t.send(dial_req(ADDRESS, random)).await;
        // Whichever agent got it answers.
        let (which, _) = within("a DIAL_REQ at either agent", first_packet(&mut agents)).await;
        agents[which].send(dial_rsp(random, random, "")).await;
        assert_eq!(t.recv().await, dial_rsp(random, random, ""));
        tunnels.push((which, random, t));
    }
    let [a, b] = agents;
    let on_a: Vec<i64> = tunnels.iter().filter(|x| x.0 == 0).map(|x| x.1).collect();
    drop(a);
    for (which, id, t) in &mut tunnels {
        if *which == 0 {
            assert_eq!(t.recv().await, close_rsp(*id, ""));
        }
    }
    h.wait_gauges((0, 20 - on_a.len() as i64)).await;
    h.wait_agents(1).await;
    let mut b = b;
    for (which, id, t) in tunnels.iter().filter(|x| x.0 == 1) {
        assert_eq!(*which, 1);
        t.send(data(*id, &b"b"[..])).await;
        assert_eq!(b.recv().await, data(*id, &b"b"[..]));
    }
    drop(tunnels);
    drop((fe, b));
    h.finish().await;
}

/// Waits for the first packet at any of `agents`; returns the agent's index and the packet.
async fn first_packet(agents: &mut [TestAgent; 2]) -> (usize, Packet) {
    let [a, b] = agents;
    tokio::select! {
        p = a.recv() => (0, p),
        p = b.recv() => (1, p),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_with_live_streams_ends_them_and_leaves_nothing_behind() {
    let h = Harness::start().await;
    let mut agent = h.agent("agent-1").await;
    let fe = h.frontend().await;
    let mut established = h.establish(&fe, &mut agent, 241, 1).await;
    let mut pending = h.pending_dial(&fe, &mut agent, ADDRESS, 242).await;
    h.wait_gauges((1, 1)).await;
    // Shut down while everything is live; every stream then ends at the clients.
    let stopped = h.shutdown().await;
    let _ = agent.recv_end().await;
    let _ = established.recv_end().await;
    let _ = pending.recv_end().await;
    drop((agent, established, pending, fe));
    stopped.check_clean().await;
}

/// The less loaded of two agents takes new tunnels: with ten tunnels open through agent A, the
/// next ten dials all go to agent B, which had none (a uniform pick would send about half of
/// them to A).
#[tokio::test]
async fn new_tunnels_go_to_the_less_loaded_of_two_agents() {
    let h = Harness::start().await;
    let mut a = h.agent("agent-a").await;
    h.wait_agents(1).await;
    let fe = h.frontend().await;
    let mut tunnels = Vec::new();
    for random in 1..=10i64 {
        tunnels.push(h.establish(&fe, &mut a, random, random).await);
    }
    let b = h.agent("agent-b").await;
    h.wait_agents(2).await;
    let mut agents = [a, b];
    for random in 11..=20i64 {
        let mut t = fe.open().await;
        t.send(dial_req(ADDRESS, random)).await;
        let (which, packet) = within("a DIAL_REQ at either agent", first_packet(&mut agents)).await;
        assert_eq!(packet, dial_req(ADDRESS, random));
        assert_eq!(
            which,
            1,
            "dial {random} went to agent A, which carries 10 tunnels, while B carries {}",
            random - 11
        );
        agents[1].send(dial_rsp(random, random, "")).await;
        assert_eq!(t.recv().await, dial_rsp(random, random, ""));
        tunnels.push(t);
    }
    drop(tunnels);
    drop((fe, agents));
    h.finish().await;
}
