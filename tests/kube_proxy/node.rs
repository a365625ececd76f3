//! One node in network namespaces: the node itself, a client on its eth0, two pods on
//! point-to-point veths, and an echo server in each pod.
//!
//! ```text
//! client  eth0 10.0.0.2/24 fd00:10::2/64, default via the node
//!   | veth
//! node    eth0 10.0.0.1/24 fd00:10::1/64 (the Node's InternalIPs); ip_forward, icmp_ratelimit=0;
//!   |     default route into a portless bridge (br0), not back out eth0
//!   | vp1: 10.244.1.1/32 fd00:10:244:1::1/128 fe80::1     | vp2: the same
//! pod1    eth0 10.244.1.2/32 fd00:10:244:1::2/128         pod2  10.244.1.3 fd00:10:244:1::3
//!         default via 10.244.1.1 onlink, via fe80::1
//! ```
//!
//! Why: /32 pod addresses with onlink default routes, because pod-to-pod traffic through a
//! Service times out with /24s on point-to-point veths (ARP for the peer goes unanswered). A
//! default route that points back out eth0 makes the node send an ICMP redirect first, and the
//! ICMP rate limit then swallows the port-unreachable of a reject, so a refusal looks like a
//! timeout; hence the bridge and icmp_ratelimit=0, and a larger node-wide ICMP budget. (This
//! kernel has no dummy interfaces.)
//!
//! Every name this run creates starts with [`prefix`], which carries the test process's pid, so
//! the namespaces of a crashed run can be told apart from anyone else's.

use std::path::Path;
use std::time::Duration;

use super::procs::{must, ns_must, run, Proc};

/// The namespace name prefix of every run of this harness; followed by the pid.
pub const PREFIX: &str = "kpsbs";

pub fn prefix() -> String {
    format!("{PREFIX}{}", std::process::id())
}

/// The pods: name, IPv4, IPv6, the node-side veth.
pub const PODS: [(&str, &str, &str, &str); 2] = [
    ("pod1", "10.244.1.2", "fd00:10:244:1::2", "vp1"),
    ("pod2", "10.244.1.3", "fd00:10:244:1::3", "vp2"),
];
pub const NODE_IP: &str = "10.0.0.1";
pub const NODE_IP6: &str = "fd00:10::1";
pub const CLIENT_IP: &str = "10.0.0.2";
pub const CLIENT_IP6: &str = "fd00:10::2";
/// The node's address on the pod veths: what a pod sees when the node masquerades.
pub const NODE_POD_SIDE_IP: &str = "10.244.1.1";
pub const NODE_POD_SIDE_IP6: &str = "fd00:10:244:1::1";
/// The ports every echo server listens on, TCP and UDP, both families.
pub const ECHO_PORTS: [u16; 3] = [8080, 8081, 8082];

/// The namespaces of one side. Dropping it deletes them (after the processes in them stopped:
/// the [`Proc`]s it holds drop first).
pub struct NodeNs {
    pub side: String,
    pub node: String,
    pub client: String,
    pub pods: Vec<String>,
    echo: Vec<Proc>,
    created: Vec<String>,
}

impl NodeNs {
    pub fn name(side: &str, role: &str) -> String {
        format!("{}-{side}-{role}", prefix())
    }

    /// The namespace a probe source runs in.
    pub fn ns_of(&self, source: &str) -> &str {
        match source {
            "client" => &self.client,
            "node" => &self.node,
            "pod1" => &self.pods[0],
            "pod2" => &self.pods[1],
            _ => panic!("unknown source {source}"),
        }
    }

    pub fn create(side: &str, dir: &Path, agent: &Path) -> NodeNs {
        let mut n = NodeNs {
            side: side.to_string(),
            node: NodeNs::name(side, "node"),
            client: NodeNs::name(side, "client"),
            pods: PODS.iter().map(|p| NodeNs::name(side, p.0)).collect(),
            echo: Vec::new(),
            created: Vec::new(),
        };
        // Recorded one by one, so a failure half-way still deletes what exists.
        let all: Vec<String> = [n.node.clone(), n.client.clone()]
            .into_iter()
            .chain(n.pods.clone())
            .collect();
        for ns in &all {
            must("ip", &["netns", "add", ns]);
            n.created.push(ns.clone());
            must("ip", &["-n", ns, "link", "set", "lo", "up"]);
        }
        let (node, client) = (n.node.clone(), n.client.clone());
        let ip = |ns: &str, args: &[&str]| {
            let mut a = vec!["-n", ns];
            a.extend_from_slice(args);
            must("ip", &a);
        };
        // client <-> node
        ip(
            &node,
            &[
                "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", &client,
            ],
        );
        ip(
            &node,
            &["addr", "add", &format!("{NODE_IP}/24"), "dev", "eth0"],
        );
        ip(
            &node,
            &[
                "addr",
                "add",
                &format!("{NODE_IP6}/64"),
                "dev",
                "eth0",
                "nodad",
            ],
        );
        ip(
            &client,
            &["addr", "add", &format!("{CLIENT_IP}/24"), "dev", "eth0"],
        );
        ip(
            &client,
            &[
                "addr",
                "add",
                &format!("{CLIENT_IP6}/64"),
                "dev",
                "eth0",
                "nodad",
            ],
        );
        ip(&node, &["link", "set", "eth0", "up"]);
        ip(&client, &["link", "set", "eth0", "up"]);
        // The client sends everything (Service, external and LB IPs included) to the node.
        ip(&client, &["route", "add", "default", "via", NODE_IP]);
        ip(&client, &["-6", "route", "add", "default", "via", NODE_IP6]);
        ip(&node, &["link", "add", "br0", "type", "bridge"]);
        ip(&node, &["link", "set", "br0", "up"]);
        ip(&node, &["route", "add", "default", "dev", "br0"]);
        ip(&node, &["-6", "route", "add", "default", "dev", "br0"]);
        ns_must(
            &node,
            &[
                "sysctl",
                "-qw",
                "net.ipv4.ip_forward=1",
                "net.ipv4.icmp_ratelimit=0",
                "net.ipv6.conf.all.forwarding=1",
                "net.ipv6.icmp.ratelimit=0",
                // The node-wide ICMP budget (50 at once by default) is per namespace too; a
                // scenario's parallel attempts against rejecting rules would exceed it.
                "net.ipv4.icmp_msgs_per_sec=100000",
                "net.ipv4.icmp_msgs_burst=100000",
            ],
        );
        for (i, (_, v4, v6, veth)) in PODS.iter().enumerate() {
            let pod = n.pods[i].clone();
            ip(
                &node,
                &[
                    "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", &pod,
                ],
            );
            ip(
                &node,
                &[
                    "addr",
                    "add",
                    &format!("{NODE_POD_SIDE_IP}/32"),
                    "dev",
                    veth,
                ],
            );
            ip(
                &node,
                &[
                    "addr",
                    "add",
                    &format!("{NODE_POD_SIDE_IP6}/128"),
                    "dev",
                    veth,
                    "nodad",
                ],
            );
            ip(&node, &["addr", "add", "fe80::1/64", "dev", veth, "nodad"]);
            ip(&node, &["link", "set", veth, "up"]);
            ip(&pod, &["addr", "add", &format!("{v4}/32"), "dev", "eth0"]);
            ip(
                &pod,
                &["addr", "add", &format!("{v6}/128"), "dev", "eth0", "nodad"],
            );
            ip(&pod, &["link", "set", "eth0", "up"]);
            ip(
                &pod,
                &[
                    "route",
                    "add",
                    "default",
                    "via",
                    NODE_POD_SIDE_IP,
                    "dev",
                    "eth0",
                    "onlink",
                ],
            );
            ip(
                &pod,
                &[
                    "-6", "route", "add", "default", "via", "fe80::1", "dev", "eth0",
                ],
            );
            ip(&node, &["route", "add", &format!("{v4}/32"), "dev", veth]);
            ip(
                &node,
                &["-6", "route", "add", &format!("{v6}/128"), "dev", veth],
            );
        }
        for (i, (name, ..)) in PODS.iter().enumerate() {
            let ports: Vec<String> = ECHO_PORTS.iter().map(|p| p.to_string()).collect();
            // The side in the name: a probe checks that the answer came from its own side.
            let tagged = format!("{name}@{side}");
            let mut argv = vec![
                python(),
                agent.to_str().expect("utf-8 path"),
                "serve",
                &tagged,
            ];
            argv.extend(ports.iter().map(String::as_str));
            let mut p = Proc::start(
                &format!("echo {name} ({side})"),
                Some(&n.pods[i]),
                &argv,
                &[],
                &dir.join(format!("{side}-{name}-echo.log")),
            );
            p.wait_for_log("ready", Duration::from_secs(20))
                .unwrap_or_else(|e| panic!("{e}"));
            n.echo.push(p);
        }
        n
    }

    /// Another address for the client, on its eth0 in the node's /24 (a second client to the
    /// node, for what depends on the client's address).
    pub fn add_client_address(&self, ip: &str) {
        must(
            "ip",
            &[
                "-n",
                &self.client,
                "addr",
                "add",
                &format!("{ip}/24"),
                "dev",
                "eth0",
            ],
        );
    }

    /// Forgets every connection the node tracks, so that a scenario starts without the last
    /// one's NAT bindings.
    pub fn flush_conntrack(&self) {
        // "0 flow entries" is reported on stderr and is not an error.
        let _ = run("ip", &["netns", "exec", &self.node, "conntrack", "-F"]);
    }
}

impl Drop for NodeNs {
    fn drop(&mut self) {
        self.echo.clear();
        for ns in self.created.iter().rev() {
            if let Err(e) = run("ip", &["netns", "del", ns]) {
                eprintln!("cleanup: {e}");
            }
        }
    }
}

/// The Python interpreter for the agent: the system one when present (a version manager's
/// shim on PATH is slower to start, and the harness starts many probes).
pub fn python() -> &'static str {
    if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

/// The pid in a name `<PREFIX><pid><sep>…` if that process no longer runs.
fn dead_owner(name: &str, sep: char) -> Option<&str> {
    let (pid, _) = name.strip_prefix(PREFIX)?.split_once(sep)?;
    if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    (!Path::new(&format!("/proc/{pid}")).exists()).then_some(pid)
}

/// Deletes what crashed earlier runs of this harness left: namespaces named `<PREFIX><pid>-…`
/// whose pid no longer runs, after killing the processes still inside them, and their
/// directories `<tmp>/<PREFIX><pid>.…`. Those of a live process, and every name without this
/// prefix, are left alone. (Their apiservers were stopped by start.sh's watchdog.)
pub fn clean_leftovers() {
    if let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if dead_owner(&name, '.').is_some() {
                eprintln!(
                    "cleanup: deleting {} left by a dead run",
                    e.path().display()
                );
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    let Ok(list) = run("ip", &["netns", "list"]) else {
        return;
    };
    for line in list.lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let Some(pid) = dead_owner(name, '-') else {
            continue;
        };
        if let Ok(pids) = run("ip", &["netns", "pids", name]) {
            for p in pids.split_whitespace() {
                let _ = run("kill", &["-KILL", p]);
            }
        }
        eprintln!("cleanup: deleting namespace {name} left by dead process {pid}");
        let _ = run("ip", &["netns", "del", name]);
    }
}
