//! A JSON value written as YAML the way upstream writes `--write-config-to`
//! (`sigs.k8s.io/yaml` over go-yaml v2): keys sorted, two-space indents, a list under a key
//! not indented, strings quoted only where YAML would read them as something else.

use serde_json::Value;

pub fn to_yaml(value: &Value) -> String {
    let mut out = String::new();
    match value {
        Value::Object(map) if !map.is_empty() => mapping(map, 0, &mut out),
        Value::Array(items) if !items.is_empty() => sequence(items, 0, &mut out),
        scalar => {
            out.push_str(&inline(scalar));
            out.push('\n');
        }
    }
    out
}

fn mapping(map: &serde_json::Map<String, Value>, indent: usize, out: &mut String) {
    let mut keys: Vec<&String> = map.keys().collect();
    keys.sort();
    for key in keys {
        out.push_str(&" ".repeat(indent));
        out.push_str(&string(key));
        out.push(':');
        match &map[key] {
            Value::Object(inner) if !inner.is_empty() => {
                out.push('\n');
                mapping(inner, indent + 2, out);
            }
            Value::Array(items) if !items.is_empty() => {
                out.push('\n');
                sequence(items, indent, out);
            }
            scalar => {
                out.push(' ');
                out.push_str(&inline(scalar));
                out.push('\n');
            }
        }
    }
}

fn sequence(items: &[Value], indent: usize, out: &mut String) {
    for item in items {
        out.push_str(&" ".repeat(indent));
        out.push('-');
        match item {
            Value::Object(inner) if !inner.is_empty() => {
                // The first key on the dash's line, the others under it.
                let mut nested = String::new();
                mapping(inner, indent + 2, &mut nested);
                out.push(' ');
                out.push_str(nested.trim_start());
            }
            Value::Array(inner) if !inner.is_empty() => {
                out.push('\n');
                sequence(inner, indent + 2, out);
            }
            scalar => {
                out.push(' ');
                out.push_str(&inline(scalar));
                out.push('\n');
            }
        }
    }
}

fn inline(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => string(s),
        Value::Array(_) => "[]".into(),
        Value::Object(_) => "{}".into(),
    }
}

/// A plain scalar YAML 1.1 would read as something other than this string.
fn resolves_to_non_string(s: &str) -> bool {
    const WORDS: [&str; 26] = [
        "", "~", "null", "Null", "NULL", "y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO",
        "true", "True", "TRUE", "false", "False", "FALSE", "on", "On", "ON", "off", "Off",
    ];
    if WORDS.contains(&s)
        || matches!(
            s,
            "OFF" | ".inf" | "-.inf" | "+.inf" | ".nan" | ".Inf" | ".NaN"
        )
    {
        return true;
    }
    let body = s.strip_prefix(['-', '+']).unwrap_or(s).replace('_', "");
    if body.is_empty() {
        return false;
    }
    let number = body.parse::<f64>().is_ok() && !body.contains(['i', 'I', 'n', 'N']);
    let radix = ["0x", "0b", "0o"].iter().any(|p| {
        body.strip_prefix(p)
            .is_some_and(|d| !d.is_empty() && d.chars().all(|c| c.is_ascii_hexdigit()))
    });
    // Base 60 (`1:20`), which go-yaml quotes too.
    let sexagesimal = body.contains(':')
        && body
            .split(':')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    number || radix || sexagesimal
}

/// Whether the string can be written plain in block context (go-yaml's emitter rules,
/// simplified to what a configuration holds): no leading or trailing space, no indicator
/// that starts a node (`[`, `&`, ...; `-`, `?`, `:` only before a blank), no `: ` or ` #`.
fn plain_allowed(s: &str) -> bool {
    let mut chars = s.chars();
    let first = chars.next().unwrap_or(' ');
    let second = chars.next();
    let blank_after = second.is_none_or(char::is_whitespace);
    let refused = s.starts_with(char::is_whitespace)
        || s.ends_with(char::is_whitespace)
        || "#,[]{}&*!|>'\"%@`".contains(first)
        || ("-?:".contains(first) && blank_after)
        || s.contains(": ")
        || s.contains(" #")
        || s.ends_with(':')
        || s.chars().any(|c| c.is_control());
    !refused
}

fn string(s: &str) -> String {
    if resolves_to_non_string(s) || s.chars().any(|c| c.is_control()) {
        return serde_json::to_string(s).unwrap_or_default();
    }
    if plain_allowed(s) {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn writes_as_go_yaml_does() {
        // "n" is a YAML 1.1 bool, so go-yaml quotes it even as a key.
        let value = json!({
            "b": {"z": "", "a": "0"},
            "a": ["primary", "10.0.0.0/8"],
            "n": null,
            "e": [],
            "m": {},
            "s": "application/vnd.kubernetes.protobuf",
            "t": true,
            "q": 5,
            "c": ":0",
            "v": [{"filePattern": "x", "verbosity": 2}],
        });
        assert_eq!(
            to_yaml(&value),
            "a:\n- primary\n- 10.0.0.0/8\nb:\n  a: \"0\"\n  z: \"\"\nc: :0\ne: []\nm: {}\n\"n\": null\nq: 5\ns: application/vnd.kubernetes.protobuf\nt: true\nv:\n- filePattern: x\n  verbosity: 2\n"
        );
    }

    #[test]
    fn quotes_what_would_read_as_another_type() {
        for s in ["true", "no", "1.5", "0x1F", "1:20", "null", "~"] {
            assert!(string(s).starts_with('"'), "{s}");
        }
        assert_eq!(string("- x"), "'- x'");
        for s in ["0.0.0.0:10256", "[::]:10256", "::1", "iptables", "15m0s"] {
            let want = if s.starts_with('[') {
                format!("'{s}'")
            } else {
                s.to_string()
            };
            assert_eq!(string(s), want, "{s}");
        }
    }
}
