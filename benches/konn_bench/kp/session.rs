//! The measured node and one run of a proxy in it: the apiserver started on a copy of a
//! populated cluster, the node's namespaces (tests/kube_proxy/node.rs), the proxy process, its
//! metrics and its /proc readings.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};

use super::harness::api::{self, Apiserver, Kube};
use super::harness::node::NodeNs;
use super::harness::nsock;
use super::harness::procs::Proc;
use super::harness::proxy;
use super::opts::Opts;
use super::state::{State, BULK_NS, DP_PORT};
use crate::procs::{clk_tck, cpu_secs, status_kib};

/// The proxies' metrics address inside the node namespace (both use the default).
const METRICS: &str = "127.0.0.1:10249";

/// An apiserver on a copy of a cached state, and the host half of its relay.
pub struct Cluster {
    // Held for their Drop, in this order: the relay, the client, then the apiserver (stop.sh).
    // The data copy goes with the run's directory.
    _relay: Proc,
    pub kube: Kube,
    _api: Apiserver,
    pub socket: PathBuf,
    pub kubeconfig: PathBuf,
}

impl Cluster {
    /// Copies the state's etcd data into `dir` and starts etcd and the apiserver on it.
    pub fn start(opts: &Opts, state: &State, dir: &Path) -> Result<Cluster> {
        std::fs::create_dir_all(dir)?;
        let data = dir.join("etcd-data");
        super::run_cmd(
            "cp",
            &["-a".as_ref(), state.etcd_data.as_os_str(), data.as_os_str()],
        )?;
        let bin_dir = opts.kube_bin_dir.to_string_lossy().into_owned();
        let data_s = data.to_string_lossy().into_owned();
        let api = Apiserver::start_with(
            &dir.join("kube"),
            &[
                ("KUBE_BIN_DIR", bin_dir.as_str()),
                ("KUBE_ETCD_DATA", data_s.as_str()),
                // Loading 44,000 Services into the watch cache takes a while.
                ("KUBE_START_TIMEOUT", "600"),
            ],
        );
        let kube = Kube::connect(&api, BULK_NS);
        let socket = dir.join("apiserver.sock");
        let relay = api::host_relay(&api, &socket, &dir.join("relay-host.log"));
        let kubeconfig = dir.join("node.kubeconfig");
        api.write_node_kubeconfig(&kubeconfig);
        Ok(Cluster {
            _relay: relay,
            kube,
            _api: api,
            socket,
            kubeconfig,
        })
    }
}

/// The node: namespaces with echo servers in the pods (tests/kube_proxy/node.rs), the node
/// half of the relay and the data-plane sinks.
pub struct Node {
    // Held for their Drop, in this order: the sinks and the relay, then NodeNs (its echo
    // servers, then the namespaces).
    _sinks: Vec<Proc>,
    _relay: Proc,
    pub ns: NodeNs,
}

impl Node {
    pub fn create(side: &str, dir: &Path, cluster: &Cluster) -> Result<Node> {
        let agent = super::harness::repo_file("tests/kube_proxy/netagent.py");
        let ns = NodeNs::create(side, dir, &agent);
        let relay = api::node_relay(
            &ns.node,
            &cluster.socket,
            &dir.join(format!("relay-{side}.log")),
        );
        let me = std::env::current_exe()?;
        let me = me.to_string_lossy().into_owned();
        let mut sinks = Vec::new();
        for (i, pod) in ns.pods.iter().enumerate() {
            let mut p = Proc::start(
                &format!("sink pod{} ({side})", i + 1),
                Some(pod),
                &[&me, "kp-sink", &DP_PORT.to_string()],
                &[],
                &dir.join(format!("{side}-pod{}-sink.log", i + 1)),
            );
            p.wait_for_log("ready", Duration::from_secs(20))
                .map_err(anyhow::Error::msg)?;
            sinks.push(p);
        }
        Ok(Node {
            _sinks: sinks,
            _relay: relay,
            ns,
        })
    }
}

/// CPU seconds of a process and of its children that it waited for (the proxies' `nft`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu {
    pub own: f64,
    pub children: f64,
}

impl std::ops::Sub for Cpu {
    type Output = Cpu;
    fn sub(self, o: Cpu) -> Cpu {
        Cpu {
            own: self.own - o.own,
            children: self.children - o.children,
        }
    }
}

/// utime+stime and cutime+cstime of `pid` from /proc/<pid>/stat.
pub fn cpu_of(pid: u32) -> Cpu {
    let own = cpu_secs(pid);
    let children = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let rest = &stat[stat.rfind(')')? + 2..];
            let f: Vec<&str> = rest.split_whitespace().collect();
            // After "pid (comm) ": cutime is field 16, cstime 17.
            let cu: f64 = f.get(13)?.parse().ok()?;
            let cs: f64 = f.get(14)?.parse().ok()?;
            Some((cu + cs) / clk_tck())
        })
        .unwrap_or(f64::NAN);
    Cpu { own, children }
}

/// The metric families the measurements read, IPv4 family.
#[derive(Clone, Debug, Default)]
pub struct SyncMetrics {
    /// Syncs of any kind done (sync_proxy_rules_duration_seconds_count).
    pub syncs: f64,
    /// Full syncs done, and the seconds they took together.
    pub full_syncs: f64,
    pub full_sum: f64,
    /// When the last sync completed (unix seconds).
    pub last: f64,
}

/// The IPv4 family's sample of `name` (the sync metrics carry an `ip_family` label in both
/// proxies' versions that have one; a sample without labels is taken as it is).
fn metric(text: &str, name: &str) -> Option<f64> {
    nsock::metric(text, &format!("{name}{{ip_family=\"IPv4\"}}"))
        .or_else(|| nsock::metric(text, name))
}

/// The first full sync of a run of the proxy.
#[derive(Clone, Debug, Default)]
pub struct FirstSync {
    /// From the exec to the end of the first sync (the metric's timestamp); None when it did
    /// not happen within the bound.
    pub secs: Option<f64>,
    /// How long was waited (the bound, when `secs` is None).
    pub waited: f64,
    /// The proxy's own duration of that sync (its full-sync histogram's sum).
    pub internal: Option<f64>,
    /// VmHWM of the proxy when the sync was seen complete, MiB.
    pub peak_rss_mib: f64,
    /// The largest VmHWM seen of an `nft` child, MiB (polled: a lower bound for short ones).
    pub nft_peak_mib: f64,
    pub nft_runs: usize,
    pub cpu: Cpu,
    pub note: Option<String>,
}

/// A running proxy.
pub struct Session {
    pub proc: Proc,
    pub pid: u32,
    started: SystemTime,
    started_i: Instant,
    pub ns: String,
}

impl Session {
    pub fn start(
        label: &str,
        bin: &Path,
        node: &Node,
        cluster: &Cluster,
        set: &[String],
        log: &Path,
    ) -> Session {
        // The tests' flags, with `set` replacing the flags of the same names: both proxies get
        // the same command line.
        let spec = proxy::Args::Defaults {
            set: set.to_vec(),
            unset: Vec::new(),
        };
        let dir = log.parent().unwrap_or(Path::new("."));
        let args = proxy::argv(&spec, &cluster.kubeconfig, dir);
        let started = SystemTime::now();
        let started_i = Instant::now();
        let proc = proxy::start_bin(
            &format!("kube-proxy ({label})"),
            bin,
            &node.ns.node,
            &args,
            &[],
            log,
        );
        let pid = proc.pid();
        Session {
            proc,
            pid,
            started,
            started_i,
            ns: node.ns.node.clone(),
        }
    }

    pub fn metrics(&self) -> Result<SyncMetrics> {
        let addr: SocketAddr = METRICS.parse()?;
        let (code, text) =
            nsock::http_get(&self.ns, addr, "/metrics").map_err(anyhow::Error::msg)?;
        if code != 200 {
            bail!("GET /metrics: HTTP {code}");
        }
        let get = |n: &str| metric(&text, n);
        Ok(SyncMetrics {
            syncs: get("kubeproxy_sync_proxy_rules_duration_seconds_count").unwrap_or(0.0),
            full_syncs: get("kubeproxy_sync_full_proxy_rules_duration_seconds_count")
                .unwrap_or(0.0),
            full_sum: get("kubeproxy_sync_full_proxy_rules_duration_seconds_sum").unwrap_or(0.0),
            last: get("kubeproxy_sync_proxy_rules_last_timestamp_seconds").unwrap_or(0.0),
        })
    }

    pub fn cpu(&self) -> Cpu {
        cpu_of(self.pid)
    }

    pub fn rss_mib(&self) -> f64 {
        status_kib(self.pid, "VmRSS") / 1024.0
    }

    pub fn hwm_mib(&self) -> f64 {
        status_kib(self.pid, "VmHWM") / 1024.0
    }

    fn check_alive(&mut self) -> Result<()> {
        if let Some(st) = self.proc.exited() {
            bail!(
                "{} exited ({st}):\n{}",
                self.proc.name,
                self.proc.log_tail(30)
            );
        }
        Ok(())
    }

    /// Waits for the first full sync to complete, polling the metrics every 100 ms and the
    /// proxy's children every 20 ms (the `nft` processes: their peak RSS). The end is the
    /// sync's own completion timestamp (sync_proxy_rules_last_timestamp_seconds) when the
    /// first poll that sees a full sync sees exactly one sync; else the poll's time.
    pub fn wait_first_sync(&mut self, timeout: Duration) -> Result<FirstSync> {
        let deadline = self.started_i + timeout;
        let mut nft: BTreeMap<u32, f64> = BTreeMap::new();
        let mut tick = 0u64;
        loop {
            self.check_alive()?;
            sample_children(self.pid, &mut nft);
            if tick.is_multiple_of(5) {
                if let Ok(m) = self.metrics() {
                    if m.full_syncs >= 1.0 {
                        let seen = SystemTime::now();
                        let cpu = self.cpu();
                        let peak = self.hwm_mib();
                        let start = self.started.duration_since(UNIX_EPOCH)?.as_secs_f64();
                        let (secs, note) = if m.syncs <= 1.0 && m.last > start {
                            (m.last - start, None)
                        } else {
                            (
                                seen.duration_since(self.started)?.as_secs_f64(),
                                Some(format!(
                                    "{} syncs by the first poll: the poll's time is used",
                                    m.syncs
                                )),
                            )
                        };
                        return Ok(FirstSync {
                            secs: Some(secs),
                            waited: secs,
                            internal: (m.full_syncs == 1.0).then_some(m.full_sum),
                            peak_rss_mib: peak,
                            nft_peak_mib: nft.values().copied().fold(0.0, f64::max),
                            nft_runs: nft.len(),
                            cpu,
                            note,
                        });
                    }
                }
            }
            if Instant::now() > deadline {
                return Ok(FirstSync {
                    secs: None,
                    waited: self.started_i.elapsed().as_secs_f64(),
                    internal: None,
                    peak_rss_mib: self.hwm_mib(),
                    nft_peak_mib: nft.values().copied().fold(0.0, f64::max),
                    nft_runs: nft.len(),
                    cpu: self.cpu(),
                    note: Some(format!(
                        "no full sync within {:.0} s",
                        timeout.as_secs_f64()
                    )),
                });
            }
            tick += 1;
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until the proxy has been quiet (no sync completed) for `quiet`, at most `max`.
    pub fn wait_quiet(&mut self, quiet: Duration, max: Duration) -> Result<()> {
        let t0 = Instant::now();
        let mut last = self.metrics().map(|m| m.syncs).unwrap_or(0.0);
        let mut since = Instant::now();
        while t0.elapsed() < max {
            self.check_alive()?;
            std::thread::sleep(Duration::from_millis(200));
            let now = self.metrics().map(|m| m.syncs).unwrap_or(last);
            if now != last {
                last = now;
                since = Instant::now();
            } else if since.elapsed() >= quiet {
                break;
            }
        }
        Ok(())
    }

    /// Stops the proxy (SIGTERM; both leave their tables in place) and waits for it.
    pub fn stop(self) {
        drop(self.proc);
    }
}

/// Records the VmHWM (MiB) of every `nft` child of `pid` now running, per child.
fn sample_children(pid: u32, seen: &mut BTreeMap<u32, f64>) {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return;
    };
    for t in tasks.flatten() {
        let Ok(list) = std::fs::read_to_string(t.path().join("children")) else {
            continue;
        };
        for c in list
            .split_whitespace()
            .filter_map(|c| c.parse::<u32>().ok())
        {
            let comm = std::fs::read_to_string(format!("/proc/{c}/comm")).unwrap_or_default();
            if comm.trim() != "nft" {
                continue;
            }
            let hwm = status_kib(c, "VmHWM") / 1024.0;
            if hwm.is_finite() {
                let e = seen.entry(c).or_insert(0.0);
                *e = e.max(hwm);
            }
        }
    }
}

/// `nft list table ip kube-proxy` of the node into `file`; its seconds.
pub fn list_table(ns: &str, file: &Path) -> Result<f64> {
    let out = std::fs::File::create(file).with_context(|| file.display().to_string())?;
    let t0 = Instant::now();
    let st = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            "nft",
            "list",
            "table",
            "ip",
            "kube-proxy",
        ])
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .status()?;
    if !st.success() {
        bail!("nft list table ip kube-proxy in {ns}: {st}");
    }
    Ok(t0.elapsed().as_secs_f64())
}
