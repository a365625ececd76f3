//! `udp-conntrack`: stale UDP entries after an endpoint change and across restarts.

use super::*;

/// The node's UDP conntrack entries whose original destination is `vip`: (original source
/// address and port) -> reply source address (the endpoint chosen).
pub(crate) fn udp_entries(h: &Harness, i: usize, vip: &str) -> BTreeMap<String, String> {
    let out = ns_run(&h.sides[i].node.node, &["conntrack", "-L", "-p", "udp"]).unwrap_or_default();
    let mut m = BTreeMap::new();
    for line in out.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let all = |key: &str| -> Vec<&str> {
            fields
                .iter()
                .filter_map(|f| f.strip_prefix(key))
                .collect::<Vec<_>>()
        };
        let (src, dst, sport) = (all("src="), all("dst="), all("sport="));
        if dst.first() == Some(&vip) && src.len() >= 2 && !sport.is_empty() {
            m.insert(format!("{}:{}", src[0], sport[0]), src[1].to_string());
        }
    }
    m
}

pub(crate) fn udp_conntrack(h: &mut Harness) {
    // Part 1: the only endpoint replaced; a flow with a fixed source port follows it.
    let vip = "10.96.20.1";
    h.api()
        .create_service(&Svc::cluster_ip("ct-udp", vip).port("dns", Udp, 53, 8080));
    let slice = |ep: &str| {
        Slice::v4("ct-udp-1", "ct-udp")
            .port("dns", Udp, 8080)
            .ep(Ep::ready(ep))
    };
    h.api().create_slice(&slice(POD1));
    h.settle();
    let n = h.sides.len();
    // Per side: (source, socket).
    let mut flows = Vec::new();
    for i in 0..n {
        let side = &h.sides[i];
        let label = side.label;
        for (from, ns, local) in [
            ("client", side.node.client.clone(), sock(CLIENT_IP, 40001)),
            ("pod2", side.node.pods[1].clone(), sock(POD2, 40002)),
        ] {
            let s = nsock::udp_flow(&ns, local, sock(vip, 53));
            let first = nsock::udp_ask(&s);
            if first != format!("pod1@{label}") {
                h.fail(format!(
                    "side {label}: {from} -> {vip}:53/udp answered by {first}, not pod1"
                ));
            }
            flows.push((i, from, s));
        }
    }
    let series = "kubeproxy_conntrack_reconciler_sync_duration_seconds_count{ip_family=\"IPv4\"}";
    let deleted = "kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family=\"IPv4\"}";
    let before: Vec<f64> = (0..n).map(|i| metric(h, i, series)).collect();
    let deleted_before: Vec<f64> = (0..n).map(|i| metric(h, i, deleted)).collect();
    h.api().patch_slice(
        "ct-udp-1",
        json!({"endpoints": [{"addresses": [POD2], "conditions": {"ready": true, "serving": true, "terminating": false}, "nodeName": "node-a"}]}),
    );
    h.settle();
    // The reconciler runs after the sync that removed pod1; the barrier may show before it
    // has finished, so wait for its count to move.
    for (i, b) in before.iter().enumerate() {
        wait_metric(h, i, series, Duration::from_secs(20), |v| v > *b);
    }
    for (i, deleted_before) in deleted_before.iter().enumerate() {
        let left = udp_entries(h, i, vip);
        let stale: Vec<_> = left.iter().filter(|(_, r)| *r == POD1).collect();
        note(format!(
            "udp-conntrack: side {} after pod1 -> pod2: the reconciler deleted {} entries; entries to {vip} left with pod1 as reply source: {}",
            h.sides[i].label,
            metric(h, i, deleted) - deleted_before,
            stale.len()
        ));
        if !stale.is_empty() {
            h.fail(format!(
                "side {}: stale entries kept: {stale:?}",
                h.sides[i].label
            ));
        }
    }
    for (i, from, s) in &flows {
        let label = h.sides[*i].label;
        let next = nsock::udp_ask(s);
        note(format!(
            "udp-conntrack: side {label}: {from}'s flow after the endpoint change: {next}"
        ));
        if next != format!("pod2@{label}") {
            h.fail(format!(
                "side {label}: {from}'s next datagram reached {next}, not the new endpoint pod2"
            ));
        }
    }
    drop(flows);

    // Part 2: a restart with every endpoint still serving.
    let vip = "10.96.20.2";
    h.api()
        .create_service(&Svc::cluster_ip("ct-keep", vip).port("dns", Udp, 53, 8080));
    h.api().create_slice(
        &Slice::v4("ct-keep-1", "ct-keep")
            .port("dns", Udp, 8080)
            .ep(Ep::ready(POD1))
            .ep(Ep::ready(POD2)),
    );
    h.settle();
    let mut kept_flows = Vec::new();
    for i in 0..n {
        let side = &h.sides[i];
        let mut sources: Vec<(String, SocketAddr)> = (0..8)
            .map(|k| (side.node.client.clone(), sock(CLIENT_IP, 41000 + k)))
            .collect();
        sources.push((side.node.pods[0].clone(), sock(POD1, 41100)));
        sources.push((side.node.pods[1].clone(), sock(POD2, 41101)));
        for (ns, local) in sources {
            let s = nsock::udp_flow(&ns, local, sock(vip, 53));
            let first = nsock::udp_ask(&s);
            kept_flows.push((i, local, s, first));
        }
    }
    let before: Vec<BTreeMap<String, String>> = (0..n).map(|i| udp_entries(h, i, vip)).collect();
    let series = "kubeproxy_conntrack_reconciler_sync_duration_seconds_count{ip_family=\"IPv4\"}";
    for i in 0..n {
        let args = proxy::args(&h.kubeconfig());
        h.restart_proxy(i, true, &args, &[]);
    }
    h.settle();
    // Both programs reconcile after their first sync; wait for that before listing.
    for i in 0..n {
        wait_metric(h, i, series, Duration::from_secs(30), |v| v >= 1.0);
    }
    for (i, before) in before.iter().enumerate() {
        let label = h.sides[i].label;
        let after = udp_entries(h, i, vip);
        let kept = before
            .iter()
            .filter(|(k, r)| after.get(*k) == Some(*r))
            .count();
        let deleted = before.len() - kept;
        let reanswered: Vec<(String, String)> = kept_flows
            .iter()
            .filter(|f| f.0 == i)
            .map(|(_, local, s, first)| (first.clone(), nsock::udp_ask(s), local))
            .map(|(first, now, local)| (format!("{local}"), format!("{first} -> {now}")))
            .collect();
        let moved = reanswered
            .iter()
            .filter(|(_, change)| {
                let (a, b) = change.split_once(" -> ").unwrap();
                a != b
            })
            .count();
        note(format!(
            "udp-conntrack: side {label} ({}) restarted (SIGKILL, start): {} UDP entries to {vip} before, {kept} kept, {deleted} deleted; {moved} of {} flows then answered by another endpoint",
            h.sides[i].which.label(),
            before.len(),
            reanswered.len()
        ));
        if h.sides[i].which == Impl::Ours && (deleted > 0 || moved > 0) {
            h.fail(format!(
                "side {label}: a restart deleted {deleted} conntrack entries whose endpoints still serve; flows: {reanswered:?}"
            ));
        }
        if before.len() < 10 {
            h.fail(format!(
                "side {label}: only {} entries before the restart (expected 10 flows)",
                before.len()
            ));
        }
    }
}
