//! `apiserver-away`: the kube-apiserver killed for 30 s, the proxies restarted meanwhile.

use super::*;

pub(crate) fn apiserver_away(h: &mut Harness) {
    let vip = "10.96.21.1";
    echo_service(h, "away", vip, &[POD1]);
    h.settle();
    h.probe(&[p("client", "tcp", vip, 80, all(&["pod1<-masq"]))]);
    let n = h.sides.len();
    let mut conns = Vec::new();
    for i in 0..n {
        let c = LineConn::open(&h.sides[i].node.client, sock(vip, 90))
            .unwrap_or_else(|e| panic!("side {}: {e}", h.sides[i].label));
        conns.push(c);
    }
    let tables: Vec<Vec<Option<ruleset::Table>>> = (0..n)
        .map(|i| vec![table(h, i, "ip"), table(h, i, "ip6")])
        .collect();
    let mut stages: Vec<(String, Vec<String>)> = Vec::new();
    let mut record = |h: &Harness, stage: &str| {
        let row: Vec<String> = (0..n).map(|i| health(h, i, 10256)).collect();
        stages.push((stage.to_string(), row));
    };
    record(h, "before");

    let t_kill = Instant::now();
    let stopped = h.apiserver().kill_apiserver();
    record(h, "apiserver killed");
    for i in 0..n {
        let args = proxy::args(&h.kubeconfig());
        h.restart_proxy(i, false, &args, &[]);
    }
    // While the apiserver is away: every second, the rules, the established connection and
    // a new connection, on every side, until 30 s have passed since the kill.
    let mut checks = 0;
    let mut problems = Vec::new();
    while t_kill.elapsed() < Duration::from_secs(30) {
        let tick = Instant::now();
        for i in 0..n {
            let label = h.sides[i].label;
            if let Some(status) = h.sides[i].proxy.exited() {
                problems.push(format!(
                    "side {label}: the restarted proxy exited ({status}) while the apiserver was away:\n{}",
                    h.sides[i].proxy.log_tail(20)
                ));
            }
            let now = vec![table(h, i, "ip"), table(h, i, "ip6")];
            if now != tables[i] {
                let a = tables[i][0]
                    .as_ref()
                    .map(|t| t.lines.clone())
                    .unwrap_or_default();
                let b = now[0].as_ref().map(|t| t.lines.clone()).unwrap_or_default();
                problems.push(format!(
                    "side {label}: the rules changed while the apiserver was away: {:?}",
                    ruleset::diff("before", &a, "now", &b)
                ));
            }
            if let Err(e) = conns[i].ask(&format!("away {checks}")) {
                problems.push(format!("side {label}: the established connection: {e}"));
            }
            match LineConn::open(&h.sides[i].node.client, sock(vip, 90)) {
                Ok(c) if c.server == format!("pod1@{label}") => {}
                Ok(c) => problems.push(format!(
                    "side {label}: a new connection reached {}",
                    c.server
                )),
                Err(e) => problems.push(format!("side {label}: a new connection: {e}")),
            }
        }
        checks += 1;
        if !problems.is_empty() {
            break;
        }
        if checks == 3 {
            record(h, "proxies restarted, apiserver away");
        }
        let rest = Duration::from_secs(1).saturating_sub(tick.elapsed());
        std::thread::sleep(rest);
    }
    record(h, "apiserver away 30 s");
    for p in problems {
        h.fail(p);
    }
    note(format!(
        "apiserver-away: {checks} rounds of checks (rules unchanged, the held connection and new connections answered) while the apiserver was away {:.1} s",
        t_kill.elapsed().as_secs_f64()
    ));
    h.apiserver().restart_apiserver(stopped);
    let back = Instant::now();
    record(h, "apiserver back");
    // The proxies resume: a new Service reaches every side. Both programs' watches back off
    // exponentially (client-go's and kube-rs's, 800 ms doubling up to 30 s), so the first
    // retry after the outage may come up to 30 s after the apiserver is back.
    echo_service(h, "away-new", "10.96.21.2", &[POD2]);
    h.sync_timeout = Duration::from_secs(75);
    let settled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| h.settle()));
    h.sync_timeout = Duration::from_secs(30);
    if let Err(e) = settled {
        std::panic::resume_unwind(e);
    }
    note(format!(
        "apiserver-away: a Service created after the apiserver came back was in every side's rules {:.1} s after /readyz",
        back.elapsed().as_secs_f64()
    ));
    // The proxies restarted without the apiserver program what each other does.
    h.compare_rulesets();
    h.probe(&[
        p("client", "tcp", "10.96.21.2", 80, all(&["pod2<-masq"])),
        p("client", "tcp", vip, 80, all(&["pod1<-masq"])),
    ]);
    for (i, c) in conns.iter_mut().enumerate() {
        if let Err(e) = c.ask("after") {
            let label = h.sides[i].label;
            h.fail(format!(
                "side {label}: the held connection after the outage: {e}"
            ));
        }
    }
    record(h, "synced after the outage");
    let labels: Vec<String> = h
        .sides
        .iter()
        .map(|s| format!("{} ({})", s.label, s.which.label()))
        .collect();
    for (stage, row) in &stages {
        note(format!(
            "apiserver-away: {stage:<36} {}",
            labels
                .iter()
                .zip(row)
                .map(|(l, r)| format!("{l}: {r}"))
                .collect::<Vec<_>>()
                .join(" | ")
        ));
        if n == 2 && row[0] != row[1] {
            h.fail(format!(
                "/healthz and /livez differ from upstream's at stage {stage:?}: up {} / rs {}",
                row[0], row[1]
            ));
        }
    }
}
