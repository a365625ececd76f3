//! The destination policy at the server, on both frontends: a denied range, a denied port and a
//! denied name are refused before any agent hears of them, with the right reply and counter;
//! a reload changes the policy of the next dial and leaves open tunnels alone.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use kube_traffic::proto::packet::Payload;
use kube_traffic::proto::Packet;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

const POLICY: &str = "--deny-destinations=169.254.0.0/16,10.0.0.0/8:22,*.internal";
const REFUSED: &str = "destination not allowed by policy";

/// Sends a DIAL_REQ for `address` on a new tunnel and returns the tunnel's first packet.
async fn dial_reply(fe: &Frontend, address: &str, random: i64) -> (Tunnel, Packet) {
    let mut t = fe.open().await;
    t.send(dial_req(address, random)).await;
    let reply = t.recv().await;
    (t, reply)
}

#[tokio::test]
async fn grpc_dials_to_denied_destinations_are_refused_before_any_agent() {
    let h = Harness::start_with(&[POLICY]).await;
    let mut agent = h.agent("policy-agent").await;
    let fe = h.frontend().await;
    for (random, address, rule) in [
        (1, "169.254.169.254:80", "169.254.0.0/16"),
        (2, "10.1.2.3:22", "10.0.0.0/8:22"),
        (3, "metadata.google.internal:80", "*.internal"),
    ] {
        let (_t, reply) = dial_reply(&fe, address, random).await;
        assert_eq!(reply, dial_rsp(random, 0, REFUSED), "{address}");
        assert_eq!(h.metrics().dial.destinations_refused(rule), 1, "{address}");
    }
    // Nothing reached the agent: the next packet it sees is the allowed dial.
    let mut t = fe.open().await;
    t.send(dial_req("10.1.2.3:443", 4)).await;
    assert_eq!(agent.recv().await, dial_req("10.1.2.3:443", 4));
    agent.send(dial_rsp(4, 4, "")).await;
    assert_eq!(t.recv().await, dial_rsp(4, 4, ""));
    drop(t);
    drop((fe, agent));
    h.finish().await;
}

#[tokio::test]
async fn http_connect_to_denied_destinations_is_forbidden() {
    let h = Harness::start_with(&["--mode=http-connect", POLICY]).await;
    let mut agent = h.agent("policy-agent").await;
    for (address, rule) in [
        ("169.254.169.254:80", "169.254.0.0/16"),
        ("10.1.2.3:22", "10.0.0.0/8:22"),
        ("vault.internal:8200", "*.internal"),
    ] {
        let mut client = UnixStream::connect(&h.uds).await.unwrap();
        let request = format!("CONNECT {address} HTTP/1.1\r\nHost: {address}\r\n\r\n");
        client.write_all(request.as_bytes()).await.unwrap();
        let mut reply = Vec::new();
        within("the reply and close", client.read_to_end(&mut reply))
            .await
            .unwrap();
        let reply = String::from_utf8(reply).unwrap();
        assert!(
            reply.starts_with("HTTP/1.1 403 Forbidden\r\n")
                && reply.ends_with(&format!("{REFUSED}\r\n")),
            "{address}: {reply:?}"
        );
        assert_eq!(h.metrics().dial.destinations_refused(rule), 1, "{address}");
    }
    // An allowed CONNECT still reaches the agent, and is the first thing it sees.
    let mut client = UnixStream::connect(&h.uds).await.unwrap();
    client
        .write_all(b"CONNECT 10.1.2.3:443 HTTP/1.1\r\nHost: 10.1.2.3:443\r\n\r\n")
        .await
        .unwrap();
    match agent.recv().await.payload {
        Some(Payload::DialRequest(req)) => assert_eq!(req.address, "10.1.2.3:443"),
        other => panic!("expected the allowed DIAL_REQ, got {other:?}"),
    }
    drop(client);
    drop(agent);
    h.finish().await;
}

#[tokio::test]
async fn a_reload_applies_to_the_next_dial_and_not_to_open_tunnels() {
    let h = Harness::start().await;
    let mut agent = h.agent("policy-agent").await;
    let fe = h.frontend().await;
    let mut open = h.establish(&fe, &mut agent, 1, 1).await;

    h.reconfigure(&[
        "--allow-destinations=10.0.0.0/8:443",
        "--deny-destinations=10.0.0.1",
    ]);
    // The open tunnel (to 10.0.0.1:443, now denied) carries on both ways.
    open.send(data(1, &b"ping"[..])).await;
    assert_eq!(agent.recv().await, data(1, &b"ping"[..]));
    agent.send(data(1, &b"pong"[..])).await;
    assert_eq!(open.recv().await, data(1, &b"pong"[..]));
    // New dials meet the new policy: denied, not allowed, allowed.
    let (refused, reply) = dial_reply(&fe, "10.0.0.1:443", 2).await;
    assert_eq!(reply, dial_rsp(2, 0, REFUSED));
    drop(refused);
    let (refused, reply) = dial_reply(&fe, "192.168.0.1:443", 3).await;
    assert_eq!(reply, dial_rsp(3, 0, REFUSED));
    drop(refused);
    assert_eq!(h.metrics().dial.destinations_refused("10.0.0.1"), 1);
    assert_eq!(h.metrics().dial.destinations_refused("allow-list"), 1);
    let t = fe.open().await;
    t.send(dial_req("10.0.0.2:443", 4)).await;
    assert_eq!(agent.recv().await, dial_req("10.0.0.2:443", 4));

    // And back: with the lists empty again, the denied address is dialled.
    h.reconfigure(&[]);
    let again = fe.open().await;
    again.send(dial_req("10.0.0.1:443", 5)).await;
    assert_eq!(agent.recv().await, dial_req("10.0.0.1:443", 5));
    drop((open, t, again));
    drop((fe, agent));
    h.finish().await;
}

#[test]
fn a_bad_rule_names_its_flag() {
    let args = [
        "konnectivity-server",
        "--uds-name=/tmp/x.sock",
        "--server-port=0",
        "--deny-destinations=10.0.0.0/33",
    ];
    let options = kube_traffic::config::Options::parse_from_args(args).unwrap();
    let err = kube_traffic::config::Config::from_options(&options)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--deny-destinations") && err.contains("10.0.0.0/33"),
        "{err}"
    );
}
