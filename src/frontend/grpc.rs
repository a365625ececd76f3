//! `/ProxyService/Proxy`: one stream per tunnel, as konnectivity-client opens them.

use std::sync::Arc;

use tokio::time::Instant;

use super::sleep_until_opt;
use tonic::{Request, Response, Status, Streaming};

use crate::admin::metrics::{DialFailure, Segment};
use crate::backend::session::{AddPendingError, AgentSession, Released};
use crate::proto::packet::Payload;
use crate::proto::proxy_service_server::ProxyService;
use crate::proto::{DialRequest, Packet, PacketType};
use crate::server::Shared;
use crate::tunnel::{
    close_response, dial_close, dial_response_error, send_to_agent_bounded, FrontendLink,
    FrontendQueue, AGENT_DISCONNECTED_DURING_DIAL,
};

pub const NO_AGENT_AVAILABLE: &str = "No agent available";
pub const DIAL_TIMEOUT: &str = "timed out waiting for backend dial";
pub const BACKEND_NOT_INITIALIZED: &str = "backend not initialized";
pub const BACKEND_UNINITIALIZED: &str = "backend uninitialized";
pub const MISMATCHED_CONNECTION_IDS: &str = "mismatched connection IDs";
pub const CLOSE_REQ_FAILED: &str = "CLOSE_REQ to backend failed";
pub const SHUTTING_DOWN: &str = "konnectivity-server is shutting down: no new dials accepted";

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
        let (link, queue) =
            FrontendLink::new(shared.snapshot().queue_limits(), shared.metrics.clone());
        let tunnel = GrpcTunnel {
            shared: shared.clone(),
            link,
            agent: None,
            dial_id: 0,
            deadline: None,
            stopped: false,
        };
        shared.tasks.spawn(tunnel.serve(request.into_inner()));
        Ok(Response::new(queue))
    }
}

/// The state of one Proxy stream.
struct GrpcTunnel {
    shared: Arc<Shared>,
    link: Arc<FrontendLink>,
    agent: Option<Arc<AgentSession>>,
    dial_id: i64,
    /// When a pending dial times out (--backend-dial-timeout).
    deadline: Option<Instant>,
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
            let deadline = self.deadline;
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
            (kind, _) => tracing::warn!(
                frontend = self.link.uid,
                packet_type = kind.map(|k| k.as_str_name()).unwrap_or("Unknown"),
                "ignoring a frontend packet that is unexpected or whose type disagrees with its payload"
            ),
        }
    }

    async fn on_dial_request(&mut self, req: DialRequest, packet: Packet) {
        let metrics = &self.shared.metrics;
        if self.agent.is_some() {
            tracing::warn!(
                frontend = self.link.uid,
                "ignoring a second DIAL_REQ on one stream"
            );
            return;
        }
        if self.shared.is_draining() {
            self.reply(dial_response_error(req.random, SHUTTING_DOWN));
            self.stopped = true;
            return;
        }
        let Some(agent) = self.shared.registry.pick(&req.address) else {
            metrics.dial_failure(DialFailure::NoAgent);
            self.reply(dial_response_error(req.random, NO_AGENT_AVAILABLE));
            self.stopped = true;
            return;
        };
        match agent.add_pending(req.random, self.link.clone()) {
            Ok(()) => {}
            Err(AddPendingError::AgentGone) => {
                metrics.dial_failure(DialFailure::BackendClose);
                self.reply(dial_response_error(
                    req.random,
                    AGENT_DISCONNECTED_DURING_DIAL,
                ));
                self.stopped = true;
                return;
            }
            Err(AddPendingError::DuplicateDialId) => {
                self.reply(dial_response_error(
                    req.random,
                    "a dial with this id is already pending",
                ));
                self.stopped = true;
                return;
            }
        }
        self.agent = Some(agent.clone());
        self.dial_id = req.random;
        tracing::debug!(agent_id = %agent.agent_id, dial_id = req.random, address = %req.address, "dialing through agent");
        let timeout = self.shared.snapshot().config.backend_dial_timeout;
        let sent = match timeout {
            Some(limit) => match tokio::time::timeout(limit, agent.send(packet)).await {
                Ok(result) => result.map_err(|_| false),
                Err(_) => Err(true),
            },
            None => agent.send(packet).await.map_err(|_| false),
        };
        match sent {
            Ok(()) => self.deadline = timeout.map(|t| Instant::now() + t),
            Err(timed_out) => {
                if agent.take_pending(req.random).is_some() {
                    if timed_out {
                        metrics.dial_failure(DialFailure::BackendDialTimeout);
                        // An agent that cannot take a DIAL_REQ in time is stuck: retire it so
                        // later dials go elsewhere and it reconnects afresh.
                        tracing::warn!(agent_id = %agent.agent_id, "retiring agent: sending DIAL_REQ timed out");
                        agent.set_draining();
                        agent.retired.cancel();
                        self.reply(dial_response_error(req.random, DIAL_TIMEOUT));
                    } else {
                        metrics.dial_failure(DialFailure::BackendClose);
                        self.reply(dial_response_error(
                            req.random,
                            AGENT_DISCONNECTED_DURING_DIAL,
                        ));
                    }
                }
                self.stopped = true;
            }
        }
    }

    fn on_dial_deadline(&mut self) {
        self.deadline = None;
        let Some(agent) = &self.agent else { return };
        if agent.take_pending(self.dial_id).is_some() {
            self.shared
                .metrics
                .dial_failure(DialFailure::BackendDialTimeout);
            tracing::info!(agent_id = %agent.agent_id, dial_id = self.dial_id, "dial timed out waiting for the agent");
            self.reply(dial_response_error(self.dial_id, DIAL_TIMEOUT));
            self.stopped = true;
        }
    }

    async fn on_data(&mut self, connect_id: i64, packet: Packet) {
        let Some(agent) = self.agent.clone() else {
            self.reply(close_response(connect_id, BACKEND_NOT_INITIALIZED));
            self.stopped = true;
            return;
        };
        if connect_id == 0 {
            tracing::warn!(frontend = self.link.uid, "dropping DATA with connect id 0");
            return;
        }
        let own = self.link.connect_id();
        if own == 0 {
            tracing::warn!(
                frontend = self.link.uid,
                connect_id,
                "dropping DATA sent before the dial completed"
            );
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
            if let Released::Established(id) = agent.release(&self.link, self.dial_id) {
                crate::tunnel::close_at_agent(&agent, id).await;
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
        let Some(agent) = self.agent.clone() else {
            self.reply(close_response(connect_id, BACKEND_UNINITIALIZED));
            return;
        };
        if connect_id != self.link.connect_id() {
            tracing::warn!(
                frontend = self.link.uid,
                connect_id,
                "CLOSE_REQ for a connection this stream does not own"
            );
            self.reply(close_response(connect_id, "unrecognized connectID"));
            return;
        }
        if agent.send(packet).await.is_err() {
            self.reply(close_response(connect_id, CLOSE_REQ_FAILED));
        }
        // Upstream stops reading here; the agent's CLOSE_RSP still reaches the client.
        self.stopped = true;
    }

    fn on_dial_close(&mut self, dial_id: i64) {
        let Some(agent) = &self.agent else { return };
        if dial_id == self.dial_id && agent.take_pending(dial_id).is_some() {
            self.shared.metrics.dial_failure(DialFailure::FrontendClose);
            self.deadline = None;
        }
    }

    /// Runs when the stream ends, however it ends: whatever this tunnel still holds at its
    /// agent is removed and the agent told.
    async fn release(&mut self) {
        let Some(agent) = self.agent.take() else {
            return;
        };
        match agent.release(&self.link, self.dial_id) {
            Released::Pending(dial_id) => {
                self.shared.metrics.dial_failure(DialFailure::FrontendClose);
                send_to_agent_bounded(&agent, dial_close(dial_id)).await
            }
            Released::Established(connect_id) => {
                crate::tunnel::close_at_agent(&agent, connect_id).await
            }
            Released::Nothing => {}
        }
    }
}
