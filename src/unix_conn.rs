//! An accepted Unix-socket connection whose end, once its peer has closed, is left to close(2).
//!
//! hyper (on gRPC frontends) and the HTTP-CONNECT relay shut the write side down when a
//! connection ends, and the socket is closed right after. Once the peer has closed its own
//! side (a read returned end of stream), that shutdown(2) tells it nothing the close does not:
//! both end the stream the same way. It is skipped then, one system call fewer per connection.
//! A connection the peer has not closed is shut down as before.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::UnixStream;

pub struct UnixConn {
    stream: UnixStream,
    /// A read returned end of stream: the peer has closed its side.
    peer_closed: bool,
}

impl UnixConn {
    pub fn new(stream: UnixStream) -> UnixConn {
        UnixConn {
            stream,
            peer_closed: false,
        }
    }

    /// The socket itself, for a relay that splits it into owned halves (`RelayIo`).
    pub fn into_stream(self) -> UnixStream {
        self.stream
    }
}

impl AsyncRead for UnixConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let room = buf.remaining() > 0;
        ready!(Pin::new(&mut self.stream).poll_read(cx, buf))?;
        if room && buf.filled().len() == before {
            self.peer_closed = true;
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for UnixConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, data)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.peer_closed {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// While the peer is open, shutdown shuts the write side (a later write fails) and the
    /// peer sees the end of the stream at once.
    #[tokio::test]
    async fn shutdown_ends_the_stream_while_the_peer_is_open() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let mut conn = UnixConn::new(ours);
        conn.write_all(b"reply").await.unwrap();
        conn.shutdown().await.unwrap();
        assert!(conn.write_all(b"more").await.is_err());
        let mut got = Vec::new();
        theirs.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"reply");
    }

    /// Once the peer has closed its side, shutdown leaves the socket as it is (a write after
    /// it still goes through) and the close ends the stream.
    #[tokio::test]
    async fn after_the_peers_end_the_close_ends_the_stream() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let mut conn = UnixConn::new(ours);
        theirs.shutdown().await.unwrap();
        let mut buf = [0u8; 16];
        assert_eq!(conn.read(&mut buf).await.unwrap(), 0);
        conn.shutdown().await.unwrap();
        conn.write_all(b"last").await.unwrap();
        drop(conn);
        let mut got = Vec::new();
        theirs.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"last");
    }

    /// A read into a full buffer returns nothing without meaning end of stream.
    #[tokio::test]
    async fn an_empty_read_buffer_is_not_end_of_stream() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let mut conn = UnixConn::new(ours);
        theirs.write_all(b"x").await.unwrap();
        let mut empty = [0u8; 0];
        assert_eq!(conn.read(&mut empty).await.unwrap(), 0);
        assert!(!conn.peer_closed);
        let mut one = [0u8; 1];
        assert_eq!(conn.read(&mut one).await.unwrap(), 1);
        assert!(!conn.peer_closed);
    }
}
