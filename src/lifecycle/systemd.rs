//! sd_notify: readiness, reloads, stopping, status and the watchdog, for both programs (each
//! says what its STATUS line reads). Every call is a no-op when NOTIFY_SOCKET is unset.

use std::time::Duration;

use sd_notify::NotifyState;
use tokio_util::sync::CancellationToken;

fn send(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!(error = %e, "sd_notify failed");
    }
}

pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// STATUS alone (a state change that is not readiness).
pub fn status(status: &str) {
    send(&[NotifyState::Status(status)]);
}

pub fn reloading() {
    match NotifyState::monotonic_usec_now() {
        Ok(now) => send(&[NotifyState::Reloading, now]),
        Err(_) => send(&[NotifyState::Reloading]),
    }
}

pub fn reload_failed(cause: &str) {
    // One line: systemctl status shows STATUS as is.
    let cause = cause.replace('\n', " ");
    let status = format!("reload failed: {cause}");
    send(&[NotifyState::Ready, NotifyState::Status(&status)]);
}

pub fn stopping(status: &str) {
    send(&[NotifyState::Stopping, NotifyState::Status(status)]);
}

/// Pings the watchdog at half its interval and refreshes STATUS (`status_line`), from a task
/// on the runtime: if the runtime hangs, the pings stop and systemd restarts us.
pub fn spawn_heartbeat(status_line: impl Fn() -> String + Send + 'static, stop: CancellationToken) {
    spawn_heartbeat_when(status_line, || true, stop);
}

/// [`spawn_heartbeat`], pinging the watchdog only while `healthy` says so: a program whose
/// own work is stuck (not only its runtime) is restarted too.
pub fn spawn_heartbeat_when(
    status_line: impl Fn() -> String + Send + 'static,
    healthy: impl Fn() -> bool + Send + 'static,
    stop: CancellationToken,
) {
    let watchdog = sd_notify::watchdog_enabled();
    let period = watchdog
        .map(|d| d / 2)
        .unwrap_or(Duration::from_secs(10))
        .max(Duration::from_millis(10));
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = ticks.tick() => {}
            }
            let status = status_line();
            if watchdog.is_some() && healthy() {
                send(&[NotifyState::Watchdog, NotifyState::Status(&status)]);
            } else if std::env::var_os("NOTIFY_SOCKET").is_some() {
                send(&[NotifyState::Status(&status)]);
            }
        }
    });
}
