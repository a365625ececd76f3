//! The agent's health port (`/healthz`, `/readyz`, `/ready`, `/metrics`) and admin port
//! (`/metrics` redirects to the health port, as upstream; pprof with --enable-profiling).

use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use tokio::net::TcpListener;
use tokio_util::task::TaskTracker;

use super::clientset::ClientSet;
use crate::admin::{accepts_gzip, exposition, pprof_route, redirect, serve_http1, text};

/// Upstream's body when no server is connected.
pub const NOT_READY_BODY: &str = "[+]ping ok\n[-]server-connected failed: no servers connected\n";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Port {
    Health,
    Admin,
}

fn readiness(servers: &ClientSet, verbose: bool) -> Response<Full<Bytes>> {
    if servers.connected() > 0 {
        if verbose {
            text(
                StatusCode::OK,
                "[+]ping ok\n[+]server-connected ok\ncheck passed\n",
            )
        } else {
            text(StatusCode::OK, "ok")
        }
    } else {
        tracing::info!("server-connected check failed: no servers connected");
        text(StatusCode::SERVICE_UNAVAILABLE, NOT_READY_BODY)
    }
}

const PPROF_INDEX: &str = "konnectivity-agent profiles\n\
    /debug/pprof/profile?seconds=N  CPU profile (pprof protobuf; `go tool pprof URL`)\n\
    /debug/pprof/heap               allocator heap summary (text)\n";

async fn route(
    port: Port,
    servers: &ClientSet,
    request: &Request<Incoming>,
    health_port: u16,
) -> Response<Full<Bytes>> {
    let path = request.uri().path();
    let query = request.uri().query();
    let profiling_on = port == Port::Admin && servers.state().snapshot().config.enable_profiling;
    match (port, path) {
        (Port::Health, "/healthz") => text(StatusCode::OK, "ok"),
        (Port::Health, "/readyz" | "/ready") => readiness(
            servers,
            query.is_some_and(|q| q.split('&').any(|p| p.split('=').next() == Some("verbose"))),
        ),
        (Port::Health, "/metrics") => {
            let gzip = request
                .headers()
                .get_all(http::header::ACCEPT_ENCODING)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .any(accepts_gzip);
            exposition(servers.state().metrics.render(), gzip)
        }
        (Port::Admin, "/metrics") => {
            let host = request
                .headers()
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
                .unwrap_or_default();
            let host = match host.rsplit_once(':') {
                Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
                _ => host,
            };
            let query = query.map(|q| format!("?{q}")).unwrap_or_default();
            redirect(&format!("//{host}:{health_port}/metrics{query}"))
        }
        (Port::Admin, path) if profiling_on && path.starts_with("/debug/pprof") => {
            pprof_route(path, query, PPROF_INDEX).await
        }
        _ => text(StatusCode::NOT_FOUND, "404 page not found\n"),
    }
}

/// Serves `port` on `listener` until the agent stops.
pub fn spawn(
    tasks: &TaskTracker,
    listener: TcpListener,
    port: Port,
    servers: Arc<ClientSet>,
    health_port: u16,
) {
    let stop = servers.state().stop.clone();
    let what = match port {
        Port::Health => "the health port",
        Port::Admin => "the admin port",
    };
    serve_http1(
        tasks,
        listener,
        stop,
        what,
        move |request: Request<Incoming>| {
            let servers = servers.clone();
            async move { route(port, &servers, &request, health_port).await }
        },
    );
}
