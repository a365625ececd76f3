//! Go's spellings of values, where operators' tools read them: floats as `strconv.FormatFloat(f,
//! 'g', -1, 64)` writes them (histogram `le` labels), durations as `time.Duration.String()`
//! (log fields such as `dialDuration`).

use std::fmt;
use std::time::Duration;

/// A float in Go's shortest `'g'` form: `1e-06`, `0.0001`, `12.5`, `86400`, `1.5e+07`, `+Inf`.
pub fn go_float(value: f64) -> String {
    if value.is_nan() {
        return "NaN".into();
    }
    if value.is_infinite() {
        return if value > 0.0 { "+Inf" } else { "-Inf" }.into();
    }
    if value == 0.0 {
        return if value.is_sign_negative() { "-0" } else { "0" }.into();
    }
    // Rust's `{:e}` gives the shortest round-trip digits; Go picks %e when the decimal
    // exponent is below -4 or at least 6 (the precision "shortest" uses for this choice).
    let scientific = format!("{value:e}");
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    if !(-4..6).contains(&exponent) {
        let sign = if exponent < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exponent.unsigned_abs())
    } else {
        format!("{value}")
    }
}

/// A duration as Go's `time.Duration.String()` writes it: `0s`, `512ns`, `1.5µs`, `12.3ms`,
/// `2.5s`, `1m30s`, `1h0m0s`.
#[derive(Clone, Copy, Debug)]
pub struct GoDuration(pub Duration);

/// `n / unit` with the remainder as trimmed decimal digits: (1500, 1000) is `1.5`.
fn decimal(out: &mut fmt::Formatter<'_>, n: u128, unit: u128) -> fmt::Result {
    write!(out, "{}", n / unit)?;
    let rest = n % unit;
    if rest == 0 {
        return Ok(());
    }
    let width = unit.ilog10() as usize;
    let digits = format!("{rest:0width$}");
    write!(out, ".{}", digits.trim_end_matches('0'))
}

impl fmt::Display for GoDuration {
    fn fmt(&self, out: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ns = self.0.as_nanos();
        match ns {
            0 => out.write_str("0s"),
            1..=999 => write!(out, "{ns}ns"),
            1_000..=999_999 => {
                decimal(out, ns, 1_000)?;
                out.write_str("µs")
            }
            1_000_000..=999_999_999 => {
                decimal(out, ns, 1_000_000)?;
                out.write_str("ms")
            }
            _ => {
                let secs = ns / 1_000_000_000;
                let (hours, minutes) = (secs / 3600, secs / 60 % 60);
                if hours > 0 {
                    write!(out, "{hours}h")?;
                }
                if hours > 0 || minutes > 0 {
                    write!(out, "{minutes}m")?;
                }
                decimal(out, ns % 60_000_000_000, 1_000_000_000)?;
                out.write_str("s")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_are_spelled_as_go_spells_them() {
        let cases = [
            (1e-6, "1e-06"),
            (1e-5, "1e-05"),
            (1e-4, "0.0001"),
            (0.005, "0.005"),
            (0.025, "0.025"),
            (0.1, "0.1"),
            (0.5, "0.5"),
            (2.5, "2.5"),
            (12.5, "12.5"),
            (1.0, "1"),
            (86400.0, "86400"),
            (999999.0, "999999"),
            (1e6, "1e+06"),
            (1.5e7, "1.5e+07"),
            (123456789.0, "1.23456789e+08"),
            (f64::INFINITY, "+Inf"),
            (f64::NEG_INFINITY, "-Inf"),
            (0.0, "0"),
            (-2.5e-7, "-2.5e-07"),
        ];
        for (value, go) in cases {
            assert_eq!(go_float(value), go, "{value}");
        }
    }

    #[test]
    fn durations_are_spelled_as_go_spells_them() {
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(512), "512ns"),
            (Duration::from_nanos(1_500), "1.5µs"),
            (Duration::from_micros(12_345), "12.345ms"),
            (Duration::from_millis(2_500), "2.5s"),
            (Duration::from_secs(90), "1m30s"),
            (Duration::from_secs(3600), "1h0m0s"),
            (Duration::from_millis(3_723_004), "1h2m3.004s"),
        ];
        for (value, go) in cases {
            assert_eq!(GoDuration(value).to_string(), go, "{value:?}");
        }
    }
}
