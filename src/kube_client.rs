//! A Kubernetes API client as the Go programs make one: from a kubeconfig (with `--master`
//! overriding its server), else the in-cluster configuration, and client-go's client-side
//! rate limit (QPS and burst) on every request, watches and lists included.

use std::future::Future;
use std::num::NonZeroU32;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use tower::{Layer, Service};

/// client-go's defaults, which the Go programs get for 0.
pub const DEFAULT_QPS: f32 = 5.0;
pub const DEFAULT_BURST: u32 = 10;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("reading kubeconfig {path}: {message}")]
    Kubeconfig { path: String, message: String },
    #[error("--master {0:?} is not a URL")]
    Master(String),
    #[error("in-cluster configuration: {0}")]
    InCluster(String),
    #[error("building the Kubernetes client: {0}")]
    Build(String),
}

/// The connection settings: `kubeconfig` and `master` as the flags give them (empty: none).
pub async fn config(kubeconfig: Option<&Path>, master: &str) -> Result<kube::Config, ClientError> {
    let mut config = match kubeconfig {
        Some(path) => {
            let fail = |message: String| ClientError::Kubeconfig {
                path: path.display().to_string(),
                message,
            };
            let file =
                kube::config::Kubeconfig::read_from(path).map_err(|e| fail(e.to_string()))?;
            kube::Config::from_custom_kubeconfig(file, &Default::default())
                .await
                .map_err(|e| fail(e.to_string()))?
        }
        None if !master.is_empty() => {
            let url = master
                .parse::<http::Uri>()
                .map_err(|_| ClientError::Master(master.to_owned()))?;
            kube::Config::new(url)
        }
        None => kube::Config::incluster().map_err(|e| ClientError::InCluster(e.to_string()))?,
    };
    if !master.is_empty() && kubeconfig.is_some() {
        config.cluster_url = master
            .parse::<http::Uri>()
            .map_err(|_| ClientError::Master(master.to_owned()))?;
    }
    Ok(config)
}

/// A client on `config` whose requests wait for the rate limit (`qps` and `burst` of 0 or
/// less mean client-go's defaults).
pub fn client(config: kube::Config, qps: f32, burst: i64) -> Result<kube::Client, ClientError> {
    let limiter = Arc::new(limiter(qps, burst));
    let builder = kube::client::ClientBuilder::try_from(config)
        .map_err(|e| ClientError::Build(e.to_string()))?;
    Ok(builder.with_layer(&ThrottleLayer { limiter }).build())
}

pub fn limiter(qps: f32, burst: i64) -> DefaultDirectRateLimiter {
    let qps = if qps > 0.0 { qps } else { DEFAULT_QPS };
    let burst = u32::try_from(burst)
        .ok()
        .and_then(NonZeroU32::new)
        .unwrap_or(NonZeroU32::new(DEFAULT_BURST).expect("a positive default"));
    let period = Duration::from_secs_f64(1.0 / f64::from(qps));
    let quota = Quota::with_period(period)
        .unwrap_or_else(|| Quota::per_second(NonZeroU32::MIN))
        .allow_burst(burst);
    RateLimiter::direct(quota)
}

/// Holds each request until the rate limit admits it.
#[derive(Clone)]
struct ThrottleLayer {
    limiter: Arc<DefaultDirectRateLimiter>,
}

impl<S> Layer<S> for ThrottleLayer {
    type Service = Throttle<S>;

    fn layer(&self, inner: S) -> Throttle<S> {
        Throttle {
            inner,
            limiter: self.limiter.clone(),
            wait: None,
            admitted: false,
        }
    }
}

type Wait = Pin<Box<dyn Future<Output = ()> + Send>>;

struct Throttle<S> {
    inner: S,
    limiter: Arc<DefaultDirectRateLimiter>,
    wait: Option<Wait>,
    admitted: bool,
}

impl<S, R> Service<R> for Throttle<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if !self.admitted {
            let limiter = self.limiter.clone();
            let wait = self
                .wait
                .get_or_insert_with(|| Box::pin(async move { limiter.until_ready().await }));
            match wait.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    self.wait = None;
                    self.admitted = true;
                }
                Poll::Pending => return Poll::Pending,
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        self.admitted = false;
        self.inner.call(request)
    }
}
