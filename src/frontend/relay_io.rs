//! A client connection as the HTTP-CONNECT relay holds it: two halves that read and write at
//! once, a wait for data that takes no read buffer where the transport can tell, and the end
//! of the write side.
//!
//! A server holds thousands of quiet CONNECT tunnels. Each one waiting in a read would hold
//! its read buffer for as long as it is quiet; over the Unix socket, readiness comes from the
//! socket itself, so the buffer is taken only once there is something to read. TLS cannot
//! tell that way (rustls may already hold decrypted bytes), so it reads straight away.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::Poll;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

use crate::unix_conn::UnixConn;

pub trait RelayIo: AsyncRead + AsyncWrite + Unpin + Send + Sized {
    type Reader: AsyncRead + Unpin + Send;
    type Writer: AsyncWrite + Unpin + Send;

    fn into_halves(self) -> (Self::Reader, Self::Writer);

    /// The next bytes from `reader`, in a buffer of `want` bytes' room taken once they are
    /// there (where the transport can tell; else taken before the wait); empty at the end of
    /// the stream.
    fn read_chunk(
        reader: &mut Self::Reader,
        want: usize,
    ) -> impl Future<Output = io::Result<BytesMut>> + Send;

    /// Ends the write side once the relay is over. `peer_closed`: the client's end of stream
    /// was read.
    fn finish(writer: Self::Writer, peer_closed: bool) -> impl Future<Output = ()> + Send;
}

impl RelayIo for UnixConn {
    type Reader = OwnedReadHalf;
    type Writer = OwnedWriteHalf;

    fn into_halves(self) -> (OwnedReadHalf, OwnedWriteHalf) {
        self.into_stream().into_split()
    }

    async fn read_chunk(reader: &mut OwnedReadHalf, want: usize) -> io::Result<BytesMut> {
        loop {
            reader.readable().await?;
            let mut buf = BytesMut::with_capacity(want);
            // One poll of the read, not an await: a read that would wait gives the buffer back
            // (the readiness is cleared and the wait above is the only one), so no buffer is
            // held while the tunnel idles. A poll, not `try_read_buf`: a read that fills less
            // than the room given also clears the readiness (the socket is drained), so the
            // next chunk waits without first making a read that finds nothing.
            let read = std::future::poll_fn(|cx| {
                Poll::Ready(tokio_util::io::poll_read_buf(
                    Pin::new(&mut *reader),
                    cx,
                    &mut buf,
                ))
            })
            .await;
            match read {
                Poll::Ready(Ok(_)) => return Ok(buf),
                Poll::Ready(Err(e)) => return Err(e),
                Poll::Pending => continue,
            }
        }
    }

    async fn finish(mut writer: OwnedWriteHalf, peer_closed: bool) {
        if peer_closed {
            // The close that follows ends the stream as a shutdown would (see `unix_conn`);
            // `forget` keeps the half from shutting the socket down when dropped.
            writer.forget();
        } else {
            let _ = writer.shutdown().await;
        }
    }
}

impl RelayIo for TlsStream<TcpStream> {
    type Reader = ReadHalf<Self>;
    type Writer = WriteHalf<Self>;

    fn into_halves(self) -> (ReadHalf<Self>, WriteHalf<Self>) {
        tokio::io::split(self)
    }

    async fn read_chunk(reader: &mut ReadHalf<Self>, want: usize) -> io::Result<BytesMut> {
        let mut buf = BytesMut::with_capacity(want);
        reader.read_buf(&mut buf).await?;
        Ok(buf)
    }

    /// Always sends the close_notify alert, as Go's tls.Conn.Close does.
    async fn finish(mut writer: WriteHalf<Self>, _: bool) {
        let _ = writer.shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::UnixStream;

    /// Whether `f` is still pending after one poll.
    async fn pending<F: Future + Unpin>(f: &mut F) -> bool {
        std::future::poll_fn(|cx| {
            std::task::Poll::Ready(std::pin::Pin::new(&mut *f).poll(cx).is_pending())
        })
        .await
    }

    /// A chunk comes once the client wrote, at most `want` bytes of it; after reads that
    /// took all there was, the next one waits again (and gets the next bytes); the end of
    /// the stream is an empty chunk.
    #[tokio::test]
    async fn a_unix_reader_gets_chunks_once_the_client_writes() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let (mut reader, _writer) = UnixConn::new(ours).into_halves();
        {
            let mut wait = Box::pin(UnixConn::read_chunk(&mut reader, 4));
            assert!(pending(&mut wait).await);
            theirs.write_all(b"hello").await.unwrap();
            assert_eq!(&wait.await.unwrap()[..], b"hell");
        }
        assert_eq!(
            &UnixConn::read_chunk(&mut reader, 4).await.unwrap()[..],
            b"o"
        );
        {
            let mut wait = Box::pin(UnixConn::read_chunk(&mut reader, 4));
            assert!(pending(&mut wait).await);
            theirs.write_all(b"more").await.unwrap();
            assert_eq!(&wait.await.unwrap()[..], b"more");
        }
        theirs.shutdown().await.unwrap();
        assert!(UnixConn::read_chunk(&mut reader, 4)
            .await
            .unwrap()
            .is_empty());
    }

    /// A chunk shorter than the room given drains the socket: the reader's readiness is
    /// cleared with it, so the next wait costs no read that finds nothing (with the readiness
    /// left set, `readable` would return at once).
    #[tokio::test]
    async fn a_short_chunk_clears_the_readiness() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let (mut reader, _writer) = UnixConn::new(ours).into_halves();
        theirs.write_all(b"hi").await.unwrap();
        assert_eq!(
            &UnixConn::read_chunk(&mut reader, 4).await.unwrap()[..],
            b"hi"
        );
        let mut wait = Box::pin(reader.readable());
        assert!(pending(&mut wait).await);
        theirs.write_all(b"more").await.unwrap();
        wait.await.unwrap();
    }

    /// Finishing after the client's end leaves the socket open for the close; before it, the
    /// write side is shut down and the client sees the end at once.
    #[tokio::test]
    async fn finish_shuts_down_only_while_the_client_is_open() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let (reader, writer) = UnixConn::new(ours).into_halves();
        UnixConn::finish(writer, false).await;
        let mut got = Vec::new();
        let end = tokio::time::timeout(Duration::from_secs(10), theirs.read_to_end(&mut got));
        end.await
            .expect("the end, while the read half lives")
            .unwrap();
        assert!(got.is_empty());
        drop(reader);

        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let (reader, mut writer) = UnixConn::new(ours).into_halves();
        writer.write_all(b"last").await.unwrap();
        UnixConn::finish(writer, true).await;
        // Not ended yet: the read half still holds the socket open.
        let mut wait = Box::pin(theirs.read_to_end(&mut got));
        assert!(pending(&mut wait).await);
        drop(reader);
        wait.await.unwrap();
        assert_eq!(got, b"last");
    }
}
