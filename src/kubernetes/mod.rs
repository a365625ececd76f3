//! The Kubernetes API: agent token authentication and the lease controller.

pub mod auth;
pub mod leases;

use std::path::PathBuf;

use governor::DefaultDirectRateLimiter;
use tokio::sync::OnceCell;

/// A lazily built client with client-go's rate limiting (QPS and burst).
pub struct Kube {
    kubeconfig: Option<PathBuf>,
    client: OnceCell<kube::Client>,
    limiter: DefaultDirectRateLimiter,
}

impl Kube {
    /// `qps` and `burst` of 0 mean client-go's defaults (5 and 10), as upstream.
    pub fn new(kubeconfig: Option<PathBuf>, qps: f32, burst: i64) -> Kube {
        Kube {
            kubeconfig,
            client: OnceCell::new(),
            limiter: crate::kube_client::limiter(qps, burst),
        }
    }

    /// The client, built on first use: from --kubeconfig, else the in-cluster configuration
    /// only (never a kubeconfig from a home directory).
    pub async fn client(&self) -> Result<kube::Client, String> {
        self.client
            .get_or_try_init(|| async {
                let config = match &self.kubeconfig {
                    Some(path) => {
                        let kubeconfig = kube::config::Kubeconfig::read_from(path)
                            .map_err(|e| format!("reading kubeconfig {}: {e}", path.display()))?;
                        kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                            .await
                            .map_err(|e| format!("kubeconfig {}: {e}", path.display()))?
                    }
                    None => kube::Config::incluster()
                        .map_err(|e| format!("in-cluster configuration: {e}"))?,
                };
                kube::Client::try_from(config)
                    .map_err(|e| format!("building the Kubernetes client: {e}"))
            })
            .await
            .cloned()
    }

    /// Waits for the rate limiter before an API call.
    pub async fn throttle(&self) {
        self.limiter.until_ready().await;
    }
}

/// The HTTP status of a failed call, for metric labels ("" when there was no response).
pub fn error_status(error: &kube::Error) -> (String, String) {
    match error {
        kube::Error::Api(status) => (status.code.to_string(), status.reason.clone()),
        other => (String::new(), other.to_string()),
    }
}
