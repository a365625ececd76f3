//! One stream to one server: its receive loop, which dispatches every packet the server
//! sends and never waits on a destination that stopped reading; its table of tunnels; and
//! the dials it runs for the server.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::Streaming;

use super::dialer;
use super::endpoint::{End, Endpoint};
use super::metrics::{AgentMetrics, DialFailureReason};
use super::queue::{Delivery, EndpointQueue};
use super::state::AgentState;
use super::uplink::Uplink;
use crate::proto::packet::Payload;
use crate::proto::{Data, DialRequest, Packet, PacketType};
use crate::wire;

/// How a stream ended.
#[derive(Debug, PartialEq, Eq)]
pub enum StreamEnd {
    /// The server ended the RPC (EOF).
    Eof,
    /// Receiving failed.
    Failed,
    /// We stopped it.
    Stopped,
}

pub struct ServerStream {
    pub server_id: String,
    state: Arc<AgentState>,
    uplink: Uplink,
    tunnels: Mutex<HashMap<i64, Arc<Endpoint>>>,
    /// Connection ids, per stream, from 1, taken when a DIAL_REQ arrives (as upstream).
    next_id: AtomicI64,
    /// Ends this stream and every tunnel on it.
    pub cancel: CancellationToken,
    drained: AtomicBool,
}

impl ServerStream {
    pub fn new(
        server_id: String,
        state: Arc<AgentState>,
        outbound: mpsc::Sender<Packet>,
    ) -> Arc<ServerStream> {
        let cancel = state.stop.child_token();
        Arc::new(ServerStream {
            server_id,
            uplink: Uplink::new(outbound, cancel.clone(), state.metrics.clone()),
            state,
            tunnels: Mutex::new(HashMap::new()),
            next_id: AtomicI64::new(1),
            cancel,
            drained: AtomicBool::new(false),
        })
    }

    fn tunnels(&self) -> MutexGuard<'_, HashMap<i64, Arc<Endpoint>>> {
        // Single inserts and removes: a poisoned lock is still consistent.
        self.tunnels.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn tunnel_count(&self) -> usize {
        self.tunnels().len()
    }

    fn metrics(&self) -> &AgentMetrics {
        &self.state.metrics
    }

    /// Sends a packet toward the server, waiting for room; false once the stream is gone.
    pub async fn send(&self, packet: Packet) -> bool {
        self.uplink.send(packet).await
    }

    /// A reply the receive loop sends without waiting: when the stream toward the server is
    /// full, the reply is dropped (and counted) rather than stopping the loop.
    fn reply(&self, packet: Packet) {
        if !self.uplink.try_send(packet) {
            self.violation(
                "reply_dropped",
                "dropped a reply: the stream toward the server is full",
            );
        }
    }

    /// Removes a tunnel from the table, once.
    fn remove(&self, connect_id: i64) {
        if self.tunnels().remove(&connect_id).is_some() {
            self.state.metrics.endpoint_closed();
        }
    }

    /// Closes a tunnel that ended: out of the table (so later DATA for it is refused), its
    /// queue emptied, CLOSE_RSP to the server, the access line.
    async fn finish(&self, endpoint: &Endpoint, end: End) {
        let connect_id = endpoint.connect_id;
        self.remove(connect_id);
        endpoint.queue.close();
        match &end {
            End::RemoteEof => {
                tracing::info!(v = 2, connectionID = connect_id, "remote connection EOF")
            }
            End::ReadFailed(e) => {
                tracing::error!(error = %e, connectionID = connect_id, "connection read failure")
            }
            End::WriteFailed(e) => {
                tracing::error!(error = %e, connectionID = connect_id, "conn write failure")
            }
            End::Refused(why) => {
                self.metrics().queue_closed(*why);
                tracing::warn!(
                    connectionID = connect_id,
                    dialAddress = %endpoint.address,
                    queuedBytes = endpoint.queue.queued(),
                    reason = why.label(),
                    "closing a tunnel whose destination does not keep up"
                );
            }
            End::Requested | End::StreamGone => {}
        }
        if !matches!(end, End::StreamGone)
            && !self
                .send(wire::close_response(connect_id, end.wire_error()))
                .await
        {
            tracing::debug!(
                connectionID = connect_id,
                dialID = endpoint.dial_id,
                "close response failure"
            );
        }
        tracing::info!(
            v = 4,
            dialID = endpoint.dial_id,
            connectionID = connect_id,
            dialAddress = %endpoint.address,
            "close connection"
        );
        let (to_destination, from_destination) = endpoint.bytes();
        tracing::info!(
            v = 2,
            serverID = %self.server_id,
            dialAddress = %endpoint.address,
            connectionID = connect_id,
            bytesToDestination = to_destination,
            bytesFromDestination = from_destination,
            duration = %crate::gofmt::GoDuration(endpoint.age()),
            reason = %end.reason(),
            "Tunnel closed"
        );
    }

    /// Sends DRAIN once: the server stops picking this agent for new dials.
    pub fn drain(self: &Arc<Self>) {
        if self.drained.swap(true, Ordering::AcqRel) {
            return;
        }
        let stream = self.clone();
        self.state.tunnels.spawn(async move {
            tracing::info!(v = 2, serverID = %stream.server_id, agentID = %stream.state.agent_id, "drain agent client");
            if !stream.send(wire::drain()).await {
                tracing::error!(serverID = %stream.server_id, agentID = %stream.state.agent_id, "drain failure");
            }
        });
    }

    fn violation(&self, kind: &'static str, message: &'static str) {
        if let Some(unlogged) = self.state.metrics.peer_violation(kind) {
            tracing::warn!(serverID = %self.server_id, kind, unlogged, "{message}");
        }
    }

    /// Runs the receive loop until the server ends the stream, it fails, or we stop.
    pub async fn serve(self: Arc<Self>, mut inbound: Streaming<Packet>) -> StreamEnd {
        let agent_id = self.state.agent_id.clone();
        tracing::info!(v = 2, serverID = %self.server_id, agentID = %agent_id, "Start serving");
        let end = loop {
            let message = tokio::select! {
                biased;
                _ = self.cancel.cancelled() => break StreamEnd::Stopped,
                message = inbound.message() => message,
            };
            match message {
                Ok(Some(packet)) => {
                    self.state.metrics.packet("to_agent", packet.r#type);
                    self.handle(packet).await;
                }
                Ok(None) => {
                    tracing::info!(v = 2, serverID = %self.server_id, agentID = %agent_id, "received EOF, exit");
                    break StreamEnd::Eof;
                }
                Err(status) => {
                    self.state
                        .metrics
                        .stream_error("to_agent", &status, "Unknown");
                    if self.state.stop.is_cancelled() {
                        tracing::debug!(serverID = %self.server_id, agentID = %agent_id, "could not read stream because agent client is shutting down");
                    } else if status.code() == tonic::Code::Cancelled {
                        tracing::info!(v = 2, serverID = %self.server_id, agentID = %agent_id, "stream canceled");
                    } else {
                        tracing::error!(serverID = %self.server_id, agentID = %agent_id, error = %status, "could not read stream");
                    }
                    break StreamEnd::Failed;
                }
            }
        };
        tracing::info!(v = 2, serverID = %self.server_id, "cleanup all of conn contexts when client exits");
        // Every tunnel's token is a child of this one: they all end, and leave the table.
        self.cancel.cancel();
        end
    }

    async fn handle(self: &Arc<Self>, packet: Packet) {
        let kind = PacketType::try_from(packet.r#type);
        match (kind, packet.payload) {
            (Ok(PacketType::DialReq), Some(Payload::DialRequest(request))) => self.dial(request),
            (Ok(PacketType::Data), Some(Payload::Data(data))) => self.data(data).await,
            (Ok(PacketType::CloseReq), Some(Payload::CloseRequest(close))) => {
                self.close_request(close.connect_id)
            }
            // The server sends DIAL_CLS when a frontend leaves mid-dial. As upstream, the
            // dial finishes; the server answers its DIAL_RSP with CLOSE_REQ.
            (
                Ok(
                    PacketType::DialCls
                    | PacketType::DialRsp
                    | PacketType::CloseRsp
                    | PacketType::Drain,
                ),
                _,
            ) => {
                tracing::debug!(serverID = %self.server_id, packetType = wire::packet_type_name(packet.r#type), "unrecognized packet");
            }
            (Ok(_), _) => self.violation(
                "payload_mismatch",
                "a packet from the server whose payload does not match its type; ignoring it",
            ),
            (Err(_), _) => self.violation(
                "unknown_packet_type",
                "a packet of unknown type from the server; ignoring it",
            ),
        }
    }

    fn dial(self: &Arc<Self>, request: DialRequest) {
        let connect_id = self.next_id.fetch_add(1, Ordering::AcqRel);
        tracing::info!(
            v = 3,
            serverID = %self.server_id,
            agentID = %self.state.agent_id,
            dialID = request.random,
            dialAddress = %request.address,
            "Received DIAL_REQ"
        );
        let Ok(permit) = self.state.dials.clone().try_acquire_owned() else {
            self.violation(
                "too_many_dials",
                "refusing a dial: too many dials in progress",
            );
            self.reply(wire::dial_response_error(
                request.random,
                wire::TOO_MANY_DIALS,
            ));
            return;
        };
        let stream = self.clone();
        self.state.tunnels.spawn(async move {
            stream.run_dial(connect_id, request, permit).await;
        });
    }

    async fn run_dial(
        self: Arc<Self>,
        connect_id: i64,
        request: DialRequest,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) {
        let snapshot = self.state.snapshot();
        let started = Instant::now();
        let dialed = tokio::select! {
            dialed = dialer::dial(&request.protocol, &request.address, snapshot.config.dial_timeout, &snapshot.config.destinations) => dialed,
            _ = self.cancel.cancelled() => return,
        };
        drop(permit);
        let tcp = match dialed {
            Ok(tcp) => tcp,
            Err(e) if e.refused_by.is_some() => {
                let rule = e.refused_by.as_deref().unwrap_or_default();
                if let Some(unlogged) = self.state.metrics.destination_refused(rule) {
                    tracing::warn!(dialID = request.random, dialAddress = %request.address, rule, unlogged, "dial refused: destination not allowed by policy");
                }
                if !self
                    .send(wire::dial_response_error(request.random, &e.text))
                    .await
                {
                    tracing::error!(dialID = request.random, connectionID = connect_id, dialAddress = %request.address, "could not send DIAL_RSP with error");
                }
                return;
            }
            Err(e) => {
                self.state.metrics.dial_failed(if e.timeout {
                    DialFailureReason::Timeout
                } else {
                    DialFailureReason::Unknown
                });
                tracing::info!(
                    v = 1,
                    error = %e.text,
                    dialID = request.random,
                    connectionID = connect_id,
                    dialAddress = %request.address,
                    "error dialing backend"
                );
                if !self
                    .send(wire::dial_response_error(request.random, &e.text))
                    .await
                {
                    tracing::error!(dialID = request.random, connectionID = connect_id, dialAddress = %request.address, "could not send DIAL_RSP with error");
                }
                return;
            }
        };
        self.state
            .metrics
            .dial_succeeded(started.elapsed().as_secs_f64());
        tracing::info!(
            v = 3,
            dialID = request.random,
            connectionID = connect_id,
            dialAddress = %request.address,
            "Endpoint connection established"
        );
        let endpoint = Arc::new(Endpoint::new(
            connect_id,
            request.random,
            request.address,
            EndpointQueue::new(snapshot.config.queue, self.state.budget.clone()),
            self.cancel.child_token(),
        ));
        // In the table before the DIAL_RSP goes out, so DATA right after it is recognised.
        self.tunnels().insert(connect_id, endpoint.clone());
        self.state.metrics.endpoint_opened();
        if !self
            .send(wire::dial_response(request.random, connect_id, ""))
            .await
        {
            tracing::error!(dialID = request.random, connectionID = connect_id, dialAddress = %endpoint.address, "could not send DIAL_RSP");
            self.finish(&endpoint, End::StreamGone).await;
            return;
        }
        let end = endpoint
            .run(tcp, &self.uplink, snapshot.config.queue.stall)
            .await;
        self.finish(&endpoint, end).await;
    }

    async fn data(&self, data: Data) {
        let connect_id = data.connect_id;
        if connect_id == 0 {
            self.violation(
                "data_without_connect_id",
                "Received packet missing ConnectID from frontend",
            );
            return;
        }
        tracing::info!(v = 4, connectionID = connect_id, "received DATA");
        let endpoint = self.tunnels().get(&connect_id).cloned();
        let Some(endpoint) = endpoint else {
            self.violation(
                "data_unknown_connection",
                "received DATA for unrecognized connection",
            );
            self.reply(wire::close_response(
                connect_id,
                wire::UNRECOGNIZED_CONNECT_ID,
            ));
            return;
        };
        let len = data.data.len();
        match endpoint.queue.deliver(data.data).await {
            Delivery::Queued => endpoint.counted_to_destination(len),
            Delivery::Closed => {}
            Delivery::Refused(why) => endpoint.end(End::Refused(why)),
        }
    }

    fn close_request(&self, connect_id: i64) {
        tracing::info!(v = 4, connectionID = connect_id, "received CLOSE_REQ");
        let endpoint = self.tunnels().get(&connect_id).cloned();
        match endpoint {
            Some(endpoint) => endpoint.end(End::Requested),
            None => {
                tracing::info!(
                    v = 4,
                    connectionID = connect_id,
                    "Failed to find connection context for close"
                );
                self.reply(wire::close_response(connect_id, wire::UNKNOWN_CONNECT_ID));
            }
        }
    }
}
