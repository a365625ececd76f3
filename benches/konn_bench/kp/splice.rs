//! Where the kube-proxy part's results go: its section of RESULTS.md and its key of
//! results.json, each replaced in place so that the Konnectivity part's stay.

use std::path::Path;

use anyhow::Result;

use super::info::Info;
use super::opts::{Opts, Size};
use crate::output::JSON_KEY;
use crate::results::Record;

/// Marks the section in RESULTS.md, so the Konnectivity part's writer keeps it and this
/// part's writer replaces only it.
pub const BEGIN: &str =
    "<!-- kube-proxy: begin (written by `benches/run --kube-proxy`; kept by the Konnectivity part) -->";
pub const END: &str = "<!-- kube-proxy: end -->";

pub fn json(opts: &Opts, records: &[Record], info: &Info) -> serde_json::Value {
    serde_json::json!({
        "quick": opts.quick,
        "rounds": opts.rounds,
        "sizes": opts.sizes.iter().map(Size::label).collect::<Vec<_>>(),
        "changes": opts.changes,
        "total_secs": info.total_secs,
        "date": info.date,
        "machine": info.machine,
        "nft": info.nft,
        "ours": info.ours,
        "git": info.git,
        "upstream": info.upstream,
        "records": crate::output::json_escape_records(records),
    })
}

/// RESULTS.md with this section in place of the old one (or appended).
pub fn splice_markdown(path: &Path, section: &str) -> Result<()> {
    let old = std::fs::read_to_string(path).unwrap_or_default();
    let (rest, _) = split_section(&old);
    let mut out = rest.trim_end().to_string();
    if !out.is_empty() {
        out.push_str("\n\n");
    }
    out.push_str(section.trim_end());
    out.push('\n');
    std::fs::write(path, out)?;
    Ok(())
}

/// The text without this part's section, and the section (markers included).
pub fn split_section(text: &str) -> (String, Option<String>) {
    let Some(b) = text.find(BEGIN) else {
        return (text.to_string(), None);
    };
    let e = text[b..]
        .find(END)
        .map(|i| b + i + END.len())
        .unwrap_or(text.len());
    let mut rest = text[..b].to_string();
    rest.push_str(&text[e..]);
    (rest, Some(text[b..e].to_string()))
}

/// results.json with this part under its key, the rest kept.
pub fn splice_json(path: &Path, v: serde_json::Value) -> Result<()> {
    let mut doc: serde_json::Value = std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_else(|| serde_json::json!({}));
    if !doc.is_object() {
        doc = serde_json::json!({});
    }
    doc[JSON_KEY] = v;
    std::fs::write(path, serde_json::to_string_pretty(&doc)?)?;
    Ok(())
}
