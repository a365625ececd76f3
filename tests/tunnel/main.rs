//! Protocol-level tests over real sockets and real TLS: a test agent on the agent port (mTLS),
//! test frontends on the Unix socket, and the server in between.
//!
//! Tests named `row_*` follow upstream's disconnect table (what each side gets when the other
//! goes away, at each point of a tunnel's life) row by row;
//! `misbehaving_*` cover peers that break the protocol, each contained to its own stream.
//! Every test ends with `Harness::finish`: the gauges return to 0, every stream task ends,
//! and after shutdown the runtime is back to its baseline task count.
//!
//! One test binary, a module per area; `support` holds what they share.
#![allow(clippy::unwrap_used)] // tests and benchmarks fail loudly by design

#[path = "../common/mod.rs"]
mod common;
mod support;

mod disconnects;
mod drain;
mod grpc_limits;
mod health;
mod misbehaving;
mod raw_streams;
