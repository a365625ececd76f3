//! kube-proxy's conntrack client and `clean_stale` against the kernel, each test in a network
//! namespace of its own: real UDP flows through nftables DNAT rules (what kube-proxy's rules
//! do to a Service's traffic), read with our dump, checked against `conntrack -L`.
//!
//! Needs root, `ip`, `nft` and `conntrack`; without them the tests say so and pass, unless
//! CI=true, where they fail. Nothing is done in the machine's own namespace: the netlink calls
//! and sockets run in a thread that entered the test's namespace, the tools through
//! `ip netns exec`, and each namespace is deleted when its test ends, failed or not.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::Write;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use kube_traffic::kube_proxy::conntrack::{
    clean_stale, Conntrack, ConntrackMetrics, Deletion, Flow, Tuple,
};
use kube_traffic::kube_proxy::model::{
    Endpoint, IpFamily, Protocol, ServiceName, ServicePort, ServicePortName,
};
use nix::sched::{setns, CloneFlags};

const UDP: u8 = 17;
const TCP: u8 = 6;

/// Whether the tests can run here; panics when they must (CI=true) and cannot.
fn environment_ready() -> bool {
    let mut missing = Vec::new();
    let euid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("Uid:"))?.to_owned();
            line.split_whitespace().nth(2).map(str::to_owned)
        });
    if euid.as_deref() != Some("0") {
        missing.push("root".to_owned());
    }
    for (tool, flag) in [
        ("ip", "-V"),
        ("nft", "--version"),
        ("conntrack", "--version"),
    ] {
        let found = Command::new(tool)
            .arg(flag)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            missing.push(format!("`{tool}`"));
        }
    }
    if missing.is_empty() {
        return true;
    }
    let why = format!(
        "the real-kernel conntrack tests need {}",
        missing.join(", ")
    );
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{why} (CI=true: not skipped)");
    }
    eprintln!("SKIPPED: {why}");
    false
}

fn run(program: &str, args: &[&str]) -> Output {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program} {args:?}: {e}"));
    assert!(
        output.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// A network namespace of this test's, deleted on drop.
struct Netns {
    name: String,
}

impl Netns {
    fn new() -> Netns {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "kpct-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        run("ip", &["netns", "add", &name]);
        let netns = Netns { name };
        netns.ip(&["link", "set", "lo", "up"]);
        netns
    }

    fn ip(&self, args: &[&str]) {
        let mut all = vec!["-n", &self.name];
        all.extend(args);
        run("ip", &all);
    }

    fn exec(&self, args: &[&str]) -> Output {
        let mut all = vec!["netns", "exec", &self.name];
        all.extend(args);
        run("ip", &all)
    }

    fn nft(&self, ruleset: &str) {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.name, "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("nft runs");
        child
            .stdin
            .take()
            .expect("a stdin")
            .write_all(ruleset.as_bytes())
            .expect("nft reads its ruleset");
        let output = child.wait_with_output().expect("nft ends");
        assert!(
            output.status.success(),
            "nft: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// Runs `body` in a thread that entered this namespace (the calling thread stays where it
    /// is); a panic in it is this test's.
    fn inside<T: Send>(&self, body: impl FnOnce() -> T + Send) -> T {
        let path = format!("/run/netns/{}", self.name);
        std::thread::scope(|scope| {
            let thread = scope.spawn(|| {
                let netns = File::open(&path).expect("the namespace's file");
                setns(netns.as_raw_fd(), CloneFlags::CLONE_NEWNET).expect("setns");
                body()
            });
            thread
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    /// The entries `conntrack -L` lists, as (original, reply).
    fn listed(&self, family: &str, protocol: &str) -> Vec<(Tuple, Tuple)> {
        let output = self.exec(&["conntrack", "-L", "-f", family, "-p", protocol]);
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .map(parse_listed)
            .collect()
    }

    /// `conntrack -I`: an entry without a packet (TCP here, which needs no flow to exist).
    fn insert_tcp(&self, original: &Tuple, reply: &Tuple) {
        let command = format!(
            "conntrack -I -p tcp -s {} -d {} --sport {} --dport {} -r {} -q {} \
             --reply-port-src {} --reply-port-dst {} --state ESTABLISHED -t 300",
            original.src,
            original.dst,
            original.src_port,
            original.dst_port,
            reply.src,
            reply.dst,
            reply.src_port,
            reply.dst_port,
        );
        self.exec(&command.split_whitespace().collect::<Vec<_>>());
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let deleted = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status()
            .is_ok_and(|s| s.success());
        if !deleted {
            eprintln!("could not delete network namespace {}", self.name);
        }
    }
}

/// One line of `conntrack -L`: the protocol number, then src, dst, sport, dport of each
/// direction.
fn parse_listed(line: &str) -> (Tuple, Tuple) {
    let mut fields = line.split_whitespace();
    let protocol: u8 = fields
        .nth(1)
        .and_then(|n| n.parse().ok())
        .expect("a protocol number");
    let values: Vec<&str> = fields
        .filter_map(|field| field.split_once('='))
        .filter(|(key, _)| matches!(*key, "src" | "dst" | "sport" | "dport"))
        .map(|(_, value)| value)
        .collect();
    assert!(values.len() >= 8, "{line}");
    let tuple = |v: &[&str]| Tuple {
        protocol,
        src: v[0].parse().expect("an address"),
        dst: v[1].parse().expect("an address"),
        src_port: v[2].parse().expect("a port"),
        dst_port: v[3].parse().expect("a port"),
    };
    (tuple(&values[0..4]), tuple(&values[4..8]))
}

fn addr(text: &str) -> SocketAddr {
    text.parse().expect("a socket address")
}

fn bind(address: &str) -> UdpSocket {
    let socket = UdpSocket::bind(addr(address)).unwrap_or_else(|e| panic!("bind {address}: {e}"));
    socket
        .set_read_timeout(Some(Duration::from_secs(2)))
        .expect("a timeout");
    socket
}

/// One request and its answer through the namespace's DNAT rules: `client` sends to
/// `service`, `endpoint` (where the rules send it) answers, and the answer comes back from
/// `service`, as a Service's client sees it. Leaves an entry the kernel saw both ways.
fn exchange(client: &UdpSocket, service: &str, endpoint: &UdpSocket) {
    client.send_to(b"ping", addr(service)).expect("send");
    let mut buf = [0; 16];
    let (_, from) = endpoint
        .recv_from(&mut buf)
        .expect("the endpoint hears the client");
    endpoint.send_to(b"pong", from).expect("answer");
    let (_, answered_by) = client.recv_from(&mut buf).expect("the client hears back");
    assert_eq!(answered_by, addr(service), "the answer is un-NATed");
}

/// The entries a client at `client` made to `service`, answered by `endpoint`.
fn udp_flow(client: &str, service: &str, endpoint: &str) -> (Tuple, Tuple) {
    let (client, service, endpoint) = (addr(client), addr(service), addr(endpoint));
    let original = Tuple {
        protocol: UDP,
        src: client.ip(),
        dst: service.ip(),
        src_port: client.port(),
        dst_port: service.port(),
    };
    let reply = Tuple {
        protocol: UDP,
        src: endpoint.ip(),
        dst: client.ip(),
        src_port: endpoint.port(),
        dst_port: client.port(),
    };
    (original, reply)
}

fn find<'f>(flows: &'f [Flow], (original, reply): &(Tuple, Tuple)) -> Option<&'f Flow> {
    flows
        .iter()
        .find(|f| f.original == *original && f.reply == *reply)
}

/// A namespace where 10.244.1.1 is the client and 10.244.1.5 and .6 are the endpoints, all
/// on lo; 10.96.0.0/16 (ClusterIPs) routes there too, and 10.0.0.2 is the node's address.
/// DNAT like kube-proxy's, chosen by source port so the test knows which endpoint a flow
/// gets: 10.96.0.10:53 from port 40001 to .5, from 40002 to .6; the NodePort 30053 to .6;
/// 10.96.0.20:53 from anywhere to .5.
fn dns_namespace() -> Netns {
    let netns = Netns::new();
    for address in ["10.244.1.1", "10.244.1.5", "10.244.1.6", "10.0.0.2"] {
        netns.ip(&["addr", "add", &format!("{address}/32"), "dev", "lo"]);
    }
    netns.ip(&["route", "add", "10.96.0.0/16", "dev", "lo"]);
    netns.nft(
        "table ip kpct {
            chain out {
                type nat hook output priority -100;
                ip daddr 10.96.0.10 udp dport 53 udp sport 40001 dnat to 10.244.1.5:5353
                ip daddr 10.96.0.10 udp dport 53 udp sport 40002 dnat to 10.244.1.6:5353
                ip daddr 10.0.0.2 udp dport 30053 dnat to 10.244.1.6:5353
                ip daddr 10.96.0.20 udp dport 53 dnat to 10.244.1.5:5353
            }
        }",
    );
    netns
}

/// ns/dns, UDP 53, ClusterIP `cluster_ip`, NodePort `node_port`, with its endpoints.
fn dns_state(
    cluster_ip: &str,
    node_port: u16,
    endpoints: &[(&str, bool)],
) -> (
    BTreeMap<ServiceName, Vec<ServicePort>>,
    HashMap<ServicePortName, Vec<Endpoint>>,
) {
    let svc = ServiceName::new("ns", "dns");
    let port = ServicePort {
        name: ServicePortName::new(svc.clone(), "dns", Protocol::Udp),
        cluster_ip: cluster_ip.parse().expect("an address"),
        port: 53,
        node_port,
        affinity_timeout: None,
        external_policy_local: false,
        internal_policy_local: false,
        external_ips: Vec::new(),
        source_ranges: Vec::new(),
        lb_vips: Vec::new(),
        health_check_node_port: 0,
    };
    let endpoints = endpoints
        .iter()
        .map(|(address, serving)| Endpoint {
            ip: address.parse().expect("an address"),
            port: 5353,
            is_local: true,
            ready: *serving,
            serving: *serving,
            terminating: !*serving,
            hints: None,
        })
        .collect();
    let endpoints = HashMap::from([(port.name.clone(), endpoints)]);
    (BTreeMap::from([(svc, vec![port])]), endpoints)
}

#[test]
fn the_dump_reads_real_flows_and_a_delete_removes_exactly_its_entry() {
    if !environment_ready() {
        return;
    }
    let netns = dns_namespace();
    let to_5 = udp_flow("10.244.1.1:40001", "10.96.0.10:53", "10.244.1.5:5353");
    let to_6 = udp_flow("10.244.1.1:40002", "10.96.0.10:53", "10.244.1.6:5353");
    let tcp = (
        Tuple {
            protocol: TCP,
            ..to_6.0
        },
        Tuple {
            protocol: TCP,
            ..to_6.1
        },
    );
    netns.insert_tcp(&tcp.0, &tcp.1);
    netns.inside(|| {
        let (endpoint_5, endpoint_6) = (bind("10.244.1.5:5353"), bind("10.244.1.6:5353"));
        exchange(&bind("10.244.1.1:40001"), "10.96.0.10:53", &endpoint_5);
        exchange(&bind("10.244.1.1:40002"), "10.96.0.10:53", &endpoint_6);

        let mut conntrack = Conntrack::open().expect("a ctnetlink socket");
        let started = Instant::now();
        let dump = conntrack
            .dump(IpFamily::V4, Some(Protocol::Udp))
            .expect("a dump");
        eprintln!(
            "UDP dump: {} entries in {:?}",
            dump.flows.len(),
            started.elapsed()
        );
        assert!(!dump.interrupted && dump.skipped == 0, "{dump:?}");
        assert_eq!(dump.flows.len(), 2, "{dump:?}");
        let flow_5 = find(&dump.flows, &to_5).expect("the flow to .5").clone();
        let flow_6 = find(&dump.flows, &to_6).expect("the flow to .6").clone();
        assert!(flow_6.id.is_some() && flow_6.zone.is_none(), "{flow_6}");

        let tcp_dump = conntrack
            .dump(IpFamily::V4, Some(Protocol::Tcp))
            .expect("a dump");
        assert_eq!(tcp_dump.flows.len(), 1);
        assert!(find(&tcp_dump.flows, &tcp).is_some(), "{tcp_dump:?}");
        let all = conntrack.dump(IpFamily::V4, None).expect("a dump");
        assert_eq!(all.flows.len(), 3, "{all:?}");
        let v6 = conntrack
            .dump(IpFamily::V6, Some(Protocol::Udp))
            .expect("a dump");
        assert!(v6.flows.is_empty(), "{v6:?}");

        // An id that is not the entry's: the kernel finds the tuple but refuses it.
        let wrong_id = Flow {
            id: flow_5.id.map(|id| id.wrapping_add(1)),
            ..flow_5.clone()
        };
        assert_eq!(
            conntrack.delete(&wrong_id).expect("a delete"),
            Deletion::AlreadyGone
        );

        let started = Instant::now();
        assert_eq!(
            conntrack.delete(&flow_6).expect("a delete"),
            Deletion::Deleted
        );
        eprintln!("delete: {:?}", started.elapsed());
        assert_eq!(
            conntrack.delete(&flow_6).expect("a delete"),
            Deletion::AlreadyGone
        );
    });
    let udp = netns.listed("ipv4", "udp");
    assert_eq!(udp, [to_5], "only the deleted entry is gone");
    assert_eq!(netns.listed("ipv4", "tcp"), [tcp]);
}

#[test]
fn a_dump_larger_than_a_datagram_reads_every_entry_and_cleans_them() {
    if !environment_ready() {
        return;
    }
    const FLOWS: usize = 2000;
    let netns = dns_namespace();
    netns.inside(|| {
        // Each from a port of its own: one entry each, of about 200 bytes, so the dump needs
        // several of the kernel's datagrams (32 KiB at most). The entries outlive the sockets.
        for port in 20000..20000 + FLOWS {
            bind(&format!("10.244.1.1:{port}"))
                .send_to(b"ping", addr("10.96.0.20:53"))
                .expect("send");
        }
        let mut conntrack = Conntrack::open().expect("a ctnetlink socket");
        let started = Instant::now();
        let dump = conntrack
            .dump(IpFamily::V4, Some(Protocol::Udp))
            .expect("a dump");
        eprintln!(
            "UDP dump: {} entries in {:?}",
            dump.flows.len(),
            started.elapsed()
        );
        assert!(!dump.interrupted && dump.skipped == 0);
        let to_service: Vec<&Flow> = dump
            .flows
            .iter()
            .filter(|f| f.original.dst == "10.96.0.20".parse::<IpAddr>().expect("an address"))
            .collect();
        assert_eq!(to_service.len(), FLOWS);
        let mut ports: Vec<u16> = to_service.iter().map(|f| f.original.src_port).collect();
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), FLOWS, "each entry once");

        // Its one endpoint stopped serving: every entry goes.
        let (services, endpoints) = dns_state("10.96.0.20", 0, &[("10.244.1.5", false)]);
        let metrics = ConntrackMetrics::register(&prometheus::Registry::new()).expect("metrics");
        let cleaned = clean_stale(IpFamily::V4, &services, &endpoints, &metrics).expect("cleaned");
        eprintln!(
            "clean_stale: {} deleted in {:?}",
            cleaned.deleted, cleaned.duration
        );
        assert_eq!(cleaned.deleted, FLOWS);
        assert_eq!(metrics.deleted_entries(IpFamily::V4), FLOWS as u64);
    });
    assert!(netns.listed("ipv4", "udp").is_empty());
}

#[test]
fn clean_stale_removes_only_entries_whose_endpoint_stopped_serving() {
    if !environment_ready() {
        return;
    }
    let netns = dns_namespace();
    let kept = udp_flow("10.244.1.1:40001", "10.96.0.10:53", "10.244.1.5:5353");
    let stale = udp_flow("10.244.1.1:40002", "10.96.0.10:53", "10.244.1.6:5353");
    let node_port = udp_flow("10.244.1.1:40003", "10.0.0.2:30053", "10.244.1.6:5353");
    // To the endpoint's own address, not through the Service: not the reconciler's.
    let direct = udp_flow("10.244.1.1:40004", "10.244.1.6:5353", "10.244.1.6:5353");
    // TCP to the same Service and endpoint: never touched.
    let tcp = (
        Tuple {
            protocol: TCP,
            ..stale.0
        },
        Tuple {
            protocol: TCP,
            ..stale.1
        },
    );
    netns.insert_tcp(&tcp.0, &tcp.1);
    let metrics = ConntrackMetrics::register(&prometheus::Registry::new()).expect("metrics");
    let cleaned = netns.inside(|| {
        let (endpoint_5, endpoint_6) = (bind("10.244.1.5:5353"), bind("10.244.1.6:5353"));
        exchange(&bind("10.244.1.1:40001"), "10.96.0.10:53", &endpoint_5);
        exchange(&bind("10.244.1.1:40002"), "10.96.0.10:53", &endpoint_6);
        exchange(&bind("10.244.1.1:40003"), "10.0.0.2:30053", &endpoint_6);
        exchange(&bind("10.244.1.1:40004"), "10.244.1.6:5353", &endpoint_6);
        let before = Conntrack::open()
            .and_then(|mut c| c.dump(IpFamily::V4, Some(Protocol::Udp)))
            .expect("a dump");
        for flow in [&kept, &stale, &node_port, &direct] {
            assert!(
                find(&before.flows, flow).is_some(),
                "{flow:?} in {before:?}"
            );
        }
        // .6 is terminating and no longer serving; .5 still serves.
        let (services, endpoints) = dns_state(
            "10.96.0.10",
            30053,
            &[("10.244.1.5", true), ("10.244.1.6", false)],
        );
        clean_stale(IpFamily::V4, &services, &endpoints, &metrics).expect("cleaned")
    });
    eprintln!(
        "clean_stale: {} deleted in {:?}",
        cleaned.deleted, cleaned.duration
    );
    assert_eq!(cleaned.deleted, 2);
    assert_eq!(metrics.deleted_entries(IpFamily::V4), 2);
    assert_eq!(metrics.syncs(IpFamily::V4), 1);
    let mut udp = netns.listed("ipv4", "udp");
    udp.sort_by_key(|(original, _)| original.src_port);
    assert_eq!(udp, [kept, direct]);
    assert_eq!(netns.listed("ipv4", "tcp"), [tcp]);
}

#[test]
fn clean_stale_works_on_ipv6_entries() {
    if !environment_ready() {
        return;
    }
    let netns = Netns::new();
    for address in ["fd00:244::1", "fd00:244::5", "fd00:244::6"] {
        netns.ip(&[
            "-6",
            "addr",
            "add",
            &format!("{address}/128"),
            "dev",
            "lo",
            "nodad",
        ]);
    }
    netns.ip(&["-6", "route", "add", "fd00:96::/64", "dev", "lo"]);
    netns.nft(
        "table ip6 kpct {
            chain out {
                type nat hook output priority -100;
                ip6 daddr fd00:96::10 udp dport 53 udp sport 40001 dnat to [fd00:244::5]:5353
                ip6 daddr fd00:96::10 udp dport 53 udp sport 40002 dnat to [fd00:244::6]:5353
            }
        }",
    );
    let kept = udp_flow(
        "[fd00:244::1]:40001",
        "[fd00:96::10]:53",
        "[fd00:244::5]:5353",
    );
    let stale = udp_flow(
        "[fd00:244::1]:40002",
        "[fd00:96::10]:53",
        "[fd00:244::6]:5353",
    );
    let metrics = ConntrackMetrics::register(&prometheus::Registry::new()).expect("metrics");
    let cleaned = netns.inside(|| {
        let (endpoint_5, endpoint_6) = (bind("[fd00:244::5]:5353"), bind("[fd00:244::6]:5353"));
        exchange(
            &bind("[fd00:244::1]:40001"),
            "[fd00:96::10]:53",
            &endpoint_5,
        );
        exchange(
            &bind("[fd00:244::1]:40002"),
            "[fd00:96::10]:53",
            &endpoint_6,
        );
        let dump = Conntrack::open()
            .and_then(|mut c| c.dump(IpFamily::V6, Some(Protocol::Udp)))
            .expect("a dump");
        assert!(find(&dump.flows, &kept).is_some() && find(&dump.flows, &stale).is_some());
        let (services, endpoints) = dns_state(
            "fd00:96::10",
            0,
            &[("fd00:244::5", true), ("fd00:244::6", false)],
        );
        clean_stale(IpFamily::V6, &services, &endpoints, &metrics).expect("cleaned")
    });
    eprintln!(
        "clean_stale (IPv6): {} deleted in {:?}",
        cleaned.deleted, cleaned.duration
    );
    assert_eq!(cleaned.deleted, 1);
    assert_eq!(metrics.deleted_entries(IpFamily::V6), 1);
    assert_eq!(netns.listed("ipv6", "udp"), [kept]);
}
