//! The `process_*` families, as Go's client_golang exposes them for a process.

/// The `process_*` families Go's client_golang registers, for a registry of either program.
pub(crate) fn collectors() -> Vec<Box<dyn prometheus::core::Collector>> {
    vec![
        Box::new(prometheus::process_collector::ProcessCollector::for_self()),
        Box::new(ProcessExtras::new()),
    ]
}

/// The process families Go's client_golang collector has and the prometheus crate's lacks:
/// network bytes from `/proc/self/net/netstat` (`IpExt` InOctets/OutOctets, as procfs reads
/// them) and the address-space limit (RLIMIT_AS; unlimited is 2^64-1, as Go reports it).
struct ProcessExtras {
    receive: prometheus::core::Desc,
    transmit: prometheus::core::Desc,
    max_vsize: prometheus::core::Desc,
}

impl ProcessExtras {
    fn new() -> ProcessExtras {
        let desc = |name: &str, help: &str| {
            prometheus::core::Desc::new(name.into(), help.into(), vec![], Default::default())
                .expect("a valid metric definition")
        };
        ProcessExtras {
            receive: desc(
                "process_network_receive_bytes_total",
                "Number of bytes received by the process over the network.",
            ),
            transmit: desc(
                "process_network_transmit_bytes_total",
                "Number of bytes sent by the process over the network.",
            ),
            max_vsize: desc(
                "process_virtual_memory_max_bytes",
                "Maximum amount of virtual memory available in bytes.",
            ),
        }
    }
}

/// `IpExt` InOctets and OutOctets from a `/proc/<pid>/net/netstat` text.
pub fn ip_octets(netstat: &str) -> Option<(f64, f64)> {
    let mut lines = netstat.lines().filter(|l| l.starts_with("IpExt:"));
    let names = lines.next()?.split_whitespace();
    let values = lines.next()?.split_whitespace();
    let (mut rx, mut tx) = (0.0, 0.0);
    for (name, value) in names.zip(values) {
        match name {
            "InOctets" => rx = value.parse().ok()?,
            "OutOctets" => tx = value.parse().ok()?,
            _ => {}
        }
    }
    Some((rx, tx))
}

impl prometheus::core::Collector for ProcessExtras {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        vec![&self.max_vsize, &self.receive, &self.transmit]
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        use prometheus::proto::{Counter, Gauge as GaugeValue, Metric, MetricFamily, MetricType};
        let family = |desc: &prometheus::core::Desc, kind: MetricType, value: f64| {
            let mut metric = Metric::default();
            if kind == MetricType::COUNTER {
                let mut counter = Counter::default();
                counter.set_value(value);
                metric.set_counter(counter);
            } else {
                let mut gauge = GaugeValue::default();
                gauge.set_value(value);
                metric.set_gauge(gauge);
            }
            let mut family = MetricFamily::default();
            family.set_name(desc.fq_name.clone());
            family.set_help(desc.help.clone());
            family.set_field_type(kind);
            family.set_metric(vec![metric]);
            family
        };
        let mut families = Vec::new();
        if let Ok((soft, _)) = rlimit::getrlimit(rlimit::Resource::AS) {
            families.push(family(&self.max_vsize, MetricType::GAUGE, soft as f64));
        }
        if let Some((rx, tx)) = std::fs::read_to_string("/proc/self/net/netstat")
            .ok()
            .as_deref()
            .and_then(ip_octets)
        {
            families.push(family(&self.receive, MetricType::COUNTER, rx));
            families.push(family(&self.transmit, MetricType::COUNTER, tx));
        }
        families
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netstat_octets_are_read_from_ip_ext() {
        let netstat =
            "TcpExt: A B\nTcpExt: 1 2\nIpExt: InNoRoutes InOctets OutOctets\nIpExt: 0 1234 5678\n";
        assert_eq!(ip_octets(netstat), Some((1234.0, 5678.0)));
        assert_eq!(ip_octets("TcpExt: A\nTcpExt: 1\n"), None);
    }
}
