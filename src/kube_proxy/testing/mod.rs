//! Scenarios for the proxy's tests: Services and endpoints built in a line each, rendered
//! into a table, and the packet-flow cases that check the table. Used by the unit tests and
//! by the integration tests that replay the same cases on a real kernel (`kube-proxy trace`
//! over what the kernel holds must give the same answers). Not a stable interface.

pub mod flows;
pub mod scenario;
