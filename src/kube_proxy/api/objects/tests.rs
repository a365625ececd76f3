use super::*;

fn service(json: serde_json::Value) -> Service {
    serde_json::from_value(json).expect("a Service")
}

fn slice(json: serde_json::Value) -> EndpointSlice {
    serde_json::from_value(json).expect("an EndpointSlice")
}

#[test]
fn a_dual_stack_load_balancer_reads_per_family() {
    let svc = service(serde_json::json!({
        "metadata": {"namespace": "ns1", "name": "svc1"},
        "spec": {
            "type": "LoadBalancer",
            "clusterIP": "10.96.0.10",
            "clusterIPs": ["10.96.0.10", "fd00::10"],
            "ipFamilies": ["IPv4", "IPv6"],
            "ports": [
                {"name": "p80", "port": 80, "nodePort": 30080, "protocol": "TCP"},
                {"name": "dns", "port": 53, "protocol": "UDP"}
            ],
            "externalIPs": ["1.2.3.4", "2001:db8::4", ""],
            "loadBalancerSourceRanges": [" 203.0.113.0/25", "2001:db8::/64"],
            "externalTrafficPolicy": "Local",
            "healthCheckNodePort": 30100,
            "sessionAffinity": "ClientIP",
            "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 600}}
        },
        "status": {"loadBalancer": {"ingress": [
            {"ip": "5.6.7.8"},
            {"ip": "5.6.7.9", "ipMode": "Proxy"},
            {"hostname": "lb.example"},
            {"ip": "2001:db8::8", "ipMode": "VIP"}
        ]}}
    }));
    let read = read_service(&svc).expect("readable");
    assert!(read.problems.is_empty(), "{:?}", read.problems);
    let obj = read.service.expect("proxied");
    let v4 = obj.ports_for(IpFamily::V4);
    assert_eq!(v4.len(), 2);
    let p = &v4[0];
    assert_eq!(p.cluster_ip, "10.96.0.10".parse::<IpAddr>().unwrap());
    assert_eq!((p.port, p.node_port), (80, 30080));
    assert_eq!(p.external_ips, ["1.2.3.4".parse::<IpAddr>().unwrap()]);
    assert_eq!(
        p.lb_vips,
        ["5.6.7.8".parse::<IpAddr>().unwrap()],
        "Proxy mode and hostnames are skipped"
    );
    assert_eq!(
        p.source_ranges,
        ["203.0.113.0/25".parse::<IpNet>().unwrap()]
    );
    assert!(p.external_policy_local && !p.internal_policy_local);
    assert_eq!(p.affinity_timeout, Some(600));
    assert_eq!(p.health_check_node_port, 30100);
    let v6 = obj.ports_for(IpFamily::V6);
    assert_eq!(v6[1].cluster_ip, "fd00::10".parse::<IpAddr>().unwrap());
    assert_eq!(v6[1].name.protocol, Protocol::Udp);
    assert_eq!(v6[0].lb_vips, ["2001:db8::8".parse::<IpAddr>().unwrap()]);
}

#[test]
fn skipped_services_and_bad_entries() {
    for spec in [
        serde_json::json!({"type": "ExternalName", "externalName": "x.example", "ports": []}),
        serde_json::json!({"clusterIP": "None", "ports": [{"port": 80}]}),
        serde_json::json!({"clusterIP": "", "ports": [{"port": 80}]}),
    ] {
        let svc = service(
            serde_json::json!({"metadata": {"namespace": "ns", "name": "s"}, "spec": spec}),
        );
        assert!(read_service(&svc).expect("readable").service.is_none());
    }
    // A ClusterIP of the wrong family, bad IPs, an unknown protocol and a bad port name: the
    // rest of the Service is used.
    let svc = service(serde_json::json!({
        "metadata": {"namespace": "ns", "name": "s"},
        "spec": {
            "clusterIP": "10.96.0.1",
            "clusterIPs": ["fd00::1"],
            "ipFamilies": ["IPv4"],
            "ports": [
                {"name": "ok", "port": 80},
                {"name": "bad proto", "port": 81, "protocol": "ICMP"},
                {"name": "q\"uote", "port": 82},
                {"name": "zero", "port": 0},
                {"name": "ok", "port": 83}
            ],
            "externalIPs": ["not-an-ip"],
            "loadBalancerSourceRanges": ["10.0.0.0/99"]
        }
    }));
    let read = read_service(&svc).expect("readable");
    let obj = read.service.expect("proxied");
    assert_eq!(
        obj.cluster_ip_v4, None,
        "the IPv4 ClusterIP is an IPv6 address"
    );
    assert_eq!(obj.ports.len(), 1);
    assert_eq!(read.problems.len(), 7, "{:#?}", read.problems);
    // A name that could break an nft command refuses the whole object.
    let svc = service(
        serde_json::json!({"metadata": {"namespace": "ns", "name": "a b"}, "spec": {"clusterIP": "10.0.0.1"}}),
    );
    assert!(matches!(read_service(&svc), Err(Refused::BadName(_))));
}

#[test]
fn slices_read_as_upstream_reads_them() {
    let s = slice(serde_json::json!({
        "metadata": {
            "namespace": "ns1", "name": "svc1-abc",
            "labels": {"kubernetes.io/service-name": "svc1"},
            "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2026-12-07T01:02:03Z"}
        },
        "addressType": "IPv4",
        "ports": [
            {"name": "p80", "port": 8080, "protocol": "TCP"},
            {"port": 9090},
            {"name": "noport"}
        ],
        "endpoints": [
            {"addresses": ["10.0.0.1", "10.0.0.99"], "nodeName": "node-a",
             "hints": {"forZones": [{"name": "zone-a"}], "forNodes": [{"name": "node-a"}]}},
            {"addresses": ["10.0.0.2"], "conditions": {"ready": false, "serving": true, "terminating": true}, "nodeName": "node-b"},
            {"addresses": ["fd00::1"]},
            {"addresses": []}
        ]
    }));
    let read = read_slice(&s, "node-a").expect("readable");
    assert_eq!(
        read.problems.len(),
        1,
        "the IPv6 address: {:?}",
        read.problems
    );
    let obj = read.slice;
    assert_eq!(obj.service, ServiceName::new("ns1", "svc1"));
    assert_eq!(
        obj.ports.len(),
        1,
        "unnamed and port-less ports are skipped"
    );
    assert_eq!(obj.endpoints.len(), 2);
    let first = &obj.endpoints[0];
    assert!(first.is_local && first.ready && first.serving && !first.terminating);
    let hints = first.hints.as_ref().expect("hints");
    assert!(hints.zones.as_ref().is_some_and(|z| z.contains("zone-a")));
    assert!(!obj.endpoints[1].is_local && obj.endpoints[1].terminating);
    assert!(obj.trigger_time.is_some());
    // No Service label: not used.
    let s = slice(
        serde_json::json!({"metadata": {"namespace": "ns", "name": "x"}, "addressType": "IPv4", "endpoints": []}),
    );
    assert!(matches!(read_slice(&s, "n"), Err(Refused::NoServiceLabel)));
    let s = slice(
        serde_json::json!({"metadata": {"namespace": "ns", "name": "x", "labels": {"kubernetes.io/service-name": "s"}}, "addressType": "FQDN", "endpoints": []}),
    );
    assert!(matches!(read_slice(&s, "n"), Err(Refused::AddressType(_))));
}
