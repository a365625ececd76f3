//! The names of the per-port chains and affinity sets, and comment truncation, as upstream
//! makes them: operators' scripts, upstream's docs and `nft list` readers see the same names.
//!
//! A base name is `HASH-ns/svc/proto/port` (`HASH-ns/svc/proto/port__IP/port` for an
//! endpoint), where HASH is the first 8 characters of the standard base32 of the SHA-256 of
//! the rest. The `/` never occurs in the fixed names, which is how service chains are told
//! apart from them.

use std::net::IpAddr;

use sha2::{Digest, Sha256};

use crate::kube_proxy::model::{Endpoint, ServicePortName};

/// nftables' limit for a name, less room for the longest prefix (`external-` and the like).
const NAME_BASE_MAX: usize = 256 - 16;
/// nftables' limit for a comment.
pub const COMMENT_MAX: usize = 128;

pub const SERVICE_PREFIX: &str = "service-";
pub const LOCAL_PREFIX: &str = "local-";
pub const EXTERNAL_PREFIX: &str = "external-";
pub const FIREWALL_PREFIX: &str = "firewall-";
pub const ENDPOINT_PREFIX: &str = "endpoint-";
pub const AFFINITY_PREFIX: &str = "affinity-";

/// The first 5 bytes of a digest in RFC 4648 base32 (upstream takes 8 characters of the
/// padded encoding of the whole digest, which are these 40 bits).
fn hash8(text: &str) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let digest = Sha256::digest(text.as_bytes());
    let bits = digest[..5]
        .iter()
        .fold(0u64, |acc, &b| (acc << 8) | u64::from(b));
    (0..8)
        .rev()
        .map(|i| char::from(ALPHABET[((bits >> (i * 5)) & 31) as usize]))
        .collect()
}

fn hash_and_truncate(name: String) -> String {
    let mut out = hash8(&name);
    out.push('-');
    out.push_str(&name);
    if out.len() > NAME_BASE_MAX {
        // Names are ASCII (API names, protocols, addresses), so any byte is a boundary.
        out.truncate(NAME_BASE_MAX - 3);
        out.push_str("...");
    }
    out
}

/// `HASH-ns/svc/proto/port`.
pub fn port_base(name: &ServicePortName) -> String {
    hash_and_truncate(format!(
        "{}/{}/{}/{}",
        name.service.namespace(),
        name.service.name(),
        name.protocol.nft(),
        name.port
    ))
}

/// `HASH-ns/svc/proto/port__IP/port`, with an IPv6 address's colons as dots.
pub fn endpoint_base(name: &ServicePortName, endpoint: &Endpoint) -> String {
    let ip = match endpoint.ip {
        IpAddr::V4(ip) => ip.to_string(),
        IpAddr::V6(ip) => ip.to_string().replace(':', "."),
    };
    hash_and_truncate(format!(
        "{}/{}/{}/{}__{}/{}",
        name.service.namespace(),
        name.service.name(),
        name.protocol.nft(),
        name.port,
        ip,
        endpoint.port
    ))
}

/// The chains and sets of one Service port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortChains {
    pub cluster: String,
    pub local: String,
    pub external: String,
    pub firewall: String,
}

impl PortChains {
    pub fn new(name: &ServicePortName) -> PortChains {
        let base = port_base(name);
        PortChains {
            cluster: format!("{SERVICE_PREFIX}{base}"),
            local: format!("{LOCAL_PREFIX}{base}"),
            external: format!("{EXTERNAL_PREFIX}{base}"),
            firewall: format!("{FIREWALL_PREFIX}{base}"),
        }
    }
}

/// An endpoint's chain and affinity set (made only for Services with ClientIP affinity).
pub fn endpoint_chain_and_set(name: &ServicePortName, endpoint: &Endpoint) -> (String, String) {
    let base = endpoint_base(name, endpoint);
    (
        format!("{ENDPOINT_PREFIX}{base}"),
        format!("{AFFINITY_PREFIX}{base}"),
    )
}

/// Whether a chain is one of the per-port or per-endpoint chains.
pub fn is_service_chain(name: &str) -> bool {
    name.contains('/')
}

pub fn is_affinity_set(name: &str) -> bool {
    name.starts_with(AFFINITY_PREFIX)
}

/// A comment cut to nftables' limit (at a character boundary).
pub fn truncate_comment(comment: &str) -> String {
    if comment.len() <= COMMENT_MAX {
        return comment.to_owned();
    }
    let mut end = COMMENT_MAX;
    while !comment.is_char_boundary(end) {
        end -= 1;
    }
    comment[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube_proxy::model::{Protocol, ServiceName};

    fn ep(ip: &str, port: u16) -> Endpoint {
        Endpoint {
            ip: ip.parse().unwrap(),
            port,
            is_local: false,
            ready: true,
            serving: true,
            terminating: false,
            hints: None,
        }
    }

    #[test]
    fn names_are_upstreams() {
        // The names upstream's documentation and tests show for these objects.
        let name = ServicePortName::new(ServiceName::new("ns1", "svc1"), "p80", Protocol::Tcp);
        assert_eq!(port_base(&name), "ULMVA6XW-ns1/svc1/tcp/p80");
        assert_eq!(
            endpoint_base(&name, &ep("10.180.0.1", 80)),
            "5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80"
        );
        let chains = PortChains::new(&name);
        assert_eq!(chains.external, "external-ULMVA6XW-ns1/svc1/tcp/p80");
        assert!(is_service_chain(&chains.firewall));
        assert!(!is_service_chain("services"));
    }

    #[test]
    fn ipv6_endpoints_have_dots_and_long_names_are_cut() {
        let name = ServicePortName::new(ServiceName::new("ns1", "svc1"), "p80", Protocol::Tcp);
        assert!(endpoint_base(&name, &ep("fd00:10:180::1", 80)).ends_with("__fd00.10.180..1/80"));
        let long = "x".repeat(63);
        let name = ServicePortName::new(
            ServiceName::new(long.clone(), long.clone()),
            long,
            Protocol::Sctp,
        );
        let base = endpoint_base(&name, &ep("fd00:1234:5678:9abc:def0:1234:5678:9abc", 65535));
        assert_eq!(base.len(), NAME_BASE_MAX);
        assert!(base.ends_with("..."));
    }

    #[test]
    fn comments_are_cut_at_the_limit() {
        assert_eq!(truncate_comment("ns/svc:p").len(), 8);
        assert_eq!(truncate_comment(&"a".repeat(300)).len(), COMMENT_MAX);
    }
}
