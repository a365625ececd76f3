//! The `:authority` values that grpc-go and the upstream agent send, and that h2 alone would
//! refuse, sent at a real server: HTTP/2 frames and HPACK written by hand on one connection
//! over the frontend socket, so that no client library tidies them first.
//!
//! One connection carries, in order: grpc-go's percent-encoded socket path (a literal that
//! enters the dynamic table), the upstream agent's unbracketed `::1:8091` (a literal that does
//! not), and a request whose `:authority` is an indexed reference to the first one's table
//! entry. Every stream must open: its DIAL_REQ reaches the agent, and the server answers each
//! with response HEADERS, never RST_STREAM or GOAWAY.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;

use common::raw_h2::{
    frame, read_frame, ACK, DATA, END_HEADERS, GOAWAY, HEADERS, PREFACE, RST_STREAM, SETTINGS,
};
use common::{dial_req, dial_rsp, Harness};
use prost::Message;
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;

/// An HPACK string literal, not Huffman-coded (all lengths here are under 127).
fn literal(s: &str) -> Vec<u8> {
    assert!(s.len() < 127);
    let mut out = vec![s.len() as u8];
    out.extend_from_slice(s.as_bytes());
    out
}

/// A literal field with incremental indexing whose name is static-table entry `index`.
fn indexed_name_incremental(index: u8, value: &str) -> Vec<u8> {
    let mut out = vec![0x40 | index];
    out.extend(literal(value));
    out
}

/// The static-table entries this test uses (RFC 7541 Appendix A).
const METHOD_POST: u8 = 0x83;
const SCHEME_HTTP: u8 = 0x86;
const NAME_AUTHORITY: u8 = 1;
const NAME_PATH: u8 = 4;
const NAME_CONTENT_TYPE: u8 = 31;

/// A gRPC message on the wire: uncompressed flag, length, then the message.
fn grpc_message(packet: &kube_traffic::proto::Packet) -> Vec<u8> {
    let body = packet.encode_to_vec();
    let mut out = vec![0];
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend(body);
    out
}

#[tokio::test]
async fn invalid_authorities_from_real_clients_open_their_streams() {
    let harness = Harness::start().await;
    let mut agent = harness.agent("authority-agent").await;
    let mut conn = UnixStream::connect(&harness.uds).await.unwrap();

    // Stream 1, as grpc-go over a Unix socket: every field a literal with incremental
    // indexing, so after this block the dynamic table is (newest first) te, content-type,
    // :authority, :path: indices 62, 63, 64, 65.
    let mut first = vec![METHOD_POST, SCHEME_HTTP];
    first.extend(indexed_name_incremental(NAME_PATH, "/ProxyService/Proxy"));
    first.extend(indexed_name_incremental(
        NAME_AUTHORITY,
        "%2Ftmp%2Fkonnectivity-server.sock",
    ));
    first.extend(indexed_name_incremental(
        NAME_CONTENT_TYPE,
        "application/grpc",
    ));
    first.push(0x40);
    first.extend(literal("te"));
    first.extend(literal("trailers"));
    // Stream 3, as the upstream agent given --proxy-server-host=::1: the authority a literal
    // without indexing; the other fields indexed from the dynamic table.
    let mut second = vec![METHOD_POST, SCHEME_HTTP, 0x80 | 65, NAME_AUTHORITY];
    second.extend(literal("::1:8091"));
    second.extend([0x80 | 63, 0x80 | 62]);
    // Stream 5: the authority an indexed reference to stream 1's entry, which h2 holds as
    // the mended value; the table is as after stream 1, since stream 3 added nothing.
    let third = vec![
        METHOD_POST,
        SCHEME_HTTP,
        0x80 | 65,
        0x80 | 64,
        0x80 | 63,
        0x80 | 62,
    ];

    let mut out = PREFACE.to_vec();
    out.extend(frame(SETTINGS, 0, 0, &[]));
    for (stream, block) in [(1u32, &first), (3, &second), (5, &third)] {
        out.extend(frame(HEADERS, END_HEADERS, stream, block));
        let dial = dial_req(&format!("10.0.0.{stream}:443"), stream.into());
        out.extend(frame(DATA, 0, stream, &grpc_message(&dial)));
    }
    conn.write_all(&out).await.unwrap();

    // Each stream's DIAL_REQ reaches the agent, which answers it; the response HEADERS come
    // with the DIAL_RSP, as from upstream's server.
    for stream in [1i64, 3, 5] {
        assert_eq!(
            agent.recv().await,
            dial_req(&format!("10.0.0.{stream}:443"), stream),
            "stream {stream}'s DIAL_REQ reaches the agent"
        );
        agent.send(dial_rsp(stream, 100 + stream, "")).await;
    }

    // The server's frames: SETTINGS (acknowledged here), then response HEADERS per stream.
    let mut responded: HashMap<u32, u8> = HashMap::new();
    while responded.len() < 3 {
        let common::raw_h2::Frame {
            kind,
            flags,
            stream,
            payload,
        } = read_frame(&mut conn).await;
        assert!(
            kind != RST_STREAM && kind != GOAWAY,
            "the server refused stream {stream} (frame type {kind}, payload {payload:?})"
        );
        if kind == SETTINGS && flags & ACK == 0 {
            conn.write_all(&frame(SETTINGS, ACK, 0, &[])).await.unwrap();
        }
        if kind == HEADERS {
            responded.insert(stream, flags);
        }
    }
    assert_eq!(
        responded
            .keys()
            .copied()
            .collect::<std::collections::BTreeSet<_>>(),
        [1, 3, 5].into()
    );

    drop(conn);
    drop(agent);
    harness.wait_gauges((0, 0)).await;
    harness.finish().await;
}
