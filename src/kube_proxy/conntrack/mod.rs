//! Conntrack for kube-proxy (upstream's `pkg/proxy/conntrack`): the removal of stale UDP
//! entries after a sync, and the conntrack sysctls set at start-up.
//!
//! - `flow`: a conntrack entry as data;
//! - `messages`: ctnetlink's requests and answers, without I/O;
//! - `netlink`: the client (`Conntrack`): dump one family's table, delete one entry;
//! - `cleanup`: which entries are stale, a pure function of the proxier's state.

pub mod cleanup;
pub mod flow;
mod messages;
pub mod netlink;

pub use cleanup::stale_flows;
pub use flow::{Flow, Tuple};
pub use netlink::{Conntrack, ConntrackError, Deletion, Dump};
