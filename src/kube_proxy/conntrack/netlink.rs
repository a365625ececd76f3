//! The kernel's conntrack table over ctnetlink (a NETLINK_NETFILTER socket): dump the entries
//! of one IP family, optionally of one protocol, and delete one entry. The socket belongs to
//! the network namespace of the thread that opens it.
//!
//! Calls block: a dump reads the whole table before it returns.

use std::io;
use std::time::Duration;

use netlink_packet_core::{
    DecodeError, NetlinkBuffer, NLMSG_DONE, NLMSG_ERROR, NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR,
    NLM_F_REQUEST,
};
use netlink_packet_netfilter::conntrack::ConntrackMessage;
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket, SocketAddr};

use super::flow::Flow;
use super::messages;
use crate::kube_proxy::model::{IpFamily, Protocol};

/// How many times a request is made in all while the kernel answers that it was interrupted
/// (for a dump: the table changed under it): upstream's count.
pub const MAX_ATTEMPTS: u32 = 5;
/// The kernel fills one dump datagram up to 32 KiB at most, whatever the reader offers.
const RECEIVE_BUFFER: usize = 64 * 1024;
/// A kernel that stops answering fails the call instead of hanging the proxier.
const RECEIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// What a request was doing, for error messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    Dump,
    Delete,
}

impl std::fmt::Display for Operation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Operation::Dump => "dump",
            Operation::Delete => "delete",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConntrackError {
    #[error("opening a NETLINK_NETFILTER socket: {0}")]
    Socket(#[source] io::Error),
    #[error("sending a conntrack {operation} request: {source}")]
    Send {
        operation: Operation,
        #[source]
        source: io::Error,
    },
    #[error("receiving the answer to a conntrack {operation} request: {source}")]
    Receive {
        operation: Operation,
        #[source]
        source: io::Error,
    },
    #[error("the kernel refused a conntrack {operation}: {source}")]
    Kernel {
        operation: Operation,
        #[source]
        source: io::Error,
    },
    #[error("a conntrack {operation} answer of {length} bytes did not fit the {RECEIVE_BUFFER}-byte buffer")]
    Truncated { operation: Operation, length: usize },
    #[error("an undecodable answer to a conntrack {operation}: {source}")]
    Decode {
        operation: Operation,
        #[source]
        source: DecodeError,
    },
    /// Some deletes of a cleanup failed; the others were done.
    #[error("error deleting conntrack entries: {failed} failed, {deleted} deleted; first failure: {first}")]
    Incomplete {
        deleted: usize,
        failed: usize,
        #[source]
        first: Box<ConntrackError>,
    },
}

impl ConntrackError {
    /// The errno the kernel answered, when it answered one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            ConntrackError::Kernel { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

/// The entries of one dump.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Dump {
    pub flows: Vec<Flow>,
    /// The kernel still marked the last attempt interrupted: `flows` may miss entries (or
    /// hold some twice). Upstream cleans with such a result all the same.
    pub interrupted: bool,
    /// Entries that could not be read (no tuple, or an attribute the decoder refused).
    pub skipped: usize,
}

/// What a delete found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deletion {
    Deleted,
    /// No such entry (it expired, or was deleted by someone else): nothing left to do.
    AlreadyGone,
}

/// A ctnetlink socket in the network namespace of the thread that opened it.
pub struct Conntrack {
    socket: Socket,
    sequence: u32,
    buffer: Vec<u8>,
}

impl Conntrack {
    pub fn open() -> Result<Conntrack, ConntrackError> {
        let mut socket = Socket::new(NETLINK_NETFILTER).map_err(ConntrackError::Socket)?;
        socket.bind_auto().map_err(ConntrackError::Socket)?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .map_err(ConntrackError::Socket)?;
        socket2::SockRef::from(&socket)
            .set_read_timeout(Some(RECEIVE_TIMEOUT))
            .map_err(ConntrackError::Socket)?;
        Ok(Conntrack {
            socket,
            sequence: 0,
            buffer: Vec::with_capacity(RECEIVE_BUFFER),
        })
    }

    /// The entries of `family`, only those of `protocol` when it is given (filtered by the
    /// kernel, and again here for kernels that ignore the filter). An interrupted dump is
    /// made again, up to `MAX_ATTEMPTS` in all; the last one's result is returned even when
    /// it was interrupted too.
    pub fn dump(
        &mut self,
        family: IpFamily,
        protocol: Option<Protocol>,
    ) -> Result<Dump, ConntrackError> {
        let mut attempt = 1;
        loop {
            match self.dump_once(family, protocol) {
                Ok(dump) if dump.interrupted && attempt < MAX_ATTEMPTS => {}
                Err(e) if e.errno() == Some(libc::EINTR) && attempt < MAX_ATTEMPTS => {}
                result => return result,
            }
            attempt += 1;
        }
    }

    /// Deletes the entry `flow` names: by its original tuple and zone, and, when the flow
    /// came from a dump, its id, so that an entry created since with the same original tuple
    /// (answered by another endpoint, say) is not deleted in its place. Only protocols with
    /// ports (TCP, UDP, SCTP, ...) can be named this way.
    pub fn delete(&mut self, flow: &Flow) -> Result<Deletion, ConntrackError> {
        let mut attempt = 1;
        loop {
            match self.delete_once(flow) {
                Err(e) if e.errno() == Some(libc::EINTR) && attempt < MAX_ATTEMPTS => {}
                result => return result,
            }
            attempt += 1;
        }
    }

    fn dump_once(
        &mut self,
        family: IpFamily,
        protocol: Option<Protocol>,
    ) -> Result<Dump, ConntrackError> {
        let operation = Operation::Dump;
        let request = messages::dump_request(protocol);
        let sequence = self.send(family, request, NLM_F_REQUEST | NLM_F_DUMP, operation)?;
        let mut dump = Dump::default();
        loop {
            self.receive(operation)?;
            let datagram = messages::split(&self.buffer)
                .map_err(|source| ConntrackError::Decode { operation, source })?;
            for message in datagram {
                let header = NetlinkBuffer::new(message);
                if header.sequence_number() != sequence {
                    continue;
                }
                if header.flags() & NLM_F_DUMP_INTR != 0 {
                    dump.interrupted = true;
                }
                match header.message_type() {
                    NLMSG_DONE | NLMSG_ERROR => {
                        check(message, operation)?;
                        if let Some(protocol) = protocol {
                            let number = protocol.number();
                            dump.flows.retain(|flow| flow.original.protocol == number);
                        }
                        return Ok(dump);
                    }
                    _ => match messages::entry(message) {
                        Some(flow) if flow.family() == family => dump.flows.push(flow),
                        Some(_) => {}
                        None => dump.skipped += 1,
                    },
                }
            }
        }
    }

    fn delete_once(&mut self, flow: &Flow) -> Result<Deletion, ConntrackError> {
        let operation = Operation::Delete;
        let request = messages::delete_request(flow);
        let sequence = self.send(flow.family(), request, NLM_F_REQUEST | NLM_F_ACK, operation)?;
        loop {
            self.receive(operation)?;
            let datagram = messages::split(&self.buffer)
                .map_err(|source| ConntrackError::Decode { operation, source })?;
            for message in datagram {
                let header = NetlinkBuffer::new(message);
                if header.sequence_number() != sequence || header.message_type() != NLMSG_ERROR {
                    continue;
                }
                return match check(message, operation) {
                    Ok(()) => Ok(Deletion::Deleted),
                    Err(e) if e.errno() == Some(libc::ENOENT) => Ok(Deletion::AlreadyGone),
                    Err(e) => Err(e),
                };
            }
        }
    }

    /// Sends one request; returns its sequence number.
    fn send(
        &mut self,
        family: IpFamily,
        message: ConntrackMessage,
        flags: u16,
        operation: Operation,
    ) -> Result<u32, ConntrackError> {
        self.sequence = self.sequence.wrapping_add(1);
        let bytes = messages::request(family, message, flags, self.sequence);
        self.socket
            .send(&bytes, 0)
            .map_err(|source| ConntrackError::Send { operation, source })?;
        Ok(self.sequence)
    }

    /// Reads one datagram into `self.buffer`.
    fn receive(&mut self, operation: Operation) -> Result<(), ConntrackError> {
        loop {
            self.buffer.clear();
            // MSG_TRUNC: the datagram's whole length, to tell a truncated one.
            match self.socket.recv(&mut self.buffer, libc::MSG_TRUNC) {
                Ok(length) if length > self.buffer.len() => {
                    return Err(ConntrackError::Truncated { operation, length })
                }
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => return Err(ConntrackError::Receive { operation, source }),
            }
        }
    }
}

/// The end of an answer: Ok for an ACK or a dump's end, the kernel's errno otherwise.
fn check(message: &[u8], operation: Operation) -> Result<(), ConntrackError> {
    let code =
        messages::status(message).map_err(|source| ConntrackError::Decode { operation, source })?;
    if code == 0 {
        return Ok(());
    }
    Err(ConntrackError::Kernel {
        operation,
        source: io::Error::from_raw_os_error(code.saturating_abs()),
    })
}
