//! Every `--proxy-mode` value gets its answer, with real processes in network namespaces and
//! the real kube-apiserver (the side-by-side harness, tests/kube_proxy/): ours always programs
//! nftables, and answers iptables and ipvs modes with what those modes show to traffic;
//! upstream kube-proxy v1.37.2 runs beside it where it can, in its iptables mode.
//!
//! One apiserver serves three sets of sides, one after the other:
//! 1. a node FORWARD policy of DROP (as Docker sets it) in every node: upstream in iptables
//!    mode, ours in iptables mode, ours in ipvs mode with rr. Services and NodePorts answer the
//!    client as upstream's do, only because of the KUBE-FORWARD chain (a control run without
//!    its jump times out, on every side); NodePorts on every local address and on 127.0.0.1
//!    (route_localnet=1); ipvs rr alternates per new connection; then `--cleanup`, ours and
//!    upstream's, on what each proxy left;
//! 2. nftables mode, ours and upstream's (equal tables; NodePorts on the primary address only;
//!    no localhost NodePorts; a FORWARD policy of DROP blocks Services, as upstream documents),
//!    and ipvs mode with sh (one endpoint per client address);
//! 3. the command lines operators run: the reference unit's (ipvs, wrr, --logtostderr) and
//!    kubeadm's DaemonSet with kubeadm's own KubeProxyConfiguration (mode empty), upstream
//!    running the latter too, and the mode left unset on the command line.
//!
//! Apart from it, without an apiserver: `--proxy-mode=userspace`/`kernelspace` get upstream's
//! error (upstream's binary run with the same flags), and `--ipvs-scheduler=lc` is refused.
//!
//! Needs root, iproute2, nftables, iptables (with ip6tables and the -save/-restore tools),
//! conntrack, socat, setpriv, python3 and Go (tests/kube/build.sh); skipped without them,
//! except under CI=true, where that fails. `KP_KEEP=1` keeps the run's directory.
#![allow(clippy::unwrap_used)] // tests fail loudly by design

#[path = "kube_proxy_modes/command_lines.rs"]
mod command_lines;
#[path = "kube_proxy_modes/forward_drop.rs"]
mod forward_drop;
#[path = "kube_proxy_modes/hairpin.rs"]
mod hairpin;
#[path = "kube_proxy_modes/helpers.rs"]
mod helpers;
mod kube_proxy;
#[allow(dead_code)] // shared with tests that use all of it
#[path = "support/netns.rs"]
mod netns;
#[path = "kube_proxy_modes/nftables_mode.rs"]
mod nftables_mode;
#[path = "kube_proxy_modes/no_apiserver.rs"]
mod no_apiserver;
#[path = "kube_proxy_modes/sides.rs"]
mod sides;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use command_lines::*;
use forward_drop::*;
use helpers::*;
use kube_proxy::api::{Ep, Proto::*, Slice, Svc};
use kube_proxy::harness::{all, p, Harness, Rules, SideSetup};
use kube_proxy::probe;
use kube_proxy::procs::{run, wait_until};
use kube_proxy::proxy::Impl;
use nftables_mode::*;
use sides::*;

const POD1: &str = "10.244.1.2";
const POD2: &str = "10.244.1.3";
/// The node's primary address (its Node object's first InternalIP).
const NODE: &str = "10.0.0.1";
/// Another address of the node (on its pod veths): iptables and ipvs modes serve NodePorts
/// here too, nftables mode by default only on the primary address.
const NODE_OTHER: &str = "10.244.1.1";
const CLUSTER_IP: &str = "10.96.20.1";
const NODEPORT_IP: &str = "10.96.20.2";
const NODE_PORT: u16 = 30080;

/// Both pods answering, each seeing the node's masquerade address.
const BOTH_MASQ: &[&str] = &["pod1<-masq", "pod2<-masq"];

const FORWARD_DROP: &[&str] = &["iptables", "-P", "FORWARD", "DROP"];
/// The rule our proxy and upstream's iptables and ipvs modes put at the top of FORWARD.
const FORWARD_JUMP: &str =
    "-A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD";

/// kubeadm's KubeProxyConfiguration, as its ConfigMap holds it (tests/fixtures; kubeadm writes
/// every field); only the kubeconfig's path is this test's.
const KUBEADM_CONFIG: &str = include_str!("fixtures/kube-proxy/kubeadm-config.conf");
const KUBEADM_KUBECONFIG: &str = "/var/lib/kube-proxy/kubeconfig.conf";

/// What upstream v1.37.2 logs (as an error) and posts as a KubeProxyDefaultMode Event when no
/// mode was given; read from its log in the run, this is only to find the line.
const DEFAULTED_MODE_START: &str = "No kube-proxy mode specified: defaulting to 'iptables'.";

fn artefacts() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kube-proxy-modes")
}

/// Whether the iptables tools are here (the harness's own preflight checks the rest).
fn iptables_preflight() -> bool {
    let missing: Vec<&str> = [
        "iptables",
        "ip6tables",
        "iptables-save",
        "ip6tables-save",
        "iptables-restore",
        "ip6tables-restore",
    ]
    .into_iter()
    .filter(|t| {
        !Command::new(t)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
    .collect();
    if missing.is_empty() {
        return true;
    }
    let msg = format!("the proxy-mode tests need {}", missing.join(", "));
    assert!(
        !std::env::var("CI").is_ok_and(|v| v == "true"),
        "CI=true: {msg}"
    );
    eprintln!("SKIPPED: {msg} (CI=true makes this a failure)");
    false
}

// ------------------------------------------------------------------------------------ the test

#[test]
fn every_proxy_mode_gets_its_answer() {
    if !kube_proxy::preflight() || !iptables_preflight() {
        return;
    }
    let t0 = std::time::Instant::now();
    let mut h = Harness::start_with(&artefacts(), &forward_drop_sides(["up", "ipt", "rr"]), &[]);
    h.scenario("forward-drop-services", forward_drop_services);
    h.scenario("forward-chain", forward_chain);
    h.scenario("forward-drop-control", forward_drop_control);
    h.scenario("ipvs-rr-alternates", ipvs_rr_alternates);
    h.scenario("localhost-nodeports-iptables", localhost_nodeports_iptables);
    h.scenario("mode-events", mode_events);
    h.scenario("cleanup", cleanup);

    h.restart_sides(&nftables_sides());
    h.scenario("nftables-mode", nftables_mode);
    h.scenario("ipvs-sh-by-client", ipvs_sh_by_client);
    h.scenario("nftables-forward-drop", nftables_forward_drop);

    match conntrack_defaults_hold() {
        Ok(()) => {
            h.restart_sides(&command_line_sides());
            h.scenario("command-lines", command_lines);
            h.scenario("defaulted-mode", defaulted_mode);
        }
        Err(why) => {
            assert!(
                !std::env::var("CI").is_ok_and(|v| v == "true"),
                "CI=true: {why}"
            );
            eprintln!("SKIPPED the command-line scenarios: {why}");
        }
    }

    h.finish("modes", t0);
}
