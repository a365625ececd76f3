use kube_traffic::kube_proxy::model::{IpFamily, Protocol};
use kube_traffic::kube_proxy::ruleset::sync::{KernelView, SyncKind, Wanted};
use kube_traffic::kube_proxy::testing::scenario::{Net, Scenario, READY};
use std::time::Instant;
#[test]
fn scale_probe() {
    let n: usize = std::env::var("N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10000);
    let e: usize = std::env::var("E")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let net = Net::of(IpFamily::V4);
    let mut s = Scenario::default();
    for i in 0..n {
        let ip = std::net::IpAddr::from([10, 96, (i / 250) as u8, (i % 250) as u8 + 1]);
        let mut svc = s
            .service("ns", &format!("svc{i}"), ip)
            .port("p80", Protocol::Tcp, 80, 0);
        for j in 0..e {
            svc = svc.endpoint(
                "p80",
                std::net::IpAddr::from([10, 244, (j % 250) as u8, (i % 250) as u8]),
                8080,
                READY,
            );
        }
        svc.done();
    }
    let t = Instant::now();
    let view = KernelView::new();
    let plan = view.plan(
        &net.settings(),
        SyncKind::Full,
        &Wanted {
            services: &s.services,
            endpoints: &s.endpoints,
            zone: None,
        },
        &Default::default(),
    );
    let t_plan = t.elapsed();
    let t = Instant::now();
    let text = plan.tx.text();
    let t_render = t.elapsed();
    std::fs::write("/tmp/scale/full.nft", &text).unwrap();
    eprintln!(
        "services {n} x {e}: ops {} bytes {} plan {:?} render {:?}",
        plan.tx.len(),
        text.len(),
        t_plan,
        t_render
    );
}
