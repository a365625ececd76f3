//! A node's Services and endpoints, written compactly, and the table they render to.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;

use ipnet::IpNet;

use crate::kube_proxy::model::{
    sort_endpoints, Endpoint, Hints, IpFamily, Protocol, ServiceName, ServicePort, ServicePortName,
};
use crate::kube_proxy::nft::table::{apply, Table};
use crate::kube_proxy::ruleset::settings::Settings;
use crate::kube_proxy::ruleset::sync::{KernelView, Plan, SyncKind, Wanted};

/// The addresses every scenario uses (facts of the kind upstream's tests use: a node at
/// 192.168.0.2 with pods in 10.0.0.0/8 and Services in 172.30.0.0/16; in IPv6, fd00:10::/64
/// pods and fd00:10:96::/112 Services).
pub struct Net {
    pub family: IpFamily,
    pub node_ip: IpAddr,
    /// Another address of the node (NodePorts do not answer on it by default).
    pub node_ip2: IpAddr,
    pub pod_cidr: &'static str,
    /// A pod on this node, and one on another node (no Service's endpoints).
    pub local_pod: IpAddr,
    pub remote_pod: IpAddr,
    /// A client outside the cluster, one inside the LB source range, one outside it.
    pub external_client: IpAddr,
    pub allowed_client: IpAddr,
    pub blocked_client: IpAddr,
    pub source_range: &'static str,
}

impl Net {
    pub fn of(family: IpFamily) -> Net {
        let ip = |s: &str| s.parse().expect("a literal address");
        match family {
            IpFamily::V4 => Net {
                family,
                node_ip: ip("192.168.0.2"),
                node_ip2: ip("192.168.1.2"),
                pod_cidr: "10.0.0.0/8",
                local_pod: ip("10.0.0.2"),
                remote_pod: ip("10.0.2.9"),
                external_client: ip("203.0.113.2"),
                allowed_client: ip("203.0.113.2"),
                blocked_client: ip("203.0.113.130"),
                source_range: "203.0.113.0/25",
            },
            IpFamily::V6 => Net {
                family,
                node_ip: ip("fd00::2"),
                node_ip2: ip("fd00:1::2"),
                pod_cidr: "fd00:10::/64",
                local_pod: ip("fd00:10::1:2"),
                remote_pod: ip("fd00:10::2:9"),
                external_client: ip("2001:db8::2"),
                allowed_client: ip("2001:db8::2"),
                blocked_client: ip("2001:db8:1::2"),
                source_range: "2001:db8::/64",
            },
        }
    }

    /// An address in the Service range: `svc(41)` is 172.30.0.41 (fd00:10:96::29).
    pub fn svc(&self, n: u8) -> IpAddr {
        match self.family {
            IpFamily::V4 => IpAddr::from([172, 30, 0, n]),
            IpFamily::V6 => IpAddr::from([0xfd00, 0x10, 0x96, 0, 0, 0, 0, u16::from(n)]),
        }
    }

    /// A pod address: `pod(0, 1)` is 10.180.0.1 (fd00:10::1); third octet 0 is this node.
    pub fn pod(&self, node: u8, n: u8) -> IpAddr {
        match self.family {
            IpFamily::V4 => IpAddr::from([10, 180, node, n]),
            IpFamily::V6 => IpAddr::from([
                0xfd00,
                0x10,
                0,
                0,
                0,
                0,
                0,
                u16::from(node) * 0x100 + u16::from(n),
            ]),
        }
    }

    /// An external or LB address: `ext(1)` is 192.168.99.1 (2600:5200::1).
    pub fn ext(&self, n: u8) -> IpAddr {
        match self.family {
            IpFamily::V4 => IpAddr::from([192, 168, 99, n]),
            IpFamily::V6 => IpAddr::from([0x2600, 0x5200, 0, 0, 0, 0, 0, u16::from(n)]),
        }
    }

    pub fn settings(&self) -> Settings {
        let mut settings = Settings::example(self.family);
        settings.node_ip = Some(self.node_ip);
        settings
    }
}

/// The Services of a scenario, built one at a time.
#[derive(Default)]
pub struct Scenario {
    pub services: BTreeMap<ServiceName, Vec<ServicePort>>,
    pub endpoints: HashMap<ServicePortName, Vec<Endpoint>>,
}

/// One Service, built with chained calls; `done()` adds it to the scenario.
pub struct Svc<'a> {
    scenario: &'a mut Scenario,
    name: ServiceName,
    template: ServicePort,
    ports: Vec<ServicePort>,
}

/// How an endpoint is: ready, serving, terminating, on this node.
#[derive(Clone, Copy)]
pub struct EpState {
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    pub local: bool,
}

pub const READY: EpState = EpState {
    ready: true,
    serving: true,
    terminating: false,
    local: false,
};
pub const READY_LOCAL: EpState = EpState {
    local: true,
    ..READY
};
pub const TERMINATING: EpState = EpState {
    ready: false,
    serving: true,
    terminating: true,
    local: false,
};
pub const TERMINATING_LOCAL: EpState = EpState {
    local: true,
    ..TERMINATING
};
pub const NOT_SERVING: EpState = EpState {
    ready: false,
    serving: false,
    terminating: true,
    local: false,
};

pub const NOT_SERVING_LOCAL: EpState = EpState {
    local: true,
    ..NOT_SERVING
};

impl Scenario {
    pub fn service(&mut self, namespace: &str, name: &str, cluster_ip: IpAddr) -> Svc<'_> {
        let name = ServiceName::new(namespace, name);
        Svc {
            template: ServicePort {
                name: ServicePortName::new(name.clone(), "", Protocol::Tcp),
                cluster_ip,
                port: 0,
                node_port: 0,
                affinity_timeout: None,
                external_policy_local: false,
                internal_policy_local: false,
                external_ips: Vec::new(),
                source_ranges: Vec::new(),
                lb_vips: Vec::new(),
                health_check_node_port: 0,
            },
            scenario: self,
            name,
            ports: Vec::new(),
        }
    }

    /// Renders every Service into a table in one full sync.
    pub fn table(&self, settings: &Settings) -> Table {
        let mut view = KernelView::new();
        let plan = self.plan(&view, settings, SyncKind::Full, &HashSet::new());
        let mut state = None;
        apply(&mut state, &plan.tx).expect("the model kernel takes the full sync");
        view.commit(plan, std::time::Instant::now());
        state.expect("a full sync makes the table")
    }

    pub fn plan(
        &self,
        view: &KernelView,
        settings: &Settings,
        kind: SyncKind,
        changed: &HashSet<ServiceName>,
    ) -> Plan {
        view.plan(
            settings,
            kind,
            &Wanted {
                services: &self.services,
                endpoints: &self.endpoints,
                zone: None,
            },
            changed,
        )
    }
}

impl Svc<'_> {
    /// Adds a port; later settings apply to every port.
    pub fn port(mut self, name: &str, protocol: Protocol, port: u16, node_port: u16) -> Self {
        let mut p = self.template.clone();
        p.name = ServicePortName::new(self.name.clone(), name, protocol);
        p.port = port;
        p.node_port = node_port;
        self.ports.push(p);
        self
    }

    fn each(mut self, f: impl Fn(&mut ServicePort)) -> Self {
        f(&mut self.template);
        for p in &mut self.ports {
            f(p);
        }
        self
    }

    pub fn external_ip(self, ip: IpAddr) -> Self {
        self.each(|p| p.external_ips.push(ip))
    }

    pub fn lb(self, ip: IpAddr) -> Self {
        self.each(|p| p.lb_vips.push(ip))
    }

    pub fn source_range(self, cidr: &str) -> Self {
        let net: IpNet = cidr.parse().expect("a literal prefix");
        self.each(|p| p.source_ranges.push(net))
    }

    pub fn external_local(self) -> Self {
        self.each(|p| p.external_policy_local = true)
    }

    pub fn internal_local(self) -> Self {
        self.each(|p| p.internal_policy_local = true)
    }

    pub fn affinity(self, seconds: u32) -> Self {
        self.each(|p| p.affinity_timeout = Some(seconds))
    }

    pub fn health_check(self, port: u16) -> Self {
        self.each(|p| p.health_check_node_port = port)
    }

    /// An endpoint of the port named `port` (listening on `target`).
    pub fn endpoint(self, port: &str, ip: IpAddr, target: u16, state: EpState) -> Self {
        self.endpoint_hinted(port, ip, target, state, None)
    }

    pub fn endpoint_hinted(
        self,
        port: &str,
        ip: IpAddr,
        target: u16,
        state: EpState,
        zone: Option<&str>,
    ) -> Self {
        let key = self
            .ports
            .iter()
            .find(|p| p.name.port == port)
            .map(|p| p.name.clone())
            .expect("endpoint() names a port added before it");
        let list = self.scenario.endpoints.entry(key).or_default();
        list.push(Endpoint {
            ip,
            port: target,
            is_local: state.local,
            ready: state.ready,
            serving: state.serving,
            terminating: state.terminating,
            hints: zone.map(|z| {
                Box::new(Hints {
                    zones: Some([z.to_owned()].into_iter().collect()),
                    nodes: None,
                })
            }),
        });
        sort_endpoints(list);
        self
    }

    pub fn done(self) {
        self.scenario.services.insert(self.name, self.ports);
    }
}

/// The lines only one of two dumps has, for an assertion's message.
pub fn dump_diff(got: &str, want: &str) -> String {
    let got_lines: std::collections::BTreeSet<&str> = got.lines().collect();
    let want_lines: std::collections::BTreeSet<&str> = want.lines().collect();
    let mut out = String::new();
    for line in want_lines.difference(&got_lines) {
        out.push_str(&format!("- {line}\n"));
    }
    for line in got_lines.difference(&want_lines) {
        out.push_str(&format!("+ {line}\n"));
    }
    out
}
