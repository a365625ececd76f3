//! Whether an agent still answers. A half-open agent connection (a NAT or firewall that
//! dropped its state, a node that lost power) says nothing: without a check, the agent keeps
//! being picked for dials that hang, for as long as `--keepalive-time` (an hour by default).
//!
//! Each agent stream's task runs [`watch`]: an HTTP/2 PING on the connection every
//! `interval` after the last answer, and at once when a dial has waited `dial_wait` with no
//! answer since it was sent. Unanswered for `suspect_after`, the agent is suspect: it gets no
//! new dials while another agent can take them, and dials waiting on it are sent once more
//! elsewhere (`frontend::dial`). Unanswered for `retire_after`, it is retired.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::session::AgentSession;
use crate::config::AgentLiveness;
use crate::h2_ping::PingHandle;
use crate::metrics::Metrics;

/// How often the watch looks again while the check is turned off, for a reload that turns it on.
const DISABLED_RECHECK: Duration = Duration::from_secs(1);

/// Why an agent is retired.
#[derive(Debug)]
pub struct Unanswered(pub Duration);

/// Runs for the life of an agent stream; returns when the agent must be retired. `settings`
/// gives the current configuration's (a reload applies at the next look).
pub async fn watch(
    session: &AgentSession,
    settings: impl Fn() -> Option<AgentLiveness>,
    metrics: &Metrics,
) -> Unanswered {
    let Some(ping) = session.ping.clone() else {
        // Not on a connection we can PING (tests that build sessions by hand).
        return std::future::pending().await;
    };
    loop {
        let settings = settings();
        let next = match settings {
            Some(settings) => match step(session, &ping, &settings, metrics) {
                Ok(next) => next,
                Err(retire) => return retire,
            },
            None => {
                session.set_suspect(false, metrics);
                Instant::now() + DISABLED_RECHECK
            }
        };
        // A dial added while we sleep past its own wait wakes us (see `note_dial`).
        let dial_added = session.liveness.dial_added.notified();
        tokio::pin!(dial_added);
        dial_added.as_mut().enable();
        let far = settings.is_some_and(|s| next > Instant::now() + s.dial_wait);
        session.liveness.wake_on_dial.store(far, Ordering::Release);
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {}
            _ = dial_added => {}
        }
    }
}

/// One look at the connection: marks the agent suspect or not, asks for a PING when one is
/// due, and says when to look again (or that the agent is to be retired).
fn step(
    session: &AgentSession,
    ping: &PingHandle,
    settings: &AgentLiveness,
    metrics: &Metrics,
) -> Result<Instant, Unanswered> {
    let now = Instant::now();
    if let Some(asked) = ping.unanswered_since() {
        let silent = now.saturating_duration_since(asked);
        if silent >= settings.retire_after {
            return Err(Unanswered(silent));
        }
        if silent >= settings.suspect_after {
            if session.set_suspect(true, metrics) {
                tracing::warn!(
                    agentID = %session.agent_id,
                    unanswered = ?silent,
                    "agent does not answer PING: no new dials go to it while another agent can take them"
                );
            }
            return Ok(asked + settings.retire_after);
        }
        return Ok(asked + settings.suspect_after);
    }
    if session.set_suspect(false, metrics) {
        tracing::info!(agentID = %session.agent_id, "agent answers PING again");
    }
    let answered = ping
        .last_answer()
        .unwrap_or_else(|| Instant::from_std(session.connected_at));
    let mut due = answered + settings.interval;
    if let Some(sent) = session.oldest_pending_dial() {
        let sent = Instant::from_std(sent);
        // A dial the agent may have missed: sent after its last answer.
        if sent >= answered {
            due = due.min(sent + settings.dial_wait);
        }
    }
    if now >= due {
        ping.ping();
        return Ok(now + settings.suspect_after);
    }
    Ok(due)
}
