//! The addresses of this network namespace's interfaces: where NodePorts may answer, and
//! which addresses are the node's own when tracing.

use std::net::{IpAddr, Ipv4Addr};

use super::model::unmap;

/// The addresses of the node's interfaces (in the network namespace the proxy runs in).
pub fn interface_addresses() -> Vec<IpAddr> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for ifa in addrs {
        let Some(addr) = ifa.address else {
            continue;
        };
        if let Some(v4) = addr.as_sockaddr_in() {
            out.push(IpAddr::V4(Ipv4Addr::from(v4.ip())));
        } else if let Some(v6) = addr.as_sockaddr_in6() {
            out.push(unmap(IpAddr::V6(v6.ip())));
        }
    }
    out.sort();
    out.dedup();
    out
}
