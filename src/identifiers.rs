//! The `agentidentifiers` metadata: a URL query naming the hosts and addresses an agent serves.
//! The agent checks its `--agent-identifiers` with the same syntax the server parses.

/// What an agent declares it can reach.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AgentIdentifiers {
    pub ipv4: Vec<String>,
    pub ipv6: Vec<String>,
    pub host: Vec<String>,
    pub cidr: Vec<String>,
    pub default_route: bool,
}

/// Mirrors Go's `strconv.ParseBool` truth values.
fn go_parse_bool(value: &str) -> bool {
    matches!(value, "1" | "t" | "T" | "TRUE" | "true" | "True")
}

/// Rejects what Go's `url.ParseQuery` rejects: semicolons and malformed percent escapes.
pub fn check_query_syntax(query: &str) -> Result<(), String> {
    if query.contains(';') {
        return Err("invalid semicolon separator in query".into());
    }
    let bytes = query.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let escape = bytes.get(i + 1..i + 3);
            let valid = escape.is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit));
            if !valid {
                let shown: String = query[i..].chars().take(3).collect();
                return Err(format!("invalid URL escape {shown:?}"));
            }
            i += 3;
        } else {
            i += 1;
        }
    }
    Ok(())
}

/// The keys an agent may declare, as upstream's agent validates them.
pub const KEYS: &[&str] = &["ipv4", "ipv6", "cidr", "host", "default-route"];

/// The agent's check of its own `--agent-identifiers`: Go's query syntax, known keys only.
pub fn validate(query: &str) -> Result<(), String> {
    check_query_syntax(query)?;
    for (key, _) in form_urlencoded::parse(query.as_bytes()) {
        if !KEYS.contains(&key.as_ref()) {
            return Err(format!("unknown address type: {key}"));
        }
    }
    Ok(())
}

impl AgentIdentifiers {
    /// Parses the header value; unknown keys are ignored so newer agents keep working.
    pub fn parse(query: &str) -> Result<AgentIdentifiers, String> {
        check_query_syntax(query)?;
        let mut ids = AgentIdentifiers::default();
        let mut default_route_seen = false;
        for (key, value) in form_urlencoded::parse(query.as_bytes()) {
            match key.as_ref() {
                "ipv4" => ids.ipv4.push(value.into_owned()),
                "ipv6" => ids.ipv6.push(value.into_owned()),
                "host" => ids.host.push(value.into_owned()),
                "cidr" => ids.cidr.push(value.into_owned()),
                // Only the first value counts, as upstream reads it.
                "default-route" if !default_route_seen => {
                    default_route_seen = true;
                    ids.default_route = go_parse_bool(&value);
                }
                _ => {}
            }
        }
        Ok(ids)
    }

    /// The keys the destHost strategy indexes this agent under.
    pub fn dest_host_keys(&self) -> Vec<String> {
        self.ipv4
            .iter()
            .chain(&self.ipv6)
            .chain(&self.host)
            .cloned()
            .collect()
    }
}

/// Strips the port from a dial address the way upstream does, so destHost keys compare equal:
/// `10.0.0.5:10250` → `10.0.0.5`, `[fd00::1]:443` → `fd00::1`, bare IPv6 kept whole.
pub fn remove_port_from_host(address: &str) -> String {
    if address.split(':').count() <= 2 {
        return address.split(':').next().unwrap_or("").to_string();
    }
    let mut host = address;
    if host.contains('[') {
        if let Some(i) = host.rfind(':') {
            host = &host[..i];
        }
    }
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_upstream_example() {
        let ids = AgentIdentifiers::parse(
            "host=localhost&host=node1.mydomain.com&cidr=127.0.0.1/16&ipv4=1.2.3.4&ipv4=5.6.7.8&ipv6=:::::&default-route=true&future-key=x",
        )
        .unwrap();
        assert_eq!(ids.host, ["localhost", "node1.mydomain.com"]);
        assert_eq!(ids.ipv4, ["1.2.3.4", "5.6.7.8"]);
        assert_eq!(ids.ipv6, [":::::"]);
        assert_eq!(ids.cidr, ["127.0.0.1/16"]);
        assert!(ids.default_route);
    }

    #[test]
    fn first_default_route_value_wins() {
        assert!(
            !AgentIdentifiers::parse("default-route=no&default-route=true")
                .unwrap()
                .default_route
        );
        assert!(
            AgentIdentifiers::parse("default-route=1")
                .unwrap()
                .default_route
        );
    }

    #[test]
    fn rejects_malformed_queries() {
        assert!(AgentIdentifiers::parse("host=a;b").is_err());
        assert_eq!(
            AgentIdentifiers::parse("host=%zz").unwrap_err(),
            "invalid URL escape \"%zz\""
        );
        assert_eq!(
            AgentIdentifiers::parse("").unwrap(),
            AgentIdentifiers::default()
        );
    }

    #[test]
    fn strips_ports_like_upstream() {
        assert_eq!(remove_port_from_host("10.0.0.5:10250"), "10.0.0.5");
        assert_eq!(remove_port_from_host("[fd00::1]:443"), "fd00::1");
        assert_eq!(remove_port_from_host("fd00::1:443"), "fd00::1:443");
        assert_eq!(remove_port_from_host("node1"), "node1");
    }
}
