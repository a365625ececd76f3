//! `probe.json` is what nft 1.0.6 on Linux 6.18 listed after loading `probe.nft` (rules of
//! every kind a kube-proxy table holds).

use super::*;

fn probe() -> Table {
    parse_table(include_str!("probe.json"), IpFamily::V4).expect("the probe parses")
}

#[test]
fn every_statement_of_the_probe_is_understood() {
    let table = probe();
    let others: Vec<String> = table
        .chains
        .iter()
        .flat_map(|(name, c)| c.rules.iter().map(move |r| (name, r)))
        .flat_map(|(name, r)| {
            r.stmts.iter().filter_map(move |s| match s {
                Stmt::Other(text) => Some(format!("{name}: {text}")),
                _ => None,
            })
        })
        .collect();
    assert!(others.is_empty(), "{others:#?}");
}

#[test]
fn the_probe_reads_back_as_written() {
    let table = probe();
    // nft 1.0.6 leaves a table's comment out of its JSON.
    assert_eq!(table.comment, None);
    let base = table.chains["filter-prerouting-pre-dnat"]
        .base
        .expect("a base chain");
    assert_eq!(
        (base.kind, base.hook, base.priority),
        (ChainType::Filter, Hook::Prerouting, -110)
    );
    let text = |chain: &str| -> Vec<String> {
        table
            .rules(chain)
            .iter()
            .map(|r| r.text(IpFamily::V4))
            .collect()
    };
    assert_eq!(
        text("masquerading"),
        [
            "mark and 0x00004000 != 0 mark set mark xor 0x00004000 masquerade fully-random",
            "ct status dnat ip saddr . ip daddr . meta l4proto . th dport @hairpin-connections masquerade fully-random",
        ]
    );
    assert_eq!(
        text("services")[..3],
        [
            "ip daddr @cluster-ips ip saddr != 10.0.0.0/8 mark set mark or 0x00004000",
            "ip daddr . meta l4proto . th dport vmap @service-ips",
            "fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports",
        ]
    );
    assert_eq!(
        text("service-ULMVA6XW-ns1/svc1/tcp/p80"),
        ["meta l4proto tcp dnat ip addr . port to numgen random mod 2 map { 0 : 10.180.0.1 . 80 , 1 : 10.180.0.2 . 80 }"]
    );
    assert_eq!(
        text("firewall-ULMVA6XW-ns1/svc1/tcp/p80"),
        ["ip saddr != { 5.6.7.8 , 203.0.113.0/25 } drop"]
    );
    assert_eq!(
        text("endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80"),
        [
            "update @affinity-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 { ip saddr }",
            "meta l4proto tcp dnat to 10.180.0.1:80",
        ]
    );
    assert_eq!(
        table.rules("external-ULMVA6XW-ns1/svc1/tcp/p80")[0]
            .comment
            .as_deref(),
        Some("short-circuit pod traffic")
    );
    let no_ep = &table.sets["no-endpoint-services"];
    assert_eq!(no_ep.spec.kind, SetKind::Map);
    assert_eq!(
        no_ep.spec.key_type,
        "ipv4_addr . inet_proto . inet_service : verdict"
    );
    let key = Key::AddrPort("172.30.0.42".parse().unwrap(), Protocol::Tcp, 80);
    assert_eq!(
        no_ep.elements[&key].comment.as_deref(),
        Some("ns2/svc2:p80")
    );
    assert_eq!(
        no_ep.elements[&key].value,
        Some(Verdict::Goto("reject-chain".into()))
    );
    let hairpin = Key::Hairpin(
        "10.180.0.1".parse().unwrap(),
        "10.180.0.1".parse().unwrap(),
        Protocol::Tcp,
        80,
    );
    assert!(table.sets["hairpin-connections"]
        .elements
        .contains_key(&hairpin));
    assert_eq!(
        table.sets["affinity-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80"]
            .spec
            .timeout_secs,
        Some(10800)
    );
}

#[test]
fn a_family_without_its_table_is_an_error() {
    assert!(matches!(
        parse_table(include_str!("probe.json"), IpFamily::V6),
        Err(JsonError::NoTable("ip6"))
    ));
    assert!(matches!(
        parse_table("{}", IpFamily::V4),
        Err(JsonError::Shape)
    ));
}
