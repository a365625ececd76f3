//! Draining and starting: dials accepted before a drain are served, and dials that find no
//! agent during the start-up grace wait for one.

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_serves_the_first_dial_of_a_connection_and_refuses_later_ones() {
    use kube_traffic::wire::SHUTTING_DOWN;
    let h = Harness::start().await;
    let mut agent = h.agent("agent-1").await;
    let used = h.frontend().await;
    let t1 = h.establish(&used, &mut agent, 301, 1).await;
    // A connection that was open before the drain and has not dialed yet: its client raced
    // the drain (a restart under socket activation), and its one dial is served.
    let fresh = h.frontend().await;
    h.start_draining();
    let mut t2 = h
        .pending_dial(&fresh, &mut agent, "10.0.0.1:443", 302)
        .await;
    agent.send(dial_rsp(302, 2, "")).await;
    assert_eq!(t2.recv().await, dial_rsp(302, 2, ""));
    // A second dial on a connection that already carried one is refused: its client moves on.
    let mut t3 = used.open().await;
    t3.send(dial_req("10.0.0.1:443", 303)).await;
    assert_eq!(t3.recv().await, dial_rsp(303, 0, SHUTTING_DOWN));
    assert_eq!(
        agent.sync().await,
        Vec::<Packet>::new(),
        "the agent saw no third dial"
    );
    drop((t1, t2, t3));
    let mut closes = vec![agent.recv().await, agent.recv().await];
    closes.sort_by_key(|p| format!("{p:?}"));
    assert_eq!(closes, vec![close_req(1), close_req(2)]);
    drop((used, fresh, agent));
    h.finish().await;
}

/// A stop while no tunnel is open still serves the first request of a connection accepted
/// before it. The drain used to end at once when no tunnel was open, and closed such a
/// connection under the request its client was sending (a restart under socket activation
/// failed about one request in 400; packaging/nspawn-test.sh).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_with_no_tunnel_open_serves_a_connection_accepted_before_it() {
    let h = Harness::start().await;
    let mut agent = h.agent("agent-1").await;
    let fresh = h.frontend().await;
    let (shared, stopping) = h
        .stop_once_accepted(1, std::time::Duration::from_secs(60))
        .await;
    let mut tunnel = fresh.open().await;
    tunnel.send(dial_req("10.0.0.1:443", 401)).await;
    assert_eq!(agent.recv().await, dial_req("10.0.0.1:443", 401));
    agent.send(dial_rsp(401, 1, "")).await;
    assert_eq!(tunnel.recv().await, dial_rsp(401, 1, ""));
    tunnel.send(data(1, "ping")).await;
    assert_eq!(agent.recv().await, data(1, "ping"));
    agent.send(data(1, "pong")).await;
    assert_eq!(tunnel.recv().await, data(1, "pong"));
    assert!(!stopping.is_finished(), "the drain waits for the tunnel");
    // The tunnel's end ends the drain (its CLOSE_REQ to the agent may be cut off by the stop).
    drop(tunnel);
    within("the drain to end once the tunnel is released", stopping)
        .await
        .expect("the shutdown task");
    assert_eq!(shared.metrics.tunnel.established_connections.get(), 0);
    assert_eq!(shared.metrics.dial.pending_backend_dials.get(), 0);
    drop((fresh, agent));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_grace_a_dial_without_agent_waits_for_one_to_connect() {
    let h = Harness::start_with(&["--startup-dial-grace=60s"]).await;
    let fe = h.frontend().await;
    let mut tunnel = fe.open().await;
    tunnel.send(dial_req("10.0.0.1:443", 311)).await;
    // No agent yet: the dial waits instead of failing.
    eventually(
        "the dial to wait for an agent",
        || h.metrics().dial.dials_waiting_for_agent.get() == 1,
        || format!("{} waiting", h.metrics().dial.dials_waiting_for_agent.get()),
    )
    .await;
    let mut agent = h.agent("late").await;
    assert_eq!(agent.recv().await, dial_req("10.0.0.1:443", 311));
    agent.send(dial_rsp(311, 1, "")).await;
    assert_eq!(tunnel.recv().await, dial_rsp(311, 1, ""));
    assert_eq!(h.metrics().dial.startup_waits("agent"), 1);
    assert_eq!(h.metrics().dial.dials_waiting_for_agent.get(), 0);
    assert_eq!(h.metrics().dial.dial_failures(DialFailure::NoAgent), 0);
    drop(tunnel);
    assert_eq!(agent.recv().await, close_req(1));
    drop((fe, agent));
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_grace_over_a_dial_without_agent_fails_as_upstream() {
    let h = Harness::start_with(&["--startup-dial-grace=300ms"]).await;
    let fe = h.frontend().await;
    let mut tunnel = fe.open().await;
    tunnel.send(dial_req("10.0.0.1:443", 312)).await;
    assert_eq!(
        tunnel.recv().await,
        dial_rsp(312, 0, NO_AGENT_AVAILABLE),
        "once the grace is over, no agent fails the dial"
    );
    assert_eq!(h.metrics().dial.startup_waits("no_agent"), 1);
    assert_eq!(h.metrics().dial.dial_failures(DialFailure::NoAgent), 1);
    // After the grace, a dial fails at once, without waiting.
    let mut again = fe.open().await;
    again.send(dial_req("10.0.0.1:443", 313)).await;
    assert_eq!(again.recv().await, dial_rsp(313, 0, NO_AGENT_AVAILABLE));
    assert_eq!(
        h.metrics().dial.startup_waits("no_agent"),
        1,
        "no second wait"
    );
    drop((tunnel, again, fe));
    h.finish().await;
}
