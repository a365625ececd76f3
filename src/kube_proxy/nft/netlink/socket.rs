//! Sending a batch and reading the kernel's answers over a NETLINK_NETFILTER socket.
//!
//! The kernel takes a batch only whole, in one datagram: the socket's send buffer is raised
//! to the batch's size (`SO_SNDBUFFORCE`, as nft does). It processes the batch within the
//! `send` call and queues its answers then: an error for each message it refused, an ack
//! for each message that asked for one, and an error naming the begin message when the
//! commit itself failed. Every message asks for an ack, so the receive buffer is raised to
//! hold them all (`SO_RCVBUFFORCE`); a datagram the kernel could not queue would leave the
//! outcome unknown, and is reported so. Acks are capped (`NETLINK_CAP_ACK`: no copy of the
//! request) and extended (`NETLINK_EXT_ACK`: the kernel's message, when it has one).

use std::io;
use std::os::fd::AsRawFd;
use std::time::Duration;

use netlink_packet_core::{NetlinkBuffer, NLMSG_ERROR, NLM_F_ACK_TLVS};
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket, SocketAddr};
use nix::sys::socket::{setsockopt, sockopt};

use super::batch::Batch;

/// One answer datagram is small (an ack, or an error with the kernel's message).
const RECEIVE_BUFFER: usize = 64 * 1024;
/// A kernel that stops answering fails the apply instead of hanging the proxier: the
/// answers are queued before `send` returns, so this is generous.
const RECEIVE_TIMEOUT: Duration = Duration::from_secs(30);
/// What one queued ack costs the receive buffer (the socket buffer's accounting of a
/// small datagram: its data and its `sk_buff`), with room to spare.
const ACK_COST: usize = 1024;
/// The receive buffer is never made smaller than this.
const MIN_RECEIVE_SPACE: usize = 1 << 20;
/// `NLMSGERR_ATTR_MSG`: the kernel's text in an extended ack.
const NLMSGERR_ATTR_MSG: u16 = 1;

/// The kernel's answer to one message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub sequence: u32,
    /// 0, or the errno the kernel refused the message with.
    pub errno: i32,
    /// The kernel's explanation, when it gave one.
    pub message: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("opening a NETLINK_NETFILTER socket: {0}")]
    Open(#[source] io::Error),
    #[error("sending the batch ({bytes} bytes): {source}")]
    Send {
        bytes: usize,
        #[source]
        source: io::Error,
    },
    #[error("receiving the kernel's answers: {0}")]
    Receive(#[source] io::Error),
    #[error("an answer of {0} bytes did not fit the {RECEIVE_BUFFER}-byte buffer")]
    Truncated(usize),
    #[error(
        "the kernel answered {answered} of {expected} messages before {RECEIVE_TIMEOUT:?} passed"
    )]
    Silent { answered: usize, expected: usize },
}

/// A NETLINK_NETFILTER socket, in the network namespace of the thread that opened it.
pub struct NfSocket {
    socket: Socket,
    buffer: Vec<u8>,
}

impl NfSocket {
    pub fn open() -> Result<NfSocket, SocketError> {
        let mut socket = Socket::new(NETLINK_NETFILTER).map_err(SocketError::Open)?;
        socket.bind_auto().map_err(SocketError::Open)?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .map_err(SocketError::Open)?;
        socket.set_cap_ack(true).map_err(SocketError::Open)?;
        // Older kernels lack extended acks; the kernel's text is only a bonus.
        let _ = socket.set_ext_ack(true);
        socket2::SockRef::from(&socket)
            .set_read_timeout(Some(RECEIVE_TIMEOUT))
            .map_err(SocketError::Open)?;
        Ok(NfSocket {
            socket,
            buffer: Vec::with_capacity(RECEIVE_BUFFER),
        })
    }

    /// Sends `batch` and returns the kernel's answers: one for every message that asked for
    /// one, in the order the kernel gave them, and any error for the begin message.
    pub fn exchange(&mut self, batch: &Batch, acked: bool) -> Result<Vec<Answer>, SocketError> {
        self.drain();
        let bytes = batch.bytes();
        self.make_room(bytes.len(), if acked { batch.messages() } else { 0 });
        self.socket
            .send(bytes, 0)
            .map_err(|source| SocketError::Send {
                bytes: bytes.len(),
                source,
            })?;
        let expected = if acked { batch.messages() } else { 0 };
        let begin = batch.begin_sequence();
        let mut answers = Vec::with_capacity(expected + 1);
        let mut acked_messages = 0;
        let mut batch_refused = false;
        // Everything is queued by now: read until every message is answered, and past a
        // refusal of the whole batch read what is left without waiting.
        while acked_messages < expected {
            let wait = !batch_refused;
            if !self.receive(wait)? {
                if batch_refused || !wait {
                    break;
                }
                return Err(SocketError::Silent {
                    answered: acked_messages,
                    expected,
                });
            }
            for answer in parse(&self.buffer) {
                if answer.sequence == begin {
                    batch_refused = answer.errno != 0;
                } else {
                    acked_messages += 1;
                }
                answers.push(answer);
            }
        }
        // What else is queued: the refusals, without acks; a refusal of the whole batch
        // (before or after the acks, or alone for a batch of no messages).
        while self.receive(false)? {
            answers.extend(parse(&self.buffer));
        }
        Ok(answers)
    }

    /// Raises the send buffer to hold the batch, and the receive buffer to hold `acks`
    /// acks. As root (CAP_NET_ADMIN) past the system's limits, as nft does; otherwise up
    /// to them, and a batch too large fails to send with EMSGSIZE.
    fn make_room(&self, batch: usize, acks: usize) {
        let fd = self.socket.as_raw_fd();
        // The kernel wants the datagram and its overhead below the send buffer.
        let send = batch + 64 * 1024;
        if setsockopt(fd, sockopt::SndBufForce, &send).is_err() {
            let _ = setsockopt(fd, sockopt::SndBuf, &send);
        }
        let receive = (acks * ACK_COST).max(MIN_RECEIVE_SPACE);
        if setsockopt(fd, sockopt::RcvBufForce, &receive).is_err() {
            let _ = setsockopt(fd, sockopt::RcvBuf, &receive);
        }
    }

    /// Discards answers left from an earlier exchange (one that failed half-way).
    fn drain(&mut self) {
        while let Ok(true) = self.receive(false) {}
    }

    /// Reads one datagram into the buffer; false when there was none (without waiting:
    /// none queued; waiting: none before the timeout).
    fn receive(&mut self, wait: bool) -> Result<bool, SocketError> {
        let flags = libc::MSG_TRUNC | if wait { 0 } else { libc::MSG_DONTWAIT };
        loop {
            self.buffer.clear();
            match self.socket.recv(&mut self.buffer, flags) {
                Ok(length) if length > self.buffer.capacity() => {
                    return Err(SocketError::Truncated(length))
                }
                Ok(_) => return Ok(true),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::TimedOut => return Ok(false),
                Err(e) => return Err(SocketError::Receive(e)),
            }
        }
    }
}

/// The error messages (acks included) of one datagram.
pub fn parse(datagram: &[u8]) -> Vec<Answer> {
    let mut answers = Vec::new();
    let mut rest = datagram;
    while let Ok(header) = NetlinkBuffer::new_checked(rest) {
        let length = header.length() as usize;
        if header.message_type() == NLMSG_ERROR {
            if let Some(answer) = error_message(&rest[..length], header.flags()) {
                answers.push(answer);
            }
        }
        let aligned = length.next_multiple_of(4);
        rest = rest.get(aligned..).unwrap_or_default();
    }
    answers
}

fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

/// `struct nlmsgerr` (the errno, then the request's header: its sequence number is the
/// request's) and, with `NLM_F_ACK_TLVS`, the extended ack's attributes after the request
/// (only its header with capped acks, the whole request otherwise).
fn error_message(message: &[u8], flags: u16) -> Option<Answer> {
    const HEADER: usize = 16;
    let errno = i32::from_ne_bytes(message.get(HEADER..HEADER + 4)?.try_into().ok()?);
    let request = HEADER + 4;
    let request_len = u32_at(message, request)? as usize;
    let sequence = u32_at(message, request + 8)?;
    let mut text = None;
    if flags & NLM_F_ACK_TLVS != 0 {
        let capped = flags & netlink_packet_core::NLM_F_CAPPED != 0;
        let mut at = request + if capped { HEADER } else { request_len };
        at = at.next_multiple_of(4);
        while at + 4 <= message.len() {
            let len = usize::from(u16_at(message, at)?);
            let kind = u16_at(message, at + 2)? & netlink_packet_core::NLA_TYPE_MASK;
            if len < 4 {
                break;
            }
            if kind == NLMSGERR_ATTR_MSG {
                let value = message.get(at + 4..at + len)?;
                let value = value.strip_suffix(&[0]).unwrap_or(value);
                text = Some(String::from_utf8_lossy(value).into_owned());
            }
            at += len.next_multiple_of(4);
        }
    }
    Some(Answer {
        sequence,
        errno: errno.saturating_abs(),
        message: text,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(seq: u32, errno: i32, flags: u16, tlv: Option<&str>) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&0u32.to_ne_bytes());
        m.extend_from_slice(&NLMSG_ERROR.to_ne_bytes());
        m.extend_from_slice(&flags.to_ne_bytes());
        m.extend_from_slice(&seq.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        m.extend_from_slice(&(-errno).to_ne_bytes());
        // The request's header (capped).
        m.extend_from_slice(&20u32.to_ne_bytes());
        m.extend_from_slice(&0x0a06u16.to_ne_bytes());
        m.extend_from_slice(&5u16.to_ne_bytes());
        m.extend_from_slice(&seq.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        if let Some(text) = tlv {
            let len = 4 + text.len() + 1;
            m.extend_from_slice(&u16::try_from(len).unwrap_or(0).to_ne_bytes());
            m.extend_from_slice(&NLMSGERR_ATTR_MSG.to_ne_bytes());
            m.extend_from_slice(text.as_bytes());
            m.push(0);
            while m.len() % 4 != 0 {
                m.push(0);
            }
        }
        let len = u32::try_from(m.len()).unwrap_or(0);
        m[..4].copy_from_slice(&len.to_ne_bytes());
        m
    }

    #[test]
    fn acks_and_errors_name_their_request_and_carry_the_kernels_text() {
        let mut datagram = error(7, 0, netlink_packet_core::NLM_F_CAPPED, None);
        datagram.extend(error(
            8,
            libc::ENOENT,
            netlink_packet_core::NLM_F_CAPPED | NLM_F_ACK_TLVS,
            Some("chain not found"),
        ));
        let answers = parse(&datagram);
        assert_eq!(
            answers,
            vec![
                Answer {
                    sequence: 7,
                    errno: 0,
                    message: None
                },
                Answer {
                    sequence: 8,
                    errno: libc::ENOENT,
                    message: Some("chain not found".into())
                }
            ]
        );
    }
}
