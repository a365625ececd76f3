//! The health port (/healthz, /readyz, /ready, /metrics) and the admin port (/metrics).

pub mod metrics;

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::task::TaskTracker;

use crate::server::Shared;

pub const NOT_READY_BODY: &str = "no connection to any proxy agent";
pub const SHUTTING_DOWN_BODY: &str = "shutting down";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Port {
    Health,
    Admin,
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "text/plain; charset=utf-8")
        .body(Full::new(body.into()))
        .expect("static response parts are valid")
}

fn metrics_response(shared: &Shared) -> Response<Full<Bytes>> {
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "text/plain; version=0.0.4; charset=utf-8")
        .body(Full::new(Bytes::from(shared.metrics.render())))
        .expect("static response parts are valid")
}

fn readiness(shared: &Shared) -> Response<Full<Bytes>> {
    if shared.is_draining() {
        // Beyond upstream: turn unready at once on shutdown so load balancers move away.
        text(StatusCode::INTERNAL_SERVER_ERROR, SHUTTING_DOWN_BODY)
    } else if shared.registry.ready() {
        text(StatusCode::OK, "ok")
    } else {
        text(StatusCode::INTERNAL_SERVER_ERROR, NOT_READY_BODY)
    }
}

/// Routes one request. Every method is accepted, as Go's ServeMux does.
pub fn route(port: Port, shared: &Shared, path: &str) -> Response<Full<Bytes>> {
    match (port, path) {
        (_, "/metrics") => metrics_response(shared),
        (Port::Health, "/healthz") => text(StatusCode::OK, "ok"),
        (Port::Health, "/readyz" | "/ready") => readiness(shared),
        _ => text(StatusCode::NOT_FOUND, "404 page not found\n"),
    }
}

/// Serves `port` on `listener` until the server's hard stop.
pub fn spawn_http(tasks: &TaskTracker, listener: TcpListener, port: Port, shared: Arc<Shared>) {
    let stop = shared.hard_stop.clone();
    let connections = TaskTracker::new();
    tasks.spawn(async move {
        loop {
            let (stream, _) = tokio::select! {
                _ = stop.cancelled() => break,
                accepted = listener.accept() => match accepted {
                    Ok(conn) => conn,
                    Err(e) => {
                        tracing::warn!(error = %e, ?port, "accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let shared = shared.clone();
            let stop = stop.clone();
            connections.spawn(async move {
                let service = service_fn(move |req: Request<Incoming>| {
                    let response = route(port, &shared, req.uri().path());
                    async move { Ok::<_, Infallible>(response) }
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
            });
        }
        connections.close();
        connections.wait().await;
    });
}
