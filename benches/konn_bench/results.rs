//! Per-run records and the statistics the tables are made of.

use std::collections::{BTreeMap, BTreeSet};

pub type Metrics = BTreeMap<String, f64>;

/// One workload run (one server, one round). `error` is set when the run failed in any way;
/// its metrics are then kept for results.json only.
#[derive(Clone, Debug)]
pub struct Record {
    pub workload: String,
    pub imp: String,
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

/// The other server of a comparison, or None for a run without one (`direct`).
fn partner(imp: &str) -> Option<&'static str> {
    match imp {
        "ours" => Some("go"),
        "go" => Some("ours"),
        _ => None,
    }
}

/// Whether a record's numbers enter the tables: it succeeded, and so did the other server's
/// run of the same workload in the same round, so no comparison stands on one side only.
pub fn usable(records: &[Record], r: &Record) -> bool {
    if r.error.is_some() {
        return false;
    }
    let Some(other) = partner(&r.imp) else {
        return true;
    };
    records.iter().any(|x| {
        x.workload == r.workload && x.round == r.round && x.imp == other && x.error.is_none()
    })
}

/// Successful runs left out of the tables because the other server failed that round.
pub fn excluded<'a>(records: &'a [Record], w: &str) -> Vec<&'a Record> {
    records
        .iter()
        .filter(|r| r.workload == w && r.error.is_none() && !usable(records, r))
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

/// The values that enter the tables (see `usable`).
pub fn values(records: &[Record], w: &str, imp: &str, key: &str) -> Vec<Val> {
    records
        .iter()
        .filter(|r| r.workload == w && r.imp == imp && usable(records, r))
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

/// Ratio of medians ours/Go, the range of the per-round ratios, and the number of rounds.
/// Both sides come from the same rounds (see `usable`).
pub struct Ratio {
    pub r: f64,
    pub lo: f64,
    pub hi: f64,
    pub n: usize,
}

pub fn ratio(records: &[Record], w: &str, key: &str) -> Ratio {
    let o = values(records, w, "ours", key);
    let g = values(records, w, "go", key);
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

pub fn fmt_ratio(r: &Ratio) -> String {
    if r.r.is_finite() {
        format!("{:.2}x, n={}", r.r, r.n)
    } else {
        format!("n/a, n={}", r.n)
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
