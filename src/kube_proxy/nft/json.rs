//! Reads the kernel's table (`nft -j list table <family> kube-proxy`) into the same model
//! the proxy renders (`table::Table`), so the tracer and the checks work on what the kernel
//! holds. Only what a kube-proxy table holds is understood; a statement of any other kind
//! is kept as `Stmt::Other` with its JSON, for the tracer to report.

use std::net::IpAddr;

use serde_json::Value;

use super::objects::{BaseChain, ChainType, Hook, Key, SetKind, SetSpec, Verdict, TABLE};
use super::rule::{AddrField, AddrValue, Pick, Rule, Stmt, VmapKey};
use super::table::{Chain, Element, Set, Table};
use crate::kube_proxy::model::{IpFamily, Protocol};

#[derive(Debug, thiserror::Error)]
pub enum JsonError {
    #[error("nft's JSON output does not parse: {0}")]
    Syntax(#[from] serde_json::Error),
    #[error("nft's JSON output has no \"nftables\" list")]
    Shape,
    #[error("the kernel has no table {0} {TABLE}")]
    NoTable(&'static str),
}

/// Reads the listing of one family's table.
pub fn parse_table(text: &str, family: IpFamily) -> Result<Table, JsonError> {
    let root: Value = serde_json::from_str(text)?;
    let items = root
        .get("nftables")
        .and_then(Value::as_array)
        .ok_or(JsonError::Shape)?;
    let mut table = None::<Table>;
    let mine = |o: &Value| {
        o.get("family").and_then(Value::as_str) == Some(family.nft())
            && o.get("table")
                .or_else(|| o.get("name"))
                .and_then(Value::as_str)
                == Some(TABLE)
    };
    for item in items {
        if let Some(t) = item.get("table") {
            if mine(t) {
                let mut new = Table::new(family);
                new.comment = t.get("comment").and_then(Value::as_str).map(str::to_owned);
                table = Some(new);
            }
            continue;
        }
        let Some(table) = table.as_mut() else {
            continue;
        };
        if let Some(c) = item.get("chain").filter(|c| mine(c)) {
            let Some(name) = c.get("name").and_then(Value::as_str) else {
                continue;
            };
            let base = chain_base(c);
            table.chains.insert(
                name.to_owned(),
                Chain {
                    base,
                    comment: c.get("comment").and_then(Value::as_str).map(str::to_owned),
                    rules: Vec::new(),
                },
            );
        } else if let Some((s, kind)) = item
            .get("set")
            .map(|s| (s, SetKind::Set))
            .or_else(|| item.get("map").map(|m| (m, SetKind::Map)))
        {
            if !mine(s) {
                continue;
            }
            let Some(name) = s.get("name").and_then(Value::as_str) else {
                continue;
            };
            table.sets.insert(name.to_owned(), set(s, kind));
        } else if let Some(counter) = item.get("counter").filter(|c| mine(c)) {
            if let Some(name) = counter.get("name").and_then(Value::as_str) {
                table.counters.insert(name.to_owned());
            }
        } else if let Some(r) = item.get("rule").filter(|r| mine(r)) {
            let Some(chain) = r.get("chain").and_then(Value::as_str) else {
                continue;
            };
            let stmts = r
                .get("expr")
                .and_then(Value::as_array)
                .map(|exprs| statements(exprs))
                .unwrap_or_default();
            let rule = Rule {
                stmts,
                comment: r.get("comment").and_then(Value::as_str).map(str::to_owned),
            };
            if let Some(chain) = table.chains.get_mut(chain) {
                chain.rules.push(rule);
            }
        }
    }
    table.ok_or(JsonError::NoTable(family.nft()))
}

fn chain_base(c: &Value) -> Option<BaseChain> {
    let kind = match c.get("type")?.as_str()? {
        "filter" => ChainType::Filter,
        "nat" => ChainType::Nat,
        _ => return None,
    };
    let hook = Hook::parse(c.get("hook")?.as_str()?)?;
    let priority = i32::try_from(c.get("prio")?.as_i64()?).ok()?;
    Some(BaseChain {
        kind,
        hook,
        priority,
    })
}

fn set(s: &Value, kind: SetKind) -> Set {
    let mut key_type = match s.get("type") {
        Some(Value::String(t)) => t.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(" . "),
        _ => String::new(),
    };
    if let Some(data) = s.get("map").and_then(Value::as_str) {
        key_type.push_str(" : ");
        key_type.push_str(data);
    }
    let flags = match s.get("flags") {
        Some(Value::Array(f)) => f
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        Some(Value::String(f)) => vec![f.clone()],
        _ => Vec::new(),
    };
    let mut elements = std::collections::BTreeMap::new();
    for elem in s
        .get("elem")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let (key, value) = match elem {
            Value::Array(pair) if pair.len() == 2 => (&pair[0], verdict(&pair[1])),
            single => (single, None),
        };
        let (key, comment) = match key.get("elem") {
            Some(inner) => (
                inner.get("val").unwrap_or(key),
                inner
                    .get("comment")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
            ),
            None => (key, None),
        };
        if let Some(key) = element_key(key) {
            elements.insert(key, Element { value, comment });
        }
    }
    Set {
        spec: SetSpec {
            kind,
            key_type,
            flags,
            timeout_secs: s
                .get("timeout")
                .and_then(Value::as_u64)
                .and_then(|t| u32::try_from(t).ok()),
            comment: s.get("comment").and_then(Value::as_str).map(str::to_owned),
        },
        elements,
    }
}

fn ip(v: &Value) -> Option<IpAddr> {
    v.as_str()?.parse().ok()
}

fn proto(v: &Value) -> Option<Protocol> {
    match v {
        Value::String(s) => Protocol::from_nft(s),
        Value::Number(n) => match n.as_u64()? {
            6 => Some(Protocol::Tcp),
            17 => Some(Protocol::Udp),
            132 => Some(Protocol::Sctp),
            _ => None,
        },
        _ => None,
    }
}

fn port(v: &Value) -> Option<u16> {
    v.as_u64().and_then(|p| u16::try_from(p).ok())
}

fn element_key(v: &Value) -> Option<Key> {
    if let Some(addr) = ip(v) {
        return Some(Key::Addr(addr));
    }
    let parts = v.get("concat")?.as_array()?;
    match parts.as_slice() {
        [a, p, n] => Some(Key::AddrPort(ip(a)?, proto(p)?, port(n)?)),
        [p, n] => Some(Key::Port(proto(p)?, port(n)?)),
        [a, b, p, n] => Some(Key::Hairpin(ip(a)?, ip(b)?, proto(p)?, port(n)?)),
        _ => None,
    }
}

fn verdict(v: &Value) -> Option<Verdict> {
    let target = |key: &str| {
        v.get(key)
            .and_then(|g| g.get("target"))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    if let Some(t) = target("goto") {
        return Some(Verdict::Goto(t));
    }
    if let Some(t) = target("jump") {
        return Some(Verdict::Jump(t));
    }
    if v.get("drop").is_some() {
        return Some(Verdict::Drop);
    }
    if v.get("accept").is_some() {
        return Some(Verdict::Accept);
    }
    None
}

/// `{"payload": {"protocol": "ip", "field": "saddr"}}`
fn addr_field(v: &Value) -> Option<AddrField> {
    let payload = v.get("payload")?;
    if !matches!(payload.get("protocol")?.as_str()?, "ip" | "ip6") {
        return None;
    }
    match payload.get("field")?.as_str()? {
        "saddr" => Some(AddrField::Saddr),
        "daddr" => Some(AddrField::Daddr),
        _ => None,
    }
}

fn is_meta(v: &Value, key: &str) -> bool {
    v.get("meta")
        .and_then(|m| m.get("key"))
        .and_then(Value::as_str)
        == Some(key)
}

fn is_th_dport(v: &Value) -> bool {
    v.get("payload").is_some_and(|p| {
        p.get("protocol").and_then(Value::as_str) == Some("th")
            && p.get("field").and_then(Value::as_str) == Some("dport")
    })
}

fn net(v: &Value) -> Option<ipnet::IpNet> {
    if let Some(addr) = ip(v) {
        return Some(addr.into());
    }
    let prefix = v.get("prefix")?;
    let addr = ip(prefix.get("addr")?)?;
    let len = u8::try_from(prefix.get("len")?.as_u64()?).ok()?;
    ipnet::IpNet::new(addr, len).ok()
}

/// A range of addresses as the prefixes that cover exactly it (the kernel merges adjacent
/// addresses of an anonymous set into a range).
fn range(v: &Value) -> Option<Vec<ipnet::IpNet>> {
    let ends = v.get("range")?.as_array()?;
    let (start, end) = (ip(ends.first()?)?, ip(ends.get(1)?)?);
    Some(match (start, end) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            ipnet::Ipv4Subnets::new(a, b, 0).map(Into::into).collect()
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => {
            ipnet::Ipv6Subnets::new(a, b, 0).map(Into::into).collect()
        }
        _ => return None,
    })
}

fn addr_value(v: &Value) -> Option<AddrValue> {
    if let Some(name) = v.as_str().and_then(|s| s.strip_prefix('@')) {
        return Some(AddrValue::Named(name.to_owned()));
    }
    if let Some(items) = v.get("set").and_then(Value::as_array) {
        let mut nets = Vec::new();
        for item in items {
            match range(item) {
                Some(covered) => nets.extend(covered),
                None => nets.push(net(item)?),
            }
        }
        return Some(AddrValue::Anonymous(nets));
    }
    if let Some(covered) = range(v) {
        return Some(AddrValue::Anonymous(covered));
    }
    net(v).map(AddrValue::Net)
}

fn mark_bits(v: &Value, op: &str) -> Option<u32> {
    let parts = v.get(op)?.as_array()?;
    match parts.as_slice() {
        [m, bits] if is_meta(m, "mark") => bits.as_u64().and_then(|b| u32::try_from(b).ok()),
        _ => None,
    }
}

/// `numgen random|inc mod N` or `jhash <ip> saddr mod N seed 0`: how a rule picks.
fn pick(key: &Value) -> Option<Pick> {
    if let Some(numgen) = key.get("numgen") {
        return match numgen.get("mode")?.as_str()? {
            "random" => Some(Pick::Random),
            "inc" => Some(Pick::RoundRobin),
            _ => None,
        };
    }
    let jhash = key.get("jhash")?;
    let by_source = addr_field(jhash.get("expr")?)? == AddrField::Saddr;
    (by_source && jhash.get("seed").and_then(Value::as_u64) == Some(0)).then_some(Pick::SourceHash)
}

fn statements(exprs: &[Value]) -> Vec<Stmt> {
    exprs
        .iter()
        .map(|e| statement(e).unwrap_or_else(|| Stmt::Other(e.to_string())))
        .collect()
}

fn statement(e: &Value) -> Option<Stmt> {
    if let Some(m) = e.get("match") {
        return match_stmt(m);
    }
    if let Some(mangle) = e.get("mangle") {
        if !is_meta(mangle.get("key")?, "mark") {
            return None;
        }
        let value = mangle.get("value")?;
        if let Some(bits) = mark_bits(value, "|") {
            return Some(Stmt::MarkSetOr(bits));
        }
        return mark_bits(value, "^").map(Stmt::MarkSetXor);
    }
    if e.get("masquerade").is_some() {
        return Some(Stmt::Masquerade);
    }
    if let Some(set) = e.get("set") {
        if set.get("op")?.as_str()? == "update" && addr_field(set.get("elem")?)? == AddrField::Saddr
        {
            let name = set.get("set")?.as_str()?.strip_prefix('@')?;
            return Some(Stmt::UpdateSaddr(name.to_owned()));
        }
        return None;
    }
    if let Some(counter) = e.get("counter") {
        return counter.as_str().map(|n| Stmt::NamedCounter(n.to_owned()));
    }
    if let Some(vmap) = e.get("vmap") {
        let key = vmap.get("key")?;
        let data = vmap.get("data")?;
        if let Some(pick) = pick(key) {
            let mut chains = Vec::new();
            for pair in data.get("set")?.as_array()? {
                let pair = pair.as_array()?;
                match verdict(pair.get(1)?)? {
                    Verdict::Goto(t) => chains.push(t),
                    _ => return None,
                }
            }
            return Some(Stmt::PickVmap { pick, chains });
        }
        let map = data.as_str()?.strip_prefix('@')?.to_owned();
        let parts = key.get("concat")?.as_array()?;
        let key = match parts.as_slice() {
            [d, p, port]
                if addr_field(d) == Some(AddrField::Daddr)
                    && is_meta(p, "l4proto")
                    && is_th_dport(port) =>
            {
                VmapKey::DaddrProtoPort
            }
            [p, port] if is_meta(p, "l4proto") && is_th_dport(port) => VmapKey::ProtoPort,
            _ => return None,
        };
        return Some(Stmt::Vmap { key, map });
    }
    if let Some(dnat) = e.get("dnat") {
        let addr = dnat.get("addr")?;
        if let Some(a) = ip(addr) {
            return Some(Stmt::Dnat {
                addr: a,
                port: port(dnat.get("port")?)?,
            });
        }
        let map = addr.get("map")?;
        let pick = pick(map.get("key")?)?;
        let mut targets = Vec::new();
        for pair in map.get("data")?.get("set")?.as_array()? {
            let target = pair.as_array()?.get(1)?.get("concat")?.as_array()?;
            targets.push((ip(target.first()?)?, port(target.get(1)?)?));
        }
        return Some(Stmt::PickDnat { pick, targets });
    }
    if let Some(v) = verdict(e) {
        return Some(match v {
            Verdict::Goto(t) => Stmt::Goto(t),
            Verdict::Jump(t) => Stmt::Jump(t),
            Verdict::Drop => Stmt::Drop,
            Verdict::Accept => Stmt::Accept,
        });
    }
    if e.get("reject").is_some() {
        return Some(Stmt::Reject);
    }
    if e.get("return").is_some() {
        return Some(Stmt::Return);
    }
    None
}

fn match_stmt(m: &Value) -> Option<Stmt> {
    let op = m.get("op")?.as_str()?;
    let negate = op == "!=";
    let left = m.get("left")?;
    let right = m.get("right")?;
    let right_is = |word: &str| match right {
        Value::String(s) => s == word,
        Value::Array(a) => a.len() == 1 && a[0].as_str() == Some(word),
        _ => false,
    };
    if let Some(ct) = left.get("ct") {
        return match ct.get("key")?.as_str()? {
            "state" if right_is("new") && !negate => Some(Stmt::CtStateNew),
            "status" if right_is("dnat") && !negate => Some(Stmt::CtStatusDnat),
            _ => None,
        };
    }
    if let Some(field) = addr_field(left) {
        return Some(Stmt::Addr {
            field,
            negate,
            value: addr_value(right)?,
        });
    }
    if let Some(fib) = left.get("fib") {
        if fib.get("result")?.as_str()? != "type" || !right_is("local") || negate {
            return None;
        }
        let flags = fib.get("flags")?.as_array()?;
        return match flags.first()?.as_str()? {
            "saddr" => Some(Stmt::FibLocal(AddrField::Saddr)),
            "daddr" => Some(Stmt::FibLocal(AddrField::Daddr)),
            _ => None,
        };
    }
    if is_meta(left, "iifname") {
        return Some(Stmt::Iifname {
            negate,
            name: right.as_str()?.to_owned(),
        });
    }
    if is_meta(left, "l4proto") && !negate {
        return proto(right).map(Stmt::L4Proto);
    }
    if let Some(mask) = mark_bits(left, "&") {
        return (negate && right.as_u64() == Some(0)).then_some(Stmt::MarkAnyOf(mask));
    }
    if let Some(parts) = left.get("concat").and_then(Value::as_array) {
        let hairpin = matches!(parts.as_slice(), [s, d, p, port]
            if addr_field(s) == Some(AddrField::Saddr)
                && addr_field(d) == Some(AddrField::Daddr)
                && is_meta(p, "l4proto")
                && is_th_dport(port));
        if hairpin && !negate {
            let set = right.as_str()?.strip_prefix('@')?;
            return Some(Stmt::HairpinLookup(set.to_owned()));
        }
    }
    None
}

#[cfg(test)]
mod tests;
