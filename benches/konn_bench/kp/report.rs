//! The kube-proxy section of RESULTS.md: the header, a table per size and how it is measured
//! (the overview and the targets: targets.rs; where it goes: splice.rs).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use super::cells::{all_vals, cell, ratio_cell};
use super::info::Info;
use super::opts::{thousands, Opts, Size};
use super::splice::{BEGIN, END};
use super::state::State;
use crate::results::{fmt_num, median, Record};

/// One row of a table: the record key, what it is, and how a bound reads.
struct Row {
    key: &'static str,
    label: &'static str,
    /// A censored value is a timeout: "> N" (else a percentile that hit one: "≥ N").
    timeout: bool,
}

const fn row(key: &'static str, label: &'static str, timeout: bool) -> Row {
    Row {
        key,
        label,
        timeout,
    }
}

const START_ROWS: &[Row] = &[
    row(
        "cold_sync_s",
        "start → rules in the kernel, empty table (s)",
        true,
    ),
    row(
        "cold_sync_internal_s",
        "… of which the first sync itself (s; the proxy's full-sync histogram)",
        false,
    ),
    row("cold_cpu_s", "… CPU of the proxy up to then (s)", false),
    row(
        "cold_nft_cpu_s",
        "… CPU of its `nft` children up to then (s)",
        false,
    ),
    row(
        "restart_sync_s",
        "restart → rules in the kernel, its own table left in place (s)",
        true,
    ),
    row(
        "restart_sync_internal_s",
        "… of which the first sync itself (s)",
        false,
    ),
    row("restart_cpu_s", "… CPU of the proxy up to then (s)", false),
    row(
        "restart_nft_cpu_s",
        "… CPU of its `nft` children up to then (s)",
        false,
    ),
];

const CHANGE_ROWS: &[Row] = &[
    row(
        "change0_p50_ms",
        "endpoint change → kernel, p50 (ms), min-sync-period 0",
        false,
    ),
    row("change0_p99_ms", "… p99 (ms), min-sync-period 0", false),
    row(
        "change0_cpu_ms",
        "… proxy CPU per change (ms), min-sync-period 0",
        false,
    ),
    row(
        "change0_nft_cpu_ms",
        "… `nft` CPU per change (ms), min-sync-period 0",
        false,
    ),
    row(
        "change1_p50_ms",
        "endpoint change → kernel, p50 (ms), min-sync-period 1 s (default)",
        false,
    ),
    row("change1_p99_ms", "… p99 (ms), 1 s", false),
    row("change1_cpu_ms", "… proxy CPU per change (ms), 1 s", false),
    row(
        "change1_nft_cpu_ms",
        "… `nft` CPU per change (ms), 1 s",
        false,
    ),
    row(
        "newsvc0_ms",
        "new Service → kernel (ms, median of the run's), min-sync-period 0",
        false,
    ),
    row("newsvc1_ms", "new Service → kernel (ms), 1 s", false),
];

const MEM_ROWS: &[Row] = &[
    row(
        "settled_rss_mib",
        "RSS, settled after the first sync (MiB)",
        false,
    ),
    row(
        "cold_peak_rss_mib",
        "peak RSS up to the end of the first sync (MiB, VmHWM)",
        false,
    ),
    row(
        "cold_nft_peak_mib",
        "peak RSS of an `nft` child during it (MiB)",
        false,
    ),
    row(
        "restart_peak_rss_mib",
        "peak RSS up to the end of the restart's first sync (MiB)",
        false,
    ),
    row(
        "restart_nft_peak_mib",
        "peak RSS of an `nft` child during it (MiB)",
        false,
    ),
];

const KERNEL_ROWS: &[Row] = &[
    row(
        "ruleset_lines",
        "ruleset after the first sync: lines of `nft list table ip kube-proxy`",
        false,
    ),
    row(
        "ruleset_services",
        "… Services in its service-ips map",
        false,
    ),
    row("list_s", "… `nft list table` (s)", false),
    row(
        "floor_s",
        "floor: that ruleset by `nft -f` into an empty namespace, alone (s)",
        true,
    ),
    row("floor_user_s", "… nft's user CPU (s)", false),
    row("floor_sys_s", "… system CPU, the kernel (s)", false),
];

fn table(s: &mut String, records: &[Record], size: &str, rows: &[Row]) {
    let present: Vec<&Row> = rows
        .iter()
        .filter(|r| {
            records
                .iter()
                .any(|x| x.workload == size && x.metrics.contains_key(r.key))
        })
        .collect();
    if present.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "\n| metric | ours | upstream | ours/upstream (per-round range) |\n|---|---|---|---|"
    );
    for r in present {
        let o = all_vals(records, size, "ours", r.key);
        let u = all_vals(records, size, "upstream", r.key);
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} |",
            r.label,
            cell(&o, r.timeout),
            cell(&u, r.timeout),
            ratio_cell(&o, &u)
        );
    }
}

pub fn render(opts: &Opts, records: &[Record], info: &Info, states: &[State]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{BEGIN}");
    let _ = writeln!(
        s,
        "# kube-proxy vs upstream kube-proxy v1.37.2: benchmarks\n"
    );
    let failed: Vec<&Record> = records.iter().filter(|r| r.error.is_some()).collect();
    if !failed.is_empty() {
        let _ = writeln!(
            s,
            "**THIS RUN FAILED**: {} of {} runs failed (listed under Failures).\n",
            failed.len(),
            records.len()
        );
    }
    let _ = writeln!(
        s,
        "Written by `benches/run{} --kube-proxy` ({}; {} round(s), ours and upstream alternating which goes first; every cell: median (min–max) over rounds, n = rounds; {:.0} s of benchmarks).\n",
        if opts.quick { " --quick" } else { "" },
        if opts.quick {
            "quick mode: small sizes, the numbers are NOT representative"
        } else {
            "full mode"
        },
        opts.rounds,
        info.total_secs
    );
    // What this run covered, and what of the full set it left out (a run cut to fit the time
    // says so here rather than by silence).
    let full = ["0x0", "1000x10", "10000x10", "44000x2", "5000x50"];
    let run: Vec<String> = opts.sizes.iter().map(Size::title).collect();
    let left: Vec<String> = full
        .iter()
        .filter_map(|f| Size::parse(f).ok())
        .filter(|f| !opts.sizes.contains(f))
        .map(|f| f.title())
        .collect();
    let _ = writeln!(
        s,
        "What was run: sizes (Services x endpoints) {}; {} round(s); n = {} endpoint changes per series (a series stops at {:.0} s), {} new Services per series; first syncs bounded at {:.0} s; data plane at {}.{}\n",
        run.join(", "),
        opts.rounds,
        opts.changes,
        opts.series_budget_secs,
        opts.new_services,
        opts.first_sync_timeout_secs,
        opts.dataplane_size
            .map(|d| d.title())
            .unwrap_or_else(|| "none".into()),
        if left.is_empty() {
            String::new()
        } else {
            format!(
                " **Not run** in this run: {} (no numbers below for them).",
                left.join(", ")
            )
        }
    );
    let _ = writeln!(
        s,
        "The arguments of this run: `konn_bench kube-proxy {}` (`benches/run{} --kube-proxy` passes them on).\n",
        opts.args.join(" "),
        if opts.quick { " --quick" } else { "" }
    );
    let _ = writeln!(s, "Reproduce (as root; the populated clusters are cached in `~/.cache/kube-traffic-bench/`, so only the first run of a size creates its objects):\n");
    let _ = writeln!(s, "```sh");
    let _ = writeln!(
        s,
        "benches/run --kube-proxy                        # this section: builds ours as shipped, upstream from tests/kube/build.sh's cache"
    );
    let _ = writeln!(
        s,
        "benches/run --kube-proxy --sizes 10000x10 --rounds 1   # one size (0x0: no Services)"
    );
    let _ = writeln!(
        s,
        "benches/run --kube-proxy --kube-proxy-bin PATH  # another build of ours, e.g. a branch's target/release/kube-proxy"
    );
    let _ = writeln!(
        s,
        "benches/run --quick --kube-proxy                # what CI runs (small sizes, 1 round, into target/konn-bench-quick/)"
    );
    let _ = writeln!(s, "```\n");
    let loads: Vec<f64> = records
        .iter()
        .flat_map(|r| {
            [r.metrics.get("load1_start"), r.metrics.get("load1_end")]
                .into_iter()
                .flatten()
                .copied()
        })
        .filter(|x| x.is_finite())
        .collect();
    let busy: Vec<f64> = records
        .iter()
        .filter_map(|r| r.metrics.get("machine_busy_pct").copied())
        .filter(|x| x.is_finite())
        .collect();
    let range = |v: &[f64]| {
        if v.is_empty() {
            "n/a".to_string()
        } else {
            format!(
                "{} ({}–{})",
                fmt_num(median(v)),
                fmt_num(v.iter().copied().fold(f64::INFINITY, f64::min)),
                fmt_num(v.iter().copied().fold(f64::NEG_INFINITY, f64::max))
            )
        }
    };
    let _ = writeln!(s, "| | |\n|---|---|");
    let _ = writeln!(s, "| date | {} |", info.date);
    let _ = writeln!(s, "| machine | {}; {} |", info.machine, info.nft);
    let _ = writeln!(
        s,
        "| load while measuring | 1-min load average at the start and end of each run: {}; the machine's CPU busy over each run (all processes, the run's own included): {} % |",
        range(&loads),
        range(&busy)
    );
    let _ = writeln!(s, "| ours | {} — {} |", info.ours, info.git);
    let _ = writeln!(s, "| upstream | {} |", info.upstream);
    let _ = writeln!(
        s,
        "| both run with | `{}` and, in the first run of each measurement, `{}` |",
        super::harness::proxy::args(Path::new("<node kubeconfig>")).join(" "),
        super::measure::MIN_SYNC_0
    );
    for st in states {
        if !st.info.is_empty() {
            let _ = writeln!(
                s,
                "| cluster {} | {} |",
                st.size.title(),
                st.info.replace('|', "/")
            );
        }
    }

    let _ = writeln!(
        s,
        "\n## Summary (medians: ours vs upstream (ours/upstream); `>`: a timeout, a lower bound)"
    );
    super::targets::summary(&mut s, records, opts);
    super::targets::targets(&mut s, records, opts);

    for z in super::targets::sizes_in(records, opts) {
        let w = z.label();
        let eps = z.services * z.endpoints;
        if z.idle() {
            let _ = writeln!(
                s,
                "\n## No Services (the apiserver's own `kubernetes` Service only): idle"
            );
        } else {
            let _ = writeln!(
                s,
                "\n## {} ({} Services, {} endpoints, {} on this node)",
                z.title(),
                thousands(z.services),
                thousands(eps),
                thousands(eps / 100)
            );
        }
        let _ = writeln!(s, "\n### Start and restart");
        table(&mut s, records, &w, START_ROWS);
        if !z.idle() {
            let _ = writeln!(s, "\n### Changes: to the kernel, and their CPU");
            table(&mut s, records, &w, CHANGE_ROWS);
        }
        let _ = writeln!(s, "\n### Memory");
        table(&mut s, records, &w, MEM_ROWS);
        if !z.idle() {
            let _ = writeln!(s, "\n### The kernel's floor");
            table(&mut s, records, &w, KERNEL_ROWS);
            rulesets(&mut s, records, &w);
        }
        if records
            .iter()
            .any(|r| r.workload == w && r.metrics.contains_key("dp_clusterip_cps"))
        {
            let _ = writeln!(
                s,
                "\n### Data plane: new TCP connections per second from the client pod's namespace"
            );
            table(
                &mut s,
                records,
                &w,
                &[
                    row(
                        "dp_clusterip_cps",
                        "through the ClusterIP (the node's ruleset as this proxy programmed it)",
                        false,
                    ),
                    row(
                        "dp_direct_cps",
                        "straight to the pod's address (no DNAT; the same node, same run)",
                        false,
                    ),
                    row(
                        "dp_clusterip_rel",
                        "through the ClusterIP / straight to the pod, each rep's pair (what the target compares: the machine's rate moves between the two proxies' turns)",
                        false,
                    ),
                ],
            );
        }
        notes(&mut s, records, &w);
    }

    if !failed.is_empty() {
        let _ = writeln!(s, "\n## Failures\n");
        for r in &failed {
            let _ = writeln!(
                s,
                "- {} {} round {}: {}",
                r.imp,
                r.workload,
                r.round,
                r.error.as_deref().unwrap_or("").replace('\n', " ")
            );
        }
    }
    how(&mut s, opts);
    let _ = writeln!(s, "{END}");
    s
}

fn rulesets(s: &mut String, records: &[Record], size: &str) {
    let mut by: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in records.iter().filter(|r| r.workload == size) {
        for n in &r.notes {
            if let Some(d) = n.strip_prefix("ruleset digest ") {
                by.entry(d.to_string())
                    .or_default()
                    .push(format!("{} round {}", r.imp, r.round));
            }
        }
    }
    match by.len() {
        0 => {}
        1 => {
            let _ = writeln!(
                s,
                "\nThe rulesets after the first sync were the same in every run, ours and upstream's (digest of the listing's items, order aside: {}).",
                by.keys().next().map(String::as_str).unwrap_or("")
            );
        }
        _ => {
            let _ = writeln!(s, "\nThe rulesets after the first sync differ:");
            for (d, runs) in by {
                let _ = writeln!(s, "- {d}: {}", runs.join(", "));
            }
        }
    }
}

fn notes(s: &mut String, records: &[Record], size: &str) {
    let notes: Vec<String> = records
        .iter()
        .filter(|r| r.workload == size)
        .flat_map(|r| {
            r.notes
                .iter()
                .filter(|n| !n.starts_with("ruleset digest "))
                .map(move |n| format!("{} round {}: {n}", r.imp, r.round))
        })
        .collect();
    if !notes.is_empty() {
        let _ = writeln!(s, "\nNotes:");
        for n in notes {
            let _ = writeln!(s, "- {n}");
        }
    }
}

fn how(s: &mut String, opts: &Opts) {
    let _ = writeln!(s, "\n## How it is measured\n");
    let _ = writeln!(s, "- Clusters: for each size the objects are created once through the API ({} concurrent requests) by an apiserver on an empty etcd, and the etcd data is kept (`~/.cache/kube-traffic-bench/etcd/<layout>_<size>_<versions>/`). Every run copies it and starts etcd and kube-apiserver v1.37.2 on the copy (tests/kube/start.sh, `KUBE_ETCD_DATA`), so both proxies start against exactly the same objects. Services: type ClusterIP, one TCP port, no selector; EndpointSlices written as the controller would (up to 100 endpoints each), every endpoint ready, spread over 100 nodes, one in a hundred on this node. Plus two Services of the benchmark's own (`probe`: one endpoint, pod1's echo server; `dp`: pod1's and pod2's sinks).", opts.create_concurrency);
    let _ = writeln!(s, "- Node: tests/kube_proxy/node.rs's namespaces (node, client, two pods with echo servers), the apiserver reached through a socat relay; one proxy at a time on the machine, each in a fresh node, its flags the side-by-side tests' (above). Runs alternate: ours first in odd rounds, upstream first in even ones.");
    let _ = writeln!(s, "- Start → rules: from the exec of the proxy to the completion time of its first full sync, `kubeproxy_sync_proxy_rules_last_timestamp_seconds{{ip_family=\"IPv4\"}}` on its metrics port (polled every 100 ms; the timestamp is the sync's own, the poll only finds it). The first sync follows the initial LIST of every Service and EndpointSlice, so this includes reading the cluster. \"Of which the first sync itself\": the sum of `kubeproxy_sync_full_proxy_rules_duration_seconds` after that one sync. A run that has not synced within {:.0} s is stopped there and reported as `> {:.0}`. Restart: the proxy stopped with SIGTERM (both leave their table in place) and started again in the same node, with the default minimum sync period.", opts.first_sync_timeout_secs, opts.first_sync_timeout_secs);
    let _ = writeln!(s, "- Endpoint change → kernel: the `probe` Service's one endpoint swapped between pod1 and pod2 by a PATCH of its slice, timed from before the PATCH to the start of the first new TCP connection through its ClusterIP that the new pod answers (a connection every ~2 ms from the client namespace, each meeting the rules afresh; the API round trip and the watch are in it, as in the network-programming SLI). {} changes per series (a series stops at {:.0} s), a pause drawn uniformly from [0, {} ms) after each; first with `--iptables-min-sync-period=0` (the first run), then with the default 1 s (after the restart). Proxy CPU per change: the proxy's utime+stime over the series / changes; `nft` CPU: its waited-for children's (cutime+cstime), the `nft` processes it runs.", opts.changes, opts.series_budget_secs, opts.gap_max_ms);
    let _ = writeln!(s, "- New Service → kernel: {} per series; each Service's slice is created 1.5 s before it, then the Service (a fixed ClusterIP) is timed from before its POST to the first connection through the ClusterIP that pod1 answers (a ClusterIP without rules drops the SYN: attempts every ~20 ms).", opts.new_services);
    let _ = writeln!(s, "- Memory: VmRSS after the first sync and a {:.0} s settle (the no-Services size is the idle RSS); VmHWM when the first sync is seen complete; the `nft` children's VmHWM polled every 20 ms while they run.", opts.settle_secs);
    let _ = writeln!(s, "- The kernel's floor: `nft list table ip kube-proxy` of the node right after the first sync, loaded with `nft -f` into a fresh empty namespace once the run's processes are gone: the time nft and the kernel alone need for the work of that sync. User CPU is nft's own (parsing, evaluation, its cache); system CPU is the kernel's. Rulesets are compared by a digest of the listing's comma-separated items, sorted (the kernel lists set elements in hash order).");
    if let Some(d) = opts.dataplane_size {
        let _ = writeln!(s, "- Data plane (at {}): 4 threads in the client namespace each open a TCP connection to the `dp` ClusterIP (pod1's and pod2's sinks, a small Rust server that writes one byte and closes), read to the end and close with a reset (so no TIME_WAIT and no port exhaustion), for {:.0} s, {} time(s) per run, alternating with the same load straight to pod1's address; the median per run. All of it, the client, the sinks and the kernel's forwarding, shares the same cores.", d.title(), opts.dataplane_secs, opts.dataplane_reps);
    }
    let _ = writeln!(s, "- Load: the machine is shared; the 1-min load average and the CPU busy share of every run are in the header. Numbers from a busy machine are upper bounds for both proxies alike.");
}
