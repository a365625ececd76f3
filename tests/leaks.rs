//! File descriptors and tasks after shutdown. The only test in this binary, so nothing else
//! in the process opens or closes descriptors while it counts them.
#![allow(clippy::unwrap_used)] // tests and benchmarks fail loudly by design

mod common;

use common::*;
use kube_traffic::proto::Packet;

/// One server's life: agents (accepted and rejected), tunnels that succeed, fail, are pending,
/// die abruptly, and a shutdown with streams still live.
async fn one_server_lifetime() {
    let h = Harness::start().await;
    let mut agent = h.agent("agent-1").await;
    let rejected = h.agent_with(&[("agentid", "a"), ("agentid", "b")]).await;
    assert!(rejected.is_err());
    let fe = h.frontend().await;

    // Established, then closed by the frontend dropping it.
    let t = h.establish(&fe, &mut agent, 1, 1).await;
    drop(t);
    assert_eq!(agent.recv().await, close_req(1));
    // A failed dial.
    let mut failed = fe.open().await;
    failed.send(dial_req("10.0.0.1:1", 2)).await;
    assert_eq!(agent.recv().await, dial_req("10.0.0.1:1", 2));
    agent.send(dial_rsp(2, 0, "refused")).await;
    assert_eq!(failed.recv().await, dial_rsp(2, 0, "refused"));
    drop(failed);
    // A second agent dies with an established tunnel; the first one is then the only agent.
    let mut doomed = h.agent("agent-2").await;
    h.wait_agents(2).await;
    let mut on_doomed = None;
    for random in 3..40 {
        let mut t = fe.open().await;
        t.send(dial_req("10.0.0.1:2", random)).await;
        tokio::select! {
            p = agent.recv() => {
                assert_eq!(p, dial_req("10.0.0.1:2", random));
                agent.send(dial_rsp(random, random, "")).await;
                assert_eq!(t.recv().await, dial_rsp(random, random, ""));
                drop(t);
                assert_eq!(agent.recv().await, close_req(random));
            }
            p = doomed.recv() => {
                assert_eq!(p, dial_req("10.0.0.1:2", random));
                doomed.send(dial_rsp(random, random, "")).await;
                assert_eq!(t.recv().await, dial_rsp(random, random, ""));
                on_doomed = Some((random, t));
                break;
            }
        }
    }
    let (id, mut t) = on_doomed.expect("the random strategy picks both agents within 37 dials");
    drop(doomed);
    assert_eq!(t.recv().await, close_rsp(id, ""));
    drop(t);
    h.wait_agents(1).await;
    // Health traffic.
    assert_eq!(Harness::http_get(h.health_addr, "/readyz").await.0, 200);
    assert_eq!(Harness::http_get(h.admin_addr, "/metrics").await.0, 200);
    // Live at shutdown: an established tunnel and a pending dial.
    let mut live = h.establish(&fe, &mut agent, 100, 100).await;
    let mut pending = fe.open().await;
    pending.send(dial_req("10.0.0.1:3", 101)).await;
    assert_eq!(agent.recv().await, dial_req("10.0.0.1:3", 101));
    h.wait_gauges((1, 1)).await;

    let stopped = h.shutdown().await;
    let _: Result<Vec<Packet>, _> = agent.recv_end().await;
    let _ = live.recv_end().await;
    let _ = pending.recv_end().await;
    drop((agent, live, pending, fe));
    stopped.check_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_fd_or_task_leaks_after_shutdown() {
    // A first round initializes whatever is created once per process (lazily opened files,
    // statics); it is not counted.
    one_server_lifetime().await;
    let baseline_fds = open_fds();
    let baseline_tasks = alive_tasks();
    for _ in 0..3 {
        one_server_lifetime().await;
    }
    // Sockets close as their tasks finish: poll, never a bare sleep. No tolerance: nothing
    // else runs in this process.
    eventually(
        "open file descriptors to return to their baseline",
        || open_fds() <= baseline_fds,
        || format!("{} open, baseline {baseline_fds}", open_fds()),
    )
    .await;
    eventually(
        "alive tasks to return to their baseline",
        || alive_tasks() <= baseline_tasks,
        || format!("{} alive, baseline {baseline_tasks}", alive_tasks()),
    )
    .await;
}
