//! `/ProxyService/Proxy`: one stream per tunnel, as konnectivity-client opens them.

use std::sync::Arc;

use tonic::{Request, Response, Status, Streaming};

use super::dial::{dial, Dial, DialError, DialSpec, FrontendKind, Wake};
use super::{sleep_until_opt, TunnelRecord};
use crate::backend::session::Released;
use crate::codec::serve::Handler;
use crate::listen::ConnStreams;
use crate::metrics::{stream_error_code, Peer, Segment};
use crate::proto::packet::Payload;
use crate::proto::{DialRequest, Packet, PacketType};
use crate::state::Shared;
use crate::tunnel::{FrontendLink, FrontendQueue};
use crate::wire::{
    close_response, dial_response_error, AGENT_DISCONNECTED_DURING_DIAL, BACKEND_NOT_INITIALIZED,
    BACKEND_UNINITIALIZED, CLOSE_REQ_FAILED, DIAL_TIMEOUT, MISMATCHED_CONNECTION_IDS,
    UNRECOGNIZED_CONNECT_ID,
};
use tokio_util::task::task_tracker::TaskTrackerToken;

pub struct ProxyFrontend {
    pub shared: Arc<Shared>,
    /// The frontend's name, for the access line.
    pub name: Arc<str>,
}

impl Handler for ProxyFrontend {
    const PATH: &'static str = "/ProxyService/Proxy";
    type Packets = FrontendQueue;

    async fn serve(
        &self,
        request: Request<Streaming<Packet>>,
    ) -> Result<Response<FrontendQueue>, Status> {
        let shared = self.shared.clone();
        // The first stream of a connection is served also during the drain: the connection
        // was accepted before it began, and its client could not know.
        let conn = request.extensions().get::<ConnStreams>();
        let first_on_connection = conn.is_none_or(ConnStreams::open_first);
        let peer = conn.map_or_else(|| Arc::from("unknown"), |c| c.peer().clone());
        // The first stream keeps the drain waiting for it (see `Shared::tunnels_released`).
        let accept_hold = conn
            .filter(|_| first_on_connection)
            .and_then(ConnStreams::take_hold);
        let (link, queue) = shared.tunnel_queue();
        let user_agent = request
            .metadata()
            .get("user-agent")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        tracing::debug!(
            userAgent = %user_agent,
            serverID = %shared.snapshot().config.server_id,
            streamUID = link.uid,
            "Proxy request from client"
        );
        let tunnel = GrpcTunnel {
            shared: shared.clone(),
            link,
            dial: None,
            stopped: false,
            first_on_connection,
            peer,
            _accept_hold: accept_hold,
            user_agent,
            record: TunnelRecord::new(FrontendKind::Grpc, self.name.clone()),
        };
        shared.tasks.spawn(tunnel.serve(request.into_inner()));
        // The response's HEADERS go out with its first message (the DIAL_RSP, as grpc-go
        // sends them), in one write rather than two. A client that resets the stream
        // meanwhile makes hyper drop this future, and with it the queue.
        queue.ready().await;
        Ok(Response::new(queue))
    }
}

/// The state of one Proxy stream.
struct GrpcTunnel {
    shared: Arc<Shared>,
    link: Arc<FrontendLink>,
    /// The dial this stream sent, once it reached an agent.
    dial: Option<Dial>,
    /// Whether this is its connection's first stream (see [`DialSpec`]).
    first_on_connection: bool,
    /// Who opened it (see [`crate::listen::Accepted::peer`]).
    peer: Arc<str>,
    /// The first stream's hold on the drain, from its connection's accept on.
    _accept_hold: Option<TaskTrackerToken>,
    /// After a fatal error the stream is only drained, as upstream does, until the client ends it.
    stopped: bool,
    user_agent: String,
    record: TunnelRecord,
}

impl GrpcTunnel {
    async fn serve(mut self, mut inbound: Streaming<Packet>) {
        let metrics = self.shared.metrics.clone();
        let gauge = metrics
            .frontend
            .grpc_connections
            .with_label_values(&["Proxy"]);
        gauge.inc();
        let hard_stop = self.shared.hard_stop.clone();
        let ended = loop {
            let wake_at = self.dial.as_ref().and_then(|d| d.wake_at());
            tokio::select! {
                biased;
                _ = hard_stop.cancelled() => break "server stopped",
                _ = sleep_until_opt(wake_at) => Box::pin(self.on_dial_wake()).await,
                message = inbound.message() => match message {
                    Ok(Some(packet)) => {
                        metrics.tunnel.packet(Segment::FromClient, packet.r#type);
                        if !self.stopped {
                            // Boxed, as `release` below: a packet's handling (a dial, a send
                            // to the agent) is short, and inline its state would stay in this
                            // task, and so in every idle tunnel's memory: the task
                            // is 1.1 KB so, 2.3 KB inline.
                            Box::pin(self.on_packet(packet)).await;
                        }
                    }
                    Ok(None) => {
                        tracing::info!(v = 2, userAgent = %self.user_agent, "Receive stream from frontend closed");
                        break "client closed";
                    }
                    Err(status) => {
                        let code = stream_error_code(&status);
                        metrics.tunnel.stream_error(Segment::FromClient, code, "Unknown");
                        if code == tonic::Code::Cancelled {
                            tracing::info!(v = 2, userAgent = %self.user_agent, "Stream read from frontend cancelled");
                            break "client canceled";
                        }
                        tracing::error!(err = %status.message(), userAgent = %self.user_agent, "Stream read from frontend failure");
                        break "client stream failed";
                    }
                }
            }
        };
        tracing::debug!(
            connectionID = self.link.connect_id(),
            streamUID = self.link.uid,
            "Close frontend streaming"
        );
        Box::pin(self.release()).await;
        self.record.log(&self.link, ended);
        gauge.dec();
    }

    /// Counts a protocol violation by this frontend; `Some` when it may be logged.
    fn violation(&self, kind: &'static str) -> Option<u64> {
        self.shared
            .metrics
            .tunnel
            .peer_violation(Peer::Frontend, kind)
    }

    fn reply(&self, packet: Packet) {
        self.link.deliver(packet);
    }

    async fn on_packet(&mut self, packet: Packet) {
        match (PacketType::try_from(packet.r#type), &packet.payload) {
            (Ok(PacketType::DialReq), Some(Payload::DialRequest(req))) => {
                let req = req.clone();
                self.on_dial_request(req, packet).await
            }
            (Ok(PacketType::Data), Some(Payload::Data(data))) => {
                let connect_id = data.connect_id;
                self.on_data(connect_id, packet).await
            }
            (Ok(PacketType::CloseReq), Some(Payload::CloseRequest(req))) => {
                let connect_id = req.connect_id;
                self.on_close_request(connect_id, packet).await
            }
            (Ok(PacketType::DialCls), Some(Payload::CloseDial(cls))) => {
                self.on_dial_close(cls.random)
            }
            (kind, _) => {
                if let Some(unlogged) = self.violation("unexpected_packet") {
                    tracing::warn!(
                        frontend = self.link.uid,
                        packet_type = kind.map(|k| k.as_str_name()).unwrap_or("Unknown"),
                        unlogged,
                        "ignoring a frontend packet that is unexpected or whose type disagrees with its payload"
                    )
                }
            }
        }
    }

    async fn on_dial_request(&mut self, req: DialRequest, packet: Packet) {
        if self.dial.is_some() {
            if let Some(unlogged) = self.violation("second_dial_request") {
                tracing::warn!(
                    frontend = self.link.uid,
                    unlogged,
                    "ignoring a second DIAL_REQ on one stream"
                );
            }
            return;
        }
        tracing::info!(v = 3, dialID = req.random, dialAddress = %req.address, "Received DIAL_REQ");
        self.record.destination = req.address.clone();
        self.link.set_destination(&req.address);
        let spec = DialSpec {
            kind: FrontendKind::Grpc,
            first_on_connection: self.first_on_connection,
            peer: &self.peer,
            address: &req.address,
            dial_id: req.random,
            request: packet,
        };
        match dial(&self.shared, &self.link, spec).await {
            Ok(dial) => {
                tracing::debug!(dialID = req.random, dialAddress = %req.address, "DIAL_REQ sent to backend");
                self.record.agent_id = Some(dial.agent.agent_id.clone());
                self.dial = Some(dial);
            }
            Err(e) => {
                match e {
                    DialError::NoAgent | DialError::ShuttingDown => {
                        tracing::error!(err = %e, dialID = req.random, "Failed to get a backend")
                    }
                    e => {
                        tracing::error!(err = %e, dialID = req.random, "DIAL_REQ to Backend failed")
                    }
                }
                let text = match e {
                    // Said the same way as when the agent dies later, while the dial waits.
                    DialError::SendFailed => AGENT_DISCONNECTED_DURING_DIAL.to_string(),
                    e => e.to_string(),
                };
                self.reply(dial_response_error(req.random, &text));
                self.stopped = true;
            }
        }
    }

    async fn on_dial_wake(&mut self) {
        let Some(dial) = &mut self.dial else { return };
        let dial_id = dial.id;
        match dial.wake(&self.shared).await {
            Wake::Nothing => {}
            Wake::SentAgain => self.record.agent_id = Some(dial.agent.agent_id.clone()),
            Wake::Expired => {
                self.reply(dial_response_error(dial_id, DIAL_TIMEOUT));
                self.stopped = true;
            }
            Wake::Failed(e) => {
                tracing::error!(err = %e, dialID = dial_id, "DIAL_REQ to Backend failed");
                self.reply(dial_response_error(dial_id, AGENT_DISCONNECTED_DURING_DIAL));
                self.stopped = true;
            }
        }
    }

    async fn on_data(&mut self, connect_id: i64, packet: Packet) {
        tracing::debug!(
            bytes = crate::wire::data_len(&packet),
            connectionID = connect_id,
            "Received data from connection"
        );
        if let Some(dial) = &mut self.dial {
            // The client sends DATA once it has its DIAL_RSP: no second try is left to make,
            // and no wake-up to arm for every later packet.
            dial.answered();
        }
        let Some(agent) = self.dial.as_ref().map(|d| d.agent.clone()) else {
            tracing::info!(
                v = 2,
                connectionID = connect_id,
                "Backend has not been initialized for this connection"
            );
            self.reply(close_response(connect_id, BACKEND_NOT_INITIALIZED));
            self.stopped = true;
            return;
        };
        if connect_id == 0 {
            if let Some(unlogged) = self.violation("data_without_connect_id") {
                tracing::error!(
                    packetType = "DATA",
                    frontend = self.link.uid,
                    unlogged,
                    "Received packet missing ConnectID from frontend"
                );
            }
            return;
        }
        let own = self.link.connect_id();
        if own == 0 {
            if let Some(unlogged) = self.violation("data_before_dial") {
                tracing::warn!(
                    frontend = self.link.uid,
                    connect_id,
                    unlogged,
                    "dropping DATA sent before the dial completed"
                );
            }
            return;
        }
        if connect_id != own {
            // Only our own connection is closed at the agent: the other id may belong to
            // another tunnel on the same agent, which this frontend must not touch.
            tracing::error!(
                firstConnectionID = own,
                connectionID = connect_id,
                frontend = self.link.uid,
                "Data does not match first connection id"
            );
            self.link.note_end(|| "mismatched connection IDs".into());
            if let Some(dial) = &self.dial {
                dial.release().await;
            }
            self.reply(close_response(own, MISMATCHED_CONNECTION_IDS));
            self.reply(close_response(connect_id, MISMATCHED_CONNECTION_IDS));
            self.stopped = true;
            return;
        }
        if self.link.close_was_sent() {
            // Closed already (by the agent, or its stream ended): the agent no longer knows
            // this connection, and the client may have dropped that CLOSE_RSP (see
            // `close_was_sent`). It hears it again, once.
            tracing::info!(
                v = 2,
                connectionID = connect_id,
                "DATA for a closed connection; sending CLOSE_RSP again"
            );
            self.reply(close_response(connect_id, ""));
            self.stopped = true;
            return;
        }
        let bytes = crate::wire::data_len(&packet) as u64;
        if agent.send(packet).await.is_err() {
            tracing::error!(err = "agent stream closed", connectionID = connect_id, agentID = %agent.agent_id, "DATA to Backend failed");
            // The stream's teardown closes this tunnel too; a client that never hears of it
            // would wait for data forever.
            self.link.note_end(|| "agent stream closed".into());
            self.reply(close_response(connect_id, ""));
            self.stopped = true;
        } else {
            self.link.facts.add_to_agent(bytes);
        }
    }

    async fn on_close_request(&mut self, connect_id: i64, packet: Packet) {
        tracing::debug!(connectionID = connect_id, "Received CLOSE_REQ");
        if let Some(dial) = &mut self.dial {
            // The client sends DATA once it has its DIAL_RSP: no second try is left to make,
            // and no wake-up to arm for every later packet.
            dial.answered();
        }
        let Some(agent) = self.dial.as_ref().map(|d| d.agent.clone()) else {
            tracing::info!(
                v = 2,
                connectionID = connect_id,
                "Backend has not been initialized for this connection"
            );
            self.reply(close_response(connect_id, BACKEND_UNINITIALIZED));
            return;
        };
        if connect_id != self.link.connect_id() {
            if let Some(unlogged) = self.violation("close_for_another_connection") {
                tracing::warn!(
                    frontend = self.link.uid,
                    connect_id,
                    unlogged,
                    "CLOSE_REQ for a connection this stream does not own"
                );
            }
            self.reply(close_response(connect_id, UNRECOGNIZED_CONNECT_ID));
            return;
        }
        self.link.note_end(|| "client closed".into());
        if agent.send(packet).await.is_err() {
            tracing::error!(err = "agent stream closed", connectionID = connect_id, agentID = %agent.agent_id, "CLOSE_REQ to Backend failed");
            self.reply(close_response(connect_id, CLOSE_REQ_FAILED));
        } else {
            tracing::debug!(connectionID = connect_id, "CLOSE_REQ sent to backend");
        }
        tracing::info!(
            v = 3,
            connectionID = connect_id,
            "Closing frontend streaming per CLOSE_REQ"
        );
        // Upstream stops reading here; the agent's CLOSE_RSP still reaches the client.
        self.stopped = true;
    }

    fn on_dial_close(&mut self, dial_id: i64) {
        tracing::debug!(dialID = dial_id, "Received DIAL_CLOSE");
        let cancelled = match &mut self.dial {
            Some(dial) => dial.cancel(dial_id),
            None => false,
        };
        if cancelled {
            self.link.note_end(|| "dial cancelled by client".into());
            tracing::error!(
                dialID = dial_id,
                dialAddress = %self.record.destination,
                dialDuration = %crate::gofmt::GoDuration(self.record.elapsed()),
                "Dial cancelled (DIAL_CLS) by frontend"
            );
        } else {
            tracing::error!(
                dialID = dial_id,
                "Unrecognized dial cancelled (DIAL_CLS) by frontend"
            );
        }
    }

    /// Runs when the stream ends, however it ends: whatever this tunnel still holds at its
    /// agent is removed and the agent told.
    async fn release(&mut self) {
        if let Some(dial) = self.dial.take() {
            match dial.release().await {
                Released::Pending(dial_id) => {
                    tracing::info!(
                        v = 2,
                        dialID = dial_id,
                        "frontend stream shutdown, cleaning dial"
                    )
                }
                Released::Established(connect_id) => tracing::info!(
                    v = 2,
                    connectionID = connect_id,
                    dialID = dial.id,
                    "frontend stream shutdown, cleaning frontend"
                ),
                Released::Nothing => {}
            }
        }
    }
}
