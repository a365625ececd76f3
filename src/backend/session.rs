//! One connected agent stream and the routes that use it.
//!
//! Every pending dial and established tunnel lives in the route table of the agent stream it
//! was sent to, and only the methods here add or remove entries, so the gauges change in one
//! place and a dying stream can drain exactly its own entries. Keying by stream (not by agent
//! id) also keeps two streams with the same agent id from seeing each other's connect ids.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::h2_ping::PingHandle;
use crate::identifiers::AgentIdentifiers;
use crate::metrics::{Metrics, Segment};
use crate::proto::Packet;
use crate::tunnel::FrontendLink;
use crate::wire::{data_len, packet_type_name};

static NEXT_SESSION_UID: AtomicU64 = AtomicU64::new(1);

/// The agent stream is gone; the packet was not sent.
#[derive(Debug, thiserror::Error)]
#[error("agent stream closed")]
pub struct AgentGone;

pub struct PendingDial {
    pub link: Arc<FrontendLink>,
    pub started: Instant,
}

pub struct Established {
    pub link: Arc<FrontendLink>,
    pub since: Instant,
}

#[derive(Default)]
struct Routes {
    pending: HashMap<i64, PendingDial>,
    established: HashMap<i64, Established>,
    /// Set by teardown: nothing may be added afterwards, so nothing can leak past it.
    closed: bool,
    /// Connections we asked the agent to close and whose CLOSE_RSP has not come yet, oldest
    /// first, with when we asked; bounded, and gone with the stream.
    closing: std::collections::VecDeque<(i64, Instant)>,
}

/// How many unconfirmed closes a stream remembers.
const MAX_CLOSING: usize = 1024;

/// Everything a closed route table held: pending dials and established tunnels, by id.
pub type TornDown = (Vec<(i64, PendingDial)>, Vec<(i64, Established)>);

/// Why a pending dial could not be recorded.
#[derive(Debug, PartialEq, Eq)]
pub enum AddPendingError {
    AgentGone,
    DuplicateDialId,
}

/// The result of matching a successful DIAL_RSP.
pub enum Establish {
    /// No pending dial with that id (cancelled, timed out, or never sent).
    Unknown,
    /// The agent reused a connect id that is still live on this stream.
    DuplicateConnectId(PendingDial),
    Established {
        link: Arc<FrontendLink>,
        started: Instant,
    },
}

/// Where a route is in its life, as `/tunnels` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouteState {
    Pending,
    Established,
    /// We asked the agent to close it and its CLOSE_RSP has not come yet.
    Closing,
}

/// One route of an agent stream, as [`AgentSession::routes_view`] saw it.
pub struct Route {
    /// The agent's connect id, once established.
    pub connect_id: Option<i64>,
    /// The tunnel's queue; `None` for a closing route, whose frontend side is already gone.
    pub link: Option<Arc<FrontendLink>>,
    pub state: RouteState,
    /// When it entered `state`.
    pub since: Instant,
}

/// What a frontend's cleanup found of its own entry.
pub enum Released {
    Nothing,
    Pending(i64),
    Established(i64),
}

/// The packets waiting to be written to an agent's stream. Boxed: tokio's channel allocates its
/// slots 32 at a time, on creation, and 32 packets inline are 2.3 KiB held by every connected
/// agent, idle or not; 32 boxes are 256 B, for one small allocation per packet.
pub type Outbound = mpsc::Sender<Box<Packet>>;

/// What [`super::liveness::watch`] shares with the dial path.
#[derive(Default)]
pub struct LivenessState {
    suspect: AtomicBool,
    /// Set while the watch sleeps past the wait of a dial added now: such a dial wakes it.
    pub wake_on_dial: AtomicBool,
    pub dial_added: tokio::sync::Notify,
}

pub struct AgentSession {
    pub uid: u64,
    pub agent_id: String,
    pub identifiers: AgentIdentifiers,
    pub connected_at: Instant,
    outbound: Outbound,
    draining: AtomicBool,
    /// Cancelled to end this agent's stream (server stop, or a retired backend).
    pub retired: CancellationToken,
    /// The agent's connection, to PING (`None` for sessions built without one, in tests).
    pub ping: Option<PingHandle>,
    pub liveness: LivenessState,
    routes: Mutex<Routes>,
    metrics: Arc<Metrics>,
}

impl AgentSession {
    pub fn new(
        agent_id: String,
        identifiers: AgentIdentifiers,
        outbound: Outbound,
        retired: CancellationToken,
        ping: Option<PingHandle>,
        metrics: Arc<Metrics>,
    ) -> AgentSession {
        AgentSession {
            uid: NEXT_SESSION_UID.fetch_add(1, Ordering::Relaxed),
            agent_id,
            identifiers,
            connected_at: Instant::now(),
            outbound,
            draining: AtomicBool::new(false),
            retired,
            ping,
            liveness: LivenessState::default(),
            routes: Mutex::new(Routes::default()),
            metrics,
        }
    }

    fn routes(&self) -> MutexGuard<'_, Routes> {
        // A panic while holding this lock cannot leave the maps half-updated (every update is a
        // single insert or remove), so a poisoned lock is still safe to use.
        self.routes.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// Whether the agent left a PING unanswered past --agent-suspect-timeout.
    pub fn is_suspect(&self) -> bool {
        self.liveness.suspect.load(Ordering::Acquire)
    }

    /// Whether the agent should get no new dials while another can take them.
    pub fn is_avoided(&self) -> bool {
        self.is_draining() || self.is_suspect()
    }

    /// Marks the agent suspect or not; returns whether that changed.
    pub fn set_suspect(&self, suspect: bool, metrics: &Metrics) -> bool {
        let changed = self.liveness.suspect.swap(suspect, Ordering::AcqRel) != suspect;
        if changed {
            metrics
                .backend
                .suspect_agents
                .add(if suspect { 1 } else { -1 });
        }
        changed
    }

    /// Whether the agent answered a PING after `since`.
    pub fn answered_since(&self, since: Instant) -> bool {
        self.ping
            .as_ref()
            .and_then(PingHandle::last_answer)
            .is_some_and(|at| at.into_std() > since)
    }

    /// When the oldest dial still waiting for this agent was sent.
    pub fn oldest_pending_dial(&self) -> Option<Instant> {
        self.routes().pending.values().map(|p| p.started).min()
    }

    /// Sends a packet to the agent, waiting for room in its queue.
    pub async fn send(&self, packet: Packet) -> Result<(), AgentGone> {
        let kind = packet.r#type;
        let bytes = data_len(&packet);
        match self.outbound.send(Box::new(packet)).await {
            Ok(()) => {
                self.metrics.tunnel.packet(Segment::ToAgent, kind);
                if bytes > 0 {
                    self.metrics.tunnel.relayed(true, bytes);
                }
                Ok(())
            }
            Err(_) => {
                self.metrics.tunnel.stream_error(
                    Segment::ToAgent,
                    tonic::Code::Unavailable,
                    packet_type_name(kind),
                );
                Err(AgentGone)
            }
        }
    }

    pub fn add_pending(
        &self,
        dial_id: i64,
        link: Arc<FrontendLink>,
    ) -> Result<(), AddPendingError> {
        let mut routes = self.routes();
        if routes.closed {
            return Err(AddPendingError::AgentGone);
        }
        if routes.pending.contains_key(&dial_id) {
            return Err(AddPendingError::DuplicateDialId);
        }
        routes.pending.insert(
            dial_id,
            PendingDial {
                link,
                started: Instant::now(),
            },
        );
        drop(routes);
        self.metrics.dial.pending_backend_dials.inc();
        if self.liveness.wake_on_dial.swap(false, Ordering::AcqRel) {
            self.liveness.dial_added.notify_one();
        }
        Ok(())
    }

    pub fn is_pending(&self, dial_id: i64) -> bool {
        self.routes().pending.contains_key(&dial_id)
    }

    pub fn take_pending(&self, dial_id: i64) -> Option<PendingDial> {
        let taken = self.routes().pending.remove(&dial_id);
        if taken.is_some() {
            self.metrics.dial.pending_backend_dials.dec();
        }
        taken
    }

    /// Turns a pending dial into an established tunnel in one step, so a frontend cleaning up
    /// concurrently finds it in exactly one of the two tables.
    pub fn establish(&self, dial_id: i64, connect_id: i64) -> Establish {
        let mut routes = self.routes();
        let Some(pending) = routes.pending.remove(&dial_id) else {
            return Establish::Unknown;
        };
        self.metrics.dial.pending_backend_dials.dec();
        if routes.established.contains_key(&connect_id) {
            return Establish::DuplicateConnectId(pending);
        }
        pending.link.set_connect_id(connect_id);
        routes.established.insert(
            connect_id,
            Established {
                link: pending.link.clone(),
                since: Instant::now(),
            },
        );
        self.metrics.tunnel.established_connections.inc();
        Establish::Established {
            link: pending.link,
            started: pending.started,
        }
    }

    /// Remembers that we asked the agent to close `connect_id`.
    pub fn mark_closing(&self, connect_id: i64) {
        let mut routes = self.routes();
        if routes.closing.iter().any(|(id, _)| *id == connect_id) {
            return;
        }
        if routes.closing.len() >= MAX_CLOSING {
            routes.closing.pop_front();
        }
        routes.closing.push_back((connect_id, Instant::now()));
    }

    pub fn is_closing(&self, connect_id: i64) -> bool {
        self.routes()
            .closing
            .iter()
            .any(|(id, _)| *id == connect_id)
    }

    /// The agent confirmed a close we asked for; returns whether we had asked.
    pub fn closing_confirmed(&self, connect_id: i64) -> bool {
        let mut routes = self.routes();
        match routes.closing.iter().position(|(id, _)| *id == connect_id) {
            Some(i) => {
                routes.closing.remove(i);
                true
            }
            None => false,
        }
    }

    /// Every established tunnel of this stream, for the stall sweeper.
    pub fn established_links(&self) -> Vec<(i64, Arc<FrontendLink>)> {
        self.routes()
            .established
            .iter()
            .map(|(id, e)| (*id, e.link.clone()))
            .collect()
    }

    /// Every route of this stream as it is now, for the admin port's `/tunnels`: one lock, a
    /// copy of the links (no packet waits on it for longer than the copy).
    pub fn routes_view(&self) -> Vec<Route> {
        let routes = self.routes();
        let pending = routes.pending.values().map(|p| Route {
            connect_id: None,
            link: Some(p.link.clone()),
            state: RouteState::Pending,
            since: p.started,
        });
        let established = routes.established.iter().map(|(id, e)| Route {
            connect_id: Some(*id),
            link: Some(e.link.clone()),
            state: RouteState::Established,
            since: e.since,
        });
        let closing = routes.closing.iter().map(|(id, at)| Route {
            connect_id: Some(*id),
            link: None,
            state: RouteState::Closing,
            since: *at,
        });
        pending.chain(established).chain(closing).collect()
    }

    pub fn tunnel(&self, connect_id: i64) -> Option<Arc<FrontendLink>> {
        self.routes()
            .established
            .get(&connect_id)
            .map(|e| e.link.clone())
    }

    pub fn remove_established(&self, connect_id: i64) -> Option<Established> {
        let removed = self.routes().established.remove(&connect_id);
        if let Some(entry) = &removed {
            self.record_closed(entry);
        }
        removed
    }

    fn record_closed(&self, entry: &Established) {
        self.metrics.tunnel.established_connections.dec();
        self.metrics
            .tunnel
            .connection_duration
            .observe(entry.since.elapsed().as_secs_f64());
    }

    /// Removes whatever entry `link` still owns on this stream: its pending dial, or its
    /// established tunnel.
    pub fn release(&self, link: &Arc<FrontendLink>, dial_id: i64) -> Released {
        let mut routes = self.routes();
        if routes
            .pending
            .get(&dial_id)
            .is_some_and(|p| Arc::ptr_eq(&p.link, link))
        {
            routes.pending.remove(&dial_id);
            self.metrics.dial.pending_backend_dials.dec();
            return Released::Pending(dial_id);
        }
        let connect_id = link.connect_id();
        if connect_id != 0
            && routes
                .established
                .get(&connect_id)
                .is_some_and(|e| Arc::ptr_eq(&e.link, link))
        {
            let entry = routes
                .established
                .remove(&connect_id)
                .expect("checked above");
            drop(routes);
            self.record_closed(&entry);
            return Released::Established(connect_id);
        }
        Released::Nothing
    }

    /// Closes the route table for good and hands back every entry it held.
    pub fn teardown(&self) -> TornDown {
        let mut routes = self.routes();
        routes.closed = true;
        let pending: Vec<_> = routes.pending.drain().collect();
        let established: Vec<_> = routes.established.drain().collect();
        drop(routes);
        self.metrics
            .dial
            .pending_backend_dials
            .sub(pending.len() as i64);
        for (_, entry) in &established {
            self.record_closed(entry);
        }
        (pending, established)
    }

    /// (pending, established) counts, for the admin view and tests.
    /// How busy this agent is, to choose between two: its tunnels and pending dials, plus the
    /// packets waiting to be written to it (a congested agent link fills that queue first).
    pub fn load(&self) -> usize {
        let (pending, established) = self.counts();
        let queued = self.outbound.max_capacity() - self.outbound.capacity();
        pending + established + queued
    }

    pub fn counts(&self) -> (usize, usize) {
        let routes = self.routes();
        (routes.pending.len(), routes.established.len())
    }
}

impl std::fmt::Debug for AgentSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentSession")
            .field("uid", &self.uid)
            .field("agent_id", &self.agent_id)
            .field("draining", &self.is_draining())
            .field("suspect", &self.is_suspect())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session() -> AgentSession {
        let (outbound, _rx) = mpsc::channel(1);
        AgentSession::new(
            "agent".into(),
            AgentIdentifiers::default(),
            outbound,
            CancellationToken::new(),
            None,
            Arc::new(Metrics::new()),
        )
    }

    /// The remembered closes are emptied by the agent's answers, so under churn the list stays
    /// short (each lookup scans it) and a CLOSE_RSP we asked for is told from a stray one.
    #[test]
    fn a_confirmed_close_is_forgotten_and_only_once() {
        let agent = session();
        agent.mark_closing(7);
        agent.mark_closing(7);
        assert!(agent.is_closing(7));
        assert!(agent.closing_confirmed(7));
        assert!(!agent.is_closing(7));
        assert!(
            !agent.closing_confirmed(7),
            "a second CLOSE_RSP is a stray one"
        );
        assert!(agent.routes().closing.is_empty());
    }

    #[test]
    fn unconfirmed_closes_are_bounded() {
        let agent = session();
        for id in 0..(MAX_CLOSING as i64 + 10) {
            agent.mark_closing(id);
        }
        assert_eq!(agent.routes().closing.len(), MAX_CLOSING);
        assert!(!agent.is_closing(0), "the oldest are forgotten first");
        assert!(agent.is_closing(MAX_CLOSING as i64 + 9));
    }
}
