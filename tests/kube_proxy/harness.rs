//! The whole fixture: one apiserver, one relay, and per side a node (namespaces, echo pods)
//! with a kube-proxy in it; how to wait for both proxies to catch up, compare their rulesets
//! and drive connections through both nodes.
//!
//! Waiting: after every change the harness moves a *barrier*, a dual-stack Service of its own
//! whose port (and its endpoints' port) it sets to a new number, and waits until every side's
//! tables show that number. A proxy handles the events of one resource kind in order, so once
//! the barrier's Service and slices show, every earlier Service and slice change has been seen,
//! and the sync that showed it included them. That also covers changes that must leave the
//! rules as they were (a headless Service, a slice without a Service), where "the ruleset
//! stopped changing" would prove nothing. A side that writes iptables rules instead of a table
//! (upstream in iptables mode) is waited on the same way, through `iptables-save`.
//!
//! A side can run another mode or an operator's own command line ([`SideSetup`]), and the
//! sides can be replaced while the apiserver keeps running ([`Harness::restart_sides`]).

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;

use super::api::{self, Apiserver, Ep, Kube, KubeNs, Proto, Slice, Svc};
use super::node::{self, NodeNs};
use super::probe::{self, Expect};
use super::procs::{self, ns_must, Proc};
use super::proxy::{self, Args, Impl};
use super::ruleset::{self, Table};
use super::NODE_NAME;

/// The namespace scenarios create their objects in; emptied between scenarios.
pub const NS: &str = "kp";
const BARRIER_NS: &str = "kp-barrier";
const BARRIER_V4: &str = "10.96.255.254";
const BARRIER_V6: &str = "fd00:10:96::fffe";
const BARRIER_EP_V4: &str = "10.244.99.99";
const BARRIER_EP_V6: &str = "fd00:10:244:99::99";
/// What identifies the barrier's lines in a ruleset.
const BARRIER_NEEDLES: [&str; 5] = [
    BARRIER_V4,
    BARRIER_V6,
    BARRIER_EP_V4,
    BARRIER_EP_V6,
    "kp-barrier/",
];
/// How long a proxy may take to show a change. Upstream needs at most ~1 s (its minimum sync
/// interval) plus the sync itself; the rest is for a machine busy with builds.
const SYNC_TIMEOUT: Duration = Duration::from_secs(30);
const FAMILIES: [&str; 2] = ["ip", "ip6"];

/// One side to run: its label and its program.
#[derive(Clone, Copy, Debug)]
pub struct SideSpec {
    pub label: &'static str,
    pub which: Impl,
}

/// Where the harness sees a side's rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rules {
    /// The `kube-proxy` table of each family (nftables mode, and ours in every mode).
    Nftables,
    /// `iptables-save` and `ip6tables-save` (upstream in iptables mode): there is no table to
    /// compare, only to wait on.
    Iptables,
}

/// One side to run, in full: its program and command line, what its node gets before the
/// proxy starts, and where its rules are seen.
#[derive(Clone, Debug)]
pub struct SideSetup {
    pub label: &'static str,
    pub which: Impl,
    pub args: Args,
    /// Commands run in the node namespace once it exists, before the proxy starts (say,
    /// `iptables -P FORWARD DROP`).
    pub node_setup: Vec<Vec<String>>,
    /// Files written into the side's own directory before the proxy starts: name, text
    /// (with `{kubeconfig}` and `{dir}` replaced as in [`Args::Exact`]).
    pub files: Vec<(String, String)>,
    pub rules: Rules,
}

impl From<SideSpec> for SideSetup {
    fn from(spec: SideSpec) -> SideSetup {
        SideSetup::new(spec.label, spec.which)
    }
}

impl SideSetup {
    /// The harness's defaults: nftables mode, the flags of [`proxy::args`].
    pub fn new(label: &'static str, which: Impl) -> SideSetup {
        SideSetup {
            label,
            which,
            args: Args::default(),
            node_setup: Vec::new(),
            files: Vec::new(),
            rules: Rules::Nftables,
        }
    }

    /// `--proxy-mode=<mode>`, or no `--proxy-mode` at all for "" (the mode unset). Upstream
    /// in iptables mode (which an unset mode is) is then waited on through iptables-save.
    pub fn mode(self, mode: &str) -> SideSetup {
        let s = if mode.is_empty() {
            self.without("--proxy-mode")
        } else {
            self.flag(&format!("--proxy-mode={mode}"))
        };
        let iptables = mode.is_empty() || mode == "iptables";
        if s.which == Impl::Upstream && iptables {
            s.rules(Rules::Iptables)
        } else {
            s
        }
    }

    /// A flag `--name=value` that replaces the default flag of its name, or is added.
    pub fn flag(mut self, flag: &str) -> SideSetup {
        if let Args::Defaults { set, unset } = &mut self.args {
            let name = flag.split_once('=').map_or(flag, |(n, _)| n);
            unset.retain(|u| u != name);
            set.retain(|f| f.split_once('=').map_or(f.as_str(), |(n, _)| n) != name);
            set.push(flag.to_string());
        } else {
            panic!("side {}: flag() on an exact command line", self.label);
        }
        self
    }

    /// Leaves the default flag `--name` out.
    pub fn without(mut self, name: &str) -> SideSetup {
        if let Args::Defaults { set, unset } = &mut self.args {
            set.retain(|f| f.split_once('=').map_or(f.as_str(), |(n, _)| n) != name);
            unset.push(name.to_string());
        } else {
            panic!("side {}: without() on an exact command line", self.label);
        }
        self
    }

    /// Exactly this command line (see [`Args::Exact`]).
    pub fn exact(mut self, argv: &[&str]) -> SideSetup {
        self.args = Args::Exact(argv.iter().map(|a| a.to_string()).collect());
        self
    }

    pub fn node(mut self, command: &[&str]) -> SideSetup {
        self.node_setup
            .push(command.iter().map(|a| a.to_string()).collect());
        self
    }

    pub fn file(mut self, name: &str, text: &str) -> SideSetup {
        self.files.push((name.to_string(), text.to_string()));
        self
    }

    pub fn rules(mut self, rules: Rules) -> SideSetup {
        self.rules = rules;
        self
    }
}

/// A ruleset line difference that is expected, with why.
pub struct KnownDiff {
    /// The scenario it applies to, or "*".
    pub scenario: &'static str,
    /// A substring of the differing line.
    pub line_contains: &'static str,
    pub why: &'static str,
}

pub struct Side {
    pub label: &'static str,
    pub which: Impl,
    pub rules: Rules,
    /// The proxy's arguments, as started.
    pub argv: Vec<String>,
    // Field order is drop order: the proxy first, then the relay, then the namespaces.
    pub proxy: Proc,
    /// None while a test keeps the apiserver out of this node's reach.
    relay: Option<Proc>,
    pub node: NodeNs,
    /// The tables as the last wait saw them, per family.
    pub tables: BTreeMap<&'static str, Option<Table>>,
    baseline: BTreeMap<&'static str, Option<Table>>,
}

/// One row of the report: what a source saw at a target on a side.
pub struct Row {
    pub scenario: String,
    /// Which call of [`Harness::probe`] in the run.
    pub step: usize,
    pub from: String,
    pub target: String,
    pub side: &'static str,
    pub summary: String,
}

pub struct Harness {
    // Drop order: sides (proxies, node relays, namespaces), host relay, apiserver, files.
    pub sides: Vec<Side>,
    host_relay: Proc,
    pub kube: Kube,
    api: Apiserver,
    dir: tempfile::TempDir,
    pub agent: PathBuf,
    barrier: u16,
    scenario: String,
    pub failures: Vec<String>,
    pub report: Vec<Row>,
    pub timings: Vec<(String, Duration)>,
    known: &'static [KnownDiff],
    probe_calls: usize,
    /// The host half of the relay, which every node's half connects to.
    socket: PathBuf,
    /// The kubeconfig the proxies get (the relay's end inside a node).
    kubeconfig: PathBuf,
    artefacts: PathBuf,
    /// Proxies started since the start-up (numbers their logs).
    restarts: usize,
    /// How long [`Harness::settle`] waits ([`SYNC_TIMEOUT`] unless a scenario says).
    pub sync_timeout: Duration,
}

impl Side {
    /// A command in the side's node namespace.
    pub fn node_run(&self, args: &[&str]) -> Result<String, String> {
        super::procs::ns_run(&self.node.node, args)
    }
}

impl Harness {
    /// Starts everything and waits until every side's proxy has synced once.
    pub fn start(specs: &[SideSpec], known: &'static [KnownDiff]) -> Harness {
        let setups: Vec<SideSetup> = specs.iter().map(|s| SideSetup::from(*s)).collect();
        Harness::start_with(&artefacts(), &setups, known)
    }

    /// [`start`](Self::start) with sides set up in full, leaving what a person needs to read a
    /// failure in `artefacts` (a directory of this run's own: it is emptied first).
    pub fn start_with(
        artefacts: &Path,
        setups: &[SideSetup],
        known: &'static [KnownDiff],
    ) -> Harness {
        node::clean_leftovers();
        let _ = std::fs::remove_dir_all(artefacts);
        std::fs::create_dir_all(artefacts).expect("artefacts dir");
        let t0 = Instant::now();
        let dir = tempfile::Builder::new()
            .prefix(&format!("{}.", node::prefix()))
            .tempdir()
            .expect("tempdir");
        let agent = super::repo_file("tests/kube_proxy/netagent.py");
        let api = Apiserver::start(&dir.path().join("kube"));
        let kube = Kube::connect(&api, NS);
        kube.ensure_namespace(BARRIER_NS);
        kube.create_node(NODE_NAME, &[node::NODE_IP, node::NODE_IP6]);
        let barrier = 1000;
        create_barrier(&kube.in_namespace(BARRIER_NS), barrier);
        let socket = dir.path().join("apiserver.sock");
        let host_relay = api::host_relay(&api, &socket, &dir.path().join("relay-host.log"));
        let kubeconfig = dir.path().join("node.kubeconfig");
        api.write_node_kubeconfig(&kubeconfig);
        let mut h = Harness {
            sides: Vec::new(),
            host_relay,
            kube,
            api,
            dir,
            agent,
            barrier,
            scenario: "start-up".into(),
            failures: Vec::new(),
            report: Vec::new(),
            timings: Vec::new(),
            known,
            probe_calls: 0,
            socket,
            kubeconfig,
            artefacts: artefacts.to_path_buf(),
            restarts: 0,
            sync_timeout: SYNC_TIMEOUT,
        };
        h.add_sides(setups);
        h.sides_ready();
        h.timings.push(("start-up".into(), t0.elapsed()));
        h
    }

    /// Stops every side and deletes its namespaces, then starts these sides (new nodes, new
    /// proxies) against the same apiserver, with the scenario namespace emptied first, and
    /// waits until each has synced once.
    pub fn restart_sides(&mut self, setups: &[SideSetup]) {
        let t0 = Instant::now();
        self.scenario = format!("start-up of {}", labels(setups));
        self.sides.clear();
        self.api().delete_all();
        self.add_sides(setups);
        self.sides_ready();
        self.timings.push((self.scenario.clone(), t0.elapsed()));
    }

    fn add_sides(&mut self, setups: &[SideSetup]) {
        let bin_dir = self.api.bin_dir();
        for setup in setups {
            assert!(
                !self.sides.iter().any(|s| s.label == setup.label),
                "two sides labelled {}",
                setup.label
            );
            let run_dir = self.dir.path();
            // Each side's files in a directory of its own: a proxy that watches its
            // configuration file (upstream exits when it changes) must not see another
            // side's copy written over it.
            let dir = &run_dir.join(setup.label);
            std::fs::create_dir_all(dir).expect("a side's directory");
            let node = NodeNs::create(setup.label, run_dir, &self.agent);
            for command in &setup.node_setup {
                let args: Vec<&str> = command.iter().map(String::as_str).collect();
                ns_must(&node.node, &args);
            }
            for (name, text) in &setup.files {
                let text = proxy::fill(text, &self.kubeconfig, dir);
                std::fs::write(dir.join(name), text).expect("write a side's file");
            }
            let relay = api::node_relay(
                &node.node,
                &self.socket,
                &run_dir.join(format!("relay-{}.log", setup.label)),
            );
            let argv = proxy::argv(&setup.args, &self.kubeconfig, dir);
            let proxy = proxy::start_argv(
                setup.which,
                &bin_dir,
                &node.node,
                &argv,
                &run_dir.join(format!("kube-proxy-{}.log", setup.label)),
            );
            self.sides.push(Side {
                label: setup.label,
                which: setup.which,
                rules: setup.rules,
                argv,
                proxy,
                relay: Some(relay),
                node,
                tables: BTreeMap::new(),
                baseline: BTreeMap::new(),
            });
        }
    }

    /// After new sides started: every one has synced once, and their start-up state is kept.
    fn sides_ready(&mut self) {
        self.wait_barrier().unwrap_or_else(|e| panic!("{e}"));
        self.wait_service_cidrs();
        self.settle_stale().unwrap_or_else(|e| panic!("{e}"));
        self.check_the_comparison_sees_a_difference();
        for s in &mut self.sides {
            s.baseline = s.tables.clone();
        }
    }

    /// The side labelled `label`.
    pub fn side(&self, label: &str) -> &Side {
        self.sides
            .iter()
            .find(|s| s.label == label)
            .unwrap_or_else(|| panic!("no side {label}"))
    }

    pub fn side_mut(&mut self, label: &str) -> &mut Side {
        self.sides
            .iter_mut()
            .find(|s| s.label == label)
            .unwrap_or_else(|| panic!("no side {label}"))
    }

    /// Where this run leaves what a person needs to read a failure.
    pub fn artefacts(&self) -> &Path {
        &self.artefacts
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Copies every process's log into [`artefacts`] (for a failed run: the run's directory
    /// goes with the harness).
    pub fn save_logs(&self) -> PathBuf {
        let to = self.artefacts.clone();
        if let Ok(entries) = std::fs::read_dir(self.dir()) {
            for e in entries.flatten() {
                if e.path().extension().is_some_and(|x| x == "log") {
                    let _ = std::fs::copy(e.path(), to.join(e.file_name()));
                }
            }
        }
        to
    }

    /// Ends a run: prints and writes `summary.txt` (the header, the probe table, the steps'
    /// timings), saves the logs of a failed run, keeps the run's directory under `KP_KEEP=1`,
    /// stops every process, then fails the test with every failure recorded.
    pub fn finish(mut self, header: &str, started: Instant) {
        let timings: Vec<String> = self
            .timings
            .iter()
            .map(|(n, d)| format!("  {n:<40} {:>6.2} s", d.as_secs_f64()))
            .collect();
        let summary = format!(
            "{header}\nprobes:\n{}\ntimings:\n{}\n  total {:.1} s\n",
            self.report_table(),
            timings.join("\n"),
            started.elapsed().as_secs_f64()
        );
        eprintln!("{summary}");
        let _ = std::fs::write(self.artefacts.join("summary.txt"), &summary);
        if !self.failures.is_empty() {
            eprintln!("logs and differing tables: {}", self.save_logs().display());
        }
        if std::env::var("KP_KEEP").is_ok_and(|v| v == "1") {
            eprintln!("KP_KEEP=1: kept {}", self.keep_dir().display());
        }
        let failures = std::mem::take(&mut self.failures);
        drop(self);
        assert!(
            failures.is_empty(),
            "{} failure(s):\n{}",
            failures.len(),
            failures.join("\n")
        );
    }

    /// Keeps the run's directory (logs, apiserver data) after the harness is dropped.
    pub fn keep_dir(&mut self) -> PathBuf {
        self.dir.disable_cleanup(true);
        self.dir.path().to_path_buf()
    }

    /// The kubeconfig the proxies use (the relay's end in their node).
    pub fn kubeconfig(&self) -> PathBuf {
        self.kubeconfig.clone()
    }

    /// The apiserver fixture (to stop and start the kube-apiserver).
    pub fn apiserver(&mut self) -> &mut Apiserver {
        &mut self.api
    }

    /// Index of the side labelled `label`.
    pub fn side_index(&self, label: &str) -> usize {
        self.sides
            .iter()
            .position(|s| s.label == label)
            .unwrap_or_else(|| panic!("no side {label}"))
    }

    /// Stops side `label` and deletes its node (for scenarios that need one side only).
    pub fn remove_side(&mut self, label: &str) {
        let i = self.side_index(label);
        drop(self.sides.remove(i));
    }

    /// Stops side `i`'s proxy (SIGKILL when `kill`, else SIGTERM) and starts its program
    /// again with `args` (see [`proxy::args`]) and `env`; returns the new log's path. Does not
    /// wait for it to sync.
    pub fn restart_proxy(
        &mut self,
        i: usize,
        kill: bool,
        args: &[String],
        env: &[(&str, &str)],
    ) -> PathBuf {
        self.stop_proxy(i, kill);
        self.start_proxy(i, args, env)
    }

    /// Stops side `i`'s proxy; the guard stays until [`Harness::start_proxy`] replaces it.
    pub fn stop_proxy(&mut self, i: usize, kill: bool) {
        let side = &mut self.sides[i];
        if kill {
            side.proxy.kill();
        } else {
            side.proxy.stop();
        }
    }

    /// Starts side `i`'s program with `args` and `env` (its previous proxy must be stopped).
    pub fn start_proxy(&mut self, i: usize, args: &[String], env: &[(&str, &str)]) -> PathBuf {
        self.restarts += 1;
        let side = &mut self.sides[i];
        assert!(
            side.proxy.exited().is_some(),
            "side {}: its proxy still runs",
            side.label
        );
        let log = self
            .dir
            .path()
            .join(format!("kube-proxy-{}-{}.log", side.label, self.restarts));
        side.proxy = proxy::start_with(
            side.which,
            &self.api.bin_dir(),
            &side.node.node,
            args,
            env,
            &log,
        );
        log
    }

    /// Stops the relay into side `i`'s node: its proxy can no longer reach the apiserver.
    pub fn stop_relay(&mut self, i: usize) {
        if let Some(mut r) = self.sides[i].relay.take() {
            r.stop();
        }
    }

    /// Starts the relay into side `i`'s node again.
    pub fn start_relay(&mut self, i: usize) {
        assert!(self.sides[i].relay.is_none(), "the relay runs");
        let socket = self.socket.clone();
        let log = self.dir.path().join(format!(
            "relay-{}-{}.log",
            self.sides[i].label, self.restarts
        ));
        self.sides[i].relay = Some(api::node_relay(&self.sides[i].node.node, &socket, &log));
    }

    /// The scenario namespace's client.
    pub fn api(&self) -> KubeNs<'_> {
        self.kube.in_namespace(NS)
    }

    /// Runs one scenario: empties the namespace (and waits until every proxy has dropped its
    /// rules), forgets tracked connections, then runs `f`. A panic in `f` is recorded as the
    /// scenario's failure and the next scenario still runs.
    pub fn scenario(&mut self, name: &str, f: impl FnOnce(&mut Harness)) {
        let t0 = Instant::now();
        self.scenario = name.to_string();
        let result = catch_unwind(AssertUnwindSafe(|| {
            if self.api().delete_all() {
                self.settle();
            }
            for s in &self.sides {
                s.node.flush_conntrack();
            }
            f(self);
        }));
        if let Err(panic) = result {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "non-string panic".into());
            self.fail(format!("panicked: {msg}"));
        }
        self.timings.push((name.to_string(), t0.elapsed()));
    }

    /// Records a failure of the current scenario.
    pub fn fail(&mut self, msg: String) {
        eprintln!("FAIL [{}] {msg}", self.scenario);
        self.failures.push(format!("[{}] {msg}", self.scenario));
    }

    // ------------------------------------------------------------------ waiting

    /// Waits until every proxy has handled every change made so far and has deleted the
    /// chains it flushed. Panics with the reason when it does not happen in time.
    pub fn settle(&mut self) {
        self.barrier += 1;
        move_barrier(&self.kube.in_namespace(BARRIER_NS), self.barrier);
        self.wait_barrier().unwrap_or_else(|e| panic!("{e}"));
        self.settle_stale().unwrap_or_else(|e| panic!("{e}"));
    }

    /// Upstream's first sync may go in before it has listed the ServiceCIDRs (ours waits
    /// for their first list), so its rule that drops traffic to unallocated ClusterIPs may come one
    /// sync later. The baseline is taken after every side has it, so that its late arrival
    /// does not show as a difference in the first scenario that compares with the baseline;
    /// a test that restarts a proxy waits for it too, so that the sync it adds does not land
    /// in the middle of what the test measures.
    pub fn wait_service_cidrs(&mut self) {
        const RULE: &str = "Drop traffic to unallocated ClusterIPs";
        for side in self.sides.iter().filter(|s| s.rules == Rules::Nftables) {
            procs::wait_until(
                &format!("side {}: the unallocated-ClusterIP rule", side.label),
                SYNC_TIMEOUT,
                Duration::from_millis(50),
                || {
                    FAMILIES
                        .iter()
                        .all(|fam| {
                            ruleset::dump(&side.node.node, fam)
                                .ok()
                                .flatten()
                                .is_some_and(|t| t.mentions(RULE))
                        })
                        .then_some(())
                },
            )
            .unwrap_or_else(|e| panic!("{e}; proxy log:\n{}", side.proxy.log_tail(30)));
        }
        // The tables the baseline is taken from include it.
        self.settle();
    }

    /// Upstream flushes a chain it no longer uses and deletes it in a later sync, at least a
    /// second after; a sync happens only when something changes. So while any side shows a
    /// flushed chain, move the barrier again (each move is one more sync). A program that
    /// never deletes them fails here, after a few rounds.
    fn settle_stale(&mut self) -> Result<(), String> {
        let start = Instant::now();
        let mut rounds = 0;
        loop {
            let stale: Vec<String> = self
                .sides
                .iter()
                .flat_map(|s| {
                    s.tables.values().flatten().flat_map(move |t| {
                        t.flushed_service_chains()
                            .into_iter()
                            .map(move |c| format!("{} {}: {c}", s.label, t.family))
                    })
                })
                .collect();
            if stale.is_empty() {
                return Ok(());
            }
            // At least 4 more syncs, and (for a proxy whose min sync period is under the
            // second a flushed chain waits) at least 10 s of them.
            if rounds >= 4 {
                if start.elapsed() > Duration::from_secs(10) {
                    return Err(format!(
                        "flushed per-Service chains still present after {rounds} more syncs in \
                         {:?}: {stale:?}",
                        start.elapsed()
                    ));
                }
                std::thread::sleep(Duration::from_millis(250));
            }
            self.barrier += 1;
            move_barrier(&self.kube.in_namespace(BARRIER_NS), self.barrier);
            self.wait_barrier()?;
            rounds += 1;
        }
    }

    /// Polls every side's tables until both families show the current barrier.
    fn wait_barrier(&mut self) -> Result<(), String> {
        let want = u64::from(self.barrier);
        let timeout = self.sync_timeout;
        let deadline = Instant::now() + timeout;
        for side in &mut self.sides {
            loop {
                if let Some(status) = side.proxy.exited() {
                    return Err(format!(
                        "side {}: {} exited ({status}):\n{}",
                        side.label,
                        side.proxy.name,
                        side.proxy.log_tail(30)
                    ));
                }
                let mut seen = Vec::new();
                let mut ok = true;
                if side.rules == Rules::Iptables {
                    let (shown, what) = iptables_barrier(&side.node.node, want)?;
                    ok &= shown;
                    seen.push(what);
                }
                for fam in FAMILIES {
                    let t = ruleset::dump(&side.node.node, fam)?;
                    let (vip, ep) = if fam == "ip" {
                        (BARRIER_V4, BARRIER_EP_V4)
                    } else {
                        (BARRIER_V6, BARRIER_EP_V6)
                    };
                    let (ports, dnat) = match &t {
                        Some(t) => (t.service_ports(vip, "tcp"), t.dnat_ports(ep)),
                        None => (vec![], vec![]),
                    };
                    side.tables.insert(fam, t);
                    if side.rules == Rules::Iptables {
                        continue;
                    }
                    ok &= ports == [want] && dnat == [want];
                    seen.push(format!(
                        "{fam}: service port {ports:?}, endpoint port {dnat:?}"
                    ));
                }
                if ok {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(format!(
                        "side {} ({}): the barrier's port {want} did not reach the rules within \
                         {timeout:?} (last seen {}); proxy log:\n{}",
                        side.label,
                        side.which.label(),
                        seen.join("; "),
                        side.proxy.log_tail(30)
                    ));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    /// [`settle`](Self::settle), then [`compare_rulesets`](Self::compare_rulesets): what a
    /// scenario calls after each change.
    pub fn synced(&mut self) {
        self.settle();
        self.compare_rulesets();
    }

    // ------------------------------------------------------------------ rulesets

    /// After [`settle`](Self::settle): the sides' tables must be equal, but for the known
    /// differences. Records a failure with the readable diff otherwise.
    pub fn compare_rulesets(&mut self) {
        if !self.first_two_have_tables() {
            return;
        }
        let mut problems = Vec::new();
        for fam in FAMILIES {
            let (a, b) = (&self.sides[0], &self.sides[1]);
            let lines = |s: &Side| -> Vec<String> {
                s.tables
                    .get(fam)
                    .cloned()
                    .flatten()
                    .map(|t| t.lines)
                    .unwrap_or_else(|| vec![format!("(no table {fam} kube-proxy)")])
            };
            let d = ruleset::diff(a.label, &lines(a), b.label, &lines(b));
            let unexplained: Vec<String> = d
                .into_iter()
                .filter(|l| {
                    !self.known.iter().any(|k| {
                        (k.scenario == "*" || k.scenario == self.scenario)
                            && l.contains(k.line_contains)
                    })
                })
                .collect();
            if !unexplained.is_empty() {
                let files = self.save_tables(fam);
                problems.push(format!(
                    "table {fam} kube-proxy differs ({} lines; full listings: {files}):\n  {}",
                    unexplained.len(),
                    unexplained.join("\n  ")
                ));
            }
        }
        for p in problems {
            self.fail(p);
        }
    }

    /// A comparison that cannot fail proves nothing: add an unused chain to the second side's
    /// table behind its proxy's back, require the diff to name it, and delete it again. This
    /// also proves that each side's listing comes from its own namespace. (Upstream only
    /// deletes chains whose names hold a `/`, so it leaves this one alone meanwhile.)
    fn check_the_comparison_sees_a_difference(&mut self) {
        if !self.first_two_have_tables() {
            return;
        }
        let (a, b) = (&self.sides[0], &self.sides[1]);
        let lines = |t: Option<Table>| t.map(|t| t.lines).unwrap_or_default();
        let a_lines = lines(a.tables.get("ip").cloned().flatten());
        let ns = b.node.node.clone();
        let chain = ["ip", "kube-proxy", "kpsbs-canary"];
        ns_must(&ns, &[&["nft", "add", "chain"][..], &chain].concat());
        let with = ruleset::dump(&ns, "ip");
        ns_must(&ns, &[&["nft", "delete", "chain"][..], &chain].concat());
        let with = lines(with.unwrap_or_else(|e| panic!("{e}")));
        let canary = format!("{} only: chain kpsbs-canary {{}}", b.label);
        let before = ruleset::diff(
            a.label,
            &a_lines,
            b.label,
            &lines(b.tables.get("ip").cloned().flatten()),
        );
        let after = ruleset::diff(a.label, &a_lines, b.label, &with);
        assert!(
            after.contains(&canary) && !before.contains(&canary),
            "the ruleset comparison did not see a chain added to side {}: {after:#?}",
            b.label
        );
    }

    /// Whether there are two sides to compare and both keep their rules in nftables tables.
    fn first_two_have_tables(&self) -> bool {
        self.sides.len() >= 2 && self.sides[..2].iter().all(|s| s.rules == Rules::Nftables)
    }

    /// Writes each side's text listing of `fam` for this scenario into [`artefacts`];
    /// returns the paths.
    fn save_tables(&self, fam: &str) -> String {
        let mut paths = Vec::new();
        for s in &self.sides {
            let p = self
                .artefacts
                .join(format!("{}-{}-{fam}.nft", self.scenario, s.label));
            let _ = std::fs::write(&p, ruleset::dump_text(&s.node.node, fam));
            paths.push(p.display().to_string());
        }
        paths.join(", ")
    }

    /// Every side's tables equal its start-up tables (the barrier aside): a scenario whose
    /// objects the proxies must ignore, or whose objects are gone.
    pub fn expect_baseline(&mut self) {
        let mut problems = Vec::new();
        for s in &self.sides {
            for fam in FAMILIES {
                let now = s.tables.get(fam).cloned().flatten();
                let base = s.baseline.get(fam).cloned().flatten();
                let (now, base) = match (now, base) {
                    (Some(n), Some(b)) => {
                        (n.without(&BARRIER_NEEDLES), b.without(&BARRIER_NEEDLES))
                    }
                    (n, b) => {
                        if n.is_some() != b.is_some() {
                            problems.push(format!(
                                "side {} {fam}: table present {} at start-up, {} now",
                                s.label,
                                b.is_some(),
                                n.is_some()
                            ));
                        }
                        continue;
                    }
                };
                let d = ruleset::diff("start-up", &base, "now", &now);
                if !d.is_empty() {
                    problems.push(format!(
                        "side {} table {fam} differs from its start-up state:\n  {}",
                        s.label,
                        d.join("\n  ")
                    ));
                }
            }
        }
        for p in problems {
            self.fail(p);
        }
    }

    /// Whether any side's table of `fam` mentions `needle` now.
    pub fn any_mentions(&self, fam: &str, needle: &str) -> bool {
        self.sides.iter().any(|s| {
            s.tables
                .get(fam)
                .and_then(|t| t.as_ref())
                .is_some_and(|t| t.mentions(needle))
        })
    }

    // ------------------------------------------------------------------ connections

    /// Runs every probe on every side at once, checks each against its expectation and the
    /// sides against each other, and adds the results to the report.
    pub fn probe(&mut self, probes: &[P]) {
        self.probe_on(&[], probes);
    }

    /// [`probe`](Self::probe) on the sides with these labels only (all of them for none); the
    /// answers of each are compared with the first one's.
    pub fn probe_on(&mut self, labels: &[&str], probes: &[P]) {
        self.probe_calls += 1;
        let first_alone = probes.iter().any(|p| !p.expect.sides_comparable());
        let chosen = |s: &Side| labels.is_empty() || labels.contains(&s.label);
        let mut running = Vec::new();
        for (si, s) in self.sides.iter().enumerate() {
            if !chosen(s) {
                continue;
            }
            let mut by_source: BTreeMap<&str, Vec<String>> = BTreeMap::new();
            for p in probes {
                by_source.entry(p.from).or_default().push(p.target.clone());
            }
            for (from, targets) in by_source {
                let r = probe::start(
                    s.label,
                    s.node.ns_of(from),
                    &self.agent,
                    first_alone,
                    &targets,
                );
                running.push((si, from, r));
            }
        }
        // side index -> (from, target) -> answers
        let mut results: Vec<BTreeMap<(String, String), Vec<String>>> =
            vec![BTreeMap::new(); self.sides.len()];
        for (si, from, r) in running {
            for (target, answers) in r.finish() {
                results[si].insert((from.to_string(), target), answers);
            }
        }
        for p in probes {
            let key = (p.from.to_string(), p.target.clone());
            let mut per_side = Vec::new();
            for (si, s) in self.sides.iter().enumerate() {
                if !chosen(s) {
                    continue;
                }
                let answers = results[si].get(&key).cloned().unwrap_or_default();
                self.report.push(Row {
                    scenario: self.scenario.clone(),
                    step: self.probe_calls,
                    from: p.from.to_string(),
                    target: p.target.clone(),
                    side: s.label,
                    summary: probe::summary(&answers),
                });
                per_side.push((s.label, answers));
            }
            for (label, answers) in &per_side {
                if let Err(e) = p.expect.check(answers) {
                    self.fail(format!("side {label}: {} -> {}: {e}", p.from, p.target));
                }
            }
            if p.expect.sides_comparable() {
                let Some(a) = per_side.first() else { continue };
                for b in &per_side[1..] {
                    if probe::distinct(&a.1) != probe::distinct(&b.1) {
                        self.fail(format!(
                            "{} -> {}: the sides differ: {} saw {}; {} saw {}",
                            p.from,
                            p.target,
                            a.0,
                            probe::summary(&a.1),
                            b.0,
                            probe::summary(&b.1)
                        ));
                    }
                }
            }
        }
    }

    /// The report as a table, one line per probe: the first side's answers, and the second
    /// side's when they differ in which answers appeared.
    pub fn report_table(&self) -> String {
        let mut out = String::new();
        let mut i = 0;
        while i < self.report.len() {
            let r = &self.report[i];
            let mut line = format!(
                "{:<28} {:<6} {:<26} {}: {}",
                r.scenario, r.from, r.target, r.side, r.summary
            );
            let mut j = i + 1;
            while j < self.report.len()
                && self.report[j].step == r.step
                && self.report[j].from == r.from
                && self.report[j].target == r.target
            {
                line.push_str(&format!(
                    " | {}: {}",
                    self.report[j].side, self.report[j].summary
                ));
                j += 1;
            }
            out.push_str(&line);
            out.push('\n');
            i = j;
        }
        out
    }
}

/// Where a run leaves what a person needs to read a failure (the cargo target's tmp dir, which
/// outlives the run's own directory): `kube-proxy-side-by-side/` for that test binary, one
/// directory per test binary (named after it) so that one binary's run does not empty
/// another's. Emptied when a run starts.
pub fn artefacts() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let stem = exe
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    // Cargo names a test binary `<target>-<hash>`.
    let target = stem.rsplit_once('-').map_or(stem.as_str(), |(t, _)| t);
    let name = if target.is_empty() {
        "kube-proxy-side-by-side".to_string()
    } else {
        target.replace('_', "-")
    };
    // Cargo sets CARGO_TARGET_TMPDIR for tests only; the benchmark tool, which builds this
    // harness into a program of its own, keeps its files in the system's temporary directory.
    option_env!("CARGO_TARGET_TMPDIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
        .join(name)
}

/// "a, b, c": the sides' labels.
fn labels(setups: &[SideSetup]) -> String {
    setups
        .iter()
        .map(|s| s.label)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether the node's iptables rules (`iptables-save -t nat`, both families) show the barrier
/// Service at port `want` and its endpoint at the same port, and only there; with what was
/// seen. (Upstream's iptables mode writes the Service's rule with `-d <ClusterIP>/32 ...
/// --dport <port>` and the endpoint's with `--to-destination <ip>:<port>`.)
fn iptables_barrier(ns: &str, want: u64) -> Result<(bool, String), String> {
    let mut ok = true;
    let mut seen = Vec::new();
    for (save, vip, ep) in [
        (
            "iptables-save",
            format!("-d {BARRIER_V4}/32 "),
            format!("--to-destination {BARRIER_EP_V4}:"),
        ),
        (
            "ip6tables-save",
            format!("-d {BARRIER_V6}/128 "),
            format!("--to-destination [{BARRIER_EP_V6}]:"),
        ),
    ] {
        let text = super::procs::ns_run(ns, &[save, "-t", "nat"])?;
        let mut ports: Vec<u64> = text
            .lines()
            .filter(|l| l.contains(&vip))
            .filter_map(|l| l.split(" --dport ").nth(1))
            .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
            .collect();
        let mut dnat: Vec<u64> = text
            .lines()
            .filter_map(|l| l.split(&ep).nth(1))
            .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
            .collect();
        for list in [&mut ports, &mut dnat] {
            list.sort_unstable();
            list.dedup();
        }
        ok &= ports == [want] && dnat == [want];
        seen.push(format!(
            "{save}: service port {ports:?}, endpoint port {dnat:?}"
        ));
    }
    Ok((ok, seen.join("; ")))
}

/// A probe: from a source namespace ("client", "node", "pod1", "pod2") to a target.
pub struct P {
    pub from: &'static str,
    pub target: String,
    pub expect: Expect,
}

/// `p("client", "tcp", "10.96.1.1", 80, all(&["pod1<-masq"]))`.
pub fn p(from: &'static str, proto: &str, addr: &str, port: u16, expect: Expect) -> P {
    P {
        from,
        target: probe::target(proto, addr, port),
        expect,
    }
}

pub fn all(tokens: &[&str]) -> Expect {
    Expect::All(tokens.iter().map(|s| s.to_string()).collect())
}

pub fn one_of(tokens: &[&str]) -> Expect {
    Expect::OneOf(tokens.iter().map(|s| s.to_string()).collect())
}

// ------------------------------------------------------------------ the barrier

fn create_barrier(k: &KubeNs<'_>, port: u16) {
    k.create_service(
        &Svc::cluster_ip("barrier", BARRIER_V4)
            .dual_stack(BARRIER_V6)
            .port("b", Proto::Tcp, port, port),
    );
    // On another node, so that it adds nothing node-local (no hairpin entry).
    for (fam, ep) in [("IPv4", BARRIER_EP_V4), ("IPv6", BARRIER_EP_V6)] {
        k.create_slice(
            &Slice::new(&format!("barrier-{}", fam.to_lowercase()), "barrier", fam)
                .port("b", Proto::Tcp, port)
                .ep(Ep::ready(ep).on("node-z")),
        );
    }
}

fn move_barrier(k: &KubeNs<'_>, port: u16) {
    k.patch_service(
        "barrier",
        json!({"spec": {"ports": [{"name": "b", "protocol": "TCP", "port": port, "targetPort": port}]}}),
    );
    for name in ["barrier-ipv4", "barrier-ipv6"] {
        k.patch_slice(
            name,
            json!({"ports": [{"name": "b", "protocol": "TCP", "port": port}]}),
        );
    }
}
