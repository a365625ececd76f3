use super::*;
use crate::kube_proxy::model::Protocol;
use crate::kube_proxy::nft::objects::SetSpec;

fn map(name: &str) -> Object {
    Object::Set {
        name: name.into(),
        spec: SetSpec {
            kind: SetKind::Map,
            key_type: "ipv4_addr . inet_proto . inet_service : verdict".into(),
            flags: vec![],
            timeout_secs: None,
            comment: None,
        },
    }
}

fn element(set: &str, port: u16, chain: &str) -> Object {
    Object::Element {
        set: set.into(),
        key: Key::AddrPort("10.0.0.1".parse().unwrap(), Protocol::Tcp, port),
        value: Some(Verdict::Goto(chain.into())),
        comment: None,
    }
}

fn base() -> Transaction {
    let mut tx = Transaction::new(IpFamily::V4);
    tx.add(Object::Table { comment: None });
    tx.add(map("service-ips"));
    tx.add(Object::chain("svc/a"));
    tx.add(element("service-ips", 80, "svc/a"));
    tx
}

#[test]
fn a_transaction_applies_whole_or_not_at_all() {
    let mut state = None;
    apply(&mut state, &base()).unwrap();
    let before = state.clone();
    let mut tx = Transaction::new(IpFamily::V4);
    tx.add(Object::chain("svc/b"));
    tx.add(element("service-ips", 81, "svc/b"));
    tx.add(element("service-ips", 82, "svc/missing"));
    assert_eq!(
        apply(&mut state, &tx),
        Err(ApplyError::NotFound("chain svc/missing".into()))
    );
    assert_eq!(state, before);
}

#[test]
fn referenced_and_missing_objects_are_refused() {
    let mut state = None;
    apply(&mut state, &base()).unwrap();
    let mut tx = Transaction::new(IpFamily::V4);
    tx.delete(Object::chain("svc/a"));
    assert!(matches!(apply(&mut state, &tx), Err(ApplyError::Busy(_))));
    let mut tx = Transaction::new(IpFamily::V4);
    tx.flush(Object::chain("svc/none"));
    assert!(matches!(
        apply(&mut state, &tx),
        Err(ApplyError::NotFound(_))
    ));
    // A changed value needs delete + add.
    let mut tx = Transaction::new(IpFamily::V4);
    tx.add(Object::chain("svc/b"));
    tx.add(element("service-ips", 80, "svc/b"));
    assert!(matches!(apply(&mut state, &tx), Err(ApplyError::Exists(_))));
    let mut tx = Transaction::new(IpFamily::V4);
    tx.add(Object::chain("svc/b"));
    tx.delete(element("service-ips", 80, ""));
    tx.add(element("service-ips", 80, "svc/b"));
    tx.delete(Object::chain("svc/a"));
    apply(&mut state, &tx).unwrap();
    let table = state.as_ref().unwrap();
    assert!(!table.chains.contains_key("svc/a"));
    assert_eq!(table.sets["service-ips"].elements.len(), 1);
    // The same element again is no change.
    let mut tx = Transaction::new(IpFamily::V4);
    tx.add(element("service-ips", 80, "svc/b"));
    apply(&mut state, &tx).unwrap();
}

#[test]
fn rules_need_what_they_name() {
    let mut state = None;
    apply(&mut state, &base()).unwrap();
    let mut tx = Transaction::new(IpFamily::V4);
    tx.add_rule(
        "svc/a",
        Rule::new(vec![Stmt::Addr {
            field: crate::kube_proxy::nft::rule::AddrField::Daddr,
            negate: false,
            value: AddrValue::Named("cluster-ips".into()),
        }]),
    );
    assert_eq!(
        apply(&mut state, &tx),
        Err(ApplyError::NotFound("set cluster-ips".into()))
    );
    let mut tx = Transaction::new(IpFamily::V4);
    tx.add(Object::chain("top"));
    tx.add_rule("top", Rule::new(vec![Stmt::Jump("svc/a".into())]));
    tx.delete(Object::set_named(SetKind::Map, "service-ips"));
    apply(&mut state, &tx).unwrap();
    let mut tx = Transaction::new(IpFamily::V4);
    tx.flush(Object::chain("top"));
    tx.delete(Object::chain("svc/a"));
    apply(&mut state, &tx).unwrap();
    assert!(state
        .as_ref()
        .unwrap()
        .dump()
        .contains("add chain ip kube-proxy top\n"));
}
