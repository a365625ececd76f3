//! `clean_stale_in` over a table of our own: what it asks the kernel for, what it deletes,
//! how it counts, and what it does with failures.

use std::io;

use prometheus::Registry;

use super::*;
use crate::kube_proxy::conntrack::netlink::Operation;

#[derive(Default)]
struct FakeTable {
    flows: Vec<Flow>,
    interrupted: bool,
    dump_fails: bool,
    /// Source ports of entries whose delete fails, or finds nothing.
    delete_fails: Vec<u16>,
    already_gone: Vec<u16>,
    dumps: Vec<(IpFamily, Option<Protocol>)>,
    deleted: Vec<Flow>,
}

impl ConntrackTable for FakeTable {
    fn dump(
        &mut self,
        family: IpFamily,
        protocol: Option<Protocol>,
    ) -> Result<Dump, ConntrackError> {
        self.dumps.push((family, protocol));
        if self.dump_fails {
            return Err(ConntrackError::Receive {
                operation: Operation::Dump,
                source: io::Error::from(io::ErrorKind::TimedOut),
            });
        }
        Ok(Dump {
            flows: self.flows.clone(),
            interrupted: self.interrupted,
            skipped: 0,
        })
    }

    fn delete(&mut self, flow: &Flow) -> Result<Deletion, ConntrackError> {
        let port = flow.original.src_port;
        if self.delete_fails.contains(&port) {
            return Err(ConntrackError::Kernel {
                operation: Operation::Delete,
                source: io::Error::from_raw_os_error(libc::EPERM),
            });
        }
        if self.already_gone.contains(&port) {
            return Ok(Deletion::AlreadyGone);
        }
        self.deleted.push(flow.clone());
        Ok(Deletion::Deleted)
    }
}

/// ns/dns UDP 53 on 10.96.0.10, served by 10.244.1.5 only.
fn state() -> (
    BTreeMap<ServiceName, Vec<ServicePort>>,
    HashMap<ServicePortName, Vec<Endpoint>>,
) {
    let svc = ServiceName::new("ns", "dns");
    let port = ServicePort {
        name: ServicePortName::new(svc.clone(), "dns", Protocol::Udp),
        cluster_ip: "10.96.0.10".parse().unwrap(),
        port: 53,
        node_port: 0,
        affinity_timeout: None,
        external_policy_local: false,
        internal_policy_local: false,
        external_ips: Vec::new(),
        source_ranges: Vec::new(),
        lb_vips: Vec::new(),
        health_check_node_port: 0,
    };
    let endpoint = Endpoint {
        ip: "10.244.1.5".parse().unwrap(),
        port: 5353,
        is_local: false,
        ready: true,
        serving: true,
        terminating: false,
        hints: None,
    };
    let endpoints = HashMap::from([(port.name.clone(), vec![endpoint])]);
    (BTreeMap::from([(svc, vec![port])]), endpoints)
}

/// A client on source port `src_port` to the ClusterIP, answered by `backend`.
fn flow(src_port: u16, backend: &str) -> Flow {
    let original = Tuple {
        protocol: 17,
        src: "10.0.0.1".parse().unwrap(),
        dst: "10.96.0.10".parse().unwrap(),
        src_port,
        dst_port: 53,
    };
    let reply = Tuple {
        src: backend.parse().unwrap(),
        src_port: 5353,
        ..original.inverse()
    };
    Flow {
        original,
        reply,
        zone: None,
        id: Some(u32::from(src_port)),
    }
}

fn metrics() -> ConntrackMetrics {
    ConntrackMetrics::register(&Registry::new()).unwrap()
}

#[test]
fn stale_entries_are_deleted_and_counted() {
    let (services, endpoints) = state();
    let mut table = FakeTable {
        flows: vec![
            flow(1, "10.244.1.5"),
            flow(2, "10.244.1.6"),
            flow(3, "10.244.1.5"),
            flow(4, "10.244.1.7"),
        ],
        ..FakeTable::default()
    };
    let metrics = metrics();
    let cleaned =
        clean_stale_in(&mut table, IpFamily::V4, &services, &endpoints, &metrics).unwrap();
    assert_eq!(table.dumps, [(IpFamily::V4, Some(Protocol::Udp))]);
    assert_eq!(
        table.deleted,
        [flow(2, "10.244.1.6"), flow(4, "10.244.1.7")]
    );
    assert_eq!(cleaned.deleted, 2);
    assert_eq!(metrics.syncs(IpFamily::V4), 1);
    assert_eq!(metrics.deleted_entries(IpFamily::V4), 2);
    assert_eq!(metrics.syncs(IpFamily::V6), 0);
}

#[test]
fn entries_already_gone_count_as_deleted() {
    let (services, endpoints) = state();
    let mut table = FakeTable {
        flows: vec![flow(1, "10.244.1.6"), flow(2, "10.244.1.6")],
        already_gone: vec![1],
        ..FakeTable::default()
    };
    let metrics = metrics();
    let cleaned =
        clean_stale_in(&mut table, IpFamily::V4, &services, &endpoints, &metrics).unwrap();
    assert_eq!(cleaned.deleted, 2);
    assert_eq!(table.deleted, [flow(2, "10.244.1.6")]);
    assert_eq!(metrics.deleted_entries(IpFamily::V4), 2);
}

#[test]
fn a_failed_delete_does_not_stop_the_others() {
    let (services, endpoints) = state();
    let mut table = FakeTable {
        flows: vec![
            flow(1, "10.244.1.6"),
            flow(2, "10.244.1.6"),
            flow(3, "10.244.1.6"),
        ],
        delete_fails: vec![1, 3],
        ..FakeTable::default()
    };
    let metrics = metrics();
    let err =
        clean_stale_in(&mut table, IpFamily::V4, &services, &endpoints, &metrics).unwrap_err();
    let ConntrackError::Incomplete {
        deleted,
        failed,
        first,
    } = &err
    else {
        panic!("{err:?}");
    };
    assert_eq!((*deleted, *failed), (1, 2));
    assert_eq!(first.errno(), Some(libc::EPERM));
    assert_eq!(table.deleted, [flow(2, "10.244.1.6")]);
    // Still observed, with what was deleted, as upstream's.
    assert_eq!(metrics.syncs(IpFamily::V4), 1);
    assert_eq!(metrics.deleted_entries(IpFamily::V4), 1);
}

#[test]
fn an_interrupted_dump_is_cleaned_all_the_same() {
    let (services, endpoints) = state();
    let mut table = FakeTable {
        flows: vec![flow(1, "10.244.1.6")],
        interrupted: true,
        ..FakeTable::default()
    };
    let cleaned =
        clean_stale_in(&mut table, IpFamily::V4, &services, &endpoints, &metrics()).unwrap();
    assert_eq!(cleaned.deleted, 1);
}

#[test]
fn a_failed_dump_deletes_nothing_and_is_not_observed() {
    let (services, endpoints) = state();
    let mut table = FakeTable {
        flows: vec![flow(1, "10.244.1.6")],
        dump_fails: true,
        ..FakeTable::default()
    };
    let metrics = metrics();
    let err =
        clean_stale_in(&mut table, IpFamily::V6, &services, &endpoints, &metrics).unwrap_err();
    assert!(matches!(err, ConntrackError::Receive { .. }), "{err:?}");
    assert!(table.deleted.is_empty());
    assert_eq!(metrics.syncs(IpFamily::V6), 0);
}
