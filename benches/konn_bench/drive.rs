//! `konn_bench drive`: one load against our server alone, for the profiling scripts
//! (benches/profile/). The server may run under a tool (`--wrap 'valgrind --tool=callgrind'`);
//! hooks run around the measured phase with `$PID` = the server's pid, and the server is
//! stopped with SIGTERM at the end so the tool writes its output.
//!
//! ```text
//! konn_bench drive --server-bin BIN --upstream-dir DIR
//!     --what single|reusable|connect|idle|connect-idle|agents
//!     --count N [--parallel P] [--wrap 'CMD ARGS'] [--before 'SH'] [--after 'SH'] [--settle S]
//! ```
//! single/reusable/connect: N short tunnels (1 KiB each way, checked), P at a time (default 8);
//! idle: N idle single-use gRPC tunnels held; connect-idle: N idle HTTP-CONNECT tunnels held;
//! agents: N idle agents held (see agents.rs).
//! `--after` runs while the idle tunnels or agents are still held.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use tokio::task::JoinSet;

use crate::agents::connect_agents;
use crate::env::{start_env, FrontMode, Impl, Pair};
use crate::opts::{parse_opts, Opts};
use crate::pattern::splitmix;
use crate::procs::status_kib;
use crate::run::make_ctx;
use crate::tunnel::{uds_channel, Style};
use crate::workloads::{close_all, open_idle, short_one, summarize_errs};

pub struct Spec {
    pub what: String,
    pub count: usize,
    pub parallel: usize,
    pub before: Option<String>,
    pub after: Option<String>,
    pub settle_secs: f64,
}

pub fn parse_drive(args: &[String]) -> Result<(Opts, Spec)> {
    let mut spec = Spec {
        what: String::new(),
        count: 100,
        parallel: 8,
        before: None,
        after: None,
        settle_secs: 2.0,
    };
    let mut wrap = Vec::new();
    let mut rest = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || {
            it.next()
                .cloned()
                .ok_or_else(|| anyhow!("{a} needs a value"))
        };
        match a.as_str() {
            "--what" => spec.what = val()?,
            "--count" => spec.count = val()?.parse()?,
            "--parallel" => spec.parallel = val()?.parse()?,
            "--before" => spec.before = Some(val()?),
            "--after" => spec.after = Some(val()?),
            "--settle" => spec.settle_secs = val()?.parse()?,
            "--wrap" => wrap = val()?.split_whitespace().map(String::from).collect(),
            _ => rest.push(a.clone()),
        }
    }
    if ![
        "single",
        "reusable",
        "connect",
        "idle",
        "connect-idle",
        "agents",
    ]
    .contains(&spec.what.as_str())
    {
        bail!("drive: --what single|reusable|connect|idle|connect-idle|agents");
    }
    let mut opts = parse_opts(&rest)?;
    opts.server_wrap = wrap;
    Ok((opts, spec))
}

fn hook(what: &str, cmd: &Option<String>, pid: u32) -> Result<()> {
    let Some(cmd) = cmd else { return Ok(()) };
    let st = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .env("PID", pid.to_string())
        .status()
        .with_context(|| format!("{what} hook"))?;
    if !st.success() {
        bail!("{what} hook {cmd:?} failed: {st}");
    }
    Ok(())
}

async fn short_tunnels(
    ctx: &crate::env::Ctx,
    style: &Style,
    sock: &std::path::Path,
    n: usize,
    parallel: usize,
) -> Result<()> {
    let mut set = JoinSet::new();
    let base = ctx.seed();
    for w in 0..parallel {
        let style = style.clone();
        let sock = sock.to_path_buf();
        let far = ctx.far;
        let mine = n / parallel + usize::from(w < n % parallel);
        set.spawn(async move {
            let mut errs = Vec::new();
            for i in 0..mine {
                let seed = splitmix(base ^ ((w as u64) << 40) ^ i as u64);
                let t = short_one(&style, &sock, far, seed, Duration::from_secs(120)).await;
                errs.extend(t.failure);
            }
            errs
        });
    }
    let mut errs = Vec::new();
    while let Some(r) = set.join_next().await {
        errs.extend(r?);
    }
    match summarize_errs(&format!("of {n} short tunnels failed"), &errs) {
        Some(e) => bail!(e),
        None => Ok(()),
    }
}

pub async fn drive(mut opts: Opts, spec: Spec) -> Result<i32> {
    // One workload, `spec`; the run's list would make make_ctx ask for our agent even when
    // upstream's is the one behind the server.
    opts.workloads.clear();
    let (ctx, _far) = make_ctx(&opts)?;
    let mode = if spec.what == "connect" || spec.what == "connect-idle" {
        FrontMode::HttpConnect
    } else {
        FrontMode::Grpc
    };
    let mut env = start_env(
        &ctx,
        // Upstream's agent behind it, or ours with `--agent-bin`.
        Pair::new(
            Impl::Ours,
            if opts.agent_bin.is_some() {
                Impl::Ours
            } else {
                Impl::Go
            },
        ),
        mode,
        &format!("drive-{}", spec.what),
        &["--graceful-shutdown-timeout=1s"],
    )
    .await?;
    let pid = env.server.pid();
    let rss = || status_kib(pid, "VmRSS");
    let style = match spec.what.as_str() {
        "single" | "idle" => Style::Single,
        "reusable" => Style::Reusable(uds_channel(&env.sock).await?),
        _ => Style::Connect,
    };
    // Warm-up: lazily built state exists before the measured phase.
    if spec.what == "agents" {
        drop(connect_agents(&ctx, env.agent_port, 10, "warm", 10).await?);
    } else if spec.what == "idle" || spec.what == "connect-idle" {
        let warm = open_idle(&style, &env.sock, ctx.far, 10, ctx.seed()).await?;
        close_all(warm, Duration::from_secs(60)).await;
    } else {
        short_tunnels(&ctx, &style, &env.sock, 20, spec.parallel.min(20)).await?;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss0 = rss();
    hook("before", &spec.before, pid)?;
    let t0 = Instant::now();
    let (mut held_tunnels, mut held_agents) = (Vec::new(), Vec::new());
    match spec.what.as_str() {
        "idle" | "connect-idle" => {
            held_tunnels = open_idle(&style, &env.sock, ctx.far, spec.count, ctx.seed()).await?
        }
        "agents" => {
            held_agents = connect_agents(&ctx, env.agent_port, spec.count, "held", 32).await?
        }
        _ => short_tunnels(&ctx, &style, &env.sock, spec.count, spec.parallel).await?,
    }
    let secs = t0.elapsed().as_secs_f64();
    if !held_tunnels.is_empty() || !held_agents.is_empty() {
        tokio::time::sleep(Duration::from_secs_f64(spec.settle_secs)).await;
    }
    let rss1 = rss();
    hook("after", &spec.after, pid)?;
    eprintln!(
        "drive: {} x{} in {secs:.1} s; server pid {pid} VmRSS {rss0} -> {rss1} KiB ({:.2} KiB each)",
        spec.what,
        spec.count,
        (rss1 - rss0) / spec.count as f64
    );
    println!(
        "{{\"what\":\"{}\",\"count\":{},\"secs\":{secs},\"rss0_kib\":{rss0},\"rss1_kib\":{rss1}}}",
        spec.what, spec.count
    );
    close_all(held_tunnels, Duration::from_secs(60)).await;
    drop(held_agents);
    drop(style);
    // SIGTERM and wait: a profiler writes its output as the server exits.
    #[allow(unsafe_code)] // a documented site: see the SAFETY note
    // SAFETY: plain kill(2) on our own child's pid.
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    while env.server.exited().is_none() {
        if Instant::now() > deadline {
            bail!("server did not exit within 600 s of SIGTERM");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if !opts.keep_tmp {
        let _ = std::fs::remove_dir_all(&ctx.tmp);
    }
    Ok(0)
}
