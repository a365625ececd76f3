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

use super::dial::{dial, Dial, DialError, DialSpec, FrontendKind, Wake};
use super::TunnelRecord;
use crate::backend::session::AgentSession;
use crate::proto::packet::Payload;
use crate::state::Shared;
use crate::tunnel::{FrontendLink, FrontendQueue};
use crate::wire::{dial_request, AGENT_DISCONNECTED_DURING_DIAL, DIAL_TIMEOUT};

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

/// Go's `http.Error(w, ..., 405)`: kept alive unless `close` (then `Connection: close`).
fn method_not_allowed(close: bool) -> Vec<u8> {
    let body = "this proxy only supports CONNECT passthrough\n";
    let date = jiff::Timestamp::now().strftime("%a, %d %b %Y %H:%M:%S GMT");
    let connection = if close { "Connection: close\r\n" } else { "" };
    format!(
        "HTTP/1.1 405 Method Not Allowed\r\nContent-Type: text/plain; charset=utf-8\r\nX-Content-Type-Options: nosniff\r\nDate: {date}\r\nContent-Length: {}\r\n{connection}\r\n{body}",
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

/// A parsed request head, and any bytes the client sent after it.
struct Head {
    method: String,
    /// What Go's `r.Host` holds: the request-target's authority (CONNECT), else the Host header.
    host: String,
    user_agent: String,
    /// The client asked to close after this request (`Connection: close`, or HTTP/1.0 without
    /// keep-alive).
    close: bool,
    /// `Content-Length` of a request body, to be skipped before the next request; `None` for a
    /// body we cannot skip (chunked, or too large), after which the connection is closed.
    body: Option<u64>,
    rest: Bytes,
}

/// Why a request head was refused, each with Go's http.Server bytes.
#[derive(Debug, PartialEq, Eq)]
enum HeadError {
    Closed,
    /// Over Go's read limit (431).
    TooLarge,
    /// Go's plain `400 Bad Request`.
    Malformed,
    /// Go's `400 Bad Request: <text>`.
    BadRequest(&'static str),
    /// Not HTTP/1.x (505).
    Version,
    TimedOut,
}

impl HeadError {
    fn response(&self) -> Option<Vec<u8>> {
        const HEADERS: &str =
            "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n";
        let public = match self {
            HeadError::Closed | HeadError::TimedOut => return None,
            HeadError::TooLarge => "431 Request Header Fields Too Large".to_string(),
            HeadError::Malformed => "400 Bad Request".to_string(),
            HeadError::BadRequest(text) => format!("400 Bad Request: {text}"),
            HeadError::Version => {
                "505 HTTP Version Not Supported: unsupported protocol version".to_string()
            }
        };
        Some(format!("HTTP/1.1 {public}{HEADERS}{public}").into_bytes())
    }
}

/// Go's http.Server reads at most MaxHeaderBytes plus 4 KiB of bufio slack for a request head.
pub const HEAD_READ_LIMIT: usize = MAX_HEADER_BYTES + 4096;
/// Go discards up to 256 KiB of an unread request body to keep the connection.
const MAX_SKIPPED_BODY: u64 = 256 << 10;

/// Where the head ends (after its blank line), if it is complete: lines end in LF or CRLF.
fn head_end(buf: &[u8], from: usize) -> Option<usize> {
    let mut at = from;
    while let Some(i) = buf[at..].iter().position(|&b| b == b'\n') {
        let nl = at + i;
        let blank = (nl >= 1 && buf[nl - 1] == b'\n')
            || (nl >= 2 && buf[nl - 1] == b'\r' && buf[nl - 2] == b'\n');
        if blank {
            return Some(nl + 1);
        }
        at = nl + 1;
    }
    None
}

/// An HTTP token (method, header name), as Go checks them.
fn is_token(text: &str) -> bool {
    !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Go's `http.ParseHTTPVersion`.
fn parse_version(proto: &str) -> Option<(u32, u32)> {
    let (major, minor) = proto.strip_prefix("HTTP/")?.split_once('.')?;
    let digits = |s: &str| {
        (!s.is_empty() && s.len() <= 3 && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    Some((digits(major)?, digits(minor)?))
}

/// Whether Go's `url.ParseRequestURI` takes a non-CONNECT request-target: `*`, a path, or an
/// absolute URL.
fn request_uri_ok(target: &str) -> bool {
    if target == "*" || target.starts_with('/') {
        return true;
    }
    match target.split_once(':') {
        Some((scheme, _)) => {
            scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                && scheme
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
        }
        None => false,
    }
}

/// Parses a complete head the way Go's http.Server reads one, up to what the handler sees.
fn parse_head(head: &[u8]) -> Result<Head, HeadError> {
    let text = std::str::from_utf8(head).map_err(|_| HeadError::Malformed)?;
    let mut lines = text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l));
    let request_line = lines.next().unwrap_or_default();
    let (method, rest) = request_line.split_once(' ').ok_or(HeadError::Malformed)?;
    let (target, proto) = rest.split_once(' ').ok_or(HeadError::Malformed)?;
    if !is_token(method) {
        return Err(HeadError::Malformed);
    }
    let (major, minor) = parse_version(proto).ok_or(HeadError::Malformed)?;
    let authority = method == "CONNECT" && !target.starts_with('/');
    if !authority && !request_uri_ok(target) {
        return Err(HeadError::Malformed);
    }
    let mut host_headers = Vec::new();
    let mut user_agent = String::new();
    let mut connection = Vec::new();
    let mut content_length: Option<u64> = None;
    let mut chunked = false;
    for line in lines.take_while(|l| !l.is_empty()) {
        let (name, value) = line.split_once(':').ok_or(HeadError::Malformed)?;
        if !is_token(name) {
            return Err(HeadError::Malformed);
        }
        let value = value.trim_matches([' ', '\t']);
        match name.to_ascii_lowercase().as_str() {
            "host" => host_headers.push(value.to_string()),
            "user-agent" => user_agent = value.to_string(),
            "connection" => {
                connection.extend(value.split(',').map(|t| t.trim().to_ascii_lowercase()))
            }
            "content-length" => {
                content_length = Some(value.parse().map_err(|_| HeadError::Malformed)?)
            }
            "transfer-encoding" => chunked = true,
            _ => {}
        }
    }
    if host_headers.len() > 1 {
        return Err(HeadError::Malformed);
    }
    let pri = major == 2 && minor == 0 && method == "PRI" && target == "*";
    if major != 1 && !pri {
        return Err(HeadError::Version);
    }
    if (major, minor) >= (1, 1) && host_headers.is_empty() && method != "CONNECT" {
        return Err(HeadError::BadRequest("missing required Host header"));
    }
    let host = if authority {
        // Go parses "http://" + target and takes its host (userinfo and path dropped).
        let after_userinfo = target.rsplit_once('@').map_or(target, |(_, h)| h);
        after_userinfo
            .split(['/', '?', '#'])
            .next()
            .unwrap_or_default()
            .to_string()
    } else {
        String::new()
    };
    let host = if host.is_empty() {
        host_headers.into_iter().next().unwrap_or_default()
    } else {
        host
    };
    let close = connection.iter().any(|t| t == "close")
        || ((major, minor) < (1, 1) && !connection.iter().any(|t| t == "keep-alive"));
    let body = match (chunked, content_length) {
        (true, _) => None,
        (false, Some(n)) if n > MAX_SKIPPED_BODY => None,
        (false, n) => Some(n.unwrap_or(0)),
    };
    Ok(Head {
        method: method.to_string(),
        host,
        user_agent,
        close,
        body,
        rest: Bytes::new(),
    })
}

/// Reads one request head, starting with what `buf` already holds.
async fn read_head<S: AsyncRead + Unpin>(
    stream: &mut S,
    mut buf: BytesMut,
) -> Result<Head, HeadError> {
    let read = async {
        let mut scanned = 0;
        loop {
            if let Some(len) = head_end(&buf, scanned) {
                if len > HEAD_READ_LIMIT {
                    return Err(HeadError::TooLarge);
                }
                let head = parse_head(&buf[..len])?;
                let rest = buf.split_off(len).freeze();
                return Ok(Head { rest, ..head });
            }
            if buf.len() >= HEAD_READ_LIMIT {
                return Err(HeadError::TooLarge);
            }
            scanned = buf.len().saturating_sub(2);
            buf.reserve(4096);
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

/// Reads and drops `n` body bytes after `rest`; returns what follows them.
async fn skip_body<S: AsyncRead + Unpin>(
    stream: &mut S,
    rest: Bytes,
    mut n: u64,
) -> Option<BytesMut> {
    let mut buf = BytesMut::from(&rest[..]);
    loop {
        let take = n.min(buf.len() as u64) as usize;
        let _ = buf.split_to(take);
        n -= take as u64;
        if n == 0 {
            return Some(buf);
        }
        if stream.read_buf(&mut buf).await.ok()? == 0 {
            return None;
        }
    }
}

/// Serves one HTTP-CONNECT connection to its end: requests other than CONNECT are answered
/// with 405 and the connection kept for the next request, as Go's http.Server keeps it.
pub async fn serve<S>(shared: Arc<Shared>, mut stream: S)
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let gauge = shared.metrics.frontend.http_connections.clone();
    gauge.inc();
    let mut buf = BytesMut::new();
    loop {
        let head = match read_head(&mut stream, buf).await {
            Ok(head) => head,
            Err(e) => {
                if let Some(bytes) = e.response() {
                    let _ = stream.write_all(&bytes).await;
                    let _ = stream.shutdown().await;
                }
                break;
            }
        };
        tracing::info!(
            v = 2,
            method = %head.method,
            host = %head.host,
            userAgent = %head.user_agent,
            "Received request for host"
        );
        if head.method == "CONNECT" {
            tunnel(&shared, stream, head).await;
            break;
        }
        let keep = !head.close && head.body.is_some();
        if stream.write_all(&method_not_allowed(!keep)).await.is_err() || !keep {
            let _ = stream.shutdown().await;
            break;
        }
        match skip_body(&mut stream, head.rest, head.body.unwrap_or(0)).await {
            Some(rest) => buf = rest,
            None => break,
        }
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
    // The dial target is Go's r.Host: the request-target (authority form), not the Host header.
    let address = head.host.clone();
    let (link, mut queue) = shared.tunnel_queue();
    link.without_client_segment();
    link.set_destination(&address);
    let mut record = TunnelRecord::new(FrontendKind::HttpConnect);
    record.destination = address.clone();
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
        Err(e) => {
            match e {
                DialError::NoAgent | DialError::ShuttingDown => {
                    tracing::error!(err = %e, host = %address, "no tunnels available")
                }
                e => {
                    tracing::error!(err = %e, host = %address, dialID = dial_id, "failed to tunnel dial request")
                }
            }
            link.note_end(|| format!("dial failed: {e}"));
            answer(&mut stream, &dial_error_response(e)).await;
            record.log(&link, "dial failed");
            return;
        }
    };
    let agent_id = dial.agent.agent_id.clone();
    record.agent_id = Some(agent_id.clone());
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
    let ended = match outcome {
        DialOutcome::Established(connect_id) => {
            let ids = (address.as_str(), agent_id.as_str(), connect_id);
            match stream.write_all(ESTABLISHED).await {
                Ok(()) => {
                    tracing::info!(v = 3, host = %address, agentID = %agent_id, connectionID = connect_id, "Connection established, sent 200 OK");
                    tracing::info!(v = 3, host = %address, agentID = %agent_id, connectionID = connect_id, "Starting proxy to host");
                    let agent = &dial.agent;
                    let ended = pump(
                        shared,
                        agent,
                        &link,
                        ids,
                        &mut queue,
                        stream,
                        early.freeze(),
                        &mut record,
                    )
                    .await;
                    tracing::debug!(host = %address, agentID = %agent_id, connectionID = connect_id, "Stopping transfer to host");
                    ended
                }
                Err(e) => {
                    tracing::error!(err = %e, host = %address, agentID = %agent_id, "failed to send 200 connection established");
                    "client gone"
                }
            }
        }
        DialOutcome::Respond(bytes, what) => {
            let error = match what {
                Failure::AgentGone => Some("context canceled"),
                Failure::Timeout => Some(DIAL_TIMEOUT),
                Failure::AgentError => None,
            };
            if let Some(err) = error {
                let message = match what {
                    Failure::AgentGone => {
                        "backend context closed before connection was established"
                    }
                    _ => "backend dial timed out before connection was established",
                };
                tracing::error!(err, host = %address, dialID = dial_id, agentID = %agent_id, "{message}");
                link.note_end(|| format!("dial failed: {err}"));
            }
            answer(&mut stream, &bytes).await;
            "dial failed"
        }
        DialOutcome::ClientGone => {
            tracing::info!(v = 2, host = %address, dialID = dial_id, agentID = %agent_id, "Frontend connection closed before being established");
            "client closed"
        }
    };
    dial.release().await;
    record.log(&link, ended);
}

/// Which failure a `Respond` outcome answers.
#[derive(Clone, Copy)]
enum Failure {
    /// The agent's DIAL_RSP carried an error (logged where it arrived).
    AgentError,
    /// The agent went away while the dial waited.
    AgentGone,
    /// --backend-dial-timeout passed.
    Timeout,
}

enum DialOutcome {
    Established(i64),
    Respond(Vec<u8>, Failure),
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
                    return DialOutcome::Respond(plain_response("502 Bad Gateway", "Backend context error: context canceled\r\n"), Failure::AgentGone);
                }
                Some(Payload::DialResponse(rsp)) => return DialOutcome::Respond(agent_dial_error_response(&rsp.error), Failure::AgentError),
                // DIAL_CLS from the agent, or the link closed: nothing to say.
                _ => return DialOutcome::ClientGone,
            },
            _ = crate::frontend::sleep_until_opt(dial.wake_at()) => match Box::pin(dial.wake(shared)).await {
                Wake::Nothing | Wake::SentAgain => {}
                Wake::Expired => {
                    return DialOutcome::Respond(plain_response(
                        "504 Gateway Timeout",
                        "Backend dial timeout: timed out waiting for backend dial\r\n",
                    ), Failure::Timeout);
                }
                Wake::Failed(_) => {
                    return DialOutcome::Respond(plain_response("502 Bad Gateway", "Backend context error: context canceled\r\n"), Failure::AgentGone);
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
/// Returns why it ended, for the access log.
#[allow(clippy::too_many_arguments)]
async fn pump<S>(
    shared: &Shared,
    agent: &AgentSession,
    link: &FrontendLink,
    (host, agent_id, connect_id): (&str, &str, i64),
    queue: &mut FrontendQueue,
    stream: S,
    early: Bytes,
    record: &mut TunnelRecord,
) -> &'static str
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let (mut reader, mut writer) = tokio::io::split(stream);
    let to_agent = async {
        let send = |data: Bytes| async move {
            let n = data.len();
            tracing::debug!(
                bytes = n,
                host,
                agentID = agent_id,
                connectionID = connect_id,
                "Forwarding data on tunnel to agent"
            );
            match agent.send(crate::wire::data(connect_id, data)).await {
                Ok(()) => Ok(n as u64),
                Err(_) => {
                    tracing::error!(
                        err = "agent stream closed",
                        host,
                        agentID = agent_id,
                        connectionID = connect_id,
                        "error sending packet"
                    );
                    Err("agent gone")
                }
            }
        };
        if !early.is_empty() {
            record.to_agent += send(early).await?;
        }
        let mut buf = BytesMut::with_capacity(READ_CHUNK);
        loop {
            buf.reserve(READ_CHUNK);
            match reader.read_buf(&mut buf).await {
                Ok(0) => {
                    tracing::info!(
                        v = 1,
                        host,
                        agentID = agent_id,
                        connectionID = connect_id,
                        "EOF from host"
                    );
                    return Err("client closed");
                }
                Err(e) => {
                    tracing::error!(err = %e, host, agentID = agent_id, connectionID = connect_id, "Received failure on connection");
                    return Err("client read failed");
                }
                Ok(_) => record.to_agent += send(buf.split().freeze()).await?,
            }
        }
        #[allow(unreachable_code)]
        Ok::<(), &'static str>(())
    };
    let to_client = async {
        while let Some(packet) = queue.recv().await {
            match packet.payload {
                Some(Payload::Data(data)) => {
                    if writer.write_all(&data.data).await.is_err() {
                        return "client write failed";
                    }
                }
                // CLOSE_RSP, DIAL_CLS: the agent closed the connection.
                _ => return "agent closed",
            }
        }
        "agent closed"
    };
    let ended = tokio::select! {
        ended = to_agent => ended.err().unwrap_or("client closed"),
        ended = to_client => ended,
        // Closed from our side (the client stopped reading): a write that waits on it forever
        // must not keep the socket.
        _ = link.aborted() => "frontend not reading",
        _ = shared.hard_stop.cancelled() => "server stopped",
    };
    link.note_end(|| ended.to_string());
    let _ = writer.shutdown().await;
    ended
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
