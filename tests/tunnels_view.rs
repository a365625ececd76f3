//! The admin port's `/tunnels` (and `POST /tunnels/ID/close`) and the `konnectivity-server
//! tunnels` command, against our server in-process with our agent (real sockets, real TLS,
//! real destinations) or the test agent where the test must choose which agent gets a dial.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod common;

use clap::Parser;
use common::*;
use kube_traffic::agent::{self, AgentConfig, AgentListeners, AgentOptions, RunningAgent};
use kube_traffic::proto::packet::Payload;
use kube_traffic::proto::Packet;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const SERVER: &str = env!("CARGO_BIN_EXE_konnectivity-server");

/// Starts our agent against `h`'s agent port.
async fn start_agent(h: &Harness, id: &str) -> RunningAgent {
    let mut args = h.agent_args(id);
    args.extend([
        "--sync-interval=100ms".into(),
        "--sync-interval-cap=1s".into(),
    ]);
    let options = AgentOptions::try_parse_from(&args).expect("agent flags parse");
    let config = AgentConfig::from_options(&options).expect("agent flags validate");
    let snapshot = agent::Snapshot::build(config).expect("agent TLS loads");
    let bind = || TcpListener::bind("127.0.0.1:0");
    let listeners = AgentListeners {
        health: bind().await.unwrap(),
        admin: bind().await.unwrap(),
    };
    let running = agent::spawn(snapshot, listeners);
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
                let (mut r, mut w) = conn.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

/// A destination that writes `bytes` to each connection, then holds it open.
async fn talker(bytes: usize) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let _ = conn.write_all(&vec![7u8; bytes]).await;
                let mut sink = [0u8; 1024];
                while matches!(conn.read(&mut sink).await, Ok(n) if n > 0) {}
            });
        }
    });
    addr
}

fn dial_rsp_of(packet: &Packet) -> (i64, i64, String) {
    match &packet.payload {
        Some(Payload::DialResponse(r)) => (r.random, r.connect_id, r.error.clone()),
        other => panic!("expected DIAL_RSP, got {other:?}"),
    }
}

/// Dials `address` through the server and its agent; returns the tunnel and its connect id.
async fn dial(frontend: &Frontend, address: &str, random: i64) -> (Tunnel, i64) {
    let mut tunnel = frontend.open().await;
    tunnel.send(dial_req(address, random)).await;
    let (got_random, connect_id, error) = dial_rsp_of(&tunnel.recv().await);
    assert_eq!((got_random, error.as_str()), (random, ""), "{address}");
    (tunnel, connect_id)
}

/// Sends `payload` and reads as many bytes back.
async fn echo(tunnel: &mut Tunnel, connect_id: i64, payload: &[u8]) {
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

/// One HTTP/1.1 request to `addr`; (status, body).
async fn http(addr: std::net::SocketAddr, method: &str, path: &str) -> (u16, String) {
    within(&format!("{method} {path}"), async {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.unwrap();
        let response = String::from_utf8(response).unwrap();
        let (head, body) = response.split_once("\r\n\r\n").unwrap();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        (status, body.to_string())
    })
    .await
}

/// A table line's cells: columns are set apart by at least three spaces, and a cell (the
/// peer: "unix socket") may hold one.
fn cells(line: &str) -> Vec<&str> {
    line.split("   ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect()
}

/// Runs the real binary; (exit code, stdout, stderr).
async fn server_command(args: Vec<String>) -> (i32, String, String) {
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(SERVER).args(&args).output()
    });
    let out = within("konnectivity-server tunnels", out)
        .await
        .unwrap()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn admin_port_args(h: &Harness) -> Vec<String> {
    vec![
        "tunnels".into(),
        "--admin-address=127.0.0.1".into(),
        format!("--admin-port={}", h.admin_addr.port()),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_tunnel_is_listed_with_its_bytes_each_way_and_in_the_table() {
    let h = Harness::start().await;
    let agent = start_agent(&h, "rust-agent").await;
    let echo_addr = echo_server().await.to_string();
    let frontend = h.frontend().await;
    let (mut tunnel, connect_id) = dial(&frontend, &echo_addr, 11).await;
    let mut sent = 0;
    for size in [1usize, 1000, 100_000] {
        let payload: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        echo(&mut tunnel, connect_id, &payload).await;
        sent += size as u64;
    }
    let listed = h
        .wait_tunnels("", "the tunnel's bytes", |t| {
            t.len() == 1 && t[0]["bytes_to_agent"] == sent && t[0]["bytes_to_frontend"] == sent
        })
        .await;
    let t = &listed[0];
    assert_eq!(t["connection_id"], connect_id, "{t}");
    assert_eq!(t["dial_id"], 11);
    assert_eq!(t["frontend"]["kind"], "grpc");
    assert!(t["frontend"]["peer"].is_string(), "{t}");
    assert_eq!(t["agent_id"], "rust-agent");
    assert_eq!(t["destination"], echo_addr.as_str());
    assert_eq!(t["state"], "established");
    assert_eq!(t["queued_bytes"], 0);
    assert_eq!(t["reader_stalled"], false);
    assert!(t["age_seconds"].as_f64().unwrap() >= 0.0);

    // The command prints it as a table, and the JSON as it is with -o json.
    let (code, stdout, stderr) = server_command(admin_port_args(&h)).await;
    assert_eq!(code, 0, "{stderr}");
    let lines: Vec<Vec<&str>> = stdout.lines().map(cells).collect();
    assert_eq!(
        lines[0],
        [
            "CONN",
            "DIAL",
            "FRONTEND",
            "PEER",
            "AGENT",
            "DESTINATION",
            "STATE",
            "AGE",
            "TX",
            "RX",
            "QUEUED",
            "STALLED"
        ],
        "{stdout}"
    );
    assert_eq!(lines.len(), 2, "{stdout}");
    let row = &lines[1];
    let (sent_text, id_text) = (sent.to_string(), connect_id.to_string());
    assert_eq!(row[0], id_text, "{stdout}");
    assert_eq!(row[1], "11");
    assert_eq!(row[2], "grpc");
    assert_eq!(row[3], listed[0]["frontend"]["peer"].as_str().unwrap());
    assert_eq!(row[4], "rust-agent");
    assert_eq!(row[5], echo_addr);
    assert_eq!(row[6], "established");
    assert_eq!(
        &row[8..],
        [sent_text.as_str(), sent_text.as_str(), "0", "no"]
    );
    let mut json_args = admin_port_args(&h);
    json_args.extend(["-o".into(), "json".into()]);
    let (code, stdout, _) = server_command(json_args).await;
    assert_eq!(code, 0);
    let parsed: Vec<Value> = serde_json::from_str(&stdout).unwrap();
    assert_eq!(parsed[0]["connection_id"], connect_id);
    // A filter that matches nothing leaves the header alone.
    let mut filtered = admin_port_args(&h);
    filtered.push("--agent=nobody".into());
    let (code, stdout, _) = server_command(filtered).await;
    assert_eq!((code, stdout.lines().count()), (0, 1), "{stdout}");

    tunnel.send(close_req(connect_id)).await;
    tunnel.recv().await;
    h.wait_gauges((0, 0)).await;
    h.wait_tunnels("", "an empty list", |t| t.is_empty()).await;
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frontend_that_does_not_read_shows_a_stalled_reader_and_queued_bytes() {
    // Limits far above what the destination writes, so the tunnel stays open to be looked at.
    let h = Harness::start_with(&["--frontend-queue-stall-timeout=10m"]).await;
    let agent = start_agent(&h, "rust-agent").await;
    let destination = talker(8 << 20).await.to_string();
    let frontend = h.frontend().await;
    let (tunnel, _) = dial(&frontend, &destination, 5).await;
    // The client reads nothing more.
    let listed = h
        .wait_tunnels("", "a stalled reader", |t| {
            t.len() == 1
                && t[0]["reader_stalled"] == true
                && t[0]["queued_bytes"].as_u64() > Some(0)
        })
        .await;
    let t = &listed[0];
    assert_eq!(t["state"], "established", "{t}");
    assert!(
        t["bytes_to_frontend"].as_u64().unwrap() < 8 << 20,
        "the frontend did not take it all: {t}"
    );
    drop(tunnel);
    h.wait_gauges((0, 0)).await;
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnels_are_filtered_by_agent_and_destination() {
    let h = Harness::start_with(&["--proxy-strategies=destHost"]).await;
    let mut a = h
        .agent_with(&[
            ("agentid", "agent-a"),
            ("agentidentifiers", "host=a.example"),
        ])
        .await
        .unwrap();
    let mut b = h
        .agent_with(&[
            ("agentid", "agent-b"),
            ("agentidentifiers", "host=b.example"),
        ])
        .await
        .unwrap();
    h.wait_agents(2).await;
    let frontend = h.frontend().await;
    // The same connect id on both agents: ids are per agent stream.
    let mut to_a = h.pending_dial(&frontend, &mut a, "a.example:443", 1).await;
    a.send(dial_rsp(1, 100, "")).await;
    assert_eq!(to_a.recv().await, dial_rsp(1, 100, ""));
    let mut to_b = h.pending_dial(&frontend, &mut b, "b.example:80", 2).await;
    b.send(dial_rsp(2, 100, "")).await;
    assert_eq!(to_b.recv().await, dial_rsp(2, 100, ""));
    // And one dial the agent has not answered yet.
    let _pending = h.pending_dial(&frontend, &mut b, "b.example:8080", 3).await;

    let all = h.tunnels("").await;
    assert_eq!(all.len(), 3, "{all:#?}");
    let only = |list: Vec<Value>| -> Vec<(String, String)> {
        let mut v: Vec<_> = list
            .iter()
            .map(|t| {
                (
                    t["destination"].as_str().unwrap().to_string(),
                    t["state"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        v.sort();
        v
    };
    let pair = |d: &str, s: &str| (d.to_string(), s.to_string());
    assert_eq!(
        only(h.tunnels("?agent=agent-a").await),
        [pair("a.example:443", "established")]
    );
    assert_eq!(
        only(h.tunnels("?agent=agent-b").await),
        [
            pair("b.example:80", "established"),
            pair("b.example:8080", "pending")
        ]
    );
    assert_eq!(
        only(h.tunnels("?destination=b.example:80").await),
        [pair("b.example:80", "established")]
    );
    assert_eq!(
        only(h.tunnels("?destination=b.example").await),
        [
            pair("b.example:80", "established"),
            pair("b.example:8080", "pending")
        ]
    );
    assert!(
        h.tunnels("?destination=b.exam").await.is_empty(),
        "not a substring match"
    );
    assert!(h
        .tunnels("?agent=agent-a&destination=b.example")
        .await
        .is_empty());
    let pending = h.tunnels("?destination=b.example:8080").await;
    assert_eq!(pending[0]["connection_id"], Value::Null);
    assert_eq!(pending[0]["dial_id"], 3);
    let (status, body) = http(h.admin_addr, "GET", "/tunnels?agnet=x").await;
    assert_eq!(status, 400, "{body}");

    // Closing id 100 names two tunnels; with the agent named, only that one closes.
    h.reconfigure(&["--proxy-strategies=destHost", "--enable-tunnel-close"]);
    let (status, body) = http(h.admin_addr, "POST", "/tunnels/100/close").await;
    assert_eq!(status, 409, "{body}");
    let (status, body) = http(h.admin_addr, "POST", "/tunnels/100/close?agent=agent-b").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        b.recv().await,
        close_req(100),
        "the agent is asked to close it"
    );
    assert_eq!(
        to_b.recv().await,
        close_rsp(100, ""),
        "the frontend is told"
    );
    b.send(close_rsp(100, "")).await;
    let left = h
        .wait_tunnels("?agent=agent-b", "agent-b's closed tunnel to go", |t| {
            t.len() == 1
        })
        .await;
    assert_eq!(left[0]["state"], "pending");
    assert_eq!(
        h.tunnels("?agent=agent-a").await.len(),
        1,
        "agent-a's tunnel is untouched"
    );
    let (status, _) = http(h.admin_addr, "POST", "/tunnels/100/close?agent=agent-b").await;
    assert_eq!(status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_is_closed_on_request_only_when_enabled_and_ends_on_both_sides() {
    let h = Harness::start().await;
    let agent = start_agent(&h, "rust-agent").await;
    let echo_addr = echo_server().await.to_string();
    let frontend = h.frontend().await;
    let (mut tunnel, connect_id) = dial(&frontend, &echo_addr, 21).await;
    echo(&mut tunnel, connect_id, b"hello").await;

    let path = format!("/tunnels/{connect_id}/close");
    let (status, body) = http(h.admin_addr, "POST", &path).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("--enable-tunnel-close"), "{body}");
    let mut close_args = admin_port_args(&h);
    close_args.extend(["close".into(), connect_id.to_string()]);
    let (code, _, stderr) = server_command(close_args.clone()).await;
    assert_eq!(code, 1);
    assert!(
        stderr.contains("403") && stderr.contains("--enable-tunnel-close"),
        "{stderr}"
    );
    assert_eq!(h.tunnels("").await.len(), 1, "nothing was closed");
    let (status, _) = http(h.admin_addr, "GET", &path).await;
    assert_eq!(status, 405, "a close is a POST");

    // Reloadable: the next request reads the new snapshot.
    h.reconfigure(&["--enable-tunnel-close"]);
    let (code, stdout, stderr) = server_command(close_args).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains(&format!("closed tunnel {connect_id}")),
        "{stdout}"
    );
    // The frontend gets its CLOSE_RSP and the stream ends; the agent closes its end.
    let packet = tunnel.recv().await;
    assert!(
        matches!(&packet.payload, Some(Payload::CloseResponse(c)) if c.connect_id == connect_id && c.error.is_empty()),
        "{packet:?}"
    );
    eventually(
        "the agent's tunnel table to empty",
        || agent.tunnels() == 0 && agent.metrics().open_endpoints() == 0,
        || format!("{} tunnels", agent.tunnels()),
    )
    .await;
    h.wait_gauges((0, 0)).await;
    h.wait_tunnels("", "an empty list (the agent confirmed the close)", |t| {
        t.is_empty()
    })
    .await;
    let (status, _) = http(h.admin_addr, "POST", &path).await;
    assert_eq!(status, 404);
    assert_eq!(h.metrics().frontend.queued_bytes.get(), 0);
    drop(tunnel);
    agent.stop().await;
}
