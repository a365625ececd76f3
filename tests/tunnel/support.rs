//! What every area of the tunnel tests uses: the shared harness, the wire types and upstream's
//! error texts, and the destination the test dials.

pub use crate::common::*;
pub use kube_traffic::proto::packet::Payload;
pub use kube_traffic::proto::{DialResponse, Packet, PacketType};
pub use kube_traffic::testing::DialFailure;
pub use kube_traffic::wire::{
    AGENT_DISCONNECTED_DURING_DIAL, BACKEND_NOT_INITIALIZED, BACKEND_UNINITIALIZED, DIAL_TIMEOUT,
    MISMATCHED_CONNECTION_IDS, NO_AGENT_AVAILABLE,
};

pub const ADDRESS: &str = "10.0.0.1:443";
