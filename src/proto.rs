//! The wire contract, generated from `proto/` at build time.
#![allow(clippy::all, clippy::unwrap_used)]

tonic::include_proto!("_");
