//! The form the kernel keeps a rule in, for comparing a table read back with the one the
//! proxy wants. Only an address compared with `{ ... }` changes: nft writes a set of one as
//! a plain comparison, stores a set of addresses in no order, and merges a set with prefixes
//! into ranges; so what reads back is one prefix, the addresses sorted, or the prefixes that
//! cover the merged ranges. Every other statement reads back as written (`unlower`).

use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Subnets, Ipv6Subnets};

use crate::kube_proxy::nft::rule::{AddrValue, Rule, Stmt};
use crate::kube_proxy::nft::table::Table;

/// The fewest prefixes that cover exactly the ranges (in order, each `(low, high)` with both
/// ends included), of addresses of `addr_len` bytes.
pub fn covering(addr_len: usize, ranges: &[(u128, u128)]) -> Vec<IpNet> {
    let mut out = Vec::new();
    for &(low, high) in ranges {
        if addr_len == 4 {
            let (Ok(low), Ok(high)) = (u32::try_from(low), u32::try_from(high)) else {
                continue;
            };
            out.extend(
                Ipv4Subnets::new(Ipv4Addr::from(low), Ipv4Addr::from(high), 0).map(IpNet::V4),
            );
        } else {
            out.extend(
                Ipv6Subnets::new(Ipv6Addr::from(low), Ipv6Addr::from(high), 0).map(IpNet::V6),
            );
        }
    }
    out
}

/// An address value as it reads back from the kernel.
pub fn addr_value(value: &AddrValue) -> AddrValue {
    match value {
        AddrValue::Net(net) => AddrValue::Net(net.trunc()),
        AddrValue::Anonymous(nets) if nets.len() == 1 => AddrValue::Net(nets[0].trunc()),
        AddrValue::Anonymous(nets) => {
            if nets.iter().all(|n| n.prefix_len() == n.max_prefix_len()) {
                let mut hosts = nets.clone();
                hosts.sort();
                hosts.dedup();
                return AddrValue::Anonymous(hosts);
            }
            let addr_len = match nets.first() {
                Some(IpNet::V4(_)) => 4,
                _ => 16,
            };
            AddrValue::Anonymous(covering(addr_len, &super::intervals::merged(nets)))
        }
        AddrValue::Named(name) => AddrValue::Named(name.clone()),
    }
}

/// A rule as it reads back from the kernel.
pub fn rule(rule: &Rule) -> Rule {
    let mut out = rule.clone();
    for stmt in &mut out.stmts {
        if let Stmt::Addr { value, .. } = stmt {
            *value = addr_value(value);
        }
    }
    out
}

/// Every rule of a table as it reads back from the kernel.
pub fn table(table: &mut Table) {
    for chain in table.chains.values_mut() {
        for r in &mut chain.rules {
            let anonymous = r.stmts.iter().any(|s| {
                matches!(
                    s,
                    Stmt::Addr {
                        value: AddrValue::Anonymous(_) | AddrValue::Net(_),
                        ..
                    }
                )
            });
            if anonymous {
                *r = rule(r);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|s| s.parse().expect("a prefix")).collect()
    }

    #[test]
    fn a_set_reads_back_as_the_kernel_keeps_it() {
        assert_eq!(
            addr_value(&AddrValue::Anonymous(nets(&["10.1.2.3/8"]))),
            AddrValue::Net("10.0.0.0/8".parse().expect("a prefix"))
        );
        assert_eq!(
            addr_value(&AddrValue::Anonymous(nets(&[
                "10.0.0.2/32",
                "10.0.0.1/32",
                "10.0.0.2/32"
            ]))),
            AddrValue::Anonymous(nets(&["10.0.0.1/32", "10.0.0.2/32"]))
        );
        // Merged: covered, adjacent; the merged range as its fewest prefixes.
        assert_eq!(
            addr_value(&AddrValue::Anonymous(nets(&[
                "10.128.0.0/9",
                "10.0.0.0/9",
                "10.1.0.0/16",
                "5.6.7.8/32"
            ]))),
            AddrValue::Anonymous(nets(&["5.6.7.8/32", "10.0.0.0/8"]))
        );
        assert_eq!(
            addr_value(&AddrValue::Anonymous(nets(&["fd00::/65", "fd00::1/128"]))),
            AddrValue::Anonymous(nets(&["fd00::/65"]))
        );
        assert_eq!(
            covering(4, &[(1, 6)]),
            nets(&["0.0.0.1/32", "0.0.0.2/31", "0.0.0.4/31", "0.0.0.6/32"])
        );
    }
}
