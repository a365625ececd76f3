//! The proxy's rendered rulesets in a real kernel: every packet-flow suite is loaded with
//! `nft -f` into a network namespace of this test's own; what the kernel then lists must be
//! what the proxy meant (its JSON read back into the same model), and the tracer must send
//! every case's packet where the unit tests say, over the kernel's copy. That is what
//! `kube-proxy trace` does on a node; the last test runs the subcommand itself.
//!
//! Needs root, `ip` and `nft` (skipped otherwise, failing under CI=true).

use std::process::{Command, Stdio};

use kube_traffic::kube_proxy::model::IpFamily;
use kube_traffic::kube_proxy::nft::json::parse_table;
use kube_traffic::kube_proxy::nft::rule::{AddrValue, Stmt};
use kube_traffic::kube_proxy::nft::table::Table;
use kube_traffic::kube_proxy::ruleset::sync::{KernelView, SyncKind, Wanted};
use kube_traffic::kube_proxy::testing::flows::suites;
use kube_traffic::kube_proxy::trace::trace;

mod support {
    pub mod netns;
}
use support::netns::{can_run, Netns};

/// Loads `suite`'s full sync into `ns` and reads the kernel's table back.
fn load(
    ns: &Netns,
    suite: &kube_traffic::kube_proxy::testing::flows::Suite,
    family: IpFamily,
) -> Table {
    let view = KernelView::new();
    let plan = view.plan(
        &suite.settings,
        SyncKind::Full,
        &Wanted {
            services: &suite.scenario.services,
            endpoints: &suite.scenario.endpoints,
            zone: None,
        },
        &Default::default(),
    );
    ns.nft_stdin(&plan.tx.text())
        .unwrap_or_else(|e| panic!("{}: the kernel refused: {e}", suite.name));
    let json = ns
        .nft(&["-j", "list", "table", family.nft(), "kube-proxy"])
        .expect("listing");
    parse_table(&json, family).expect("the listing parses")
}

/// A table normalised to compare the kernel's listing with ours: nft 1.0.6's JSON has no
/// table or chain comments and no `dynamic` set flag; the kernel orders an anonymous set's
/// elements its own way, merges neighbours into ranges, and keeps a set of one prefix as
/// that prefix.
fn normalise(mut table: Table) -> Table {
    table.comment = None;
    for chain in table.chains.values_mut() {
        chain.comment = None;
        for rule in &mut chain.rules {
            for stmt in &mut rule.stmts {
                if let Stmt::Addr { value, .. } = stmt {
                    if let AddrValue::Anonymous(nets) = value {
                        nets.sort();
                        if let [one] = nets.as_slice() {
                            *value = AddrValue::Net(*one);
                        }
                    }
                }
            }
        }
    }
    for set in table.sets.values_mut() {
        set.spec.flags.retain(|f| f != "dynamic");
    }
    table
}

#[test]
fn the_kernel_holds_what_the_proxy_rendered_and_packets_go_where_the_tests_say() {
    if !can_run("kube_proxy_kernel") {
        return;
    }
    let ns = Netns::new("trace").expect("a network namespace");
    let mut cases = 0;
    let mut failures = Vec::new();
    for family in [IpFamily::V4, IpFamily::V6] {
        for suite in suites(family) {
            ns.nft(&["flush", "ruleset"]).expect("flush");
            let kernel = load(&ns, &suite, family);
            let ours = normalise(suite.scenario.table(&suite.settings));
            let theirs = normalise(kernel.clone());
            assert_eq!(
                theirs.dump(),
                ours.dump(),
                "{}: the kernel lists another table than the one rendered",
                suite.name
            );
            for case in &suite.cases {
                cases += 1;
                let outcome = trace(&kernel, &suite.node, &case.packet);
                if outcome.summary() != case.expect
                    || outcome.masquerade() != case.masquerade
                    || !outcome.unknown.is_empty()
                {
                    failures.push(format!(
                        "{} / {}: expected {}, got {}\n{outcome}",
                        suite.name,
                        case.name,
                        case.expect,
                        outcome.summary()
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(cases >= 150, "{cases} cases");
}

#[test]
fn kube_proxy_trace_reads_the_kernel_of_its_namespace() {
    if !can_run("kube_proxy_kernel") {
        return;
    }
    let ns = Netns::new("tracecli").expect("a network namespace");
    let family = IpFamily::V4;
    let suite = suites(family).into_iter().next().expect("a suite");
    load(&ns, &suite, family);
    let case = &suite.cases[0];
    let node_ips: Vec<String> = suite.node.local.iter().map(|ip| ip.to_string()).collect();
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            ns.name(),
            env!("CARGO_BIN_EXE_kube-proxy"),
            "trace",
        ])
        .arg(format!("--from={}", case.packet.src))
        .arg(format!("--to={}:{}", case.packet.dst, case.packet.port))
        .arg(format!("--protocol={}", case.packet.protocol.nft()))
        .arg(format!("--node-ip={}", node_ips.join(",")))
        .arg("--json")
        .stdin(Stdio::null())
        .output()
        .expect("kube-proxy trace runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(json["summary"], case.expect.as_str(), "{json}");
    assert_eq!(json["masquerade"], case.masquerade, "{json}");
    // The human form names the chain path and the endpoints.
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            ns.name(),
            env!("CARGO_BIN_EXE_kube-proxy"),
            "trace",
        ])
        .arg(format!("--from={}", case.packet.src))
        .arg(format!("--to={}:{}", case.packet.dst, case.packet.port))
        .arg(format!("--node-ip={}", node_ips.join(",")))
        .output()
        .expect("kube-proxy trace runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("services: ip daddr . meta l4proto . th dport vmap @service-ips"),
        "{text}"
    );
    assert!(text.contains("-> "), "{text}");
}
