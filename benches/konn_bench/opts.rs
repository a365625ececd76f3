//! Command-line options of the tool.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{bail, Result};

use crate::cli_args::ArgWalk;
use crate::{GIB, MIB};

/// `--client-window fixed`.
pub static FIXED_WINDOW: AtomicBool = AtomicBool::new(false);

#[derive(Clone, Debug)]
pub struct Opts {
    pub quick: bool,
    pub rounds: usize,
    pub server_bin: PathBuf,
    pub upstream_dir: PathBuf,
    /// Our agent (`--agent-bin`; else `konnectivity-agent` beside `--server-bin`), measured
    /// against upstream's `proxy-agent` in the `agent` jobs. The server comparison always runs
    /// upstream's agent.
    pub agent_bin: Option<PathBuf>,
    pub out: PathBuf,
    pub workloads: Vec<String>,
    pub bulk_bytes: u64,
    pub short_secs: f64,
    /// Limit for one short tunnel (dial, transfer, close); a dial past it counts as +inf.
    pub short_timeout_secs: f64,
    pub short_clients: usize,
    pub idle_counts: Vec<usize>,
    /// `connect-idle`: how many idle HTTP-CONNECT tunnels (one Unix-socket connection each).
    pub connect_idle_counts: Vec<usize>,
    /// `agents`: how many connected idle agents (one mTLS HTTP/2 connection each).
    pub agent_counts: Vec<usize>,
    pub idle_settle_secs: f64,
    pub idle_secs: f64,
    pub hol_secs: f64,
    pub hol_active: usize,
    pub keep_tmp: bool,
    pub repo: PathBuf,
    /// `konn_bench drive --wrap`: a command our server runs under (valgrind, heaptrack).
    pub server_wrap: Vec<String>,
}

/// `agent` is the agent comparison (our agent vs upstream's behind each server, and the whole
/// path): short-single, short-connect, bulk, idle-N (the smallest of `--idle-counts`) and
/// agent-idle-1/agent-idle-3. `agents` is the server workload of many idle agents.
pub const ALL_WORKLOADS: &[&str] = &[
    "bulk",
    "short",
    "idle",
    "connect-idle",
    "agents",
    "hol",
    "limit",
    "agent",
];

pub fn usage() -> &'static str {
    "usage: konn_bench --server-bin PATH --upstream-dir DIR [--out DIR] [--quick] [--rounds N]\n\
     \x20      [--workloads bulk,short,idle,connect-idle,agents,hol,limit,agent]\n\
     \x20      [--agent-bin PATH]\n\
     \x20      [--bulk-mib N] [--short-secs S]\n\
     \x20      [--short-clients N] [--short-timeout S] [--idle-counts 1000,10000]\n\
     \x20      [--connect-idle-counts 2000,10000]\n\
     \x20      [--agent-counts 2000]\n\
     \x20      [--idle-secs S] [--hol-secs S]\n\
     \x20      [--client-window adaptive|fixed] [--keep-tmp] [--repo DIR]\n\
     \x20  konn_bench farend   (internal: the far-end source/sink process)"
}

impl Opts {
    /// The idle-tunnel count of the agent comparison: the smallest of `--idle-counts`.
    pub fn agent_idle_count(&self) -> usize {
        self.idle_counts.iter().copied().min().unwrap_or(1000)
    }
    pub fn with_agents(&self) -> bool {
        self.workloads.iter().any(|w| w == "agent")
    }

    /// The workloads of the agent comparison (`--workloads agent`).
    pub fn agent_workloads(&self) -> Vec<String> {
        vec![
            "short-single".into(),
            "short-connect".into(),
            "bulk".into(),
            format!("idle-{}", self.agent_idle_count()),
            "agent-idle-1".into(),
            "agent-idle-3".into(),
        ]
    }
}

pub fn parse_opts(args: &[String]) -> Result<Opts> {
    let quick = args.iter().any(|a| a == "--quick");
    let mut o = Opts {
        quick,
        rounds: if quick { 1 } else { 5 },
        server_bin: PathBuf::new(),
        upstream_dir: PathBuf::new(),
        agent_bin: None,
        out: PathBuf::from("."),
        workloads: ALL_WORKLOADS.iter().map(|s| s.to_string()).collect(),
        bulk_bytes: if quick { 32 * MIB } else { GIB },
        short_secs: if quick { 2.0 } else { 10.0 },
        short_timeout_secs: 10.0,
        short_clients: 64,
        idle_counts: if quick { vec![200] } else { vec![1000, 10000] },
        connect_idle_counts: if quick { vec![200] } else { vec![2000, 10000] },
        agent_counts: if quick { vec![100] } else { vec![2000] },
        idle_settle_secs: if quick { 1.0 } else { 2.0 },
        idle_secs: if quick { 2.0 } else { 5.0 },
        hol_secs: if quick { 3.0 } else { 10.0 },
        hol_active: 10,
        keep_tmp: false,
        repo: std::env::current_dir()?,
        server_wrap: Vec::new(),
    };
    let mut walk = ArgWalk::new(args);
    while let Some(key) = walk.next_key() {
        match key.as_str() {
            "--quick" | "--bench" => {}
            "--keep-tmp" => o.keep_tmp = true,
            "--rounds" => o.rounds = walk.value()?.parse()?,
            "--server-bin" => o.server_bin = walk.value()?.into(),
            "--upstream-dir" => o.upstream_dir = walk.value()?.into(),
            "--agent-bin" => o.agent_bin = Some(walk.value()?.into()),
            "--out" => o.out = walk.value()?.into(),
            "--repo" => o.repo = walk.value()?.into(),
            "--workloads" => {
                o.workloads = walk
                    .value()?
                    .split(',')
                    .map(|s| s.trim().to_string())
                    .collect();
                for w in &o.workloads {
                    if !ALL_WORKLOADS.contains(&w.as_str()) {
                        bail!("unknown workload {w:?} (known: {ALL_WORKLOADS:?})");
                    }
                }
            }
            "--bulk-mib" => o.bulk_bytes = walk.value()?.parse::<u64>()? * MIB,
            "--short-secs" => o.short_secs = walk.value()?.parse()?,
            "--short-timeout" => o.short_timeout_secs = walk.value()?.parse()?,
            "--short-clients" => o.short_clients = walk.value()?.parse()?,
            "--idle-counts" => {
                o.idle_counts = walk
                    .value()?
                    .split(',')
                    .map(|s| s.trim().parse())
                    .collect::<Result<_, _>>()?
            }
            "--connect-idle-counts" => {
                o.connect_idle_counts = walk
                    .value()?
                    .split(',')
                    .map(|s| s.trim().parse())
                    .collect::<Result<_, _>>()?
            }
            "--agent-counts" => {
                o.agent_counts = walk
                    .value()?
                    .split(',')
                    .map(|s| s.trim().parse())
                    .collect::<Result<_, _>>()?
            }
            "--idle-secs" => o.idle_secs = walk.value()?.parse()?,
            "--hol-secs" => o.hol_secs = walk.value()?.parse()?,
            "--client-window" => match walk.value()?.as_str() {
                "adaptive" => FIXED_WINDOW.store(false, Ordering::Relaxed),
                "fixed" => FIXED_WINDOW.store(true, Ordering::Relaxed),
                v => bail!("--client-window adaptive|fixed, not {v:?}"),
            },
            "-h" | "--help" => {
                println!("{}", usage());
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?}\n{}", usage()),
        }
    }
    if o.server_bin.as_os_str().is_empty() || o.upstream_dir.as_os_str().is_empty() {
        bail!("--server-bin and --upstream-dir are required\n{}", usage());
    }
    if o.idle_counts.is_empty() {
        bail!("--idle-counts needs at least one count");
    }
    if o.rounds == 0 {
        bail!("--rounds must be >= 1");
    }
    Ok(o)
}
