//! How one transaction went in, whichever way it reached the kernel.

use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Applied {
    /// The transaction's operations, as `Transaction::len` counts them.
    pub operations: usize,
    /// The bytes sent: the batch's netlink messages, or the text given to `nft -f`.
    pub bytes: usize,
    pub elapsed: Duration,
}
