use super::*;
use crate::kube_proxy::api::objects::{SliceEndpoint, SlicePort};
use crate::kube_proxy::model::Protocol;

fn slice(service: &str, name: &str, family: IpFamily, ips: &[&str]) -> SliceObj {
    SliceObj {
        service: ServiceName::new("ns", service),
        name: name.into(),
        family,
        ports: vec![SlicePort {
            name: "p".into(),
            protocol: Protocol::Tcp,
            port: 80,
        }],
        endpoints: ips
            .iter()
            .map(|ip| SliceEndpoint {
                ip: ip.parse().unwrap(),
                is_local: false,
                ready: true,
                serving: true,
                terminating: false,
                hints: None,
            })
            .collect(),
        trigger_time: None,
    }
}

fn service(name: &str) -> ServiceObj {
    ServiceObj {
        name: ServiceName::new("ns", name),
        cluster_ip_v4: Some("10.96.0.1".parse().unwrap()),
        cluster_ip_v6: None,
        ports: vec![],
        external_ips: vec![],
        source_ranges: vec![],
        lb_vips: vec![],
        external_policy_local: false,
        internal_policy_local: false,
        affinity_timeout: None,
        health_check_node_port: 0,
    }
}

#[test]
fn nothing_is_checked_out_before_both_lists_arrived_then_everything_is() {
    let store = Store::new(&[IpFamily::V4, IpFamily::V6]);
    assert!(store.set_service(ServiceName::new("ns", "a"), Some(service("a"))));
    assert!(store.set_slice(slice("a", "a-1", IpFamily::V4, &["10.0.0.1"])));
    store.mark_synced(true);
    assert!(!store.synced());
    store.mark_synced(false);
    assert!(store.synced());
    let v4 = store.checkout(IpFamily::V4);
    assert_eq!(v4.services.len(), 1);
    assert_eq!(v4.endpoints[&ServiceName::new("ns", "a")].len(), 1);
    let v6 = store.checkout(IpFamily::V6);
    assert!(
        v6.endpoints[&ServiceName::new("ns", "a")].is_empty(),
        "no IPv6 slices"
    );
    assert!(store.checkout(IpFamily::V4).is_empty(), "taken");
}

#[test]
fn unchanged_objects_mark_nothing() {
    let store = Store::new(&[IpFamily::V4]);
    store.mark_synced(true);
    store.mark_synced(false);
    let _ = store.checkout(IpFamily::V4);
    assert!(store.set_service(ServiceName::new("ns", "a"), Some(service("a"))));
    assert!(!store.set_service(ServiceName::new("ns", "a"), Some(service("a"))));
    assert!(store.set_slice(slice("a", "a-1", IpFamily::V4, &["10.0.0.1"])));
    let mut again = slice("a", "a-1", IpFamily::V4, &["10.0.0.1"]);
    again.trigger_time = Some(SystemTime::now());
    assert!(!store.set_slice(again), "only the trigger time differs");
    let out = store.checkout(IpFamily::V4);
    assert_eq!((out.services.len(), out.endpoints.len()), (1, 1));
    assert!(!store.remove_slice("ns", "missing"));
    assert!(store.remove_slice("ns", "a-1"));
    assert_eq!(store.counts(), (1, 0));
    assert!(store.checkout(IpFamily::V4).endpoints[&ServiceName::new("ns", "a")].is_empty());
}

#[test]
fn a_slice_that_changes_service_leaves_the_old_one() {
    let store = Store::new(&[IpFamily::V4]);
    store.mark_synced(true);
    store.mark_synced(false);
    store.set_slice(slice("a", "s-1", IpFamily::V4, &["10.0.0.1"]));
    let _ = store.checkout(IpFamily::V4);
    store.set_slice(slice("b", "s-1", IpFamily::V4, &["10.0.0.1"]));
    let out = store.checkout(IpFamily::V4);
    assert!(out.endpoints[&ServiceName::new("ns", "a")].is_empty());
    assert_eq!(out.endpoints[&ServiceName::new("ns", "b")].len(), 1);
    assert_eq!(store.counts(), (0, 1));
}

#[test]
fn a_relist_removes_what_it_no_longer_has() {
    let store = Store::new(&[IpFamily::V4]);
    store.mark_synced(true);
    store.mark_synced(false);
    store.set_service(ServiceName::new("ns", "a"), Some(service("a")));
    store.set_service(ServiceName::new("ns", "b"), Some(service("b")));
    store.set_slice(slice("a", "a-1", IpFamily::V4, &["10.0.0.1"]));
    store.set_slice(slice("b", "b-1", IpFamily::V4, &["10.0.0.2"]));
    let _ = store.checkout(IpFamily::V4);
    store.retain_services(&[ServiceName::new("ns", "b")].into_iter().collect());
    store.retain_slices(
        &[("ns".to_string(), "b-1".to_string())]
            .into_iter()
            .collect(),
    );
    assert_eq!(store.counts(), (1, 1));
    let out = store.checkout(IpFamily::V4);
    assert_eq!(out.services[&ServiceName::new("ns", "a")], None);
    assert!(out.endpoints[&ServiceName::new("ns", "a")].is_empty());
}
