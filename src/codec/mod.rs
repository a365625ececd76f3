//! The gRPC message codec of every service: prost, with small initial codec buffers.
//!
//! tonic allocates `buffer_size` bytes per RPC up front for the decoder and again for the
//! encoder (8 KiB each by default) and keeps them for the stream's life, so every idle tunnel
//! and every agent held 16 KiB for its packets of a few dozen bytes. The buffers still grow to
//! whatever a message needs (a 32 KiB DATA packet), and are reused once drained; only the
//! initial allocation is smaller. The wire format is prost's, unchanged.
//!
//! What the programs send on their own streams (a `Proxy` or `Connect` response, the agent's
//! `Connect` request) is encoded by [`body::PacketBody`] instead of tonic's encoder: the same
//! bytes, with a large DATA payload handed to h2 without a copy ([`split`]).

use std::marker::PhantomData;

pub mod body;
pub mod call;
pub mod serve;
pub mod split;

use tonic::codec::{BufferSettings, Codec};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// Enough for the control packets (DIAL_REQ, DIAL_RSP, CLOSE_*) in one allocation.
pub(crate) const INITIAL_BUFFER: usize = 256;
/// tonic's default: encoded messages are handed to h2 once this many bytes are buffered.
pub(crate) const YIELD_THRESHOLD: usize = 32 * 1024;

/// [`ProstCodec`] with [`INITIAL_BUFFER`]; named by `build.rs` (`codec_path`).
#[derive(Debug, Clone)]
pub struct LeanCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for LeanCodec<T, U> {
    fn default() -> Self {
        LeanCodec(PhantomData)
    }
}

fn settings() -> BufferSettings {
    BufferSettings::new(INITIAL_BUFFER, YIELD_THRESHOLD)
}

impl<T, U> Codec for LeanCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(settings())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(settings())
    }
}
