//! The HTTP-CONNECT frontend's request parsing, against Go's http.Server on real sockets: its
//! header limits, its status codes for malformed requests, and a connection kept after a 405.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod common;

use common::*;
use kube_traffic::proto::packet::Payload;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

async fn http_connect_server() -> (Harness, TestAgent) {
    let h = Harness::start_with(&["--mode=http-connect"]).await;
    let agent = h.agent("agent-http").await;
    (h, agent)
}

/// Sends `request` on a fresh connection and reads the whole reply (the server closes).
async fn exchange(h: &Harness, request: &[u8]) -> String {
    let mut client = UnixStream::connect(&h.uds).await.unwrap();
    client.write_all(request).await.unwrap();
    let mut reply = Vec::new();
    within("the reply and close", client.read_to_end(&mut reply))
        .await
        .unwrap();
    String::from_utf8(reply).unwrap()
}

/// The address of the next DIAL_REQ at `agent`, and its dial id.
async fn next_dial(agent: &mut TestAgent) -> (String, i64) {
    match agent.recv().await.payload {
        Some(Payload::DialRequest(req)) => (req.address, req.random),
        other => panic!("expected a DIAL_REQ, got {other:?}"),
    }
}

/// Sends `CONNECT address` on `client`, has `agent` accept the dial as `connect_id`, and reads
/// the 200.
async fn connect_through(
    client: &mut UnixStream,
    agent: &mut TestAgent,
    address: &str,
    connect_id: i64,
) {
    let request = format!("CONNECT {address} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    client.write_all(request.as_bytes()).await.unwrap();
    let (dialed, random) = next_dial(agent).await;
    assert_eq!(dialed, address);
    agent.send(dial_rsp(random, connect_id, "")).await;
    let mut head = [0u8; 39];
    within("the 200", client.read_exact(&mut head))
        .await
        .unwrap();
    assert_eq!(&head, b"HTTP/1.1 200 Connection Established\r\n\r\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_number_of_headers_within_the_size_limit_is_accepted() {
    let (h, mut agent) = http_connect_server().await;
    let mut request = String::from("CONNECT 10.0.0.1:443 HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    for i in 0..500 {
        request.push_str(&format!("X-Header-{i}: value {i}\r\n"));
    }
    request.push_str("\r\n");
    let mut client = UnixStream::connect(&h.uds).await.unwrap();
    client.write_all(request.as_bytes()).await.unwrap();
    let (address, random) = next_dial(&mut agent).await;
    assert_eq!(address, "10.0.0.1:443");
    agent.send(dial_rsp(random, 1, "")).await;
    let mut head = [0u8; 39];
    within("the 200", client.read_exact(&mut head))
        .await
        .unwrap();
    assert_eq!(&head, b"HTTP/1.1 200 Connection Established\r\n\r\n");
    drop(client);
    assert_eq!(agent.recv().await, close_req(1));
    drop(agent);
    h.finish().await;
}

/// Go reads up to MaxHeaderBytes (1 MiB) plus 4 KiB of bufio slack for a request head.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_over_1_mib_is_accepted_up_to_gos_slack() {
    let (h, mut agent) = http_connect_server().await;
    let head = |size: usize| {
        let mut request = String::from("CONNECT 10.0.0.2:443 HTTP/1.1\r\nHost: 127.0.0.1\r\n");
        let filler = size - request.len() - "X-Big: \r\n\r\n".len();
        request.push_str(&format!("X-Big: {}\r\n\r\n", "a".repeat(filler)));
        assert_eq!(request.len(), size);
        request
    };
    // 1 MiB + 2 KiB: accepted.
    let mut client = UnixStream::connect(&h.uds).await.unwrap();
    client
        .write_all(head((1 << 20) + 2048).as_bytes())
        .await
        .unwrap();
    let (address, random) = next_dial(&mut agent).await;
    assert_eq!(address, "10.0.0.2:443");
    agent
        .send(dial_rsp(
            random,
            0,
            "dial tcp 10.0.0.2:443: connect: connection refused",
        ))
        .await;
    let mut reply = String::new();
    within("the 502", client.read_to_string(&mut reply))
        .await
        .unwrap();
    assert!(reply.starts_with("HTTP/1.1 502 Bad Gateway\r\n"), "{reply}");
    // 1 MiB + 8 KiB: too large, 431 as Go answers it.
    let reply = exchange(&h, head((1 << 20) + 8192).as_bytes()).await;
    assert_eq!(
        reply,
        "HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n431 Request Header Fields Too Large"
    );
    drop(agent);
    h.finish().await;
}

/// Go dials `r.Host`: with an empty request-target that is the Host header, which the agent
/// cannot dial without a port, so the client gets the agent's error as a 502.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_target_dials_the_host_header_and_gets_502() {
    let (h, mut agent) = http_connect_server().await;
    let mut client = UnixStream::connect(&h.uds).await.unwrap();
    client
        .write_all(b"CONNECT  HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let (address, random) = next_dial(&mut agent).await;
    assert_eq!(address, "127.0.0.1");
    let error = "dial tcp: address 127.0.0.1: missing port in address";
    agent.send(dial_rsp(random, 0, error)).await;
    let mut reply = String::new();
    within("the 502", client.read_to_string(&mut reply))
        .await
        .unwrap();
    assert_eq!(
        reply,
        format!("HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n{error}")
    );
    drop(agent);
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_gos_status_codes() {
    let (h, agent) = http_connect_server().await;
    // A lowercase method is another method, whose authority-form target Go cannot parse: 400.
    assert_eq!(
        exchange(&h, b"connect 10.0.0.1:443 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").await,
        "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request"
    );
    assert_eq!(
        exchange(&h, b"CONNECT 10.0.0.1:443 HTTP/2.0\r\nHost: 127.0.0.1\r\n\r\n").await,
        "HTTP/1.1 505 HTTP Version Not Supported: unsupported protocol version\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n505 HTTP Version Not Supported: unsupported protocol version"
    );
    assert_eq!(
        exchange(&h, b"GET / HTTP/1.1\r\n\r\n").await,
        "HTTP/1.1 400 Bad Request: missing required Host header\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request: missing required Host header"
    );
    assert!(
        exchange(&h, b"CONNECT 10.0.0.1:443\r\n\r\n")
            .await
            .starts_with("HTTP/1.1 400 Bad Request\r\n"),
        "no protocol"
    );
    assert!(
        exchange(
            &h,
            b"CONNECT 10.0.0.1:443 HTTP/1.1\r\nNo colon here\r\n\r\n"
        )
        .await
        .starts_with("HTTP/1.1 400 Bad Request\r\n"),
        "a header line without a colon"
    );
    drop(agent);
    h.finish().await;
}

/// Go's http.Server keeps serving a connection after the handler's 405.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_stays_open_after_a_405() {
    let (h, mut agent) = http_connect_server().await;
    let mut client = UnixStream::connect(&h.uds).await.unwrap();
    client
        .write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let mut reply = Vec::new();
    loop {
        let mut byte = [0u8; 1];
        within("the 405", client.read_exact(&mut byte))
            .await
            .unwrap();
        reply.push(byte[0]);
        if reply.ends_with(b"CONNECT passthrough\n") {
            break;
        }
    }
    let reply = String::from_utf8(reply).unwrap();
    assert!(
        reply.starts_with("HTTP/1.1 405 Method Not Allowed\r\nContent-Type: text/plain; charset=utf-8\r\nX-Content-Type-Options: nosniff\r\nDate: "),
        "{reply}"
    );
    assert!(
        reply.ends_with(
            " GMT\r\nContent-Length: 45\r\n\r\nthis proxy only supports CONNECT passthrough\n"
        ),
        "{reply}"
    );
    // The same connection then carries a tunnel.
    connect_through(&mut client, &mut agent, "10.0.0.3:443", 9).await;
    drop(client);
    assert_eq!(agent.recv().await, close_req(9));
    // With `Connection: close` Go says so and closes.
    let reply = exchange(
        &h,
        b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(
        reply.contains("\r\nContent-Length: 45\r\nConnection: close\r\n\r\n"),
        "{reply}"
    );
    drop(agent);
    h.finish().await;
}

/// As `a_stop_with_no_tunnel_open_serves_a_connection_accepted_before_it` (tests/tunnel/drain.rs):
/// a CONNECT that arrives on a connection accepted before the stop began is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_serves_the_connect_of_a_connection_accepted_before_it() {
    let (h, mut agent) = http_connect_server().await;
    let mut client = UnixStream::connect(&h.uds).await.unwrap();
    let (shared, stopping) = h
        .stop_once_accepted(1, std::time::Duration::from_secs(60))
        .await;
    connect_through(&mut client, &mut agent, "10.0.0.1:443", 1).await;
    client.write_all(b"ping").await.unwrap();
    assert_eq!(agent.recv().await, data(1, "ping"));
    assert!(!stopping.is_finished(), "the drain waits for the tunnel");
    drop(client);
    within("the drain to end once the tunnel is released", stopping)
        .await
        .expect("the shutdown task");
    assert_eq!(shared.metrics.tunnel.established_connections.get(), 0);
    drop(agent);
}
