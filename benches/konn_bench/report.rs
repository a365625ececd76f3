//! The results tables (Markdown), shared by RESULTS.md and the tool's stdout.

use std::fmt::Write as _;

use crate::metrics::{defs_for, MetricDef, AGENT_DEFS, DEFS, WHOLE_DEFS};
use crate::opts::Opts;
use crate::results::{
    agent_only, cell, excluded, fmt_cell, fmt_ratio, ok_rounds, pair_label, ratio, ratio_of, side,
    values, values_in, workload_names, Cell, Ratio, Record, Side,
};
use crate::{GIB, MIB};

pub fn title(w: &str, opts: &Opts) -> String {
    match w {
        "bulk" => format!("1. Bulk: one single-use gRPC tunnel, {} down then {} up", size(opts.bulk_bytes), size(opts.bulk_bytes)),
        "short-single" => format!("2a. Short tunnels, single-use gRPC (new UDS connection + Proxy stream per dial; {} clients, 1 KiB each way, {} s)", opts.short_clients, opts.short_secs),
        "short-reusable" => format!("2b. Short tunnels, reusable gRPC (one UDS connection, one Proxy stream per dial; {} clients, {} s)", opts.short_clients, opts.short_secs),
        "short-connect" => format!("2c. Short tunnels, HTTP-CONNECT over the UDS (--mode=http-connect; {} clients, {} s)", opts.short_clients, opts.short_secs),
        w if w.starts_with("idle-") => format!("3. Idle tunnels: {} open single-use gRPC tunnels", &w[5..]),
        w if w.starts_with("connect-idle-") => format!("3a. Idle HTTP-CONNECT tunnels: {} open CONNECT tunnels over the UDS (--mode=http-connect), one connection each", &w[13..]),
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

/// Metrics that are counts or shares, or (an idle agent's CPU) mostly one or two 10 ms ticks
/// in the window: no ratio column.
fn no_ratio(key: &str) -> bool {
    matches!(
        key,
        "share_pct"
            | "errors"
            | "blocked_with_stalled"
            | "agent_threads"
            | "agent_idle_cpu_ms_per_s"
    )
}

fn fmt_range(r: &Ratio) -> String {
    if r.lo.is_finite() && r.hi > r.lo {
        format!("{:.2}–{:.2}", r.lo, r.hi)
    } else if r.lo.is_finite() {
        format!("{:.2}", r.lo)
    } else {
        String::new()
    }
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
    let sides = if w == "limit" {
        vec![side("direct", "")]
    } else {
        vec![side("ours", "go"), side("go", "go")]
    };
    if ok_rounds(records, w, &sides).is_empty() {
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
                (fmt_ratio(&r), fmt_range(&r))
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
        .filter(|r| r.workload == w && r.agent != "ours" && r.error.is_some())
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
        if matches!(d.workload, "idle" | "connect-idle" | "agents") {
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
    for w in workload_names(records)
        .into_iter()
        .filter(|w| !agent_only(w))
    {
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
                pair_label(r),
                one_line(r.error.as_deref().unwrap_or(""))
            );
        }
        for r in notes {
            let _ = writeln!(
                s,
                "- note round {} {} {}: {}",
                r.round,
                r.workload,
                pair_label(r),
                r.notes.join("; ")
            );
        }
    }
    s.push_str(&agent_section(opts, records));
    s
}

/// The workload an agent-comparison row is measured in (`idle` = the agent idle count).
fn agent_workload(opts: &Opts, d: &MetricDef) -> String {
    if d.workload == "idle" {
        format!("idle-{}", opts.agent_idle_count())
    } else {
        d.workload.to_string()
    }
}

fn agent_label(opts: &Opts, d: &MetricDef) -> String {
    if d.workload == "idle" {
        format!("{} ({} open)", d.label, opts.agent_idle_count())
    } else {
        d.label.to_string()
    }
}

/// One agent-comparison row: our agent vs upstream's behind `server`, over the rounds in
/// which both ran successfully.
pub struct AgentRow {
    pub go: Cell,
    pub ours: Cell,
    pub ratio: Ratio,
}

pub fn agent_row(records: &[Record], w: &str, server: &str, key: &str) -> AgentRow {
    let (a, b) = (side(server, "ours"), side(server, "go"));
    let rounds = ok_rounds(records, w, &[a, b]);
    let o = values_in(records, w, a, key, &rounds);
    let g = values_in(records, w, b, key, &rounds);
    AgentRow {
        go: cell(&g),
        ours: cell(&o),
        ratio: ratio_of(&o, &g),
    }
}

/// The four pairs of the whole-path table, all-Go first.
pub const PATH_SIDES: [(Side<'static>, &str); 4] = [
    (side("go", "go"), "Go server + Go agent"),
    (side("ours", "go"), "our server + Go agent"),
    (side("go", "ours"), "Go server + our agent"),
    (side("ours", "ours"), "our server + our agent"),
];

/// One whole-path row: the four pairs' cells over the rounds in which all four succeeded, and
/// all-Rust / all-Go.
pub fn path_row(records: &[Record], w: &str, key: &str) -> (Vec<Cell>, Ratio) {
    let sides: Vec<Side> = PATH_SIDES.iter().map(|(s, _)| *s).collect();
    let rounds = ok_rounds(records, w, &sides);
    let vals: Vec<_> = sides
        .iter()
        .map(|s| values_in(records, w, *s, key, &rounds))
        .collect();
    let r = ratio_of(&vals[3], &vals[0]);
    (vals.iter().map(|v| cell(v)).collect(), r)
}

/// The agent comparison (`--workloads agent`): our konnectivity-agent against upstream's
/// proxy-agent behind each server, then the whole path (all four pairs).
pub fn agent_section(opts: &Opts, records: &[Record]) -> String {
    let mut s = String::new();
    if !records.iter().any(|r| r.agent == "ours") {
        return s;
    }
    let names = workload_names(records);
    let _ = writeln!(
        s,
        "\n## Agents: konnectivity-agent vs upstream proxy-agent (ratio = our agent / Go agent, medians)\n"
    );
    let _ = writeln!(
        s,
        "The same workloads with the agent swapped: behind each server (same binary and flags), \
         upstream's `proxy-agent` and our `konnectivity-agent` (same flags). Each row is over \
         the rounds in which both agents' runs succeeded behind that server (n). Agent idle: \
         the agent connected to 1 or 3 servers of one implementation (3: `--server-count=3`, \
         distinct ids, behind a TCP round-robin proxy in the bench tool), nothing else \
         running; VmRSS after a {} s settle and a {} s window (its CPU over the window). RSS \
         per idle tunnel: the idle workload's agent VmRSS delta / N.\n",
        opts.idle_settle_secs, opts.idle_secs
    );
    let _ = writeln!(
        s,
        "| what | server | Go agent | our agent | ours/Go | per-round ratio range | target | met |\n|---|---|---|---|---|---|---|---|"
    );
    for d in AGENT_DEFS {
        let w = agent_workload(opts, d);
        if !names.contains(&w) {
            continue;
        }
        for (i, (server, sname)) in [("ours", "ours"), ("go", "Go")].into_iter().enumerate() {
            let row = agent_row(records, &w, server, d.key);
            let (rs, range, tt, mt) = if no_ratio(d.key) {
                Default::default()
            } else {
                (
                    fmt_ratio(&row.ratio),
                    fmt_range(&row.ratio),
                    target_text(d),
                    met(d, row.ratio.r),
                )
            };
            let label = if i == 0 {
                format!("{w}: {}", agent_label(opts, d))
            } else {
                String::new()
            };
            let _ = writeln!(
                s,
                "| {label} | {sname} | {} | {} | {rs} | {range} | {tt} | {mt} |",
                fmt_cell(&row.go),
                fmt_cell(&row.ours)
            );
        }
    }
    let _ = writeln!(
        s,
        "\n### Whole path: all-Go vs all-Rust (ratio = our server + our agent / Go server + Go agent)\n"
    );
    let _ = writeln!(
        s,
        "Each row is over the rounds in which all four pairs succeeded (n).\n"
    );
    let mut head = String::from("| what |");
    for (_, l) in PATH_SIDES {
        let _ = write!(head, " {l} |");
    }
    let _ = writeln!(
        s,
        "{head} all-Rust/all-Go | per-round ratio range | target | met |\n|---|---|---|---|---|---|---|---|---|"
    );
    for d in WHOLE_DEFS {
        if !names.iter().any(|n| n == d.workload) {
            continue;
        }
        let (cells, r) = path_row(records, d.workload, d.key);
        let cells: Vec<String> = cells.iter().map(fmt_cell).collect();
        let _ = writeln!(
            s,
            "| {}: {} | {} | {} | {} | {} | {} |",
            d.workload,
            d.label,
            cells.join(" | "),
            fmt_ratio(&r),
            fmt_range(&r),
            target_text(d),
            met(d, r.r)
        );
    }
    // The failed runs of the agent comparison's workloads (a Go-agent run also shows under
    // its server table).
    let agent_ws = opts.agent_workloads();
    let failed: Vec<&Record> = records
        .iter()
        .filter(|r| r.error.is_some() && agent_ws.contains(&r.workload))
        .collect();
    if !failed.is_empty() {
        let _ = writeln!(s);
        for r in failed {
            let _ = writeln!(
                s,
                "- **FAILED** round {} {} {}: {}",
                r.round,
                r.workload,
                pair_label(r),
                one_line(r.error.as_deref().unwrap_or(""))
            );
        }
    }
    s
}
