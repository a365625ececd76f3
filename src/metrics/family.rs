//! Creating a metric family and registering it are one step: a family that is declared is
//! exposed, and a family cannot be exposed twice.

use prometheus::core::Collector;
use prometheus::{
    Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry,
};

/// Every family's name starts `konnectivity_network_proxy_<subsystem>_`, as upstream's.
const NAMESPACE: &str = "konnectivity_network_proxy";

/// Makes families under one subsystem (`server`, `agent`) and registers each as it is made.
pub(crate) struct Families<'r> {
    registry: &'r Registry,
    namespace: &'static str,
    subsystem: &'static str,
}

impl<'r> Families<'r> {
    /// Konnectivity's families: `konnectivity_network_proxy_<subsystem>_<name>`.
    pub(crate) fn new(registry: &'r Registry, subsystem: &'static str) -> Families<'r> {
        Families::with_namespace(registry, NAMESPACE, subsystem)
    }

    /// Families under another namespace (empty: none, as kube-proxy's `kubeproxy_<name>`).
    pub(crate) fn with_namespace(
        registry: &'r Registry,
        namespace: &'static str,
        subsystem: &'static str,
    ) -> Families<'r> {
        Families {
            registry,
            namespace,
            subsystem,
        }
    }

    fn opts(&self, name: &str, help: &str) -> Opts {
        Opts::new(name, help)
            .namespace(self.namespace)
            .subsystem(self.subsystem)
    }

    fn histogram_opts(&self, name: &str, help: &str, buckets: Option<&[f64]>) -> HistogramOpts {
        let opts = HistogramOpts::from(self.opts(name, help));
        match buckets {
            Some(buckets) => opts.buckets(buckets.to_vec()),
            None => opts,
        }
    }

    /// Registers `metric` and returns it. Names are fixed in the code, so a clash or an invalid
    /// definition is a programming error that every test run would hit at once.
    fn register<C: Collector + Clone + 'static>(&self, metric: prometheus::Result<C>) -> C {
        let metric = metric.expect("a valid metric definition");
        self.registry
            .register(Box::new(metric.clone()))
            .expect("metric names are unique");
        metric
    }

    pub(crate) fn counter(&self, name: &str, help: &str) -> IntCounter {
        self.register(IntCounter::with_opts(self.opts(name, help)))
    }

    pub(crate) fn counter_vec(&self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        self.register(IntCounterVec::new(self.opts(name, help), labels))
    }

    pub(crate) fn gauge(&self, name: &str, help: &str) -> IntGauge {
        self.register(IntGauge::with_opts(self.opts(name, help)))
    }

    pub(crate) fn gauge_vec(&self, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
        self.register(IntGaugeVec::new(self.opts(name, help), labels))
    }

    /// A float gauge, with labels whose values never change (`version` of `build_info`).
    pub(crate) fn float_gauge(
        &self,
        name: &str,
        help: &str,
        const_labels: &[(&str, &str)],
    ) -> Gauge {
        let opts = const_labels
            .iter()
            .fold(self.opts(name, help), |opts, (label, value)| {
                opts.const_label(*label, *value)
            });
        self.register(Gauge::with_opts(opts))
    }

    pub(crate) fn histogram(&self, name: &str, help: &str, buckets: &[f64]) -> Histogram {
        self.register(Histogram::with_opts(self.histogram_opts(
            name,
            help,
            Some(buckets),
        )))
    }

    /// `buckets` None: the client library's default buckets, as upstream's family has.
    pub(crate) fn histogram_vec(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
        buckets: Option<&[f64]>,
    ) -> HistogramVec {
        self.register(HistogramVec::new(
            self.histogram_opts(name, help, buckets),
            labels,
        ))
    }

    /// A float gauge with labels (timestamps in seconds).
    pub(crate) fn float_gauge_vec(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> prometheus::GaugeVec {
        self.register(prometheus::GaugeVec::new(self.opts(name, help), labels))
    }

    /// A collector that is not a family of ours (the `process_*` ones).
    pub(crate) fn collector(&self, collector: Box<dyn Collector>) {
        self.registry
            .register(collector)
            .expect("metric names are unique");
    }
}
