//! What the scenarios share: the proxy's pages, metrics, log and table, and the echo Services.

use super::*;

pub(crate) fn ours(h: &Harness) -> usize {
    h.side_index("rs")
}

pub(crate) fn sock(ip: &str, port: u16) -> SocketAddr {
    format!("{ip}:{port}").parse().unwrap()
}

/// A GET on a port of side `i`'s node namespace: the status and body, or why not.
pub(crate) fn get(h: &Harness, i: usize, addr: &str, path: &str) -> Result<(u16, String), String> {
    nsock::http_get(&h.sides[i].node.node, addr.parse().unwrap(), path)
}

pub(crate) fn metrics_text(h: &Harness, i: usize) -> String {
    get(h, i, "127.0.0.1:10249", "/metrics")
        .map(|(_, body)| body)
        .unwrap_or_default()
}

pub(crate) fn metric(h: &Harness, i: usize, series: &str) -> f64 {
    nsock::metric(&metrics_text(h, i), series).unwrap_or(0.0)
}

/// Waits until side `i`'s metric `series` satisfies `ok`; its value then.
pub(crate) fn wait_metric(
    h: &Harness,
    i: usize,
    series: &str,
    timeout: Duration,
    ok: impl Fn(f64) -> bool,
) -> f64 {
    wait_until(
        &format!("side {}: {series}", h.sides[i].label),
        timeout,
        Duration::from_millis(50),
        || nsock::metric(&metrics_text(h, i), series).filter(|v| ok(*v)),
    )
    .unwrap_or_else(|e| {
        panic!(
            "{e} (last {:?}); log:\n{}",
            nsock::metric(&metrics_text(h, i), series),
            h.sides[i].proxy.log_tail(20)
        )
    })
}

/// `/healthz` and `/livez` of side `i` as "200/200", "503/200" or "down".
pub(crate) fn health(h: &Harness, i: usize, port: u16) -> String {
    let addr = format!("127.0.0.1:{port}");
    let code = |path| match get(h, i, &addr, path) {
        Ok((c, _)) => c.to_string(),
        Err(_) => "down".to_string(),
    };
    format!("healthz {} livez {}", code("/healthz"), code("/livez"))
}

pub(crate) fn log_text(h: &Harness, i: usize) -> String {
    std::fs::read_to_string(&h.sides[i].proxy.log).unwrap_or_default()
}

/// The log records (a line, and the tab-indented lines of a klog `key=<` block closed by
/// ` >` that follow it) that contain `needle` in their first line.
pub(crate) fn log_records(h: &Harness, i: usize, needle: &str) -> Vec<String> {
    let text = log_text(h, i);
    let mut out = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let mut record = line.to_string();
        if line.ends_with("=<") {
            for next in lines.by_ref() {
                record.push('\n');
                record.push_str(next);
                if next == " >" {
                    break;
                }
            }
        }
        if line.contains(needle) {
            out.push(record);
        }
    }
    out
}

pub(crate) fn count_in_log(h: &Harness, i: usize, needle: &str) -> usize {
    log_text(h, i).matches(needle).count()
}

/// Side `i`'s table of `fam` now.
pub(crate) fn table(h: &Harness, i: usize, fam: &str) -> Option<ruleset::Table> {
    ruleset::dump(&h.sides[i].node.node, fam).unwrap_or_else(|e| panic!("{e}"))
}

/// Waits until side `i`'s IPv4 table satisfies `ok` (a reload or a change reaching the
/// kernel).
pub(crate) fn wait_table(h: &Harness, i: usize, what: &str, ok: impl Fn(&ruleset::Table) -> bool) {
    wait_until(
        what,
        Duration::from_secs(30),
        Duration::from_millis(50),
        || table(h, i, "ip").filter(|t| ok(t)).map(|_| ()),
    )
    .unwrap_or_else(|e| panic!("{e}; proxy log:\n{}", h.sides[i].proxy.log_tail(20)));
}

/// Restarts side `i` with the harness's flags plus `extra`, and waits until it has synced.
pub(crate) fn restart_default(
    h: &mut Harness,
    i: usize,
    kill: bool,
    extra: &[&str],
    env: &[(&str, &str)],
) {
    let mut args = proxy::args(&h.kubeconfig());
    args.extend(extra.iter().map(|s| s.to_string()));
    h.restart_proxy(i, kill, &args, env);
    h.settle();
    h.wait_service_cidrs();
}

/// A Service `name` at `ip`: port 80 to the echo (8080) and port 90 to the line echo, TCP,
/// with one slice holding `eps`.
pub(crate) fn echo_service(h: &Harness, name: &str, ip: &str, eps: &[&str]) {
    h.api().create_service(
        &Svc::cluster_ip(name, ip)
            .port("http", Tcp, 80, 8080)
            .port("line", Tcp, 90, LINE_PORT),
    );
    h.api().create_slice(&echo_slice(name, eps));
}

pub(crate) fn echo_slice(name: &str, eps: &[&str]) -> Slice {
    eps.iter().fold(
        Slice::v4(&format!("{name}-1"), name)
            .port("http", Tcp, 8080)
            .port("line", Tcp, LINE_PORT),
        |s, ep| s.ep(Ep::ready(ep)),
    )
}

pub(crate) fn percentile(sorted: &[f64], q: f64) -> f64 {
    let idx = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}
