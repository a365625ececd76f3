//! A stream of packets as an HTTP/2 body of gRPC messages: what tonic's encoder does (messages
//! ready together go out in one chunk of up to [`YIELD_THRESHOLD`] bytes, from a buffer of
//! [`INITIAL_BUFFER`] bytes allocated at the first message), with large DATA payloads handed
//! to h2 as they are ([`super::split`]).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use futures_util::Stream;
use http_body::Frame;
use tonic::Status;

use super::{split, INITIAL_BUFFER, YIELD_THRESHOLD};
use crate::proto::Packet;

/// Which side of the stream the body is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// A response: ends with trailers, `grpc-status` 0 or the stream's error.
    Server,
    /// A request: ends with the last message; an error ends the body with it.
    Client,
}

#[derive(Debug)]
enum State {
    Streaming,
    /// The packets ended; what is buffered goes first, then these trailers (a response).
    /// Boxed: a `Status` is larger than all the rest of the body, which every idle tunnel
    /// holds.
    Ending(Option<Box<Status>>),
    Done,
}

/// The body of a `Proxy` or `Connect` stream, from its packets.
pub struct PacketBody<S> {
    packets: S,
    buf: BytesMut,
    /// A payload that follows the buffer's last message.
    payload: Option<Bytes>,
    state: State,
    role: Role,
}

impl<S> PacketBody<S>
where
    S: Stream<Item = Result<Packet, Status>> + Unpin,
{
    /// A response body: trailers end it.
    pub fn response(packets: S) -> Self {
        Self::new(packets, Role::Server)
    }

    /// A request body.
    pub fn request(packets: S) -> Self {
        Self::new(packets, Role::Client)
    }

    fn new(packets: S, role: Role) -> Self {
        PacketBody {
            packets,
            buf: BytesMut::new(),
            payload: None,
            state: State::Streaming,
            role,
        }
    }

    fn take_buffered(&mut self) -> Option<Bytes> {
        (!self.buf.is_empty()).then(|| self.buf.split().freeze())
    }
}

fn data(bytes: Bytes) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
    Poll::Ready(Some(Ok(Frame::data(bytes))))
}

impl<S> http_body::Body for PacketBody<S>
where
    S: Stream<Item = Result<Packet, Status>> + Unpin,
{
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        loop {
            if let Some(payload) = this.payload.take() {
                return data(payload);
            }
            match &mut this.state {
                State::Streaming => {}
                State::Ending(status) => {
                    if !this.buf.is_empty() {
                        return data(this.buf.split().freeze());
                    }
                    let status = status.take().map(|status| *status);
                    this.state = State::Done;
                    return Poll::Ready(match (this.role, status) {
                        (Role::Server, status) => {
                            let status = status.unwrap_or_else(|| Status::ok(""));
                            let mut trailers = http::HeaderMap::with_capacity(3);
                            Some(match status.add_header(&mut trailers) {
                                Ok(()) => Ok(Frame::trailers(trailers)),
                                Err(unrenderable) => Err(unrenderable),
                            })
                        }
                        (Role::Client, Some(status)) => Some(Err(status)),
                        (Role::Client, None) => None,
                    });
                }
                State::Done => return Poll::Ready(None),
            }
            match Pin::new(&mut this.packets).poll_next(cx) {
                Poll::Ready(Some(Ok(packet))) => {
                    if this.buf.capacity() == 0 {
                        this.buf.reserve(INITIAL_BUFFER);
                    }
                    if let Some(payload) = split::encode(packet, &mut this.buf) {
                        this.payload = Some(payload);
                        return data(this.buf.split().freeze());
                    }
                    if this.buf.len() >= YIELD_THRESHOLD {
                        return data(this.buf.split().freeze());
                    }
                }
                Poll::Ready(Some(Err(status))) => {
                    this.state = State::Ending(Some(Box::new(status)))
                }
                Poll::Ready(None) => this.state = State::Ending(None),
                Poll::Pending => {
                    return match this.take_buffered() {
                        Some(bytes) => data(bytes),
                        None => Poll::Pending,
                    };
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.state, State::Done) && self.payload.is_none()
    }
}

/// Ends once `packets` does; for streams whose items cannot fail (a request's packets).
pub fn infallible<S: Stream<Item = Packet>>(
    packets: S,
) -> impl Stream<Item = Result<Packet, Status>> {
    futures_util::StreamExt::map(packets, Ok)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::split::tests::tonic_bytes;
    use crate::wire;
    use http_body_util::BodyExt;

    async fn collect(
        body: PacketBody<impl Stream<Item = Result<Packet, Status>> + Unpin>,
    ) -> (Vec<u8>, Option<http::HeaderMap>, Option<Status>) {
        let mut body = body;
        let mut bytes = Vec::new();
        let mut trailers = None;
        loop {
            match body.frame().await {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(chunk) => bytes.extend_from_slice(&chunk),
                    Err(frame) => trailers = frame.into_trailers().ok(),
                },
                Some(Err(status)) => return (bytes, trailers, Some(status)),
                None => return (bytes, trailers, None),
            }
        }
    }

    fn packets() -> Vec<Packet> {
        vec![
            wire::close_request(1),
            wire::data(2, vec![1u8; 10]),
            wire::data(3, vec![2u8; split::SPLIT_PAYLOAD * 3]),
            wire::data(4, vec![3u8; 20]),
            wire::data(5, vec![4u8; 100_000]),
        ]
    }

    #[tokio::test]
    async fn a_response_is_its_messages_then_an_ok_status() {
        let all = packets();
        let body =
            PacketBody::response(futures_util::stream::iter(all.clone().into_iter().map(Ok)));
        let (bytes, trailers, error) = collect(body).await;
        let want: Vec<u8> = all.iter().flat_map(tonic_bytes).collect();
        assert_eq!(bytes, want);
        assert!(error.is_none());
        let trailers = trailers.expect("trailers");
        assert_eq!(trailers.get("grpc-status").unwrap(), "0");
    }

    #[tokio::test]
    async fn a_response_ends_with_its_streams_error() {
        let items = vec![
            Ok(wire::close_request(1)),
            Err(Status::resource_exhausted("too big")),
            Ok(wire::close_request(2)),
        ];
        let body = PacketBody::response(futures_util::stream::iter(items));
        let (bytes, trailers, error) = collect(body).await;
        assert_eq!(
            bytes,
            tonic_bytes(&wire::close_request(1)),
            "nothing after the error"
        );
        assert!(error.is_none());
        let trailers = trailers.expect("trailers");
        assert_eq!(trailers.get("grpc-status").unwrap(), "8");
        // Percent-encoded, as tonic writes it.
        assert_eq!(trailers.get("grpc-message").unwrap(), "too%20big");
    }

    #[tokio::test]
    async fn a_request_has_no_trailers() {
        let all = packets();
        let body = PacketBody::request(infallible(futures_util::stream::iter(all.clone())));
        let (bytes, trailers, error) = collect(body).await;
        assert_eq!(bytes, all.iter().flat_map(tonic_bytes).collect::<Vec<_>>());
        assert!(trailers.is_none() && error.is_none());
    }

    #[tokio::test]
    async fn what_is_ready_goes_out_before_the_body_waits() {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let mut body =
            PacketBody::request(infallible(tokio_stream::wrappers::ReceiverStream::new(rx)));
        tx.send(wire::close_request(1)).await.unwrap();
        tx.send(wire::close_request(2)).await.unwrap();
        let chunk = body.frame().await.unwrap().unwrap().into_data().unwrap();
        let mut want = tonic_bytes(&wire::close_request(1));
        want.extend(tonic_bytes(&wire::close_request(2)));
        assert_eq!(chunk.to_vec(), want, "both ready messages in one chunk");
        assert!(futures_util::poll!(body.frame()).is_pending());
        drop(tx);
        assert!(body.frame().await.is_none());
        assert!(http_body::Body::is_end_stream(&body));
    }
}
