//! The health port (/healthz, /readyz, /ready, /metrics) and the admin port (/metrics,
//! /agents, /tunnels, profiling).

pub mod profiling;
pub mod tunnels;

use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use tokio::net::TcpListener;
use tokio_util::task::TaskTracker;

pub use crate::http_port::{accepts_gzip, exposition, redirect, serve_http1, text, PeerAddr};
use crate::state::Shared;

pub const NOT_READY_BODY: &str = "no connection to any proxy agent";
pub const SHUTTING_DOWN_BODY: &str = "shutting down";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Port {
    Health,
    Admin,
}

/// `/metrics`, gzipped when the scraper accepts it (Prometheus always does), as promhttp.
fn metrics_response(shared: &Shared, gzip: bool) -> Response<Full<Bytes>> {
    exposition(shared.metrics.render(), gzip)
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

/// Connected agents, for operators: identifiers, stream age, draining, liveness, routes.
fn agents_response(shared: &Shared) -> Response<Full<Bytes>> {
    let agents: Vec<serde_json::Value> = shared
        .registry
        .agents()
        .iter()
        .map(|agent| {
            let (pending, established) = agent.counts();
            let ids = &agent.identifiers;
            let ping = agent.ping.as_ref();
            let ago = |at: Option<tokio::time::Instant>| at.map(|at| at.elapsed().as_secs_f64());
            serde_json::json!({
                "agent_id": agent.agent_id,
                "stream": agent.uid,
                "identifiers": {
                    "host": ids.host, "ipv4": ids.ipv4, "ipv6": ids.ipv6, "cidr": ids.cidr,
                    "default_route": ids.default_route,
                },
                "stream_age_seconds": agent.connected_at.elapsed().as_secs_f64(),
                "draining": agent.is_draining(),
                "suspect": agent.is_suspect(),
                "ping_unanswered_seconds": ago(ping.and_then(|p| p.unanswered_since())),
                "last_ping_answer_seconds_ago": ago(ping.and_then(|p| p.last_answer())),
                "receive_window_bytes": ping.and_then(|p| p.receive_window()),
                "pending_dials": pending,
                "tunnels": established,
            })
        })
        .collect();
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(
            serde_json::to_vec_pretty(&agents).expect("JSON values serialize"),
        )))
        .expect("static response parts are valid")
}

const PPROF_INDEX: &str = "konnectivity-server profiles\n\
    /debug/pprof/profile?seconds=N  CPU profile (pprof protobuf; `go tool pprof URL`)\n\
    /debug/pprof/heap               allocator heap summary (text)\n";

/// `/debug/pprof`, `/debug/pprof/`, `/heap` and `/profile` for either program's admin port;
/// `index` is the page at `/debug/pprof/`.
pub async fn pprof_route(
    path: &str,
    query: Option<&str>,
    index: &'static str,
) -> Response<Full<Bytes>> {
    match path {
        "/debug/pprof" => redirect("/debug/pprof/"),
        "/debug/pprof/" => text(StatusCode::OK, index),
        "/debug/pprof/heap" => text(StatusCode::OK, profiling::heap_summary()),
        "/debug/pprof/profile" => {
            let seconds = profiling::profile_seconds(query);
            match tokio::task::spawn_blocking(move || profiling::cpu_profile(seconds)).await {
                Ok(Ok(profile)) => Response::builder()
                    .status(StatusCode::OK)
                    .header("content-type", "application/octet-stream")
                    .header("content-disposition", "attachment; filename=\"profile\"")
                    .body(Full::new(Bytes::from(profile)))
                    .expect("static response parts are valid"),
                Ok(Err(e)) => text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
                Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
            }
        }
        _ => text(StatusCode::NOT_FOUND, "404 page not found\n"),
    }
}

/// One request as [`route`] reads it.
pub struct Call<'a> {
    pub method: &'a http::Method,
    pub path: &'a str,
    pub query: Option<&'a str>,
    pub gzip: bool,
    /// Who sent it, for the log line of a tunnel closed on request.
    pub peer: Option<std::net::SocketAddr>,
}

/// Routes one request. Every method is accepted, as Go's ServeMux does, except by the one
/// route that changes something (`POST /tunnels/ID/close`).
pub async fn route(port: Port, shared: &Shared, call: Call<'_>) -> Response<Full<Bytes>> {
    let Call {
        method,
        path,
        query,
        gzip,
        peer,
    } = call;
    let profiling = port == Port::Admin && shared.snapshot().config.enable_profiling;
    match (port, path) {
        (_, "/metrics") => metrics_response(shared, gzip),
        (Port::Health, "/healthz") => text(StatusCode::OK, "ok"),
        (Port::Health, "/readyz" | "/ready") => readiness(shared),
        (Port::Admin, "/agents") => agents_response(shared),
        (Port::Admin, "/tunnels") => tunnels::list(shared, query),
        (Port::Admin, path) if path.starts_with("/tunnels/") => {
            match path["/tunnels/".len()..].strip_suffix("/close") {
                Some(id) => tunnels::close(shared, method, id, query, peer).await,
                None => text(StatusCode::NOT_FOUND, "404 page not found\n"),
            }
        }
        (Port::Admin, path) if profiling && path.starts_with("/debug/pprof") => {
            pprof_route(path, query, PPROF_INDEX).await
        }
        _ => text(StatusCode::NOT_FOUND, "404 page not found\n"),
    }
}

/// Serves `port` on `listener` until the server's hard stop.
pub fn spawn_http(tasks: &TaskTracker, listener: TcpListener, port: Port, shared: Arc<Shared>) {
    let stop = shared.hard_stop.clone();
    let what = match port {
        Port::Health => "the health port",
        Port::Admin => "the admin port",
    };
    serve_http1(
        tasks,
        listener,
        stop,
        what,
        move |req: Request<Incoming>| {
            let shared = shared.clone();
            async move {
                let uri = req.uri();
                let gzip = req
                    .headers()
                    .get_all(http::header::ACCEPT_ENCODING)
                    .iter()
                    .filter_map(|v| v.to_str().ok())
                    .any(accepts_gzip);
                let call = Call {
                    method: req.method(),
                    path: uri.path(),
                    query: uri.query(),
                    gzip,
                    peer: req.extensions().get::<PeerAddr>().map(|p| p.0),
                };
                route(port, &shared, call).await
            }
        },
    );
}
