//! pflag's typed values beyond Go's basic syntax (`goflag.rs`), as Kubernetes components
//! declare them: `int32`, component-base's `Level` (an unsigned 31-bit verbosity) and
//! `pattern=N,...`, `ip` and `ipport` (`k8s.io/kubernetes/pkg/util/flag`), `mapStringBool`
//! (`--feature-gates`). Each returns the text pflag prints after `invalid argument "v" for
//! "--flag" flag: ` when it refuses a value.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::goflag::{go_int, parse_go_bool};

/// pflag's int32 flags: Go's `strconv.ParseInt(text, 0, 32)`.
pub fn go_int32(text: &str) -> Result<i32, String> {
    let value = go_int(text)?;
    i32::try_from(value)
        .map_err(|_| format!("strconv.ParseInt: parsing {text:?}: value out of range"))
}

/// Go's `strconv.ParseUint(text, 10, bits)`: decimal digits only, no sign.
fn go_uint_base10(text: &str, bits: u32) -> Result<u64, String> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "strconv.ParseUint: parsing {text:?}: invalid syntax"
        ));
    }
    let max = (1u64 << bits) - 1;
    match text.parse::<u64>() {
        Ok(value) if value <= max => Ok(value),
        _ => Err(format!(
            "strconv.ParseUint: parsing {text:?}: value out of range"
        )),
    }
}

/// component-base's `-v` (`VerbosityLevel`): `strconv.ParseUint(text, 10, 31)`. Unlike klog's
/// own `-v`, a negative level is refused.
pub fn go_verbosity(text: &str) -> Result<u32, String> {
    go_uint_base10(text, 31).map(|v| v as u32)
}

/// component-base's `--vmodule` (`pattern=N,...`): each non-empty item is `pattern=N` with N an
/// unsigned 31-bit integer. Returns the text unchanged: it is kept as given.
pub fn go_vmodule(text: &str) -> Result<String, String> {
    for item in text.split(',').filter(|item| !item.is_empty()) {
        let parts: Vec<&str> = item.split('=').collect();
        if parts.len() != 2 || parts[0].is_empty() || parts[1].is_empty() {
            return Err(format!("{item:?} does not have the pattern=N format"));
        }
        go_uint_base10(parts[1], 31)
            .map_err(|cause| format!("parsing verbosity in {item:?}: {cause}"))?;
    }
    Ok(text.to_string())
}

/// Go's `net.ParseIP` as Kubernetes calls it (`netutils.ParseIPSloppy`): dotted IPv4 (leading
/// zeros allowed, read as decimal), IPv6, and IPv4-mapped IPv6. No brackets, no zone.
pub fn parse_ip_sloppy(text: &str) -> Option<IpAddr> {
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(ip);
    }
    // Leading zeros ("010.001.000.001"), which Rust refuses and Go's sloppy parser takes as
    // decimal.
    let octets: Vec<&str> = text.split('.').collect();
    if octets.len() != 4 {
        return None;
    }
    let mut bytes = [0u8; 4];
    for (slot, octet) in bytes.iter_mut().zip(&octets) {
        if octet.is_empty() || octet.len() > 3 || !octet.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *slot = octet.parse().ok()?;
    }
    Some(IpAddr::from(bytes))
}

/// Go's `net.SplitHostPort`, with its error texts.
pub fn split_host_port(text: &str) -> Result<(&str, &str), String> {
    let missing_port = || format!("address {text}: missing port in address");
    let too_many = || format!("address {text}: too many colons in address");
    let Some(colon) = text.rfind(':') else {
        return Err(missing_port());
    };
    let (host, port) = (&text[..colon], &text[colon + 1..]);
    if let Some(inner) = host.strip_prefix('[') {
        let Some(inner) = inner.strip_suffix(']') else {
            return Err(format!("address {text}: missing ']' in address"));
        };
        if inner.contains('[') || inner.contains(']') {
            return Err(format!("address {text}: unexpected '[' in address"));
        }
        return Ok((inner, port));
    }
    if host.contains(':') {
        return Err(too_many());
    }
    if host.contains('[') {
        return Err(format!("address {text}: unexpected '[' in address"));
    }
    if host.contains(']') || port.contains(']') {
        return Err(format!("address {text}: unexpected ']' in address"));
    }
    Ok((host, port))
}

/// Go's `net.JoinHostPort`: brackets around a host with a colon.
pub fn join_host_port(host: &str, port: impl std::fmt::Display) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The `ip` flag type: an IP address, or empty (which leaves the setting as it was).
pub fn ip_flag(text: &str) -> Result<String, String> {
    if text.is_empty() || parse_ip_sloppy(text).is_some() {
        return Ok(text.to_string());
    }
    Err(format!("{text:?} is not a valid IP address"))
}

/// The `ipport` flag type: `ip`, `ip:port` or `[ipv6]:port`, or empty (which leaves the
/// setting as it was).
pub fn ipport_flag(text: &str) -> Result<String, String> {
    if text.is_empty() || parse_ip_sloppy(text).is_some() {
        return Ok(text.to_string());
    }
    let (host, port) = split_host_port(text)
        .map_err(|e| format!("{text:?} is not in a valid format (ip or ip:port): {e}"))?;
    if parse_ip_sloppy(host).is_none() {
        return Err(format!("{host:?} is not a valid IP address"));
    }
    // netutils.ParsePort(port, true): a base-10 number from 0 to 65535.
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) || port.parse::<u16>().is_err()
    {
        return Err(format!("{port:?} is not a valid number"));
    }
    Ok(text.to_string())
}

/// One `--feature-gates` value: `Name=bool` pairs, comma separated, names and values trimmed.
/// Repeats of the flag add to the map, as pflag's `mapStringBool` does.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BoolMap(pub BTreeMap<String, bool>);

impl BoolMap {
    /// pflag's `mapStringBool.Set`, with its messages.
    pub fn parse(text: &str) -> Result<BoolMap, String> {
        let mut map = BTreeMap::new();
        for pair in text.split(',').filter(|pair| !pair.is_empty()) {
            let Some((key, value)) = pair.split_once('=') else {
                return Err("malformed pair, expect string=bool".into());
            };
            let (key, value) = (key.trim(), value.trim());
            let value = parse_go_bool(value).ok_or_else(|| {
                format!(
                    "invalid value of {key}: {value}, err: strconv.ParseBool: parsing {value:?}: invalid syntax"
                )
            })?;
            map.insert(key.to_string(), value);
        }
        Ok(BoolMap(map))
    }

    /// Several values of the flag, merged in order (a later value of a name wins).
    pub fn merged<'a>(maps: impl IntoIterator<Item = &'a BoolMap>) -> BTreeMap<String, bool> {
        let mut all = BTreeMap::new();
        for map in maps {
            all.extend(map.0.iter().map(|(k, v)| (k.clone(), *v)));
        }
        all
    }
}

/// Serde for a repeated `mapStringBool` flag: written as one table (`{ Name = true }`), read
/// from a table or from the flag's own text (`"Name=true,Other=false"`, the environment's form).
pub mod bool_maps {
    use super::*;

    pub fn serialize<S: serde::Serializer>(
        maps: &[BoolMap],
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        BoolMap::merged(maps).serialize(serializer)
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<BoolMap>, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Form {
            Text(String),
            Table(BTreeMap<String, bool>),
        }
        Ok(match Form::deserialize(deserializer)? {
            Form::Text(text) => vec![BoolMap::parse(&text).map_err(serde::de::Error::custom)?],
            Form::Table(map) => vec![BoolMap(map)],
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn int32_is_range_checked_in_go_words() {
        assert_eq!(go_int32("14"), Ok(14));
        assert_eq!(go_int32("-999"), Ok(-999));
        assert_eq!(go_int32("0x10"), Ok(16));
        assert_eq!(
            go_int32("4294967296"),
            Err("strconv.ParseInt: parsing \"4294967296\": value out of range".into())
        );
        assert_eq!(
            go_int32("x"),
            Err("strconv.ParseInt: parsing \"x\": invalid syntax".into())
        );
    }

    #[test]
    fn verbosity_is_unsigned() {
        assert_eq!(go_verbosity("2"), Ok(2));
        assert_eq!(
            go_verbosity("-1"),
            Err("strconv.ParseUint: parsing \"-1\": invalid syntax".into())
        );
        assert_eq!(
            go_verbosity("2147483648"),
            Err("strconv.ParseUint: parsing \"2147483648\": value out of range".into())
        );
    }

    #[test]
    fn vmodule_items_are_checked() {
        assert!(go_vmodule("proxier=4,,sync*=2").is_ok());
        assert_eq!(
            go_vmodule("proxier"),
            Err("\"proxier\" does not have the pattern=N format".into())
        );
        assert_eq!(
            go_vmodule("a=x"),
            Err(
                "parsing verbosity in \"a=x\": strconv.ParseUint: parsing \"x\": invalid syntax"
                    .into()
            )
        );
    }

    #[test]
    fn ip_and_ipport_flags_speak_pflag() {
        assert!(ip_flag("10.12.51.171").is_ok());
        assert!(ip_flag("::1").is_ok());
        assert!(ip_flag("").is_ok());
        assert_eq!(
            ip_flag("a.b"),
            Err("\"a.b\" is not a valid IP address".into())
        );
        assert!(ipport_flag("0.0.0.0:10256").is_ok());
        assert!(ipport_flag("[::]:10256").is_ok());
        assert!(ipport_flag("127.0.0.1").is_ok());
        assert_eq!(
            ipport_flag("localhost:80"),
            Err("\"localhost\" is not a valid IP address".into())
        );
        assert_eq!(
            ipport_flag("1.2.3.4:http"),
            Err("\"http\" is not a valid number".into())
        );
        assert_eq!(
            ipport_flag("nonsense"),
            Err("\"nonsense\" is not in a valid format (ip or ip:port): address nonsense: missing port in address".into())
        );
        assert_eq!(
            parse_ip_sloppy("010.001.000.001"),
            Some(IpAddr::from([10, 1, 0, 1]))
        );
    }

    #[test]
    fn host_port_splits_as_go() {
        assert_eq!(split_host_port("[::1]:80"), Ok(("::1", "80")));
        assert_eq!(split_host_port(":80"), Ok(("", "80")));
        assert_eq!(
            split_host_port("::1:80"),
            Err("address ::1:80: too many colons in address".into())
        );
        assert_eq!(join_host_port("::", 10256), "[::]:10256");
    }

    #[test]
    fn bool_maps_parse_and_merge_as_pflag() {
        let a = BoolMap::parse("A=true, B = false,").unwrap();
        let b = BoolMap::parse("B=1").unwrap();
        let merged = BoolMap::merged([&a, &b]);
        assert_eq!(merged.get("A"), Some(&true));
        assert_eq!(merged.get("B"), Some(&true));
        assert_eq!(
            BoolMap::parse("A").unwrap_err(),
            "malformed pair, expect string=bool"
        );
        assert_eq!(
            BoolMap::parse("A=yes").unwrap_err(),
            "invalid value of A: yes, err: strconv.ParseBool: parsing \"yes\": invalid syntax"
        );
    }
}
