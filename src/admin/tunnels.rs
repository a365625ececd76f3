//! `/tunnels` on the admin port: every tunnel the server holds, read from the agents' route
//! tables (the one place tunnels are registered, so the view cannot outlive them), and
//! `POST /tunnels/<connection id>/close`, which closes one while --enable-tunnel-close is set.

use std::net::SocketAddr;

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use http_body_util::Full;

use super::text;
use crate::backend::dispatch::close_by_operator;
use crate::backend::session::{Route, RouteState};
use crate::state::Shared;

/// Why a `/tunnels` query was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum FilterError {
    #[error("unknown query parameter {0:?}: /tunnels takes agent and destination")]
    Unknown(String),
}

/// Which tunnels a `/tunnels` request asks for.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Filter {
    /// The agent id, exactly.
    pub agent: Option<String>,
    /// `host:port` matches that destination exactly; a bare host matches every port of it.
    pub destination: Option<String>,
}

impl Filter {
    pub fn parse(query: Option<&str>) -> Result<Filter, FilterError> {
        let mut filter = Filter::default();
        for (key, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
            match key.as_ref() {
                "agent" => filter.agent = Some(value.into_owned()),
                "destination" => filter.destination = Some(value.into_owned()),
                other => return Err(FilterError::Unknown(other.to_string())),
            }
        }
        Ok(filter)
    }

    fn agent_matches(&self, agent_id: &str) -> bool {
        self.agent.as_deref().is_none_or(|want| want == agent_id)
    }

    /// A route whose destination is not known (a closing one) matches no destination filter.
    fn destination_matches(&self, destination: Option<&str>) -> bool {
        let Some(want) = self.destination.as_deref() else {
            return true;
        };
        let Some(have) = destination else {
            return false;
        };
        let want_host = host_of(want);
        let bare_host = want_host == want.trim_matches(['[', ']']);
        have == want || bare_host && host_of(have) == want_host
    }
}

/// The host of `host:port` (brackets of an IPv6 literal removed); the whole text without a port.
fn host_of(address: &str) -> &str {
    let host = match address.rsplit_once(':') {
        // An IPv6 literal without brackets has colons but no port.
        Some((host, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => {
            if host.contains(':') && !host.starts_with('[') {
                address
            } else {
                host
            }
        }
        _ => address,
    };
    host.trim_matches(['[', ']'])
}

fn json(status: StatusCode, value: &serde_json::Value) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(
            serde_json::to_vec_pretty(value).expect("JSON values serialize"),
        )))
        .expect("static response parts are valid")
}

fn state_name(state: RouteState) -> &'static str {
    match state {
        RouteState::Pending => "pending",
        RouteState::Established => "established",
        RouteState::Closing => "closing",
    }
}

/// One route as `/tunnels` shows it.
fn describe(agent_id: &str, stream: u64, route: &Route) -> serde_json::Value {
    let link = route.link.as_deref();
    let origin = link.and_then(|l| l.facts.origin());
    // A tunnel's age runs from its frontend's request; a closing route only knows when we
    // asked its agent to close it.
    let age = link.map_or(route.since, |l| l.facts.opened()).elapsed();
    serde_json::json!({
        "connection_id": route.connect_id,
        "dial_id": origin.map(|o| o.dial_id),
        "frontend": origin.map(|o| serde_json::json!({"kind": o.frontend, "peer": &*o.peer})),
        "agent_id": agent_id,
        "agent_stream": stream,
        "destination": link.map(|l| l.destination()).filter(|d| !d.is_empty()),
        "state": state_name(route.state),
        "age_seconds": age.as_secs_f64(),
        "bytes_to_agent": link.map_or(0, |l| l.facts.to_agent()),
        "bytes_to_frontend": link.map_or(0, |l| l.taken_bytes()),
        "queued_bytes": link.map_or(0, |l| l.queued_bytes()),
        // Data waits and the frontend took none of it within the last moment. The tunnel is
        // closed once its full queue goes --frontend-queue-stall-timeout without progress.
        "reader_stalled": link.is_some_and(|l| l.queued_bytes() > 0 && !l.is_reading()),
    })
}

/// `GET /tunnels[?agent=ID][&destination=HOST[:PORT]]`.
pub fn list(shared: &Shared, query: Option<&str>) -> Response<Full<Bytes>> {
    let filter = match Filter::parse(query) {
        Ok(filter) => filter,
        Err(e) => return text(StatusCode::BAD_REQUEST, format!("{e}\n")),
    };
    let mut tunnels = Vec::new();
    for agent in shared.registry.agents() {
        if !filter.agent_matches(&agent.agent_id) {
            continue;
        }
        for route in agent.routes_view() {
            let destination = route.link.as_deref().map(|l| l.destination());
            if filter.destination_matches(destination) {
                tunnels.push(describe(&agent.agent_id, agent.uid, &route));
            }
        }
    }
    json(StatusCode::OK, &serde_json::Value::Array(tunnels))
}

pub const CLOSE_DISABLED: &str = "closing tunnels is disabled: start the server with \
    --enable-tunnel-close (TOML enable_tunnel_close = true)\n";

/// `POST /tunnels/<connection id>/close[?agent=ID]`: connection ids are per agent stream, so
/// one that several agents use needs the agent named.
pub async fn close(
    shared: &Shared,
    method: &Method,
    id: &str,
    query: Option<&str>,
    peer: Option<SocketAddr>,
) -> Response<Full<Bytes>> {
    if method != Method::POST {
        return Response::builder()
            .status(StatusCode::METHOD_NOT_ALLOWED)
            .header("allow", "POST")
            .body(Full::new(Bytes::from_static(b"use POST\n")))
            .expect("static response parts are valid");
    }
    if !shared.snapshot().config.enable_tunnel_close {
        return text(StatusCode::FORBIDDEN, CLOSE_DISABLED);
    }
    let Ok(connect_id) = id.parse::<i64>() else {
        return text(
            StatusCode::BAD_REQUEST,
            format!("{id:?} is not a connection id\n"),
        );
    };
    let filter = match Filter::parse(query) {
        Ok(filter) if filter.destination.is_none() => filter,
        _ => return text(StatusCode::BAD_REQUEST, "closing takes only ?agent=ID\n"),
    };
    let holders: Vec<_> = shared
        .registry
        .agents()
        .into_iter()
        .filter(|a| filter.agent_matches(&a.agent_id))
        .filter_map(|a| a.tunnel(connect_id).map(|link| (a, link)))
        .collect();
    let (agent, link) = match holders.as_slice() {
        [] => {
            return text(
                StatusCode::NOT_FOUND,
                format!("no established tunnel with connection id {connect_id}\n"),
            )
        }
        [one] => one.clone(),
        _ => {
            return text(
                StatusCode::CONFLICT,
                format!(
                    "connection id {connect_id} is established on {} agent streams: name the agent with ?agent=ID\n",
                    holders.len()
                ),
            )
        }
    };
    if !close_by_operator(&agent, connect_id).await {
        return text(
            StatusCode::NOT_FOUND,
            format!("tunnel {connect_id} ended meanwhile\n"),
        );
    }
    let admin = peer.map_or_else(|| "unknown".to_string(), |p| p.to_string());
    tracing::info!(
        admin = %admin,
        agentID = %agent.agent_id,
        connectionID = connect_id,
        dialAddress = %link.destination(),
        "Tunnel closed on the admin port's request"
    );
    text(
        StatusCode::OK,
        format!("closed tunnel {connect_id} (agent {})\n", agent.agent_id),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_parse_and_refuse_unknown_keys() {
        assert_eq!(
            Filter::parse(Some("agent=a%201&destination=10.0.0.1:443")),
            Ok(Filter {
                agent: Some("a 1".into()),
                destination: Some("10.0.0.1:443".into())
            })
        );
        assert_eq!(Filter::parse(None), Ok(Filter::default()));
        assert!(Filter::parse(Some("agnet=x")).is_err());
    }

    #[test]
    fn a_destination_matches_exactly_or_by_its_host() {
        let f = |d: &str| Filter {
            agent: None,
            destination: Some(d.into()),
        };
        assert!(f("10.0.0.1:443").destination_matches(Some("10.0.0.1:443")));
        assert!(!f("10.0.0.1:443").destination_matches(Some("10.0.0.1:80")));
        assert!(f("10.0.0.1").destination_matches(Some("10.0.0.1:80")));
        assert!(!f("10.0.0.1").destination_matches(Some("10.0.0.11:80")));
        assert!(!f("10.0.0").destination_matches(Some("10.0.0.1:80")));
        assert!(f("::1").destination_matches(Some("[::1]:443")));
        assert!(f("[::1]").destination_matches(Some("[::1]:443")));
        assert!(f("kubernetes.default").destination_matches(Some("kubernetes.default:443")));
        assert!(!f("10.0.0.1").destination_matches(None));
        assert!(Filter::default().destination_matches(None));
    }
}
