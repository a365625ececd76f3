//! The results tables (Markdown), shared by RESULTS.md and the tool's stdout.

use std::fmt::Write as _;

use crate::metrics::{defs_for, MetricDef, DEFS};
use crate::opts::Opts;
use crate::results::{
    cell, excluded, fmt_cell, fmt_ratio, ratio, usable, values, workload_names, Cell, Record,
};
use crate::{GIB, MIB};

pub fn title(w: &str, opts: &Opts) -> String {
    match w {
        "bulk" => format!("1. Bulk: one single-use gRPC tunnel, {} down then {} up", size(opts.bulk_bytes), size(opts.bulk_bytes)),
        "short-single" => format!("2a. Short tunnels, single-use gRPC (new UDS connection + Proxy stream per dial; {} clients, 1 KiB each way, {} s)", opts.short_clients, opts.short_secs),
        "short-reusable" => format!("2b. Short tunnels, reusable gRPC (one UDS connection, one Proxy stream per dial; {} clients, {} s)", opts.short_clients, opts.short_secs),
        "short-connect" => format!("2c. Short tunnels, HTTP-CONNECT over the UDS (--mode=http-connect; {} clients, {} s)", opts.short_clients, opts.short_secs),
        w if w.starts_with("idle-") => format!("3. Idle tunnels: {} open single-use gRPC tunnels", &w[5..]),
        w if w.starts_with("agents-") => format!("3b. Connected agents: {} idle agents, one mTLS HTTP/2 connection and one Connect stream each (from one process)", &w[7..]),
        "hol" => format!("4. Head-of-line: {} active streaming tunnels with and without one stalled tunnel on the same agent ({} s each)", opts.hol_active, opts.hol_secs),
        "limit" => format!("5. The limit: the bulk transfer over a direct loopback TCP connection ({} each way)", size(opts.bulk_bytes)),
        _ => w.to_string(),
    }
}

pub fn size(b: u64) -> String {
    if b >= GIB && b.is_multiple_of(GIB) {
        format!("{} GiB", b / GIB)
    } else {
        format!("{} MiB", b / MIB)
    }
}

pub fn target_text(d: &MetricDef) -> String {
    match d.target {
        None => String::new(),
        Some((t, kind)) => format!("{kind} {}{t}x", if d.higher_better { "≥ " } else { "≤ " }),
    }
}

pub fn met(d: &MetricDef, r: f64) -> &'static str {
    match d.target {
        None => "",
        Some(_) if !r.is_finite() => "n/a",
        Some((t, _)) => {
            if (d.higher_better && r >= t) || (!d.higher_better && r <= t) {
                "yes"
            } else {
                "no"
            }
        }
    }
}

/// Metrics that are counts or shares: no ratio column.
fn no_ratio(key: &str) -> bool {
    matches!(key, "share_pct" | "errors" | "blocked_with_stalled")
}

fn share_met(o: &Cell) -> &'static str {
    if o.n == 0 {
        "n/a"
    } else if o.med >= 90.0 {
        "yes"
    } else {
        "no"
    }
}

pub fn table_for(records: &[Record], w: &str) -> String {
    let mut s = String::new();
    if !records
        .iter()
        .any(|r| r.workload == w && usable(records, r))
    {
        let _ = writeln!(
            s,
            "_No results: every run of this workload failed or was paired with a failed one._"
        );
    } else if w == "limit" {
        let _ = writeln!(
            s,
            "| metric | direct | ours as % of direct | Go as % of direct |\n|---|---|---|---|"
        );
        for (key, label) in [
            ("mbps", "end-to-end MB/s (down+up)"),
            ("down_mbps", "download MB/s"),
            ("up_mbps", "upload MB/s"),
            ("client_cpu_s_per_gib", "CPU: client s/GiB"),
            ("sink_cpu_s_per_gib", "CPU: far end s/GiB"),
        ] {
            let c = cell(&values(records, "limit", "direct", key));
            let pct = |imp: &str| {
                if !key.ends_with("mbps") {
                    return String::new();
                }
                let o = cell(&values(records, "bulk", imp, key));
                if o.n == 0 || c.n == 0 {
                    format!("n/a, n={}", o.n)
                } else {
                    format!("{:.0}%, n={}", o.med / c.med * 100.0, o.n)
                }
            };
            let _ = writeln!(
                s,
                "| {label} | {} | {} | {} |",
                fmt_cell(&c),
                pct("ours"),
                pct("go")
            );
        }
    } else {
        let _ = writeln!(s, "| metric | ours | Go | ours/Go | per-round ratio range | target | met |\n|---|---|---|---|---|---|---|");
        for d in defs_for(w) {
            let o = cell(&values(records, w, "ours", d.key));
            let g = cell(&values(records, w, "go", d.key));
            if o.n == 0 && g.n == 0 {
                continue;
            }
            let r = ratio(records, w, d.key);
            let (rs, range) = if no_ratio(d.key) {
                (String::new(), String::new())
            } else {
                (
                    fmt_ratio(&r),
                    if r.lo.is_finite() && r.hi > r.lo {
                        format!("{:.2}–{:.2}", r.lo, r.hi)
                    } else if r.lo.is_finite() {
                        format!("{:.2}", r.lo)
                    } else {
                        String::new()
                    },
                )
            };
            let (tt, mt) = if d.key == "share_pct" {
                ("target ≥ 90% (ours)".to_string(), share_met(&o))
            } else {
                (target_text(d), met(d, r.r))
            };
            let _ = writeln!(
                s,
                "| {} | {} | {} | {rs} | {range} | {tt} | {mt} |",
                d.label,
                fmt_cell(&o),
                fmt_cell(&g)
            );
        }
    }
    s.push_str(&failures_for(records, w));
    s
}

/// The failed runs of a workload and the runs left out with them, right under its table.
fn failures_for(records: &[Record], w: &str) -> String {
    let mut s = String::new();
    let failed: Vec<&Record> = records
        .iter()
        .filter(|r| r.workload == w && r.error.is_some())
        .collect();
    if failed.is_empty() {
        return s;
    }
    let _ = writeln!(s);
    for r in failed {
        let _ = writeln!(
            s,
            "- **FAILED** round {} {}: {}",
            r.round,
            r.imp,
            one_line(r.error.as_deref().unwrap_or(""))
        );
    }
    for r in excluded(records, w) {
        let _ = writeln!(
            s,
            "- left out: round {} {} succeeded, but the other server failed that round",
            r.round, r.imp
        );
    }
    s
}

fn one_line(text: &str) -> String {
    text.replace('\n', " ⏎ ")
}

pub type SummaryRow = (String, String, String, String, String, &'static str);

pub fn summary_rows(records: &[Record]) -> Vec<SummaryRow> {
    // (what, ours, go, ratio, target, met)
    let mut rows = Vec::new();
    let names = workload_names(records);
    let mut items: Vec<(String, &'static MetricDef)> = vec![];
    for d in DEFS.iter().filter(|d| d.target.is_some()) {
        if matches!(d.workload, "idle" | "agents") {
            let prefix = format!("{}-", d.workload);
            for w in names.iter().filter(|w| w.starts_with(&prefix)) {
                items.push((w.to_string(), d));
            }
        } else {
            items.push((d.workload.to_string(), d));
        }
    }
    // A workload that ran keeps its rows even when every run failed (n=0).
    for (w, d) in items.into_iter().filter(|(w, _)| names.contains(w)) {
        let o = cell(&values(records, &w, "ours", d.key));
        let g = cell(&values(records, &w, "go", d.key));
        let r = ratio(records, &w, d.key);
        rows.push((
            format!("{w}: {}", d.label),
            fmt_cell(&o),
            fmt_cell(&g),
            fmt_ratio(&r),
            target_text(d),
            met(d, r.r),
        ));
    }
    if names.iter().any(|w| w == "hol") {
        let o = cell(&values(records, "hol", "ours", "share_pct"));
        let g = cell(&values(records, "hol", "go", "share_pct"));
        rows.push((
            "hol: active throughput share %".into(),
            fmt_cell(&o),
            fmt_cell(&g),
            String::new(),
            "target ≥ 90% (ours)".into(),
            share_met(&o),
        ));
    }
    rows
}

pub fn summary_tables(opts: &Opts, records: &[Record]) -> String {
    let mut s = String::new();
    let failed = records.iter().filter(|r| r.error.is_some()).count();
    if failed > 0 {
        let _ = writeln!(
            s,
            "\n**THIS RUN FAILED: {failed} of {} workload runs failed** (listed under their tables \
             and in Failures below). The tables hold only rounds in which both servers succeeded.",
            records.len()
        );
    }
    let _ = writeln!(
        s,
        "\n## Summary (targets and aims; ratio = ours/Go, medians)\n"
    );
    let _ = writeln!(
        s,
        "n = the rounds a cell is computed from (for latency percentiles, \
        also the dials behind them); ≥ marks a lower bound (a percentile that hit the timeout).\n"
    );
    let _ = writeln!(
        s,
        "| what | ours | Go | ours/Go | target | met |\n|---|---|---|---|---|---|"
    );
    for (a, b, c, d, e, f) in summary_rows(records) {
        let _ = writeln!(s, "| {a} | {b} | {c} | {d} | {e} | {f} |");
    }
    for w in workload_names(records) {
        let _ = writeln!(s, "\n### {}\n", title(&w, opts));
        s.push_str(&table_for(records, &w));
    }
    let errs: Vec<&Record> = records.iter().filter(|r| r.error.is_some()).collect();
    let notes: Vec<&Record> = records.iter().filter(|r| !r.notes.is_empty()).collect();
    if !errs.is_empty() || !notes.is_empty() {
        let _ = writeln!(s, "\n### Failures and notes\n");
        for r in errs {
            let _ = writeln!(
                s,
                "- FAILED round {} {} {}: {}",
                r.round,
                r.workload,
                r.imp,
                one_line(r.error.as_deref().unwrap_or(""))
            );
        }
        for r in notes {
            let _ = writeln!(
                s,
                "- note round {} {} {}: {}",
                r.round,
                r.workload,
                r.imp,
                r.notes.join("; ")
            );
        }
    }
    s
}
