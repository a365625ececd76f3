//! Options of `konn_bench kube-proxy`.

use std::path::PathBuf;

use anyhow::{anyhow, bail, Result};

use crate::cli_args::ArgWalk;

/// One populated cluster: `services` Services with `endpoints` endpoints each. `0x0` is the
/// idle case: no Service but the apiserver's own `kubernetes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Size {
    pub services: usize,
    pub endpoints: usize,
}

impl Size {
    pub fn parse(s: &str) -> Result<Size> {
        let (a, b) = s
            .trim()
            .split_once('x')
            .ok_or_else(|| anyhow!("size {s:?}: expected SERVICESxENDPOINTS, e.g. 10000x10"))?;
        let size = Size {
            services: a.parse()?,
            endpoints: b.parse()?,
        };
        if (size.services == 0) != (size.endpoints == 0) {
            bail!("size {s:?}: 0 Services goes with 0 endpoints (0x0, the idle case)");
        }
        // The bulk ClusterIPs are 10.96.0.16 up to 10.96.253.255 (the rest is the probes').
        if size.services > 64_000 {
            bail!("size {s:?}: at most 64000 Services");
        }
        Ok(size)
    }
    pub fn label(&self) -> String {
        format!("{}x{}", self.services, self.endpoints)
    }
    pub fn idle(&self) -> bool {
        self.services == 0
    }
    /// A readable name: "10,000 x 10".
    pub fn title(&self) -> String {
        if self.idle() {
            "no Services".into()
        } else {
            format!(
                "{} x {}",
                thousands(self.services),
                thousands(self.endpoints)
            )
        }
    }
}

pub fn thousands(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[derive(Clone, Debug)]
pub struct Opts {
    pub quick: bool,
    pub rounds: usize,
    /// Our kube-proxy, as shipped (`cargo build --release`).
    pub ours_bin: PathBuf,
    /// tests/kube/build.sh's directory: kube-apiserver, etcd and upstream's kube-proxy.
    pub kube_bin_dir: PathBuf,
    pub out: PathBuf,
    pub repo: PathBuf,
    pub sizes: Vec<Size>,
    /// Endpoint changes per series (one series with `--iptables-min-sync-period=0`, one with
    /// the default 1 s).
    pub changes: usize,
    /// A series stops early (with the changes it made) once it has run this long.
    pub series_budget_secs: f64,
    /// After each change is in the kernel, a pause drawn uniformly from [0, this).
    pub gap_max_ms: u64,
    /// New Services per session, each timed alone.
    pub new_services: usize,
    /// Bound of one first sync (start or restart); past it the run is reported as "> N s".
    pub first_sync_timeout_secs: f64,
    /// Bound of one change (or new Service) reaching the kernel.
    pub change_timeout_secs: f64,
    /// The size whose ClusterIP carries the data-plane comparison (None: not run).
    pub dataplane_size: Option<Size>,
    pub dataplane_secs: f64,
    pub dataplane_reps: usize,
    /// Pause after the first sync before the settled RSS is read.
    pub settle_secs: f64,
    /// Bound of one `nft -f` of the final ruleset in a fresh namespace (the kernel's floor).
    pub floor_timeout_secs: f64,
    /// The populated clusters' etcd data (`<cache>/<key>/etcd-data`).
    pub cache: PathBuf,
    /// Concurrent requests while populating a cluster.
    pub create_concurrency: usize,
    pub keep_tmp: bool,
    /// Only make (or check) the cached clusters of `sizes`, measure nothing.
    pub populate_only: bool,
    /// Only these proxies ("ours", "upstream"); both by default.
    pub proxies: Vec<String>,
    /// The arguments that chose what to run (not the paths benches/run fills in), for the
    /// report to say.
    pub args: Vec<String>,
}

pub fn usage() -> &'static str {
    "usage: konn_bench kube-proxy --ours-bin PATH --kube-bin-dir DIR [--out DIR] [--quick]\n\
     \x20      [--rounds N] [--sizes 0x0,1000x10,10000x10,5000x50,44000x2] [--changes N]\n\
     \x20      [--series-budget S] [--gap-max-ms MS] [--new-services N]\n\
     \x20      [--first-sync-timeout S] [--change-timeout S] [--dataplane-size SxE|none]\n\
     \x20      [--dataplane-secs S] [--dataplane-reps N] [--settle S] [--floor-timeout S]\n\
     \x20      [--cache DIR] [--create-concurrency N] [--proxies ours,upstream] [--keep-tmp]\n\
     \x20      [--populate-only]\n\
     \x20      [--repo DIR]"
}

fn default_cache() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/var/tmp"));
    base.join("kube-traffic-bench").join("etcd")
}

fn sizes(s: &str) -> Result<Vec<Size>> {
    s.split(',')
        .filter(|x| !x.trim().is_empty())
        .map(Size::parse)
        .collect()
}

pub fn parse(args: &[String]) -> Result<Opts> {
    let quick = args.iter().any(|a| a == "--quick");
    let mut o = Opts {
        quick,
        rounds: if quick { 1 } else { 3 },
        ours_bin: PathBuf::new(),
        kube_bin_dir: PathBuf::new(),
        out: PathBuf::from("."),
        repo: std::env::current_dir()?,
        sizes: if quick {
            sizes("0x0,500x10")?
        } else {
            sizes("0x0,1000x10,10000x10,5000x50,44000x2")?
        },
        changes: if quick { 10 } else { 200 },
        series_budget_secs: if quick { 60.0 } else { 600.0 },
        gap_max_ms: 500,
        new_services: if quick { 2 } else { 5 },
        first_sync_timeout_secs: if quick { 120.0 } else { 900.0 },
        change_timeout_secs: if quick { 60.0 } else { 300.0 },
        dataplane_size: Some(if quick {
            Size::parse("500x10")?
        } else {
            Size::parse("10000x10")?
        }),
        dataplane_secs: if quick { 2.0 } else { 10.0 },
        dataplane_reps: if quick { 1 } else { 3 },
        settle_secs: if quick { 2.0 } else { 10.0 },
        floor_timeout_secs: if quick { 120.0 } else { 900.0 },
        cache: default_cache(),
        create_concurrency: 32,
        keep_tmp: false,
        populate_only: false,
        proxies: vec!["ours".into(), "upstream".into()],
        args: Vec::new(),
    };
    let mut walk = ArgWalk::new(args);
    while let Some(key) = walk.next_key() {
        match key.as_str() {
            "--quick" | "--bench" => {}
            "--keep-tmp" => o.keep_tmp = true,
            "--populate-only" => o.populate_only = true,
            "--rounds" => o.rounds = walk.value()?.parse()?,
            "--ours-bin" => o.ours_bin = walk.value()?.into(),
            "--kube-bin-dir" => o.kube_bin_dir = walk.value()?.into(),
            "--out" => o.out = walk.value()?.into(),
            "--repo" => o.repo = walk.value()?.into(),
            "--sizes" => o.sizes = sizes(&walk.value()?)?,
            "--changes" => o.changes = walk.value()?.parse()?,
            "--series-budget" => o.series_budget_secs = walk.value()?.parse()?,
            "--gap-max-ms" => o.gap_max_ms = walk.value()?.parse()?,
            "--new-services" => o.new_services = walk.value()?.parse()?,
            "--first-sync-timeout" => o.first_sync_timeout_secs = walk.value()?.parse()?,
            "--change-timeout" => o.change_timeout_secs = walk.value()?.parse()?,
            "--dataplane-size" => {
                let v = walk.value()?;
                o.dataplane_size = if v == "none" {
                    None
                } else {
                    Some(Size::parse(&v)?)
                }
            }
            "--dataplane-secs" => o.dataplane_secs = walk.value()?.parse()?,
            "--dataplane-reps" => o.dataplane_reps = walk.value()?.parse()?,
            "--settle" => o.settle_secs = walk.value()?.parse()?,
            "--floor-timeout" => o.floor_timeout_secs = walk.value()?.parse()?,
            "--cache" => o.cache = walk.value()?.into(),
            "--create-concurrency" => o.create_concurrency = walk.value()?.parse()?,
            "--proxies" => {
                o.proxies = walk
                    .value()?
                    .split(',')
                    .map(|s| s.trim().to_string())
                    .collect();
                for p in &o.proxies {
                    if p != "ours" && p != "upstream" {
                        bail!("--proxies: ours and/or upstream, not {p:?}");
                    }
                }
            }
            "-h" | "--help" => {
                println!("{}", usage());
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?}\n{}", usage()),
        }
    }
    let paths = ["--ours-bin", "--kube-bin-dir", "--out", "--repo", "--cache"];
    let mut skip = false;
    for a in args {
        if std::mem::take(&mut skip) {
            continue;
        }
        let key = a.split_once('=').map_or(a.as_str(), |(k, _)| k);
        if paths.contains(&key) {
            skip = !a.contains('=');
            continue;
        }
        o.args.push(a.clone());
    }
    if o.ours_bin.as_os_str().is_empty() || o.kube_bin_dir.as_os_str().is_empty() {
        bail!("--ours-bin and --kube-bin-dir are required\n{}", usage());
    }
    if o.rounds == 0 || o.sizes.is_empty() || o.proxies.is_empty() {
        bail!("--rounds, --sizes and --proxies need at least one each");
    }
    if let Some(d) = o.dataplane_size {
        if !o.sizes.contains(&d) {
            bail!(
                "--dataplane-size {} is not one of --sizes (or say none)",
                d.label()
            );
        }
    }
    Ok(o)
}
