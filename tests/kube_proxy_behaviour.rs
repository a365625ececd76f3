//! Our kube-proxy's behaviour as a running process: each scenario drives the real binary in a
//! node made of network namespaces against the real kube-apiserver (the side-by-side harness
//! in tests/kube_proxy/), with upstream v1.37.2 beside it where a comparison says something.
//!
//! One apiserver and, for the first scenarios, two nodes ("up" runs upstream, "rs" ours);
//! then upstream's node is removed and the rest run ours alone:
//!
//! - `udp-conntrack` (both): a UDP flow with a fixed source port, from the client and from a
//!   pod, follows its Service's endpoint when the only endpoint is replaced (the stale entry
//!   is deleted after the sync); a restart deletes no entry whose endpoint still serves (the
//!   `conntrack -L` counts of both programs are reported).
//! - `apiserver-away` (both): the kube-apiserver is killed for 30 s and the proxies restarted
//!   meanwhile; rules, an established connection and new connections stay; `/healthz` and
//!   `/livez` are compared with upstream's at every stage; a new Service works afterwards.
//! - `nft-failure`: `nft -f` fails (`KUBE_PROXY_NFT_APPLIER=nft`, a fake `nft` first on
//!   PATH): the failure metric, the log, the retry as a full sync, `/healthz` 503 after
//!   2 x syncPeriod, and the recovery.
//! - `reload`: our TOML and a kubeadm KubeProxyConfiguration in a ConfigMap-style directory,
//!   changed live by SIGHUP, by rewriting and by `..data` symlink swaps: every reloadable
//!   setting takes effect in the kernel, the sysctls or the ports, a TCP connection through a
//!   Service works across every reload, and an invalid file is refused and changes nothing.
//! - `bad-objects` (both): odd and extreme API objects; no crash, no refused transaction,
//!   the same rules as upstream's, good Services keep working.
//! - `readiness`: READY=1 only once the first sync is in the kernel (the apiserver out of
//!   reach for 33 s at the start, longer than the node wait), STOPPING=1 on SIGTERM, and the
//!   table stays after exit.
//! - `latency` (last: it leaves 1,000 Services): with `--iptables-min-sync-period=0`, the
//!   POST-to-kernel latency of 50 EndpointSlice changes, and the size of a partial sync.
//!
//! `a_change_is_queued_when_it_arrives` (both): the queued-time gauge and the healthz clock
//! start when a change arrives, not when the min sync period lets its sync start.
//!
//! Knobs (environment): `KP_SCENARIOS=a,b` runs only those; `KP_KEEP=1` keeps the run's
//! directory. The report (numbers) and, after a failure, the logs are in
//! `target/tmp/kube-proxy-behaviour/`.
//!
//! Needs root, iproute2, nftables, conntrack, socat, python3 and Go (tests/kube/build.sh);
//! skipped without them, except under CI=true, where that fails.
#![allow(clippy::unwrap_used)] // tests fail loudly by design

#[path = "kube_proxy_behaviour/apiserver_away.rs"]
mod apiserver_away;
#[path = "kube_proxy_behaviour/bad_objects.rs"]
mod bad_objects;
#[path = "kube_proxy_behaviour/helpers.rs"]
mod helpers;
mod kube_proxy;
#[path = "kube_proxy_behaviour/latency.rs"]
mod latency;
#[path = "kube_proxy_behaviour/nft_failure.rs"]
mod nft_failure;
#[path = "kube_proxy_behaviour/readiness.rs"]
mod readiness;
#[path = "kube_proxy_behaviour/reload.rs"]
mod reload;
#[path = "kube_proxy_behaviour/udp_conntrack.rs"]
mod udp_conntrack;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{json, Value};

use apiserver_away::*;
use bad_objects::*;
use helpers::*;
use kube_proxy::api::{Ep, Proto::*, Slice, Svc};
use kube_proxy::harness::{all, p, Harness, SideSpec};
use kube_proxy::node::{CLIENT_IP, NODE_IP, NODE_POD_SIDE_IP};
use kube_proxy::nsock::{self, LineConn};
use kube_proxy::procs::{ns_run, wait_until};
use kube_proxy::proxy::{self, Impl};
use kube_proxy::ruleset;
use latency::*;
use nft_failure::*;
use readiness::*;
use reload::*;
use udp_conntrack::*;

const POD1: &str = "10.244.1.2";
const POD2: &str = "10.244.1.3";
/// netagent's line echo (a connection that stays open).
const LINE_PORT: u16 = 8090;
const SCALE_NS: &str = "kp-scale";
const SCALE_SERVICES: usize = 1000;

type Scenario = (&'static str, fn(&mut Harness));

/// In order: the scenarios that compare with upstream run while its node exists.
const BOTH_SIDES: &[Scenario] = &[
    ("udp-conntrack", udp_conntrack),
    ("apiserver-away", apiserver_away),
    ("bad-objects", bad_objects),
];
const OURS_ALONE: &[Scenario] = &[
    ("nft-failure", nft_failure),
    ("reload", reload),
    ("readiness", readiness),
    ("latency", latency),
];

/// The report's lines, in the order they were found (the numbers a reader wants).
static REPORT: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn note(line: String) {
    eprintln!("REPORT {line}");
    REPORT.lock().unwrap().push(line);
}

#[test]
fn kube_proxy_behaviour() {
    if !kube_proxy::preflight() {
        return;
    }
    let only: Option<Vec<String>> = std::env::var("KP_SCENARIOS")
        .ok()
        .map(|s| s.split(',').map(str::to_string).collect());
    let wanted = |name: &str| only.as_ref().is_none_or(|o| o.iter().any(|n| n == name));
    let t0 = Instant::now();
    let need_upstream = BOTH_SIDES.iter().any(|(n, _)| wanted(n));
    let mut specs = Vec::new();
    if need_upstream {
        specs.push(SideSpec {
            label: "up",
            which: Impl::Upstream,
        });
    }
    specs.push(SideSpec {
        label: "rs",
        which: Impl::Ours,
    });
    let mut h = Harness::start(&specs, &[]);
    for (name, f) in BOTH_SIDES {
        if wanted(name) {
            h.scenario(name, f);
        }
    }
    if need_upstream {
        h.remove_side("up");
    }
    for (name, f) in OURS_ALONE {
        if wanted(name) {
            let failed = h.failures.len();
            h.scenario(name, f);
            // A scenario that stopped half-way may have left its own flags or configuration
            // file in force: the next one starts from the harness's flags again.
            if h.failures.len() > failed {
                let i = ours(&h);
                h.scenario(&format!("{name}: restore"), |h| {
                    restart_default(h, i, false, &[], &[])
                });
            }
        }
    }
    h.finish(&REPORT.lock().unwrap().join("\n"), t0);
}

/// When a change arrives while the min sync period holds the next sync back, upstream marks
/// the sync as queued at once (`Sync()` from the event handler: the healthz clock and
/// `sync_proxy_rules_last_queued_timestamp_seconds`); ours must too (the store tells its
/// listener as the change arrives), not when the sync starts up to minSyncPeriod later. With
/// a 10 s minSyncPeriod the difference would be 10 s against milliseconds.
#[test]
fn a_change_is_queued_when_it_arrives() {
    if !kube_proxy::preflight() {
        return;
    }
    // Labels of their own: with --include-ignored this runs beside the main test, in the
    // same process, and namespace names carry the process id and the label.
    let specs = [
        SideSpec {
            label: "uq",
            which: Impl::Upstream,
        },
        SideSpec {
            label: "rq",
            which: Impl::Ours,
        },
    ];
    let mut h = Harness::start(&specs, &[]);
    h.scenario("queued-on-arrival", queued_on_arrival);
    let failures = std::mem::take(&mut h.failures);
    if !failures.is_empty() {
        eprintln!("logs: {}", h.save_logs().display());
    }
    drop(h);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn queued_on_arrival(h: &mut Harness) {
    let min = Duration::from_secs(10);
    for i in 0..h.sides.len() {
        let mut args = proxy::args(&h.kubeconfig());
        args.push(format!("--iptables-min-sync-period={}s", min.as_secs()));
        h.restart_proxy(i, false, &args, &[]);
    }
    h.settle();
    // Right after a sync: the next one waits for the min sync period.
    let series = "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family=\"IPv4\"}";
    let t_change = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    echo_service(h, "queued", "10.96.27.1", &[POD1]);
    for i in 0..h.sides.len() {
        let label = h.sides[i].label;
        let seen = wait_until(
            &format!("side {label}: last_queued after the change"),
            min + Duration::from_secs(10),
            Duration::from_millis(20),
            || nsock::metric(&metrics_text(h, i), series).filter(|v| *v >= t_change),
        );
        match seen {
            Ok(v) => {
                let lag = v - t_change;
                note(format!(
                    "queued-on-arrival: side {label} ({}): sync marked queued {lag:.3} s after the change (minSyncPeriod {min:?})",
                    h.sides[i].which.label()
                ));
                if lag > 1.0 {
                    h.fail(format!(
                        "side {label}: the sync was marked queued {lag:.3} s after the change arrived"
                    ));
                }
            }
            Err(e) => h.fail(e),
        }
    }
}
