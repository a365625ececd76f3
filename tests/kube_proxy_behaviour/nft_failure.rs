//! `nft-failure`: a refused transaction, counted, logged, retried as a full sync; /healthz 503.

use super::*;

pub(crate) fn nft_failure(h: &mut Harness) {
    let i = ours(h);
    let dir = h.dir().join("fakebin");
    std::fs::create_dir_all(&dir).unwrap();
    let flag = h.dir().join("nft-fail");
    let real = which("nft");
    let script = format!(
        "#!/bin/sh\n# nft, refusing transactions while {flag} exists (a kernel that says no).\n\
         if [ -e {flag} ] && [ \"$1\" = \"-f\" ]; then\n  cat >/dev/null\n  \
         echo 'Error: Could not process rule: Device or resource busy (injected by the test)' >&2\n  exit 1\nfi\n\
         exec {real} \"$@\"\n",
        flag = flag.display(),
        real = real.display()
    );
    let fake = dir.join("nft");
    std::fs::write(&fake, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let sync_period = Duration::from_secs(2);
    restart_default(
        h,
        i,
        false,
        &["--iptables-sync-period=2s"],
        // The nft applier, so that the fake nft is the kernel's voice (netlink is the default).
        &[("PATH", path.as_str()), ("KUBE_PROXY_NFT_APPLIER", "nft")],
    );
    let failures_v4 = "kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family=\"IPv4\"}";
    let failures_v6 = "kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family=\"IPv6\"}";
    assert_eq!(metric(h, i, failures_v4), 0.0, "failures before the fault");
    assert_eq!(
        get(h, i, "127.0.0.1:10256", "/healthz").map(|r| r.0),
        Ok(200)
    );
    let full_syncs_before = count_in_log(h, i, "fullSync=true");

    std::fs::write(&flag, "").unwrap();
    let t_fault = Instant::now();
    echo_service(h, "fails", "10.96.22.1", &[POD1]);
    wait_metric(h, i, failures_v4, Duration::from_secs(15), |v| v >= 1.0);
    let first_failure = t_fault.elapsed();
    // The counter moves before the line is logged, and log lines are written by a thread of
    // their own: wait for the record.
    let failed_line = wait_until(
        "the refused transaction in the log",
        Duration::from_secs(10),
        Duration::from_millis(20),
        || {
            log_records(h, i, "nftables sync failed")
                .into_iter()
                .find(|r| r.contains("transaction=<") && r.ends_with("\n >"))
        },
    )
    .unwrap_or_default();
    // nft's reason, and the transaction's first lines (nft commands on the table).
    let tx_lines = failed_line
        .split_once("transaction=<\n")
        .map(|(_, t)| t.lines().filter(|l| l.contains(" kube-proxy ")).count())
        .unwrap_or(0);
    if !failed_line.contains("injected by the test") || tx_lines == 0 {
        h.fail(format!(
            "the failure is not logged with nft's reason and the transaction's first lines: {failed_line:?}"
        ));
    }
    // Retried every syncPeriod (each retry is a full sync: checked below, from the log).
    wait_metric(h, i, failures_v4, Duration::from_secs(15), |v| v >= 2.0);
    // 503 once a sync has been pending for 2 x syncPeriod, not before.
    let unhealthy = wait_until(
        "/healthz 503",
        Duration::from_secs(20),
        Duration::from_millis(50),
        || {
            let (code, body) = get(h, i, "127.0.0.1:10256", "/healthz").ok()?;
            (code == 503).then_some(body)
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let t_503 = t_fault.elapsed();
    if t_503 < sync_period * 2 {
        h.fail(format!(
            "/healthz turned 503 after {t_503:?}, before 2 x syncPeriod ({:?})",
            sync_period * 2
        ));
    }
    let livez = get(h, i, "127.0.0.1:10256", "/livez").map(|r| r.0);
    let v4 = metric(h, i, failures_v4);
    let v6 = metric(h, i, failures_v6);
    let t = table(h, i, "ip").unwrap();
    if !t.service_ports("10.96.22.1", "tcp").is_empty() {
        h.fail("a refused transaction's Service is in the kernel".into());
    }
    note(format!(
        "nft-failure: first failure {:.2} s after the change; {v4} IPv4 / {v6} IPv6 failures counted; /healthz 503 after {:.2} s (2 x syncPeriod = {:?}), /livez {livez:?}; body {unhealthy}",
        first_failure.as_secs_f64(),
        t_503.as_secs_f64(),
        sync_period * 2
    ));
    note(format!("nft-failure: logged: {}", cut(&failed_line, 700)));

    std::fs::remove_file(&flag).unwrap();
    let t_fixed = Instant::now();
    wait_until(
        "/healthz 200 after nft works again",
        Duration::from_secs(20),
        Duration::from_millis(50),
        || (get(h, i, "127.0.0.1:10256", "/healthz").ok()?.0 == 200).then_some(()),
    )
    .unwrap_or_else(|e| panic!("{e}; log:\n{}", h.sides[i].proxy.log_tail(20)));
    let recovered = t_fixed.elapsed();
    h.settle();
    h.probe(&[p("client", "tcp", "10.96.22.1", 80, all(&["pod1<-masq"]))]);
    let v4_after = metric(h, i, failures_v4);
    let full_syncs = count_in_log(h, i, "fullSync=true") - full_syncs_before;
    // Every IPv4 attempt after the first failure, up to the one that went in, was full.
    let attempts = ipv4_attempts_after_failure(&log_text(h, i));
    let all_full = !attempts.is_empty()
        && attempts.iter().all(|(full, _)| *full)
        && attempts.last().is_some_and(|(_, failed)| !failed);
    if !all_full {
        h.fail(format!(
            "the retries after the failure (fullSync, failed) were {attempts:?}, not full syncs ending in success"
        ));
    }
    note(format!(
        "nft-failure: IPv4 attempts after the first failure (fullSync, failed): {attempts:?}; {full_syncs} full syncs logged since the fault"
    ));
    note(format!(
        "nft-failure: recovered {:.2} s after nft worked again (/healthz 200, the Service answers); failures counter {v4_after}",
        recovered.as_secs_f64()
    ));
    h.expect_no_more_failures(i, v4_after);
    restart_default(h, i, false, &[], &[]);
}

/// The IPv4 sync attempts after the first refused transaction in `log`, up to the first that
/// went in: (fullSync, failed) each.
pub(crate) fn ipv4_attempts_after_failure(log: &str) -> Vec<(bool, bool)> {
    let mut attempts: Vec<(bool, bool)> = Vec::new();
    let mut seen_failure = false;
    for line in log.lines() {
        if !line.contains("ipFamily=\"IPv4\"") {
            continue;
        }
        if line.contains("nftables sync failed") {
            if seen_failure {
                if let Some(last) = attempts.last_mut() {
                    last.1 = true;
                }
            }
            seen_failure = true;
        } else if seen_failure && line.contains("Syncing nftables rules") {
            if attempts.last().is_some_and(|(_, failed)| !failed) {
                break;
            }
            attempts.push((line.contains("fullSync=true"), false));
        }
    }
    attempts
}

/// An absolute path of `tool` on PATH.
pub(crate) fn which(tool: &str) -> PathBuf {
    let out = kube_proxy::procs::must("sh", &["-c", &format!("command -v {tool}")]);
    PathBuf::from(out.trim())
}

pub(crate) fn cut(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

pub(crate) trait NoMoreFailures {
    fn expect_no_more_failures(&mut self, i: usize, was: f64);
}

impl NoMoreFailures for Harness {
    /// After a settle: the failure counter has not moved since `was`.
    fn expect_no_more_failures(&mut self, i: usize, was: f64) {
        let series = "kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family=\"IPv4\"}";
        let now = metric(self, i, series);
        if now != was {
            self.fail(format!("sync failures went on: {was} -> {now}"));
        }
    }
}
