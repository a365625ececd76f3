//! nftables as the proxy uses it: typed rules (`rule`), the table's objects and one
//! transaction of operations on them (`objects`), the names upstream gives per-port chains
//! (`names`), and the table as data with the kernel's rules for applying a transaction
//! (`table`).

pub mod exec;
pub mod json;
pub mod names;
pub mod objects;
pub mod rule;
pub mod table;
