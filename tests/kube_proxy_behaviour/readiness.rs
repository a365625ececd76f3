//! `readiness`: READY=1 only once the first sync is in the kernel; STOPPING=1 on SIGTERM.

use super::*;

pub(crate) fn readiness(h: &mut Harness) {
    let i = ours(h);
    h.api().create_service(
        &Svc::node_port("rdy", "10.96.24.1")
            .port_np("http", Tcp, 80, 8080, 30090)
            .port("line", Tcp, 90, LINE_PORT),
    );
    h.api().create_slice(&echo_slice("rdy", &[POD1]));
    h.settle();
    h.stop_proxy(i, false);
    for fam in ["ip", "ip6"] {
        ns_run(
            &h.sides[i].node.node,
            &["nft", "delete", "table", fam, "kube-proxy"],
        )
        .unwrap();
    }
    h.stop_relay(i);
    let path = h.dir().join("notify.sock");
    let _ = std::fs::remove_file(&path);
    let notify = UnixDatagram::bind(&path).unwrap();
    let path_s = path.display().to_string();
    // nodePortAddresses left to its default (the node's primary IP), which the proxy learns
    // from the Node.
    let args: Vec<String> = proxy::args(&h.kubeconfig())
        .into_iter()
        .filter(|a| !a.starts_with("--nodeport-addresses"))
        .collect();
    let t0 = Instant::now();
    h.start_proxy(i, &args, &[("NOTIFY_SOCKET", path_s.as_str())]);
    // The proxy runs and cannot reach the apiserver: it says so in its log.
    wait_until(
        "the proxy's first failed API request",
        Duration::from_secs(20),
        Duration::from_millis(50),
        || {
            let log = log_text(h, i);
            log.lines()
                .any(|l| l.contains("Failed to watch") || l.contains("onnection refused"))
                .then_some(())
        },
    )
    .unwrap_or_else(|e| panic!("{e}; log:\n{}", h.sides[i].proxy.log_tail(20)));
    // The apiserver stays away for longer than the 30 s a proxy gives the Node to show its
    // addresses (upstream waits for its Node informer however long that takes, ours gives up
    // after 30 s and learns the addresses when the Node arrives): no READY, no table.
    notify
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut early = Vec::new();
    while t0.elapsed() < Duration::from_secs(33) {
        let mut buf = [0u8; 4096];
        if let Ok(n) = notify.recv(&mut buf) {
            early.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        if let Some(status) = h.sides[i].proxy.exited() {
            panic!("the proxy exited ({status}) while the apiserver was out of reach");
        }
    }
    if early.iter().any(|m| m.contains("READY=1")) {
        h.fail(format!(
            "READY=1 while the apiserver was out of reach: {early:?}"
        ));
    }
    for fam in ["ip", "ip6"] {
        if table(h, i, fam).is_some() {
            h.fail(format!(
                "table {fam} kube-proxy exists before the first sync"
            ));
        }
    }
    h.start_relay(i);
    let t_reach = Instant::now();
    notify
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let ready = loop {
        let mut buf = [0u8; 4096];
        let n = notify.recv(&mut buf).unwrap_or_else(|e| {
            panic!(
                "no READY=1 within 60 s: {e}; log:\n{}",
                h.sides[i].proxy.log_tail(20)
            )
        });
        let m = String::from_utf8_lossy(&buf[..n]).into_owned();
        if m.contains("READY=1") {
            break m;
        }
    };
    let at_ready = t_reach.elapsed();
    let node_ports = table(h, i, "ip").map(|t| t.keys("nodeport-ips"));
    // At the moment READY arrives, both tables are there, with the Service in.
    let v4 = table(h, i, "ip");
    let v6 = table(h, i, "ip6");
    let has_service = v4
        .as_ref()
        .is_some_and(|t| t.service_ports("10.96.24.1", "tcp") == vec![80, 90]);
    if !has_service || v6.is_none() {
        h.fail(format!(
            "READY=1 came before the first sync was in the kernel (Service in ip table: {has_service}, ip6 table: {})",
            v6.is_some()
        ));
    }
    note(format!(
        "readiness: before the apiserver was reachable, {} notify messages, none READY ({early:?}); READY {:.2} s after it was (start {:.2} s before): {ready:?}",
        early.len(),
        at_ready.as_secs_f64(),
        (t_reach - t0).as_secs_f64()
    ));
    note(format!(
        "readiness: with the apiserver away 33 s at start-up: {:?}; nodeport-ips at READY {node_ports:?}",
        log_records(h, i, "Detected node IP")
    ));
    h.settle();
    let node_ports = table(h, i, "ip").map(|t| t.keys("nodeport-ips"));
    if node_ports != Some(vec![json!(NODE_IP)]) {
        h.fail(format!(
            "nodePortAddresses by default (primary): nodeport-ips holds {node_ports:?}, not {NODE_IP}"
        ));
    }
    h.probe(&[
        p("client", "tcp", "10.96.24.1", 80, all(&["pod1<-masq"])),
        p("client", "tcp", NODE_IP, 30090, all(&["pod1<-masq"])),
    ]);
    // Once READY has settled, the pages of start-up code are given back; the proxy runs on
    // (a new Service after it is programmed and answers).
    let released = wait_until(
        "the start-up pages released after READY",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || {
            log_records(h, i, "released the pages of start-up code")
                .into_iter()
                .next()
        },
    )
    .unwrap_or_else(|e| panic!("{e}; log:\n{}", h.sides[i].proxy.log_tail(20)));
    let bytes: u64 = released
        .split_whitespace()
        .find_map(|f| f.strip_prefix("bytes="))
        .and_then(|v| v.trim_matches('"').parse().ok())
        .unwrap_or(0);
    if bytes == 0 {
        h.fail(format!("no start-up pages given back: {released}"));
    }
    note(format!("readiness: after READY, {released}"));
    h.api().create_service(
        &Svc::cluster_ip("after-release", "10.96.24.2").port("http", Tcp, 80, 8080),
    );
    h.api().create_slice(&echo_slice("after-release", &[POD1]));
    h.settle();
    h.probe(&[p("client", "tcp", "10.96.24.2", 80, all(&["pod1<-masq"]))]);
    h.sides[i].proxy.signal("-TERM");
    notify
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    let stopping = loop {
        let mut buf = [0u8; 4096];
        let n = notify
            .recv(&mut buf)
            .unwrap_or_else(|e| panic!("no STOPPING=1 within 15 s of SIGTERM: {e}"));
        let m = String::from_utf8_lossy(&buf[..n]).into_owned();
        if m.contains("STOPPING=1") {
            break m;
        }
    };
    let status = h.sides[i].proxy.wait_exit(Duration::from_secs(15));
    if !status.is_some_and(|s| s.success()) {
        h.fail(format!("exit after SIGTERM: {status:?}"));
    }
    let kept =
        table(h, i, "ip").is_some_and(|t| t.service_ports("10.96.24.1", "tcp") == vec![80, 90]);
    if !kept {
        h.fail("the table did not stay after the proxy exited".into());
    }
    h.probe(&[p("client", "tcp", "10.96.24.1", 80, all(&["pod1<-masq"]))]);
    note(format!(
        "readiness: SIGTERM -> {stopping:?}, exit {status:?}, the table and the Service stayed after exit"
    ));
    let args = proxy::args(&h.kubeconfig());
    h.start_proxy(i, &args, &[]);
    h.settle();
}
