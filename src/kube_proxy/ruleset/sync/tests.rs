use std::collections::HashSet;
use std::time::{Duration, Instant};

use super::*;
use crate::kube_proxy::model::{IpFamily, Protocol};
use crate::kube_proxy::nft::table::{apply, Table};
use crate::kube_proxy::testing::scenario::{
    dump_diff, Net, Scenario, READY, READY_LOCAL, TERMINATING,
};

/// A scenario with `n` Services of two endpoints each, Service `i` at svc index `i`.
fn many(net: &Net, n: usize) -> Scenario {
    let mut s = Scenario::default();
    for i in 0..n {
        let ip = match net.family {
            IpFamily::V4 => IpAddr::from([172, 30, (i / 250) as u8, (i % 250) as u8 + 1]),
            IpFamily::V6 => IpAddr::from([0xfd00, 0x10, 0x96, 0, 0, 0, 0, i as u16 + 1]),
        };
        s.service("ns", &format!("svc{i}"), ip)
            .port("p80", Protocol::Tcp, 80, 0)
            .endpoint("p80", net.pod(1, (i % 200) as u8 + 1), 8080, READY)
            .endpoint("p80", net.pod(2, (i % 200) as u8 + 1), 8080, READY)
            .done();
    }
    s
}

use std::net::IpAddr;

/// Keeps a model kernel and the view in step, as the proxier does.
struct Node {
    settings: Settings,
    view: KernelView,
    kernel: Option<Table>,
    now: Instant,
}

impl Node {
    fn new(net: &Net) -> Node {
        Node {
            settings: net.settings(),
            view: KernelView::new(),
            kernel: None,
            now: Instant::now(),
        }
    }

    fn sync(&mut self, s: &Scenario, kind: SyncKind, changed: &[&str]) -> Transaction {
        if let Some((tx, names)) = self.view.stale_cleanup(&self.settings, self.now) {
            apply(&mut self.kernel, &tx).expect("the model kernel takes the stale-chain cleanup");
            self.view.stale_deleted(&names);
        }
        let changed: HashSet<ServiceName> =
            changed.iter().map(|n| ServiceName::new("ns", *n)).collect();
        let plan = s.plan(&self.view, &self.settings, kind, &changed);
        let tx = plan.tx.clone();
        apply(&mut self.kernel, &tx).unwrap_or_else(|e| panic!("refused: {e}\n{}", tx.text()));
        self.view.commit(plan, self.now);
        tx
    }

    fn table(&self) -> &Table {
        self.kernel.as_ref().expect("a table")
    }
}

fn fresh(s: &Scenario, settings: &Settings) -> String {
    s.table(settings).dump()
}

#[test]
fn the_first_sync_is_full_and_replaces_the_table() {
    let net = Net::of(IpFamily::V4);
    let s = many(&net, 3);
    let mut node = Node::new(&net);
    let tx = node.sync(&s, SyncKind::Partial, &[]);
    let text = tx.text();
    assert!(
        text.starts_with("add table ip kube-proxy\ndelete table ip kube-proxy\n"),
        "{text}"
    );
    assert_eq!(node.table().dump(), fresh(&s, &node.settings));
    assert!(!node.view.needs_full());
}

#[test]
fn one_endpoint_change_among_many_services_touches_only_that_service() {
    let net = Net::of(IpFamily::V4);
    let mut s = many(&net, 1000);
    let mut node = Node::new(&net);
    node.sync(&s, SyncKind::Full, &[]);
    // Nothing changed: nothing to send.
    assert!(node.sync(&s, SyncKind::Partial, &[]).is_empty());
    // One endpoint of svc500 goes away.
    let name = ServicePortName::new(ServiceName::new("ns", "svc500"), "p80", Protocol::Tcp);
    s.endpoints.get_mut(&name).expect("endpoints").pop();
    let tx = node.sync(&s, SyncKind::Partial, &["svc500"]);
    let text = tx.text();
    // The Service's one chain: add, flush and its one rule, and nothing else.
    assert_eq!(tx.len(), 3, "{text}");
    assert!(text.lines().all(|l| l.contains("ns/svc500/")), "{text}");
    assert_eq!(node.table().dump(), fresh(&s, &node.settings));
}

#[test]
fn a_removed_service_is_flushed_now_and_deleted_a_second_later() {
    let net = Net::of(IpFamily::V6);
    let mut s = many(&net, 3);
    s.service("ns", "gone", net.svc(200))
        .port("p", Protocol::Udp, 53, 30053)
        .affinity(60)
        .endpoint("p", net.pod(0, 9), 53, READY_LOCAL)
        .done();
    let mut node = Node::new(&net);
    node.sync(&s, SyncKind::Full, &[]);
    let before = node
        .table()
        .chains
        .keys()
        .filter(|c| c.contains("ns/gone/"))
        .count();
    assert_eq!(before, 3, "service, external and endpoint chains");
    s.services.remove(&ServiceName::new("ns", "gone"));
    s.endpoints.retain(|k, _| k.service.name() != "gone");
    let tx = node.sync(&s, SyncKind::Partial, &["gone"]);
    let text = tx.text();
    assert!(
        text.contains("flush chain ip6 kube-proxy service-"),
        "{text}"
    );
    assert!(
        text.contains("delete set ip6 kube-proxy affinity-"),
        "{text}"
    );
    assert!(!text.contains("delete chain"), "{text}");
    // The chains are still there, empty, until a second has passed.
    let kept = node
        .table()
        .chains
        .iter()
        .filter(|(n, _)| n.contains("ns/gone/"));
    assert!(kept.clone().count() == 3 && kept.into_iter().all(|(_, c)| c.rules.is_empty()));
    assert!(node.view.stale_cleanup(&node.settings, node.now).is_none());
    assert_eq!(
        node.view.next_stale_deadline(),
        Some(node.now + STALE_CHAIN_DELAY)
    );
    node.now += Duration::from_millis(1100);
    node.sync(&s, SyncKind::Partial, &[]);
    assert!(!node.table().chains.keys().any(|c| c.contains("ns/gone/")));
    assert_eq!(node.view.next_stale_deadline(), None);
    assert_eq!(node.table().dump(), fresh(&s, &node.settings));
}

#[test]
fn a_chain_wanted_again_before_its_deletion_is_kept() {
    let net = Net::of(IpFamily::V4);
    let mut s = many(&net, 2);
    let mut node = Node::new(&net);
    node.sync(&s, SyncKind::Full, &[]);
    let name = ServicePortName::new(ServiceName::new("ns", "svc0"), "p80", Protocol::Tcp);
    let saved = s.endpoints.remove(&name).expect("endpoints");
    node.sync(&s, SyncKind::Partial, &["svc0"]);
    assert!(node.view.next_stale_deadline().is_some());
    s.endpoints.insert(name, saved);
    node.sync(&s, SyncKind::Partial, &["svc0"]);
    assert_eq!(node.view.next_stale_deadline(), None);
    node.now += Duration::from_secs(2);
    node.sync(&s, SyncKind::Partial, &[]);
    assert_eq!(node.table().dump(), fresh(&s, &node.settings));
}

#[test]
fn two_services_claiming_one_key_never_clash_in_the_kernel() {
    let net = Net::of(IpFamily::V4);
    let shared = net.ext(7);
    let mut s = Scenario::default();
    s.service("ns", "a", net.svc(1))
        .port("p", Protocol::Tcp, 80, 0)
        .external_ip(shared)
        .endpoint("p", net.pod(1, 1), 80, READY)
        .done();
    s.service("ns", "b", net.svc(2))
        .port("p", Protocol::Tcp, 80, 0)
        .external_ip(shared)
        .endpoint("p", net.pod(1, 2), 80, READY)
        .done();
    let mut node = Node::new(&net);
    node.sync(&s, SyncKind::Full, &[]);
    let key = Key::AddrPort(shared, Protocol::Tcp, 80);
    let value = |node: &Node| {
        node.table()
            .element("service-ips", &key)
            .and_then(|e| e.value.clone())
    };
    let a = Some(Verdict::Goto(PortChainsOf::external("a")));
    let b = Some(Verdict::Goto(PortChainsOf::external("b")));
    assert_eq!(value(&node), a, "the first Service by name holds the key");
    s.services.remove(&ServiceName::new("ns", "a"));
    s.endpoints.retain(|k, _| k.service.name() != "a");
    node.sync(&s, SyncKind::Partial, &["a"]);
    assert_eq!(value(&node), b, "the other claim takes over");
    s.service("ns", "a", net.svc(1))
        .port("p", Protocol::Tcp, 80, 0)
        .external_ip(shared)
        .done();
    node.sync(&s, SyncKind::Partial, &["a"]);
    assert_eq!(
        value(&node),
        b,
        "a without endpoints wants only a no-endpoint entry"
    );
    assert!(node.table().element("no-endpoint-services", &key).is_some());
    node.now += Duration::from_secs(2);
    node.sync(&s, SyncKind::Partial, &[]);
    assert_eq!(node.table().dump(), fresh(&s, &node.settings));
}

struct PortChainsOf;

impl PortChainsOf {
    fn external(service: &str) -> String {
        crate::kube_proxy::nft::names::PortChains::new(&ServicePortName::new(
            ServiceName::new("ns", service),
            "p",
            Protocol::Tcp,
        ))
        .external
    }
}

#[test]
fn a_refresh_rewrites_everything_and_keeps_affinity_sets() {
    let net = Net::of(IpFamily::V4);
    let mut s = many(&net, 5);
    s.service("ns", "sticky", net.svc(250))
        .port("p", Protocol::Tcp, 80, 0)
        .affinity(300)
        .endpoint("p", net.pod(1, 1), 80, READY)
        .done();
    let mut node = Node::new(&net);
    node.sync(&s, SyncKind::Full, &[]);
    // Drift: someone empties a Service chain and deletes a map element.
    let table = node.kernel.as_mut().expect("table");
    let chain = table
        .chains
        .keys()
        .find(|c| c.starts_with("service-"))
        .cloned()
        .expect("a chain");
    table.chains.get_mut(&chain).expect("chain").rules.clear();
    table
        .sets
        .get_mut("service-ips")
        .expect("map")
        .elements
        .clear();
    let tx = node.sync(&s, SyncKind::Refresh, &[]);
    assert!(!tx.text().contains("delete table"));
    assert!(!tx.text().contains("delete set"));
    assert_eq!(node.table().dump(), fresh(&s, &node.settings));
}

#[test]
fn random_changes_always_leave_what_a_full_sync_would() {
    for seed in 1..=20u64 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let family = if seed % 2 == 0 {
            IpFamily::V6
        } else {
            IpFamily::V4
        };
        let net = Net::of(family);
        let mut s = Scenario::default();
        let mut node = Node::new(&net);
        for step in 0..30 {
            let mut changed = Vec::new();
            for _ in 0..rng.usize(1..4) {
                let i = rng.usize(0..12);
                let name = format!("s{i}");
                changed.push(name.clone());
                let key = ServiceName::new("ns", name.clone());
                s.services.remove(&key);
                s.endpoints.retain(|k, _| k.service != key);
                if rng.bool() {
                    continue;
                }
                let proto = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp][rng.usize(0..3)];
                let mut svc = s.service("ns", &name, net.svc(i as u8 + 1)).port(
                    "p",
                    proto,
                    80,
                    if rng.bool() { 30000 + i as u16 } else { 0 },
                );
                if rng.bool() {
                    svc = svc.external_ip(net.ext(rng.u8(1..4)));
                }
                if rng.bool() {
                    svc = svc
                        .lb(net.ext(rng.u8(10..12)))
                        .source_range(net.source_range);
                }
                if rng.u8(0..4) == 0 {
                    svc = svc.external_local();
                }
                if rng.u8(0..4) == 0 {
                    svc = svc.internal_local();
                }
                if rng.u8(0..4) == 0 {
                    svc = svc.affinity(rng.u32(1..100));
                }
                for e in 0..rng.usize(0..4) {
                    let state = [READY, READY_LOCAL, TERMINATING][rng.usize(0..3)];
                    svc = svc.endpoint("p", net.pod(rng.u8(0..2), e as u8 + 1), 8080, state);
                }
                svc.done();
            }
            let names: Vec<&str> = changed.iter().map(String::as_str).collect();
            let kind = if step % 10 == 9 {
                SyncKind::Refresh
            } else {
                SyncKind::Partial
            };
            node.sync(&s, kind, &names);
            node.now += Duration::from_millis(rng.u64(0..1500));
            let expected = fresh(&s, &node.settings);
            // Flushed chains wait for deletion: compare without the empty leftovers.
            let mut got = node.table().clone();
            got.chains.retain(|name, c| {
                !c.rules.is_empty()
                    || !name.contains('/')
                    || s.table(&node.settings).chains.contains_key(name)
            });
            let got = got.dump();
            assert!(
                got == expected,
                "seed {seed} step {step}:\n{}",
                dump_diff(&got, &expected)
            );
        }
    }
}

#[test]
fn a_kept_slot_gives_back_what_the_kernel_holds() {
    let claim = |owner: &str, chain: &str| Claim {
        owner: ServiceName::new("ns", owner),
        value: Some(Verdict::Goto(chain.into())),
        comment: Some(format!("ns/{owner}")),
    };
    let claims = vec![claim("b", "service-b"), claim("a", "service-a")];
    let held = |chain: &str, owner: &str| {
        Some(Box::new((
            Some(Verdict::Goto(chain.into())),
            Some(format!("ns/{owner}")),
        )))
    };
    for kernel in [
        None,
        held("service-a", "a"),
        held("service-b", "b"),
        held("gone", "x"),
    ] {
        let slot = Slot {
            kernel: kernel.clone(),
            claims: claims.clone(),
        };
        let kept = KeptSlot::keep(slot.clone());
        // Only the effective claim's value (Service "a" sorts first) is kept as a mark.
        assert_eq!(
            matches!(kept.kernel, KernelHeld::Effective),
            kernel == held("service-a", "a"),
            "{kernel:?}"
        );
        assert_eq!(kept.working(), slot);
    }
    let orphan = Slot {
        kernel: held("service-a", "a"),
        claims: Vec::new(),
    };
    assert_eq!(KeptSlot::keep(orphan.clone()).working(), orphan);
}
