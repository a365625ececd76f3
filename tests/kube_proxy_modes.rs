//! Every `--proxy-mode` value gets its answer, with real processes in network namespaces and
//! the real kube-apiserver (the side-by-side harness, tests/kube_proxy/): ours always programs
//! nftables, and answers iptables and ipvs modes with what those modes show to traffic;
//! upstream kube-proxy v1.37.2 runs beside it where it can, in its iptables mode.
//!
//! One apiserver serves three sets of sides, one after the other:
//! 1. a node FORWARD policy of DROP (as Docker sets it) in every node: upstream in iptables
//!    mode, ours in iptables mode, ours in ipvs mode with rr. Services and NodePorts answer the
//!    client as upstream's do, only because of the KUBE-FORWARD chain (a control run without
//!    its jump times out, on every side); NodePorts on every local address and on 127.0.0.1
//!    (route_localnet=1); ipvs rr alternates per new connection; then `--cleanup`, ours and
//!    upstream's, on what each proxy left;
//! 2. nftables mode, ours and upstream's (equal tables; NodePorts on the primary address only;
//!    no localhost NodePorts; a FORWARD policy of DROP blocks Services, as upstream documents),
//!    and ipvs mode with sh (one endpoint per client address);
//! 3. the command lines operators run: the reference unit's (ipvs, wrr, --logtostderr) and
//!    kubeadm's DaemonSet with kubeadm's own KubeProxyConfiguration (mode empty), upstream
//!    running the latter too, and the mode left unset on the command line.
//!
//! Apart from it, without an apiserver: `--proxy-mode=userspace`/`kernelspace` get upstream's
//! error (upstream's binary run with the same flags), and `--ipvs-scheduler=lc` is refused.
//!
//! Needs root, iproute2, nftables, iptables (with ip6tables and the -save/-restore tools),
//! conntrack, socat, setpriv, python3 and Go (tests/kube/build.sh); skipped without them,
//! except under CI=true, where that fails. `KP_KEEP=1` keeps the run's directory.
#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod kube_proxy;
#[allow(dead_code)] // shared with tests that use all of it
mod support {
    pub mod netns;
}

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use kube_proxy::api::{Ep, Proto::*, Slice, Svc};
use kube_proxy::harness::{all, p, Harness, Rules, SideSetup};
use kube_proxy::probe;
use kube_proxy::procs::{run, wait_until};
use kube_proxy::proxy::Impl;

const POD1: &str = "10.244.1.2";
const POD2: &str = "10.244.1.3";
/// The node's primary address (its Node object's first InternalIP).
const NODE: &str = "10.0.0.1";
/// Another address of the node (on its pod veths): iptables and ipvs modes serve NodePorts
/// here too, nftables mode by default only on the primary address.
const NODE_OTHER: &str = "10.244.1.1";
const CLUSTER_IP: &str = "10.96.20.1";
const NODEPORT_IP: &str = "10.96.20.2";
const NODE_PORT: u16 = 30080;

/// Both pods answering, each seeing the node's masquerade address.
const BOTH_MASQ: &[&str] = &["pod1<-masq", "pod2<-masq"];

const FORWARD_DROP: &[&str] = &["iptables", "-P", "FORWARD", "DROP"];
/// The rule our proxy and upstream's iptables and ipvs modes put at the top of FORWARD.
const FORWARD_JUMP: &str =
    "-A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD";

/// kubeadm's KubeProxyConfiguration, as its ConfigMap holds it (tests/fixtures; kubeadm writes
/// every field); only the kubeconfig's path is this test's.
const KUBEADM_CONFIG: &str = include_str!("fixtures/kube-proxy/kubeadm-config.conf");
const KUBEADM_KUBECONFIG: &str = "/var/lib/kube-proxy/kubeconfig.conf";

/// What upstream v1.37.2 logs (as an error) and posts as a KubeProxyDefaultMode Event when no
/// mode was given; read from its log in the run, this is only to find the line.
const DEFAULTED_MODE_START: &str = "No kube-proxy mode specified: defaulting to 'iptables'.";

fn artefacts() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kube-proxy-modes")
}

/// Whether the iptables tools are here (the harness's own preflight checks the rest).
fn iptables_preflight() -> bool {
    let missing: Vec<&str> = [
        "iptables",
        "ip6tables",
        "iptables-save",
        "ip6tables-save",
        "iptables-restore",
        "ip6tables-restore",
    ]
    .into_iter()
    .filter(|t| {
        !Command::new(t)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
    .collect();
    if missing.is_empty() {
        return true;
    }
    let msg = format!("the proxy-mode tests need {}", missing.join(", "));
    assert!(
        !std::env::var("CI").is_ok_and(|v| v == "true"),
        "CI=true: {msg}"
    );
    eprintln!("SKIPPED: {msg} (CI=true makes this a failure)");
    false
}

// ------------------------------------------------------------------------------------ sides

/// A side with the harness's flags but NodePort addresses left to the mode's default.
fn side(label: &'static str, which: Impl, mode: &str) -> SideSetup {
    SideSetup::new(label, which)
        .without("--nodeport-addresses")
        .mode(mode)
}

/// Upstream in iptables mode, ours in iptables mode and in ipvs mode with rr, each node with a
/// FORWARD policy of DROP. The labels name the namespaces, so that two tests of this binary
/// running at once use their own.
fn forward_drop_sides(labels: [&'static str; 3]) -> Vec<SideSetup> {
    let [up, ipt, rr] = labels;
    vec![
        side(up, Impl::Upstream, "iptables").node(FORWARD_DROP),
        side(ipt, Impl::Ours, "iptables").node(FORWARD_DROP),
        side(rr, Impl::Ours, "ipvs")
            .flag("--ipvs-scheduler=rr")
            .node(FORWARD_DROP),
    ]
}

fn nftables_sides() -> Vec<SideSetup> {
    vec![
        side("upnft", Impl::Upstream, "nftables"),
        side("nft", Impl::Ours, "nftables"),
        side("sh", Impl::Ours, "ipvs").flag("--ipvs-scheduler=sh"),
    ]
}

/// The reference unit's command line, unchanged but for the node's address and name, the pod
/// CIDR and the kubeconfig's path.
const UNIT_ARGS: &[&str] = &[
    "--bind-address=10.0.0.1",
    "--hostname-override=node-a",
    "--cluster-cidr=10.244.0.0/16",
    "--kubeconfig={kubeconfig}",
    "--logtostderr=true",
    "--v=2",
    "--ipvs-scheduler=wrr",
    "--ipvs-min-sync-period=5s",
    "--ipvs-sync-period=5s",
    "--proxy-mode=ipvs",
];

/// kubeadm's DaemonSet command line (`$(NODE_NAME)` is what the kubelet puts there), its
/// configuration file in the run's directory.
const KUBEADM_ARGS: &[&str] = &[
    "--config={dir}/kubeadm-config.conf",
    "--hostname-override=node-a",
];

fn command_line_sides() -> Vec<SideSetup> {
    let kubeadm = KUBEADM_CONFIG.replace(KUBEADM_KUBECONFIG, "{kubeconfig}");
    assert_ne!(
        kubeadm, KUBEADM_CONFIG,
        "the fixture names kubeadm's kubeconfig"
    );
    vec![
        SideSetup::new("upadm", Impl::Upstream)
            .exact(KUBEADM_ARGS)
            .file("kubeadm-config.conf", &kubeadm)
            .rules(Rules::Iptables),
        SideSetup::new("adm", Impl::Ours)
            .exact(KUBEADM_ARGS)
            .file("kubeadm-config.conf", &kubeadm),
        SideSetup::new("unit", Impl::Ours).exact(UNIT_ARGS),
        side("unset", Impl::Ours, ""),
    ]
}

/// The command lines without `--conntrack-max-per-core=0` raise nf_conntrack_max (read-only
/// in a network namespace) and the conntrack hash size (one for the whole machine) when they
/// are below what the defaults ask for. Only where both are high enough already do they
/// run here: then neither proxy writes either.
fn conntrack_defaults_hold() -> Result<(), String> {
    let read = |p: &str| -> Result<u64, String> {
        std::fs::read_to_string(p)
            .map_err(|e| format!("{p}: {e}"))?
            .trim()
            .parse()
            .map_err(|e| format!("{p}: {e}"))
    };
    let cpus = run("nproc", &[])?
        .trim()
        .parse::<u64>()
        .map_err(|e| e.to_string())?;
    // Upstream's defaults: 32768 per CPU, at most 1048576, at least 131072.
    let want = (32768 * cpus).clamp(131_072, 1 << 20);
    let max = read("/proc/sys/net/netfilter/nf_conntrack_max")?;
    let hash = read("/sys/module/nf_conntrack/parameters/hashsize")?;
    if max < want || hash < want / 4 {
        return Err(format!(
            "nf_conntrack_max {max} and hashsize {hash} are below the defaults' {want} and {}: \
             the unit's and kubeadm's command lines would change the machine's conntrack table",
            want / 4
        ));
    }
    Ok(())
}

// ------------------------------------------------------------------------------------ the test

#[test]
fn every_proxy_mode_gets_its_answer() {
    if !kube_proxy::preflight() || !iptables_preflight() {
        return;
    }
    let t0 = std::time::Instant::now();
    let mut h = Harness::start_with(&artefacts(), &forward_drop_sides(["up", "ipt", "rr"]), &[]);
    h.scenario("forward-drop-services", forward_drop_services);
    h.scenario("forward-chain", forward_chain);
    h.scenario("forward-drop-control", forward_drop_control);
    h.scenario("ipvs-rr-alternates", ipvs_rr_alternates);
    h.scenario("localhost-nodeports-iptables", localhost_nodeports_iptables);
    h.scenario("mode-events", mode_events);
    h.scenario("cleanup", cleanup);

    h.restart_sides(&nftables_sides());
    h.scenario("nftables-mode", nftables_mode);
    h.scenario("ipvs-sh-by-client", ipvs_sh_by_client);
    h.scenario("nftables-forward-drop", nftables_forward_drop);

    match conntrack_defaults_hold() {
        Ok(()) => {
            h.restart_sides(&command_line_sides());
            h.scenario("command-lines", command_lines);
            h.scenario("defaulted-mode", defaulted_mode);
        }
        Err(why) => {
            assert!(
                !std::env::var("CI").is_ok_and(|v| v == "true"),
                "CI=true: {why}"
            );
            eprintln!("SKIPPED the command-line scenarios: {why}");
        }
    }

    let timings: Vec<String> = h
        .timings
        .iter()
        .map(|(n, d)| format!("  {n:<40} {:>6.2} s", d.as_secs_f64()))
        .collect();
    let summary = format!(
        "{}\ntimings:\n{}\n  total {:.1} s\n",
        h.report_table(),
        timings.join("\n"),
        t0.elapsed().as_secs_f64()
    );
    eprintln!("{summary}");
    let _ = std::fs::write(artefacts().join("summary.txt"), &summary);
    if !h.failures.is_empty() {
        eprintln!("logs: {}", h.save_logs().display());
    }
    if std::env::var("KP_KEEP").is_ok_and(|v| v == "1") {
        eprintln!("KP_KEEP=1: kept {}", h.keep_dir().display());
    }
    let failures = std::mem::take(&mut h.failures);
    drop(h);
    assert!(
        failures.is_empty(),
        "{} failure(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

// ------------------------------------------------------------------------------------ helpers

/// A ClusterIP Service and a NodePort Service, each with both pods ready on this node.
fn web_services(h: &mut Harness) {
    h.api()
        .create_service(&Svc::cluster_ip("web", CLUSTER_IP).port("http", Tcp, 80, 8080));
    h.api().create_service(
        &Svc::node_port("np", NODEPORT_IP).port_np("http", Tcp, 80, 8080, NODE_PORT),
    );
    for (slice, svc) in [("web-1", "web"), ("np-1", "np")] {
        h.api().create_slice(
            &Slice::v4(slice, svc)
                .port("http", Tcp, 8080)
                .ep(Ep::ready(POD1))
                .ep(Ep::ready(POD2)),
        );
    }
    h.synced();
}

/// A command in a side's node namespace that must work.
fn node_must(h: &Harness, label: &str, args: &[&str]) -> String {
    h.side(label)
        .node_run(args)
        .unwrap_or_else(|e| panic!("side {label}: {e}"))
}

fn route_localnet(h: &Harness, label: &str) -> String {
    node_must(
        h,
        label,
        &["cat", "/proc/sys/net/ipv4/conf/all/route_localnet"],
    )
    .trim()
    .to_string()
}

/// `iptables -S <chain>` (or ip6tables) in a side's node; the error's text when the chain does
/// not exist.
fn rules_of(h: &Harness, label: &str, iptables: &str, chain: &str) -> String {
    h.side(label)
        .node_run(&[iptables, "-w", "-S", chain])
        .unwrap_or_else(|e| e)
}

fn flush_conntrack(h: &Harness) {
    for s in &h.sides {
        s.node.flush_conntrack();
    }
}

/// Records `what` as a failure of the scenario unless `ok`.
fn check(h: &mut Harness, ok: bool, what: String) {
    if !ok {
        h.fail(what);
    }
}

/// An upstream log line's message: klog's `"message"` or `err="…"`, unquoted.
fn klog_message(line: &str) -> String {
    let quoted = line
        .split_once("err=\"")
        .map(|(_, rest)| rest)
        .or_else(|| line.split_once("] \"").map(|(_, rest)| rest))
        .unwrap_or(line);
    let mut out = String::new();
    let mut chars = quoted.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.extend(chars.next()),
            '"' => break,
            c => out.push(c),
        }
    }
    out
}

// ------------------------------------------------------------------------------------ 1: FORWARD DROP

/// A ClusterIP and a NodePort Service, under a FORWARD policy of DROP, in iptables mode
/// (ours and upstream's) and ipvs mode (ours): the client and the node get the same answers on
/// every side, and the pods see what upstream's iptables mode shows them.
fn forward_drop_services(h: &mut Harness) {
    web_services(h);
    h.probe(&[
        p("client", "tcp", CLUSTER_IP, 80, all(BOTH_MASQ)),
        p("client", "tcp", NODE, NODE_PORT, all(BOTH_MASQ)),
        // iptables and ipvs modes serve NodePorts on every local address.
        p("client", "tcp", NODE_OTHER, NODE_PORT, all(BOTH_MASQ)),
        p("client", "tcp", NODEPORT_IP, 80, all(BOTH_MASQ)),
        // Not forwarded: the node's own connections never meet FORWARD.
        p("node", "tcp", CLUSTER_IP, 80, all(BOTH_MASQ)),
        p("node", "tcp", NODE, NODE_PORT, all(BOTH_MASQ)),
    ]);
    // A pod's connections through the Service: see the hairpin test below (a known bug).
}

/// What `iptables -S` shows of FORWARD and KUBE-FORWARD once the proxies run: ours adds the
/// jump and upstream's chain, in both families, and nothing else to FORWARD.
fn forward_chain(h: &mut Harness) {
    // Upstream's INVALID rule counts its drops with nfacct where the kernel has it (a
    // metric); iptables-nft prints that match with two spaces.
    let normalise = |text: &str| -> Vec<String> {
        text.lines()
            .map(|l| {
                l.split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ")
                    .replace(" -m nfacct --nfacct-name ct_state_invalid_dropped_pkts", "")
            })
            .collect()
    };
    for iptables in ["iptables", "ip6tables"] {
        let upstream_chain = rules_of(h, "up", iptables, "KUBE-FORWARD");
        let upstream_forward = rules_of(h, "up", iptables, "FORWARD");
        eprintln!("[up] {iptables} -S FORWARD:\n{upstream_forward}\n[up] {iptables} -S KUBE-FORWARD:\n{upstream_chain}");
        let ok = upstream_forward.lines().any(|l| l == FORWARD_JUMP);
        check(
            h,
            ok,
            format!(
                "upstream's {iptables} FORWARD has no jump to KUBE-FORWARD:\n{upstream_forward}"
            ),
        );
        for label in ["ipt", "rr"] {
            let forward = rules_of(h, label, iptables, "FORWARD");
            let chain = rules_of(h, label, iptables, "KUBE-FORWARD");
            eprintln!("[{label}] {iptables} -S FORWARD:\n{forward}\n[{label}] {iptables} -S KUBE-FORWARD:\n{chain}");
            let policy = if iptables == "iptables" {
                "-P FORWARD DROP"
            } else {
                "-P FORWARD ACCEPT"
            };
            let want_forward = format!("{policy}\n{FORWARD_JUMP}");
            check(
                h,
                forward.trim() == want_forward,
                format!(
                    "side {label}: {iptables} -S FORWARD is\n{forward}\nwanted\n{want_forward}"
                ),
            );
            check(
                h,
                normalise(&chain) == normalise(&upstream_chain),
                format!(
                    "side {label}: {iptables} -S KUBE-FORWARD differs from upstream's:\n{chain}\nupstream's:\n{upstream_chain}"
                ),
            );
        }
    }
}

/// The control: without the jump to KUBE-FORWARD, the same forwarded connections time out on
/// every side (upstream's included); the node's own still answer. Putting the jump back
/// brings the answers back, so the chain is what lets traffic through.
fn forward_drop_control(h: &mut Harness) {
    web_services(h);
    let jump = [
        "FORWARD",
        "-m",
        "comment",
        "--comment",
        "kubernetes forwarding rules",
        "-j",
        "KUBE-FORWARD",
    ];
    let labels: Vec<&'static str> = h.sides.iter().map(|s| s.label).collect();
    for label in &labels {
        node_must(h, label, &[&["iptables", "-w", "-D"][..], &jump].concat());
    }
    flush_conntrack(h);
    h.probe(&[
        p("client", "tcp", CLUSTER_IP, 80, all(&["TIMEOUT"])),
        p("client", "tcp", NODE, NODE_PORT, all(&["TIMEOUT"])),
        p("node", "tcp", CLUSTER_IP, 80, all(BOTH_MASQ)),
    ]);
    for label in &labels {
        node_must(h, label, &[&["iptables", "-w", "-I"][..], &jump].concat());
    }
    flush_conntrack(h);
    h.probe(&[
        p("client", "tcp", CLUSTER_IP, 80, all(BOTH_MASQ)),
        p("client", "tcp", NODE, NODE_PORT, all(BOTH_MASQ)),
    ]);
}

/// ipvs mode with rr: one client's new connections, one after another, alternate strictly
/// between the two endpoints (round robin per new connection). Upstream's and ours' iptables
/// mode pick at random; their sequences are only reported.
fn ipvs_rr_alternates(h: &mut Harness) {
    web_services(h);
    let target = probe::target("tcp", CLUSTER_IP, 80);
    for label in ["rr", "ipt", "up"] {
        let s = h.side(label);
        let seq = probe::sequence(label, &s.node.client, &h.agent, &target, 10, None);
        eprintln!("[{label}] 10 connections one after another: {seq:?}");
        h.report.push(kube_proxy::harness::Row {
            scenario: "ipvs-rr-alternates".into(),
            step: 0,
            from: "client".into(),
            target: target.clone(),
            side: s.label,
            summary: format!("in order: {}", seq.join(" ")),
        });
        if label != "rr" {
            continue;
        }
        let alternates = seq.len() == 10
            && seq.iter().all(|t| BOTH_MASQ.contains(&t.as_str()))
            && seq.windows(2).all(|w| w[0] != w[1]);
        check(
            h,
            alternates,
            format!("ipvs rr: 10 new connections do not alternate strictly: {seq:?}"),
        );
    }
}

/// iptables mode answers NodePorts on 127.0.0.1 from the node itself, with route_localnet=1,
/// ours as upstream's; ipvs mode has no localhost NodePorts (upstream's flag help: "localhost
/// NodePorts are never allowed with other proxy modes") and leaves route_localnet alone.
fn localhost_nodeports_iptables(h: &mut Harness) {
    web_services(h);
    h.probe_on(
        &["up", "ipt"],
        &[p("node", "tcp", "127.0.0.1", NODE_PORT, all(BOTH_MASQ))],
    );
    h.probe_on(
        &["rr"],
        &[p("node", "tcp", "127.0.0.1", NODE_PORT, all(&["REFUSED"]))],
    );
    for (label, want) in [("up", "1"), ("ipt", "1"), ("rr", "0")] {
        let got = route_localnet(h, label);
        check(
            h,
            got == want,
            format!("side {label}: route_localnet is {got}, wanted {want}"),
        );
    }
}

/// Ours says at start, in an Event about the Node, what serves the mode asked for.
fn mode_events(h: &mut Harness) {
    let events = wait_until(
        "our Events saying what serves the iptables and ipvs modes",
        Duration::from_secs(10),
        Duration::from_millis(200),
        || {
            let notes: Vec<String> = h
                .kube
                .node_events()
                .iter()
                .filter(|e| e["reason"] == "ProxyModeServedByNftables")
                .filter_map(|e| e["note"].as_str().map(str::to_string))
                .collect();
            let both = ["the iptables mode", "the ipvs mode"]
                .iter()
                .all(|m| notes.iter().any(|n| n.starts_with(m)));
            both.then_some(notes)
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("our mode Events: {events:#?}");
    for label in ["ipt", "rr"] {
        let log = std::fs::read_to_string(&h.side(label).proxy.log).unwrap_or_default();
        check(
            h,
            log.contains("mode is served by nftables rules"),
            format!("side {label}: no log line saying what serves the mode"),
        );
    }
}

/// `kube-proxy --cleanup`, after the proxies stopped: ours removes upstream's iptables
/// leftovers, our KUBE-FORWARD and our tables, and leaves kubelet's KUBE-FIREWALL and the
/// test's own chains; upstream's `--cleanup` on what ours left gives the same.
fn cleanup(h: &mut Harness) {
    web_services(h);
    let labels: Vec<&'static str> = h.sides.iter().map(|s| s.label).collect();
    for label in &labels {
        // Other software's rules: kubelet's chain (upstream's iptables mode writes a copy of
        // it; kubelet's own is what the other nodes get), and one of the test's own in filter
        // and in nat, each jumped to.
        let kubelet = h
            .side(label)
            .node_run(&["iptables", "-w", "-S", "KUBE-FIREWALL"])
            .is_ok();
        let mut commands: Vec<Vec<&str>> = Vec::new();
        if !kubelet {
            commands.push(vec!["iptables", "-w", "-N", "KUBE-FIREWALL"]);
            commands.push(vec![
                "iptables",
                "-w",
                "-A",
                "KUBE-FIREWALL",
                "-d",
                "127.0.0.0/8",
                "!",
                "-s",
                "127.0.0.0/8",
                "-m",
                "comment",
                "--comment",
                "block incoming localnet connections",
                "-m",
                "conntrack",
                "!",
                "--ctstate",
                "RELATED,ESTABLISHED,DNAT",
                "-j",
                "DROP",
            ]);
            commands.push(vec!["iptables", "-w", "-A", "INPUT", "-j", "KUBE-FIREWALL"]);
        }
        for table in ["filter", "nat"] {
            let hook = if table == "nat" {
                "POSTROUTING"
            } else {
                "INPUT"
            };
            commands.push(vec!["iptables", "-w", "-t", table, "-N", "TEST-OWN"]);
            commands.push(vec![
                "iptables",
                "-w",
                "-t",
                table,
                "-A",
                "TEST-OWN",
                "-s",
                "192.0.2.0/24",
                "-j",
                "RETURN",
            ]);
            commands.push(vec![
                "iptables", "-w", "-t", table, "-A", hook, "-j", "TEST-OWN",
            ]);
        }
        commands.push(vec!["ip6tables", "-w", "-N", "TEST-OWN"]);
        commands.push(vec!["ip6tables", "-w", "-A", "INPUT", "-j", "TEST-OWN"]);
        for c in &commands {
            node_must(h, label, c);
        }
        let status = h.side_mut(label).proxy.stop();
        eprintln!("[{label}] proxy stopped: {status:?}");
    }
    let before: Vec<(&str, String)> = labels.iter().map(|l| (*l, saved_rules(h, l))).collect();
    for (label, text) in &before {
        eprintln!("[{label}] before --cleanup:\n{text}");
        for fam in ["ip", "ip6"] {
            let t = h
                .side(label)
                .node_run(&["nft", "list", "table", fam, "kube-proxy"])
                .unwrap_or_else(|e| e);
            eprintln!("[{label}] table {fam} kube-proxy:\n{t}");
        }
    }
    let up_had = &before[0].1;
    check(
        h,
        up_had.contains(":KUBE-SERVICES") && up_had.contains(":KUBE-SVC-"),
        "upstream's iptables mode left no KUBE-SERVICES/KUBE-SVC-* chains to clean up".into(),
    );
    let ours_had = &before[1].1;
    check(
        h,
        ours_had.contains(":KUBE-FORWARD") && ours_had.contains("table ip kube-proxy"),
        "ours left no KUBE-FORWARD or no table to clean up".into(),
    );

    let ours = Impl::Ours.binary(Path::new(""));
    let upstream = Impl::Upstream.binary(&upstream_dir());
    for (label, bin) in [("up", &ours), ("ipt", &ours), ("rr", &upstream)] {
        let who = if bin == &ours { "ours" } else { "upstream's" };
        let (code, out) = cleanup_in(&h.side(label).node.node, bin);
        eprintln!("[{label}] {who} --cleanup: exit {code:?}\n{out}");
        if bin == &ours {
            check(
                h,
                code == Some(0),
                format!("side {label}: our --cleanup exited {code:?}:\n{out}"),
            );
        }
        let after = saved_rules(h, label);
        eprintln!("[{label}] after {who} --cleanup:\n{after}");
        let left: Vec<&str> = after
            .lines()
            .filter(|l| l.starts_with(':') || l.starts_with("-A") || l.starts_with("table"))
            .filter(|l| {
                (l.contains("KUBE-") && !l.contains("KUBE-FIREWALL")) || l.contains("kube-proxy")
            })
            .collect();
        check(
            h,
            left.is_empty(),
            format!("side {label}: {who} --cleanup left {left:#?}"),
        );
        for kept in [
            ":TEST-OWN",
            "-A INPUT -j TEST-OWN",
            "-A POSTROUTING -j TEST-OWN",
            "-A TEST-OWN -s 192.0.2.0/24 -j RETURN",
            ":KUBE-FIREWALL",
            "-A INPUT -j KUBE-FIREWALL",
            "block incoming localnet connections",
            ":FORWARD DROP",
        ] {
            check(
                h,
                after.contains(kept),
                format!("side {label}: {who} --cleanup removed {kept:?}"),
            );
        }
    }
    // What ours left after ours' --cleanup (ipt) and after upstream's (rr): the same.
    let (ipt, rr) = (saved_rules(h, "ipt"), saved_rules(h, "rr"));
    check(
        h,
        ipt == rr,
        format!(
            "our --cleanup and upstream's leave different rules:\nours:\n{ipt}\nupstream's:\n{rr}"
        ),
    );
    // A second run finds nothing to do and still succeeds.
    let (code, out) = cleanup_in(&h.side("up").node.node, &ours);
    check(
        h,
        code == Some(0),
        format!("our second --cleanup exited {code:?}:\n{out}"),
    );
}

/// The upstream binaries' directory (tests/kube/build.sh's cache; a cache hit is quick).
fn upstream_dir() -> PathBuf {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/kube/build.sh");
    let out = run("bash", &[script]).unwrap_or_else(|e| panic!("{e}"));
    PathBuf::from(
        out.lines()
            .last()
            .expect("build.sh prints its directory")
            .trim(),
    )
}

/// Runs `<bin> --cleanup` in namespace `ns` (stopped after 60 s); its exit code and output.
fn cleanup_in(ns: &str, bin: &Path) -> (Option<i32>, String) {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "timeout", "60"])
        .arg(bin)
        .args(["--cleanup", "--v=2"])
        .stdin(Stdio::null())
        .output()
        .expect("run --cleanup");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// A node's iptables rules of both families (without counters and comments that change
/// between runs) and its nftables tables' names: what a cleanup is judged on.
fn saved_rules(h: &Harness, label: &str) -> String {
    let mut out = String::new();
    for save in ["iptables-save", "ip6tables-save"] {
        let text = node_must(h, label, &[save]);
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            // ":CHAIN POLICY [packets:bytes]" keeps its name and policy.
            let line = match line.rsplit_once(" [") {
                Some((head, _)) if line.starts_with(':') => head,
                _ => line,
            };
            out.push_str(&format!("{save}: {line}\n"));
        }
    }
    out.push_str(&node_must(h, label, &["nft", "list", "tables"]));
    out
}

// ------------------------------------------------------------------------------------ 2: nftables

/// nftables mode, ours and upstream's: the same tables (the harness compares them), NodePorts
/// on the primary address only, no localhost NodePorts and no route_localnet, nothing in
/// iptables.
fn nftables_mode(h: &mut Harness) {
    web_services(h);
    h.probe_on(
        &["upnft", "nft"],
        &[
            p("client", "tcp", CLUSTER_IP, 80, all(BOTH_MASQ)),
            p("client", "tcp", NODE, NODE_PORT, all(BOTH_MASQ)),
            // Not the primary address: nothing matches, the node's own stack refuses.
            p("client", "tcp", NODE_OTHER, NODE_PORT, all(&["REFUSED"])),
            p("node", "tcp", "127.0.0.1", NODE_PORT, all(&["REFUSED"])),
        ],
    );
    for label in ["upnft", "nft"] {
        let got = route_localnet(h, label);
        check(
            h,
            got == "0",
            format!("side {label}: route_localnet is {got} in nftables mode"),
        );
        let saved = node_must(h, label, &["iptables-save"]);
        check(
            h,
            !saved.contains("KUBE-"),
            format!("side {label}: nftables mode wrote to iptables:\n{saved}"),
        );
    }
}

/// ipvs mode with sh: every connection from one client address goes to one endpoint, and
/// client addresses spread over both.
fn ipvs_sh_by_client(h: &mut Harness) {
    web_services(h);
    let clients = ["10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5"];
    for extra in &clients[1..] {
        h.side("sh").node.add_client_address(extra);
    }
    let target = probe::target("tcp", CLUSTER_IP, 80);
    let mut picked = BTreeSet::new();
    for source in clients {
        let s = h.side("sh");
        let seq = probe::sequence("sh", &s.node.client, &h.agent, &target, 6, Some(source));
        eprintln!("[sh] from {source}: {seq:?}");
        h.report.push(kube_proxy::harness::Row {
            scenario: "ipvs-sh-by-client".into(),
            step: 0,
            from: source.into(),
            target: target.clone(),
            side: "sh",
            summary: format!("in order: {}", seq.join(" ")),
        });
        let distinct: BTreeSet<&String> = seq.iter().collect();
        let pod = seq
            .first()
            .map(|t| t.split('<').next().unwrap_or("").to_string());
        check(
            h,
            distinct.len() == 1
                && seq.len() == 6
                && pod.as_deref().is_some_and(|p| p.starts_with("pod")),
            format!("ipvs sh: client {source} did not keep one endpoint: {seq:?}"),
        );
        picked.extend(pod);
    }
    check(
        h,
        picked.len() == 2,
        format!(
            "ipvs sh: client addresses {clients:?} did not spread over both endpoints: {picked:?}"
        ),
    );
}

/// nftables mode adds nothing to iptables, so a FORWARD policy of DROP stops forwarded
/// Service traffic, on both sides: upstream documents that a host firewall must allow it.
fn nftables_forward_drop(h: &mut Harness) {
    web_services(h);
    for label in ["upnft", "nft"] {
        node_must(h, label, FORWARD_DROP);
    }
    flush_conntrack(h);
    h.probe_on(
        &["upnft", "nft"],
        &[
            p("client", "tcp", CLUSTER_IP, 80, all(&["TIMEOUT"])),
            p("client", "tcp", NODE, NODE_PORT, all(&["TIMEOUT"])),
            p("node", "tcp", CLUSTER_IP, 80, all(BOTH_MASQ)),
        ],
    );
}

// ------------------------------------------------------------------------------------ 3: command lines

/// The unit's and kubeadm's command lines start the proxy, which programs the node and
/// answers: through ipvs mode (unit) and iptables mode (kubeadm's empty mode, and an unset
/// `--proxy-mode`), as upstream running kubeadm's configuration answers.
fn command_lines(h: &mut Harness) {
    web_services(h);
    h.probe(&[
        p("client", "tcp", CLUSTER_IP, 80, all(BOTH_MASQ)),
        p("client", "tcp", NODE, NODE_PORT, all(BOTH_MASQ)),
        p("client", "tcp", NODE_OTHER, NODE_PORT, all(BOTH_MASQ)),
    ]);
    h.probe_on(
        &["upadm", "adm", "unset"],
        &[p("node", "tcp", "127.0.0.1", NODE_PORT, all(BOTH_MASQ))],
    );
    for (label, localnet) in [("upadm", "1"), ("adm", "1"), ("unset", "1"), ("unit", "0")] {
        let got = route_localnet(h, label);
        check(
            h,
            got == localnet,
            format!("side {label}: route_localnet is {got}, wanted {localnet}"),
        );
    }
    for label in ["adm", "unit", "unset"] {
        let forward = rules_of(h, label, "iptables", "FORWARD");
        check(
            h,
            forward.lines().any(|l| l == FORWARD_JUMP),
            format!("side {label}: no KUBE-FORWARD jump:\n{forward}"),
        );
        let table = h.side(label).tables.get("ip").cloned().flatten();
        check(
            h,
            table.is_some(),
            format!("side {label}: no table ip kube-proxy"),
        );
    }
    // The unit's wrr: every endpoint's weight is 1, so round robin.
    let text = node_must(h, "unit", &["nft", "list", "table", "ip", "kube-proxy"]);
    check(
        h,
        text.contains("numgen inc mod 2"),
        "side unit: wrr is not served by numgen inc".into(),
    );
    // --logtostderr, which upstream v1.37 no longer has, is accepted with one warning.
    let log = std::fs::read_to_string(&h.side("unit").proxy.log).unwrap_or_default();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("logtostderr") && (l.starts_with('W') || l.contains("WARN")))
        .collect();
    check(
        h,
        warnings.len() == 1,
        format!("side unit: wanted one warning about --logtostderr, got {warnings:#?}"),
    );
    eprintln!("[unit] {warnings:?}");
}

/// An empty mode (kubeadm's file) or no `--proxy-mode` at all: ours logs the line upstream
/// logs (an error, as upstream's), then serves iptables mode (checked above).
fn defaulted_mode(h: &mut Harness) {
    let upstream_log = std::fs::read_to_string(&h.side("upadm").proxy.log).unwrap_or_default();
    let Some(line) = upstream_log
        .lines()
        .find(|l| l.contains(DEFAULTED_MODE_START))
    else {
        panic!("upstream logged no defaulted-mode line:\n{upstream_log}");
    };
    let message = klog_message(line);
    eprintln!("upstream: {line}");
    for label in ["adm", "unset"] {
        let log = std::fs::read_to_string(&h.side(label).proxy.log).unwrap_or_default();
        let ours = log.lines().find(|l| l.contains(DEFAULTED_MODE_START));
        eprintln!("[{label}] {ours:?}");
        // klog's severity letter leads the line: an error, as upstream's.
        check(
            h,
            ours.is_some_and(|l| l.starts_with('E') && l.contains(&message)),
            format!("side {label}: no error line {message:?}"),
        );
    }
    // Upstream calls for a KubeProxyDefaultMode Event too, but records it before its Event
    // broadcaster starts, so it never reaches the API (its "Starting" Event, posted later,
    // does). Ours posts none either; what the API holds is only reported.
    let reasons: Vec<String> = h
        .kube
        .node_events()
        .iter()
        .map(|e| format!("{} {}", e["reportingInstance"], e["reason"]))
        .collect();
    eprintln!("Events about the Node: {reasons:#?}");
}

// ------------------------------------------------------------------------------------ hairpin

/// Under a FORWARD policy of DROP, a pod's connection to a Service whose one endpoint is the
/// pod itself (hairpin): upstream's iptables mode marks it for masquerade in the endpoint's
/// chain (`KUBE-SEP-* -s <endpoint> -j KUBE-MARK-MASQ`), so KUBE-FORWARD accepts it and the
/// pod answers itself. Ours, in iptables and ipvs modes, marks it in a forward-hook chain
/// that runs before the filter table's FORWARD (the nftables ruleset itself masquerades
/// hairpin at postrouting, too late for KUBE-FORWARD).
#[test]
fn hairpin_under_forward_drop_answers_as_upstreams_iptables_mode() {
    if !kube_proxy::preflight() || !iptables_preflight() {
        return;
    }
    let dir = artefacts().with_file_name("kube-proxy-modes-hairpin");
    let sides = forward_drop_sides(["hp-up", "hp-ipt", "hp-rr"]);
    let mut h = Harness::start_with(&dir, &sides, &[]);
    h.scenario("hairpin-forward-drop", |h| {
        h.api()
            .create_service(&Svc::cluster_ip("self", CLUSTER_IP).port("http", Tcp, 80, 8080));
        h.api().create_slice(
            &Slice::v4("self-1", "self")
                .port("http", Tcp, 8080)
                .ep(Ep::ready(POD1)),
        );
        h.synced();
        h.probe(&[
            p("pod1", "tcp", CLUSTER_IP, 80, all(&["pod1<-masq"])),
            // Not forwarded: the same Service from the node answers everywhere.
            p("node", "tcp", CLUSTER_IP, 80, all(&["pod1<-masq"])),
        ]);
    });
    eprintln!("{}", h.report_table());
    let failures = std::mem::take(&mut h.failures);
    drop(h);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ------------------------------------------------------------------------------------ no apiserver

/// Runs `bin args` in a namespace of its own (so that a binary that wrongly started would
/// program nothing of the machine's), stopped after 60 s; exit code, stdout and stderr.
fn run_alone(ns: &str, bin: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "timeout", "60"])
        .arg(bin)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run kube-proxy");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `--proxy-mode=userspace` (removed in 1.26) and `kernelspace` (Windows only): ours refuses
/// them with upstream's own validation message and exit code, upstream's binary run with the
/// same command line being the reference.
#[test]
fn userspace_and_kernelspace_get_upstreams_error() {
    if !support::netns::can_run("userspace_and_kernelspace_get_upstreams_error")
        || !kube_proxy::preflight()
    {
        return;
    }
    let ns = support::netns::Netns::new("kpmodes").expect("a namespace");
    let upstream = Impl::Upstream.binary(&upstream_dir());
    let ours = Impl::Ours.binary(Path::new(""));
    for mode in ["userspace", "kernelspace"] {
        let flag = format!("--proxy-mode={mode}");
        let args = [
            flag.as_str(),
            "--kubeconfig=/nonexistent/kubeconfig",
            "--hostname-override=node-a",
        ];
        let (up_code, _, up_err) = run_alone(ns.name(), &upstream, &args);
        let (our_code, _, our_err) = run_alone(ns.name(), &ours, &args);
        eprintln!("{mode}: upstream exit {up_code:?}: {up_err}ours exit {our_code:?}: {our_err}");
        let up_line = up_err
            .lines()
            .find(|l| l.contains("command failed"))
            .unwrap_or_else(|| panic!("upstream printed no failure for {mode}: {up_err}"));
        let message = klog_message(up_line);
        assert!(
            message.starts_with("failed validate: KubeProxyConfiguration.Mode.ProxyMode"),
            "{message}"
        );
        assert!(
            our_err.contains(&message),
            "{mode}: ours does not print upstream's message {message:?}:\n{our_err}"
        );
        assert_eq!(our_code, up_code, "{mode}: the exit codes differ");
    }
    let tables = ns.nft(&["list", "tables"]).expect("nft list tables");
    assert!(
        tables.trim().is_empty(),
        "a refused mode programmed: {tables}"
    );
}

/// An ipvs scheduler nothing here can serve is refused at start, naming the flag, before
/// anything is programmed.
#[test]
fn an_unservable_ipvs_scheduler_is_refused_at_start() {
    if !support::netns::can_run("an_unservable_ipvs_scheduler_is_refused_at_start") {
        return;
    }
    let ns = support::netns::Netns::new("kpsched").expect("a namespace");
    let ours = Impl::Ours.binary(Path::new(""));
    let (code, _, err) = run_alone(
        ns.name(),
        &ours,
        &[
            "--proxy-mode=ipvs",
            "--ipvs-scheduler=lc",
            "--kubeconfig=/nonexistent/kubeconfig",
            "--hostname-override=node-a",
            "--conntrack-max-per-core=0",
        ],
    );
    eprintln!("exit {code:?}: {err}");
    assert!(
        code.is_some_and(|c| c != 0),
        "lc was not refused: exit {code:?}"
    );
    assert!(
        err.contains("--ipvs-scheduler") && err.contains("\"lc\""),
        "the refusal does not name the flag and the value: {err}"
    );
    let tables = ns.nft(&["list", "tables"]).expect("nft list tables");
    assert!(
        tables.trim().is_empty(),
        "a refused scheduler programmed: {tables}"
    );
}
