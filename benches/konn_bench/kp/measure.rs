//! One measured run: one proxy, one size, one round, on a fresh apiserver started from the
//! size's cached state and a fresh node. See benches/README.md for what each number means.

use std::net::{IpAddr, SocketAddr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use serde_json::json;
use sha2::{Digest, Sha256};

use super::harness::api::{Ep, Proto, Slice, Svc};
use super::netns::{load, wait_answer};
use super::opts::Opts;
use super::session::{list_table, Cluster, FirstSync, Node, Session};
use super::state::{
    new_vip, pod, probe_endpoints, State, DP_PORT, DP_VIP, ECHO_PORT, PROBE_NS, PROBE_PORT,
    PROBE_SLICE, PROBE_VIP,
};
use crate::results::{median, percentile, Record};

/// Which proxy a run measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Which {
    Ours,
    Upstream,
}

impl Which {
    /// The key in records and results.json.
    pub fn key(self) -> &'static str {
        match self {
            Which::Ours => "ours",
            Which::Upstream => "upstream",
        }
    }
    /// The side name of its node's namespaces (short: namespace names carry it).
    fn side(self) -> &'static str {
        match self {
            Which::Ours => "rs",
            Which::Upstream => "up",
        }
    }
    pub fn bin(self, opts: &Opts) -> PathBuf {
        match self {
            Which::Ours => opts.ours_bin.clone(),
            Which::Upstream => opts.kube_bin_dir.join("kube-proxy"),
        }
    }
}

/// The proxies' flags besides tests/kube_proxy/proxy.rs's common ones: the first run of a
/// measurement syncs every change at once, the restart keeps the default minimum period (1 s).
pub const MIN_SYNC_0: &str = "--iptables-min-sync-period=0";

/// Runs one measurement into a record; a failure (an error or a panic of the harness) is the
/// record's error, with whatever was measured before it.
pub fn run_one(opts: &Opts, state: &State, which: Which, round: usize, dir: &Path) -> Record {
    let t0 = Instant::now();
    let mut rec = Record {
        workload: state.size.label(),
        imp: which.key().to_string(),
        agent: String::new(),
        round,
        metrics: Default::default(),
        censored: Default::default(),
        samples: Default::default(),
        error: None,
        notes: Vec::new(),
        secs: 0.0,
    };
    let machine0 = MachineCpu::now();
    rec.metrics.insert("load1_start".into(), load1());
    let result = catch_unwind(AssertUnwindSafe(|| {
        measure(opts, state, which, round, dir, &mut rec)
    }));
    match result {
        Ok(Ok(())) => {}
        Ok(Err(e)) => rec.error = Some(format!("{e:#}")),
        Err(panic) => {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "non-string panic".into());
            rec.error = Some(format!("panicked: {msg}"));
        }
    }
    rec.metrics.insert("load1_end".into(), load1());
    rec.metrics
        .insert("machine_busy_pct".into(), machine0.busy_pct_since());
    rec.secs = t0.elapsed().as_secs_f64();
    rec
}

fn set(rec: &mut Record, key: &str, v: f64) {
    rec.metrics.insert(key.to_string(), v);
}

fn measure(
    opts: &Opts,
    state: &State,
    which: Which,
    round: usize,
    dir: &Path,
    rec: &mut Record,
) -> Result<()> {
    let size = state.size;
    let label = which.key();
    let cluster = Cluster::start(opts, state, &dir.join("cluster"))?;
    let node = Node::create(which.side(), dir, &cluster)?;
    let client = node.ns.client.clone();
    let first_timeout = Duration::from_secs_f64(opts.first_sync_timeout_secs);
    let mut rng = fastrand::Rng::with_seed(round as u64);
    let mut probe_at = 0usize;
    let mut new_count = 0usize;

    // 1. Start on an empty table, every change synced at once.
    let bin = which.bin(opts);
    let mut s = Session::start(
        label,
        &bin,
        &node,
        &cluster,
        &[MIN_SYNC_0.into()],
        &dir.join("kube-proxy-1.log"),
    );
    let fs = s.wait_first_sync(first_timeout)?;
    first_sync(rec, "cold", &fs);
    if fs.secs.is_none() {
        rec.notes
            .push("the rest of the run was not measured: no first sync".into());
        return Ok(());
    }
    std::thread::sleep(Duration::from_secs_f64(opts.settle_secs));
    s.wait_quiet(Duration::from_secs(2), Duration::from_secs(60))?;
    set(rec, "settled_rss_mib", s.rss_mib());
    if size.idle() {
        return Ok(());
    }
    // The probe Service answers from pod1 (its endpoint in the cached state).
    let probe = SocketAddr::new(IpAddr::V4(PROBE_VIP), PROBE_PORT);
    let deadline = Instant::now() + Duration::from_secs(30);
    if wait_answer(
        &client,
        probe,
        pod(0).0,
        Duration::from_millis(100),
        deadline,
    )?
    .is_none()
    {
        bail!("the probe Service does not answer from pod1 after the first sync");
    }

    // The ruleset of the first sync, before any change: for the floor and the comparison.
    let listing = dir.join(format!("ruleset-{label}.nft"));
    let secs = list_table(&node.ns.node, &listing)?;
    set(rec, "list_s", secs);
    ruleset_facts(rec, &listing)?;

    series(
        rec,
        "0",
        opts,
        &s,
        &cluster,
        &client,
        &mut probe_at,
        &mut rng,
    )?;
    new_services(rec, "0", opts, &cluster, &client, &mut new_count, &mut rng)?;
    if opts.dataplane_size == Some(size) {
        dataplane(rec, opts, &client)?;
    }
    s.stop();

    // 2. Restart on the table the first run left, the default minimum sync period (1 s).
    let mut s = Session::start(
        label,
        &bin,
        &node,
        &cluster,
        &[],
        &dir.join("kube-proxy-2.log"),
    );
    let fs = s.wait_first_sync(first_timeout)?;
    first_sync(rec, "restart", &fs);
    if fs.secs.is_some() {
        s.wait_quiet(Duration::from_secs(2), Duration::from_secs(60))?;
        series(
            rec,
            "1",
            opts,
            &s,
            &cluster,
            &client,
            &mut probe_at,
            &mut rng,
        )?;
        new_services(rec, "1", opts, &cluster, &client, &mut new_count, &mut rng)?;
    } else {
        rec.notes
            .push("the 1 s series was not measured: no first sync after the restart".into());
    }
    s.stop();
    drop(node);
    drop(cluster);

    // 3. The kernel's floor, with nothing else of the run left.
    floor(rec, opts, &listing)?;
    Ok(())
}

fn first_sync(rec: &mut Record, tag: &str, fs: &FirstSync) {
    match fs.secs {
        Some(s) => set(rec, &format!("{tag}_sync_s"), s),
        None => {
            set(rec, &format!("{tag}_sync_s"), fs.waited);
            rec.censored.insert(format!("{tag}_sync_s"));
        }
    }
    if let Some(i) = fs.internal {
        set(rec, &format!("{tag}_sync_internal_s"), i);
    }
    set(rec, &format!("{tag}_peak_rss_mib"), fs.peak_rss_mib);
    set(rec, &format!("{tag}_nft_peak_mib"), fs.nft_peak_mib);
    set(rec, &format!("{tag}_nft_runs"), fs.nft_runs as f64);
    set(rec, &format!("{tag}_cpu_s"), fs.cpu.own);
    set(rec, &format!("{tag}_nft_cpu_s"), fs.cpu.children);
    if let Some(n) = &fs.note {
        rec.notes.push(format!("{tag} start: {n}"));
    }
}

/// A pause drawn uniformly from [0, gap_max).
fn gap(opts: &Opts, rng: &mut fastrand::Rng) -> Duration {
    Duration::from_millis(rng.u64(0..opts.gap_max_ms.max(1)))
}

/// Endpoint changes one after another: the probe Service's one endpoint swapped between pod1
/// and pod2 (a PATCH of its slice), each timed from before the PATCH to the first new
/// connection through the ClusterIP that the new pod answers; then a pause (`gap`).
#[allow(clippy::too_many_arguments)]
fn series(
    rec: &mut Record,
    tag: &str,
    opts: &Opts,
    s: &Session,
    cluster: &Cluster,
    client: &str,
    at: &mut usize,
    rng: &mut fastrand::Rng,
) -> Result<()> {
    let api = cluster.kube.in_namespace(PROBE_NS);
    let target = SocketAddr::new(IpAddr::V4(PROBE_VIP), PROBE_PORT);
    let budget = Duration::from_secs_f64(opts.series_budget_secs);
    let timeout = Duration::from_secs_f64(opts.change_timeout_secs);
    let t_start = Instant::now();
    let cpu0 = s.cpu();
    let mut lat = Vec::new();
    let mut censored = false;
    for _ in 0..opts.changes {
        if t_start.elapsed() > budget {
            rec.notes.push(format!(
                "series {tag}: stopped after {} changes (budget {:.0} s)",
                lat.len(),
                budget.as_secs_f64()
            ));
            break;
        }
        let next = 1 - *at;
        let t0 = Instant::now();
        api.patch_slice(PROBE_SLICE, json!({"endpoints": probe_endpoints(next)}));
        let seen = wait_answer(
            client,
            target,
            pod(next).0,
            Duration::from_millis(100),
            t0 + timeout,
        )?;
        *at = next;
        match seen {
            Some(t) => lat.push(t.saturating_duration_since(t0).as_secs_f64() * 1000.0),
            None => {
                lat.push(timeout.as_secs_f64() * 1000.0);
                censored = true;
                rec.notes.push(format!(
                    "series {tag}: a change did not reach the kernel within {:.0} s",
                    timeout.as_secs_f64()
                ));
                break;
            }
        }
        std::thread::sleep(gap(opts, rng));
    }
    let cpu = s.cpu() - cpu0;
    let n = lat.len();
    if n == 0 {
        return Ok(());
    }
    lat.sort_by(|a, b| a.total_cmp(b));
    for (q, name) in [(0.5, "p50"), (0.99, "p99")] {
        let key = format!("change{tag}_{name}_ms");
        let v = percentile(&lat, q);
        set(rec, &key, v);
        rec.samples.insert(key.clone(), n as u64);
        if censored && v >= lat[n - 1] {
            rec.censored.insert(key);
        }
    }
    set(rec, &format!("change{tag}_n"), n as f64);
    set(
        rec,
        &format!("change{tag}_cpu_ms"),
        cpu.own * 1000.0 / n as f64,
    );
    set(
        rec,
        &format!("change{tag}_nft_cpu_ms"),
        cpu.children * 1000.0 / n as f64,
    );
    Ok(())
}

/// New Services, one at a time: the slice first (nothing to program without its Service),
/// then, once the proxy has had time to handle it, the Service, timed from before its POST to
/// the first connection through its ClusterIP that pod1 answers.
fn new_services(
    rec: &mut Record,
    tag: &str,
    opts: &Opts,
    cluster: &Cluster,
    client: &str,
    count: &mut usize,
    rng: &mut fastrand::Rng,
) -> Result<()> {
    let api = cluster.kube.in_namespace(PROBE_NS);
    let timeout = Duration::from_secs_f64(opts.change_timeout_secs);
    let mut lat = Vec::new();
    let mut censored = false;
    for _ in 0..opts.new_services {
        let k = *count;
        *count += 1;
        let name = format!("new-{k}");
        let vip = new_vip(k);
        api.create_slice(
            &Slice::v4(&format!("{name}-1"), &name)
                .port("http", Proto::Tcp, ECHO_PORT)
                .ep(Ep::ready(pod(0).1)),
        );
        std::thread::sleep(Duration::from_millis(1500) + gap(opts, rng));
        let t0 = Instant::now();
        api.create_service(&Svc::cluster_ip(&name, &vip.to_string()).port(
            "http",
            Proto::Tcp,
            80,
            ECHO_PORT,
        ));
        // A ClusterIP with no rules yet is dropped: each attempt waits 20 ms for an answer.
        let seen = wait_answer(
            client,
            SocketAddr::new(IpAddr::V4(vip), 80),
            pod(0).0,
            Duration::from_millis(20),
            t0 + timeout,
        )?;
        match seen {
            Some(t) => lat.push(t.saturating_duration_since(t0).as_secs_f64() * 1000.0),
            None => {
                lat.push(timeout.as_secs_f64() * 1000.0);
                censored = true;
                break;
            }
        }
    }
    if lat.is_empty() {
        return Ok(());
    }
    let key = format!("newsvc{tag}_ms");
    set(rec, &key, median(&lat));
    rec.samples.insert(key.clone(), lat.len() as u64);
    if censored {
        rec.censored.insert(key);
    }
    Ok(())
}

/// New connections per second from the client, through the `dp` ClusterIP (both pods' sinks)
/// and, for reference, straight to pod1's address (the same path without the DNAT).
fn dataplane(rec: &mut Record, opts: &Opts, client: &str) -> Result<()> {
    const THREADS: usize = 4;
    let via = SocketAddr::new(IpAddr::V4(DP_VIP), DP_PORT);
    let direct = SocketAddr::new(pod(0).1.parse()?, DP_PORT);
    let (mut vs, mut ds) = (Vec::new(), Vec::new());
    let mut failed = 0;
    for _ in 0..opts.dataplane_reps.max(1) {
        let (v, f) = load(client, via, THREADS, opts.dataplane_secs)?;
        vs.push(v);
        failed += f;
        let (d, f) = load(client, direct, THREADS, opts.dataplane_secs)?;
        ds.push(d);
        failed += f;
    }
    if failed > 0 {
        rec.notes
            .push(format!("data plane: {failed} connections failed"));
    }
    if vs.iter().any(|v| *v <= 0.0) {
        bail!("no connection through the dp ClusterIP succeeded");
    }
    set(rec, "dp_clusterip_cps", median(&vs));
    set(rec, "dp_direct_cps", median(&ds));
    // The two proxies' turns run minutes apart, and the machine's own rate moves between
    // them; each rep's direct load, just after its ClusterIP load, is the yardstick.
    let relative: Vec<f64> = vs
        .iter()
        .zip(&ds)
        .filter(|(_, d)| **d > 0.0)
        .map(|(v, d)| v / d)
        .collect();
    if !relative.is_empty() {
        set(rec, "dp_clusterip_rel", median(&relative));
    }
    Ok(())
}

/// The listing's size, the Services in its service-ips map, and a digest that is the same for
/// the same rules whatever order the kernel lists elements in (the lines' comma-separated
/// items, sorted).
fn ruleset_facts(rec: &mut Record, listing: &Path) -> Result<()> {
    let text = std::fs::read_to_string(listing)?;
    set(rec, "ruleset_lines", text.lines().count() as f64);
    set(
        rec,
        "ruleset_services",
        text.matches(": goto service-").count() as f64,
    );
    let mut items: Vec<&str> = text
        .lines()
        .flat_map(|l| l.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    items.sort_unstable();
    let mut h = Sha256::new();
    for i in items {
        h.update(i.as_bytes());
        h.update(b"\n");
    }
    let d = h.finalize();
    let hex: String = d.iter().take(8).map(|b| format!("{b:02x}")).collect();
    rec.notes.push(format!("ruleset digest {hex}"));
    Ok(())
}

/// `nft -f` of the first sync's ruleset into a fresh namespace with nothing else running:
/// wall time, and nft's user (its own parsing and evaluation) and system (the kernel's) CPU.
fn floor(rec: &mut Record, opts: &Opts, listing: &Path) -> Result<()> {
    let ns = format!("{}-floor", super::harness::node::prefix());
    super::run_cmd("ip", &["netns".as_ref(), "add".as_ref(), ns.as_ref()])?;
    let result = (|| -> Result<()> {
        let log = listing.with_extension("floor.log");
        let me = std::process::id();
        let before = children_cpu(me);
        let t0 = Instant::now();
        let mut cmd = std::process::Command::new("ip");
        cmd.args(["netns", "exec", &ns, "nft", "-f"])
            .arg(listing)
            .stdin(std::process::Stdio::null())
            .stdout(std::fs::File::create(&log)?)
            .stderr(std::fs::File::create(&log)?);
        crate::procs::set_pdeathsig(&mut cmd);
        let mut child = cmd.spawn()?;
        let deadline = t0 + Duration::from_secs_f64(opts.floor_timeout_secs);
        let status = loop {
            if let Some(st) = child.try_wait()? {
                break Some(st);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let wall = t0.elapsed().as_secs_f64();
        let after = children_cpu(me);
        match status {
            Some(st) if st.success() => {}
            Some(st) => bail!(
                "nft -f of the ruleset failed ({st}): {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            ),
            None => {
                rec.censored.insert("floor_s".into());
            }
        }
        set(rec, "floor_s", wall);
        set(rec, "floor_user_s", after.0 - before.0);
        set(rec, "floor_sys_s", after.1 - before.1);
        Ok(())
    })();
    let _ = super::run_cmd("ip", &["netns".as_ref(), "del".as_ref(), ns.as_ref()]);
    result
}

/// cutime and cstime of `pid` in seconds: the CPU of its children it has waited for.
fn children_cpu(pid: u32) -> (f64, f64) {
    let parse = || -> Option<(f64, f64)> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let rest = &stat[stat.rfind(')')? + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        let t = crate::procs::clk_tck();
        Some((
            f.get(13)?.parse::<f64>().ok()? / t,
            f.get(14)?.parse::<f64>().ok()? / t,
        ))
    };
    parse().unwrap_or((f64::NAN, f64::NAN))
}

/// The 1-minute load average.
pub fn load1() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// The machine's CPU time from /proc/stat: busy and total jiffies.
pub struct MachineCpu {
    busy: f64,
    total: f64,
}

impl MachineCpu {
    pub fn now() -> MachineCpu {
        let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let v: Vec<f64> = text
            .lines()
            .next()
            .unwrap_or("")
            .split_whitespace()
            .skip(1)
            .filter_map(|x| x.parse().ok())
            .collect();
        let total: f64 = v.iter().take(8).sum();
        // idle and iowait
        let idle = v.get(3).copied().unwrap_or(0.0) + v.get(4).copied().unwrap_or(0.0);
        MachineCpu {
            busy: total - idle,
            total,
        }
    }
    /// The share of all cores' time that was busy since `self`, in percent.
    pub fn busy_pct_since(&self) -> f64 {
        let now = MachineCpu::now();
        let total = now.total - self.total;
        if total <= 0.0 {
            return f64::NAN;
        }
        (now.busy - self.busy) / total * 100.0
    }
}
