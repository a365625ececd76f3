//! One conntrack entry as the proxy reads it: the tuple of each direction, and what the kernel
//! needs to find exactly that entry again when it is deleted.

use std::fmt;
use std::net::IpAddr;

use crate::kube_proxy::model::IpFamily;

/// One direction of a connection: protocol, addresses and ports. Protocols without ports
/// (ICMP, GRE, ...) read as port 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tuple {
    /// The IP protocol number (17 for UDP).
    pub protocol: u8,
    pub src: IpAddr,
    pub dst: IpAddr,
    pub src_port: u16,
    pub dst_port: u16,
}

impl Tuple {
    /// The tuple seen from the other end: what the reply direction of an entry that was not
    /// translated looks like.
    pub fn inverse(&self) -> Tuple {
        Tuple {
            protocol: self.protocol,
            src: self.dst,
            dst: self.src,
            src_port: self.dst_port,
            dst_port: self.src_port,
        }
    }
}

/// A conntrack entry. Its identity is the original tuple, the reply tuple and the protocol
/// (upstream's nine fields); `zone` and `id` come from the dump and let a delete reach that
/// entry and no other.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Flow {
    /// The direction of the packet that created the entry: for a Service, destination is the
    /// Service IP and port.
    pub original: Tuple,
    /// The direction of the answers: after a DNAT, its source is the endpoint chosen.
    pub reply: Tuple,
    /// The conntrack zone, when not the default one.
    pub zone: Option<u16>,
    /// The kernel's id of the entry. A delete that carries it fails with ENOENT when the
    /// entry with that original tuple is a newer one (say, recreated towards another
    /// endpoint) instead of deleting it.
    pub id: Option<u32>,
}

impl Flow {
    pub fn family(&self) -> IpFamily {
        IpFamily::of(&self.original.src)
    }
}

/// The `conntrack -L` spelling of the tuples, as upstream's debug line shows a flow.
impl fmt::Display for Flow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.original.protocol {
            6 => "tcp",
            17 => "udp",
            132 => "sctp",
            1 => "icmp",
            58 => "icmpv6",
            _ => "unknown",
        };
        write!(f, "{name}\t{} ", self.original.protocol)?;
        for tuple in [&self.original, &self.reply] {
            write!(
                f,
                "src={} dst={} sport={} dport={} ",
                tuple.src, tuple.dst, tuple.src_port, tuple.dst_port
            )?;
        }
        if let Some(zone) = self.zone {
            write!(f, "zone={zone} ")?;
        }
        match self.id {
            Some(id) => write!(f, "id={id}"),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flow_prints_as_conntrack_lists_it() {
        let original = Tuple {
            protocol: 17,
            src: "10.0.0.1".parse().unwrap(),
            dst: "10.96.0.10".parse().unwrap(),
            src_port: 40000,
            dst_port: 53,
        };
        let reply = Tuple {
            src: "10.244.1.5".parse().unwrap(),
            src_port: 5353,
            ..original.inverse()
        };
        let flow = Flow {
            original,
            reply,
            zone: None,
            id: Some(7),
        };
        assert_eq!(
            flow.to_string(),
            "udp\t17 src=10.0.0.1 dst=10.96.0.10 sport=40000 dport=53 \
             src=10.244.1.5 dst=10.0.0.1 sport=5353 dport=40000 id=7"
        );
        assert_eq!(flow.family(), IpFamily::V4);
        assert_eq!(original.inverse().inverse(), original);
    }
}
