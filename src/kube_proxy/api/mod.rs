//! What the API says: Services and EndpointSlices read into the values the proxy keeps.

pub mod node;
pub mod objects;
pub mod store;
pub mod stream;
pub mod watch;
