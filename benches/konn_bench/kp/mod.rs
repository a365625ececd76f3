//! `konn_bench kube-proxy`: our kube-proxy against upstream's v1.37.2 in one run, on
//! populated clusters of a real kube-apiserver (see benches/README.md, "kube-proxy").
//!
//! Everything runs from the main thread, synchronously: the pieces are the side-by-side test
//! harness's own (tests/kube_proxy/, compiled in here as [`harness`]): the apiserver fixture and
//! its relay, the node's namespaces with their echo servers, the proxy's flags and processes
//! (each under `setpriv --pdeathsig KILL`, stopped by its recorded pid).
//!
//! Cleanup: every namespace this run makes is named `kpsbs<pid>-…` (the harness's prefix), every
//! file lives under one temporary directory `<tmp>/kpsbs<pid>.kp-bench…`, and the apiservers'
//! watchdog follows this process. Drops remove them on the normal path (also after a failed
//! run); SIGINT or SIGTERM removes them from a signal thread and exits; a run killed outright
//! leaves them to the next run's `clean_leftovers` (pid no longer alive).

// A bench target is compiled with cfg(test) but without the test harness: the harness files'
// unit-test modules are there without their #[test] functions, so their imports go unused.
// Named `harness` here, it holds its own `harness` module (tests/kube_proxy/harness.rs): the
// tests' names are kept rather than renamed for this one user.
#[allow(unused_imports, clippy::module_inception)]
#[path = "../../../tests/kube_proxy/mod.rs"]
pub mod harness;

mod cells;
mod info;
mod measure;
mod netns;
mod opts;
mod report;
mod session;
mod splice;
mod state;
mod targets;

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Result};

use crate::output::cmd_out;
use crate::results::Record;
use measure::{run_one, Which};
use opts::Opts;

pub use netns::sink_main;
pub use splice::split_section;

/// Runs a command to completion; an error with its stderr when it fails.
pub fn run_cmd(program: &str, args: &[&OsStr]) -> Result<()> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()?;
    if !out.status.success() {
        bail!(
            "{program} {:?} failed ({}): {}",
            args,
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Deletes every namespace of this process (`kpsbs<pid>-…`) after killing what runs in it,
/// stops every apiserver under `tmp` that still runs, and removes `tmp`.
fn hard_cleanup(tmp: &Path) {
    let mine = format!("{}-", harness::node::prefix());
    if let Ok(out) = Command::new("ip").args(["netns", "list"]).output() {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let name = line.split_whitespace().next().unwrap_or("");
            if !name.starts_with(&mine) {
                continue;
            }
            if let Ok(pids) = Command::new("ip").args(["netns", "pids", name]).output() {
                for p in String::from_utf8_lossy(&pids.stdout).split_whitespace() {
                    let _ = Command::new("kill").args(["-KILL", p]).status();
                }
            }
            let _ = Command::new("ip").args(["netns", "del", name]).status();
        }
    }
    let stop = harness::repo_file("tests/kube/stop.sh");
    let mut dirs = vec![tmp.to_path_buf()];
    while let Some(d) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.file_name().is_some_and(|n| n == "env") && p.parent().is_some() {
                let _ = Command::new("bash")
                    .arg(&stop)
                    .arg(p.parent().unwrap_or(&d))
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
            } else if p.is_dir() && !p.ends_with("etcd-data") {
                dirs.push(p);
            }
        }
    }
    let _ = std::fs::remove_dir_all(tmp);
}

fn info(opts: &Opts, total: f64) -> info::Info {
    let m = crate::output::machine(&opts.repo);
    let versions = std::fs::read_to_string(opts.kube_bin_dir.join("VERSIONS")).unwrap_or_default();
    info::Info {
        date: m.date,
        machine: format!(
            "{} cores ({}), {} RAM, Linux {}",
            m.cores, m.cpu_model, m.mem, m.kernel
        ),
        nft: cmd_out(Command::new("nft").arg("--version")),
        ours: cmd_out(Command::new(&opts.ours_bin).arg("--version")),
        git: m.git,
        upstream: format!(
            "{} (tests/kube/build.sh: {})",
            cmd_out(Command::new(opts.kube_bin_dir.join("kube-proxy")).arg("--version")),
            versions
                .lines()
                .filter(|l| l.starts_with("kube-proxy") || l.starts_with("go "))
                .collect::<Vec<_>>()
                .join("; ")
        ),
        total_secs: total,
    }
}

/// The entry point: `konn_bench kube-proxy ARGS`. Returns the exit status.
pub fn main(args: &[String]) -> i32 {
    let opts = match opts::parse(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("konn_bench kube-proxy: {e:#}");
            return 2;
        }
    };
    if !harness::preflight() {
        return 1;
    }
    harness::node::clean_leftovers();
    let tmp = match tempfile::Builder::new()
        .prefix(&format!("{}.kp-bench", harness::node::prefix()))
        .tempdir()
    {
        Ok(t) => t.keep(),
        Err(e) => {
            eprintln!("konn_bench kube-proxy: tempdir: {e}");
            return 1;
        }
    };
    // SIGINT/SIGTERM (benches/run's timeout, a person's ^C): remove everything at once and
    // exit; the children started under setpriv die with this process.
    {
        let tmp = tmp.clone();
        match signal_hook::iterator::Signals::new([
            signal_hook::consts::SIGINT,
            signal_hook::consts::SIGTERM,
        ]) {
            Ok(mut signals) => {
                std::thread::spawn(move || {
                    if let Some(sig) = signals.forever().next() {
                        eprintln!("konn_bench kube-proxy: signal {sig}: cleaning up");
                        hard_cleanup(&tmp);
                        std::process::exit(128 + sig);
                    }
                });
            }
            Err(e) => eprintln!("konn_bench kube-proxy: no signal handler: {e}"),
        }
    }
    // A panic outside a measured run (populating a cluster) is a failure like an error.
    let code = match std::panic::catch_unwind(|| run(&opts, &tmp)) {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            eprintln!("konn_bench kube-proxy: FAILED: {e:#}");
            1
        }
        Err(_) => {
            eprintln!("konn_bench kube-proxy: FAILED (panicked, above)");
            1
        }
    };
    if opts.keep_tmp || code != 0 {
        eprintln!("konn_bench kube-proxy: logs kept in {}", tmp.display());
        // Only the logs: the apiservers' data copies are large.
        remove_data_copies(&tmp);
    } else {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    code
}

fn remove_data_copies(dir: &Path) {
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                if p.ends_with("etcd-data") {
                    let _ = std::fs::remove_dir_all(&p);
                } else {
                    dirs.push(p);
                }
            }
        }
    }
}

fn run(opts: &Opts, tmp: &Path) -> Result<i32> {
    let t0 = Instant::now();
    let mut states = Vec::new();
    for size in &opts.sizes {
        states.push(state::ensure(opts, *size, tmp)?);
    }
    let populate_secs = t0.elapsed().as_secs_f64();
    if opts.populate_only {
        for st in &states {
            eprintln!(
                "konn_bench kube-proxy: {}: {} ({})",
                st.size.title(),
                st.etcd_data.display(),
                st.info
            );
        }
        return Ok(0);
    }
    let t1 = Instant::now();
    let mut records: Vec<Record> = Vec::new();
    let mut n = 0;
    for round in 1..=opts.rounds {
        // Ours first in odd rounds, upstream first in even ones.
        let mut order = vec![Which::Ours, Which::Upstream];
        if round % 2 == 0 {
            order.reverse();
        }
        order.retain(|w| opts.proxies.iter().any(|p| p == w.key()));
        for st in &states {
            for which in &order {
                n += 1;
                let dir = tmp.join(format!(
                    "run-{n}-{}-{}-r{round}",
                    st.size.label(),
                    which.key()
                ));
                std::fs::create_dir_all(&dir)?;
                eprintln!(
                    "[round {round}/{}] {} {}: starting",
                    opts.rounds,
                    st.size.title(),
                    which.key()
                );
                let rec = run_one(opts, st, *which, round, &dir);
                eprintln!(
                    "[round {round}/{}] {} {}: {} in {:.0} s{}",
                    opts.rounds,
                    st.size.title(),
                    which.key(),
                    if rec.error.is_some() {
                        "FAILED"
                    } else {
                        "done"
                    },
                    rec.secs,
                    rec.error
                        .as_ref()
                        .map(|e| format!(": {e}"))
                        .unwrap_or_default()
                );
                eprintln!("    {}", one_line(&rec));
                if rec.error.is_none() && !opts.keep_tmp {
                    let _ = std::fs::remove_dir_all(&dir);
                } else {
                    remove_data_copies(&dir);
                }
                records.push(rec);
            }
        }
    }
    let total = t1.elapsed().as_secs_f64();
    let info = info(opts, total);
    let md = report::render(opts, &records, &info, &states);
    std::fs::create_dir_all(&opts.out)?;
    let results = opts.out.join("RESULTS.md");
    splice::splice_markdown(&results, &md)?;
    splice::splice_json(
        &opts.out.join("results.json"),
        splice::json(opts, &records, &info),
    )?;
    eprintln!(
        "konn_bench kube-proxy: wrote {} and results.json ({populate_secs:.0} s populating, {total:.0} s measuring)",
        results.display()
    );
    let failed = records.iter().filter(|r| r.error.is_some()).count();
    if failed > 0 {
        eprintln!(
            "konn_bench kube-proxy: FAILED: {failed} of {} runs failed",
            records.len()
        );
        return Ok(1);
    }
    Ok(0)
}

/// A progress line: the headline numbers of a run.
fn one_line(r: &Record) -> String {
    let keys = [
        ("cold_sync_s", "start"),
        ("restart_sync_s", "restart"),
        ("change0_p50_ms", "p50@0"),
        ("change0_p99_ms", "p99@0"),
        ("change1_p50_ms", "p50@1s"),
        ("newsvc1_ms", "new@1s"),
        ("settled_rss_mib", "rss"),
        ("cold_peak_rss_mib", "peak"),
        ("floor_s", "floor"),
        ("dp_clusterip_cps", "conn/s"),
    ];
    keys.iter()
        .filter_map(|(k, l)| {
            r.metrics.get(*k).map(|v| {
                format!(
                    "{l}={}{}",
                    if r.censored.contains(*k) { ">" } else { "" },
                    crate::results::fmt_num(*v)
                )
            })
        })
        .collect::<Vec<_>>()
        .join(" ")
}
