//! Service and NodePort traffic under an iptables FORWARD policy of DROP.

use super::*;

/// A ClusterIP and a NodePort Service, under a FORWARD policy of DROP, in iptables mode
/// (ours and upstream's) and ipvs mode (ours): the client and the node get the same answers on
/// every side, and the pods see what upstream's iptables mode shows them.
pub(crate) fn forward_drop_services(h: &mut Harness) {
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
pub(crate) fn forward_chain(h: &mut Harness) {
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
pub(crate) fn forward_drop_control(h: &mut Harness) {
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
pub(crate) fn ipvs_rr_alternates(h: &mut Harness) {
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
pub(crate) fn localhost_nodeports_iptables(h: &mut Harness) {
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
pub(crate) fn mode_events(h: &mut Harness) {
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
pub(crate) fn cleanup(h: &mut Harness) {
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
pub(crate) fn upstream_dir() -> PathBuf {
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
pub(crate) fn cleanup_in(ns: &str, bin: &Path) -> (Option<i32>, String) {
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
pub(crate) fn saved_rules(h: &Harness, label: &str) -> String {
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
