//! An HTTP/1.1 port as every program serves one (health, metrics, admin): the accept loop,
//! a bounded number of connections, and the responses they all send (plain text, the
//! Prometheus exposition, gzipped when the scraper accepts it, a redirect).

use std::convert::Infallible;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::task::TaskTracker;

use crate::accept::Acceptor;

/// Connections open at once on a health or admin port. Probes and scrapers need a few; past
/// this the port stops accepting and new connections wait in the kernel's backlog, so held
/// connections cannot take every descriptor.
pub const MAX_HTTP_CONNECTIONS: usize = 256;

pub fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "text/plain; charset=utf-8")
        .body(Full::new(body.into()))
        .expect("static response parts are valid")
}

/// Whether an `Accept-Encoding` value accepts gzip (as promhttp reads it: any `gzip` token
/// whose quality is not 0).
pub fn accepts_gzip(accept_encoding: &str) -> bool {
    accept_encoding.split(',').any(|coding| {
        let mut parts = coding.split(';').map(str::trim);
        let name = parts.next().unwrap_or_default();
        let zero_q = parts.any(|p| {
            p.strip_prefix("q=")
                .and_then(|q| q.parse::<f32>().ok())
                .is_some_and(|q| q == 0.0)
        });
        name.eq_ignore_ascii_case("gzip") && !zero_q
    })
}

/// A text exposition as promhttp serves it: gzipped when the scraper accepts it.
pub fn exposition(text: String, gzip: bool) -> Response<Full<Bytes>> {
    let builder = Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "text/plain; version=0.0.4; charset=utf-8");
    let (builder, body) = if gzip {
        use std::io::Write;
        let mut encoder = flate2::write::GzEncoder::new(
            Vec::with_capacity(text.len() / 4),
            flate2::Compression::fast(),
        );
        let compressed = encoder
            .write_all(text.as_bytes())
            .and_then(|()| encoder.finish());
        match compressed {
            Ok(bytes) => (
                builder
                    .header("content-encoding", "gzip")
                    .header("vary", "Accept-Encoding"),
                Bytes::from(bytes),
            ),
            Err(_) => (builder, Bytes::from(text)),
        }
    } else {
        (builder, Bytes::from(text))
    };
    builder
        .body(Full::new(body))
        .expect("static response parts are valid")
}

pub fn redirect(to: &str) -> Response<Full<Bytes>> {
    Response::builder()
        .status(StatusCode::MOVED_PERMANENTLY)
        .header("location", to)
        .body(Full::new(Bytes::new()))
        .expect("static response parts are valid")
}

/// The peer of an HTTP connection, put in each request's extensions by [`serve_http1`].
#[derive(Clone, Copy, Debug)]
pub struct PeerAddr(pub std::net::SocketAddr);

/// An HTTP/1.1 port of either program (health, admin): every request to `handler`, until
/// `stop`, through the common accept loop (`accept`), with at most [`MAX_HTTP_CONNECTIONS`]
/// connections open. `what` names the port in logs ("the health port").
pub fn serve_http1<H, F>(
    tasks: &TaskTracker,
    listener: TcpListener,
    stop: tokio_util::sync::CancellationToken,
    what: &'static str,
    handler: H,
) where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: std::future::Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let connections = TaskTracker::new();
    tasks.spawn(async move {
        let mut acceptor = Acceptor::new(listener, what, Some(MAX_HTTP_CONNECTIONS));
        while let Some(accepted) = acceptor.next(&stop).await {
            let (stream, slot, peer) = (accepted.io, accepted.slot, PeerAddr(accepted.peer));
            let (handler, stop) = (handler.clone(), stop.clone());
            connections.spawn(async move {
                let service = service_fn(move |mut req: Request<Incoming>| {
                    req.extensions_mut().insert(peer);
                    let response = handler(req);
                    async move { Ok::<_, Infallible>(response.await) }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .header_read_timeout(std::time::Duration::from_secs(60))
                    .timer(hyper_util::rt::TokioTimer::new())
                    .serve_connection(TokioIo::new(stream), service);
                tokio::pin!(conn);
                tokio::select! {
                    _ = conn.as_mut() => {}
                    _ = stop.cancelled() => conn.as_mut().graceful_shutdown(),
                }
                drop(slot);
            });
        }
        connections.close();
        connections.wait().await;
    });
}

#[cfg(test)]
mod tests {
    use super::accepts_gzip;

    #[test]
    fn gzip_is_used_when_accepted() {
        assert!(accepts_gzip("gzip"));
        assert!(accepts_gzip("deflate, GZIP;q=0.5"));
        assert!(!accepts_gzip("identity"));
        assert!(!accepts_gzip("gzip;q=0"));
        assert!(!accepts_gzip(""));
    }
}
