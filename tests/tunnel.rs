//! Protocol-level tests over real sockets and real TLS: a test agent on the agent port (mTLS),
//! test frontends on the Unix socket, and the server in between.
//!
//! Tests named `row_*` follow the disconnect table (upstream-behaviour.md 2.5) row by row;
//! `misbehaving_*` cover peers that break the protocol, each contained to its own stream.
//! Every test ends with [`Harness::finish`]: the gauges return to 0, every stream task ends,
//! and after shutdown the runtime is back to its baseline task count.
#![allow(clippy::unwrap_used)] // tests and benchmarks fail loudly by design

mod common;

use common::*;
use konnectivity_server::proto::packet::Payload;
use konnectivity_server::proto::{DialResponse, Packet, PacketType};
use konnectivity_server::testing::DialFailure;
use konnectivity_server::wire::{
    AGENT_DISCONNECTED_DURING_DIAL, BACKEND_NOT_INITIALIZED, BACKEND_UNINITIALIZED, DIAL_TIMEOUT,
    MISMATCHED_CONNECTION_IDS, NO_AGENT_AVAILABLE,
};

const ADDRESS: &str = "10.0.0.1:443";

// =============================================================================================
// Disconnect table (2.5), one test (or one pair of variants) per row

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_no_backend_available_dial_rsp_no_agent_available() {
    let h = Harness::start().await;
    let fe = h.frontend().await;
    let mut t = fe.open().await;
    t.send(dial_req(ADDRESS, 11)).await;
    assert_eq!(t.recv().await, dial_rsp(11, 0, NO_AGENT_AVAILABLE));
    assert_eq!(NO_AGENT_AVAILABLE, "No agent available");
    assert_eq!(h.metrics().dial_failures(DialFailure::NoAgent), 1);
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
    assert_eq!(h.metrics().dial_failures(DialFailure::ErrorResponse), 1);
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
    let before = h.metrics().dial_failures(DialFailure::BackendClose);
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
        h.metrics().dial_failures(DialFailure::BackendClose),
        before + 1
    );
    h.wait_gauges((0, 0)).await;
    // The client gives up; its end of stream is not a frontend_close failure on top.
    t.close_send();
    t.recv_end().await.expect("clean end");
    assert_eq!(h.metrics().dial_failures(DialFailure::FrontendClose), 0);
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
    assert_eq!(h.metrics().dial_failures(DialFailure::FrontendClose), 1);
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
        h.metrics().dial_failures(DialFailure::UnrecognizedResponse),
        1
    );
    // With connect id 0 (a failed dial) there is nothing to close.
    agent.send(dial_rsp(424_243, 0, "dial failed")).await;
    agent.send(dial_rsp(424_244, 0, "")).await;
    assert_eq!(agent.sync().await, Vec::<Packet>::new());
    assert_eq!(
        h.metrics().dial_failures(DialFailure::UnrecognizedResponse),
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
        || h.metrics().dial_failures(DialFailure::FrontendClose) == 1,
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
    assert_eq!(h.metrics().dial_failures(DialFailure::FrontendClose), 1);
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
        h.metrics().dial_failures(DialFailure::BackendDialTimeout),
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

// =============================================================================================
// Misbehaving peers: each contained to its own stream

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
            Payload::Drain(konnectivity_server::proto::Drain {}),
        ))
        .await;
    assert_eq!(agent.sync().await, Vec::<Packet>::new());
    agent.send(data(1, &b"reply"[..])).await;
    assert_eq!(t.recv().await, data(1, &b"reply"[..]));
    h.wait_gauges((0, 1)).await;
    assert_eq!(h.metrics().dial_failures(DialFailure::BackendClose), 0);

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
    assert!(h.metrics().ready_backend_connections.get() == 0);
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
    use konnectivity_server::wire::FRONTEND_QUEUE_OVERFLOW;
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
    assert_eq!(h.metrics().frontend_queue_overflows.get(), 1);
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
    use konnectivity_server::wire::FRONTEND_QUEUE_BUDGET;
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
    assert_eq!(h.metrics().frontend_queue_budget_closes.get(), 0);
    // A frontend counts as not reading once it took nothing for 250 ms: let both idle ones
    // pass that (time only grows, so this cannot be too short under load).
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    // More for the larger one until the budget closes a tunnel: it closes the idle tunnel
    // holding the most, never the reader.
    let mut sent_large = 20;
    while h.metrics().frontend_queue_budget_closes.get() == 0 {
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
    assert_eq!(h.metrics().frontend_queue_budget_closes.get(), 1);
    assert_eq!(h.metrics().frontend_queue_overflows.get(), 0);
    // Its queue was emptied at once; the smaller idle tunnel keeps its 8 MiB.
    let queued = h.metrics().frontend_queued_bytes.get();
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
    assert_eq!(h.metrics().frontend_queued_bytes.get(), 0);
    drop((reader, small, large));
    let mut closes = vec![agent.recv().await, agent.recv().await];
    closes.sort_by_key(|p| format!("{p:?}"));
    assert_eq!(closes, vec![close_req(1), close_req(2)]);
    drop((fe, agent));
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_serves_the_first_dial_of_a_connection_and_refuses_later_ones() {
    use konnectivity_server::wire::SHUTTING_DOWN;
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
    assert_eq!(shared.metrics.established_connections.get(), 0);
    assert_eq!(shared.metrics.pending_backend_dials.get(), 0);
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
        || h.metrics().dials_waiting_for_agent.get() == 1,
        || format!("{} waiting", h.metrics().dials_waiting_for_agent.get()),
    )
    .await;
    let mut agent = h.agent("late").await;
    assert_eq!(agent.recv().await, dial_req("10.0.0.1:443", 311));
    agent.send(dial_rsp(311, 1, "")).await;
    assert_eq!(tunnel.recv().await, dial_rsp(311, 1, ""));
    assert_eq!(h.metrics().startup_waits("agent"), 1);
    assert_eq!(h.metrics().dials_waiting_for_agent.get(), 0);
    assert_eq!(h.metrics().dial_failures(DialFailure::NoAgent), 0);
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
    assert_eq!(h.metrics().startup_waits("no_agent"), 1);
    assert_eq!(h.metrics().dial_failures(DialFailure::NoAgent), 1);
    // After the grace, a dial fails at once, without waiting.
    let mut again = fe.open().await;
    again.send(dial_req("10.0.0.1:443", 313)).await;
    assert_eq!(again.recv().await, dial_rsp(313, 0, NO_AGENT_AVAILABLE));
    assert_eq!(h.metrics().startup_waits("no_agent"), 1, "no second wait");
    drop((tunnel, again, fe));
    h.finish().await;
}

// =============================================================================================
// gRPC paths and limits

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
    let response = within(
        "Proxy",
        proxy_grpc.streaming(
            tonic::Request::new(ReceiverStream::new(rx)),
            PathAndQuery::from_static("/ProxyService/Proxy"),
            ProstCodec::<Packet, Packet>::default(),
        ),
    )
    .await
    .expect("/ProxyService/Proxy is served");
    let mut proxy_rx = response.into_inner();
    tx.send(dial_req(ADDRESS, 201)).await.unwrap();
    let got = within("DIAL_REQ", agent_rx.message()).await.unwrap();
    assert_eq!(got, Some(dial_req(ADDRESS, 201)));
    agent_tx.send(dial_rsp(201, 1, "")).await.unwrap();
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
    drop((agent_tx, agent_rx, agent_grpc, proxy_grpc, fe));
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

// =============================================================================================
// Health and admin ports

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
        || h.metrics().ready_backend_connections.get() == 0,
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

// =============================================================================================
// grpc-go sends an invalid :authority on a UDS and h2 clients send :authority before :path;
// the server's header recoder must handle both (see src/frontend/uds_authority.rs).

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frontend_plain_h2_client_over_uds() {
    let h = Harness::start().await;
    let fe = Frontend::connect(h.uds.clone()).await;
    let mut t = fe.open().await;
    t.send(dial_req(ADDRESS, 1)).await;
    assert_eq!(t.recv().await, dial_rsp(1, 0, NO_AGENT_AVAILABLE));
    drop((t, fe));
    h.finish().await;
}

/// A gRPC codec that sends raw bytes as the message (to break the protocol on purpose) and
/// decodes packets.
#[derive(Clone, Default)]
struct RawCodec;

struct RawEncoder;

impl tonic::codec::Encoder for RawEncoder {
    type Item = bytes::Bytes;
    type Error = tonic::Status;

    fn encode(
        &mut self,
        item: bytes::Bytes,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        use bytes::BufMut;
        dst.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Codec for RawCodec {
    type Encode = bytes::Bytes;
    type Decode = Packet;
    type Encoder = RawEncoder;
    type Decoder = <tonic_prost::ProstCodec<Packet, Packet> as tonic::codec::Codec>::Decoder;

    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic::codec::Codec::decoder(&mut tonic_prost::ProstCodec::<Packet, Packet>::default())
    }
}

/// Sends `message` as the first message of an agent stream; returns how the stream ended.
async fn agent_stream_end_after(h: &Harness, message: bytes::Bytes) -> tonic::Status {
    use http::uri::PathAndQuery;
    use tokio_stream::wrappers::ReceiverStream;
    let mut grpc =
        tonic::client::Grpc::new(h.agent_channel().await).max_encoding_message_size(64 << 20);
    within("ready", grpc.ready()).await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(1);
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    request
        .metadata_mut()
        .insert("agentid", "broken".parse().unwrap());
    let response = within(
        "Connect",
        grpc.streaming(
            request,
            PathAndQuery::from_static("/AgentService/Connect"),
            RawCodec,
        ),
    )
    .await
    .expect("the stream opens");
    let mut stream = response.into_inner();
    tx.send(message).await.unwrap();
    loop {
        match within("the end of the stream", stream.message()).await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the agent stream ended with OK after a broken message"),
            Err(status) => return status,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misbehaving_agent_broken_messages_end_its_stream_with_a_grpc_error() {
    let h = Harness::start().await;
    // Field 1 with wire type 7, which does not exist: not a packet.
    let status = agent_stream_end_after(&h, bytes::Bytes::from_static(b"\x0f")).await;
    assert_eq!(status.code(), tonic::Code::Internal, "{status:?}");
    // Over the 4 MiB message limit, as grpc-go says it.
    let status = agent_stream_end_after(&h, bytes::Bytes::from(vec![0u8; 5 << 20])).await;
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misbehaving_agent_a_flood_of_bad_packets_is_counted_not_logged_each() {
    let h = Harness::start().await;
    let agent = h.agent("flooder").await;
    const N: u64 = 20_000;
    for _ in 0..N {
        agent
            .send(Packet {
                r#type: 99,
                payload: None,
            })
            .await;
    }
    let counted = || {
        h.metrics()
            .peer_violations
            .with_label_values(&["agent", "unknown_packet_type"])
            .get()
    };
    eventually(
        "every bad packet counted",
        || counted() == N,
        || format!("{} counted", counted()),
    )
    .await;
    // The log allowance is one line a second with bursts of ten, server-wide; how many lines
    // this cost depends on how long the flood took, never on how many packets it had.
    let allowance = h.metrics().peer_violation_lines();
    assert!(allowance >= 1, "the first violation is logged");
    assert!(
        allowance <= 10 + 60,
        "{allowance} lines for {N} bad packets"
    );
    drop(agent);
    h.finish().await;
}
