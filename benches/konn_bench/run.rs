//! Orchestration: the far end, the jobs of each round (servers alternating) and their deadlines.

use std::collections::{BTreeSet, HashSet};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use kube_traffic::tls::DevPki;

use crate::agent_idle::w_agent_idle;
use crate::agents::w_agents;
use crate::env::{Ctx, Impl, Pair};
use crate::opts::Opts;
use crate::output::{machine_info, render_markdown, write_json, write_ratios_csv};
use crate::procs::{set_pdeathsig, Ports, Proc};
use crate::report::summary_tables;
use crate::results::{fmt_num, Metrics, Record};
use crate::tunnel::Style;
use crate::workloads::{w_bulk, w_hol, w_idle, w_limit, w_short, Outcome};

/// The heading of the hand-kept breakdown section of RESULTS.md (see benches/profile).
const PROFILE_SECTION: &str = "## Per-tunnel and per-agent cost: breakdowns";

pub struct Job {
    pub workload: String,
    /// None: the direct-TCP limit (no server, no agent).
    pub pair: Option<Pair>,
}

/// The four (server, agent) pairs in the order of odd rounds; even rounds run them reversed.
/// So each comparison (servers behind the Go agent, agents behind each server, all-Rust vs
/// all-Go) alternates which side goes first, and the server pairs keep the order they had
/// alone (ours first in odd rounds).
pub const PAIR_ORDER: [Pair; 4] = [
    Pair::new(Impl::Ours, Impl::Go),
    Pair::new(Impl::Go, Impl::Go),
    Pair::new(Impl::Go, Impl::Ours),
    Pair::new(Impl::Ours, Impl::Ours),
];

/// The workloads of one server group of `--workloads`.
fn server_group(opts: &Opts, w: &str) -> Vec<String> {
    match w {
        "bulk" => vec!["bulk".into()],
        "short" => vec![
            "short-single".into(),
            "short-reusable".into(),
            "short-connect".into(),
        ],
        "idle" => opts
            .idle_counts
            .iter()
            .map(|n| format!("idle-{n}"))
            .collect(),
        "connect-idle" => opts
            .connect_idle_counts
            .iter()
            .map(|n| format!("connect-idle-{n}"))
            .collect(),
        "agents" => opts
            .agent_counts
            .iter()
            .map(|n| format!("agents-{n}"))
            .collect(),
        "hol" => vec!["hol".into()],
        _ => vec![],
    }
}

/// One round's jobs. A server workload runs the two servers behind upstream's agent; a
/// workload of the agent comparison runs all four pairs, so when the server jobs also have it
/// (bulk, short-single, ...), their Go-agent runs are shared, not repeated.
pub fn jobs_for_round(opts: &Opts, round: usize) -> Vec<Job> {
    let mut order = PAIR_ORDER.to_vec();
    if round.is_multiple_of(2) {
        order.reverse();
    }
    let agent_names = if opts.with_agents() {
        opts.agent_workloads()
    } else {
        vec![]
    };
    let server_names: Vec<String> = opts
        .workloads
        .iter()
        .flat_map(|w| server_group(opts, w))
        .collect();
    let mut out = Vec::new();
    for w in &opts.workloads {
        let names: Vec<String> = match w.as_str() {
            "limit" => {
                out.push(Job {
                    workload: "limit".into(),
                    pair: None,
                });
                continue;
            }
            // The agent workloads no server group runs, where `agent` is in the list.
            "agent" => agent_names
                .iter()
                .filter(|n| !server_names.contains(n))
                .cloned()
                .collect(),
            w => server_group(opts, w),
        };
        for name in names {
            let all = agent_names.contains(&name);
            for &pair in order.iter().filter(|p| all || p.agent == Impl::Go) {
                out.push(Job {
                    workload: name.clone(),
                    pair: Some(pair),
                });
            }
        }
    }
    out
}

pub fn job_deadline(opts: &Opts, w: &str) -> Duration {
    let s = match w {
        "bulk" | "limit" => 60.0 + 2.0 * opts.bulk_bytes as f64 / 5e6,
        w if w.starts_with("short") => 60.0 + opts.short_secs,
        w if w.starts_with("idle") => {
            let n: f64 = w.trim_start_matches("idle-").parse().unwrap_or(1000.0);
            120.0 + n / 50.0 + opts.idle_secs + opts.idle_settle_secs
        }
        w if w.starts_with("connect-idle-") => {
            let n: f64 = w
                .trim_start_matches("connect-idle-")
                .parse()
                .unwrap_or(2000.0);
            120.0 + n / 50.0 + opts.idle_secs + opts.idle_settle_secs
        }
        w if w.starts_with("agents") => {
            let n: f64 = w.trim_start_matches("agents-").parse().unwrap_or(2000.0);
            120.0 + n / 20.0 + opts.idle_secs + opts.idle_settle_secs
        }
        "hol" => 120.0 + 2.0 * opts.hol_secs,
        w if w.starts_with("agent-idle-") => {
            120.0 + opts.idle_secs + opts.idle_settle_secs + opts.short_timeout_secs * 3.0
        }
        _ => 300.0,
    };
    Duration::from_secs_f64(s)
}

pub async fn run_job(ctx: &Ctx, w: &str, pair: Option<Pair>) -> Result<Outcome> {
    match (w, pair) {
        ("limit", _) => w_limit(ctx).await,
        ("bulk", Some(i)) => w_bulk(ctx, i).await,
        ("hol", Some(i)) => w_hol(ctx, i).await,
        (s, Some(i)) if s.starts_with("short-") => w_short(ctx, i, &s["short-".len()..]).await,
        (s, Some(i)) if s.starts_with("idle-") => {
            w_idle(ctx, i, s["idle-".len()..].parse()?, Style::Single).await
        }
        (s, Some(i)) if s.starts_with("connect-idle-") => {
            w_idle(ctx, i, s["connect-idle-".len()..].parse()?, Style::Connect).await
        }
        (s, Some(i)) if s.starts_with("agents-") => {
            w_agents(ctx, i, s["agents-".len()..].parse()?).await
        }
        (s, Some(i)) if s.starts_with("agent-idle-") => {
            w_agent_idle(ctx, i, s["agent-idle-".len()..].parse()?).await
        }
        _ => bail!("unknown job {w}"),
    }
}

pub fn brief(m: &Metrics, censored: &BTreeSet<String>) -> String {
    let keys = [
        ("mbps", "MB/s"),
        ("server_cpu_s_per_gib", "srv s/GiB"),
        ("peak_rss_mib", "peak MiB"),
        ("tunnels_per_s", "tun/s"),
        ("dial_p99_ms", "p99 ms"),
        ("server_cpu_us_per_tunnel", "srv us/tun"),
        ("rss_kib_per_tunnel", "KiB/tun"),
        ("rss_kib_per_agent", "KiB/agent"),
        ("idle_cpu_us_per_s_per_agent", "idle us/s/agent"),
        ("idle_cpu_ms_per_s", "idle ms/s"),
        ("agent_cpu_us_per_tunnel", "agent us/tun"),
        ("agent_cpu_s_per_gib", "agent s/GiB"),
        ("agent_rss_kib_per_tunnel", "agent KiB/tun"),
        ("agent_rss_mib", "agent MiB"),
        ("agent_idle_cpu_ms_per_s", "agent idle ms/s"),
        ("share_pct", "share %"),
        ("blocked_with_stalled", "blocked"),
    ];
    keys.iter()
        .filter_map(|(k, l)| {
            let bound = if censored.contains(*k) { "≥ " } else { "" };
            m.get(*k).map(|v| format!("{l} {bound}{}", fmt_num(*v)))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The run context: the work directory, the dev PKI and the far end (whose guard kills it).
pub fn make_ctx(opts: &Opts) -> Result<(Ctx, Proc)> {
    let go_server = opts.upstream_dir.join("proxy-server");
    let go_agent = opts.upstream_dir.join("proxy-agent");
    let our_agent = opts
        .agent_bin
        .clone()
        .unwrap_or_else(|| opts.server_bin.with_file_name("konnectivity-agent"));
    let mut needed = vec![&opts.server_bin, &go_server, &go_agent];
    if opts.with_agents() || opts.agent_bin.is_some() {
        needed.push(&our_agent);
    }
    for b in needed {
        if !b.is_file() {
            bail!("missing binary {}", b.display());
        }
    }
    std::fs::create_dir_all(&opts.out)?;
    let tmp = std::env::temp_dir().join(format!("konn-bench-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    // A fresh directory: DevPki::ensure generates the CA, the server certificate (SANs
    // localhost, 127.0.0.1, ::1) and the agent client certificate.
    let (certs, _) = DevPki::ensure(&tmp.join("pki")).context("generate the dev PKI")?;

    // The far end: this binary in its own process.
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(&exe);
    cmd.arg("farend")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(tmp.join("farend.log"))?);
    set_pdeathsig(&mut cmd);
    let mut far_child = cmd.spawn().context("spawn far end")?;
    let stdout = far_child.stdout.take().unwrap();
    let (ptx, prx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = ptx.send(line);
    });
    let line = prx
        .recv_timeout(Duration::from_secs(10))
        .context("far end did not report its port")?;
    let port: u16 = line
        .trim()
        .strip_prefix("PORT ")
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| anyhow!("far end said {line:?}"))?;
    let far_pid = far_child.id();
    let far_guard = Proc {
        name: "farend".into(),
        child: far_child,
        log: tmp.join("farend.log"),
    };

    let ctx = Ctx {
        opts: opts.clone(),
        tmp: tmp.clone(),
        certs,
        ports: Mutex::new(Ports {
            used: HashSet::from([port]),
            rng: fastrand::Rng::with_seed(std::process::id() as u64 ^ 0x6b6f6e6e),
        }),
        far: SocketAddr::from(([127, 0, 0, 1], port)),
        far_pid,
        seeds: AtomicU64::new(0x1234_5678),
        go_server,
        go_agent,
        our_agent,
        env_counter: AtomicU64::new(0),
    };
    Ok((ctx, far_guard))
}

pub async fn run(opts: Opts) -> Result<i32> {
    let started = Instant::now();
    let (ctx, far_guard) = make_ctx(&opts)?;
    let tmp = ctx.tmp.clone();
    let port = ctx.far.port();
    eprintln!(
        "konn_bench: {} mode, {} round(s), workloads {:?}; far end 127.0.0.1:{port}; work dir {}",
        if opts.quick { "quick" } else { "full" },
        opts.rounds,
        opts.workloads,
        tmp.display()
    );

    let mut records: Vec<Record> = Vec::new();
    let mut failed = false;
    for round in 1..=opts.rounds {
        for job in jobs_for_round(&opts, round) {
            let who = job.pair.map(|p| p.label()).unwrap_or("direct".into());
            let (server, agent) = match job.pair {
                Some(p) => (p.server.name(), p.agent.name()),
                None => ("direct", ""),
            };
            let t0 = Instant::now();
            let r = tokio::time::timeout(
                job_deadline(&opts, &job.workload),
                run_job(&ctx, &job.workload, job.pair),
            )
            .await;
            let secs = t0.elapsed().as_secs_f64();
            let failure = |error: String| Record {
                workload: job.workload.clone(),
                imp: server.into(),
                agent: agent.into(),
                round,
                metrics: Metrics::new(),
                censored: Default::default(),
                samples: Default::default(),
                error: Some(error),
                notes: vec![],
                secs,
            };
            let rec = match r {
                Ok(Ok(o)) => {
                    let error = (!o.failures.is_empty()).then(|| o.failures.join("; "));
                    eprintln!(
                        "[round {round}/{}] {:<15} {:<15} {:>6.1}s  {}{}{}",
                        opts.rounds,
                        job.workload,
                        who,
                        secs,
                        if error.is_some() { "FAILED: " } else { "" },
                        brief(&o.metrics, &o.censored),
                        match (&error, o.notes.is_empty()) {
                            (Some(e), _) => format!("  (failures: {e})"),
                            (None, false) => format!("  (notes: {})", o.notes.join("; ")),
                            (None, true) => String::new(),
                        }
                    );
                    Record {
                        workload: job.workload.clone(),
                        imp: server.into(),
                        agent: agent.into(),
                        round,
                        metrics: o.metrics,
                        censored: o.censored,
                        samples: o.samples,
                        error,
                        notes: o.notes,
                        secs,
                    }
                }
                Ok(Err(e)) => {
                    eprintln!(
                        "[round {round}/{}] {:<15} {:<15} FAILED after {secs:.1}s: {e:#}",
                        opts.rounds, job.workload, who
                    );
                    failure(format!("{e:#}"))
                }
                Err(_) => {
                    eprintln!(
                        "[round {round}/{}] {:<15} {:<15} TIMED OUT after {secs:.1}s",
                        opts.rounds, job.workload, who
                    );
                    failure(format!("timed out after {secs:.0} s"))
                }
            };
            failed |= rec.error.is_some();
            records.push(rec);
        }
    }
    drop(far_guard);
    let total = started.elapsed().as_secs_f64();

    let info = machine_info(&opts);
    write_json(&opts, &records, &info, total)?;
    let mut md = render_markdown(&opts, &records, &info, total);
    // The profile breakdowns (benches/profile) are written by hand from their own scripts:
    // a benchmark run keeps them.
    // So is the kube-proxy part's section (`konn_bench kube-proxy`), last.
    let path = opts.out.join("RESULTS.md");
    let old = std::fs::read_to_string(&path).unwrap_or_default();
    let (old, kube_proxy) = crate::kp::split_section(&old);
    if let Some(at) = old.find(PROFILE_SECTION) {
        md.push('\n');
        md.push_str(old[at..].trim_end());
        md.push('\n');
    }
    if let Some(section) = kube_proxy {
        md.push('\n');
        md.push_str(&section);
        md.push('\n');
    }
    std::fs::write(&path, &md)?;
    write_ratios_csv(&opts, &records)?;
    print!("{}", summary_tables(&opts, &records));
    eprintln!(
        "konn_bench: wrote {} ({:.0} s of benchmarks)",
        opts.out.join("RESULTS.md").display(),
        total
    );
    if failed {
        let n = records.iter().filter(|r| r.error.is_some()).count();
        eprintln!(
            "konn_bench: FAILED: {n} of {} workload runs failed (see {})",
            records.len(),
            opts.out.join("RESULTS.md").display()
        );
    }
    if failed || opts.keep_tmp {
        eprintln!("konn_bench: logs kept in {}", tmp.display());
    } else {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    Ok(if failed { 1 } else { 0 })
}
