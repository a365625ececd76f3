use std::collections::HashSet;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use super::*;
use crate::kube_proxy::model::{IpFamily, Protocol, ServiceName, ServicePortName};
use crate::kube_proxy::nft::objects::{Key, Verdict};
use crate::kube_proxy::ruleset::settings::Settings;
use crate::kube_proxy::ruleset::sync::{KernelView, SyncKind};
use crate::kube_proxy::testing::scenario::{dump_diff, Net, Scenario, READY, READY_LOCAL};

fn scenario(net: &Net, n: usize) -> Scenario {
    let mut s = Scenario::default();
    for i in 0..n {
        s.service("ns", &format!("svc{i}"), net.svc(i as u8 + 1))
            .port("p80", Protocol::Tcp, 80, 30000 + i as u16)
            .external_ip(net.ext(i as u8 + 1))
            .endpoint("p80", net.pod(1, i as u8 + 1), 8080, READY)
            .endpoint("p80", net.pod(0, i as u8 + 1), 8080, READY_LOCAL)
            .done();
    }
    s.service("ns", "sticky", net.svc(200))
        .port("p", Protocol::Udp, 53, 0)
        .affinity(300)
        .lb(net.ext(100))
        .source_range(net.source_range)
        .endpoint("p", net.pod(1, 99), 53, READY)
        .done();
    s
}

/// What the kernel lists after `s`'s full sync: the model's table in the kernel's form.
fn kernel_table(s: &Scenario, settings: &Settings) -> Table {
    let mut table = s.table(settings);
    canon::table(&mut table);
    table
}

fn full(s: &Scenario, settings: &Settings) -> Plan {
    s.plan(
        &KernelView::new(),
        settings,
        SyncKind::Full,
        &HashSet::new(),
    )
}

/// Adopts `actual` for `s`; applies what is sent to `actual` in the model; returns the
/// outcome, the view committed, and the table then.
fn run(
    s: &Scenario,
    settings: &Settings,
    actual: &Table,
    unsupported: &[String],
) -> (Adoption, KernelView, Table, Transaction) {
    let (plan, adoption) = adopt(full(s, settings), actual, unsupported);
    let tx = plan.tx.clone();
    let mut state = Some(actual.clone());
    apply(&mut state, &tx).unwrap_or_else(|e| panic!("refused: {e}\n{}", tx.text()));
    let mut view = KernelView::new();
    view.commit(plan, Instant::now());
    (adoption, view, state.expect("a table"), tx)
}

fn ip(text: &str) -> IpAddr {
    text.parse().expect("an address")
}

#[test]
fn the_table_a_full_sync_left_is_adopted_as_it_is() {
    for family in [IpFamily::V4, IpFamily::V6] {
        let net = Net::of(family);
        let settings = net.settings();
        let s = scenario(&net, 5);
        let actual = kernel_table(&s, &settings);
        let (adoption, view, _, tx) = run(&s, &settings, &actual, &[]);
        assert_eq!(
            adoption,
            Adoption::Adopted {
                chains: actual.chains.len()
            }
        );
        assert!(tx.is_empty());
        // The view is a full sync's: the next sync is partial and sends nothing.
        assert!(!view.needs_full());
        let next = s.plan(&view, &settings, SyncKind::Partial, &HashSet::new());
        assert_eq!(next.kind, SyncKind::Partial);
        assert!(next.tx.is_empty(), "{}", next.tx.text());
    }
}

#[test]
fn affinity_entries_are_neither_compared_nor_touched() {
    let net = Net::of(IpFamily::V4);
    let settings = net.settings();
    let s = scenario(&net, 2);
    let mut actual = kernel_table(&s, &settings);
    let affinity = actual
        .sets
        .iter_mut()
        .find(|(name, _)| name.starts_with("affinity-"))
        .map(|(_, set)| set)
        .expect("an affinity set");
    let client = Key::Addr(ip("203.0.113.7"));
    affinity.elements.insert(
        client.clone(),
        crate::kube_proxy::nft::table::Element {
            value: None,
            comment: None,
        },
    );
    let (adoption, _, after, _) = run(&s, &settings, &actual, &[]);
    assert!(matches!(adoption, Adoption::Adopted { .. }), "{adoption:?}");
    let kept = after
        .sets
        .values()
        .any(|set| set.elements.contains_key(&client));
    assert!(kept, "the client's affinity survives");
}

#[test]
fn a_changed_scenario_is_repaired_to_what_a_full_sync_leaves() {
    for family in [IpFamily::V4, IpFamily::V6] {
        let net = Net::of(family);
        let settings = net.settings();
        let old = scenario(&net, 6);
        let mut new = scenario(&net, 6);
        // An endpoint changes, a Service goes, another comes.
        let svc1 = ServicePortName::new(ServiceName::new("ns", "svc1"), "p80", Protocol::Tcp);
        new.endpoints.get_mut(&svc1).expect("endpoints").pop();
        new.services.remove(&ServiceName::new("ns", "svc2"));
        new.endpoints.retain(|k, _| k.service.name() != "svc2");
        new.service("ns", "added", net.svc(77))
            .port("p", Protocol::Sctp, 9, 0)
            .endpoint("p", net.pod(1, 77), 9, READY)
            .done();
        let actual = kernel_table(&old, &settings);
        let (adoption, mut view, after, tx) = run(&new, &settings, &actual, &[]);
        let Adoption::Repaired { operations } = adoption else {
            panic!("{adoption:?}");
        };
        assert_eq!(operations, tx.len());
        let text = tx.text();
        assert!(!text.contains("delete table"), "{text}");
        assert!(
            !text.contains("ns/svc0/"),
            "an unchanged Service is left alone: {text}"
        );
        assert!(
            operations < full(&new, &settings).tx.len() / 3,
            "{operations} operations:\n{text}"
        );
        // svc2's chains are flushed now and deleted a second later.
        let mut after = Some(after);
        let later = Instant::now() + Duration::from_secs(2);
        let (stale, names) = view
            .stale_cleanup(&settings, later)
            .expect("stale chains to delete");
        assert!(names.iter().all(|n| n.contains("ns/svc2/")), "{names:?}");
        apply(&mut after, &stale).expect("the stale chains go");
        view.stale_deleted(&names);
        let mut want = new.table(&settings);
        canon::table(&mut want);
        let mut got = after.expect("a table");
        canon::table(&mut got);
        assert!(
            got.dump() == want.dump(),
            "{}",
            dump_diff(&got.dump(), &want.dump())
        );
        // And the view goes on from there.
        let next = new.plan(&view, &settings, SyncKind::Partial, &HashSet::new());
        assert!(next.tx.is_empty(), "{}", next.tx.text());
    }
}

fn service_chain(table: &Table, service: &str) -> String {
    table
        .chains
        .keys()
        .find(|c| c.starts_with("service-") && c.contains(&format!("ns/{service}/")))
        .cloned()
        .expect("a service chain")
}

#[test]
fn hand_made_changes_are_repaired() {
    let net = Net::of(IpFamily::V4);
    let settings = net.settings();
    let s = scenario(&net, 4);
    let clean = kernel_table(&s, &settings);

    // An extra rule in a Service's chain: that chain alone is written again.
    let mut actual = clean.clone();
    let chain = service_chain(&actual, "svc1");
    let rules = &mut actual.chains.get_mut(&chain).expect("chain").rules;
    rules.insert(0, Rule::new(vec![Stmt::Accept]));
    let wanted = clean.rules(&chain).len();
    let (adoption, _, after, tx) = run(&s, &settings, &actual, &[]);
    assert_eq!(
        adoption,
        Adoption::Repaired {
            operations: 1 + wanted
        }
    );
    assert!(tx
        .text()
        .starts_with(&format!("flush chain ip kube-proxy {chain}\n")));
    assert_eq!(after.dump(), clean.dump());

    // An extra element, and one with another value: deleted; deleted and added.
    let mut actual = clean.clone();
    let ips = &mut actual.sets.get_mut("service-ips").expect("map").elements;
    ips.insert(
        Key::AddrPort(ip("172.30.9.9"), Protocol::Tcp, 1),
        crate::kube_proxy::nft::table::Element {
            value: Some(Verdict::Drop),
            comment: None,
        },
    );
    let (key, element) = ips
        .iter_mut()
        .find(|(k, _)| matches!(k, Key::AddrPort(a, ..) if *a == net.svc(1)))
        .expect("svc0's element");
    let key = key.clone();
    element.comment = Some("someone else's".into());
    let (adoption, _, after, tx) = run(&s, &settings, &actual, &[]);
    assert_eq!(
        adoption,
        Adoption::Repaired { operations: 3 },
        "{}",
        tx.text()
    );
    assert!(tx.text().contains(&format!(
        "delete element ip kube-proxy service-ips {{ {key} }}"
    )));
    assert_eq!(after.dump(), clean.dump());

    // A deleted endpoint chain (its Service chain emptied first, as the kernel requires).
    let mut actual = clean.clone();
    let chain = service_chain(&actual, "sticky");
    actual.chains.get_mut(&chain).expect("chain").rules.clear();
    let endpoint = actual
        .chains
        .keys()
        .find(|c| c.starts_with("endpoint-") && c.contains("ns/sticky/"))
        .cloned()
        .expect("an endpoint chain");
    actual.chains.remove(&endpoint);
    let (adoption, _, after, tx) = run(&s, &settings, &actual, &[]);
    assert!(
        matches!(adoption, Adoption::Repaired { .. }),
        "{adoption:?}"
    );
    assert!(tx
        .text()
        .contains(&format!("add chain ip kube-proxy {endpoint}\n")));
    assert_eq!(after.dump(), clean.dump());

    // A set's elements all gone: added again.
    let mut actual = clean.clone();
    let count = {
        let set = actual.sets.get_mut("service-ips").expect("map");
        std::mem::take(&mut set.elements).len()
    };
    let (adoption, _, after, _) = run(&s, &settings, &actual, &[]);
    assert_eq!(adoption, Adoption::Repaired { operations: count });
    assert_eq!(after.dump(), clean.dump());
}

#[test]
fn what_only_a_new_table_can_change_is_replaced() {
    let net = Net::of(IpFamily::V6);
    let settings = net.settings();
    let s = scenario(&net, 2);
    let clean = kernel_table(&s, &settings);
    let replaced = |actual: &Table, unsupported: &[String]| -> String {
        let (plan, adoption) = adopt(full(&s, &settings), actual, unsupported);
        assert!(plan
            .tx
            .text()
            .starts_with("add table ip6 kube-proxy\ndelete table"));
        match adoption {
            Adoption::Replaced { reason } => reason,
            other => panic!("not replaced: {other:?}"),
        }
    };
    // A set declared with another comment, or another timeout.
    let mut actual = clean.clone();
    actual
        .sets
        .get_mut("service-ips")
        .expect("map")
        .spec
        .comment = None;
    assert!(replaced(&actual, &[]).contains("service-ips"));
    let mut actual = clean.clone();
    let affinity = actual
        .sets
        .values_mut()
        .find(|set| set.spec.timeout_secs.is_some())
        .expect("an affinity set");
    affinity.spec.timeout_secs = Some(1);
    assert!(replaced(&actual, &[]).contains("declared differently"));
    // A base chain at another priority.
    let mut actual = clean.clone();
    let base = actual
        .chains
        .values_mut()
        .find_map(|c| c.base.as_mut())
        .expect("a base chain");
    base.priority += 1;
    assert!(replaced(&actual, &[]).contains("hooked differently"));
    // What the reader could not express.
    let reason = replaced(&clean, &["chain x: policy 0".into()]);
    assert!(reason.contains("policy 0"), "{reason}");
    // Another table comment.
    let mut actual = clean.clone();
    actual.comment = None;
    assert!(replaced(&actual, &[]).contains("comment"));
}
