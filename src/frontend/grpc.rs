//! `/ProxyService/Proxy`: one stream per tunnel, as konnectivity-client opens them.

use std::sync::Arc;

use tonic::{Request, Response, Status, Streaming};

use super::dial::{dial, Dial, DialError, DialSpec, FrontendKind};
use super::sleep_until_opt;
use crate::listen::ConnStreams;
use crate::metrics::{Peer, Segment};
use crate::proto::packet::Payload;
use crate::proto::proxy_service_server::ProxyService;
use crate::proto::{DialRequest, Packet, PacketType};
use crate::state::Shared;
use crate::tunnel::{FrontendLink, FrontendQueue};
use crate::wire::{
    close_response, dial_response_error, AGENT_DISCONNECTED_DURING_DIAL, BACKEND_NOT_INITIALIZED,
    BACKEND_UNINITIALIZED, CLOSE_REQ_FAILED, DIAL_TIMEOUT, MISMATCHED_CONNECTION_IDS,
    UNRECOGNIZED_CONNECT_ID,
};

pub struct ProxyFrontend {
    pub shared: Arc<Shared>,
}

#[tonic::async_trait]
impl ProxyService for ProxyFrontend {
    type ProxyStream = FrontendQueue;

    async fn proxy(
        &self,
        request: Request<Streaming<Packet>>,
    ) -> Result<Response<FrontendQueue>, Status> {
        let shared = self.shared.clone();
        // The first stream of a connection is served also during the drain: the connection
        // was accepted before it began, and its client could not know.
        let first_on_connection = request
            .extensions()
            .get::<ConnStreams>()
            .is_none_or(ConnStreams::open_first);
        let (link, queue) = shared.tunnel_queue();
        let tunnel = GrpcTunnel {
            shared: shared.clone(),
            link,
            dial: None,
            stopped: false,
            first_on_connection,
        };
        shared.tasks.spawn(tunnel.serve(request.into_inner()));
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
    /// After a fatal error the stream is only drained, as upstream does, until the client ends it.
    stopped: bool,
}

impl GrpcTunnel {
    async fn serve(mut self, mut inbound: Streaming<Packet>) {
        let metrics = self.shared.metrics.clone();
        let gauge = metrics.grpc_connections.with_label_values(&["Proxy"]);
        gauge.inc();
        let hard_stop = self.shared.hard_stop.clone();
        loop {
            let deadline = self.dial.as_ref().and_then(|d| d.deadline);
            tokio::select! {
                biased;
                _ = hard_stop.cancelled() => break,
                _ = sleep_until_opt(deadline) => self.on_dial_deadline(),
                message = inbound.message() => match message {
                    Ok(Some(packet)) => {
                        metrics.packet(Segment::FromClient, packet.r#type);
                        if !self.stopped {
                            self.on_packet(packet).await;
                        }
                    }
                    Ok(None) => break,
                    Err(status) => {
                        metrics.stream_error(Segment::FromClient, status.code(), "Unknown");
                        break;
                    }
                }
            }
        }
        self.release().await;
        gauge.dec();
    }

    /// Counts a protocol violation by this frontend; `Some` when it may be logged.
    fn violation(&self, kind: &'static str) -> Option<u64> {
        self.shared.metrics.peer_violation(Peer::Frontend, kind)
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
        let spec = DialSpec {
            kind: FrontendKind::Grpc,
            first_on_connection: self.first_on_connection,
            address: &req.address,
            dial_id: req.random,
            request: packet,
        };
        match dial(&self.shared, &self.link, spec).await {
            Ok(dial) => self.dial = Some(dial),
            Err(e) => {
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

    fn on_dial_deadline(&mut self) {
        let Some(dial) = &mut self.dial else { return };
        if dial.expire() {
            let dial_id = dial.id;
            self.reply(dial_response_error(dial_id, DIAL_TIMEOUT));
            self.stopped = true;
        }
    }

    async fn on_data(&mut self, connect_id: i64, packet: Packet) {
        let Some(agent) = self.dial.as_ref().map(|d| d.agent.clone()) else {
            self.reply(close_response(connect_id, BACKEND_NOT_INITIALIZED));
            self.stopped = true;
            return;
        };
        if connect_id == 0 {
            if let Some(unlogged) = self.violation("data_without_connect_id") {
                tracing::warn!(
                    frontend = self.link.uid,
                    unlogged,
                    "dropping DATA with connect id 0"
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
            tracing::warn!(
                frontend = self.link.uid,
                connect_id,
                own,
                "mismatched connection IDs; closing the tunnel"
            );
            if let Some(dial) = &self.dial {
                dial.release().await;
            }
            self.reply(close_response(own, MISMATCHED_CONNECTION_IDS));
            self.reply(close_response(connect_id, MISMATCHED_CONNECTION_IDS));
            self.stopped = true;
            return;
        }
        if agent.send(packet).await.is_err() {
            tracing::debug!(agent_id = %agent.agent_id, connect_id, "DATA to agent failed: agent stream closed");
        }
    }

    async fn on_close_request(&mut self, connect_id: i64, packet: Packet) {
        let Some(agent) = self.dial.as_ref().map(|d| d.agent.clone()) else {
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
        if agent.send(packet).await.is_err() {
            self.reply(close_response(connect_id, CLOSE_REQ_FAILED));
        }
        // Upstream stops reading here; the agent's CLOSE_RSP still reaches the client.
        self.stopped = true;
    }

    fn on_dial_close(&mut self, dial_id: i64) {
        if let Some(dial) = &mut self.dial {
            dial.cancel(dial_id);
        }
    }

    /// Runs when the stream ends, however it ends: whatever this tunnel still holds at its
    /// agent is removed and the agent told.
    async fn release(&mut self) {
        if let Some(dial) = self.dial.take() {
            dial.release().await;
        }
    }
}
