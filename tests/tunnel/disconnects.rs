//! The disconnect table, one test (or one pair of variants) per row: what each side gets
//! when the other side, or its stream, goes away at each point of a tunnel's life.

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_no_backend_available_dial_rsp_no_agent_available() {
    let h = Harness::start().await;
    let fe = h.frontend().await;
    let mut t = fe.open().await;
    t.send(dial_req(ADDRESS, 11)).await;
    assert_eq!(t.recv().await, dial_rsp(11, 0, NO_AGENT_AVAILABLE));
    assert_eq!(NO_AGENT_AVAILABLE, "No agent available");
    assert_eq!(h.metrics().dial.dial_failures(DialFailure::NoAgent), 1);
    assert_eq!(h.gauges(), (0, 0));
    // The stream stays open until the client ends it, then ends cleanly.
    t.close_send();
    assert_eq!(t.recv_end().await.expect("clean end"), Vec::<Packet>::new());
    drop((t, fe));
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_agent_dial_error_forwarded_unchanged() {
    let h = Harness::start().await;
    let mut agent = h.agent("agent-1").await;
    let fe = h.frontend().await;
    let mut t = h.pending_dial(&fe, &mut agent, "127.0.0.1:8000", 21).await;
    h.wait_gauges((1, 0)).await;
    let error = "dial tcp 127.0.0.1:8000: connect: connection refused";
    agent.send(dial_rsp(21, 0, error)).await;
    assert_eq!(
        t.recv().await,
        dial_rsp(21, 0, error),
        "forwarded unchanged"
    );
    assert_eq!(
        h.metrics().dial.dial_failures(DialFailure::ErrorResponse),
        1
    );
    h.wait_gauges((0, 0)).await;
    // Nothing is sent to the agent when the client then goes away.
    t.close_send();
    t.recv_end().await.expect("clean end");
    assert_eq!(agent.sync().await, Vec::<Packet>::new());
    drop((t, fe, agent));
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_agent_dial_ok_dial_rsp_relayed_and_data_flows() {
    let h = Harness::start().await;
    let mut agent = h.agent("agent-1").await;
    let fe = h.frontend().await;
    let mut t = fe.open().await;
    t.send(dial_req(ADDRESS, 31)).await;
    assert_eq!(
        agent.recv().await,
        dial_req(ADDRESS, 31),
        "DIAL_REQ forwarded as sent"
    );
    agent.send(dial_rsp(31, 7, "")).await;
    assert_eq!(t.recv().await, dial_rsp(31, 7, ""));
    h.wait_gauges((0, 1)).await;
    // Data in both directions, unchanged.
    t.send(data(7, &b"GET / HTTP/1.1\r\n\r\n"[..])).await;
    assert_eq!(agent.recv().await, data(7, &b"GET / HTTP/1.1\r\n\r\n"[..]));
    agent.send(data(7, &b"HTTP/1.1 200 OK\r\n\r\n"[..])).await;
    assert_eq!(t.recv().await, data(7, &b"HTTP/1.1 200 OK\r\n\r\n"[..]));
    // DATA with connect id 0 is dropped, in both directions.
    t.send(data(0, &b"dropped"[..])).await;
    agent.send(data(0, &b"dropped"[..])).await;
    t.send(data(7, &b"after"[..])).await;
    assert_eq!(agent.recv().await, data(7, &b"after"[..]));
    agent.send(data(7, &b"after"[..])).await;
    assert_eq!(t.recv().await, data(7, &b"after"[..]));
    drop(t);
    assert_eq!(agent.recv().await, close_req(7));
    drop((fe, agent));
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_frontend_close_req_agent_gets_close_req_and_close_rsp_relayed() {
    let h = Harness::start().await;
    let mut agent = h.agent("agent-1").await;
    let fe = h.frontend().await;
    let mut t = h.establish(&fe, &mut agent, 41, 3).await;
    t.send(close_req(3)).await;
    assert_eq!(agent.recv().await, close_req(3));
    agent.send(close_rsp(3, "")).await;
    assert_eq!(t.recv().await, close_rsp(3, ""));
    h.wait_gauges((0, 0)).await;
    // konnectivity-client then ends the stream; the connection is already gone at the agent,
    // so it gets nothing more.
    t.close_send();
    assert_eq!(t.recv_end().await.expect("clean end"), Vec::<Packet>::new());
    assert_eq!(agent.sync().await, Vec::<Packet>::new());
    drop((t, fe, agent));
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_endpoint_eof_at_agent_unsolicited_close_rsp_relayed() {
    let h = Harness::start().await;
    let mut agent = h.agent("agent-1").await;
    let fe = h.frontend().await;
    let mut t = h.establish(&fe, &mut agent, 51, 5).await;
    agent.send(data(5, &b"last bytes"[..])).await;
    agent.send(close_rsp(5, "")).await;
    assert_eq!(t.recv().await, data(5, &b"last bytes"[..]));
    assert_eq!(t.recv().await, close_rsp(5, ""));
    h.wait_gauges((0, 0)).await;
    // The connection is closed: the frontend's end of stream sends no CLOSE_REQ.
    t.close_send();
    t.recv_end().await.expect("clean end");
    assert_eq!(agent.sync().await, Vec::<Packet>::new());
    drop((t, fe, agent));
    h.finish().await;
}

/// konnectivity-client registers a connection only after its dialing goroutine took the
/// DIAL_RSP, so a CLOSE_RSP right behind it can be dropped as unknown; its next DATA shows
/// that it never heard, and it is told again (once), while the agent, which closed that
/// connection, is not sent DATA for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_data_after_close_rsp_client_told_again_agent_gets_nothing() {
    let h = Harness::start().await;
    let mut agent = h.agent("agent-1").await;
    let fe = h.frontend().await;
    let mut t = h.establish(&fe, &mut agent, 52, 6).await;
    agent.send(close_rsp(6, "")).await;
    assert_eq!(t.recv().await, close_rsp(6, ""));
    t.send(data(6, &b"GET / HTTP/1.1\r\n\r\n"[..])).await;
    assert_eq!(t.recv().await, close_rsp(6, ""), "told again");
    t.send(data(6, &b"more"[..])).await;
    t.close_send();
    assert_eq!(
        t.recv_end().await.expect("clean end"),
        Vec::<Packet>::new(),
        "once"
    );
    assert_eq!(agent.sync().await, Vec::<Packet>::new());
    h.wait_gauges((0, 0)).await;
    drop((t, fe, agent));
    h.finish().await;
}

/// The same after the agent's stream ended: the CLOSE_RSP the teardown sent may have been
/// dropped by the client; its DATA finds no agent and gets a CLOSE_RSP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_data_after_agent_stream_died_client_told_again() {
    let h = Harness::start().await;
    let mut agent = h.agent("agent-1").await;
    let fe = h.frontend().await;
    let mut t = h.establish(&fe, &mut agent, 53, 7).await;
    drop(agent);
    assert_eq!(t.recv().await, close_rsp(7, ""), "synthesized CLOSE_RSP");
    h.wait_agents(0).await;
    t.send(data(7, &b"GET / HTTP/1.1\r\n\r\n"[..])).await;
    assert_eq!(t.recv().await, close_rsp(7, ""), "told again");
    t.close_send();
    assert_eq!(t.recv_end().await.expect("clean end"), Vec::<Packet>::new());
    h.wait_gauges((0, 0)).await;
    drop((t, fe));
    h.finish().await;
}

async fn agent_stream_dies_with_established_connection(death: Death) {
    let h = Harness::start().await;
    let mut agent = h.agent("agent-1").await;
    let fe = h.frontend().await;
    let mut t1 = h.establish(&fe, &mut agent, 61, 1).await;
    let mut t2 = h.establish(&fe, &mut agent, 62, 2).await;
    h.wait_gauges((0, 2)).await;
    match death {
        Death::Eof => {
            agent.close_send();
            // The server ends its side too, so the agent reconnects.
            agent.recv_end().await.expect("clean end at the agent");
            drop(agent);
        }
        Death::Reset => drop(agent),
    }
    assert_eq!(t1.recv().await, close_rsp(1, ""), "synthesized CLOSE_RSP");
    assert_eq!(t2.recv().await, close_rsp(2, ""), "synthesized CLOSE_RSP");
    h.wait_gauges((0, 0)).await;
    h.wait_agents(0).await;
    drop((t1, t2, fe));
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_agent_stream_dies_established_frontend_gets_synthesized_close_rsp_eof() {
    agent_stream_dies_with_established_connection(Death::Eof).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_agent_stream_dies_established_frontend_gets_synthesized_close_rsp_reset() {
    agent_stream_dies_with_established_connection(Death::Reset).await;
}

async fn agent_stream_dies_with_dial_pending(death: Death) {
    let h = Harness::start().await;
    let mut agent = h.agent("agent-1").await;
    let fe = h.frontend().await;
    let mut t = h.pending_dial(&fe, &mut agent, ADDRESS, 71).await;
    h.wait_gauges((1, 0)).await;
    let before = h.metrics().dial.dial_failures(DialFailure::BackendClose);
    match death {
        Death::Eof => {
            agent.close_send();
            agent.recv_end().await.expect("clean end at the agent");
            drop(agent);
        }
        Death::Reset => drop(agent),
    }
    // Answered at once, well inside the client's 30 s backstop (upstream #126).
    assert_eq!(
        t.recv().await,
        dial_rsp(71, 0, AGENT_DISCONNECTED_DURING_DIAL)
    );
    assert_eq!(
        h.metrics().dial.dial_failures(DialFailure::BackendClose),
        before + 1
    );
    h.wait_gauges((0, 0)).await;
    // The client gives up; its end of stream is not a frontend_close failure on top.
    t.close_send();
    t.recv_end().await.expect("clean end");
    assert_eq!(
        h.metrics().dial.dial_failures(DialFailure::FrontendClose),
        0
    );
    drop((t, fe));
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_agent_stream_dies_dial_pending_frontend_gets_dial_rsp_error_eof() {
    agent_stream_dies_with_dial_pending(Death::Eof).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_agent_stream_dies_dial_pending_frontend_gets_dial_rsp_error_reset() {
    agent_stream_dies_with_dial_pending(Death::Reset).await;
}

async fn frontend_stream_dies_with_dial_pending(death: Death) {
    let h = Harness::start().await;
    let mut agent = h.agent("agent-1").await;
    let fe = h.frontend().await;
    let mut t = h.pending_dial(&fe, &mut agent, ADDRESS, 81).await;
    h.wait_gauges((1, 0)).await;
    match death {
        Death::Eof => {
            t.close_send();
            t.recv_end().await.expect("clean end");
            drop(t);
        }
        Death::Reset => drop((t, fe.clone())),
    }
    assert_eq!(agent.recv().await, dial_cls(81));
    assert_eq!(
        h.metrics().dial.dial_failures(DialFailure::FrontendClose),
        1
    );
    h.wait_gauges((0, 0)).await;
    // The agent's late answer is now unrecognized: the server asks it to close.
    agent.send(dial_rsp(81, 9, "")).await;
    assert_eq!(agent.recv().await, close_req(9));
    drop((fe, agent));
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_frontend_stream_dies_dial_pending_agent_gets_dial_cls_eof() {
    frontend_stream_dies_with_dial_pending(Death::Eof).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_frontend_stream_dies_dial_pending_agent_gets_dial_cls_reset() {
    frontend_stream_dies_with_dial_pending(Death::Reset).await;
}

async fn frontend_stream_dies_with_established_connection(death: Death) {
    let h = Harness::start().await;
    let mut agent = h.agent("agent-1").await;
    let fe = h.frontend().await;
    let mut t = h.establish(&fe, &mut agent, 91, 4).await;
    let mut other = h.establish(&fe, &mut agent, 92, 5).await;
    match death {
        Death::Eof => {
            t.close_send();
            t.recv_end().await.expect("clean end");
            drop(t);
        }
        Death::Reset => drop(t),
    }
    assert_eq!(agent.recv().await, close_req(4));
    h.wait_gauges((0, 1)).await;
    // The agent's CLOSE_RSP for the closed connection goes nowhere and harms nothing.
    agent.send(close_rsp(4, "")).await;
    agent.send(data(5, &b"still here"[..])).await;
    assert_eq!(other.recv().await, data(5, &b"still here"[..]));
    drop(other);
    assert_eq!(agent.recv().await, close_req(5));
    drop((fe, agent));
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_frontend_stream_dies_established_agent_gets_close_req_eof() {
    frontend_stream_dies_with_established_connection(Death::Eof).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_frontend_stream_dies_established_agent_gets_close_req_reset() {
    frontend_stream_dies_with_established_connection(Death::Reset).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_dial_rsp_for_unknown_random_agent_gets_close_req() {
    let h = Harness::start().await;
    let mut agent = h.agent("agent-1").await;
    agent.send(dial_rsp(424_242, 17, "")).await;
    assert_eq!(agent.recv().await, close_req(17));
    assert_eq!(
        h.metrics()
            .dial
            .dial_failures(DialFailure::UnrecognizedResponse),
        1
    );
    // With connect id 0 (a failed dial) there is nothing to close.
    agent.send(dial_rsp(424_243, 0, "dial failed")).await;
    agent.send(dial_rsp(424_244, 0, "")).await;
    assert_eq!(agent.sync().await, Vec::<Packet>::new());
    assert_eq!(
        h.metrics()
            .dial
            .dial_failures(DialFailure::UnrecognizedResponse),
        3
    );
    assert_eq!(h.gauges(), (0, 0));
    drop(agent);
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_frontend_dial_cls_then_late_dial_rsp_agent_gets_close_req() {
    // The realistic way to reach the row above: konnectivity-client gives up on a dial
    // (DIAL_CLS), the agent answers afterwards.
    let h = Harness::start().await;
    let mut agent = h.agent("agent-1").await;
    let fe = h.frontend().await;
    let mut t = h.pending_dial(&fe, &mut agent, ADDRESS, 101).await;
    t.send(dial_cls(101)).await;
    eventually(
        "dial_failure_count{reason=frontend_close} to count the DIAL_CLS",
        || h.metrics().dial.dial_failures(DialFailure::FrontendClose) == 1,
        || "still 0".into(),
    )
    .await;
    h.wait_gauges((0, 0)).await;
    // Nothing is sent to the agent for the DIAL_CLS itself, as upstream.
    assert_eq!(agent.sync().await, Vec::<Packet>::new());
    agent.send(dial_rsp(101, 8, "")).await;
    assert_eq!(agent.recv().await, close_req(8));
    // Nor when the stream then ends: the dial is no longer pending.
    t.close_send();
    t.recv_end().await.expect("clean end");
    assert_eq!(agent.sync().await, Vec::<Packet>::new());
    assert_eq!(
        h.metrics().dial.dial_failures(DialFailure::FrontendClose),
        1
    );
    drop((t, fe, agent));
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_data_from_agent_for_unknown_connect_id_agent_gets_close_req() {
    let h = Harness::start().await;
    let mut agent = h.agent("agent-1").await;
    let fe = h.frontend().await;
    let mut t = h.establish(&fe, &mut agent, 111, 1).await;
    agent.send(data(99, &b"nobody"[..])).await;
    assert_eq!(agent.recv().await, close_req(99));
    // The live connection is untouched.
    agent.send(data(1, &b"hello"[..])).await;
    assert_eq!(t.recv().await, data(1, &b"hello"[..]));
    // A connection the frontend closed is unknown too.
    t.send(close_req(1)).await;
    assert_eq!(agent.recv().await, close_req(1));
    agent.send(close_rsp(1, "")).await;
    assert_eq!(t.recv().await, close_rsp(1, ""));
    h.wait_gauges((0, 0)).await;
    agent.send(data(1, &b"late"[..])).await;
    assert_eq!(agent.recv().await, close_req(1));
    drop((t, fe, agent));
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_backend_dial_timeout_while_pending_dial_rsp_timed_out() {
    let h = Harness::start_with(&["--backend-dial-timeout=200ms"]).await;
    let mut agent = h.agent("agent-1").await;
    let fe = h.frontend().await;
    let mut t = h.pending_dial(&fe, &mut agent, ADDRESS, 121).await;
    // The agent never answers.
    assert_eq!(t.recv().await, dial_rsp(121, 0, DIAL_TIMEOUT));
    assert_eq!(DIAL_TIMEOUT, "timed out waiting for backend dial");
    assert_eq!(
        h.metrics()
            .dial
            .dial_failures(DialFailure::BackendDialTimeout),
        1
    );
    h.wait_gauges((0, 0)).await;
    // The agent sees nothing and stays connected; its late answer is unrecognized.
    assert_eq!(agent.sync().await, Vec::<Packet>::new());
    agent.send(dial_rsp(121, 6, "")).await;
    assert_eq!(agent.recv().await, close_req(6));
    t.close_send();
    t.recv_end().await.expect("clean end");
    assert_eq!(
        agent.sync().await,
        Vec::<Packet>::new(),
        "no DIAL_CLS afterwards"
    );
    // (A dial answered in time is not checked here: under load, 200 ms is not a safe bound
    // for an answer.)
    drop((t, fe, agent));
    h.finish().await;
}
