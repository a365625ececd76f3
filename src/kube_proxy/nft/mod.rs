//! nftables as the proxy uses it: typed rules (`rule`), the table's objects and one
//! transaction of operations on them (`objects`), the names upstream gives per-port chains
//! (`names`), and the table as data with the kernel's rules for applying a transaction
//! (`table`). A transaction reaches the kernel in one of two ways: through `nft -f -`
//! (`exec`), or as nf_tables netlink messages written here (`netlink`).

pub mod applied;
pub mod exec;
pub mod json;
pub mod names;
pub mod netlink;
pub mod objects;
pub mod rule;
pub mod stages;
pub mod table;
