//! One tunnel at the agent: the TCP connection to its destination, the queue toward it, and
//! the task that moves bytes both ways until the tunnel ends (its stream then closes it).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use super::metrics::QueueClose;
use super::queue::{EndpointQueue, Taken};
use super::uplink::Uplink;
use crate::wire;

/// Each read from a destination takes at most this much (upstream reads 4 KiB; a larger
/// read means fewer packets, so less work per byte, at no cost to an idle tunnel, which
/// holds no buffer).
const READ_BYTES: usize = 64 * 1024;

/// What one write toward a destination may gather of what its queue holds: the chunks the
/// server sent meanwhile go out in one writev(2), with one log line, rather than one write
/// and one line each.
const WRITE_BATCH_BYTES: usize = 256 * 1024;
/// The most slices one writev(2) is given.
const WRITE_SLICES: usize = 64;

/// Why a tunnel ended.
#[derive(Debug)]
pub enum End {
    /// The server asked (CLOSE_REQ).
    Requested,
    /// The destination closed its side.
    RemoteEof,
    ReadFailed(std::io::Error),
    WriteFailed(std::io::Error),
    /// The destination did not keep up.
    Refused(QueueClose),
    /// The server stream is gone: nothing can be told.
    StreamGone,
}

impl End {
    pub fn reason(&self) -> String {
        match self {
            End::Requested => "closed by the server".into(),
            End::RemoteEof => "destination closed".into(),
            End::ReadFailed(e) => format!("read from destination failed: {e}"),
            End::WriteFailed(e) => format!("write to destination failed: {e}"),
            End::Refused(why) => format!("destination did not keep up ({})", why.label()),
            End::StreamGone => "server stream ended".into(),
        }
    }

    /// The CLOSE_RSP error the server (and so its frontend) is given.
    pub fn wire_error(&self) -> &'static str {
        match self {
            End::Refused(QueueClose::Overflow) => wire::ENDPOINT_QUEUE_OVERFLOW,
            End::Refused(QueueClose::Stall) => wire::ENDPOINT_WRITE_STALLED,
            End::Refused(QueueClose::Budget) => wire::ENDPOINT_QUEUE_BUDGET,
            _ => "",
        }
    }
}

pub struct Endpoint {
    pub connect_id: i64,
    pub dial_id: i64,
    pub address: String,
    pub queue: EndpointQueue,
    started: Instant,
    /// Cancelled to end the tunnel from outside its task (CLOSE_REQ, a refused delivery).
    cancel: CancellationToken,
    /// Why, when cancelled from outside.
    cause: Mutex<Option<End>>,
    bytes_to_destination: AtomicU64,
    bytes_from_destination: AtomicU64,
}

impl Endpoint {
    pub fn new(
        connect_id: i64,
        dial_id: i64,
        address: String,
        queue: EndpointQueue,
        cancel: CancellationToken,
    ) -> Endpoint {
        Endpoint {
            connect_id,
            dial_id,
            address,
            queue,
            started: Instant::now(),
            cancel,
            cause: Mutex::new(None),
            bytes_to_destination: AtomicU64::new(0),
            bytes_from_destination: AtomicU64::new(0),
        }
    }

    /// Ends the tunnel from outside its task; the first cause given wins.
    pub fn end(&self, cause: End) {
        let mut slot = self.cause.lock().unwrap_or_else(|p| p.into_inner());
        slot.get_or_insert(cause);
        drop(slot);
        self.queue.close();
        self.cancel.cancel();
    }

    pub fn counted_to_destination(&self, bytes: usize) {
        self.bytes_to_destination
            .fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Bytes written toward the destination, and read from it.
    pub fn bytes(&self) -> (u64, u64) {
        (
            self.bytes_to_destination.load(Ordering::Relaxed),
            self.bytes_from_destination.load(Ordering::Relaxed),
        )
    }

    pub fn age(&self) -> Duration {
        self.started.elapsed()
    }

    fn outside_cause(&self) -> End {
        self.cause
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .unwrap_or(End::StreamGone)
    }

    /// Moves bytes both ways until the tunnel ends; a write that makes no progress for
    /// `stall` ends it. Returns why it ended.
    pub async fn run(&self, tcp: TcpStream, uplink: &Uplink, stall: Duration) -> End {
        let (read, mut write) = tcp.into_split();
        let writer = async {
            let mut batch = Vec::new();
            loop {
                batch.clear();
                let Some(mut taken) = self.queue.next_batch(&mut batch, WRITE_BATCH_BYTES).await
                else {
                    // Closed from outside: CLOSE_REQ, or a refused delivery.
                    return self.outside_cause();
                };
                tracing::info!(
                    v = 4,
                    connectionID = self.connect_id,
                    dataSize = batch.iter().map(bytes::Bytes::len).sum::<usize>(),
                    "write to remote"
                );
                if let Err(end) = write_all(&mut write, &mut batch, &mut taken, stall).await {
                    return end;
                }
            }
        };
        let reader = async {
            loop {
                if let Err(e) = read.readable().await {
                    return End::ReadFailed(e);
                }
                let mut buf = BytesMut::with_capacity(READ_BYTES);
                match read.try_read_buf(&mut buf) {
                    Ok(0) => return End::RemoteEof,
                    Ok(n) => {
                        self.bytes_from_destination
                            .fetch_add(n as u64, Ordering::Relaxed);
                        tracing::debug!(
                            bytes = n,
                            connectionID = self.connect_id,
                            "received data from remote"
                        );
                        // A small read is copied out so the large buffer is not held while
                        // the packet waits to be sent.
                        let data = if n < READ_BYTES / 4 {
                            bytes::Bytes::copy_from_slice(&buf)
                        } else {
                            buf.freeze()
                        };
                        if !uplink.send(wire::data(self.connect_id, data)).await {
                            return End::StreamGone;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                    Err(e) => return End::ReadFailed(e),
                }
            }
        };
        tokio::select! {
            end = writer => end,
            end = reader => end,
            _ = self.cancel.cancelled() => self.outside_cause(),
        }
    }
}

/// Writes every chunk of `batch` (consuming them), a writev(2) at a time, telling `taken` what
/// each wrote; a write that makes no progress for `stall` ends the tunnel.
async fn write_all(
    write: &mut tokio::net::tcp::OwnedWriteHalf,
    batch: &mut [bytes::Bytes],
    taken: &mut Taken<'_>,
    stall: Duration,
) -> Result<(), End> {
    use bytes::Buf;
    let mut first = 0;
    loop {
        while batch.get(first).is_some_and(bytes::Bytes::is_empty) {
            first += 1;
        }
        if first == batch.len() {
            return Ok(());
        }
        let mut written = {
            let mut slices = [std::io::IoSlice::new(&[]); WRITE_SLICES];
            let mut count = 0;
            for (slot, chunk) in slices.iter_mut().zip(&batch[first..]) {
                *slot = std::io::IoSlice::new(chunk);
                count += 1;
            }
            match tokio::time::timeout(stall, write.write_vectored(&slices[..count])).await {
                Err(_) => return Err(End::Refused(QueueClose::Stall)),
                Ok(Err(e)) => return Err(End::WriteFailed(e)),
                Ok(Ok(0)) => return Err(End::WriteFailed(std::io::ErrorKind::WriteZero.into())),
                Ok(Ok(n)) => n,
            }
        };
        taken.written(written);
        for chunk in &mut batch[first..] {
            let step = written.min(chunk.len());
            chunk.advance(step);
            written -= step;
            if written == 0 {
                break;
            }
        }
    }
}
