//! kube-proxy: the node's Service proxy, a drop-in for upstream's kube-proxy v1.37 in its
//! nftables mode. The layers follow upstream's `pkg/proxy`, bottom up:
//!
//! - `model`: the vocabulary (families, protocols, Service ports, endpoints);
//! - `api`: what the API says, read once into typed values (`objects`), kept (`store`) and
//!   watched;
//! - `topology`: which endpoints a port sends traffic to from this node (a pure function);
//! - `nft`: nftables' objects, rules and transactions, the table as data, and the kernel;
//! - `ruleset`: the table rendered from the wanted state and planned as one transaction per
//!   sync, with no I/O;
//! - `trace`: a packet walked through a table (the rendered one or the kernel's);
//! - `conntrack`: stale UDP entries removed over netlink after a sync, and the conntrack
//!   sysctls set at start-up;
//! - `options`, `config`: the command line, the KubeProxyConfiguration file and our TOML,
//!   upstream's validation, and the typed `ProxyConfig` the rest runs on;
//! - the proxier, the runner that decides when to sync, and the process around them.

pub mod api;
pub mod cleanup;
pub mod config;
pub mod conntrack;
pub mod events;
pub mod forward_accept;
pub mod healthz;
pub mod interfaces;
pub mod metrics;
pub mod model;
pub mod nft;
pub mod node_service;
pub mod node_settings;
pub mod options;
pub mod proxier;
pub mod ruleset;
pub mod run;
pub mod runner;
pub mod servers;
pub mod service;
pub mod service_health;
pub mod shared;
pub mod topology;
pub mod trace;
pub mod trace_cli;

#[doc(hidden)]
pub mod testing;
