//! An anonymous set of prefixes as nft sends it: the prefixes as ranges, sorted, the
//! overlapping and adjacent ones merged (nft's automerge of anonymous interval sets), then
//! written as interval start and end elements: an end element at 0 first when the first
//! range does not start there, each range's start, and an end element just past each range
//! unless the range runs to the top of the address space (marked "open" in the element's
//! userdata instead). The kernel's interval set needs exactly this shape; `nft list` reads
//! it back as the merged prefixes.

use ipnet::IpNet;

use super::attr::Udata;
use super::consts::{UDATA_SET_ELEM_FLAGS, UDATA_SET_ELEM_F_INTERVAL_OPEN};
use super::sets::Element;

fn value(net: &IpNet) -> u128 {
    match net.network() {
        std::net::IpAddr::V4(ip) => u128::from(u32::from(ip)),
        std::net::IpAddr::V6(ip) => u128::from(ip),
    }
}

fn host_mask(net: &IpNet) -> u128 {
    let host_bits = u32::from(net.max_prefix_len() - net.prefix_len());
    if host_bits >= 128 {
        u128::MAX
    } else {
        (1u128 << host_bits) - 1
    }
}

fn key(addr_len: usize, value: u128) -> Vec<u8> {
    value.to_be_bytes()[16 - addr_len..].to_vec()
}

/// The merged ranges (low, high) of some prefixes, in order.
pub fn merged(nets: &[IpNet]) -> Vec<(u128, u128)> {
    let mut ranges: Vec<(u128, u128)> = nets
        .iter()
        .map(|n| {
            let low = value(n);
            (low, low | host_mask(n))
        })
        .collect();
    ranges.sort_by_key(|r| r.0);
    let mut out: Vec<(u128, u128)> = Vec::with_capacity(ranges.len());
    for range in ranges {
        match out.last_mut() {
            // Covered, overlapping or adjacent: one range.
            Some(prev) if range.0 <= prev.1.saturating_add(1) => {
                prev.1 = prev.1.max(range.1);
            }
            _ => out.push(range),
        }
    }
    out
}

/// The elements of the interval set of `nets` (addresses of `addr_len` bytes), and the size
/// nft declares for the set (its count of what it made: twice the ranges, and one for the
/// leading end element).
pub fn elements(addr_len: usize, nets: &[IpNet]) -> (Vec<Element>, usize) {
    let max = if addr_len == 4 {
        u128::from(u32::MAX)
    } else {
        u128::MAX
    };
    let ranges = merged(nets);
    let mut out = Vec::with_capacity(ranges.len() * 2 + 1);
    let leading = ranges.first().is_some_and(|r| r.0 != 0);
    if leading {
        out.push(Element {
            key: key(addr_len, 0),
            interval_end: true,
            value: None,
            udata: None,
        });
    }
    for (low, high) in &ranges {
        let open = *high == max;
        out.push(Element {
            key: key(addr_len, *low),
            interval_end: false,
            value: None,
            udata: open.then(|| {
                let mut udata = Udata::new();
                udata.put_u32(UDATA_SET_ELEM_FLAGS, UDATA_SET_ELEM_F_INTERVAL_OPEN);
                udata.bytes().to_vec()
            }),
        });
        if !open {
            out.push(Element {
                key: key(addr_len, high + 1),
                interval_end: true,
                value: None,
                udata: None,
            });
        }
    }
    let size = ranges.len() * 2 + usize::from(leading);
    (out, size)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|s| s.parse().expect("a prefix")).collect()
    }

    #[test]
    fn prefixes_are_merged_as_nft_merges_them() {
        // Covered, adjacent, apart: two ranges.
        let got = merged(&nets(&[
            "10.0.0.0/8",
            "11.0.0.0/8",
            "10.1.0.0/16",
            "128.0.0.0/1",
        ]));
        assert_eq!(
            got,
            vec![(0x0a00_0000, 0x0bff_ffff), (0x8000_0000, 0xffff_ffff)]
        );
        // Host bits are cleared, as nft clears them.
        assert_eq!(
            merged(&nets(&["10.1.2.3/8"])),
            vec![(0x0a00_0000, 0x0aff_ffff)]
        );
    }

    #[test]
    fn elements_are_starts_and_ends_with_a_leading_end_and_an_open_top() {
        let (elements, size) = elements(4, &nets(&["203.0.113.0/25", "5.6.7.8/32"]));
        let keys: Vec<(Vec<u8>, bool)> = elements
            .iter()
            .map(|e| (e.key.clone(), e.interval_end))
            .collect();
        assert_eq!(
            keys,
            vec![
                (vec![0, 0, 0, 0], true),
                (vec![5, 6, 7, 8], false),
                (vec![5, 6, 7, 9], true),
                (vec![203, 0, 113, 0], false),
                (vec![203, 0, 113, 128], true),
            ]
        );
        assert_eq!(size, 5);
        let (elements, size) = elements_open();
        assert_eq!(elements.len(), 4);
        assert_eq!(size, 5, "nft counts an end it did not add");
        assert!(elements[3].udata.is_some(), "the last range is open");
    }

    fn elements_open() -> (Vec<Element>, usize) {
        elements(4, &nets(&["10.0.0.0/8", "11.0.0.0/8", "128.0.0.0/1"]))
    }
}
