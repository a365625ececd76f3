use super::*;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![
        (payload.len() >> 16) as u8,
        (payload.len() >> 8) as u8,
        payload.len() as u8,
        kind,
        flags,
    ];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

fn ack(seq: u32) -> Vec<u8> {
    let mut payload = MARKER.to_vec();
    payload.extend_from_slice(&seq.to_be_bytes());
    frame(TYPE_PING, FLAG_ACK, 0, &payload)
}

/// A stream as a client writes it: preface, SETTINGS, a DATA frame, our ACK, a foreign
/// PING ACK, a PING (not an ACK) with our marker, and a zero-length frame.
fn client_stream(seq: u32) -> (Vec<u8>, Vec<u8>) {
    let mut with = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    with.extend(frame(0x4, 0, 0, &[0, 3, 0, 0, 0, 100]));
    // A DATA payload that contains bytes looking like our ACK: not at a boundary.
    with.extend(frame(0x0, 0, 1, &ack(seq)));
    let before_ours = with.len();
    with.extend(ack(seq));
    let after_ours = with.len();
    with.extend(frame(TYPE_PING, FLAG_ACK, 0, b"h2-own!!"));
    let mut not_ack = MARKER.to_vec();
    not_ack.extend_from_slice(&seq.to_be_bytes());
    with.extend(frame(TYPE_PING, 0, 0, &not_ack));
    with.extend(frame(0x4, FLAG_ACK, 0, &[]));
    let mut without = with[..before_ours].to_vec();
    without.extend_from_slice(&with[after_ours..]);
    (with, without)
}

fn handle_expecting(seq: u32) -> PingHandle {
    let handle = PingHandle::new();
    handle.0.requested.store(seq, Ordering::Release);
    handle.0.sent.store(seq, Ordering::Release);
    handle.0.asked_at.store(1, Ordering::Release);
    handle
}

#[test]
fn only_our_acks_at_frame_boundaries_are_taken_out_whatever_the_read_sizes() {
    let (with, without) = client_stream(7);
    for chunk in [1, 2, 5, 9, 16, 17, 18, 40, with.len()] {
        let handle = handle_expecting(7);
        let mut frames = Frames::with_preface(CLIENT_PREFACE_LEN);
        let mut out = Vec::new();
        for piece in with.chunks(chunk) {
            let mut piece = piece.to_vec();
            let n = strip_acks(
                &mut frames,
                &handle,
                &mut LinkWindow::new(),
                &mut false,
                &mut piece,
            );
            out.extend_from_slice(&piece[..n]);
        }
        if chunk == with.len() {
            assert_eq!(out, without);
        }
        // Split reads may let our ACK through to h2, never anything else, and never lose
        // a byte of h2's; either way the answer is counted.
        assert!(out == without || out == with, "chunk {chunk}");
        assert!(frames.at_boundary());
        assert!(handle.unanswered_since().is_none(), "chunk {chunk}");
        assert!(handle.last_answer().is_some(), "chunk {chunk}");
    }
}

#[test]
fn an_answer_to_an_older_ping_does_not_count() {
    let handle = handle_expecting(3);
    handle.answered(2);
    assert!(handle.unanswered_since().is_some());
    handle.answered(3);
    assert!(handle.unanswered_since().is_none());
}

#[test]
fn a_ping_is_asked_for_once_until_answered() {
    let handle = PingHandle::new();
    assert!(!handle.awaiting());
    handle.ping();
    handle.ping();
    assert_eq!(handle.0.requested.load(Ordering::Acquire), 1);
    assert!(handle.awaiting());
    handle.0.sent.store(1, Ordering::Release);
    handle.answered(1);
    assert!(!handle.awaiting());
    handle.ping();
    assert_eq!(handle.0.requested.load(Ordering::Acquire), 2);
}

/// Against h2 itself: a real h2 client and server over a duplex pipe, the server's side
/// wrapped. The PING goes out between h2's frames, the client's h2 answers it, the answer
/// is seen and kept from the server's h2, and requests on the connection still work.
#[tokio::test]
async fn pings_between_h2_frames_are_answered_and_h2_never_sees_them() {
    let (client_io, server_io) = tokio::io::duplex(64 << 10);
    let (server_io, handle) = PingIo::new(server_io);
    let server = tokio::spawn(async move {
        let mut conn = h2::server::handshake(server_io).await.unwrap();
        while let Some(request) = conn.accept().await {
            let (request, mut respond) = request.unwrap();
            let mut body = request.into_body();
            let mut got = Vec::new();
            while let Some(chunk) = body.data().await {
                let chunk = chunk.unwrap();
                body.flow_control().release_capacity(chunk.len()).unwrap();
                got.extend_from_slice(&chunk);
            }
            let mut send = respond
                .send_response(http::Response::new(()), false)
                .unwrap();
            send.send_data(got.into(), true).unwrap();
        }
    });
    let (mut client, conn) = h2::client::handshake(client_io).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    for round in 0..3u8 {
        handle.ping();
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        while handle.awaiting() {
            // Traffic on the connection in the meantime, so a PING has to find its
            // place between frames.
            let request = http::Request::post("http://x/").body(()).unwrap();
            let (response, mut send) = client.send_request(request, false).unwrap();
            send.send_data(vec![round; 3000].into(), true).unwrap();
            let mut body = response.await.unwrap().into_body();
            let mut echoed = Vec::new();
            while let Some(chunk) = body.data().await {
                let chunk = chunk.unwrap();
                body.flow_control().release_capacity(chunk.len()).unwrap();
                echoed.extend_from_slice(&chunk);
            }
            assert_eq!(echoed, vec![round; 3000]);
            assert!(Instant::now() < deadline, "the PING was never answered");
        }
        assert!(handle.last_answer().is_some());
    }
    // With nothing else on the connection, a PING still goes out and is answered.
    handle.ping();
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    while handle.awaiting() {
        assert!(
            Instant::now() < deadline,
            "an idle connection's PING was never answered"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    // A killed connection fails its reads: the server's h2 ends.
    handle.kill();
    let ended = tokio::time::timeout(std::time::Duration::from_secs(10), server).await;
    assert!(ended.is_ok(), "the killed connection did not end");
}

/// Serves h2 over `io` (wrapped) with a large stream window, as the agent port does: each
/// request's body is read whole (`read` says whether the app reads at all) and answered
/// with its length and a checksum.
fn paced_server(
    io: tokio::io::DuplexStream,
    read: bool,
) -> tokio::task::JoinHandle<Result<(), h2::Error>> {
    let (io, _handle) = PingIo::new(io);
    tokio::spawn(async move {
        let mut conn = h2::server::Builder::new()
            .initial_window_size(8 << 20)
            .initial_connection_window_size(32 << 20)
            .handshake::<_, bytes::Bytes>(io)
            .await?;
        while let Some(request) = conn.accept().await {
            let (request, mut respond) = request?;
            tokio::spawn(async move {
                let mut body = request.into_body();
                if !read {
                    std::future::pending::<()>().await;
                }
                let (mut len, mut sum) = (0u64, 0u64);
                while let Some(chunk) = body.data().await {
                    let chunk = chunk.unwrap();
                    body.flow_control().release_capacity(chunk.len()).unwrap();
                    len += chunk.len() as u64;
                    sum = chunk
                        .iter()
                        .fold(sum, |s, b| s.wrapping_mul(31).wrapping_add(u64::from(*b)));
                }
                let mut send = respond
                    .send_response(http::Response::new(()), false)
                    .unwrap();
                send.send_data(format!("{len} {sum}").into_bytes().into(), true)
                    .unwrap();
            });
        }
        Ok(())
    })
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed))
        .collect()
}

fn checksum(data: &[u8]) -> u64 {
    data.iter()
        .fold(0u64, |s, b| s.wrapping_mul(31).wrapping_add(u64::from(*b)))
}

async fn upload(client: &mut h2::client::SendRequest<bytes::Bytes>, data: Vec<u8>) -> String {
    let request = http::Request::post("http://x/").body(()).unwrap();
    let (response, mut send) = client.send_request(request, false).unwrap();
    let mut rest = bytes::Bytes::from(data);
    while !rest.is_empty() {
        send.reserve_capacity(rest.len().min(1 << 20));
        let got = std::future::poll_fn(|cx| send.poll_capacity(cx))
            .await
            .unwrap()
            .unwrap();
        let chunk = rest.split_to(got.min(rest.len()));
        send.send_data(chunk, rest.is_empty()).unwrap();
    }
    let mut body = response.await.unwrap().into_body();
    let mut out = Vec::new();
    while let Some(chunk) = body.data().await {
        out.extend_from_slice(&chunk.unwrap());
    }
    String::from_utf8(out).unwrap()
}

/// Against h2 on both sides: the rewritten SETTINGS, held-back WINDOW_UPDATEs and our own
/// never make either h2 see a flow-control error; a second stream (not paced) moves too;
/// every byte arrives. With a pipe of a few dozen bytes, frames are split across writes.
#[tokio::test]
async fn a_paced_stream_and_another_carry_every_byte_with_any_write_sizes() {
    for pipe in [64 << 10, 100, 33] {
        let (client_io, server_io) = tokio::io::duplex(pipe);
        let server = paced_server(server_io, true);
        let (mut client, conn) = h2::client::handshake(client_io).await.unwrap();
        let conn = tokio::spawn(conn);
        let size = if pipe < 1000 { 300 << 10 } else { 12 << 20 };
        let first = pattern(size, 1);
        let want = format!("{} {}", first.len(), checksum(&first));
        assert_eq!(upload(&mut client, first).await, want, "pipe {pipe}");
        let second = pattern(size / 2, 2);
        let want2 = format!("{} {}", second.len(), checksum(&second));
        let mut other = client.clone();
        let third = pattern(size / 3, 3);
        let want3 = format!("{} {}", third.len(), checksum(&third));
        let (a, b) = tokio::join!(upload(&mut other, second), upload(&mut client, third));
        assert_eq!((a, b), (want2, want3), "pipe {pipe}");
        drop(client);
        drop(other);
        let _ = conn.await;
        server.abort();
    }
}

/// A server app that does not read: the client can send h2's window on the paced stream,
/// no more, and neither side errs.
#[tokio::test]
async fn an_app_that_does_not_read_holds_the_peer_at_h2s_window() {
    let (client_io, server_io) = tokio::io::duplex(64 << 10);
    let server = paced_server(server_io, false);
    let (mut client, conn): (h2::client::SendRequest<bytes::Bytes>, _) =
        h2::client::handshake(client_io).await.unwrap();
    let conn = tokio::spawn(conn);
    let request = http::Request::post("http://x/").body(()).unwrap();
    let (_response, mut send) = client.send_request(request, false).unwrap();
    let mut sent = 0usize;
    loop {
        send.reserve_capacity(1 << 20);
        let got = tokio::time::timeout(
            std::time::Duration::from_millis(500),
            std::future::poll_fn(|cx| send.poll_capacity(cx)),
        )
        .await;
        let Ok(Some(Ok(n))) = got else { break };
        send.send_data(vec![0u8; n].into(), false).unwrap();
        sent += n;
        assert!(sent <= 8 << 20, "sent {sent}, past h2's window");
    }
    assert_eq!(sent, 8 << 20, "h2's window, all of it, in the end");
    assert!(!conn.is_finished(), "the connection is still up");
    server.abort();
}
