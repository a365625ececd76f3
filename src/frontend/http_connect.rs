//! The HTTP-CONNECT frontend (`--mode=http-connect`), over the Unix socket or TCP with mTLS.
//!
//! The request head is parsed here rather than by an HTTP server library because the wire
//! contract is byte-exact: the success line is exactly
//! `HTTP/1.1 200 Connection Established\r\n\r\n` with no headers, written before any tunnel
//! data, and the error responses are upstream's raw bytes.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::dial::{dial, Dial, DialError, DialSpec, FrontendKind};
use crate::backend::session::AgentSession;
use crate::proto::packet::Payload;
use crate::state::Shared;
use crate::tunnel::{FrontendLink, FrontendQueue};
use crate::wire::{dial_request, AGENT_DISCONNECTED_DURING_DIAL};

/// Go's http.Server ReadHeaderTimeout in upstream.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(60);
/// Go's DefaultMaxHeaderBytes.
pub const MAX_HEADER_BYTES: usize = 1 << 20;
/// Upstream reads the client in 32 KiB chunks.
const READ_CHUNK: usize = 32 * 1024;

pub const ESTABLISHED: &[u8] = b"HTTP/1.1 200 Connection Established\r\n\r\n";
pub const NO_AGENT: &[u8] = b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\n\r\ncurrently no tunnels available: No agent available";

fn plain_response(status: &str, body: &str) -> Vec<u8> {
    format!("HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n{body}")
        .into_bytes()
}

fn method_not_allowed() -> Vec<u8> {
    let body = "this proxy only supports CONNECT passthrough\n";
    format!(
        "HTTP/1.1 405 Method Not Allowed\r\nContent-Type: text/plain; charset=utf-8\r\nX-Content-Type-Options: nosniff\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The status upstream picks for an agent's dial error: timeouts 504, descriptor exhaustion
/// 503, anything else 502 (case-insensitive, first match wins).
pub fn status_for_dial_error(error: &str) -> &'static str {
    let error = error.to_ascii_lowercase();
    if ["i/o timeout", "deadline exceeded", "timeout"]
        .iter()
        .any(|s| error.contains(s))
    {
        "504 Gateway Timeout"
    } else if error.contains("too many open files") {
        "503 Service Unavailable"
    } else {
        "502 Bad Gateway"
    }
}

fn agent_dial_error_response(error: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {}\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n{error}",
        status_for_dial_error(error)
    )
    .into_bytes()
}

/// A parsed CONNECT request head, and any bytes the client sent after it.
struct Head {
    method: String,
    target: String,
    rest: Bytes,
}

enum HeadError {
    Closed,
    TooLarge,
    Malformed,
    TimedOut,
}

async fn read_head<S: AsyncRead + Unpin>(stream: &mut S) -> Result<Head, HeadError> {
    let mut buf = BytesMut::with_capacity(4096);
    let read = async {
        loop {
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let mut request = httparse::Request::new(&mut headers);
            match request.parse(&buf) {
                Ok(httparse::Status::Complete(len)) => {
                    let head = Head {
                        method: request.method.unwrap_or_default().to_string(),
                        target: request.path.unwrap_or_default().to_string(),
                        rest: Bytes::new(),
                    };
                    let rest = buf.split_off(len).freeze();
                    return Ok(Head { rest, ..head });
                }
                Ok(httparse::Status::Partial) => {}
                Err(_) => return Err(HeadError::Malformed),
            }
            if buf.len() >= MAX_HEADER_BYTES {
                return Err(HeadError::TooLarge);
            }
            if stream
                .read_buf(&mut buf)
                .await
                .map_err(|_| HeadError::Closed)?
                == 0
            {
                return Err(HeadError::Closed);
            }
        }
    };
    tokio::time::timeout(HEADER_TIMEOUT, read)
        .await
        .unwrap_or(Err(HeadError::TimedOut))
}

/// Serves one HTTP-CONNECT connection to its end.
pub async fn serve<S>(shared: Arc<Shared>, mut stream: S)
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let gauge = shared.metrics.http_connections.clone();
    gauge.inc();
    let head = match read_head(&mut stream).await {
        Ok(head) => head,
        Err(HeadError::TooLarge) => {
            let _ = stream
                .write_all(b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n431 Request Header Fields Too Large")
                .await;
            gauge.dec();
            return;
        }
        Err(HeadError::Malformed) => {
            let _ = stream
                .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request")
                .await;
            gauge.dec();
            return;
        }
        Err(HeadError::Closed | HeadError::TimedOut) => {
            gauge.dec();
            return;
        }
    };
    if head.method != "CONNECT" {
        let _ = stream.write_all(&method_not_allowed()).await;
    } else {
        tunnel(&shared, stream, head).await;
    }
    gauge.dec();
}

/// Writes `bytes` and ends the connection.
async fn answer<S: AsyncWrite + Unpin>(stream: &mut S, bytes: &[u8]) {
    let _ = stream.write_all(bytes).await;
    let _ = stream.shutdown().await;
}

/// The reply to a dial that did not reach an agent, in upstream's bytes.
fn dial_error_response(error: DialError) -> Vec<u8> {
    match error {
        DialError::ShuttingDown => {
            plain_response("503 Service Unavailable", &format!("{error}\r\n"))
        }
        DialError::NoAgent => NO_AGENT.to_vec(),
        DialError::SendTimedOut => plain_response(
            "504 Gateway Timeout",
            &format!("Failed to tunnel dial request: {error}\r\n"),
        ),
        DialError::AgentGone | DialError::DuplicateDialId | DialError::SendFailed => {
            plain_response(
                "502 Bad Gateway",
                &format!("Failed to tunnel dial request: {error}\r\n"),
            )
        }
    }
}

async fn tunnel<S>(shared: &Arc<Shared>, mut stream: S, head: Head)
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    // The dial target is the request-target (authority form), not the Host header.
    let address = head.target.clone();
    let (link, mut queue) = shared.tunnel_queue();
    let dial_id = fastrand::i64(0..i64::MAX);
    let spec = DialSpec {
        kind: FrontendKind::HttpConnect,
        // One tunnel per connection, accepted before any drain began.
        first_on_connection: true,
        address: &address,
        dial_id,
        request: dial_request(&address, dial_id),
    };
    let mut dial = match dial(shared, &link, spec).await {
        Ok(dial) => dial,
        Err(e) => return answer(&mut stream, &dial_error_response(e)).await,
    };
    let mut early = BytesMut::from(&head.rest[..]);
    let outcome = await_dial(
        shared,
        &mut dial,
        &link,
        &mut queue,
        &mut stream,
        &mut early,
    )
    .await;
    match outcome {
        DialOutcome::Established(connect_id) => {
            if stream.write_all(ESTABLISHED).await.is_ok() {
                let agent = &dial.agent;
                pump(
                    shared,
                    agent,
                    &link,
                    connect_id,
                    &mut queue,
                    stream,
                    early.freeze(),
                )
                .await;
            }
            dial.release().await;
        }
        DialOutcome::Respond(bytes) => answer(&mut stream, &bytes).await,
        DialOutcome::ClientGone => dial.release().await,
    }
}

enum DialOutcome {
    Established(i64),
    Respond(Vec<u8>),
    ClientGone,
}

/// Waits for the agent's answer, the dial deadline, the client leaving, or the server stopping.
/// Bytes the client sends meanwhile are kept for the tunnel.
async fn await_dial<S: AsyncRead + Unpin>(
    shared: &Shared,
    dial: &mut Dial,
    link: &Arc<FrontendLink>,
    queue: &mut FrontendQueue,
    stream: &mut S,
    early: &mut BytesMut,
) -> DialOutcome {
    loop {
        tokio::select! {
            packet = queue.recv() => match packet.and_then(|p| p.payload) {
                Some(Payload::DialResponse(rsp)) if rsp.error.is_empty() => {
                    return DialOutcome::Established(rsp.connect_id);
                }
                Some(Payload::DialResponse(rsp)) if rsp.error == AGENT_DISCONNECTED_DURING_DIAL => {
                    return DialOutcome::Respond(plain_response("502 Bad Gateway", "Backend context error: context canceled\r\n"));
                }
                Some(Payload::DialResponse(rsp)) => return DialOutcome::Respond(agent_dial_error_response(&rsp.error)),
                // DIAL_CLS from the agent, or the link closed: nothing to say.
                _ => return DialOutcome::ClientGone,
            },
            _ = crate::frontend::sleep_until_opt(dial.deadline) => {
                if dial.expire() {
                    return DialOutcome::Respond(plain_response(
                        "504 Gateway Timeout",
                        "Backend dial timeout: timed out waiting for backend dial\r\n",
                    ));
                }
            },
            read = stream.read_buf(early), if early.len() < READ_CHUNK => match read {
                Ok(n) if n > 0 => {}
                _ => return DialOutcome::ClientGone,
            },
            _ = shared.hard_stop.cancelled() => return DialOutcome::ClientGone,
        }
        if link.is_closed() {
            return DialOutcome::ClientGone;
        }
    }
}

/// Relays bytes both ways until either side ends; half-close is not supported, as upstream.
async fn pump<S>(
    shared: &Shared,
    agent: &AgentSession,
    link: &FrontendLink,
    connect_id: i64,
    queue: &mut FrontendQueue,
    stream: S,
    early: Bytes,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let (mut reader, mut writer) = tokio::io::split(stream);
    let to_agent = async {
        if !early.is_empty() && send_data(agent, connect_id, early).await.is_err() {
            return;
        }
        let mut buf = BytesMut::with_capacity(READ_CHUNK);
        loop {
            buf.reserve(READ_CHUNK);
            match reader.read_buf(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    if send_data(agent, connect_id, buf.split().freeze())
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
    };
    let to_client = async {
        while let Some(packet) = queue.recv().await {
            match packet.payload {
                Some(Payload::Data(data)) => {
                    if writer.write_all(&data.data).await.is_err() {
                        return;
                    }
                }
                // CLOSE_RSP, DIAL_CLS: the agent closed the connection.
                _ => return,
            }
        }
    };
    tokio::select! {
        _ = to_agent => {}
        _ = to_client => {}
        // Closed from our side (the client stopped reading): a write that waits on it forever
        // must not keep the socket.
        _ = link.aborted() => {}
        _ = shared.hard_stop.cancelled() => {}
    }
    let _ = writer.shutdown().await;
}

async fn send_data(agent: &AgentSession, connect_id: i64, data: Bytes) -> Result<(), ()> {
    agent
        .send(crate::wire::data(connect_id, data))
        .await
        .map_err(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dial_errors_map_like_upstream() {
        assert_eq!(
            status_for_dial_error("dial tcp 1.2.3.4:80: i/o timeout"),
            "504 Gateway Timeout"
        );
        assert_eq!(
            status_for_dial_error("context deadline exceeded"),
            "504 Gateway Timeout"
        );
        assert_eq!(
            status_for_dial_error("accept: Too Many Open Files"),
            "503 Service Unavailable"
        );
        assert_eq!(
            status_for_dial_error("dial tcp 127.0.0.1:1: connect: connection refused"),
            "502 Bad Gateway"
        );
        assert_eq!(
            status_for_dial_error("dial tcp: lookup x: no such host"),
            "502 Bad Gateway"
        );
    }
}
