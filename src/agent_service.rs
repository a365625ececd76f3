//! `/AgentService/Connect`: one long-lived stream per agent.

use std::sync::Arc;

use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Request, Response, Status, Streaming};

use crate::backend::dispatch::{route_from_agent, teardown_agent};
use crate::backend::liveness::{watch, Unanswered};
use crate::backend::session::AgentSession;
use crate::codec::serve::Handler;
use crate::identifiers::AgentIdentifiers;
use crate::listen::ConnStreams;
use crate::metrics::{stream_error_code, Segment};
use crate::proto::Packet;
use crate::state::Shared;

/// Renders metadata values as Go prints a `[]string` with `%v`: `[a b]`.
fn go_string_list(values: &[String]) -> String {
    format!("[{}]", values.join(" "))
}

fn metadata_values(metadata: &MetadataMap, key: &str) -> Vec<String> {
    metadata
        .get_all(key)
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .collect()
}

/// Reads `agentid` (exactly one) and `agentidentifiers` (at most one), with upstream's errors.
pub fn read_agent_metadata(metadata: &MetadataMap) -> Result<(String, AgentIdentifiers), Status> {
    let ids = metadata_values(metadata, "agentid");
    if ids.len() != 1 {
        return Err(Status::unknown(format!(
            "expected one agent ID in the context, got {}",
            go_string_list(&ids)
        )));
    }
    let identifiers = metadata_values(metadata, "agentidentifiers");
    if identifiers.len() > 1 {
        return Err(Status::unknown(format!(
            "expected at most one set of agent identifiers in the context, got {}",
            go_string_list(&identifiers)
        )));
    }
    let parsed = match identifiers.first() {
        Some(query) => AgentIdentifiers::parse(query)
            .map_err(|e| Status::unknown(format!("fail to parse url encoded string: {e}")))?,
        None => AgentIdentifiers::default(),
    };
    Ok((ids.into_iter().next().expect("one id"), parsed))
}

pub struct AgentServer {
    pub shared: Arc<Shared>,
}

type ConnectStream =
    std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<Packet, Status>> + Send>>;

impl Handler for AgentServer {
    const PATH: &'static str = "/AgentService/Connect";
    type Packets = ConnectStream;

    async fn serve(
        &self,
        request: Request<Streaming<Packet>>,
    ) -> Result<Response<ConnectStream>, Status> {
        let shared = &self.shared;
        let (agent_id, identifiers) = read_agent_metadata(request.metadata()).inspect_err(|e| {
            tracing::error!(err = %e.message(), "Invalid backend");
        })?;
        if shared.is_draining() {
            return Err(Status::unavailable("konnectivity-server is shutting down"));
        }
        let snapshot = shared.snapshot();
        tracing::info!(v = 2, agentID = %agent_id, serverID = %snapshot.config.server_id, "Connect request from agent");
        if let Some(authenticator) = &shared.authenticator {
            let expected = crate::kubernetes::auth::Expected {
                namespace: snapshot.config.agent_namespace.clone(),
                service_account: snapshot.config.agent_service_account.clone(),
                audience: snapshot.config.authentication_audience.clone(),
            };
            if let Err(message) = authenticator
                .authenticate(request.metadata(), &expected, &shared.metrics)
                .await
            {
                tracing::error!(err = %message, agentID = %agent_id, "Client authentication failed");
                return Err(Status::unknown(message));
            }
        }
        let server_id = MetadataValue::try_from(snapshot.config.server_id.as_str())
            .map_err(|_| Status::internal("server id is not valid metadata"))?;
        let server_count = MetadataValue::from(snapshot.config.server_count);

        let (outbound_tx, outbound_rx) = mpsc::channel(snapshot.config.xfr_channel_size);
        let retired = shared.hard_stop.child_token();
        let ping = request
            .extensions()
            .get::<ConnStreams>()
            .and_then(|conn| conn.ping().cloned());
        let session = Arc::new(AgentSession::new(
            agent_id,
            identifiers,
            outbound_tx,
            retired.clone(),
            ping,
            shared.metrics.clone(),
        ));
        tracing::info!(
            v = 2,
            agentID = %session.agent_id,
            serverID = %snapshot.config.server_id,
            identifiers = ?session.identifiers,
            "Agent connected"
        );
        let ending = Arc::new(std::sync::Mutex::new(None::<Status>));
        shared.registry.add(&session);
        shared
            .metrics
            .frontend
            .grpc_connections
            .with_label_values(&["Connect"])
            .inc();
        shared.tasks.spawn(serve_agent(
            shared.clone(),
            session,
            request.into_inner(),
            ending.clone(),
        ));

        // The stream ends when the session is retired, so the agent sees a clean end of
        // stream and reconnects; or, when the agent broke the stream, with the error status.
        let outbound = ReceiverStream::new(outbound_rx)
            .take_until(retired.cancelled_owned())
            .map(|packet| Ok(*packet))
            .chain(futures_util::stream::iter(std::iter::from_fn(move || {
                ending
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take()
                    .map(Err)
            })));
        let mut response = Response::new(Box::pin(outbound) as ConnectStream);
        // Sent as response headers before any packet: the agent waits for them.
        response.metadata_mut().insert("serverid", server_id);
        response.metadata_mut().insert("servercount", server_count);
        Ok(response)
    }
}

/// The status a stream that the agent broke ends with, as grpc-go ends it: INTERNAL for a
/// message that does not decode, RESOURCE_EXHAUSTED for one over the size limit. `None` for
/// an agent that went away (nobody is left to tell).
fn broken_stream_status(status: &Status) -> Option<Status> {
    match status.code() {
        tonic::Code::Internal => Some(Status::internal(status.message())),
        // tonic says OUT_OF_RANGE for a message over the limit; grpc-go, RESOURCE_EXHAUSTED.
        tonic::Code::OutOfRange | tonic::Code::ResourceExhausted => {
            Some(Status::resource_exhausted(status.message()))
        }
        _ => None,
    }
}

async fn serve_agent(
    shared: Arc<Shared>,
    session: Arc<AgentSession>,
    mut inbound: Streaming<Packet>,
    ending: Arc<std::sync::Mutex<Option<Status>>>,
) {
    let metrics = &shared.metrics;
    let agent_id = &session.agent_id;
    let liveness = watch(
        &session,
        || shared.snapshot().config.agent_liveness,
        metrics,
    );
    tokio::pin!(liveness);
    loop {
        tokio::select! {
            biased;
            _ = session.retired.cancelled() => {
                tracing::info!(v = 2, agentID = %agent_id, "Backend connection retired");
                break;
            }
            Unanswered(silent) = &mut liveness => {
                tracing::warn!(agentID = %agent_id, unanswered = ?silent, "agent did not answer PING: retiring its connection, failing its dials and closing its tunnels");
                metrics.backend.unanswered_agent_retirements.inc();
                session.set_draining();
                if let Some(ping) = &session.ping {
                    // The connection itself goes too: nothing on it can be answered.
                    ping.kill();
                }
                session.retired.cancel();
                break;
            }
            message = inbound.message() => match message {
                // Boxed: inline, the state of every path a packet can take (a dial's answer,
                // a close at the agent, the budget) would stay in this task, and so in every
                // idle agent's memory; one small allocation per packet instead.
                Ok(Some(packet)) => Box::pin(route_from_agent(&session, &shared.registry, metrics, packet)).await,
                Ok(None) => {
                    tracing::info!(v = 2, agentID = %agent_id, "Receive stream from agent is closed");
                    break;
                }
                Err(status) => {
                    let code = stream_error_code(&status);
                    metrics.tunnel.stream_error(Segment::FromAgent, code, "Unknown");
                    if code == tonic::Code::Cancelled {
                        tracing::info!(v = 2, agentID = %agent_id, "Stream read from agent cancelled");
                    } else {
                        tracing::error!(err = %status.message(), agentID = %agent_id, "Receive stream from agent read failure");
                    }
                    *ending.lock().unwrap_or_else(|p| p.into_inner()) = broken_stream_status(&status);
                    break;
                }
            }
        }
    }
    shared.registry.remove(&session);
    session.set_suspect(false, metrics);
    session.retired.cancel();
    teardown_agent(&session, metrics);
    metrics
        .frontend
        .grpc_connections
        .with_label_values(&["Connect"])
        .dec();
    tracing::info!(v = 3, agentID = %session.agent_id, "Close backend of agent");
}
