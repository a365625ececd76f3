//! The files a run writes: RESULTS.md, results.json, ratios.csv (for chart.py).

use std::fmt::Write as _;
use std::process::{Command, Stdio};

use anyhow::Result;

use crate::metrics::{defs_for, AGENT_DEFS, WHOLE_DEFS};
use crate::opts::Opts;
use crate::report::{agent_row, path_row, summary_tables};
use crate::results::{cell, ratio, usable, values, workload_names, Record};

/// results.json's key for the kube-proxy part.
pub const JSON_KEY: &str = "kube_proxy";

pub struct Info {
    pub date: String,
    pub cores: usize,
    pub cpu_model: String,
    pub mem: String,
    pub kernel: String,
    pub ours_version: String,
    pub agent_version: String,
    pub git: String,
    pub rustc: String,
    pub upstream: String,
}

pub fn cmd_out(cmd: &mut Command) -> String {
    cmd.stdin(Stdio::null());
    match cmd.output() {
        Ok(o) => {
            let mut s = String::from_utf8_lossy(&o.stdout).trim().to_string();
            if s.is_empty() {
                s = String::from_utf8_lossy(&o.stderr)
                    .trim()
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_string();
            }
            s
        }
        Err(e) => format!("({e})"),
    }
}

/// What the machine and checkout are, for the header of each part of RESULTS.md.
pub struct Machine {
    pub date: String,
    pub cores: usize,
    pub cpu_model: String,
    pub mem: String,
    pub kernel: String,
    pub git: String,
}

pub fn machine(repo: &std::path::Path) -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|x| x.1.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|k| k.parse::<f64>().ok())
        .map(|k| format!("{:.1} GiB", k / 1024.0 / 1024.0))
        .unwrap_or_else(|| "unknown".into());
    let git = {
        let d = cmd_out(
            Command::new("git")
                .args(["--no-optional-locks", "-C"])
                .arg(repo)
                .args(["describe", "--always", "--tags", "--dirty"]),
        );
        let c = cmd_out(
            Command::new("git")
                .args(["--no-optional-locks", "-C"])
                .arg(repo)
                .args(["rev-parse", "HEAD"]),
        );
        format!("{d} (commit {c})")
    };
    Machine {
        date: jiff::Timestamp::now()
            .strftime("%Y-%m-%d %H:%M:%S UTC")
            .to_string(),
        cores: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        cpu_model,
        mem,
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string(),
        git,
    }
}

pub fn machine_info(opts: &Opts) -> Info {
    let m = machine(&opts.repo);
    let upstream = std::fs::read_to_string(opts.upstream_dir.join("VERSIONS"))
        .unwrap_or_else(|_| "unknown (no VERSIONS file)".into());
    Info {
        date: m.date,
        cores: m.cores,
        cpu_model: m.cpu_model,
        mem: m.mem,
        kernel: m.kernel,
        ours_version: cmd_out(Command::new(&opts.server_bin).arg("--version")),
        agent_version: if opts.with_agents() {
            cmd_out(
                Command::new(
                    opts.agent_bin
                        .clone()
                        .unwrap_or_else(|| opts.server_bin.with_file_name("konnectivity-agent")),
                )
                .arg("--version"),
            )
        } else {
            String::new()
        },
        git: m.git,
        rustc: cmd_out(Command::new("rustc").arg("--version")),
        upstream: upstream
            .lines()
            .filter(|l| !l.contains("skew") && !l.contains("test driver"))
            .collect::<Vec<_>>()
            .join("; "),
    }
}

pub fn render_markdown(opts: &Opts, records: &[Record], info: &Info, total: f64) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# konnectivity-server vs upstream proxy-server: benchmarks\n"
    );
    let _ = writeln!(
        s,
        "Written by `benches/run{}` ({}; {} round(s), servers (and agents) alternating, medians with (min–max); {:.0} s of benchmarks).\n",
        if opts.quick { " --quick" } else { "" },
        if opts.quick { "quick mode: small sizes, the numbers are NOT representative" } else { "full mode" },
        opts.rounds,
        total
    );
    let _ = writeln!(s, "| | |\n|---|---|");
    let _ = writeln!(s, "| date | {} |", info.date);
    let _ = writeln!(
        s,
        "| machine | {} cores ({}), {} RAM, Linux {} |",
        info.cores, info.cpu_model, info.mem, info.kernel
    );
    let _ = writeln!(s, "| ours | {} — {} |", info.ours_version, info.git);
    let _ = writeln!(s, "| rustc | {} |", info.rustc);
    let _ = writeln!(s, "| upstream | {} |", info.upstream.replace('\n', "; "));
    let _ = writeln!(s, "| agent | upstream proxy-agent in the server tables (same binary and flags for both servers; --xfr-channel-size defaults){} |", if opts.with_agents() { format!("; the Agents section adds ours: {}", info.agent_version) } else { String::new() });
    s.push_str(&summary_tables(opts, records));
    let _ = writeln!(s, "\n![ratios](ratios.png)\n");
    let _ = writeln!(s, "## How it is measured\n");
    let _ = writeln!(s, "- Both servers get the same flags: `--mode=grpc|http-connect --uds-name=<tmp>/konn.sock --server-port=0 --cluster-cert/--cluster-key/--cluster-ca-cert` (ECDSA certificates generated per run), `--agent-port/--health-port/--admin-port` from a port allocator in [1024, 32767], `--*-bind-address=127.0.0.1 --server-count=1`. Ours additionally gets `--frontend-queue-stall-timeout=2s` in the head-of-line workload only. A fresh server and agent per workload and round; the far end (source/sink) is a separate process of the bench tool.");
    let _ = writeln!(s, "- Client: tonic/hyper HTTP/2 over the UDS with adaptive flow-control windows (as grpc-go); single-use = one HTTP/2 connection + one `Proxy` stream per dial (DIAL_REQ with a random id, DIAL_RSP, DATA both ways, CLOSE_REQ, CLOSE_RSP), reusable = one connection with a stream per dial, HTTP-CONNECT = one UDS connection per dial. Uploads are sent as 32 KiB DATA packets.");
    let _ = writeln!(s, "- Data: every byte is compared with a seeded position-dependent stream (downloads by the client, uploads by the far end, which reports the first bad offset); any mismatch fails the workload.");
    let _ = writeln!(s, "- CPU: utime+stime deltas from /proc/<pid>/stat (10 ms ticks) of the server, the agent, the far end and the client (the bench process). RSS: VmHWM (bulk peak) and VmRSS (idle: RSS with all tunnels open minus RSS after a 10-tunnel warm-up, over the count; the warm-up starts once the server and agent have settled for {} s). Idle CPU is measured after a {} s settle over {} s.", opts.idle_settle_secs, opts.idle_settle_secs, opts.idle_secs);
    let _ = writeln!(s, "- Agents: N agents connected from the bench process, each with its own TCP + mTLS (the dev PKI's agent certificate) + HTTP/2 connection (tonic, as the upstream agent: one `/AgentService/Connect` stream with `agentid` metadata, read until it ends, nothing sent). RSS per agent = (VmRSS with all N connected − VmRSS after a 10-agent warm-up, with the one upstream agent connected) / N; idle CPU per agent over the same settle and window as the idle tunnels, / N.");
    if opts.with_agents() {
        let _ = writeln!(s, "- Agents section: the workloads short-single, short-connect, bulk and idle-{} run with each of the four (server, agent) pairs (the server tables' runs are the Go-agent pairs), plus agent-idle-1/agent-idle-3: one agent connected to 1 or 3 servers of one implementation (3: `--server-count=3`, distinct `--server-id`s, behind a TCP round-robin proxy in the bench tool, the agent dialing that one address until it holds a connection to each server), idle; its VmRSS and CPU after a {} s settle over {} s, then one checked tunnel through each server. Agent flags: the same for both agents (`--ca-cert --agent-cert --agent-key --proxy-server-host=127.0.0.1 --proxy-server-port --agent-id --agent-identifiers=host=localhost&ipv4=127.0.0.1 --health-server-host=127.0.0.1 --health-server-port --admin-bind-address=127.0.0.1 --admin-server-port`), agent-idle adds `--sync-interval=100ms --sync-interval-cap=1s`. The four pairs run in one order in odd rounds and reversed in even rounds, so every comparison alternates which side goes first.", opts.agent_idle_count(), opts.idle_settle_secs, opts.idle_secs);
    }
    let _ = writeln!(s, "- Dial latency: single-use from the UDS connect to DIAL_RSP (what konnectivity-client's tunnel creation costs kube-apiserver); reusable from opening the stream to DIAL_RSP; HTTP-CONNECT from the UDS connect to the 200 response.");
    let _ = writeln!(s, "- Head-of-line: {} streaming tunnels read for {} s (dials included in the window) without, then with, one tunnel that requested an endless stream and never reads (opened 1 s before the window); share = with/without.", opts.hol_active, opts.hol_secs);
    let _ = writeln!(s, "- Failures: a workload run fails on any failed or timed-out tunnel (a short tunnel has {} s for dial, transfer and close), any failed close, any data mismatch, or a server or agent that does not start; the tool then exits non-zero. A failed run's numbers are not in the tables (results.json keeps them), and neither are the other server's numbers of the same round, so every comparison is over the same rounds. Timed-out dials count in the latency percentiles as +inf (a percentile that lands on one shows as ≥ the timeout). In the head-of-line workload, tunnels the stalled tunnel blocks are the measured effect: they count with 0 bytes and are reported, not failed.", opts.short_timeout_secs);
    let _ = writeln!(s, "- Ratios are ours/Go of the medians; the range is of the per-round ratios (servers alternate which goes first each round). Targets are reported, not asserted.");
    s
}

pub fn json_escape_records(records: &[Record]) -> serde_json::Value {
    serde_json::Value::Array(
        records
            .iter()
            .map(|r| {
                serde_json::json!({
                    "workload": r.workload,
                    "impl": r.imp,
                    "agent": r.agent,
                    "round": r.round,
                    "secs": r.secs,
                    "metrics": r.metrics.iter().map(|(k, v)| (k.clone(), if v.is_finite() { serde_json::json!(v) } else { serde_json::Value::Null })).collect::<serde_json::Map<_, _>>(),
                    "censored": r.censored,
                    "samples": r.samples,
                    "error": r.error,
                    "in_tables": usable(records, r),
                    "notes": r.notes,
                })
            })
            .collect(),
    )
}

pub fn write_json(opts: &Opts, records: &[Record], info: &Info, total: f64) -> Result<()> {
    let path = opts.out.join("results.json");
    // The kube-proxy part's results (`konn_bench kube-proxy`) stay.
    let kept = std::fs::read_to_string(&path)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v.get(JSON_KEY).cloned());
    let mut v = serde_json::json!({
        "quick": opts.quick,
        "rounds": opts.rounds,
        "total_secs": total,
        "date": info.date,
        "cores": info.cores,
        "cpu": info.cpu_model,
        "memory": info.mem,
        "ours": info.ours_version,
        "git": info.git,
        "upstream": info.upstream,
        "records": json_escape_records(records),
    });
    if let Some(k) = kept {
        v[JSON_KEY] = k;
    }
    std::fs::write(&path, serde_json::to_string_pretty(&v)?)?;
    Ok(())
}

/// For the chart: label, ours/Go ratio, higher_better, target ratio (or empty), ours, go.
pub fn write_ratios_csv(opts: &Opts, records: &[Record]) -> Result<()> {
    let mut s = String::from("label,ratio,higher_better,target,ours,go\n");
    let ws = workload_names(records);
    let chart: &[(&str, &str)] = &[
        ("bulk", "mbps"),
        ("bulk", "server_cpu_s_per_gib"),
        ("bulk", "peak_rss_mib"),
        ("short-single", "tunnels_per_s"),
        ("short-single", "dial_p99_ms"),
        ("short-single", "server_cpu_us_per_tunnel"),
        ("short-reusable", "tunnels_per_s"),
        ("short-reusable", "server_cpu_us_per_tunnel"),
        ("short-connect", "tunnels_per_s"),
        ("short-connect", "server_cpu_us_per_tunnel"),
        ("idle", "rss_kib_per_tunnel"),
        ("idle", "idle_cpu_ms_per_s"),
        ("connect-idle", "rss_kib_per_tunnel"),
        ("agents", "rss_kib_per_agent"),
        ("hol", "share_pct"),
    ];
    for (w0, key) in chart {
        let targets: Vec<String> = if matches!(*w0, "idle" | "connect-idle" | "agents") {
            ws.iter()
                .filter(|w| w.starts_with(&format!("{w0}-")))
                .cloned()
                .collect()
        } else {
            vec![w0.to_string()]
        };
        for w in targets {
            if !ws.contains(&w) {
                continue;
            }
            let Some(d) = defs_for(&w).into_iter().find(|d| d.key == *key) else {
                continue;
            };
            let o = cell(&values(records, &w, "ours", key)).med;
            let g = cell(&values(records, &w, "go", key)).med;
            let r = ratio(records, &w, key).r;
            let label = format!("{w}: {}", d.label).replace(',', ";");
            let t = if *key == "share_pct" {
                "0.9".to_string()
            } else {
                d.target.map(|t| t.0.to_string()).unwrap_or_default()
            };
            let num = |v: f64| {
                if v.is_finite() {
                    format!("{v}")
                } else {
                    String::new()
                }
            };
            let _ = writeln!(
                s,
                "{label},{},{},{t},{},{}",
                num(r),
                d.higher_better,
                num(o),
                num(g)
            );
        }
    }
    // The agent comparison: targeted rows per server, and the whole path.
    let num = |v: f64| {
        if v.is_finite() {
            format!("{v}")
        } else {
            String::new()
        }
    };
    for d in AGENT_DEFS.iter().filter(|d| {
        d.target.is_some() || (d.workload == "agent-idle-3" && d.key == "agent_rss_mib")
    }) {
        let w = if d.workload == "idle" {
            format!("idle-{}", opts.agent_idle_count())
        } else {
            d.workload.to_string()
        };
        if !ws.contains(&w) || !records.iter().any(|r| r.agent == "ours") {
            continue;
        }
        for (server, sname) in [("ours", "ours"), ("go", "Go")] {
            let row = agent_row(records, &w, server, d.key);
            let label = format!("agent behind {sname} server: {w}: {}", d.label).replace(',', ";");
            let t = d.target.map(|t| t.0.to_string()).unwrap_or_default();
            let _ = writeln!(
                s,
                "{label},{},{},{t},{},{}",
                num(row.ratio.r),
                d.higher_better,
                num(row.ours.med),
                num(row.go.med)
            );
        }
    }
    for d in WHOLE_DEFS.iter().filter(|d| d.target.is_some()) {
        if !ws.iter().any(|w| w == d.workload) || !records.iter().any(|r| r.agent == "ours") {
            continue;
        }
        let (cells, r) = path_row(records, d.workload, d.key);
        let label = format!("all-Rust vs all-Go: {}: {}", d.workload, d.label).replace(',', ";");
        let t = d.target.map(|t| t.0.to_string()).unwrap_or_default();
        let _ = writeln!(
            s,
            "{label},{},{},{t},{},{}",
            num(r.r),
            d.higher_better,
            num(cells[3].med),
            num(cells[0].med)
        );
    }
    std::fs::write(opts.out.join("ratios.csv"), s)?;
    Ok(())
}
