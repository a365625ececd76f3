//! The netlink applier against the real kernel and against nft: every packet-flow suite's
//! full sync is applied once with `nft -f` in one network namespace and once with our
//! netlink messages in another, and `nft -j list table` must read the same in both (only
//! the kernel's handles may differ); likewise partial syncs (a changed Service, a removed
//! one, the later deletion of its stale chains) and a refresh. A transaction the kernel
//! refuses must be reported with the operation it refused, and change nothing.
//!
//! Needs root, `ip` and `nft` (skipped otherwise, failing under CI=true). Every namespace is
//! this test's own and deleted when the test ends, failed or not; the netlink socket is
//! opened by a thread that entered the namespace, so nothing touches the machine's own.
//!
//! `scale_probe` (ignored) measures a large full sync through both paths: see its comment.

use std::collections::HashSet;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use kube_traffic::kube_proxy::model::{IpFamily, Protocol, ServiceName};
use kube_traffic::kube_proxy::nft::applied::Applied;
use kube_traffic::kube_proxy::nft::netlink::{Netlink, NetlinkError};
use kube_traffic::kube_proxy::nft::objects::{Object, Transaction};
use kube_traffic::kube_proxy::nft::rule::{Rule, Stmt};
use kube_traffic::kube_proxy::nft::stages::{stages, ANONYMOUS_SETS_PER_STAGE};
use kube_traffic::kube_proxy::ruleset::adopt::{adopt, Adoption};
use kube_traffic::kube_proxy::ruleset::sync::{KernelView, SyncKind};
use kube_traffic::kube_proxy::testing::flows::{suites, Suite};
use kube_traffic::kube_proxy::testing::scenario::{Net, Scenario, READY};
use nix::sched::{setns, CloneFlags};
use nix::sys::resource::{getrusage, UsageWho};
use serde_json::Value;

mod support {
    pub mod netns;
}
use support::netns::{can_run, Netns};

/// Opens a netlink applier inside `ns` (the socket stays in that namespace).
fn netlink_in(ns: &Netns) -> Netlink {
    let path = format!("/run/netns/{}", ns.name());
    std::thread::scope(|s| {
        s.spawn(|| {
            let file = File::open(&path).expect("the namespace's file");
            setns(file.as_raw_fd(), CloneFlags::CLONE_NEWNET).expect("setns");
            Netlink::open().expect("a netlink socket")
        })
        .join()
        .expect("the opening thread")
    })
}

/// Two namespaces: one written with nft, one with netlink.
struct Pair {
    text: Netns,
    binary: Netns,
    netlink: Netlink,
}

impl Pair {
    fn new(tag: &str) -> Pair {
        let text = Netns::new(&format!("{tag}-nft")).expect("a namespace");
        let binary = Netns::new(&format!("{tag}-nl")).expect("a namespace");
        let netlink = netlink_in(&binary);
        Pair {
            text,
            binary,
            netlink,
        }
    }

    fn reset(&self) {
        self.text.nft(&["flush", "ruleset"]).expect("flush");
        self.binary.nft(&["flush", "ruleset"]).expect("flush");
    }

    /// Applies `tx` both ways; both must take it.
    fn apply(&self, tx: &Transaction, what: &str) {
        self.text
            .nft_stdin(&tx.text())
            .unwrap_or_else(|e| panic!("{what}: nft refused: {e}"));
        self.netlink
            .apply_blocking(tx)
            .unwrap_or_else(|e| panic!("{what}: the kernel refused our batch: {e}"));
    }

    /// `nft -j list table` must read the same in both namespaces, and so must `nft list
    /// table` (nft 1.0.6's JSON leaves out table and chain comments; its text has them).
    fn assert_same(&self, family: IpFamily, what: &str) {
        let text = listing(&self.text, family);
        let binary = listing(&self.binary, family);
        if text != binary {
            let a = serde_json::to_string_pretty(&text).unwrap_or_default();
            let b = serde_json::to_string_pretty(&binary).unwrap_or_default();
            panic!("{what}: the tables differ\n{}", line_diff(&a, &b));
        }
        assert!(
            text.to_string().contains("\"rule\""),
            "{what}: a table with rules"
        );
        let args = ["list", "table", family.nft(), "kube-proxy"];
        let a = self.text.nft(&args).expect("lists");
        let b = self.binary.nft(&args).expect("lists");
        assert!(a == b, "{what}: the listings differ\n{}", line_diff(&a, &b));
    }
}

/// `nft -j list table` with the kernel's handles left out (they count every object the
/// namespace ever had).
fn listing(ns: &Netns, family: IpFamily) -> Value {
    let json = ns
        .nft(&["-j", "list", "table", family.nft(), "kube-proxy"])
        .expect("the table lists");
    let mut value: Value = serde_json::from_str(&json).expect("nft's JSON");
    strip_handles(&mut value);
    value
}

fn strip_handles(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.remove("handle");
            map.values_mut().for_each(strip_handles);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_handles),
        _ => {}
    }
}

fn line_diff(a: &str, b: &str) -> String {
    let mut out = String::new();
    for (i, (x, y)) in a.lines().zip(b.lines()).enumerate() {
        if x != y {
            out.push_str(&format!("line {i}:\n- nft:     {x}\n+ netlink: {y}\n"));
        }
    }
    if a.lines().count() != b.lines().count() {
        out.push_str("(and the listings have different lengths)\n");
    }
    out
}

fn full_sync(
    suite: &Suite,
) -> (
    KernelView,
    Transaction,
    kube_traffic::kube_proxy::ruleset::sync::Plan,
) {
    let view = KernelView::new();
    let plan = suite
        .scenario
        .plan(&view, &suite.settings, SyncKind::Full, &HashSet::new());
    let tx = plan.tx.clone();
    (view, tx, plan)
}

#[test]
fn every_flow_suite_lists_the_same_through_netlink_as_through_nft() {
    if !can_run("kube_proxy_netlink") {
        return;
    }
    let pair = Pair::new("suites");
    let mut count = 0;
    for family in [IpFamily::V4, IpFamily::V6] {
        for suite in suites(family) {
            pair.reset();
            let (_, tx, _) = full_sync(&suite);
            let what = format!("{} ({family})", suite.name);
            pair.apply(&tx, &what);
            pair.assert_same(family, &what);
            count += 1;
        }
    }
    assert!(count >= 20, "{count} suites");
}

/// A full sync written in stages (as on a node with no table) leaves the table one
/// transaction leaves: every suite, and 600 Services, cut at several sizes.
#[test]
fn a_full_sync_in_stages_lists_the_same_as_in_one_transaction() {
    if !can_run("kube_proxy_netlink") {
        return;
    }
    let pair = Pair::new("stages");
    let mut staged = 0;
    for family in [IpFamily::V4, IpFamily::V6] {
        let mut cases: Vec<(String, Transaction)> = suites(family)
            .iter()
            .map(|suite| (format!("{} ({family})", suite.name), full_sync(suite).1))
            .collect();
        if family == IpFamily::V4 {
            let settings = Net::of(family).settings();
            let plan = scale_scenario(600, 3).plan(
                &KernelView::new(),
                &settings,
                SyncKind::Full,
                &HashSet::new(),
            );
            cases.push(("600 Services (IPv4)".into(), plan.tx));
        }
        for (what, tx) in cases {
            for per_stage in [1, 7, ANONYMOUS_SETS_PER_STAGE] {
                pair.reset();
                pair.text
                    .nft_stdin(&tx.text())
                    .unwrap_or_else(|e| panic!("{what}: nft refused: {e}"));
                let parts: Vec<_> = stages(tx.clone(), per_stage).collect();
                staged += usize::from(parts.len() > 1);
                for (i, part) in parts.iter().enumerate() {
                    pair.netlink.apply_blocking(part).unwrap_or_else(|e| {
                        panic!("{what}: stage {i} of {} refused: {e}", parts.len())
                    });
                }
                pair.assert_same(family, &format!("{what}, stages of {per_stage}"));
            }
        }
    }
    assert!(
        staged >= 15,
        "{staged} cases written in more than one stage"
    );
}

/// A suite's Services changed: one gains an external IP and an endpoint, one is removed.
fn changed(suite: &Suite, family: IpFamily) -> (Scenario, HashSet<ServiceName>) {
    let net = Net::of(family);
    let mut scenario = Scenario {
        services: suite.scenario.services.clone(),
        endpoints: suite.scenario.endpoints.clone(),
    };
    let names: Vec<ServiceName> = scenario.services.keys().take(2).cloned().collect();
    if let Some(first) = names.first() {
        if let Some(ports) = scenario.services.get_mut(first) {
            for port in ports.iter_mut() {
                port.external_ips.push(net.ext(7));
            }
        }
    }
    if let Some(second) = names.get(1) {
        scenario.services.remove(second);
    }
    (scenario, names.into_iter().collect())
}

#[test]
fn partial_syncs_and_stale_chain_deletion_list_the_same() {
    if !can_run("kube_proxy_netlink") {
        return;
    }
    let pair = Pair::new("partial");
    for family in [IpFamily::V4, IpFamily::V6] {
        for suite in suites(family).into_iter().take(4) {
            let what = format!("{} ({family})", suite.name);
            pair.reset();
            let (mut view, tx, plan) = full_sync(&suite);
            pair.apply(&tx, &what);
            view.commit(plan, Instant::now());

            let (scenario, changed) = changed(&suite, family);
            let partial = scenario.plan(&view, &suite.settings, SyncKind::Partial, &changed);
            assert!(
                !partial.tx.is_empty(),
                "{what}: the partial sync does something"
            );
            pair.apply(&partial.tx, &format!("{what}, partial"));
            pair.assert_same(family, &format!("{what}, partial"));
            view.commit(partial, Instant::now());

            let later = Instant::now() + Duration::from_secs(5);
            if let Some((stale, names)) = view.stale_cleanup(&suite.settings, later) {
                pair.apply(&stale, &format!("{what}, stale chains"));
                pair.assert_same(family, &format!("{what}, stale chains"));
                view.stale_deleted(&names);
            }

            let refresh = scenario.plan(&view, &suite.settings, SyncKind::Refresh, &HashSet::new());
            pair.apply(&refresh.tx, &format!("{what}, refresh"));
            pair.assert_same(family, &format!("{what}, refresh"));
        }
    }
}

#[test]
fn a_refused_transaction_names_its_operation_and_changes_nothing() {
    if !can_run("kube_proxy_netlink") {
        return;
    }
    let family = IpFamily::V4;
    let pair = Pair::new("refused");
    let suite = suites(family).into_iter().next().expect("a suite");
    let (_, tx, _) = full_sync(&suite);
    pair.apply(&tx, "the full sync");
    let before = listing(&pair.binary, family);

    // Good operations, then a rule jumping to a chain that does not exist, then more.
    let mut bad = Transaction::new(family);
    bad.add(Object::chain("a-new-chain"));
    bad.add_rule("a-new-chain", Rule::new(vec![Stmt::Accept]));
    bad.add_rule(
        "a-new-chain",
        Rule::new(vec![
            Stmt::L4Proto(Protocol::Tcp),
            Stmt::Jump("no-such-chain".into()),
        ]),
    );
    bad.flush(Object::chain("services"));
    let error = pair
        .netlink
        .apply_blocking(&bad)
        .expect_err("the kernel refuses a jump to a missing chain");
    match &error {
        NetlinkError::Refused {
            index,
            total,
            operation,
            source,
            ..
        } => {
            assert_eq!(*index, 2, "{error}");
            assert_eq!(*total, 4);
            assert_eq!(
                operation,
                "add rule ip kube-proxy a-new-chain meta l4proto tcp jump no-such-chain"
            );
            assert_eq!(source.raw_os_error(), Some(libc::ENOENT), "{error}");
        }
        other => panic!("not a refusal of one operation: {other}"),
    }
    assert!(error.to_string().contains("operation 3 of 4"), "{error}");
    assert_eq!(listing(&pair.binary, family), before, "nothing was applied");
    // nft refuses the same text, and the two namespaces still read the same.
    assert!(pair.text.nft_stdin(&bad.text()).is_err());
    pair.assert_same(family, "after the refusal");

    // A statement that is never written is refused before anything is sent.
    let mut unwritable = Transaction::new(family);
    unwritable.flush(Object::chain("services"));
    unwritable.add_rule(
        "services",
        Rule::new(vec![Stmt::Other("{\"xt\":null}".into())]),
    );
    match pair.netlink.apply_blocking(&unwritable) {
        Err(NetlinkError::Encode { index: 1, .. }) => {}
        other => panic!("expected an encoding refusal of operation 2: {other:?}"),
    }
    assert_eq!(listing(&pair.binary, family), before, "nothing was applied");

    // And after a refusal the socket still works.
    let mut good = Transaction::new(family);
    good.flush(Object::chain("services"));
    pair.netlink
        .apply_blocking(&good)
        .expect("a good transaction");
    assert_ne!(listing(&pair.binary, family), before);
}

/// nft's and our time and memory for a full sync of N Services of E endpoints each
/// (N=10000 E=10 by default), each in a fresh namespace; and, for ours, what a restart on
/// that table costs instead: reading it back, comparing it with the full sync's, sending the
/// difference, against replacing the table with the full sync as a restart did before:
///
/// ```text
/// N=10000 E=10 cargo test --release --test kube_proxy_netlink scale_probe -- --ignored --nocapture
/// ```
///
/// nft's peak RSS is its process's (`ru_maxrss` of the child); ours is this process's peak
/// while applying, over what it held before (the planned transaction included).
#[test]
#[ignore]
fn scale_probe() {
    if !can_run("kube_proxy_netlink") {
        return;
    }
    let n: usize = env_number("N", 10_000);
    let e: usize = env_number("E", 10);
    let family = IpFamily::V4;
    let settings = Net::of(family).settings();
    let scenario = scale_scenario(n, e);
    let view = KernelView::new();
    let plan = scenario.plan(&view, &settings, SyncKind::Full, &HashSet::new());
    let text = plan.tx.text();
    if std::env::var_os("SHOW").is_some() {
        eprintln!("{text}");
    }
    eprintln!(
        "{n} Services x {e} endpoints: {} operations, {} bytes of text",
        plan.tx.len(),
        text.len()
    );

    // The same transaction in stages of at most so many anonymous sets (STAGES, a list),
    // each size in a fresh namespace: what a first sync on a node with no table sends.
    let sizes = std::env::var("STAGES").unwrap_or_else(|_| ANONYMOUS_SETS_PER_STAGE.to_string());
    for per_stage in sizes
        .split(',')
        .filter_map(|v| v.trim().parse::<usize>().ok())
    {
        let ns = Netns::new("scale-st").expect("a namespace");
        let netlink = netlink_in(&ns);
        let parts: Vec<_> = stages(plan.tx.clone(), per_stage).collect();
        let count = parts.len();
        let start = Instant::now();
        let cpu = cpu_times(UsageWho::RUSAGE_SELF);
        for part in &parts {
            netlink
                .apply_blocking(part)
                .expect("the kernel takes each stage");
        }
        let cpu_after = cpu_times(UsageWho::RUSAGE_SELF);
        eprintln!(
            "netlink in {count} stages of <= {per_stage} anonymous sets: {:.2} s (user {:.2} s, kernel {:.2} s)",
            start.elapsed().as_secs_f64(),
            cpu_after.0 - cpu.0,
            cpu_after.1 - cpu.1,
        );
        drop(netlink);
        drop(ns);
    }

    let ns = Netns::new("scale-nl").expect("a namespace");
    let netlink = netlink_in(&ns);
    let start = Instant::now();
    let batch = netlink.encode(&plan.tx).expect("encodes");
    eprintln!(
        "encoding alone: {:.3} s, {} messages",
        start.elapsed().as_secs_f64(),
        batch.messages()
    );
    drop(batch);
    let before = rss_kib("VmRSS");
    reset_peak();
    let cpu = cpu_times(UsageWho::RUSAGE_SELF);
    let applied: Applied = netlink
        .apply_blocking(&plan.tx)
        .expect("the kernel takes it");
    let cpu_after = cpu_times(UsageWho::RUSAGE_SELF);
    let peak = rss_kib("VmHWM");
    eprintln!(
        "netlink: {:.2} s (user {:.2} s, kernel {:.2} s), batch {} bytes, peak RSS {} MiB ({} MiB over the {} MiB before)",
        applied.elapsed.as_secs_f64(),
        cpu_after.0 - cpu.0,
        cpu_after.1 - cpu.1,
        applied.bytes,
        peak / 1024,
        peak.saturating_sub(before) / 1024,
        before / 1024
    );

    // What a restart on this table costs: reading it back, and comparing it with the full
    // sync's (the transaction, already planned, applied to an empty table in the model).
    reset_peak();
    let before = rss_kib("VmRSS");
    let start = Instant::now();
    let cpu = cpu_times(UsageWho::RUSAGE_SELF);
    let listing = netlink
        .read_table_blocking(family, Some(&plan.tx))
        .expect("the table reads back")
        .expect("a table");
    let read = start.elapsed();
    let cpu_after = cpu_times(UsageWho::RUSAGE_SELF);
    let stats = listing.stats;
    // Kept to time replacing the table, what a restart does without adoption.
    let full_tx = plan.tx.clone();
    let start = Instant::now();
    let (adopted, adoption) = adopt(plan, &listing.table, &listing.unsupported);
    let diff = start.elapsed();
    let peak = rss_kib("VmHWM");
    eprintln!(
        "read back: {:.2} s (user {:.2} s, kernel {:.2} s; {} requests, {} messages, {} MB; {} chains, {} rules, {} sets and {} anonymous ones ({} known by their digests), {} elements)",
        read.as_secs_f64(),
        cpu_after.0 - cpu.0,
        cpu_after.1 - cpu.1,
        stats.requests,
        stats.messages,
        stats.bytes / 1_000_000,
        stats.chains,
        stats.rules,
        stats.sets,
        stats.anonymous_sets,
        stats.known_maps,
        stats.elements,
    );
    eprintln!(
        "diff: {:.2} s, {adoption:?}, {} operations to send; peak RSS {} MiB ({} MiB over the {} MiB before)",
        diff.as_secs_f64(),
        adopted.tx.len(),
        peak / 1024,
        peak.saturating_sub(before) / 1024,
        before / 1024
    );
    assert!(matches!(adoption, Adoption::Adopted { .. }), "{adoption:?}");
    let start = Instant::now();
    netlink
        .apply_blocking(&adopted.tx)
        .expect("the kernel takes the adoption's transaction");
    let adopted_apply = start.elapsed();
    eprintln!(
        "first sync of a restart, adopting: {:.2} s (read {:.2} s + diff {:.2} s + sending {} operations {:.2} s)",
        (read + diff + adopted_apply).as_secs_f64(),
        read.as_secs_f64(),
        diff.as_secs_f64(),
        adopted.tx.len(),
        adopted_apply.as_secs_f64()
    );
    drop((listing, adopted));
    // Without adoption the first sync replaces the table the previous run left.
    let start = Instant::now();
    let replaced: Applied = netlink
        .apply_blocking(&full_tx)
        .expect("the kernel takes the full sync over the table");
    eprintln!(
        "first sync of a restart, replacing: {:.2} s ({} operations)",
        start
            .elapsed()
            .as_secs_f64()
            .max(replaced.elapsed.as_secs_f64()),
        full_tx.len()
    );
    drop(full_tx);
    drop(ns);

    let ns = Netns::new("scale-nft").expect("a namespace");
    let path = std::env::temp_dir().join(format!("kt-scale-{}.nft", std::process::id()));
    std::fs::write(&path, &text).expect("writes the text");
    let start = Instant::now();
    let status = std::process::Command::new("ip")
        .args(["netns", "exec", ns.name(), "nft", "-f"])
        .arg(&path)
        .status()
        .expect("nft runs");
    let elapsed = start.elapsed();
    let _ = std::fs::remove_file(&path);
    assert!(status.success());
    let (user, kernel) = cpu_times(UsageWho::RUSAGE_CHILDREN);
    eprintln!(
        "nft -f: {:.2} s (user {user:.2} s, kernel {kernel:.2} s), peak RSS {} MiB",
        elapsed.as_secs_f64(),
        children_peak_kib() / 1024
    );
    let listed = ns
        .nft(&["list", "table", "ip", "kube-proxy"])
        .expect("lists");
    assert!(listed.len() > text.len() / 4);
}

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn scale_scenario(n: usize, e: usize) -> Scenario {
    let mut s = Scenario::default();
    for i in 0..n {
        let ip = std::net::IpAddr::from([172, 30, (i / 250) as u8, (i % 250) as u8 + 1]);
        let mut svc = s
            .service("ns", &format!("svc{i}"), ip)
            .port("p80", Protocol::Tcp, 80, 0);
        for j in 0..e.min(70) {
            let ep =
                std::net::IpAddr::from([10, 180 + j as u8, (i / 250) as u8, (i % 250) as u8 + 1]);
            svc = svc.endpoint("p80", ep, 8080, READY);
        }
        svc.done();
    }
    s
}

fn rss_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// Makes VmHWM start again from the current RSS (`clear_refs` 5).
fn reset_peak() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn children_peak_kib() -> u64 {
    getrusage(UsageWho::RUSAGE_CHILDREN)
        .map(|u| u64::try_from(u.max_rss()).unwrap_or(0))
        .unwrap_or(0)
}

/// User and kernel CPU seconds (of this process, or of its finished children).
fn cpu_times(who: UsageWho) -> (f64, f64) {
    let seconds = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
    getrusage(who)
        .map(|u| (seconds(u.user_time()), seconds(u.system_time())))
        .unwrap_or((0.0, 0.0))
}
