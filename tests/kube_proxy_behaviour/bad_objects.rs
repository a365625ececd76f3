//! `bad-objects`: odd and extreme API objects, side by side with upstream.

use super::*;

pub(crate) fn bad_objects(h: &mut Harness) {
    let mut refused = Vec::new();
    let mut accepted = Vec::new();
    let mut try_it = |what: &str, r: Result<(), String>| match r {
        Ok(()) => accepted.push(what.to_string()),
        Err(e) => refused.push(format!("{what}: {}", cut(&e, 160))),
    };
    echo_service(h, "good", "10.96.25.1", &[POD1]);

    // Two slices of one Service with an endpoint in common.
    h.api()
        .create_service(&Svc::cluster_ip("overlap", "10.96.25.2").port("http", Tcp, 80, 8080));
    for (name, eps) in [("overlap-a", vec![POD1, POD2]), ("overlap-b", vec![POD2])] {
        let s = eps.iter().fold(
            Slice::v4(name, "overlap").port("http", Tcp, 8080),
            |s, e| s.ep(Ep::ready(e)),
        );
        try_it(
            "two slices sharing an endpoint",
            h.api().try_create_slice(&s),
        );
    }

    // A Service with 250 ports (1000-1249, all to 8080), and one slice of it with 2,000
    // ports (the API takes them): 250 name the Service's ports, 1,750 name none.
    let wide = (0..250u16).fold(Svc::cluster_ip("wide", "10.96.25.3"), |s, k| {
        s.port(&format!("p{k}"), Tcp, 1000 + k, 8080)
    });
    try_it(
        "a Service with 250 ports",
        h.api().try_create_service(&wide).map(|_| ()),
    );
    let many = (0..2000).fold(
        Slice::v4("wide-2000", "wide").ep(Ep::ready(POD1)),
        |s, k| s.port(&format!("p{k}"), Tcp, 8080),
    );
    try_it("a slice with 2,000 ports", h.api().try_create_slice(&many));

    // Names at their length limits: a 63-character Service, a 15-character port name, a
    // 253-character slice name.
    let long_svc = format!("l{}", "o".repeat(61)) + "g";
    assert_eq!(long_svc.len(), 63);
    try_it(
        "a 63-character Service name",
        h.api()
            .try_create_service(&Svc::cluster_ip(&long_svc, "10.96.25.4").port(
                "abcdefghijklmno",
                Tcp,
                80,
                8080,
            ))
            .map(|_| ()),
    );
    let long_slice = format!("s{}", "x".repeat(252));
    try_it(
        "a 253-character slice name",
        h.api().try_create_slice(
            &Slice::v4(&long_slice, &long_svc)
                .port("abcdefghijklmno", Tcp, 8080)
                .ep(Ep::ready(POD2)),
        ),
    );
    try_it(
        "a 64-character Service name",
        h.api()
            .try_create_service(
                &Svc::cluster_ip(&format!("{long_svc}x"), "10.96.25.14")
                    .port("http", Tcp, 80, 8080),
            )
            .map(|_| ()),
    );

    // A slice with 1,000 endpoints (the API's limit), all on another node.
    h.api()
        .create_service(&Svc::cluster_ip("many-eps", "10.96.25.8").port("http", Tcp, 80, 8080));
    let thousand = (0..1000u32).fold(
        Slice::v4("many-eps-1", "many-eps").port("http", Tcp, 8080),
        |s, k| s.ep(Ep::ready(&format!("10.244.{}.{}", 200 + k / 250, 1 + k % 250)).on("node-z")),
    );
    try_it(
        "a slice with 1,000 endpoints",
        h.api().try_create_slice(&thousand),
    );

    // A slice whose Service does not exist.
    try_it(
        "a slice without its Service",
        h.api().try_create_slice(
            &Slice::v4("orphan-1", "no-such-service")
                .port("http", Tcp, 8080)
                .ep(Ep::ready(POD1)),
        ),
    );

    // A LoadBalancer with malformed ingress IPs in its status.
    h.api().create_service(
        &Svc::load_balancer("lb-odd", "10.96.25.5").port_np("http", Tcp, 80, 8080, 30081),
    );
    h.api().create_slice(&echo_slice("lb-odd", &[POD1]));
    for ip in [
        "10.0.0.999",
        "not-an-ip",
        "::ffff:10.1.2.3",
        "010.1.2.4",
        "",
        "0.0.0.0",
    ] {
        try_it(
            &format!("LoadBalancer ingress ip {ip:?}"),
            h.api().try_set_lb_ingress("lb-odd", &[ip]),
        );
    }

    // Odd externalIPs, each on a Service of its own.
    for (k, ip) in [
        "::ffff:10.1.2.5",
        "010.1.2.6",
        "0.0.0.0",
        "255.255.255.255",
        "127.0.0.1",
        "fe80::1",
        "224.0.0.1",
        "10.0.0.1",
    ]
    .iter()
    .enumerate()
    {
        let svc = Svc::cluster_ip(&format!("ext-{k}"), &format!("10.96.25.{}", 20 + k))
            .port("http", Tcp, 80, 8080)
            .external_ips(&[ip]);
        try_it(
            &format!("externalIP {ip:?}"),
            h.api().try_create_service(&svc).map(|_| ()),
        );
        let _ = h
            .api()
            .try_create_slice(&echo_slice(&format!("ext-{k}"), &[POD2]));
    }

    // Odd endpoint addresses.
    h.api()
        .create_service(&Svc::cluster_ip("odd-eps", "10.96.25.6").port("http", Tcp, 80, 8080));
    for (k, addr) in [
        "010.244.1.2",
        "::ffff:10.244.1.2",
        "0.0.0.0",
        "127.0.0.1",
        "10.96.25.1",
    ]
    .iter()
    .enumerate()
    {
        try_it(
            &format!("endpoint address {addr:?}"),
            h.api().try_create_slice(
                &Slice::v4(&format!("odd-eps-{k}"), "odd-eps")
                    .port("http", Tcp, 8080)
                    .ep(Ep::ready(addr)),
            ),
        );
    }
    // A port named in the slice but not in the Service, and a protocol mismatch.
    try_it(
        "a slice port the Service lacks",
        h.api().try_create_slice(
            &Slice::v4("good-2", "good")
                .port("nosuch", Udp, 9999)
                .ep(Ep::ready(POD2)),
        ),
    );

    h.settle();
    note(format!(
        "bad-objects: the API accepted {} objects: {}",
        accepted.len(),
        accepted.join("; ")
    ));
    note(format!(
        "bad-objects: the API refused: {}",
        refused.join(" | ")
    ));
    // Both programs survive, have every transaction accepted, and program the same rules.
    for i in 0..h.sides.len() {
        let label = h.sides[i].label;
        if let Some(status) = h.sides[i].proxy.exited() {
            panic!("side {label}: the proxy exited: {status}");
        }
        let m = metrics_text(h, i);
        for fam in ["IPv4", "IPv6"] {
            let series = format!(
                "kubeproxy_sync_proxy_rules_nftables_sync_failures_total{{ip_family=\"{fam}\"}}"
            );
            let v = nsock::metric(&m, &series).unwrap_or(0.0);
            if v != 0.0 {
                h.fail(format!(
                    "side {label}: {v} refused transactions ({fam}): log:\n{}",
                    h.sides[i].proxy.log_tail(30)
                ));
            }
        }
        if h.sides[i].which == Impl::Ours {
            let skipped: Vec<&str> = m
                .lines()
                .filter(|l| l.starts_with("kubeproxy_api_objects_skipped_total"))
                .collect();
            note(format!("bad-objects: ours skipped: {skipped:?}"));
        }
    }
    h.compare_rulesets();
    h.probe(&[
        p("client", "tcp", "10.96.25.1", 80, all(&["pod1<-masq"])),
        p(
            "client",
            "tcp",
            "10.96.25.2",
            80,
            all(&["pod1<-masq", "pod2<-masq"]),
        ),
        p("client", "tcp", "10.96.25.3", 1000, all(&["pod1<-masq"])),
        p("client", "tcp", "10.96.25.3", 1249, all(&["pod1<-masq"])),
        p("client", "tcp", "10.96.25.4", 80, all(&["pod2<-masq"])),
        p("client", "tcp", "10.96.25.5", 80, all(&["pod1<-masq"])),
        // The node's own address as an externalIP (ext-7): the API takes it.
        p("client", "tcp", NODE_IP, 80, all(&["pod2<-masq"])),
    ]);
}
