//! Reading the table back from a real kernel, and adopting it: every packet-flow suite's full
//! sync is applied over netlink in a network namespace of this test's own and read back with
//! the netlink reader; the table read must be the model's (in the form the kernel keeps it),
//! and adopting it must send nothing. A changed scenario, and tables changed by hand, must be
//! repaired by a transaction the kernel takes, after which `nft -j list table` reads as after
//! a full sync of the scenario; a set declared differently must make the proxy replace the
//! table.
//!
//! Needs root, `ip` and `nft` (skipped otherwise, failing under CI=true). Every namespace is
//! this test's own and deleted when the test ends, failed or not; the netlink socket is opened
//! by a thread that entered the namespace, so nothing touches the machine's own.

use std::collections::HashSet;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use kube_traffic::kube_proxy::model::{IpFamily, Protocol, ServiceName, ServicePortName};
use kube_traffic::kube_proxy::nft::json::parse_table;
use kube_traffic::kube_proxy::nft::netlink::canon;
use kube_traffic::kube_proxy::nft::netlink::read::Listing;
use kube_traffic::kube_proxy::nft::netlink::Netlink;
use kube_traffic::kube_proxy::nft::objects::Transaction;
use kube_traffic::kube_proxy::nft::rule::{AddrValue, Stmt};
use kube_traffic::kube_proxy::nft::table::Table;
use kube_traffic::kube_proxy::ruleset::adopt::{adopt, Adoption};
use kube_traffic::kube_proxy::ruleset::settings::Settings;
use kube_traffic::kube_proxy::ruleset::sync::{KernelView, SyncKind};
use kube_traffic::kube_proxy::testing::flows::{suites, Suite};
use kube_traffic::kube_proxy::testing::scenario::{dump_diff, Net, Scenario, READY};
use nix::sched::{setns, CloneFlags};

mod support {
    pub mod netns;
}
use support::netns::{can_run, Netns};

/// A namespace of this test's own, and a netlink socket in it.
struct Node {
    ns: Netns,
    netlink: Netlink,
}

impl Node {
    fn new(tag: &str) -> Node {
        let ns = Netns::new(tag).expect("a namespace");
        let path = format!("/run/netns/{}", ns.name());
        let netlink = std::thread::scope(|s| {
            s.spawn(|| {
                let file = File::open(&path).expect("the namespace's file");
                setns(file.as_raw_fd(), CloneFlags::CLONE_NEWNET).expect("setns");
                Netlink::open().expect("a netlink socket")
            })
            .join()
            .expect("the opening thread")
        });
        Node { ns, netlink }
    }

    fn reset(&self) {
        self.ns.nft(&["flush", "ruleset"]).expect("flush");
    }

    fn apply(&self, tx: &Transaction, what: &str) {
        self.netlink
            .apply_blocking(tx)
            .unwrap_or_else(|e| panic!("{what}: the kernel refused: {e}"));
    }

    /// The table read back; `wanted`'s maps need not be asked for (when their digests match).
    fn read(&self, family: IpFamily, wanted: Option<&Transaction>, what: &str) -> Listing {
        self.netlink
            .read_table_blocking(family, wanted)
            .unwrap_or_else(|e| panic!("{what}: reading back: {e}"))
            .unwrap_or_else(|| panic!("{what}: no table"))
    }

    /// `nft -j list table`, in the model, normalised as `tests/kube_proxy_kernel.rs` does.
    fn listed(&self, family: IpFamily) -> String {
        let json = self
            .ns
            .nft(&["-j", "list", "table", family.nft(), "kube-proxy"])
            .expect("the table lists");
        normalise(parse_table(&json, family).expect("the listing parses")).dump()
    }
}

/// nft 1.0.6's JSON has no table or chain comments and no `dynamic` flag; an anonymous set's
/// order is the kernel's.
fn normalise(mut table: Table) -> Table {
    table.comment = None;
    for chain in table.chains.values_mut() {
        chain.comment = None;
        for rule in &mut chain.rules {
            for stmt in &mut rule.stmts {
                if let Stmt::Addr {
                    value: AddrValue::Anonymous(nets),
                    ..
                } = stmt
                {
                    nets.sort();
                }
            }
        }
    }
    for set in table.sets.values_mut() {
        set.spec.flags.retain(|f| f != "dynamic");
    }
    table
}

fn full(scenario: &Scenario, settings: &Settings) -> kube_traffic::kube_proxy::ruleset::sync::Plan {
    scenario.plan(
        &KernelView::new(),
        settings,
        SyncKind::Full,
        &HashSet::new(),
    )
}

fn scenario_of(suite: &Suite) -> Scenario {
    Scenario {
        services: suite.scenario.services.clone(),
        endpoints: suite.scenario.endpoints.clone(),
    }
}

#[test]
fn every_flow_suite_reads_back_as_the_model_and_is_adopted_as_it_is() {
    if !can_run("kube_proxy_adopt") {
        return;
    }
    let node = Node::new("adopt-read");
    let mut count = 0;
    let mut known = 0;
    for family in [IpFamily::V4, IpFamily::V6] {
        for suite in suites(family) {
            let what = format!("{} ({family})", suite.name);
            node.reset();
            let plan = full(&suite.scenario, &suite.settings);
            node.apply(&plan.tx, &what);
            // Every map's elements asked for, and those of the maps the plan writes known by
            // their digests: the same table, in fewer requests.
            let asked = node.read(family, None, &what);
            let listing = node.read(family, Some(&plan.tx), &what);
            assert_eq!(asked.table, listing.table, "{what}");
            assert_eq!(asked.stats.known_maps, 0, "{what}");
            assert_eq!(asked.stats.digests, listing.stats.digests, "{what}");
            assert_eq!(listing.stats.known_maps, listing.stats.digests, "{what}");
            assert_eq!(
                listing.stats.requests + listing.stats.known_maps,
                asked.stats.requests,
                "{what}"
            );
            known += listing.stats.known_maps;
            assert!(
                listing.unsupported.is_empty(),
                "{what}: {:?}",
                listing.unsupported
            );
            let mut model = suite.scenario.table(&suite.settings);
            canon::table(&mut model);
            let (read, want) = (listing.table.dump(), model.dump());
            assert!(read == want, "{what}:\n{}", dump_diff(&read, &want));
            assert_eq!(listing.table, model, "{what}");
            // No statement was left unread.
            let other = listing
                .table
                .chains
                .values()
                .flat_map(|c| &c.rules)
                .flat_map(|r| &r.stmts)
                .find(|s| matches!(s, Stmt::Other(_)));
            assert_eq!(other, None, "{what}");

            let (plan, adoption) = adopt(plan, &listing.table, &listing.unsupported);
            assert_eq!(
                adoption,
                Adoption::Adopted {
                    chains: model.chains.len()
                },
                "{what}"
            );
            assert!(plan.tx.is_empty(), "{what}: {}", plan.tx.text());
            count += 1;
        }
    }
    assert!(count >= 20, "{count} suites");
    assert!(known >= 20, "{known} maps known by their digests");
}

/// The suite's Services changed: an endpoint goes, a Service goes, a Service comes.
fn changed(suite: &Suite, family: IpFamily) -> Scenario {
    let net = Net::of(family);
    let mut scenario = scenario_of(suite);
    let names: Vec<ServiceName> = scenario.services.keys().take(2).cloned().collect();
    if let Some(first) = names.first() {
        let port: Option<ServicePortName> = scenario
            .endpoints
            .keys()
            .find(|p| &p.service == first)
            .cloned();
        if let Some(eps) = port.and_then(|p| scenario.endpoints.get_mut(&p)) {
            eps.pop();
        }
    }
    if let Some(second) = names.get(1) {
        scenario.services.remove(second);
        scenario.endpoints.retain(|k, _| &k.service != second);
    }
    scenario
        .service("adopt", "added", net.svc(231))
        .port("p", Protocol::Tcp, 8443, 0)
        .endpoint("p", net.pod(1, 231), 443, READY)
        .done();
    scenario
}

/// Adopts the table in `node` for `scenario`: the repair must be taken, the stale chains
/// deleted later, and the table must then list as `reference` lists after a full sync.
fn repair_and_compare(
    node: &Node,
    reference: &Node,
    scenario: &Scenario,
    settings: &Settings,
    what: &str,
) -> usize {
    let family = settings.family;
    // What the kernel holds is not what the plan writes: the maps whose digests differ are
    // read from the kernel.
    let wanted = full(scenario, settings);
    let listing = node.read(family, Some(&wanted.tx), what);
    let (plan, adoption) = adopt(wanted, &listing.table, &listing.unsupported);
    let Adoption::Repaired { operations } = adoption else {
        panic!("{what}: not repaired: {adoption:?}");
    };
    assert!(
        !plan.tx.text().contains("delete table"),
        "{what}: {}",
        plan.tx.text()
    );
    node.apply(&plan.tx, &format!("{what}, the repair"));
    let mut view = KernelView::new();
    view.commit(plan, Instant::now());
    if let Some((stale, names)) =
        view.stale_cleanup(settings, Instant::now() + Duration::from_secs(2))
    {
        node.apply(&stale, &format!("{what}, the stale chains"));
        view.stale_deleted(&names);
    }
    reference.reset();
    reference.apply(
        &full(scenario, settings).tx,
        &format!("{what}, the reference"),
    );
    let (got, want) = (node.listed(family), reference.listed(family));
    assert!(got == want, "{what}:\n{}", dump_diff(&got, &want));
    // And now nothing is left to repair.
    let listing = node.read(family, Some(&full(scenario, settings).tx), what);
    let (_, again) = adopt(
        full(scenario, settings),
        &listing.table,
        &listing.unsupported,
    );
    assert!(
        matches!(again, Adoption::Adopted { .. }),
        "{what}: {again:?}"
    );
    operations
}

#[test]
fn a_changed_scenario_is_repaired_by_a_transaction_the_kernel_takes() {
    if !can_run("kube_proxy_adopt") {
        return;
    }
    let node = Node::new("adopt-chg");
    let reference = Node::new("adopt-ref");
    for family in [IpFamily::V4, IpFamily::V6] {
        for suite in suites(family) {
            let what = format!("{} ({family}), changed", suite.name);
            node.reset();
            node.apply(&full(&suite.scenario, &suite.settings).tx, &what);
            let new = changed(&suite, family);
            let operations = repair_and_compare(&node, &reference, &new, &suite.settings, &what);
            let whole = full(&new, &suite.settings).tx.len();
            assert!(
                operations < whole,
                "{what}: {operations} operations, a full sync has {whole}"
            );
        }
    }
}

/// The first chain of `table` whose name starts with `prefix`.
fn chain_named(table: &Table, prefix: &str) -> String {
    table
        .chains
        .keys()
        .find(|c| c.starts_with(prefix))
        .cloned()
        .unwrap_or_else(|| panic!("a chain {prefix}..."))
}

#[test]
fn tables_changed_by_hand_are_repaired_and_a_changed_declaration_is_replaced() {
    if !can_run("kube_proxy_adopt") {
        return;
    }
    let node = Node::new("adopt-hand");
    let reference = Node::new("adopt-href");
    for family in [IpFamily::V4, IpFamily::V6] {
        let suite = suites(family)
            .into_iter()
            .find(|s| {
                let t = s.scenario.table(&s.settings);
                t.chains.keys().any(|c| c.starts_with("endpoint-"))
                    && t.chains.keys().any(|c| c.starts_with("service-"))
            })
            .expect("a suite with Service and endpoint chains");
        let scenario = scenario_of(&suite);
        let settings = &suite.settings;
        let fam = family.nft();
        let model = suite.scenario.table(settings);
        let service = chain_named(&model, "service-");
        let endpoint = chain_named(&model, "endpoint-");
        let unused = match family {
            IpFamily::V4 => "172.30.250.250",
            IpFamily::V6 => "fd00:10:96::fafa",
        };
        let cases: Vec<(&str, Vec<String>)> = vec![
            (
                "an extra rule in a Service chain",
                vec![format!("insert rule {fam} kube-proxy {service} accept")],
            ),
            (
                // nft writes no digest: the map is read from the kernel.
                "a Service's map written by hand",
                vec![
                    format!("flush chain {fam} kube-proxy {service}"),
                    format!(
                        "add rule {fam} kube-proxy {service} numgen random mod 1 vmap {{ 0 : goto {endpoint} }}"
                    ),
                ],
            ),
            (
                "an extra element",
                vec![format!(
                    "add element {fam} kube-proxy service-ips {{ {unused} . tcp . 1 : drop }}"
                )],
            ),
            (
                "a deleted endpoint chain",
                // The chains that jump to it are emptied first, as the kernel requires.
                model
                    .chains
                    .iter()
                    .filter(|(_, c)| {
                        c.rules.iter().any(|r| {
                            r.stmts.iter().any(|s| match s {
                                Stmt::Goto(t) | Stmt::Jump(t) => *t == endpoint,
                                Stmt::PickVmap { chains, .. } => chains.contains(&endpoint),
                                _ => false,
                            })
                        })
                    })
                    .map(|(n, _)| format!("flush chain {fam} kube-proxy {n}"))
                    .chain([format!("delete chain {fam} kube-proxy {endpoint}")])
                    .collect(),
            ),
        ];
        for (case, commands) in cases {
            let what = format!("{} ({family}), {case}", suite.name);
            node.reset();
            node.apply(&full(&scenario, settings).tx, &what);
            node.ns
                .nft_stdin(&commands.join("\n"))
                .unwrap_or_else(|e| panic!("{what}: nft -f: {e}\n{}", commands.join("\n")));
            repair_and_compare(&node, &reference, &scenario, settings, &what);
        }

        // A map declared with another comment: only a new table can change that.
        let what = format!("{} ({family}), a changed declaration", suite.name);
        node.reset();
        node.apply(&full(&scenario, settings).tx, &what);
        let key = match family {
            IpFamily::V4 => "ipv4_addr",
            IpFamily::V6 => "ipv6_addr",
        };
        let commands = format!(
            "flush chain {fam} kube-proxy firewall-check\n\
             delete map {fam} kube-proxy firewall-ips\n\
             add map {fam} kube-proxy firewall-ips {{ type {key} . inet_proto . inet_service : verdict ; comment \"another\" ; }}\n"
        );
        node.ns
            .nft_stdin(&commands)
            .unwrap_or_else(|e| panic!("{what}: {e}\n{commands}"));
        let listing = node.read(family, None, &what);
        let (plan, adoption) = adopt(
            full(&scenario, settings),
            &listing.table,
            &listing.unsupported,
        );
        match &adoption {
            Adoption::Replaced { reason } => {
                assert!(reason.contains("firewall-ips"), "{what}: {reason}")
            }
            other => panic!("{what}: not replaced: {other:?}"),
        }
        node.apply(&plan.tx, &format!("{what}, the full sync"));
        reference.reset();
        reference.apply(&full(&scenario, settings).tx, &what);
        let (got, want) = (node.listed(family), reference.listed(family));
        assert!(got == want, "{what}:\n{}", dump_diff(&got, &want));
    }
}
