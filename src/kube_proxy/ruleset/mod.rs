//! The ruleset, rendered from the wanted state without I/O: the fixed objects (`skeleton`),
//! one Service port's chains and elements (`port`), and the plan of one sync against what the
//! kernel holds (`sync`), and what to send instead of a full sync to adopt the table a
//! previous run left (`adopt`). `settings` holds what the ruleset depends on besides Services.

pub mod adopt;
pub mod port;
pub mod settings;
pub mod skeleton;
pub mod sync;
