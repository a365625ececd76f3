//! The wire vocabulary: packet builders, packet type names and every error string this server
//! sends on the wire. The bottom of the stack: it imports only the generated `proto` types, and
//! src, tests and benches all build packets here, so the three cannot drift apart.

use bytes::Bytes;

use crate::proto::packet::Payload;
use crate::proto::{
    CloseDial, CloseRequest, CloseResponse, Data, DialRequest, DialResponse, Packet, PacketType,
};

/// DIAL_RSP error when no agent serves the destination (upstream's text).
pub const NO_AGENT_AVAILABLE: &str = "No agent available";
/// DIAL_RSP error when the agent did not answer within --backend-dial-timeout.
pub const DIAL_TIMEOUT: &str = "timed out waiting for backend dial";
/// CLOSE_RSP error for DATA on a stream that never dialed.
pub const BACKEND_NOT_INITIALIZED: &str = "backend not initialized";
/// CLOSE_RSP error for CLOSE_REQ on a stream that never dialed.
pub const BACKEND_UNINITIALIZED: &str = "backend uninitialized";
/// CLOSE_RSP error for DATA carrying another tunnel's connect id.
pub const MISMATCHED_CONNECTION_IDS: &str = "mismatched connection IDs";
/// CLOSE_RSP error when the CLOSE_REQ could not be passed to the agent.
pub const CLOSE_REQ_FAILED: &str = "CLOSE_REQ to backend failed";
/// CLOSE_RSP error for CLOSE_REQ naming a connection the stream does not own.
pub const UNRECOGNIZED_CONNECT_ID: &str = "unrecognized connectID";
/// DIAL_RSP error while the server drains (beyond upstream, which keeps accepting).
pub const SHUTTING_DOWN: &str = "konnectivity-server is shutting down: no new dials accepted";
/// Sent to a frontend whose dial was pending when its agent disconnected. Upstream leaves
/// such a dial hanging until the client's own timeout; we answer at once.
pub const AGENT_DISCONNECTED_DURING_DIAL: &str =
    "agent disconnected before answering the dial request";
/// DIAL_RSP error when a frontend reuses a dial id that is still pending on the agent.
pub const DUPLICATE_DIAL_ID: &str = "a dial with this id is already pending";
/// DIAL_RSP error when an agent answers a dial with a connect id that is still live.
pub const DUPLICATE_CONNECT_ID: &str = "agent reused a live connection id";
/// Sent with CLOSE_RSP when the server's queue budget is exhausted and this frontend, not
/// reading, holds the most unread data.
pub const FRONTEND_QUEUE_BUDGET: &str =
    "tunnel closed: the server's queue budget is exhausted and this frontend was not reading";
/// Sent with CLOSE_RSP when a frontend stops draining its queue.
pub const FRONTEND_QUEUE_OVERFLOW: &str =
    "tunnel closed: the frontend did not keep up with the data sent to it";

/// CLOSE_RSP error from the agent for CLOSE_REQ naming a connection it does not have
/// (upstream's agent text, capitalised as it is).
pub const UNKNOWN_CONNECT_ID: &str = "Unknown connectID";
/// CLOSE_RSP error from our agent when a destination's queue passed its hard limit.
pub const ENDPOINT_QUEUE_OVERFLOW: &str =
    "tunnel closed: the destination did not keep up with the data sent to it";
/// CLOSE_RSP error from our agent when a write to the destination made no progress.
pub const ENDPOINT_WRITE_STALLED: &str =
    "tunnel closed: the destination stopped reading the data sent to it";
/// CLOSE_RSP error from our agent when its queue budget is exhausted.
pub const ENDPOINT_QUEUE_BUDGET: &str =
    "tunnel closed: the agent's queue budget is exhausted and this destination was not reading";
/// DIAL_RSP error from our agent when too many dials are already in progress.
pub const TOO_MANY_DIALS: &str = "agent has too many dials in progress";

/// The upstream name of a packet type (`DIAL_REQ`, ...), or `Unknown`.
pub fn packet_type_name(kind: i32) -> &'static str {
    PacketType::try_from(kind)
        .map(|t| t.as_str_name())
        .unwrap_or("Unknown")
}

/// The payload bytes a DATA packet carries; 0 for every other packet.
pub fn data_len(packet: &Packet) -> usize {
    match &packet.payload {
        Some(Payload::Data(d)) => d.data.len(),
        _ => 0,
    }
}

pub fn packet(kind: PacketType, payload: Payload) -> Packet {
    Packet {
        r#type: kind as i32,
        payload: Some(payload),
    }
}

pub fn dial_request(address: &str, random: i64) -> Packet {
    packet(
        PacketType::DialReq,
        Payload::DialRequest(DialRequest {
            protocol: "tcp".into(),
            address: address.into(),
            random,
        }),
    )
}

pub fn dial_response(random: i64, connect_id: i64, error: &str) -> Packet {
    packet(
        PacketType::DialRsp,
        Payload::DialResponse(DialResponse {
            error: error.to_string(),
            connect_id,
            random,
        }),
    )
}

pub fn dial_response_error(random: i64, error: &str) -> Packet {
    dial_response(random, 0, error)
}

pub fn data(connect_id: i64, bytes: impl Into<Bytes>) -> Packet {
    packet(
        PacketType::Data,
        Payload::Data(Data {
            connect_id,
            error: String::new(),
            data: bytes.into(),
        }),
    )
}

pub fn close_request(connect_id: i64) -> Packet {
    packet(
        PacketType::CloseReq,
        Payload::CloseRequest(CloseRequest { connect_id }),
    )
}

pub fn close_response(connect_id: i64, error: &str) -> Packet {
    packet(
        PacketType::CloseRsp,
        Payload::CloseResponse(CloseResponse {
            error: error.to_string(),
            connect_id,
        }),
    )
}

pub fn drain() -> Packet {
    packet(PacketType::Drain, Payload::Drain(crate::proto::Drain {}))
}

pub fn dial_close(random: i64) -> Packet {
    packet(
        PacketType::DialCls,
        Payload::CloseDial(CloseDial { random }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_upstream() {
        assert_eq!(packet_type_name(PacketType::DialReq as i32), "DIAL_REQ");
        assert_eq!(packet_type_name(PacketType::CloseRsp as i32), "CLOSE_RSP");
        assert_eq!(packet_type_name(99), "Unknown");
    }

    #[test]
    fn data_len_counts_only_data() {
        assert_eq!(data_len(&data(1, vec![0u8; 7])), 7);
        assert_eq!(data_len(&close_request(1)), 0);
    }
}
