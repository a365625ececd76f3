//! One value of the kube-proxy section as a table shows it: a cell with its spread and
//! bound, the short form the summary uses, and a ratio of ours to upstream's.

use std::collections::BTreeSet;

use crate::results::{fmt_num, median, ratio_of, values_in, Record, Val};

fn vals(records: &[Record], size: &str, imp: &str, key: &str) -> Vec<Val> {
    let rounds: BTreeSet<usize> = records.iter().map(|r| r.round).collect();
    values_in(records, size, crate::results::side(imp, ""), key, &rounds)
        .into_iter()
        .collect()
}

/// Records of failed runs keep what they measured before the failure: every value here was
/// measured whole. (`values_in` skips failed records; this does not.)
pub fn all_vals(records: &[Record], size: &str, imp: &str, key: &str) -> Vec<Val> {
    let mut v = vals(records, size, imp, key);
    for r in records
        .iter()
        .filter(|r| r.workload == size && r.imp == imp && r.error.is_some())
    {
        if let Some(x) = r.metrics.get(key) {
            v.push(Val {
                round: r.round,
                v: *x,
                censored: r.censored.contains(key),
                samples: r.samples.get(key).copied(),
            });
        }
    }
    v.sort_by_key(|x| x.round);
    v
}

pub fn cell(v: &[Val], timeout: bool) -> String {
    let xs: Vec<f64> = v.iter().map(|x| x.v).filter(|x| x.is_finite()).collect();
    if xs.is_empty() {
        return "—".into();
    }
    let med = median(&xs);
    let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let bound = bound(v, timeout);
    let value = if xs.len() == 1 || lo == hi {
        fmt_num(med)
    } else {
        format!("{} ({}–{})", fmt_num(med), fmt_num(lo), fmt_num(hi))
    };
    let samples: u64 = v.iter().filter_map(|x| x.samples).sum();
    if samples > 0 {
        format!("{bound}{value}, n={} ({samples} samples)", xs.len())
    } else {
        format!("{bound}{value}, n={}", xs.len())
    }
}

pub fn ratio_cell(o: &[Val], u: &[Val]) -> String {
    let r = ratio_of(o, u);
    if !r.r.is_finite() {
        return "—".into();
    }
    // A bound on either side bounds the ratio: upstream's timeout makes ours/upstream an upper
    // bound, ours' a lower one.
    let (oc, uc) = (o.iter().any(|x| x.censored), u.iter().any(|x| x.censored));
    let mark = match (oc, uc) {
        (false, false) => "",
        (false, true) => "≤ ",
        (true, false) => "≥ ",
        (true, true) => return "— (both bounds)".into(),
    };
    if r.n > 1 && r.lo.is_finite() {
        format!("{mark}{:.2}x ({:.2}–{:.2})", r.r, r.lo, r.hi)
    } else {
        format!("{mark}{:.2}x", r.r)
    }
}

pub fn short(v: &[Val], timeout: bool) -> String {
    let xs: Vec<f64> = v.iter().map(|x| x.v).filter(|x| x.is_finite()).collect();
    if xs.is_empty() {
        return "—".into();
    }
    let bound = bound(v, timeout);
    format!("{bound}{}", fmt_num(median(&xs)))
}

/// The mark of a value that is a bound: "> " for a timeout, "≥ " for a percentile that hit
/// one, nothing for a measured value.
fn bound(v: &[Val], timeout: bool) -> &'static str {
    match (v.iter().any(|x| x.censored), timeout) {
        (false, _) => "",
        (true, true) => "> ",
        (true, false) => "≥ ",
    }
}
