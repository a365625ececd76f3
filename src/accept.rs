//! The accept loop every listening port of both programs runs: the frontend and agent ports
//! of the server, and the health and admin ports of both. It waits for a slot (connections
//! or handshakes in progress are bounded per port), accepts, sets Go's socket options on TCP,
//! and backs off when accepting fails.
//!
//! Failed accepts come in storms (`EMFILE` when the process is out of descriptors: the
//! connection stays in the backlog, so every retry fails the same way), so a port logs the
//! first failure of an episode, then one line when accepting works again with the number of
//! failures in between, and nothing for each retry but a debug line.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// Back-off after a failed accept, doubling up to the maximum, as Go's net/http server does.
pub const BACKOFF_MIN: Duration = Duration::from_millis(5);
pub const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Go's default TCP keepalive on accepted sockets.
const TCP_KEEPALIVE: Duration = Duration::from_secs(15);

/// A listening socket.
pub trait Listener: Send + Sync + 'static {
    type Io: Send + 'static;
    type Peer: std::fmt::Debug + Send + 'static;
    fn accept(
        &self,
    ) -> impl std::future::Future<Output = io::Result<(Self::Io, Self::Peer)>> + Send;
}

impl Listener for TcpListener {
    type Io = TcpStream;
    type Peer = std::net::SocketAddr;

    async fn accept(&self) -> io::Result<(TcpStream, std::net::SocketAddr)> {
        let (stream, peer) = TcpListener::accept(self).await?;
        tune_accepted(&stream);
        Ok((stream, peer))
    }
}

impl Listener for UnixListener {
    type Io = UnixStream;
    type Peer = tokio::net::unix::SocketAddr;

    async fn accept(&self) -> io::Result<(UnixStream, tokio::net::unix::SocketAddr)> {
        UnixListener::accept(self).await
    }
}

/// Socket options Go sets on every accepted connection: no Nagle delay (small packets such as
/// dial requests and responses would otherwise wait for the peer's delayed ACK), and TCP
/// keepalive, so a vanished peer is noticed.
fn tune_accepted(stream: &TcpStream) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(error = %e, "could not set TCP_NODELAY");
    }
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(TCP_KEEPALIVE)
        .with_interval(TCP_KEEPALIVE);
    if let Err(e) = socket2::SockRef::from(stream).set_tcp_keepalive(&keepalive) {
        tracing::debug!(error = %e, "could not enable TCP keepalive");
    }
}

/// One accepted connection, with its slot on the port when the port is bounded: dropping the
/// slot lets the port accept another.
pub struct Accepted<IO, Peer> {
    pub io: IO,
    pub peer: Peer,
    pub slot: Option<OwnedSemaphorePermit>,
}

/// A port's accept loop state.
pub struct Acceptor<L> {
    listener: L,
    slots: Option<Arc<Semaphore>>,
    backoff: Backoff,
}

impl<L: Listener> Acceptor<L> {
    /// `what` names the port in logs; `max_in_progress` bounds the accepted connections whose
    /// slot is held (None: unbounded). Past the bound the port stops accepting, and new
    /// connections wait in the kernel's backlog.
    pub fn new(
        listener: L,
        what: impl Into<Arc<str>>,
        max_in_progress: Option<usize>,
    ) -> Acceptor<L> {
        Acceptor {
            listener,
            slots: max_in_progress.map(|n| Arc::new(Semaphore::new(n))),
            backoff: Backoff::new(what.into()),
        }
    }

    /// The next connection; `None` once `stop` is cancelled.
    pub async fn next(&mut self, stop: &CancellationToken) -> Option<Accepted<L::Io, L::Peer>> {
        loop {
            let slot = match &self.slots {
                Some(slots) => tokio::select! {
                    biased;
                    _ = stop.cancelled() => return None,
                    slot = slots.clone().acquire_owned() => Some(slot.ok()?),
                },
                None => None,
            };
            let accepted = tokio::select! {
                biased;
                _ = stop.cancelled() => return None,
                accepted = self.listener.accept() => accepted,
            };
            match accepted {
                Ok((io, peer)) => {
                    self.backoff.succeeded();
                    return Some(Accepted { io, peer, slot });
                }
                Err(error) => {
                    drop(slot);
                    tokio::select! {
                        biased;
                        _ = stop.cancelled() => return None,
                        () = self.backoff.failed(error) => {}
                    }
                }
            }
        }
    }
}

/// Exponential back-off for a port whose accepts fail, logged once per episode.
struct Backoff {
    what: Arc<str>,
    delay: Option<Duration>,
    failures: u64,
}

impl Backoff {
    fn new(what: Arc<str>) -> Backoff {
        Backoff {
            what,
            delay: None,
            failures: 0,
        }
    }

    async fn failed(&mut self, error: io::Error) {
        let delay = match self.delay {
            None => {
                tracing::warn!(listener = &*self.what, %error, "accept failed; backing off (logged once until accepting works again)");
                BACKOFF_MIN
            }
            Some(d) => {
                tracing::debug!(listener = &*self.what, %error, "accept failed again");
                (d * 2).min(BACKOFF_MAX)
            }
        };
        self.delay = Some(delay);
        self.failures += 1;
        tokio::time::sleep(delay).await;
    }

    fn succeeded(&mut self) {
        if self.delay.take().is_some() {
            tracing::info!(
                listener = &*self.what,
                failures = self.failures,
                "accepting again after failures"
            );
            self.failures = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn backoff_doubles_to_a_second_and_resets() {
        let mut backoff = Backoff::new("test".into());
        let mut delays = Vec::new();
        for _ in 0..10 {
            let before = tokio::time::Instant::now();
            backoff
                .failed(io::Error::from_raw_os_error(libc::EMFILE))
                .await;
            delays.push(before.elapsed());
        }
        assert_eq!(delays[0], BACKOFF_MIN);
        assert_eq!(delays[1], BACKOFF_MIN * 2);
        assert_eq!(delays.last().copied(), Some(BACKOFF_MAX));
        assert_eq!(backoff.failures, 10);
        backoff.succeeded();
        assert_eq!(backoff.delay, None);
        assert_eq!(backoff.failures, 0);
    }

    #[tokio::test]
    async fn a_bounded_port_accepts_no_more_than_its_slots_until_one_is_let_go() {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let mut acceptor = Acceptor::new(listener, "test", Some(2));
        let stop = CancellationToken::new();
        let mut clients = Vec::new();
        for _ in 0..3 {
            clients.push(
                TcpStream::connect(addr)
                    .await
                    .unwrap_or_else(|e| panic!("{e}")),
            );
        }
        let first = acceptor.next(&stop).await.map(|a| a.slot);
        let second = acceptor.next(&stop).await.map(|a| a.slot);
        assert!(first.as_ref().is_some_and(Option::is_some) && second.is_some());
        // The third waits for a slot however long it is given; a slot let go admits it.
        let third = tokio::time::timeout(Duration::from_millis(50), acceptor.next(&stop)).await;
        assert!(
            third.is_err(),
            "a third connection was accepted with both slots held"
        );
        drop(first);
        assert!(acceptor.next(&stop).await.is_some());
        stop.cancel();
        assert!(acceptor.next(&stop).await.is_none());
    }
}
