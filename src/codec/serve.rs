//! The server side of a bidirectional `Packet` stream (`/ProxyService/Proxy`,
//! `/AgentService/Connect`), as tonic's generated service and `tonic::server::Grpc` serve it,
//! except that the response is encoded by [`PacketBody`]. The request is decoded by tonic's
//! `Streaming`, with its limits and errors; compression is refused as tonic refuses it when
//! none is enabled.

use std::future::Future;
use std::sync::Arc;

use futures_util::Stream;
use tonic::body::Body;
use tonic::codec::{Codec, Streaming};
use tonic::metadata::{MetadataValue, GRPC_CONTENT_TYPE};
use tonic::{Request, Response, Status};

use super::body::PacketBody;
use super::LeanCodec;
use crate::proto::Packet;

/// One bidirectional `Packet` method and what serves it.
pub trait Handler: Send + Sync + 'static {
    /// The method's path (`/ProxyService/Proxy`); any other path is unimplemented.
    const PATH: &'static str;
    /// The packets the response sends.
    type Packets: Stream<Item = Result<Packet, Status>> + Unpin + Send + 'static;

    fn serve(
        &self,
        request: Request<Streaming<Packet>>,
    ) -> impl Future<Output = Result<Response<Self::Packets>, Status>> + Send;
}

/// A [`Handler`] and the limit on the messages it is sent: what serves a port's requests.
pub struct Route<H> {
    handler: Arc<H>,
    max_message: usize,
}

impl<H> Route<H> {
    /// Serves `handler`, refusing any message over `max_message` bytes.
    pub fn new(handler: H, max_message: usize) -> Self {
        Route {
            handler: Arc::new(handler),
            max_message,
        }
    }
}

impl<H> Clone for Route<H> {
    fn clone(&self) -> Self {
        Route {
            handler: self.handler.clone(),
            max_message: self.max_message,
        }
    }
}

impl<H: Handler> Route<H> {
    /// The response to one request: the stream at [`Handler::PATH`], unimplemented elsewhere.
    pub fn respond(
        &self,
        request: http::Request<Body>,
    ) -> impl Future<Output = http::Response<Body>> + Send + 'static {
        let handler = self.handler.clone();
        let max_message = self.max_message;
        async move {
            if request.uri().path() != H::PATH {
                return unimplemented();
            }
            streaming(request, max_message, |request| handler.serve(request)).await
        }
    }
}

const ENCODING_HEADER: &str = "grpc-encoding";
const ACCEPT_ENCODING_HEADER: &str = "grpc-accept-encoding";

/// Serves one stream: decodes `request`'s body as packets (each at most `max_message`
/// bytes), hands it to `handler`, and answers with the packets it returns.
pub async fn streaming<H, F, S>(
    request: http::Request<Body>,
    max_message: usize,
    handler: H,
) -> http::Response<Body>
where
    H: FnOnce(Request<Streaming<Packet>>) -> F,
    F: Future<Output = Result<Response<S>, Status>>,
    S: Stream<Item = Result<Packet, Status>> + Unpin + Send + 'static,
{
    if let Err(status) = identity_only(request.headers()) {
        return status.into_http();
    }
    let request = request.map(|body| {
        Streaming::new_request(
            LeanCodec::<Packet, Packet>::default().decoder(),
            body,
            None,
            Some(max_message),
        )
    });
    match handler(Request::from_http(request)).await {
        Ok(response) => {
            let (metadata, packets, extensions) = response.into_parts();
            let mut response = http::Response::new(Body::new(PacketBody::response(packets)));
            *response.headers_mut() = metadata.into_headers();
            response
                .headers_mut()
                .insert(http::header::CONTENT_TYPE, GRPC_CONTENT_TYPE);
            *response.extensions_mut() = extensions;
            response
        }
        Err(status) => status.into_http(),
    }
}

/// The answer tonic gives a message compressed with an encoding it was not told to accept
/// (no compression is enabled on either side).
pub(super) fn identity_only(headers: &http::HeaderMap) -> Result<(), Status> {
    let Some(encoding) = headers.get(ENCODING_HEADER) else {
        return Ok(());
    };
    if encoding.as_bytes() == b"identity" {
        return Ok(());
    }
    let name = match std::str::from_utf8(encoding.as_bytes()) {
        Ok(name) => name.to_owned(),
        Err(_) => format!("{:?}", encoding.as_bytes()),
    };
    let mut status = Status::unimplemented(format!(
        "Content is compressed with `{name}` which isn't supported"
    ));
    status.metadata_mut().insert(
        ACCEPT_ENCODING_HEADER,
        MetadataValue::from_static("identity"),
    );
    Err(status)
}

/// The answer to a path no route serves, as tonic's generated services give it.
pub fn unimplemented() -> http::Response<Body> {
    let mut response = http::Response::new(Body::default());
    let headers = response.headers_mut();
    headers.insert(
        Status::GRPC_STATUS,
        (tonic::Code::Unimplemented as i32).into(),
    );
    headers.insert(http::header::CONTENT_TYPE, GRPC_CONTENT_TYPE);
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use prost::Message;

    fn grpc_request(encoding: Option<&str>, packets: &[Packet]) -> http::Request<Body> {
        let mut bytes = Vec::new();
        for packet in packets {
            let body = packet.encode_to_vec();
            bytes.push(0);
            bytes.extend_from_slice(&(body.len() as u32).to_be_bytes());
            bytes.extend_from_slice(&body);
        }
        let mut request = http::Request::new(Body::new(http_body_util::Full::new(
            bytes::Bytes::from(bytes),
        )));
        request
            .headers_mut()
            .insert("content-type", "application/grpc".parse().unwrap());
        request
            .headers_mut()
            .insert("x-test", "metadata".parse().unwrap());
        if let Some(encoding) = encoding {
            request
                .headers_mut()
                .insert(ENCODING_HEADER, encoding.parse().unwrap());
        }
        request
    }

    /// Echoes every packet back, and the request's `x-test` metadata as a response header.
    async fn echo(
        request: Request<Streaming<Packet>>,
    ) -> Result<Response<futures_util::stream::BoxStream<'static, Result<Packet, Status>>>, Status>
    {
        let seen = request.metadata().get("x-test").cloned();
        let inbound = request.into_inner();
        let mut response = Response::new(futures_util::StreamExt::boxed(inbound));
        if let Some(seen) = seen {
            response.metadata_mut().insert("x-seen", seen);
        }
        Ok(response)
    }

    #[tokio::test]
    async fn packets_in_packets_out_with_metadata_and_an_ok_status() {
        let packets = [
            crate::wire::close_request(1),
            crate::wire::data(2, vec![7u8; 10_000]),
        ];
        let response = streaming(grpc_request(None, &packets), 1 << 20, echo).await;
        assert_eq!(response.headers()["content-type"], "application/grpc");
        assert_eq!(response.headers()["x-seen"], "metadata");
        let collected = response.into_body().collect().await.unwrap();
        let trailers = collected.trailers().cloned().expect("trailers");
        assert_eq!(trailers["grpc-status"], "0");
        let bytes = collected.to_bytes();
        let mut decoded = Vec::new();
        let mut rest = &bytes[..];
        while !rest.is_empty() {
            let len = u32::from_be_bytes(rest[1..5].try_into().unwrap()) as usize;
            decoded.push(Packet::decode(&rest[5..5 + len]).unwrap());
            rest = &rest[5 + len..];
        }
        assert_eq!(decoded, packets);
    }

    #[tokio::test]
    async fn a_compressed_request_is_refused_as_tonic_refuses_it() {
        let response = streaming(grpc_request(Some("gzip"), &[]), 1 << 20, echo).await;
        let status = Status::from_header_map(response.headers()).expect("a status");
        assert_eq!(status.code(), tonic::Code::Unimplemented);
        assert_eq!(
            status.message(),
            "Content is compressed with `gzip` which isn't supported"
        );
        assert_eq!(response.headers()[ACCEPT_ENCODING_HEADER], "identity");
    }

    #[tokio::test]
    async fn a_message_over_the_limit_ends_the_stream_with_tonics_error() {
        let big = [crate::wire::data(1, vec![0u8; 5000])];
        let response = streaming(grpc_request(None, &big), 1000, echo).await;
        let collected = response.into_body().collect().await.unwrap();
        let trailers = collected.trailers().cloned().expect("trailers");
        // tonic's decoder says OUT_OF_RANGE; the handler passes its error on.
        assert_eq!(trailers["grpc-status"], "11");
    }

    #[tokio::test]
    async fn a_refused_stream_is_answered_with_its_status_alone() {
        let response =
            streaming(grpc_request(None, &[]), 1 << 20, |_| async {
                Err::<
                    Response<futures_util::stream::BoxStream<'static, Result<Packet, Status>>>,
                    Status,
                >(Status::unavailable("draining"))
            })
            .await;
        let status = Status::from_header_map(response.headers()).expect("a status");
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert_eq!(status.message(), "draining");
    }
}
