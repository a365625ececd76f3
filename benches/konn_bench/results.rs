//! Per-run records and the statistics the tables are made of.

use std::collections::{BTreeMap, BTreeSet};

pub type Metrics = BTreeMap<String, f64>;

/// One workload run (one server and agent pair, one round). `error` is set when the run failed
/// in any way; its metrics are then kept for results.json only.
#[derive(Clone, Debug)]
pub struct Record {
    pub workload: String,
    /// The server: "ours", "go", or "direct" (the limit: no server, no agent).
    pub imp: String,
    /// The agent behind it: "go" (upstream's proxy-agent), "ours", or "" (direct).
    pub agent: String,
    pub round: usize,
    pub metrics: Metrics,
    /// Metrics that are lower bounds (a latency percentile that landed on a timeout).
    pub censored: BTreeSet<String>,
    /// Metrics computed from many samples within the run (percentiles): how many.
    pub samples: BTreeMap<String, u64>,
    pub error: Option<String>,
    pub notes: Vec<String>,
    pub secs: f64,
}

/// One side of a comparison: a server behind an agent ("ours"/"go" each).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Side<'a> {
    pub server: &'a str,
    pub agent: &'a str,
}

pub const fn side<'a>(server: &'a str, agent: &'a str) -> Side<'a> {
    Side { server, agent }
}

impl Record {
    pub fn is(&self, w: &str, s: Side) -> bool {
        self.workload == w && self.imp == s.server && self.agent == s.agent
    }
}

fn other(imp: &str) -> Option<&'static str> {
    match imp {
        "ours" => Some("go"),
        "go" => Some("ours"),
        _ => None,
    }
}

/// The server comparison: each server behind upstream's agent; `direct` stands alone.
fn server_side(imp: &str) -> Side<'_> {
    side(imp, if imp == "direct" { "" } else { "go" })
}

/// Workloads that only the agent comparison reports (no server table).
pub fn agent_only(w: &str) -> bool {
    w.starts_with("agent-idle-")
}

/// The sides a record is compared with (see report.rs): the other server behind the same Go
/// agent (server tables), the other agent behind the same server (agent tables), and for the
/// all-ours and all-Go pairs the other whole path.
fn partners(r: &Record) -> Vec<Side<'static>> {
    let (Some(os), Some(oa)) = (other(&r.imp), other(&r.agent)) else {
        return vec![];
    };
    let mut v = Vec::new();
    if r.agent == "go" && !agent_only(&r.workload) {
        v.push(side(os, "go"));
    }
    let same = if r.imp == "ours" { "ours" } else { "go" };
    v.push(side(same, oa));
    if r.imp == r.agent {
        v.push(side(os, oa));
    }
    v
}

fn ok_in(records: &[Record], w: &str, s: Side, round: usize) -> bool {
    records
        .iter()
        .any(|x| x.is(w, s) && x.round == round && x.error.is_none())
}

/// Whether a record's numbers enter some table: it succeeded, and so did the run it is
/// compared with in the same round (in at least one of its comparisons that ran), so no
/// comparison stands on one side only.
pub fn usable(records: &[Record], r: &Record) -> bool {
    if r.error.is_some() {
        return false;
    }
    let ran: Vec<Side> = partners(r)
        .into_iter()
        .filter(|p| records.iter().any(|x| x.is(&r.workload, *p)))
        .collect();
    ran.is_empty() || ran.iter().any(|p| ok_in(records, &r.workload, *p, r.round))
}

/// The rounds in which every one of `sides` ran `w` successfully.
pub fn ok_rounds(records: &[Record], w: &str, sides: &[Side]) -> BTreeSet<usize> {
    records
        .iter()
        .filter(|r| r.workload == w)
        .map(|r| r.round)
        .filter(|&round| sides.iter().all(|s| ok_in(records, w, *s, round)))
        .collect()
}

/// Successful server-table runs left out because the other server failed that round.
pub fn excluded<'a>(records: &'a [Record], w: &str) -> Vec<&'a Record> {
    records
        .iter()
        .filter(|r| r.workload == w && r.error.is_none() && r.agent == "go")
        .filter(|r| other(&r.imp).is_some_and(|o| !ok_in(records, w, side(o, "go"), r.round)))
        .collect()
}

pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

pub fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return f64::NAN;
    }
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

pub fn fmt_num(v: f64) -> String {
    if !v.is_finite() {
        return "n/a".into();
    }
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 1000.0 || (v.fract() == 0.0 && a < 1e15) {
        format!("{v:.0}")
    } else if a >= 100.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// One round's value of a metric.
pub struct Val {
    pub round: usize,
    pub v: f64,
    pub censored: bool,
    pub samples: Option<u64>,
}

/// One side's values of a metric in the given rounds.
pub fn values_in(
    records: &[Record],
    w: &str,
    s: Side,
    key: &str,
    rounds: &BTreeSet<usize>,
) -> Vec<Val> {
    records
        .iter()
        .filter(|r| r.is(w, s) && r.error.is_none() && rounds.contains(&r.round))
        .filter_map(|r| {
            r.metrics.get(key).map(|v| Val {
                round: r.round,
                v: *v,
                censored: r.censored.contains(key),
                samples: r.samples.get(key).copied(),
            })
        })
        .collect()
}

/// The server tables' values: `imp` behind upstream's agent, in the rounds in which the other
/// server (behind the same agent) succeeded too.
pub fn values(records: &[Record], w: &str, imp: &str, key: &str) -> Vec<Val> {
    let me = server_side(imp);
    let mut sides = vec![me];
    sides.extend(other(imp).map(server_side));
    values_in(records, w, me, key, &ok_rounds(records, w, &sides))
}

/// A table cell: the median over rounds with its range; `n` = the rounds it is computed from.
pub struct Cell {
    pub med: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
    /// Samples behind the per-round values (percentiles: dials), summed over the rounds.
    pub samples: Option<u64>,
    /// Some value is a lower bound.
    pub censored: bool,
}

pub fn cell(vals: &[Val]) -> Cell {
    let ok: Vec<&Val> = vals.iter().filter(|x| x.v.is_finite()).collect();
    let v: Vec<f64> = ok.iter().map(|x| x.v).collect();
    let samples: Vec<u64> = ok.iter().filter_map(|x| x.samples).collect();
    Cell {
        med: median(&v),
        min: v.iter().copied().fold(f64::INFINITY, f64::min),
        max: v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        n: v.len(),
        samples: (!samples.is_empty()).then(|| samples.iter().sum()),
        censored: ok.iter().any(|x| x.censored),
    }
}

pub fn fmt_cell(c: &Cell) -> String {
    let value = if c.n == 0 {
        "n/a".to_string()
    } else if c.n == 1 || c.min == c.max {
        fmt_num(c.med)
    } else {
        format!("{} ({}–{})", fmt_num(c.med), fmt_num(c.min), fmt_num(c.max))
    };
    let bound = if c.censored { "≥ " } else { "" };
    match c.samples {
        Some(s) => format!("{bound}{value}, n={} ({s} samples)", c.n),
        None => format!("{bound}{value}, n={}", c.n),
    }
}

/// Ratio of medians a/b, the range of the per-round ratios, and the number of rounds.
/// Both sides come from the same rounds (see `usable`).
pub struct Ratio {
    pub r: f64,
    pub lo: f64,
    pub hi: f64,
    pub n: usize,
}

/// a/b from the two sides' values (of the same rounds).
pub fn ratio_of(o: &[Val], g: &[Val]) -> Ratio {
    let r = median(&o.iter().map(|x| x.v).collect::<Vec<_>>())
        / median(&g.iter().map(|x| x.v).collect::<Vec<_>>());
    let per: Vec<f64> = o
        .iter()
        .filter_map(|ov| {
            g.iter()
                .find(|gv| gv.round == ov.round)
                .map(|gv| ov.v / gv.v)
        })
        .filter(|x| x.is_finite())
        .collect();
    let lo = per.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = per.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let n = o
        .iter()
        .filter(|ov| {
            ov.v.is_finite() && g.iter().any(|gv| gv.round == ov.round && gv.v.is_finite())
        })
        .count();
    Ratio { r, lo, hi, n }
}

/// The server tables' ratio ours/Go, both behind upstream's agent.
pub fn ratio(records: &[Record], w: &str, key: &str) -> Ratio {
    ratio_of(
        &values(records, w, "ours", key),
        &values(records, w, "go", key),
    )
}

pub fn fmt_ratio(r: &Ratio) -> String {
    if r.r.is_finite() {
        format!("{:.2}x, n={}", r.r, r.n)
    } else {
        format!("n/a, n={}", r.n)
    }
}

/// How a record's pair is named in lists: the server, with the agent when it is ours.
pub fn pair_label(r: &Record) -> String {
    if r.agent == "ours" {
        format!("{}+our-agent", r.imp)
    } else {
        r.imp.clone()
    }
}

pub fn workload_names(records: &[Record]) -> Vec<String> {
    let mut seen = Vec::new();
    for r in records {
        if !seen.contains(&r.workload) {
            seen.push(r.workload.clone());
        }
    }
    seen
}
