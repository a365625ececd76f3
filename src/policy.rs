//! Destination policy: which `host:port` a tunnel may reach, for both programs.
//!
//! A rule is an address range (`10.0.0.0/8`, `169.254.169.254`, `fe80::/10`) or a host-name
//! pattern (`metadata.google.internal`, `*.svc.cluster.local`: a leading `*.` matches one or
//! more labels), each with an optional port or port range (`:443`, `:8000-8999`; an IPv6
//! range with a port is written in brackets, `[fd00::/8]:443`). Deny rules win; an empty allow
//! list allows everything else, a non-empty one allows only what one of its rules matches.
//!
//! What each side can see differs: the server sees the destination as the frontend named it,
//! so a name is matched against name rules only (it cannot know the address the agent will
//! resolve it to); the agent checks again after resolving, matching the name against name
//! rules and the resolved address against address rules.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;

/// One rule, as written and as parsed.
#[derive(Clone, PartialEq, Eq)]
pub struct Rule {
    text: String,
    target: Target,
    /// Inclusive; `None` is every port.
    ports: Option<(u16, u16)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Target {
    Net(IpNet),
    /// A name, lowercase, without a trailing dot.
    Name(String),
    /// `*.suffix`: any name ending in `.suffix`.
    Suffix(String),
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid destination rule {rule:?}: {reason}")]
pub struct RuleError {
    rule: String,
    reason: &'static str,
}

fn parse_ports(text: &str) -> Result<(u16, u16), &'static str> {
    let port = |p: &str| match p.parse::<u16>() {
        Ok(0) | Err(_) => Err("a port is a number from 1 to 65535"),
        Ok(n) => Ok(n),
    };
    match text.split_once('-') {
        Some((lo, hi)) => {
            let (lo, hi) = (port(lo)?, port(hi)?);
            if lo > hi {
                return Err("a port range goes from the lower port to the higher");
            }
            Ok((lo, hi))
        }
        None => port(text).map(|p| (p, p)),
    }
}

fn parse_net(text: &str) -> Option<IpNet> {
    IpNet::from_str(text)
        .ok()
        .or_else(|| IpAddr::from_str(text).ok().map(IpNet::from))
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

impl FromStr for Rule {
    type Err = RuleError;

    fn from_str(text: &str) -> Result<Rule, RuleError> {
        let error = |reason| RuleError {
            rule: text.to_string(),
            reason,
        };
        let trimmed = text.trim();
        // Split off the port: `[v6]:p`, `v4-or-name:p`; a bare IPv6 range has several colons.
        let (target, ports) = if let Some(rest) = trimmed.strip_prefix('[') {
            let (inside, after) = rest.split_once(']').ok_or_else(|| error("no closing ]"))?;
            match after {
                "" => (inside, None),
                _ => {
                    let ports = after
                        .strip_prefix(':')
                        .ok_or_else(|| error("a port follows ] after a colon"))?;
                    (inside, Some(parse_ports(ports).map_err(error)?))
                }
            }
        } else {
            match trimmed.matches(':').count() {
                0 => (trimmed, None),
                1 => {
                    let (target, ports) = trimmed.split_once(':').unwrap_or((trimmed, ""));
                    (target, Some(parse_ports(ports).map_err(error)?))
                }
                _ => (trimmed, None),
            }
        };
        let target = if let Some(net) = parse_net(target) {
            Target::Net(net.trunc())
        } else if target.contains(':') || target.contains('/') {
            return Err(error("not an address or an address range"));
        } else {
            let name = target.trim_end_matches('.').to_ascii_lowercase();
            match name.strip_prefix("*.") {
                Some(suffix) if valid_name(suffix) => Target::Suffix(suffix.to_string()),
                _ if valid_name(&name) => Target::Name(name),
                _ => return Err(error("not an address, a range or a host name (or *.name)")),
            }
        };
        Ok(Rule {
            text: trimmed.to_string(),
            target,
            ports,
        })
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Debug for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.text)
    }
}

impl serde::Serialize for Rule {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

impl<'de> serde::Deserialize<'de> for Rule {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Rule, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// A destination as a frontend names it: a host (name or address) and a port.
#[derive(Debug, PartialEq, Eq)]
pub struct Destination<'a> {
    pub host: Host<'a>,
    pub port: Option<u16>,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Host<'a> {
    Ip(IpAddr),
    Name(&'a str),
}

impl<'a> Destination<'a> {
    /// `host:port`, `[v6]:port`, or a host alone.
    pub fn parse(address: &'a str) -> Destination<'a> {
        let (host, port) = if let Some(rest) = address.strip_prefix('[') {
            match rest.split_once(']') {
                Some((host, after)) => (host, after.strip_prefix(':')),
                None => (address, None),
            }
        } else if address.matches(':').count() == 1 {
            let (host, port) = address.split_once(':').unwrap_or((address, ""));
            (host, Some(port))
        } else {
            (address, None)
        };
        let port = port.and_then(|p| p.parse().ok());
        let host = match IpAddr::from_str(host) {
            Ok(ip) => Host::Ip(ip),
            Err(_) => Host::Name(host),
        };
        Destination { host, port }
    }
}

impl Rule {
    fn port_matches(&self, port: Option<u16>) -> bool {
        match (self.ports, port) {
            (None, _) => true,
            (Some((lo, hi)), Some(p)) => lo <= p && p <= hi,
            // A port-limited rule says nothing of a destination without a port.
            (Some(_), None) => false,
        }
    }

    fn name_matches(&self, name: &str) -> bool {
        let name = name.trim_end_matches('.');
        match &self.target {
            Target::Name(n) => name.eq_ignore_ascii_case(n),
            Target::Suffix(suffix) => {
                name.len() > suffix.len() + 1
                    && name.as_bytes()[name.len() - suffix.len() - 1] == b'.'
                    && name[name.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
            }
            Target::Net(_) => false,
        }
    }

    fn ip_matches(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            // An IPv4-mapped IPv6 address reaches the IPv4 host: match it as one.
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        matches!(&self.target, Target::Net(net) if net.contains(&ip))
    }
}

/// The allow and deny lists, as configured.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    pub allow: Vec<Rule>,
    pub deny: Vec<Rule>,
}

/// Why a destination was refused: the deny rule that matched, or no allow rule matching.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal<'a> {
    Denied(&'a Rule),
    NotAllowed,
}

impl Refusal<'_> {
    /// The `rule` label of `destinations_refused_total`: the deny rule as written, or
    /// `allow-list` when no allow rule matched.
    pub fn label(&self) -> &str {
        match self {
            Refusal::Denied(rule) => &rule.text,
            Refusal::NotAllowed => "allow-list",
        }
    }
}

/// The text a refused dial is answered with.
pub const NOT_ALLOWED: &str = "destination not allowed by policy";

impl Policy {
    /// The lists of `--allow-destinations` and `--deny-destinations`, parsed; an error names
    /// the flag. Empty items are skipped (`--deny-destinations=` is pflag's empty list).
    pub fn from_lists(allow: &[String], deny: &[String]) -> Result<Policy, String> {
        let parse = |flag: &str, list: &[String]| {
            list.iter()
                .filter(|r| !r.trim().is_empty())
                .map(|r| r.parse::<Rule>().map_err(|e| format!("--{flag}: {e}")))
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(Policy {
            allow: parse("allow-destinations", allow)?,
            deny: parse("deny-destinations", deny)?,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.allow.is_empty() && self.deny.is_empty()
    }

    /// What the server can check: the destination as named (a name against name rules, an
    /// address against address rules).
    pub fn check(&self, address: &str) -> Result<(), Refusal<'_>> {
        if self.is_empty() {
            return Ok(());
        }
        let dest = Destination::parse(address);
        let matches = |rule: &Rule| {
            rule.port_matches(dest.port)
                && match dest.host {
                    Host::Ip(ip) => rule.ip_matches(ip),
                    Host::Name(name) => rule.name_matches(name),
                }
        };
        self.decide(matches)
    }

    /// What the agent can check after resolving `name` (as the frontend named it) to `ip`.
    pub fn check_resolved(&self, name: &str, ip: IpAddr, port: u16) -> Result<(), Refusal<'_>> {
        if self.is_empty() {
            return Ok(());
        }
        let matches = |rule: &Rule| {
            rule.port_matches(Some(port)) && (rule.name_matches(name) || rule.ip_matches(ip))
        };
        self.decide(matches)
    }

    fn decide(&self, matches: impl Fn(&Rule) -> bool) -> Result<(), Refusal<'_>> {
        if let Some(rule) = self.deny.iter().find(|r| matches(r)) {
            return Err(Refusal::Denied(rule));
        }
        if !self.allow.is_empty() && !self.allow.iter().any(&matches) {
            return Err(Refusal::NotAllowed);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(list: &[&str]) -> Vec<Rule> {
        list.iter().map(|r| r.parse().unwrap()).collect()
    }

    #[test]
    fn rules_parse_with_and_without_ports() {
        for ok in [
            "10.0.0.0/8",
            "169.254.169.254",
            "10.0.0.0/8:22",
            "10.1.2.3:8000-8999",
            "fe80::/10",
            "::1",
            "[fd00::/8]:443",
            "[::1]:1-1024",
            "*.svc.cluster.local",
            "*.svc.cluster.local:443",
            "metadata.google.internal",
            "Node-1.Example.",
        ] {
            assert!(ok.parse::<Rule>().is_ok(), "{ok}");
        }
        for (bad, reason) in [
            ("10.0.0.0/33", "not an address"),
            ("10.0.0.0/8:0", "1 to 65535"),
            ("10.0.0.0/8:99999", "1 to 65535"),
            ("host:20-10", "lower port"),
            ("[fd00::/8", "closing ]"),
            ("[fd00::/8]443", "after a colon"),
            ("*", "host name"),
            ("a..b", "host name"),
            ("under score?", "host name"),
            ("", "host name"),
        ] {
            let err = bad.parse::<Rule>().unwrap_err().to_string();
            assert!(
                err.contains(reason) && err.contains(&format!("{bad:?}")),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn deny_wins_and_an_allow_list_allows_only_what_it_names() {
        let policy = Policy {
            allow: rules(&["10.0.0.0/8", "*.svc.cluster.local:443"]),
            deny: rules(&["10.0.0.0/8:22", "10.9.0.0/16"]),
        };
        assert_eq!(policy.check("10.1.2.3:443"), Ok(()));
        assert_eq!(
            policy.check("10.1.2.3:22").unwrap_err().label(),
            "10.0.0.0/8:22"
        );
        assert_eq!(
            policy.check("10.9.1.1:443").unwrap_err().label(),
            "10.9.0.0/16"
        );
        assert_eq!(
            policy.check("kubernetes.default.svc.cluster.local:443"),
            Ok(())
        );
        assert_eq!(
            policy.check("a.svc.cluster.local:80"),
            Err(Refusal::NotAllowed)
        );
        assert_eq!(
            policy.check("svc.cluster.local:443"),
            Err(Refusal::NotAllowed)
        );
        assert_eq!(policy.check("192.168.1.1:443"), Err(Refusal::NotAllowed));
        // A name is not matched against address ranges by the server.
        assert_eq!(policy.check("ten.example:443"), Err(Refusal::NotAllowed));
        assert_eq!(Policy::default().check("anything:1"), Ok(()));
    }

    #[test]
    fn link_local_and_loopback_in_every_spelling() {
        let policy = Policy {
            allow: vec![],
            deny: rules(&[
                "169.254.0.0/16",
                "fe80::/10",
                "127.0.0.0/8",
                "::1",
                "localhost",
            ]),
        };
        for denied in [
            "169.254.169.254:80",
            "[fe80::1]:443",
            "[::ffff:127.0.0.1]:8080",
            "127.1.2.3:10250",
            "[::1]:10250",
            "LOCALHOST:10250",
            "localhost.:10250",
        ] {
            assert!(policy.check(denied).is_err(), "{denied}");
        }
        assert_eq!(policy.check("10.0.0.1:443"), Ok(()));
        assert_eq!(policy.check("[2001:db8::1]:443"), Ok(()));
    }

    #[test]
    fn the_agent_checks_the_resolved_address_too() {
        let policy = Policy {
            allow: vec![],
            deny: rules(&["127.0.0.0/8"]),
        };
        let ip = IpAddr::from([127, 0, 0, 1]);
        assert_eq!(policy.check("innocent.example:80"), Ok(()));
        assert!(policy.check_resolved("innocent.example", ip, 80).is_err());
        let allow = Policy {
            allow: rules(&["10.0.0.0/8"]),
            deny: vec![],
        };
        assert_eq!(
            allow.check_resolved("db.internal", IpAddr::from([10, 0, 0, 5]), 5432),
            Ok(())
        );
    }
}
