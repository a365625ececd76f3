//! The client side of a bidirectional `Packet` stream (the agent's `/AgentService/Connect`),
//! as tonic's generated client and `tonic::client::Grpc` open it, except that the request is
//! encoded by [`PacketBody`].

use futures_util::Stream;
use tonic::body::Body;
use tonic::codec::{Codec, Streaming};
use tonic::metadata::GRPC_CONTENT_TYPE;
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status};
use tower::ServiceExt;

use super::body::{infallible, PacketBody};
use super::serve::identity_only;
use super::LeanCodec;
use crate::proto::Packet;

/// Opens the stream at `path` on `channel`, sending `request`'s packets. Resolves once the
/// server has answered with its headers: `Err` when it refused the stream.
pub async fn streaming<S>(
    channel: Channel,
    path: &'static str,
    request: Request<S>,
) -> Result<Response<Streaming<Packet>>, Status>
where
    S: Stream<Item = Packet> + Unpin + Send + 'static,
{
    let (metadata, extensions, packets) = request.into_parts();
    let mut request = http::Request::new(Body::new(PacketBody::request(infallible(packets))));
    *request.method_mut() = http::Method::POST;
    *request.version_mut() = http::Version::HTTP_2;
    *request.uri_mut() = http::Uri::from_static(path);
    *request.headers_mut() = metadata.into_headers();
    *request.extensions_mut() = extensions;
    let headers = request.headers_mut();
    headers.insert(http::header::TE, http::HeaderValue::from_static("trailers"));
    headers.insert(http::header::CONTENT_TYPE, GRPC_CONTENT_TYPE);

    let mut channel = channel
        .ready_oneshot()
        .await
        .map_err(|e| Status::unknown(format!("Service was not ready: {e}")))?;
    let response = tower::Service::call(&mut channel, request)
        .await
        .map_err(|e| Status::from_error(Box::new(e)))?;

    identity_only(response.headers())?;
    let status_code = response.status();
    // A `grpc-status` in the headers is a trailers-only answer: the stream is over.
    let trailers_only = match Status::from_header_map(response.headers()) {
        Some(status) if status.code() != Code::Ok => return Err(status),
        Some(_) => true,
        None => false,
    };
    let decoder = LeanCodec::<Packet, Packet>::default().decoder();
    let (parts, body) = response.into_parts();
    let packets = if trailers_only {
        Streaming::new_empty(decoder, body)
    } else {
        Streaming::new_response(decoder, body, status_code, None, None)
    };
    Ok(Response::from_parts(
        tonic::metadata::MetadataMap::from_headers(parts.headers),
        packets,
        parts.extensions,
    ))
}
