//! Conntrack for kube-proxy (upstream's `pkg/proxy/conntrack`): the removal of stale UDP
//! entries after a sync, and the conntrack sysctls set at start-up.
//!
//! - `flow`: a conntrack entry as data;
//! - `messages`: ctnetlink's requests and answers, without I/O;
//! - `netlink`: the client (`Conntrack`): dump one family's table, delete one entry;
//! - `cleanup`: which entries are stale, a pure function of the proxier's state;
//! - `metrics`: the reconciler's two Prometheus families;
//! - `sysctls`: `nf_conntrack_max`, the hash size and the timeouts;
//! - here: `clean_stale`, which dumps, decides, deletes and counts.

pub mod cleanup;
pub mod flow;
mod messages;
pub mod metrics;
pub mod netlink;
pub mod sysctls;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use crate::gofmt::GoDuration;
use crate::kube_proxy::model::{
    Endpoint, IpFamily, Protocol, ServiceName, ServicePort, ServicePortName,
};

pub use cleanup::stale_flows;
pub use flow::{Flow, Tuple};
pub use metrics::ConntrackMetrics;
pub use netlink::{Conntrack, ConntrackError, Deletion, Dump};
pub use sysctls::{set_sysctls, ConntrackSettings, KernelRoots, SysctlError};

/// The conntrack table as the reconciler uses it: the kernel's (`Conntrack`), or a test's.
pub trait ConntrackTable {
    fn dump(
        &mut self,
        family: IpFamily,
        protocol: Option<Protocol>,
    ) -> Result<Dump, ConntrackError>;
    fn delete(&mut self, flow: &Flow) -> Result<Deletion, ConntrackError>;
}

impl ConntrackTable for Conntrack {
    fn dump(
        &mut self,
        family: IpFamily,
        protocol: Option<Protocol>,
    ) -> Result<Dump, ConntrackError> {
        Conntrack::dump(self, family, protocol)
    }

    fn delete(&mut self, flow: &Flow) -> Result<Deletion, ConntrackError> {
        Conntrack::delete(self, flow)
    }
}

/// One reconciliation's outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cleaned {
    /// Stale entries removed, those already gone when deleted included (as upstream counts).
    pub deleted: usize,
    pub duration: Duration,
}

/// Removes the stale UDP entries of `family` from the conntrack table of the calling
/// thread's network namespace (see `cleanup::stale_flows` for which), and counts the run in
/// `metrics`. It logs what upstream logs, errors included, so the caller need not log them
/// again. Blocking: run it off the async runtime.
pub fn clean_stale(
    family: IpFamily,
    services: &BTreeMap<ServiceName, Vec<ServicePort>>,
    endpoints: &HashMap<ServicePortName, Vec<Endpoint>>,
    metrics: &ConntrackMetrics,
) -> Result<Cleaned, ConntrackError> {
    let mut table = Conntrack::open().inspect_err(|e| {
        tracing::error!(err = %e, "Failed to list conntrack entries");
    })?;
    clean_stale_in(&mut table, family, services, endpoints, metrics)
}

/// `clean_stale` on a given table.
pub fn clean_stale_in<T: ConntrackTable>(
    table: &mut T,
    family: IpFamily,
    services: &BTreeMap<ServiceName, Vec<ServicePort>>,
    endpoints: &HashMap<ServicePortName, Vec<Endpoint>>,
    metrics: &ConntrackMetrics,
) -> Result<Cleaned, ConntrackError> {
    let start = Instant::now();
    tracing::info!(v = 4, ipFamily = %family, "Started to reconcile conntrack entries");
    // Only UDP entries can be stale: the kernel leaves the others out of the dump.
    let dump = table.dump(family, Some(Protocol::Udp)).inspect_err(|e| {
        tracing::error!(err = %e, "Failed to list conntrack entries");
    })?;
    if dump.interrupted {
        // Upstream logs this at V2; our error lines show at every verbosity.
        tracing::error!(
            err = "results may be incomplete or inconsistent",
            "received a partial result, continuing to clean with partial result"
        );
    }
    if dump.skipped > 0 {
        tracing::warn!(ipFamily = %family, entries = dump.skipped, "Skipped conntrack entries that could not be decoded");
    }
    let (mut deleted, mut failed, mut first_error) = (0, 0, None);
    for flow in stale_flows(services, endpoints, &dump.flows) {
        tracing::trace!(flow = %flow, "Deleting conntrack entry");
        match table.delete(flow) {
            Ok(Deletion::Deleted | Deletion::AlreadyGone) => deleted += 1,
            Err(e) => {
                failed += 1;
                first_error.get_or_insert(e);
            }
        }
    }
    let took = start.elapsed();
    metrics.observe(family, took, deleted);
    if let Some(first) = first_error {
        let err = ConntrackError::Incomplete {
            deleted,
            failed,
            first: Box::new(first),
        };
        tracing::error!(err = %err, ipFamily = %family, entriesDeleted = deleted, took = %GoDuration(took), "Failed to clear all conntrack entries");
        return Err(err);
    }
    tracing::info!(v = 4, ipFamily = %family, entriesDeleted = deleted, took = %GoDuration(took), "Finished reconciling conntrack entries");
    Ok(Cleaned {
        deleted,
        duration: took,
    })
}

#[cfg(test)]
mod tests;
