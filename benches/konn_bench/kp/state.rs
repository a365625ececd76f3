//! Populated clusters: the objects of one size, created once through the API, and the etcd
//! data they leave kept in a cache outside the work tree, so that every later measurement
//! starts an apiserver on a copy of exactly the same state.
//!
//! Layout of a cluster of S Services x E endpoints (no controller runs: every object is
//! written by hand, as tests/kube_proxy does):
//! - Node `node-a` (the node both proxies run as) with its InternalIPs.
//! - Namespace `bench`: Services `svc-00000`... type ClusterIP, ClusterIP 10.96.0.16 + i, one
//!   port `http` TCP 80 -> 8080, no selector; per Service ceil(E/100) EndpointSlices of up to
//!   100 endpoints (as the EndpointSlice controller fills them), all ready. The endpoints are
//!   spread over 100 nodes: every hundredth on `node-a` (addresses of its pod CIDR that no pod
//!   holds), the rest on `node-01`...`node-99`, each with a /24 of 10.244.0.0/16.
//! - Namespace `kp-probe`: Service `probe` (10.96.255.1:80 -> pod1:8080, the echo server that
//!   says which pod answered; the endpoint changes swap pod1 and pod2) and Service `dp`
//!   (10.96.255.2:9000 -> pod1 and pod2 on 9000, the data-plane sink). The idle size (0x0)
//!   has neither: nothing but the apiserver's own `kubernetes` Service.
//!
//! New Services made during a measurement take 10.96.254.1 and up.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, bail, Result};
use serde_json::Value;

use super::harness::api::{Apiserver, Ep, Kube, Proto, Slice, Svc};
use super::harness::node::{NODE_IP, NODE_IP6, PODS};
use super::harness::NODE_NAME;
use super::opts::{Opts, Size};

/// Bumped whenever the layout above changes: the cache key carries it.
const LAYOUT_VERSION: u32 = 1;
pub const BULK_NS: &str = "bench";
pub const PROBE_NS: &str = "kp-probe";
pub const PROBE_SVC: &str = "probe";
pub const PROBE_SLICE: &str = "probe-1";
pub const PROBE_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 255, 1);
pub const PROBE_PORT: u16 = 80;
/// netagent.py's first echo port (tests/kube_proxy/node.rs ECHO_PORTS).
pub const ECHO_PORT: u16 = 8080;
pub const DP_SVC: &str = "dp";
pub const DP_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 255, 2);
/// The data-plane sink's port in both pods (the Service maps it to itself).
pub const DP_PORT: u16 = 9000;
/// Endpoints per EndpointSlice, the controller's default `--max-endpoints-per-slice`.
const SLICE_MAX: usize = 100;
/// The nodes endpoints are spread over (node-a and 99 others): one in a hundred is local.
const NODES: usize = 100;

/// A pod of the measured node: (name, IPv4).
pub fn pod(i: usize) -> (&'static str, &'static str) {
    (PODS[i].0, PODS[i].1)
}

/// The ClusterIP of new Service `k` made during a measurement.
pub fn new_vip(k: usize) -> Ipv4Addr {
    let k = u8::try_from(k + 1).unwrap_or(u8::MAX);
    Ipv4Addr::new(10, 96, 254, k)
}

fn bulk_vip(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 96, 0, 16)) + i as u32)
}

/// Endpoint `j` of bulk Service `i`: its address and node.
fn endpoint(size: Size, i: usize, j: usize) -> (String, String) {
    let g = i * size.endpoints + j;
    let node = g % NODES;
    let host = 2 + (g / NODES) % 250;
    if node == 0 {
        // node-a's pod CIDR is 10.244.1.0/24; .2 and .3 are its two real pods.
        let host = 10 + (g / NODES) % 240;
        (format!("10.244.1.{host}"), NODE_NAME.to_string())
    } else {
        (
            format!("10.244.{}.{host}", node + 1),
            format!("node-{node:02}"),
        )
    }
}

fn bulk_service(i: usize) -> Svc {
    Svc::cluster_ip(&format!("svc-{i:05}"), &bulk_vip(i).to_string()).port(
        "http",
        Proto::Tcp,
        80,
        ECHO_PORT,
    )
}

fn bulk_slices(size: Size, i: usize) -> Vec<Slice> {
    let svc = format!("svc-{i:05}");
    (0..size.endpoints.div_ceil(SLICE_MAX))
        .map(|k| {
            let mut s = Slice::v4(&format!("{svc}-{k}"), &svc).port("http", Proto::Tcp, ECHO_PORT);
            for j in k * SLICE_MAX..((k + 1) * SLICE_MAX).min(size.endpoints) {
                let (addr, node) = endpoint(size, i, j);
                s = s.ep(Ep::ready(&addr).on(&node));
            }
            s
        })
        .collect()
}

/// The `endpoints` of the probe's slice when `pod` (0 or 1) is its one endpoint.
pub fn probe_endpoints(pod_index: usize) -> Value {
    Slice::v4("x", PROBE_SVC)
        .ep(Ep::ready(pod(pod_index).1))
        .0
        .get("endpoints")
        .cloned()
        .unwrap_or(Value::Null)
}

/// A cached cluster: where its etcd data is, and what it holds.
pub struct State {
    pub size: Size,
    pub etcd_data: PathBuf,
    /// How the data was made (objects, seconds, rate), from the cache's INFO file.
    pub info: String,
}

/// `kube-v1.37.2_etcd-v3.7.3` from build.sh's VERSIONS: etcd's data format and the
/// apiserver's storage follow these, not the Go version or the build script.
fn versions_key(kube_bin_dir: &Path) -> String {
    let text = std::fs::read_to_string(kube_bin_dir.join("VERSIONS")).unwrap_or_default();
    let pick = |prefix: &str| {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.split_whitespace().nth(2))
            .unwrap_or("unknown")
            .to_string()
    };
    format!("kube-{}_etcd-{}", pick("kube-apiserver "), pick("etcd "))
}

pub fn cache_key(opts: &Opts, size: Size) -> String {
    format!(
        "v{LAYOUT_VERSION}_{}_{}",
        size.label(),
        versions_key(&opts.kube_bin_dir)
    )
}

/// The cached state of `size`, made first if the cache does not hold it.
pub fn ensure(opts: &Opts, size: Size, tmp: &Path) -> Result<State> {
    let key = cache_key(opts, size);
    let entry = opts.cache.join(&key);
    if !entry.join(".complete").exists() {
        populate(opts, size, &entry, tmp)?;
    }
    Ok(State {
        size,
        etcd_data: entry.join("etcd-data"),
        info: std::fs::read_to_string(entry.join("INFO"))
            .unwrap_or_default()
            .trim()
            .to_string(),
    })
}

/// Starts an apiserver on an empty etcd in `tmp`, creates the objects of `size`, stops it and
/// moves the data into the cache at `entry` (renamed into place when complete, so an
/// interrupted run leaves no half entry).
fn populate(opts: &Opts, size: Size, entry: &Path, tmp: &Path) -> Result<()> {
    let work = tmp.join(format!("populate-{}", size.label()));
    std::fs::create_dir_all(&work)?;
    eprintln!(
        "kube-proxy bench: populating {} (cached afterwards in {})",
        size.title(),
        entry.display()
    );
    let t0 = Instant::now();
    let bin_dir = opts.kube_bin_dir.to_string_lossy().into_owned();
    let created;
    {
        let api = Apiserver::start_with(
            &work.join("kube"),
            &[
                ("KUBE_BIN_DIR", bin_dir.as_str()),
                ("KUBE_START_TIMEOUT", "600"),
            ],
        );
        let kube = Kube::connect(&api, BULK_NS);
        kube.create_node(NODE_NAME, &[NODE_IP, NODE_IP6]);
        if !size.idle() {
            kube.ensure_namespace(PROBE_NS);
            let probe = kube.in_namespace(PROBE_NS);
            probe.create_service(&Svc::cluster_ip(PROBE_SVC, &PROBE_VIP.to_string()).port(
                "http",
                Proto::Tcp,
                PROBE_PORT,
                ECHO_PORT,
            ));
            probe.create_slice(
                &Slice::v4(PROBE_SLICE, PROBE_SVC)
                    .port("http", Proto::Tcp, ECHO_PORT)
                    .ep(Ep::ready(pod(0).1)),
            );
            probe.create_service(&Svc::cluster_ip(DP_SVC, &DP_VIP.to_string()).port(
                "sink",
                Proto::Tcp,
                DP_PORT,
                DP_PORT,
            ));
            probe.create_slice(
                &Slice::v4("dp-1", DP_SVC)
                    .port("sink", Proto::Tcp, DP_PORT)
                    .ep(Ep::ready(pod(0).1))
                    .ep(Ep::ready(pod(1).1)),
            );
        }
        created = create_bulk(&kube, size, opts.create_concurrency);
        // Drop stops the apiserver and etcd (stop.sh: SIGTERM), which leaves the data whole.
    }
    let secs = t0.elapsed().as_secs_f64();
    let data = work.join("kube").join("etcd-data");
    if !data.is_dir() {
        bail!("no etcd data in {}", data.display());
    }
    let parent = entry
        .parent()
        .ok_or_else(|| anyhow!("cache entry has no parent"))?;
    std::fs::create_dir_all(parent)?;
    let staging = parent.join(format!(
        ".staging-{}-{}",
        std::process::id(),
        entry.file_name().unwrap_or_default().to_string_lossy()
    ));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging)?;
    crate::kp::run_cmd(
        "mv",
        &[data.as_os_str(), staging.join("etcd-data").as_os_str()],
    )?;
    std::fs::write(
        staging.join("INFO"),
        format!(
            "{created} objects (Services and EndpointSlices) created in {secs:.0} s \
             ({:.0}/s, {} concurrent requests)\n",
            created as f64 / secs.max(0.001),
            opts.create_concurrency
        ),
    )?;
    std::fs::write(staging.join(".complete"), "")?;
    if std::fs::rename(&staging, entry).is_err() {
        // Another run made the same entry meanwhile: keep theirs.
        let _ = std::fs::remove_dir_all(&staging);
    }
    let _ = std::fs::remove_dir_all(&work);
    eprintln!(
        "kube-proxy bench: {} populated: {created} objects in {secs:.0} s",
        size.title()
    );
    Ok(())
}

/// Creates every bulk Service and its slices, `concurrency` requests at a time (the harness's
/// [`create_many`](super::harness::api::KubeNs::create_many): an object that exists already
/// is left as it is). Returns the number of objects.
fn create_bulk(kube: &Kube, size: Size, concurrency: usize) -> usize {
    if size.idle() {
        return 0;
    }
    let svcs: Vec<Svc> = (0..size.services).map(bulk_service).collect();
    let slices: Vec<Slice> = (0..size.services)
        .flat_map(|i| bulk_slices(size, i))
        .collect();
    eprintln!(
        "kube-proxy bench: creating {} Services and {} EndpointSlices",
        svcs.len(),
        slices.len()
    );
    kube.ns().create_many(&svcs, &slices, concurrency.max(1));
    svcs.len() + slices.len()
}
