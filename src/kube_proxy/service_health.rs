//! Health-check node ports: for each LoadBalancer Service with external traffic policy Local,
//! an HTTP port that says whether this node has a ready endpoint of it, so the cloud load
//! balancer sends traffic only to nodes that can serve it. As upstream: one listener per
//! address NodePorts answer on (every address of the family when they answer everywhere),
//! 200 with a local endpoint and a healthy proxy, else 503, and upstream's JSON body.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::healthz::ProxyHealth;
use super::model::{IpFamily, ServiceName};
use super::ruleset::settings::NodePorts;
use crate::http_port::serve_http1;

struct Instance {
    port: u16,
    endpoints: Arc<AtomicUsize>,
    stop: CancellationToken,
}

/// One family's health-check ports.
pub struct ServiceHealth {
    family: IpFamily,
    listen: Vec<IpAddr>,
    health: Arc<ProxyHealth>,
    tasks: TaskTracker,
    services: HashMap<ServiceName, Instance>,
}

/// The body upstream writes (its template, dedented: tabs, no trailing newline).
pub fn body(service: &ServiceName, endpoints: usize, healthy: bool) -> String {
    format!(
        "{{\n\t\"service\": {{\n\t\t\"namespace\": {:?},\n\t\t\"name\": {:?}\n\t}},\n\t\"localEndpoints\": {endpoints},\n\t\"serviceProxyHealthy\": {healthy}\n}}",
        service.namespace(),
        service.name()
    )
}

fn respond(service: &ServiceName, endpoints: usize, healthy: bool) -> Response<Full<Bytes>> {
    let status = if endpoints > 0 && healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .header("x-content-type-options", "nosniff")
        .header("x-load-balancing-endpoint-weight", endpoints.to_string())
        .body(Full::new(Bytes::from(body(service, endpoints, healthy))))
        .expect("static response parts are valid")
}

impl ServiceHealth {
    pub fn new(
        family: IpFamily,
        node_ports: &NodePorts,
        health: Arc<ProxyHealth>,
        tasks: TaskTracker,
    ) -> ServiceHealth {
        let listen = match node_ports {
            NodePorts::All => vec![match family {
                IpFamily::V4 => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                IpFamily::V6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
            }],
            NodePorts::Addresses(ips) => ips.clone(),
        };
        ServiceHealth {
            family,
            listen,
            health,
            tasks,
            services: HashMap::new(),
        }
    }

    /// Opens and closes ports for `checks` (Service: health-check port and ready local
    /// endpoints) and updates the counts the open ones report.
    pub fn sync(&mut self, checks: &BTreeMap<ServiceName, (u16, usize)>) {
        self.services.retain(|name, instance| {
            let keep = checks
                .get(name)
                .is_some_and(|(port, _)| *port == instance.port);
            if !keep {
                tracing::info!(v = 2, service = %name, port = instance.port, "Closing healthcheck");
                instance.stop.cancel();
            }
            keep
        });
        for (name, (port, endpoints)) in checks {
            if let Some(instance) = self.services.get(name) {
                instance.endpoints.store(*endpoints, Ordering::Relaxed);
                continue;
            }
            tracing::info!(v = 2, service = %name, port, "Opening healthcheck");
            match self.open(name, *port, *endpoints) {
                Ok(instance) => {
                    self.services.insert(name.clone(), instance);
                }
                Err(e) => tracing::error!(
                    error = %e,
                    service = %name,
                    port,
                    ipFamily = self.family.api(),
                    "Failed to start healthcheck"
                ),
            }
        }
    }

    fn open(&self, name: &ServiceName, port: u16, endpoints: usize) -> std::io::Result<Instance> {
        let stop = CancellationToken::new();
        let count = Arc::new(AtomicUsize::new(endpoints));
        let mut listeners = Vec::new();
        for ip in &self.listen {
            listeners.push(bind(SocketAddr::new(*ip, port))?);
        }
        for listener in listeners {
            let (name, count, health) = (name.clone(), count.clone(), self.health.clone());
            serve_http1(
                &self.tasks,
                listener,
                stop.clone(),
                "a health-check node port",
                move |_req| {
                    let (name, count, health) = (name.clone(), count.clone(), health.clone());
                    async move { respond(&name, count.load(Ordering::Relaxed), health.healthy()) }
                },
            );
        }
        Ok(Instance {
            port,
            endpoints: count,
            stop,
        })
    }

    /// Closes every port (at exit).
    pub fn close(&mut self) {
        for (_, instance) in self.services.drain() {
            instance.stop.cancel();
        }
    }

    pub fn open_ports(&self) -> Vec<u16> {
        let mut ports: Vec<u16> = self.services.values().map(|i| i.port).collect();
        ports.sort_unstable();
        ports
    }
}

/// A listener; an IPv6 one never takes IPv4 too, so both families can have the same port.
pub fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let domain = socket2::Domain::for_address(addr);
    let socket = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(128)?;
    tokio::net::TcpListener::from_std(socket.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_is_upstreams() {
        let name = ServiceName::new("ns1", "svc1");
        assert_eq!(
            body(&name, 2, true),
            "{\n\t\"service\": {\n\t\t\"namespace\": \"ns1\",\n\t\t\"name\": \"svc1\"\n\t},\n\t\"localEndpoints\": 2,\n\t\"serviceProxyHealthy\": true\n}"
        );
        assert_eq!(
            respond(&name, 0, true).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            respond(&name, 1, false).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        let ok = respond(&name, 3, true);
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(ok.headers()["x-load-balancing-endpoint-weight"], "3");
    }

    #[tokio::test]
    async fn ports_open_and_close_with_the_services() {
        let tasks = TaskTracker::new();
        let health = Arc::new(ProxyHealth::new(std::time::Duration::from_secs(60)));
        health.updated(IpFamily::V4);
        let mut sh = ServiceHealth::new(
            IpFamily::V4,
            &NodePorts::Addresses(vec!["127.0.0.1".parse().unwrap()]),
            health,
            tasks.clone(),
        );
        // A free port, found by binding port 0.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let name = ServiceName::new("ns", "lb");
        sh.sync(&[(name.clone(), (port, 1))].into_iter().collect());
        assert_eq!(sh.open_ports(), [port]);
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        stream
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut text = String::new();
        stream.read_to_string(&mut text).await.unwrap();
        assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
        assert!(text.contains("\"localEndpoints\": 1"), "{text}");
        sh.sync(&BTreeMap::new());
        assert!(sh.open_ports().is_empty());
        tasks.close();
        tokio::time::timeout(std::time::Duration::from_secs(5), tasks.wait())
            .await
            .unwrap();
        assert!(tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err());
    }
}
