//! Compiles the wire contract with protox, so a fresh machine needs no system protoc.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(["client.proto", "agent.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // AgentService's rpc is called `Connect`, which clashes with the `connect()`
        // constructor tonic generates for transports; clients are built with `new(channel)`.
        .build_transport(false)
        // DATA payloads are relayed, never inspected: Bytes lets them move without a copy.
        .bytes(".Data.data")
        // prost with small initial codec buffers (src/codec.rs): tonic's 8 KiB per direction
        // and stream would be most of an idle tunnel's memory.
        .codec_path("crate::codec::LeanCodec")
        .compile_fds(descriptors)?;
    Ok(())
}
