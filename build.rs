//! Compiles the wire contract with protox, so a fresh machine needs no system protoc, and
//! lays out the agent's code for a small idle working set.

use std::env;
use std::path::Path;

/// The functions an idle agent runs, placed first in its text: see the file's header.
const AGENT_SYMBOL_ORDER: &str = "src/bin/konnectivity-agent.symbol-order";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    order_agent_symbols()?;
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

/// Links the agent's idle functions next to each other. The kernel maps a program's text
/// about 64 KiB around each page it faults in, so an idle agent whose few hundred kilobytes of
/// idle code are scattered over ten megabytes of text keeps most of it resident; together they
/// fill a few such windows. Only for release builds linked by rustc's bundled lld (the default
/// linker of x86_64-unknown-linux-gnu): another linker may not know the option, and a name the
/// build no longer has is skipped without a warning, so a stale list costs memory, never
/// correctness.
fn order_agent_symbols() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed={AGENT_SYMBOL_ORDER}");
    println!("cargo:rerun-if-env-changed=RUSTC_LINKER");
    let release = env::var("PROFILE").is_ok_and(|p| p == "release");
    let bundled_lld = env::var("TARGET").is_ok_and(|t| t == "x86_64-unknown-linux-gnu")
        && env::var_os("RUSTC_LINKER").is_none()
        && !env::var("CARGO_ENCODED_RUSTFLAGS").is_ok_and(|f| f.contains("linker"));
    if release && bundled_lld {
        let order = Path::new(&env::var("CARGO_MANIFEST_DIR")?).join(AGENT_SYMBOL_ORDER);
        for arg in [
            format!("-Wl,--symbol-ordering-file={}", order.display()),
            "-Wl,--no-warn-symbol-ordering".to_owned(),
        ] {
            println!("cargo:rustc-link-arg-bin=konnectivity-agent={arg}");
        }
    }
    Ok(())
}
