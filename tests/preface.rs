//! The server's side of the HTTP/2 connection preface, seen byte by byte on the frontend
//! socket: its SETTINGS and the WINDOW_UPDATE that raises the connection's receive window
//! arrive together, before the client has sent anything, and the window is raised once.

#![allow(clippy::unwrap_used)]

mod common;

use common::raw_h2::{frame, frames, read_frame, ACK, PING, PREFACE, SETTINGS, WINDOW_UPDATE};
use common::{within, Harness};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// The connection window the server gives every connection (32 MiB), less the 65,535 bytes
/// every HTTP/2 connection starts with.
const INCREMENT: u32 = (32 << 20) - 65_535;

#[tokio::test]
async fn settings_and_the_connection_window_come_in_one_write_and_the_window_is_raised_once() {
    let harness = Harness::start().await;
    let mut conn = UnixStream::connect(&harness.uds).await.unwrap();

    // Nothing sent yet. One read takes all that one write of the server put on the socket
    // (a Unix stream socket queues a write's bytes as a whole), so both frames in this read
    // means one write; a server that raised the window only after the client's preface
    // would have sent its SETTINGS alone by now.
    let mut first = vec![0u8; 4096];
    let n = within("the server's preface", conn.read(&mut first))
        .await
        .unwrap();
    let sent = frames(&first[..n]);
    assert_eq!(sent.len(), 2, "SETTINGS and WINDOW_UPDATE in one write");
    assert_eq!(
        (sent[0].kind, sent[0].flags, sent[0].stream),
        (SETTINGS, 0, 0)
    );
    assert_eq!((sent[1].kind, sent[1].stream), (WINDOW_UPDATE, 0));
    assert_eq!(sent[1].payload, INCREMENT.to_be_bytes());

    // The client's preface and SETTINGS, then a PING, and once its ACK is in, another: up to
    // the second ACK, nothing raises the connection window again. h2 counts the increment
    // above as sent; were it not counted, a second WINDOW_UPDATE would go out at the end of
    // the server's first turn on the connection, in the write that carries the first PING's
    // ACK or one before it, and so before the second ACK.
    let mut out = PREFACE.to_vec();
    out.extend(frame(SETTINGS, 0, 0, &[]));
    conn.write_all(&out).await.unwrap();
    let mut settings_acked = false;
    for payload in [b"preface1", b"preface2"] {
        let ping = frame(PING, 0, 0, payload);
        conn.write_all(&ping).await.unwrap();
        loop {
            let frame = read_frame(&mut conn).await;
            assert!(
                !(frame.kind == WINDOW_UPDATE && frame.stream == 0),
                "a second connection WINDOW_UPDATE"
            );
            settings_acked |= frame.kind == SETTINGS && frame.flags & ACK != 0;
            if frame.kind == PING && frame.flags & ACK != 0 {
                assert_eq!(frame.payload, payload);
                break;
            }
        }
    }
    assert!(settings_acked, "the client's SETTINGS acknowledged");
}
