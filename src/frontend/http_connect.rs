//! The HTTP-CONNECT frontend (`--mode=http-connect`), over the Unix socket or TCP with mTLS.
//!
//! The request head is parsed here rather than by an HTTP server library because the wire
//! contract is byte-exact: the success line is exactly
//! `HTTP/1.1 200 Connection Established\r\n\r\n` with no headers, written before any tunnel
//! data, and the error responses are upstream's raw bytes. The head itself is read in
//! `http_head`; a CONNECT's tunnel is a [`ConnectTunnel`].

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::dial::{dial, Dial, DialError, DialSpec, FrontendKind, Wake};
use super::http_head::{read_head, skip_body};
use super::relay_io::RelayIo;
use super::TunnelRecord;
use crate::backend::session::AgentSession;
use crate::proto::packet::Payload;
use crate::state::Shared;
use crate::tunnel::{FrontendLink, FrontendQueue};
use crate::wire::{dial_request, AGENT_DISCONNECTED_DURING_DIAL, DIAL_TIMEOUT};

/// Upstream reads the client in 32 KiB chunks.
const READ_CHUNK: usize = 32 * 1024;
/// The first read of a tunnel's client side asks for this much (see [`next_read_size`]).
const READ_START: usize = 2 * 1024;

/// The next read's size after one that took `n` of `room` bytes: twice as much after a read
/// that filled its buffer, up to [`READ_CHUNK`], half as much after one that took less than
/// a quarter, down to [`READ_START`].
fn next_read_size(want: usize, n: usize, room: usize) -> usize {
    if n >= room {
        (want * 2).min(READ_CHUNK)
    } else if n < want / 4 {
        (want / 2).max(READ_START)
    } else {
        want
    }
}

/// Why a tunnel ended when its client's end of stream was read (the access log's reason).
const CLIENT_CLOSED: &str = "client closed";

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

/// Serves one HTTP-CONNECT connection to its end: requests other than CONNECT are answered
/// with 405 and the connection kept for the next request, as Go's http.Server keeps it.
/// `frontend` is the frontend's name, for the access line.
pub async fn serve<S>(shared: Arc<Shared>, stream: S, peer: Arc<str>, frontend: Arc<str>)
where
    S: RelayIo,
{
    let gauge = shared.metrics.frontend.http_connections.clone();
    gauge.inc();
    // A connection's task keeps the size of its largest state for its whole life, and the
    // long-lived state is the relay. Reading requests and dialing run in a future of their
    // own, freed once the tunnel is established, and the relay comes back boxed (a value
    // bound here and moved into `run` would keep its room in this future beside `run`'s), so
    // an idle tunnel's task holds only its relay's running state.
    let relay = Box::pin(requests(&shared, stream, peer, frontend)).await;
    if let Some(relay) = relay {
        relay.run().await;
    }
    gauge.dec();
}

/// Answers requests until a CONNECT, which it dials; the relay when the tunnel was
/// established.
async fn requests<S>(
    shared: &Arc<Shared>,
    mut stream: S,
    peer: Arc<str>,
    frontend: Arc<str>,
) -> Option<Box<Relay<S>>>
where
    S: RelayIo,
{
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
            return ConnectTunnel::new(shared, head.host, peer, frontend)
                .establish(stream, head.rest)
                .await;
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
    None
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
        DialError::NotAllowed => plain_response("403 Forbidden", &format!("{error}\r\n")),
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

/// One CONNECT tunnel: its dial and the answer to the client (`establish`), then its relay
/// ([`Relay`]). A connection carries one tunnel, which ends it; bytes the client sent after
/// the head go to the agent first.
struct ConnectTunnel {
    shared: Arc<Shared>,
    link: Arc<FrontendLink>,
    queue: FrontendQueue,
    /// The dial target: Go's r.Host, the request-target (authority form), not the Host header.
    address: String,
    /// Who asked (see [`crate::listen::Accepted::peer`]).
    peer: Arc<str>,
    dial_id: i64,
    record: TunnelRecord,
}

/// The tunnel's ends once its agent has connected it.
struct Established<'a> {
    agent: &'a AgentSession,
    agent_id: &'a str,
    connect_id: i64,
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

/// An established tunnel: what its relay needs.
struct Relay<S> {
    tunnel: ConnectTunnel,
    dial: Dial,
    stream: S,
    early: Bytes,
    connect_id: i64,
    agent_id: String,
}

impl<S: RelayIo> Relay<S> {
    /// Relays until either side ends, releases the dial, and writes the access line.
    async fn run(self: Box<Self>) {
        let Relay {
            mut tunnel,
            dial,
            stream,
            early,
            connect_id,
            agent_id,
        } = *self;
        let ends = Established {
            agent: &dial.agent,
            agent_id: &agent_id,
            connect_id,
        };
        let ended = tunnel.pump(ends, stream, early).await;
        tracing::debug!(host = %tunnel.address, agentID = %agent_id, connectionID = connect_id, "Stopping transfer to host");
        dial.release().await;
        tunnel.record.log(&tunnel.link, ended);
    }
}

impl ConnectTunnel {
    fn new(
        shared: &Arc<Shared>,
        address: String,
        peer: Arc<str>,
        frontend: Arc<str>,
    ) -> ConnectTunnel {
        let (link, queue) = shared.tunnel_queue();
        link.without_client_segment();
        link.set_destination(&address);
        let mut record = TunnelRecord::new(FrontendKind::HttpConnect, frontend);
        record.destination = address.clone();
        ConnectTunnel {
            shared: shared.clone(),
            link,
            queue,
            address,
            peer,
            dial_id: fastrand::i64(0..i64::MAX),
            record,
        }
    }

    /// Dials and answers the client. Returns the relay when the tunnel was established; else
    /// releases the dial and writes the access line.
    async fn establish<S>(mut self, mut stream: S, early: Bytes) -> Option<Box<Relay<S>>>
    where
        S: RelayIo,
    {
        let (shared, address, dial_id) = (self.shared.clone(), self.address.clone(), self.dial_id);
        let spec = DialSpec {
            kind: FrontendKind::HttpConnect,
            // One tunnel per connection, accepted before any drain began.
            first_on_connection: true,
            peer: &self.peer,
            address: &address,
            dial_id,
            request: dial_request(&address, dial_id),
        };
        let mut dial = match dial(&shared, &self.link, spec).await {
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
                self.link.note_end(|| format!("dial failed: {e}"));
                answer(&mut stream, &dial_error_response(e)).await;
                self.record.log(&self.link, "dial failed");
                return None;
            }
        };
        let agent_id = dial.agent.agent_id.clone();
        self.record.agent_id = Some(agent_id.clone());
        let mut early = BytesMut::from(&early[..]);
        let outcome = self.await_dial(&mut dial, &mut stream, &mut early).await;
        let ended = match outcome {
            DialOutcome::Established(connect_id) => match stream.write_all(ESTABLISHED).await {
                Ok(()) => {
                    tracing::info!(v = 3, host = %address, agentID = %agent_id, connectionID = connect_id, "Connection established, sent 200 OK");
                    tracing::info!(v = 3, host = %address, agentID = %agent_id, connectionID = connect_id, "Starting proxy to host");
                    return Some(Box::new(Relay {
                        tunnel: self,
                        dial,
                        stream,
                        early: early.freeze(),
                        connect_id,
                        agent_id,
                    }));
                }
                Err(e) => {
                    tracing::error!(err = %e, host = %address, agentID = %agent_id, "failed to send 200 connection established");
                    "client gone"
                }
            },
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
                    self.link.note_end(|| format!("dial failed: {err}"));
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
        self.record.log(&self.link, ended);
        None
    }

    /// Waits for the agent's answer, the dial deadline, the client leaving, or the server
    /// stopping. Bytes the client sends meanwhile are kept for the tunnel.
    async fn await_dial<S: AsyncRead + Unpin>(
        &mut self,
        dial: &mut Dial,
        stream: &mut S,
        early: &mut BytesMut,
    ) -> DialOutcome {
        let shared: &Shared = &self.shared;
        loop {
            tokio::select! {
                packet = self.queue.recv() => match packet.and_then(|p| p.payload) {
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
            if self.link.is_closed() {
                return DialOutcome::ClientGone;
            }
        }
    }

    /// Relays bytes both ways until either side ends; half-close is not supported, as
    /// upstream. Returns why it ended, for the access log.
    async fn pump<S>(&mut self, ends: Established<'_>, stream: S, early: Bytes) -> &'static str
    where
        S: RelayIo,
    {
        let ConnectTunnel {
            shared,
            link,
            queue,
            address,
            ..
        } = self;
        let (host, agent_id, connect_id) = (address.as_str(), ends.agent_id, ends.connect_id);
        let agent = ends.agent;
        let (mut reader, mut writer) = stream.into_halves();
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
                link.facts.add_to_agent(send(early).await?);
            }
            // The read buffer grows while reads fill it (a transfer) and shrinks while they
            // do not. It is taken once there is something to read (where the transport can
            // tell): a quiet tunnel, of which a server holds thousands, holds none.
            let mut want = READ_START;
            loop {
                match S::read_chunk(&mut reader, want).await {
                    Ok(buf) if buf.is_empty() => {
                        tracing::info!(
                            v = 1,
                            host,
                            agentID = agent_id,
                            connectionID = connect_id,
                            "EOF from host"
                        );
                        return Err(CLIENT_CLOSED);
                    }
                    Err(e) => {
                        tracing::error!(err = %e, host, agentID = agent_id, connectionID = connect_id, "Received failure on connection");
                        return Err("client read failed");
                    }
                    Ok(buf) => {
                        want = next_read_size(want, buf.len(), buf.capacity());
                        link.facts.add_to_agent(send(buf.freeze()).await?)
                    }
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
            ended = to_agent => ended.err().unwrap_or(CLIENT_CLOSED),
            ended = to_client => ended,
            // Closed from our side (the client stopped reading): a write that waits on it
            // forever must not keep the socket.
            _ = link.aborted() => "frontend not reading",
            _ = shared.hard_stop.cancelled() => "server stopped",
        };
        link.note_end(|| ended.to_string());
        S::finish(writer, ended == CLIENT_CLOSED).await;
        ended
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_read_size_follows_what_reads_take() {
        let mut want = READ_START;
        // A transfer: every read fills its buffer.
        for _ in 0..10 {
            want = next_read_size(want, want, want);
        }
        assert_eq!(want, READ_CHUNK);
        // Steady reads of half the buffer keep the size.
        assert_eq!(next_read_size(want, want / 2, want), want);
        // Quiet again: small reads bring it back down.
        for _ in 0..10 {
            want = next_read_size(want, 100, want);
        }
        assert_eq!(want, READ_START);
    }

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
