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
        let mut frames = Frames {
            preface: CLIENT_PREFACE_LEN,
            ..Frames::default()
        };
        let mut out = Vec::new();
        for piece in with.chunks(chunk) {
            let mut piece = piece.to_vec();
            let n = strip_acks(&mut frames, &handle, &mut piece);
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
