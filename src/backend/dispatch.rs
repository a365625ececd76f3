//! Agent → frontend dispatch: what the agent session's receive loop does with each packet,
//! and the closes that keep the route table and the agent in step.

use std::time::Duration;

use super::session::{AgentSession, Establish};
use super::Registry;
use crate::gofmt::GoDuration;
use crate::metrics::{DialFailure, Metrics, Peer, Segment};
use crate::proto::packet::Payload;
use crate::proto::{DialResponse, Packet, PacketType};
use crate::tunnel::{Delivery, FrontendLink, QueueBudget};
use crate::wire::{
    close_request, close_response, dial_response_error, packet_type_name,
    AGENT_DISCONNECTED_DURING_DIAL, DUPLICATE_CONNECT_ID, FRONTEND_QUEUE_BUDGET,
    FRONTEND_QUEUE_OVERFLOW,
};

/// Sends a control packet to an agent without letting a stuck agent hold up the caller for
/// long: cleanup paths must always finish.
pub async fn send_to_agent_bounded(agent: &AgentSession, packet: Packet) {
    const CONTROL_SEND_LIMIT: Duration = Duration::from_secs(5);
    let kind = packet_type_name(packet.r#type);
    // Boxed: cleanup paths run rarely, and inline their timer and channel send would be part
    // of the future of every agent stream and every tunnel task, idle or not.
    match Box::pin(tokio::time::timeout(CONTROL_SEND_LIMIT, agent.send(packet))).await {
        Ok(Ok(())) => {}
        Ok(Err(_)) => {
            tracing::debug!(agent_id = %agent.agent_id, packet_type = kind, "agent gone; control packet dropped")
        }
        Err(_) => {
            tracing::warn!(agent_id = %agent.agent_id, packet_type = kind, "agent did not accept a control packet within 5s; dropped")
        }
    }
}

/// Asks the agent to close a connection, once: DATA still in flight for it is then dropped
/// quietly instead of answered with a CLOSE_REQ each.
pub async fn close_at_agent(agent: &AgentSession, connect_id: i64) {
    agent.mark_closing(connect_id);
    send_to_agent_bounded(agent, close_request(connect_id)).await;
}

/// Closes one established tunnel on an operator's request (the admin port), as the agent
/// closing it would for its frontend (a CLOSE_RSP, which ends an HTTP-CONNECT socket), and
/// asks the agent to close it (CLOSE_REQ). Returns false if it was no longer established.
pub async fn close_by_operator(agent: &AgentSession, connect_id: i64) -> bool {
    let Some(entry) = agent.remove_established(connect_id) else {
        return false;
    };
    entry.link.note_end(|| "closed by operator".into());
    entry.link.deliver(close_response(connect_id, ""));
    close_at_agent(agent, connect_id).await;
    true
}

/// Dispatches one packet received from an agent.
pub async fn route_from_agent(
    agent: &AgentSession,
    registry: &Registry,
    metrics: &Metrics,
    packet: Packet,
) {
    let kind = PacketType::try_from(packet.r#type);
    metrics.tunnel.packet(Segment::FromAgent, packet.r#type);
    match (kind, &packet.payload) {
        (Ok(PacketType::DialRsp), Some(Payload::DialResponse(rsp))) => {
            let rsp = rsp.clone();
            // Boxed, as the rare paths of `on_data` below: once per tunnel, and inline its
            // state would be part of every agent stream's future.
            Box::pin(on_dial_response(agent, metrics, rsp, packet)).await
        }
        (Ok(PacketType::Data), Some(Payload::Data(data))) => {
            let connect_id = data.connect_id;
            on_data(agent, registry, metrics, connect_id, packet).await
        }
        (Ok(PacketType::CloseRsp), Some(Payload::CloseResponse(rsp))) => {
            let connect_id = rsp.connect_id;
            tracing::debug!(agentID = %agent.agent_id, connectionID = connect_id, "Received CLOSE_RSP");
            match agent.remove_established(connect_id) {
                Some(entry) => {
                    if entry.link.deliver(packet) == Delivery::Gone {
                        tracing::error!(err = "frontend gone", agentID = %agent.agent_id, connectionID = connect_id, "CLOSE_RSP send to client stream error");
                    } else {
                        tracing::debug!(connectionID = connect_id, "CLOSE_RSP sent to frontend");
                    }
                }
                // A close we asked for (the frontend went first, as HTTP-CONNECT clients do):
                // its entry is already gone, and the answer only ends the close we remembered.
                // Upstream keeps the entry until this answer and so logs nothing here either.
                None if agent.closing_confirmed(connect_id) => {
                    tracing::debug!(agentID = %agent.agent_id, connectionID = connect_id, "CLOSE_RSP confirms a close this server asked for")
                }
                None => {
                    tracing::info!(v = 2, agentID = %agent.agent_id, connectionID = connect_id, "could not get frontend client for closing")
                }
            }
        }
        (Ok(PacketType::DialCls), Some(Payload::CloseDial(cls))) => {
            tracing::debug!(agentID = %agent.agent_id, dialID = cls.random, "Received DIAL_CLS");
            match agent.take_pending(cls.random) {
                Some(pending) => {
                    metrics.dial.dial_failure(DialFailure::BackendClose);
                    tracing::error!(
                        dialID = cls.random,
                        agentID = %agent.agent_id,
                        dialAddress = %pending.link.destination(),
                        dialDuration = %GoDuration(pending.started.elapsed()),
                        "Dial terminated (DIAL_CLS) by backend"
                    );
                    pending.link.deliver(packet);
                }
                None => {
                    tracing::info!(v = 2, dialID = cls.random, agentID = %agent.agent_id, "DIAL_CLS not recognized; dropped")
                }
            }
        }
        (Ok(PacketType::Drain), _) => {
            tracing::info!(v = 2, agentID = %agent.agent_id, "agent is draining");
            agent.set_draining();
            tracing::info!(v = 2, agentID = %agent.agent_id, "marked backend as draining, will not route new requests to this agent");
        }
        (Ok(kind), _) => {
            if let Some(unlogged) = metrics
                .tunnel
                .peer_violation(Peer::Agent, "unexpected_packet")
            {
                tracing::warn!(
                    agent_id = %agent.agent_id,
                    packet_type = kind.as_str_name(),
                    unlogged,
                    "dropping a packet whose type disagrees with its payload or is not expected from an agent"
                )
            }
        }
        (Err(_), _) => {
            if let Some(unlogged) = metrics
                .tunnel
                .peer_violation(Peer::Agent, "unknown_packet_type")
            {
                tracing::warn!(agent_id = %agent.agent_id, packet_type = packet.r#type, unlogged, "dropping a packet of unknown type")
            }
        }
    }
}

async fn on_dial_response(
    agent: &AgentSession,
    metrics: &Metrics,
    rsp: DialResponse,
    packet: Packet,
) {
    tracing::debug!(dialID = rsp.random, agentID = %agent.agent_id, connectionID = rsp.connect_id, "Received DIAL_RSP");
    if !rsp.error.is_empty() {
        match agent.take_pending(rsp.random) {
            Some(pending) => {
                tracing::error!(err = %rsp.error, dialID = rsp.random, agentID = %agent.agent_id, dialAddress = %pending.link.destination(), "DIAL_RSP contains failure");
                metrics.dial.dial_failure(DialFailure::ErrorResponse);
                pending.link.deliver(packet);
            }
            None => reject_unrecognized(agent, metrics, &rsp).await,
        }
        return;
    }
    match agent.establish(rsp.random, rsp.connect_id) {
        Establish::Unknown => reject_unrecognized(agent, metrics, &rsp).await,
        Establish::DuplicateConnectId(pending) => {
            tracing::warn!(agent_id = %agent.agent_id, connect_id = rsp.connect_id, "agent reused a live connect id; failing the new dial");
            metrics.dial.dial_failure(DialFailure::ErrorResponse);
            pending
                .link
                .deliver(dial_response_error(rsp.random, DUPLICATE_CONNECT_ID));
        }
        Establish::Established { link, started } => {
            if link.deliver(packet) == Delivery::Queued {
                metrics
                    .dial
                    .dial_duration
                    .observe(started.elapsed().as_secs_f64());
                tracing::info!(
                    v = 3,
                    dialID = rsp.random,
                    connectionID = rsp.connect_id,
                    agentID = %agent.agent_id,
                    dialAddress = %link.destination(),
                    dialDuration = %GoDuration(started.elapsed()),
                    "Proxy connection established"
                );
            } else {
                tracing::error!(err = "frontend gone", dialID = rsp.random, agentID = %agent.agent_id, connectionID = rsp.connect_id, "DIAL_RSP send to frontend stream failure");
                metrics.dial.dial_failure(DialFailure::SendRsp);
                agent.remove_established(rsp.connect_id);
                close_at_agent(agent, rsp.connect_id).await;
            }
        }
    }
}

async fn reject_unrecognized(agent: &AgentSession, metrics: &Metrics, rsp: &DialResponse) {
    metrics.dial.dial_failure(DialFailure::UnrecognizedResponse);
    tracing::info!(v = 2, dialID = rsp.random, agentID = %agent.agent_id, connectionID = rsp.connect_id, "DIAL_RSP not recognized; dropped");
    if rsp.connect_id != 0 {
        close_at_agent(agent, rsp.connect_id).await;
    }
}

async fn on_data(
    agent: &AgentSession,
    registry: &Registry,
    metrics: &Metrics,
    connect_id: i64,
    mut packet: Packet,
) {
    tracing::debug!(
        bytes = crate::wire::data_len(&packet),
        agentID = %agent.agent_id,
        connectionID = connect_id,
        "Received data from agent"
    );
    if connect_id == 0 {
        if let Some(unlogged) = metrics
            .tunnel
            .peer_violation(Peer::Agent, "data_without_connect_id")
        {
            tracing::error!(packetType = "DATA", agentID = %agent.agent_id, unlogged, "Received packet missing ConnectID from agent");
        }
        return;
    }
    let Some(link) = agent.tunnel(connect_id) else {
        if !agent.is_closing(connect_id) {
            tracing::info!(v = 2, agentID = %agent.agent_id, connectionID = connect_id, error = "unknown connection", "could not get frontend client; closing connection");
            close_at_agent(agent, connect_id).await;
        }
        return;
    };
    // The payload is a slice of the gRPC decode buffer, which it would keep alive whole while
    // it waits in the queue (a buffer several times its size): a copy of exactly its length
    // frees the buffer and makes the queue's byte count what it really holds.
    if let Some(Payload::Data(data)) = &mut packet.payload {
        data.data = bytes::Bytes::copy_from_slice(&data.data);
    }
    link.make_room().await;
    match link.deliver(packet) {
        Delivery::Queued => {
            if link.budget().is_over() {
                Box::pin(enforce_budget(registry, metrics, link.budget())).await;
            }
        }
        Delivery::Gone => {
            if agent.remove_established(connect_id).is_some() {
                close_at_agent(agent, connect_id).await;
            }
        }
        Delivery::Overflow => Box::pin(close_backlogged(agent, metrics, connect_id, &link)).await,
    }
}

/// Why a tunnel is closed from our side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backlog {
    /// Its own queue passed its byte or stall limit.
    Overflow,
    /// The server's budget was exhausted and this frontend was not reading.
    Budget,
}

/// Closes a tunnel whose frontend fell behind past its limits: CLOSE_REQ to the agent, a
/// CLOSE_RSP with an error to the frontend (HTTP-CONNECT closes the socket), a counter, and
/// one log line naming the tunnel. What was queued for it is dropped at once.
pub async fn close_backlogged(
    agent: &AgentSession,
    metrics: &Metrics,
    connect_id: i64,
    link: &FrontendLink,
) {
    close_behind(agent, metrics, connect_id, link, Backlog::Overflow).await
}

async fn close_behind(
    agent: &AgentSession,
    metrics: &Metrics,
    connect_id: i64,
    link: &FrontendLink,
    why: Backlog,
) {
    if agent.remove_established(connect_id).is_none() {
        return;
    }
    let (counter, error, why) = match why {
        Backlog::Overflow => (
            &metrics.frontend.queue_overflows,
            FRONTEND_QUEUE_OVERFLOW,
            "its frontend stopped reading and its queue passed the byte or stall limit",
        ),
        Backlog::Budget => (
            &metrics.frontend.queue_budget_closes,
            FRONTEND_QUEUE_BUDGET,
            "the server's frontend queue budget is exhausted and this frontend, holding the most unread data, is not reading",
        ),
    };
    // Counted before the queue is dropped (tens of MiB may take a while to free): a scrape that
    // already sees the tunnel gone from the established gauge should see why.
    counter.inc();
    let dropped = link.abort();
    tracing::warn!(
        agent_id = %agent.agent_id,
        connect_id,
        frontend = link.uid,
        dropped,
        "closing tunnel: {why}"
    );
    link.deliver(close_response(connect_id, error));
    close_at_agent(agent, connect_id).await;
}

/// Brings the bytes queued toward all frontends back within the budget: closes the tunnel
/// whose frontend is not reading and holds the most unread bytes, then the next, until the
/// budget holds or only readers are left. Readers are never closed for the budget; they are
/// held to a fair share of it instead (`FrontendLink::make_room`).
pub async fn enforce_budget(registry: &Registry, metrics: &Metrics, budget: &QueueBudget) {
    while budget.is_over() {
        let victim = registry
            .agents()
            .into_iter()
            .flat_map(|agent| {
                let links = agent.established_links();
                links
                    .into_iter()
                    .map(move |(id, link)| (agent.clone(), id, link))
            })
            .filter(|(_, _, link)| !link.is_reading() && link.queued_bytes() > 0)
            .max_by_key(|(_, _, link)| link.queued_bytes());
        let Some((agent, connect_id, link)) = victim else {
            break;
        };
        close_behind(&agent, metrics, connect_id, &link, Backlog::Budget).await;
    }
    // Queues whose tunnels were already closed at their agents, but whose frontends never
    // read what was queued before the close.
    while budget.is_over() {
        let Some(dropped) = budget.abort_largest_idle() else {
            break;
        };
        metrics.frontend.queue_budget_closes.inc();
        tracing::warn!(
            dropped,
            "dropping the unread data of a closed tunnel: the server's frontend queue budget is exhausted"
        );
    }
}

/// Closes tunnels whose full queues made no progress for their stall limit, also when no
/// new data arrives to notice it. Runs once a second until `stop`.
pub async fn sweep_stalled_tunnels(
    registry: &Registry,
    metrics: &Metrics,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut ticks = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        for agent in registry.agents() {
            for (connect_id, link) in agent.established_links() {
                if link.is_stalled() {
                    close_backlogged(&agent, metrics, connect_id, &link).await;
                }
            }
        }
    }
}

/// Fails or closes everything that used an agent stream that has ended.
pub fn teardown_agent(agent: &AgentSession, metrics: &Metrics) {
    let (pending, established) = agent.teardown();
    if !established.is_empty() {
        tracing::info!(v = 2, count = established.len(), agentID = %agent.agent_id, "Close established connections to agent");
    }
    for (dial_id, dial) in pending {
        metrics.dial.dial_failure(DialFailure::BackendClose);
        dial.link
            .deliver(dial_response_error(dial_id, AGENT_DISCONNECTED_DURING_DIAL));
    }
    for (connect_id, tunnel) in established {
        tunnel.link.deliver(close_response(connect_id, ""));
    }
}
