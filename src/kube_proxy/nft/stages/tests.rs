use std::collections::HashSet;

use super::*;
use crate::kube_proxy::model::{IpFamily, Protocol};
use crate::kube_proxy::nft::table::apply;
use crate::kube_proxy::ruleset::sync::{KernelView, SyncKind};
use crate::kube_proxy::testing::scenario::{Net, Scenario, READY, READY_LOCAL};

fn scenario(net: &Net, n: usize) -> Scenario {
    let mut s = Scenario::default();
    for i in 0..n {
        s.service("ns", &format!("svc{i}"), net.svc(i as u8 + 1))
            .port("p80", Protocol::Tcp, 80, 30000 + i as u16)
            .port("p53", Protocol::Udp, 53, 0)
            .endpoint("p80", net.pod(1, i as u8 + 1), 8080, READY)
            .endpoint("p80", net.pod(0, i as u8 + 1), 8080, READY_LOCAL)
            .endpoint("p53", net.pod(1, i as u8 + 1), 53, READY)
            .endpoint("p53", net.pod(0, i as u8 + 1), 53, READY)
            .done();
    }
    s
}

fn full_sync(family: IpFamily, n: usize) -> Transaction {
    let net = Net::of(family);
    let settings = net.settings();
    scenario(&net, n)
        .plan(
            &KernelView::new(),
            &settings,
            SyncKind::Full,
            &HashSet::new(),
        )
        .tx
}

fn anonymous(tx: &Transaction) -> usize {
    tx.ops
        .iter()
        .map(|(_, object)| match object {
            Object::Rule { rule, .. } => rule.anonymous_sets(),
            _ => 0,
        })
        .sum()
}

#[test]
fn the_stages_in_order_are_the_transaction_and_leave_the_same_table() {
    for family in [IpFamily::V4, IpFamily::V6] {
        let tx = full_sync(family, 40);
        let total = anonymous(&tx);
        // Two numgen maps per Service (its ports with two endpoints each).
        assert!(total >= 80, "{family}: {total} anonymous sets");
        for per_stage in [1, 7, 25, total, total + 1] {
            let parts: Vec<_> = stages(tx.clone(), per_stage).collect();
            let expected = total.div_ceil(per_stage);
            assert_eq!(parts.len(), expected, "{family}, {per_stage} per stage");
            // Each stage names its anonymous sets after those of the stages before it.
            let mut named = 0;
            for part in &parts {
                assert!(!part.is_empty());
                assert!(
                    anonymous(part) <= per_stage,
                    "{family}: a stage over its bound"
                );
                assert_eq!(part.anonymous_names_from, Some(named as u32));
                named += anonymous(part);
            }
            let joined: Vec<_> = parts.iter().flat_map(|p| p.ops.iter().cloned()).collect();
            assert_eq!(
                joined, tx.ops,
                "{family}, {per_stage}: the operations, in order"
            );

            let mut whole = None;
            apply(&mut whole, &tx).expect("the whole transaction applies");
            let mut staged = None;
            for (i, part) in parts.iter().enumerate() {
                apply(&mut staged, part).unwrap_or_else(|e| {
                    panic!("{family}: stage {i} of {} refused: {e}", parts.len())
                });
            }
            assert_eq!(staged, whole, "{family}, {per_stage}: the same table");
        }
    }
}

#[test]
fn a_transaction_without_anonymous_sets_stays_whole() {
    let mut tx = Transaction::new(IpFamily::V4);
    tx.add(Object::Table { comment: None });
    tx.add(Object::chain("a"));
    let parts: Vec<_> = stages(tx.clone(), 1).collect();
    assert_eq!(parts.len(), 1);
    assert_eq!(parts[0].ops, tx.ops);
    assert_eq!(parts[0].anonymous_names_from, Some(0));
    let empty: Vec<_> = stages(Transaction::new(IpFamily::V6), 10).collect();
    assert_eq!(empty.len(), 1);
    assert!(empty[0].is_empty());
}
