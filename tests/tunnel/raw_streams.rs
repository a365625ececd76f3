//! Streams written by hand. grpc-go sends an invalid :authority on a UDS and h2 clients send
//! :authority before :path, which the server's header recoder must take; agents that send
//! broken gRPC messages get a gRPC error on their stream only.

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frontend_plain_h2_client_over_uds() {
    let h = Harness::start().await;
    let fe = Frontend::connect(h.uds.clone()).await;
    let mut t = fe.open().await;
    t.send(dial_req(ADDRESS, 1)).await;
    assert_eq!(t.recv().await, dial_rsp(1, 0, NO_AGENT_AVAILABLE));
    drop((t, fe));
    h.finish().await;
}

/// A gRPC codec that sends raw bytes as the message (to break the protocol on purpose) and
/// decodes packets.
#[derive(Clone, Default)]
struct RawCodec;

struct RawEncoder;

impl tonic::codec::Encoder for RawEncoder {
    type Item = bytes::Bytes;
    type Error = tonic::Status;

    fn encode(
        &mut self,
        item: bytes::Bytes,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        use bytes::BufMut;
        dst.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Codec for RawCodec {
    type Encode = bytes::Bytes;
    type Decode = Packet;
    type Encoder = RawEncoder;
    type Decoder = <tonic_prost::ProstCodec<Packet, Packet> as tonic::codec::Codec>::Decoder;

    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic::codec::Codec::decoder(&mut tonic_prost::ProstCodec::<Packet, Packet>::default())
    }
}

/// Sends `message` as the first message of an agent stream; returns how the stream ended.
async fn agent_stream_end_after(h: &Harness, message: bytes::Bytes) -> tonic::Status {
    use http::uri::PathAndQuery;
    use tokio_stream::wrappers::ReceiverStream;
    let mut grpc =
        tonic::client::Grpc::new(h.agent_channel().await).max_encoding_message_size(64 << 20);
    within("ready", grpc.ready()).await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(1);
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    request
        .metadata_mut()
        .insert("agentid", "broken".parse().unwrap());
    let response = within(
        "Connect",
        grpc.streaming(
            request,
            PathAndQuery::from_static("/AgentService/Connect"),
            RawCodec,
        ),
    )
    .await
    .expect("the stream opens");
    let mut stream = response.into_inner();
    tx.send(message).await.unwrap();
    loop {
        match within("the end of the stream", stream.message()).await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the agent stream ended with OK after a broken message"),
            Err(status) => return status,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misbehaving_agent_broken_messages_end_its_stream_with_a_grpc_error() {
    let h = Harness::start().await;
    // Field 1 with wire type 7, which does not exist: not a packet.
    let status = agent_stream_end_after(&h, bytes::Bytes::from_static(b"\x0f")).await;
    assert_eq!(status.code(), tonic::Code::Internal, "{status:?}");
    // Over the 4 MiB message limit, as grpc-go says it.
    let status = agent_stream_end_after(&h, bytes::Bytes::from(vec![0u8; 5 << 20])).await;
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misbehaving_agent_a_flood_of_bad_packets_is_counted_not_logged_each() {
    let h = Harness::start().await;
    let agent = h.agent("flooder").await;
    const N: u64 = 20_000;
    for _ in 0..N {
        agent
            .send(Packet {
                r#type: 99,
                payload: None,
            })
            .await;
    }
    let counted = || {
        h.metrics()
            .tunnel
            .peer_violations
            .with_label_values(&["agent", "unknown_packet_type"])
            .get()
    };
    eventually(
        "every bad packet counted",
        || counted() == N,
        || format!("{} counted", counted()),
    )
    .await;
    // The log allowance is one line a second with bursts of ten, server-wide; how many lines
    // this cost depends on how long the flood took, never on how many packets it had.
    let allowance = h.metrics().tunnel.peer_violation_lines();
    assert!(allowance >= 1, "the first violation is logged");
    assert!(
        allowance <= 10 + 60,
        "{allowance} lines for {N} bad packets"
    );
    drop(agent);
    h.finish().await;
}
