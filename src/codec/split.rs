//! A packet's gRPC message with its DATA payload left where it is.
//!
//! tonic encodes every message into one buffer, so each byte a tunnel carries is copied there
//! once more on its way to h2. A DATA packet's payload is the last field of its encoding
//! (`Packet.data` is field 4, and `Data.data` is field 3 of it, after `connectID` and
//! `error`), so the message can be sent as two chunks: everything up to the payload's length
//! prefix, written into the buffer, and the payload itself, handed to h2 as the `Bytes` it
//! already is. The bytes on the wire are prost's, exactly.

use bytes::{BufMut, Bytes, BytesMut};
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, WireType};
use prost::Message;

use crate::proto::packet::Payload;
use crate::proto::Packet;

/// The smallest payload sent as a chunk of its own. Below it a copy costs less than the
/// extra DATA frame and the bookkeeping of a second chunk.
pub const SPLIT_PAYLOAD: usize = 4096;

/// The gRPC message prefix: the compressed flag and the message length.
const PREFIX: usize = 5;

const PACKET_TYPE_FIELD: u32 = 1;
const PACKET_DATA_FIELD: u32 = 4;
const DATA_PAYLOAD_FIELD: u32 = 3;

/// Appends `packet`'s gRPC message (prefix and prost encoding) to `buf`. A DATA payload of at
/// least [`SPLIT_PAYLOAD`] bytes is not copied: it is returned, and belongs right after what
/// `buf` holds now.
pub fn encode(mut packet: Packet, buf: &mut BytesMut) -> Option<Bytes> {
    let payload = match &mut packet.payload {
        Some(Payload::Data(data)) if data.data.len() >= SPLIT_PAYLOAD => {
            std::mem::take(&mut data.data)
        }
        _ => {
            encode_whole(&packet, buf);
            return None;
        }
    };
    let Some(Payload::Data(head)) = &packet.payload else {
        unreachable!("the payload was taken from a DATA packet");
    };
    // `head` now encodes as the Data message less its payload field (proto3 leaves out an
    // empty `bytes`), which follows it last.
    let payload_field = key_len(DATA_PAYLOAD_FIELD) + encoded_len_varint(payload.len() as u64);
    let data_len = head.encoded_len() + payload_field + payload.len();
    let type_len = type_field_len(packet.r#type);
    let message_len =
        type_len + key_len(PACKET_DATA_FIELD) + encoded_len_varint(data_len as u64) + data_len;
    buf.reserve(PREFIX + message_len - payload.len());
    put_prefix(buf, message_len);
    if packet.r#type != 0 {
        prost::encoding::int32::encode(PACKET_TYPE_FIELD, &packet.r#type, buf);
    }
    encode_key(PACKET_DATA_FIELD, WireType::LengthDelimited, buf);
    encode_varint(data_len as u64, buf);
    head.encode_raw(buf);
    encode_key(DATA_PAYLOAD_FIELD, WireType::LengthDelimited, buf);
    encode_varint(payload.len() as u64, buf);
    Some(payload)
}

/// Appends `packet`'s whole gRPC message to `buf`, as tonic writes it.
fn encode_whole(packet: &Packet, buf: &mut BytesMut) {
    let len = packet.encoded_len();
    buf.reserve(PREFIX + len);
    put_prefix(buf, len);
    packet.encode_raw(buf);
}

/// The `type` field as prost writes it: left out when 0 (DIAL_REQ), as proto3 wants.
fn type_field_len(kind: i32) -> usize {
    if kind == 0 {
        0
    } else {
        prost::encoding::int32::encoded_len(PACKET_TYPE_FIELD, &kind)
    }
}

fn put_prefix(buf: &mut BytesMut, len: usize) {
    // Uncompressed. A message never nears 4 GiB: payloads are one read of a socket, or one
    // decoded message (at most 4 MiB).
    buf.put_u8(0);
    buf.put_u32(u32::try_from(len).expect("a gRPC message under 4 GiB"));
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::proto::{Data, PacketType};
    use crate::wire;

    /// What tonic would have sent: the prefix and prost's encoding of the whole packet.
    pub(crate) fn tonic_bytes(packet: &Packet) -> Vec<u8> {
        let body = packet.encode_to_vec();
        let mut out = vec![0u8];
        out.extend_from_slice(&(body.len() as u32).to_be_bytes());
        out.extend_from_slice(&body);
        out
    }

    fn split_bytes(packet: Packet) -> (Vec<u8>, bool) {
        let mut buf = BytesMut::new();
        let payload = encode(packet, &mut buf);
        let split = payload.is_some();
        let mut out = buf.to_vec();
        if let Some(payload) = payload {
            out.extend_from_slice(&payload);
        }
        (out, split)
    }

    fn data_packet(kind: i32, connect_id: i64, error: &str, len: usize) -> Packet {
        let payload: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
        Packet {
            r#type: kind,
            payload: Some(Payload::Data(Data {
                connect_id,
                error: error.into(),
                data: payload.into(),
            })),
        }
    }

    #[test]
    fn split_messages_are_the_bytes_tonic_sends() {
        let lengths = [
            0,
            1,
            SPLIT_PAYLOAD - 1,
            SPLIT_PAYLOAD,
            SPLIT_PAYLOAD + 1,
            16_383,
            16_384,
            32 * 1024,
            65_536,
            2_097_152 + 17,
        ];
        let ids = [0, 1, 127, 128, 1 << 40, -1, i64::MIN, i64::MAX];
        // DATA as sent, and the odd ones a peer could build: another type, a negative one,
        // an error beside the payload.
        let kinds = [PacketType::Data as i32, 0, 1, 127, 128, -5];
        let mut splits = 0;
        for len in lengths {
            for id in ids {
                for kind in kinds {
                    for error in ["", "e", &"x".repeat(200)] {
                        let packet = data_packet(kind, id, error, len);
                        let (got, split) = split_bytes(packet.clone());
                        assert_eq!(got, tonic_bytes(&packet), "len {len} id {id} type {kind}");
                        assert_eq!(split, len >= SPLIT_PAYLOAD);
                        splits += usize::from(split);
                    }
                }
            }
        }
        assert!(splits > 0);
    }

    #[test]
    fn control_packets_and_small_data_are_encoded_whole() {
        for packet in [
            wire::close_request(42),
            wire::data(7, vec![1u8; 100]),
            Packet::default(),
        ] {
            let (got, split) = split_bytes(packet.clone());
            assert!(!split);
            assert_eq!(got, tonic_bytes(&packet));
        }
    }

    #[test]
    fn a_payload_is_handed_over_without_a_copy() {
        let payload = Bytes::from(vec![9u8; 40_000]);
        let mut buf = BytesMut::new();
        let out = encode(wire::data(3, payload.clone()), &mut buf).expect("split");
        assert_eq!(out.as_ptr(), payload.as_ptr(), "the same bytes, not a copy");
        assert!(
            buf.len() < 32,
            "only the prefix and the fields before the payload"
        );
    }

    #[test]
    fn messages_append_after_what_the_buffer_holds() {
        let mut buf = BytesMut::new();
        let first = wire::close_request(1);
        assert!(encode(first.clone(), &mut buf).is_none());
        let second = wire::data(2, vec![5u8; SPLIT_PAYLOAD]);
        let payload = encode(second.clone(), &mut buf).expect("split");
        let mut got = buf.to_vec();
        got.extend_from_slice(&payload);
        let mut want = tonic_bytes(&first);
        want.extend_from_slice(&tonic_bytes(&second));
        assert_eq!(got, want);
    }
}
