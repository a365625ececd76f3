//! konn_bench: loads konnectivity-server and the upstream Go proxy-server side by side, the way
//! kube-apiserver does, and writes RESULTS.md (see benches/README.md). `konn_bench kube-proxy`
//! is the kube-proxy part: ours against upstream's on populated clusters (kp/).
//!
//! Built as a `[[bench]]` with `harness = false`; `benches/run` is the entry point. The same
//! binary is also the far end (`konn_bench farend`): a loopback TCP source/sink in its own
//! process, so its CPU is measured apart from the client's.
//!
//! Every byte that crosses a tunnel is compared with a deterministic stream (seeded splitmix64,
//! position-dependent): downloads by the client, uploads by the far end, which reports the
//! first mismatching offset in an 8-byte trailer. A server that loses, reorders or corrupts
//! data fails the workload.
//!
//! Processes: every child (servers, agents, far end) is spawned from the main thread with
//! PR_SET_PDEATHSIG=SIGKILL and is killed (SIGKILL + wait) when its guard drops, so nothing
//! outlives the tool, also on error or timeout. Every wait has a deadline.
#![allow(clippy::unwrap_used)] // tests and benchmarks fail loudly by design

mod agent_idle;
mod agents;
mod cli_args;
mod drive;
mod env;
mod farend;
mod kp;
mod metrics;
mod opts;
mod output;
mod pattern;
mod procs;
mod report;
mod results;
mod run;
mod tunnel;
mod workloads;

use std::time::Duration;

use farend::farend_main;
use opts::parse_opts;
use run::run;

pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * 1024;
pub const GIB: u64 = 1024 * 1024 * 1024;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("farend") {
        farend_main();
    }
    // The kube-proxy part (kp/): synchronous, no runtime of its own here (the harness's
    // apiserver client brings one).
    match args.first().map(String::as_str) {
        Some("kube-proxy") => std::process::exit(kp::main(&args[1..])),
        Some("kp-sink") => kp::sink_main(&args[1..]),
        _ => {}
    }
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(n) => eprintln!(
            "konn_bench: RLIMIT_NOFILE soft limit = {n} (inherited by servers, agents, far end)"
        ),
        Err(e) => eprintln!("konn_bench: could not raise RLIMIT_NOFILE: {e}"),
    }
    // `konn_bench drive ...`: one load against our server alone (benches/profile/).
    let parsed = if args.first().map(String::as_str) == Some("drive") {
        drive::parse_drive(&args[1..]).map(|(o, s)| (o, Some(s)))
    } else {
        parse_opts(&args).map(|o| (o, None))
    };
    let (opts, spec) = match parsed {
        Ok(o) => o,
        Err(e) => {
            eprintln!("konn_bench: {e:#}");
            std::process::exit(2);
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    // The orchestrating future runs on this (main) thread: every child process is spawned from
    // it, which PR_SET_PDEATHSIG requires (the signal follows the spawning thread).
    let code = rt.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            eprintln!("konn_bench: cannot install signal handlers");
            return 1;
        };
        // On SIGTERM/SIGINT the run future is dropped here, which kills every child.
        tokio::select! {
            r = async move {
                match spec {
                    Some(spec) => drive::drive(opts, spec).await,
                    None => run(opts).await,
                }
            } => match r {
                Ok(code) => code,
                Err(e) => {
                    eprintln!("konn_bench: FAILED: {e:#}");
                    1
                }
            },
            _ = term.recv() => {
                eprintln!("konn_bench: SIGTERM, stopping (children killed)");
                143
            }
            _ = int.recv() => {
                eprintln!("konn_bench: SIGINT, stopping (children killed)");
                130
            }
        }
    });
    if code >= 128 {
        // Interrupted: the children are gone; their logs and certificates need not stay.
        let _ = std::fs::remove_dir_all(
            std::env::temp_dir().join(format!("konn-bench-{}", std::process::id())),
        );
    }
    rt.shutdown_timeout(Duration::from_secs(2));
    std::process::exit(code);
}
