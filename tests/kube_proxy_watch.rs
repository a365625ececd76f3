//! The proxy's watches' initial lists against a real kube-apiserver v1.37.2: streamed as watch
//! events where the apiserver serves them (its default), listed in pages where it refuses them
//! (the WatchList feature turned off); either way every object arrives once and the list ends.
//!
//! Needs root and Go as the kube-proxy harness does (tests/kube/build.sh); skipped without
//! them, except under CI=true, where that fails.
#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod kube_proxy;

use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::api::PostParams;
use kube::runtime::watcher::{self, Event};
use kube::Api;
use kube_proxy::api::Apiserver;
use kube_traffic::kube_proxy::api::stream::Watch;
use tokio_util::sync::CancellationToken;

const RANGE: &str = "--service-cluster-ip-range=10.96.0.0/16,fd00:10:96::/112";

#[test]
fn initial_lists_stream_or_fall_back_to_pages() {
    if !kube_proxy::preflight() {
        return;
    }
    for (extra, streams) in [
        (RANGE.to_string(), true),
        (format!("{RANGE} --feature-gates=WatchList=false"), false),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let api = Apiserver::start_with(dir.path(), &[("KUBE_APISERVER_EXTRA_ARGS", &extra)]);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let kubeconfig = kube::config::Kubeconfig::read_from(api.get("KUBECONFIG")).unwrap();
            let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .unwrap();
            let client = kube::Client::try_from(config).unwrap();
            // Seven Services and the apiserver's own: four pages of two when paged.
            let services: Api<Service> = Api::namespaced(client.clone(), "default");
            let mut expected = vec!["default/kubernetes".to_string()];
            for i in 0..7 {
                let svc: Service = serde_json::from_value(serde_json::json!({
                    "apiVersion": "v1", "kind": "Service",
                    "metadata": {"name": format!("s{i}")},
                    "spec": {"ports": [{"port": 80, "protocol": "TCP"}]}
                }))
                .unwrap();
                services.create(&PostParams::default(), &svc).await.unwrap();
                expected.push(format!("default/s{i}"));
            }

            let stop = CancellationToken::new();
            let config = watcher::Config::default().page_size(2);
            let mut watch = Watch::new(Api::<Service>::all(client), config, "Service");
            let mut seen = Vec::new();
            let mut errors = 0;
            let listed = tokio::time::timeout(Duration::from_secs(60), async {
                loop {
                    match watch.next(&stop).await.expect("the watch runs") {
                        Ok(Event::Init) => seen.clear(),
                        Ok(Event::InitApply(s)) => seen.push(format!(
                            "{}/{}",
                            s.metadata.namespace.unwrap_or_default(),
                            s.metadata.name.unwrap_or_default()
                        )),
                        Ok(Event::InitDone) => return,
                        Ok(_) => {}
                        Err(e) => {
                            eprintln!("watch error: {e}");
                            errors += 1;
                        }
                    }
                }
            })
            .await;
            assert!(
                listed.is_ok(),
                "{extra}: the initial list did not end in 60 s"
            );
            seen.sort();
            expected.sort();
            assert_eq!(seen, expected, "{extra}: every Service once");
            assert_eq!(watch.streaming(), streams, "{extra}");
            // Refused once, then paged; or streamed with no error at all.
            assert_eq!(errors, usize::from(!streams), "{extra}");
        });
        drop(api);
    }
}
