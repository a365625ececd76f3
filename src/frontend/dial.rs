//! The dial protocol, written once for every frontend: refuse while draining, pick an agent,
//! record the pending dial, send DIAL_REQ within --backend-dial-timeout (retiring an agent
//! that cannot take it), and, however the tunnel ends, release what it still holds at its
//! agent. Frontends only render the outcome in their own protocol; the dial-failure metrics
//! are recorded here, so the frontends cannot disagree about them.

use std::sync::Arc;

use tokio::time::Instant;
use tokio_util::task::task_tracker::TaskTrackerToken;

use crate::backend::dispatch::{close_at_agent, send_to_agent_bounded};
use crate::backend::session::{AddPendingError, AgentSession, Released};
use crate::metrics::{DialFailure, Metrics};
use crate::proto::Packet;
use crate::state::Shared;
use crate::tunnel::{FrontendLink, Origin};
use crate::wire::{
    dial_close, AGENT_DISCONNECTED_DURING_DIAL, DIAL_TIMEOUT, DUPLICATE_DIAL_ID,
    NO_AGENT_AVAILABLE, SHUTTING_DOWN,
};

/// Which frontend protocol a tunnel speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrontendKind {
    Grpc,
    HttpConnect,
}

impl FrontendKind {
    /// The name in log lines and the admin port's `/tunnels`.
    pub fn as_str(self) -> &'static str {
        match self {
            FrontendKind::Grpc => "grpc",
            FrontendKind::HttpConnect => "http-connect",
        }
    }
}

/// Why a dial request did not reach an agent. Each is counted (or not) here, as upstream
/// counts it for that frontend; the frontend turns it into its own reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DialError {
    #[error("{SHUTTING_DOWN}")]
    ShuttingDown,
    #[error("{NO_AGENT_AVAILABLE}")]
    NoAgent,
    /// The chosen agent's stream ended before the dial could be recorded.
    #[error("{AGENT_DISCONNECTED_DURING_DIAL}")]
    AgentGone,
    #[error("{DUPLICATE_DIAL_ID}")]
    DuplicateDialId,
    /// The destination policy refuses the address (counted and logged where it is checked).
    #[error("{}", crate::policy::NOT_ALLOWED)]
    NotAllowed,
    /// The agent's stream closed while the DIAL_REQ was being sent.
    #[error("agent stream closed")]
    SendFailed,
    /// The agent did not take the DIAL_REQ within the dial timeout; it was retired.
    #[error("{DIAL_TIMEOUT}")]
    SendTimedOut,
}

impl DialError {
    fn record(self, kind: FrontendKind, metrics: &Metrics) {
        let failure = match self {
            DialError::ShuttingDown | DialError::DuplicateDialId | DialError::NotAllowed => return,
            // Upstream counts `no_agent` for gRPC only; its HTTP-CONNECT path records nothing.
            DialError::NoAgent if kind == FrontendKind::HttpConnect => return,
            DialError::NoAgent => DialFailure::NoAgent,
            DialError::AgentGone | DialError::SendFailed => DialFailure::BackendClose,
            DialError::SendTimedOut => DialFailure::BackendDialTimeout,
        };
        metrics.dial.dial_failure(failure);
    }
}

/// A dial sent to an agent, pending or established, owned by one frontend tunnel.
pub struct Dial {
    pub agent: Arc<AgentSession>,
    pub id: i64,
    /// When a still-pending dial times out (--backend-dial-timeout); `None` once settled.
    pub deadline: Option<Instant>,
    /// When to look whether the agent still answers while the dial waits; `None` once the
    /// dial is answered, its agent answered a PING since, or it was sent a second time.
    check_at: Option<Instant>,
    sent_at: std::time::Instant,
    /// The DIAL_REQ, for a second try on another agent (only while one can come).
    second_try: Option<Box<Packet>>,
    link: Arc<FrontendLink>,
    metrics: Arc<Metrics>,
    /// Keeps the drain waiting while this tunnel holds anything at its agent.
    _drain: TaskTrackerToken,
}

/// What a frontend asks to dial.
pub struct DialSpec<'a> {
    pub kind: FrontendKind,
    /// Whether this is the first tunnel on its frontend connection. During the drain no new
    /// connection is accepted, and a new dial on a connection that already carried one is
    /// refused (its client should move on); the first one of a connection accepted just
    /// before the drain began is still served, so a restart fails no request.
    pub first_on_connection: bool,
    /// Who asked, for log lines: the frontend's address, or the Unix socket.
    pub peer: &'a Arc<str>,
    pub address: &'a str,
    pub dial_id: i64,
    /// The DIAL_REQ to send, with id `dial_id` for `address`.
    pub request: Packet,
}

/// Sends the DIAL_REQ of `spec` to an agent on behalf of the frontend tunnel whose queue is
/// `link`.
pub async fn dial(
    shared: &Shared,
    link: &Arc<FrontendLink>,
    spec: DialSpec<'_>,
) -> Result<Dial, DialError> {
    let kind = spec.kind;
    // Boxed: a dial runs once per tunnel, and its state (the pick, the start-up grace wait,
    // the DIAL_REQ send under a timeout) would otherwise stay in the frontend task's future,
    // and so in its memory, for the tunnel's whole life.
    let result = Box::pin(send_dial(shared, link, spec)).await;
    if let Err(e) = result {
        e.record(kind, &shared.metrics);
    }
    result
}

async fn send_dial(
    shared: &Shared,
    link: &Arc<FrontendLink>,
    spec: DialSpec<'_>,
) -> Result<Dial, DialError> {
    let DialSpec {
        kind: spec_kind,
        first_on_connection,
        peer,
        address,
        dial_id,
        request,
    } = spec;
    if shared.is_draining() && !first_on_connection {
        return Err(DialError::ShuttingDown);
    }
    if let Err(refusal) = shared.snapshot().config.destinations.check(address) {
        if let Some(unlogged) = shared.metrics.dial.destination_refused(refusal.label()) {
            tracing::warn!(frontend = ?spec_kind, peer = %peer, destination = %address, rule = refusal.label(), unlogged, "dial refused: destination not allowed by policy");
        }
        return Err(DialError::NotAllowed);
    }
    let agent = match shared.registry.pick(address) {
        Some(agent) => agent,
        None => wait_for_agent(shared, address)
            .await
            .ok_or(DialError::NoAgent)?,
    };
    link.facts.set_origin(Origin {
        frontend: spec_kind.as_str(),
        peer: peer.clone(),
        dial_id,
    });
    agent
        .add_pending(dial_id, link.clone())
        .map_err(|e| match e {
            AddPendingError::AgentGone => DialError::AgentGone,
            AddPendingError::DuplicateDialId => DialError::DuplicateDialId,
        })?;
    let drain = shared.tunnel_token();
    tracing::info!(v = 3, agentID = %agent.agent_id, dialID = dial_id, dialAddress = %address, "Pick agent as backend");
    let snapshot = shared.snapshot();
    let timeout = snapshot.config.backend_dial_timeout;
    let liveness = snapshot.config.agent_liveness;
    let second_try = liveness.map(|_| Box::new(request.clone()));
    let sent_at = std::time::Instant::now();
    let sent = send_within(&agent, request, timeout).await;
    // A failed send whose pending entry is already gone was answered through the link (the
    // agent's teardown sent the frontend its DIAL_RSP): the tunnel then goes on as if sent.
    if let Err(e) = sent {
        if agent.take_pending(dial_id).is_some() {
            if e == DialError::SendTimedOut {
                // An agent that cannot take a DIAL_REQ in time is stuck: retire it so later
                // dials go elsewhere and it reconnects afresh.
                tracing::info!(v = 2, agentID = %agent.agent_id, reason = "backend dial request send timed out", "Retire backend connection");
                agent.set_draining();
                agent.retired.cancel();
            }
            return Err(e);
        }
    }
    Ok(Dial {
        agent,
        id: dial_id,
        deadline: timeout.map(|t| Instant::now() + t),
        check_at: liveness.map(|l| Instant::now() + l.dial_wait + l.suspect_after + CHECK_SLACK),
        sent_at,
        second_try,
        link: link.clone(),
        metrics: shared.metrics.clone(),
        _drain: drain,
    })
}

/// Sends a DIAL_REQ within --backend-dial-timeout.
async fn send_within(
    agent: &AgentSession,
    request: Packet,
    timeout: Option<std::time::Duration>,
) -> Result<(), DialError> {
    match timeout {
        Some(limit) => tokio::time::timeout(limit, agent.send(request))
            .await
            .map_err(|_| DialError::SendTimedOut)
            .and_then(|sent| sent.map_err(|_| DialError::SendFailed)),
        None => agent.send(request).await.map_err(|_| DialError::SendFailed),
    }
}

/// How long after an agent should have turned suspect a waiting dial looks (the agent's
/// watch runs on its own timer), and how often again while it is undecided.
const CHECK_SLACK: std::time::Duration = std::time::Duration::from_millis(100);
const RECHECK: std::time::Duration = std::time::Duration::from_millis(250);

/// What a dial's wake-up came to.
pub enum Wake {
    Nothing,
    /// The dial timed out (--backend-dial-timeout); it is removed and counted.
    Expired,
    /// Its agent stopped answering; the dial went to another agent.
    SentAgain,
    /// Its agent stopped answering and the second try could not be made; the dial is gone.
    Failed(DialError),
}

/// Just after a (re)start the agents have not reconnected yet: within --startup-dial-grace a
/// dial that finds no agent waits for one (bounded by --backend-dial-timeout) instead of
/// failing at once, so a restart does not fail the requests that arrive meanwhile.
async fn wait_for_agent(shared: &Shared, address: &str) -> Option<Arc<AgentSession>> {
    let mut limit = shared.startup_grace_left();
    if limit.is_zero() {
        return None;
    }
    if let Some(timeout) = shared.snapshot().config.backend_dial_timeout {
        limit = limit.min(timeout);
    }
    tracing::debug!(%address, ?limit, "no agent yet: waiting for one (startup grace)");
    let waiting = &shared.metrics.dial.dials_waiting_for_agent;
    waiting.inc();
    let agent = tokio::select! {
        agent = shared.registry.pick_within(address, limit) => agent,
        _ = shared.hard_stop.cancelled() => None,
    };
    waiting.dec();
    shared.metrics.dial.startup_wait(agent.is_some());
    agent
}

impl Dial {
    /// When the frontend should call [`Dial::wake`].
    pub fn wake_at(&self) -> Option<Instant> {
        match (self.deadline, self.check_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The frontend knows the dial was answered: drops the second try and its check.
    pub fn answered(&mut self) {
        self.check_at = None;
        self.second_try = None;
    }

    /// Called at [`Dial::wake_at`]: times the dial out, or sends it to another agent when its
    /// agent stopped answering before it answered the dial.
    pub async fn wake(&mut self, shared: &Shared) -> Wake {
        let now = Instant::now();
        if self.deadline.is_some_and(|at| now >= at) {
            return if self.expire() {
                Wake::Expired
            } else {
                Wake::Nothing
            };
        }
        if self.check_at.is_none_or(|at| now < at) {
            return Wake::Nothing;
        }
        self.check_at = None;
        if !self.agent.is_pending(self.id) || self.agent.answered_since(self.sent_at) {
            // Answered, or the agent is alive and the dial merely slow.
            self.second_try = None;
            return Wake::Nothing;
        }
        if !self.agent.is_suspect() {
            self.check_at = Some(now + RECHECK);
            return Wake::Nothing;
        }
        Box::pin(self.send_again(shared)).await
    }

    async fn send_again(&mut self, shared: &Shared) -> Wake {
        let Some(request) = self.second_try.take() else {
            return Wake::Nothing;
        };
        let metrics = &shared.metrics;
        let address = match &request.payload {
            Some(crate::proto::packet::Payload::DialRequest(req)) => req.address.as_str(),
            _ => return Wake::Nothing,
        };
        let Some(other) = shared.registry.pick_instead_of(address, &self.agent) else {
            metrics.dial.dial_retry("no_other_agent");
            return Wake::Nothing;
        };
        if self.agent.take_pending(self.id).is_none() {
            return Wake::Nothing;
        }
        if other.add_pending(self.id, self.link.clone()).is_err() {
            metrics.dial.dial_retry("failed");
            // Back where it was, if that agent is still there.
            return match self.agent.add_pending(self.id, self.link.clone()) {
                Ok(()) => Wake::Nothing,
                Err(_) => Wake::Failed(DialError::AgentGone),
            };
        }
        tracing::info!(
            dialID = self.id,
            dialAddress = %address,
            agentID = %self.agent.agent_id,
            to = %other.agent_id,
            "agent does not answer: dial sent to another agent"
        );
        // In case the first agent answers after all, it forgets the dial.
        send_to_agent_bounded(&self.agent, dial_close(self.id)).await;
        let timeout = shared.snapshot().config.backend_dial_timeout;
        if let Err(e) = send_within(&other, *request, timeout).await {
            if other.take_pending(self.id).is_some() {
                metrics.dial.dial_retry("failed");
                return Wake::Failed(e);
            }
        }
        metrics.dial.dial_retry("sent");
        self.agent = other;
        Wake::SentAgain
    }

    /// The dial deadline passed. Returns whether the dial was still pending (it is then
    /// removed and counted as a timeout); the frontend answers it.
    pub fn expire(&mut self) -> bool {
        self.deadline = None;
        let expired = self.agent.take_pending(self.id).is_some();
        if expired {
            self.metrics
                .dial
                .dial_failure(DialFailure::BackendDialTimeout);
            tracing::info!(agentID = %self.agent.agent_id, dialID = self.id, "dial timed out waiting for the agent");
        }
        expired
    }

    /// The frontend withdrew its dial (DIAL_CLS). As upstream, the agent is not told.
    /// Returns whether the dial was still pending.
    pub fn cancel(&mut self, dial_id: i64) -> bool {
        if dial_id == self.id && self.agent.take_pending(dial_id).is_some() {
            self.metrics.dial.dial_failure(DialFailure::FrontendClose);
            self.deadline = None;
            return true;
        }
        false
    }

    /// Removes whatever this tunnel still holds at its agent and tells the agent: DIAL_CLS for
    /// a pending dial, CLOSE_REQ for a connection. Safe to call more than once. Returns what
    /// it released.
    pub async fn release(&self) -> Released {
        let released = self.agent.release(&self.link, self.id);
        match released {
            Released::Pending(dial_id) => {
                self.metrics.dial.dial_failure(DialFailure::FrontendClose);
                send_to_agent_bounded(&self.agent, dial_close(dial_id)).await
            }
            Released::Established(connect_id) => close_at_agent(&self.agent, connect_id).await,
            Released::Nothing => {}
        }
        released
    }
}
