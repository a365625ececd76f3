//! The kube-proxy section's overview: one line per size, and the targets, each with
//! what this run measured and whether it was met.

use std::fmt::Write as _;

use super::cells::{all_vals, ratio_cell, short};
use super::opts::{Opts, Size};
use crate::results::{fmt_num, median, Record, Val};

pub fn sizes_in(records: &[Record], opts: &Opts) -> Vec<Size> {
    opts.sizes
        .iter()
        .copied()
        .filter(|z| records.iter().any(|r| r.workload == z.label()))
        .collect()
}

/// The compact overview: one line per size, medians, ours / upstream (ratio).
pub fn summary(s: &mut String, records: &[Record], opts: &Opts) {
    let cols: &[(&str, &str, bool)] = &[
        ("cold_sync_s", "start → rules, empty table (s)", true),
        ("restart_sync_s", "restart → rules (s)", true),
        (
            "change0_p50_ms",
            "endpoint change p50 / p99, min-sync 0 (ms)",
            false,
        ),
        (
            "change1_p50_ms",
            "endpoint change p50 / p99, min-sync 1 s (ms)",
            false,
        ),
        ("newsvc1_ms", "new Service, 1 s (ms)", false),
        ("settled_rss_mib", "RSS settled (MiB)", false),
        ("cold_peak_rss_mib", "peak RSS, first sync (MiB)", false),
    ];
    let _ = write!(s, "\n| Services x endpoints |");
    for (_, label, _) in cols {
        let _ = write!(s, " {label} |");
    }
    let _ = write!(s, "\n|---|");
    for _ in cols {
        let _ = write!(s, "---|");
    }
    s.push('\n');
    for z in sizes_in(records, opts) {
        let w = z.label();
        let _ = write!(s, "| {} |", z.title());
        for (key, _, timeout) in cols {
            let one = |imp: &str| {
                let v = all_vals(records, &w, imp, key);
                if key.ends_with("_p50_ms") {
                    let p99 = key.replace("_p50_", "_p99_");
                    format!(
                        "{} / {}",
                        short(&v, *timeout),
                        short(&all_vals(records, &w, imp, &p99), *timeout)
                    )
                } else {
                    short(&v, *timeout)
                }
            };
            let o = all_vals(records, &w, "ours", key);
            let u = all_vals(records, &w, "upstream", key);
            if o.is_empty() && u.is_empty() {
                let _ = write!(s, " — |");
                continue;
            }
            let r = ratio_cell(&o, &u);
            let r = r.split(' ').next().unwrap_or("").to_string();
            let r = if r == "—" || r.is_empty() {
                String::new()
            } else {
                format!(" ({r})")
            };
            let _ = write!(s, " {} vs {}{r} |", one("ours"), one("upstream"));
        }
        s.push('\n');
    }
}

/// What a target compares.
enum Goal {
    /// ours / upstream of a metric at most this; with `or_timeout`, also met when upstream
    /// timed out and ours did not.
    Ratio { max: f64, or_timeout: bool },
    /// ours' value at most this.
    Abs { max: f64, unit: &'static str },
    /// ours' value / ours' value of another metric (the kernel's floor) at most this.
    OfOwn { other: &'static str, max: f64 },
    /// |ours / upstream - 1| at most this.
    Within { frac: f64 },
}

struct Target {
    what: &'static str,
    size: Size,
    key: &'static str,
    goal: Goal,
}

const fn size(services: usize, endpoints: usize) -> Size {
    Size {
        services,
        endpoints,
    }
}

const TARGETS: &[Target] = &[
    Target {
        what: "first sync, empty table",
        size: size(10_000, 10),
        key: "cold_sync_s",
        goal: Goal::Ratio {
            max: 0.1,
            or_timeout: false,
        },
    },
    Target {
        what: "first sync, table of a previous run",
        size: size(10_000, 10),
        key: "restart_sync_s",
        goal: Goal::Ratio {
            max: 0.1,
            or_timeout: false,
        },
    },
    Target {
        what: "first sync, empty table, against the kernel's floor (`nft -f` of the same ruleset)",
        size: size(10_000, 10),
        key: "cold_sync_s",
        goal: Goal::OfOwn {
            other: "floor_s",
            max: 1.5,
        },
    },
    Target {
        what: "first sync, empty table",
        size: size(44_000, 2),
        key: "cold_sync_s",
        goal: Goal::Ratio {
            max: 0.1,
            or_timeout: true,
        },
    },
    Target {
        what: "first sync, empty table",
        size: size(5_000, 50),
        key: "cold_sync_s",
        goal: Goal::Ratio {
            max: 0.1,
            or_timeout: true,
        },
    },
    Target {
        what: "endpoint change → kernel p99, min-sync-period 0",
        size: size(10_000, 10),
        key: "change0_p99_ms",
        goal: Goal::Abs {
            max: 50.0,
            unit: "ms",
        },
    },
    Target {
        what: "endpoint change → kernel p99, min-sync-period 0",
        size: size(10_000, 10),
        key: "change0_p99_ms",
        goal: Goal::Ratio {
            max: 0.1,
            or_timeout: false,
        },
    },
    Target {
        what: "RSS, settled",
        size: size(10_000, 10),
        key: "settled_rss_mib",
        goal: Goal::Ratio {
            max: 0.2,
            or_timeout: false,
        },
    },
    Target {
        what: "RSS, idle (no Services)",
        size: size(0, 0),
        key: "settled_rss_mib",
        goal: Goal::Ratio {
            max: 0.15,
            or_timeout: false,
        },
    },
    Target {
        what: "peak RSS during the first sync",
        size: size(10_000, 10),
        key: "cold_peak_rss_mib",
        goal: Goal::Ratio {
            max: 0.25,
            or_timeout: false,
        },
    },
    Target {
        what: "data plane: new connections/s through a ClusterIP, relative to straight to the pod in the same turn",
        size: size(10_000, 10),
        key: "dp_clusterip_rel",
        goal: Goal::Within { frac: 0.05 },
    },
];

fn med(v: &[Val]) -> f64 {
    median(&v.iter().map(|x| x.v).collect::<Vec<_>>())
}

fn censored(v: &[Val]) -> bool {
    v.iter().any(|x| x.censored)
}

/// The goal as the table states it.
fn goal_text(g: &Goal) -> String {
    match g {
        Goal::Ratio { max, or_timeout } => format!(
            "≤ {max}x upstream{}",
            if *or_timeout {
                ", or upstream timed out"
            } else {
                ""
            }
        ),
        Goal::Abs { max, unit } => format!("≤ {} {unit}", fmt_num(*max)),
        Goal::OfOwn { max, .. } => format!("≤ {max}x the floor"),
        Goal::Within { frac } => format!("within {:.0} % of upstream", frac * 100.0),
    }
}

/// The measured side of a target and its verdict ("met", "MISSED", "not measured").
fn judge(t: &Target, records: &[Record]) -> (String, &'static str) {
    let w = t.size.label();
    let o = all_vals(records, &w, "ours", t.key);
    let u = all_vals(records, &w, "upstream", t.key);
    let none = ("—".to_string(), "not measured");
    if o.is_empty() {
        return none;
    }
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    match &t.goal {
        Goal::Abs { max, unit } => {
            let v = med(&o);
            (
                format!("ours {} {unit}", short(&o, false)),
                verdict(v <= *max && !censored(&o)),
            )
        }
        Goal::OfOwn { other, max } => {
            let f = all_vals(records, &w, "ours", other);
            if f.is_empty() {
                return none;
            }
            let r = med(&o) / med(&f);
            (
                format!(
                    "{r:.2}x (ours {} s, floor {} s)",
                    short(&o, true),
                    short(&f, true)
                ),
                verdict(r <= *max && !censored(&o)),
            )
        }
        Goal::Ratio { max, or_timeout } => {
            if u.is_empty() {
                return (
                    format!("ours {}; upstream not measured", short(&o, true)),
                    "not measured",
                );
            }
            let r = med(&o) / med(&u);
            let (oc, uc) = (censored(&o), censored(&u));
            // Upstream's timeout makes the ratio an upper bound: met if the bound is.
            let ok = !oc && (r <= *max || (*or_timeout && uc));
            (
                format!(
                    "{} (ours {} vs upstream {})",
                    ratio_cell(&o, &u),
                    short(&o, true),
                    short(&u, true)
                ),
                verdict(ok),
            )
        }
        Goal::Within { frac } => {
            if u.is_empty() {
                return none;
            }
            let r = med(&o) / med(&u);
            (
                format!(
                    "{} (ours {} vs upstream {})",
                    ratio_cell(&o, &u),
                    short(&o, false),
                    short(&u, false)
                ),
                verdict((r - 1.0).abs() <= *frac),
            )
        }
    }
}

/// The targets: the goal, what this run measured (medians over rounds) and the
/// verdict. A size this run did not measure says so.
pub fn targets(s: &mut String, records: &[Record], opts: &Opts) {
    let _ = writeln!(
        s,
        "\n## Targets (medians over rounds; a ratio's range is per round)\n\n| size | target | goal | measured | |\n|---|---|---|---|---|"
    );
    for t in TARGETS {
        let (measured, verdict) = judge(t, records);
        let verdict = if verdict == "not measured" && !opts.sizes.contains(&t.size) {
            "not measured: size not in this run"
        } else {
            verdict
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {measured} | {verdict} |",
            t.size.title(),
            t.what,
            goal_text(&t.goal)
        );
    }
}
