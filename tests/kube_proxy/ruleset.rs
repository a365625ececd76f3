//! A kube-proxy table as `nft -j` lists it, normalised so that two programs that programmed
//! the same rules compare equal, and a line diff for when they did not.
//!
//! Normalisation drops what the kernel assigns (handles), what depends on the nft binary
//! (metainfo), and what depends on time (`expires` of dynamic set elements: ClientIP affinity);
//! sorts sets, maps and chains by name and the elements of each set and map; keeps the order of
//! the rules within a chain (it is the program). The kernel's own additions (for example the
//! `size` of a dynamic set) stay: they are the same for the same rules.

use serde_json::Value;

use super::procs::ns_run;

/// One family's `kube-proxy` table, normalised, as lines: a header line per object, one line
/// per set or map element, one per rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    pub family: String,
    pub lines: Vec<String>,
    /// Per chain, its rules (normalised JSON), in order; for the queries below.
    chains: Vec<(String, Vec<Value>)>,
    /// Per set or map, its elements (normalised JSON).
    elements: Vec<(String, Vec<Value>)>,
}

/// Lists `table <family> kube-proxy` in namespace `ns`. None when the table does not exist.
pub fn dump(ns: &str, family: &str) -> Result<Option<Table>, String> {
    match ns_run(ns, &["nft", "-j", "list", "table", family, "kube-proxy"]) {
        Ok(text) => Ok(Some(parse(family, &text)?)),
        Err(e) if e.contains("No such file or directory") => Ok(None),
        Err(e) => Err(e),
    }
}

/// The raw text listing (for a person reading a failure), or the error.
pub fn dump_text(ns: &str, family: &str) -> String {
    ns_run(ns, &["nft", "list", "table", family, "kube-proxy"]).unwrap_or_else(|e| e)
}

fn strip(obj: &mut Value, keys: &[&str]) {
    if let Some(m) = obj.as_object_mut() {
        for k in keys {
            m.remove(*k);
        }
    }
}

/// Removes `expires` wherever it appears in an element (a dynamic set's countdown).
fn strip_expires(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.remove("expires");
            for x in m.values_mut() {
                strip_expires(x);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(strip_expires),
        _ => {}
    }
}

pub fn parse(family: &str, text: &str) -> Result<Table, String> {
    let doc: Value = serde_json::from_str(text).map_err(|e| format!("nft -j output: {e}"))?;
    let items = doc["nftables"]
        .as_array()
        .ok_or("nft -j output has no nftables array")?;
    let mut table_header = None;
    // (kind, name) -> header, elements
    let mut sets: Vec<(String, String, Value, Vec<Value>)> = Vec::new();
    let mut chains: Vec<(String, Value)> = Vec::new();
    let mut rules: Vec<(String, Value)> = Vec::new();
    for item in items {
        let Some((kind, body)) = item.as_object().and_then(|m| m.iter().next()) else {
            continue;
        };
        let mut body = body.clone();
        match kind.as_str() {
            "metainfo" => {}
            "table" => {
                strip(&mut body, &["handle"]);
                table_header = Some(body);
            }
            "set" | "map" => {
                let name = body["name"].as_str().unwrap_or("").to_string();
                let mut elems: Vec<Value> = body["elem"].as_array().cloned().unwrap_or_default();
                elems.iter_mut().for_each(strip_expires);
                elems.sort_by_key(|e| e.to_string());
                strip(&mut body, &["handle", "family", "table", "name", "elem"]);
                sets.push((kind.clone(), name, body, elems));
            }
            "chain" => {
                let name = body["name"].as_str().unwrap_or("").to_string();
                strip(&mut body, &["handle", "family", "table", "name"]);
                chains.push((name, body));
            }
            "rule" => {
                let chain = body["chain"].as_str().unwrap_or("").to_string();
                strip(&mut body, &["handle", "family", "table", "chain"]);
                rules.push((chain, body));
            }
            other => return Err(format!("unexpected nft object kind {other:?}")),
        }
    }
    sets.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    chains.sort_by(|a, b| a.0.cmp(&b.0));
    let mut lines = vec![format!(
        "table {family} kube-proxy {}",
        table_header.unwrap_or(Value::Null)
    )];
    let mut elements = Vec::new();
    for (kind, name, header, elems) in sets {
        lines.push(format!("{kind} {name} {header}"));
        for e in &elems {
            lines.push(format!("{kind} {name} element {e}"));
        }
        elements.push((name, elems));
    }
    let mut chain_rules = Vec::new();
    for (name, header) in chains {
        lines.push(format!("chain {name} {header}"));
        // nft lists a chain's rules in their order in the chain.
        let mine: Vec<Value> = rules
            .iter()
            .filter(|(c, _)| *c == name)
            .map(|(_, r)| r.clone())
            .collect();
        for r in &mine {
            lines.push(format!("chain {name} rule {r}"));
        }
        chain_rules.push((name, mine));
    }
    Ok(Table {
        family: family.to_string(),
        lines,
        chains: chain_rules,
        elements,
    })
}

impl Table {
    /// Per-Service chains (their names hold a `/`; fixed names never do) that have no rules:
    /// upstream flushes a chain that is no longer used and deletes it in a later sync, at least
    /// a second later.
    pub fn flushed_service_chains(&self) -> Vec<String> {
        self.chains
            .iter()
            .filter(|(name, rules)| name.contains('/') && rules.is_empty())
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// The keys of a set or map's elements, with comments and values taken off.
    pub fn keys(&self, set: &str) -> Vec<Value> {
        let Some((_, elems)) = self.elements.iter().find(|(n, _)| n == set) else {
            return Vec::new();
        };
        elems
            .iter()
            .map(|e| {
                // A map element is [key, value]; a key with a comment is {"elem": {"val": …}}.
                let key = if let Some(pair) = e.as_array() {
                    pair[0].clone()
                } else {
                    e.clone()
                };
                match key.get("elem") {
                    Some(inner) => inner["val"].clone(),
                    None => key,
                }
            })
            .collect()
    }

    /// The ports of `service-ips` entries for `ip` and protocol `proto`.
    pub fn service_ports(&self, ip: &str, proto: &str) -> Vec<u64> {
        self.keys("service-ips")
            .iter()
            .filter_map(|k| {
                let c = k["concat"].as_array()?;
                (c[0] == ip && c[1] == proto).then(|| c[2].as_u64())?
            })
            .collect()
    }

    /// The ports of every DNAT to `addr` in any rule.
    pub fn dnat_ports(&self, addr: &str) -> Vec<u64> {
        let mut out = Vec::new();
        for (_, rules) in &self.chains {
            for r in rules {
                collect_dnat(r, addr, &mut out);
            }
        }
        out
    }

    /// Whether any line mentions `needle` (an address, a Service's name).
    pub fn mentions(&self, needle: &str) -> bool {
        self.lines.iter().any(|l| l.contains(needle))
    }

    /// The lines without those that mention any of `needles`.
    pub fn without(&self, needles: &[&str]) -> Vec<String> {
        self.lines
            .iter()
            .filter(|l| !needles.iter().any(|n| l.contains(n)))
            .cloned()
            .collect()
    }
}

fn collect_dnat(v: &Value, addr: &str, out: &mut Vec<u64>) {
    match v {
        Value::Object(m) => {
            if let Some(d) = m.get("dnat") {
                if d["addr"] == addr {
                    if let Some(p) = d["port"].as_u64() {
                        out.push(p);
                    }
                }
            }
            m.values().for_each(|x| collect_dnat(x, addr, out));
        }
        Value::Array(a) => a.iter().for_each(|x| collect_dnat(x, addr, out)),
        _ => {}
    }
}

/// The lines only one side has, in order (a longest-common-subsequence diff), each prefixed
/// with the side's label. Empty when equal.
pub fn diff(a_label: &str, a: &[String], b_label: &str, b: &[String]) -> Vec<String> {
    let (n, m) = (a.len(), b.len());
    // lcs[i][j]: the LCS length of a[i..] and b[j..].
    let mut lcs = vec![vec![0u32; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < n || j < m {
        if i < n && j < m && a[i] == b[j] {
            i += 1;
            j += 1;
        } else if j == m || (i < n && lcs[i + 1][j] >= lcs[i][j + 1]) {
            out.push(format!("{a_label} only: {}", a[i]));
            i += 1;
        } else {
            out.push(format!("{b_label} only: {}", b[j]));
            j += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"{"nftables": [
      {"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}},
      {"table": {"family": "ip", "name": "kube-proxy", "handle": 3}},
      {"set": {"family": "ip", "name": "cluster-ips", "table": "kube-proxy", "type": "ipv4_addr", "handle": 37,
               "elem": ["10.96.0.20", "10.96.0.1"]}},
      {"set": {"family": "ip", "name": "affinity-X", "table": "kube-proxy", "type": "ipv4_addr", "handle": 88,
               "size": 65535, "flags": ["timeout"], "timeout": 10800,
               "elem": [{"elem": {"val": "10.0.0.2", "expires": 10798}}]}},
      {"map": {"family": "ip", "name": "service-ips", "table": "kube-proxy", "type": ["ipv4_addr", "inet_proto", "inet_service"],
               "handle": 56, "map": "verdict",
               "elem": [[{"concat": ["10.96.0.20", "tcp", 80]}, {"goto": {"target": "service-A-ns/a/tcp/p"}}]]}},
      {"chain": {"family": "ip", "table": "kube-proxy", "name": "services", "handle": 26}},
      {"chain": {"family": "ip", "table": "kube-proxy", "name": "service-A-ns/a/tcp/p", "handle": 81}},
      {"chain": {"family": "ip", "table": "kube-proxy", "name": "external-A-ns/a/tcp/p", "handle": 82}},
      {"rule": {"family": "ip", "table": "kube-proxy", "chain": "services", "handle": 5, "expr": [{"accept": null}]}},
      {"rule": {"family": "ip", "table": "kube-proxy", "chain": "services", "handle": 4, "expr": [{"drop": null}]}},
      {"rule": {"family": "ip", "table": "kube-proxy", "chain": "service-A-ns/a/tcp/p", "handle": 90,
                "expr": [{"dnat": {"addr": "10.244.1.2", "port": 8080}}]}}
    ]}"#;

    #[test]
    fn normalising_drops_handles_and_expiry_sorts_objects_and_keeps_rule_order() {
        let t = parse("ip", SAMPLE).unwrap();
        let text = t.lines.join("\n");
        assert!(!text.contains("handle"), "{text}");
        assert!(!text.contains("expires"), "{text}");
        assert!(!text.contains("metainfo"), "{text}");
        // Elements sorted; rules in list order (accept before drop), not by handle.
        let cluster_ips: Vec<&String> = t
            .lines
            .iter()
            .filter(|l| l.starts_with("set cluster-ips element"))
            .collect();
        assert_eq!(
            cluster_ips,
            [
                "set cluster-ips element \"10.96.0.1\"",
                "set cluster-ips element \"10.96.0.20\""
            ],
            "{text}"
        );
        assert!(
            text.find("accept").unwrap() < text.find("drop").unwrap(),
            "{text}"
        );
        // Chains sorted by name.
        assert!(text.find("chain external-").unwrap() < text.find("chain service-A").unwrap());
        assert_eq!(
            t.flushed_service_chains(),
            vec!["external-A-ns/a/tcp/p".to_string()]
        );
        assert_eq!(t.service_ports("10.96.0.20", "tcp"), vec![80]);
        assert_eq!(t.dnat_ports("10.244.1.2"), vec![8080]);
        assert!(t.dnat_ports("10.244.1.3").is_empty());
    }

    #[test]
    fn equal_after_renumbering_and_reordering() {
        // The same objects listed in another order with other handles.
        let other = SAMPLE
            .replace("\"handle\": 81", "\"handle\": 181")
            .replace(
                "\"10.96.0.20\", \"10.96.0.1\"",
                "\"10.96.0.1\", \"10.96.0.20\"",
            )
            .replace("\"expires\": 10798", "\"expires\": 3");
        assert_eq!(parse("ip", SAMPLE).unwrap(), parse("ip", &other).unwrap());
        // A changed rule is not equal, and the diff names it on each side.
        let changed = SAMPLE.replace("\"port\": 8080", "\"port\": 8081");
        let (a, b) = (parse("ip", SAMPLE).unwrap(), parse("ip", &changed).unwrap());
        assert_ne!(a, b);
        let d = diff("up", &a.lines, "rs", &b.lines);
        assert_eq!(d.len(), 2, "{d:#?}");
        assert!(
            d[0].starts_with("up only: chain service-A") && d[0].contains("8080"),
            "{d:#?}"
        );
        assert!(
            d[1].starts_with("rs only: chain service-A") && d[1].contains("8081"),
            "{d:#?}"
        );
    }

    #[test]
    fn diff_lists_inserted_and_removed_lines() {
        let a: Vec<String> = ["x", "y", "z"].iter().map(|s| s.to_string()).collect();
        let b: Vec<String> = ["x", "q", "z", "w"].iter().map(|s| s.to_string()).collect();
        assert_eq!(
            diff("up", &a, "rs", &b),
            vec!["up only: y", "rs only: q", "rs only: w"]
        );
        assert!(diff("up", &a, "rs", &a).is_empty());
    }
}
