//! ctnetlink's messages as the client sends and reads them: the requests (a dump, with the
//! kernel-side protocol filter; a delete naming one entry), the netlink messages of one
//! datagram, an answer's status, and a dumped entry as a `Flow`. No I/O.

use netlink_packet_core::{
    DecodeError, DefaultNla, Emitable, NetlinkBuffer, NetlinkHeader, NetlinkMessage,
    NetlinkPayload, Nla, NLA_F_NESTED, NLA_TYPE_MASK, NLMSG_ALIGNTO,
};
use netlink_packet_netfilter::conntrack::{
    ConntrackAttribute, ConntrackMessage, IPTuple, ProtoTuple, Protocol as NfProtocol,
    Tuple as NfTuple,
};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
};

use super::flow::{Flow, Tuple};
use crate::kube_proxy::model::{IpFamily, Protocol};

/// Attributes of a conntrack message that the packet crate leaves undecoded
/// (`include/uapi/linux/netfilter/nfnetlink_conntrack.h`).
const CTA_ID: u16 = 12;
const CTA_ZONE: u16 = 18;
const CTA_FILTER: u16 = 25;
const CTA_FILTER_ORIG_FLAGS: u16 = 1;
/// The kernel's filter flag "match the original tuple's protocol number" (its
/// `nf_internals.h`: not exported, but fixed ABI).
const CTA_FILTER_F_CTA_PROTO_NUM: u32 = 1 << 3;
const NFNETLINK_V0: u8 = 0;
const IPCTNL_MSG_CT_GET: u8 = 1;
const CTA_TUPLE_ORIG: u16 = 1;

/// One request, serialized.
pub(super) fn request(
    family: IpFamily,
    message: ConntrackMessage,
    flags: u16,
    sequence: u32,
) -> Vec<u8> {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    header.sequence_number = sequence;
    let nf_family = match family {
        IpFamily::V4 => NetfilterProtoFamily::IPv4,
        IpFamily::V6 => NetfilterProtoFamily::IPv6,
    };
    let mut packet = NetlinkMessage::new(
        header,
        NetlinkPayload::from(NetfilterMessage::new(
            NetfilterHeader::new(nf_family, NFNETLINK_V0, 0),
            message,
        )),
    );
    packet.finalize();
    let mut bytes = vec![0; packet.buffer_len()];
    packet.serialize(&mut bytes);
    bytes
}

/// A dump's request: the whole table of the family, or only the entries whose original
/// tuple has `protocol` (filtered by Linux 5.8 and later; older kernels ignore the filter).
pub(super) fn dump_request(protocol: Option<Protocol>) -> ConntrackMessage {
    let Some(protocol) = protocol else {
        return ConntrackMessage::Get(Vec::new());
    };
    // The kernel parses CTA_FILTER strictly: it must carry NLA_F_NESTED, which the packet
    // crate drops from the attributes it does not know. Raw attributes keep their flags.
    let protocol = NfTuple::Proto(vec![ProtoTuple::Protocol(NfProtocol::from(
        protocol.number(),
    ))]);
    let flags = DefaultNla::new(
        CTA_FILTER_ORIG_FLAGS,
        CTA_FILTER_F_CTA_PROTO_NUM.to_ne_bytes().to_vec(),
    );
    ConntrackMessage::Other {
        message_type: IPCTNL_MSG_CT_GET,
        attributes: vec![
            DefaultNla::new(CTA_TUPLE_ORIG | NLA_F_NESTED, emitted(&protocol)),
            DefaultNla::new(CTA_FILTER | NLA_F_NESTED, emitted(&flags)),
        ],
    }
}

/// A delete's request. The kernel finds the entry by its original tuple (and zone); the id,
/// when the flow has one, makes it refuse (ENOENT) an entry that is not the one dumped.
/// Only protocols with ports (TCP, UDP, SCTP, ...) can be named this way.
pub(super) fn delete_request(flow: &Flow) -> ConntrackMessage {
    let mut attributes = vec![
        ConntrackAttribute::CtaTupleOrig(tuple_attributes(&flow.original)),
        ConntrackAttribute::CtaTupleReply(tuple_attributes(&flow.reply)),
    ];
    if let Some(zone) = flow.zone {
        attributes.push(ConntrackAttribute::Other(DefaultNla::new(
            CTA_ZONE,
            zone.to_be_bytes().to_vec(),
        )));
    }
    if let Some(id) = flow.id {
        attributes.push(ConntrackAttribute::Other(DefaultNla::new(
            CTA_ID,
            id.to_be_bytes().to_vec(),
        )));
    }
    ConntrackMessage::Delete(attributes)
}

/// The netlink messages of one datagram.
pub(super) fn split(datagram: &[u8]) -> Result<Vec<&[u8]>, DecodeError> {
    let mut messages = Vec::new();
    let mut rest = datagram;
    while !rest.is_empty() {
        // Checked: the length is at least a header's and at most what is left.
        let length = NetlinkBuffer::new_checked(rest)?.length() as usize;
        messages.push(&rest[..length]);
        let aligned = length.next_multiple_of(usize::from(NLMSG_ALIGNTO));
        rest = rest.get(aligned..).unwrap_or_default();
    }
    Ok(messages)
}

/// The status an NLMSG_DONE or NLMSG_ERROR carries: 0, or a negative errno.
pub(super) fn status(message: &[u8]) -> Result<i32, DecodeError> {
    let parsed = NetlinkMessage::<NetfilterMessage>::deserialize(message)?;
    Ok(match parsed.payload {
        NetlinkPayload::Done(done) => done.code,
        NetlinkPayload::Error(error) => error.raw_code(),
        _ => 0,
    })
}

/// One entry of a dump; None when it cannot be read.
pub(super) fn entry(message: &[u8]) -> Option<Flow> {
    let parsed = NetlinkMessage::<NetfilterMessage>::deserialize(message).ok()?;
    let NetlinkPayload::InnerMessage(NetfilterMessage { inner, .. }) = parsed.payload else {
        return None;
    };
    match inner {
        NetfilterMessageInner::Conntrack(
            ConntrackMessage::New(attributes)
            | ConntrackMessage::Get(attributes)
            | ConntrackMessage::Delete(attributes),
        ) => flow(&attributes),
        _ => None,
    }
}

/// A flow from the attributes of a conntrack message: None without both tuples.
fn flow(attributes: &[ConntrackAttribute]) -> Option<Flow> {
    let (mut original, mut reply, mut zone, mut id) = (None, None, None, None);
    for attribute in attributes {
        match attribute {
            ConntrackAttribute::CtaTupleOrig(parts) => original = tuple(parts),
            ConntrackAttribute::CtaTupleReply(parts) => reply = tuple(parts),
            ConntrackAttribute::Other(nla) => {
                let value = nla_value(nla);
                match nla.kind() & NLA_TYPE_MASK {
                    CTA_ID => id = value.try_into().ok().map(u32::from_be_bytes),
                    CTA_ZONE => zone = value.try_into().ok().map(u16::from_be_bytes),
                    _ => {}
                }
            }
            _ => {}
        }
    }
    Some(Flow {
        original: original?,
        reply: reply?,
        zone,
        id,
    })
}

fn tuple(parts: &[NfTuple]) -> Option<Tuple> {
    let (mut src, mut dst, mut protocol) = (None, None, None);
    let (mut src_port, mut dst_port) = (0, 0);
    for part in parts {
        match part {
            NfTuple::Ip(addresses) => {
                for address in addresses {
                    match address {
                        IPTuple::SourceAddress(ip) => src = Some(*ip),
                        IPTuple::DestinationAddress(ip) => dst = Some(*ip),
                        _ => {}
                    }
                }
            }
            NfTuple::Proto(fields) => {
                for field in fields {
                    match field {
                        ProtoTuple::Protocol(number) => protocol = Some(u8::from(*number)),
                        ProtoTuple::SourcePort(port) => src_port = *port,
                        ProtoTuple::DestinationPort(port) => dst_port = *port,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Some(Tuple {
        protocol: protocol?,
        src: src?,
        dst: dst?,
        src_port,
        dst_port,
    })
}

fn tuple_attributes(tuple: &Tuple) -> Vec<NfTuple> {
    vec![
        NfTuple::Ip(vec![
            IPTuple::SourceAddress(tuple.src),
            IPTuple::DestinationAddress(tuple.dst),
        ]),
        NfTuple::Proto(vec![
            ProtoTuple::Protocol(NfProtocol::from(tuple.protocol)),
            ProtoTuple::SourcePort(tuple.src_port),
            ProtoTuple::DestinationPort(tuple.dst_port),
        ]),
    ]
}

fn emitted(nla: &impl Emitable) -> Vec<u8> {
    let mut bytes = vec![0; nla.buffer_len()];
    nla.emit(&mut bytes);
    bytes
}

/// An undecoded attribute's value (the packet crate keeps it private).
fn nla_value(nla: &DefaultNla) -> Vec<u8> {
    let mut value = vec![0; nla.value_len()];
    nla.emit_value(&mut value);
    value
}

#[cfg(test)]
mod tests {
    use netlink_packet_core::{ErrorMessage, NlasIterator, NLM_F_DUMP_INTR};

    use super::*;

    fn dns_flow(zone: Option<u16>, id: Option<u32>) -> Flow {
        let original = Tuple {
            protocol: 17,
            src: "10.0.0.1".parse().unwrap(),
            dst: "10.96.0.10".parse().unwrap(),
            src_port: 40000,
            dst_port: 53,
        };
        Flow {
            original,
            reply: Tuple {
                src: "10.244.1.5".parse().unwrap(),
                src_port: 5353,
                ..original.inverse()
            },
            zone,
            id,
        }
    }

    /// A message as the kernel sends one in a dump: the delete request's attributes (both
    /// tuples, zone, id) plus one the client ignores.
    fn dumped(flow: &Flow, sequence: u32, flags: u16) -> Vec<u8> {
        let ConntrackMessage::Delete(mut attributes) = delete_request(flow) else {
            panic!("a delete request");
        };
        attributes.push(ConntrackAttribute::CtaTimeout(30));
        request(
            flow.family(),
            ConntrackMessage::Get(attributes),
            flags,
            sequence,
        )
    }

    #[test]
    fn a_dumped_entry_reads_back_with_its_tuples_zone_and_id() {
        let flow = dns_flow(Some(3), Some(0xdead_beef));
        let bytes = dumped(&flow, 9, NLM_F_DUMP_INTR);
        assert_eq!(entry(&bytes), Some(flow));
        let header = NetlinkBuffer::new(&bytes[..]);
        assert_eq!(header.sequence_number(), 9);
        assert_ne!(header.flags() & NLM_F_DUMP_INTR, 0);
        // ctnetlink's message type: subsystem 1 (conntrack), message 1 (get).
        assert_eq!(header.message_type(), 0x0101);
    }

    #[test]
    fn an_ipv6_entry_without_zone_or_id_reads_back() {
        let original = Tuple {
            protocol: 17,
            src: "fd00::1".parse().unwrap(),
            dst: "fd00:96::10".parse().unwrap(),
            src_port: 1,
            dst_port: 53,
        };
        let flow = Flow {
            original,
            reply: original.inverse(),
            zone: None,
            id: None,
        };
        assert_eq!(entry(&dumped(&flow, 1, 0)), Some(flow.clone()));
        // Without a reply tuple, there is no flow to decide on.
        let attributes = [ConntrackAttribute::CtaTupleOrig(tuple_attributes(
            &flow.original,
        ))];
        assert_eq!(super::flow(&attributes), None);
        // Something that is not a conntrack entry is not one.
        assert_eq!(entry(&[0; 20]), None);
    }

    #[test]
    fn a_datagram_splits_into_its_aligned_messages() {
        let flow = dns_flow(None, Some(1));
        let mut datagram = dumped(&flow, 1, 0);
        let first = datagram.len();
        datagram.extend(dumped(&flow, 2, 0));
        let messages = split(&datagram).unwrap();
        assert_eq!(messages.len(), 2);
        assert_eq!(messages[0].len(), first);
        assert_eq!(NetlinkBuffer::new(messages[1]).sequence_number(), 2);
        // A message that claims more bytes than the datagram holds is an error, not a panic.
        assert!(split(&datagram[..first + 8]).is_err());
    }

    #[test]
    fn the_protocol_filter_is_a_nested_flag_word_and_a_protocol_tuple() {
        assert_eq!(dump_request(None), ConntrackMessage::Get(Vec::new()));
        let bytes = request(IpFamily::V4, dump_request(Some(Protocol::Udp)), 0, 1);
        #[rustfmt::skip]
        let attributes = [
            // CTA_TUPLE_ORIG, nested: CTA_TUPLE_PROTO, nested: CTA_PROTO_NUM 17 (padded).
            0x10, 0, 0x01, 0x80, 0x0c, 0, 0x02, 0x80, 0x05, 0, 0x01, 0, 17, 0, 0, 0,
            // CTA_FILTER, nested (the kernel refuses it otherwise): CTA_FILTER_ORIG_FLAGS.
            0x0c, 0, 0x19, 0x80, 0x08, 0, 0x01, 0,
        ];
        // After the netlink header (16 bytes) and nfgenmsg (4: AF_INET, version 0).
        assert_eq!(&bytes[16..20], [2, 0, 0, 0]);
        assert_eq!(&bytes[20..44], attributes);
        assert_eq!(&bytes[44..], CTA_FILTER_F_CTA_PROTO_NUM.to_ne_bytes());
        // ctnetlink's message type: subsystem 1 (conntrack), message 1 (get).
        assert_eq!(NetlinkBuffer::new(&bytes[..]).message_type(), 0x0101);
    }

    #[test]
    fn a_delete_names_the_entry_by_tuples_zone_and_id() {
        let ConntrackMessage::Delete(attributes) = delete_request(&dns_flow(Some(2), Some(7)))
        else {
            panic!("a delete request");
        };
        let kinds: Vec<u16> = attributes.iter().map(|a| a.kind()).collect();
        assert_eq!(kinds, [1, 2, CTA_ZONE, CTA_ID]);
        // On the wire, the tuples carry NLA_F_NESTED.
        let bytes = request(IpFamily::V4, ConntrackMessage::Delete(attributes), 0, 1);
        let wire: Vec<(u16, bool)> = NlasIterator::new(&bytes[20..])
            .map(|nla| nla.map(|nla| (nla.kind(), nla.nested_flag())))
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            wire,
            [(1, true), (2, true), (CTA_ZONE, false), (CTA_ID, false)]
        );
        let ConntrackMessage::Delete(attributes) = delete_request(&dns_flow(None, None)) else {
            panic!("a delete request");
        };
        assert_eq!(attributes.len(), 2);
    }

    #[test]
    fn statuses_are_zero_or_a_negative_errno() {
        let mut error = ErrorMessage::default();
        error.code = std::num::NonZeroI32::new(-libc::ENOENT);
        let mut packet = NetlinkMessage::<NetfilterMessage>::new(
            NetlinkHeader::default(),
            NetlinkPayload::Error(error),
        );
        packet.finalize();
        let mut bytes = vec![0; packet.buffer_len()];
        packet.serialize(&mut bytes);
        assert_eq!(status(&bytes).unwrap(), -libc::ENOENT);

        let mut ack = NetlinkMessage::<NetfilterMessage>::new(
            NetlinkHeader::default(),
            NetlinkPayload::Error(ErrorMessage::default()),
        );
        ack.finalize();
        let mut bytes = vec![0; ack.buffer_len()];
        ack.serialize(&mut bytes);
        assert_eq!(status(&bytes).unwrap(), 0);
    }
}
