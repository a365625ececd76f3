//! One port's gRPC connections: each accepted connection is an HTTP/2 connection that hyper
//! serves with the port's one [`Route`], in a task of its own spawned by the acceptor.
//!
//! tonic's server would do the same through its router, a stack of tower layers built for
//! every connection, a task that takes the connections from the acceptor, and version
//! detection on each connection's first bytes; a port here serves one method, over HTTP/2
//! only, so the connection goes from its acceptor straight to hyper.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::authority::AuthorityScrub;
use crate::codec::serve::{Handler, Route};
use crate::h2_ping::PingHandle;
use crate::listen::{Accepted, ConnStreams, OnAccept, Tracked};

/// How long a keepalive PING may go unanswered before the connection is closed.
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// The connection-level HTTP/2 flow-control window, as h2 accounts it.
const CONNECTION_WINDOW: u32 = 32 << 20;

/// The HTTP/2 settings of a port's connections.
pub struct Http2 {
    /// How often an idle connection is PINGed.
    pub keepalive: Duration,
    /// Each stream's receive window, as h2 accounts it.
    pub stream_window: u32,
}

impl Http2 {
    fn builder(&self) -> hyper::server::conn::http2::Builder<TokioExecutor> {
        let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        builder
            .timer(TokioTimer::new())
            .keep_alive_interval(Some(self.keepalive))
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            // grpc-go sets no stream limit; hyper's default of 200 would starve clients that
            // open one stream per dial on a shared connection.
            .max_concurrent_streams(u32::MAX)
            // Fixed, generous windows rather than hyper's adaptive (BDP) window: that one
            // starts at 64 KiB for the connection too, and h2 then answers a burst of small
            // frames (many dials at once on one connection) with GOAWAY ENHANCE_YOUR_CALM,
            // killing every tunnel on it. On agent connections, what the agent is told follows
            // the link (`h2_ping::window`), within the stream window h2 accounts.
            .adaptive_window(false)
            .initial_stream_window_size(self.stream_window)
            .initial_connection_window_size(CONNECTION_WINDOW)
            // As tonic's server: no limit on streams reset for a local error, h2's default
            // for those reset before they were accepted.
            .max_local_error_reset_streams(None)
            .max_pending_accept_reset_streams(None);
        builder
    }
}

/// What serves each accepted connection of a port with `route`: the connection is wrapped by
/// `wrap` (the agent port's PINGs), read through [`AuthorityScrub`] (clients that send an
/// invalid `:authority` are served) and served in a task of its own, tracked in `servers`. A
/// connection still open at `stop` is told to go away (GOAWAY) and ends once its streams have;
/// the acceptor stopping ends no connection.
pub fn on_accept<IO, Wrapped, H>(
    servers: &TaskTracker,
    settings: Http2,
    route: Route<H>,
    wrap: fn(IO) -> (Wrapped, Option<PingHandle>),
    stop: CancellationToken,
) -> OnAccept<IO>
where
    IO: Send + 'static,
    Wrapped: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    H: Handler,
{
    let builder = settings.builder();
    let servers = servers.clone();
    Arc::new(move |accepted: Accepted<IO>| {
        let (io, ping) = wrap(accepted.io);
        let tracked = Tracked::new(
            Accepted {
                io: AuthorityScrub::new(io),
                hold: accepted.hold,
                peer: accepted.peer,
            },
            ping,
        );
        let service = Connection {
            streams: tracked.streams().clone(),
            route: route.clone(),
        };
        // Boxed here rather than pinned in the task: a value the task captures and then pins
        // would take its room in the task twice (the capture and the pinned local), and the
        // connection is most of what an idle single-use tunnel holds.
        let mut connection = Box::pin(builder.serve_connection(TokioIo::new(tracked), service));
        let stop = stop.clone();
        servers.spawn(async move {
            let ended = tokio::select! {
                ended = connection.as_mut() => ended,
                _ = stop.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(e) = ended {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    })
}

/// A connection's requests: each carries the connection's [`ConnStreams`] to the route.
struct Connection<H> {
    streams: ConnStreams,
    route: Route<H>,
}

impl<H: Handler> hyper::service::Service<http::Request<Incoming>> for Connection<H> {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn call(&self, mut request: http::Request<Incoming>) -> Self::Future {
        request.extensions_mut().insert(self.streams.clone());
        // `map`, not an async block awaiting it: that would hold the response future twice.
        Box::pin(
            self.route
                .respond(request.map(tonic::body::Body::new))
                .map(Ok),
        )
    }
}
