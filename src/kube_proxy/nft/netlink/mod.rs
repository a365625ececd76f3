//! Transactions applied as nf_tables netlink messages, without the `nft` program.
//!
//! Without nft there is no second program to run, parse text and cache the table (nft's
//! process holds ~280 MB for a 10,000-Service sync), and no nft of another version than the
//! host's kernel and tools expect. The kernel's own work is the same: its cost for many
//! anonymous maps in one transaction grows with the square of their number (binding each
//! set walks the whole transaction, naming and finding one walks all the table's sets), and
//! it dominates a large full sync either way (`tests/kube_proxy_netlink.rs`, `scale_probe`).
//!
//! This module writes a `Transaction` as the batch nft would send for
//! its rendered text, message for message and attribute for attribute: the same objects,
//! expressions, set declarations, anonymous sets and userdata (comments, key byte orders,
//! `typeof`), so that `nft list table` reads the result the same whichever path wrote it.
//! The byte-for-byte references are nft's own batches, recorded as fixtures (`tests.rs`).
//!
//! - `batch`: operations to messages, each message remembering its operation;
//! - `lower`: a rule's statements to expressions; `expr`: the expressions' encoding;
//! - `sets`, `intervals`: set declarations, elements, anonymous sets;
//! - `attr`: the message and attribute writer; `consts`: the ABI's numbers;
//! - `socket`: sending the batch whole and reading every message's ack.
//!
//! And the other way, a family's table read back from the kernel (`read`): dump requests,
//! the answers' attributes (`parse`), the objects (`decode`), a rule's expressions
//! (`unexpr`) and its statements (`unlower`, the inverse of `lower`), and the form the
//! kernel keeps a rule in (`canon`).
//!
//! The batch is atomic: every message is acknowledged, and any refusal names the
//! operation whose message the kernel refused (its rendered text, as `nft -f` would have
//! named the line); the kernel then applies nothing.

mod attr;
pub mod batch;
pub mod canon;
mod consts;
mod decode;
mod element;
mod expr;
mod intervals;
mod lower;
mod parse;
pub mod read;
mod sets;
pub mod socket;
mod unexpr;
mod unlower;

#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod tests;

use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::applied::Applied;
use super::objects::{render_op, Transaction};
use crate::kube_proxy::model::IpFamily;
use batch::{encode, Batch, EncodeFailure, Options};
use read::{Listing, ReadError};
use socket::{NfSocket, SocketError};

/// Why an operation cannot be written as netlink (nft would refuse its text too).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unsupported {
    #[error("`{0} {1}` is not an operation nftables has")]
    Operation(&'static str, &'static str),
    #[error("a statement read from a kernel, never written: {0}")]
    ReadOnlyStatement(String),
    #[error("set type {0:?} is not one the proxy declares")]
    KeyType(String),
    #[error("set flag {0:?} is not one the proxy declares")]
    SetFlag(String),
    #[error("a comment of {0} bytes (nft allows 128)")]
    CommentTooLong(usize),
    #[error("interface name {0:?} is not 1 to 15 bytes")]
    InterfaceName(String),
    #[error("an empty anonymous set")]
    EmptySet,
}

#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    #[error("operation {} ({operation}) cannot be written: {reason}", index + 1)]
    Encode {
        index: usize,
        operation: String,
        #[source]
        reason: Unsupported,
    },
    #[error(transparent)]
    Socket(#[from] SocketError),
    #[error("the kernel refused operation {} of {total} ({operation}): {source}{}{}", index + 1, detail(message), others_text(*others))]
    Refused {
        /// The operation's index in the transaction.
        index: usize,
        total: usize,
        operation: String,
        source: io::Error,
        message: Option<String>,
        /// Further operations the kernel refused in the same batch.
        others: usize,
    },
    #[error(
        "the kernel refused the transaction of {total} operations: {source}{}",
        detail(message)
    )]
    BatchRefused {
        total: usize,
        source: io::Error,
        message: Option<String>,
    },
    #[error("the kernel acknowledged {answered} of the batch's {messages} messages and refused none: whether the transaction was applied is unknown")]
    Unanswered { answered: usize, messages: usize },
}

fn detail(message: &Option<String>) -> String {
    message
        .as_ref()
        .map(|m| format!(" ({m})"))
        .unwrap_or_default()
}

fn others_text(others: usize) -> String {
    if others == 0 {
        String::new()
    } else {
        format!("; and {others} more")
    }
}

impl NetlinkError {
    /// The errno the kernel refused with, when it refused.
    pub fn errno(&self) -> Option<i32> {
        match self {
            NetlinkError::Refused { source, .. } | NetlinkError::BatchRefused { source, .. } => {
                source.raw_os_error()
            }
            _ => None,
        }
    }

    /// A label for the failure counters.
    pub fn kind(&self) -> &'static str {
        match self {
            NetlinkError::Encode { .. } => "encode",
            NetlinkError::Refused { .. } | NetlinkError::BatchRefused { .. } => "refused",
            NetlinkError::Socket(_) | NetlinkError::Unanswered { .. } => "netlink",
        }
    }
}

/// Sequence numbers are spaced this far apart between batches, so that no answer to one
/// batch can be taken for an answer to the next.
const SEQUENCE_STRIDE: u32 = 1 << 24;

/// Applies transactions over one NETLINK_NETFILTER socket. Clones share the socket; one
/// batch is in flight at a time.
#[derive(Clone)]
pub struct Netlink {
    socket: Arc<Mutex<NfSocket>>,
    next_sequence: Arc<AtomicU32>,
}

impl std::fmt::Debug for Netlink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Netlink")
    }
}

impl Netlink {
    /// Opens the socket, in the network namespace of the calling thread: every transaction
    /// goes to that namespace's nftables, whichever thread applies it.
    pub fn open() -> Result<Netlink, NetlinkError> {
        let socket = NfSocket::open()?;
        // Start where an earlier process's stray answers are unlikely.
        let start = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        Ok(Netlink {
            socket: Arc::new(Mutex::new(socket)),
            next_sequence: Arc::new(AtomicU32::new(start)),
        })
    }

    /// Writes `tx` as a batch (nothing is sent).
    pub fn encode(&self, tx: &Transaction) -> Result<Batch, NetlinkError> {
        let first_sequence = self
            .next_sequence
            .fetch_add(SEQUENCE_STRIDE, Ordering::Relaxed);
        encode(
            tx,
            Options {
                ack: true,
                first_sequence,
            },
        )
        .map_err(|EncodeFailure { index, reason }| {
            let mut operation = String::new();
            if let Some((verb, object)) = tx.ops.get(index) {
                render_op(tx.family, *verb, object, &mut operation);
            }
            NetlinkError::Encode {
                index,
                operation,
                reason,
            }
        })
    }

    /// Applies `tx`: all of it, or none of it and the kernel's reason. Blocks.
    pub fn apply_blocking(&self, tx: &Transaction) -> Result<Applied, NetlinkError> {
        let start = Instant::now();
        let batch = self.encode(tx)?;
        let answers = self.exchange(&batch)?;
        judge(tx, &batch, &answers)?;
        Ok(Applied {
            operations: tx.len(),
            bytes: batch.bytes().len(),
            elapsed: start.elapsed(),
        })
    }

    /// Applies `tx` from async code: the batch is written here, sent and answered on a
    /// blocking thread.
    pub async fn apply(&self, tx: &Transaction) -> Result<Applied, NetlinkError> {
        let start = Instant::now();
        let batch = self.encode(tx)?;
        let this = self.clone();
        let (batch, answers) = tokio::task::spawn_blocking(move || {
            let answers = this.exchange(&batch);
            (batch, answers)
        })
        .await
        .map_err(|e| {
            NetlinkError::Socket(SocketError::Receive(io::Error::other(format!(
                "the sending thread failed: {e}"
            ))))
        })?;
        judge(tx, &batch, &answers?)?;
        Ok(Applied {
            operations: tx.len(),
            bytes: batch.bytes().len(),
            elapsed: start.elapsed(),
        })
    }

    /// Reads `family`'s table back (None: there is none). Blocks. `wanted`: the transaction
    /// that would write the table as wanted, whose maps' elements need not be read (`read`).
    pub fn read_table_blocking(
        &self,
        family: IpFamily,
        wanted: Option<&Transaction>,
    ) -> Result<Option<Listing>, ReadError> {
        let first = self
            .next_sequence
            .fetch_add(SEQUENCE_STRIDE, Ordering::Relaxed);
        let mut socket = self.socket.lock().unwrap_or_else(|p| p.into_inner());
        read::read(&mut socket, family, first, wanted)
    }

    /// Reads `family`'s table back from async code, on a blocking thread, knowing the
    /// transaction that would write it as wanted (`read_table_blocking`).
    pub async fn read_table_wanting(
        &self,
        family: IpFamily,
        wanted: Arc<Transaction>,
    ) -> Result<Option<Listing>, ReadError> {
        self.read_on_thread(family, Some(wanted)).await
    }

    /// Reads `family`'s table back from async code, on a blocking thread.
    pub async fn read_table(&self, family: IpFamily) -> Result<Option<Listing>, ReadError> {
        self.read_on_thread(family, None).await
    }

    async fn read_on_thread(
        &self,
        family: IpFamily,
        wanted: Option<Arc<Transaction>>,
    ) -> Result<Option<Listing>, ReadError> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.read_table_blocking(family, wanted.as_deref()))
            .await
            .map_err(|e| {
                ReadError::Socket(SocketError::Receive(io::Error::other(format!(
                    "the reading thread failed: {e}"
                ))))
            })?
    }

    fn exchange(&self, batch: &Batch) -> Result<Vec<socket::Answer>, NetlinkError> {
        let mut socket = self.socket.lock().unwrap_or_else(|p| p.into_inner());
        Ok(socket.exchange(batch, true)?)
    }
}

/// The outcome the answers tell: every message acknowledged and none refused, or the first
/// refusal (by the operation whose message it was), or a refusal of the whole batch.
fn judge(tx: &Transaction, batch: &Batch, answers: &[socket::Answer]) -> Result<(), NetlinkError> {
    let begin = batch.begin_sequence();
    let mut refused = answers.iter().filter(|a| a.errno != 0);
    if let Some(first) = refused.next() {
        let source = io::Error::from_raw_os_error(first.errno);
        let message = first.message.clone();
        return Err(match batch.origin(first.sequence) {
            Some(index) if first.sequence != begin => {
                let mut operation = String::new();
                if let Some((verb, object)) = tx.ops.get(index) {
                    render_op(tx.family, *verb, object, &mut operation);
                }
                NetlinkError::Refused {
                    index,
                    total: tx.len(),
                    operation,
                    source,
                    message,
                    others: refused.count(),
                }
            }
            _ => NetlinkError::BatchRefused {
                total: tx.len(),
                source,
                message,
            },
        });
    }
    let answered = answers.iter().filter(|a| a.sequence != begin).count();
    if answered < batch.messages() {
        return Err(NetlinkError::Unanswered {
            answered,
            messages: batch.messages(),
        });
    }
    Ok(())
}
