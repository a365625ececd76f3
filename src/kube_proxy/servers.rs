//! The proxy's two HTTP ports, as upstream's: the healthz port (`/healthz`, `/livez`) and
//! the metrics port (`/metrics`, `/healthz`, `/proxyMode`, `/configz`). A port that cannot
//! be bound is retried every 5 s, as upstream, or stops the start with
//! `--bind-address-hard-fail`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::shared::ProxyShared;
use crate::http_port::{accepts_gzip, exposition, serve_http1, text};

const RETRY: Duration = Duration::from_secs(5);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Port {
    Healthz,
    Metrics,
}

impl Port {
    fn what(self) -> &'static str {
        match self {
            Port::Healthz => "the healthz port",
            Port::Metrics => "the metrics port",
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("failed to start {what} on {addr}: {source}")]
pub struct BindError {
    pub what: &'static str,
    pub addr: SocketAddr,
    pub source: std::io::Error,
}

fn json(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .header("x-content-type-options", "nosniff")
        .body(Full::new(Bytes::from(body)))
        .expect("static response parts are valid")
}

fn route(port: Port, shared: &ProxyShared, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let path = req.uri().path();
    match (port, path) {
        (Port::Healthz, "/healthz" | "/livez") => {
            let node = path == "/healthz";
            let report = shared.health.report(node, SystemTime::now());
            let code = report.code();
            let counter = if node {
                &shared.metrics.healthz_total
            } else {
                &shared.metrics.livez_total
            };
            counter.with_label_values(&[&code.to_string()]).inc();
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
            json(status, report.json())
        }
        (Port::Metrics, "/metrics") => {
            let gzip = req
                .headers()
                .get_all(http::header::ACCEPT_ENCODING)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .any(accepts_gzip);
            exposition(shared.metrics.render(), gzip)
        }
        (Port::Metrics, "/healthz") => text(StatusCode::OK, "ok"),
        (Port::Metrics, "/proxyMode") => text(StatusCode::OK, shared.config().mode.name()),
        (Port::Metrics, "/configz") => {
            let body = serde_json::json!({
                "kubeproxy.config.k8s.io": shared.config().v1alpha1_json(),
            });
            json(StatusCode::OK, body.to_string())
        }
        _ => text(StatusCode::NOT_FOUND, "404 page not found\n"),
    }
}

/// Serves `port` on `addr` until `stop`; binds at once (an error with `hard_fail`) or keeps
/// trying every 5 s in the background.
pub async fn serve(
    port: Port,
    addr: SocketAddr,
    shared: Arc<ProxyShared>,
    tasks: &TaskTracker,
    stop: CancellationToken,
    hard_fail: bool,
) -> Result<(), BindError> {
    let what = port.what();
    let first = super::service_health::bind(addr);
    let listener = match first {
        Ok(l) => Some(l),
        Err(source) if hard_fail => return Err(BindError { what, addr, source }),
        Err(e) => {
            tracing::error!(error = %e, address = %addr, "Failed to start {what}; retrying every 5s");
            None
        }
    };
    let tasks_inner = tasks.clone();
    tasks.spawn(async move {
        let listener = match listener {
            Some(l) => l,
            None => loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(RETRY) => {}
                }
                match super::service_health::bind(addr) {
                    Ok(l) => break l,
                    Err(e) => {
                        tracing::error!(error = %e, address = %addr, "Failed to start {what}")
                    }
                }
            },
        };
        tracing::info!(v = 3, address = %addr, "Starting {what}");
        serve_http1(
            &tasks_inner,
            listener,
            stop,
            what,
            move |req: Request<Incoming>| {
                let shared = shared.clone();
                async move { route(port, &shared, &req) }
            },
        );
    });
    Ok(())
}
